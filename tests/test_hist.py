"""The histogram model against independent ground truth: bounds written out from the spec, numpy
sample quantiles, naive per-sample counting and a literal port of Prometheus' quantile rule."""

from __future__ import annotations

import bisect
import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tailsight.hist import (
    BUCKET_WIDTH_NS,
    LINEAR_BUCKETS,
    NUM_BUCKETS,
    TAIL_BUCKETS,
    Histogram,
    SparseHistogram,
    bucket_index,
    bucket_indices,
    bucket_upper_bounds_ns,
    nonzero_index,
)

# The layout written out from the brief, independently of the module under test.
SPEC_BOUNDS_NS = [5_000 * (i + 1) for i in range(2048)] + [10_240_000 * 2**k for k in range(1, 11)]
LINEAR_MAX_NS = 10_240_000
FINITE_MAX_NS = 10_485_760_000

# The machine is shared and small: per-example timing is not a property under test.
relaxed = settings(deadline=None)


def spec_index(value_ns: int) -> int:
    """Naive ceiling rule: first bucket with upper bound >= value; len(bounds) means overflow."""
    return bisect.bisect_left(SPEC_BOUNDS_NS, value_ns)


def prometheus_histogram_quantile(q: float, le_buckets: list[tuple[float, float]]) -> float:
    """Port of Prometheus' bucketQuantile (promql/quantile.go) from its documented algorithm.

    ``le_buckets`` are (upper bound, cumulative count) pairs ending with (+Inf, total).
    """
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    buckets = sorted(le_buckets)
    if not math.isinf(buckets[-1][0]):
        return math.nan
    if len(buckets) < 2:
        return math.nan
    observations = buckets[-1][1]
    if observations == 0:
        return math.nan
    rank = q * observations
    # sort.Search(len(buckets)-1, count >= rank): the +Inf bucket itself is not searched.
    b = next((i for i in range(len(buckets) - 1) if buckets[i][1] >= rank), len(buckets) - 1)
    if b == len(buckets) - 1:
        return buckets[-2][0]
    if b == 0 and buckets[0][0] <= 0:
        return buckets[0][0]
    bucket_start = 0.0
    bucket_end = buckets[b][0]
    count = buckets[b][1]
    if b > 0:
        bucket_start = buckets[b - 1][0]
        count -= buckets[b - 1][1]
        rank -= buckets[b - 1][1]
    return bucket_start + (bucket_end - bucket_start) * (rank / count)


def le_buckets_of(hist: Histogram) -> list[tuple[float, float]]:
    """Classic Prometheus buckets built by hand from the raw counts (not via hist.cumulative)."""
    out: list[tuple[float, float]] = []
    running = 0
    for bound, count in zip(SPEC_BOUNDS_NS, hist.counts.tolist(), strict=True):
        running += count
        out.append((float(bound), float(running)))
    out.append((math.inf, float(running + hist.overflow)))
    return out


linear_samples = st.lists(st.integers(0, LINEAR_MAX_NS), min_size=1, max_size=300)
any_samples = st.lists(
    st.one_of(
        st.integers(0, 50_000),
        st.integers(0, LINEAR_MAX_NS),
        st.integers(0, 2 * FINITE_MAX_NS),
        st.sampled_from([0, 5_000, 5_001, LINEAR_MAX_NS, LINEAR_MAX_NS + 1, FINITE_MAX_NS]),
    ),
    max_size=300,
)
quantile_q = st.floats(0.0, 1.0, allow_nan=False)


@st.composite
def histograms(draw: st.DrawFn) -> Histogram:
    buckets = draw(
        st.dictionaries(st.integers(0, NUM_BUCKETS - 1), st.integers(0, 1_000_000), max_size=40)
    )
    overflow = draw(st.integers(0, 1_000))
    sum_ns = draw(st.integers(0, 2**70))
    return Histogram.from_sparse(buckets.items(), overflow=overflow, sum_ns=sum_ns)


# -- layout -----------------------------------------------------------------------------------


def test_layout_matches_spec() -> None:
    bounds = bucket_upper_bounds_ns()
    assert (LINEAR_BUCKETS, TAIL_BUCKETS, NUM_BUCKETS, BUCKET_WIDTH_NS) == (2048, 10, 2058, 5000)
    assert bounds.tolist() == SPEC_BOUNDS_NS
    assert bounds[2047] == LINEAR_MAX_NS and bounds[-1] == FINITE_MAX_NS
    assert all(b % 5_000 == 0 for b in SPEC_BOUNDS_NS)
    with pytest.raises(ValueError):
        bounds[0] = 1  # the cached array is shared: it must be read-only


@pytest.mark.parametrize(
    ("value_ns", "index"),
    [
        (0, 0),
        (1, 0),
        (4_999, 0),
        (5_000, 0),
        (5_001, 1),
        (10_000, 1),
        (10_001, 2),
        (10_240_000, 2047),
        (10_240_001, 2048),
        (20_480_000, 2048),
        (20_480_001, 2049),
        (10_485_760_000, 2057),
        (10_485_760_001, NUM_BUCKETS),
        (2**63 - 1, NUM_BUCKETS),
    ],
)
def test_ceiling_semantics_at_edges(value_ns: int, index: int) -> None:
    assert bucket_index(value_ns) == index
    assert bucket_indices(np.array([value_ns], dtype=np.int64)).tolist() == [index]


def test_kernel_formula_for_linear_part() -> None:
    """The C expression hist.bpf.h uses, evaluated for every linear edge and its neighbours."""
    values = np.array([e + d for e in range(0, LINEAR_MAX_NS + 1, 5_000) for d in (-1, 0, 1)])
    values = values[(values >= 0) & (values <= LINEAR_MAX_NS)]
    kernel = np.where(values == 0, 0, (values - 1) // 5_000)
    assert np.array_equal(bucket_indices(values), kernel)


@relaxed
@given(st.integers(0, 4 * FINITE_MAX_NS))
def test_bucket_index_matches_naive_rule(value_ns: int) -> None:
    expected = spec_index(value_ns)
    assert bucket_index(value_ns) == expected
    assert int(bucket_indices([value_ns])[0]) == expected


def test_bucket_indices_uint64_and_shapes() -> None:
    big = np.array([0, 5_001, 2**64 - 1], dtype=np.uint64)
    assert bucket_indices(big).tolist() == [0, 1, NUM_BUCKETS]
    assert bucket_indices([]).tolist() == []


def test_rejects_negative_and_non_integer_values() -> None:
    with pytest.raises(ValueError, match="negative"):
        bucket_index(-1)
    with pytest.raises(ValueError, match="negative"):
        bucket_indices([5, -3])
    with pytest.raises(ValueError, match="negative"):
        Histogram.from_samples([1, -1])
    with pytest.raises(TypeError):
        bucket_index(1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Histogram.from_samples([1.0, 2.0])
    with pytest.raises(TypeError):
        bucket_index(True)


# -- construction -----------------------------------------------------------------------------


@relaxed
@given(any_samples)
def test_from_samples_counts_and_sum_are_exact(samples: list[int]) -> None:
    hist = Histogram.from_samples(np.array(samples, dtype=np.int64))
    expected = [0] * (NUM_BUCKETS + 1)
    for value in samples:
        expected[spec_index(value)] += 1
    assert hist.counts.tolist() == expected[:NUM_BUCKETS]
    assert hist.overflow == expected[NUM_BUCKETS]
    assert hist.count == len(samples)
    assert hist.sum_ns == sum(samples)


def test_sum_does_not_wrap_int64() -> None:
    samples = np.full(10, 2**62, dtype=np.int64)
    assert Histogram.from_samples(samples).sum_ns == 10 * 2**62
    assert Histogram.from_samples(np.full(3, 2**64 - 1, dtype=np.uint64)).sum_ns == 3 * (2**64 - 1)


@relaxed
@given(any_samples)
def test_record_agrees_with_from_samples(samples: list[int]) -> None:
    hist = Histogram.empty()
    for value in samples:
        hist.record(value)
    assert hist == Histogram.from_samples(samples)


def test_record_with_multiplicity_and_add_bucket() -> None:
    hist = Histogram.empty()
    hist.record(7_000, n=3)
    hist.record(FINITE_MAX_NS + 1)
    hist.add_bucket(2, 4)
    hist.add_bucket(NUM_BUCKETS, 2)  # the kernel reports overflow as index NUM_BUCKETS
    assert hist.sparse_buckets() == [(1, 3), (2, 4)]
    assert hist.overflow == 3
    assert hist.sum_ns == 3 * 7_000 + FINITE_MAX_NS + 1  # add_bucket leaves sum_ns to the caller
    with pytest.raises(ValueError):
        hist.add_bucket(NUM_BUCKETS + 1, 1)
    with pytest.raises(ValueError):
        hist.add_bucket(-1, 1)
    with pytest.raises(ValueError):
        hist.record(5, n=-1)


def test_from_sparse_validation() -> None:
    hist = Histogram.from_sparse([(0, 2), (2057, 1)], overflow=4, sum_ns=9)
    assert (hist.count, hist.overflow, hist.sum_ns) == (7, 4, 9)
    with pytest.raises(ValueError, match="outside"):
        Histogram.from_sparse([(NUM_BUCKETS, 1)], overflow=0, sum_ns=0)
    with pytest.raises(ValueError, match="outside"):
        Histogram.from_sparse([(-1, 1)], overflow=0, sum_ns=0)
    with pytest.raises(ValueError, match="duplicate"):
        Histogram.from_sparse([(3, 1), (3, 1)], overflow=0, sum_ns=0)
    with pytest.raises(ValueError):
        Histogram.from_sparse([(3, -1)], overflow=0, sum_ns=0)
    with pytest.raises(ValueError):
        Histogram.from_sparse([], overflow=-1, sum_ns=0)


def test_constructor_validation() -> None:
    with pytest.raises(ValueError, match="shape"):
        Histogram(np.zeros(10, dtype=np.int64))
    with pytest.raises(ValueError, match="negative"):
        Histogram(np.full(NUM_BUCKETS, -1, dtype=np.int64))
    with pytest.raises(ValueError, match="integers"):
        Histogram(np.zeros(NUM_BUCKETS))  # type: ignore[arg-type]


@relaxed
@given(histograms())
def test_sparse_round_trip(hist: Histogram) -> None:
    back = Histogram.from_sparse(hist.sparse_buckets(), overflow=hist.overflow, sum_ns=hist.sum_ns)
    assert back == hist
    indices = [i for i, _ in hist.sparse_buckets()]
    assert indices == sorted(set(indices))
    assert all(c > 0 for _, c in hist.sparse_buckets())


@given(histograms(), histograms())
def test_sparse_histogram_keeps_exactly_the_nonzero_buckets(hist: Histogram, g: Histogram) -> None:
    sparse = SparseHistogram.of(hist)
    naive = [(i, int(n)) for i, n in enumerate(hist.counts.tolist()) if n]
    assert list(zip(sparse.index.tolist(), sparse.count.tolist(), strict=True)) == naive
    assert sparse.total == hist.count
    assert sparse.dense() == hist
    total = g.copy()
    sparse.add_to(total)
    assert total == g.merge(hist)
    sparse.subtract_from(total)
    assert total == g


@given(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=NUM_BUCKETS))
def test_nonzero_index_matches_a_naive_scan(row: list[int]) -> None:
    index = nonzero_index(np.array(row, dtype=np.int64))
    assert index.tolist() == [i for i, count in enumerate(row) if count != 0]


# -- arithmetic -------------------------------------------------------------------------------


@relaxed
@given(histograms(), histograms())
def test_merge_then_delta_is_identity(h: Histogram, g: Histogram) -> None:
    assert h.merge(g).delta(g) == h
    assert (h + g) - h == g
    assert (h + g).count == h.count + g.count


@relaxed
@given(histograms(), histograms(), histograms())
def test_merge_commutative_and_associative(a: Histogram, b: Histogram, c: Histogram) -> None:
    assert a + b == b + a
    assert (a + b) + c == a + (b + c)
    assert a + Histogram.empty() == a


@relaxed
@given(any_samples, any_samples)
def test_merge_equals_histogram_of_concatenation(xs: list[int], ys: list[int]) -> None:
    assert Histogram.from_samples(xs) + Histogram.from_samples(ys) == Histogram.from_samples(
        xs + ys
    )


@relaxed
@given(any_samples, any_samples)
def test_add_in_place_equals_histogram_of_concatenation(xs: list[int], ys: list[int]) -> None:
    total = Histogram.from_samples(xs)
    addend = Histogram.from_samples(ys)
    total.add(addend)
    assert total == Histogram.from_samples(xs + ys)
    assert addend == Histogram.from_samples(ys)


@relaxed
@given(histograms(), histograms())
def test_sparse_delta_matches_a_naive_scan(h: Histogram, g: Histogram) -> None:
    sparse = h.merge(g).sparse_delta(g)
    assert sparse.dense() == h
    naive = [(i, int(n)) for i, n in enumerate(h.counts.tolist()) if n]
    assert list(zip(sparse.index.tolist(), sparse.count.tolist(), strict=True)) == naive
    assert (sparse.overflow, sparse.sum_ns) == (h.overflow, h.sum_ns)


def test_delta_rejects_counter_reset() -> None:
    earlier = Histogram.from_samples([1, 6_000, 6_000])
    later = Histogram.from_samples([1, 6_000, 20_000])  # bucket 1 went from 2 to 1
    with pytest.raises(ValueError, match="bucket 1"):
        later.delta(earlier)
    # The bucket named is the one that went down, not the first that changed.
    grown = Histogram.from_samples([1, 1, 6_000, 20_000])
    with pytest.raises(ValueError, match=r"bucket 1 went down \(2 -> 1\)"):
        grown.delta(earlier)
    with pytest.raises(ValueError, match="overflow"):
        Histogram.empty().delta(Histogram.from_sparse([], overflow=1, sum_ns=0))
    with pytest.raises(ValueError, match="sum_ns"):
        Histogram.from_sparse([(0, 1)], 0, 1).delta(Histogram.from_sparse([(0, 1)], 0, 2))


def test_merge_does_not_alias_inputs() -> None:
    a = Histogram.from_samples([1])
    b = a + Histogram.empty()
    b.record(1)
    assert a.count == 1 and b.count == 2
    c = a.copy()
    c.record(1)
    assert a.count == 1


def test_equality_is_value_based() -> None:
    assert Histogram.from_samples([5, 6]) == Histogram.from_samples([6, 5])
    assert Histogram.from_samples([5, 6]) != Histogram.from_samples([5, 7])  # sum differs
    assert Histogram.from_samples([5]) != Histogram.from_samples([5_001])
    assert Histogram.empty() != "histogram"


# -- quantiles --------------------------------------------------------------------------------


@settings(relaxed, max_examples=300)
@given(linear_samples, quantile_q)
def test_quantile_within_one_bucket_of_numpy(samples: list[int], q: float) -> None:
    """numpy's "inverted_cdf" returns the order statistic of rank ceil(q*n) (x_1 for q=0): the
    same rank the histogram rule looks up, so both lie in one 5 µs bucket."""
    hist = Histogram.from_samples(samples)
    exact = float(np.quantile(np.array(samples), q, method="inverted_cdf"))
    assert abs(hist.quantile(q) - exact) <= BUCKET_WIDTH_NS * (1 + 1e-9)


@relaxed
@given(histograms(), st.lists(quantile_q, min_size=1, max_size=5))
def test_quantile_matches_prometheus(hist: Histogram, qs: list[float]) -> None:
    ours = hist.quantiles(qs)
    reference = le_buckets_of(hist)
    for q, value in zip(qs, ours, strict=True):
        if hist.count == 0:
            assert math.isnan(value)
            continue
        if q == 0.0 and hist.counts[0] == 0:
            continue  # Prometheus computes 0/0 here; covered by test_quantile_zero_rank
        assert value == pytest.approx(prometheus_histogram_quantile(q, reference), rel=1e-12)


@relaxed
@given(histograms())
def test_quantile_zero_rank(hist: Histogram) -> None:
    """Rank 0 -> the lower bound of the first non-empty bucket (where the minimum lies)."""
    if hist.count == 0:
        return
    nonzero = np.flatnonzero(hist.counts)
    if nonzero.size == 0:
        assert hist.quantile(0.0) == FINITE_MAX_NS
    else:
        first = int(nonzero[0])
        assert hist.quantile(0.0) == (0 if first == 0 else SPEC_BOUNDS_NS[first - 1])


@relaxed
@given(histograms(), st.lists(quantile_q, min_size=2, max_size=8))
def test_quantiles_monotone(hist: Histogram, qs: list[float]) -> None:
    if hist.count == 0:
        return
    values = hist.quantiles(sorted(qs))
    assert all(a <= b for a, b in itertools.pairwise(values))
    assert values == [hist.quantile(q) for q in sorted(qs)]


def test_quantile_hand_computed() -> None:
    hist = Histogram.from_sparse([(0, 12), (1, 5), (3, 2), (2049, 1)], overflow=0, sum_ns=1)
    assert hist.quantile(0.5) == pytest.approx(5_000 * 10 / 12)
    assert hist.quantile(0.9) == 17_500.0
    assert hist.quantile(0.99) == pytest.approx(20_480_000 * 1.8)
    assert hist.quantile(1.0) == 40_960_000.0
    with_overflow = Histogram.from_sparse([(0, 1)], overflow=1, sum_ns=1)
    assert with_overflow.quantile(0.99) == FINITE_MAX_NS  # rank in +Inf -> highest finite bound


def test_quantile_edge_cases() -> None:
    assert math.isnan(Histogram.empty().quantile(0.5))
    assert math.isnan(Histogram.empty().mean_ns())
    hist = Histogram.from_samples([10])
    for bad in (-0.01, 1.01, math.nan, math.inf):
        with pytest.raises(ValueError):
            hist.quantile(bad)


@relaxed
@given(any_samples)
def test_mean_is_exact(samples: list[int]) -> None:
    hist = Histogram.from_samples(samples)
    if samples:
        assert hist.mean_ns() == sum(samples) / len(samples)


# -- re-bucketing -----------------------------------------------------------------------------


@relaxed
@given(any_samples, st.sets(st.sampled_from(SPEC_BOUNDS_NS), max_size=12))
def test_rebucket_exact_against_per_sample_count(samples: list[int], chosen: set[int]) -> None:
    bounds = sorted(chosen)
    hist = Histogram.from_samples(samples)
    # Per sample: index of the first coarse bound >= value, len(bounds) when above all of them.
    positions = np.searchsorted(np.array(bounds, dtype=np.int64), samples, side="left")
    expected = np.bincount(positions, minlength=len(bounds) + 1)
    assert hist.rebucket(bounds).tolist() == expected.tolist()
    assert hist.cumulative(bounds).tolist() == np.cumsum(expected).tolist()
    assert int(hist.rebucket(bounds).sum()) == hist.count


def test_rebucket_prometheus_style_bounds() -> None:
    samples = [0, 5_000, 5_001, 100_000, 100_001, 1_000_000, 10_240_001, FINITE_MAX_NS + 7]
    hist = Histogram.from_samples(samples)
    assert hist.rebucket([5_000, 100_000, 1_000_000]).tolist() == [2, 2, 2, 2]
    assert hist.cumulative([5_000, 100_000, 1_000_000]).tolist() == [2, 4, 6, 8]
    assert hist.rebucket([]).tolist() == [8]


@pytest.mark.parametrize(
    "bounds",
    [
        [5_001],
        [0],
        [10_245_000],
        [15_000_000],
        [FINITE_MAX_NS * 2],
        [10_000, 5_000],
        [5_000, 5_000],
    ],
)
def test_rebucket_rejects_inexact_bounds(bounds: list[int]) -> None:
    with pytest.raises(ValueError):
        Histogram.from_samples([1, 2, 3]).rebucket(bounds)
