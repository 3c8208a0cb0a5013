"""Price-time priority matching engine, one order book per symbol (stock locate).

An incoming limit order trades against the opposite side while prices cross: best price first,
and at one price the oldest order first. Each trade prints at the *resting* order's price. What is
left rests (a day order) or is dropped (immediate-or-cancel). Orders carry an ``owner`` so the
exchange can tell replayed market orders ("") from a client's, and an external ``execute`` /
``cancel`` lets a replayed feed consume market orders without matching.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass, field

__all__ = [
    "BUY",
    "SELL",
    "Fill",
    "MatchingEngine",
    "RestingOrder",
    "SubmitResult",
    "SymbolBook",
]

BUY = "B"
SELL = "S"


@dataclass(slots=True)
class RestingOrder:
    """An order on the book; ``shares`` is what is left."""

    ref: int
    locate: int
    side: str
    price: int
    shares: int
    owner: str = ""
    sequence: int = 0  # arrival order, for time priority


@dataclass(frozen=True, slots=True)
class Fill:
    """One trade between an incoming (aggressor) order and a resting one, at the resting price."""

    match_number: int
    locate: int
    price: int
    shares: int
    aggressor_ref: int
    aggressor_side: str
    aggressor_owner: str
    resting_ref: int
    resting_owner: str
    resting_left: int  # shares of the resting order left after this fill


@dataclass(slots=True)
class SubmitResult:
    fills: list[Fill] = field(default_factory=list)
    remaining: int = 0  # shares not filled
    rested: bool = False  # the remainder went onto the book


class _Side:
    """Price levels of one side: price -> FIFO (insertion-ordered dict), best price at the back."""

    __slots__ = ("keys", "levels", "sign")

    def __init__(self, sign: int) -> None:
        self.sign = sign  # +1 bids (higher better), -1 asks (stored negated)
        self.levels: dict[int, dict[int, RestingOrder]] = {}
        self.keys: list[int] = []  # sign * price, ascending: best at the end

    def best_price(self) -> int | None:
        return self.sign * self.keys[-1] if self.keys else None

    def add(self, order: RestingOrder) -> None:
        level = self.levels.get(order.price)
        if level is None:
            level = self.levels[order.price] = {}
            insort(self.keys, self.sign * order.price)
        level[order.ref] = order

    def remove(self, order: RestingOrder) -> None:
        level = self.levels[order.price]
        del level[order.ref]
        if not level:
            del self.levels[order.price]
            key = self.sign * order.price
            del self.keys[bisect_left(self.keys, key)]

    def depth(self) -> list[tuple[int, int, int]]:
        """(price, shares, orders) per level, best first."""
        out = []
        for key in reversed(self.keys):
            level = self.levels[self.sign * key]
            out.append((self.sign * key, sum(o.shares for o in level.values()), len(level)))
        return out


class SymbolBook:
    """Bids and asks of one symbol."""

    def __init__(self, locate: int) -> None:
        self.locate = locate
        self.bids = _Side(+1)
        self.asks = _Side(-1)

    def side(self, side: str) -> _Side:
        return self.bids if side == BUY else self.asks

    def best_bid(self) -> int | None:
        return self.bids.best_price()

    def best_ask(self) -> int | None:
        return self.asks.best_price()


class MatchingEngine:
    """Books per locate plus one index of live orders by reference (references are day-unique)."""

    def __init__(self, first_match_number: int = 1) -> None:
        self.books: dict[int, SymbolBook] = {}
        self.orders: dict[int, RestingOrder] = {}
        self.next_match_number = first_match_number
        self._sequence = 0

    def book(self, locate: int) -> SymbolBook:
        book = self.books.get(locate)
        if book is None:
            book = self.books[locate] = SymbolBook(locate)
        return book

    def submit(
        self,
        locate: int,
        ref: int,
        side: str,
        price: int,
        shares: int,
        owner: str = "",
        rest: bool = True,
    ) -> SubmitResult:
        """Match an incoming limit order, then rest the remainder if ``rest`` (else drop it)."""
        if side not in (BUY, SELL):
            raise ValueError(f"side must be {BUY!r} or {SELL!r}, not {side!r}")
        if shares <= 0:
            raise ValueError(f"shares must be positive, not {shares}")
        if ref in self.orders:
            raise ValueError(f"order reference {ref} is live already")
        book = self.book(locate)
        opposite = book.asks if side == BUY else book.bids
        result = SubmitResult(remaining=shares)
        while result.remaining and opposite.keys:
            best = opposite.best_price()
            assert best is not None
            if (side == BUY and best > price) or (side == SELL and best < price):
                break
            level = opposite.levels[best]
            resting = next(iter(level.values()))
            traded = min(resting.shares, result.remaining)
            resting.shares -= traded
            result.remaining -= traded
            if resting.shares == 0:
                opposite.remove(resting)
                del self.orders[resting.ref]
            result.fills.append(
                Fill(
                    self.next_match_number,
                    locate,
                    best,
                    traded,
                    ref,
                    side,
                    owner,
                    resting.ref,
                    resting.owner,
                    resting.shares,
                )
            )
            self.next_match_number += 1
        if result.remaining and rest:
            self._rest(RestingOrder(ref, locate, side, price, result.remaining, owner))
            result.rested = True
        return result

    def add_resting(
        self, locate: int, ref: int, side: str, price: int, shares: int, owner: str = ""
    ) -> RestingOrder:
        """Put an order on the book without matching (a replayed feed's add)."""
        if ref in self.orders:
            raise ValueError(f"order reference {ref} is live already")
        order = RestingOrder(ref, locate, side, price, shares, owner)
        self._rest(order)
        return order

    def _rest(self, order: RestingOrder) -> None:
        self._sequence += 1
        order.sequence = self._sequence
        self.book(order.locate).side(order.side).add(order)
        self.orders[order.ref] = order

    def reduce(self, ref: int, shares: int) -> int:
        """Take up to ``shares`` off a live order (cancel or external execution); returns how many.

        The order keeps its time priority; it leaves the book when nothing is left.
        """
        order = self.orders.get(ref)
        if order is None or shares <= 0:
            return 0
        taken = min(shares, order.shares)
        order.shares -= taken
        if order.shares == 0:
            self.book(order.locate).side(order.side).remove(order)
            del self.orders[ref]
        return taken

    def delete(self, ref: int) -> int:
        """Remove a live order; returns the shares it had (0 when unknown)."""
        order = self.orders.get(ref)
        return 0 if order is None else self.reduce(ref, order.shares)

    def depth(self, locate: int) -> tuple[list[tuple[int, int, int]], list[tuple[int, int, int]]]:
        """(bids, asks) as (price, shares, orders) per level, best first."""
        book = self.book(locate)
        return book.bids.depth(), book.asks.depth()

    def queue(self, locate: int, side: str, price: int) -> list[int]:
        """References at one price level in time priority."""
        return list(self.book(locate).side(side).levels.get(price, {}))
