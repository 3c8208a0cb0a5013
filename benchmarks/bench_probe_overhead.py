"""Cost per event of the run-queue probe's sched_switch program, against an empty program on the
same tracepoint, in the same attach mode (tp_btf or raw_tp), attached at the same time, under a
context-switch-heavy load (two processes ping-ponging a byte over pipes on one CPU).  Figures
come from the kernel's BPF run-time stats (run_time_ns / run_cnt of bpf_prog_info).
The probe has no sched_wakeup program: nothing else to measure.

Usage: bench_probe_overhead.py [--quick] [--seconds S]   (needs root; exits 0 with a note if not)
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def prog_stats(fd: int) -> tuple[int, int]:
    """(run_time_ns, run_cnt) of a loaded program, from the kernel."""
    from tailsight.probes.loader import read_program_stats

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


def other_probes(seconds: float) -> None:
    """tcpstate's inet_sock_set_state and migration's sched_migrate_task, each against an
    empty program on the same tracepoint in the same mode, under a load that fires it."""
    from tailsight.probes.loader import attach_raw_tracepoints, compile_source
    from tailsight.probes.migration import MigrationProbe
    from tailsight.probes.tcpstate import TcpStateProbe

    cases = (
        (TcpStateProbe, "inet_sock_set_state", loopback_connections),
        (MigrationProbe, "sched_migrate_task", self_migrations),
    )
    for make, tracepoint, load in cases:
        empty = compile_source(HERE / "empty_raw_tp.bpf.c", [])
        probe = make()
        probe.attach()
        mode = probe.attach_mode or "raw_tp"
        baseline = attach_raw_tracepoints(empty, "empty", [tracepoint], mode=mode)
        try:
            fds = (probe.program_fds()[tracepoint], baseline.prog_fds[tracepoint])
            before = [prog_stats(fd) for fd in fds]
            load(seconds)
            after = [prog_stats(fd) for fd in fds]
        finally:
            baseline.close()
            probe.close()
            empty.cleanup()
        (ours_ns, ours_n), (empty_ns, empty_n) = (
            (b[0] - a[0], b[1] - a[1]) for a, b in zip(before, after, strict=True)
        )
        if min(ours_n, empty_n) == 0:
            print(f"{tracepoint}: no events seen")
            continue
        per_ours, per_empty = ours_ns / ours_n, empty_ns / empty_n
        print(
            f"{probe.name} {tracepoint} ({mode}): "
            f"{per_ours:.1f} vs empty {per_empty:.1f} ns/event over {ours_n:,} events, "
            f"ratio {per_ours / per_empty:.2f}x"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short run for CI (~5 s)")
    parser.add_argument("--seconds", type=float, default=None, help="load duration")
    args = parser.parse_args(argv)
    seconds = args.seconds or (2.0 if args.quick else 10.0)
    if os.geteuid() != 0:
        print("bench_probe_overhead: skipped (needs root for BPF)")
        return 0

    from tailsight.probes.features import enable_bpf_stats
    from tailsight.probes.loader import attach_raw_tracepoints, compile_source
    from tailsight.probes.runqueue import RunQueueProbe
    from tailsight.workload import default_cpu

    empty = compile_source(HERE / "empty_raw_tp.bpf.c", [])
    probe = RunQueueProbe()
    with enable_bpf_stats() as mechanism:
        probe.attach()
        mode = probe.attach_mode or "raw_tp"
        baseline = attach_raw_tracepoints(empty, "empty", ["sched_switch"], mode=mode)
        try:
            ours_fd = probe.program_fds()["sched_switch"]
            empty_fd = baseline.prog_fds["sched_switch"]
            pids = start_load(default_cpu())
            try:
                time.sleep(0.2)  # let the ping-pong settle
                ours_0, empty_0 = prog_stats(ours_fd), prog_stats(empty_fd)
                time.sleep(seconds)
                ours_1, empty_1 = prog_stats(ours_fd), prog_stats(empty_fd)
            finally:
                stop_load(pids)
            snapshot = probe.read()
        finally:
            baseline.close()
            probe.close()
            empty.cleanup()

    ours_ns, ours_n = ours_1[0] - ours_0[0], ours_1[1] - ours_0[1]
    empty_ns, empty_n = empty_1[0] - empty_0[0], empty_1[1] - empty_0[1]
    if min(ours_n, empty_n) == 0:
        print("bench_probe_overhead: no sched_switch events seen", file=sys.stderr)
        return 1
    per_ours, per_empty = ours_ns / ours_n, empty_ns / empty_n
    print(
        f"stats via {mechanism}; attach mode {mode}; load: pipe ping-pong on one CPU for "
        f"{seconds:.1f} s"
    )
    print(f"sched_switch events: {ours_n:,} ({ours_n / seconds:,.0f}/s); empty saw {empty_n:,}")
    print(f"runqueue sched_switch: {per_ours:8.1f} ns/event")
    print(f"empty program        : {per_empty:8.1f} ns/event (same tracepoint, same run)")
    print(f"ratio {per_ours / per_empty:.2f}x, added work {per_ours - per_empty:.1f} ns/event")
    dropped = sum(
        v for (name, _), v in snapshot.counters.items() if name.endswith("_dropped_events")
    )
    print(f"drops during the run: {dropped}")
    with enable_bpf_stats():
        other_probes(seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
