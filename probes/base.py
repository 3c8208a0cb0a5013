"""What every probe offers `trace` and the collector: attach, read cumulative state, close.

A probe's kernel maps are cumulative; ``read()`` turns them into a ``Snapshot`` whose labels still
carry raw cgroup ids. Subtracting two snapshots gives an interval; ``to_document`` names the
cgroups and yields one ``tailsight.hist/1`` document, the shape everything downstream consumes.
Outlier stacks travel as ordinary counters, ``<probe>_outlier_events`` labelled ``cgroup``,
``kernel_stack`` and ``user_stack`` (folded, leaf last; see ``outliers.py``): consumers with a
cardinality budget (Prometheus) should drop or top-K them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final, Protocol

from tailsight.hist import Histogram
from tailsight.histfile import Counter, HistDocument, Series

LabelValue = str | int
Labels = tuple[tuple[str, LabelValue], ...]
"""Sorted (name, value) pairs; the values of CGROUP_LABELS are cgroup v2 ids until resolved."""

CGROUP_LABELS: Final = frozenset({"cgroup", "victim", "aggressor"})
IDLE_CGROUP_NAME: Final = "idle"
"""Name of cgroup id 0 where it stands for "no task": the CPU was idle (an aggressor)."""
UNKNOWN_CGROUP_NAME: Final = "unknown"

CgroupNamer = Callable[[Iterable[int]], Mapping[int, str]]
"""Bulk cgroup id -> path, e.g. ``CgroupResolver.resolve_many``."""


@dataclass(frozen=True)
class SeriesInfo:
    """A latency histogram a probe records, exported as ``tailsight_<probe>_<what>_seconds``."""

    what: str
    """The metric's stem; where a probe records several, its series' ``kind`` label names it."""
    title: str
    """Its words in prose, headings and panels: "run-queue wait"."""
    help: str
    by: tuple[str, ...] = ()
    """Series labels besides ``cgroup``."""


@dataclass(frozen=True)
class CounterInfo:
    """A counter a probe records (a ``_ns`` counter is exported in seconds)."""

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

    def delta(self, earlier: Snapshot) -> Snapshot:
        """The interval (earlier, self]; ValueError if anything went backwards (a reset)."""
        if earlier.probe != self.probe:
            raise ValueError(f"cannot subtract a {earlier.probe} snapshot from a {self.probe} one")
        histograms = {}
        for key, hist in self.histograms.items():
            before = earlier.histograms.get(key)
            changed = hist if before is None else hist.delta(before)
            if changed.sum_ns or changed.overflow or changed.counts.any():
                histograms[key] = changed
        counters = {}
        for counter_key, value in self.counters.items():
            changed_value = value - earlier.counters.get(counter_key, 0)
            if changed_value < 0:
                raise ValueError(f"counter {counter_key} went backwards by {-changed_value}")
            counters[counter_key] = changed_value
        return Snapshot(self.probe, self.taken_ns, histograms, counters)

    def __sub__(self, earlier: Snapshot) -> Snapshot:
        return self.delta(earlier)

    def without(self, cgroup_ids: set[int]) -> Snapshot:
        """This snapshot less every series and counter naming one of these cgroups."""

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
        keys = [*self.histograms, *(key for _, key in self.counters)]
        return {
            value
            for key in keys
            for name, value in key
            if name in CGROUP_LABELS and isinstance(value, int) and value != 0
        }

    def to_document(
        self, start_ns: int, name_cgroups: CgroupNamer, keep: Callable[[str], bool] | None = None
    ) -> HistDocument:
        """This snapshot (usually an interval) as a document, cgroup ids replaced by paths.

        Ids that resolve to the same path (a recreated cgroup) are merged. ``keep(path)`` filters
        on the ``cgroup`` / ``victim`` label (``--cgroup``); counters without one are kept.
        """
        names = dict(name_cgroups(sorted(self.cgroup_ids())))

        def resolve(key: Labels) -> dict[str, str] | None:
            named = {"probe": self.probe}
            for name, value in key:
                if name in CGROUP_LABELS and isinstance(value, int):
                    fallback = IDLE_CGROUP_NAME if value == 0 else UNKNOWN_CGROUP_NAME
                    named[name] = names.get(value, fallback)
                else:
                    named[name] = str(value)
            subject = named.get("cgroup", named.get("victim"))
            if keep is not None and subject is not None and not keep(subject):
                return None
            return named

        merged: dict[tuple[tuple[str, str], ...], tuple[dict[str, str], Histogram]] = {}
        for key, hist in self.histograms.items():
            named = resolve(key)
            if named is None:
                continue
            slot = tuple(sorted(named.items()))
            previous = merged.get(slot)
            merged[slot] = (named, hist if previous is None else previous[1].merge(hist))
        totals: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[dict[str, str], int]] = {}
        for (counter_name, key), value in self.counters.items():
            named = resolve(key)
            if named is None:
                continue
            slot_key = (counter_name, tuple(sorted(named.items())))
            previous_total = totals.get(slot_key)
            totals[slot_key] = (named, value + (0 if previous_total is None else previous_total[1]))
        return HistDocument(
            start_ns=start_ns,
            end_ns=self.taken_ns,
            series=[Series(named, hist) for _, (named, hist) in sorted(merged.items())],
            counters=[
                Counter(counter_name, named, value)
                for (counter_name, _), (named, value) in sorted(totals.items())
            ],
        )


class Probe(Protocol):
    """One probe: ``probes/<name>.bpf.c`` + ``probes/<name>.py``."""

    name: str

    def attach(self) -> None:
        """Compile with verified offsets and attach; raises ProbeError saying why not."""

    def read(self) -> Snapshot:
        """Cumulative state as of now."""

    def set_cgroup_filter(self, cgroup_ids: Iterable[int] | None) -> None:
        """Record only these cgroup ids (None: all).

        Called before ``attach`` it decides whether the filter is compiled in; once attached
        only the set of ids may change (switching between None and a set: ValueError).
        """

    def program_fds(self) -> Mapping[str, int]:
        """Program fd per attached program, for kernel BPF run-time stats."""

    def forget(self, cgroup_ids: set[int]) -> None:
        """Drop every trace of these removed cgroups, in the kernel and in the probe: their
        last interval has been read. The next ``read`` no longer names them, and a slot they
        held serves a new cgroup (so a long-lived agent under cgroup churn stays bounded)."""

    def close(self) -> None:
        """Detach and free the maps; safe to call twice."""
