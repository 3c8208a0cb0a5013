"""Cost per event of the netsyscall probe's sys_enter/sys_exit programs, for a syscall it does
not trace (a getpid loop) and one it does (UDP sendto to loopback), each against an empty program
on the same tracepoint in the same attach mode, attached at the same time, in both attach orders
(see bench_probe_overhead.py: the first program on a tracepoint costs more).  Figures come from the
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
from collections.abc import Mapping
from typing import Any

from bench_probe_overhead import (
    NoEvents,
    PerEvent,
    both_orders_line,
    dropped,
    in_both_orders,
    measure,
)

from tailsight.probes.features import enable_bpf_stats
from tailsight.probes.netsyscall import NetSyscallProbe

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short run for CI (~6 s)")
    parser.add_argument("--seconds", type=float, default=None, help="duration of each load")
    args = parser.parse_args(argv)
    seconds = args.seconds or (1.5 if args.quick else 5.0)
    if os.geteuid() != 0:
        print("bench_netsyscall_overhead: skipped (needs root for BPF)")
        return 0

    loads = {"getpid (not traced)": getpid_loop, "sendto (traced)": sendto_loop}

    def run(
        fds: Mapping[str, tuple[int, int]], probe: Any
    ) -> tuple[dict[str, tuple[int, PerEvent]], int]:
        runs = {name: measure(fds, load, seconds) for name, load in loads.items()}
        return runs, dropped(probe.read())

    try:
        with enable_bpf_stats() as mechanism:
            mode, results = in_both_orders(NetSyscallProbe, TRACEPOINTS, run)
    except NoEvents as error:
        print(f"bench_netsyscall_overhead: {error}", file=sys.stderr)
        return 1
    print(
        f"stats via {mechanism}; attach mode {mode} (the empty programs too); each load runs "
        f"{seconds:.1f} s per attach order in one Python thread"
    )
    for load in loads:
        calls = sum(runs[load][0] for runs, _ in results)
        events = sum(runs[load][1]["sys_enter"][2] for runs, _ in results)
        share = 100 * calls / events if events else 0.0
        print(f"{load}: {calls:,} calls, {events:,} sys_enter events ({share:.0f}% ours)")
        for tp in TRACEPOINTS:
            per_order = [runs[load][1][tp] for runs, _ in results]
            print("  " + both_orders_line(f"{tp:9} netsyscall", per_order))
    print(f"drops during the runs: {sum(n for _, n in results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
