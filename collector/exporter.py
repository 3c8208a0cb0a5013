"""Prometheus export of interval documents: a custom collector (own registry, never the global one)
with coarse classic histograms that are exact re-bucketings of the 5 µs model, exact quantile
gauges from full resolution, counters, a bounded ``cgroup`` label and self-metrics."""

from __future__ import annotations

import functools
import math
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, Generic, TypeVar

import numpy as np
import numpy.typing as npt

from tailsight.collector.config import CollectorConfig
from tailsight.collector.pods import PodLabeler
from tailsight.hist import (
    LINEAR_LIMIT_NS,
    NUM_BUCKETS,
    TAIL_BUCKETS,
    SparseHistogram,
    bucket_upper_bounds_ns,
)
from tailsight.intervals import Counter, CounterPairs, HistDocument, LabelKey, key_of, label_key
from tailsight.probes import metricnames
from tailsight.probes.base import HIST_ROW
from tailsight.probes.catalog import PROBES
from tailsight.probes.loader import read_program_stats
from tailsight.probes.symbolizer import shared_symbolizer

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric
    from prometheus_client.registry import CollectorRegistry

# 5 µs ... 10 ms in a 1-2-5 series, then the model's own power-of-two tail edges (20.48 ms ...
# 10.49 s): every bound is a bucket upper bound of the model, so counts per `le` are exact.
COARSE_BOUNDS_NS: Final[tuple[int, ...]] = (
    5_000, 10_000, 20_000, 50_000, 100_000, 200_000, 500_000,
    1_000_000, 2_000_000, 5_000_000, 10_000_000,
    *(LINEAR_LIMIT_NS << k for k in range(1, TAIL_BUCKETS + 1)),
)  # fmt: skip
# Coarse bucket (index into COARSE_BOUNDS_NS, len = +Inf) of every fine bucket of the model.
_COARSE_OF_FINE: Final = np.searchsorted(
    np.array(COARSE_BOUNDS_NS, dtype=np.int64), bucket_upper_bounds_ns(), side="left"
)
QUANTILES: Final = (0.5, 0.9, 0.99, 0.999)
_UPPER_BOUNDS_NS: Final = bucket_upper_bounds_ns()
# The label of an exact quantile gauge; "quantile" is reserved for summaries (promtool says so).
QUANTILE_LABEL: Final = "q"
OTHER_CGROUP: Final = "other"
CGROUP_LABELS: Final = ("cgroup", "victim", "aggressor")
# Label values that name no cgroup and are bounded by construction (id 0 = idle CPU).
FIXED_CGROUP_NAMES: Final = frozenset({"idle", OTHER_CGROUP})
RANKED_BY_TIME: Final = frozenset(
    info.name
    for info in PROBES.values()
    if not info.series and all(c.name.endswith("_ns") for c in info.counters)
)
"""Probes whose cgroups rank by time (pressure stalls): they count no events."""
# A cgroup in the top-K keeps its place until another has this many times its events: cgroups of
# about equal weight would otherwise swap every interval, each swap ending one cgroup's series
# and starting another's (series churn in Prometheus, and every key of both re-folded here).
TOP_K_HYSTERESIS: Final = 1.25
# How a raw series folds is remembered until it goes unexported this many intervals. Each
# interval holds only the counters that moved: on a busy host the victim x aggressor pairs come
# and go from one interval to the next and must not be re-folded every time they come back.
FOLD_MAX_AGE: Final = 16
# Labels that would make Prometheus cardinality unbounded: stacks (outlier events) and task ids
# stay in the recording; the exporter sums over them.
UNEXPORTED_LABELS: Final = frozenset({"kernel_stack", "user_stack", "stack", "pid", "tid", "comm"})
# What a histogram measures, for the metric name tailsight_<probe>_<what>_seconds: a series label
# in WHAT_LABELS (e.g. tcpstate's kind="connect") names it and is consumed; else the probe's
# descriptor (probes/catalog.py) its only series.
WHAT_LABELS: Final = ("what", "kind")
GENERIC_HELP: Final = {
    "histogram": "Latency, 5 µs model re-bucketed exactly; cumulative since the collector started.",
    "quantile": "Exact quantile (label q) from full-resolution 5 µs buckets over the window.",
    "counter": "Probe counter since the collector started.",
}
"""Help of a family no probe descriptor describes; a described one's help comes first."""

Labels = tuple[tuple[str, str], ...]  # as exposed, in the family's label order
K = TypeVar("K")
P = TypeVar("P")


def metric_base(probe: str, labels: Mapping[str, str]) -> str:
    """``tailsight_<probe>_<what>`` for a histogram series."""
    what = _what_label(labels)
    stem = labels[what] if what is not None else default_what(probe)
    return metricnames.histogram_base(probe, stem)


def default_what(probe: str) -> str:
    """The ``<what>`` of a probe's histogram series that carry no what label: its only one."""
    info = PROBES.get(probe)
    series = None if info is None else info.series_info({})
    return "latency" if series is None else series.what


@functools.cache
def described() -> dict[str, str]:
    """Help text by family name (histogram base, counter without ``_total``) from the probes'
    descriptors: one source for what each series and counter means."""
    out: dict[str, str] = {}
    for info in PROBES.values():
        for series in info.series:
            out[metric_base(info.name, {"kind": series.what})] = series.help
        for counter in info.counters:
            out[counter_metric(counter.name, info.name)[0]] = counter.help
    return out


def counter_metric(name: str, probe: str) -> tuple[str, float]:
    """Metric name (without ``_total``) and scale for a document counter; ``_ns`` become seconds."""
    return metricnames.counter_family(name, probe)


def window_label(seconds: float) -> str:
    """ "1s", "60s", "500ms": the ``window`` label value of a quantile gauge."""
    if seconds >= 1 and float(seconds).is_integer():
        return f"{int(seconds)}s"
    return f"{seconds * 1000:g}ms"


@dataclass
class ProbeStatus:
    """Attach state of one probe as the agent last saw it."""

    attached: bool
    reason: str = ""
    program_fds: Mapping[str, int] = field(default_factory=dict)
    map_fill: Callable[[], Mapping[str, float]] | None = None
    read_errors: int = 0
    mode: str = ""  # how its programs attach: "tp_btf", or "raw_tp" (the fallback)


@dataclass
class RecordingStatus:
    """Whether ``serve --record`` is still recording; after a write fails it is not (the endpoint
    stays up) and ``reason`` says why."""

    up: bool = True
    errors: int = 0
    reason: str = ""


@dataclass(slots=True)
class _Fold:
    """How one raw series is exported: its family, labels after top-K folding, counter scale;
    and its probe and cgroups, to know when it folds differently."""

    exported: str
    folded: LabelKey
    scale: float
    probe: str
    cgroups: tuple[str, ...]
    seen: int  # the last interval that exported it (``PrometheusExporter.intervals``)
    # Where ``update`` adds the series (held here: thousands of lookups an interval less). Its
    # cgroups' leaving the top-K retires the total and drops this fold with it.
    histogram: _Cumulative | None = None
    counter: _Total | None = None


@dataclass
class _Cumulative:
    """Coarse bucket counts (not cumulative across ``le``), count and sum since export start."""

    coarse: npt.NDArray[np.int64]
    sum_ns: int = 0


@dataclass(slots=True)
class _Total:
    """An exported counter since export start, in the probe's unit (``scale`` to the metric's)."""

    scale: float
    total: int = 0


class _Sliding(Generic[K, P]):
    """The intervals ending within ``span_ns`` of the newest, and per key how many of them hold
    it. A key leaves when no interval in the span holds it, never because its running sum reads
    zero: a part can be zero in count and not in sum (``Snapshot.delta`` keeps torn sums)."""

    def __init__(self, span_ns: int) -> None:
        self.span_ns = span_ns
        self.intervals: deque[tuple[int, Mapping[K, P]]] = deque()
        self.holders: dict[K, int] = {}

    def push(self, end_ns: int, parts: Mapping[K, P]) -> tuple[list[Mapping[K, P]], list[K]]:
        """Add an interval; return the intervals that left the span and the keys now gone."""
        self.intervals.append((end_ns, parts))
        for key in parts:
            self.holders[key] = self.holders.get(key, 0) + 1
        # Keep the intervals that end within the span before the newest end; an interval ending
        # about one span ago (timer jitter: 1%) is out, so a 60 s window holds 60 one-second ones.
        horizon = end_ns - self.span_ns + self.span_ns // 100
        expired: list[Mapping[K, P]] = []
        gone: list[K] = []
        while self.intervals and self.intervals[0][0] <= horizon:
            _, old = self.intervals.popleft()
            expired.append(old)
            for key in old:
                self.holders[key] -= 1
                if self.holders[key] == 0:
                    del self.holders[key]
                    gone.append(key)
        return expired, gone


class _Window:
    """Running bucket counts per raw series over the last ``span_s`` of intervals, a row each of
    one block (finite buckets, then overflow): a scrape's quantiles read every row, in one pass
    over the block instead of a numpy call per series."""

    def __init__(self, span_s: float) -> None:
        self.sliding: _Sliding[LabelKey, SparseHistogram] = _Sliding(int(span_s * 1e9))
        self.row_of: dict[LabelKey, int] = {}
        self.rows = np.zeros((64, HIST_ROW), dtype=np.int64)
        self._free: list[int] = []  # rows of series gone (all 0)

    def add(self, end_ns: int, sparse: dict[LabelKey, SparseHistogram]) -> None:
        self._apply(sparse, 1)
        expired, gone = self.sliding.push(end_ns, sparse)
        for old in expired:
            self._apply(old, -1)
        for key in gone:  # its row is all 0 again: every interval that held it has left
            self._free.append(self.row_of.pop(key))
        if len(self.rows) > 64 and 4 * len(self.row_of) < len(self.rows):  # after churn
            self._compact()

    def _compact(self) -> None:
        """The live rows moved to the front of a block twice their number (at least 64)."""
        rows = np.zeros((max(64, 2 * len(self.row_of)), HIST_ROW), dtype=np.int64)
        for new_row, (key, row) in enumerate(self.row_of.items()):
            rows[new_row] = self.rows[row]
            self.row_of[key] = new_row
        self.rows, self._free = rows, []

    def _apply(self, parts: Mapping[LabelKey, SparseHistogram], sign: int) -> None:
        """Add (sign 1) or take away (-1) one interval's parts: one scatter into the block (a
        part's buckets are distinct, and so are its row's)."""
        rows = np.array([self._row(key) for key in parts], dtype=np.intp) * HIST_ROW
        if not len(rows):
            return
        values = list(parts.values())
        cells = np.repeat(rows, [len(part.index) for part in values])
        cells += np.concatenate([part.index for part in values])
        counts = np.concatenate([part.count for part in values])
        overflow = np.array([part.overflow for part in values], dtype=np.int64)
        flat = self.rows.ravel()
        flat[cells] += counts if sign > 0 else -counts
        flat[rows + NUM_BUCKETS] += overflow if sign > 0 else -overflow

    def _row(self, key: LabelKey) -> int:
        row = self.row_of.get(key)
        if row is None:
            if self._free:
                row = self._free.pop()
            else:
                row = len(self.row_of)
                if row == len(self.rows):  # full: twice the rows
                    self.rows = np.concatenate([self.rows, np.zeros_like(self.rows)])
            self.row_of[key] = row
        return row


class _Merge:
    """Bucket counts added up per group (a series and its window) from many parts, then every
    group's quantiles in one numpy pass: a busy host's scrape has hundreds of groups, some of
    dozens of parts ("other")."""

    def __init__(self) -> None:
        self._keys: list[npt.NDArray[np.int64]] = []  # group * NUM_BUCKETS + bucket
        self._counts: list[npt.NDArray[np.int64]] = []
        self._overflow_groups: list[npt.NDArray[np.int64]] = []
        self._overflow: list[npt.NDArray[np.int64]] = []

    def add_sparse(self, groups: Sequence[int], parts: Sequence[SparseHistogram]) -> None:
        """Add ``parts[i]`` to group ``groups[i]``."""
        if not parts:
            return
        lengths = [len(part.index) for part in parts]
        at = np.array(groups, dtype=np.int64)
        self._keys.append(
            np.repeat(at * NUM_BUCKETS, lengths) + np.concatenate([p.index for p in parts])
        )
        self._counts.append(np.concatenate([part.count for part in parts]))
        self._overflow_groups.append(at)
        self._overflow.append(np.array([part.overflow for part in parts], dtype=np.int64))

    def add_rows(self, groups: npt.NDArray[np.int64], rows: npt.NDArray[np.int64]) -> None:
        """Add row i of a block (HIST_ROW cells) to group ``groups[i]``; rows of only zeros may
        have any group."""
        flat = np.flatnonzero(rows != 0)  # a flat index: numpy's 2-D nonzero costs 8x
        row, cell = np.divmod(flat, HIST_ROW)
        counts = rows.ravel()[flat]
        finite = cell != NUM_BUCKETS
        self._keys.append(groups[row[finite]] * NUM_BUCKETS + cell[finite])
        self._counts.append(counts[finite])
        self._overflow_groups.append(groups[row[~finite]])
        self._overflow.append(counts[~finite])

    def quantiles_ns(self, groups: int, qs: Sequence[float]) -> list[list[float] | None]:
        """``Histogram.quantiles`` of each group's sum; None for a group without observations."""
        empty = np.zeros(0, dtype=np.int64)
        keys = np.concatenate([empty, *self._keys])
        # The same (group, bucket) from several parts added up, in integers: sorted, then one
        # sum per run of equal keys.
        order = np.argsort(keys, kind="stable")
        keys, counts = keys[order], np.concatenate([empty, *self._counts])[order]
        starts = (
            np.flatnonzero(np.concatenate([[True], keys[1:] != keys[:-1]])) if len(keys) else empty
        )
        group, index = np.divmod(keys[starts], NUM_BUCKETS)
        overflow = np.zeros(groups, dtype=np.int64)
        np.add.at(
            overflow,
            np.concatenate([empty, *self._overflow_groups]),
            np.concatenate([empty, *self._overflow]),
        )
        return _quantiles_of_buckets(
            index,
            np.add.reduceat(counts, starts) if len(keys) else empty,
            np.bincount(group, minlength=groups),
            overflow,
            qs,
        )


class PrometheusExporter:
    """Turns interval documents into Prometheus metrics; register on your own registry.

    ``update`` (agent thread) and ``collect`` (HTTP threads) may run concurrently.
    """

    def __init__(
        self, config: CollectorConfig | None = None, pods: PodLabeler | None = None
    ) -> None:
        self.config = config or CollectorConfig()
        # namespace/pod/container beside each cgroup label (serve --pod-labels), added when a
        # family is rendered: the series' state stays keyed by cgroup path alone.
        self.pods = pods
        self._allow = [re.compile(p) for p in self.config.cgroup_allow]
        self._lock = threading.Lock()
        self._windows: dict[str, _Window] = {
            window_label(s): _Window(s) for s in self.config.quantile_windows_s
        }
        self._rank_window: _Sliding[tuple[str, str], int] = _Sliding(
            int(self.config.ranking_window_s * 1e9)
        )
        self._rank_totals: dict[tuple[str, str], int] = {}
        self._kept: dict[str, set[str]] = {}
        # How each raw series is exported (``_fold_of``), until its cgroups' top-K standing
        # changes: (counter name or "" for a histogram, raw key) -> _Fold.
        self._folds: dict[tuple[str, LabelKey], _Fold] = {}
        # The _folds keys naming each (probe, cgroup): a cgroup entering or leaving the top-K
        # drops just those (may name keys already pruned).
        self._folds_of: dict[tuple[str, str], list[tuple[str, LabelKey]]] = {}
        self._folds_indexed = 0  # entries in _folds_of: rebuilt when far above live folds
        self._folded: dict[str, int] = {}
        self._cumulative: dict[tuple[str, LabelKey], _Cumulative] = {}
        self._counters: dict[tuple[str, LabelKey], _Total] = {}
        self._last: HistDocument | None = None
        self._last_sparse: dict[LabelKey, SparseHistogram] = {}
        self.probes: dict[str, ProbeStatus] = {}
        self.intervals = 0
        self.last_update_s = 0.0
        self.last_collect_s = 0.0
        self.bpf_stats_enabled = False
        self.interval_errors = 0
        self.recording: RecordingStatus | None = None
        # More families served with ours, e.g. the live jump verdicts (analysis/verdicts.py).
        self.extra_families: list[Callable[[], list[Family]]] = []
        # Bumped by every change a scrape can see; the exposition is rendered once per value.
        self.generation = 0
        self.renders = 0
        self._render_lock = threading.Lock()
        self._rendered: tuple[int, bytes] | None = None
        self._templates: dict[tuple[str, Labels], str] = {}  # render_text's, kept between renders

    # -- feeding ----------------------------------------------------------------------------

    def update(self, document: HistDocument) -> None:
        """Add one interval (series labels carry cgroup paths, as from ``Snapshot.to_document``)."""
        began = time.perf_counter()
        raws = [key_of(s) for s in document.series]
        sparse = {raw: s.sparse for raw, s in zip(raws, document.series, strict=True)}
        plain: list[Counter] = []
        blocks: list[CounterPairs] = []  # victim x aggressor pairs: folded as arrays
        for part in document.counter_parts():
            if isinstance(part, CounterPairs):
                blocks.append(part)
                plain.extend(part.others)
            else:
                plain.extend(part)
        if self.pods is not None:  # outside the lock: this may ask the kubelet
            labelled = [s.labels for s in document.series] + [c.labels for c in plain]
            cgroups = {v for labels in labelled for v in _cgroups(labels)}
            for block in blocks:
                pairs = block.pairs
                named = np.unique(np.concatenate([pairs.victim, pairs.aggressor]))
                cgroups.update(pairs.cgroups[i] for i in named.tolist())
            self.pods.observe(cgroups)
        with self._lock:
            self._rank(document, raws, sparse, plain, blocks)
            slots = []
            for raw in raws:
                fold = self._fold_of("", raw)
                slot = fold.histogram
                if slot is None:
                    coarse = np.zeros(len(COARSE_BOUNDS_NS) + 1, dtype=np.int64)
                    slot = fold.histogram = self._cumulative.setdefault(
                        (fold.exported, fold.folded), _Cumulative(coarse)
                    )
                slots.append(slot)
            _add_coarse(slots, [sparse[raw] for raw in raws])
            for c in plain:
                self._add_counter(c.name, key_of(c), c.value)
            for block in blocks:
                self._add_pairs(block)
            for window in self._windows.values():
                window.add(document.end_ns, sparse)
            self._last, self._last_sparse = document, sparse
            self.intervals += 1
            self._prune_folds()
            self.generation += 1
        self.last_update_s = time.perf_counter() - began

    def _add_counter(self, name: str, raw: LabelKey, value: int) -> None:
        """Add to the exported total of a raw counter (made at 0 the first time)."""
        fold = self._fold_of(name, raw)
        total = fold.counter
        if total is None:
            total = fold.counter = self._counters.setdefault(
                (fold.exported, fold.folded), _Total(fold.scale)
            )
        total.total += value

    def _add_pairs(self, block: CounterPairs) -> None:
        """``_add_counter`` for each pair counter of a block, its cgroups folded first (top-K or
        other), then summed per folded pair: one total per folded pair, not one per pair."""
        kept, pairs = self._kept.get(block.probe, set()), block.pairs
        folded = [
            path if path in kept or path in FIXED_CGROUP_NAMES else OTHER_CGROUP
            for path in pairs.cgroups
        ]
        names = tuple(dict.fromkeys(folded))
        at = {name: n for n, name in enumerate(names)}
        fold = np.array([at[name] for name in folded], dtype=np.intp)
        pair = fold[pairs.victim] * len(names) + fold[pairs.aggressor]
        for k, counter_name in enumerate(pairs.names):
            rows = np.flatnonzero(pairs.moved[:, k])
            groups, group_of = np.unique(pair[rows], return_inverse=True)
            sums = np.zeros(len(groups), dtype=np.uint64)
            np.add.at(sums, group_of, pairs.values[rows, k])
            for group, value in zip(groups.tolist(), sums.tolist(), strict=True):
                victim, aggressor = divmod(group, len(names))
                raw = (
                    ("aggressor", names[aggressor]),
                    ("probe", block.probe),
                    ("victim", names[victim]),
                )
                self._add_counter(counter_name, raw, value)

    def _fold_of(self, name: str, raw: LabelKey) -> _Fold:
        """How a raw series is exported: its name (a histogram's metric base when ``name`` is "",
        else the counter's), folded labels, scale and total; remembered until one of its cgroups
        enters or leaves the top-K (``_rank`` drops those) or it goes FOLD_MAX_AGE intervals
        unexported."""
        known = self._folds.get((name, raw))
        if known is not None:
            known.seen = self.intervals
        else:
            labels = dict(raw)
            probe = labels.get("probe", "")
            if name:
                exported, scale = counter_metric(name, probe)
            else:
                exported, scale = metric_base(probe, labels), 1.0
            cgroups = tuple(labels[label] for label in CGROUP_LABELS if label in labels)
            folded = label_key(self._fold(labels, histogram=not name))
            known = self._folds[(name, raw)] = _Fold(
                exported, folded, scale, probe, cgroups, self.intervals
            )
            for cgroup in cgroups:
                self._folds_of.setdefault((probe, cgroup), []).append((name, raw))
            self._folds_indexed += len(cgroups)
        return known

    def _prune_folds(self) -> None:
        """Every FOLD_MAX_AGE intervals, forget how series unexported that long were exported:
        what is remembered is bounded by the keys of 2 x FOLD_MAX_AGE intervals, under churn too."""
        if self.intervals % FOLD_MAX_AGE:
            return
        oldest = self.intervals - FOLD_MAX_AGE
        self._folds = {key: fold for key, fold in self._folds.items() if fold.seen >= oldest}
        self._index_folds()

    def _index_folds(self) -> None:
        """Rebuild ``_folds_of`` from the live folds (it keeps keys already dropped)."""
        self._folds_of = {}
        for key, fold in self._folds.items():
            for cgroup in fold.cgroups:
                self._folds_of.setdefault((fold.probe, cgroup), []).append(key)
        self._folds_indexed = sum(len(fold.cgroups) for fold in self._folds.values())

    def _rank(
        self,
        document: HistDocument,
        raws: list[LabelKey],
        sparse: Mapping[LabelKey, SparseHistogram],
        plain: list[Counter],
        blocks: list[CounterPairs],
    ) -> None:
        """Re-pick each probe's top-K cgroups; those dropped lose their series."""
        counts: dict[tuple[str, str], int] = {}
        for s, raw in zip(document.series, raws, strict=True):
            subject = _subject(s.labels)
            if subject is not None:
                key = (s.labels.get("probe", ""), subject)
                counts[key] = counts.get(key, 0) + sparse[raw].total
        # Probes without histograms (migration) rank by their event counters instead, those
        # that count no events (pressure) by their times.
        with_histograms = {s.labels.get("probe", "") for s in document.series}
        for c in plain:  # the cheap tests first
            probe = c.labels.get("probe", "")
            if probe in with_histograms or (c.name.endswith("_ns") and probe not in RANKED_BY_TIME):
                continue
            subject = _subject(c.labels)
            if subject is not None:
                counts[(probe, subject)] = counts.get((probe, subject), 0) + c.value
        for block in blocks:  # a pair's subject is its victim
            if block.probe in with_histograms:
                continue
            for k, name in enumerate(block.pairs.names):
                if name.endswith("_ns"):
                    continue
                victims, _, values = block.pairs.moved_cells(k)
                for victim, value in zip(victims, values, strict=True):
                    key = (block.probe, victim)
                    counts[key] = counts.get(key, 0) + value
        for key, n in counts.items():
            self._rank_totals[key] = self._rank_totals.get(key, 0) + n
        expired, gone = self._rank_window.push(document.end_ns, counts)
        for old in expired:
            for key, n in old.items():
                self._rank_totals[key] -= n
        for key in gone:
            del self._rank_totals[key]
        by_probe: dict[str, list[tuple[float, bool, str]]] = {}
        for (probe, cgroup), n in self._rank_totals.items():
            if n > 0 and cgroup not in FIXED_CGROUP_NAMES and self._allowed(cgroup):
                incumbent = cgroup in self._kept.get(probe, ())
                score = n * TOP_K_HYSTERESIS if incumbent else n
                by_probe.setdefault(probe, []).append((-score, not incumbent, cgroup))
        retired: set[tuple[str, str]] = set()
        moved: set[tuple[str, str]] = set()  # entered or left the top-K
        for probe in set(self._kept) | set(by_probe):
            ranked = sorted(by_probe.get(probe, []))
            kept = {cgroup for _, _, cgroup in ranked[: self.config.top_k]}
            self._folded[probe] = max(0, len(ranked) - len(kept))
            retired.update((probe, cgroup) for cgroup in self._kept.get(probe, set()) - kept)
            moved.update((probe, c) for c in kept ^ self._kept.get(probe, set()))
            self._kept[probe] = kept
        self._retire(retired)
        for probe_cgroup in moved:  # their series fold differently now
            stale = self._folds_of.pop(probe_cgroup, [])
            self._folds_indexed -= len(stale)
            for fold_key in stale:
                self._folds.pop(fold_key, None)
        if self._folds_indexed > 4 * len(self._folds) + 1024:  # churn left stale entries
            self._index_folds()

    def _retire(self, retired: set[tuple[str, str]]) -> None:
        """Drop the exported series of these (probe, cgroup): they left the top-K."""
        if not retired:
            return

        def mentions(labels: LabelKey) -> bool:
            probe = next((value for name, value in labels if name == "probe"), None)
            return any((probe, value) in retired for name, value in labels if name in CGROUP_LABELS)

        for key in [k for k in self._cumulative if mentions(k[1])]:
            del self._cumulative[key]
        for counter_key in [k for k in self._counters if mentions(k[1])]:
            del self._counters[counter_key]

    def _allowed(self, cgroup: str) -> bool:
        return not self._allow or any(p.fullmatch(cgroup) for p in self._allow)

    def _fold(self, labels: Mapping[str, str], histogram: bool = True) -> dict[str, str]:
        kept = self._kept.get(labels.get("probe", ""), set())
        what = _what_label(labels) if histogram else None
        folded = {}
        for name, value in labels.items():
            if name == what or name in UNEXPORTED_LABELS:
                continue
            if name in CGROUP_LABELS and value not in kept and value not in FIXED_CGROUP_NAMES:
                value = OTHER_CGROUP
            folded[name] = value
        return folded

    def _with_pods(self, labels: LabelKey) -> LabelKey:
        """``labels`` and the pod labels of its cgroups (``victim_pod`` for ``victim``, ...)."""
        if self.pods is None:
            return labels
        extra: list[tuple[str, str]] = []
        for name, value in labels:
            if name in CGROUP_LABELS and value not in FIXED_CGROUP_NAMES:
                extra += self.pods.labels(value, "" if name == "cgroup" else f"{name}_")
        return tuple(sorted((*labels, *extra))) if extra else labels

    def kept_cgroups(self, probe: str) -> set[str]:
        """Cgroups of a probe that currently have their own label."""
        with self._lock:
            return set(self._kept.get(probe, ()))

    # -- exposition ---------------------------------------------------------------------------

    def families(self) -> list[Family]:
        """Every family, the probes' built under the lock from the state as of the last interval."""
        began = time.perf_counter()
        with self._lock:
            out = [*self._histogram_families(), *self._quantile_families()]
            out += self._counter_families()
        out += self._self_families()
        for extra in self.extra_families:
            out += extra()
        self.last_collect_s = time.perf_counter() - began
        return out

    def _histogram_families(self) -> list[Family]:
        les = [("le", le) for le in (*(repr(b / 1e9) for b in COARSE_BOUNDS_NS), "+Inf")]
        grouped: dict[str, list[tuple[LabelKey, _Cumulative]]] = {}
        for (base, labels), slot in sorted(self._cumulative.items()):
            grouped.setdefault(base, []).append((self._with_pods(labels), slot))
        out: list[Family] = []
        for base, entries in grouped.items():
            name = metricnames.histogram_family(base)
            names = _label_names(labels for labels, _ in entries)
            about = described().get(base)
            help_text = GENERIC_HELP["histogram"]
            shape = (
                *((f"{name}_bucket", le) for le in les),
                (f"{name}_count", None),
                (f"{name}_sum", None),
            )
            family = Family(
                name, "histogram", f"{about} {help_text}" if about else help_text, shape
            )
            # One cumulative sum for the family's series (ints: "9", as Go's client writes).
            rows = np.cumsum([slot.coarse for _, slot in entries], axis=1).tolist()
            for (labels, slot), cumulative in zip(entries, rows, strict=True):
                values = (*cumulative, cumulative[-1], slot.sum_ns / 1e9)
                family.series.append((_pairs(labels, names), values))
            out.append(family)
        return out

    def _quantile_families(self) -> list[Family]:
        # Each (metric base, folded labels, window) is a group: the series' labels with its
        # window are made once per series, and every group's quantiles in one pass.
        group_of: dict[tuple[str, LabelKey, str], int] = {}

        def group(raw: LabelKey, window: str) -> int:
            fold = self._fold_of("", raw)
            return group_of.setdefault((fold.exported, fold.folded, window), len(group_of))

        merge = _Merge()
        if self._last is not None:
            window = window_label(self.config.interval_s)
            parts = self._last_sparse
            merge.add_sparse([group(raw, window) for raw in parts], list(parts.values()))
        for window, sums in self._windows.items():
            groups = np.zeros(len(sums.rows), dtype=np.int64)  # rows of no series hold 0s
            for raw, row in sums.row_of.items():
                groups[row] = group(raw, window)
            merge.add_rows(groups, sums.rows)
        quantiles = merge.quantiles_ns(len(group_of), QUANTILES)
        by_base: dict[str, list[tuple[LabelKey, list[float] | None]]] = {}
        for (base, folded, window), at in group_of.items():
            series_key = (*folded, ("window", window))  # "window" is no series label
            by_base.setdefault(base, []).append((series_key, quantiles[at]))
        out: list[Family] = []
        quantile_labels = [(QUANTILE_LABEL, str(q)) for q in QUANTILES]
        for base, entries in sorted(by_base.items()):
            names = _label_names(self._with_pods(key) for key, _ in entries)
            about = described().get(base)
            help_text = GENERIC_HELP["quantile"]
            name = metricnames.quantile_family(base)
            family = Family(
                name,
                "gauge",
                f"{about} {help_text}" if about else help_text,
                tuple((name, q_label) for q_label in quantile_labels),
            )
            for series_key, values_ns in sorted(entries, key=lambda entry: entry[0]):
                if values_ns is None:
                    continue
                pairs = _pairs(self._with_pods(series_key), names)
                family.series.append((pairs, tuple([value_ns / 1e9 for value_ns in values_ns])))
            out.append(family)
        return out

    def _counter_families(self) -> list[Family]:
        grouped: dict[str, list[tuple[LabelKey, float, int]]] = {}
        for (name, labels), counter in sorted(self._counters.items()):
            grouped.setdefault(name, []).append(
                (self._with_pods(labels), counter.scale, counter.total)
            )
        out: list[Family] = []
        for name, entries in grouped.items():
            names = _label_names(labels for labels, _, _ in entries)
            help_text = described().get(name, GENERIC_HELP["counter"])
            family = Family(name, "counter", help_text)
            family.series = [
                (_pairs(labels, names), (float(total * scale),)) for labels, scale, total in entries
            ]
            out.append(family)
        return out

    def _self_families(self) -> list[Family]:
        attached = Family(
            "tailsight_probe_attached",
            "gauge",
            "1 if the probe is attached (mode: tp_btf or the raw_tp fallback); 0 with the reason "
            "it is not.",
        )
        runs = Family(
            "tailsight_bpf_program_runs",
            "counter",
            "Times the kernel ran the program (kernel BPF stats: serve --bpf-stats).",
        )
        run_time = Family(
            "tailsight_bpf_program_run_time_seconds",
            "counter",
            "Time the kernel spent in the program (kernel BPF stats: serve --bpf-stats).",
        )
        missed = Family(
            "tailsight_bpf_program_missed_runs",
            "counter",
            "Events the kernel did not run the program for: it was already running on that CPU "
            "(the kernel's recursion_misses). Each is an event missing from the probe's counts.",
        )
        fill = Family("tailsight_map_fill_ratio", "gauge", "Entries used / max entries.")
        errors = Family(
            "tailsight_probe_read_errors", "counter", "Failed or reset reads of a probe."
        )
        folded = Family(
            "tailsight_cgroups_folded",
            "gauge",
            'Cgroups with events in the ranking window summed into cgroup="other".',
        )
        for probe, status in sorted(self.probes.items()):
            where = (("probe", probe), ("reason", status.reason[:200]), ("mode", status.mode))
            attached.add(where, status.attached)
            errors.add((("probe", probe),), status.read_errors)
            for program, fd in sorted(status.program_fds.items()):
                stats = read_program_stats(fd)
                if stats is not None:
                    program_labels = (("probe", probe), ("program", program))
                    if self.bpf_stats_enabled:  # else the kernel does not count them
                        run_time.add(program_labels, stats.run_time_ns / 1e9)
                        runs.add(program_labels, stats.run_cnt)
                    missed.add(program_labels, stats.missed_runs)
            if status.map_fill is not None:
                try:
                    for map_name, ratio in sorted(status.map_fill().items()):
                        fill.add((("probe", probe), ("map", map_name)), ratio)
                except Exception:  # a probe's optional self-report must not break a scrape
                    pass
        with self._lock:
            for probe, n in sorted(self._folded.items()):
                folded.add((("probe", probe),), n)
        cpu = Family(
            "tailsight_cpu_seconds",
            "counter",
            "CPU time of this agent's process and of its symbolizer helpers (they name the user "
            "frames of outlier stacks): tailsight's cost to the host beside its BPF programs.",
        )
        cpu.add((("process", "agent"),), time.process_time())
        cpu.add((("process", "symbolizer"),), shared_symbolizer().helper_cpu_s())
        out = [attached, runs, run_time, missed, fill, errors, folded, cpu]
        for name, kind, help_text, value in (
            (
                "tailsight_bpf_stats_enabled",
                "gauge",
                "Whether this agent holds the kernel's BPF run-time stats on (--bpf-stats).",
                self.bpf_stats_enabled,
            ),
            ("tailsight_intervals", "counter", "Intervals exported.", self.intervals),
            (
                "tailsight_interval_export_seconds",
                "gauge",
                "Wall time of the last interval's export update.",
                self.last_update_s,
            ),
            (
                "tailsight_scrape_duration_seconds",
                "gauge",
                "Wall time of the previous exposition render.",
                self.last_collect_s,
            ),
            (
                "tailsight_exposition_renders",
                "counter",
                "Expositions rendered (at most one per interval; scrapes share it).",
                self.renders,
            ),
            (
                "tailsight_interval_errors",
                "counter",
                "Intervals that failed and were skipped; serving went on.",
                self.interval_errors,
            ),
        ):
            family = Family(name, kind, help_text)
            family.add((), value)
            out.append(family)
        if self.recording is not None:
            up = Family(
                "tailsight_recording_up",
                "gauge",
                "1 while --record writes every interval; 0 after a write failed (reason).",
            )
            up.add((("reason", self.recording.reason[:200]),), self.recording.up)
            failed = Family(
                "tailsight_recording_errors",
                "counter",
                "Recording writes that failed (e.g. disk full).",
            )
            failed.add((), self.recording.errors)
            out += [up, failed]
        return out

    def changed(self) -> None:
        """State outside ``update`` changed (an interval failed, recording stopped): re-render."""
        self.generation += 1

    def note_interval_error(self) -> None:
        """One interval could not be exported; counted in ``tailsight_interval_errors_total``."""
        self.interval_errors += 1
        self.changed()

    def exposition(self) -> bytes:
        """The text exposition (format 0.0.4), rendered at most once per generation (one
        interval, normally): scrapes in between get the same bytes object, however many."""
        with self._render_lock:
            generation = self.generation
            if self._rendered is None or self._rendered[0] != generation:
                families = self.families()
                if len(self._templates) > 2 * sum(len(f.series) for f in families) + 1024:
                    self._templates.clear()  # series churned: keep only the live ones' templates
                self._rendered = (generation, render_text(families, self._templates))
                self.renders += 1
            return self._rendered[1]

    # -- prometheus-client collector protocol (the same families, for a CollectorRegistry) ------

    def describe(self) -> list[Metric]:
        """Nothing up front: families depend on the probes loaded (avoids a collect at register)."""
        return []

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.metrics_core import Metric

        for family in self.families():
            metric = Metric(family.name, family.help, family.kind)
            for name, pairs, extra, value in family.samples:
                labels = dict(pairs if extra is None else (*pairs, extra))
                metric.add_sample(name, labels, value)
            yield metric

    def register(self, registry: CollectorRegistry | None = None) -> CollectorRegistry:
        """Register on ``registry`` (a new one by default) and return it."""
        from prometheus_client import CollectorRegistry

        registry = registry if registry is not None else CollectorRegistry(auto_describe=False)
        registry.register(self)
        return registry


Shape = tuple[tuple[str, tuple[str, str] | None], ...]
"""A family's samples per series: (sample name, extra label or None), one per value."""


@dataclass
class Family:
    """One metric family as exposed: each series is its labels and one value per entry of the
    family's ``shape`` (a histogram's buckets, count and sum; a quantile gauge's ``q`` values).
    The extra label (``le``, ``q``) is kept apart so a series' labels are escaped once."""

    name: str
    kind: str  # counter (samples named <name>_total) | gauge | histogram
    help: str
    shape: Shape = ()  # default: one sample, <name>_total for a counter, else <name>
    series: list[tuple[Labels, tuple[float, ...]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.shape:
            self.shape = ((f"{self.name}_total" if self.kind == "counter" else self.name, None),)

    def add(self, labels: Labels, value: float) -> None:
        """A series of a one-sample family."""
        self.series.append((labels, (float(value),)))

    @property
    def samples(self) -> list[tuple[str, Labels, tuple[str, str] | None, float]]:
        """Every sample: (name, labels, extra label or None, value)."""
        return [
            (name, labels, extra, value)
            for labels, values in self.series
            for (name, extra), value in zip(self.shape, values, strict=True)
        ]


def render_text(
    families: Iterable[Family], templates: dict[tuple[str, Labels], str] | None = None
) -> bytes:
    """Prometheus text format 0.0.4 (the samples prometheus-client's ``generate_latest`` writes,
    integer values as integers, at a fraction of its cost). Each series' lines are one
    %-template with its label text, kept in ``templates`` from one render to the next: a render
    formats only the numbers. Templates are keyed by family name and labels, so a family's name
    must fix its shape."""
    templates = {} if templates is None else templates
    chunks: list[str] = []
    for family in families:
        exposed = f"{family.name}_total" if family.kind == "counter" else family.name
        help_text = family.help.replace("\\", r"\\").replace("\n", r"\n")
        chunks.append(f"# HELP {exposed} {help_text}\n# TYPE {exposed} {family.kind}\n")
        for labels, values in family.series:
            template = templates.get((family.name, labels))
            if template is None:
                template = templates[(family.name, labels)] = _template(family.shape, labels)
            if math.isfinite(sum(values)):  # %r writes inf and nan unlike the format
                chunks.append(template % values)
            else:
                chunks.append(template % tuple(_Number(value) for value in values))
    return "".join(chunks).encode("utf-8")


def _template(shape: Shape, labels: Labels) -> str:
    """The %-template of one series' lines: a ``%r`` where each value goes."""
    pairs = [_label_pair(pair) for pair in labels]
    lines = []
    for name, extra in shape:
        text = ",".join(pairs if extra is None else [*pairs, _label_pair(extra)])
        lines.append(f"{name}{{{text}}} " if text else f"{name} ")
    return "".join(line.replace("%", "%%") + "%r\n" for line in lines)


class _Number(float):
    """A value as the text format writes it: ``repr`` except +Inf, -Inf and NaN."""

    def __repr__(self) -> str:
        if math.isfinite(self):
            return float.__repr__(self)
        return "NaN" if math.isnan(self) else ("+Inf" if self > 0 else "-Inf")


def _label_pair(pair: tuple[str, str]) -> str:
    name, value = pair
    if "\\" in value or '"' in value or "\n" in value:
        value = value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return f'{name}="{value}"'


def _quantiles_of_buckets(
    index: npt.NDArray[np.int64],
    counts: npt.NDArray[np.int64],
    lengths: npt.NDArray[np.int64],
    overflow: npt.NDArray[np.int64],
    qs: Sequence[float],
) -> list[list[float] | None]:
    """The quantiles of groups given as their non-zero buckets (``index`` ascending and
    ``counts``, group after group: ``lengths`` each) and overflow counts."""
    if not len(index):  # every group empty or overflow only
        top = float(_UPPER_BOUNDS_NS[-1])
        return [[top] * len(qs) if over else None for over in overflow.tolist()]
    running = np.concatenate([np.zeros(1, np.int64), np.cumsum(counts)])
    ends = np.cumsum(lengths)
    starts = ends - lengths
    before = running[starts]  # the counts of the groups before each one
    totals = running[ends] - before + overflow
    group_of = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
    local = running[1:] - before[group_of]  # cumulative count within each group
    # Same rule as Histogram.quantiles: the first bucket whose cumulative count reaches the rank
    # (rank 0: the first non-empty one), linear inside it; a rank in overflow gives the highest
    # finite bound. Integer counts reach a rank iff they reach its ceiling, so one searchsorted
    # over all groups, each lifted by group * span, finds every group's bucket.
    ranks = np.outer(totals, np.asarray(qs, dtype=np.float64))  # group x q: float(q) * total
    span = int(totals.max()) + 1
    if span * (len(lengths) + 1) >= 2**62:  # lifted keys would overflow int64: one at a time
        return [
            _quantiles_of_buckets(
                index[start:end], counts[start:end], lengths[g : g + 1], overflow[g : g + 1], qs
            )[0]
            for g, (start, end) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True))
        ]
    lift = np.arange(len(lengths), dtype=np.int64)[:, None] * span
    found = np.searchsorted(local + group_of * span, np.ceil(ranks).astype(np.int64) + lift)
    found = np.where(ranks == 0, starts[:, None], found)
    in_overflow = found >= ends[:, None]
    at = np.minimum(found, len(index) - 1)
    bucket = index[at]
    lifted = before[:, None]
    below = running[at] - lifted  # 0 at a group's first bucket
    reached = running[at + 1] - lifted
    start = np.where(bucket > 0, _UPPER_BOUNDS_NS[np.maximum(bucket - 1, 0)], 0).astype(np.float64)
    end = _UPPER_BOUNDS_NS[bucket].astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):  # overflow entries are replaced below
        values = start + (end - start) * ((ranks - below) / (reached - below))
    values = np.where(in_overflow, float(_UPPER_BOUNDS_NS[-1]), values)
    return [row if total else None for row, total in zip(values.tolist(), totals, strict=True)]


def _add_coarse(slots: Sequence[_Cumulative], parts: Sequence[SparseHistogram]) -> None:
    """Add each part to its slot, re-bucketed exactly onto the coarse buckets (cf.
    ``Histogram.rebucket``): one bincount over every part's non-zero buckets, then one add per
    slot (a busy host's interval holds hundreds of parts, folded into far fewer slots)."""
    row_of: dict[int, int] = {}  # by id(): a slot is a mutable dataclass
    unique: list[_Cumulative] = []
    for slot in slots:
        if id(slot) not in row_of:
            row_of[id(slot)] = len(unique)
            unique.append(slot)
    rows = np.array([row_of[id(slot)] for slot in slots], dtype=np.int64)
    lengths = [len(part.index) for part in parts]
    width = len(COARSE_BOUNDS_NS) + 1
    if sum(lengths):
        index = np.concatenate([part.index for part in parts])
        count = np.concatenate([part.count for part in parts])
        flat = np.repeat(rows, lengths) * width + _COARSE_OF_FINE[index]
        # float64 weights are exact below 2^53: one interval's counts are far below.
        added = np.bincount(flat, count, len(unique) * width).astype(np.int64)
        for slot, row in zip(unique, added.reshape(len(unique), width), strict=True):
            slot.coarse += row
    for slot, part in zip(slots, parts, strict=True):
        slot.coarse[-1] += part.overflow
        slot.sum_ns += part.sum_ns


def _what_label(labels: Mapping[str, str]) -> str | None:
    return next((name for name in WHAT_LABELS if labels.get(name)), None)


def _cgroups(labels: Mapping[str, str]) -> list[str]:
    return [labels[name] for name in CGROUP_LABELS if name in labels]


def _subject(labels: Mapping[str, str]) -> str | None:
    return labels.get("cgroup", labels.get("victim"))


def _label_names(keys: Iterable[LabelKey]) -> tuple[str, ...]:
    return tuple(sorted({name for key in keys for name, _ in key}))


@functools.lru_cache(maxsize=8192)  # a busy host's exposition: ~1,100 distinct
def _pairs(labels: LabelKey, names: tuple[str, ...]) -> Labels:
    """The family's label names in order, "" where this series lacks one (remembered: a series
    keeps its labels from one render to the next; 8% of a busy host's render without it)."""
    named = dict(labels)
    return tuple((name, named.get(name, "")) for name in names)
