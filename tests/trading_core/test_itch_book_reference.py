"""The book against ``itch-book`` (an independent C++ ITCH 5.0 book) on the same generated file.

itch-book needs the session date, which it takes from a NASDAQ-style file name
(``MMDDYYYY.NASDAQ_ITCH50``, ``SMMDDYY-v50``, ``YYYYMMDD.BX_ITCH_50``) or from ``date=``; its
``seq`` column is the 1-based ordinal of the message in the file. Its ``bbo`` table has one row
per change of price or size at the touch, so the test replays tailsight's book, records the same
rows, and compares whole trajectories, not only the final top of book.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
from pathlib import Path
from typing import Any

import itch_book
import numpy as np
import pytest

from tailsight.trading_core import itch
from tailsight.trading_core.book import Book, TradeEvent
from tailsight.trading_core.itch_file import write_itch
from tailsight.trading_core.market import generate_day, write_day

SEED, SYMBOLS, MESSAGES = 20260105, 6, 40_000


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any, dict[str, Any]]:
    path = tmp_path_factory.mktemp("itch") / "01052026.NASDAQ_ITCH50"  # date from the name
    write_day(path, seed=SEED, symbols=SYMBOLS, messages=MESSAGES)
    feed = itch_book.open(str(path), price_type="fixed")
    assert feed.date == dt.date(2026, 1, 5)
    batches = list(feed.batches(tables=("bbo", "trades", "symbols"), rows=10**9))
    assert len(batches) == 1
    assert feed.stats is not None
    return path, batches[0], feed.stats


@pytest.fixture(scope="module")
def replay() -> tuple[Book, list[tuple[int, ...]], list[tuple[int, TradeEvent]]]:
    book = Book(debug=True)
    last: dict[int, tuple[int, ...]] = {}
    bbo_rows: list[tuple[int, ...]] = []
    trades: list[tuple[int, TradeEvent]] = []
    for seq, msg in enumerate(generate_day(SEED, symbols=SYMBOLS, messages=MESSAGES), start=1):
        trade = book.apply(msg)
        if trade is not None:
            trades.append((seq, trade))
        locate = msg.stock_locate
        if locate and locate in book.books:
            top = tuple(book.top_of_book(locate))
            if top != last.get(locate, (0, 0, 0, 0)):
                bbo_rows.append((seq, locate, *top))
                last[locate] = top
    return book, bbo_rows, trades


def test_final_top_of_book_per_symbol(reference: Any, replay: Any) -> None:
    _, batch, _ = reference
    book, _, _ = replay
    bbo = batch.bbo
    symbols = dict(zip(batch.symbols["locate"], batch.symbols["symbol"], strict=True))
    assert {int(k): v for k, v in symbols.items()} == book.symbols
    for locate in book.symbols:
        last = np.nonzero(bbo["locate"] == locate)[0][-1]
        theirs = tuple(int(bbo[c][last]) for c in ("bid_px", "bid_sz", "ask_px", "ask_sz"))
        assert theirs == tuple(book.top_of_book(locate)), symbols[locate]
        best_bid = book.books[locate].bids.best()
        assert best_bid is not None and int(bbo["bid_ct"][last]) == len(best_bid.orders)


def test_every_top_of_book_change_matches(reference: Any, replay: Any) -> None:
    _, batch, _ = reference
    _, bbo_rows, _ = replay
    bbo = batch.bbo
    columns = ("seq", "locate", "bid_px", "bid_sz", "ask_px", "ask_sz")
    theirs = list(zip(*(bbo[c].tolist() for c in columns), strict=True))
    assert len(theirs) > MESSAGES // 10
    assert theirs == bbo_rows


def test_trades_match(reference: Any, replay: Any) -> None:
    """Every print (E, printable C, P): same message, price, size, side (resting side; N for P)."""
    _, batch, _ = reference
    _, _, trades = replay
    t = batch.trades
    columns = ("seq", "locate", "price", "size", "side", "kind")
    theirs = [
        (seq, locate, price, size, side.decode(), kind.decode())
        for seq, locate, price, size, side, kind in zip(
            *(t[c].tolist() for c in columns), strict=True
        )
    ]
    resting = {"B": "S", "S": "B", "N": "N"}
    ours = [
        (seq, e.locate, e.price, e.shares, resting[e.aggressor_side], e.kind)
        for seq, e in trades
        if e.printable
    ]
    assert {row[-1] for row in ours} == {"E", "C", "P"}
    assert len(ours) > 1000
    assert theirs == ours


def test_feed_statistics_agree(reference: Any, replay: Any) -> None:
    path, _, stats = reference
    book, _, _ = replay
    assert stats["messages"] == MESSAGES
    assert stats["live_orders"] == len(book.orders)
    assert stats["crossed_books"] == 0
    assert stats["missing_ref"] == stats["dup_ref"] == stats["clamped"] == 0
    assert book.errors == {}
    kinds: dict[str, int] = {}
    for msg in generate_day(SEED, symbols=SYMBOLS, messages=MESSAGES):
        kinds[msg.message_type.decode()] = kinds.get(msg.message_type.decode(), 0) + 1
    assert stats["adds"] == kinds["A"] + kinds["F"]
    assert stats["deletes"] == kinds["D"]
    assert stats["replaces"] == kinds["U"]
    framed_bytes = sum(n * (2 + itch.MESSAGE_LENGTHS[k.encode()]) for k, n in kinds.items())
    assert path.stat().st_size == framed_bytes


def test_faulty_feed_same_book_and_fault_counts(tmp_path: Path) -> None:
    """Unknown refs, duplicate adds, oversized executes/cancels, zero-share adds: both books apply
    the same rules, so every top-of-book change and every fault count agrees."""
    rng = np.random.default_rng(3)
    messages: list[itch.Message] = []
    for msg in generate_day(17, symbols=3, messages=10_000):
        messages.append(msg)
        roll = rng.random()
        if isinstance(msg, itch.AddOrder) and roll < 0.03:
            messages.append(replace(msg, shares=msg.shares + 7))  # same live reference again
        elif isinstance(msg, itch.AddOrder) and roll < 0.05:
            messages.append(replace(msg, order_reference_number=10**9 + len(messages), shares=0))
        elif isinstance(msg, itch.OrderDelete) and roll < 0.05:
            messages.append(msg)  # already gone: unknown reference
        elif isinstance(msg, itch.OrderCancel) and roll < 0.3:
            messages[-1] = replace(msg, cancelled_shares=10**6)
        elif isinstance(msg, itch.OrderExecuted) and roll < 0.2:
            messages[-1] = replace(msg, executed_shares=10**6)
    path = tmp_path / "faulty.itch"
    write_itch(path, messages)
    feed = itch_book.open(str(path), date=dt.date(2026, 1, 5), price_type="fixed")
    (batch,) = feed.batches(tables=("bbo",), rows=10**9)
    stats = feed.stats
    assert stats is not None

    book, last, ours = Book(), {}, []
    for seq, msg in enumerate(messages, start=1):
        book.apply(msg)
        locate = msg.stock_locate
        if locate and locate in book.books:
            top = tuple(book.top_of_book(locate))
            if top != last.get(locate, (0, 0, 0, 0)):
                ours.append((seq, locate, *top))
                last[locate] = top
    columns = ("seq", "locate", "bid_px", "bid_sz", "ask_px", "ask_sz")
    theirs = list(zip(*(batch.bbo[c].tolist() for c in columns), strict=True))
    assert theirs == ours
    errors = book.errors
    assert min(errors.values()) > 10 and len(errors) == 5
    assert stats["missing_ref"] == errors["unknown_ref"]
    assert stats["dup_ref"] == errors["duplicate_ref"]
    assert stats["rejected"] == errors["rejected_add"]
    assert stats["clamped"] == errors["oversized_execute"] + errors["oversized_cancel"]
    assert stats["live_orders"] == len(book.orders)
