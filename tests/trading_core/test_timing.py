"""Stage timing: latencies and histograms checked against a plain-Python reference per tick."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tailsight.hist import Histogram
from tailsight.intervals import HistDocument
from tailsight.trading_core.timing import (
    IN_SYSTEM,
    IN_SYSTEM_WITH_QUEUE,
    KERNEL_RX,
    PUBLISH_LAG,
    QUEUE,
    RECEIVE,
    SEND,
    SERIES,
    STAGES,
    TICK_TO_TRADE,
    UNSET,
    WIRE,
    StageTimer,
    replay_labels,
)


def _reference(
    intended: list[int], sent: list[int], ready: list[int], rows: list[list[int]]
) -> dict[str, list[int]]:
    """Every series, tick by tick, the obvious way (negative spans included)."""
    spans: dict[str, list[int]] = {name: [] for name in SERIES}

    def add(name: str, start: int, end: int) -> None:
        if start != UNSET and end != UNSET:
            spans[name].append(end - start)

    for start, sent_at, ready_at, row in zip(intended, sent, ready, rows, strict=True):
        handled_from = row[KERNEL_RX] if ready_at == UNSET else ready_at
        add(WIRE, sent_at, row[KERNEL_RX])
        add(QUEUE, row[KERNEL_RX], ready_at)
        add(STAGES[RECEIVE], handled_from, row[RECEIVE])
        for stage in range(RECEIVE + 1, len(STAGES)):
            add(STAGES[stage], row[stage - 1], row[stage])
        add(IN_SYSTEM, handled_from, row[SEND])
        add(IN_SYSTEM_WITH_QUEUE, row[KERNEL_RX], row[SEND])
        add(TICK_TO_TRADE, start, row[SEND])
        add(PUBLISH_LAG, start, sent_at)
    return spans


_STAMP = st.one_of(st.just(UNSET), st.integers(0, 10**9))


@st.composite
def _ticks(draw: st.DrawFn) -> tuple[list[int], list[int], list[int], list[list[int]]]:
    count = draw(st.integers(1, 30))
    intended = draw(st.lists(_STAMP, min_size=count, max_size=count))
    sent = draw(st.lists(_STAMP, min_size=count, max_size=count))
    ready = draw(st.lists(_STAMP, min_size=count, max_size=count))
    rows = [draw(st.lists(_STAMP, min_size=len(STAGES), max_size=len(STAGES))) for _ in intended]
    return intended, sent, ready, rows


@settings(max_examples=80, deadline=None)
@given(_ticks())
def test_histograms_and_anomalies_match_per_tick_reference(
    ticks: tuple[list[int], list[int], list[int], list[list[int]]],
) -> None:
    """Arbitrary stamps, out of order included: every non-negative span lands in its series'
    histogram, every negative one is counted in that series' anomalies, nothing raises."""
    intended, sent, ready, rows = ticks
    timer = StageTimer(len(rows))
    timer.intended_ns[:] = intended
    timer.sent_ns[:] = sent
    timer.ready_ns[:] = ready
    timer.stamps[:] = rows
    expected = _reference(intended, sent, ready, rows)
    histograms, anomalies = timer.histograms()
    assert set(histograms) == set(SERIES)
    for name, spans in expected.items():
        good = [span for span in spans if span >= 0]
        assert histograms[name] == Histogram.from_samples(np.array(good, dtype=np.int64)), name
        bad = [span for span in spans if span < 0]
        if bad:
            assert anomalies[name].count == len(bad)
            assert anomalies[name].end_ns - anomalies[name].start_ns == bad[0]
        else:
            assert name not in anomalies


def test_negative_span_is_counted_with_an_example_not_raised() -> None:
    """A kernel stamp after the order's send (a clock step) is counted as a clock anomaly with
    an example, not raised as ``ValueError: negative latency``, which would abort the replay."""
    timer = StageTimer(3)
    timer.intended_ns[:] = [0, 1_000, 2_000]
    timer.stamps[:, KERNEL_RX] = [10_000, 30_000_000, 12_000]
    timer.stamps[:, SEND] = [40_000, 10_620_117, 52_000]  # tick 2: 19,379,883 ns "before"
    document = timer.document(replay_labels("udp", "none"), 0, 1)
    (in_system,) = document.find(stage=IN_SYSTEM)
    assert in_system.hist.count == 2
    assert in_system.hist.sum_ns == 30_000 + 40_000
    anomalies = {c.labels["stage"]: c for c in document.counters if c.name == "clock_anomalies"}
    assert set(anomalies) == {IN_SYSTEM, IN_SYSTEM_WITH_QUEUE}  # no ready time: the same span
    anomaly = anomalies[IN_SYSTEM]
    assert anomaly.value == 1
    assert anomaly.labels["example"] == "tick 2: -19379883 ns"
    again = HistDocument.loads(document.dumps())
    assert [c.value for c in again.counters if c.name == "clock_anomalies"] == [1, 1]


def test_open_loop_counts_from_intended_time_not_from_arrival_order() -> None:
    # Ticks due every 10 µs arrive together after a 1 ms stall: each open-loop latency is from
    # its own intended time, so the stall is charged to every tick it delayed.
    timer = StageTimer(5)
    timer.intended_ns[:] = np.arange(5) * 10_000
    timer.stamps[:, SEND] = 1_000_000
    assert timer.latencies_ns(TICK_TO_TRADE).tolist() == [1_000_000 - 10_000 * i for i in range(5)]


def test_in_system_is_kernel_receive_to_send_and_excludes_publish_lag() -> None:
    timer = StageTimer(2)
    timer.intended_ns[:] = [0, 0]
    timer.sent_ns[:] = [500_000, 600_000]  # the publisher was half a millisecond late
    timer.stamps[:, KERNEL_RX] = [510_000, 610_000]
    timer.stamps[:, RECEIVE] = [515_000, 612_000]
    timer.stamps[:, SEND] = [540_000, UNSET]  # tick 2 led to no order
    assert timer.latencies_ns(IN_SYSTEM).tolist() == [30_000]
    assert timer.latencies_ns(TICK_TO_TRADE).tolist() == [540_000]
    assert timer.latencies_ns(PUBLISH_LAG).tolist() == [500_000, 600_000]
    assert timer.latencies_ns(WIRE).tolist() == [10_000, 10_000]
    assert timer.latencies_ns(STAGES[RECEIVE]).tolist() == [5_000, 2_000]


def test_document_round_trips_with_labels_and_counters() -> None:
    timer = StageTimer(2)
    timer.intended_ns[:] = [0, 100]
    timer.sent_ns[:] = [1_000, UNSET]
    for stage in range(len(STAGES)):
        timer.stamp(0, stage, 6_000 * (stage + 1))
    labels = replay_labels("afxdp", "copy/skb", "exchange=0,trading=1")
    document = timer.document(labels, 10, 20, {"gaps_detected": 3})
    again = HistDocument.loads(document.dumps())
    assert {s.labels["stage"] for s in again.series} == set(SERIES)
    for series in again.series:
        assert series.labels["probe"] == "replay"
        assert series.labels["path"] == "afxdp"
        assert series.labels["xdp_mode"] == "copy/skb"
        assert series.labels["placement"] == "exchange=0,trading=1"
    (in_system,) = again.find(stage=IN_SYSTEM)
    assert in_system.hist.count == 1
    assert in_system.hist.sum_ns == 6_000 * (SEND + 1) - 6_000 * (KERNEL_RX + 1)
    assert [(c.name, c.value) for c in again.counters] == [("gaps_detected", 3)]


def test_wait_behind_earlier_messages_is_the_queue_stage_not_in_system() -> None:
    """The second message of a packet is not charged the first one's handling (order send
    included) in in-system tick-to-trade or in "decode" (stamped from the packet's pickup): it
    counts from when the handler was free; the wait is ``queue``."""
    timer = StageTimer(2)
    # One packet, both messages received by the kernel at 100 µs; the first is handled
    # 105-160 µs (its order sent at 150 µs), the second 160-190 µs.
    timer.stamps[:, KERNEL_RX] = [100_000, 100_000]
    timer.ready_ns[:] = [100_000, 160_000]
    timer.stamps[:, RECEIVE] = [105_000, 161_000]
    timer.stamps[:, SEND] = [150_000, 190_000]
    assert timer.latencies_ns(IN_SYSTEM).tolist() == [50_000, 30_000]
    assert timer.latencies_ns(QUEUE).tolist() == [0, 60_000]
    assert timer.latencies_ns(IN_SYSTEM_WITH_QUEUE).tolist() == [50_000, 90_000]
    assert timer.latencies_ns(STAGES[RECEIVE]).tolist() == [5_000, 1_000]
