"""Stage timing for the trading pipeline: CLOCK_MONOTONIC stamps per tick in preallocated arrays.

One row per tick (MoldUDP64 sequence - 1); each stage writes its stamp (``perf_counter_ns``, the
kernel's CLOCK_MONOTONIC, which the XDP program's ``bpf_ktime_get_ns`` also reads) into its
column, nothing is allocated on the hot path. A stage's latency is its stamp minus the previous
stage's. Three end-to-end series:

* ``in_system_tick_to_trade``: from when the tick could be handled (its frame's kernel receive
  stamp, or the end of the previous feed message's handling if that came later) to the order's
  ``send()``: our own latency per triggering message, what a regression gate should watch;
* ``queue``: the kernel receive stamp to that instant, the wait behind earlier feed messages
  (those of the same MoldUDP64 packet, or a backlog when the publisher outpaces the handler);
  real behaviour, so reported as its own stage, and ``in_system_with_queue`` is the sum;
* ``tick_to_trade``: the tick's *intended* send time to the order's ``send()`` (open loop: a
  stalled publisher or pipeline is charged to every tick it delayed, no coordinated omission);
* ``publish_lag``: intended to actual send, the exchange simulator's own delay, reported apart.

A span that comes out negative (a clock stepped, a stamp from another run) cannot be a latency:
it is counted per series in ``clock_anomalies`` with one example and left out of the histogram.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

from tailsight.hist import Histogram
from tailsight.intervals import Counter, HistDocument, Series

# The stage names (the document's vocabulary), re-exported for the pipeline's own modules.
from tailsight.stages import IN_SYSTEM as IN_SYSTEM
from tailsight.stages import IN_SYSTEM_WITH_QUEUE as IN_SYSTEM_WITH_QUEUE
from tailsight.stages import PROBE as STAGES_PROBE
from tailsight.stages import PUBLISH_LAG as PUBLISH_LAG
from tailsight.stages import QUEUE as QUEUE
from tailsight.stages import SERIES as SERIES
from tailsight.stages import STAGES as STAGES
from tailsight.stages import TICK_TO_TRADE as TICK_TO_TRADE
from tailsight.stages import WIRE as WIRE

KERNEL_RX, RECEIVE, DECODE, BOOK, DECISION, SEND, ACK = range(len(STAGES))  # stamp columns
UNSET: Final = -1


@dataclass(frozen=True)
class ClockAnomaly:
    """Negative spans of one series: how many, and the first one (tick row, start, end)."""

    count: int
    row: int
    start_ns: int
    end_ns: int

    def describe(self) -> str:
        return f"tick {self.row + 1}: {self.end_ns - self.start_ns} ns"


class StageTimer:
    """Preallocated stamps for ``capacity`` ticks: ``stamps[row, stage]`` in CLOCK_MONOTONIC ns."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.intended_ns: npt.NDArray[np.int64] = np.full(capacity, UNSET, dtype=np.int64)
        # When the exchange actually sent each tick (same clock, another process), if known.
        self.sent_ns: npt.NDArray[np.int64] = np.full(capacity, UNSET, dtype=np.int64)
        # When the handler was free for the tick: max(kernel receive, end of the previous feed
        # message's handling); UNSET = not known, the kernel receive stamp stands in.
        self.ready_ns: npt.NDArray[np.int64] = np.full(capacity, UNSET, dtype=np.int64)
        self.stamps: npt.NDArray[np.int64] = np.full((capacity, len(STAGES)), UNSET, np.int64)

    def stamp(self, row: int, stage: int, now_ns: int | None = None) -> None:
        """Record that ``stage`` finished tick ``row`` now (or at ``now_ns``)."""
        self.stamps[row, stage] = time.perf_counter_ns() if now_ns is None else now_ns

    def _columns(self) -> dict[str, tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]]:
        """Every series as its (start, end) stamp columns, one entry per tick."""
        stamps = self.stamps
        kernel_rx = stamps[:, KERNEL_RX]
        ready = np.where(self.ready_ns != UNSET, self.ready_ns, kernel_rx)
        columns = {WIRE: (self.sent_ns, kernel_rx), QUEUE: (kernel_rx, self.ready_ns)}
        columns[STAGES[RECEIVE]] = (ready, stamps[:, RECEIVE])
        for stage in range(RECEIVE + 1, len(STAGES)):
            columns[STAGES[stage]] = (stamps[:, stage - 1], stamps[:, stage])
        columns[IN_SYSTEM] = (ready, stamps[:, SEND])
        columns[IN_SYSTEM_WITH_QUEUE] = (kernel_rx, stamps[:, SEND])
        columns[TICK_TO_TRADE] = (self.intended_ns, stamps[:, SEND])
        columns[PUBLISH_LAG] = (self.intended_ns, self.sent_ns)
        return columns

    def latencies_ns(self, name: str) -> npt.NDArray[np.int64]:
        """Spans of one series for the ticks that have both stamps (negative ones included)."""
        start, end = self._columns()[name]
        valid = (start != UNSET) & (end != UNSET)
        return np.asarray(end[valid] - start[valid], dtype=np.int64)

    def histograms(self) -> tuple[dict[str, Histogram], dict[str, ClockAnomaly]]:
        """A histogram per series, and the negative spans left out of them, per series."""
        hists: dict[str, Histogram] = {}
        anomalies: dict[str, ClockAnomaly] = {}
        for name, (start, end) in self._columns().items():
            span = end - start
            keep = (start != UNSET) & (end != UNSET)
            negative = keep & (span < 0)
            if negative.any():
                row = int(np.argmax(negative))
                anomalies[name] = ClockAnomaly(
                    int(negative.sum()), row, int(start[row]), int(end[row])
                )
                keep &= ~negative
            hists[name] = Histogram.from_samples(np.asarray(span[keep], dtype=np.int64))
        return hists, anomalies

    def document(
        self,
        labels: Mapping[str, str],
        start_ns: int,
        end_ns: int,
        counters: Mapping[str, int] | None = None,
    ) -> HistDocument:
        """The run as ``tailsight.hist/1``: one series per stage, ``labels`` + ``stage``.

        Clock anomalies become ``clock_anomalies`` counters labelled with the series and one
        example, so a reader sees them next to the histogram they were left out of.
        """
        hists, anomalies = self.histograms()
        series = [Series({**labels, "stage": stage}, hist) for stage, hist in hists.items()]
        counter_list = [
            Counter(name, dict(labels), int(value)) for name, value in (counters or {}).items()
        ]
        counter_list += [
            Counter(
                "clock_anomalies",
                {**labels, "stage": stage, "example": anomaly.describe()},
                anomaly.count,
            )
            for stage, anomaly in anomalies.items()
        ]
        return HistDocument(start_ns=start_ns, end_ns=end_ns, series=series, counters=counter_list)


def replay_labels(path: str, xdp_mode: str, placement: str = "unpinned") -> dict[str, str]:
    """The labels every replay series carries: receive path, how XDP delivered, CPU placement."""
    return {"probe": STAGES_PROBE, "path": path, "xdp_mode": xdp_mode, "placement": placement}
