"""Calibration harness: synthetic runs and interval series with known ground truth, used to measure
the gate's false-fail rate and power and the jump detector's false-alarm rate and detection delay.

Latencies come from a mixture of lognormals (body + tail), so every true quantile is known exactly
(CDF inversion) and histograms are drawn directly as multinomial counts over the 5 µs buckets,
which is exact and independent of the number of events. Run-to-run noise (:class:`RunNoise`):
every run scales all latencies by ``exp(N(0, scale_sigma))`` and with probability
``noisy_run_prob`` a run also suffers interference (an extra slow component). A tail regression is
a monotone stretch of values above the baseline's P95, sized so the P99 moves by exactly the
requested ratio and the body (P50) does not move at all.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from tailsight.analysis.gate import DEFAULT_SERIES, GateConfig, Outcome, gate_documents
from tailsight.analysis.jumps import (
    JumpConfig,
    TailThreshold,
    benjamini_hochberg,
    detect_offline,
    monitor,
    pearson_dispersion,
    quantile_of,
)
from tailsight.analysis.quantiles import dense_counts
from tailsight.hist import NUM_BUCKETS, Histogram, bucket_upper_bounds_ns
from tailsight.intervals import HistDocument, Series

_INTERVAL_NS = 1_000_000_000


@dataclass(frozen=True)
class LatencyModel:
    """Mixture of lognormals ``(weight, median_ns, sigma)``, then a tail stretch, then a scale.

    ``T(v) = scale * g(v)`` with ``g(v) = v`` below ``stretch_from_ns`` and
    ``stretch_from_ns + (v - stretch_from_ns) * stretch`` above it.
    """

    components: tuple[tuple[float, float, float], ...] = (
        (0.97, 40_000.0, 0.30),
        (0.03, 200_000.0, 0.50),
    )
    scale: float = 1.0
    stretch_from_ns: float = math.inf
    stretch: float = 1.0

    def _base_cdf(self, v_ns: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        from scipy.special import ndtr

        total = sum(w for w, _, _ in self.components)
        out = np.zeros_like(v_ns)
        with np.errstate(divide="ignore"):
            logs = np.log(np.maximum(v_ns, 0.0))
        for weight, median_ns, sigma in self.components:
            out += weight / total * ndtr((logs - math.log(median_ns)) / sigma)
        return out

    def cdf(self, x_ns: npt.ArrayLike) -> npt.NDArray[np.float64]:
        """P(latency <= x)."""
        g = np.asarray(x_ns, dtype=np.float64) / self.scale
        v = g
        if math.isfinite(self.stretch_from_ns):
            v0 = self.stretch_from_ns
            v = np.where(g <= v0, g, v0 + (g - v0) / self.stretch)
        return self._base_cdf(v)

    def quantile(self, q: float) -> float:
        """Exact q-quantile in ns (bisection on the CDF in log space)."""
        from scipy.optimize import brentq

        def gap(log_x: float) -> float:
            return float(self.cdf(np.array([math.exp(log_x)]))[0]) - q

        return math.exp(brentq(gap, math.log(1.0), math.log(1e12), xtol=1e-12))

    def bucket_probabilities(self) -> npt.NDArray[np.float64]:
        """Probability of each finite bucket, then overflow: ``[NUM_BUCKETS + 1]``."""
        cdf = self.cdf(bucket_upper_bounds_ns().astype(np.float64))
        probs = np.diff(np.concatenate([[0.0], cdf, [1.0]]))
        probs = np.clip(probs, 0.0, None)
        return np.asarray(probs / probs.sum())

    def sample_counts(self, rng: np.random.Generator, events: int) -> npt.NDArray[np.int64]:
        """Dense counts ``[NUM_BUCKETS + 1]`` of ``events`` draws."""
        return rng.multinomial(events, self.bucket_probabilities()).astype(np.int64)

    def sample_hist(self, rng: np.random.Generator, events: int) -> Histogram:
        """A Histogram of ``events`` draws (``sum_ns`` left at 0: the gate does not use it)."""
        counts = self.sample_counts(rng, events)
        return Histogram(counts[:NUM_BUCKETS], overflow=int(counts[NUM_BUCKETS]))

    def scaled(self, factor: float) -> LatencyModel:
        """Every latency multiplied by ``factor``."""
        return replace(self, scale=self.scale * factor)

    def with_component(self, weight: float, median_ns: float, sigma: float) -> LatencyModel:
        """Add a component holding ``weight`` of the events (the others shrink proportionally)."""
        total = sum(w for w, _, _ in self.components)
        kept = tuple((w / total * (1.0 - weight), m, s) for w, m, s in self.components)
        return replace(self, components=(*kept, (weight, median_ns, sigma)))

    def with_tail_ratio(self, ratio: float, q: float = 0.99, from_q: float = 0.95) -> LatencyModel:
        """Stretch values above the ``from_q`` quantile so the ``q`` quantile moves by ``ratio``."""
        if math.isfinite(self.stretch_from_ns):
            raise ValueError("model is already stretched")
        v0 = self.quantile(from_q) / self.scale
        vq = self.quantile(q) / self.scale
        stretch = (ratio * vq - v0) / (vq - v0)
        if stretch <= 0:
            raise ValueError(f"ratio {ratio} would make the tail non-monotone")
        return replace(self, stretch_from_ns=v0, stretch=stretch)


@dataclass(frozen=True)
class RunNoise:
    """Run-to-run noise of a benchmark (defaults: 3 % scale jitter, 1 run in 10 disturbed)."""

    scale_sigma: float = 0.03
    noisy_run_prob: float = 0.1
    noisy_weight: float = 0.005
    noisy_median_ns: float = 400_000.0
    noisy_sigma: float = 0.5
    events_per_run: int = 20_000

    def run_model(self, model: LatencyModel, rng: np.random.Generator) -> LatencyModel:
        """The model one run actually sees."""
        run = model.scaled(math.exp(rng.normal(0.0, self.scale_sigma)))
        if rng.random() < self.noisy_run_prob:
            run = run.with_component(self.noisy_weight, self.noisy_median_ns, self.noisy_sigma)
        return run


def simulate_runs(
    model: LatencyModel,
    runs: int,
    rng: np.random.Generator,
    noise: RunNoise | None = None,
    labels: dict[str, str] | None = None,
) -> list[HistDocument]:
    """One ``tailsight.hist/1`` document per run, each holding one series."""
    noise = noise or RunNoise()
    labels = labels or dict(DEFAULT_SERIES)
    documents = []
    for n in range(runs):
        hist = noise.run_model(model, rng).sample_hist(rng, noise.events_per_run)
        start = n * _INTERVAL_NS
        documents.append(HistDocument(start, start + _INTERVAL_NS, [Series(dict(labels), hist)]))
    return documents


# -- gate calibration -------------------------------------------------------------------------


@dataclass(frozen=True)
class Rate:
    """A proportion over trials with its Wilson 95 % interval."""

    hits: int
    trials: int

    @property
    def value(self) -> float:
        """hits / trials."""
        return self.hits / self.trials if self.trials else math.nan

    def interval(self, z: float = 1.96) -> tuple[float, float]:
        """Wilson score interval."""
        if not self.trials:
            return (math.nan, math.nan)
        n, p = self.trials, self.value
        centre = (p + z * z / (2 * n)) / (1 + z * z / n)
        half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
        return (max(0.0, centre - half), min(1.0, centre + half))

    def __str__(self) -> str:
        low, high = self.interval()
        if 0 < high < 0.005:  # false-alarm rates per interval: keep the digits that matter
            return f"{self.value:.1e} [{low:.1e}, {high:.1e}] ({self.hits}/{self.trials})"
        return f"{self.value:5.3f} [{low:.3f}, {high:.3f}] ({self.hits}/{self.trials})"


@dataclass(frozen=True)
class GateCalibration:
    """Outcome rates of the gate on one scenario, plus the pooled per-event baseline's rate."""

    scenario: str
    ratio: float
    regression: Rate
    passed: Rate
    inconclusive: Rate
    pooled_regression: Rate

    def to_json(self) -> dict[str, Any]:
        """Rates as plain numbers."""
        return {
            "scenario": self.scenario,
            "p99_ratio": self.ratio,
            "regression": self.regression.value,
            "pass": self.passed.value,
            "inconclusive": self.inconclusive.value,
            "pooled_per_event_regression": self.pooled_regression.value,
            "trials": self.regression.trials,
        }


def pooled_event_test(
    baseline: Sequence[HistDocument], candidate: Sequence[HistDocument], q: float, alpha: float
) -> bool:
    """Naive gate (a baseline, not used by the gate): pool all events per side, then a one-sided
    two-proportion z-test of exceedances above the pooled baseline's q-quantile bucket edge."""
    from scipy.stats import norm

    base = np.sum([dense_counts(d.series[0].hist) for d in baseline], axis=0)
    cand = np.sum([dense_counts(d.series[0].hist) for d in candidate], axis=0)
    threshold = TailThreshold.from_counts(base, q)
    if threshold is None:
        return False
    x1, n1 = float(threshold.exceedances(base)), float(base.sum())
    x2, n2 = float(threshold.exceedances(cand)), float(cand.sum())
    pooled = (x1 + x2) / (n1 + n2)
    se = math.sqrt(pooled * (1 - pooled) * (1 / n1 + 1 / n2))
    return bool(se > 0 and norm.sf((x2 / n2 - x1 / n1) / se) < alpha)


def gate_calibration(
    ratio: float,
    trials: int,
    runs_per_side: int = 15,
    noise: RunNoise | None = None,
    config: GateConfig | None = None,
    model: LatencyModel | None = None,
    seed: int = 0,
    scenario: str = "",
) -> GateCalibration:
    """Gate ``trials`` independent experiments whose true candidate / baseline P99 is ``ratio``."""
    model = model or LatencyModel()
    candidate_model = model if ratio == 1.0 else model.with_tail_ratio(ratio)
    config = config or GateConfig()
    outcomes = {o: 0 for o in Outcome}
    pooled = 0
    for trial in range(trials):
        rng = np.random.default_rng([seed, trial])
        base = simulate_runs(model, runs_per_side, rng, noise)
        cand = simulate_runs(candidate_model, runs_per_side, rng, noise)
        result = gate_documents(base, cand, config=config)
        outcomes[result.outcome] += 1
        pooled += pooled_event_test(base, cand, 0.99, config.alpha)
    return GateCalibration(
        scenario=scenario or f"P99 x{ratio:g}",
        ratio=ratio,
        regression=Rate(outcomes[Outcome.REGRESSION], trials),
        passed=Rate(outcomes[Outcome.PASS], trials),
        inconclusive=Rate(outcomes[Outcome.INCONCLUSIVE], trials),
        pooled_regression=Rate(pooled, trials),
    )


# -- jump detector calibration ----------------------------------------------------------------


@dataclass(frozen=True)
class IntervalNoise:
    """Interval-to-interval noise of one series (makes exceedance counts overdispersed)."""

    scale_sigma: float = 0.02
    events_per_interval: int = 5_000


def simulate_intervals(
    before: LatencyModel,
    intervals: int,
    rng: np.random.Generator,
    after: LatencyModel | None = None,
    change_at: int | None = None,
    noise: IntervalNoise | None = None,
) -> npt.NDArray[np.int64]:
    """Dense counts ``[intervals, NUM_BUCKETS + 1]``; ``after`` applies from ``change_at`` on."""
    noise = noise or IntervalNoise()
    rows = np.zeros((intervals, NUM_BUCKETS + 1), dtype=np.int64)
    for t in range(intervals):
        model = after if after is not None and change_at is not None and t >= change_at else before
        if noise.scale_sigma > 0:
            model = model.scaled(math.exp(rng.normal(0.0, noise.scale_sigma)))
        events = int(rng.poisson(noise.events_per_interval))
        rows[t] = model.sample_counts(rng, events)
    return rows


@dataclass(frozen=True)
class DetectorScore:
    """One detector on the same stationary and changed series."""

    name: str
    false_alarms: Rate  # alarms per monitored series-interval, stationary series
    detected: Rate  # changed series alarmed at or after the change, within the horizon
    early_alarms: int  # changed series alarmed before the change
    delays: list[int] = field(default_factory=list)  # first alarm at/after the change - change

    def delay_summary(self) -> dict[str, float]:
        """Median, mean and 90th percentile of the delay, in intervals."""
        values = np.array(self.delays, dtype=np.float64)
        if not values.size:
            return {"median": math.nan, "mean": math.nan, "p90": math.nan}
        return {
            "median": float(np.median(values)),
            "mean": float(values.mean()),
            "p90": float(np.quantile(values, 0.9)),
        }


@dataclass(frozen=True)
class JumpCalibration:
    """The CUSUM detector (first score) and same-data baselines for one jump size."""

    ratio: float
    scores: list[DetectorScore]

    @property
    def cusum(self) -> DetectorScore:
        """The score of :func:`tailsight.analysis.jumps.monitor`."""
        return self.scores[0]


def dashboard_alarms(
    counts: npt.NDArray[np.int64], config: JumpConfig, factor: float = 1.2
) -> list[int]:
    """Baseline rule: alarm when an interval's q-quantile exceeds ``factor`` x the reference's."""
    reference = config.reference_intervals
    limit = factor * quantile_of(counts[:reference].sum(axis=0), config.quantile)
    return [
        t
        for t in range(reference, counts.shape[0])
        if quantile_of(counts[t], config.quantile) > limit
    ]


def shewhart_alarms(counts: npt.NDArray[np.int64], config: JumpConfig) -> list[int]:
    """Baseline rule at the same nominal rate: a two-sided z-test of each interval's exceedance
    count against the reference (same threshold and dispersion as the CUSUM, no memory)."""
    from scipy.stats import norm

    reference = config.reference_intervals
    threshold = TailThreshold.from_counts(counts[:reference].sum(axis=0), config.quantile)
    if threshold is None:
        return []
    exceed = threshold.exceedances(counts).astype(np.float64)
    total = counts.sum(axis=1).astype(np.float64)
    rate = threshold.rate
    dispersion = pearson_dispersion(
        exceed[:reference], total[:reference], rate, config.dispersion_quantile
    )
    with np.errstate(divide="ignore", invalid="ignore"):
        z = (exceed - total * rate) / np.sqrt(dispersion * total * rate * (1.0 - rate))
    limit = float(norm.isf(config.false_alarm_rate / 2))
    return [t for t in range(reference, counts.shape[0]) if abs(z[t]) > limit]


def jump_calibration(
    series: int,
    intervals: int,
    ratio: float,
    change_at: int,
    config: JumpConfig | None = None,
    noise: IntervalNoise | None = None,
    model: LatencyModel | None = None,
    seed: int = 0,
) -> JumpCalibration:
    """False alarms on ``series`` stationary series and delays on as many with a ``ratio`` jump of
    the configured quantile at ``change_at``: the CUSUM, a Shewhart test and a dashboard rule."""
    config = config or JumpConfig()
    model = model or LatencyModel()
    after = model.with_tail_ratio(ratio, q=config.quantile)
    detectors: dict[str, Callable[[npt.NDArray[np.int64]], list[int]]] = {
        "cusum": lambda c: [j.alarm_index for j in monitor(c, config)],
        "shewhart": lambda c: shewhart_alarms(c, config),
        "dashboard x1.2": lambda c: dashboard_alarms(c, config),
    }
    false_alarms = dict.fromkeys(detectors, 0)
    early = dict.fromkeys(detectors, 0)
    delays: dict[str, list[int]] = {name: [] for name in detectors}
    for n in range(series):
        rng = np.random.default_rng([seed, n])
        quiet = simulate_intervals(model, intervals, rng, noise=noise)
        changed = simulate_intervals(model, intervals, rng, after, change_at, noise)
        for name, detect in detectors.items():
            false_alarms[name] += len(detect(quiet))
            alarms = detect(changed)
            early[name] += any(a < change_at for a in alarms)
            later = [a for a in alarms if a >= change_at]
            if later:
                delays[name].append(later[0] - change_at)
    monitored = series * (intervals - config.reference_intervals)
    return JumpCalibration(
        ratio=ratio,
        scores=[
            DetectorScore(
                name=name,
                false_alarms=Rate(false_alarms[name], monitored),
                detected=Rate(len(delays[name]), series),
                early_alarms=early[name],
                delays=delays[name],
            )
            for name in detectors
        ],
    )


@dataclass(frozen=True)
class FdrCalibration:
    """Offline detection over many series per trial, BH across them: realized FDR and power."""

    fdr: float
    power: float
    trials: int
    level: float


def fdr_calibration(
    trials: int,
    series: int,
    changed: int,
    intervals: int,
    ratio: float,
    level: float = 0.05,
    config: JumpConfig | None = None,
    noise: IntervalNoise | None = None,
    model: LatencyModel | None = None,
    seed: int = 0,
) -> FdrCalibration:
    """Mean false discovery proportion and mean power of BH over offline p-values."""
    config = config or JumpConfig()
    model = model or LatencyModel()
    after = model.with_tail_ratio(ratio, q=config.quantile)
    fdps: list[float] = []
    powers: list[float] = []
    for trial in range(trials):
        rng = np.random.default_rng([seed, trial])
        truth = np.zeros(series, dtype=bool)
        truth[:changed] = True
        p_values = []
        for s in range(series):
            change_at = int(rng.integers(intervals // 4, 3 * intervals // 4))
            counts = simulate_intervals(
                model, intervals, rng, after if truth[s] else None, change_at, noise
            )
            p_values.append(detect_offline(counts, config).p_value)
        found = benjamini_hochberg(p_values, level)
        fdps.append(float((found & ~truth).sum()) / max(1, int(found.sum())))
        powers.append(float((found & truth).sum()) / max(1, changed))
    return FdrCalibration(
        fdr=float(np.mean(fdps)), power=float(np.mean(powers)), trials=trials, level=level
    )
