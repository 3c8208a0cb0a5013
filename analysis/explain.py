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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
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
    decompose_tail,
    displaced_by,
    stack_shifts,
)
from tailsight.analysis.jumps import JumpConfig, OfflineResult, detect_many
from tailsight.analysis.quantiles import LabelKey, describe, quantile_name, series_arrays
from tailsight.hist import NUM_BUCKETS, Histogram, bucket_index
from tailsight.histfile import HistDocument
from tailsight.probes.base import IDLE_CGROUP_NAME
from tailsight.probes.outliers import short_stack

TEXT_WIDTH: Final = 80
PLOT_QUANTILES: Final = (0.5, 0.99, 0.999)
PROBE_WORDS: Final = {
    "runqueue": "run-queue wait",
    "netsyscall": "socket syscall time",
    "tcpstate": "TCP state time",
    "migration": "migration delay",
}


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
        what = PROBE_WORDS.get(labels.get("probe", ""), labels.get("probe", "latency"))
        rest = [v for k, v in sorted(labels.items()) if k not in ("probe", "cgroup")]
        whom = labels.get("cgroup", "all cgroups")
        return f"{what} of {whom}" + (f" ({' '.join(rest)})" if rest else "")

    def sentences(self, top: int = 3) -> list[str]:
        """The jump and its causes in plain words, most important first."""
        name = quantile_name(self.quantile).upper()
        verb = "rose" if self.direction == "up" else "fell"
        out = [
            f"{self.title()} {verb} {_us(self.before_ns)} -> {_us(self.after_ns)} µs ({name}) "
            f"at {_clock(self.change_start_ns)} (p={self.p_value:.1g})."
        ]
        d = self.decomposition
        if d.excess > 0:
            out.append(
                f"Events above {_us(d.threshold_ns)} µs: {d.tail_before:.1f} -> "
                f"{d.tail_after:.1f} per interval; of the excess {_pct(d.rate_share)} is "
                f"sources getting slower (rate), {_pct(d.volume_share)} more traffic (volume)."
            )
            parts = []
            for rank, source in enumerate(d.sources[:top]):
                if not source.effect > 0 or (rank and not source.share.low > 0):
                    break
                kind = "slower" if source.rate_effect >= source.volume_effect else "more traffic"
                parts.append(f"{self._source_name(source.source)} {_pct(source.share)} ({kind})")
            if parts and len(d.sources) > 1:
                out.append("By source: " + "; ".join(parts) + ".")
        shown = self.displacement
        if shown is not None and shown.excess_ns > 0:
            aggressors = [a for a in shown.aggressors if a.excess_ns > 0][:top]
            if aggressors:
                first, *others = aggressors
                others = [a for a in others if a.share.value >= 0.05]
                line = (
                    f"{_pct(first.share)} of the excess run-queue wait of {shown.victim} is time "
                    f"displaced by {_aggressor(first.aggressor)}"
                    f"{', new since the change,' if first.new else ''} "
                    f"({_us(first.wait_before_ns)} -> {_us(first.wait_after_ns)} µs of wait per "
                    f"interval)"
                )
                if others:
                    # The probe charges a wait to the task that ran just before the victim; under
                    # background load a brief third task often runs last, so the newcomer that
                    # caused the wait can rank second: say that it is new.
                    line += "; then " + ", ".join(
                        f"{_aggressor(a.aggressor)} {_pct(a.share)}" + (" (new)" if a.new else "")
                        for a in others
                    )
                out.append(line + ".")
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
class Report:
    """Everything ``tailsight explain`` says about one range of a recording."""

    start_ns: int | None
    end_ns: int | None
    intervals: int
    selector: Mapping[str, str]
    tested: int
    jumps: list[JumpExplanation]
    config: ExplainConfig

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
                "jumps": [j.to_json() for j in self.jumps],
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
        return (
            f"{self.intervals} intervals, {span_s:,.1f} s from {start:%Y-%m-%d %H:%M:%S} UTC: "
            f"{self.tested} tests, {found} jump{'s' * (found != 1)} (FDR {self.config.fdr:.0%})."
        )

    def render_text(self, width: int = TEXT_WIDTH) -> str:
        """The report for a terminal: every line at most ``width`` columns."""
        lines = textwrap.wrap(self.headline(), width)
        for n, jump in enumerate(self.jumps, 1):
            lines.append("")
            for k, sentence in enumerate(jump.sentences(self.config.top)):
                lead = f"{n}. " if k == 0 else "   "
                lines.extend(
                    textwrap.wrap(
                        sentence,
                        width,
                        initial_indent=lead,
                        subsequent_indent="   ",
                        break_on_hyphens=False,
                        break_long_words=True,
                    )
                )
        return "\n".join(lines) + "\n"


# -- series views --------------------------------------------------------------------------------


def views(
    leaves: Mapping[LabelKey, npt.NDArray[np.int64]], aggregates: bool = True
) -> dict[LabelKey, list[LabelKey]]:
    """Every series to test, with the leaf series it sums: each leaf itself and, if
    ``aggregates``, ``{probe, cgroup}`` and ``{probe}`` over the leaves below them."""
    found: dict[LabelKey, list[LabelKey]] = {key: [key] for key in leaves}
    if not aggregates:
        return found
    grouped: dict[LabelKey, list[LabelKey]] = {}
    for key in leaves:
        labels = dict(key)
        if "probe" not in labels:
            continue
        probe = (("probe", labels["probe"]),)
        grouped.setdefault(probe, []).append(key)
        if "cgroup" in labels and len(labels) > 2:
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
    _, leaves = series_arrays(documents, {**dict(selector or {}), **dict(key)})
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
    config = config or ExplainConfig()
    selector = dict(selector or {})
    starts, leaves = series_arrays(documents, selector)
    tested = views(leaves, config.aggregates)
    arrays = {key: _sum(leaves, children) for key, children in tested.items()}
    results = detect_many(arrays, config.quantiles, config.jump, config.fdr)
    best: dict[LabelKey, OfflineResult] = {}
    for result in results:
        if not (result.discovered and result.confirmed and result.change_index is not None):
            continue
        held = best.get(result.series)
        if held is None or result.p_value < held.p_value:
            best[result.series] = result
    jumps = [
        _explain_one(documents, starts, leaves, tested[key], arrays[key], result, config)
        for key, result in best.items()
    ]
    # Series before aggregates: "/trading rose" is the headline, "all cgroups rose" the context.
    jumps.sort(key=lambda j: (j.aggregate, j.p_value, -abs(math.log(_safe_ratio(j))), j.series))
    return Report(
        start_ns=documents[0].start_ns if documents else None,
        end_ns=documents[-1].end_ns if documents else None,
        intervals=len(documents),
        selector=selector,
        tested=len(results),
        jumps=jumps,
        config=config,
    )


def _explain_one(
    documents: Sequence[HistDocument],
    starts: npt.NDArray[np.int64],
    leaves: Mapping[LabelKey, npt.NDArray[np.int64]],
    children: list[LabelKey],
    counts: npt.NDArray[np.int64],
    result: OfflineResult,
    config: ExplainConfig,
) -> JumpExplanation:
    assert result.change_index is not None
    windows = Windows.around(result.change_index, len(documents), config.window_intervals)
    decomposition = decompose_tail(
        {child: leaves[child] for child in children},
        bucket_index(int(result.threshold_ns)),
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
    if probe == "runqueue" and focus is not None:
        displacement = displaced_by(
            documents, focus, windows, config.n_boot, config.seed, config.level
        )
    stacks = stack_shifts(
        documents,
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
        change_start_ns=int(starts[result.change_index]),
        before_ns=result.before_ns,
        after_ns=result.after_ns,
        p_value=result.p_value,
        threshold_ns=result.threshold_ns,
        decomposition=decomposition,
        displacement=displacement,
        stacks=stacks,
        starts_ns=[int(s) for s in starts],
        interval_quantiles_ns=interval_quantiles(counts),
    )


# -- words ---------------------------------------------------------------------------------------


def _us(value_ns: float) -> str:
    if not math.isfinite(value_ns):
        return "-"
    value_us = value_ns / 1e3
    return f"{value_us:,.0f}" if value_us >= 10 else f"{value_us:.1f}"


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


def _aggressor(name: str) -> str:
    return "an idle CPU (nobody)" if name == IDLE_CGROUP_NAME else name


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
