"""Prometheus export of interval documents: a custom collector (own registry, never the global one)
with coarse classic histograms that are exact re-bucketings of the 5 µs model, exact quantile
gauges from full resolution, counters, a bounded ``cgroup`` label and self-metrics."""

from __future__ import annotations

import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Final, Generic, TypeVar

import numpy as np
import numpy.typing as npt

from tailsight.collector.config import CollectorConfig
from tailsight.hist import LINEAR_LIMIT_NS, TAIL_BUCKETS, Histogram, bucket_upper_bounds_ns
from tailsight.histfile import HistDocument

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
# The label of an exact quantile gauge; "quantile" is reserved for summaries (promtool says so).
QUANTILE_LABEL: Final = "q"
OTHER_CGROUP: Final = "other"
CGROUP_LABELS: Final = ("cgroup", "victim", "aggressor")
# Label values that name no cgroup and are bounded by construction (id 0 = idle CPU).
FIXED_CGROUP_NAMES: Final = frozenset({"idle", OTHER_CGROUP})
# Labels that would make Prometheus cardinality unbounded: stacks (outlier events) and task ids
# stay in the recording; the exporter sums over them.
UNEXPORTED_LABELS: Final = frozenset({"kernel_stack", "user_stack", "stack", "pid", "tid", "comm"})
# What a probe's histogram measures, for the metric name tailsight_<probe>_<what>_seconds; a
# series label in WHAT_LABELS (e.g. tcpstate's kind="connect") names it instead and is consumed.
PROBE_WHAT: Final[dict[str, str]] = {"runqueue": "wait", "netsyscall": "syscall"}
WHAT_LABELS: Final = ("what", "kind")
_NAME_BAD = re.compile(r"[^a-zA-Z0-9_]")

LabelKey = tuple[tuple[str, str], ...]
K = TypeVar("K")
P = TypeVar("P")


def metric_base(probe: str, labels: Mapping[str, str]) -> str:
    """``tailsight_<probe>_<what>`` for a histogram series."""
    what = _what_label(labels)
    what = labels[what] if what is not None else PROBE_WHAT.get(probe, "latency")
    return _NAME_BAD.sub("_", f"tailsight_{probe}_{what}")


def counter_metric(name: str, probe: str) -> tuple[str, float]:
    """Metric name (without ``_total``) and scale for a document counter; ``_ns`` become seconds."""
    stem = name if name.startswith(f"{probe}_") or not probe else f"{probe}_{name}"
    scale = 1.0
    if stem.endswith("_ns"):
        stem, scale = stem[: -len("_ns")] + "_seconds", 1e-9
    stem = stem.removesuffix("_total")
    return _NAME_BAD.sub("_", f"tailsight_{stem}"), scale


def window_label(seconds: float) -> str:
    """ "1s", "60s", "500ms": the ``window`` label value of a quantile gauge."""
    if seconds >= 1 and float(seconds).is_integer():
        return f"{int(seconds)}s"
    return f"{seconds * 1000:g}ms"


def read_program_stats(proc_root: Path, fd: int) -> tuple[int, int] | None:
    """(run_time_ns, run_cnt) of a BPF program fd from ``<proc>/self/fdinfo``; None if absent."""
    try:
        text = (proc_root / "self" / "fdinfo" / str(fd)).read_text(encoding="utf-8")
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    try:
        return int(fields["run_time_ns"].strip()), int(fields["run_cnt"].strip())
    except (KeyError, ValueError):
        return None


@dataclass
class ProbeStatus:
    """Attach state of one probe as the agent last saw it."""

    attached: bool
    reason: str = ""
    program_fds: Mapping[str, int] = field(default_factory=dict)
    map_fill: Callable[[], Mapping[str, float]] | None = None
    read_errors: int = 0


@dataclass
class RecordingStatus:
    """Whether ``serve --record`` is still recording; after a write fails it is not (the endpoint
    stays up) and ``reason`` says why."""

    up: bool = True
    errors: int = 0
    reason: str = ""


@dataclass
class _Sparse:
    """A histogram's non-zero buckets (window storage: dense copies would cost 16 KiB each)."""

    index: npt.NDArray[np.int64]
    count: npt.NDArray[np.int64]
    overflow: int
    sum_ns: int

    @classmethod
    def of(cls, hist: Histogram) -> _Sparse:
        index = np.flatnonzero(hist.counts).astype(np.int64)
        return cls(index, hist.counts[index], hist.overflow, hist.sum_ns)

    @property
    def total(self) -> int:
        """Observations, overflow included."""
        return int(self.count.sum()) + self.overflow

    def add_to(self, dense: Histogram, sign: int) -> None:
        dense.counts[self.index] += sign * self.count
        dense.overflow += sign * self.overflow
        dense.sum_ns += sign * self.sum_ns


@dataclass
class _Cumulative:
    """Coarse bucket counts (not cumulative across ``le``), count and sum since export start."""

    coarse: npt.NDArray[np.int64]
    sum_ns: int = 0


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
    """Running sums per raw series over the last ``span_s`` of intervals."""

    def __init__(self, span_s: float) -> None:
        self.sliding: _Sliding[LabelKey, _Sparse] = _Sliding(int(span_s * 1e9))
        self.sums: dict[LabelKey, Histogram] = {}

    def add(self, end_ns: int, sparse: dict[LabelKey, _Sparse]) -> None:
        for key, part in sparse.items():
            dense = self.sums.get(key)
            if dense is None:
                dense = self.sums[key] = Histogram.empty()
            part.add_to(dense, 1)
        expired, gone = self.sliding.push(end_ns, sparse)
        for old in expired:
            for key, part in old.items():
                part.add_to(self.sums[key], -1)
        for key in gone:
            del self.sums[key]


class PrometheusExporter:
    """Turns interval documents into Prometheus metrics; register on your own registry.

    ``update`` (agent thread) and ``collect`` (HTTP threads) may run concurrently.
    """

    def __init__(self, config: CollectorConfig | None = None) -> None:
        self.config = config or CollectorConfig()
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
        self._folded: dict[str, int] = {}
        self._cumulative: dict[tuple[str, LabelKey], _Cumulative] = {}
        self._counters: dict[tuple[str, LabelKey], tuple[float, int]] = {}
        self._last: HistDocument | None = None
        self._last_sparse: dict[LabelKey, _Sparse] = {}
        self.probes: dict[str, ProbeStatus] = {}
        self.intervals = 0
        self.last_update_s = 0.0
        self.last_collect_s = 0.0
        self.bpf_stats_enabled = False
        self.interval_errors = 0
        self.recording: RecordingStatus | None = None
        # Bumped by every change a scrape can see; the exposition is rendered once per value.
        self.generation = 0
        self.renders = 0
        self._render_lock = threading.Lock()
        self._rendered: tuple[int, bytes] | None = None
        self._registry: CollectorRegistry | None = None

    # -- feeding ----------------------------------------------------------------------------

    def update(self, document: HistDocument) -> None:
        """Add one interval (series labels carry cgroup paths, as from ``Snapshot.to_document``)."""
        began = time.perf_counter()
        sparse = {_key(s.labels): _Sparse.of(s.hist) for s in document.series}
        with self._lock:
            self._rank(document, sparse)
            for s in document.series:
                raw = _key(s.labels)
                labels = self._fold(s.labels)
                slot_key = (metric_base(s.labels.get("probe", ""), s.labels), _key(labels))
                slot = self._cumulative.get(slot_key)
                if slot is None:
                    slot = self._cumulative[slot_key] = _Cumulative(
                        np.zeros(len(COARSE_BOUNDS_NS) + 1, dtype=np.int64)
                    )
                part = sparse[raw]
                # Exact integer re-bucketing of the non-zero buckets only (cf. Histogram.rebucket).
                np.add.at(slot.coarse, _COARSE_OF_FINE[part.index], part.count)
                slot.coarse[-1] += part.overflow
                slot.sum_ns += part.sum_ns
            for c in document.counters:
                probe = c.labels.get("probe", "")
                name, scale = counter_metric(c.name, probe)
                labels = self._fold(c.labels, histogram=False)
                counter_key = (name, _key(labels))
                _, total = self._counters.get(counter_key, (scale, 0))
                self._counters[counter_key] = (scale, total + c.value)
            for window in self._windows.values():
                window.add(document.end_ns, sparse)
            self._last, self._last_sparse = document, sparse
            self.intervals += 1
            self.generation += 1
        self.last_update_s = time.perf_counter() - began

    def _rank(self, document: HistDocument, sparse: Mapping[LabelKey, _Sparse]) -> None:
        """Re-pick each probe's top-K cgroups; those dropped lose their series."""
        counts: dict[tuple[str, str], int] = {}
        for s in document.series:
            subject = _subject(s.labels)
            if subject is not None:
                key = (s.labels.get("probe", ""), subject)
                counts[key] = counts.get(key, 0) + sparse[_key(s.labels)].total
        # Probes without histograms (migration) rank by their event counters instead.
        with_histograms = {s.labels.get("probe", "") for s in document.series}
        for c in document.counters:
            subject = _subject(c.labels)
            probe = c.labels.get("probe", "")
            if subject is not None and probe not in with_histograms and not c.name.endswith("_ns"):
                counts[(probe, subject)] = counts.get((probe, subject), 0) + c.value
        for key, n in counts.items():
            self._rank_totals[key] = self._rank_totals.get(key, 0) + n
        expired, gone = self._rank_window.push(document.end_ns, counts)
        for old in expired:
            for key, n in old.items():
                self._rank_totals[key] -= n
        for key in gone:
            del self._rank_totals[key]
        by_probe: dict[str, list[tuple[int, bool, str]]] = {}
        for (probe, cgroup), n in self._rank_totals.items():
            if n > 0 and cgroup not in FIXED_CGROUP_NAMES and self._allowed(cgroup):
                incumbent = cgroup in self._kept.get(probe, ())
                by_probe.setdefault(probe, []).append((-n, not incumbent, cgroup))
        for probe in set(self._kept) | set(by_probe):
            ranked = sorted(by_probe.get(probe, []))
            kept = {cgroup for _, _, cgroup in ranked[: self.config.top_k]}
            self._folded[probe] = max(0, len(ranked) - len(kept))
            for cgroup in self._kept.get(probe, set()) - kept:
                self._retire(probe, cgroup)
            self._kept[probe] = kept

    def _retire(self, probe: str, cgroup: str) -> None:
        def mentions(labels: LabelKey) -> bool:
            named = dict(labels)
            return named.get("probe") == probe and any(
                named.get(name) == cgroup for name in CGROUP_LABELS
            )

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

    def kept_cgroups(self, probe: str) -> set[str]:
        """Cgroups of a probe that currently have their own label."""
        with self._lock:
            return set(self._kept.get(probe, ()))

    # -- Prometheus collector protocol ------------------------------------------------------

    def describe(self) -> list[Metric]:
        """Nothing up front: families depend on the probes loaded (avoids a collect at register)."""
        return []

    def collect(self) -> Iterator[Metric]:
        """Every family, built under the lock from the state as of the last interval."""
        began = time.perf_counter()
        with self._lock:
            families = [*self._histogram_families(), *self._quantile_families()]
            families += self._counter_families()
        families += self._self_families()
        self.last_collect_s = time.perf_counter() - began
        yield from families

    def _histogram_families(self) -> list[Metric]:
        from prometheus_client.core import HistogramMetricFamily

        les = [*(repr(b / 1e9) for b in COARSE_BOUNDS_NS), "+Inf"]
        grouped: dict[str, list[tuple[LabelKey, _Cumulative]]] = {}
        for (base, labels), slot in sorted(self._cumulative.items()):
            grouped.setdefault(base, []).append((labels, slot))
        out: list[Metric] = []
        for base, entries in grouped.items():
            names = _label_names(labels for labels, _ in entries)
            family = HistogramMetricFamily(
                f"{base}_seconds",
                "Latency, 5 µs model re-bucketed exactly; cumulative since the collector started.",
                labels=names,
            )
            for labels, slot in entries:
                cumulative = np.cumsum(slot.coarse).tolist()
                family.add_metric(
                    _values(labels, names),
                    list(zip(les, cumulative, strict=True)),
                    sum_value=slot.sum_ns / 1e9,
                )
            out.append(family)
        return out

    def _quantile_families(self) -> list[Metric]:
        from prometheus_client.core import GaugeMetricFamily

        views: list[tuple[str, Mapping[LabelKey, _Sparse | Histogram]]] = []
        if self._last is not None:
            views.append((window_label(self.config.interval_s), self._last_sparse))
        views += [(label, window.sums) for label, window in self._windows.items()]
        folded_of: dict[LabelKey, tuple[str, dict[str, str]]] = {}
        grouped: dict[str, dict[LabelKey, Histogram]] = {}
        for window, parts in views:
            for raw, part in parts.items():
                if raw not in folded_of:
                    labels = dict(raw)
                    base = metric_base(labels.get("probe", ""), labels)
                    folded_of[raw] = (base, self._fold(labels))
                base, folded_labels = folded_of[raw]
                folded = _key({**folded_labels, "window": window})
                dense = grouped.setdefault(base, {}).get(folded)
                if dense is None:
                    dense = grouped[base][folded] = Histogram.empty()
                # Summed in place: constructing a merged Histogram per part costs a validation.
                if isinstance(part, _Sparse):
                    part.add_to(dense, 1)
                else:
                    dense.counts += part.counts
                    dense.overflow += part.overflow
                    dense.sum_ns += part.sum_ns
        out: list[Metric] = []
        for base, series in sorted(grouped.items()):
            names = [*_label_names(series), QUANTILE_LABEL]
            family = GaugeMetricFamily(
                f"{base}_quantile_seconds",
                "Exact quantile from full-resolution 5 µs buckets over the window.",
                labels=names,
            )
            for label_key, hist in sorted(series.items()):
                if hist.count == 0:
                    continue
                values = _values(label_key, names[:-1])
                for q, value_ns in zip(QUANTILES, hist.quantiles(QUANTILES), strict=True):
                    family.add_metric([*values, str(q)], value_ns / 1e9)
            out.append(family)
        return out

    def _counter_families(self) -> list[Metric]:
        from prometheus_client.core import CounterMetricFamily

        grouped: dict[str, list[tuple[LabelKey, float, int]]] = {}
        for (name, labels), (scale, total) in sorted(self._counters.items()):
            grouped.setdefault(name, []).append((labels, scale, total))
        out: list[Metric] = []
        for name, entries in grouped.items():
            names = _label_names(labels for labels, _, _ in entries)
            family = CounterMetricFamily(
                name, "Probe counter since the collector started.", labels=names
            )
            for labels, scale, total in entries:
                family.add_metric(_values(labels, names), total * scale if scale != 1.0 else total)
            out.append(family)
        return out

    def _self_families(self) -> list[Metric]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        attached = GaugeMetricFamily(
            "tailsight_probe_attached",
            "1 if the probe is attached; 0 with the reason it is not.",
            labels=["probe", "reason"],
        )
        runs = CounterMetricFamily(
            "tailsight_bpf_program_runs",
            "Times the kernel ran the program (kernel BPF stats).",
            labels=["probe", "program"],
        )
        run_time = CounterMetricFamily(
            "tailsight_bpf_program_run_time_seconds",
            "Time the kernel spent in the program (kernel BPF stats).",
            labels=["probe", "program"],
        )
        fill = GaugeMetricFamily(
            "tailsight_map_fill_ratio", "Entries used / max entries.", labels=["probe", "map"]
        )
        errors = CounterMetricFamily(
            "tailsight_probe_read_errors", "Failed or reset reads of a probe.", labels=["probe"]
        )
        folded = GaugeMetricFamily(
            "tailsight_cgroups_folded",
            'Cgroups with events in the ranking window summed into cgroup="other".',
            labels=["probe"],
        )
        for probe, status in sorted(self.probes.items()):
            attached.add_metric([probe, status.reason[:200]], 1.0 if status.attached else 0.0)
            errors.add_metric([probe], status.read_errors)
            for program, fd in sorted(status.program_fds.items()):
                stats = read_program_stats(self.config.proc_root, fd)
                if stats is not None:
                    run_time.add_metric([probe, program], stats[0] / 1e9)
                    runs.add_metric([probe, program], stats[1])
            if status.map_fill is not None:
                try:
                    for map_name, ratio in sorted(status.map_fill().items()):
                        fill.add_metric([probe, map_name], ratio)
                except Exception:  # a probe's optional self-report must not break a scrape
                    pass
        with self._lock:
            for probe, n in sorted(self._folded.items()):
                folded.add_metric([probe], n)
        stats_on = GaugeMetricFamily(
            "tailsight_bpf_stats_enabled", "Whether kernel BPF run-time stats are held on."
        )
        stats_on.add_metric([], 1.0 if self.bpf_stats_enabled else 0.0)
        intervals = CounterMetricFamily("tailsight_intervals", "Intervals exported.")
        intervals.add_metric([], self.intervals)
        update = GaugeMetricFamily(
            "tailsight_interval_export_seconds", "Wall time of the last interval's export update."
        )
        update.add_metric([], self.last_update_s)
        scrape = GaugeMetricFamily(
            "tailsight_scrape_duration_seconds", "Wall time of the previous exposition render."
        )
        scrape.add_metric([], self.last_collect_s)
        renders = CounterMetricFamily(
            "tailsight_exposition_renders",
            "Expositions rendered (at most one per interval; scrapes share it).",
        )
        renders.add_metric([], self.renders)
        interval_errors = CounterMetricFamily(
            "tailsight_interval_errors", "Intervals that failed and were skipped; serving went on."
        )
        interval_errors.add_metric([], self.interval_errors)
        out = [attached, runs, run_time, fill, errors, folded, stats_on, intervals, update, scrape]
        out += [renders, interval_errors]
        if self.recording is not None:
            up = GaugeMetricFamily(
                "tailsight_recording_up",
                "1 while --record writes every interval; 0 after a write failed (reason).",
                labels=["reason"],
            )
            up.add_metric([self.recording.reason[:200]], 1.0 if self.recording.up else 0.0)
            failed = CounterMetricFamily(
                "tailsight_recording_errors", "Recording writes that failed (e.g. disk full)."
            )
            failed.add_metric([], self.recording.errors)
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
        """The text exposition, rendered at most once per generation (one interval, normally):
        scrapes in between get the same bytes object, however many there are."""
        from prometheus_client import generate_latest

        with self._render_lock:
            generation = self.generation
            if self._rendered is None or self._rendered[0] != generation:
                if self._registry is None:
                    self._registry = self.register()
                self._rendered = (generation, generate_latest(self._registry))
                self.renders += 1
            return self._rendered[1]

    def register(self, registry: CollectorRegistry | None = None) -> CollectorRegistry:
        """Register on ``registry`` (a new one by default) and return it."""
        from prometheus_client import CollectorRegistry

        registry = registry if registry is not None else CollectorRegistry(auto_describe=False)
        registry.register(self)
        return registry


def _what_label(labels: Mapping[str, str]) -> str | None:
    return next((name for name in WHAT_LABELS if labels.get(name)), None)


def _subject(labels: Mapping[str, str]) -> str | None:
    return labels.get("cgroup", labels.get("victim"))


def _key(labels: Mapping[str, str]) -> LabelKey:
    return tuple(sorted(labels.items()))


def _label_names(keys: Iterable[LabelKey]) -> list[str]:
    return sorted({name for key in keys for name, _ in key})


def _values(labels: LabelKey, names: list[str]) -> list[str]:
    named = dict(labels)
    return [named.get(name, "") for name in names]
