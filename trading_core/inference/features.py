"""What the model reads: a compact text rendering of one symbol's L3 book state.

The feed side only copies numbers (``BookFeatures``: a few levels, recent trades), cheap enough
for the fast path; the text and the chat prompt are made in the inference process.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Final, NamedTuple

from tailsight.trading_core.book import Book, TradeEvent

LABELS: Final = ("buy", "sell", "hold")
"""The answers, in this order everywhere (scores, probabilities); single tokens for SmolLM2."""
SYSTEM_PROMPT: Final = (
    "You are a market microstructure model. Given an order book snapshot (price x shares "
    "(orders), best first) and the latest trades, answer with one word: buy, sell or hold."
)
PRICE_SCALE: Final = 10_000  # ITCH Price(4)


class BookFeatures(NamedTuple):
    symbol: str
    bids: tuple[tuple[int, int, int], ...]  # (price, shares, orders), best first
    asks: tuple[tuple[int, int, int], ...]
    trades: tuple[tuple[str, int, int], ...]  # (aggressor side, price, shares), newest last


class RecentTrades:
    """The last ``n`` trades per stock locate, fed from the feed's ``TradeEvent``s."""

    def __init__(self, n: int = 5) -> None:
        self.n = n
        self._trades: dict[int, deque[tuple[str, int, int]]] = {}

    def add(self, trade: TradeEvent) -> None:
        recent = self._trades.get(trade.locate)
        if recent is None:
            recent = self._trades[trade.locate] = deque(maxlen=self.n)
        recent.append((trade.aggressor_side, trade.price, trade.shares))

    def get(self, locate: int) -> tuple[tuple[str, int, int], ...]:
        return tuple(self._trades.get(locate, ()))


def features_from_book(
    book: Book, locate: int, trades: RecentTrades | None = None, levels: int = 3
) -> BookFeatures:
    depth = book.depth(locate, levels)
    return BookFeatures(
        book.symbols.get(locate, str(locate)),
        tuple((level.price, level.shares, level.orders) for level in depth.bids),
        tuple((level.price, level.shares, level.orders) for level in depth.asks),
        trades.get(locate) if trades is not None else (),
    )


def imbalance(features: BookFeatures) -> float:
    """Top-level queue imbalance in [-1, 1]: > 0 more resting at the bid."""
    bid = features.bids[0][1] if features.bids else 0
    ask = features.asks[0][1] if features.asks else 0
    return (bid - ask) / (bid + ask) if bid + ask else 0.0


def _price(price: int) -> str:
    return f"{price / PRICE_SCALE:.2f}"


def _levels(levels: Sequence[tuple[int, int, int]]) -> str:
    return " ".join(f"{_price(p)}x{s}({o})" for p, s, o in levels) or "none"


def render(features: BookFeatures) -> str:
    """E.g. ``AAPL bid 187.40x300(2) 187.39x900(4) | ask 187.42x100(1) | imbalance +0.50 |
    trades B100@187.42 S50@187.40``."""
    trades = " ".join(f"{side}{shares}@{_price(p)}" for side, p, shares in features.trades)
    return (
        f"{features.symbol} bid {_levels(features.bids)} | ask {_levels(features.asks)} | "
        f"imbalance {imbalance(features):+.2f} | trades {trades or 'none'}"
    )
