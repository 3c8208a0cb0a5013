"""CPU throttling of a cgroup by its own CPU limit (CFS bandwidth control), from cgroupfs.

A cgroup with a quota (cgroup v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``) that spends it within a
period (100 ms by default) is parked until the next one, even when its average use is far below
the limit: its tasks then wait on the run queue as if a neighbour held the CPU. The kernel counts
it per cgroup in ``cpu.stat``: periods with runnable tasks (``nr_periods``), periods in which the
quota ran out (``nr_throttled``) and the time throttled (v2 ``throttled_usec``, v1
``throttled_time`` in ns). Read once per interval for every cgroup with a limit (found by walks
of the hierarchies, one begun every ``RESCAN_INTERVALS`` reads and spread over them, over more
on a host of many cgroups), and for the busiest ones and their ancestors (a limit set mid-run
is seen from its first interval there); the limit is the ``cpu_max`` label, as v2 writes it
("20000 100000": 20 ms per 100 ms).
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from tailsight.cgroups import DEFAULT_MOUNTS_PATH
from tailsight.probes.base import CounterInfo, Labels, ProbeInfo, Snapshot, labels
from tailsight.probes.cgroupfiles import (
    RESCAN_INTERVALS,
    WALKED_PER_READ,
    FileProbe,
    Increments,
    find_v1_mount,
    key_values,
    read_file,
    v2_path_of_task,
    walk_paths,
)
from tailsight.probes.loader import ProbeError

PROBE_NAME: Final = "throttle"
PERIODS: Final = "throttle_periods"
THROTTLED_PERIODS: Final = "throttle_throttled_periods"
THROTTLED: Final = "throttle_throttled_ns"
COUNTERS: Final = (PERIODS, THROTTLED_PERIODS, THROTTLED)
LIMIT_LABEL: Final = "cpu_max"
INFO: Final = ProbeInfo(
    name=PROBE_NAME,
    title="CPU throttling by the cgroup's own limit",
    tracepoints=(),
    files=("cpu.stat", "cpu.max", "v1 cpu.cfs_quota_us", "v1 cpu.cfs_period_us"),
    counters=(
        CounterInfo(PERIODS, "CFS bandwidth periods in which the cgroup had runnable tasks."),
        CounterInfo(THROTTLED_PERIODS, "Periods in which the cgroup spent its CPU quota."),
        CounterInfo(THROTTLED, "Time the cgroup was throttled (parked until its next period)."),
    ),
)


def cpu_max_text(cpu_max: str) -> str:
    """ "20000 100000" -> "20 ms per 100 ms"."""
    quota, _, period = cpu_max.partition(" ")
    if not quota.isdigit() or not period.isdigit():
        return cpu_max
    return f"{_ms(int(quota))} per {_ms(int(period))}"


def _ms(us: int) -> str:
    return f"{us / 1000:g} ms"


class _Limit:
    """Where one v2 cgroup's CPU limit and counters are read: its own files (v2 controller) or a
    v1 group's."""

    __slots__ = ("directory", "v1")

    def __init__(self, directory: str, v1: bool) -> None:
        self.directory, self.v1 = directory, v1

    def read(self) -> tuple[str | None, tuple[int, int, int]] | None:
        """(the limit as ``cpu.max`` writes it, or None: none; (periods, throttled periods,
        throttled ns)); None where the group is gone."""
        d = self.directory
        stat = read_file(f"{d}/cpu.stat")
        if stat is None:
            return None
        values = key_values(stat)
        if self.v1:
            quota = read_file(f"{d}/cpu.cfs_quota_us")
            if quota is None:
                return None
            limit = None
            if int(quota) >= 0:  # the period matters only with a quota
                period = read_file(f"{d}/cpu.cfs_period_us")
                if period is None:
                    return None
                limit = f"{int(quota)} {int(period)}"
            throttled_ns = values.get(b"throttled_time", 0)
        else:
            text = read_file(f"{d}/cpu.max")
            if text is None:
                return None
            quota_text, _, period_text = text.decode().strip().partition(" ")
            limit = None if quota_text == "max" else f"{quota_text} {period_text}"
            throttled_ns = values.get(b"throttled_usec", 0) * 1000
        counts = (values.get(b"nr_periods", 0), values.get(b"nr_throttled", 0), throttled_ns)
        return limit, counts


class ThrottleProbe(FileProbe):
    """Reads the throttling counters of cgroups with a CPU limit (see the module docstring)."""

    name = PROBE_NAME

    def __init__(
        self,
        v2_root: Path | str | None = None,
        v1_cpu_root: Path | str | None = None,
        mounts_path: Path | str = DEFAULT_MOUNTS_PATH,
        proc: Path | str = "/proc",
    ) -> None:
        super().__init__(v2_root, mounts_path)
        self._v1_root = None if v1_cpu_root is None else Path(v1_cpu_root)
        self._proc = proc
        self._limited: dict[str, _Limit] = {}  # v2 path -> where its limit is, found by a walk
        self._walk: Iterator[tuple[str, _Limit] | None] | None = None  # the walk under way
        self._found: dict[str, _Limit] = {}  # what it found so far
        self._walked = self._walk_size = 0  # directories it visited so far, and the last one
        self._walk_began = 0  # the read in which it began
        self._where_of: dict[str, _Limit | None] = {}  # _where's answers, until a walk ends
        self._moved = Increments()  # by cgroup id
        self._totals: dict[tuple[int, str], list[int]] = {}  # (cgroup id, limit) -> counters

    def attach(self) -> None:
        """Find the hierarchies; ProbeError where no cpu controller is mounted."""
        v2_root = self._find_v2_root()
        if self._v1_root is None:
            self._v1_root = find_v1_mount("cpu", self._mounts_path)
        v2_cpu = b"cpu" in (read_file(f"{v2_root}/cgroup.controllers") or b"").split()
        if self._v1_root is None and not v2_cpu:
            raise ProbeError(
                "throttle: no cpu controller, neither on cgroup v2 (cgroup.controllers) nor "
                "mounted on v1: there is no CPU limit to be throttled by"
            )
        self._start_watching()

    def _where(self, path: str) -> _Limit | None:
        """Where a v2 cgroup's limit lives: its own cpu.max, or a v1 group of the same path
        (kept until the walk under way ends: two stats per watched cgroup and read saved)."""
        if path in self._where_of:
            return self._where_of[path]
        where = self._where_of[path] = self._find_where(path)
        return where

    def _find_where(self, path: str) -> _Limit | None:
        assert self._v2_root is not None
        own = f"{self._v2_root}{path if path != '/' else ''}"
        if os.path.exists(f"{own}/cpu.max"):
            return _Limit(own, v1=False)
        if self._v1_root is not None:
            v1 = f"{self._v1_root}{path if path != '/' else ''}"
            if os.path.exists(f"{v1}/cpu.cfs_quota_us"):
                return _Limit(v1, v1=True)
        return None

    def _limits(self) -> Iterator[tuple[str, _Limit] | None]:
        """A walk of the hierarchies, one item per directory: (v2 path, where its limit is) for
        a cgroup with a limit now (a v2 cpu.max with a quota; a v1 cfs_quota_us set, matched to
        the v2 cgroup of the same path, else of its first task's), else None."""
        assert self._v2_root is not None
        if b"cpu" in (read_file(f"{self._v2_root}/cgroup.subtree_control") or b"").split():
            for path in walk_paths(self._v2_root):
                text = read_file(f"{self._v2_root}{path}/cpu.max") if path != "/" else None
                limited = text is not None and not text.startswith(b"max")
                yield (path, _Limit(f"{self._v2_root}{path}", v1=False)) if limited else None
        if self._v1_root is not None:
            for path in walk_paths(self._v1_root):
                yield self._v1_limit(path)

    def _v1_limit(self, path: str) -> tuple[str, _Limit] | None:
        where = f"{self._v1_root}{path if path != '/' else ''}"
        quota = read_file(f"{where}/cpu.cfs_quota_us")
        if quota is None or int(quota) < 0:
            return None
        v2_path: str | None = path
        if not os.path.isdir(f"{self._v2_root}{path}"):
            procs = (read_file(f"{where}/cgroup.procs") or b"").split()
            v2_path = v2_path_of_task(int(procs[0]), self._proc) if procs else None
        return None if v2_path is None else (v2_path, _Limit(where, v1=True))

    def _walk_on(self, budget: int | None) -> None:
        """Walk on for ``budget`` directories (None: to the end). Where a walk ends, the cgroups
        it found with a limit replace those of the walk before, and the next one starts."""
        if self._walk is None:
            self._walk, self._found, self._walked = self._limits(), {}, 0
            self._walk_began = self._moved.reads
        visited = 0
        for item in itertools.islice(self._walk, budget):
            visited += 1
            if item is not None:
                self._found.setdefault(item[0], item[1])
        self._walked += visited
        if budget is None or visited < budget:
            self._limited, self._walk_size, self._walk = self._found, self._walked, None
            self._where_of.clear()

    def read(self) -> Snapshot:
        """Cumulative counters, per (cgroup, limit), since each cgroup was first read."""
        watched = self._attached()
        reads = self._moved.reads
        if reads == 0:  # the first read walks all at once
            self._walk_on(None)
        elif self._walk is not None or reads - self._walk_began >= RESCAN_INTERVALS:
            # A walk every RESCAN_INTERVALS reads, spread over them (over more where it would
            # walk more than WALKED_PER_READ directories per read).
            share = -(-self._walk_size // RESCAN_INTERVALS)
            self._walk_on(max(1, min(WALKED_PER_READ, share)))
        self._moved.next_read()
        wanted = {path: None for path in watched.with_ancestors(watched.busy)}
        wanted.update(dict.fromkeys(self._limited))
        for path in wanted:
            cgroup_id = watched.id_of(path)
            if cgroup_id is None:
                continue
            where = self._limited.get(path) or self._where(path)
            reading = None if where is None else where.read()
            if reading is None:
                continue
            limit, now = reading
            moved = self._moved.since_last(cgroup_id, now)
            if limit is not None:  # periods before a limit was set count under the new one
                total = self._totals.setdefault((cgroup_id, limit), [0, 0, 0])
                for k, value in enumerate(moved):
                    total[k] += value
        counters: dict[tuple[str, Labels], int] = {}
        for (cgroup_id, limit), total in self._totals.items():
            key = labels(cgroup=cgroup_id, cpu_max=limit)
            for name, value in zip(COUNTERS, total, strict=True):
                counters[(name, key)] = value
        return Snapshot(PROBE_NAME, time.time_ns(), {}, counters)

    def forget(self, cgroup_ids: set[int]) -> None:
        self._moved.forget(lambda key: key in cgroup_ids)
        self._totals = {k: v for k, v in self._totals.items() if k[0] not in cgroup_ids}
        super().forget(cgroup_ids)

    def close(self) -> None:
        super().close()
        self._walk = None
