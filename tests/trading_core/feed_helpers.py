"""Shared by the feed and replay tests: the book as plain data, and the file's own book."""

from __future__ import annotations

from pathlib import Path

from tailsight.trading_core import itch
from tailsight.trading_core.book import Book
from tailsight.trading_core.itch_file import iter_itch

Levels = list[tuple[int, list[tuple[int, int]]]]


def book_state(book: Book) -> dict[int, tuple[Levels, Levels]]:
    """Every symbol's levels, best first, with each queue's (reference, shares) in time order."""
    state = {}
    for locate, symbol in book.books.items():
        bids, asks = (
            [
                (level.price, [(o.ref, o.shares) for o in level.orders.values()])
                for level in (side.levels[side.sign * key] for key in reversed(side.keys))
            ]
            for side in (symbol.bids, symbol.asks)
        )
        state[locate] = (bids, asks)
    return state


def reference_book(path: Path) -> Book:
    """The book from decoding the file message by message, no network involved."""
    book = Book()
    for _, raw in iter_itch(path):
        book.apply(itch.decode(raw))
    return book
