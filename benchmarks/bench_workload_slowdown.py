"""What a user feels: round trips per second of a context-switch + small-syscall workload with all
probes attached (as ``tailsight trace`` does) against none, rounds interleaved in the same run.

Workloads, each two processes pinned to two different CPUs (so every round trip is two wakeups,
two context switches per CPU and four syscalls per side):
  pipe: a byte ping-ponged over two pipes (read/write: syscalls netsyscall does not trace)
  udp:  a datagram ping-ponged over loopback (sendto/recvfrom: traced by netsyscall)

The figure is the median of the per-round ratios on/off (off and on alternate in order from one
round to the next, so a drift of the shared machine cancels), with a distribution-free 95 %
interval for it from order statistics; the goal is judged on that interval: "within" when all
of it is within the goal, "above" when all of it is above, else "not decided by this run".

Usage: bench_workload_slowdown.py [--quick] [--seconds S] [--rounds N]
(needs root and two CPUs; exits 0 with a note if not)
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

GOAL_SLOWDOWN = 0.03


def median_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float]:
    """Distribution-free interval for the median: the order statistics k and n - k + 1 with
    P(Binomial(n, 1/2) < k) <= (1 - confidence) / 2 (the widest, the sample, for tiny n)."""
    from scipy.stats import binom

    ordered = sorted(values)
    n = len(ordered)
    k = 0
    while k < n // 2 and binom.cdf(k, n, 0.5) <= (1 - confidence) / 2:
        k += 1
    return ordered[max(k - 1, 0)], ordered[n - max(k, 1)]


def _pipe_side(first: bool, read_fd: int, write_fd: int, seconds: float) -> int:
    """One end of the pipe ping-pong; the first end counts round trips until the deadline."""
    if not first:
        while os.read(read_fd, 1) == b"x":
            os.write(write_fd, b"x")
        return 0
    trips = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for _ in range(100):
            os.write(write_fd, b"x")
            os.read(read_fd, 1)
        trips += 100
    os.write(write_fd, b"q")  # stops the echo end
    return trips


def pipe_ping_pong(cpus: tuple[int, int], seconds: float) -> int:
    a_to_b, b_to_a = os.pipe(), os.pipe()
    ends = ((True, b_to_a[0], a_to_b[1]), (False, a_to_b[0], b_to_a[1]))
    return _two_processes(cpus, [lambda e=e: _pipe_side(*e, seconds) for e in ends])


def _udp_side(first: bool, sock: socket.socket, peer: Any, seconds: float) -> int:
    if not first:
        while True:
            data, _ = sock.recvfrom(16)
            if data != b"x":
                return 0
            sock.sendto(b"x", peer)
    trips = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for _ in range(100):
            sock.sendto(b"x", peer)
            sock.recvfrom(16)
        trips += 100
    sock.sendto(b"q", peer)
    return trips


def udp_ping_pong(cpus: tuple[int, int], seconds: float) -> int:
    a = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    b = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    a.bind(("127.0.0.1", 0))
    b.bind(("127.0.0.1", 0))
    try:
        sides = ((True, a, b.getsockname()), (False, b, a.getsockname()))
        return _two_processes(cpus, [lambda s=s: _udp_side(*s, seconds) for s in sides])
    finally:
        a.close()
        b.close()


def _two_processes(cpus: tuple[int, int], sides: list[Callable[[], int]]) -> int:
    """Fork one process per side, pinned to its CPU; the first side's count comes back."""
    result_read, result_write = os.pipe()
    pids = []
    for cpu, side in zip(cpus, sides, strict=True):
        pid = os.fork()
        if pid == 0:
            os.sched_setaffinity(0, {cpu})
            trips = side()
            os.write(result_write, f"{trips}\n".encode() if trips else b"")
            os._exit(0)
        pids.append(pid)
    os.close(result_write)
    for pid in pids:
        os.waitpid(pid, 0)
    with os.fdopen(result_read) as results:
        return int(results.read().strip())


def attach_all() -> list[Any]:
    from tailsight.probes.catalog import PROBES, create_probe

    probes = []
    for name in PROBES:
        probe = create_probe(name)
        probe.attach()
        probes.append(probe)
    return probes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short run for CI (~30 s)")
    parser.add_argument("--seconds", type=float, default=None, help="length of one measurement")
    parser.add_argument("--rounds", type=int, default=None, help="off/on pairs per workload")
    args = parser.parse_args(argv)
    seconds = args.seconds or (1.0 if args.quick else 2.0)
    rounds = args.rounds or (5 if args.quick else 15)
    if os.geteuid() != 0:
        print("bench_workload_slowdown: skipped (needs root for BPF)")
        return 0
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        print("bench_workload_slowdown: skipped (needs two CPUs)")
        return 0
    pair = (cpus[0], cpus[1])
    workloads: dict[str, Callable[[tuple[int, int], float], int]] = {
        "pipe": pipe_ping_pong,
        "udp": udp_ping_pong,
    }
    rates: dict[tuple[str, bool], list[float]] = {(w, on): [] for w in workloads for on in (0, 1)}
    # Attached once (compiling takes seconds); "off" unlinks the loaded programs from their
    # tracepoints, so off and on alternate within seconds of each other.
    probes = attach_all()
    modes = sorted({str(p.attach_mode) for p in probes})
    try:
        for round_index in range(rounds):
            for on in (False, True) if round_index % 2 == 0 else (True, False):
                for probe in probes:
                    attachment = probe.attachment()
                    if on:
                        attachment.reattach()
                    else:
                        attachment.detach()
                for name, run in workloads.items():
                    rates[(name, on)].append(run(pair, seconds) / seconds)
    finally:
        for probe in probes:
            probe.close()

    print(
        f"CPUs {pair[0]} and {pair[1]}; {rounds} off/on rounds of {seconds:.1f} s per workload; "
        f"probes on: all four ({', '.join(modes)})"
    )
    verdicts = []
    for name in workloads:
        offs, ons = rates[(name, False)], rates[(name, True)]
        ratios = [b / a for a, b in zip(offs, ons, strict=True)]
        ratio = statistics.median(ratios)
        low, high = median_interval(ratios)
        most, least = 1 - low, 1 - high  # slowdown bounds
        goal = f"the {100 * GOAL_SLOWDOWN:.0f} % goal"
        if most <= GOAL_SLOWDOWN:
            verdict = f"within {goal}"
        elif least > GOAL_SLOWDOWN:
            verdict = f"above {goal}"
        else:
            verdict = f"{goal} not decided by this run"
        verdicts.append(verdict)
        spread = ", ".join(f"{a:,.0f}/{b:,.0f}" for a, b in zip(offs, ons, strict=True))
        print(
            f"{name:4} ping-pong: off {statistics.median(offs):9,.0f} round trips/s, on "
            f"{statistics.median(ons):9,.0f}; per-round ratio on/off {ratio:.3f}: slowdown "
            f"{100 * (1 - ratio):5.1f} %, 95 % interval [{100 * least:.1f}, {100 * most:.1f}] %: "
            f"{verdict}  (rounds off/on: {spread})"
        )
    print(
        "; ".join(f"{name}: {verdict}" for name, verdict in zip(workloads, verdicts, strict=True))
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
