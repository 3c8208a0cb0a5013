"""The one latency histogram model: 5 µs linear buckets with ceiling semantics, a power-of-two tail
and an explicit overflow, with exact merge, delta, re-bucketing and Prometheus-style quantiles.

Bucket ``i`` holds values in ``(lower_i, upper_i]`` so every ``le`` is a true upper bound; 0 ns goes
to bucket 0. The kernel side (``probes/include/hist.bpf.h``) computes the same index.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Final

import numpy as np
import numpy.typing as npt

BUCKET_WIDTH_NS: Final = 5_000
LINEAR_BUCKETS: Final = 2048
TAIL_BUCKETS: Final = 10
NUM_BUCKETS: Final = LINEAR_BUCKETS + TAIL_BUCKETS
"""Finite buckets; index ``NUM_BUCKETS`` denotes overflow (+Inf)."""

LINEAR_LIMIT_NS: Final = BUCKET_WIDTH_NS * LINEAR_BUCKETS
"""Upper bound of the last linear bucket (10.24 ms)."""
MAX_FINITE_NS: Final = LINEAR_LIMIT_NS << TAIL_BUCKETS
"""Upper bound of the last finite bucket (10.48576 s); anything above is overflow."""
OVERFLOW_INDEX: Final = NUM_BUCKETS

_INT64_MAX: Final = int(np.iinfo(np.int64).max)


@cache
def _upper_bounds() -> npt.NDArray[np.int64]:
    linear = np.arange(1, LINEAR_BUCKETS + 1, dtype=np.int64) * BUCKET_WIDTH_NS
    tail = LINEAR_LIMIT_NS * (np.int64(2) ** np.arange(1, TAIL_BUCKETS + 1, dtype=np.int64))
    bounds = np.concatenate([linear, tail])
    bounds.flags.writeable = False
    return bounds


def bucket_upper_bounds_ns() -> npt.NDArray[np.int64]:
    """Inclusive upper bound of every finite bucket, in ns (cached, read-only)."""
    return _upper_bounds()


def bucket_lower_bounds_ns() -> npt.NDArray[np.int64]:
    """Exclusive lower bound of every finite bucket, in ns (bucket 0 starts at 0, inclusive)."""
    return np.concatenate([np.zeros(1, dtype=np.int64), _upper_bounds()[:-1]])


def nonzero_index(counts: npt.NDArray[np.integer]) -> npt.NDArray[np.intp]:
    """Indices of the non-zero entries of a row of counts, ascending. Taken through a bool row:
    numpy's ``nonzero`` on int64 is ~4x slower (3.9 vs 1.0 µs per 2,059-bucket row here), and
    the collector takes it for every series every interval."""
    return counts.astype(bool).nonzero()[0]


def bucket_index(value_ns: int) -> int:
    """Index of the bucket holding ``value_ns``; ``NUM_BUCKETS`` for overflow."""
    value_ns = _as_int("value_ns", value_ns)
    if value_ns < 0:
        raise ValueError(f"negative latency {value_ns} ns")
    if value_ns <= LINEAR_LIMIT_NS:
        return 0 if value_ns == 0 else (value_ns - 1) // BUCKET_WIDTH_NS
    if value_ns > MAX_FINITE_NS:
        return OVERFLOW_INDEX
    # Tail bucket k (1-based) holds (L*2^(k-1), L*2^k]  <=>  (v-1)//L has bit length k.
    return LINEAR_BUCKETS - 1 + ((value_ns - 1) // LINEAR_LIMIT_NS).bit_length()


def bucket_indices(values_ns: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """Vectorized :func:`bucket_index` (same rule, overflow -> ``NUM_BUCKETS``)."""
    values = _as_int_array(values_ns)
    if values.size and values.min() < 0:
        raise ValueError(f"negative latency {int(values.min())} ns")
    if values.dtype == np.uint64:
        # Anything beyond int64 is overflow anyway; clipping keeps searchsorted in integer space.
        values = np.minimum(values, np.uint64(MAX_FINITE_NS + 1)).astype(np.int64)
    # side="left" finds the first upper bound >= value: exactly the ceiling rule.
    return np.searchsorted(_upper_bounds(), values, side="left").astype(np.int64)


@dataclass(eq=False)
class Histogram:
    """Counts per finite bucket plus overflow and the exact sum of all recorded values."""

    counts: npt.NDArray[np.int64]
    overflow: int = 0
    sum_ns: int = 0

    def __post_init__(self) -> None:
        counts = np.asarray(self.counts)
        if counts.shape != (NUM_BUCKETS,):
            raise ValueError(f"counts must have shape ({NUM_BUCKETS},), got {counts.shape}")
        if counts.dtype.kind not in "iu":
            raise ValueError(f"counts must be integers, got dtype {counts.dtype}")
        if counts.dtype == np.uint64 and counts.size and int(counts.max()) > _INT64_MAX:
            raise ValueError("bucket count does not fit in int64")
        self.counts = np.array(counts, dtype=np.int64)
        self.overflow = _as_int("overflow", self.overflow)
        self.sum_ns = _as_int("sum_ns", self.sum_ns)
        if self.counts.size and int(self.counts.min()) < 0:
            raise ValueError(f"negative bucket count {int(self.counts.min())}")
        if self.overflow < 0:
            raise ValueError(f"negative overflow count {self.overflow}")
        if self.sum_ns < 0:
            raise ValueError(f"negative sum_ns {self.sum_ns}")
        # A float estimate suffices to rule out int64 wrap-around in count and cumulative sums.
        if float(self.counts.sum(dtype=np.float64)) + self.overflow >= 2.0**63:
            raise ValueError("total count does not fit in int64")

    # -- construction -----------------------------------------------------------------------

    @classmethod
    def _trusted(cls, counts: npt.NDArray[np.int64], overflow: int, sum_ns: int) -> Histogram:
        """A histogram from parts already valid (int64 counts of the model's shape, owned by the
        result; non-negative ints): the collector builds hundreds per interval from checked
        arithmetic, and ``__post_init__``'s copy and scans would be most of their cost."""
        hist = object.__new__(cls)
        hist.counts, hist.overflow, hist.sum_ns = counts, overflow, sum_ns
        return hist

    @classmethod
    def empty(cls) -> Histogram:
        """A histogram with no observations."""
        return cls(np.zeros(NUM_BUCKETS, dtype=np.int64))

    @classmethod
    def from_samples(cls, values_ns: npt.ArrayLike) -> Histogram:
        """Histogram of raw latencies in ns (vectorized)."""
        values = _as_int_array(values_ns).ravel()
        indices = bucket_indices(values)
        binned = np.bincount(indices, minlength=NUM_BUCKETS + 1).astype(np.int64)
        return cls(
            binned[:NUM_BUCKETS], overflow=int(binned[NUM_BUCKETS]), sum_ns=_exact_sum(values)
        )

    @classmethod
    def from_sparse(
        cls, buckets: Iterable[tuple[int, int]], overflow: int = 0, sum_ns: int = 0
    ) -> Histogram:
        """Histogram from ``(index, count)`` pairs of finite buckets; duplicates are rejected."""
        counts = np.zeros(NUM_BUCKETS, dtype=np.int64)
        seen: set[int] = set()
        for index, count in buckets:
            index = _as_int("bucket index", index)
            count = _as_int("bucket count", count)
            if not 0 <= index < NUM_BUCKETS:
                raise ValueError(f"bucket index {index} outside [0, {NUM_BUCKETS})")
            if index in seen:
                raise ValueError(f"duplicate bucket index {index}")
            if not 0 <= count <= _INT64_MAX:
                raise ValueError(f"bucket {index} count {count} outside [0, 2^63)")
            seen.add(index)
            counts[index] = count
        return cls(counts, overflow=overflow, sum_ns=sum_ns)

    # -- mutation (probe readers, stage timers) ---------------------------------------------

    def record(self, value_ns: int, n: int = 1) -> None:
        """Add ``n`` observations of ``value_ns``."""
        n = _as_int("n", n)
        if n < 0:
            raise ValueError(f"negative observation count {n}")
        index = bucket_index(value_ns)
        self.add_bucket(index, n)
        self.sum_ns += int(value_ns) * n

    def add_bucket(self, index: int, n: int) -> None:
        """Add ``n`` to bucket ``index`` (``NUM_BUCKETS`` = overflow); caller keeps ``sum_ns``."""
        index = _as_int("bucket index", index)
        n = _as_int("n", n)
        if n < 0:
            raise ValueError(f"negative observation count {n}")
        if index == OVERFLOW_INDEX:
            self.overflow += n
        elif 0 <= index < NUM_BUCKETS:
            self.counts[index] += n
        else:
            raise ValueError(f"bucket index {index} outside [0, {NUM_BUCKETS}]")

    def add(self, other: Histogram) -> None:
        """Add ``other`` into this histogram in place (a running total: ``merge`` would validate
        a new histogram for every addend)."""
        self.counts += other.counts
        self.overflow += other.overflow
        self.sum_ns += other.sum_ns

    # -- exact arithmetic -------------------------------------------------------------------

    @property
    def count(self) -> int:
        """Number of observations, overflow included."""
        return int(self.counts.sum()) + self.overflow

    def merge(self, other: Histogram) -> Histogram:
        """Sum of two histograms (e.g. two CPUs, two cgroups, two intervals)."""
        return Histogram(
            self.counts + other.counts,
            overflow=self.overflow + other.overflow,
            sum_ns=self.sum_ns + other.sum_ns,
        )

    def delta(self, earlier: Histogram) -> Histogram:
        """What was added since ``earlier`` (both cumulative); ValueError on a counter reset."""
        return self.sparse_delta(earlier).dense()

    def sparse_delta(self, earlier: Histogram) -> SparseHistogram:
        """:meth:`delta` as its non-zero buckets, found by comparing the two rows: no dense
        difference is written (the collector takes this for every series every interval, from
        rows long out of cache: one 16 KiB write and read less per series)."""
        index = (self.counts != earlier.counts).nonzero()[0]
        changed = self.counts[index] - earlier.counts[index]
        if min(changed.tolist(), default=0) < 0:  # a Python min: numpy's costs 2x on ~40
            bad = int(index[np.flatnonzero(changed < 0)[0]])
            raise ValueError(
                f"bucket {bad} went down ({int(earlier.counts[bad])} -> {int(self.counts[bad])}): "
                "counter reset or not the same series"
            )
        overflow = self.overflow - earlier.overflow
        if overflow < 0:
            raise ValueError(f"overflow went down ({earlier.overflow} -> {self.overflow})")
        sum_ns = self.sum_ns - earlier.sum_ns
        if sum_ns < 0:
            raise ValueError(f"sum_ns went down ({earlier.sum_ns} -> {self.sum_ns})")
        return SparseHistogram(index, changed, overflow, sum_ns)

    def __add__(self, other: Histogram) -> Histogram:
        if not isinstance(other, Histogram):
            return NotImplemented
        return self.merge(other)

    def __sub__(self, other: Histogram) -> Histogram:
        if not isinstance(other, Histogram):
            return NotImplemented
        return self.delta(other)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Histogram):
            return NotImplemented
        return (
            self.overflow == other.overflow
            and self.sum_ns == other.sum_ns
            and bool(np.array_equal(self.counts, other.counts))
        )

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        sparse = self.sparse_buckets()
        shown = ", ".join(f"{i}: {c}" for i, c in sparse[:8]) + (", ..." if len(sparse) > 8 else "")
        return (
            f"Histogram(count={self.count}, sum_ns={self.sum_ns}, overflow={self.overflow}, "
            f"buckets={{{shown}}})"
        )

    def copy(self) -> Histogram:
        """Independent copy (``record`` mutates in place)."""
        return Histogram._trusted(self.counts.copy(), self.overflow, self.sum_ns)

    # -- statistics -------------------------------------------------------------------------

    def quantile(self, q: float) -> float:
        """Quantile in ns by Prometheus' ``histogram_quantile`` rule; nan when empty.

        Rank ``q*count`` selects the first bucket whose cumulative count reaches it, then the value
        is interpolated linearly between that bucket's lower and upper bound. A rank in overflow
        yields the highest finite bound. One deliberate difference: rank 0 selects the first
        *non-empty* bucket (Prometheus would divide 0 by 0 when leading buckets are empty).
        """
        return self.quantiles([q])[0]

    def quantiles(self, qs: Sequence[float]) -> list[float]:
        """:meth:`quantile` for several ``q`` with one cumulative sum."""
        for q in qs:
            if not 0.0 <= q <= 1.0:  # also rejects nan
                raise ValueError(f"quantile {q!r} outside [0, 1]")
        total = self.count
        if total == 0:
            return [math.nan] * len(qs)
        cumulative = np.cumsum(self.counts)
        bounds = _upper_bounds()
        out: list[float] = []
        for q in qs:
            rank = float(q) * total
            if rank == 0.0:
                b = int(np.searchsorted(cumulative, 0, side="right"))
            else:
                b = int(np.searchsorted(cumulative, rank, side="left"))
            if b >= NUM_BUCKETS:
                out.append(float(bounds[-1]))
                continue
            start = 0.0
            in_bucket = float(cumulative[b])
            if b > 0:
                start = float(bounds[b - 1])
                below = float(cumulative[b - 1])
                in_bucket -= below
                rank -= below
            end = float(bounds[b])
            out.append(start + (end - start) * (rank / in_bucket))
        return out

    def mean_ns(self) -> float:
        """Exact mean of the recorded values (from ``sum_ns``); nan when empty."""
        total = self.count
        return math.nan if total == 0 else self.sum_ns / total

    def sparse_buckets(self) -> list[tuple[int, int]]:
        """Non-zero finite buckets as ``(index, count)``, ascending by index."""
        nonzero = nonzero_index(self.counts)
        return list(zip(nonzero.tolist(), self.counts[nonzero].tolist(), strict=True))

    # -- coarser views ----------------------------------------------------------------------

    def rebucket(self, upper_bounds_ns: Sequence[int]) -> npt.NDArray[np.int64]:
        """Exact counts for coarser bounds (each one of our bucket upper bounds, increasing).

        Result has ``len(bounds) + 1`` entries: entry j counts values in ``(bounds[j-1],
        bounds[j]]`` and the last counts everything above the last bound, overflow included.
        """
        positions = _bound_positions(upper_bounds_ns)
        cumulative = np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(self.counts)])
        at_bounds = cumulative[positions + 1]
        edges = np.concatenate([np.zeros(1, dtype=np.int64), at_bounds, [self.count]])
        return np.diff(edges).astype(np.int64)

    def cumulative(self, upper_bounds_ns: Sequence[int]) -> npt.NDArray[np.int64]:
        """Prometheus ``le`` counts: values <= each bound, then +Inf (= count); length n+1."""
        return np.cumsum(self.rebucket(upper_bounds_ns)).astype(np.int64)


def _bound_positions(upper_bounds_ns: Sequence[int]) -> npt.NDArray[np.int64]:
    bounds = _upper_bounds()
    wanted = [_as_int("upper bound", b) for b in upper_bounds_ns]
    requested = np.array(wanted, dtype=np.int64)
    if requested.size == 0:
        return requested
    if np.any(np.diff(requested) <= 0):
        raise ValueError(f"upper bounds must be strictly increasing: {wanted}")
    positions = np.searchsorted(bounds, requested, side="left")
    for bound, position in zip(wanted, positions, strict=True):
        if position >= NUM_BUCKETS or int(bounds[position]) != bound:
            raise ValueError(
                f"{bound} ns is not a bucket upper bound (multiples of {BUCKET_WIDTH_NS} ns up to "
                f"{LINEAR_LIMIT_NS} ns, then {LINEAR_LIMIT_NS} ns * 2^k): cannot re-bucket exactly"
            )
    return positions.astype(np.int64)


def _as_int(name: str, value: object) -> int:
    """Accept Python and numpy integers only (no bools, no floats, even integral ones)."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
    return int(value)


def _as_int_array(values: npt.ArrayLike) -> npt.NDArray[np.int64] | npt.NDArray[np.uint64]:
    array = np.asarray(values)
    if array.size == 0:
        return np.zeros(array.shape, dtype=np.int64)
    if array.dtype.kind == "b" or array.dtype.kind not in "iu":
        raise TypeError(f"latencies must be integer ns, got dtype {array.dtype}")
    if array.dtype == np.uint64:
        return array.astype(np.uint64, copy=False)
    return array.astype(np.int64, copy=False)


def _exact_sum(values: npt.NDArray[np.int64] | npt.NDArray[np.uint64]) -> int:
    """Sum without int64 wrap-around: 32-bit halves are summed separately in uint64."""
    if values.size == 0:
        return 0
    if values.size * int(values.max()) <= _INT64_MAX:
        return int(values.sum(dtype=np.int64))
    unsigned = values.astype(np.uint64)
    high = int((unsigned >> np.uint64(32)).sum(dtype=np.uint64))
    low = int((unsigned & np.uint64(0xFFFFFFFF)).sum(dtype=np.uint64))
    return (high << 32) + low


@dataclass(slots=True)
class SparseHistogram:
    """A histogram's non-zero buckets (index ascending, count), overflow and sum: what is kept of
    histograms held for long (windows, the live view's history), where a dense copy would cost
    16 KiB each."""

    index: npt.NDArray[np.intp]
    count: npt.NDArray[np.int64]
    overflow: int
    sum_ns: int

    @classmethod
    def of(cls, hist: Histogram) -> SparseHistogram:
        index = nonzero_index(hist.counts)
        return cls(index, hist.counts[index], hist.overflow, hist.sum_ns)

    @property
    def total(self) -> int:
        """Observations, overflow included (a Python sum: numpy's costs 3x on ~40 buckets)."""
        counts: list[int] = self.count.tolist()
        return sum(counts) + self.overflow

    def dense(self) -> Histogram:
        """The histogram again."""
        counts = np.zeros(NUM_BUCKETS, dtype=np.int64)
        counts[self.index] = self.count
        return Histogram._trusted(counts, self.overflow, self.sum_ns)

    def add_to(self, dense: Histogram) -> None:
        dense.counts[self.index] += self.count
        dense.overflow += self.overflow
        dense.sum_ns += self.sum_ns

    def subtract_from(self, dense: Histogram) -> None:
        dense.counts[self.index] -= self.count
        dense.overflow -= self.overflow
        dense.sum_ns -= self.sum_ns
