"""Differential tests: the book against the brute-force naive book after every message of a day."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tailsight.trading_core import itch
from tailsight.trading_core.book import Book, Depth, TradeEvent
from tailsight.trading_core.itch_batch import decode_batch
from tailsight.trading_core.itch_file import iter_itch, iter_itch_chunks
from tailsight.trading_core.market import generate_day, write_day
from tests.trading_core.naive_book import NaiveBook


def _depth(depth: Depth) -> tuple[list[tuple[int, int, int]], list[tuple[int, int, int]]]:
    return [tuple(lv) for lv in depth.bids], [tuple(lv) for lv in depth.asks]  # type: ignore[misc]


def _replay_and_compare(messages: list[itch.Message], debug: bool) -> tuple[Book, NaiveBook]:
    book, naive = Book(debug=debug), NaiveBook()
    for index, msg in enumerate(messages):
        trade = book.apply(msg)
        expected = naive.apply(msg)
        got = None if trade is None else (trade.price, trade.shares, trade.aggressor_side)
        assert got == expected, f"message {index}: {msg}"
        locate = msg.stock_locate
        if locate:
            assert tuple(book.top_of_book(locate)) == naive.top_of_book(locate), index
            assert _depth(book.depth(locate, 5)) == naive.depth(locate, 5), index
            if index % 5 == 0:  # time priority at the touch (naive: sorted by arrival)
                for side in "BS":
                    levels = naive.levels(locate, side)
                    if levels:
                        price = levels[0][0]
                        assert book.queue(locate, side, price) == naive.queue(locate, side, price)
    for locate in naive.by_locate:
        assert _depth(book.depth(locate, 10_000)) == naive.depth(locate, 10_000)
        for side in "BS":
            for price, _, _ in naive.levels(locate, side):
                assert book.queue(locate, side, price) == naive.queue(locate, side, price)
    assert set(book.orders) == set(naive.where)
    book.check_invariants()
    return book, naive


def test_generated_day_matches_naive_book_after_every_message() -> None:
    """30k messages, 6 symbols, debug invariants on: BBO and depth-5 equal after each message."""
    messages = list(generate_day(20260105, symbols=6, messages=30_000))
    book, naive = _replay_and_compare(messages, debug=True)
    assert book.errors == naive.errors == {}
    assert len(book.orders) > 100  # the comparison ran on a populated book


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), symbols=st.integers(1, 4))
def test_other_seeds_match_naive_book(seed: int, symbols: int) -> None:
    _replay_and_compare(list(generate_day(seed, symbols=symbols, messages=3_000)), debug=True)


def test_faulty_feed_matches_naive_book() -> None:
    """Unknown refs, duplicate adds and oversized executes/cancels: both books count and agree."""
    rng = np.random.default_rng(7)
    messages: list[itch.Message] = []
    for msg in generate_day(11, symbols=3, messages=8_000):
        messages.append(msg)
        roll = rng.random()
        if isinstance(msg, itch.AddOrder) and roll < 0.03:
            messages.append(itch.AddOrder(msg.stock_locate, 0, msg.timestamp_ns,
                                          msg.order_reference_number, msg.side, msg.shares + 1,
                                          msg.stock, msg.price))  # fmt: skip
        elif isinstance(msg, itch.OrderDelete) and roll < 0.05:
            messages.append(msg)  # the reference is gone now: unknown
        elif isinstance(msg, itch.OrderCancel) and roll < 0.2:
            messages[-1] = itch.OrderCancel(msg.stock_locate, 0, msg.timestamp_ns,
                                            msg.order_reference_number, 10**6)  # fmt: skip
        elif isinstance(msg, itch.OrderExecuted) and roll < 0.2:
            messages[-1] = itch.OrderExecuted(msg.stock_locate, 0, msg.timestamp_ns,
                                              msg.order_reference_number, 10**6,
                                              msg.match_number)  # fmt: skip
    book, naive = _replay_and_compare(messages, debug=False)
    assert book.errors == naive.errors
    assert set(book.errors) >= {"duplicate_ref", "unknown_ref", "oversized_execute"}


def test_batch_fast_path_matches_message_path(tmp_path: Path) -> None:
    """``apply_batch`` on itch_batch arrays == ``apply`` on records: trades, books, state."""
    write_day(tmp_path / "day.itch", seed=5, symbols=4, messages=20_000)
    by_message, by_batch = Book(), Book()
    expected = [t for _, raw in iter_itch(tmp_path / "day.itch")
                if (t := by_message.apply(itch.decode(raw))) is not None]  # fmt: skip
    got: list[TradeEvent] = []
    applied = sum(
        by_batch.apply_batch(decode_batch(chunk), got.append)
        for chunk in iter_itch_chunks(tmp_path / "day.itch", chunk_size=64 * 1024)
    )
    assert applied == 20_000
    assert len(expected) > 1000 and got == expected
    assert by_batch.symbols == by_message.symbols and len(by_batch.symbols) == 4
    assert by_batch.last_system_event == by_message.last_system_event == "C"
    assert set(by_batch.orders) == set(by_message.orders)
    for locate in by_message.books:
        assert by_batch.depth(locate, 10_000) == by_message.depth(locate, 10_000)
    by_batch.check_invariants()
