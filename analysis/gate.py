"""Regression gate: per-run quantiles, a one-sided rank test and a bootstrap ratio interval.

Pooled per-event tests false-alarm at a very high rate on real run-to-run noise (every run has its
own machine state), so the unit of analysis is one quantile per run. For each (series, quantile):

* ``x`` = baseline per-run quantiles, ``y`` = candidate per-run quantiles (runs where the series is
  absent or empty are left out);
* ``p`` = one-sided Mann-Whitney U p-value for "candidate larger" (scipy; exact for small samples
  without ties);
* ``ratio`` = the Hodges-Lehmann ratio ``exp(median_ij(log y_j - log x_i))`` (the estimator that
  goes with the rank test: as robust to a noisy run as a ratio of medians, but more efficient),
  with a percentile bootstrap interval ``[lo, hi]`` of level ``1 - 2*alpha`` (runs resampled within
  each side, ``bootstrap`` resamples, seeded), so each bound is a one-sided ``1 - alpha`` bound;
* threshold ``t = 1 + max(min_effect, min_effect_ns / median(x))``: the smallest ratio that counts
  as a regression. The absolute floor (default 10 µs = two 5 µs buckets) keeps bucket-resolution
  movements of small quantiles from failing a build.

Decision, in this order:

1. fewer than ``min_runs`` usable runs on either side, or too few for the rank test to ever reach
   ``alpha`` -> **inconclusive** (the reason says how many runs are needed);
2. ``p < alpha`` and ``lo > t`` -> **regression** (significantly worse, and confidently by more
   than the minimum effect);
3. ``hi < t`` -> **pass** (confidently not worse by the minimum effect; improvements pass);
4. otherwise -> **inconclusive** (e.g. a real but small shift whose interval straddles ``t``).

The gate's outcome is the worst over all comparisons: any regression -> regression (exit 1), else
any inconclusive -> inconclusive (exit 3), else pass (exit 0). ``alpha`` is per comparison; the
calibration harness (``tailsight.analysis.eval``) measures the whole gate's A/A false-fail rate.

Defaults: quantiles 0.5, 0.99, 0.999; alpha 0.05; min_effect 5 %; min_effect_ns 10 000;
min_runs 5; bootstrap 2000; seed 0.
"""

from __future__ import annotations

import math
import os
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from tailsight.analysis.quantiles import (
    LabelKey,
    RunInputError,
    describe,
    load_runs,
    quantile_name,
    run_quantiles,
    select_series,
    tail_events,
)
from tailsight.histfile import HistDocument

JSON_FORMAT: Final = "tailsight.gate/1"
LOW_TAIL_EVENTS: Final = 10.0
"""Below this many expected events above q in a run, its q-quantile is little more than its max."""


class Outcome(StrEnum):
    """Verdict of one comparison or of the whole gate."""

    PASS = "pass"
    REGRESSION = "regression"
    INCONCLUSIVE = "inconclusive"


EXIT_CODES: Final = {Outcome.PASS: 0, Outcome.REGRESSION: 1, Outcome.INCONCLUSIVE: 3}
"""Process exit status per outcome; 2 is left for usage and input errors."""
_SEVERITY: Final = {Outcome.PASS: 0, Outcome.INCONCLUSIVE: 1, Outcome.REGRESSION: 2}


class GateInputError(RunInputError):
    """The runs cannot be gated as asked (nothing matches the selector, no runs, ...)."""


@dataclass(frozen=True)
class GateConfig:
    """Parameters of the decision rule (see the module docstring)."""

    quantiles: tuple[float, ...] = (0.5, 0.99, 0.999)
    alpha: float = 0.05
    min_effect: float = 0.05
    min_effect_ns: float = 10_000.0
    min_runs: int = 5
    bootstrap: int = 2000
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.quantiles or not all(0.0 < q < 1.0 for q in self.quantiles):
            raise ValueError(f"quantiles must lie in (0, 1): {self.quantiles}")
        if not 0.0 < self.alpha < 0.5:
            raise ValueError(f"alpha {self.alpha} outside (0, 0.5)")
        if self.min_effect < 0 or self.min_effect_ns < 0:
            raise ValueError("minimum effects must be >= 0")
        if self.min_runs < 2:
            raise ValueError("min_runs must be at least 2")
        if self.bootstrap < 100:
            raise ValueError("bootstrap needs at least 100 resamples")


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
    p_value: float = math.nan
    min_tail_events: float = math.nan

    def to_json(self) -> dict[str, Any]:
        """Plain JSON-able dict (nan -> None)."""
        out: dict[str, Any] = {
            "series": dict(self.series),
            "quantile": self.quantile,
            "name": quantile_name(self.quantile),
            "outcome": self.outcome.value,
            "reason": self.reason,
        }
        for name in (
            "baseline_runs",
            "candidate_runs",
            "baseline_ns",
            "candidate_ns",
            "ratio",
            "ratio_low",
            "ratio_high",
            "threshold",
            "p_value",
            "min_tail_events",
        ):
            value = getattr(self, name)
            out[name] = None if isinstance(value, float) and math.isnan(value) else value
        return out


@dataclass(frozen=True)
class GateResult:
    """All comparisons, the overall outcome and what went in."""

    outcome: Outcome
    comparisons: list[Comparison]
    config: GateConfig
    baseline_files: list[str] = field(default_factory=list)
    candidate_files: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        """0 pass, 1 regression, 3 inconclusive."""
        return EXIT_CODES[self.outcome]

    def to_json(self) -> dict[str, Any]:
        """The ``tailsight.gate/1`` JSON report."""
        config = asdict(self.config)
        config["quantiles"] = list(self.config.quantiles)
        return {
            "format": JSON_FORMAT,
            "outcome": self.outcome.value,
            "exit_code": self.exit_code,
            "config": config,
            "baseline": {"runs": len(self.baseline_files), "files": self.baseline_files},
            "candidate": {"runs": len(self.candidate_files), "files": self.candidate_files},
            "comparisons": [c.to_json() for c in self.comparisons],
            "notes": self.notes,
        }


def min_runs_for_alpha(alpha: float) -> int:
    """Smallest equal per-side run count whose exact one-sided U test can reach ``p < alpha``."""
    n = 1
    while 1.0 / math.comb(2 * n, n) >= alpha:
        n += 1
    return n


def hodges_lehmann_ratio(
    log_baseline: npt.NDArray[np.float64], log_candidate: npt.NDArray[np.float64]
) -> npt.NDArray[np.float64]:
    """``exp(median of all pairwise log differences)`` along the last axis (batched rows).

    The Hodges-Lehmann shift is the estimator that goes with the rank test: it ignores a noisy run
    or two like a median, but uses all ``n*m`` pairs, so it is markedly more efficient.
    """
    rows_x = np.atleast_2d(log_baseline)
    rows_y = np.atleast_2d(log_candidate)
    out = np.empty(rows_x.shape[0])
    chunk = max(1, 2_000_000 // (rows_x.shape[1] * rows_y.shape[1]))  # bound the temporary
    for start in range(0, rows_x.shape[0], chunk):
        part = rows_y[start : start + chunk, None, :] - rows_x[start : start + chunk, :, None]
        out[start : start + chunk] = np.median(part.reshape(part.shape[0], -1), axis=1)
    result = np.exp(out)
    return result if np.ndim(log_baseline) > 1 else result[:1]


def compare(
    baseline_ns: npt.ArrayLike,
    candidate_ns: npt.ArrayLike,
    quantile: float,
    config: GateConfig,
    rng: np.random.Generator,
    series: LabelKey = (),
) -> Comparison:
    """Verdict for one quantile from per-run values (nan entries = runs without data)."""
    from scipy.stats import mannwhitneyu

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
    if 1.0 / math.comb(x.size + y.size, x.size) >= config.alpha:
        reason = (
            f"too few runs for the rank test to reach alpha {config.alpha}: use at least "
            f"{min_runs_for_alpha(config.alpha)} per side"
        )
        return Comparison(**base, outcome=Outcome.INCONCLUSIVE, reason=reason, **counts)

    median_x = counts["baseline_ns"]
    if median_x <= 0.0:
        reason = "baseline quantile is 0: no ratio"
        return Comparison(**base, outcome=Outcome.INCONCLUSIVE, reason=reason, **counts)
    threshold = 1.0 + max(config.min_effect, config.min_effect_ns / median_x)

    test = mannwhitneyu(y, x, alternative="greater")
    p_value = float(test.pvalue)
    if math.isnan(p_value):  # all values identical: no evidence of a shift
        p_value = 1.0

    log_x, log_y = np.log(np.maximum(x, 1.0)), np.log(np.maximum(y, 1.0))
    ratio = float(hodges_lehmann_ratio(log_x, log_y)[0])
    resampled_x = log_x[rng.integers(0, x.size, (config.bootstrap, x.size))]
    resampled_y = log_y[rng.integers(0, y.size, (config.bootstrap, y.size))]
    ratios = hodges_lehmann_ratio(resampled_x, resampled_y)
    low, high = (float(v) for v in np.quantile(ratios, [config.alpha, 1.0 - config.alpha]))

    if p_value < config.alpha and low > threshold:
        outcome = Outcome.REGRESSION
        reason = f"worse: rank test p={p_value:.3g} and ratio >= {low:.3f} > {threshold:.3f}"
    elif high < threshold:
        outcome = Outcome.PASS
        reason = f"ratio <= {high:.3f} < {threshold:.3f}"
    else:
        outcome = Outcome.INCONCLUSIVE
        if p_value < config.alpha:
            reason = (
                f"significant (p={p_value:.3g}) but the ratio interval [{low:.3f}, {high:.3f}] "
                f"includes the threshold {threshold:.3f}: add runs"
            )
        else:
            reason = (
                f"not significant (p={p_value:.3g}) and the ratio interval [{low:.3f}, "
                f"{high:.3f}] reaches {threshold:.3f}: add runs or reduce noise"
            )
    return Comparison(
        **base,
        outcome=outcome,
        reason=reason,
        **counts,
        ratio=ratio,
        ratio_low=low,
        ratio_high=high,
        threshold=threshold,
        p_value=p_value,
    )


def gate_documents(
    baseline: Sequence[HistDocument],
    candidate: Sequence[HistDocument],
    selector: Mapping[str, str] | None = None,
    config: GateConfig | None = None,
) -> GateResult:
    """Gate one document per run on each side; every series matching ``selector`` is compared."""
    config = config or GateConfig()
    selector = selector or {}
    if not baseline or not candidate:
        raise GateInputError("need at least one baseline run and one candidate run")
    base_series = select_series(baseline, selector)
    cand_series = select_series(candidate, selector)
    if not base_series and not cand_series:
        wanted = describe(tuple(sorted(selector.items())))
        raise GateInputError(f"no series matches the selector {wanted}")

    comparisons: list[Comparison] = []
    notes: list[str] = []
    for key in sorted(set(base_series) | set(cand_series)):
        empty: list[None] = []
        base_hists = base_series.get(key, empty)
        cand_hists = cand_series.get(key, empty)
        base_q = run_quantiles(base_hists, config.quantiles)
        cand_q = run_quantiles(cand_hists, config.quantiles)
        for row, q in enumerate(config.quantiles):
            # One generator per (series, q), keyed by name: adding a series or a quantile does not
            # change the other comparisons' intervals.
            name = f"{describe(key)}|{quantile_name(q)}".encode()
            rng = np.random.default_rng([config.seed, zlib.crc32(name)])
            result = compare(base_q[row], cand_q[row], q, config, rng, key)
            events = tail_events(base_hists, q) + tail_events(cand_hists, q)
            min_events = min(events) if events else math.nan
            comparisons.append(replace(result, min_tail_events=min_events))
            if events and min_events < LOW_TAIL_EVENTS:
                notes.append(
                    f"{describe(key)} {quantile_name(q)}: some runs have only "
                    f"{min_events:.1f} events above it; that quantile is close to the run's max"
                )
    outcome = max((c.outcome for c in comparisons), key=_SEVERITY.__getitem__)
    return GateResult(outcome=outcome, comparisons=comparisons, config=config, notes=notes)


def gate_paths(
    baseline: Iterable[str | os.PathLike[str]],
    candidate: Iterable[str | os.PathLike[str]],
    selector: Mapping[str, str] | None = None,
    config: GateConfig | None = None,
) -> GateResult:
    """:func:`gate_documents` on run files or directories of them (RunInputError on bad input)."""
    base_runs = load_runs(baseline)
    cand_runs = load_runs(candidate)
    result = gate_documents(
        [r.document for r in base_runs], [r.document for r in cand_runs], selector, config
    )
    return GateResult(
        outcome=result.outcome,
        comparisons=result.comparisons,
        config=result.config,
        baseline_files=[str(r.path) for r in base_runs],
        candidate_files=[str(r.path) for r in cand_runs],
        notes=result.notes,
    )
