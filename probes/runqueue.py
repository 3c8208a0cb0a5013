"""Run-queue wait per cgroup (5 µs histograms) and who displaced whom: user side of
``runqueue.bpf.c`` (what it measures and how it attributes is documented there)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, Final

from tailsight.hist import Histogram
from tailsight.histfile import HistDocument
from tailsight.probes.base import Labels, Snapshot, labels
from tailsight.probes.catalog import PROBE_TRACEPOINTS

PROBE_NAME: Final = "runqueue"
# Index i of the kernel's runqueue_dropped_events array (DROP_* in runqueue.bpf.c).
DROP_REASONS: Final = ("stamp_update", "hist_full", "pair_full", "untraced_switch")
DISPLACED_WAIT: Final = "runqueue_displaced_wait_ns"
DISPLACED_SWITCHES: Final = "runqueue_displaced_switches"
DROPPED: Final = "runqueue_dropped_events"


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
            self._bpf = bpf
            if self._filter is not None:
                self._sync_filter()
            self._attached = attach_raw_tracepoints(bpf, PROBE_NAME, PROBE_TRACEPOINTS[PROBE_NAME])
        except BaseException:
            self._bpf = None
            bpf.cleanup()
            raise

    def set_cgroup_filter(self, cgroup_ids: Iterable[int] | None) -> None:
        """Record only waits of these victim cgroup ids (None: all).

        Before ``attach`` this chooses whether the filter is compiled in; once attached, only
        the id set can change (ValueError on switching between None and a set).
        """
        wanted = None if cgroup_ids is None else set(cgroup_ids)
        if self._bpf is not None and (wanted is None) != (self._filter is None):
            raise ValueError("runqueue: cgroup filtering on/off is fixed at attach")
        self._filter = wanted
        if self._bpf is not None and wanted is not None:
            self._sync_filter()

    def _sync_filter(self) -> None:
        import ctypes

        assert self._filter is not None
        table = self._bpf[b"runqueue_cgroup_allow"]
        present = {k.value for k in table}
        for cgroup_id in present - self._filter:
            del table[table.Key(cgroup_id)]
        for cgroup_id in self._filter - present:
            table[table.Key(cgroup_id)] = ctypes.c_uint8(1)

    def read(self) -> Snapshot:
        """Cumulative wait histograms per cgroup id, displaced wait per pair and drops."""
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
        counters: dict[tuple[str, Labels], int] = {}
        for pair, pair_wait in bpf[b"runqueue_displaced_wait"].items():
            key = labels(victim=pair.victim_cgroup_id, aggressor=pair.aggressor_cgroup_id)
            counters[(DISPLACED_WAIT, key)] = int(pair_wait.wait_ns)
            counters[(DISPLACED_SWITCHES, key)] = int(pair_wait.count)
        drops = bpf[b"runqueue_dropped_events"]
        for index, reason in enumerate(DROP_REASONS):
            counters[(DROPPED, labels(reason=reason))] = int(drops.sum(index).value)
        histograms = {labels(cgroup=cgroup_id): hist for cgroup_id, hist in wait.items()}
        return Snapshot(PROBE_NAME, taken_ns, histograms, counters)

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


def top_pairs(document: HistDocument, limit: int = 5) -> list[tuple[str, str, int, int]]:
    """(victim, aggressor, wait_ns, switches) with the most displaced wait first."""
    waits: dict[tuple[str, str], list[int]] = {}
    for counter in document.counters:
        if counter.name not in (DISPLACED_WAIT, DISPLACED_SWITCHES):
            continue
        key = (counter.labels["victim"], counter.labels["aggressor"])
        slot = waits.setdefault(key, [0, 0])
        slot[0 if counter.name == DISPLACED_WAIT else 1] += counter.value
    ranked = sorted(waits.items(), key=lambda kv: (-kv[1][0], kv[0]))
    return [(v, a, w, n) for (v, a), (w, n) in ranked[:limit] if n]


def expected_tracepoint_args() -> Mapping[str, Sequence[str]]:
    """The raw tracepoint signatures runqueue.bpf.c reads (``ctx->args[i]``), for BTF checks."""
    task = "struct task_struct *"
    return {
        "sched_wakeup": [task],
        "sched_wakeup_new": [task],
        "sched_switch": ["bool", task, task, "unsigned int"],
    }
