"""Stage timing: latencies and histograms checked against a plain-Python reference per tick."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tailsight.hist import Histogram
from tailsight.histfile import HistDocument
from tailsight.trading_core.timing import (
    ACK,
    PUBLISH_LAG,
    RECEIVE,
    SEND,
    STAGES,
    TICK_TO_TRADE,
    UNSET,
    WIRE,
    StageTimer,
    replay_labels,
)


def _reference(intended: list[int], rows: list[list[int]]) -> dict[str, list[int]]:
    """Per-stage and tick-to-trade spans, tick by tick, the obvious way."""
    spans: dict[str, list[int]] = {name: [] for name in (*STAGES, TICK_TO_TRADE)}
    for start, row in zip(intended, rows, strict=True):
        previous = start
        for stage, stamp in enumerate(row):
            if stamp != UNSET and previous != UNSET:
                spans[STAGES[stage]].append(stamp - previous)
            previous = stamp
        if row[SEND] != UNSET:
            spans[TICK_TO_TRADE].append(row[SEND] - start)
    return spans


@st.composite
def _ticks(draw: st.DrawFn) -> tuple[list[int], list[list[int]]]:
    count = draw(st.integers(1, 40))
    intended, rows = [], []
    for _ in range(count):
        start = draw(st.integers(0, 10**12))
        reached = draw(st.integers(0, len(STAGES)))  # stages the tick went through
        stamps, now = [], start
        for _stage in range(reached):
            now += draw(st.integers(0, 20_000_000))
            stamps.append(now)
        intended.append(start)
        rows.append(stamps + [UNSET] * (len(STAGES) - reached))
    return intended, rows


@settings(max_examples=60, deadline=None)
@given(_ticks())
def test_histograms_match_per_tick_reference(ticks: tuple[list[int], list[list[int]]]) -> None:
    intended, rows = ticks
    timer = StageTimer(len(rows))
    timer.intended_ns[:] = intended
    for row, stamps in enumerate(rows):
        for stage, stamp in enumerate(stamps):
            if stamp != UNSET:
                timer.stamp(row, stage, stamp)
    expected = _reference(intended, rows)
    histograms = timer.histograms()
    assert set(histograms) == {*expected, PUBLISH_LAG, WIRE}
    assert histograms[PUBLISH_LAG].count == histograms[WIRE].count == 0  # no send times given
    for name, spans in expected.items():
        assert histograms[name] == Histogram.from_samples(np.array(spans, dtype=np.int64)), name
        assert histograms[name].sum_ns == sum(spans)


def test_receive_counts_from_intended_time_not_from_arrival_order() -> None:
    # Ticks due every 10 µs arrive together after a 1 ms stall: each latency is from its own
    # intended time, so the stall is charged to every tick it delayed (no coordinated omission).
    timer = StageTimer(5)
    timer.intended_ns[:] = np.arange(5) * 10_000
    for row in range(5):
        timer.stamp(row, RECEIVE, 1_000_000)
    assert timer.stage_latencies_ns(RECEIVE).tolist() == [1_000_000 - 10_000 * i for i in range(5)]


def test_unstamped_ticks_are_left_out() -> None:
    timer = StageTimer(3)
    timer.intended_ns[:] = [0, 0, UNSET]
    timer.stamp(0, RECEIVE, 7_000)
    timer.stamp(2, RECEIVE, 9_000)  # never intended: not a tick of this run
    assert timer.stage_latencies_ns(RECEIVE).tolist() == [7_000]
    assert timer.stage_latencies_ns(ACK).size == 0
    assert timer.tick_to_trade_ns().size == 0


def test_document_round_trips_with_labels_and_counters(tmp_path: object) -> None:
    timer = StageTimer(2)
    timer.intended_ns[:] = [0, 100]
    for stage in range(len(STAGES)):
        timer.stamp(0, stage, 6_000 * (stage + 1))
    labels = replay_labels("afxdp", "copy/skb")
    document = timer.document(labels, 10, 20, {"gaps_detected": 3})
    again = HistDocument.loads(document.dumps())
    assert {s.labels["stage"] for s in again.series} == {*STAGES, TICK_TO_TRADE, PUBLISH_LAG, WIRE}
    for series in again.series:
        assert series.labels["probe"] == "replay"
        assert series.labels["path"] == "afxdp"
        assert series.labels["xdp_mode"] == "copy/skb"
    (tick_to_trade,) = again.find(stage=TICK_TO_TRADE)
    assert tick_to_trade.hist.count == 1
    assert tick_to_trade.hist.sum_ns == 6_000 * (SEND + 1)
    assert [(c.name, c.value) for c in again.counters] == [("gaps_detected", 3)]


def test_receive_splits_into_publish_lag_and_wire_exactly() -> None:
    timer = StageTimer(4)
    timer.intended_ns[:] = [0, 1_000, 2_000, 3_000]
    timer.sent_ns[:] = [500, 1_000, UNSET, 9_000]  # tick 2: send time unknown
    for row, received in enumerate([20_500, 8_000, 4_000, 9_001]):
        timer.stamp(row, RECEIVE, received)
    lag, wire = timer.receive_split_ns()
    assert lag.tolist() == [500, 0, 6_000]
    assert wire.tolist() == [20_000, 7_000, 1]
    histograms = timer.histograms()
    known = [0, 1, 3]
    receive_known = sum(int(timer.stamps[r, RECEIVE] - timer.intended_ns[r]) for r in known)
    assert histograms[PUBLISH_LAG].sum_ns + histograms[WIRE].sum_ns == receive_known
