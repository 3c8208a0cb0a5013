"""The compiled book against ``Book`` (batch by batch), ``NaiveBook`` (message by message, on
random operation streams) and ``itch-book`` (every top-of-book change, every print, every fault).

Books start with tiny capacities so that every run also exercises growth and rehashing.
"""

from __future__ import annotations

import datetime as dt
import gzip
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import itch_book
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tailsight.trading_core import itch
from tailsight.trading_core.book import Book, TradeEvent
from tailsight.trading_core.fastbook import FastBook
from tailsight.trading_core.itch_batch import decode_batch
from tailsight.trading_core.itch_file import iter_itch_chunks, write_itch
from tailsight.trading_core.market import generate_day
from tests.trading_core.itch_strategies import framed
from tests.trading_core.naive_book import NaiveBook
from tests.trading_core.test_itch_book_reference import (  # noqa: F401 -- a pytest fixture
    MESSAGES,
    SYMBOLS,
    reference,
)

BBO_COLUMNS = ("seq", "locate", "bid_px", "bid_sz", "ask_px", "ask_sz")


def _small() -> FastBook:
    return FastBook(orders=16, levels=16)


def faulty_day(seed: int, symbols: int, messages: int) -> Iterator[itch.Message]:
    """A generated day with every fault kind injected: duplicate and zero-share adds, deletes of
    gone references, cancels and executions larger than the order, replaces of unknown orders."""
    rng = np.random.default_rng(seed)
    for msg in generate_day(seed, symbols=symbols, messages=messages):
        roll = rng.random()
        if isinstance(msg, itch.OrderCancel) and roll < 0.25:
            msg = replace(msg, cancelled_shares=10**6)
        elif isinstance(msg, itch.OrderExecuted) and roll < 0.2:
            msg = replace(msg, executed_shares=10**6)
        yield msg
        if isinstance(msg, itch.AddOrder) and roll < 0.03:
            yield replace(msg, shares=msg.shares + 3)  # onto the live reference
        elif isinstance(msg, itch.AddOrder) and roll < 0.05:
            yield replace(msg, order_reference_number=2**63 + int(roll * 1e9), shares=0)
        elif isinstance(msg, itch.OrderDelete) and roll < 0.05:
            yield msg  # already gone
        elif isinstance(msg, itch.OrderReplace) and roll < 0.05:
            yield msg  # the original reference is gone now


def _assert_same_book(fast: FastBook, book: Book, full: bool = False) -> None:
    for locate in book.books:
        assert tuple(fast.top_of_book(locate)) == tuple(book.top_of_book(locate)), locate
        assert fast.depth(locate, 5) == book.depth(locate, 5), locate
        if full:
            assert fast.depth(locate, 10**6) == book.depth(locate, 10**6), locate
            for side in (book.books[locate].bids, book.books[locate].asks):
                for price in side.levels:
                    name = "B" if side.sign > 0 else "S"
                    assert fast.queue(locate, name, price) == book.queue(locate, name, price)
    assert fast.errors == book.errors
    assert fast.live_orders == len(book.orders)


@pytest.mark.parametrize("seed", [1, 20260105, 99])
def test_faulty_days_match_book_after_every_batch(tmp_path: Path, seed: int) -> None:
    """Arrays path and bytes path, small batches: same tops, depth, queues, faults, trades."""
    path = tmp_path / "day.itch"
    write_itch(path, faulty_day(seed, symbols=5, messages=25_000))
    book, by_arrays, by_bytes, total = Book(), _small(), _small(), 0
    expected: list[TradeEvent] = []
    got_arrays: list[TradeEvent] = []
    got_bytes: list[TradeEvent] = []
    for chunk in iter_itch_chunks(path, chunk_size=16 * 1024):
        batch = decode_batch(chunk)
        count = book.apply_batch(batch, expected.append)
        total += count
        assert by_arrays.apply_batch(batch, got_arrays.append) == count
        assert by_bytes.apply_buffer(chunk, got_bytes.append) == (count, len(chunk))
        _assert_same_book(by_arrays, book)
        _assert_same_book(by_bytes, book)
    assert len(book.errors) == 5 and min(book.errors.values()) > 10
    assert len(expected) > 1000 and got_arrays == expected and got_bytes == expected
    for fast in (by_arrays, by_bytes):
        _assert_same_book(fast, book, full=True)
        assert fast.trade_count == len(expected)
        assert fast.symbols == book.symbols and len(book.symbols) == 5
        assert fast.last_system_event == book.last_system_event == "C"
        assert fast.trading_states == {k: b.trading_state for k, b in book.books.items()}
    assert by_bytes.messages == by_arrays.messages == total > 25_000


def test_file_replay_repairs_damage_and_reads_gzip(tmp_path: Path) -> None:
    """Garbage in the middle of a file: the compiled replay hands over to the repairing framer
    and ends where ``Book`` over ``iter_itch_chunks`` ends; a gzipped copy replays the same."""
    messages = list(faulty_day(5, symbols=3, messages=12_000))
    clean = framed(messages)
    cut = len(framed(messages[:7_000]))
    damaged = tmp_path / "damaged.itch"
    damaged.write_bytes(clean[:cut] + b"\x00\x07garbage!" + clean[cut:])
    book, expected = Book(), list[TradeEvent]()
    repaired = sum(
        book.apply_batch(decode_batch(chunk), expected.append)
        for chunk in iter_itch_chunks(damaged)
    )
    assert len(messages) - 2 <= repaired <= len(messages)  # the garbage may take a frame along
    fast, got = FastBook(orders=16, levels=16), list[TradeEvent]()
    applied = fast.apply_file(damaged, got.append, block_size=4096)
    assert applied == repaired and got == expected
    _assert_same_book(fast, book, full=True)

    zipped = tmp_path / "clean.itch.gz"
    zipped.write_bytes(gzip.compress(clean))
    plain = Book()
    plain.apply_batch(decode_batch(clean))
    from_gzip = FastBook()
    assert from_gzip.apply_file(zipped) == len(messages)
    _assert_same_book(from_gzip, plain, full=True)


def test_bbo_history_and_trades_match_itch_book(reference: Any) -> None:  # noqa: F811
    """Every top-of-book change (seq, locate, prices, sizes) and every print equal itch-book's."""
    path, batch, stats = reference
    fast = FastBook(record_bbo=True, orders=16, levels=16)
    trades: list[tuple[int, TradeEvent]] = []
    fast.apply_file(path, lambda t: trades.append((fast.messages, t)), block_size=8192)
    ours = fast.bbo_changes()
    theirs = batch.bbo
    assert len(ours) > MESSAGES // 10
    for column in BBO_COLUMNS:
        assert ours[column].tolist() == theirs[column].tolist(), column
    assert fast.messages == stats["messages"] == MESSAGES
    assert fast.live_orders == stats["live_orders"]
    assert fast.errors == {}
    printed = [t for _, t in trades if t.printable]
    resting = {"B": "S", "S": "B", "N": "N"}
    columns = ("locate", "price", "size", "side", "kind")
    t = batch.trades
    expected = list(zip(*(t[c].tolist() for c in columns), strict=True))
    assert len(printed) > 1000 and len(fast.symbols) == SYMBOLS
    assert [
        (e.locate, e.price, e.shares, resting[e.aggressor_side].encode(), e.kind.encode())
        for e in printed
    ] == expected


def test_faulty_feed_bbo_history_and_fault_counts_match_itch_book(tmp_path: Path) -> None:
    path = tmp_path / "faulty.itch"
    write_itch(path, faulty_day(17, symbols=3, messages=10_000))
    feed = itch_book.open(str(path), date=dt.date(2026, 1, 5), price_type="fixed")
    (batch,) = feed.batches(tables=("bbo",), rows=10**9)
    stats = feed.stats
    assert stats is not None
    fast = FastBook(record_bbo=True, orders=16, levels=16)
    fast.apply_file(path)
    ours = fast.bbo_changes()
    for column in BBO_COLUMNS:
        assert ours[column].tolist() == batch.bbo[column].tolist(), column
    errors = fast.errors
    assert len(errors) == 5 and min(errors.values()) > 10
    assert stats["missing_ref"] == errors["unknown_ref"]
    assert stats["dup_ref"] == errors["duplicate_ref"]
    assert stats["rejected"] == errors["rejected_add"]
    assert stats["clamped"] == errors["oversized_execute"] + errors["oversized_cancel"]
    assert stats["live_orders"] == fast.live_orders


# ------------------------------------------------------------------ random streams vs naive

_REFS = st.integers(1, 12) | st.integers(2**63, 2**64 - 1)  # few: collisions and faults
_PRICES = st.sampled_from([1, 100, 101, 102, 250, 2**31, 2**32 - 1]) | st.integers(0, 2**32 - 1)
_SHARES = st.integers(0, 5) | st.integers(0, 2**32 - 1)
_LOCATES = st.sampled_from([1, 2, 65535])


def _operation() -> st.SearchStrategy[itch.Message]:
    header = (st.just(0), st.integers(0, 2**48 - 1))
    return st.one_of(
        st.builds(
            lambda loc, tr, ts, ref, side, sh, px: itch.AddOrder(
                loc, tr, ts, ref, side, sh, "ABC", px
            ),
            _LOCATES,
            *header,
            _REFS,
            st.sampled_from("BS"),
            _SHARES,
            _PRICES,
        ),
        st.builds(
            lambda loc, tr, ts, ref, sh, m: itch.OrderExecuted(loc, tr, ts, ref, sh, m),
            _LOCATES,
            *header,
            _REFS,
            _SHARES,
            st.integers(0, 2**64 - 1),
        ),
        st.builds(
            lambda loc, tr, ts, ref, sh, px: itch.OrderExecutedWithPrice(
                loc, tr, ts, ref, sh, 7, "N", px
            ),
            _LOCATES,
            *header,
            _REFS,
            _SHARES,
            _PRICES,
        ),
        st.builds(
            lambda loc, tr, ts, ref, sh: itch.OrderCancel(loc, tr, ts, ref, sh),
            _LOCATES,
            *header,
            _REFS,
            _SHARES,
        ),
        st.builds(
            lambda loc, tr, ts, ref: itch.OrderDelete(loc, tr, ts, ref), _LOCATES, *header, _REFS
        ),
        st.builds(
            lambda loc, tr, ts, old, new, sh, px: itch.OrderReplace(loc, tr, ts, old, new, sh, px),
            _LOCATES,
            *header,
            _REFS,
            _REFS,
            _SHARES,
            _PRICES,
        ),
    )


@settings(max_examples=60, deadline=None)
@given(st.lists(_operation(), min_size=1, max_size=120))
def test_random_streams_match_naive_book(messages: list[itch.Message]) -> None:
    """Any prices (whole u32 range), colliding references, every fault: after each message the
    top, depth and executions equal the brute-force book's, and at the end every queue."""
    naive, fast = NaiveBook(), FastBook(orders=16, levels=16)
    for msg in messages:
        expected = naive.apply(msg)
        got: list[TradeEvent] = []
        assert fast.apply_buffer(framed([msg]), got.append)[0] == 1
        assert [(t.price, t.shares, t.aggressor_side) for t in got] == (
            [] if expected is None else [expected]
        )
        locate = msg.stock_locate
        assert tuple(fast.top_of_book(locate)) == naive.top_of_book(locate)
        depth = fast.depth(locate, 5)
        assert ([tuple(x) for x in depth.bids], [tuple(x) for x in depth.asks]) == naive.depth(
            locate, 5
        )
    assert fast.errors == naive.errors
    assert fast.live_orders == len(naive.where)
    for locate in (1, 2, 65535):
        for side in "BS":
            for price, _, _ in naive.levels(locate, side):
                assert fast.queue(locate, side, price) == naive.queue(locate, side, price)
