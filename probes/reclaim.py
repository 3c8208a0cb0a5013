"""Direct memory reclaim and compaction stalls per cgroup of the stalled task (5 µs
histograms): user side of ``reclaim.bpf.c`` (what it measures and how it attributes is
documented there).

Series ``{cgroup, kind}`` with kind ``direct`` (global reclaim), ``memcg`` (cgroup limit
reclaim) or ``compaction`` (direct compaction, where the kernel has it); counters
``reclaim_pages_reclaimed{cgroup, kind}`` and ``reclaim_dropped_events{reason}``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Final

import numpy as np

from tailsight.probes.base import (
    HIST_ROW,
    CounterInfo,
    Labels,
    ProbeInfo,
    SeriesInfo,
    Snapshot,
    labels,
)
from tailsight.probes.bccprobe import (
    BccProbe,
    cgroup_slots,
    drops_help,
    release_slots,
    slot_histograms,
    steer_slot_hint,
    table_items,
)
from tailsight.probes.btf import Btf, BtfError
from tailsight.probes.offsets import offset_cflags, resolve_offsets

PROBE_NAME: Final = "reclaim"
KINDS: Final = ("direct", "memcg", "compaction")
"""Index i is the kernel's KIND_* (reclaim.bpf.c): the series' ``kind`` label."""
RECLAIM_TRACEPOINTS: Final = (
    "mm_vmscan_direct_reclaim_begin",
    "mm_vmscan_direct_reclaim_end",
    "mm_vmscan_memcg_reclaim_begin",
    "mm_vmscan_memcg_reclaim_end",
)
COMPACTION_TRACEPOINTS: Final = ("mm_compaction_begin", "mm_compaction_end")
"""Only with CONFIG_COMPACTION: attached where BTF names them."""
COMPACTION_FIELDS: Final = {"CC_DIRECT_OFF": ("compact_control", "direct_compaction")}
DROP_REASONS: Final = ("series_full", "tasks_full", "unpaired_end")
"""Index i of the kernel's reclaim_dropped_events (DROP_* in reclaim.bpf.c)."""
PAGES_RECLAIMED: Final = "reclaim_pages_reclaimed"
DROPPED: Final = "reclaim_dropped_events"
INFO: Final = ProbeInfo(
    name=PROBE_NAME,
    title="memory reclaim stalls",
    tracepoints=RECLAIM_TRACEPOINTS + COMPACTION_TRACEPOINTS,
    series=(
        SeriesInfo(
            "direct",
            "direct reclaim stall",
            "Time a task spent reclaiming memory itself because the host ran low "
            "(global direct reclaim), by cgroup of the task.",
        ),
        SeriesInfo(
            "memcg",
            "cgroup reclaim stall",
            "Time a task spent reclaiming memory of its cgroup to stay under the cgroup's "
            "limit (memory.limit_in_bytes, memory.max or memory.high), by cgroup of the task.",
        ),
        SeriesInfo(
            "compaction",
            "direct compaction stall",
            "Time a task spent compacting memory for a higher-order allocation, by cgroup of "
            "the task.",
        ),
    ),
    counters=(
        CounterInfo(PAGES_RECLAIMED, "Pages the stalls reclaimed, by cgroup of the task and kind."),
        CounterInfo(DROPPED, drops_help("Stalls", DROP_REASONS)),
    ),
)
MAX_SERIES: Final = 192
"""(cgroup, kind) series the probe tells apart (-DRECLAIM_MAX_SERIES): 3.0 MiB of histogram
rows, shared by all CPUs."""
MAX_TASKS: Final = 4096
"""Tasks in a stall at once (-DRECLAIM_MAX_TASKS): one begin timestamp each."""


def stall_labels(cgroup_id: int, kind: int) -> Labels:
    """A kernel series' labels (``kind`` a KIND_* index)."""
    return labels(cgroup=cgroup_id, kind=KINDS[kind])


class ReclaimProbe(BccProbe):
    """Loads, attaches and reads the reclaim probe.

    ``cgroup_ids``: if given, only stalls of tasks in exactly these cgroup ids are recorded
    (kernel allow-list; ``set_cgroup_filter`` changes it at any time).
    """

    name = PROBE_NAME
    tracepoints = INFO.tracepoints
    drop_reasons = DROP_REASONS

    def __init__(self, cgroup_ids: Iterable[int] | None = None) -> None:
        super().__init__(cgroup_ids)
        self.has_compaction = False
        """The kernel has the compaction tracepoints (CONFIG_COMPACTION): attached."""

    def extra_cflags(self) -> list[str]:
        """Table sizes and, where the kernel compacts, compact_control.direct_compaction's
        offset from BTF."""
        btf = Btf.load()
        cflags = [f"-DRECLAIM_MAX_SERIES={MAX_SERIES}", f"-DRECLAIM_MAX_TASKS={MAX_TASKS}"]
        try:
            for tracepoint in COMPACTION_TRACEPOINTS:
                btf.tracepoint_args(tracepoint)
            offsets = resolve_offsets(btf, COMPACTION_FIELDS)
        except BtfError:
            self.has_compaction = False
            return cflags
        self.has_compaction = True
        return [*cflags, *offset_cflags(offsets), "-DRECLAIM_HAS_COMPACTION"]

    def attach_tracepoints(self) -> Sequence[str]:
        """The reclaim pairs, and compaction's where the kernel has it (``extra_cflags``)."""
        self.tracepoints = RECLAIM_TRACEPOINTS + (
            COMPACTION_TRACEPOINTS if self.has_compaction else ()
        )
        return self.tracepoints

    def read(self) -> Snapshot:
        """Cumulative stall histograms per (cgroup, kind), pages reclaimed, drops."""
        bpf = self._require_bpf()
        taken_ns = time.time_ns()
        series_of = {
            int(slot.value): (int(key.cgroup_id), int(key.kind))
            for key, slot in table_items(bpf[b"reclaim_slots"])
        }
        slots = sorted(series_of)
        steer_slot_hint(bpf, PROBE_NAME, slots, 0, MAX_SERIES)
        hist_rows = self.mapped_array("reclaim_stall_hist", np.uint64, (MAX_SERIES, HIST_ROW))
        totals = self.mapped_array("reclaim_totals", np.uint64, (MAX_SERIES, 2))
        # Sums first: a stall lands in its bucket before its sum, so the rows read after
        # explain at least the sums read before.
        total_block = totals[slots]
        rows = hist_rows[slots]
        keys = [stall_labels(*series_of[slot]) for slot in slots]
        stalls = slot_histograms(keys, rows, total_block[:, 0].tolist())
        counters: dict[tuple[str, Labels], int] = dict(self.drop_counters())
        for key, pages in zip(keys, total_block[:, 1].tolist(), strict=True):
            if pages:
                counters[(PAGES_RECLAIMED, key)] = int(pages)
        return Snapshot(PROBE_NAME, taken_ns, stalls, counters)

    def forget(self, cgroup_ids: set[int]) -> None:
        """Clear removed cgroups' rows and give their series slots back."""
        bpf = self._require_bpf()
        gone = cgroup_slots(bpf, PROBE_NAME, cgroup_ids)
        if gone:
            slots = sorted(slot for _, slot in gone)
            self.mapped("reclaim_stall_hist", np.uint64, (MAX_SERIES, HIST_ROW)).zero(np.s_[slots])
            self.mapped("reclaim_totals", np.uint64, (MAX_SERIES, 2)).zero(np.s_[slots])
            release_slots(bpf, PROBE_NAME, [key for key, _ in gone])


def expected_tracepoint_args() -> Mapping[str, Sequence[str]]:
    """The raw tracepoint signatures reclaim.bpf.c reads (``ctx->args[i]``), for BTF checks:
    the ends' page count and compaction's compact_control."""
    begin = ["int", "gfp_t"]
    end = ["long unsigned int"]
    return {
        "mm_vmscan_direct_reclaim_begin": begin,
        "mm_vmscan_direct_reclaim_end": end,
        "mm_vmscan_memcg_reclaim_begin": begin,
        "mm_vmscan_memcg_reclaim_end": end,
        "mm_compaction_begin": ["struct compact_control *"],
        "mm_compaction_end": ["struct compact_control *"],
    }
