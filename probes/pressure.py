"""Pressure stall information (PSI): time tasks stalled on CPU, memory or io, from cgroupfs.

The kernel (booted with ``psi=1``, or with PSI on by default) counts, per cgroup v2 and
host-wide (``/proc/pressure/*``), the time in which some task, or every non-idle task ("full"),
was stalled on a resource: waiting for a CPU, reclaiming or faulting memory in, waiting on io.
Every v2 cgroup has the files, controllers enabled or not. Read once per interval for the
busiest cgroups (and their ancestors, whose stalls include their children's) and for the host.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Final

from tailsight.cgroups import DEFAULT_MOUNTS_PATH
from tailsight.probes.base import CounterInfo, Labels, ProbeInfo, Snapshot, labels
from tailsight.probes.cgroupfiles import FileProbe, Increments, read_file
from tailsight.probes.loader import ProbeError

PROBE_NAME: Final = "pressure"
RESOURCES: Final = ("cpu", "memory", "io")
SOME: Final = "pressure_some_ns"
FULL: Final = "pressure_full_ns"
HOST_SOME: Final = "pressure_host_some_ns"
HOST_FULL: Final = "pressure_host_full_ns"
INFO: Final = ProbeInfo(
    name=PROBE_NAME,
    title="pressure stalls",
    tracepoints=(),
    files=("cpu.pressure", "memory.pressure", "io.pressure", "/proc/pressure/*"),
    counters=(
        CounterInfo(SOME, "Time some task of the cgroup stalled on the resource (PSI 'some')."),
        CounterInfo(FULL, "Time every non-idle task of the cgroup stalled at once (PSI 'full')."),
        CounterInfo(HOST_SOME, "The host's PSI 'some' stall time (/proc/pressure)."),
        CounterInfo(HOST_FULL, "The host's PSI 'full' stall time (/proc/pressure)."),
    ),
)


def parse_pressure(text: bytes) -> tuple[int, int] | None:
    """(some, full) ``total=`` of a pressure file, in ns (the file counts µs); None if unreadable.
    Host-wide cpu has a "full" line of zeros (or none, before 5.13)."""
    some = full = None
    for line in text.splitlines():
        kind, _, rest = line.partition(b" ")
        total = rest.rpartition(b"total=")[2]
        if not total.isdigit():
            continue
        if kind == b"some":
            some = int(total) * 1000
        elif kind == b"full":
            full = int(total) * 1000
    return None if some is None else (some, full or 0)


class PressureProbe(FileProbe):
    """Reads PSI stall time of the busiest cgroups and of the host (see the module docstring)."""

    name = PROBE_NAME

    def __init__(
        self,
        v2_root: Path | str | None = None,
        proc: Path | str = "/proc",
        mounts_path: Path | str = DEFAULT_MOUNTS_PATH,
    ) -> None:
        super().__init__(v2_root, mounts_path)
        self._proc = Path(proc)
        # (cgroup id, or None for the host; resource) -> (some, full) since first read
        self._moved = Increments()
        self._totals: dict[tuple[int | None, str], list[int]] = {}

    def attach(self) -> None:
        """ProbeError where the kernel keeps no pressure information (``psi=0``)."""
        self._find_v2_root()
        if read_file(f"{self._proc}/pressure/cpu") is None:
            raise ProbeError(
                f"pressure: {self._proc}/pressure/cpu cannot be read: the kernel keeps no "
                "pressure stall information (CONFIG_PSI off, or booted with psi=0)"
            )
        self._start_watching()

    def _add(self, key: tuple[int | None, str], now: tuple[int, int]) -> None:
        total = self._totals.setdefault(key, [0, 0])
        for k, value in enumerate(self._moved.since_last(key, now)):
            total[k] += value

    def read(self) -> Snapshot:
        """Cumulative stall time per (cgroup, resource) and host-wide, since first read."""
        watched = self._attached()
        self._moved.next_read()
        for resource in RESOURCES:
            text = read_file(f"{self._proc}/pressure/{resource}")
            parsed = None if text is None else parse_pressure(text)
            if parsed is not None:
                self._add((None, resource), parsed)
        root = f"{watched.v2_root}"
        for path in watched.with_ancestors(watched.busy):
            cgroup_id = watched.id_of(path)
            if cgroup_id is None:
                continue
            for resource in RESOURCES:
                text = read_file(f"{root}{path}/{resource}.pressure")
                parsed = None if text is None else parse_pressure(text)
                if parsed is None:
                    continue
                self._add((cgroup_id, resource), parsed)
        # Every key ever read, moved or not: one left out would count afresh when it returns.
        counters: dict[tuple[str, Labels], int] = {}
        for (cgroup_id, resource), (some, full) in self._totals.items():
            if cgroup_id is None:
                counters[(HOST_SOME, labels(resource=resource))] = some
                counters[(HOST_FULL, labels(resource=resource))] = full
            else:
                key = labels(cgroup=cgroup_id, resource=resource)
                counters[(SOME, key)] = some
                counters[(FULL, key)] = full
        return Snapshot(PROBE_NAME, time.time_ns(), {}, counters)

    def forget(self, cgroup_ids: set[int]) -> None:
        self._totals = {k: v for k, v in self._totals.items() if k[0] not in cgroup_ids}
        self._moved.forget(lambda key: isinstance(key, tuple) and key[0] in cgroup_ids)
        super().forget(cgroup_ids)
