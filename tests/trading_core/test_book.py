"""Unit tests of the L3 book: queue priority, each message type, faults, debug invariants.

Expected values are written out by hand from the ITCH 5.0 semantics (sections 1.3-1.5), and a
hypothesis state machine drives random operation sequences against the naive reference book.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tailsight.trading_core import itch
from tailsight.trading_core.book import Book, BookInvariantError, LevelView, TopOfBook
from tailsight.trading_core.itch_file import iter_itch
from tailsight.trading_core.market import write_day
from tests.trading_core.naive_book import NaiveBook

AAPL = 7


def _book(debug: bool = False) -> Book:
    book = Book(debug=debug)
    book.system_event("Q")  # market hours: the crossed-book check is live
    return book


def test_fifo_priority_and_level_totals() -> None:
    book = _book()
    book.add(AAPL, 1, "B", 1_000_000, 100)
    book.add(AAPL, 2, "B", 1_000_000, 200)
    book.add(AAPL, 3, "B", 1_000_000, 300)
    book.add(AAPL, 4, "B", 999_900, 50)
    assert book.queue(AAPL, "B", 1_000_000) == [1, 2, 3]
    assert book.top_of_book(AAPL) == TopOfBook(1_000_000, 600, 0, 0)
    trade = book.execute(1, 100, timestamp_ns=5, match_number=9)
    assert trade is not None
    assert (trade.price, trade.shares, trade.aggressor_side, trade.resting_ref) == (
        1_000_000,
        100,
        "S",
        1,
    )
    assert (trade.timestamp_ns, trade.match_number, trade.printable) == (5, 9, True)
    assert book.queue(AAPL, "B", 1_000_000) == [2, 3]
    assert book.depth(AAPL, 5).bids == [LevelView(1_000_000, 500, 2), LevelView(999_900, 50, 1)]


def test_partial_execution_keeps_priority() -> None:
    book = _book()
    book.add(AAPL, 1, "S", 1_000_100, 300)
    book.add(AAPL, 2, "S", 1_000_100, 100)
    trade = book.execute(1, 120)
    assert trade is not None and trade.aggressor_side == "B"
    assert book.queue(AAPL, "S", 1_000_100) == [1, 2]
    assert book.top_of_book(AAPL) == TopOfBook(0, 0, 1_000_100, 280)
    assert book.orders[1].shares == 180


def test_cancel_partial_then_to_zero_removes_order_and_level() -> None:
    book = _book()
    book.add(AAPL, 1, "S", 1_000_100, 300)
    book.cancel(1, 100)
    assert book.top_of_book(AAPL) == TopOfBook(0, 0, 1_000_100, 200)
    book.cancel(1, 200)
    assert 1 not in book.orders
    assert book.top_of_book(AAPL) == TopOfBook(0, 0, 0, 0)
    assert book.depth(AAPL, 5).asks == []


def test_delete_best_level_exposes_next() -> None:
    book = _book()
    book.add(AAPL, 1, "S", 1_000_100, 300)
    book.add(AAPL, 2, "S", 1_000_300, 100)
    book.add(AAPL, 3, "S", 1_000_200, 100)
    book.add(AAPL, 4, "B", 999_000, 100)
    book.delete(1)
    assert book.top_of_book(AAPL) == TopOfBook(999_000, 100, 1_000_200, 100)
    assert [lv.price for lv in book.depth(AAPL, 5).asks] == [1_000_200, 1_000_300]


def test_replace_new_ref_keeps_side_loses_priority() -> None:
    book = _book()
    book.add(AAPL, 1, "B", 1_000_000, 100)
    book.add(AAPL, 2, "B", 1_000_000, 100)
    # Same price, new size: the order goes to the back of the queue under its new reference.
    book.replace(1, 10, 1_000_000, 150)
    assert book.queue(AAPL, "B", 1_000_000) == [2, 10]
    assert 1 not in book.orders
    assert book.orders[10].is_buy
    assert book.top_of_book(AAPL) == TopOfBook(1_000_000, 250, 0, 0)
    # New price: the old level keeps the other order, the new level holds the replacement.
    book.replace(10, 11, 999_900, 150)
    assert book.depth(AAPL, 5).bids == [LevelView(1_000_000, 100, 1), LevelView(999_900, 150, 1)]


def test_execute_with_price_reports_message_price_and_printable() -> None:
    book = _book()
    book.add(AAPL, 1, "B", 1_000_000, 100)
    msg = itch.OrderExecutedWithPrice(AAPL, 0, 77, 1, 40, 3, "N", 1_000_500)
    trade = book.apply(msg)
    assert trade is not None
    assert (trade.kind, trade.price, trade.shares, trade.printable, trade.match_number) == (
        "C",
        1_000_500,
        40,
        False,
        3,
    )
    assert book.top_of_book(AAPL) == TopOfBook(1_000_000, 60, 0, 0)


def test_hidden_trade_is_reported_and_leaves_the_book_alone() -> None:
    book = _book()
    book.add(AAPL, 1, "B", 1_000_000, 100)
    trade = book.apply(itch.Trade(AAPL, 0, 9, 0, "B", 300, "AAPL", 1_000_100, 12))
    assert trade is not None
    assert (trade.kind, trade.price, trade.shares, trade.aggressor_side) == (
        "P",
        1_000_100,
        300,
        "N",
    )
    assert (trade.match_number, trade.timestamp_ns, trade.resting_ref) == (12, 9, 0)
    assert book.top_of_book(AAPL) == TopOfBook(1_000_000, 100, 0, 0)


def test_apply_dispatches_every_book_message_through_the_codec() -> None:
    """Messages go through encode/decode first, so field names and types are the codec's."""
    msgs = [
        itch.SystemEvent(0, 0, 1, "Q"),
        itch.StockDirectory(
            AAPL, 0, 2, "AAPL", "Q", "N", 100, "N", "C", "Z", "P", "N", "N", "1", "N", 0, "N"
        ),
        itch.StockTradingAction(AAPL, 0, 3, "AAPL", "T", " ", ""),
        itch.AddOrder(AAPL, 0, 4, 1, "B", 100, "AAPL", 1_000_000),
        itch.AddOrderMPID(AAPL, 0, 5, 2, "S", 200, "AAPL", 1_000_100, "GSCO"),
        itch.OrderExecuted(AAPL, 0, 6, 2, 50, 1),
        itch.OrderCancel(AAPL, 0, 7, 2, 50),
        itch.OrderReplace(AAPL, 0, 8, 1, 3, 300, 999_900),
        itch.AddOrder(AAPL, 0, 9, 4, "B", 10, "AAPL", 999_900),
        itch.OrderDelete(AAPL, 0, 10, 3),
    ]
    book = Book(debug=True)
    trades = [book.apply(itch.decode(itch.encode(m))) for m in msgs]
    assert [t is not None for t in trades] == [False] * 5 + [True] + [False] * 4
    assert book.symbols == {AAPL: "AAPL"}
    assert book.market_open
    assert book.top_of_book(AAPL) == TopOfBook(999_900, 10, 1_000_100, 100)
    assert book.queue(AAPL, "B", 999_900) == [4]


def test_unknown_refs_are_counted_not_fatal() -> None:
    book = _book()
    assert book.execute(42, 100) is None
    book.cancel(42, 1)
    book.delete(42)
    book.replace(42, 43, 100, 100)
    assert book.errors == {"unknown_ref": 4}
    assert 43 not in book.orders


def test_faults_follow_itch_book_rules() -> None:
    book = _book()
    book.add(AAPL, 1, "B", 1_000_000, 100)
    book.add(AAPL, 1, "B", 999_000, 70)  # live reference: the stale order is evicted
    assert book.top_of_book(AAPL) == TopOfBook(999_000, 70, 0, 0)
    trade = book.execute(1, 500)  # oversized: clamped to what rests
    assert trade is not None and trade.shares == 70
    book.add(AAPL, 2, "B", 0, 100)
    book.add(AAPL, 3, "B", 1_000_000, 0)
    assert book.errors == {"duplicate_ref": 1, "oversized_execute": 1, "rejected_add": 2}
    assert book.orders == {}


def test_debug_mode_raises_on_unknown_ref() -> None:
    book = _book(debug=True)
    with pytest.raises(BookInvariantError):
        book.delete(42)


def test_debug_mode_rejects_crossed_book_only_in_continuous_trading() -> None:
    book = Book(debug=True)
    book.add(AAPL, 1, "S", 1_000_000, 100)
    book.add(AAPL, 2, "B", 1_000_000, 100)  # before the open: allowed
    with pytest.raises(BookInvariantError, match="crossed"):
        book.system_event("Q")
    book = Book(debug=True)
    book.system_event("Q")
    book.set_trading_state(AAPL, "H")
    book.add(AAPL, 1, "S", 1_000_000, 100)
    book.add(AAPL, 2, "B", 1_000_100, 100)  # halted: orders may lock/cross for the halt cross
    assert book.is_crossed(AAPL)
    with pytest.raises(BookInvariantError, match="crossed"):
        book.set_trading_state(AAPL, "T")
    book = _book(debug=True)
    book.add(AAPL, 1, "S", 1_000_000, 100)
    with pytest.raises(BookInvariantError, match="crossed"):
        book.add(AAPL, 2, "B", 1_000_000, 100)  # locked counts: it would have executed


def test_check_invariants_detects_corrupt_level_total() -> None:
    book = _book()
    book.add(AAPL, 1, "B", 1_000_000, 100)
    book.add(AAPL, 2, "B", 1_000_000, 100)
    book.check_invariants()
    book.books[AAPL].bids.levels[1_000_000].shares += 1
    with pytest.raises(BookInvariantError, match="total"):
        book.check_invariants()


_op = st.one_of(
    st.tuples(st.just("add"), st.integers(1, 2), st.integers(1, 40), st.sampled_from("BS"),
              st.integers(1, 3), st.integers(1, 500)),
    st.tuples(st.just("add"), st.integers(1, 2), st.integers(1, 40), st.sampled_from("BS"),
              st.integers(1, 3), st.integers(1, 500)),
    st.tuples(st.just("execute"), st.integers(1, 40), st.integers(1, 600)),
    st.tuples(st.just("cancel"), st.integers(1, 40), st.integers(1, 600)),
    st.tuples(st.just("delete"), st.integers(1, 40)),
    st.tuples(st.just("replace"), st.integers(1, 40), st.integers(1, 40), st.integers(1, 3),
              st.integers(0, 500)),
)  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(st.lists(_op, min_size=10, max_size=150))
def test_random_operations_match_naive_book(ops: list[tuple[Any, ...]]) -> None:
    """Any operation sequence, faults included (unknown, duplicate, oversized), vs brute force."""
    book, naive = Book(), NaiveBook()
    for op in ops:
        name, *args = op
        if name == "add":
            locate, ref, side, ticks, shares = args
            book.add(locate, ref, side, ticks * 100, shares)
            naive.add(locate, ref, side, ticks * 100, shares)
        elif name == "execute":
            trade = book.execute(*args)
            expected = naive.execute(*args, None)
            got = None if trade is None else (trade.price, trade.shares, trade.aggressor_side)
            assert got == expected
        elif name == "replace":
            old, new, ticks, shares = args
            book.replace(old, new, ticks * 100, shares)
            naive.replace(old, new, ticks * 100, shares)
        else:
            getattr(book, name)(*args)
            getattr(naive, name)(*args)
        for locate in (1, 2):
            assert tuple(book.top_of_book(locate)) == naive.top_of_book(locate)
            for side in "BS":
                for price, _, _ in naive.levels(locate, side):
                    assert book.queue(locate, side, price) == naive.queue(locate, side, price)
    book.check_invariants()
    assert book.errors == naive.errors
    for locate in (1, 2):
        depth = book.depth(locate, 50)
        assert ([tuple(lv) for lv in depth.bids], [tuple(lv) for lv in depth.asks]) == tuple(
            naive.depth(locate, 50)
        )


def test_raw_handlers_match_decode_then_apply(tmp_path: Any) -> None:
    """The live feed's fast path (unpack, no message object) must leave the same book, faults
    and trades as ``apply(itch.decode(raw))``: a generated day, then one message of every type
    it handles."""
    from feed_helpers import book_state

    day = tmp_path / "day.itch"
    write_day(day, seed=5, symbols=4, messages=3000)
    extra = [
        itch.AddOrderMPID(1, 0, 10, 900_001, "S", 300, "ZZZ", 1_010_000, "ABCD"),
        itch.OrderExecutedWithPrice(1, 0, 11, 900_001, 100, 77, "Y", 1_009_900),
        itch.OrderExecutedWithPrice(1, 0, 12, 900_001, 50, 78, "N", 1_009_800),
        itch.OrderReplace(1, 0, 13, 900_001, 900_002, 120, 1_011_000),
        itch.Trade(1, 0, 14, 0, "B", 40, "ZZZ", 1_012_000, 79),
        itch.OrderExecuted(1, 0, 15, 900_002, 20, 80),
        itch.OrderCancel(1, 0, 16, 900_002, 30),
        itch.OrderDelete(1, 0, 17, 900_002),
        itch.OrderDelete(1, 0, 18, 424_242),  # unknown reference: a fault, counted alike
    ]
    messages = [raw for _, raw in iter_itch(day)] + [itch.encode(m) for m in extra]
    decoded, raw_book = Book(), Book()
    handlers = raw_book.raw_handlers()
    assert {chr(kind) for kind in handlers} == set("AFECXDUP")
    trades_decoded, trades_raw = [], []
    for raw in messages:
        trades_decoded.append(decoded.apply(itch.decode(raw)))
        entry = handlers.get(raw[0])
        if entry is None:
            trades_raw.append(raw_book.apply(itch.decode(raw)))
        else:
            layout, handler = entry
            trades_raw.append(handler(layout.unpack_from(raw)))
    assert trades_raw == trades_decoded
    assert sum(t is not None for t in trades_raw) > 100
    assert book_state(raw_book) == book_state(decoded)
    assert raw_book.errors == decoded.errors and decoded.errors.get("unknown_ref", 0) >= 1
    assert raw_book.symbols == decoded.symbols and raw_book.market_open == decoded.market_open
