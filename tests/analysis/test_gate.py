"""Regression gate: decision rule on hand-made per-run values, its A/A false-fail rate and its power
on synthetic runs whose true quantile ratio is known from the generator."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy.stats import mannwhitneyu

from tailsight.analysis.eval import LatencyModel, RunNoise, simulate_runs
from tailsight.analysis.gate import (
    GateConfig,
    GateInputError,
    Outcome,
    compare,
    gate_documents,
    hodges_lehmann_ratio,
    min_runs_for_alpha,
)
from tailsight.analysis.quantiles import parse_quantiles, parse_selector, quantile_name
from tailsight.hist import Histogram
from tailsight.histfile import HistDocument, Series

ALPHA = 0.05
FAST = GateConfig(bootstrap=300)


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def test_hodges_lehmann_matches_naive_pairwise_median() -> None:
    rng = _rng(1)
    x, y = rng.lognormal(5, 0.2, 7), rng.lognormal(5.1, 0.2, 9)
    pairwise = [math.log(b) - math.log(a) for a, b in itertools.product(x, y)]
    expected = math.exp(float(np.median(pairwise)))
    assert hodges_lehmann_ratio(np.log(x), np.log(y))[0] == pytest.approx(expected, rel=1e-12)
    batch = hodges_lehmann_ratio(np.log(np.stack([x, x])), np.log(np.stack([y, y * 2])))
    assert batch == pytest.approx([expected, 2 * expected], rel=1e-12)


def test_min_runs_for_alpha_agrees_with_exact_rank_test() -> None:
    n = min_runs_for_alpha(ALPHA)
    # Completely separated samples give the smallest exact p-value scipy can produce.
    for runs, reachable in ((n - 1, False), (n, True)):
        p = mannwhitneyu(np.arange(runs) + 100.0, np.arange(runs), alternative="greater").pvalue
        assert bool(p < ALPHA) is reachable


def test_clear_regression_pass_and_inconclusive_on_constructed_runs() -> None:
    rng = _rng(2)
    base = 250_000 * rng.lognormal(0, 0.02, 12)
    worse = compare(base, 1.3 * 250_000 * rng.lognormal(0, 0.02, 12), 0.99, FAST, _rng())
    assert worse.outcome is Outcome.REGRESSION
    assert worse.ratio_low > worse.threshold == pytest.approx(1.05)
    assert worse.ratio == pytest.approx(1.3, rel=0.03)
    same = compare(base, 250_000 * rng.lognormal(0, 0.02, 12), 0.99, FAST, _rng())
    assert same.outcome is Outcome.PASS and same.ratio_high < 1.05
    better = compare(base, 0.8 * base, 0.99, FAST, _rng())
    assert better.outcome is Outcome.PASS
    # 5 % true shift with 10 % noise: neither confidently above nor below the 5 % threshold.
    vague = compare(base, 1.05 * 250_000 * rng.lognormal(0, 0.1, 12), 0.99, FAST, _rng())
    assert vague.outcome is Outcome.INCONCLUSIVE
    assert vague.ratio_low < 1.05 < vague.ratio_high


def test_absolute_floor_of_two_buckets_sets_the_threshold_for_small_quantiles() -> None:
    base = np.full(8, 20_000.0) + np.arange(8)  # a P50 of ~20 µs
    cand = base * 1.2  # +4 µs: less than two 5 µs buckets
    result = compare(base, cand, 0.5, FAST, _rng())
    assert result.threshold == pytest.approx(1 + 10_000 / np.median(base))
    assert result.outcome is Outcome.PASS
    relative_only = GateConfig(bootstrap=300, min_effect_ns=0)
    assert compare(base, cand, 0.5, relative_only, _rng()).outcome is Outcome.REGRESSION


def test_too_few_runs_is_inconclusive_and_says_how_many() -> None:
    result = compare([1e5, 1.1e5, 1.2e5], [2e5] * 9, 0.99, FAST, _rng())
    assert result.outcome is Outcome.INCONCLUSIVE
    assert "at least 5" in result.reason and "baseline 3" in result.reason
    # nan = a run without the series: not counted.
    result = compare([1e5] * 5 + [math.nan], [1e5] * 6, 0.99, FAST, _rng())
    assert result.baseline_runs == 5 and result.outcome is not Outcome.INCONCLUSIVE


def test_deterministic_for_a_seed() -> None:
    rng = _rng(3)
    base, cand = rng.lognormal(12, 0.1, 10), rng.lognormal(12.05, 0.1, 10)
    first = compare(base, cand, 0.99, GateConfig(seed=7), np.random.default_rng([7, 0]))
    again = compare(base, cand, 0.99, GateConfig(seed=7), np.random.default_rng([7, 0]))
    other = compare(base, cand, 0.99, GateConfig(seed=8), np.random.default_rng([8, 0]))
    assert first == again
    assert (first.ratio_low, first.ratio_high) != (other.ratio_low, other.ratio_high)


def _aa_or_ab(ratio: float, trials: int, runs: int, seed: int) -> dict[Outcome, int]:
    model = LatencyModel()
    candidate = model if ratio == 1.0 else model.with_tail_ratio(ratio)
    outcomes = dict.fromkeys(Outcome, 0)
    for trial in range(trials):
        rng = np.random.default_rng([seed, trial])
        base = simulate_runs(model, runs, rng, RunNoise())
        cand = simulate_runs(candidate, runs, rng, RunNoise())
        config = GateConfig(bootstrap=300, seed=trial)
        outcomes[gate_documents(base, cand, config=config).outcome] += 1
    return outcomes


def test_aa_false_fail_rate_at_most_nominal() -> None:
    trials = 200
    outcomes = _aa_or_ab(1.0, trials, runs=10, seed=11)
    margin = 3 * math.sqrt(ALPHA * (1 - ALPHA) / trials)
    assert outcomes[Outcome.REGRESSION] / trials <= ALPHA + margin
    assert outcomes[Outcome.PASS] > 0  # the gate can pass an A/A at all


def test_ten_percent_p99_regression_is_caught_with_15_runs() -> None:
    trials = 80
    outcomes = _aa_or_ab(1.10, trials, runs=15, seed=12)
    assert outcomes[Outcome.REGRESSION] / trials >= 0.8
    assert outcomes[Outcome.PASS] == 0


def test_ten_percent_improvement_passes() -> None:
    trials = 30
    outcomes = _aa_or_ab(0.90, trials, runs=15, seed=13)
    assert outcomes[Outcome.REGRESSION] == 0
    assert outcomes[Outcome.PASS] / trials >= 0.9


def _doc(labels: dict[str, str], values_ns: list[int]) -> HistDocument:
    return HistDocument(0, 1, [Series(labels, Histogram.from_samples(values_ns))])


def test_series_selection_and_missing_series() -> None:
    replay = {"probe": "replay", "stage": "tick_to_trade"}
    other = {"probe": "runqueue", "cgroup": "/x"}
    base = [
        HistDocument(0, 1, [Series(replay, Histogram.from_samples([50_000 + i] * 100))])
        for i in range(6)
    ]
    cand = [_doc(other, [50_000] * 100) for _ in range(6)]
    result = gate_documents(base, cand, parse_selector("probe=replay"), FAST)
    assert result.outcome is Outcome.INCONCLUSIVE
    assert {c.candidate_runs for c in result.comparisons} == {0}
    with pytest.raises(GateInputError, match="no series matches"):
        gate_documents(base, cand, parse_selector("probe=nothing"), FAST)


def test_selector_and_quantile_parsing() -> None:
    assert parse_selector("probe=replay, stage=tick_to_trade") == {
        "probe": "replay",
        "stage": "tick_to_trade",
    }
    assert parse_selector("") == {}
    for bad in ("probe", "=x", "a=1,a=2"):
        with pytest.raises(ValueError):
            parse_selector(bad)
    assert parse_quantiles("0.999,0.5,0.99,0.5") == [0.5, 0.99, 0.999]
    for bad in ("1.0", "0", "x", ""):
        with pytest.raises(ValueError):
            parse_quantiles(bad)
    assert [quantile_name(q) for q in (0.5, 0.99, 0.999)] == ["p50", "p99", "p99.9"]
