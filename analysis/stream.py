"""What ``explain`` needs of a range of intervals, read in a few streaming passes of sparse
interval arrays (:class:`tailsight.collector.store.codec.IntervalArrays`), never as a dense
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
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from tailsight.analysis.attribution import CounterRows
from tailsight.analysis.causes import CALLS, wanted_counter
from tailsight.analysis.jumps import TailThreshold
from tailsight.analysis.quantiles import matches
from tailsight.collector.store.codec import IntervalArrays, Layout
from tailsight.hist import NUM_BUCKETS, Histogram
from tailsight.intervals import HistDocument, LabelKey
from tailsight.probes.netsyscall import PROBE_NAME as NETSYSCALL
from tailsight.probes.outliers import OUTLIER_EVENTS_SUFFIX
from tailsight.probes.runqueue import DISPLACED_SWITCHES

DENSE: Final = NUM_BUCKETS + 1
"""Dense row width: finite buckets, then overflow."""
_NO_EDGE: Final = NUM_BUCKETS  # no finite index is above it: an unused edge slot counts nothing
_ROW_STRIDE: Final = 4096  # > NUM_BUCKETS: row * stride + bucket orders entries by row, bucket

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


CHUNK_INTERVALS: Final = 64
CACHE_BYTES: Final = 384 << 20
"""Up to this much of the selected series' sparse counts is kept after the first pass; past it,
the later passes read the range again (slower, the same memory whatever the range)."""


@dataclass
class _LayoutMap:
    """Per layout (validated once per label set): where its series and counters go."""

    layout: Layout  # held, so the id this is cached under stays its own
    leaf: npt.NDArray[np.int64]  # leaf of each series, -1 when not selected
    call_series: npt.NDArray[np.int64]  # netsyscall series ...
    call_rows: npt.NDArray[np.int64]  # ... and their counter rows
    counter_index: npt.NDArray[np.int64]  # streamed counters ...
    counter_rows: npt.NDArray[np.int64]  # ... and their counter rows


@dataclass(frozen=True)
class _Chunk:
    """The selected series of a few intervals, sparse: one row per (interval, series)."""

    t: npt.NDArray[np.int32]  # interval of each row
    leaf: npt.NDArray[np.int32]
    nnz: npt.NDArray[np.int32]
    overflows: npt.NDArray[np.int64]
    indices: npt.NDArray[np.uint16]
    counts: npt.NDArray[Any]  # the narrowest of uint16, uint32, int64 that holds every count

    @property
    def nbytes(self) -> int:
        arrays = (self.t, self.leaf, self.nnz, self.overflows, self.indices, self.counts)
        return sum(a.nbytes for a in arrays)

    def entry_rows(self) -> npt.NDArray[np.int64]:
        return np.repeat(np.arange(len(self.nnz)), self.nnz)

    def with_order(self, position: npt.NDArray[np.int64]) -> _Chunk:
        return _Chunk(
            position[self.t].astype(np.int32),
            self.leaf,
            self.nnz,
            self.overflows,
            self.indices,
            self.counts,
        )


class _ChunkBuilder:
    """Collects intervals' selected series into :class:`_Chunk` s."""

    def __init__(self) -> None:
        self.parts: list[tuple[int, IntervalArrays, npt.NDArray[np.int64]]] = []

    def add(self, t: int, interval: IntervalArrays, leaf_of: npt.NDArray[np.int64]) -> None:
        self.parts.append((t, interval, leaf_of))

    def close(self) -> _Chunk | None:
        if not self.parts:
            return None
        t, leaf, nnz, overflows, indices, counts = [], [], [], [], [], []
        for at, interval, leaf_of in self.parts:
            chosen = leaf_of >= 0
            t.append(np.full(int(chosen.sum()), at, dtype=np.int64))
            if chosen.all():  # no selector: every series (no copies)
                leaf.append(leaf_of)
                nnz.append(interval.nnz)
                overflows.append(interval.overflows)
                indices.append(interval.indices)
                counts.append(interval.counts)
                continue
            picked = chosen[interval.series_of_entries]
            leaf.append(leaf_of[chosen])
            nnz.append(interval.nnz[chosen])
            overflows.append(interval.overflows[chosen])
            indices.append(interval.indices[picked])
            counts.append(interval.counts[picked])
        self.parts = []
        all_counts = np.concatenate(counts)
        largest = int(all_counts.max()) if all_counts.size else 0
        narrow = next((d for d in (np.uint16, np.uint32) if largest <= np.iinfo(d).max), None)
        return _Chunk(
            np.concatenate(t).astype(np.int32),
            np.concatenate(leaf).astype(np.int32),
            np.concatenate(nnz).astype(np.int32),
            np.concatenate(overflows),
            np.concatenate(indices).astype(np.uint16),
            all_counts if narrow is None else all_counts.astype(narrow),
        )


@dataclass
class RangeStats:
    """Pass 1 (:meth:`read`), then :meth:`tail_events` (pass 2) and :meth:`sides` (pass 3);
    the later passes run on the sparse counts kept by the first while they fit
    :data:`CACHE_BYTES`, else on the range read again."""

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
    _cached: list[_Chunk] | None
    _maps: dict[int, _LayoutMap] = field(default_factory=dict)

    @property
    def intervals(self) -> int:
        return len(self.starts_ns)

    @classmethod
    def read(
        cls,
        source: Source,
        selector: Mapping[str, str] | None = None,
        cache_bytes: int = CACHE_BYTES,
    ) -> RangeStats:
        """Pass 1: pooled counts and volumes of the selected series, every streamed counter."""
        selector = dict(selector or {})
        leaf_ids: dict[LabelKey, int] = {}
        row_ids: dict[tuple[str, LabelKey], int] = {}
        maps: dict[int, _LayoutMap] = {}
        pooled = np.zeros((0, DENSE))  # float64 sums of counts: exact below 2**53
        keys: list[tuple[int, int]] = []
        volumes: list[tuple[npt.NDArray[np.int32], npt.NDArray[np.int32], FloatArray]] = []
        values: list[tuple[npt.NDArray[np.int64], FloatArray]] = []
        cached: list[_Chunk] | None = []
        kept = 0
        builder = _ChunkBuilder()

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
                if labels.get("probe") == NETSYSCALL:
                    calls.append((k, row_ids.setdefault((CALLS, key), len(row_ids))))
            counters = [
                (j, row_ids.setdefault((name, key), len(row_ids)))
                for j, (name, key) in enumerate(layout.counters)
                if streamed_counter(name)
            ]
            found = maps[id(layout)] = _LayoutMap(
                layout,
                leaf,
                np.array([k for k, _ in calls], dtype=np.int64),
                np.array([r for _, r in calls], dtype=np.int64),
                np.array([j for j, _ in counters], dtype=np.int64),
                np.array([r for _, r in counters], dtype=np.int64),
            )
            return found

        def flush() -> None:
            nonlocal pooled, cached, kept
            chunk = builder.close()
            if chunk is None:
                return
            leaves = len(leaf_ids)
            if pooled.shape[0] < leaves:
                grown = np.zeros((leaves, DENSE))
                grown[: pooled.shape[0]] = pooled
                pooled = grown
            rows = chunk.entry_rows()
            flat = chunk.leaf[rows].astype(np.int64) * DENSE + chunk.indices
            cells = pooled.reshape(-1)  # a view: adds in place
            cells += np.bincount(flat, weights=chunk.counts, minlength=leaves * DENSE)
            pooled[:, NUM_BUCKETS] += np.bincount(
                chunk.leaf, weights=chunk.overflows, minlength=leaves
            )
            totals = np.bincount(rows, weights=chunk.counts, minlength=len(chunk.nnz))
            volumes.append((chunk.t, chunk.leaf, np.asarray(totals + chunk.overflows, np.float64)))
            if cached is not None and kept + chunk.nbytes <= cache_bytes:
                cached.append(chunk)
                kept += chunk.nbytes
            else:
                cached = None  # too big to keep: the later passes read again

        for a, interval in enumerate(source.read()):
            mapping = layout_map(interval.layout)
            keys.append((interval.start_ns, interval.end_ns))
            builder.add(a, interval, mapping.leaf)
            ids = np.concatenate([mapping.call_rows, mapping.counter_rows])
            if ids.size:
                calls = interval.totals()[mapping.call_series]
                counted = interval.values[mapping.counter_index].astype(np.float64)
                values.append((ids, np.concatenate([calls, counted])))
            else:
                values.append((ids, np.zeros(0)))
            if len(builder.parts) >= CHUNK_INTERVALS:
                flush()
        flush()

        order: dict[tuple[int, int], int] | None = None
        position = np.arange(len(keys))
        if not source.ordered:
            ranked = sorted(range(len(keys)), key=lambda a: keys[a])
            position[ranked] = np.arange(len(keys))
            order = {keys[a]: int(position[a]) for a in range(len(keys))}
        starts = np.zeros(len(keys), dtype=np.int64)
        ends = np.zeros(len(keys), dtype=np.int64)
        rows = np.zeros((len(row_ids), len(keys)))
        for a, (start, end) in enumerate(keys):
            t = position[a]
            starts[t], ends[t] = start, end
            rows[values[a][0], t] += values[a][1]
        volume = np.zeros((len(keys), len(leaf_ids)))
        for t_rows, leaf_rows, totals in volumes:
            volume[position[t_rows], leaf_rows] = totals
        counters = {key: rows[r] for key, r in row_ids.items()}
        leaves = sorted(leaf_ids, key=lambda key: leaf_ids[key])
        if cached is not None and not source.ordered:
            cached = [chunk.with_order(position) for chunk in cached]
        return cls(
            source,
            starts,
            ends,
            leaves,
            pooled[: len(leaves)].astype(np.int64),
            volume,
            counters,
            order,
            cached,
            maps,
        )

    def _chunks(self) -> Iterator[_Chunk]:
        """A later pass: the kept chunks, or the range read again (in chunks too)."""
        if self._cached is not None:
            yield from self._cached
            return
        builder = _ChunkBuilder()
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
                none = np.zeros(0, dtype=np.int64)
                mapping = self._maps[id(interval.layout)] = _LayoutMap(
                    interval.layout, leaf, none, none, none, none
                )
            builder.add(t, interval, mapping.leaf)
            if len(builder.parts) >= CHUNK_INTERVALS:
                chunk = builder.close()
                assert chunk is not None
                yield chunk
        chunk = builder.close()
        if chunk is not None:
            yield chunk

    def tail_events(self, edges: Mapping[int, Sequence[int]]) -> dict[tuple[int, int], FloatArray]:
        """Pass 2: per (leaf, edge) asked for, tail events (dense buckets above the edge)
        per interval."""
        slots = max((len(e) for e in edges.values()), default=0)
        table = np.full((len(self.leaves), max(slots, 1)), _NO_EDGE, dtype=np.int64)
        for leaf, wanted in edges.items():
            table[leaf, : len(wanted)] = wanted
        out = np.zeros((max(slots, 1), self.intervals, len(self.leaves)))
        if slots:
            for chunk in self._chunks():
                # Entries sorted by (row, bucket): the first entry above an edge is a binary
                # search away, and a row's tail is a difference of cumulative counts.
                rows = np.arange(len(chunk.nnz)) * _ROW_STRIDE
                keys = chunk.entry_rows() * _ROW_STRIDE + chunk.indices
                cumulative = np.concatenate([[0], np.cumsum(chunk.counts, dtype=np.int64)])
                row_end = cumulative[np.cumsum(chunk.nnz)]
                for slot in range(slots):
                    edge = table[chunk.leaf, slot]
                    first_above = np.searchsorted(keys, rows + edge, side="right")
                    counted = row_end - cumulative[first_above]
                    counted += np.where(edge != _NO_EDGE, chunk.overflows, 0)
                    out[slot, chunk.t, chunk.leaf] = counted
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
            member = np.zeros(len(self.leaves), dtype=bool)
            member[list(leaves)] = True
            members.append(member)
        for chunk in self._chunks() if views else ():
            rows = chunk.entry_rows()
            first = int(chunk.t.min()) if chunk.t.size else 0
            span = int(chunk.t.max()) - first + 1 if chunk.t.size else 0
            for v, (_, changes) in enumerate(views):
                rows_in = members[v][chunk.leaf]
                if not rows_in.any():
                    continue
                entries = rows_in[rows]
                local = chunk.t[rows[entries]].astype(np.int64) - first
                dense = np.bincount(
                    local * DENSE + chunk.indices[entries],
                    weights=chunk.counts[entries],
                    minlength=span * DENSE,
                ).reshape(span, DENSE)
                dense[:, NUM_BUCKETS] += np.bincount(
                    chunk.t[rows_in] - first, weights=chunk.overflows[rows_in], minlength=span
                )
                counts = dense.astype(np.int64)
                for r in np.flatnonzero(counts.sum(axis=1)):
                    hist = Histogram(counts[r, :NUM_BUCKETS].copy(), overflow=int(counts[r, -1]))
                    quantiles[v][first + r] = hist.quantiles(list(plot))
                for c, change in enumerate(changes):
                    before[v][c] += counts[: max(0, min(change - first, span))].sum(axis=0)
        return list(zip(before, quantiles, strict=True))


def view_threshold(
    stats: RangeStats, leaves: Sequence[int], quantile: float
) -> TailThreshold | None:
    """The tail threshold of a view's pooled counts (what the dense detector picks)."""
    return TailThreshold.from_counts(stats.pooled[list(leaves)].sum(axis=0), quantile)
