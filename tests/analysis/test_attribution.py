"""Attribution on constructed data with known causes: the volume/rate split (exact identity,
property-tested), shares recovered within their bootstrap intervals (and the intervals' coverage
over many seeds), aggressor shares against numpy means, stack tests against scipy's binomtest."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import binomtest

from tailsight.analysis.attribution import (
    Windows,
    decompose_tail,
    displaced_by,
    kitagawa,
    rate_increase_p_value,
    stack_shifts,
)
from tailsight.hist import NUM_BUCKETS
from tailsight.intervals import Counter, HistDocument, label_key

FAST_BUCKET = 4  # (20, 25] µs
SLOW_BUCKET = 100  # (500, 505] µs
THRESHOLD = 50  # tail: above 255 µs
T = 60
CHANGE = 30
WINDOWS = Windows(0, CHANGE, T)


def _source(
    rng: np.random.Generator,
    volume: tuple[float, float],
    tail_rate: tuple[float, float],
) -> np.ndarray:
    """Dense counts: Poisson(volume) events per interval, Binomial(tail_rate) of them slow;
    (before, after) values switch at CHANGE."""
    rows = np.zeros((T, NUM_BUCKETS + 1), dtype=np.int64)
    for t in range(T):
        side = int(t >= CHANGE)
        events = int(rng.poisson(volume[side]))
        slow = int(rng.binomial(events, tail_rate[side]))
        rows[t, SLOW_BUCKET] = slow
        rows[t, FAST_BUCKET] = events - slow
    return rows


def _key(cgroup: str) -> tuple[tuple[str, str], ...]:
    return label_key({"probe": "netsyscall", "cgroup": cgroup})


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(0, 1e4), st.floats(0, 1), st.floats(0, 1e4), st.floats(0, 1), st.booleans()
        ),
        min_size=1,
        max_size=8,
    )
)
def test_volume_and_rate_terms_add_up_to_the_change(
    sources: list[tuple[float, float, float, float, bool]],
) -> None:
    vb = np.array([0.0 if gone else s[0] for *s, gone in sources])
    va = np.array([s[2] for s in sources])
    tb = vb * np.array([s[1] for s in sources])
    ta = va * np.array([s[3] for s in sources])
    volume, rate = kitagawa(tb, vb, ta, va)
    assert np.allclose(volume + rate, ta - tb, rtol=1e-9, atol=1e-6)
    # A source with no events before is pure volume: new traffic at its own rate.
    assert np.allclose(rate[vb == 0], 0.0)


def test_mix_shift_is_volume_not_rate() -> None:
    rng = np.random.default_rng(1)
    sources = {
        _key("/slow"): _source(rng, (10, 40), (1.0, 1.0)),  # always slow, 4x the calls
        _key("/fast"): _source(rng, (1000, 1000), (0.0, 0.0)),
    }
    d = decompose_tail(sources, THRESHOLD, WINDOWS, seed=3)
    assert d.excess == pytest.approx(30, abs=4)  # truth: 30 more slow calls per interval
    slow = d.sources[0]
    assert dict(slow.source)["cgroup"] == "/slow"
    assert slow.rate_effect == pytest.approx(0.0, abs=1e-9)
    assert slow.volume_effect == pytest.approx(d.excess)
    assert d.volume_share.contains(1.0) and d.rate_share.contains(0.0)
    assert d.volume_share.value > 0.99


def test_slower_source_is_rate_not_volume() -> None:
    rng = np.random.default_rng(2)
    sources = {
        _key("/slow"): _source(rng, (10, 10), (1.0, 1.0)),
        _key("/fast"): _source(rng, (1000, 1000), (0.01, 0.04)),  # same traffic, 4x the tail
    }
    d = decompose_tail(sources, THRESHOLD, WINDOWS, seed=3)
    top = d.sources[0]
    assert dict(top.source)["cgroup"] == "/fast"
    assert top.rate_share.contains(1.0) and top.volume_share.contains(0.0)
    assert d.rate_share.contains(1.0) and d.volume_share.contains(0.0)
    assert d.rate_share.value > 0.9
    assert abs(top.rate_effect - 30.0) < 4.0  # truth: 1000 * (0.04 - 0.01)


def _three(seed: int) -> dict[tuple[tuple[str, str], ...], np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        _key("/a"): _source(rng, (2000, 2000), (0.01, 0.04)),  # rate: +60 tail events
        _key("/b"): _source(rng, (5, 35), (1.0, 1.0)),  # volume: +30
        _key("/c"): _source(rng, (1000, 1000), (0.01, 0.02)),  # rate: +10
    }


TRUE_SHARES = {"/a": 0.6, "/b": 0.3, "/c": 0.1}


def test_known_shares_are_recovered_within_their_intervals() -> None:
    # One seed, 99 % intervals; calibration over many seeds is the next test's job.
    d = decompose_tail(_three(6), THRESHOLD, WINDOWS, seed=11, level=0.99)
    assert math.isclose(sum(s.share.value for s in d.sources), 1.0)
    by_cgroup = {dict(s.source)["cgroup"]: s for s in d.sources}
    assert [dict(s.source)["cgroup"] for s in d.sources] == ["/a", "/b", "/c"]
    for cgroup, truth in TRUE_SHARES.items():
        share = by_cgroup[cgroup].share
        assert share.contains(truth), (cgroup, share)
        assert abs(share.value - truth) < 0.1
    assert by_cgroup["/b"].volume_share.contains(0.3) and by_cgroup["/b"].rate_share.contains(0.0)
    assert by_cgroup["/a"].rate_share.contains(0.6) and by_cgroup["/a"].volume_share.contains(0.0)
    # Point terms add up to the observed change of total tail events per interval.
    assert sum(s.effect for s in d.sources) == pytest.approx(d.excess)
    # Seeded: the same inputs and seed give the same intervals.
    again = decompose_tail(_three(6), THRESHOLD, WINDOWS, seed=11, level=0.99)
    assert again.sources[0].share == d.sources[0].share


def test_share_intervals_cover_the_truth_at_about_their_level() -> None:
    covered = {cgroup: 0 for cgroup in TRUE_SHARES}
    runs = 40
    for seed in range(runs):
        d = decompose_tail(_three(100 + seed), THRESHOLD, WINDOWS, n_boot=200, seed=seed)
        for s in d.sources:
            cgroup = dict(s.source)["cgroup"]
            covered[cgroup] += s.share.contains(TRUE_SHARES[cgroup])
    # Nominal 95 %; a percentile bootstrap on 30 + 30 intervals runs a little narrow.
    assert all(hits >= 0.8 * runs for hits in covered.values()), covered


def _displacement_documents(seed: int) -> tuple[list[HistDocument], dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    means = {"/batch": (1e6, 4e6), "/web": (1e6, 2e6), "idle": (2e6, 2e6)}
    waits = {
        name: np.array([rng.gamma(10.0, (after if t >= CHANGE else before) / 10) for t in range(T)])
        for name, (before, after) in means.items()
    }
    documents = []
    for t in range(T):
        counters = []
        for name, row in waits.items():
            labels = {"probe": "runqueue", "victim": "/trading", "aggressor": name}
            counters.append(Counter("runqueue_displaced_wait_ns", labels, int(row[t])))
            counters.append(Counter("runqueue_displaced_switches", labels, 7))
        other = {"probe": "runqueue", "victim": "/else", "aggressor": "/batch"}
        counters.append(Counter("runqueue_displaced_wait_ns", other, 10**9))
        documents.append(HistDocument(t * 10**9, (t + 1) * 10**9, [], counters))
    return documents, {name: row.astype(np.int64).astype(float) for name, row in waits.items()}


def test_displaced_by_recovers_aggressor_shares() -> None:
    documents, waits = _displacement_documents(4)
    shown = displaced_by(documents, "/trading", WINDOWS, seed=2, level=0.99)
    assert shown is not None
    assert [a.aggressor for a in shown.aggressors] == ["/batch", "/web", "idle"]
    truth = {"/batch": 0.75, "/web": 0.25, "idle": 0.0}
    for a in shown.aggressors:
        row = waits[a.aggressor]
        assert a.wait_before_ns == pytest.approx(row[:CHANGE].mean())
        assert a.wait_after_ns == pytest.approx(row[CHANGE:].mean())
        assert a.switches_before == 7
        assert a.share.contains(truth[a.aggressor]), (a.aggressor, a.share)
    before_total = sum(row[:CHANGE].mean() for row in waits.values())
    batch = shown.aggressors[0]
    assert batch.share_of_wait_before == pytest.approx(
        waits["/batch"][:CHANGE].mean() / before_total
    )
    assert math.isclose(sum(a.share.value for a in shown.aggressors), 1.0)
    assert displaced_by(documents, "/nobody", WINDOWS) is None


def test_stack_shifts_rank_the_stack_that_became_frequent() -> None:
    rng = np.random.default_rng(9)
    documents = []
    for t in range(T):
        late = t >= CHANGE
        counters = []
        for name, rate, cgroup, probe in (
            ("grew", 8.0 if late else 1.0, "/trading", "runqueue"),
            ("steady", 4.0, "/trading", "runqueue"),
            ("elsewhere", 50.0 if late else 0.0, "/batch", "runqueue"),
            ("other-probe", 50.0 if late else 0.0, "/trading", "netsyscall"),
        ):
            labels = {"probe": probe, "cgroup": cgroup, "kernel_stack": name, "user_stack": "u"}
            value = int(rng.poisson(rate))
            counters.append(Counter(f"{probe}_outlier_events", labels, value))
        documents.append(HistDocument(t * 10**9, (t + 1) * 10**9, [], counters))
    shifts = stack_shifts(documents, WINDOWS, "runqueue", ["/trading"], seed=1)
    assert [s.kernel_stack for s in shifts] == ["grew", "steady"]
    grew, steady = shifts
    assert grew.discovered and not steady.discovered
    assert grew.share.contains(1.0) and steady.share.contains(0.0)
    for s in shifts:
        reference = binomtest(s.events_after, s.events_before + s.events_after, 0.5, "greater")
        assert s.p_value == pytest.approx(reference.pvalue, rel=1e-9)


def test_rate_increase_test_holds_its_level_under_no_change() -> None:
    rng = np.random.default_rng(0)
    before = rng.poisson(3.0 * 20, size=4000)
    after = rng.poisson(3.0 * 40, size=4000)
    p = np.array(
        [rate_increase_p_value(int(b), int(a), 20, 40) for b, a in zip(before, after, strict=True)]
    )
    assert (p < 0.05).mean() <= 0.06
    assert rate_increase_p_value(0, 0, 5, 5) == 1.0


def test_windows() -> None:
    w = Windows.around(10, 15, 30)
    assert (w.before_start, w.change, w.after_stop) == (0, 10, 15)
    w = Windows.around(50, 200, 30)
    assert (w.before_start, w.after_stop) == (20, 80)
    with pytest.raises(ValueError):
        Windows.around(0, 10, 5)
