"""The synthetic generator behind the calibration: its exact quantiles and bucket probabilities
against independent numpy sampling, the tail-only regression, and the harness' bookkeeping."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tailsight.hist import NUM_BUCKETS, Histogram
from tailsight.testing.eval import (
    LatencyModel,
    Rate,
    RunNoise,
    gate_calibration,
    jump_calibration,
    simulate_runs,
)

MODEL = LatencyModel()


def _numpy_samples(model: LatencyModel, n: int, seed: int) -> np.ndarray:
    """Independent sampler: pick a component, draw a lognormal, apply stretch and scale."""
    rng = np.random.default_rng(seed)
    weights = np.array([w for w, _, _ in model.components])
    which = rng.choice(len(weights), size=n, p=weights / weights.sum())
    medians = np.array([m for _, m, _ in model.components])[which]
    sigmas = np.array([s for _, _, s in model.components])[which]
    v = medians * np.exp(sigmas * rng.standard_normal(n))
    if math.isfinite(model.stretch_from_ns):
        v0 = model.stretch_from_ns
        v = np.where(v <= v0, v, v0 + (v - v0) * model.stretch)
    return np.asarray(model.scale * v)


@pytest.mark.parametrize("q", [0.5, 0.99, 0.999])
def test_model_quantile_matches_sampling(q: float) -> None:
    samples = _numpy_samples(MODEL, 2_000_000, seed=1)
    assert MODEL.quantile(q) == pytest.approx(np.quantile(samples, q), rel=0.01)


def test_bucket_probabilities_match_binned_samples() -> None:
    model = MODEL.scaled(1.3).with_component(0.01, 400_000, 0.5)
    samples = _numpy_samples(model, 1_000_000, seed=2)
    hist = Histogram.from_samples(samples.astype(np.int64))
    probs = model.bucket_probabilities()
    assert probs.shape == (NUM_BUCKETS + 1,) and probs.sum() == pytest.approx(1.0)
    empirical = np.cumsum(np.append(hist.counts, hist.overflow)) / hist.count
    assert np.max(np.abs(np.cumsum(probs) - empirical)) < 0.003  # KS distance


@pytest.mark.parametrize("ratio", [1.1, 0.9, 1.5])
def test_tail_ratio_moves_p99_exactly_and_leaves_the_body(ratio: float) -> None:
    moved = MODEL.with_tail_ratio(ratio)
    assert moved.quantile(0.99) / MODEL.quantile(0.99) == pytest.approx(ratio, rel=1e-6)
    assert moved.quantile(0.5) == pytest.approx(MODEL.quantile(0.5), rel=1e-9)
    samples = _numpy_samples(moved, 1_000_000, seed=3)
    assert np.quantile(samples, 0.99) == pytest.approx(ratio * MODEL.quantile(0.99), rel=0.015)


def test_run_noise_spreads_per_run_p99() -> None:
    rng = np.random.default_rng(4)
    quiet = RunNoise(scale_sigma=0.0, noisy_run_prob=0.0)
    calm = [d.series[0].hist.quantile(0.99) for d in simulate_runs(MODEL, 30, rng, quiet)]
    noisy = [d.series[0].hist.quantile(0.99) for d in simulate_runs(MODEL, 30, rng, RunNoise())]
    assert np.std(np.log(noisy)) > 1.5 * np.std(np.log(calm))
    assert np.median(calm) == pytest.approx(MODEL.quantile(0.99), rel=0.03)


def test_wilson_interval_known_values() -> None:
    low, high = Rate(0, 10).interval()
    assert low == 0.0 and high == pytest.approx(0.2775, abs=1e-4)
    low, high = Rate(5, 10).interval()
    assert (low, high) == pytest.approx((0.2366, 0.7634), abs=1e-4)


def test_gate_calibration_bookkeeping() -> None:
    result = gate_calibration(1.3, trials=4, runs_per_side=8, seed=5)
    total = result.regression.hits + result.passed.hits + result.inconclusive.hits
    assert total == 4 and result.regression.hits == 4  # +30 % P99 with 8 runs: always caught
    assert result.to_json()["trials"] == 4


def test_jump_calibration_bookkeeping() -> None:
    result = jump_calibration(series=2, intervals=80, ratio=1.5, change_at=50, seed=6)
    assert [s.name for s in result.scores] == ["cusum", "shewhart", "dashboard x1.2"]
    cusum = result.cusum
    assert cusum.detected.hits == 2 and cusum.early_alarms == 0
    assert all(0 <= d <= 3 for d in cusum.delays)
    assert cusum.false_alarms.trials == 2 * (80 - 30)
