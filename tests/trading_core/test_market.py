"""The synthetic market: determinism, day structure, message mix, and a book that never crosses.

The book-level checks use the naive reference book, not the ``Book`` the generator steers by.
"""

from __future__ import annotations

import io
from collections import Counter
from pathlib import Path

import pytest

from tailsight.trading_core import itch
from tailsight.trading_core.itch_file import FramingReport, iter_itch
from tailsight.trading_core.market import (
    TICK,
    generate_day,
    symbol_names,
    write_day,
    write_moldudp64,
)
from tailsight.trading_core.moldudp64 import MoldReceiver, decode_packet
from tests.trading_core.naive_book import NaiveBook

ORDER_TYPES = itch.AddOrder | itch.AddOrderMPID


@pytest.fixture(scope="module")
def day() -> list[itch.Message]:
    return list(generate_day(42, symbols=5, messages=20_000))


def test_same_seed_same_bytes_other_seed_differs() -> None:
    a = [itch.encode(m) for m in generate_day(1, symbols=3, messages=3_000)]
    b = [itch.encode(m) for m in generate_day(1, symbols=3, messages=3_000)]
    c = [itch.encode(m) for m in generate_day(2, symbols=3, messages=3_000)]
    assert a == b
    assert a != c


def test_exact_count_and_nondecreasing_timestamps(day: list[itch.Message]) -> None:
    assert len(day) == 20_000
    stamps = [m.timestamp_ns for m in day]
    assert stamps == sorted(stamps)
    assert all(m == itch.decode(itch.encode(m)) for m in day[:2000])


def test_day_structure(day: list[itch.Message]) -> None:
    events = [(i, m.event_code) for i, m in enumerate(day) if isinstance(m, itch.SystemEvent)]
    assert [code for _, code in events] == ["O", "S", "Q", "M", "E", "C"]
    assert events[0][0] == 0 and events[-1][0] == len(day) - 1
    first_order = next(i for i, m in enumerate(day) if isinstance(m, ORDER_TYPES))
    directory = [m for m in day[:first_order] if isinstance(m, itch.StockDirectory)]
    actions = [m for m in day[:first_order] if isinstance(m, itch.StockTradingAction)]
    assert [m.stock for m in directory] == symbol_names(5)
    assert [m.stock_locate for m in directory] == [1, 2, 3, 4, 5]
    assert {(m.stock_locate, m.trading_state) for m in actions} == {(i, "T") for i in range(1, 6)}
    # Order flow happens in all three sessions: pre-market, market hours, post-market.
    q_at, m_at = events[2][0], events[3][0]
    assert any(isinstance(m, ORDER_TYPES) for m in day[events[1][0] : q_at])
    assert any(isinstance(m, ORDER_TYPES) for m in day[m_at:])
    assert day[q_at].timestamp_ns == 34_200 * 10**9  # 09:30:00 in ns since midnight


def test_message_mix(day: list[itch.Message]) -> None:
    kinds = Counter(m.message_type.decode() for m in day)
    share = {k: v / len(day) for k, v in kinds.items()}
    adds = share["A"] + share["F"]
    assert adds > 0.42 and adds == max(adds, share["D"], share["E"])
    assert 0.25 < share["D"] + share["X"] < 0.45
    assert 0.03 < share["E"] < 0.2
    assert 0.01 < share["U"] < 0.08
    assert 0 < share["C"] < 0.02
    assert 0 < share["P"] < 0.05
    assert 0 < share["F"] < share["A"] / 5


def test_prices_on_tick_grid_and_references_unique(day: list[itch.Message]) -> None:
    refs = []
    for m in day:
        if isinstance(m, ORDER_TYPES | itch.OrderReplace):
            assert m.price > 0 and m.price % TICK == 0
            assert 0 < m.shares < 1_000_000
        if isinstance(m, ORDER_TYPES):
            refs.append(m.order_reference_number)
        elif isinstance(m, itch.OrderReplace):
            refs.append(m.new_order_reference_number)
    assert len(refs) == len(set(refs))
    assert refs == sorted(refs)  # references increase through the day, as on NASDAQ


def test_naive_book_never_crosses_and_all_references_resolve(day: list[itch.Message]) -> None:
    naive = NaiveBook()
    state = dict.fromkeys(range(1, 6), "T")
    halted_executions = 0
    market_open = False
    checked = 0
    for m in day:
        naive.apply(m)
        if isinstance(m, itch.SystemEvent):
            market_open = m.event_code == "Q" or (market_open and m.event_code != "M")
        elif isinstance(m, itch.StockTradingAction):
            state[m.stock_locate] = m.trading_state
        if isinstance(m, itch.OrderExecuted | itch.OrderExecutedWithPrice | itch.Trade):
            halted_executions += state[m.stock_locate] != "T"
        if m.stock_locate and isinstance(m, ORDER_TYPES | itch.OrderReplace):
            bid, _, ask, _ = naive.top_of_book(m.stock_locate)
            assert not (bid and ask and bid >= ask), m
            checked += market_open
    assert naive.errors == {}  # no unknown reference, no oversized fill or cancel
    assert halted_executions == 0
    assert checked > 5_000


def test_one_halt_and_resume_in_market_hours(day: list[itch.Message]) -> None:
    q_at = next(i for i, m in enumerate(day) if getattr(m, "event_code", "") == "Q")
    m_at = next(i for i, m in enumerate(day) if getattr(m, "event_code", "") == "M")
    actions = [m for m in day[q_at:m_at] if isinstance(m, itch.StockTradingAction)]
    assert [(m.stock_locate, m.trading_state) for m in actions] == [(2, "H"), (2, "Q"), (2, "T")]
    assert actions[0].reason == "T1"


def test_symbols_argument() -> None:
    assert symbol_names(2) == ["AAPL", "MSFT"]
    assert symbol_names(18)[-1] == "SYM0017"
    assert symbol_names(["aapl", "ibm"]) == ["AAPL", "IBM"]
    for bad in ([], ["A", "A"], ["NINECHARS"]):
        with pytest.raises(ValueError):
            symbol_names(bad)
    names = {m.stock for m in generate_day(0, ["IBM"], 300) if isinstance(m, ORDER_TYPES)}
    assert names == {"IBM"}


def test_write_day_round_trips_through_itch_file(tmp_path: Path) -> None:
    expected = [itch.encode(m) for m in generate_day(8, symbols=2, messages=2_000)]
    for name in ("day.itch", "day.itch.gz"):
        write_day(tmp_path / name, seed=8, symbols=2, messages=2_000)
        report = FramingReport()
        assert [raw for _, raw in iter_itch(tmp_path / name, report)] == expected
        assert report.clean


def test_write_moldudp64_packets_carry_the_day_in_sequence(tmp_path: Path) -> None:
    expected = [itch.encode(m) for m in generate_day(4, symbols=3, messages=25_000)]
    path = tmp_path / "day.mold"
    count = write_moldudp64(
        path, seed=4, symbols=3, messages=25_000, session="DAY4", max_payload=1000
    )
    data = path.read_bytes()
    packets, offset = [], 0
    while offset < len(data):
        length = int.from_bytes(data[offset : offset + 2], "big")
        packets.append(data[offset + 2 : offset + 2 + length])
        offset += 2 + length
    assert offset == len(data) and len(packets) == count
    assert max(len(p) for p in packets) <= 1000
    receiver = MoldReceiver()
    delivered: list[tuple[int, bytes]] = []
    for raw in packets:
        delivery = receiver.on_packet(raw)
        assert delivery.request is None  # no gap anywhere
        delivered += delivery.messages
    assert [seq for seq, _ in delivered] == list(range(1, len(expected) + 1))
    assert [msg for _, msg in delivered] == expected
    last = decode_packet(packets[-1])
    assert last.end_of_session and last.sequence_number == len(expected) + 1
    assert {decode_packet(p).session for p in packets} == {"DAY4"}
    # Packets are full except at the end: the 10k-message groups leave no half-empty packets.
    sizes = [len(p) for p in packets[:-2]]
    assert min(sizes) > 1000 - 2 - max(itch.MESSAGE_LENGTHS.values())
    stream = io.BytesIO()
    assert write_moldudp64(stream, seed=4, symbols=3, messages=25_000, session="DAY4",
                           max_payload=1000) == count  # fmt: skip
    assert stream.getvalue() == data
