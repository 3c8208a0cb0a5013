"""Cost per event of each probe's programs against an empty program on the same tracepoint, in
the same attach mode (tp_btf or raw_tp), attached at the same time: runqueue's sched_switch
under a context-switch-heavy load (two processes ping-ponging a byte over pipes on one CPU),
tcpstate's inet_sock_set_state (loopback connections), migration's sched_migrate_task
(affinity flips), drops' kfree_skb (UDP datagrams to a full receive buffer, each a drop
charged to the receiving socket's cgroup) and irq's softirq_entry and softirq_exit (the same
datagrams: each runs a NET_RX softirq on the sender's CPU).  Figures come from the kernel's BPF
run-time stats (run_time_ns / run_cnt of bpf_prog_info).  The run-queue probe has no
sched_wakeup program: nothing else to measure.

The first program attached to a tracepoint costs more than the next one: two empty programs on
one tracepoint, 77 vs 65 ns per sched_migrate_task and 66 vs 59 ns per inet_sock_set_state
(medians of 6 rounds, measured on this 2-core host).  So each probe is measured twice, attached
before the empty program and after it, and the ratio is that of the two programs' means over
both orders; each order's ratio is printed too.

Usage: bench_probe_overhead.py [--quick] [--seconds S] [--probe NAME]...   (needs root; exits 0
with a note if not)
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, TypeVar

from tailsight.probes.drops import DropsProbe
from tailsight.probes.features import enable_bpf_stats
from tailsight.probes.irq import IrqProbe
from tailsight.probes.loader import attach_raw_tracepoints, compile_source, read_program_stats
from tailsight.probes.migration import MigrationProbe
from tailsight.probes.runqueue import RunQueueProbe
from tailsight.probes.tcpstate import TcpStateProbe
from tailsight.testing.workload import default_cpu

HERE = Path(__file__).resolve().parent


def prog_stats(fd: int) -> tuple[int, int]:
    """(run_time_ns, run_cnt) of a loaded program, from the kernel."""
    stats = read_program_stats(fd)
    if stats is None:
        raise RuntimeError(f"no BPF run-time stats for fd {fd}: not a BPF program")
    return stats.run_time_ns, stats.run_cnt


def _ping_pong_child(cpu: int, rounds_fd: tuple[int, int], first: bool) -> None:
    read_fd, write_fd = rounds_fd
    os.sched_setaffinity(0, {cpu})
    if first:
        os.write(write_fd, b"x")
    while os.read(read_fd, 1):
        os.write(write_fd, b"x")
    os._exit(0)


def start_load(cpu: int) -> list[int]:
    """Two processes pinned to one CPU, each blocked until the other hands it the byte."""
    a_to_b, b_to_a = os.pipe(), os.pipe()
    pids = []
    for first, ends in ((True, (b_to_a[0], a_to_b[1])), (False, (a_to_b[0], b_to_a[1]))):
        pid = os.fork()
        if pid == 0:
            _ping_pong_child(cpu, ends, first)
        pids.append(pid)
    for fd in (*a_to_b, *b_to_a):
        os.close(fd)
    return pids


def stop_load(pids: list[int]) -> None:
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    for pid in pids:
        os.waitpid(pid, 0)


def loopback_connections(seconds: float) -> int:
    """connect/accept/close on loopback (~10 TCP state changes per connection, both ends)."""
    import socket

    with socket.create_server(("127.0.0.1", 0)) as server:
        address = server.getsockname()
        count = 0
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            with socket.create_connection(address):
                accepted, _ = server.accept()
                accepted.close()
            count += 1
    return count


def self_migrations(seconds: float) -> int:
    """Flip our own affinity between two CPUs: one migration each (needs two CPUs)."""
    cpus = sorted(os.sched_getaffinity(0))[:2]
    count = 0
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            os.sched_setaffinity(0, {cpus[count % 2]})
            count += 1
    finally:
        os.sched_setaffinity(0, set(cpus))
    return count


def udp_rcvbuf_drops(seconds: float) -> int:
    """Datagrams to a socket with the smallest receive buffer, never read: all but the first
    few are dropped (SOCKET_RCVBUFF), in the sender's softirq."""
    import socket

    with (
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as receiver,
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender,
    ):
        receiver.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)
        receiver.bind(("127.0.0.1", 0))
        address = receiver.getsockname()
        count = 0
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for _ in range(100):
                sender.sendto(b"x" * 256, address)
            count += 100
    return count


def pipe_ping_pong(seconds: float) -> int:
    """``start_load`` on the default CPU for ``seconds``."""
    pids = start_load(default_cpu())
    try:
        time.sleep(seconds)
    finally:
        stop_load(pids)
    return 0


PerEvent = dict[str, tuple[float, float, int]]
"""Per tracepoint: (ours ns/event, empty ns/event, our events)."""


def measure(
    fds: Mapping[str, tuple[int, int]], load: Callable[[float], int], seconds: float
) -> tuple[int, PerEvent]:
    """Run the load; what it returns (e.g. its calls) and the cost per event of each tracepoint's
    two programs, ``fds[tracepoint]`` = (ours, empty); NoEvents if either saw none."""
    before = {tp: (prog_stats(ours), prog_stats(empty)) for tp, (ours, empty) in fds.items()}
    calls = load(seconds)
    result = {}
    for tp, (ours, empty) in fds.items():
        (ours_ns0, ours_n0), (empty_ns0, empty_n0) = before[tp]
        ours_ns, ours_n = prog_stats(ours)
        empty_ns, empty_n = prog_stats(empty)
        if min(ours_n - ours_n0, empty_n - empty_n0) == 0:
            raise NoEvents(f"no {tp} events seen")
        result[tp] = (
            (ours_ns - ours_ns0) / (ours_n - ours_n0),
            (empty_ns - empty_ns0) / (empty_n - empty_n0),
            ours_n - ours_n0,
        )
    return calls, result


class NoEvents(RuntimeError):
    """A load did not fire the tracepoint it is meant to: there is no cost to report."""


ORDERS: Final = ("ours first", "empty first")
R = TypeVar("R")


def in_both_orders(
    make_probe: Callable[[], Any],
    tracepoints: Sequence[str],
    run: Callable[[Mapping[str, tuple[int, int]], Any], R],
) -> tuple[str, list[R]]:
    """``run(fds, probe)`` with the probe's programs attached before the empty ones on each
    tracepoint, then after them (see the module docstring); the attach mode and both results,
    in ``ORDERS``. The empty programs take the probe's mode (tp_btf where the kernel takes it)."""
    empty = compile_source(HERE / "empty_raw_tp.bpf.c", [])
    mode = ""
    results = []
    try:
        for order in ORDERS:
            probe, baseline = make_probe(), None
            try:
                if order == "empty first":
                    baseline = attach_raw_tracepoints(empty, "empty", tracepoints, mode=mode)
                probe.attach()
                attached_mode = probe.attach_mode or "raw_tp"
                if mode and attached_mode != mode:
                    raise RuntimeError(f"{probe.name} attached as {attached_mode}, then {mode}")
                mode = attached_mode
                if baseline is None:
                    baseline = attach_raw_tracepoints(empty, "empty", tracepoints, mode=mode)
                ours = probe.program_fds()
                fds = {tp: (ours[tp], baseline.prog_fds[tp]) for tp in tracepoints}
                results.append(run(fds, probe))
            finally:
                if baseline is not None:
                    baseline.close()
                probe.close()
    finally:
        empty.cleanup()
    return mode, results


def both_orders_line(name: str, per_order: Sequence[tuple[float, float, int]]) -> str:
    """``name``'s cost against the empty program over both attach orders, and each order's."""
    ours = sum(o for o, _, _ in per_order) / len(per_order)
    empty = sum(e for _, e, _ in per_order) / len(per_order)
    orders = ", ".join(
        f"{order} {o / e:.2f}x" for order, (o, e, _) in zip(ORDERS, per_order, strict=True)
    )
    events = sum(n for _, _, n in per_order)
    return (
        f"{name}: {ours:.1f} vs empty {empty:.1f} ns/event over {events:,} events, ratio "
        f"{ours / empty:.2f}x, added {ours - empty:.1f} ns ({orders})"
    )


def dropped(snapshot: Any) -> int:
    """Events a probe lost (its ``*_dropped_events`` counters)."""
    return sum(v for (name, _), v in snapshot.counters.items() if name.endswith("_dropped_events"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short run for CI (~30 s)")
    parser.add_argument("--seconds", type=float, default=None, help="load duration")
    parser.add_argument("--probe", action="append", help="only this probe (repeatable)")
    args = parser.parse_args(argv)
    seconds = args.seconds or (2.0 if args.quick else 10.0)
    if os.geteuid() != 0:
        print("bench_probe_overhead: skipped (needs root for BPF)")
        return 0

    cases = (
        (RunQueueProbe, "sched_switch", pipe_ping_pong),
        (TcpStateProbe, "inet_sock_set_state", loopback_connections),
        (MigrationProbe, "sched_migrate_task", self_migrations),
        (DropsProbe, "kfree_skb", udp_rcvbuf_drops),
        (IrqProbe, "softirq_entry", udp_rcvbuf_drops),
        (IrqProbe, "softirq_exit", udp_rcvbuf_drops),
    )
    cases = tuple(case for case in cases if not args.probe or case[0].name in args.probe)
    with enable_bpf_stats() as mechanism:
        print(f"stats via {mechanism}; each load runs {seconds:.1f} s per attach order")
        for make, tracepoint, load in cases:

            def run(
                fds: Mapping[str, tuple[int, int]],
                probe: Any,
                load: Callable[[float], int] = load,
                tracepoint: str = tracepoint,
            ) -> tuple[tuple[float, float, int], int]:
                _, per_tp = measure(fds, load, seconds)
                return per_tp[tracepoint], dropped(probe.read())

            try:
                mode, results = in_both_orders(make, [tracepoint], run)
            except NoEvents as error:
                print(f"bench_probe_overhead: {error}", file=sys.stderr)
                return 1
            name = f"{make.name} {tracepoint} ({mode})"
            print(both_orders_line(name, [per_event for per_event, _ in results]))
            print(f"  drops during the runs: {sum(n for _, n in results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
