"""Live tail-jump verdicts: the online jump detector (``analysis/jumps.py``) run over the agent's
intervals, one detector per (series, quantile), with the cause attached while a jump is active:
the victim's own CPU limit (or a parent's) where it throttled the victim in those intervals,
else the aggressors' shares of the victim's extra displaced run-queue wait, counted over the
intervals no limit parked it (what runs while a cgroup is throttled displaces nothing); the
idle task is never an aggressor (its share is the wait on idle CPUs). Exported as
``tailsight_tail_jump{…}`` (1 while active) with the quantile before/after, the aggressor shares
and the throttling, and handed to ``annotate`` (the agent's wiring posts them to Grafana)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

import numpy as np

from tailsight.analysis.jumps import Jump, JumpConfig, OnlineJumpDetector
from tailsight.cgroups import is_within
from tailsight.collector.exporter import QUANTILE_LABEL, UNEXPORTED_LABELS, Family
from tailsight.hist import NUM_BUCKETS
from tailsight.intervals import CounterPairs, HistDocument
from tailsight.probes.base import IDLE_CGROUP_NAME
from tailsight.probes.runqueue import DISPLACED_WAIT
from tailsight.probes.runqueue import PROBE_NAME as RUNQUEUE
from tailsight.probes.throttle import LIMIT_LABEL, THROTTLED, cpu_max_text

# Labels that would make a verdict unbounded (stacks, tasks): series are keyed without them.
MIN_THROTTLED_SHARE: Final = 0.01
"""Share of the intervals after the change that the limit must have parked the victim (more
than before) for the verdict to put the jump on the limit."""

# The verdicts' families, as the dashboards and the demo read them.
TAIL_JUMP: Final = "tailsight_tail_jump"
TAIL_JUMP_P99_BEFORE: Final = "tailsight_tail_jump_p99_before_seconds"
TAIL_JUMP_P99_AFTER: Final = "tailsight_tail_jump_p99_after_seconds"
TAIL_JUMP_AGGRESSOR_SHARE: Final = "tailsight_tail_jump_aggressor_share"

SeriesKey = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Verdict:
    """One jump the detector confirmed, and who caused it (run-queue victims only)."""

    series: SeriesKey
    jump: Jump
    aggressor_shares: tuple[tuple[str, float], ...] = ()
    """Of the victim's extra displaced wait in the intervals no limit parked it, each
    aggressor's share (the idle task's is ``idle_share``)."""
    alarm_interval: int = 0
    idle_share: float = 0.0
    throttled: tuple[str, str, float] | None = None
    """(the cgroup whose limit parked the victim, its ``cpu.max``, the share of the time after
    the change it was parked), where its limit throttled it."""

    @property
    def labels(self) -> dict[str, str]:
        return dict(self.series)

    def text(self) -> str:
        """One line for a Grafana annotation."""
        labels = self.labels
        what = " ".join(v for k, v in self.series if k not in ("probe", "cgroup"))
        name = f"{labels.get('probe', '')} {what}".strip()
        line = (
            f"{name} of {labels.get('cgroup', '?')}: P{self.jump.quantile * 100:g} "
            f"{self.jump.before_ns / 1e3:,.0f} µs -> {self.jump.after_ns / 1e3:,.0f} µs"
        )
        if self.throttled is not None:
            limited, cpu_max, share = self.throttled
            whose = "its own" if limited == labels.get("cgroup") else "a parent's"
            line += (
                f"; throttled by {whose} CPU limit (cpu.max {cpu_max_text(cpu_max)} at "
                f"{limited}) {share:.0%} of the time"
            )
        elif self.aggressor_shares and self.aggressor_shares[0][1] >= self.idle_share:
            top, share = self.aggressor_shares[0]
            line += f"; displaced by {top} ({share:.0%} of the extra wait)"
        elif self.idle_share > 0:
            line += (
                f"; waited on idle CPUs ({self.idle_share:.0%} of the extra wait: a wake-up "
                "from idle, or steal)"
            )
        return line


@dataclass
class JumpVerdicts:
    """Feed every interval document to ``update``; ``families`` gives the Prometheus metrics.

    ``keep(cgroup)`` and ``probes`` bound the detectors (each holds up to ``reference_intervals``
    dense rows, 16 KiB each, until its reference is set): by default the run-queue series of the
    cgroups the exporter labels. A verdict stays active for ``hold_intervals`` after its alarm.
    ``annotate`` is called once per new verdict (e.g. ``GrafanaAnnotator.post``), must not raise.
    """

    config: JumpConfig = field(default_factory=JumpConfig)
    quantiles: tuple[float, ...] = (0.99,)
    hold_intervals: int = 30
    probes: tuple[str, ...] = (RUNQUEUE,)
    keep: Callable[[str], bool] = lambda cgroup: True
    annotate: Callable[[Verdict], None] | None = None
    intervals: int = 0
    idle_intervals: int = 600
    """A detector whose series had no samples for this long is dropped (a removed cgroup)."""
    _detectors: dict[tuple[SeriesKey, float], OnlineJumpDetector] = field(default_factory=dict)
    _last_seen: dict[SeriesKey, int] = field(default_factory=dict)
    _displaced: deque[dict[tuple[str, str], float]] = field(default_factory=deque)
    # Per interval: throttled share of the interval by (cgroup, cpu.max)
    _throttled: deque[dict[tuple[str, str], float]] = field(default_factory=deque)
    _active: list[Verdict] = field(default_factory=list)

    def __post_init__(self) -> None:
        # The detectors' tests come from scipy.stats, whose first import costs ~0.55 s here:
        # taken now, at agent start, not inside the interval that sets the first references
        # (the 30th), which it held up that long.
        import scipy.stats  # noqa: F401

    def update(self, document: HistDocument) -> list[Verdict]:
        """Run every detector on this interval; the verdicts it newly confirmed."""
        rows: dict[SeriesKey, np.ndarray] = {}
        for series in document.series:
            cgroup = series.labels.get("cgroup")
            if series.labels.get("probe") not in self.probes or cgroup is None:
                continue
            if not self.keep(cgroup):
                continue
            key = _key(series.labels)
            row = rows.get(key)
            if row is None:
                row = rows[key] = np.zeros(NUM_BUCKETS + 1, dtype=np.int64)
            sparse = series.sparse
            row[sparse.index] += sparse.count
            row[NUM_BUCKETS] += sparse.overflow
        displaced: dict[tuple[str, str], float] = {}
        throttled: dict[tuple[str, str], float] = {}
        for part in document.counter_parts():
            if isinstance(part, CounterPairs):  # read as arrays: thousands on a busy host
                pairs = part.pairs
                if DISPLACED_WAIT in pairs.names:
                    cells = pairs.moved_cells(pairs.names.index(DISPLACED_WAIT))
                    for victim, aggressor, value in zip(*cells, strict=True):
                        pair = (victim, aggressor)
                        displaced[pair] = displaced.get(pair, 0.0) + value
                part = part.others
            for counter in part:
                if counter.name == DISPLACED_WAIT:
                    pair = (counter.labels.get("victim", ""), counter.labels.get("aggressor", ""))
                    displaced[pair] = displaced.get(pair, 0.0) + counter.value
                elif counter.name == THROTTLED and counter.value:
                    limit = (counter.labels.get("cgroup", ""), counter.labels.get(LIMIT_LABEL, ""))
                    span_ns = max(1, document.end_ns - document.start_ns)
                    throttled[limit] = throttled.get(limit, 0.0) + counter.value / span_ns
        self._displaced.append(displaced)
        self._throttled.append(throttled)
        while len(self._displaced) > 4 * self.config.reference_intervals:
            self._displaced.popleft()
            self._throttled.popleft()
        new: list[Verdict] = []
        for key, row in rows.items():
            for q in self.quantiles:
                detector = self._detectors.get((key, q))
                if detector is None:
                    config = JumpConfig(**{**vars(self.config), "quantile": q})
                    detector = self._detectors[(key, q)] = OnlineJumpDetector(config, key)
                jump = detector.update(row, document.start_ns)
                if jump is not None and jump.confirmed and jump.direction == "up":
                    new.append(self._verdict(key, jump))
        self.intervals += 1
        for key in rows:
            self._last_seen[key] = self.intervals
        if self.intervals % self.idle_intervals == 0:
            self._drop_idle()
        self._active = [
            v for v in self._active if self.intervals - v.alarm_interval < self.hold_intervals
        ]
        self._active.extend(new)
        if self.annotate is not None:
            for verdict in new:
                self.annotate(verdict)
        return new

    def _drop_idle(self) -> None:
        idle = {
            k for k, seen in self._last_seen.items() if self.intervals - seen >= self.idle_intervals
        }
        for key in idle:
            del self._last_seen[key]
        self._detectors = {k: d for k, d in self._detectors.items() if k[0] not in idle}

    def _verdict(self, key: SeriesKey, jump: Jump) -> Verdict:
        """The victim's limit where it throttled the victim more after the change than before;
        aggressor shares of its extra displaced wait over the intervals it was not parked."""
        victim = dict(key).get("cgroup", "")
        after_len = jump.alarm_index - jump.change_index + 1
        # Per interval, how much of it the limits of the victim and its parents parked it.
        parked = [
            {limit: share for limit, share in interval.items() if is_within(victim, limit[0])}
            for interval in self._throttled
        ]
        throttled = None
        limits = {limit for interval in parked for limit in interval}
        if limits:
            rise = {
                limit: _mean(i.get(limit, 0.0) for i in parked[-after_len:])
                - _mean(i.get(limit, 0.0) for i in parked[:-after_len])
                for limit in limits
            }
            top = max(rise, key=lambda limit: rise[limit])
            if rise[top] >= MIN_THROTTLED_SHARE:
                after_share = _mean(i.get(top, 0.0) for i in parked[-after_len:])
                throttled = (top[0], top[1], after_share)
        free = [not interval for interval in parked]
        history = [i for i, unparked in zip(self._displaced, free, strict=True) if unparked]
        after_free = sum(free[-after_len:])
        after, before = history[len(history) - after_free :], history[: len(history) - after_free]
        excess: dict[str, float] = {}
        for aggressor in {a for interval in history for (v, a) in interval if v == victim}:
            mean_after = _mean(i.get((victim, aggressor), 0.0) for i in after)
            mean_before = _mean(i.get((victim, aggressor), 0.0) for i in before)
            if after and before and mean_after - mean_before > 0:
                excess[aggressor] = mean_after - mean_before
        total = sum(excess.values())
        idle_share = excess.pop(IDLE_CGROUP_NAME, 0.0) / total if total > 0 else 0.0
        shares = tuple(
            sorted(((a, e / total) for a, e in excess.items()), key=lambda item: -item[1])
        )
        return Verdict(key, jump, shares, self.intervals + 1, idle_share, throttled)

    @property
    def active(self) -> list[Verdict]:
        return list(self._active)

    def families(self) -> list[Family]:
        """``tailsight_tail_jump`` and its companions for the active verdicts (the exporter
        serves them with its own families)."""
        names = sorted({k for v in self._active for k, _ in v.series} | {"cgroup", "probe"})
        active = Family(
            TAIL_JUMP, "gauge", "1 while a confirmed tail jump of the series is active."
        )
        before = Family(
            TAIL_JUMP_P99_BEFORE,
            "gauge",
            "The jump's tail quantile before the change.",
        )
        after = Family(
            TAIL_JUMP_P99_AFTER,
            "gauge",
            "The jump's tail quantile after the change.",
        )
        share = Family(
            TAIL_JUMP_AGGRESSOR_SHARE,
            "gauge",
            "Share of the victim's extra displaced wait each aggressor caused, over the "
            "intervals no CPU limit parked it (the idle task is no aggressor).",
        )
        idle = Family(
            "tailsight_tail_jump_idle_share",
            "gauge",
            "Share of the victim's extra displaced wait spent on idle CPUs (a wake-up from "
            "idle, or steal).",
        )
        throttled = Family(
            "tailsight_tail_jump_throttled_share",
            "gauge",
            "Share of the time since the change a CPU limit (the victim's own, or a parent's: "
            "limited_cgroup, cpu_max) parked the victim.",
        )
        for verdict in self._active:
            pairs = tuple((n, verdict.labels.get(n, "")) for n in names)
            pairs += (
                (QUANTILE_LABEL, str(verdict.jump.quantile)),
                ("direction", verdict.jump.direction),
            )
            active.add(pairs, 1.0)
            before.add(pairs, verdict.jump.before_ns / 1e9)
            after.add(pairs, verdict.jump.after_ns / 1e9)
            for aggressor, fraction in verdict.aggressor_shares:
                share.add((*pairs, ("aggressor", aggressor)), fraction)
            if verdict.idle_share > 0:
                idle.add(pairs, verdict.idle_share)
            if verdict.throttled is not None:
                limited, cpu_max, parked = verdict.throttled
                throttled.add((*pairs, ("limited_cgroup", limited), (LIMIT_LABEL, cpu_max)), parked)
        return [active, before, after, share, idle, throttled]


def _key(labels: Mapping[str, str]) -> SeriesKey:
    return tuple(sorted((k, v) for k, v in labels.items() if k not in UNEXPORTED_LABELS))


def _mean(values: Iterable[float]) -> float:
    items = list(values)
    return sum(items) / len(items) if items else 0.0
