"""Run-queue wait per cgroup (5 µs histograms) and who displaced whom: user side of
``runqueue.bpf.c`` (what it measures and how it attributes is documented there)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Final

from tailsight.histfile import HistDocument
from tailsight.probes.base import Labels, Snapshot, labels
from tailsight.probes.bccprobe import BccProbe, read_histograms
from tailsight.probes.catalog import PROBE_TRACEPOINTS
from tailsight.probes.outliers import DEFAULT_OUTLIER_FLOOR_NS, DEFAULT_OUTLIER_RATE_PER_S

PROBE_NAME: Final = "runqueue"
# Index i of the kernel's runqueue_dropped_events array (DROP_* in runqueue.bpf.c).
DROP_REASONS: Final = ("stamp_update", "hist_full", "pair_full", "untraced_switch")
DISPLACED_WAIT: Final = "runqueue_displaced_wait_ns"
DISPLACED_SWITCHES: Final = "runqueue_displaced_switches"
DROPPED: Final = "runqueue_dropped_events"


class RunQueueProbe(BccProbe):
    """Loads, attaches and reads the run-queue probe.

    ``cgroup_ids``: if given, only waits of tasks in exactly these cgroup ids are recorded
    (kernel allow-list; update it with ``set_cgroup_filter`` as cgroups come and go).
    Waits above ``max(outlier_floor_ns, P99 bucket of the cgroup)`` become outlier events with
    the victim's stacks, at most ``outlier_rate_per_s`` per CPU.
    """

    name = PROBE_NAME
    tracepoints = PROBE_TRACEPOINTS[PROBE_NAME]

    def __init__(
        self,
        cgroup_ids: Iterable[int] | None = None,
        outlier_floor_ns: int = DEFAULT_OUTLIER_FLOOR_NS,
        outlier_rate_per_s: int = DEFAULT_OUTLIER_RATE_PER_S,
    ) -> None:
        super().__init__(cgroup_ids, outlier_floor_ns, outlier_rate_per_s)

    def read(self) -> Snapshot:
        """Cumulative wait histograms per cgroup id, displaced wait per pair, drops and
        outlier stacks."""
        bpf = self._require_bpf()
        taken_ns = time.time_ns()
        wait = read_histograms(
            bpf[b"runqueue_wait_hist"],
            bpf[b"runqueue_wait_totals"],
            lambda cell: int(cell.cgroup_id),
            lambda cgroup_id: int(cgroup_id.value),
        )
        counters: dict[tuple[str, Labels], int] = {}
        for pair, pair_wait in bpf[b"runqueue_displaced_wait"].items():
            key = labels(victim=pair.victim_cgroup_id, aggressor=pair.aggressor_cgroup_id)
            counters[(DISPLACED_WAIT, key)] = int(pair_wait.wait_ns)
            counters[(DISPLACED_SWITCHES, key)] = int(pair_wait.count)
        drops = bpf[b"runqueue_dropped_events"]
        for index, reason in enumerate(DROP_REASONS):
            counters[(DROPPED, labels(reason=reason))] = int(drops.sum(index).value)
        assert self.outliers is not None
        self.outliers.drain()
        self.outliers.update_thresholds(wait)
        counters.update(self.outliers.counters(PROBE_NAME))
        histograms = {labels(cgroup=cgroup_id): hist for cgroup_id, hist in wait.items()}
        return Snapshot(PROBE_NAME, taken_ns, histograms, counters)


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
