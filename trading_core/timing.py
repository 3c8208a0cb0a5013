"""Stage timing for the trading pipeline: perf_counter_ns stamps per tick in preallocated arrays.

One row per tick (MoldUDP64 sequence - 1). Each stage writes its stamp into its column; nothing
is allocated on the hot path. A stage's latency is its stamp minus the previous stage's, the first
stage (receive) counts from the tick's *intended* send time, and tick-to-trade runs from the
intended send time to the order leaving: measuring from the schedule, not from when the sender
got round to it, is what keeps a stalled pipeline from hiding its own backlog (coordinated
omission). Everything ends up as 5 µs histograms in one ``tailsight.hist/1`` document.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Final

import numpy as np
import numpy.typing as npt

from tailsight.hist import Histogram
from tailsight.histfile import Counter, HistDocument, Series

STAGES: Final = ("receive", "decode", "book", "decision", "encode", "send", "ack")
"""Pipeline stages in order; each stamps when it is done with the tick."""
RECEIVE, DECODE, BOOK, DECISION, ENCODE, SEND, ACK = range(len(STAGES))
TICK_TO_TRADE: Final = "tick_to_trade"
PUBLISH_LAG: Final = "publish_lag"
"""Intended send time to the exchange's actual send: the publisher's own delay."""
WIRE: Final = "wire"
"""Actual send to receive in user space: the network path under test (XDP/AF_XDP or UDP)."""
UNSET: Final = -1


class StageTimer:
    """Preallocated stamps for ``capacity`` ticks: ``stamps[row, stage]`` in perf_counter_ns."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.intended_ns: npt.NDArray[np.int64] = np.full(capacity, UNSET, dtype=np.int64)
        self.exchange_ts_ns: npt.NDArray[np.int64] = np.full(capacity, UNSET, dtype=np.int64)
        # When the exchange actually sent each tick (same clock, another process), if known.
        self.sent_ns: npt.NDArray[np.int64] = np.full(capacity, UNSET, dtype=np.int64)
        self.stamps: npt.NDArray[np.int64] = np.full((capacity, len(STAGES)), UNSET, np.int64)

    def stamp(self, row: int, stage: int, now_ns: int | None = None) -> None:
        """Record that ``stage`` finished tick ``row`` now (or at ``now_ns``)."""
        self.stamps[row, stage] = time.perf_counter_ns() if now_ns is None else now_ns

    def stage_latencies_ns(self, stage: int) -> npt.NDArray[np.int64]:
        """Latency of ``stage`` for every tick that reached it (receive: from intended send)."""
        done = self.stamps[:, stage]
        start = self.intended_ns if stage == RECEIVE else self.stamps[:, stage - 1]
        valid = (done != UNSET) & (start != UNSET)
        return np.asarray(done[valid] - start[valid], dtype=np.int64)

    def tick_to_trade_ns(self) -> npt.NDArray[np.int64]:
        """Intended tick send time to order sent, for ticks that led to an order."""
        sent = self.stamps[:, SEND]
        valid = (sent != UNSET) & (self.intended_ns != UNSET)
        return np.asarray(sent[valid] - self.intended_ns[valid], dtype=np.int64)

    def receive_split_ns(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """The receive stage in two: (publish lag, wire) for ticks with a known actual send."""
        sent, received = self.sent_ns, self.stamps[:, RECEIVE]
        valid = (sent != UNSET) & (received != UNSET) & (self.intended_ns != UNSET)
        lag = sent[valid] - self.intended_ns[valid]
        wire = received[valid] - sent[valid]
        return np.asarray(lag, dtype=np.int64), np.asarray(wire, dtype=np.int64)

    def histograms(self) -> dict[str, Histogram]:
        """All stages, tick-to-trade, the receive split; a negative span (clock misuse) raises."""
        result = {
            name: Histogram.from_samples(self.stage_latencies_ns(index))
            for index, name in enumerate(STAGES)
        }
        result[TICK_TO_TRADE] = Histogram.from_samples(self.tick_to_trade_ns())
        lag, wire = self.receive_split_ns()
        result[PUBLISH_LAG] = Histogram.from_samples(lag)
        result[WIRE] = Histogram.from_samples(wire)
        return result

    def document(
        self,
        labels: Mapping[str, str],
        start_ns: int,
        end_ns: int,
        counters: Mapping[str, int] | None = None,
    ) -> HistDocument:
        """The run as ``tailsight.hist/1``: one series per stage, ``labels`` + ``stage``."""
        series = [
            Series({**labels, "stage": stage}, hist) for stage, hist in self.histograms().items()
        ]
        counter_list = [
            Counter(name, dict(labels), int(value)) for name, value in (counters or {}).items()
        ]
        return HistDocument(start_ns=start_ns, end_ns=end_ns, series=series, counters=counter_list)


def replay_labels(path: str, xdp_mode: str) -> dict[str, str]:
    """The labels every replay series carries: which receive path and how XDP delivered."""
    return {"probe": "replay", "path": path, "xdp_mode": xdp_mode}
