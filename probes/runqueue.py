"""Run-queue wait per cgroup (5 µs histograms) and who displaced whom: user side of
``runqueue.bpf.c`` (what it measures and how it attributes is documented there)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Final

import numpy as np

from tailsight.intervals import HistDocument
from tailsight.probes.base import (
    HIST_ROW,
    CounterInfo,
    Labels,
    PairCounters,
    ProbeInfo,
    SeriesInfo,
    Snapshot,
    labels,
)
from tailsight.probes.bccprobe import (
    BccProbe,
    drops_help,
    release_slots,
    slot_histograms,
    slot_ids,
    steer_slot_hint,
)
from tailsight.probes.offsets import resolve_offsets
from tailsight.probes.outliers import (
    DEFAULT_OUTLIER_FLOOR_NS,
    DEFAULT_OUTLIER_RATE_PER_S,
    outlier_counters,
)

PROBE_NAME: Final = "runqueue"
# Index i of the kernel's runqueue_dropped_events array (DROP_* in runqueue.bpf.c).
DROP_REASONS: Final = ("slots_full", "untraced_switch")
MAX_SLOTS: Final = 256
"""Cgroups the probe can tell apart (slot 0 is the idle aggressor); memory: 4.2 MiB of
histogram rows + 1 MiB of victim x aggressor pairs, shared by all CPUs (-DRUNQUEUE_MAX_SLOTS),
plus 1 MiB of per-task run_delay (65,536 tids, for the waits of tasks moved between CPUs)."""
# Fields of the kernel's own run-queue wait (sched_info_arrive: rq->clock - last_queued).
SCHED_FIELDS: Final = {
    "SCHED_INFO_LAST_QUEUED_OFF": ("task_struct", "sched_info.last_queued"),
    "SCHED_INFO_RUN_DELAY_OFF": ("task_struct", "sched_info.run_delay"),
    "SCHED_INFO_PCOUNT_OFF": ("task_struct", "sched_info.pcount"),
    "TASK_SE_CFS_RQ_OFF": ("task_struct", "se.cfs_rq"),
    "CFS_RQ_RQ_OFF": ("cfs_rq", "rq"),
    "RQ_CLOCK_OFF": ("rq", "clock"),
}
DISPLACED_WAIT: Final = "runqueue_displaced_wait_ns"
DISPLACED_SWITCHES: Final = "runqueue_displaced_switches"
DROPPED: Final = "runqueue_dropped_events"
STEAL: Final = "host_cpu_steal_ns"
INFO: Final = ProbeInfo(
    name=PROBE_NAME,
    title="run-queue wait",
    tracepoints=("sched_switch",),
    series=(
        SeriesInfo(
            "wait",
            "run-queue wait",
            "Time a task waited on a run queue, from becoming runnable (woken or preempted) to "
            "running, by cgroup; the kernel's own sched_info run_delay.",
        ),
    ),
    counters=(
        CounterInfo(
            DISPLACED_WAIT,
            "Run-queue wait of the victim cgroup's tasks while the aggressor cgroup's task held "
            "the CPU (aggressor idle: the CPU was idle).",
        ),
        CounterInfo(DISPLACED_SWITCHES, "Switches in behind the aggressor, by victim."),
        CounterInfo(DROPPED, drops_help("Waits", DROP_REASONS)),
        CounterInfo(
            STEAL,
            "Time the hypervisor ran something else on this virtual CPU (steal time from "
            "/proc/stat), by CPU: to the kernel the CPU looked idle, so its waits show as "
            "displaced by idle.",
        ),
        *outlier_counters(PROBE_NAME),
    ),
)


def read_cpu_times_ns(proc_root: Path | str = "/proc") -> dict[int, list[int]]:
    """Per-CPU times in ns since boot (``cpuN`` lines of ``<proc_root>/stat``: user, nice,
    system, idle, iowait, irq, softirq, steal, ... in USER_HZ ticks); empty where unreadable."""
    try:
        text = (Path(proc_root) / "stat").read_text(encoding="ascii")
    except OSError:
        return {}
    tick_ns = 1_000_000_000 // os.sysconf("SC_CLK_TCK")
    times: dict[int, list[int]] = {}
    for line in text.splitlines():
        if not line.startswith("cpu"):
            continue  # intr, softirq, ...: not split (the intr line holds hundreds of numbers)
        name, *values = line.split()
        if name[3:].isdigit():
            times[int(name[3:])] = [int(value) * tick_ns for value in values]
    return times


def read_steal_ns(proc_root: Path | str = "/proc") -> dict[int, int]:
    """Per-CPU steal time in ns since boot (:func:`read_cpu_times_ns`' 8th value); empty where
    the kernel does not say."""
    return {cpu: t[7] for cpu, t in read_cpu_times_ns(proc_root).items() if len(t) >= 8}


class RunQueueProbe(BccProbe):
    """Loads, attaches and reads the run-queue probe.

    ``cgroup_ids``: if given, only waits of tasks in exactly these cgroup ids are recorded
    (kernel allow-list; update it with ``set_cgroup_filter`` as cgroups come and go).
    Waits above ``max(outlier_floor_ns, P99 bucket of the cgroup)`` become outlier events with
    the victim's stacks, at most ``outlier_rate_per_s`` per CPU.
    """

    name = PROBE_NAME
    tracepoints = INFO.tracepoints
    drop_reasons = DROP_REASONS
    has_outliers = True

    def __init__(
        self,
        cgroup_ids: Iterable[int] | None = None,
        outlier_floor_ns: int = DEFAULT_OUTLIER_FLOOR_NS,
        outlier_rate_per_s: int = DEFAULT_OUTLIER_RATE_PER_S,
    ) -> None:
        super().__init__(cgroup_ids, outlier_floor_ns, outlier_rate_per_s)
        # Per victim cgroup: wait displaced by removed cgroups, whose pair cells were cleared
        # (a victim's exact wait sum is its row of pair cells: it must not go backwards).
        self._retired_wait: dict[int, int] = {}

    def extra_cflags(self) -> list[str]:
        """BTF offsets of sched_info (last_queued, run_delay, pcount) and of next -> cfs_rq ->
        rq -> clock (needs CONFIG_SCHED_INFO and CONFIG_FAIR_GROUP_SCHED), and the slot count."""
        offsets = resolve_offsets(fields=SCHED_FIELDS)
        return [f"-D{macro}={value}" for macro, value in offsets.items()] + [
            f"-DRUNQUEUE_MAX_SLOTS={MAX_SLOTS}"
        ]

    def read(self) -> Snapshot:
        """Cumulative wait histograms per cgroup id, displaced wait per pair, drops and
        outlier stacks."""
        bpf = self._require_bpf()
        taken_ns = time.time_ns()
        cgroup_of = slot_ids(bpf[b"runqueue_slots"])
        steer_slot_hint(bpf, PROBE_NAME, cgroup_of, 1, MAX_SLOTS)
        cgroup_of[0] = 0
        slots = sorted(cgroup_of)
        hist_rows = self.mapped_array("runqueue_wait_hist", np.uint64, (MAX_SLOTS, HIST_ROW))
        pairs = self.mapped_array("runqueue_displaced_wait", np.uint64, (MAX_SLOTS, MAX_SLOTS, 2))
        # Pairs first: a wait lands in the histogram before its pair, so a read racing with a
        # switch sees at most one more histogram sample than pair samples, never fewer.
        pair_block = pairs[np.ix_(slots, slots)]  # fancy indexing copies: one read each
        rows = hist_rows[slots]
        totals = pair_block[:, :, 0].sum(axis=1, dtype=np.uint64)
        sums = [
            int(total) + self._retired_wait.get(cgroup_of[slot], 0)
            for slot, total in zip(slots, totals, strict=True)
        ]
        ids = tuple(cgroup_of[slot] for slot in slots)
        wait = slot_histograms(ids, rows, sums)
        counters: dict[tuple[str, Labels], int] = dict(self.drop_counters())
        assert self.outliers is not None
        self.outliers.drain()
        self.outliers.update_thresholds(wait)
        counters.update(self.outliers.counters(PROBE_NAME))
        for cpu, steal_ns in read_steal_ns().items():
            counters[(STEAL, labels(cpu=str(cpu)))] = steal_ns
        histograms = wait.with_keys([labels(cgroup=cgroup_id) for cgroup_id in wait.row_keys])
        # Up to slots^2 pairs on a busy host: kept as the matrix read (a pair is there once it
        # has a switch), and subtracted as one.
        pair_counters = PairCounters(
            counters, (DISPLACED_WAIT, DISPLACED_SWITCHES), ids, pair_block, present=1
        )
        return Snapshot(PROBE_NAME, taken_ns, histograms, pair_counters)

    def forget(self, cgroup_ids: set[int]) -> None:
        """Clear removed cgroups' rows (as victim and as aggressor) and give their slots back."""
        bpf = self._require_bpf()
        table = bpf[b"runqueue_slots"]
        cgroup_of = slot_ids(table)
        gone = sorted(slot for slot, cgroup_id in cgroup_of.items() if cgroup_id in cgroup_ids)
        if gone:
            pairs = self.mapped("runqueue_displaced_wait", np.uint64, (MAX_SLOTS, MAX_SLOTS, 2))
            hist_rows = self.mapped("runqueue_wait_hist", np.uint64, (MAX_SLOTS, HIST_ROW))
            moved = pairs.array[:, gone, 0].sum(axis=1, dtype=np.uint64)
            for slot in np.nonzero(moved)[0]:
                victim = 0 if slot == 0 else cgroup_of.get(int(slot))
                if victim is not None and victim not in cgroup_ids:
                    self._retired_wait[victim] = self._retired_wait.get(victim, 0) + int(
                        moved[slot]
                    )
            pairs.zero(np.s_[gone, :, :])
            pairs.zero(np.s_[:, gone, :])
            hist_rows.zero(np.s_[gone])
            release_slots(bpf, PROBE_NAME, [table.Key(cgroup_of[slot]) for slot in gone])
        for cgroup_id in cgroup_ids:
            self._retired_wait.pop(cgroup_id, None)
        assert self.outliers is not None
        self.outliers.forget(cgroup_ids)


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
    return {"sched_switch": ["bool", task, task, "unsigned int"]}
