"""Regression gate: decision rule on hand-made per-run values, its A/A false-fail rate and its power
on synthetic runs whose true quantile ratio is known from the generator."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy.stats import mannwhitneyu

from tailsight.analysis.gate import (
    DEFAULT_SERIES,
    Comparison,
    GateConfig,
    GateInputError,
    Outcome,
    compare,
    gate_documents,
    hodges_lehmann_ratio,
    holm,
    min_runs_for_alpha,
    moses_interval,
    u_test_p_values,
)
from tailsight.analysis.quantiles import parse_quantiles, parse_selector, quantile_name
from tailsight.hist import Histogram
from tailsight.intervals import HistDocument, Series
from tailsight.testing.eval import LatencyModel, RunNoise, simulate_runs

ALPHA = 0.05
CONFIG = GateConfig()
RECOMMENDED_RUNS = 30
P99_NS = 200_000.0  # per-run values far above the 5 µs floor: the 5 % limit applies


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def test_hodges_lehmann_matches_naive_pairwise_median() -> None:
    rng = _rng(1)
    x, y = rng.lognormal(5, 0.2, 7), rng.lognormal(5.1, 0.2, 9)
    pairwise = [math.log(b) - math.log(a) for a, b in itertools.product(x, y)]
    expected = math.exp(float(np.median(pairwise)))
    assert hodges_lehmann_ratio(np.log(x), np.log(y)) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(("n", "m"), [(5, 5), (7, 9), (15, 15), (22, 18)])
def test_exact_u_p_values_match_scipy_exact(n: int, m: int) -> None:
    rng = _rng(n * m)
    x, y = rng.normal(size=n), rng.normal(0.4, size=m)
    shifts = [-0.5, 0.0, 0.3, 1.0]
    larger, smaller = u_test_p_values(x, y, shifts)
    for k, shift in enumerate(shifts):
        for got, side in ((larger[k], "greater"), (smaller[k], "less")):
            want = mannwhitneyu(y - shift, x, alternative=side, method="exact").pvalue
            assert got == pytest.approx(want, rel=1e-9)


def test_moses_interval_is_where_neither_shifted_test_rejects() -> None:
    rng = _rng(4)
    x, y = rng.normal(size=12), rng.normal(0.3, size=12)
    low, high = moses_interval(x, y, ALPHA)
    for log_bound, inside in ((math.log(low), True), (math.log(high), True)):
        larger, smaller = u_test_p_values(x, y, [log_bound])
        assert bool(larger[0] >= ALPHA and smaller[0] >= ALPHA) is inside
    # The p-values step at pairwise differences: the next one out is rejected.
    diffs = np.unique(np.subtract.outer(y, x))
    below = diffs[diffs < math.log(low) - 1e-12][-1]
    above = diffs[diffs > math.log(high) + 1e-12][0]
    assert u_test_p_values(x, y, [below])[0][0] < ALPHA
    assert u_test_p_values(x, y, [above])[1][0] < ALPHA
    assert low < hodges_lehmann_ratio(x, y) < high


def test_holm_step_down_by_hand() -> None:
    # Sorted 0.01, 0.02, 0.04 with m=3: 0.03, max(0.03, 0.04), max(0.04, 0.04); nan not counted.
    assert holm([0.04, 0.01, math.nan, 0.02]) == pytest.approx(
        [0.04, 0.03, math.nan, 0.04], nan_ok=True
    )
    assert holm([0.5, 0.9]) == [1.0, 1.0]


def test_min_runs_for_alpha_agrees_with_exact_rank_test() -> None:
    n = min_runs_for_alpha(ALPHA)
    # Completely separated samples give the smallest exact p-value scipy can produce.
    for runs, reachable in ((n - 1, False), (n, True)):
        p = mannwhitneyu(np.arange(runs) + 100.0, np.arange(runs), alternative="greater").pvalue
        assert bool(p < ALPHA) is reachable


def test_clear_regression_pass_and_inconclusive_on_constructed_runs() -> None:
    rng = _rng(2)
    base = 250_000 * rng.lognormal(0, 0.02, 12)
    worse = compare(base, 1.3 * 250_000 * rng.lognormal(0, 0.02, 12), 0.99, CONFIG)
    assert worse.outcome is Outcome.REGRESSION
    assert worse.ratio_low > worse.threshold == pytest.approx(1.05)
    assert worse.ratio == pytest.approx(1.3, rel=0.03)
    same = compare(base, 250_000 * rng.lognormal(0, 0.02, 12), 0.99, CONFIG)
    assert same.outcome is Outcome.PASS and same.ratio_high < 1.05 and same.p_within < ALPHA
    better = compare(base, 0.8 * base, 0.99, CONFIG)
    assert better.outcome is Outcome.PASS
    # 5 % true shift with 10 % noise: neither shown above nor shown below the 5 % limit.
    vague = compare(base, 1.05 * 250_000 * rng.lognormal(0, 0.1, 12), 0.99, CONFIG)
    assert vague.outcome is Outcome.INCONCLUSIVE
    assert vague.ratio_low < 1.05 < vague.ratio_high


def test_identical_runs_pass() -> None:
    result = compare([100_000.0] * 8, [100_000.0] * 8, 0.99, CONFIG)
    assert result.outcome is Outcome.PASS and result.ratio == 1.0


def test_absolute_floor_of_one_bucket_sets_the_threshold_for_small_quantiles() -> None:
    base = np.full(8, 20_000.0) + np.arange(8)  # a P50 of ~20 µs
    cand = base * 1.2  # +4 µs: less than one 5 µs bucket
    result = compare(base, cand, 0.5, CONFIG)
    assert result.threshold == pytest.approx(1 + 5_000 / np.median(base))
    assert result.outcome is Outcome.PASS
    relative_only = GateConfig(min_effect_ns=0)
    assert compare(base, cand, 0.5, relative_only).outcome is Outcome.REGRESSION
    assert compare(base, base * 1.3, 0.5, CONFIG).outcome is Outcome.REGRESSION  # +6 µs


def test_too_few_runs_is_inconclusive_and_says_how_many() -> None:
    result = compare([1e5, 1.1e5, 1.2e5], [2e5] * 9, 0.99, CONFIG)
    assert result.outcome is Outcome.INCONCLUSIVE
    assert "at least 5" in result.reason and "baseline 3" in result.reason
    # nan = a run without the series: not counted.
    result = compare([1e5] * 5 + [math.nan], [1e5] * 6, 0.99, CONFIG)
    assert result.baseline_runs == 5 and result.outcome is not Outcome.INCONCLUSIVE
    # A family of 40 needs p < 0.05/40 to be reachable: 5 runs per side cannot (1/252).
    result = compare([1e5] * 5, [2e5] * 5, 0.99, CONFIG, family_size=40)
    assert result.outcome is Outcome.INCONCLUSIVE and "at least 6" in result.reason


def _unchanged(
    rng: np.random.Generator, spread: float, runs: int, config: GateConfig = CONFIG
) -> Comparison:
    """A/A: both sides' per-run P99s lognormal around P99_NS with this sd of log."""
    sides = (P99_NS * np.exp(rng.normal(0, spread, runs)) for _ in range(2))
    return compare(*sides, 0.99, config)


def test_runs_to_pass_sizes_an_unchanged_build_to_pass_eight_times_in_ten() -> None:
    """Ground truth by simulation: lognormal per-run values, true ratio 1. An inconclusive A/A
    at 8 runs per side estimates the runs needed; at that many runs (fresh draws) an unchanged
    build must pass about PASS_POWER of the time, at half as many clearly less often."""
    rng = _rng(7)
    spread = 0.06  # sd of log per-run quantile: 5 % limit at 1.7 sigma per run
    estimates = []
    for _ in range(9):
        small = _unchanged(rng, spread, 8)
        assert small.outcome is not Outcome.REGRESSION
        estimates.append(small.runs_to_pass)
    needed = math.ceil(float(np.median(estimates)))
    assert 10 <= needed <= 40

    def pass_rate(runs: int, trials: int = 300) -> float:
        outcomes = [_unchanged(rng, spread, runs).outcome for _ in range(trials)]
        return outcomes.count(Outcome.PASS) / trials

    assert 0.68 <= pass_rate(needed) <= 0.92
    assert pass_rate(needed // 2) < 0.6


def test_inconclusive_says_how_many_runs_or_that_runs_cannot_help() -> None:
    rng = _rng(3)
    noisy = _unchanged(rng, 0.2, 12)
    assert noisy.outcome is Outcome.INCONCLUSIVE
    assert f"about {math.ceil(noisy.runs_to_pass)} runs per side" in noisy.reason
    at_one = GateConfig(min_effect=0.0, min_effect_ns=0.0)  # a limit of ratio 1: never shown below
    flat = _unchanged(rng, 0.2, 12, at_one)
    assert flat.outcome is Outcome.INCONCLUSIVE
    assert "more runs would not decide it" in flat.reason


def test_deterministic() -> None:
    rng = _rng(3)
    base, cand = rng.lognormal(12, 0.1, 10), rng.lognormal(12.05, 0.1, 10)
    assert compare(base, cand, 0.99, CONFIG) == compare(base, cand, 0.99, CONFIG)


@pytest.mark.parametrize(
    ("field", "value"),
    [("min_effect", math.nan), ("min_effect", math.inf), ("min_effect", -0.1),
     ("min_effect_ns", math.nan), ("min_effect_ns", math.inf), ("alpha", math.nan)],
)  # fmt: skip
def test_config_rejects_non_finite_effects(field: str, value: float) -> None:
    with pytest.raises(ValueError):
        GateConfig(**{field: value})


def _aa_or_ab(ratio: float, trials: int, runs: int, seed: int) -> dict[Outcome, int]:
    model = LatencyModel()
    candidate = model if ratio == 1.0 else model.with_tail_ratio(ratio)
    outcomes = dict.fromkeys(Outcome, 0)
    for trial in range(trials):
        rng = np.random.default_rng([seed, trial])
        base = simulate_runs(model, runs, rng, RunNoise())
        cand = simulate_runs(candidate, runs, rng, RunNoise())
        outcomes[gate_documents(base, cand).outcome] += 1
    return outcomes


def test_aa_false_fail_rate_at_most_nominal() -> None:
    trials = 200
    outcomes = _aa_or_ab(1.0, trials, runs=10, seed=11)
    margin = 3 * math.sqrt(ALPHA * (1 - ALPHA) / trials)
    assert outcomes[Outcome.REGRESSION] / trials <= ALPHA + margin
    assert outcomes[Outcome.PASS] > 0  # the gate can pass an A/A at all


def test_at_the_recommended_30_runs_aa_passes_and_ten_percent_is_caught() -> None:
    # docs/ci-gate.md recommends 30 runs per side; the goals are 8 in 10 for both (true
    # rates ~0.9 and ~0.85-0.9 in bench_gate_calibration; seeded like it, by the run count).
    trials = 100
    same = _aa_or_ab(1.0, trials, runs=RECOMMENDED_RUNS, seed=RECOMMENDED_RUNS)
    assert same[Outcome.PASS] / trials >= 0.8 and same[Outcome.REGRESSION] == 0
    worse = _aa_or_ab(1.10, trials, runs=RECOMMENDED_RUNS, seed=RECOMMENDED_RUNS)
    assert worse[Outcome.REGRESSION] / trials >= 0.8 and worse[Outcome.PASS] == 0


def test_ten_percent_improvement_passes() -> None:
    trials = 30
    outcomes = _aa_or_ab(0.90, trials, runs=15, seed=13)
    assert outcomes[Outcome.REGRESSION] == 0
    assert outcomes[Outcome.PASS] / trials >= 0.9


def _stage_runs(rng: np.random.Generator, runs: int, stages: int, decision_ratio: float = 1.0):
    """Runs holding ``stages`` independent stage series plus tick-to-trade."""
    model = LatencyModel()
    slow = model.with_tail_ratio(decision_ratio) if decision_ratio != 1.0 else model
    documents = []
    for n in range(runs):
        series = []
        for k in range(stages):
            stage_model = slow if k == 0 else model
            labels = {"probe": "replay", "stage": f"stage{k}"}
            series += simulate_runs(stage_model, 1, rng, RunNoise(), labels)[0].series
        series += simulate_runs(model, 1, rng, RunNoise())[0].series
        documents.append(HistDocument(n, n + 1, series))
    return documents


def test_holm_keeps_the_family_wise_false_fail_rate_with_many_series() -> None:
    # min effect 0: every comparison tests "ratio <= 1" at alpha; 10 series x 2 quantiles would
    # fail an A/A most of the time uncorrected (1 - 0.95^20 = 64 % if independent).
    config = GateConfig(min_effect=0.0, min_effect_ns=0.0)
    trials, false_fails, uncorrected = 60, 0, 0
    for trial in range(trials):
        rng = np.random.default_rng([21, trial])
        base, cand = _stage_runs(rng, 10, 10), _stage_runs(rng, 10, 10)
        result = gate_documents(base, cand, [{"probe": "replay"}], config)
        assert result.family_size == 22
        false_fails += result.outcome is Outcome.REGRESSION
        uncorrected += any(c.p_worse < ALPHA for c in result.comparisons)
    assert false_fails / trials <= ALPHA + 3 * math.sqrt(ALPHA * (1 - ALPHA) / trials)
    assert uncorrected / trials > 0.3  # the family really needs the correction


def test_default_gates_in_system_tick_to_trade_only_and_breaks_a_regression_down_by_stage() -> None:
    rng = _rng(5)
    base = _stage_runs(rng, 10, 3)
    cand = _stage_runs(rng, 10, 3)
    for document in cand:  # a 30 % tail regression of tick-to-trade only
        document.series[-1] = simulate_runs(
            LatencyModel().with_tail_ratio(1.3), 1, rng, RunNoise(noisy_run_prob=0.0)
        )[0].series[0]
    result = gate_documents(base, cand)
    assert {c.series for c in result.comparisons} == {tuple(sorted(DEFAULT_SERIES.items()))}
    assert [quantile_name(c.quantile) for c in result.comparisons] == ["p50", "p99"]
    assert result.outcome is Outcome.REGRESSION and result.family_size == 2
    (breakdown,) = result.breakdowns
    assert quantile_name(breakdown.quantile) == "p99"
    assert [s.stage for s in breakdown.stages] == ["stage0", "stage1", "stage2"]  # file order
    assert all(0.85 < s.ratio < 1.15 for s in breakdown.stages)  # the stages did not move


def _doc(labels: dict[str, str], values_ns: list[int]) -> HistDocument:
    return HistDocument(0, 1, [Series(labels, Histogram.from_samples(values_ns))])


def test_series_on_one_side_only_is_an_input_error() -> None:
    replay = dict(DEFAULT_SERIES)
    other = {"probe": "runqueue", "cgroup": "/x"}
    base = [_doc(replay, [50_000 + i] * 100) for i in range(6)]
    cand = [_doc(other, [50_000] * 100) for _ in range(6)]
    with pytest.raises(GateInputError, match="only in the baseline"):
        gate_documents(base, cand, config=CONFIG)
    with pytest.raises(GateInputError, match="only in the candidate"):
        gate_documents(base, cand, [parse_selector("cgroup=/x")], CONFIG)
    with pytest.raises(GateInputError, match="no series matches probe=nothing"):
        gate_documents(base, cand, [parse_selector("probe=nothing")], CONFIG)
    with pytest.raises(GateInputError, match="the default"):
        gate_documents(cand, cand, config=CONFIG)
    # Present on both sides but missing from some runs is fine: those runs are left out.
    mixed = [*base[:5], _doc(other, [1] * 10)]
    result = gate_documents(base, mixed, config=CONFIG)
    assert {c.candidate_runs for c in result.comparisons} == {5}


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
