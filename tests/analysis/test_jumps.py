"""Tail-jump detection on synthetic interval series whose change point and true quantiles come
from the generator; false-alarm and FDR rates against their nominal levels over many seeds."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import binom

from tailsight.analysis.jumps import (
    JumpConfig,
    OnlineJumpDetector,
    TailThreshold,
    benjamini_hochberg,
    binomial_llr,
    detect_documents,
    detect_offline,
    homogeneity_test,
    monitor,
    monitor_documents,
)
from tailsight.analysis.quantiles import histogram_from_dense
from tailsight.hist import NUM_BUCKETS
from tailsight.intervals import HistDocument, Series
from tailsight.testing.eval import IntervalNoise, LatencyModel, fdr_calibration, simulate_intervals

MODEL = LatencyModel()
CHANGE = 60


def _changed(seed: int, ratio: float = 1.5, q: float = 0.99, intervals: int = 120) -> np.ndarray:
    rng = np.random.default_rng([21, seed])
    return simulate_intervals(MODEL, intervals, rng, MODEL.with_tail_ratio(ratio, q=q), CHANGE)


def test_binomial_llr_matches_scipy_log_pmf() -> None:
    x, n, p0, p1 = np.array([0, 3, 17]), np.array([100, 400, 900]), 0.01, 0.015
    expected = binom.logpmf(x, n, p1) - binom.logpmf(x, n, p0)
    assert binomial_llr(x, n, p0, p1) == pytest.approx(expected, rel=1e-9)


def test_tail_threshold_counts_events_above_the_reference_quantile() -> None:
    rng = np.random.default_rng(3)
    counts = MODEL.sample_counts(rng, 200_000)
    threshold = TailThreshold.from_counts(counts, 0.99)
    assert threshold is not None
    # Ground truth with plain numpy: events in buckets after the edge, overflow included.
    above = int(counts[threshold.edge_index + 1 :].sum())
    assert threshold.rate == pytest.approx(above / counts.sum())
    assert threshold.rate == pytest.approx(0.01, rel=0.25)
    assert threshold.upper_bound_ns == pytest.approx(MODEL.quantile(0.99), abs=5_000)


@pytest.mark.parametrize("seed", range(4))
def test_online_detector_finds_the_jump_and_its_quantiles(seed: int) -> None:
    counts = _changed(seed)
    jumps = monitor(counts, JumpConfig())
    assert jumps, "no alarm"
    jump = jumps[0]
    assert jump.direction == "up"
    assert CHANGE <= jump.alarm_index <= CHANGE + 3
    assert abs(jump.change_index - CHANGE) <= 2
    assert jump.before_ns == pytest.approx(MODEL.quantile(0.99), rel=0.05)
    true_after = MODEL.with_tail_ratio(1.5).quantile(0.99)
    # At the alarm only the few intervals since the change are known: a loose bound.
    assert jump.after_ns == pytest.approx(true_after, rel=0.25)
    assert jump.settled_after_ns == pytest.approx(true_after, rel=0.05)
    assert jump.confirmed and jump.confirm_p_value < 0.01


@pytest.mark.parametrize("seed", range(3))
def test_offline_detection_dates_the_jump_and_measures_both_sides(seed: int) -> None:
    result = detect_offline(_changed(seed, ratio=1.2))
    assert result.p_value < 1e-6
    assert result.change_index is not None and abs(result.change_index - CHANGE) <= 2
    assert result.direction == "up"
    assert result.before_ns == pytest.approx(MODEL.quantile(0.99), rel=0.05)
    assert result.after_ns == pytest.approx(MODEL.with_tail_ratio(1.2).quantile(0.99), rel=0.05)
    assert result.confirmed


@pytest.mark.parametrize("seed", range(3))
def test_offline_detection_sees_a_tail_jump_that_comes_with_fewer_events(seed: int) -> None:
    # A starved process: 8x fewer wake-ups, each waiting 30x longer, burstier than before. The
    # pooled threshold then sits in the after side's far tail, where a dispersion standardized by
    # the pooled rate came out ~25 and the p-value ~1e-5 (the demo's x860 jump at p=0.04).
    rng = np.random.default_rng([25, seed])
    quiet = IntervalNoise(scale_sigma=0.05, events_per_interval=400)
    starved = IntervalNoise(scale_sigma=0.3, events_per_interval=50)
    counts = np.concatenate(
        [
            simulate_intervals(MODEL, 40, rng, noise=quiet),
            simulate_intervals(MODEL.scaled(30.0), 40, rng, noise=starved),
        ]
    )
    result = detect_offline(counts)
    assert result.p_value < 1e-12
    assert result.change_index == 40 and result.direction == "up" and result.confirmed


@pytest.mark.parametrize("seed", range(3))
def test_homogeneity_test_confirms_a_tail_shift_under_a_large_dispersion(seed: int) -> None:
    # P99 x5 on 20,000 / 8,000 events, burstier than binomial (dispersion 10): over one cell per
    # populated 5 µs bucket (~100 cells) the divided statistic gave p > 0.5; at fixed pooled
    # quantiles the tail shift is a few cells' worth and stays visible.
    rng = np.random.default_rng([26, seed])
    before = MODEL.sample_counts(rng, 20_000)
    after = MODEL.with_tail_ratio(5.0).sample_counts(rng, 8_000)
    assert homogeneity_test(before, after, dispersion=10.0) < 0.01


def test_homogeneity_test_rejects_at_most_nominal_under_no_change() -> None:
    trials, level = 300, 0.05
    rejected = 0
    for seed in range(trials):
        rng = np.random.default_rng([27, seed])
        before, after = MODEL.sample_counts(rng, 5_000), MODEL.sample_counts(rng, 2_000)
        rejected += homogeneity_test(before, after) < level
    assert rejected / trials <= level + 3 * math.sqrt(level * (1 - level) / trials)


def test_series_in_one_bucket_has_no_tail_to_test() -> None:
    counts = np.zeros((5, NUM_BUCKETS + 1), dtype=np.int64)
    counts[:, 7] = 30  # every event in one bucket: no edge leaves some but not all above it
    assert TailThreshold.from_counts(counts.sum(axis=0), 0.999) is None
    assert detect_offline(counts, JumpConfig(quantile=0.999)).change_index is None


def test_p999_detector_sees_a_p999_jump() -> None:
    counts = _changed(0, ratio=1.5, q=0.999, intervals=200)
    config = JumpConfig(quantile=0.999)
    jumps = monitor(counts, config)
    assert jumps and CHANGE <= jumps[0].alarm_index <= CHANGE + 10
    assert jumps[0].before_ns == pytest.approx(MODEL.quantile(0.999), rel=0.1)


def test_downward_jump_is_reported_as_down() -> None:
    rng = np.random.default_rng(5)
    counts = simulate_intervals(MODEL, 120, rng, MODEL.with_tail_ratio(0.7), CHANGE)
    jumps = monitor(counts, JumpConfig())
    assert jumps and jumps[0].direction == "down" and jumps[0].alarm_index >= CHANGE
    assert monitor(counts, JumpConfig(two_sided=False)) == []


def test_online_false_alarm_rate_on_stationary_series_is_at_most_nominal() -> None:
    config = JumpConfig()
    series, intervals = 30, 200
    alarms = monitored = 0
    for seed in range(series):
        rng = np.random.default_rng([22, seed])
        # Overdispersed on purpose: every interval's latencies are scaled by ~5 %.
        counts = simulate_intervals(MODEL, intervals, rng, noise=IntervalNoise(scale_sigma=0.05))
        alarms += len(monitor(counts, config))
        monitored += intervals - config.reference_intervals
    expected = config.false_alarm_rate * monitored
    assert alarms <= expected + 3 * math.sqrt(expected)


def test_offline_p_values_on_stationary_series_reject_at_most_nominal() -> None:
    trials, level = 120, 0.05
    rejected = 0
    for seed in range(trials):
        rng = np.random.default_rng([23, seed])
        counts = simulate_intervals(MODEL, 40, rng, noise=IntervalNoise(scale_sigma=0.06))
        rejected += detect_offline(counts).p_value < level
    assert rejected / trials <= level + 3 * math.sqrt(level * (1 - level) / trials)


def test_body_only_change_does_not_fire_the_tail_detectors() -> None:
    (body_w, _, body_sigma), tail = MODEL.components
    slower_body = replace(MODEL, components=((body_w, 52_000.0, body_sigma), tail))
    assert slower_body.quantile(0.5) > 1.25 * MODEL.quantile(0.5)
    assert slower_body.quantile(0.99) == pytest.approx(MODEL.quantile(0.99), rel=0.005)
    for seed in range(3):
        rng = np.random.default_rng([24, seed])
        counts = simulate_intervals(MODEL, 120, rng, slower_body, CHANGE)
        for q in (0.99, 0.999):
            assert monitor(counts, JumpConfig(quantile=q)) == []
            assert detect_offline(counts, JumpConfig(quantile=q)).p_value > 0.01
        # Positive control: the same data does move the median.
        body_jumps = monitor(counts, JumpConfig(quantile=0.5))
        assert body_jumps and body_jumps[0].alarm_index >= CHANGE


def _bh_reference(p_values: list[float], level: float) -> set[int]:
    """Textbook BH: reject the k smallest, k the largest with p_(k) <= k * level / m."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    k = 0
    for rank, i in enumerate(order, start=1):
        if p_values[i] <= rank * level / m:
            k = rank
    return set(order[:k])


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(0.0, 1.0), min_size=0, max_size=40),
    st.sampled_from([0.01, 0.05, 0.2]),
)
def test_benjamini_hochberg_matches_textbook(p_values: list[float], level: float) -> None:
    found = benjamini_hochberg(p_values, level)
    assert set(np.flatnonzero(found).tolist()) == _bh_reference(p_values, level)


def test_benjamini_hochberg_controls_fdr_over_seeds() -> None:
    level, m, m1 = 0.1, 200, 20
    fdps = []
    for seed in range(300):
        rng = np.random.default_rng([25, seed])
        p = np.concatenate([rng.beta(0.05, 1.0, m1), rng.uniform(size=m - m1)])
        found = benjamini_hochberg(p, level)
        false = int(found[m1:].sum())
        fdps.append(false / max(1, int(found.sum())))
    # E[FDP] = level * m0 / m for independent p-values; its standard error over 300 seeds is small.
    assert float(np.mean(fdps)) <= level * (m - m1) / m + 0.03


def test_offline_detection_with_bh_controls_fdr_end_to_end() -> None:
    result = fdr_calibration(trials=6, series=25, changed=5, intervals=40, ratio=1.3, seed=26)
    assert result.fdr <= result.level + 0.05
    assert result.power >= 0.8


def _documents(rows_by_labels: dict[tuple[str, str], np.ndarray]) -> list[HistDocument]:
    intervals = next(iter(rows_by_labels.values())).shape[0]
    docs = []
    for t in range(intervals):
        series = [
            Series({"probe": probe, "cgroup": cgroup}, histogram_from_dense(rows[t]))
            for (probe, cgroup), rows in rows_by_labels.items()
        ]
        docs.append(HistDocument(t * 10**9, (t + 1) * 10**9, series))
    return docs


def test_documents_interface_finds_the_changed_series_only() -> None:
    rng = np.random.default_rng(27)
    quiet = simulate_intervals(MODEL, 100, rng)
    docs = _documents({("runqueue", "/a"): _changed(1, intervals=100), ("runqueue", "/b"): quiet})
    jumps = monitor_documents(docs, {"probe": "runqueue"}, quantiles=(0.99,))
    assert {dict(j.series)["cgroup"] for j in jumps} == {"/a"}
    assert jumps[0].change_start_ns == jumps[0].change_index * 10**9
    offline = detect_documents(docs, {"probe": "runqueue"}, quantiles=(0.99,))
    assert {dict(r.series)["cgroup"] for r in offline if r.discovered} == {"/a"}


def test_detector_rejects_wrong_shapes_and_waits_for_a_reference() -> None:
    detector = OnlineJumpDetector(JumpConfig(reference_intervals=5))
    with pytest.raises(ValueError):
        detector.update(np.zeros(NUM_BUCKETS))
    for _ in range(10):  # empty intervals: no tail events, no reference, no alarms
        assert detector.update(np.zeros(NUM_BUCKETS + 1, dtype=np.int64)) is None
    assert not detector.monitoring
