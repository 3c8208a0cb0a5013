"""What ``explain`` needs of a range of intervals, read in a few streaming passes of sparse
interval arrays (:class:`tailsight.collector.store.IntervalArrays`), never as a dense
interval x series x bucket array (1 h x 400 series of those is 24 GB):

1. per selected series (*leaf*): its counts pooled over the range and its events per interval;
   every counter a cause or an attribution reads, per interval; the call counts of every
   netsyscall series (selected or not: a neighbour's calls are a cause);
2. per tested view (a leaf or an aggregate of leaves) and quantile, the threshold bucket from
   the view's pooled counts; then per leaf its tail events per interval above each threshold of
   the views it is part of;
3. only for the changes discovered: each view's counts summed before its change (after = pooled
   minus before) and its per-interval plot quantiles.

Memory: a few ``[intervals, leaves]`` float rows and one pooled histogram per leaf.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

import numpy as np
import numpy.typing as npt

from tailsight.analysis.attribution import CounterRows
from tailsight.analysis.causes import CALLS, wanted_counter
from tailsight.analysis.jumps import TailThreshold
from tailsight.analysis.quantiles import LabelKey, matches
from tailsight.collector.store import IntervalArrays, Layout
from tailsight.hist import NUM_BUCKETS, Histogram
from tailsight.histfile import HistDocument
from tailsight.probes.outliers import OUTLIER_EVENTS_SUFFIX
from tailsight.probes.runqueue import DISPLACED_SWITCHES

DENSE: Final = NUM_BUCKETS + 1
"""Dense row width: finite buckets, then overflow."""
_NO_EDGE: Final = NUM_BUCKETS  # no finite index is above it: an unused edge slot counts nothing

FloatArray = npt.NDArray[np.float64]
Pass = Callable[[], Iterable[IntervalArrays]]


def streamed_counter(name: str) -> bool:
    """The counters explain reads: causes, displacement and outlier stacks."""
    return (
        wanted_counter(name) or name == DISPLACED_SWITCHES or name.endswith(OUTLIER_EVENTS_SUFFIX)
    )


@dataclass(frozen=True)
class Source:
    """A range that can be read again: ``read()`` yields its intervals (each call anew).
    ``ordered``: intervals come in range order (a document list); otherwise they are put in
    (start, end) order, and a later read skips intervals the first did not see."""

    read: Pass
    ordered: bool

    @classmethod
    def of_documents(cls, documents: Sequence[HistDocument]) -> Source:
        arrays = [IntervalArrays.of(d) for d in documents]
        return cls(lambda: arrays, True)


@dataclass
class _LayoutMap:
    """Per layout (validated once per label set): where its series and counters go."""

    layout: Layout  # held, so the id this is cached under stays its own
    leaf: npt.NDArray[np.int64]  # leaf of each series, -1 when not selected
    calls: list[tuple[int, int]]  # (series, counter row) of netsyscall series
    counters: list[tuple[int, int]]  # (counter, counter row) of streamed counters


@dataclass
class RangeStats:
    """Pass 1 (:meth:`read`), then :meth:`tail_events` (pass 2) and :meth:`sides` (pass 3)."""

    source: Source
    starts_ns: npt.NDArray[np.int64]
    ends_ns: npt.NDArray[np.int64]
    leaves: list[LabelKey]
    pooled: npt.NDArray[np.int64]
    """``[leaves, DENSE]``: each leaf's counts over the whole range."""
    volume: FloatArray
    """``[intervals, leaves]``: events per interval."""
    counters: CounterRows
    _order: dict[tuple[int, int], int] | None
    _maps: dict[int, _LayoutMap] = field(default_factory=dict)
    _selector: dict[str, str] = field(default_factory=dict)

    @property
    def intervals(self) -> int:
        return len(self.starts_ns)

    @classmethod
    def read(cls, source: Source, selector: Mapping[str, str] | None = None) -> RangeStats:
        """Pass 1: pooled counts and volumes of the selected series, every streamed counter."""
        selector = dict(selector or {})
        leaf_ids: dict[LabelKey, int] = {}
        row_ids: dict[tuple[str, LabelKey], int] = {}
        maps: dict[int, _LayoutMap] = {}
        pooled = np.zeros((16, DENSE), dtype=np.int64)
        keys: list[tuple[int, int]] = []
        volumes: list[tuple[npt.NDArray[np.int64], FloatArray]] = []
        values: list[tuple[npt.NDArray[np.int64], FloatArray]] = []

        def layout_map(layout: Layout) -> _LayoutMap:
            found = maps.get(id(layout))
            if found is not None:
                return found
            leaf = np.full(len(layout.series), -1, dtype=np.int64)
            calls: list[tuple[int, int]] = []
            for k, key in enumerate(layout.series):
                labels = dict(key)
                if matches(labels, selector):
                    leaf[k] = leaf_ids.setdefault(key, len(leaf_ids))
                if labels.get("probe") == "netsyscall":
                    calls.append((k, row_ids.setdefault((CALLS, key), len(row_ids))))
            counters = [
                (j, row_ids.setdefault((name, key), len(row_ids)))
                for j, (name, key) in enumerate(layout.counters)
                if streamed_counter(name)
            ]
            found = maps[id(layout)] = _LayoutMap(layout, leaf, calls, counters)
            return found

        for interval in source.read():
            mapping = layout_map(interval.layout)
            keys.append((interval.start_ns, interval.end_ns))
            totals = interval.totals()
            chosen = mapping.leaf >= 0
            leaves_here = mapping.leaf[chosen]
            volumes.append((leaves_here, totals[chosen]))
            if len(leaf_ids) > pooled.shape[0]:
                grown = np.zeros((2 * len(leaf_ids), DENSE), dtype=np.int64)
                grown[: pooled.shape[0]] = pooled
                pooled = grown
            entry_leaf = mapping.leaf[interval.series_of_entries]
            picked = entry_leaf >= 0
            # One series per leaf in an interval: (leaf, bucket) pairs are unique, += suffices.
            pooled[entry_leaf[picked], interval.indices[picked]] += interval.counts[picked]
            pooled[leaves_here, NUM_BUCKETS] += interval.overflows[chosen]
            ids = [r for _, r in mapping.calls] + [r for _, r in mapping.counters]
            row_values = [totals[k] for k, _ in mapping.calls] + [
                float(interval.values[j]) for j, _ in mapping.counters
            ]
            values.append((np.array(ids, dtype=np.int64), np.array(row_values, dtype=np.float64)))

        order: dict[tuple[int, int], int] | None = None
        position = np.arange(len(keys))
        if not source.ordered:
            ranked = sorted(range(len(keys)), key=lambda a: keys[a])
            position[ranked] = np.arange(len(keys))
            order = {keys[a]: int(position[a]) for a in range(len(keys))}
        starts = np.zeros(len(keys), dtype=np.int64)
        ends = np.zeros(len(keys), dtype=np.int64)
        volume = np.zeros((len(keys), len(leaf_ids)))
        rows = np.zeros((len(row_ids), len(keys)))
        for a, (start, end) in enumerate(keys):
            t = position[a]
            starts[t], ends[t] = start, end
            volume[t, volumes[a][0]] = volumes[a][1]
            rows[values[a][0], t] += values[a][1]
        counters = {key: rows[r] for key, r in row_ids.items()}
        leaves = sorted(leaf_ids, key=lambda key: leaf_ids[key])
        return cls(
            source,
            starts,
            ends,
            leaves,
            pooled[: len(leaves)],
            volume,
            counters,
            order,
            maps,
            selector,
        )

    def _passes(self) -> Iterator[tuple[int, IntervalArrays, npt.NDArray[np.int64]]]:
        """A later pass: (interval index, interval, leaf of each series)."""
        for a, interval in enumerate(self.source.read()):
            if self._order is None:
                t = a
            else:
                found = self._order.get((interval.start_ns, interval.end_ns))
                if found is None:
                    continue  # appended since the first pass
                t = found
            mapping = self._maps.get(id(interval.layout))
            if mapping is None:  # a label set first seen now: only known leaves count
                index = {key: n for n, key in enumerate(self.leaves)}
                leaf = np.array([index.get(key, -1) for key in interval.layout.series], np.int64)
                mapping = self._maps[id(interval.layout)] = _LayoutMap(
                    interval.layout, leaf, [], []
                )
            yield t, interval, mapping.leaf

    def tail_events(self, edges: Mapping[int, Sequence[int]]) -> dict[tuple[int, int], FloatArray]:
        """Pass 2: per (leaf, edge) asked for, tail events (dense buckets above the edge)
        per interval."""
        slots = max((len(e) for e in edges.values()), default=0)
        table = np.full((len(self.leaves) + 1, max(slots, 1)), _NO_EDGE, dtype=np.int64)
        for leaf, wanted in edges.items():
            table[leaf, : len(wanted)] = wanted
        out = np.zeros((max(slots, 1), self.intervals, len(self.leaves)))
        if slots:
            for t, interval, leaf_of in self._passes():
                chosen = leaf_of >= 0
                if not chosen.any():
                    continue
                entry_series = interval.series_of_entries
                entry_edges = table[leaf_of[entry_series]]  # -1 -> the padding row
                n = len(leaf_of)
                for slot in range(slots):
                    above = interval.indices > entry_edges[:, slot]
                    counted = np.bincount(
                        entry_series[above], weights=interval.counts[above], minlength=n
                    )
                    used = table[leaf_of, slot] != _NO_EDGE
                    counted = counted + np.where(used, interval.overflows, 0)
                    out[slot, t, leaf_of[chosen]] = counted[chosen]
        found: dict[tuple[int, int], FloatArray] = {}
        for leaf, wanted in edges.items():
            for slot, edge in enumerate(wanted):
                found[(leaf, edge)] = out[slot, :, leaf]
        return found

    def sides(
        self, views: Sequence[tuple[Sequence[int], Sequence[int]]], plot: Sequence[float]
    ) -> list[tuple[list[npt.NDArray[np.int64]], list[list[float]]]]:
        """Pass 3: per (leaves of a view, change indices), the view's counts summed over the
        intervals before each change, and its ``plot`` quantiles of every interval."""
        before = [[np.zeros(DENSE, dtype=np.int64) for _ in changes] for _, changes in views]
        quantiles: list[list[list[float]]] = [
            [[math.nan] * len(plot) for _ in range(self.intervals)] for _ in views
        ]
        members = []
        for leaves, _ in views:
            member = np.zeros(len(self.leaves) + 1, dtype=bool)
            member[list(leaves)] = True
            members.append(member)  # the last slot: leaf -1, never a member
        for t, interval, leaf_of in self._passes():
            entry_series = interval.series_of_entries
            for v, (_, changes) in enumerate(views):
                series_in = members[v][leaf_of]
                if not series_in.any():
                    continue
                entries = series_in[entry_series]
                row = np.zeros(DENSE, dtype=np.int64)
                row[:NUM_BUCKETS] = np.bincount(
                    interval.indices[entries],
                    weights=interval.counts[entries],
                    minlength=NUM_BUCKETS,
                ).astype(np.int64)
                row[NUM_BUCKETS] = int(interval.overflows[series_in].sum())
                if row.sum():
                    hist = Histogram(row[:NUM_BUCKETS].copy(), overflow=int(row[NUM_BUCKETS]))
                    quantiles[v][t] = hist.quantiles(list(plot))
                for c, change in enumerate(changes):
                    if t < change:
                        before[v][c] += row
        return list(zip(before, quantiles, strict=True))


def view_threshold(
    stats: RangeStats, leaves: Sequence[int], quantile: float
) -> TailThreshold | None:
    """The tail threshold of a view's pooled counts (what the dense detector picks)."""
    return TailThreshold.from_counts(stats.pooled[list(leaves)].sum(axis=0), quantile)
