"""What every probe offers `trace` and the collector: attach, read cumulative state, close.

A probe's kernel maps are cumulative; ``read()`` turns them into a ``Snapshot`` whose labels still
carry raw cgroup ids. Subtracting two snapshots gives an interval; ``to_document`` names the
cgroups and yields one ``tailsight.hist/1`` document, the shape everything downstream consumes.
Outlier stacks travel as ordinary counters, ``<probe>_outlier_events`` labelled ``cgroup``,
``kernel_stack`` and ``user_stack`` (folded, leaf last; see ``outliers.py``): consumers with a
cardinality budget (Prometheus) should drop or top-K them.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Generic, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from tailsight.hist import NUM_BUCKETS, Histogram, SparseHistogram
from tailsight.intervals import (
    Counter,
    CounterPairs,
    HistDocument,
    LabelKey,
    PairCells,
    Series,
    label_text,
)

K = TypeVar("K", bound=Hashable)
G = TypeVar("G", bound=Hashable)
LabelValue = str | int
Labels = tuple[tuple[str, LabelValue], ...]
"""Sorted (name, value) pairs; the values of CGROUP_LABELS are cgroup v2 ids until resolved."""

CGROUP_LABELS: Final = frozenset({"cgroup", "victim", "aggressor"})
IDLE_CGROUP_NAME: Final = "idle"
"""Name of cgroup id 0 where it stands for "no task": the CPU was idle (an aggressor)."""
UNKNOWN_CGROUP_NAME: Final = "unknown"

CgroupNamer = Callable[[Iterable[int]], Mapping[int, str]]
"""Bulk cgroup id -> path, e.g. ``CgroupResolver.resolve_many``."""
Named = tuple[dict[str, str], tuple[tuple[str, str], ...], str] | None
"""How ``Snapshot.to_document`` named a raw key (labels, sorted labels, their text for sorting
documents), or None: filtered out."""
HIST_ROW: Final = NUM_BUCKETS + 1
"""Cells of a histogram row in a probe's array (finite buckets, then overflow; hist.bpf.h)."""
MEMO_GENERATION_INTERVALS: Final = 60
MEMO_GENERATION_KEYS: Final = 65_536
"""A generation also ends at this many keys (cgroup churn)."""


class LabelMemo:
    """How ``Snapshot.to_document`` named each raw key, kept from one interval to the next: the
    keys named in this generation (MEMO_GENERATION_INTERVALS intervals or MEMO_GENERATION_KEYS
    keys) or the one before. A busy host names hundreds of keys, many not every interval; the
    keys of cgroups long gone age out."""

    def __init__(self) -> None:
        self.current: dict[Labels, Named] = {}
        self.previous: dict[Labels, Named] = {}
        self.intervals = 0
        # How the victim x aggressor pairs named as arrays were labelled (``CounterPairs``):
        # made anew each generation.
        self.pair_labels: dict[tuple[str, str], tuple[LabelKey, dict[str, str], str]] = {}

    def recall(self, keys: Iterable[Labels]) -> list[Labels]:
        """Bring these keys into the current generation; those never named (or aged out)."""
        self.intervals += 1
        if self.intervals % MEMO_GENERATION_INTERVALS == 0 or (
            len(self.current) > MEMO_GENERATION_KEYS
        ):
            self.previous, self.current = self.current, {}
            self.pair_labels = {}
        current, previous = self.current, self.previous
        missing: dict[Labels, None] = {}  # each once: a pair's keys come once per counter
        for key in keys:
            if key not in current:
                if key in previous:
                    current[key] = previous[key]
                else:
                    missing[key] = None
        return list(missing)


@dataclass(frozen=True)
class SeriesInfo:
    """A latency histogram a probe records, exported as ``tailsight_<probe>_<what>_seconds``
    (``metricnames.py`` names it)."""

    what: str
    """The metric's stem; where a probe records several, its series' ``kind`` label names it."""
    title: str
    """Its words in prose, headings and panels: "run-queue wait"."""
    help: str
    by: tuple[str, ...] = ()
    """Series labels besides ``cgroup``."""


@dataclass(frozen=True)
class CounterInfo:
    """A counter a probe records (a ``_ns`` counter is exported in seconds; ``metricnames.py``)."""

    name: str
    help: str


@dataclass(frozen=True)
class ProbeInfo:
    """One probe's facts, beside its code: the catalog, the exporter, ``explain``, the trace view
    and the dashboards read them from here (``probes/catalog.py`` lists them)."""

    name: str
    title: str
    """What it measures, in a few words: a heading."""
    tracepoints: tuple[str, ...]
    series: tuple[SeriesInfo, ...] = ()
    counters: tuple[CounterInfo, ...] = ()
    files: tuple[str, ...] = ()
    """The kernel files a probe reads instead of attaching BPF programs (cgroupfs, procfs)."""

    def series_info(self, series_labels: Mapping[str, str]) -> SeriesInfo | None:
        """The series a histogram with these labels belongs to: named by its ``kind`` label, or
        the probe's only one."""
        kind = series_labels.get("kind")
        named = [s for s in self.series if s.what == kind]
        if named:
            return named[0]
        return self.series[0] if len(self.series) == 1 and kind is None else None

    def counter_info(self, name: str) -> CounterInfo | None:
        return next((c for c in self.counters if c.name == name), None)


def _cgroup_ids(keys: Iterable[Labels]) -> set[int]:
    """The cgroup ids these keys name (0 excluded: it is never a directory)."""
    return {
        value
        for key in keys
        for name, value in key
        if name in CGROUP_LABELS and isinstance(value, int) and value != 0
    }


def _names_cgroup(key: Labels) -> bool:
    return any(name in CGROUP_LABELS for name, _ in key)


def matching_rows(
    earlier: Sequence[K], now: Sequence[K]
) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    """(rows in ``now``, rows in ``earlier``) of the keys both hold (cgroup ids, series labels):
    to carry a block with a row per key over to keys that came, went or moved since."""
    row_of = {key: row for row, key in enumerate(earlier)}
    both = [(row, row_of[key]) for row, key in enumerate(now) if key in row_of]
    now_rows = np.array([row for row, _ in both], dtype=np.intp)
    return now_rows, np.array([row for _, row in both], dtype=np.intp)


def changed_cells(
    now: npt.NDArray[np.int64], before: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp], npt.NDArray[np.int64]]:
    """(row, cell, now - before) of each cell where two blocks of rows differ, row by row and
    cell by cell: one flat search (numpy's 2-D ``nonzero`` costs eight times as much)."""
    flat = np.flatnonzero(now != before)
    row, cell = np.divmod(flat, now.shape[1])
    return row, cell, now.ravel()[flat] - before.ravel()[flat]


def labels(**values: LabelValue) -> Labels:
    """Canonical label tuple (sorted by name)."""
    return tuple(sorted(values.items()))


@dataclass(frozen=True)
class Snapshot:
    """Cumulative state of one probe at ``taken_ns`` (wall clock); ``b - a`` is an interval."""

    probe: str
    taken_ns: int
    histograms: Mapping[Labels, Histogram] = field(default_factory=dict)
    counters: Mapping[tuple[str, Labels], int] = field(default_factory=dict)
    # The histograms as their non-zero buckets, where ``delta`` made them so (an interval's:
    # ``histograms`` then makes each dense only when it is looked up). Not compared: the same
    # values as ``histograms``.
    sparse: Mapping[Labels, SparseHistogram] = field(default_factory=dict, compare=False)

    def delta(self, earlier: Snapshot) -> Snapshot:
        """The interval (earlier, self]: histograms that changed, counters that moved or are new
        (and every host-wide one); ValueError if anything went backwards (a reset)."""
        if earlier.probe != self.probe:
            raise ValueError(f"cannot subtract a {earlier.probe} snapshot from a {self.probe} one")
        now_histograms, earlier_histograms = self.histograms, earlier.histograms
        if isinstance(now_histograms, HistogramRows) and isinstance(
            earlier_histograms, HistogramRows
        ):
            sparse = now_histograms.sparse_delta(earlier_histograms)  # blocks, not a row at a time
        else:
            sparse = {}
            for key, hist in now_histograms.items():
                before = earlier_histograms.get(key)
                part = SparseHistogram.of(hist) if before is None else hist.sparse_delta(before)
                if part.sum_ns or part.overflow or len(part.index):
                    sparse[key] = part
        # A per-cgroup counter that did not move is left out, unless it is new (so that it is
        # seen, at 0): a busy host holds thousands of victim x aggressor pairs, most of them
        # still. Host-wide ones (drops by reason, steal per CPU) are always there.
        now_counters, earlier_counters = self.counters, earlier.counters
        counters: dict[tuple[str, Labels], int] = {}
        pairs = None
        if isinstance(now_counters, PairCounters) and isinstance(earlier_counters, PairCounters):
            pairs = now_counters.pair_delta(earlier_counters)  # matrices, not a cell at a time
            now_counters, earlier_counters = now_counters.others, earlier_counters.others
        missing = -1
        # Whether a counter names a cgroup goes with its name (a probe's pair, event and drop
        # counters each have fixed labels): asked once per name, not for each of thousands.
        per_cgroup: dict[str, bool] = {}
        for counter_key, value in now_counters.items():
            before_value = earlier_counters.get(counter_key, missing)
            if before_value == value:
                name = counter_key[0]
                names_cgroup = per_cgroup.get(name)
                if names_cgroup is None:
                    names_cgroup = per_cgroup[name] = _names_cgroup(counter_key[1])
                if names_cgroup:
                    continue
            changed_value = value - max(before_value, 0)
            if changed_value < 0:
                raise ValueError(f"counter {counter_key} went backwards by {-changed_value}")
            counters[counter_key] = changed_value
        interval_counters = counters if pairs is None else IntervalCounters(counters, pairs)
        return Snapshot(self.probe, self.taken_ns, DenseOnDemand(sparse), interval_counters, sparse)

    def __sub__(self, earlier: Snapshot) -> Snapshot:
        return self.delta(earlier)

    def without(self, cgroup_ids: set[int]) -> Snapshot:
        """This snapshot less every series and counter naming one of these cgroups."""
        if not cgroup_ids:
            return self  # kept as it is: a PairCounters stays a matrix

        def kept(key: Labels) -> bool:
            return not any(name in CGROUP_LABELS and value in cgroup_ids for name, value in key)

        return Snapshot(
            self.probe,
            self.taken_ns,
            {key: hist for key, hist in self.histograms.items() if kept(key)},
            {key: value for key, value in self.counters.items() if kept(key[1])},
        )

    def cgroup_ids(self) -> set[int]:
        """Every cgroup id named in a label (0 excluded: it is never a directory)."""
        counters = self.counters
        pair_ids: set[int] = set()
        if isinstance(counters, PairCounters):
            pair_ids, counters = counters.cgroup_ids(), counters.others
        return pair_ids | _cgroup_ids([*self.histograms, *(key for _, key in counters)])

    def to_document(
        self,
        start_ns: int,
        name_cgroups: CgroupNamer,
        keep: Callable[[str], bool] | None = None,
        memo: LabelMemo | None = None,
    ) -> HistDocument:
        """This snapshot (usually an interval) as a document, cgroup ids replaced by paths.

        Ids that resolve to the same path (a recreated cgroup) are merged. ``keep(path)`` filters
        on the ``cgroup`` / ``victim`` label (``--cgroup``); counters without one are kept.
        ``memo``, kept by the caller from one interval to the next with the same ``keep``,
        remembers how each key was named: a busy host repeats hundreds of series and counter
        keys every interval. Victim x aggressor pairs (``IntervalCounters``) are named as
        arrays instead, their ids once each, and handed on as ``CounterPairs``.
        """
        memo = LabelMemo() if memo is None else memo
        counters: Mapping[tuple[str, Labels], int] = self.counters
        pairs: PairCells[int] | None = None
        if isinstance(counters, IntervalCounters):  # the pairs are named as arrays
            pairs = counters.pairs
            counters = counters.others
        missing = memo.recall([*self.histograms, *(key for _, key in counters)])
        known_keys = memo.current
        ids = _cgroup_ids(missing)
        if pairs is not None:
            ids.update(pairs.cgroups)
            ids.discard(0)
        names = dict(name_cgroups(sorted(ids))) if ids else {}
        uncached: dict[Labels, Named] = {}  # keys naming an id not found now: found later?
        for key in missing:
            named = {"probe": self.probe}
            known = True
            for name, value in key:
                if name in CGROUP_LABELS and isinstance(value, int):
                    fallback = IDLE_CGROUP_NAME if value == 0 else UNKNOWN_CGROUP_NAME
                    named[name] = names.get(value, fallback)
                    known = known and (value == 0 or value in names)
                else:
                    named[name] = str(value)
            subject = named.get("cgroup", named.get("victim"))
            kept = keep is None or subject is None or keep(subject)
            slot = tuple(sorted(named.items()))
            text = label_text(slot)  # the counters sort by it: strings, not tuples of pairs
            result = (dict(slot), slot, text) if kept else None
            (known_keys if known else uncached)[key] = result

        def look_up(key: Labels) -> Named:
            return uncached[key] if key in uncached else known_keys[key]

        # Usually every id is known: then one hash of each key, in the memo.
        resolve = look_up if uncached else known_keys.__getitem__
        grouped: dict[tuple[tuple[str, str], ...], tuple[dict[str, str], list[Labels]]] = {}
        for key in self.histograms:
            resolved = resolve(key)
            if resolved is None:
                continue
            named, slot, _ = resolved
            held = grouped.get(slot)
            if held is None:
                grouped[slot] = (named, [key])
            else:  # a recreated cgroup: another id with the same path
                held[1].append(key)
        series = []
        for slot, (named, keys) in sorted(grouped.items()):
            sparse = self.sparse.get(keys[0]) if len(keys) == 1 else None
            if sparse is not None:  # an interval's: the dense form is made if one asks for it
                series.append(Series(named, key=slot, sparse=sparse))
                continue
            hist = self.histograms[keys[0]]
            for key in keys[1:]:
                hist = hist.merge(self.histograms[key])
            series.append(Series(named, hist, slot))
        # By name and labels' text joined by NUL: sorted as the tuples would be (see above).
        totals: dict[str, tuple[str, dict[str, str], int, tuple[tuple[str, str], ...]]] = {}
        for (counter_name, key), value in counters.items():
            resolved = resolve(key)
            if resolved is None:
                continue
            named, slot, text = resolved
            text_key = f"{counter_name}\0{text}"
            previous_total = totals.get(text_key)
            if previous_total is not None:  # ids merged into one path
                value += previous_total[2]
            totals[text_key] = (counter_name, named, value, slot)
        named_counters = [Counter(*totals[text_key]) for text_key in sorted(totals)]
        document = HistDocument(start_ns=start_ns, end_ns=self.taken_ns, series=series)
        if pairs is None:
            document.add_counters(named_counters)
        else:
            document.add_counters(
                named_pairs(pairs, self.probe, names, keep, named_counters, memo.pair_labels)
            )
        return document


class CountersBuiltOnLookup(Mapping[tuple[str, Labels], int]):
    """Counters held in another form (``_build`` makes the mapping), made a dict at the first
    lookup: most intervals are read whole, by their arrays."""

    _all: dict[tuple[str, Labels], int] | None = None

    def _build(self) -> dict[tuple[str, Labels], int]:
        raise NotImplementedError

    def _mapping(self) -> dict[tuple[str, Labels], int]:
        if self._all is None:
            self._all = self._build()
        return self._all

    def __getitem__(self, key: tuple[str, Labels]) -> int:
        return self._mapping()[key]

    def __iter__(self) -> Iterator[tuple[str, Labels]]:
        return iter(self._mapping())

    def __len__(self) -> int:
        return len(self._mapping())


class PairCounters(CountersBuiltOnLookup):
    """A probe's cumulative counters, those of victim x aggressor cgroup pairs held as the
    kernel's matrix: ``matrix[victim, aggressor, k]`` is counter ``names[k]`` of the pair
    (``ids[victim]``, ``ids[aggressor]``), a pair being there while its counter ``present`` is
    not 0. As a mapping it is every counter (``others`` and the pairs, keyed as by
    ``labels(aggressor=..., victim=...)``), built at the first lookup; ``Snapshot.delta``
    subtracts two as matrices instead: a busy host holds thousands of pairs, most of them still.
    """

    def __init__(
        self,
        others: Mapping[tuple[str, Labels], int],
        names: tuple[str, ...],
        ids: tuple[int, ...],
        matrix: npt.NDArray[np.uint64],
        present: int,
    ) -> None:
        if matrix.shape != (len(ids), len(ids), len(names)):
            raise ValueError(f"pair matrix of shape {matrix.shape} for {len(ids)} ids x {names}")
        self.others, self.names, self.ids = others, names, ids
        self.matrix, self.present = matrix, present

    def _there(self) -> npt.NDArray[np.bool_]:
        """victim x aggressor: whether the pair is there (its counter ``present`` is not 0)."""
        there: npt.NDArray[np.bool_] = self.matrix[:, :, self.present] != 0
        return there

    def _build(self) -> dict[tuple[str, Labels], int]:
        victim, aggressor = np.nonzero(self._there())
        every = np.ones((len(victim), len(self.names)), dtype=bool)
        values = self.matrix[victim, aggressor]
        cells = PairCells(self.names, self.ids, victim, aggressor, values, every)
        return {**self.others, **pair_counters(cells)}

    def cgroup_ids(self) -> set[int]:
        """The ids of the pairs there (0 excluded), as ``_cgroup_ids`` finds them in the keys."""
        there = self._there()
        named = there.any(axis=0) | there.any(axis=1)
        return {self.ids[i] for i in np.nonzero(named)[0].tolist()} - {0}

    def pair_delta(self, earlier: PairCounters) -> PairCells[int]:
        """The pairs whose counters moved since ``earlier``, or that are new (at their value), as
        ``Snapshot.delta`` keeps counters; ValueError if one went backwards."""
        if earlier.names != self.names or earlier.present != self.present:
            raise ValueError(f"cannot subtract pair counters {earlier.names} from {self.names}")
        if earlier.ids == self.ids:
            before = earlier.matrix
        else:  # slots taken or given back since: align the earlier matrix on these ids
            before = np.zeros_like(self.matrix)
            rows, old_rows = matching_rows(earlier.ids, self.ids)
            before[np.ix_(rows, rows)] = earlier.matrix[np.ix_(old_rows, old_rows)]
        # A pair not there before counts from 0, as a counter new to the mapping would.
        existed = before[:, :, self.present] != 0
        before = np.where(existed[:, :, None], before, np.uint64(0))
        present = self._there()
        backwards = present[:, :, None] & (self.matrix < before)
        if backwards.any():
            v, a, k = (int(i[0]) for i in np.nonzero(backwards))
            key = labels(aggressor=self.ids[a], victim=self.ids[v])
            by = int(before[v, a, k]) - int(self.matrix[v, a, k])
            raise ValueError(f"counter {(self.names[k], key)} went backwards by {by}")
        moved = (self.matrix != before) | (present & ~existed)[:, :, None]
        moved &= present[:, :, None]
        victim, aggressor = np.nonzero(moved.any(axis=2))
        values = self.matrix[victim, aggressor] - before[victim, aggressor]
        return PairCells(self.names, self.ids, victim, aggressor, values, moved[victim, aggressor])


def pair_counters(cells: PairCells[int]) -> dict[tuple[str, Labels], int]:
    """The counters where ``moved``, keyed as ``Snapshot.counters`` keys them."""
    out: dict[tuple[str, Labels], int] = {}
    for k, name in enumerate(cells.names):
        for victim, aggressor, value in zip(*cells.moved_cells(k), strict=True):
            out[(name, (("aggressor", aggressor), ("victim", victim)))] = value
    return out


def named_pairs(
    cells: PairCells[int],
    probe: str,
    names: Mapping[int, str],
    keep: Callable[[str], bool] | None,
    others: list[Counter],
    labels: dict[tuple[str, str], tuple[LabelKey, dict[str, str], str]],
) -> CounterPairs:
    """These pairs with their cgroups named (ids missing from ``names``: idle for 0, else
    unknown), those whose victim ``keep`` refuses left out, ids of one path merged; ``labels``
    as ``CounterPairs`` keeps them."""
    id_paths = [
        names.get(i, IDLE_CGROUP_NAME if i == 0 else UNKNOWN_CGROUP_NAME) for i in cells.cgroups
    ]
    paths = tuple(dict.fromkeys(id_paths))
    index = {path: n for n, path in enumerate(paths)}
    path_of = np.array([index[path] for path in id_paths], dtype=np.intp)
    victim, aggressor = path_of[cells.victim], path_of[cells.aggressor]
    values, moved = cells.values, cells.moved
    if keep is not None:
        kept = np.array([keep(path) for path in paths], dtype=bool)[victim]
        victim, aggressor, values, moved = (x[kept] for x in (victim, aggressor, values, moved))
    if len(paths) < len(id_paths):  # a recreated cgroup: its pairs are summed per path
        codes = victim * len(paths) + aggressor
        pair, first = np.unique(codes, return_index=True)
        group = np.searchsorted(pair, codes)
        summed = np.zeros((len(pair), len(cells.names)), dtype=np.uint64)
        np.add.at(summed, group, values)
        any_moved = np.zeros((len(pair), len(cells.names)), dtype=bool)
        np.logical_or.at(any_moved, group, moved)
        victim, aggressor, values, moved = victim[first], aggressor[first], summed, any_moved
    pairs = PairCells(cells.names, paths, victim, aggressor, values, moved)
    return CounterPairs(probe, pairs, others, labels)


class IntervalCounters(CountersBuiltOnLookup):
    """An interval's counters (``Snapshot.delta``): ``others`` and the victim x aggressor
    ``pairs`` as arrays, named as arrays by ``to_document``."""

    def __init__(self, others: dict[tuple[str, Labels], int], pairs: PairCells[int]) -> None:
        self.others, self.pairs = others, pairs

    def _build(self) -> dict[tuple[str, Labels], int]:
        return {**pair_counters(self.pairs), **self.others}


class HistogramRows(Mapping[K, Histogram], Generic[K]):
    """Cumulative histograms held as the block read from a probe's array: ``rows[i]`` (HIST_ROW
    cells: finite buckets, then overflow) and ``sums_ns[i]`` are those of ``row_keys[i]``. As a
    mapping, each is a Histogram viewing its row, made at the first lookup; ``Snapshot.delta``
    subtracts two as blocks, and the outlier thresholds read the block: a busy host's read holds
    hundreds of rows, and numpy calls row by row would be most of their cost."""

    def __init__(
        self, keys: Sequence[K], rows: npt.NDArray[np.int64], sums_ns: Sequence[int]
    ) -> None:
        if rows.shape != (len(keys), HIST_ROW) or len(sums_ns) != len(keys):
            raise ValueError(f"{len(keys)} keys and {len(sums_ns)} sums for rows {rows.shape}")
        self.row_keys, self.rows, self.sums_ns = tuple(keys), rows, list(sums_ns)
        self._row_of: dict[K, int] | None = None
        self._views: dict[K, Histogram] = {}

    @classmethod
    def of(cls, histograms: Mapping[K, Histogram]) -> HistogramRows[K]:
        """These histograms as a block (a copy)."""
        rows = np.zeros((len(histograms), HIST_ROW), dtype=np.int64)
        for row, hist in enumerate(histograms.values()):
            rows[row, :NUM_BUCKETS], rows[row, NUM_BUCKETS] = hist.counts, hist.overflow
        return cls(list(histograms), rows, [hist.sum_ns for hist in histograms.values()])

    def __getitem__(self, key: K) -> Histogram:
        hist = self._views.get(key)
        if hist is None:
            if self._row_of is None:
                self._row_of = {k: row for row, k in enumerate(self.row_keys)}
            row = self._row_of[key]
            counts, overflow = self.rows[row, :NUM_BUCKETS], int(self.rows[row, NUM_BUCKETS])
            hist = self._views[key] = Histogram._trusted(counts, overflow, self.sums_ns[row])
        return hist

    def __iter__(self) -> Iterator[K]:
        return iter(self.row_keys)

    def __len__(self) -> int:
        return len(self.row_keys)

    def with_keys(self, keys: Sequence[G]) -> HistogramRows[G]:
        """The same rows under other keys (one per row)."""
        return HistogramRows(keys, self.rows, self.sums_ns)

    def merged(self, groups: Sequence[G]) -> HistogramRows[G]:
        """One row per group (``groups[i]`` is row i's), the rows of a group added: a cgroup's
        histograms of several syscalls as one."""
        order = {group: None for group in groups}
        if len(order) == len(groups):
            return self.with_keys(groups)
        index = {group: n for n, group in enumerate(order)}
        rows = np.zeros((len(order), HIST_ROW), dtype=np.int64)
        sums = [0] * len(order)
        # Row by row: numpy's grouped adds (add.reduceat, add.at) cost 6-10x on this shape.
        for row, (group, sum_ns) in enumerate(zip(groups, self.sums_ns, strict=True)):
            rows[index[group]] += self.rows[row]
            sums[index[group]] += sum_ns
        return HistogramRows(list(order), rows, sums)

    def sparse_delta(self, earlier: HistogramRows[K]) -> dict[K, SparseHistogram]:
        """What was added since ``earlier`` (both cumulative) to each key whose row changed, a
        key new since then counting from 0: ``Histogram.sparse_delta`` of every row at once.
        ValueError naming the key and bucket that went down (a reset)."""
        rows = self.rows
        if earlier.row_keys == self.row_keys:
            before, sums_before = earlier.rows, earlier.sums_ns
        else:  # series came, went or moved: the earlier rows aligned on these keys
            before, sums_before = np.zeros_like(rows), [0] * len(self.row_keys)
            now_rows, old_rows = matching_rows(earlier.row_keys, self.row_keys)
            before[now_rows] = earlier.rows[old_rows]
            for now_row, old_row in zip(now_rows.tolist(), old_rows.tolist(), strict=True):
                sums_before[now_row] = earlier.sums_ns[old_row]
        row, bucket, added = changed_cells(rows, before)
        if added.size and int(added.min()) < 0:
            at = int(np.flatnonzero(added < 0)[0])
            r, b = int(row[at]), int(bucket[at])
            cell = "overflow" if b == NUM_BUCKETS else f"bucket {b}"
            was, now = int(before[r, b]), int(rows[r, b])
            raise ValueError(
                f"{cell} of {self.row_keys[r]} went down ({was} -> {now}): counter reset or not"
                " the same series"
            )
        sums = [now - was for now, was in zip(self.sums_ns, sums_before, strict=True)]
        if min(sums, default=0) < 0:
            r = next(r for r, added_ns in enumerate(sums) if added_ns < 0)
            raise ValueError(
                f"sum_ns of {self.row_keys[r]} went down ({sums_before[r]} -> {self.sums_ns[r]})"
            )
        overflow = (rows[:, NUM_BUCKETS] - before[:, NUM_BUCKETS]).tolist()
        finite = bucket != NUM_BUCKETS
        row, bucket, added = row[finite], bucket[finite], added[finite]
        bounds = np.searchsorted(row, np.arange(len(self.row_keys) + 1)).tolist()
        parts = {}
        for r, key in enumerate(self.row_keys):
            lo, hi = bounds[r], bounds[r + 1]
            if lo < hi or sums[r] or overflow[r]:  # a torn sum alone is kept, as row by row
                parts[key] = SparseHistogram(bucket[lo:hi], added[lo:hi], overflow[r], sums[r])
        return parts


class DenseOnDemand(Mapping[Labels, Histogram]):
    """Histograms held as their non-zero buckets, each made dense when it is looked up (and
    kept): an interval's, whose consumers mostly read the sparse form."""

    def __init__(self, sparse: Mapping[Labels, SparseHistogram]) -> None:
        self._sparse = sparse
        self._dense: dict[Labels, Histogram] = {}

    def __getitem__(self, key: Labels) -> Histogram:
        hist = self._dense.get(key)
        if hist is None:
            hist = self._dense[key] = self._sparse[key].dense()
        return hist

    def __iter__(self) -> Iterator[Labels]:
        return iter(self._sparse)

    def __len__(self) -> int:
        return len(self._sparse)


class Probe(Protocol):
    """One probe: ``probes/<name>.bpf.c`` + ``probes/<name>.py``."""

    name: str

    def attach(self) -> None:
        """Compile with verified offsets and attach; raises ProbeError saying why not."""

    def read(self) -> Snapshot:
        """Cumulative state as of now."""

    def set_cgroup_filter(self, cgroup_ids: Iterable[int] | None) -> None:
        """Record only these cgroup ids (None: all); takes effect at once, attached or not."""

    def program_fds(self) -> Mapping[str, int]:
        """Program fd per attached program, for kernel BPF run-time stats."""

    def forget(self, cgroup_ids: set[int]) -> None:
        """Drop every trace of these removed cgroups, in the kernel and in the probe: their
        last interval has been read. The next ``read`` no longer names them, and a slot they
        held serves a new cgroup (so a long-lived agent under cgroup churn stays bounded)."""

    def close(self) -> None:
        """Detach and free the maps; safe to call twice."""
