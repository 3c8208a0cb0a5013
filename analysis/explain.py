"""``tailsight explain``: find the tail jumps of a recording, say in plain words what caused them.

Jumps are found by the offline detector of :mod:`tailsight.analysis.jumps` over every recorded
series *and* over aggregates (per probe and cgroup, summing the other labels, and per probe over
all cgroups), with Benjamini-Hochberg over all of them; a mix shift (more traffic from an
always-slow cgroup) only shows in an aggregate. Each discovered, confirmed jump is then attributed
with :mod:`tailsight.analysis.attribution`: its excess tail events over the series it sums (volume
vs rate), for run-queue wait the aggressors that displaced the victim cgroup, and the outlier
stacks that became more frequent.
"""

from __future__ import annotations

import math
import textwrap
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from tailsight.analysis.attribution import (
    DEFAULT_BOOTSTRAP,
    DEFAULT_LEVEL,
    Displacement,
    Estimate,
    StackShift,
    TailDecomposition,
    Windows,
    decompose_rows,
    displaced_by_rows,
    stack_shifts_rows,
)
from tailsight.analysis.causes import (
    CALLS,
    COUNTER_CAUSES,
    IDLE_CPU,
    LATE_INTERVALS,
    OTHER_END,
    PRESSURE_CAUSES,
    Cause,
    CounterTable,
    find_causes,
    throttled_intervals,
)
from tailsight.analysis.jumps import (
    JumpConfig,
    OfflineResult,
    TailThreshold,
    benjamini_hochberg,
    confirm_change,
    locate_change,
    no_change,
)
from tailsight.analysis.quantiles import dense_counts_by_series, describe, quantile_name
from tailsight.analysis.stream import CACHE_BYTES, RangeStats, Source, view_threshold
from tailsight.cgroups import is_within
from tailsight.collector.store.codec import IntervalArrays
from tailsight.collector.store.reader import Recording
from tailsight.hist import NUM_BUCKETS, Histogram, bucket_index
from tailsight.intervals import HistDocument, LabelKey
from tailsight.probes.base import IDLE_CGROUP_NAME
from tailsight.probes.catalog import series_title
from tailsight.probes.netsyscall import ERRORS
from tailsight.probes.netsyscall import PROBE_NAME as NETSYSCALL
from tailsight.probes.outliers import short_stack

TEXT_WIDTH: Final = 80
MIN_SPLIT_EVENTS: Final = 20
"""Fewest tail events (both windows) on which a split of the rise is printed."""
LINKED: Final = frozenset({"retransmits", "retransmit_failures", COUNTER_CAUSES[CALLS]})
"""Causes acting across cgroups (either end of a connection; a neighbour's calls on a shared
socket path, never a cause of the neighbour's own symptoms): they concern every symptom of the
incident."""
MAJORITY: Final = 0.5
"""An aggregate is explained by one cgroup that holds at least this share of its rise."""
NEWCOMER_GROWTH: Final = 10.0
"""An aggressor displacing a victim this many times more than before arrived with the change."""
PLOT_QUANTILES: Final = (0.5, 0.99, 0.999)


@dataclass(frozen=True)
class ExplainConfig:
    """What to test and how to attribute (see the module docstring)."""

    quantiles: tuple[float, ...] = (0.99,)
    fdr: float = 0.05
    window_intervals: int = 30
    aggregates: bool = True
    n_boot: int = DEFAULT_BOOTSTRAP
    seed: int = 0
    level: float = DEFAULT_LEVEL
    top: int = 3
    falls: bool = False
    """Also report tails that got faster (without causes: a fall has no excess to attribute)."""
    incident_window: int = 3
    """Jumps whose changes lie at most this many intervals apart may form one incident."""
    jump: JumpConfig = field(default_factory=JumpConfig)


@dataclass(frozen=True)
class JumpExplanation:
    """One jump (when, which series, quantile before/after) and its ranked causes."""

    series: LabelKey
    aggregate: bool
    quantile: float
    direction: str
    change_index: int
    change_start_ns: int
    before_ns: float
    after_ns: float
    p_value: float
    threshold_ns: float
    decomposition: TailDecomposition
    displacement: Displacement | None
    stacks: list[StackShift]
    starts_ns: list[int]
    interval_quantiles_ns: list[list[float]]
    """Per interval, the :data:`PLOT_QUANTILES` of this series (nan where empty)."""

    @property
    def windows(self) -> Windows:
        return self.decomposition.windows

    @property
    def labels(self) -> dict[str, str]:
        return dict(self.series)

    def title(self) -> str:
        """``run-queue wait of /trading`` (aggregates: ``... of all cgroups``)."""
        labels = self.labels
        what = series_title(labels)  # names the kind too
        rest = [v for k, v in sorted(labels.items()) if k not in ("probe", "cgroup", "kind")]
        whom = labels.get("cgroup", "all cgroups")
        return f"{what} of {whom}" + (f" ({' '.join(rest)})" if rest else "")

    def what(self) -> str:
        """The symptom in a few words: ``recvfrom`` of a socket syscall series, else the title."""
        return self.labels.get("syscall") or self.title()

    def change_line(self) -> str:
        """``run-queue wait of /a rose 40 µs -> 1.2 ms (P99, x30) at 12:00:15 (p=1e-9).``"""
        name = quantile_name(self.quantile).upper()
        verb = "rose" if self.direction == "up" else "fell"
        ratio = _safe_ratio(self)
        factor = f", x{ratio:,.0f}" if ratio >= 10 else f", x{ratio:.2f}" if ratio != 1 else ""
        return (
            f"{self.title()} {verb} {_duration(self.before_ns)} -> {_duration(self.after_ns)} "
            f"({name}{factor}) at {_clock(self.change_start_ns)} (p={self.p_value:.1g})."
        )

    def sentences(self, top: int = 3) -> list[str]:
        """The jump and its causes in plain words, most important first. Shares are of the gross
        rise (parts that rose), in [0, 1], with the remainder named; parts that fell are given
        in their own units; a split resting on too few events is not given at all."""
        out = [self.change_line()]
        if self.direction != "up":
            return out  # a faster tail has no excess to attribute
        d = self.decomposition
        if d.excess > 0 and d.tail_events < MIN_SPLIT_EVENTS:
            out.append(
                f"Only {d.tail_events} events above {_duration(d.threshold_ns)} in the compared "
                "windows: too few to split the rise by source or into traffic and slowness."
            )
        elif d.excess > 0:
            volume = "more traffic" if d.volume_effect >= 0 else "less traffic"
            rate = "sources getting slower" if d.rate_effect >= 0 else "sources getting faster"
            out.append(
                f"Events above {_duration(d.threshold_ns)}: {d.tail_before:.1f} -> "
                f"{d.tail_after:.1f} per interval ({d.excess:+.1f}): {d.rate_effect:+.1f} from "
                f"{rate}, {d.volume_effect:+.1f} from {volume}."
            )
            rising = [x for x in d.sources if x.effect > 0]
            if len(d.sources) > 1 and rising:
                parts: list[str] = []
                shown = 0.0
                for source in rising[:top]:
                    if parts and not source.share.low > 0:
                        break
                    kind = "slower" if source.rate_effect >= source.volume_effect else "traffic"
                    name = self._source_name(source.source)
                    parts.append(f"{name} {_pct(source.share)} ({kind})")
                    shown += source.share.value
                rest = len(rising) - len(parts)
                if rest and _percent(1.0 - shown) != "0%":
                    parts.append(f"{rest} other{'s' * (rest != 1)} {_percent(1.0 - shown)}")
                out.append("Share of the rise by source: " + "; ".join(parts) + ".")
        shown_d = self.displacement
        if shown_d is not None and shown_d.excess_ns > 0:
            out.append(_displacement_line(shown_d, top))
        discovered = [s for s in self.stacks if s.discovered and s.excess > 0][:top]
        for rank, stack in enumerate(discovered):
            times = stack.rate_after / stack.rate_before if stack.rate_before else math.inf
            label = "Top stack" if rank == 0 else "Next stack"
            factor = "new" if math.isinf(times) else f"x{times:.1f}"
            out.append(
                f"{label} ({factor}, {_pct(stack.share)} of extra outliers, "
                f"p={stack.p_value:.1g}): kernel {short_stack(stack.kernel_stack)}"
                f" | user {short_stack(stack.user_stack)}"
            )
        return out

    def _source_name(self, source: LabelKey) -> str:
        mine = dict(self.series)
        parts = [v for k, v in source if k not in mine or mine[k] != v]
        return " ".join(parts) or describe(source)

    def to_json(self) -> dict[str, Any]:
        """Plain JSON-able dict."""
        return {
            "series": dict(self.series),
            "aggregate": self.aggregate,
            "quantile": self.quantile,
            "name": quantile_name(self.quantile),
            "direction": self.direction,
            "change_index": self.change_index,
            "change_start_ns": self.change_start_ns,
            "before_ns": _finite(self.before_ns),
            "after_ns": _finite(self.after_ns),
            "p_value": self.p_value,
            "threshold_ns": self.threshold_ns,
            "decomposition": self.decomposition.to_json(),
            "displacement": None if self.displacement is None else self.displacement.to_json(),
            "stacks": [s.to_json() for s in self.stacks],
            "summary": self.sentences(),
        }


@dataclass(frozen=True)
class Incident:
    """Jumps that started together in related cgroups: one headline, its causes, the detail."""

    jumps: list[JumpExplanation]
    """The series shown, headline first."""
    folded: list[JumpExplanation]
    """Aggregates that rose too but are explained by one cgroup of ``jumps`` (not shown)."""
    causes: list[Cause]
    """Discovered causes, most likely first."""
    tested_causes: int
    cgroups: list[str]
    dated_ns: int | None = None
    """Where the symptom rose mostly with its cause, later than its change point (a smaller,
    earlier step): the incident is dated by the cause."""

    @property
    def headline(self) -> JumpExplanation:
        return self.jumps[0]

    @property
    def start_ns(self) -> int:
        if self.dated_ns is not None:
            return self.dated_ns
        return min(j.change_start_ns for j in self.jumps)

    def sentences(self) -> list[str]:
        """Headline, most likely cause, other candidates."""
        head = self.headline
        out = [head.change_line()]
        if self.dated_ns is not None and self.causes:
            out.append(
                f"Most of the rise came at {_clock(self.dated_ns)}, when its cause began: the "
                "incident is dated there (the change point before it was a smaller step)."
            )
        if head.direction != "up":
            return out  # shown on request (--falls); a faster tail has nothing to attribute
        d = head.decomposition
        mix = [x for x in d.sources if x.volume_effect > 0 and x.volume_share.value >= MAJORITY]
        if head.aggregate and mix:  # no cgroup got slower: one sends more (or is new)
            source = mix[0]
            name = head._source_name(source.source)
            if source.volume_before == 0:
                line = f"Likely cause: a new source, {name} ({source.volume_after:,.1f} events "
                line += "per interval, none before)."
            else:
                line = (
                    f"Likely cause: a traffic mix shift: more calls from {name} "
                    f"({source.volume_before:,.1f} -> {source.volume_after:,.1f} per interval), "
                    "which was as slow before."
                )
            out.append(line)
            if self.causes:
                out.append(
                    "Also changed: " + "; ".join(c.sentence() for c in self.causes[:2]) + "."
                )
            return out
        if self.causes:
            first, *others = self.causes
            also = "; ".join(c.timed_sentence() for c in others[:2])
            if first.late_s:  # every signal that changed began after the rise
                out.append(
                    "No cause found that began with the rise; later: "
                    + "; ".join(c.timed_sentence() for c in self.causes[:3])
                    + "."
                )
                return out
            out.append(f"Likely cause: {first.sentence(head.what(), head.after_ns)}.")
            if others:
                out.append(f"Also changed: {also}.")
            return out
        if self.tested_causes:
            out.append(
                f"No cause found: none of {self.tested_causes} candidate signals (retransmits, "
                "migrations, syscall errors, run-queue displacement) of the cgroups involved "
                "rose significantly at the same time."
            )
        else:
            out.append(
                "No cause found: no other signal of these cgroups rose (retransmits, migrations, "
                "syscall errors and run-queue displacement need their probes)."
            )
        return out

    def to_json(self) -> dict[str, Any]:
        """Plain JSON-able dict."""
        return {
            "start_ns": self.start_ns,
            "headline": dict(self.headline.series),
            "cgroups": self.cgroups,
            "summary": self.sentences(),
            "causes": [c.to_json() for c in self.causes],
            "tested_causes": self.tested_causes,
            "dated_ns": self.dated_ns,
            "jumps": [dict(j.series) for j in self.jumps],
            "folded": [dict(j.series) for j in self.folded],
        }


@dataclass(frozen=True)
class Report:
    """Everything ``tailsight explain`` says about one range of a recording."""

    start_ns: int | None
    end_ns: int | None
    intervals: int
    selector: Mapping[str, str]
    tested: int
    jumps: list[JumpExplanation]
    config: ExplainConfig
    incidents: list[Incident] = field(default_factory=list)
    falls_hidden: int = 0
    """Confirmed falls left out (``ExplainConfig.falls`` off)."""

    def to_json(self) -> dict[str, Any]:
        """Plain JSON-able dict (nan and inf -> None, so strict JSON parsers accept it)."""
        cleaned: dict[str, Any] = _clean(
            {
                "start_ns": self.start_ns,
                "end_ns": self.end_ns,
                "intervals": self.intervals,
                "selector": dict(self.selector),
                "tested": self.tested,
                "fdr": self.config.fdr,
                "incidents": [i.to_json() for i in self.incidents],
                "jumps": [j.to_json() for j in self.jumps],
                "falls_hidden": self.falls_hidden,
            }
        )
        return cleaned

    def headline(self) -> str:
        """One line: range, series tested, jumps found."""
        if self.start_ns is None or self.end_ns is None:
            return "empty recording range: nothing to explain"
        start = datetime.fromtimestamp(self.start_ns / 1e9, UTC)
        span_s = (self.end_ns - self.start_ns) / 1e9
        found = len(self.jumps)
        incidents = len(self.incidents)
        line = (
            f"{self.intervals} intervals, {span_s:,.1f} s from {start:%Y-%m-%d %H:%M:%S} UTC: "
            f"{self.tested} tests, {incidents} incident{'s' * (incidents != 1)} "
            f"({found} jump{'s' * (found != 1)}, FDR {self.config.fdr:.0%})."
        )
        if self.falls_hidden:
            line += f" {self.falls_hidden} tail{'s' * (self.falls_hidden != 1)} got faster"
            line += " (not shown; --falls)."
        return line

    def render_text(self, width: int = TEXT_WIDTH) -> str:
        """The report for a terminal: every line at most ``width`` columns."""
        lines = textwrap.wrap(self.headline(), width)

        def add(sentence: str, lead: str, indent: str) -> None:
            lines.extend(
                textwrap.wrap(
                    sentence,
                    width,
                    initial_indent=lead,
                    subsequent_indent=indent,
                    break_on_hyphens=False,
                    break_long_words=True,
                )
            )

        for n, incident in enumerate(self.incidents, 1):
            lines.append("")
            for k, sentence in enumerate(incident.sentences()):
                add(sentence, f"{n}. " if k == 0 else "   ", "   ")
            for m, jump in enumerate(incident.jumps):
                said = jump.sentences(self.config.top)
                if m == 0:  # its first line is the incident's headline
                    for sentence in said[1:]:
                        add(sentence, "   ", "   ")
                    continue
                lines.append("")
                for k, sentence in enumerate(said):
                    add(sentence, "   * " if k == 0 else "     ", "     ")
            if incident.folded:
                add(
                    "Aggregates that rose with it (explained by the cgroups above): "
                    + "; ".join(j.title() for j in incident.folded)
                    + ".",
                    "   ",
                    "   ",
                )
        return "\n".join(lines) + "\n"


# -- series views --------------------------------------------------------------------------------


def views(leaves: Iterable[LabelKey], aggregates: bool = True) -> dict[LabelKey, list[LabelKey]]:
    """Every series to test, with the leaf series it sums: each leaf itself and, if
    ``aggregates``, ``{probe, cgroup}`` and ``{probe}`` (with ``instance`` where the leaves
    have one) over the leaves below them."""
    found: dict[LabelKey, list[LabelKey]] = {key: [key] for key in leaves}
    if not aggregates:
        return found
    grouped: dict[LabelKey, list[LabelKey]] = {}
    for key in leaves:
        labels = dict(key)
        if "probe" not in labels:
            continue
        # Per probe, and per host where the series come from several (--prometheus: instance).
        probe: LabelKey = tuple((k, labels[k]) for k in ("instance", "probe") if k in labels)
        grouped.setdefault(probe, []).append(key)
        if "cgroup" in labels and len(labels) > len(probe) + 1:
            grouped.setdefault(
                tuple(sorted({**dict(probe), "cgroup": labels["cgroup"]}.items())), []
            ).append(key)
    for key, children in grouped.items():
        if key not in found and len(children) > 1:
            found[key] = sorted(children)
    return found


def _sum(
    leaves: Mapping[LabelKey, npt.NDArray[np.int64]], children: Sequence[LabelKey]
) -> npt.NDArray[np.int64]:
    if len(children) == 1:
        return leaves[children[0]]  # a leaf: no copy (dense arrays are big)
    total = leaves[children[0]].copy()
    for child in children[1:]:
        total += leaves[child]
    return total


def interval_quantiles(
    counts: npt.NDArray[np.int64], qs: Sequence[float] = PLOT_QUANTILES
) -> list[list[float]]:
    """Quantiles (ns, nan where empty) of every interval row of dense counts."""
    out = []
    for row in counts:
        if row.sum():
            hist = Histogram(row[:NUM_BUCKETS].copy(), overflow=int(row[NUM_BUCKETS]))
            out.append(hist.quantiles(list(qs)))
        else:
            out.append([math.nan] * len(qs))
    return out


def view_counts(
    documents: Sequence[HistDocument], key: LabelKey, selector: Mapping[str, str] | None = None
) -> npt.NDArray[np.int64]:
    """Dense ``[intervals, NUM_BUCKETS + 1]`` counts of a series or an aggregate (labels >= key)."""
    _, leaves = dense_counts_by_series(documents, {**dict(selector or {}), **dict(key)})
    if not leaves:
        return np.zeros((len(documents), NUM_BUCKETS + 1), dtype=np.int64)
    return _sum(leaves, list(leaves))


# -- explain -------------------------------------------------------------------------------------


def explain_documents(
    documents: Sequence[HistDocument],
    selector: Mapping[str, str] | None = None,
    config: ExplainConfig | None = None,
) -> Report:
    """Detect tail jumps across the (selected) series of a recording range and attribute each."""
    return explain_source(Source.of_documents(documents), selector, config)


def explain_recording(
    recording: Recording,
    selector: Mapping[str, str] | None = None,
    config: ExplainConfig | None = None,
    since_ns: int | None = None,
    until_ns: int | None = None,
    cache_bytes: int = CACHE_BYTES,
) -> Report:
    """:func:`explain_documents` of the intervals that end after ``since_ns`` and start before
    ``until_ns``, streamed from the recording (memory: rows per interval, not histograms;
    ``cache_bytes``: see :data:`tailsight.analysis.stream.CACHE_BYTES`)."""

    def read() -> Iterator[IntervalArrays]:
        return recording.iter_intervals(since_ns, until_ns)

    return explain_source(Source(read, ordered=False), selector, config, cache_bytes)


def explain_source(
    source: Source,
    selector: Mapping[str, str] | None = None,
    config: ExplainConfig | None = None,
    cache_bytes: int = CACHE_BYTES,
) -> Report:
    """The analysis of :func:`explain_documents` in three streaming passes over ``source``
    (:mod:`tailsight.analysis.stream`): the same tests, thresholds and numbers as on dense
    arrays of every series and aggregate."""
    config = config or ExplainConfig()
    selector = dict(selector or {})
    stats = RangeStats.read(source, selector, cache_bytes)
    intervals = stats.intervals
    index = {key: n for n, key in enumerate(stats.leaves)}
    tested = views(sorted(stats.leaves), config.aggregates)
    plans: list[tuple[LabelKey, JumpConfig, list[int], TailThreshold | None]] = []
    for key, children in tested.items():
        ids = [index[child] for child in children]
        for q in config.quantiles:
            threshold = view_threshold(stats, ids, q) if intervals >= 3 else None
            plans.append((key, replace(config.jump, quantile=q), ids, threshold))
    edges: dict[int, list[int]] = {}
    for _, _, ids, threshold in plans:
        if threshold is not None:
            for leaf in ids:
                wanted = edges.setdefault(leaf, [])
                if threshold.edge_index not in wanted:
                    wanted.append(threshold.edge_index)
    tails = stats.tail_events(edges)
    located = []
    for key, jump_config, ids, threshold in plans:
        if threshold is None:
            located.append(no_change(key, jump_config.quantile))
            continue
        exceed = np.sum([tails[(leaf, threshold.edge_index)] for leaf in ids], axis=0)
        total = stats.volume[:, ids].sum(axis=1)
        located.append(locate_change(exceed, total, threshold, jump_config, key))
    found = benjamini_hochberg([r.p_value for r in located], config.fdr)
    results = [replace(r, discovered=bool(f)) for r, f in zip(located, found, strict=True)]
    # Only the discoveries need the histograms on each side of their change (pass 3).
    changes: dict[LabelKey, list[int]] = {}
    for result in results:
        if result.discovered and result.change_index is not None:
            changes.setdefault(result.series, []).append(result.change_index)
    shown_views = list(changes)
    sides = stats.sides(
        [([index[c] for c in tested[key]], changes[key]) for key in shown_views], PLOT_QUANTILES
    )
    side_of = dict(zip(shown_views, sides, strict=True))
    for n, (result, (key, jump_config, ids, _)) in enumerate(zip(results, plans, strict=True)):
        if result.series in side_of and result.discovered and result.change_index is not None:
            befores = side_of[key][0]
            before = befores[changes[key].index(result.change_index)]
            pooled = stats.pooled[ids].sum(axis=0)
            results[n] = confirm_change(result, before, pooled - before, jump_config)
    best: dict[LabelKey, tuple[OfflineResult, list[int]]] = {}
    for result, (_, _, ids, _) in zip(results, plans, strict=True):
        if not (result.discovered and result.confirmed and result.change_index is not None):
            continue
        held = best.get(result.series)
        if held is None or result.p_value < held[0].p_value:
            best[result.series] = (result, ids)
    falls = [key for key, (result, _) in best.items() if result.direction == "down"]
    if not config.falls:
        for key in falls:
            del best[key]
    jumps = [
        _explain_one(stats, tested[key], ids, tails, result, side_of[key][1], config)
        for key, (result, ids) in best.items()
    ]
    incidents = find_incidents(jumps, CounterTable.of_rows(stats.counters), intervals, config)
    shown = [j for incident in incidents for j in incident.jumps]
    return Report(
        start_ns=int(stats.starts_ns[0]) if intervals else None,
        end_ns=int(stats.ends_ns[-1]) if intervals else None,
        intervals=intervals,
        selector=selector,
        tested=len(results),
        jumps=shown,
        config=config,
        incidents=incidents,
        falls_hidden=0 if config.falls else len(falls),
    )


# -- incidents -----------------------------------------------------------------------------------


def jump_cgroups(jump: JumpExplanation) -> set[str]:
    """The cgroup of a series; of an all-cgroups aggregate, the one cgroup holding the largest
    share of its rise (one only: an aggregate must not bridge two cgroups' incidents)."""
    own = jump.labels.get("cgroup")
    if own is not None:
        return {own}
    for source in jump.decomposition.sources:  # largest effect first
        cgroup = dict(source.source).get("cgroup")
        if cgroup is not None and source.effect > 0:
            return {cgroup}
    return set()


def _explained_by(aggregate: JumpExplanation, cgroups: set[str]) -> bool:
    """One source of ``aggregate`` in one of ``cgroups`` holds the majority of its rise."""
    return any(
        s.share.value >= MAJORITY and dict(s.source).get("cgroup") in cgroups
        for s in aggregate.decomposition.sources
    )


def find_incidents(
    jumps: Sequence[JumpExplanation],
    table: CounterTable,
    intervals: int,
    config: ExplainConfig,
) -> list[Incident]:
    """Group jumps that start within ``config.incident_window`` intervals and share a cgroup
    (directly, or through a cause found in the other's cgroup, e.g. retransmits at the other end
    of a connection); one incident per group, causes tested across probes for its cgroups."""
    rises = [j for j in jumps if j.direction == "up"]
    groups = _group(rises, [jump_cgroups(j) for j in rises], config.incident_window)
    # A discovered cause in another cgroup (a TCP peer) links that cgroup's jumps in.
    reach = []
    for members in groups:
        cgroups = set().union(*(jump_cgroups(rises[m]) for m in members))
        causes, _ = _causes(rises, members, cgroups, table, intervals, config)
        reach.append(cgroups.union(*(_linked(c) for c in causes)))
    merged = _group([rises[g[0]] for g in groups], reach, config.incident_window)
    incidents = []
    for parts in merged:
        members = sorted(m for p in parts for m in groups[p])
        incidents.append(_incident(rises, members, table, intervals, config))
    falls = [j for j in jumps if j.direction != "up"]
    for fall in falls:  # reported on request only, never with causes
        incidents.append(Incident([fall], [], [], 0, sorted(jump_cgroups(fall))))
    incidents.sort(key=lambda i: (i.start_ns, i.headline.direction != "up", i.headline.series))
    return incidents


def _linked(cause: Cause) -> set[str]:
    """The cgroups a cause involves: where it shows and, for a displacement, the aggressor."""
    aggressor = cause.labels.get("aggressor") if cause.kind == "displacement" else None
    return {cause.cgroup} | ({aggressor} if aggressor and aggressor != IDLE_CGROUP_NAME else set())


def _group(
    jumps: Sequence[JumpExplanation], cgroups: Sequence[set[str]], window: int
) -> list[list[int]]:
    """Connected components of 'close in time and sharing a cgroup' (union-find)."""
    parent = list(range(len(jumps)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i in range(len(jumps)):
        for k in range(i):
            close = abs(jumps[i].change_index - jumps[k].change_index) <= window
            if close and cgroups[i] & cgroups[k]:
                parent[root(i)] = root(k)
    found: dict[int, list[int]] = {}
    for i in range(len(jumps)):
        found.setdefault(root(i), []).append(i)
    return sorted(found.values(), key=lambda g: min(jumps[i].change_index for i in g))


def _causes(
    jumps: Sequence[JumpExplanation],
    members: Sequence[int],
    cgroups: set[str],
    table: CounterTable,
    intervals: int,
    config: ExplainConfig,
) -> tuple[list[Cause], int]:
    change = min(jumps[m].change_index for m in members)
    windows = Windows.around(change, intervals, config.window_intervals)
    # Only a socket syscall time's own calls are the volume term of its decomposition; a
    # flooding neighbour whose run-queue wait rose as well still hammers.
    symptoms = {
        c
        for m in members
        if not jumps[m].aggregate and jumps[m].labels.get("probe") == NETSYSCALL
        for c in jump_cgroups(jumps[m])
    }
    candidates = find_causes(table, windows, cgroups, config.fdr, symptoms)
    return [c for c in candidates if c.discovered], len(candidates)


def _incident(
    jumps: Sequence[JumpExplanation],
    members: Sequence[int],
    table: CounterTable,
    intervals: int,
    config: ExplainConfig,
) -> Incident:
    chosen = [jumps[m] for m in members]
    cgroups = set().union(*(jump_cgroups(j) for j in chosen))
    causes, tested = _causes(jumps, members, cgroups, table, intervals, config)
    leaves = [j for j in chosen if not j.aggregate]
    leaf_cgroups = set().union(set(), *(jump_cgroups(j) for j in leaves))
    # A cgroup a leaf's cause names (the hog that displaced it) explains an aggregate too.
    explaining = leaf_cgroups.union(*(_linked(c) for c in causes if c.cgroup in leaf_cgroups))
    folded = [j for j in chosen if j.aggregate and _explained_by(j, explaining)]
    shown = [j for j in chosen if j not in folded]
    # Headline: a leaf before an aggregate; a run-queue wait mostly displaced by a newcomer (the
    # hog's victim, not the tasks that then crowded onto the other CPUs, which may have moved
    # more); then the series that moved most.
    shown.sort(
        key=lambda j: (
            j.aggregate,
            not _displaced_by_newcomer(j),
            -abs(math.log(_safe_ratio(j))),
            j.p_value,
            j.series,
        )
    )
    # The headline's own causes first: a cause of another cgroup of the incident (the run-queue
    # of / displaced by the same hog) is context, not the answer to "why did this rise?".
    # A run-queue wait is time spent waiting for CPUs: the failing calls of a cgroup whose wait
    # rose in this incident (EAGAIN from a queue it could not drain in time) are a consequence,
    # however new, whichever series heads the incident; they rank after the rest (a neighbour's
    # calls can still be the root cause).
    mine = jump_cgroups(shown[0])
    waiting = shown[0].labels.get("probe") == "runqueue"
    # An all-cgroups wait counts its largest source as starved: e.g. a victim whose own wait
    # had too few events before the change to be tested; its sends failing with EAGAIN would
    # otherwise rank before the displacement that starved it.
    starved = set().union(
        set(), *(jump_cgroups(j) for j in chosen if j.labels.get("probe") == "runqueue")
    )
    # Retransmits with a known other end: those towards the headline's cgroup (the data it
    # waits for) before those it sent itself (requests whose acknowledgement was lost with them).
    # A cgroup moved between CPUs at a forced rate waits on the CPUs it is moved to: its
    # displacement there is the consequence, the moves the cause (however large the wait).
    # Retransmits towards the headline's cgroup over its own connection are direct evidence for
    # a call's or a connection's time: before circumstantial candidates (a neighbour's call
    # burst) of whatever effect size. Not for a run-queue wait: there they are a consequence
    # (a starved receiver acknowledges late; e.g. 88 in the demo, beside the hog behind both).
    # A run-queue wait mostly displaced by a cgroup that is not busy answering calls (a plain
    # CPU hog) is explained by it: a neighbour's call burst at the same time is then a side
    # effect (e.g. the demo's exchange polls 10x more while the hog slows trading), and so are
    # retransmits towards it (the starved receiver acknowledges late: 31 -> 159 of them beside a
    # 147 -> 384 ms displacement, however much more they rose). When the displacer's own calls
    # rose too, the calls may be the root cause.
    forced = {c.cgroup for c in causes if c.forced_migrations}
    top = _top_aggressor(causes, mine) if waiting else None
    busy = {c.cgroup for c in causes if c.kind == COUNTER_CAUSES[CALLS]}
    hogged = top is not None and top not in busy | {IDLE_CGROUP_NAME}
    # Steal time answers a wait mostly "displaced by idle" (the kernel saw the vCPU idle while
    # the hypervisor ran another guest: 26-40 % of CPU 0 in quiet runs here); otherwise it is
    # background, after the rest.
    stolen = top == IDLE_CGROUP_NAME
    # A cgroup parked by its own CPU limit (or a parent's) waited for that, whoever ran
    # meanwhile: the limit comes first (find_causes names neighbours only from the intervals in
    # which it was not throttled).
    causes, dated_ns = _timed(causes, chosen, shown[0], intervals, config)
    parked = {
        id(c)
        for c in causes
        if c.kind == "throttling" and any(is_within(m, c.cgroup) for m in mine)
    }
    # Pages read back after reclaim count as io stalls too: where memory stalled as well, the
    # io stall is its consequence.
    reclaiming = {c.cgroup for c in causes if c.kind == PRESSURE_CAUSES["memory"]}
    # The kernel's own threads (kswapd, the writeback and I/O workers: cgroup /) run when a
    # cgroup stalls on memory or io: their displacement of a stalled cgroup is the stall's
    # consequence, not a neighbour's doing.
    stalled = {c.cgroup for c in causes if c.kind in PRESSURE_CAUSES.values()}
    causes.sort(
        key=lambda c: (
            bool(c.late_s),
            id(c) not in parked,
            c.kind == PRESSURE_CAUSES["io"] and c.cgroup in reclaiming,
            c.kind == "displacement" and c.labels.get("aggressor") == "/" and c.cgroup in stalled,
            c.kind == COUNTER_CAUSES[ERRORS] and c.cgroup in starved,
            (c.kind == "steal") != stolen,
            not (not waiting and c.kind in LINKED and c.labels.get(OTHER_END) in mine),
            c.kind == "displacement" and c.cgroup in forced,
            hogged and c.kind in LINKED,
            not (c.cgroup in mine or c.cgroup not in cgroups or c.kind in LINKED),
            c.labels.get(OTHER_END, next(iter(mine), "")) not in mine,
        )
    )
    return Incident(shown, folded, causes, tested, sorted(cgroups), dated_ns)


def _timed(
    causes: list[Cause],
    chosen: Sequence[JumpExplanation],
    head: JumpExplanation,
    intervals: int,
    config: ExplainConfig,
) -> tuple[list[Cause], int | None]:
    """The causes, each that began more than LATE_INTERVALS after the symptom marked late
    (``late_s``): a cause cannot start after its symptom. Where none began in time but the
    headline rose mostly when the first late one began (its change point found a smaller,
    earlier step), the incident is dated by that cause (returned, else None), and the causes are
    timed against that date."""
    change = min(j.change_index for j in chosen)
    windows = Windows.around(change, intervals, config.window_intervals)
    starts = head.starts_ns
    onsets: list[int | None] = []  # where each began, if after the change (None: in time)
    for cause in causes:
        row = np.asarray(cause.values, dtype=np.float64)
        onset = step_onset(row, windows) if len(row) == intervals else change
        onsets.append(onset if _quiet_until(row, windows, onset) else None)
    late = [onset for onset in onsets if onset is not None]
    dated_ns = None
    if late and len(late) == len(causes):
        column = PLOT_QUANTILES.index(head.quantile) if head.quantile in PLOT_QUANTILES else 1
        level = np.array([row[column] for row in head.interval_quantiles_ns], dtype=np.float64)
        first = min(late)
        if len(level) == intervals and _rose_mostly_at(level, windows, first):
            dated_ns, change = starts[first], first
    return [
        cause
        if onset is None or onset - change <= LATE_INTERVALS
        else replace(cause, late_s=(starts[onset] - starts[change]) / 1e9)
        for cause, onset in zip(causes, onsets, strict=True)
    ], dated_ns


def step_onset(row: npt.NDArray[np.float64], windows: Windows) -> int:
    """Where a per-interval signal within ``windows`` steps up most clearly: the split that
    maximises the standardised difference of the means after and before it (CUSUM)."""
    x = row[windows.before_start : windows.after_stop]
    n = len(x)
    if n < 2:
        return windows.change
    k = np.arange(1, n)
    total = np.cumsum(x)
    left = total[:-1] / k
    right = (total[-1] - total[:-1]) / (n - k)
    score = (right - left) * np.sqrt(k * (n - k) / n)
    return windows.before_start + 1 + int(np.argmax(score))


def _quiet_until(row: npt.NDArray[np.float64], windows: Windows, onset: int) -> bool:
    """Whether a signal stayed at its level before the change until ``onset``, more than
    LATE_INTERVALS after it: at most a quarter of its rise between, over a stretch where its rate
    after would have shown at least 3 (a run of quiet intervals by chance: under 5 %)."""
    between = row[windows.change : onset]
    if len(between) <= LATE_INTERVALS:
        return False
    before = float(row[windows.before].mean())
    after = float(row[onset : windows.after_stop].mean())
    enough = (after - before) * len(between) >= 3.0
    return bool(enough and float(between.mean()) <= before + 0.25 * (after - before))


def _rose_mostly_at(level: npt.NDArray[np.float64], windows: Windows, onset: int) -> bool:
    """Whether the symptom's quantile rose mostly at ``onset`` rather than at the change."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-nan slices: no events
        before = np.nanmedian(level[windows.before])
        between = np.nanmedian(level[windows.change : onset])
        after = np.nanmedian(level[onset : windows.after_stop])
    if not (np.isfinite(before) and np.isfinite(between) and np.isfinite(after)):
        return False
    return bool(after > before and between - before < 0.5 * (after - before))


def _top_aggressor(causes: Sequence[Cause], mine: set[str]) -> str | None:
    """Who holds the largest rise of displaced wait of ``mine`` (idle for a wait on idle CPUs;
    None: no displacement rose)."""
    displaced = [c for c in causes if c.kind in ("displacement", IDLE_CPU) and c.cgroup in mine]
    if not displaced:
        return None
    top = max(displaced, key=lambda c: c.after - c.before)
    return IDLE_CGROUP_NAME if top.kind == IDLE_CPU else top.labels.get("aggressor")


def _displaced_by_newcomer(jump: JumpExplanation) -> bool:
    """Most of this run-queue wait's rise was displaced by an aggressor that arrived with the
    change: new, or displacing it NEWCOMER_GROWTH times more than before (the change is dated at
    an interval's start, so a hog that started inside the interval before shows a little)."""
    return jump.displacement is not None and any(
        a.share.value >= MAJORITY and a.wait_after_ns >= NEWCOMER_GROWTH * a.wait_before_ns
        for a in jump.displacement.aggressors
    )


def _explain_one(
    stats: RangeStats,
    children: list[LabelKey],
    ids: list[int],
    tails: Mapping[tuple[int, int], npt.NDArray[np.float64]],
    result: OfflineResult,
    plot: list[list[float]],
    config: ExplainConfig,
) -> JumpExplanation:
    assert result.change_index is not None
    intervals = stats.intervals
    windows = Windows.around(result.change_index, intervals, config.window_intervals)
    edge = bucket_index(int(result.threshold_ns))
    decomposition = decompose_rows(
        children,
        np.stack([tails[(leaf, edge)] for leaf in ids], axis=1),
        stats.volume[:, ids],
        windows,
        result.threshold_ns,
        config.n_boot,
        config.seed,
        config.level,
    )
    labels = dict(result.series)
    probe = labels.get("probe")
    focus = labels.get("cgroup")
    if focus is None:
        top = next((s for s in decomposition.sources if s.effect > 0), None)
        focus = None if top is None else dict(top.source).get("cgroup")
    displacement = None
    # Who ran while a CPU limit parked the victim displaced nothing: not named where the limit
    # parked it in most intervals after the change (the incident names the limit).
    parked = None if focus is None else throttled_intervals(stats.counters, [focus]).get(focus)
    if (
        probe == "runqueue"
        and focus is not None
        and not (parked is not None and parked[windows.after].mean() > 0.5)
    ):
        displacement = displaced_by_rows(
            stats.counters, intervals, focus, windows, config.n_boot, config.seed, config.level
        )
    stacks = stack_shifts_rows(
        stats.counters,
        intervals,
        windows,
        probe,
        None if focus is None else [focus],
        config.fdr,
        config.n_boot,
        config.seed,
        config.level,
    )
    return JumpExplanation(
        series=result.series,
        aggregate=children != [result.series],
        quantile=result.quantile,
        direction=result.direction or "up",
        change_index=result.change_index,
        change_start_ns=int(stats.starts_ns[result.change_index]),
        before_ns=result.before_ns,
        after_ns=result.after_ns,
        p_value=result.p_value,
        threshold_ns=result.threshold_ns,
        decomposition=decomposition,
        displacement=displacement,
        stacks=stacks,
        starts_ns=[int(s) for s in stats.starts_ns],
        interval_quantiles_ns=plot,
    )


# -- words ---------------------------------------------------------------------------------------


def _duration(value_ns: float) -> str:
    """``4.2 µs``, ``165 µs``, ``1.2 ms``, ``324 ms``, ``2.5 s``."""
    if not math.isfinite(value_ns):
        return "-"
    for scale, unit in ((1e9, "s"), (1e6, "ms"), (1e3, "µs")):
        if abs(value_ns) >= scale or unit == "µs":
            value = value_ns / scale
            return f"{value:,.0f} {unit}" if abs(value) >= 10 else f"{value:.1f} {unit}"
    raise AssertionError("unreachable")


def _displacement_line(shown: Displacement, top: int) -> str:
    """Who added the victim's extra displaced wait: shares of the rise, the remainder, the falls."""
    rising = [a for a in shown.aggressors if a.excess_ns > 0]
    gross = sum(a.excess_ns for a in rising)
    line = (
        f"Run-queue wait of {shown.victim} displaced by other tasks: "
        f"{_duration(shown.wait_before_ns)} -> {_duration(shown.wait_after_ns)} per interval; "
        "of the rise,"
    )
    parts: list[str] = []
    total = 0.0
    for rank, a in enumerate(rising[:top]):
        if rank and a.share.value < 0.05:
            break
        # The probe charges a wait to the task that ran just before the victim; under background
        # load a brief third task often runs last, so the newcomer that caused the wait can rank
        # second: say that it is new.
        who = (
            "passed with the CPU idle (the idle task is no aggressor: a CPU limit, steal or a "
            "wake-up from idle)"
            if a.aggressor == IDLE_CGROUP_NAME
            else f"was displaced by {_aggressor(a.aggressor, shown.victim)}"
        )
        parts.append(
            f"{_pct(a.share)} {who}"
            f"{' (new)' if a.new else ''} ({_duration(a.wait_before_ns)} -> "
            f"{_duration(a.wait_after_ns)})"
        )
        total += a.share.value
    rest = len(rising) - len(parts)
    if rest and _percent(1.0 - total) != "0%":
        parts.append(f"{_percent(1.0 - total)} by {rest} other{'s' * (rest != 1)}")
    line += " " + "; ".join(parts)
    fell = [a for a in shown.aggressors if a.excess_ns < -0.05 * gross]
    if fell:
        line += "; less time went to " + ", ".join(
            f"{_aggressor(a.aggressor, shown.victim)} ({_duration(a.excess_ns)})"
            for a in fell[:top]
        )
    return line + "."


def _pct(estimate: Estimate) -> str:
    if math.isnan(estimate.value):
        return "-"
    if math.isnan(estimate.low):
        return _percent(estimate.value)
    return f"{_percent(estimate.value)} [{_percent(estimate.low)}, {_percent(estimate.high)}]"


def _percent(value: float) -> str:
    text = f"{value:.0%}"
    return "0%" if text == "-0%" else text


def _clock(time_ns: int) -> str:
    return f"{datetime.fromtimestamp(time_ns / 1e9, UTC):%H:%M:%S}"


def _aggressor(name: str, victim: str = "") -> str:
    if name == IDLE_CGROUP_NAME:
        return "an idle CPU (nobody)"
    return f"{name} (its own cgroup)" if name == victim else name


def _safe_ratio(jump: JumpExplanation) -> float:
    if jump.before_ns > 0 and jump.after_ns > 0:
        return jump.after_ns / jump.before_ns
    return 1.0


def _clean(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def _finite(value: float) -> float | None:
    return None if math.isnan(value) else value
