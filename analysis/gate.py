"""Regression gate: per-run quantiles, rank tests against the minimum effect, Holm over the family.

Pooled per-event tests false-alarm at a very high rate on real run-to-run noise (every run has its
own machine state), so the unit of analysis is one quantile per run. For each (series, quantile):

* ``x`` = baseline per-run quantiles, ``y`` = candidate per-run quantiles (runs where the series is
  absent or empty are left out), compared on a log scale;
* threshold ``t = 1 + max(min_effect, min_effect_ns / median(x))``: the smallest ratio that counts
  as a regression. The absolute floor (default 5 µs = one bucket) keeps bucket-resolution
  movements of small quantiles from failing a build;
* ``p_worse``: one-sided Mann-Whitney U p-value of ``log y - log t`` against ``log x`` for
  "candidate larger", i.e. a test of H0 "ratio <= t" (not worse than the minimum effect);
* ``p_within``: the same shifted test the other way, H0 "ratio >= t": small when the candidate is
  *shown* to be within the bound (a non-inferiority test, the one-sided half of TOST);
* ``ratio`` = Hodges-Lehmann ratio ``exp(median_ij(log y_j - log x_i))`` with the Moses interval
  ``[lo, hi]`` of level ``1 - 2*alpha`` obtained by inverting the same test, so ``lo > t`` exactly
  when ``p_worse < alpha`` and ``hi < t`` exactly when ``p_within < alpha``.

Decision:

1. fewer than ``min_runs`` usable runs on either side, or too few for the exact rank test to reach
   the level it needs -> **inconclusive** (the reason says how many runs are needed);
2. Holm-adjusted ``p_worse < alpha`` -> **regression**: Holm-Bonferroni over every comparison the
   gate makes bounds the chance of any false regression by ``alpha`` (family-wise);
3. ``p_within < alpha`` -> **pass**: shown to be less than ``t`` worse; the gate passes only if
   every comparison passes, an intersection-union test that needs no correction to stay at
   ``alpha``;
4. otherwise -> **inconclusive** (the interval straddles ``t``): the reason says how many runs
   per side would let an unchanged build pass 8 times in 10 at the measured run-to-run spread
   (``runs_to_pass``, :func:`runs_to_pass`), or that the noise must come down.

By default only the in-system tick-to-trade series (``DEFAULT_SERIES``) is gated, at P50 and P99.

Defaults: quantiles 0.5, 0.99; alpha 0.05; min_effect 5 %; min_effect_ns 5 000; min_runs 5.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from statistics import NormalDist
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from tailsight.analysis.quantiles import (
    RunInputError,
    describe,
    load_runs,
    matches,
    quantile_name,
    run_quantiles,
    select_series,
    tail_events,
)
from tailsight.intervals import HistDocument, LabelKey, label_key
from tailsight.stages import IN_SYSTEM
from tailsight.stages import PROBE as STAGES_PROBE

JSON_FORMAT: Final = "tailsight.gate/2"
DEFAULT_STAGE: Final = IN_SYSTEM
"""The stage gated when no ``--series`` is given: the replay's in-system tick-to-trade."""
DEFAULT_SERIES: Final = {"probe": STAGES_PROBE, "stage": DEFAULT_STAGE}
STAGE_LABEL: Final = "stage"
PASS_POWER: Final = 0.8
"""``runs_to_pass`` sizes the runs for an unchanged build to pass this often (8 in 10)."""
LOW_TAIL_EVENTS: Final = 10.0
"""Below this many expected events above q in a run, its q-quantile is little more than its max."""


class Outcome(StrEnum):
    """Verdict of one comparison or of the whole gate."""

    PASS = "pass"
    REGRESSION = "regression"
    INCONCLUSIVE = "inconclusive"


EXIT_CODES: Final = {Outcome.PASS: 0, Outcome.REGRESSION: 1, Outcome.INCONCLUSIVE: 3}
"""Process exit status per outcome; 2 is left for usage and input errors."""


class GateInputError(RunInputError):
    """The runs cannot be gated as asked (nothing matches the selector, no runs, ...)."""


@dataclass(frozen=True)
class GateConfig:
    """Parameters of the decision rule (see the module docstring)."""

    quantiles: tuple[float, ...] = (0.5, 0.99)
    alpha: float = 0.05
    min_effect: float = 0.05
    min_effect_ns: float = 5_000.0
    min_runs: int = 5

    def __post_init__(self) -> None:
        if not self.quantiles or not all(0.0 < q < 1.0 for q in self.quantiles):
            raise ValueError(f"quantiles must lie in (0, 1): {self.quantiles}")
        if not 0.0 < self.alpha < 0.5:  # also rejects nan
            raise ValueError(f"alpha {self.alpha} outside (0, 0.5)")
        # nan would make every comparison inconclusive, inf would pass any slowdown.
        if not 0.0 <= self.min_effect <= 10.0:
            raise ValueError(f"min effect {self.min_effect} outside [0, 10] (0.05 = 5 %)")
        if not 0.0 <= self.min_effect_ns <= 1e12:
            raise ValueError(f"absolute min effect {self.min_effect_ns} ns outside [0, 1000 s]")
        if self.min_runs < 2:
            raise ValueError("min_runs must be at least 2")


@dataclass(frozen=True)
class Comparison:
    """One (series, quantile) verdict with its evidence; quantiles in ns, ratio = cand / base."""

    series: LabelKey
    quantile: float
    outcome: Outcome
    reason: str
    baseline_runs: int
    candidate_runs: int
    baseline_ns: float = math.nan
    candidate_ns: float = math.nan
    ratio: float = math.nan
    ratio_low: float = math.nan
    ratio_high: float = math.nan
    threshold: float = math.nan
    p_worse: float = math.nan
    p_worse_adjusted: float = math.nan
    p_within: float = math.nan
    min_tail_events: float = math.nan
    runs_to_pass: float = math.nan
    """Runs per side for an unchanged build to pass ``PASS_POWER`` of the time at this spread."""

    def to_json(self) -> dict[str, Any]:
        """Plain JSON-able dict (nan and inf -> None)."""
        out: dict[str, Any] = {
            "series": dict(self.series),
            "quantile": self.quantile,
            "name": quantile_name(self.quantile),
            "outcome": self.outcome.value,
            "reason": self.reason,
        }
        for name in _NUMBERS:
            value = getattr(self, name)
            out[name] = None if isinstance(value, float) and not math.isfinite(value) else value
        return out


_NUMBERS: Final = (
    "baseline_runs",
    "candidate_runs",
    "baseline_ns",
    "candidate_ns",
    "ratio",
    "ratio_low",
    "ratio_high",
    "threshold",
    "p_worse",
    "p_worse_adjusted",
    "p_within",
    "min_tail_events",
    "runs_to_pass",
)


@dataclass(frozen=True)
class StageDelta:
    """One stage of a regressed series: median per-run quantile of each side and their ratio."""

    stage: str
    baseline_ns: float
    candidate_ns: float
    ratio: float

    def to_json(self) -> dict[str, Any]:
        """Plain JSON-able dict (nan -> None)."""
        return {
            k: None if isinstance(v, float) and math.isnan(v) else v
            for k, v in asdict(self).items()
        }


@dataclass(frozen=True)
class Breakdown:
    """Where a regression sits: every other stage of the regressed series at the same quantile."""

    series: LabelKey
    quantile: float
    stages: list[StageDelta]

    def to_json(self) -> dict[str, Any]:
        """Plain JSON-able dict."""
        return {
            "series": dict(self.series),
            "quantile": self.quantile,
            "name": quantile_name(self.quantile),
            "stages": [s.to_json() for s in self.stages],
        }


@dataclass(frozen=True)
class GateResult:
    """All comparisons, the overall outcome and what went in."""

    outcome: Outcome
    comparisons: list[Comparison]
    config: GateConfig
    selectors: list[dict[str, str]] = field(default_factory=list)
    breakdowns: list[Breakdown] = field(default_factory=list)
    baseline_files: list[str] = field(default_factory=list)
    candidate_files: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        """0 pass, 1 regression, 3 inconclusive."""
        return EXIT_CODES[self.outcome]

    @property
    def family_size(self) -> int:
        """Comparisons in the Holm-Bonferroni family (those that could be tested)."""
        return sum(not math.isnan(c.p_worse) for c in self.comparisons)

    def to_json(self) -> dict[str, Any]:
        """The ``tailsight.gate/2`` JSON report."""
        config = asdict(self.config)
        config["quantiles"] = list(self.config.quantiles)
        return {
            "format": JSON_FORMAT,
            "outcome": self.outcome.value,
            "exit_code": self.exit_code,
            "config": config,
            "selectors": self.selectors,
            "multiple_comparisons": {"method": "holm", "family_size": self.family_size},
            "baseline": {"runs": len(self.baseline_files), "files": self.baseline_files},
            "candidate": {"runs": len(self.candidate_files), "files": self.candidate_files},
            "comparisons": [c.to_json() for c in self.comparisons],
            "breakdowns": [b.to_json() for b in self.breakdowns],
            "notes": self.notes,
        }


def min_runs_for_alpha(alpha: float) -> int:
    """Smallest equal per-side run count whose exact one-sided U test can reach ``p < alpha``."""
    n = 1
    while 1.0 / math.comb(2 * n, n) >= alpha:
        n += 1
    return n


def runs_to_pass(
    log_half_width: float, n: int, m: int, log_threshold: float, alpha: float
) -> float:
    """Runs per side with which an unchanged build (true ratio 1) passes ``PASS_POWER`` of the time.

    The Moses interval's half-width ``h`` shrinks like ``sqrt(1/n + 1/m)``, so its standard error
    is ``se = h / z`` (``z`` the one-sided ``1 - alpha`` normal quantile). A pass needs the upper
    bound below ``t``: ``z se_k < log t - Z`` with the estimate ``Z ~ N(0, se_k)``, which holds with
    probability ``PASS_POWER`` when ``(z + z_power) se_k = log t``, i.e.
    ``k = 2 / (1/n + 1/m) * ((z + z_power) h / (z log t))^2`` runs per side.
    """
    if log_threshold <= 0.0:  # a limit of ratio 1: an unchanged build never shows to be below it
        return math.inf
    normal = NormalDist()
    z = normal.inv_cdf(1.0 - alpha)
    z_power = normal.inv_cdf(PASS_POWER)
    scale = (z + z_power) * log_half_width / (z * log_threshold)
    return 2.0 / (1.0 / n + 1.0 / m) * scale * scale


def hodges_lehmann_ratio(
    log_baseline: npt.NDArray[np.float64], log_candidate: npt.NDArray[np.float64]
) -> float:
    """``exp(median of all pairwise log differences)``: the estimator that goes with the rank test.

    It ignores a noisy run or two like a median, but uses all ``n*m`` pairs, so it is markedly more
    efficient than a ratio of medians.
    """
    return math.exp(float(np.median(np.subtract.outer(log_candidate, log_baseline))))


@functools.lru_cache(maxsize=64)
def _u_null_sf(n: int, m: int) -> npt.NDArray[np.float64]:
    """``P(U >= u)`` for ``u = 0..n*m`` under H0 (no ties), exact.

    The counts are the coefficients of the Gaussian binomial ``[n+m choose n]_q``, built with
    ``[N, k] = [N-1, k-1] + q^k [N-1, k]``; float64 holds them exactly enough (<= C(n+m, n)).
    """
    size = n * m + 1
    rows = [np.zeros(size) for _ in range(n + 1)]  # rows[k] = [N choose k]_q for the current N
    rows[0][0] = 1.0
    for big_n in range(1, n + m + 1):
        for k in range(min(big_n, n), 0, -1):
            shifted = np.zeros(size)
            shifted[k:] = rows[k][: size - k]
            rows[k] = rows[k - 1] + shifted
    counts = rows[n]
    return np.asarray(np.cumsum(counts[::-1])[::-1] / counts.sum())


def u_test_p_values(
    log_x: npt.NDArray[np.float64], log_y: npt.NDArray[np.float64], shifts: npt.ArrayLike
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Exact one-sided Mann-Whitney p-values of ``log y - shift`` against ``log x``, per shift.

    Returns (p for "candidate larger", p for "candidate smaller"). Ties count one half; the
    exact tie-free null is then slightly conservative.
    """
    n, m = log_x.size, log_y.size
    diffs = np.sort(np.subtract.outer(log_y, log_x), axis=None)
    d = np.asarray(shifts, dtype=np.float64)
    above = diffs.size - np.searchsorted(diffs, d, side="right")
    below = np.searchsorted(diffs, d, side="left")
    ties = diffs.size - above - below
    sf = _u_null_sf(n, m)
    # U_larger = above + ties/2; P(U >= u) with u rounded up (conservative with ties).
    larger = sf[np.minimum(np.ceil(above + ties / 2).astype(np.int64), n * m)]
    smaller = sf[np.minimum(np.ceil(below + ties / 2).astype(np.int64), n * m)]
    return larger, smaller


def moses_interval(
    log_x: npt.NDArray[np.float64], log_y: npt.NDArray[np.float64], alpha: float
) -> tuple[float, float]:
    """Ratio interval of level ``1 - 2*alpha``: the shifts neither one-sided test rejects (Moses).

    The p-values only change at pairwise differences, so those are the candidate bounds.
    """
    diffs = np.unique(np.subtract.outer(log_y, log_x))
    larger, smaller = u_test_p_values(log_x, log_y, diffs)
    kept = diffs[(larger >= alpha) & (smaller >= alpha)]
    if not kept.size:  # cannot happen for alpha < 0.5; keep the point estimate's neighbourhood
        kept = diffs[[diffs.size // 2]]
    return math.exp(float(kept[0])), math.exp(float(kept[-1]))


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values (nan entries are not in the family and stay nan)."""
    tested = [(p, n) for n, p in enumerate(p_values) if not math.isnan(p)]
    adjusted = [math.nan] * len(p_values)
    running = 0.0
    for rank, (p, n) in enumerate(sorted(tested)):
        running = max(running, min(1.0, (len(tested) - rank) * p))
        adjusted[n] = running
    return adjusted


def compare(
    baseline_ns: npt.ArrayLike,
    candidate_ns: npt.ArrayLike,
    quantile: float,
    config: GateConfig,
    series: LabelKey = (),
    family_size: int = 1,
) -> Comparison:
    """Evidence for one quantile from per-run values (nan entries = runs without data).

    The outcome assumes a family of ``family_size`` comparisons (Holm's first step, i.e.
    Bonferroni); :func:`gate_documents` settles the final outcomes with the whole family.
    """
    x = np.asarray(baseline_ns, dtype=np.float64)
    y = np.asarray(candidate_ns, dtype=np.float64)
    x, y = x[~np.isnan(x)], y[~np.isnan(y)]
    base: dict[str, Any] = {"series": series, "quantile": quantile}
    counts: dict[str, Any] = {
        "baseline_runs": int(x.size),
        "candidate_runs": int(y.size),
        "baseline_ns": float(np.median(x)) if x.size else math.nan,
        "candidate_ns": float(np.median(y)) if y.size else math.nan,
    }
    needed = max(config.min_runs, 2)
    if x.size < needed or y.size < needed:
        reason = (
            f"too few runs: need at least {needed} per side (baseline {x.size}, candidate {y.size})"
        )
        return Comparison(**base, outcome=Outcome.INCONCLUSIVE, reason=reason, **counts)
    level = config.alpha / max(1, family_size)
    if 1.0 / math.comb(x.size + y.size, x.size) >= level:
        reason = (
            f"too few runs for the rank test to reach {level:.3g}: use at least "
            f"{min_runs_for_alpha(level)} per side"
        )
        return Comparison(**base, outcome=Outcome.INCONCLUSIVE, reason=reason, **counts)
    median_x = counts["baseline_ns"]
    if median_x <= 0.0:
        reason = "baseline quantile is 0: no ratio"
        return Comparison(**base, outcome=Outcome.INCONCLUSIVE, reason=reason, **counts)

    threshold = 1.0 + max(config.min_effect, config.min_effect_ns / median_x)
    log_x, log_y = np.log(np.maximum(x, 1.0)), np.log(np.maximum(y, 1.0))
    worse, within = u_test_p_values(log_x, log_y, [math.log(threshold)])
    p_worse, p_within = float(worse[0]), float(within[0])
    low, high = moses_interval(log_x, log_y, config.alpha)
    evidence = Comparison(
        **base,
        outcome=Outcome.INCONCLUSIVE,
        reason="",
        **counts,
        ratio=hodges_lehmann_ratio(log_x, log_y),
        ratio_low=low,
        ratio_high=high,
        threshold=threshold,
        p_worse=p_worse,
        p_worse_adjusted=min(1.0, p_worse * max(1, family_size)),
        p_within=p_within,
        runs_to_pass=runs_to_pass(
            (math.log(high) - math.log(low)) / 2,
            int(x.size),
            int(y.size),
            math.log(threshold),
            config.alpha,
        ),
    )
    return decide(evidence, config.alpha)


def decide(c: Comparison, alpha: float) -> Comparison:
    """Outcome and reason of a tested comparison from its (adjusted) p-values."""
    if c.p_worse_adjusted < alpha:
        outcome = Outcome.REGRESSION
        reason = (
            f"worse by more than {c.threshold - 1:.1%}: ratio >= {c.ratio_low:.3f}, "
            f"Holm-adjusted p={c.p_worse_adjusted:.2g}"
        )
    elif c.p_within < alpha:
        outcome = Outcome.PASS
        reason = f"within {c.threshold - 1:.1%}: ratio <= {c.ratio_high:.3f}, p={c.p_within:.2g}"
    else:
        outcome = Outcome.INCONCLUSIVE
        reason = (
            f"ratio interval [{c.ratio_low:.3f}, {c.ratio_high:.3f}] straddles the limit "
            f"{c.threshold:.3f}: {_more_runs(c)}"
        )
    return replace(c, outcome=outcome, reason=reason)


def _more_runs(c: Comparison) -> str:
    """What an inconclusive comparison needs, from its ``runs_to_pass``."""
    runs = min(c.baseline_runs, c.candidate_runs)
    if math.isnan(c.runs_to_pass) or c.runs_to_pass > 10_000:
        return "reduce the run-to-run noise (more runs would not decide it)"
    needed = math.ceil(c.runs_to_pass)
    if needed <= runs:
        return (
            f"at this spread {runs} runs per side let an unchanged build pass "
            f"{PASS_POWER:.0%} of the time: this ratio lies near the limit (add runs to decide)"
        )
    return (
        f"at this run-to-run spread an unchanged build needs about {needed} runs per side to "
        f"pass {PASS_POWER:.0%} of the time; or reduce the noise"
    )


def _stage_breakdown(
    baseline: Sequence[HistDocument],
    candidate: Sequence[HistDocument],
    key: LabelKey,
    quantile: float,
) -> Breakdown | None:
    """The other stages of a regressed series (same labels but ``stage``), in document order."""
    labels = dict(key)
    if STAGE_LABEL not in labels:
        return None
    rest = {k: v for k, v in labels.items() if k != STAGE_LABEL}
    names = set(labels)
    base = select_series(baseline, rest)
    cand = select_series(candidate, rest)
    stages: list[StageDelta] = []
    for other in base:
        other_labels = dict(other)
        if set(other_labels) != names or other == key or other not in cand:
            continue
        x = run_quantiles(base[other], [quantile])[0]
        y = run_quantiles(cand[other], [quantile])[0]
        x, y = x[~np.isnan(x)], y[~np.isnan(y)]
        if not x.size or not y.size:
            continue
        ratio = hodges_lehmann_ratio(np.log(np.maximum(x, 1.0)), np.log(np.maximum(y, 1.0)))
        stages.append(
            StageDelta(other_labels[STAGE_LABEL], float(np.median(x)), float(np.median(y)), ratio)
        )
    order = _stage_order(baseline)
    stages.sort(key=lambda s: order.get(s.stage, len(order)))
    return Breakdown(key, quantile, stages)


def _stage_order(documents: Sequence[HistDocument]) -> dict[str, int]:
    """Stage names in the order the first document lists them (the pipeline order)."""
    order: dict[str, int] = {}
    for document in documents[:1]:
        for series in document.series:
            stage = series.labels.get(STAGE_LABEL)
            if stage is not None and stage not in order:
                order[stage] = len(order)
    return order


def _selected(
    documents: Sequence[HistDocument], selectors: Sequence[Mapping[str, str]]
) -> set[LabelKey]:
    return {
        label_key(s.labels)
        for d in documents
        for s in d.series
        if any(matches(s.labels, sel) for sel in selectors)
    }


def gate_documents(
    baseline: Sequence[HistDocument],
    candidate: Sequence[HistDocument],
    selectors: Sequence[Mapping[str, str]] | None = None,
    config: GateConfig | None = None,
) -> GateResult:
    """Gate one document per run on each side.

    Every series that matches one of ``selectors`` (default: ``[DEFAULT_SERIES]``) is compared at
    every configured quantile; a series found on one side only is an input error.
    """
    config = config or GateConfig()
    chosen = [dict(s) for s in selectors] if selectors else [dict(DEFAULT_SERIES)]
    if not baseline or not candidate:
        raise GateInputError("need at least one baseline run and one candidate run")
    base_keys = _selected(baseline, chosen)
    cand_keys = _selected(candidate, chosen)
    wanted = " or ".join(describe(label_key(s)) for s in chosen)
    if not base_keys and not cand_keys:
        hint = "" if selectors else " (the default; choose others with --series)"
        raise GateInputError(f"no series matches {wanted}{hint}")
    for side, only, other in (
        ("baseline", base_keys - cand_keys, "candidate"),
        ("candidate", cand_keys - base_keys, "baseline"),
    ):
        if only:
            names = "; ".join(describe(k) for k in sorted(only)[:3])
            more = f" (+{len(only) - 3} more)" if len(only) > 3 else ""
            raise GateInputError(
                f"series only in the {side} runs, not in any {other} run: {names}{more}; "
                f"baseline and candidate must record the same series (narrow with --series)"
            )
    keys = sorted(base_keys)
    family = len(keys) * len(config.quantiles)
    base_series = select_series(baseline, {})
    cand_series = select_series(candidate, {})

    comparisons: list[Comparison] = []
    notes: list[str] = []
    for key in keys:
        base_hists, cand_hists = base_series[key], cand_series[key]
        base_q = run_quantiles(base_hists, config.quantiles)
        cand_q = run_quantiles(cand_hists, config.quantiles)
        for row, q in enumerate(config.quantiles):
            result = compare(base_q[row], cand_q[row], q, config, key, family)
            events = tail_events(base_hists, q) + tail_events(cand_hists, q)
            min_events = min(events) if events else math.nan
            comparisons.append(replace(result, min_tail_events=min_events))
            if events and min_events < LOW_TAIL_EVENTS:
                notes.append(
                    f"{describe(key)} {quantile_name(q)}: some runs have only "
                    f"{min_events:.1f} events above it; that quantile is close to the run's max"
                )
    # Holm over the whole family: re-decide with the step-down adjusted p-values.
    adjusted = holm([c.p_worse for c in comparisons])
    comparisons = [
        c if math.isnan(a) else decide(replace(c, p_worse_adjusted=a), config.alpha)
        for c, a in zip(comparisons, adjusted, strict=True)
    ]
    outcomes = {c.outcome for c in comparisons}
    if Outcome.REGRESSION in outcomes:
        outcome = Outcome.REGRESSION
    elif outcomes == {Outcome.PASS}:
        outcome = Outcome.PASS
    else:
        outcome = Outcome.INCONCLUSIVE
    breakdowns = [
        b
        for c in comparisons
        if c.outcome is Outcome.REGRESSION
        and (b := _stage_breakdown(baseline, candidate, c.series, c.quantile)) is not None
    ]
    return GateResult(
        outcome=outcome,
        comparisons=comparisons,
        config=config,
        selectors=chosen,
        breakdowns=breakdowns,
        notes=notes,
    )


def gate_paths(
    baseline: Iterable[str | os.PathLike[str]],
    candidate: Iterable[str | os.PathLike[str]],
    selectors: Sequence[Mapping[str, str]] | None = None,
    config: GateConfig | None = None,
) -> GateResult:
    """:func:`gate_documents` on run files or directories of them (RunInputError on bad input)."""
    baseline, candidate = list(baseline), list(candidate)
    base_runs = load_runs(baseline)
    cand_runs = load_runs(candidate)
    result = gate_documents(
        [r.document for r in base_runs], [r.document for r in cand_runs], selectors, config
    )
    # `tailsight replay` records a run that failed as RUN.failed: say so, it is not gated.
    failed = [
        f"{side}: {len(found)} failed run(s) not gated, e.g. {found[0]}"
        for side, paths in (("baseline", baseline), ("candidate", candidate))
        if (found := sorted(f for p in map(Path, paths) if p.is_dir() for f in p.glob("*.failed")))
    ]
    return replace(
        result,
        baseline_files=[str(r.path) for r in base_runs],
        candidate_files=[str(r.path) for r in cand_runs],
        notes=[*result.notes, *failed],
    )
