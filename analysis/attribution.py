"""Attribution of a tail jump: whose excess tail events, who displaced whom, which stacks.

Everything compares a *before* and an *after* window of intervals around a change index and
works in per-interval rates, so windows of different lengths compare fairly.

- :func:`decompose_tail`: the excess tail events per interval of a population of sources (series
  of one probe: cgroups, syscalls, ...) above one threshold, split per source by a
  Kitagawa/Oaxaca decomposition ``Δ(v·r) = Δv·r_before + v_after·Δr`` (``v`` events per interval,
  ``r`` tail fraction): the *volume* term is "more traffic from a source as slow as before", the
  *rate* term "this source got slower". The terms add up exactly to the whole excess.
- :func:`displaced_by`: the victim cgroup's displaced run-queue wait per aggressor cgroup
  (``runqueue_displaced_wait_ns``), each aggressor's share of the excess, before vs after.
- :func:`stack_shifts`: outlier stacks whose event rate rose (one-sided conditional binomial test
  per stack, Benjamini-Hochberg across stacks), each with its share of the excess outlier events.

Every share carries a percentile bootstrap interval: before and after intervals are resampled
independently with replacement (seeded, so a report is reproducible).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from tailsight.analysis.jumps import benjamini_hochberg
from tailsight.intervals import HistDocument, LabelKey
from tailsight.probes.outliers import OUTLIER_EVENTS_SUFFIX
from tailsight.probes.runqueue import DISPLACED_SWITCHES, DISPLACED_WAIT

DEFAULT_BOOTSTRAP: Final = 400
DEFAULT_LEVEL: Final = 0.95

FloatArray = npt.NDArray[np.float64]
CounterRows = Mapping[tuple[str, LabelKey], FloatArray]
"""Counters per interval: ``(name, labels)`` -> one value per interval of the range."""


def counter_rows(
    documents: Sequence[HistDocument], wanted: Callable[[str], bool] | None = None
) -> dict[tuple[str, LabelKey], FloatArray]:
    """The counters of ``documents`` (those ``wanted`` names) as :data:`CounterRows`."""
    rows: dict[tuple[str, LabelKey], FloatArray] = {}
    for t, document in enumerate(documents):
        for counter in document.counters:
            if wanted is None or wanted(counter.name):
                key = (counter.name, tuple(sorted(counter.labels.items())))
                rows.setdefault(key, np.zeros(len(documents)))[t] += counter.value
    return rows


@dataclass(frozen=True)
class Windows:
    """Interval index ranges ``[before_start, change)`` and ``[change, after_stop)``."""

    before_start: int
    change: int
    after_stop: int

    @classmethod
    def around(cls, change: int, intervals: int, width: int) -> Windows:
        """Up to ``width`` intervals on each side of ``change``, clipped to the data."""
        if not 0 < change < intervals:
            raise ValueError(f"change {change} leaves an empty side of {intervals} intervals")
        return cls(max(0, change - width), change, min(intervals, change + width))

    @property
    def before(self) -> slice:
        return slice(self.before_start, self.change)

    @property
    def after(self) -> slice:
        return slice(self.change, self.after_stop)

    def to_json(self) -> dict[str, int]:
        """Plain JSON-able dict."""
        return {
            "before_start": self.before_start,
            "change": self.change,
            "after_stop": self.after_stop,
        }


@dataclass(frozen=True)
class Estimate:
    """A point estimate with its bootstrap interval (nan bounds: not estimable)."""

    value: float
    low: float
    high: float

    def contains(self, truth: float) -> bool:
        """True when ``truth`` lies inside the interval."""
        return self.low <= truth <= self.high

    def to_json(self) -> dict[str, float | None]:
        """Plain JSON-able dict (nan -> None)."""
        return {"value": _finite(self.value), "low": _finite(self.low), "high": _finite(self.high)}


# -- bootstrap core ------------------------------------------------------------------------------


def _resample_means(rows: FloatArray, n_boot: int, rng: np.random.Generator) -> FloatArray:
    """Column means of ``n_boot`` resamples (with replacement) of the rows: ``[n_boot, S]``."""
    picks = rng.integers(0, rows.shape[0], size=(n_boot, rows.shape[0]))
    return np.asarray(rows[picks].mean(axis=1), dtype=np.float64)


def _interval(samples: FloatArray, level: float) -> tuple[FloatArray, FloatArray]:
    """Percentile interval per column, ignoring resamples where the statistic is undefined."""
    tail = (1.0 - level) / 2.0
    low = np.full(samples.shape[1], math.nan)
    high = np.full(samples.shape[1], math.nan)
    for s in range(samples.shape[1]):
        column = samples[:, s]
        column = column[np.isfinite(column)]
        if column.size:
            low[s], high[s] = np.quantile(column, [tail, 1.0 - tail])
    return low, high


def _shares(parts: FloatArray) -> FloatArray:
    """Each column's share of the row's *gross rise*: its positive part over the sum of the
    positive parts, so shares lie in [0, 1] and add up to 1 (a column that fell: 0; rows where
    nothing rose: nan). Shares of a net excess would exceed 100 % or go negative whenever some
    part fell; what fell is reported in its own units instead."""
    rises = np.clip(parts, 0.0, None)
    total = rises.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(total > 0, rises / np.where(total > 0, total, 1.0), math.nan)


@dataclass(frozen=True)
class ExcessShares:
    """Per column of a ``[T, S]`` per-interval quantity: means before and after, the excess
    (after - before) and each column's share of the summed excess with its interval."""

    before: FloatArray
    after: FloatArray
    excess: FloatArray
    share: list[Estimate]


def excess_shares(
    rows: npt.ArrayLike,
    windows: Windows,
    n_boot: int = DEFAULT_BOOTSTRAP,
    seed: int = 0,
    level: float = DEFAULT_LEVEL,
) -> ExcessShares:
    """Share of the total excess (mean after - mean before) that each column contributes."""
    data = np.asarray(rows, dtype=np.float64)
    before_rows, after_rows = data[windows.before], data[windows.after]
    before, after = before_rows.mean(axis=0), after_rows.mean(axis=0)
    excess = after - before
    point = _shares(excess)
    rng = np.random.default_rng(seed)
    boot = _shares(
        _resample_means(after_rows, n_boot, rng) - _resample_means(before_rows, n_boot, rng)
    )
    low, high = _interval(boot, level)
    share = [Estimate(float(point[s]), float(low[s]), float(high[s])) for s in range(data.shape[1])]
    return ExcessShares(before, after, excess, share)


# -- volume / rate decomposition ----------------------------------------------------------------


@dataclass(frozen=True)
class SourceEffect:
    """One source's part of the excess tail events (events per interval)."""

    source: LabelKey
    volume_before: float
    volume_after: float
    rate_before: float
    rate_after: float
    volume_effect: float
    rate_effect: float
    share: Estimate
    volume_share: Estimate
    rate_share: Estimate

    @property
    def effect(self) -> float:
        """Excess tail events per interval from this source (volume + rate terms)."""
        return self.volume_effect + self.rate_effect

    def to_json(self) -> dict[str, Any]:
        """Plain JSON-able dict."""
        return {
            "source": dict(self.source),
            "volume_before": self.volume_before,
            "volume_after": self.volume_after,
            "rate_before": self.rate_before,
            "rate_after": self.rate_after,
            "volume_effect": self.volume_effect,
            "rate_effect": self.rate_effect,
            "share": self.share.to_json(),
            "volume_share": self.volume_share.to_json(),
            "rate_share": self.rate_share.to_json(),
        }


@dataclass(frozen=True)
class TailDecomposition:
    """Excess tail events per interval above ``threshold_ns`` and its split over sources."""

    threshold_ns: float
    windows: Windows
    tail_before: float
    tail_after: float
    sources: list[SourceEffect]
    volume_effect: float
    """Excess tail events per interval from more (or less) traffic, all sources together."""
    rate_effect: float
    """Excess tail events per interval from sources getting slower (or faster)."""
    volume_share: Estimate
    rate_share: Estimate
    tail_events: int = 0
    """Tail events in both windows together (how much evidence the split rests on)."""

    @property
    def excess(self) -> float:
        """Tail events per interval after minus before (the whole the shares divide)."""
        return self.tail_after - self.tail_before

    def to_json(self) -> dict[str, Any]:
        """Plain JSON-able dict."""
        return {
            "threshold_ns": self.threshold_ns,
            "windows": self.windows.to_json(),
            "tail_before": self.tail_before,
            "tail_after": self.tail_after,
            "excess": self.excess,
            "volume_effect": self.volume_effect,
            "rate_effect": self.rate_effect,
            "tail_events": self.tail_events,
            "volume_share": self.volume_share.to_json(),
            "rate_share": self.rate_share.to_json(),
            "sources": [s.to_json() for s in self.sources],
        }


def kitagawa(
    tail_before: FloatArray,
    volume_before: FloatArray,
    tail_after: FloatArray,
    volume_after: FloatArray,
) -> tuple[FloatArray, FloatArray]:
    """Volume and rate terms per source from per-interval mean tail events and volumes.

    A source absent on one side takes the other side's tail rate, so a new source counts as pure
    volume (new traffic at its own rate) and a vanished one as negative volume.
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        rate_b = np.where(volume_before > 0, tail_before / volume_before, math.nan)
        rate_a = np.where(volume_after > 0, tail_after / volume_after, math.nan)
    rate_b = np.where(np.isnan(rate_b), rate_a, rate_b)
    rate_a = np.where(np.isnan(rate_a), rate_b, rate_a)
    rate_b = np.nan_to_num(rate_b)
    rate_a = np.nan_to_num(rate_a)
    volume = (volume_after - volume_before) * rate_b
    rate = volume_after * (rate_a - rate_b)
    return volume, rate


def decompose_tail(
    sources: Mapping[LabelKey, npt.NDArray[np.int64]],
    threshold_index: int,
    windows: Windows,
    threshold_ns: float = math.nan,
    n_boot: int = DEFAULT_BOOTSTRAP,
    seed: int = 0,
    level: float = DEFAULT_LEVEL,
) -> TailDecomposition:
    """Split the excess of events in dense buckets ``> threshold_index`` over ``sources``
    (each ``[intervals, NUM_BUCKETS + 1]``) into volume and rate effects, largest share first."""
    keys = list(sources)
    if not keys:
        raise ValueError("no sources to decompose")
    counts = [np.asarray(sources[k]) for k in keys]
    tail = np.stack([c[:, threshold_index + 1 :].sum(axis=1) for c in counts], axis=1)
    volume = np.stack([c.sum(axis=1) for c in counts], axis=1)
    return decompose_rows(
        keys,
        tail.astype(np.float64),
        volume.astype(np.float64),
        windows,
        threshold_ns,
        n_boot,
        seed,
        level,
    )


def decompose_rows(
    keys: Sequence[LabelKey],
    tail: FloatArray,
    volume: FloatArray,
    windows: Windows,
    threshold_ns: float = math.nan,
    n_boot: int = DEFAULT_BOOTSTRAP,
    seed: int = 0,
    level: float = DEFAULT_LEVEL,
) -> TailDecomposition:
    """:func:`decompose_tail` from tail events and events per interval, ``[intervals, sources]``
    (what a streamed range keeps instead of every source's histograms)."""
    if not keys:
        raise ValueError("no sources to decompose")
    b, a = windows.before, windows.after

    vol, rate = kitagawa(tail[b].mean(0), volume[b].mean(0), tail[a].mean(0), volume[a].mean(0))
    rng = np.random.default_rng(seed)
    pick_b = rng.integers(0, b.stop - b.start, size=(n_boot, b.stop - b.start)) + b.start
    pick_a = rng.integers(0, a.stop - a.start, size=(n_boot, a.stop - a.start)) + a.start
    boot_vol, boot_rate = kitagawa(
        tail[pick_b].mean(1), volume[pick_b].mean(1), tail[pick_a].mean(1), volume[pick_a].mean(1)
    )
    share_point = _shares(vol + rate)
    share_low, share_high = _interval(_shares(boot_vol + boot_rate), level)
    # Volume and rate terms of every source as shares of all rising terms.
    terms_point = _shares(np.concatenate([vol, rate]))
    terms_boot = _shares(np.concatenate([boot_vol, boot_rate], axis=1))
    terms_low, terms_high = _interval(terms_boot, level)
    n = len(keys)
    whole_point = _shares(np.array([vol.sum(), rate.sum()]))
    whole = np.stack([boot_vol.sum(1), boot_rate.sum(1)], axis=1)
    whole_low, whole_high = _interval(_shares(whole), level)
    effects = []
    for s, key in enumerate(keys):
        vb, va = float(volume[b, s].mean()), float(volume[a, s].mean())
        tb, ta = float(tail[b, s].mean()), float(tail[a, s].mean())
        effects.append(
            SourceEffect(
                source=key,
                volume_before=vb,
                volume_after=va,
                rate_before=tb / vb if vb else math.nan,
                rate_after=ta / va if va else math.nan,
                volume_effect=float(vol[s]),
                rate_effect=float(rate[s]),
                share=Estimate(float(share_point[s]), float(share_low[s]), float(share_high[s])),
                volume_share=Estimate(
                    float(terms_point[s]), float(terms_low[s]), float(terms_high[s])
                ),
                rate_share=Estimate(
                    float(terms_point[n + s]), float(terms_low[n + s]), float(terms_high[n + s])
                ),
            )
        )
    effects.sort(key=lambda e: (-e.effect, e.source))
    return TailDecomposition(
        threshold_ns=threshold_ns,
        windows=windows,
        tail_before=float(tail[b].sum(1).mean()),
        tail_after=float(tail[a].sum(1).mean()),
        sources=effects,
        tail_events=int(tail[windows.before_start : windows.after_stop].sum()),
        volume_effect=float(vol.sum()),
        rate_effect=float(rate.sum()),
        volume_share=Estimate(float(whole_point[0]), float(whole_low[0]), float(whole_high[0])),
        rate_share=Estimate(float(whole_point[1]), float(whole_low[1]), float(whole_high[1])),
    )


# -- who displaced whom -------------------------------------------------------------------------


@dataclass(frozen=True)
class AggressorShare:
    """One aggressor's displaced wait of the victim (ns per interval) and share of the excess."""

    aggressor: str
    wait_before_ns: float
    wait_after_ns: float
    switches_before: float
    switches_after: float
    share_of_wait_before: float
    share_of_wait_after: float
    share: Estimate

    @property
    def excess_ns(self) -> float:
        return self.wait_after_ns - self.wait_before_ns

    @property
    def new(self) -> bool:
        """Displaced the victim after the change only (e.g. a job started then)."""
        return self.wait_before_ns == 0 and self.switches_before == 0 and self.wait_after_ns > 0

    def to_json(self) -> dict[str, Any]:
        """Plain JSON-able dict."""
        return {
            "aggressor": self.aggressor,
            "new": self.new,
            "wait_before_ns": self.wait_before_ns,
            "wait_after_ns": self.wait_after_ns,
            "excess_ns": self.excess_ns,
            "switches_before": self.switches_before,
            "switches_after": self.switches_after,
            "share_of_wait_before": _finite(self.share_of_wait_before),
            "share_of_wait_after": _finite(self.share_of_wait_after),
            "share": self.share.to_json(),
        }


@dataclass(frozen=True)
class Displacement:
    """Who displaced ``victim``: aggressors by share of the excess displaced wait."""

    victim: str
    windows: Windows
    wait_before_ns: float
    wait_after_ns: float
    aggressors: list[AggressorShare]

    @property
    def excess_ns(self) -> float:
        return self.wait_after_ns - self.wait_before_ns

    def to_json(self) -> dict[str, Any]:
        """Plain JSON-able dict."""
        return {
            "victim": self.victim,
            "windows": self.windows.to_json(),
            "wait_before_ns": self.wait_before_ns,
            "wait_after_ns": self.wait_after_ns,
            "excess_ns": self.excess_ns,
            "aggressors": [a.to_json() for a in self.aggressors],
        }


def displaced_by(
    documents: Sequence[HistDocument],
    victim: str,
    windows: Windows,
    n_boot: int = DEFAULT_BOOTSTRAP,
    seed: int = 0,
    level: float = DEFAULT_LEVEL,
) -> Displacement | None:
    """Split the victim's excess displaced run-queue wait by aggressor; None without data."""
    rows = counter_rows(documents, lambda name: name in (DISPLACED_WAIT, DISPLACED_SWITCHES))
    return displaced_by_rows(rows, len(documents), victim, windows, n_boot, seed, level)


def displaced_by_rows(
    rows: CounterRows,
    intervals: int,
    victim: str,
    windows: Windows,
    n_boot: int = DEFAULT_BOOTSTRAP,
    seed: int = 0,
    level: float = DEFAULT_LEVEL,
) -> Displacement | None:
    """:func:`displaced_by` from the range's counter rows."""
    waits: dict[str, npt.NDArray[np.float64]] = {}
    switches: dict[str, npt.NDArray[np.float64]] = {}
    for (name, key), values in rows.items():
        if name not in (DISPLACED_WAIT, DISPLACED_SWITCHES):
            continue
        labels = dict(key)
        if labels.get("victim") != victim:
            continue
        aggressor = labels.get("aggressor", "?")
        table = waits if name == DISPLACED_WAIT else switches
        row = table.setdefault(aggressor, np.zeros(intervals))
        row += values
    names = sorted(waits)
    if not names:
        return None
    matrix = np.stack([waits[n] for n in names], axis=1)
    split = excess_shares(matrix, windows, n_boot, seed, level)
    zeros = np.zeros(intervals)
    switch_rows = np.stack([switches.get(n, zeros) for n in names], axis=1)
    sw_before = switch_rows[windows.before].mean(axis=0)
    sw_after = switch_rows[windows.after].mean(axis=0)
    total_before, total_after = float(split.before.sum()), float(split.after.sum())
    aggressors = [
        AggressorShare(
            aggressor=name,
            wait_before_ns=float(split.before[s]),
            wait_after_ns=float(split.after[s]),
            switches_before=float(sw_before[s]),
            switches_after=float(sw_after[s]),
            share_of_wait_before=_ratio(float(split.before[s]), total_before),
            share_of_wait_after=_ratio(float(split.after[s]), total_after),
            share=split.share[s],
        )
        for s, name in enumerate(names)
    ]
    aggressors.sort(key=lambda a: (-a.excess_ns, a.aggressor))
    return Displacement(victim, windows, total_before, total_after, aggressors)


# -- outlier stacks -----------------------------------------------------------------------------


@dataclass(frozen=True)
class StackShift:
    """Outlier events of one (probe, cgroup, stacks) before vs after, per interval."""

    probe: str
    cgroup: str
    kernel_stack: str
    user_stack: str
    events_before: int
    events_after: int
    rate_before: float
    rate_after: float
    p_value: float
    discovered: bool
    share: Estimate

    @property
    def excess(self) -> float:
        """Extra outlier events per interval."""
        return self.rate_after - self.rate_before

    def to_json(self) -> dict[str, Any]:
        """Plain JSON-able dict."""
        return {
            "probe": self.probe,
            "cgroup": self.cgroup,
            "kernel_stack": self.kernel_stack,
            "user_stack": self.user_stack,
            "events_before": self.events_before,
            "events_after": self.events_after,
            "rate_before": self.rate_before,
            "rate_after": self.rate_after,
            "excess": self.excess,
            "p_value": self.p_value,
            "discovered": self.discovered,
            "share": self.share.to_json(),
        }


def rate_increase_p_value(
    before: int, after: int, before_intervals: int, after_intervals: int
) -> float:
    """One-sided p-value that events became more frequent: given ``before + after`` events, the
    after count is Binomial(total, after_intervals / all intervals) when the rate is unchanged."""
    from scipy.stats import binom

    total = before + after
    if total == 0:
        return 1.0
    p = after_intervals / (before_intervals + after_intervals)
    return float(binom.sf(after - 1, total, p))


def stack_shifts(
    documents: Sequence[HistDocument],
    windows: Windows,
    probe: str | None = None,
    cgroups: Sequence[str] | None = None,
    fdr: float = 0.05,
    n_boot: int = DEFAULT_BOOTSTRAP,
    seed: int = 0,
    level: float = DEFAULT_LEVEL,
) -> list[StackShift]:
    """Outlier stacks of ``probe`` (and ``cgroups``) ranked by extra events per interval,
    discoveries (BH at ``fdr`` over the one-sided rate-increase tests) first."""
    counters = counter_rows(documents, lambda name: name.endswith(OUTLIER_EVENTS_SUFFIX))
    return stack_shifts_rows(
        counters, len(documents), windows, probe, cgroups, fdr, n_boot, seed, level
    )


def stack_shifts_rows(
    counters: CounterRows,
    intervals: int,
    windows: Windows,
    probe: str | None = None,
    cgroups: Sequence[str] | None = None,
    fdr: float = 0.05,
    n_boot: int = DEFAULT_BOOTSTRAP,
    seed: int = 0,
    level: float = DEFAULT_LEVEL,
) -> list[StackShift]:
    """:func:`stack_shifts` from the range's counter rows."""
    rows: dict[tuple[str, str, str, str], npt.NDArray[np.float64]] = {}
    for (counter_name, key), values in counters.items():
        if not counter_name.endswith(OUTLIER_EVENTS_SUFFIX):
            continue
        labels = dict(key)
        name = labels.get("probe", counter_name.removesuffix(OUTLIER_EVENTS_SUFFIX))
        cgroup = labels.get("cgroup", "?")
        if probe is not None and name != probe:
            continue
        if cgroups is not None and cgroup not in cgroups:
            continue
        stack = (name, cgroup, labels.get("kernel_stack", ""), labels.get("user_stack", ""))
        row = rows.setdefault(stack, np.zeros(intervals))
        row += values
    if not rows:
        return []
    keys = sorted(rows)
    matrix = np.stack([rows[k] for k in keys], axis=1)
    split = excess_shares(matrix, windows, n_boot, seed, level)
    n_before = windows.change - windows.before_start
    n_after = windows.after_stop - windows.change
    events_before = matrix[windows.before].sum(axis=0).astype(int)
    events_after = matrix[windows.after].sum(axis=0).astype(int)
    p_values = [
        rate_increase_p_value(int(eb), int(ea), n_before, n_after)
        for eb, ea in zip(events_before, events_after, strict=True)
    ]
    found = benjamini_hochberg(p_values, fdr)
    shifts = [
        StackShift(
            probe=key[0],
            cgroup=key[1],
            kernel_stack=key[2],
            user_stack=key[3],
            events_before=int(events_before[s]),
            events_after=int(events_after[s]),
            rate_before=float(split.before[s]),
            rate_after=float(split.after[s]),
            p_value=p_values[s],
            discovered=bool(found[s]),
            share=split.share[s],
        )
        for s, key in enumerate(keys)
    ]
    shifts.sort(key=lambda x: (not x.discovered, -x.excess, x.p_value))
    return shifts


def _ratio(part: float, whole: float) -> float:
    return part / whole if whole > 0 else math.nan


def _finite(value: float) -> float | None:
    return None if math.isnan(value) else value
