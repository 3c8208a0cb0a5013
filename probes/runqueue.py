"""Run-queue wait per cgroup (5 µs histograms) and who displaced whom: user side of
``runqueue.bpf.c`` (what it measures and how it attributes is documented there)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Final

from tailsight.probes.catalog import PROBE_TRACEPOINTS

from tailsight.hist import Histogram
from tailsight.histfile import Counter, HistDocument, Series

PROBE_NAME: Final = "runqueue"
IDLE_AGGRESSOR: Final = "idle"
# Index i of the kernel's runqueue_dropped_events array (DROP_* in runqueue.bpf.c).
DROP_REASONS: Final = ("stamp_update", "hist_full", "pair_full", "untraced_switch")

PairKey = tuple[int, int]
"""(victim cgroup id, aggressor cgroup id); aggressor 0 = the CPU was idle."""


@dataclass(frozen=True)
class PairWait:
    """Run-queue wait charged to one (victim, aggressor) pair."""

    wait_ns: int
    switches: int

    def __sub__(self, earlier: PairWait) -> PairWait:
        return PairWait(self.wait_ns - earlier.wait_ns, self.switches - earlier.switches)


@dataclass(frozen=True)
class RunQueueSnapshot:
    """Cumulative probe state at ``taken_ns`` (wall clock); subtract two for an interval."""

    taken_ns: int
    wait: Mapping[int, Histogram] = field(default_factory=dict)
    displaced: Mapping[PairKey, PairWait] = field(default_factory=dict)
    dropped: Mapping[str, int] = field(default_factory=dict)

    def delta(self, earlier: RunQueueSnapshot) -> RunQueueSnapshot:
        """The interval (earlier, self]; ValueError if a counter went backwards."""
        wait = {}
        for cgroup_id, hist in self.wait.items():
            before = earlier.wait.get(cgroup_id)
            changed = hist if before is None else hist.delta(before)
            if changed.count or changed.sum_ns:
                wait[cgroup_id] = changed
        displaced = {}
        for pair, now in self.displaced.items():
            changed_pair = now - earlier.displaced.get(pair, PairWait(0, 0))
            if changed_pair.wait_ns < 0 or changed_pair.switches < 0:
                raise ValueError(f"pair {pair} went backwards")
            if changed_pair.switches:
                displaced[pair] = changed_pair
        dropped = {k: v - earlier.dropped.get(k, 0) for k, v in self.dropped.items()}
        return RunQueueSnapshot(self.taken_ns, wait, displaced, dropped)

    def __sub__(self, earlier: RunQueueSnapshot) -> RunQueueSnapshot:
        return self.delta(earlier)


class RunQueueProbe:
    """Loads, attaches and reads the run-queue probe.

    ``cgroup_ids``: if given, only waits of tasks in exactly these cgroup ids are recorded
    (kernel allow-list; update it with ``set_cgroup_filter`` as cgroups come and go).
    """

    name: Final = PROBE_NAME

    def __init__(self, cgroup_ids: Iterable[int] | None = None) -> None:
        self._filter = None if cgroup_ids is None else set(cgroup_ids)
        self._bpf: Any = None
        self._attached: Any = None

    def attach(self) -> None:
        """Compile with verified offsets and attach all three tracepoints (all or nothing)."""
        from tailsight.probes.loader import attach_raw_tracepoints, compile_probe

        if self._bpf is not None:
            return
        cflags = [] if self._filter is None else ["-DRUNQUEUE_CGROUP_FILTER"]
        bpf = compile_probe(PROBE_NAME, cflags)
        try:
            if self._filter is not None:
                self._bpf = bpf
                self.set_cgroup_filter(self._filter)
            self._attached = attach_raw_tracepoints(bpf, PROBE_NAME, PROBE_TRACEPOINTS[PROBE_NAME])
        except BaseException:
            self._bpf = None
            bpf.cleanup()
            raise
        self._bpf = bpf

    def set_cgroup_filter(self, cgroup_ids: Iterable[int]) -> None:
        """Replace the kernel allow-list of victim cgroup ids (probe built with a filter only)."""
        import ctypes

        if self._filter is None:
            raise ValueError("probe was created without a cgroup filter")
        wanted = set(cgroup_ids)
        self._filter = wanted
        if self._bpf is None:
            return
        table = self._bpf[b"runqueue_cgroup_allow"]
        present = {k.value for k in table}
        for cgroup_id in present - wanted:
            del table[table.Key(cgroup_id)]
        for cgroup_id in wanted - present:
            table[table.Key(cgroup_id)] = ctypes.c_uint8(1)

    def read(self) -> RunQueueSnapshot:
        """Cumulative histograms per cgroup id, pair waits and drops, as of now."""
        if self._bpf is None:
            raise RuntimeError("probe not attached")
        bpf = self._bpf
        taken_ns = time.time_ns()
        wait: dict[int, Histogram] = {}
        for key, value in bpf[b"runqueue_wait_hist"].items():
            hist = wait.get(key.cgroup_id)
            if hist is None:
                hist = wait[key.cgroup_id] = Histogram.empty()
            hist.add_bucket(key.bucket, value.value)
        for key, totals in bpf[b"runqueue_wait_totals"].items():
            hist = wait.get(key.value)
            if hist is None:
                hist = wait[key.value] = Histogram.empty()
            hist.sum_ns = totals.sum_ns
        displaced = {
            (k.victim_cgroup_id, k.aggressor_cgroup_id): PairWait(v.wait_ns, v.count)
            for k, v in bpf[b"runqueue_displaced_wait"].items()
        }
        drops = bpf[b"runqueue_dropped_events"]
        dropped = {reason: int(drops.sum(i).value) for i, reason in enumerate(DROP_REASONS)}
        return RunQueueSnapshot(taken_ns, wait, displaced, dropped)

    def program_fds(self) -> dict[str, int]:
        """Program fd per attached tracepoint (for BPF run-time stats via /proc/self/fdinfo)."""
        if self._bpf is None:
            raise RuntimeError("probe not attached")
        return {tp: self._bpf.funcs[f"on_{tp}".encode()].fd for tp in PROBE_TRACEPOINTS[PROBE_NAME]}

    def close(self) -> None:
        """Detach and free the maps; safe to call twice."""
        if self._attached is not None:
            self._attached.close()
            self._attached = None
        if self._bpf is not None:
            self._bpf.cleanup()
            self._bpf = None

    def __enter__(self) -> RunQueueProbe:
        self.attach()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def to_document(
    interval: RunQueueSnapshot,
    start_ns: int,
    cgroup_path: Callable[[Iterable[int]], Mapping[int, str]],
    keep: Callable[[str], bool] | None = None,
) -> HistDocument:
    """An interval (snapshot delta) as ``tailsight.hist/1``: one series per cgroup path,
    displaced-wait counters per victim/aggressor path pair, drop counters.

    ``cgroup_path`` names ids in bulk (e.g. ``CgroupResolver.resolve_many``); ids naming the same
    path (a recreated cgroup) are merged.  ``keep(path)`` filters victims (``--cgroup``).
    """
    ids = set(interval.wait) | {i for pair in interval.displaced for i in pair if i != 0}
    names = dict(cgroup_path(sorted(ids)))

    def name(cgroup_id: int, *, aggressor: bool = False) -> str:
        if aggressor and cgroup_id == 0:
            return IDLE_AGGRESSOR
        return names.get(cgroup_id, "unknown")

    per_path: dict[str, Histogram] = {}
    for cgroup_id, hist in interval.wait.items():
        path = name(cgroup_id)
        if keep is not None and not keep(path):
            continue
        per_path[path] = per_path[path].merge(hist) if path in per_path else hist
    pairs: dict[tuple[str, str], PairWait] = {}
    for (victim_id, aggressor_id), pair_wait in interval.displaced.items():
        victim = name(victim_id)
        if keep is not None and not keep(victim):
            continue
        key = (victim, name(aggressor_id, aggressor=True))
        old = pairs.get(key, PairWait(0, 0))
        pairs[key] = PairWait(old.wait_ns + pair_wait.wait_ns, old.switches + pair_wait.switches)

    series = [
        Series({"probe": PROBE_NAME, "cgroup": path}, hist)
        for path, hist in sorted(per_path.items())
    ]
    counters: list[Counter] = []
    for (victim, aggressor), pair_wait in sorted(pairs.items()):
        labels = {"probe": PROBE_NAME, "victim": victim, "aggressor": aggressor}
        counters.append(Counter("runqueue_displaced_wait_ns", labels, pair_wait.wait_ns))
        counters.append(Counter("runqueue_displaced_switches", labels, pair_wait.switches))
    for reason in DROP_REASONS:
        counters.append(
            Counter(
                "runqueue_dropped_events",
                {"probe": PROBE_NAME, "reason": reason},
                interval.dropped.get(reason, 0),
            )
        )
    return HistDocument(
        start_ns=start_ns, end_ns=interval.taken_ns, series=series, counters=counters
    )


def top_pairs(document: HistDocument, limit: int = 5) -> list[tuple[str, str, int, int]]:
    """(victim, aggressor, wait_ns, switches) with the most displaced wait first."""
    waits: dict[tuple[str, str], list[int]] = {}
    for counter in document.counters:
        if counter.name not in ("runqueue_displaced_wait_ns", "runqueue_displaced_switches"):
            continue
        key = (counter.labels["victim"], counter.labels["aggressor"])
        slot = waits.setdefault(key, [0, 0])
        slot[0 if counter.name.endswith("_ns") else 1] += counter.value
    ranked = sorted(waits.items(), key=lambda kv: (-kv[1][0], kv[0]))
    return [(v, a, w, n) for (v, a), (w, n) in ranked[:limit]]


def expected_tracepoint_args() -> Mapping[str, Sequence[str]]:
    """The raw tracepoint signatures runqueue.bpf.c reads (``ctx->args[i]``), for BTF checks."""
    task = "struct task_struct *"
    return {
        "sched_wakeup": [task],
        "sched_wakeup_new": [task],
        "sched_switch": ["bool", task, task, "unsigned int"],
    }
