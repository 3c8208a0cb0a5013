"""Kernel map memory of each probe, measured here (the kernel's own ``memlock`` per map, from
/proc/self/fdinfo) and projected to 64 and 256 CPUs from the map layout: per-CPU maps grow by
their value size x entries per CPU, preallocated hash maps by one spare element per CPU, the
migration probe's counter array by one row per CPU and slot; other shared arrays (histogram rows,
counters) do not grow with CPUs.  Baseline: the same figure for an
empty program's module (no maps), so only what the probes allocate is counted.

Usage: bench_probe_memory.py [--quick]   (needs root; exits 0 with a note if not)
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from tailsight.probes.loader import compile_source
from tailsight.probes.migration import COUNTS_BYTES_PER_CPU, MigrationProbe
from tailsight.probes.netsyscall import NetSyscallProbe
from tailsight.probes.runqueue import RunQueueProbe
from tailsight.probes.tcpstate import TcpStateProbe

CPUS_PROJECTED = (2, 64, 256)
PER_CPU_TYPES = {5, 6, 10}  # BPF_MAP_TYPE_PERCPU_HASH, PERCPU_ARRAY, LRU_PERCPU_HASH
HASH_TYPES = {1}  # BPF_MAP_TYPE_HASH (preallocated: one extra element per CPU)
HTAB_ELEM_OVERHEAD = 48  # struct htab_elem before the key


def _round8(value: int) -> int:
    return (value + 7) // 8 * 8


def map_fds() -> dict[int, dict[str, int]]:
    """fd -> fdinfo fields (map_type, key_size, value_size, max_entries, memlock, map_id)."""
    maps = {}
    for entry in Path("/proc/self/fd").iterdir():
        try:
            if os.readlink(entry) != "anon_inode:bpf-map":
                continue
            text = Path(f"/proc/self/fdinfo/{entry.name}").read_text()
        except OSError:
            continue
        fields = dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)
        maps[int(entry.name)] = {
            k: int(fields[k])
            for k in ("map_type", "key_size", "value_size", "max_entries", "memlock")
            if k in fields
        }
    return maps


def project(info: dict[str, int], cpus: int, here: int) -> int:
    """Bytes of one map at ``cpus`` CPUs, from its measured memlock at ``here`` CPUs."""
    kind = info["map_type"]
    if kind in PER_CPU_TYPES:
        per_cpu = _round8(info["value_size"]) * info["max_entries"]
    elif kind in HASH_TYPES:
        per_cpu = HTAB_ELEM_OVERHEAD + _round8(info["key_size"]) + _round8(info["value_size"])
    else:
        return info["memlock"]
    return info["memlock"] + per_cpu * (cpus - here)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="same run (it takes ~5 s anyway)")
    parser.parse_args(argv)
    if os.geteuid() != 0:
        print("bench_probe_memory: skipped (needs root for BPF)")
        return 0

    here = os.cpu_count() or 1
    empty_before = set(map_fds())
    empty = compile_source(Path(__file__).resolve().parent / "empty_raw_tp.bpf.c", [])
    baseline = sum(info["memlock"] for fd, info in map_fds().items() if fd not in empty_before)
    empty.cleanup()
    print(f"map memory per probe (kernel memlock), {here} CPUs here; empty module: {baseline} B")
    header = "".join(f"{f'{n} CPUs':>12}" for n in CPUS_PROJECTED)
    print(f"{'probe':12}{header}   largest map")
    totals = dict.fromkeys(CPUS_PROJECTED, 0)
    for make in (RunQueueProbe, NetSyscallProbe, TcpStateProbe, MigrationProbe):
        before = set(map_fds())
        probe = make()
        probe.attach()
        try:
            ours = {fd: info for fd, info in map_fds().items() if fd not in before}
        finally:
            probe.close()
        rows_per_cpu = COUNTS_BYTES_PER_CPU if make is MigrationProbe else 0
        sizes = {
            n: sum(project(info, n, here) for info in ours.values()) + rows_per_cpu * (n - here)
            for n in CPUS_PROJECTED
        }
        for n in CPUS_PROJECTED:
            totals[n] += sizes[n]
        largest = max(ours.values(), key=lambda info: info["memlock"])
        cells = "".join(f"{sizes[n] / 2**20:9.2f} MiB" for n in CPUS_PROJECTED)
        print(f"{probe.name:12}{cells}   {largest['memlock'] / 2**20:.2f} MiB")
    cells = "".join(f"{totals[n] / 2**20:9.2f} MiB" for n in CPUS_PROJECTED)
    print(f"{'all four':12}{cells}")
    print(f"ratio 256 CPUs / {here} CPUs: {totals[256] / totals[here]:.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
