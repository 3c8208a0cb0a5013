"""What a user feels: round trips per second of a context-switch + small-syscall workload with all
probes attached (as ``tailsight trace`` does) against none, and against the floor: empty programs
on the same tracepoints, which is what any program there costs (the kernel's dispatch to it).

Workloads, each two processes (a round trip is two context switches per side and four syscalls):
  pipe: a byte ping-ponged over two pipes (read/write: syscalls netsyscall does not trace)
  udp:  a datagram ping-ponged over loopback (sendto/recvfrom: traced by netsyscall)
each on two CPUs (every round trip also wakes an idle CPU: on this VM the vCPU wake-up is most of
it, and noisy) and on one CPU (the two switch directly: the worst case for the probes' share).

For every workload a round measures off, floor and on back to back, in an order that rotates from
round to round, so a drift of the shared machine cancels.  A figure is the median of the
per-round ratios, with a distribution-free 95 % interval for it from order statistics; the goal
is judged on that interval: "within" when all of it is within the goal, "above" when all of it
is above, else "not decided by this run".

Usage: bench_workload_slowdown.py [--quick] [--seconds S] [--rounds N]
(needs root and two CPUs; exits 0 with a note if not)
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tailsight.probes.catalog import BPF_PROBES, create_probe
from tailsight.probes.loader import TP_BTF, TP_BTF_CFLAG, attach_raw_tracepoints, compile_source

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
    """The probes with BPF programs (the file probes add nothing in the kernel)."""
    probes = []
    for name in BPF_PROBES:
        probe = create_probe(name)
        probe.attach()
        probes.append(probe)
    return probes


def attach_floor(probes: list[Any]) -> tuple[list[Any], list[Any]]:
    """Empty programs on every tracepoint the probes use, in each probe's attach mode: (compiled
    modules, attachments)."""
    modules, attachments = [], []
    for probe in probes:
        attachment = probe.attachment()
        flags = [TP_BTF_CFLAG] if attachment.mode == TP_BTF else []
        empty = compile_source(Path(__file__).with_name("empty_raw_tp.bpf.c"), flags)
        modules.append(empty)
        attachments.append(
            attach_raw_tracepoints(empty, "empty", list(attachment.prog_fds), mode=attachment.mode)
        )
    return modules, attachments


def link_only(linked: list[Any], unlinked: list[Any]) -> None:
    for attachment in unlinked:
        attachment.detach()
    for attachment in linked:
        attachment.reattach()


def judged(ratios: list[float]) -> tuple[float, float, float, str]:
    """Slowdown (1 - median ratio), its 95 % interval (least, most) and the verdict on the goal."""
    low, high = median_interval(ratios)
    most, least = 1 - low, 1 - high
    goal = f"the {100 * GOAL_SLOWDOWN:.0f} % goal"
    if most <= GOAL_SLOWDOWN:
        verdict = f"within {goal}"
    elif least > GOAL_SLOWDOWN:
        verdict = f"above {goal}"
    else:
        verdict = f"{goal} not decided by this run"
    return 1 - statistics.median(ratios), least, most, verdict


def percent(slowdown: float, least: float, most: float) -> str:
    return f"{100 * slowdown:5.1f} % [{100 * least:.1f}, {100 * most:.1f}]"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short run for CI (~30 s)")
    parser.add_argument("--seconds", type=float, default=None, help="length of one measurement")
    parser.add_argument("--rounds", type=int, default=None, help="rounds per workload")
    args = parser.parse_args(argv)
    seconds = args.seconds or (0.25 if args.quick else 0.5)
    rounds = args.rounds or (5 if args.quick else 30)
    if os.geteuid() != 0:
        print("bench_workload_slowdown: skipped (needs root for BPF)")
        return 0
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        print("bench_workload_slowdown: skipped (needs two CPUs)")
        return 0
    workloads: dict[str, tuple[Callable[[tuple[int, int], float], int], tuple[int, int]]] = {
        "pipe, 2 CPUs": (pipe_ping_pong, (cpus[0], cpus[1])),
        "udp,  2 CPUs": (udp_ping_pong, (cpus[0], cpus[1])),
        "pipe, 1 CPU": (pipe_ping_pong, (cpus[1], cpus[1])),
        "udp,  1 CPU": (udp_ping_pong, (cpus[1], cpus[1])),
    }
    states = ("off", "floor", "on")
    rates: dict[tuple[str, str], list[float]] = {(w, s): [] for w in workloads for s in states}
    # Attached once (compiling takes seconds); a state links only its own programs.
    probes = attach_all()
    modes = sorted({str(p.attach_mode) for p in probes})
    floor_modules, floor = attach_floor(probes)
    ours = [probe.attachment() for probe in probes]
    links = {"off": ([], ours + floor), "floor": (floor, ours), "on": (ours, floor)}
    try:
        for round_index in range(rounds):
            order = states[round_index % 3 :] + states[: round_index % 3]
            for name, (run, pair) in workloads.items():
                for state in order if round_index % 2 == 0 else order[::-1]:
                    link_only(*links[state])
                    rates[(name, state)].append(run(pair, seconds) / seconds)
    finally:
        for attachment in floor:
            attachment.close()
        for module in floor_modules:
            module.cleanup()
        for probe in probes:
            probe.close()

    print(
        f"CPUs {cpus[0]} and {cpus[1]}; {rounds} rounds of off, floor and on, {seconds:.2f} s "
        f"each, per workload; probes on: {', '.join(BPF_PROBES)} ({', '.join(modes)}); "
        "floor: empty programs on the same tracepoints"
    )
    verdicts = []
    for name in workloads:
        off, floor_rates, on = (rates[(name, state)] for state in states)
        slowdown, least, most, verdict = judged([b / a for a, b in zip(off, on, strict=True)])
        floor_cost = judged([b / a for a, b in zip(off, floor_rates, strict=True)])
        above_floor = judged([b / a for a, b in zip(floor_rates, on, strict=True)])
        verdicts.append(f"{name}: {verdict}")
        print(
            f"{name:12} ping-pong: off {statistics.median(off):9,.0f} round trips/s; "
            f"slowdown {percent(slowdown, least, most)}: {verdict}; "
            f"of which the floor {percent(*floor_cost[:3])}, "
            f"the probes above it {percent(*above_floor[:3])}"
        )
    print("; ".join(verdicts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
