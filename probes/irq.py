"""Interrupt time per CPU and vector (5 µs histograms of each run) and the time charged to the
cgroup of the interrupted task: user side of ``irq.bpf.c`` (what it measures and how it
attributes is documented there).

Histograms: ``kind`` (``softirq`` or ``hardirq``), ``cpu``, ``vector`` (a softirq's name,
``NET_RX``; a hardirq's number and, from ``/proc/interrupts``, its name: ``24:virtio0-input.0``).
Counters (cgroup values are ids until ``to_document``; 0 is the idle task):
``irq_charged_ns{cgroup, cpu, kind, vector}``, ``irq_charged_runs{...}``, ``irq_dropped_events``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

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
    MappedArray,
    cgroup_slots,
    drops_help,
    release_slots,
    slot_histograms,
    steer_slot_hint,
    table_items,
)
from tailsight.probes.btf import Btf, BtfError
from tailsight.probes.topology import possible_cpu_ids

PROBE_NAME: Final = "irq"
SOFTIRQ: Final = "softirq"
HARDIRQ: Final = "hardirq"
CHARGED_NS: Final = "irq_charged_ns"
CHARGED_RUNS: Final = "irq_charged_runs"
DROPPED: Final = "irq_dropped_events"
DROP_REASONS: Final = ("series_full", "no_histogram_row", "unseen_entry")
"""Index i of the kernel's irq_dropped_events (DROP_* in irq.bpf.c)."""
INFO: Final = ProbeInfo(
    name=PROBE_NAME,
    title="interrupt time",
    tracepoints=("softirq_entry", "softirq_exit", "irq_handler_entry", "irq_handler_exit"),
    series=(
        SeriesInfo(
            SOFTIRQ,
            "softirq run time",
            "Time of each softirq run, entry to exit less the hardirqs inside it, by CPU and "
            "vector (NET_RX, TIMER...).",
            by=("cpu", "vector"),
        ),
        SeriesInfo(
            HARDIRQ,
            "hardirq handler time",
            "Time of each hardirq handler run, by CPU and irq.",
            by=("cpu", "vector"),
        ),
    ),
    counters=(
        CounterInfo(
            CHARGED_NS,
            "Softirq and hardirq time taken from the cgroup's tasks (the task each run "
            "interrupted; idle: the CPU was idle), by CPU, kind and vector.",
        ),
        CounterInfo(CHARGED_RUNS, "Softirq and hardirq runs that interrupted the cgroup's tasks."),
        CounterInfo(DROPPED, drops_help("Runs", DROP_REASONS)),
    ),
)
SOFTIRQ_NAMES: Final = (
    "HI",
    "TIMER",
    "NET_TX",
    "NET_RX",
    "BLOCK",
    "IRQ_POLL",
    "TASKLET",
    "SCHED",
    "HRTIMER",
    "RCU",
)
"""The softirq vectors since Linux 4.1, where the kernel's BTF does not say."""
MAX_SERIES: Final = 512
"""(cgroup, vector) series the probe tells apart (-DIRQ_MAX_SERIES): 16 bytes per CPU each."""
HARDIRQ_ROWS: Final = 8
"""Irq numbers with a histogram (the first seen); beyond them a run is charged, not binned.
Histogram rows cost 16.5 KiB per CPU each: (softirqs + HARDIRQ_ROWS) x 16.5 KiB per CPU."""
IRQ_VECTOR_FLAG: Final = 0x10000
_SOFTIRQ_ENUMERATOR: Final = "NET_RX_SOFTIRQ"
_ROW_STRIDE: Final = HIST_ROW + 1  # buckets, overflow, exact sum (ROW_STRIDE in irq.bpf.c)


def softirq_names(btf: Any) -> tuple[str, ...]:
    """The softirq vectors in number order from the kernel's (anonymous) enum, less the
    ``_SOFTIRQ`` suffix; SOFTIRQ_NAMES where BTF lacks it."""
    try:
        values = btf.enum_with(_SOFTIRQ_ENUMERATOR)
    except BtfError:
        return SOFTIRQ_NAMES
    named = sorted(
        (value, name.removesuffix("_SOFTIRQ"))
        for name, value in values.items()
        if name.endswith("_SOFTIRQ")
    )
    if [value for value, _ in named] != list(range(len(named))):
        return SOFTIRQ_NAMES
    return tuple(name for _, name in named)


def read_irq_names(proc_root: Path | str = "/proc") -> dict[int, str]:
    """Irq number -> the name ``/proc/interrupts`` gives it (its last column: the handler's
    device, ``virtio0-input.0``); empty where unreadable."""
    try:
        text = (Path(proc_root) / "interrupts").read_text(encoding="ascii", errors="replace")
    except OSError:
        return {}
    lines = text.splitlines()
    if not lines:
        return {}
    cpus = len(lines[0].split())
    names: dict[int, str] = {}
    for line in lines[1:]:
        number, _, rest = line.partition(":")
        if not number.strip().isdigit():
            continue  # NMI, LOC...: architecture vectors, not irq_handler events
        fields = rest.split()[cpus:]
        if fields:
            names[int(number)] = fields[-1]
    return names


def vector_labels(vector: int, softirqs: Sequence[str], irq_names: Mapping[int, str]) -> Labels:
    """``kind`` and ``vector`` labels of the kernel's vector code (IRQ_VECTOR_FLAG: a hardirq)."""
    if vector & IRQ_VECTOR_FLAG:
        irq = vector & ~IRQ_VECTOR_FLAG
        name = irq_names.get(irq)
        return labels(kind=HARDIRQ, vector=f"{irq}:{name}" if name else str(irq))
    name = softirqs[vector] if vector < len(softirqs) else str(vector)
    return labels(kind=SOFTIRQ, vector=name)


class IrqProbe(BccProbe):
    """Loads, attaches and reads the interrupt probe.

    ``cgroup_ids``: charge only runs that interrupted tasks of these cgroups (None: all; the
    idle task is always charged); the histograms are host-wide and always recorded.
    """

    name = PROBE_NAME
    tracepoints = INFO.tracepoints
    drop_reasons = DROP_REASONS

    def __init__(self, cgroup_ids: Iterable[int] | None = None, proc_root: str = "/proc") -> None:
        super().__init__(cgroup_ids)
        self._proc_root = proc_root
        self._cpu_ids = 0
        self.softirqs: tuple[str, ...] = SOFTIRQ_NAMES
        self._irq_names: dict[int, str] = {}

    def extra_cflags(self) -> list[str]:
        """Table sizes: CPU ids, series, the softirq vectors of this kernel, hardirq rows."""
        self.softirqs = softirq_names(Btf.load())
        self._cpu_ids = possible_cpu_ids()
        return [
            f"-DIRQ_NR_CPUS={self._cpu_ids}",
            f"-DIRQ_MAX_SERIES={MAX_SERIES}",
            f"-DIRQ_SOFTIRQ_ROWS={len(self.softirqs)}",
            f"-DIRQ_HARDIRQ_ROWS={HARDIRQ_ROWS}",
        ]

    def _irq_name_map(self, irqs: Iterable[int]) -> dict[int, str]:
        if any(irq not in self._irq_names for irq in irqs):
            self._irq_names = read_irq_names(self._proc_root)
        return self._irq_names

    def read(self) -> Snapshot:
        """Cumulative run-time histograms per (CPU, vector), charged time and runs per
        (cgroup, CPU, vector), drops."""
        bpf = self._require_bpf()
        taken_ns = time.time_ns()
        irq_rows = {
            int(row.value): int(irq.value) for irq, row in table_items(bpf[b"irq_row_slots"])
        }
        series_of = {
            int(slot.value): (int(key.cgroup_id), int(key.vector))
            for key, slot in table_items(bpf[b"irq_slots"])
        }
        irq_names = self._irq_name_map(
            [*irq_rows.values(), *(v & ~IRQ_VECTOR_FLAG for _, v in series_of.values())]
        )
        softirq_rows = len(self.softirqs)
        row_vectors = [
            *range(softirq_rows),
            *(IRQ_VECTOR_FLAG | irq_rows[row] for row in range(HARDIRQ_ROWS) if row in irq_rows),
        ]
        row_index = [*range(softirq_rows), *(softirq_rows + row for row in sorted(irq_rows))]
        hist = self._mapped_hist().array[:, row_index, :]  # a copy: (cpu, row, cell)
        keys = [
            labels(cpu=str(cpu), **dict(vector_labels(vector, self.softirqs, irq_names)))
            for cpu in range(self._cpu_ids)
            for vector in row_vectors
        ]
        flat = hist.reshape(-1, _ROW_STRIDE)
        histograms = slot_histograms(keys, flat[:, :HIST_ROW], flat[:, HIST_ROW].tolist())
        slots = sorted(series_of)
        steer_slot_hint(bpf, PROBE_NAME, slots, 0, MAX_SERIES)
        charged = self._mapped_charged().array[:, slots, :]  # (cpu, slot, ns|runs)
        counters: dict[tuple[str, Labels], int] = dict(self.drop_counters())
        for cpu, index in zip(*np.nonzero(charged[:, :, 1]), strict=True):
            cgroup_id, vector = series_of[slots[index]]
            key = labels(
                cgroup=cgroup_id,
                cpu=str(cpu),
                **dict(vector_labels(vector, self.softirqs, irq_names)),
            )
            counters[(CHARGED_NS, key)] = int(charged[cpu, index, 0])
            counters[(CHARGED_RUNS, key)] = int(charged[cpu, index, 1])
        return Snapshot(PROBE_NAME, taken_ns, histograms, counters)

    def forget(self, cgroup_ids: set[int]) -> None:
        """Clear removed cgroups' charged counters and give their series slots back."""
        bpf = self._require_bpf()
        gone = cgroup_slots(bpf, PROBE_NAME, cgroup_ids)
        if gone:
            self._mapped_charged().zero(np.s_[:, sorted(slot for _, slot in gone)])
            release_slots(bpf, PROBE_NAME, [key for key, _ in gone])

    def _mapped_hist(self) -> MappedArray:
        rows = len(self.softirqs) + HARDIRQ_ROWS
        return self.mapped("irq_time_hist", np.uint64, (self._cpu_ids, rows, _ROW_STRIDE))

    def _mapped_charged(self) -> MappedArray:
        return self.mapped("irq_charged", np.uint64, (self._cpu_ids, MAX_SERIES, 2))


def charged_ns(snapshot: Snapshot, cgroup_id: int, vector: str | None = None) -> int:
    """Time charged to one cgroup in a snapshot or interval, all CPUs (one vector, or all)."""
    total = 0
    for (name, key), value in snapshot.counters.items():
        found = dict(key)
        if (
            name == CHARGED_NS
            and found["cgroup"] == cgroup_id
            and (vector is None or found["vector"] == vector)
        ):
            total += value
    return total


def expected_tracepoint_args() -> Mapping[str, Sequence[str]]:
    """The raw tracepoint signatures irq.bpf.c reads (``ctx->args[i]``), for BTF checks."""
    action = "struct irqaction *"
    return {
        "softirq_entry": ["unsigned int"],
        "softirq_exit": ["unsigned int"],
        "irq_handler_entry": ["int", action],
        "irq_handler_exit": ["int", action, "int"],
    }
