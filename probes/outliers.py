"""Outlier events (samples above their cgroup's threshold, sent with stack ids by
``include/outlier.bpf.h``): read them, symbolize, count per (cgroup, kernel stack, user stack).

The counts live in a probe's ``Snapshot.counters`` as ``<probe>_outlier_events`` labelled
``cgroup``, ``kernel_stack`` and ``user_stack`` (folded ``"f1;f2;...;leaf"``), so deltas,
documents and the live view need nothing beyond ``tailsight.hist/1``.
"""

from __future__ import annotations

import ctypes
import errno
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from tailsight.hist import NUM_BUCKETS, bucket_upper_bounds_ns
from tailsight.intervals import HistDocument
from tailsight.probes.base import (
    HIST_ROW,
    CounterInfo,
    HistogramRows,
    Labels,
    LabelValue,
    changed_cells,
    labels,
    matching_rows,
)
from tailsight.probes.symbolizer import UNKNOWN_FRAME, shared_symbolizer

OUTLIER_EVENTS_SUFFIX: Final = "_outlier_events"
OUTLIER_DROPPED_SUFFIX: Final = "_outlier_dropped"
# Index i of <probe>_outlier_dropped (OUTLIER_DROP_* in outlier.bpf.h).
OUTLIER_DROP_REASONS: Final = ("rate_limited", "ringbuf_full", "stack_lost")
OUTLIER_QUANTILE: Final = 0.99
MIN_THRESHOLD_SAMPLES: Final = 100
"""Fewer samples than this in an interval leave a cgroup's threshold as it was."""
LOST_STACK: Final = "[lost]"
NO_THRESHOLD_NS: Final = 2**64 - 1
# Frames of the tracing machinery itself, above the tracepoint's caller (leaf side).
TRACING_FRAME_PREFIXES: Final = ("bpf_trace_run", "__bpf_trace_", "__traceiter_", "bpf_prog_")
STACK_MAP_RECYCLE: Final = 1024
"""Half of OUTLIER_MAX_STACKS (outlier.bpf.h): symbolized ids deleted from the map past this."""
_STACK_LABELS: Final = frozenset({"probe", "cgroup", "kernel_stack", "user_stack"})
DEFAULT_OUTLIER_FLOOR_NS: Final = 1_000_000
DEFAULT_OUTLIER_RATE_PER_S: Final = 100


def outlier_counters(probe: str) -> tuple[CounterInfo, CounterInfo]:
    """The counters of a probe's outlier events (:meth:`OutlierStream.counters`)."""
    return (
        CounterInfo(
            probe + OUTLIER_EVENTS_SUFFIX,
            "Events above the cgroup's outlier threshold (its recent P99), reported with their "
            "stacks; exported summed over the stacks.",
        ),
        CounterInfo(
            probe + OUTLIER_DROPPED_SUFFIX,
            f"Outlier events not reported, by reason ({', '.join(OUTLIER_DROP_REASONS)}).",
        ),
    )


def outlier_cflags(floor_ns: int, rate_per_s: int) -> list[str]:
    """-D values for outlier.bpf.h: the global threshold floor and the per-CPU event rate."""
    if floor_ns < 0 or rate_per_s < 1:
        raise ValueError(f"need floor_ns >= 0 and rate_per_s >= 1, got {floor_ns}, {rate_per_s}")
    return [f"-DOUTLIER_FLOOR_NS={floor_ns}ULL", f"-DOUTLIER_RATE_PER_S={rate_per_s}ULL"]


class OutlierEvent(ctypes.Structure):
    """``struct outlier_event`` of outlier.bpf.h."""

    _fields_ = (
        ("cgroup_id", ctypes.c_uint64),
        ("value_ns", ctypes.c_uint64),
        ("tgid", ctypes.c_uint32),
        ("pid", ctypes.c_uint32),
        ("kernel_stack_id", ctypes.c_int32),
        ("user_stack_id", ctypes.c_int32),
        ("detail", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
    )


@dataclass(frozen=True)
class OutlierStack:
    """Outlier events of one probe and cgroup with one pair of stacks (folded, leaf last)."""

    probe: str
    cgroup: str
    kernel_stack: str
    user_stack: str
    events: int
    detail: str = ""  # other labels' values, e.g. the syscall


def fold(leaf_first: Iterable[str], strip_tracing: bool = False) -> str:
    """Frames as bcc walks them (leaf first) -> ``"root;...;leaf"``.

    ``strip_tracing`` drops the BPF/tracepoint frames at the leaf end.  Runs of unknown frames
    collapse into one: code built without frame pointers makes the unwinder read garbage
    "frames", sometimes a hundred of them, that say nothing.
    """
    frames: list[str] = []
    for name in leaf_first:
        if strip_tracing and not frames and name.startswith(TRACING_FRAME_PREFIXES):
            continue
        if name == UNKNOWN_FRAME and frames and frames[-1] == UNKNOWN_FRAME:
            continue
        frames.append(name)
    return ";".join(reversed(frames))


def short_stack(folded: str, frames: int = 3) -> str:
    """The leaf end of a folded stack, for an 80-column view."""
    parts = folded.split(";") if folded else []
    if len(parts) <= frames:
        return folded or "-"
    return "…;" + ";".join(parts[-frames:])


def p99_bucket_upper_bounds_ns(
    now: npt.NDArray[np.int64], before: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.int64]]:
    """Per row of two cumulative blocks (HIST_ROW cells: finite buckets, then overflow): the
    samples added since ``before``, and the upper bound of the bucket holding their P99 rank
    (``NO_THRESHOLD_NS`` if nothing was added or the rank overflows). Found from the changed
    cells only: a row holds a few dozen of its 2,000+ buckets. ValueError if a count went down."""
    row, bucket, added = changed_cells(now, before)
    if added.size and int(added.min()) < 0:
        raise ValueError("a cumulative histogram went down: counter reset")
    # Every added count is positive, so the running count rises strictly, across rows too: one
    # search finds each row's first cell that reaches its rank (an integer count reaches the
    # rank iff it reaches its ceiling).
    running = np.concatenate([np.zeros(1, np.int64), np.cumsum(added)])
    edges = np.searchsorted(row, np.arange(len(now) + 1))
    totals = running[edges[1:]] - running[edges[:-1]]
    rank = np.ceil(OUTLIER_QUANTILE * totals).astype(np.int64)
    no_threshold = np.full(len(now), NO_THRESHOLD_NS, dtype=np.uint64)
    if not added.size:
        return no_threshold, totals
    at = np.minimum(np.searchsorted(running[1:], running[edges[:-1]] + rank), len(added) - 1)
    reached = bucket[at]
    finite = (totals > 0) & (reached < NUM_BUCKETS)  # else the rank lies in overflow
    bounds = bucket_upper_bounds_ns().astype(np.uint64)[np.minimum(reached, NUM_BUCKETS - 1)]
    return np.where(finite, bounds, no_threshold), totals


@dataclass(slots=True)
class _Counted:
    """A stack's outlier events, under its counter's labels (made once: a busy host holds
    hundreds of stacks, labelled afresh at every read before)."""

    labels: Labels
    events: int = 0


def top_outlier_stacks(document: HistDocument, limit: int = 5) -> list[OutlierStack]:
    """The stacks with the most outlier events in a document, any probe."""
    stacks = [
        OutlierStack(
            counter.labels.get("probe", counter.name.removesuffix(OUTLIER_EVENTS_SUFFIX)),
            counter.labels.get("cgroup", "?"),
            counter.labels.get("kernel_stack", ""),
            counter.labels.get("user_stack", ""),
            counter.value,
            " ".join(v for k, v in sorted(counter.labels.items()) if k not in _STACK_LABELS),
        )
        for counter in document.counters
        if counter.name.endswith(OUTLIER_EVENTS_SUFFIX) and counter.value > 0
    ]
    stacks.sort(key=lambda s: (-s.events, s.probe, s.cgroup, s.kernel_stack, s.user_stack))
    return stacks[:limit]


class OutlierStream:
    """One probe's outlier maps (``<prefix>_outlier_*``): drains the ring buffer into
    cumulative per-stack counts and keeps each cgroup's threshold at its current P99 bucket."""

    def __init__(
        self,
        bpf: Any,
        prefix: str,
        detail: tuple[str, Callable[[int], str]] | None = None,
        kernel_symbol: Callable[[int], bytes] | None = None,
        user_symbols: Callable[[int, Sequence[int]], list[str]] | None = None,
    ) -> None:
        """``detail``: (label name, naming function) for the event's probe-specific detail
        field (netsyscall: ``("syscall", number -> name)``); None leaves it out.
        ``kernel_symbol``: address -> name (default bcc's ``BPF.ksym``, one cache, bounded).
        ``user_symbols``: (tgid, addresses) -> names (default the process's recycled
        symbolizer helper: bcc's per-pid caches must not accumulate in the agent)."""
        self._bpf = bpf
        self._kernel_symbol = kernel_symbol
        self._user_symbols = user_symbols or shared_symbolizer().resolve
        self.prefix = prefix
        self._detail = detail
        # Per (cgroup, kernel stack, user stack, detail): its counter's labels and events.
        self._counts: dict[tuple[int, str, str, str], _Counted] = {}
        self._kernel_names: dict[int, str] = {}
        # Folded stack per stack id (user: per (id, tgid), symbols differ between processes).
        self._kernel_folded: dict[int, str] = {}
        self._user_folded: dict[tuple[int, int], str] = {}
        # What update_thresholds last saw, one row per id (HIST_ROW cells): the next call
        # compares it as one block (a busy host has hundreds of cgroups).
        self._previous_ids: list[int] = []
        self._previous_rows: npt.NDArray[np.int64] = np.zeros((0, HIST_ROW), np.int64)
        self._thresholds: dict[int, int] = {}
        self.callback_errors = 0
        # bcc keeps a reference to the ctypes callback only as long as this object does.
        self._callback = self._on_event
        bpf[f"{prefix}_outlier_events".encode()].open_ring_buffer(self._callback)

    def _on_event(self, _ctx: Any, data: Any, _size: int) -> int:
        try:
            event = ctypes.cast(data, ctypes.POINTER(OutlierEvent)).contents
            key = (
                int(event.cgroup_id),
                self._kernel_stack(int(event.kernel_stack_id)),
                self._user_stack(int(event.user_stack_id), int(event.tgid)),
                "" if self._detail is None else self._detail[1](int(event.detail)),
            )
            counted = self._counts.get(key)
            if counted is None:  # labelled once: a busy host holds hundreds of stacks
                counted = self._counts[key] = _Counted(self._labels(*key))
            counted.events += 1
        except Exception:  # an exception must not cross the C callback
            self.callback_errors += 1
        return 0

    def _stack_addresses(self, stack_id: int) -> list[int] | None:
        """Addresses leaf first; None if the id is gone (recycled under an event in flight)."""
        try:
            return list(self._bpf[f"{self.prefix}_outlier_stacks".encode()].walk(stack_id))
        except KeyError:
            return None

    def _kernel_stack(self, stack_id: int) -> str:
        if stack_id < 0:
            return LOST_STACK if -stack_id in (errno.EEXIST, errno.ENOMEM) else ""
        folded = self._kernel_folded.get(stack_id)
        if folded is not None:
            return folded
        if self._kernel_symbol is None:
            from bcc import BPF

            self._kernel_symbol = BPF.ksym
        addresses = self._stack_addresses(stack_id)
        if addresses is None:
            return LOST_STACK
        names = []
        for address in addresses:
            name = self._kernel_names.get(address)
            if name is None:
                name = self._kernel_symbol(address).decode(errors="replace")
                self._kernel_names[address] = name
            names.append(name)
        folded = self._kernel_folded[stack_id] = fold(names, strip_tracing=True)
        return folded

    def _user_stack(self, stack_id: int, tgid: int) -> str:
        if stack_id < 0:
            return LOST_STACK if -stack_id in (errno.EEXIST, errno.ENOMEM) else ""
        folded = self._user_folded.get((stack_id, tgid))
        if folded is not None:
            return folded
        addresses = self._stack_addresses(stack_id)
        if addresses is None:
            return LOST_STACK
        # Names are kept by the symbolizer, by file and offset: shared by every process.
        unique = sorted(set(addresses))
        names = dict(zip(unique, self._user_symbols(tgid, unique), strict=True))
        folded = self._user_folded[(stack_id, tgid)] = fold([names[a] for a in addresses])
        return folded

    def drain(self) -> None:
        """Symbolize and count every event waiting in the ring buffer (does not block).

        Stack map entries are never freed by the kernel, so once half the map's worth have
        been symbolized they are deleted: the map never fills (bcc's StackTrace.clear does
        nothing).  An event still in flight that names a deleted id gets LOST_STACK.
        """
        self._bpf.ring_buffer_consume()
        if len(self._kernel_folded) + len(self._user_folded) < STACK_MAP_RECYCLE:
            return
        table = self._bpf[f"{self.prefix}_outlier_stacks".encode()]
        for stack_id in {*self._kernel_folded, *(i for i, _ in self._user_folded)}:
            try:
                del table[table.Key(stack_id)]
            except KeyError:
                continue
        self._kernel_folded.clear()
        self._user_folded.clear()

    def counters(self, probe: str) -> dict[tuple[str, Labels], int]:
        """Cumulative ``<probe>_outlier_events`` per stack and ``<probe>_outlier_dropped``."""
        events = probe + OUTLIER_EVENTS_SUFFIX
        out: dict[tuple[str, Labels], int] = {
            (events, counted.labels): counted.events for counted in self._counts.values()
        }
        dropped = self._bpf[f"{self.prefix}_outlier_dropped".encode()]
        for index, reason in enumerate(OUTLIER_DROP_REASONS):
            out[(probe + OUTLIER_DROPPED_SUFFIX, labels(reason=reason))] = int(
                dropped.sum(index).value
            )
        return out

    def _labels(self, cgroup_id: int, kernel_stack: str, user_stack: str, detail: str) -> Labels:
        values: dict[str, LabelValue] = {
            "cgroup": cgroup_id,
            "kernel_stack": kernel_stack,
            "user_stack": user_stack,
        }
        if self._detail is not None:
            values[self._detail[0]] = detail
        return labels(**values)

    def update_thresholds(self, cumulative: HistogramRows[int]) -> dict[int, int]:
        """Threshold per cgroup = upper bound of the P99 bucket of its samples since the last
        call (kept if fewer than MIN_THRESHOLD_SAMPLES); written to the kernel if changed.
        ``cumulative``: a read's block, a row per cgroup id."""
        table = self._bpf[f"{self.prefix}_outlier_threshold".encode()]
        ids = list(cumulative.row_keys)
        if not ids:
            return dict(self._thresholds)
        if ids != self._previous_ids[: len(ids)]:  # cgroups came or went: theirs first
            self._align(ids)
        before = self._previous_rows[: len(ids)]  # a view: what is seen below is kept in place
        bounds, totals = p99_bucket_upper_bounds_ns(cumulative.rows, before)
        enough = totals >= MIN_THRESHOLD_SAMPLES
        # The rest keep counting towards their next threshold.
        before[enough] = cumulative.rows[enough]
        for row in np.flatnonzero(enough).tolist():
            cgroup_id, threshold_ns = ids[row], int(bounds[row])
            if self._thresholds.get(cgroup_id) != threshold_ns:
                try:
                    table[table.Key(cgroup_id)] = table.Leaf(threshold_ns)
                except Exception:  # map full: the cgroup keeps the floor alone
                    continue
                self._thresholds[cgroup_id] = threshold_ns
        return dict(self._thresholds)

    def _align(self, ids: list[int]) -> None:
        """What was seen, in rows for ``ids`` (0 for new ones), then the rows of cgroups not
        among them: they resume counting if they come back."""
        wanted = set(ids)
        absent = [cgroup_id for cgroup_id in self._previous_ids if cgroup_id not in wanted]
        order = [*ids, *absent]
        rows = np.zeros((len(order), HIST_ROW), np.int64)
        new_rows, old_rows = matching_rows(self._previous_ids, order)
        rows[new_rows] = self._previous_rows[old_rows]
        self._previous_ids, self._previous_rows = order, rows

    def forget(self, cgroup_ids: set[int]) -> None:
        """Drop removed cgroups' stack counts and thresholds (here and in the kernel)."""
        self._counts = {k: n for k, n in self._counts.items() if k[0] not in cgroup_ids}
        kept = [row for row, i in enumerate(self._previous_ids) if i not in cgroup_ids]
        self._previous_ids = [self._previous_ids[row] for row in kept]
        self._previous_rows = self._previous_rows[kept]
        table = self._bpf[f"{self.prefix}_outlier_threshold".encode()]
        for cgroup_id in cgroup_ids:
            if self._thresholds.pop(cgroup_id, None) is not None:
                try:
                    del table[table.Key(cgroup_id)]
                except KeyError:
                    continue

    def set_threshold(self, cgroup_id: int, threshold_ns: int) -> None:
        """Pin a cgroup's threshold (tests, operators); the next P99 update may replace it."""
        table = self._bpf[f"{self.prefix}_outlier_threshold".encode()]
        table[table.Key(cgroup_id)] = table.Leaf(threshold_ns)
        self._thresholds[cgroup_id] = threshold_ns
