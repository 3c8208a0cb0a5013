"""Tail-jump detection in sequences of interval histograms: when did a series' P99 or P99.9 move?

A tail change is treated as a *count* problem. Pick a threshold at the q-quantile of a reference
(the bucket edge whose exceedance fraction is nearest ``1 - q``); in every interval count the
events above it: ``x_t`` of ``n_t``. Without a change ``x_t ~ Binomial(n_t, p0)``; a tail that
moved up or down changes the exceedance rate. Real intervals are burstier than binomial, so every
likelihood is a quasi-likelihood divided by a dispersion factor ``phi >= 1`` estimated from data.

**Online** (:class:`OnlineJumpDetector`, one per series and quantile, fed interval by interval):

1. the first ``reference_intervals`` intervals (extended until they hold at least
   ``min_reference_exceedances`` tail events) give the threshold, ``p0`` and ``phi`` (Pearson
   chi-square of the ``x_t`` over its degrees of freedom, floored at 1);
2. two binomial CUSUMs run on the log-likelihood ratio of rate ``rate_ratio * p0`` (up) and
   ``p0 / rate_ratio`` (down) against ``p0``, each increment divided by ``phi``;
3. alarm when a CUSUM exceeds ``h = ln(sides / false_alarm_rate)``. For an exact likelihood-ratio
   CUSUM the in-control average run length is at least ``e^h`` (Lorden), so each side raises at most
   ``false_alarm_rate / sides`` alarms per interval: the rate is calibrated by construction (the
   harness in ``tailsight.testing.eval`` measures it);
4. the change is dated at the interval after the CUSUM's last zero; before = reference plus quiet
   intervals, after = change..alarm; the jump is *confirmed* by a distribution-level test (below);
5. the detector re-baselines on the post-change intervals and carries on.

**Offline** (:func:`detect_offline`, a whole range): threshold at the pooled q-quantile,
``S_k = sum_{t<k} (x_t - n_t p)``; under no change ``max_k |S_k| / sqrt(phi p (1-p) N)`` tends to
the supremum of a Brownian bridge (Kolmogorov distribution, ``scipy.stats.kstwobign``), which gives
a p-value; ``phi`` comes from successive intervals, each pair judged at its own rate (a change
of rate barely inflates it). The change is dated at ``argmax |S_k|``. Across many (cgroup, probe,
quantile) series, :func:`detect_many` controls the false discovery rate with Benjamini-Hochberg.

**Confirmation**: a chi-square test of homogeneity on the before/after 5 µs histograms (cells at
fixed quantiles of the pooled histogram, merged until every cell expects at least 5 events,
statistic divided by ``phi``), plus an
effect bound: confirmed when ``p < confirm_alpha`` and the q-quantile moved by more than
``max(min_effect, min_effect_ns / before)``.

Defaults (:class:`JumpConfig`): quantile 0.99; rate_ratio 1.5; false_alarm_rate 1e-3 per
series-interval (both directions); reference_intervals 30; min_reference_exceedances 20;
confirm_alpha 0.01; min_effect 5 %; min_effect_ns 10 000; offline FDR level 0.05.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal

import numpy as np
import numpy.typing as npt

from tailsight.analysis.quantiles import dense_counts_by_series, histogram_from_dense, quantile_name
from tailsight.hist import NUM_BUCKETS, bucket_upper_bounds_ns
from tailsight.intervals import HistDocument, LabelKey

Direction = Literal["up", "down"]
_MIN_EXPECTED = 5.0


@dataclass(frozen=True)
class JumpConfig:
    """Detector parameters (see the module docstring for their role)."""

    quantile: float = 0.99
    rate_ratio: float = 1.5
    false_alarm_rate: float = 1e-3
    reference_intervals: int = 30
    min_reference_exceedances: int = 20
    dispersion_quantile: float = 0.25
    two_sided: bool = True
    confirm_alpha: float = 0.01
    min_effect: float = 0.05
    min_effect_ns: float = 10_000.0

    def __post_init__(self) -> None:
        if not 0.0 < self.quantile < 1.0:
            raise ValueError(f"quantile {self.quantile} outside (0, 1)")
        if self.rate_ratio <= 1.0:
            raise ValueError("rate_ratio must be > 1")
        if not 0.0 < self.false_alarm_rate < 1.0:
            raise ValueError("false_alarm_rate must be in (0, 1)")
        if self.reference_intervals < 2:
            raise ValueError("reference_intervals must be >= 2")

    @property
    def cusum_threshold(self) -> float:
        """``h = ln(sides / false_alarm_rate)``: per-side alarm rate <= e^-h (Lorden's bound)."""
        return math.log((2.0 if self.two_sided else 1.0) / self.false_alarm_rate)


@dataclass(frozen=True)
class TailThreshold:
    """Exceedance threshold: events in dense buckets ``> edge_index`` are 'in the tail'."""

    edge_index: int
    upper_bound_ns: float
    rate: float

    @classmethod
    def from_counts(cls, counts: npt.NDArray[np.int64], quantile: float) -> TailThreshold | None:
        """Bucket edge whose exceedance fraction in ``counts`` is nearest ``1 - quantile``."""
        total = int(counts.sum())
        if total == 0:
            return None
        above = total - np.cumsum(counts)  # events above the upper bound of each dense bucket
        target = (1.0 - quantile) * total
        first = int(np.searchsorted(np.cumsum(counts), quantile * total, side="left"))
        # Above ``j`` must hold some but not all events: a series in one bucket has no tail.
        candidates = [
            j for j in (first - 1, first) if 0 <= j < NUM_BUCKETS and 0 < above[j] < total
        ]
        if not candidates:
            return None
        edge = min(candidates, key=lambda j: abs(math.log(float(above[j]) / target)))
        bound = float(bucket_upper_bounds_ns()[edge])
        return cls(edge_index=edge, upper_bound_ns=bound, rate=float(above[edge]) / total)

    def exceedances(self, rows: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """Tail events per row of ``[intervals, NUM_BUCKETS + 1]`` counts."""
        return np.asarray(rows[..., self.edge_index + 1 :].sum(axis=-1), dtype=np.int64)


@dataclass(frozen=True)
class Jump:
    """One detected tail move; interval indices count from the first interval fed."""

    series: LabelKey
    quantile: float
    direction: Direction
    change_index: int
    alarm_index: int
    before_ns: float
    after_ns: float
    rate_before: float
    rate_after: float
    threshold_ns: float
    dispersion: float
    confirm_p_value: float
    confirmed: bool
    change_start_ns: int | None = None
    alarm_start_ns: int | None = None
    settled_after_ns: float = math.nan
    """q-quantile over up to ``reference_intervals`` intervals from the change on (until the next
    change), filled in by :func:`monitor` when it has seen them; ``after_ns`` only covers the few
    intervals up to the alarm."""

    @property
    def ratio(self) -> float:
        """after / before q-quantile."""
        return self.after_ns / self.before_ns if self.before_ns > 0 else math.inf

    def to_json(self) -> dict[str, Any]:
        """Plain JSON-able dict."""
        return {
            "series": dict(self.series),
            "quantile": self.quantile,
            "name": quantile_name(self.quantile),
            "direction": self.direction,
            "change_index": self.change_index,
            "alarm_index": self.alarm_index,
            "change_start_ns": self.change_start_ns,
            "alarm_start_ns": self.alarm_start_ns,
            "before_ns": self.before_ns,
            "after_ns": self.after_ns,
            "ratio": self.ratio,
            "rate_before": self.rate_before,
            "rate_after": self.rate_after,
            "threshold_ns": self.threshold_ns,
            "dispersion": self.dispersion,
            "confirm_p_value": self.confirm_p_value,
            "confirmed": self.confirmed,
            "settled_after_ns": None
            if math.isnan(self.settled_after_ns)
            else self.settled_after_ns,
        }


# -- shared statistics -------------------------------------------------------------------------


def binomial_llr(
    exceed: npt.ArrayLike, total: npt.ArrayLike, p0: float, p1: float
) -> npt.NDArray[np.float64]:
    """Per-interval log-likelihood ratio of exceedance rate ``p1`` against ``p0``."""
    x = np.asarray(exceed, dtype=np.float64)
    n = np.asarray(total, dtype=np.float64)
    p1 = min(p1, 1.0 - 1e-12)
    return np.asarray(x * math.log(p1 / p0) + (n - x) * math.log((1.0 - p1) / (1.0 - p0)))


def pearson_dispersion(
    exceed: npt.ArrayLike, total: npt.ArrayLike, rate: float, lower_quantile: float = 0.5
) -> float:
    """Pearson chi-square of the counts over a chi-square quantile of its df, floored at 1.

    ``lower_quantile < 0.5`` errs towards a larger dispersion: an underestimate from a short
    reference raises the false-alarm rate, an overestimate only delays detection a little.
    """
    from scipy.stats import chi2 as chi2_distribution

    x = np.asarray(exceed, dtype=np.float64)
    n = np.asarray(total, dtype=np.float64)
    used = n > 0
    if used.sum() < 2 or not 0.0 < rate < 1.0:
        return 1.0
    expected = n[used] * rate
    chi2 = float(np.sum((x[used] - expected) ** 2 / (expected * (1.0 - rate))))
    df = int(used.sum()) - 1
    return max(1.0, chi2 / float(chi2_distribution.ppf(lower_quantile, df)))


def difference_dispersion(exceed: npt.ArrayLike, total: npt.ArrayLike) -> float:
    """Dispersion from successive intervals, each pair judged at its own rate, floored at 1.

    For neighbours ``(x1, n1), (x2, n2)`` holding ``s = x1 + x2`` tail events, the squared rate
    difference over its binomial variance at the pair's rate ``s / (n1 + n2)`` has expectation
    ``N / (N - 1) ~ 1`` given ``s`` when both share one rate. Judging each pair at its own rate
    keeps a change of rate -- and of the variance that comes with it -- out of the estimate:
    standardizing by the pooled rate inflated it by about the after/before rate ratio, which hid
    a x800 run-queue jump. Pairs with no tail event, or nothing else, carry no information.
    """
    x = np.asarray(exceed, dtype=np.float64)
    n = np.asarray(total, dtype=np.float64)
    used = n > 0
    x, n = x[used], n[used]
    x1, x2, n1, n2 = x[:-1], x[1:], n[:-1], n[1:]
    s, both = x1 + x2, n1 + n2
    informative = (s > 0) & (s < both)
    if informative.sum() < 2:
        return 1.0
    x1, x2, n1, n2, s, both = (a[informative] for a in (x1, x2, n1, n2, s, both))
    rate = s / both
    variance = rate * (1.0 - rate) * (1.0 / n1 + 1.0 / n2) * both / (both - 1.0)
    return max(1.0, float(np.mean((x1 / n1 - x2 / n2) ** 2 / variance)))


CELL_QUANTILES: Final = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 0.999)
"""Cell edges of the homogeneity test, as quantiles of the pooled histogram."""


def homogeneity_test(
    before: npt.NDArray[np.int64], after: npt.NDArray[np.int64], dispersion: float = 1.0
) -> float:
    """p-value that two dense histograms share one distribution (binned chi-square / dispersion).

    Cells end at fixed quantiles of the pooled histogram (CELL_QUANTILES, finer in the tail),
    merged until each expects at least 5 events, so the degrees of freedom do not grow with the
    bucket count: over one cell per populated 5 µs bucket (180 cells), a statistic divided by a
    bursty tail's dispersion (26) leaves a x5 P99 jump unconfirmed (p = 0.017; 3e-44 here)."""
    from scipy.stats import chi2

    total_before, total_after = int(before.sum()), int(after.sum())
    if total_before == 0 or total_after == 0:
        return 1.0
    pooled = before + after
    cumulative = np.cumsum(pooled) / float(pooled.sum())
    ends = sorted({int(np.searchsorted(cumulative, q)) for q in CELL_QUANTILES} | {pooled.size - 1})
    share = min(total_before, total_after) / (total_before + total_after)
    cells_before: list[int] = []
    cells_after: list[int] = []
    acc_before = acc_after = start = 0
    for end in ends:
        acc_before += int(before[start : end + 1].sum())
        acc_after += int(after[start : end + 1].sum())
        start = end + 1
        if (acc_before + acc_after) * share >= _MIN_EXPECTED:
            cells_before.append(acc_before)
            cells_after.append(acc_after)
            acc_before = acc_after = 0
    if acc_before + acc_after:
        if cells_before:
            cells_before[-1] += acc_before
            cells_after[-1] += acc_after
        else:
            return 1.0
    if len(cells_before) < 2:
        return 1.0
    table = np.array([cells_before, cells_after], dtype=np.float64)
    expected = table.sum(axis=0) * (table.sum(axis=1, keepdims=True) / table.sum())
    statistic = float(np.sum((table - expected) ** 2 / expected))
    return float(chi2.sf(statistic / max(dispersion, 1.0), len(cells_before) - 1))


def quantile_of(counts: npt.NDArray[np.int64], q: float) -> float:
    """q-quantile in ns of a dense count row (Prometheus rule via Histogram)."""
    return histogram_from_dense(counts).quantile(q) if counts.sum() else math.nan


def _confirmed(before_ns: float, after_ns: float, p_value: float, config: JumpConfig) -> bool:
    if not (before_ns > 0 and math.isfinite(after_ns)):
        return False
    effect = max(config.min_effect, config.min_effect_ns / before_ns)
    return p_value < config.confirm_alpha and abs(after_ns / before_ns - 1.0) > effect


# -- online -----------------------------------------------------------------------------------


@dataclass
class OnlineJumpDetector:
    """Binomial CUSUM on tail exceedances of one series, fed one interval at a time.

    Memory stays bounded while nothing happens: intervals before both CUSUMs' last zero are folded
    into one 'before' histogram, only the intervals a change could still start in are kept.
    """

    config: JumpConfig = field(default_factory=JumpConfig)
    series: LabelKey = ()
    _rows: list[npt.NDArray[np.int64]] = field(default_factory=list, repr=False)
    _starts: list[int | None] = field(default_factory=list, repr=False)
    _base: int = 0  # global index of _rows[0]
    _seen: int = 0
    _before: npt.NDArray[np.int64] | None = field(default=None, repr=False)
    _threshold: TailThreshold | None = None
    _dispersion: float = 1.0
    _up: float = 0.0
    _down: float = 0.0
    _up_zero: int = 0  # global index of the first interval after the CUSUM was last 0
    _down_zero: int = 0

    @property
    def monitoring(self) -> bool:
        """True once a reference is established and CUSUMs run."""
        return self._threshold is not None

    def update(self, counts: npt.ArrayLike, start_ns: int | None = None) -> Jump | None:
        """Feed the next interval (dense counts ``[NUM_BUCKETS + 1]``); a Jump on an alarm."""
        row = np.asarray(counts, dtype=np.int64)
        if row.shape != (NUM_BUCKETS + 1,):
            raise ValueError(f"expected {NUM_BUCKETS + 1} dense counts, got shape {row.shape}")
        index = self._seen
        self._seen += 1
        self._rows.append(row)
        self._starts.append(start_ns)
        if self._threshold is None:
            self._try_reference()
            return None
        jump = self._step(index, row)
        if jump is None:
            sides = (self._up_zero, self._down_zero) if self.config.two_sided else (self._up_zero,)
            self._fold(min(sides))
        return jump

    def _try_reference(self) -> None:
        config = self.config
        if len(self._rows) < config.reference_intervals:
            return
        rows = np.array(self._rows)
        threshold = TailThreshold.from_counts(rows.sum(axis=0), config.quantile)
        if threshold is None:
            return
        exceed = threshold.exceedances(rows)
        if int(exceed.sum()) < config.min_reference_exceedances:
            return
        self._threshold = threshold
        self._dispersion = pearson_dispersion(
            exceed, rows.sum(axis=1), threshold.rate, config.dispersion_quantile
        )
        self._up = self._down = 0.0
        self._up_zero = self._down_zero = self._seen
        self._fold(self._seen)

    def _fold(self, until: int) -> None:
        """Move intervals with global index < ``until`` into the 'before' sum."""
        drop = until - self._base
        if drop <= 0:
            return
        folded: npt.NDArray[np.int64] = np.stack(self._rows[:drop]).sum(axis=0)
        self._before = folded if self._before is None else self._before + folded
        del self._rows[:drop], self._starts[:drop]
        self._base = until

    def _step(self, index: int, row: npt.NDArray[np.int64]) -> Jump | None:
        assert self._threshold is not None
        config = self.config
        p0 = self._threshold.rate
        x = int(self._threshold.exceedances(row))
        n = int(row.sum())
        h = config.cusum_threshold
        up = float(binomial_llr(x, n, p0, p0 * config.rate_ratio)) / self._dispersion
        self._up = max(0.0, self._up + up)
        if self._up == 0.0:
            self._up_zero = index + 1
        if self._up > h:
            return self._alarm("up", self._up_zero, index)
        if config.two_sided:
            down = float(binomial_llr(x, n, p0, p0 / config.rate_ratio)) / self._dispersion
            self._down = max(0.0, self._down + down)
            if self._down == 0.0:
                self._down_zero = index + 1
            if self._down > h:
                return self._alarm("down", self._down_zero, index)
        return None

    def _alarm(self, direction: Direction, change: int, alarm: int) -> Jump:
        assert self._threshold is not None and self._before is not None
        change = min(change, alarm)
        self._fold(change)
        before = self._before
        after: npt.NDArray[np.int64] = np.stack(self._rows).sum(axis=0)
        q = self.config.quantile
        before_ns, after_ns = quantile_of(before, q), quantile_of(after, q)
        p_value = homogeneity_test(before, after, self._dispersion)
        jump = Jump(
            series=self.series,
            quantile=q,
            direction=direction,
            change_index=change,
            alarm_index=alarm,
            before_ns=before_ns,
            after_ns=after_ns,
            rate_before=float(self._threshold.exceedances(before)) / max(1, int(before.sum())),
            rate_after=float(self._threshold.exceedances(after)) / max(1, int(after.sum())),
            threshold_ns=self._threshold.upper_bound_ns,
            dispersion=self._dispersion,
            confirm_p_value=p_value,
            confirmed=_confirmed(before_ns, after_ns, p_value, self.config),
            change_start_ns=self._starts[0],
            alarm_start_ns=self._starts[-1],
        )
        # Re-baseline on what followed the change (the intervals already seen count).
        self._before = None
        self._threshold = None
        self._try_reference()
        return jump


def monitor(
    counts: npt.NDArray[np.int64],
    config: JumpConfig | None = None,
    starts_ns: Sequence[int] | None = None,
    series: LabelKey = (),
) -> list[Jump]:
    """Run the online detector over ``[intervals, NUM_BUCKETS + 1]`` counts; all alarms, each with
    its ``settled_after_ns`` from the intervals that followed."""
    config = config or JumpConfig()
    detector = OnlineJumpDetector(config, series)
    jumps: list[Jump] = []
    for t, row in enumerate(counts):
        jump = detector.update(row, None if starts_ns is None else int(starts_ns[t]))
        if jump is not None:
            jumps.append(jump)
    settled: list[Jump] = []
    for n, jump in enumerate(jumps):
        end = jumps[n + 1].change_index if n + 1 < len(jumps) else len(counts)
        end = min(end, jump.change_index + config.reference_intervals)
        window = np.asarray(counts[jump.change_index : end]).sum(axis=0)
        settled.append(replace(jump, settled_after_ns=quantile_of(window, config.quantile)))
    return settled


def monitor_documents(
    documents: Sequence[HistDocument],
    selector: Mapping[str, str] | None = None,
    quantiles: Sequence[float] = (0.99, 0.999),
    config: JumpConfig | None = None,
) -> list[Jump]:
    """Online detection over a recording (one document per interval), every series and quantile."""
    base = config or JumpConfig()
    starts, arrays = dense_counts_by_series(documents, selector)
    jumps: list[Jump] = []
    for key, counts in arrays.items():
        for q in quantiles:
            jumps.extend(monitor(counts, _with_quantile(base, q), starts.tolist(), key))
    return sorted(jumps, key=lambda j: (j.alarm_index, j.series, j.quantile))


# -- offline ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class OfflineResult:
    """Most likely tail change in a range; ``p_value`` tests 'no change at all'."""

    series: LabelKey
    quantile: float
    p_value: float
    change_index: int | None
    direction: Direction | None
    before_ns: float
    after_ns: float
    threshold_ns: float
    dispersion: float
    confirm_p_value: float
    confirmed: bool
    discovered: bool = False

    def to_json(self) -> dict[str, Any]:
        """Plain JSON-able dict (nan -> None)."""
        out: dict[str, Any] = {"series": dict(self.series), "name": quantile_name(self.quantile)}
        for name in self.__dataclass_fields__:
            if name == "series":
                continue
            value = getattr(self, name)
            out[name] = None if isinstance(value, float) and math.isnan(value) else value
        return out


def detect_offline(
    counts: npt.NDArray[np.int64],
    config: JumpConfig | None = None,
    series: LabelKey = (),
) -> OfflineResult:
    """Test a whole ``[intervals, NUM_BUCKETS + 1]`` range for one tail change and date it."""
    config = config or JumpConfig()
    rows = np.asarray(counts, dtype=np.int64)
    if rows.ndim != 2 or rows.shape[0] < 3:
        return no_change(series, config.quantile)
    pooled = rows.sum(axis=0)
    threshold = TailThreshold.from_counts(pooled, config.quantile)
    if threshold is None:
        return no_change(series, config.quantile)
    exceed = threshold.exceedances(rows).astype(np.float64)
    total = rows.sum(axis=1).astype(np.float64)
    located = locate_change(exceed, total, threshold, config, series)
    if located.change_index is None:
        return located
    before = rows[: located.change_index].sum(axis=0)
    return confirm_change(located, before, pooled - before, config)


def no_change(series: LabelKey, q: float) -> OfflineResult:
    """The result of a range too short or with too few tail events to test."""
    return OfflineResult(
        series, q, math.nan, None, None, math.nan, math.nan, math.nan, 1.0, math.nan, False
    )


def locate_change(
    exceed: npt.NDArray[np.float64],
    total: npt.NDArray[np.float64],
    threshold: TailThreshold,
    config: JumpConfig,
    series: LabelKey = (),
) -> OfflineResult:
    """The test and dating of :func:`detect_offline` from tail events and events per interval
    above the pooled ``threshold``; before/after quantiles and confirmation are left to
    :func:`confirm_change` (they need the histograms on each side)."""
    from scipy.stats import kstwobign

    q = config.quantile
    if exceed.size < 3 or exceed.sum() < config.min_reference_exceedances:
        return no_change(series, q)
    events = float(total.sum())
    rate = float(exceed.sum()) / events
    if not 0.0 < rate < 1.0:
        return no_change(series, q)
    dispersion = difference_dispersion(exceed, total)
    partial = np.cumsum(exceed - total * rate)[:-1]  # S_k for a split before interval k+1
    k = int(np.argmax(np.abs(partial)))
    scale = math.sqrt(dispersion * rate * (1.0 - rate) * events)
    p_value = float(kstwobign.sf(abs(float(partial[k])) / scale))
    return OfflineResult(
        series=series,
        quantile=q,
        p_value=p_value,
        change_index=k + 1,
        direction="up" if partial[k] < 0 else "down",
        before_ns=math.nan,
        after_ns=math.nan,
        threshold_ns=threshold.upper_bound_ns,
        dispersion=dispersion,
        confirm_p_value=math.nan,
        confirmed=False,
    )


def confirm_change(
    located: OfflineResult,
    before: npt.NDArray[np.int64],
    after: npt.NDArray[np.int64],
    config: JumpConfig,
) -> OfflineResult:
    """A located change with its quantiles on each side and the homogeneity confirmation
    (``before`` and ``after``: dense counts summed over each side of the change)."""
    q = config.quantile
    before_ns, after_ns = quantile_of(before, q), quantile_of(after, q)
    confirm = homogeneity_test(before, after, located.dispersion)
    return replace(
        located,
        before_ns=before_ns,
        after_ns=after_ns,
        confirm_p_value=confirm,
        confirmed=_confirmed(before_ns, after_ns, confirm, config),
    )


def benjamini_hochberg(p_values: npt.ArrayLike, level: float = 0.05) -> npt.NDArray[np.bool_]:
    """Discoveries of the Benjamini-Hochberg step-up procedure (nan p-values never discovered)."""
    p = np.asarray(p_values, dtype=np.float64)
    found = np.zeros(p.shape, dtype=bool)
    valid = np.flatnonzero(~np.isnan(p))
    m = valid.size
    if m == 0:
        return found
    order = valid[np.argsort(p[valid], kind="stable")]
    below = p[order] <= level * np.arange(1, m + 1) / m
    if below.any():
        last = int(np.flatnonzero(below)[-1])
        found[order[: last + 1]] = True
    return found


def detect_many(
    arrays: Mapping[LabelKey, npt.NDArray[np.int64]],
    quantiles: Sequence[float] = (0.99, 0.999),
    config: JumpConfig | None = None,
    fdr: float = 0.05,
) -> list[OfflineResult]:
    """Offline test of every (series, quantile); ``discovered`` by BH at level ``fdr`` over all."""
    base = config or JumpConfig()
    results = [
        detect_offline(counts, _with_quantile(base, q), key)
        for key, counts in arrays.items()
        for q in quantiles
    ]
    found = benjamini_hochberg([r.p_value for r in results], fdr)
    return [_discovered(r, bool(f)) for r, f in zip(results, found, strict=True)]


def detect_documents(
    documents: Sequence[HistDocument],
    selector: Mapping[str, str] | None = None,
    quantiles: Sequence[float] = (0.99, 0.999),
    config: JumpConfig | None = None,
    fdr: float = 0.05,
) -> list[OfflineResult]:
    """:func:`detect_many` over a recording (one document per interval)."""
    _, arrays = dense_counts_by_series(documents, selector)
    return detect_many(arrays, quantiles, config, fdr)


def _with_quantile(config: JumpConfig, q: float) -> JumpConfig:
    return replace(config, quantile=q)


def _discovered(result: OfflineResult, found: bool) -> OfflineResult:
    return replace(result, discovered=found)
