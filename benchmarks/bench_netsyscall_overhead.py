"""Cost per event of the netsyscall probe's sys_enter/sys_exit programs, for a syscall it does
not trace (a getpid loop) and one it does (UDP sendto to loopback), each against an empty program
on the same tracepoint in the same attach mode, attached at the same time.  Figures come from the
kernel's BPF run-time stats (run_time_ns / run_cnt); every syscall on the machine runs both
programs, so the share of events our loop caused is printed too.

Usage: bench_netsyscall_overhead.py [--quick] [--seconds S]
(needs root; exits 0 with a note if not)
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from bench_probe_overhead import prog_stats

HERE = Path(__file__).resolve().parent
TRACEPOINTS = ("sys_enter", "sys_exit")


def getpid_loop(seconds: float) -> int:
    """Calls getpid (not a socket syscall) for ``seconds``; returns how many times."""
    calls = 0
    deadline = time.monotonic() + seconds
    getpid = os.getpid  # glibc >= 2.25 does not cache it: a real syscall each time
    while time.monotonic() < deadline:  # clock_gettime is a vDSO call: no syscall
        for _ in range(1000):
            getpid()
        calls += 1000
    return calls


def sendto_loop(seconds: float) -> int:
    """UDP sendto to a bound loopback socket nobody reads (full buffer: dropped, still ok)."""
    with (
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as rx,
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx,
    ):
        rx.bind(("127.0.0.1", 0))
        address = rx.getsockname()
        calls = 0
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for _ in range(1000):
                tx.sendto(b"x", address)
            calls += 1000
    return calls


def measure(
    fds: Mapping[str, tuple[int, int]], load: Callable[[float], int], seconds: float
) -> tuple[int, dict[str, tuple[float, float, int]]]:
    """Run the load; per tracepoint (ours ns/event, empty ns/event, events)."""
    before = {tp: (prog_stats(ours), prog_stats(empty)) for tp, (ours, empty) in fds.items()}
    calls = load(seconds)
    result = {}
    for tp, (ours, empty) in fds.items():
        (ours_ns0, ours_n0), (empty_ns0, empty_n0) = before[tp]
        ours_ns, ours_n = prog_stats(ours)
        empty_ns, empty_n = prog_stats(empty)
        result[tp] = (
            (ours_ns - ours_ns0) / max(1, ours_n - ours_n0),
            (empty_ns - empty_ns0) / max(1, empty_n - empty_n0),
            ours_n - ours_n0,
        )
    return calls, result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short run for CI (~6 s)")
    parser.add_argument("--seconds", type=float, default=None, help="duration of each load")
    args = parser.parse_args(argv)
    seconds = args.seconds or (1.5 if args.quick else 5.0)
    if os.geteuid() != 0:
        print("bench_netsyscall_overhead: skipped (needs root for BPF)")
        return 0

    from tailsight.probes.features import enable_bpf_stats
    from tailsight.probes.loader import attach_raw_tracepoints, compile_source
    from tailsight.probes.netsyscall import DROPPED, NetSyscallProbe

    empty = compile_source(HERE / "empty_raw_tp.bpf.c", [])
    probe = NetSyscallProbe()
    with enable_bpf_stats() as mechanism:
        probe.attach()
        mode = probe.attach_mode or "raw_tp"
        baseline = attach_raw_tracepoints(empty, "empty", TRACEPOINTS, mode=mode)
        try:
            ours = probe.program_fds()
            fds = {tp: (ours[tp], baseline.prog_fds[tp]) for tp in TRACEPOINTS}
            runs = {
                "getpid (not traced)": measure(fds, getpid_loop, seconds),
                "sendto (traced)": measure(fds, sendto_loop, seconds),
            }
            snapshot = probe.read()
        finally:
            baseline.close()
            probe.close()
            empty.cleanup()

    print(
        f"stats via {mechanism}; attach mode {mode} (the empty programs too); each load runs "
        f"{seconds:.1f} s in one Python thread"
    )
    for load, (calls, per_tp) in runs.items():
        events = per_tp["sys_enter"][2]
        share = 100 * calls / events if events else 0.0
        print(f"{load}: {calls:,} calls, {events:,} sys_enter events ({share:.0f}% ours)")
        for tp, (ours_ns, empty_ns, _) in per_tp.items():
            print(
                f"  {tp:9}: netsyscall {ours_ns:7.1f} ns/event, empty {empty_ns:6.1f} ns/event, "
                f"ratio {ours_ns / empty_ns:5.2f}x, added {ours_ns - empty_ns:6.1f} ns"
            )
    dropped = sum(v for (name, _), v in snapshot.counters.items() if name == DROPPED)
    print(f"drops during the run: {dropped}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
