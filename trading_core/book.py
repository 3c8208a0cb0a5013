"""L3 (order-by-order) book for ITCH 5.0: per stock locate, price levels holding FIFO order queues.

Orders are day-unique references (ITCH 5.0 section 1.3: order reference numbers are unique for the
day), so one dict maps every live reference to its order across all symbols, and an order holds its
level: executes, cancels, deletes and replaces never search the book. Each side keeps a dict
price -> level plus a sorted list of keys with the best level at the back (asks stored negated), so
adds and deletes near the touch move few list elements. A level's queue is an insertion-ordered
dict, which is FIFO with O(1) removal from the middle.

Faults never crash outside ``debug`` mode; they are counted in ``Book.errors`` and follow the rules
of the ``itch-book`` reference so the two books agree on imperfect feeds: an unknown reference is
ignored, an add or replace onto a live reference evicts the stale order first, an execution or
cancel larger than the order is clamped, and zero-share or zero-price adds are rejected.
``debug=True`` turns faults into ``BookInvariantError`` and checks level totals on every change and
an uncrossed book in continuous trading: market hours (system events Q to M) with the symbol in
state T. Halts and quotation-only periods can lock or cross a book legitimately, so the check skips
them, and pre- and post-market too, to stay safe on real feeds.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from tailsight.trading_core import itch

if TYPE_CHECKING:
    import struct

    from tailsight.trading_core.itch import Message
    from tailsight.trading_core.itch_batch import BatchResult

BID = "B"
ASK = "S"

# SystemEvent codes (ITCH 5.0 section 1.1): market hours run from "Q" to "M".
_MARKET_OPEN_CODE = "Q"
_MARKET_CLOSE_CODE = "M"
# StockTradingAction state (section 1.2.2) in which the book must be uncrossed.
_TRADING = "T"


class BookInvariantError(AssertionError):
    """A book invariant (uncrossed, known references, level totals) failed in debug mode."""


class TradeEvent(NamedTuple):
    """One execution. For E and C the aggressor is the side opposite the resting order; for P
    (a non-displayed order, book untouched) it is "N": NASDAQ always sends "B" there (1.5.1)."""

    locate: int
    timestamp_ns: int
    price: int
    shares: int
    aggressor_side: str
    resting_ref: int
    match_number: int
    printable: bool
    kind: str = "E"  # the ITCH message type that printed it: E, C or P


class TopOfBook(NamedTuple):
    """Best bid and offer; a missing side reads price 0, size 0."""

    bid_price: int
    bid_shares: int
    ask_price: int
    ask_shares: int


class LevelView(NamedTuple):
    """One aggregated price level in a depth snapshot."""

    price: int
    shares: int
    orders: int


class Depth(NamedTuple):
    """Top-N levels per side, best first."""

    bids: list[LevelView]
    asks: list[LevelView]


class Order:
    """A resting order; ``level`` points at the level whose queue holds it."""

    __slots__ = ("is_buy", "level", "locate", "price", "ref", "shares")

    def __init__(
        self, ref: int, locate: int, is_buy: bool, price: int, shares: int, level: Level
    ) -> None:
        self.ref = ref
        self.locate = locate
        self.is_buy = is_buy
        self.price = price
        self.shares = shares
        self.level = level


class Level:
    """A price level: aggregate shares and the FIFO queue (ref -> order, insertion ordered)."""

    __slots__ = ("orders", "price", "shares", "side")

    def __init__(self, price: int, side: BookSide) -> None:
        self.price = price
        self.shares = 0
        self.orders: dict[int, Order] = {}
        self.side = side


class BookSide:
    """One side of one symbol: levels by price and their sort keys, best key last."""

    __slots__ = ("keys", "levels", "sign")

    def __init__(self, sign: int) -> None:
        self.sign = sign  # +1 bids, -1 asks: key = sign * price, best = keys[-1]
        self.levels: dict[int, Level] = {}
        self.keys: list[int] = []

    def best(self) -> Level | None:
        """The best level, or None when the side is empty."""
        keys = self.keys
        return self.levels[self.sign * keys[-1]] if keys else None

    def top(self, n: int) -> list[LevelView]:
        """The best ``n`` levels, best first."""
        keys, levels, sign = self.keys, self.levels, self.sign
        out = []
        for key in keys[: -n - 1 : -1] if n > 0 else ():
            level = levels[sign * key]
            out.append(LevelView(level.price, level.shares, len(level.orders)))
        return out


class SymbolBook:
    """Both sides of one stock locate, plus its trading state from H messages."""

    __slots__ = ("asks", "bids", "locate", "trading_state")

    def __init__(self, locate: int) -> None:
        self.locate = locate
        self.bids = BookSide(1)
        self.asks = BookSide(-1)
        # Before any H message a symbol is assumed trading: NASDAQ sends H "T" for every symbol
        # at the start of the day, and assuming "T" keeps the debug crossed-book check strict.
        self.trading_state = _TRADING


class Book:
    """L3 book over all stock locates; ``apply(msg)`` takes decoded ITCH messages."""

    def __init__(self, debug: bool = False) -> None:
        self.debug = debug
        self.orders: dict[int, Order] = {}
        self.books: dict[int, SymbolBook] = {}
        self.symbols: dict[int, str] = {}
        self.errors: dict[str, int] = {}
        self.market_open = False
        self.last_system_event = ""
        self._handlers: dict[type, Callable[[Any], TradeEvent | None]] = {}
        self._bind_handlers()

    def __getstate__(self) -> dict[str, Any]:
        # The dispatch table holds closures over self: rebuilt on unpickling (replay sends the
        # trading process's final book back to the parent).
        state = dict(self.__dict__)
        del state["_handlers"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._handlers = {}
        self._bind_handlers()

    # ----------------------------------------------------------------- direct methods

    def add(self, locate: int, ref: int, side: str, price: int, shares: int) -> None:
        """Add a new order at the back of its price level's queue."""
        if shares <= 0 or price <= 0:
            self._fault("rejected_add", f"add {ref}: {shares} shares at {price}")
            return
        orders = self.orders
        if ref in orders:
            self._fault("duplicate_ref", f"add onto live reference {ref}")
            self._remove(orders[ref])
        book = self.books.get(locate)
        if book is None:
            book = self.books[locate] = SymbolBook(locate)
        is_buy = side == BID
        book_side = book.bids if is_buy else book.asks
        level = book_side.levels.get(price)
        if level is None:
            level = book_side.levels[price] = Level(price, book_side)
            insort(book_side.keys, book_side.sign * price)
        order = Order(ref, locate, is_buy, price, shares, level)
        level.orders[ref] = order
        level.shares += shares
        orders[ref] = order
        if self.debug:
            self._check_after(book, level)

    def execute(
        self,
        ref: int,
        shares: int,
        *,
        price: int | None = None,
        printable: bool = True,
        timestamp_ns: int = 0,
        match_number: int = 0,
    ) -> TradeEvent | None:
        """Execute ``shares`` of a resting order (E; with ``price``, C) and return the trade."""
        order = self.orders.get(ref)
        if order is None:
            self._fault("unknown_ref", f"execute of unknown reference {ref}")
            return None
        if shares > order.shares:
            self._fault("oversized_execute", f"execute {shares} > {order.shares} on {ref}")
            shares = order.shares
        trade = TradeEvent(
            order.locate,
            timestamp_ns,
            order.price if price is None else price,
            shares,
            ASK if order.is_buy else BID,
            ref,
            match_number,
            printable,
            "E" if price is None else "C",
        )
        self._reduce(order, shares)
        return trade

    def hidden_trade(
        self, locate: int, price: int, shares: int, *, timestamp_ns: int = 0, match_number: int = 0
    ) -> TradeEvent:
        """A trade against a non-displayed order (P): reported, the book is not touched."""
        return TradeEvent(locate, timestamp_ns, price, shares, "N", 0, match_number, True, "P")

    def cancel(self, ref: int, shares: int) -> None:
        """Cancel part of an order (X); the order leaves the book when nothing remains."""
        order = self.orders.get(ref)
        if order is None:
            self._fault("unknown_ref", f"cancel of unknown reference {ref}")
            return
        if shares > order.shares:
            self._fault("oversized_cancel", f"cancel {shares} > {order.shares} on {ref}")
            shares = order.shares
        self._reduce(order, shares)

    def delete(self, ref: int) -> None:
        """Delete an order (D)."""
        order = self.orders.get(ref)
        if order is None:
            self._fault("unknown_ref", f"delete of unknown reference {ref}")
            return
        self._remove(order)

    def replace(self, old_ref: int, new_ref: int, price: int, shares: int) -> None:
        """Replace (U): the new reference keeps the side and locate, and goes to the back."""
        order = self.orders.get(old_ref)
        if order is None:
            self._fault("unknown_ref", f"replace of unknown reference {old_ref}")
            return
        self._remove(order)
        self.add(order.locate, new_ref, BID if order.is_buy else ASK, price, shares)

    def set_trading_state(self, locate: int, state: str) -> None:
        """Record a symbol's trading state (H message: T trading, H halted, P paused, Q quoting)."""
        book = self.books.get(locate)
        if book is None:
            book = self.books[locate] = SymbolBook(locate)
        book.trading_state = state
        if self.debug and self.market_open and state == _TRADING:
            self._check_uncrossed(book)

    def system_event(self, code: str) -> None:
        """Track market hours from system events (Q opens, M closes)."""
        self.last_system_event = code
        if code == _MARKET_OPEN_CODE:
            self.market_open = True
            if self.debug:
                for book in self.books.values():
                    if book.trading_state == _TRADING:
                        self._check_uncrossed(book)
        elif code == _MARKET_CLOSE_CODE:
            self.market_open = False

    # ----------------------------------------------------------------- queries

    def top_of_book(self, locate: int) -> TopOfBook:
        """Best bid price/size and best ask price/size (0, 0 for an empty side)."""
        book = self.books.get(locate)
        if book is None:
            return TopOfBook(0, 0, 0, 0)
        bid = book.bids.best()
        ask = book.asks.best()
        return TopOfBook(
            bid.price if bid else 0,
            bid.shares if bid else 0,
            ask.price if ask else 0,
            ask.shares if ask else 0,
        )

    def depth(self, locate: int, n: int = 5) -> Depth:
        """The best ``n`` levels per side as (price, shares, order count), best first."""
        book = self.books.get(locate)
        if book is None:
            return Depth([], [])
        return Depth(book.bids.top(n), book.asks.top(n))

    def queue(self, locate: int, side: str, price: int) -> list[int]:
        """Order references resting at one price level, in time priority."""
        book = self.books.get(locate)
        if book is None:
            return []
        level = (book.bids if side == BID else book.asks).levels.get(price)
        return list(level.orders) if level else []

    def order_count(self, locate: int) -> int:
        """Live orders resting in one symbol's book."""
        book = self.books.get(locate)
        if book is None:
            return 0
        sides = (book.bids, book.asks)
        return sum(len(level.orders) for side in sides for level in side.levels.values())

    def is_crossed(self, locate: int) -> bool:
        """True when best bid >= best ask (a locked book is crossed too: it would have traded)."""
        book = self.books.get(locate)
        if book is None or not book.bids.keys or not book.asks.keys:
            return False
        return book.bids.keys[-1] >= -book.asks.keys[-1]

    def check_invariants(self) -> None:
        """Full structural check of every book; raises BookInvariantError."""
        seen = 0
        for locate, book in self.books.items():
            for side in (book.bids, book.asks):
                if sorted(side.keys) != side.keys or len(side.keys) != len(side.levels):
                    raise BookInvariantError(f"locate {locate}: level keys out of order")
                for price, level in side.levels.items():
                    if side.sign * price not in side.keys or level.price != price:
                        raise BookInvariantError(f"locate {locate}: level {price} not indexed")
                    self._check_level(level)
                    for ref, order in level.orders.items():
                        if self.orders.get(ref) is not order or order.locate != locate:
                            raise BookInvariantError(f"order {ref} not indexed in its book")
                        seen += 1
        if seen != len(self.orders):
            raise BookInvariantError(f"{len(self.orders)} indexed orders, {seen} in levels")

    # ----------------------------------------------------------------- ITCH dispatch

    def apply(self, msg: Message) -> TradeEvent | None:
        """Apply one decoded ITCH message; returns the trade an execution produced, else None."""
        handler = self._handlers.get(type(msg))
        return handler(msg) if handler is not None else None

    def apply_batch(
        self, batch: BatchResult, on_trade: Callable[[TradeEvent], None] | None = None
    ) -> int:
        """Apply a batch decoded by ``itch_batch`` in stream order, without per-message records.

        The fast path for replay: rows come out of the structured arrays as plain tuples, so no
        message object is built. Returns the number of messages applied.
        """
        records = batch.records

        def rows(kind: bytes, *names: str) -> Iterator[tuple[Any, ...]]:
            # Column-wise tolist of only the fields needed: far cheaper than a structured
            # array's tolist, which converts every field (alpha ones to bytes) of every row.
            if kind not in records:
                return iter(())
            array = records[kind]
            columns = []
            for name in names:
                column = array[name]
                if name == "side":
                    column = (column == b"B") if column.dtype.kind == "S" else (column == 66)
                elif column.dtype.kind in "SU":
                    column = (
                        np.char.decode(column, "latin-1") if column.dtype.kind == "S" else column
                    )
                columns.append(column.tolist())
            return zip(*columns, strict=True)

        book_fields = ("stock_locate", "order_reference_number", "side", "price", "shares")
        executed = ("order_reference_number", "executed_shares", "timestamp_ns", "match_number")
        streams = {
            b"A"[0]: rows(b"A", *book_fields),
            b"F"[0]: rows(b"F", *book_fields),
            b"E"[0]: rows(b"E", *executed),
            b"C"[0]: rows(b"C", *executed, "printable", "execution_price"),
            b"X"[0]: rows(b"X", "order_reference_number", "cancelled_shares"),
            b"D"[0]: rows(b"D", "order_reference_number"),
            b"U"[0]: rows(
                b"U",
                "original_order_reference_number",
                "new_order_reference_number",
                "price",
                "shares",
            ),
            b"P"[0]: rows(b"P", "stock_locate", "price", "shares", *executed[2:]),
            b"S"[0]: rows(b"S", "event_code"),
            b"H"[0]: rows(b"H", "stock_locate", "trading_state"),
            b"R"[0]: rows(b"R", "stock_locate", "stock"),
        }
        add, execute, cancel, delete, replace = (
            self.add, self.execute, self.cancel, self.delete, self.replace)  # fmt: skip
        type_a, type_f, type_e, type_c, type_x, type_d, type_u = b"AFECXDU"
        type_p, type_s, type_h, type_r = b"PSHR"
        count = 0
        for kind in batch.message_types.tolist():
            count += 1
            stream = streams.get(kind)
            if stream is None:
                continue  # nothing for the book (Q, B, I, ...)
            row = next(stream)
            # Ordered by frequency on NASDAQ days: adds, deletes, executions, cancels, replaces.
            if kind == type_a or kind == type_f:  # noqa: SIM109 -- no tuple per message
                locate, ref, is_buy, price, shares = row
                add(locate, ref, BID if is_buy else ASK, price, shares)
            elif kind == type_d:
                delete(row[0])
            elif kind == type_e:
                trade = execute(row[0], row[1], timestamp_ns=row[2], match_number=row[3])
                if on_trade is not None and trade is not None:
                    on_trade(trade)
            elif kind == type_x:
                cancel(row[0], row[1])
            elif kind == type_u:
                replace(*row)
            elif kind == type_c:
                ref, shares, ts, match, printable, price = row
                trade = execute(ref, shares, price=price, printable=printable == "Y",
                                timestamp_ns=ts, match_number=match)  # fmt: skip
                if on_trade is not None and trade is not None:
                    on_trade(trade)
            elif kind == type_p:
                trade = self.hidden_trade(row[0], row[1], row[2], timestamp_ns=row[3],
                                          match_number=row[4])  # fmt: skip
                if on_trade is not None:
                    on_trade(trade)
            elif kind == type_s:
                self.system_event(row[0])
            elif kind == type_h:
                self.set_trading_state(*row)
            elif kind == type_r:
                self.symbols[row[0]] = row[1].rstrip()
        return count

    def raw_handlers(self) -> dict[int, tuple[struct.Struct, Callable[[Any], TradeEvent | None]]]:
        """Type byte -> (wire layout, handler of its unpacked tuple) for the order messages.

        The live feed's fast path: one ``unpack_from`` and a call, no message object (building a
        frozen ITCH record cost more than the book update). Other types go through ``apply``.
        """
        add, execute, cancel, delete, replace = (
            self.add, self.execute, self.cancel, self.delete, self.replace)  # fmt: skip
        # Unpacked: type, locate, tracking, timestamp high, low, then the body in wire order.

        def on_add(v: Any) -> None:
            add(v[1], v[5], BID if v[6] == b"B" else ASK, v[9], v[7])

        def on_exec(v: Any) -> TradeEvent | None:
            return execute(v[5], v[6], timestamp_ns=(v[3] << 32) | v[4], match_number=v[7])

        def on_exec_price(v: Any) -> TradeEvent | None:
            return execute(v[5], v[6], price=v[9], printable=v[8] == b"Y",
                           timestamp_ns=(v[3] << 32) | v[4], match_number=v[7])  # fmt: skip

        def on_trade(v: Any) -> TradeEvent:
            return self.hidden_trade(v[1], v[9], v[7], timestamp_ns=(v[3] << 32) | v[4],
                                     match_number=v[10])  # fmt: skip

        handlers: dict[bytes, Callable[[Any], TradeEvent | None]] = {
            b"A": on_add,
            b"F": on_add,
            b"E": on_exec,
            b"C": on_exec_price,
            b"X": lambda v: cancel(v[5], v[6]),
            b"D": lambda v: delete(v[5]),
            b"U": lambda v: replace(v[5], v[6], v[8], v[7]),
            b"P": on_trade,
        }
        return {kind[0]: (itch.wire_struct(kind), handler) for kind, handler in handlers.items()}

    def _bind_handlers(self) -> None:
        h = self._handlers

        def on_add(m: Any) -> None:
            self.add(m.stock_locate, m.order_reference_number, m.side, m.price, m.shares)

        def on_exec(m: Any) -> TradeEvent | None:
            return self.execute(
                m.order_reference_number,
                m.executed_shares,
                timestamp_ns=m.timestamp_ns,
                match_number=m.match_number,
            )

        def on_exec_price(m: Any) -> TradeEvent | None:
            return self.execute(
                m.order_reference_number,
                m.executed_shares,
                price=m.execution_price,
                printable=m.printable == "Y",
                timestamp_ns=m.timestamp_ns,
                match_number=m.match_number,
            )

        h[itch.AddOrder] = on_add
        h[itch.AddOrderMPID] = on_add
        h[itch.OrderExecuted] = on_exec
        h[itch.OrderExecutedWithPrice] = on_exec_price
        h[itch.OrderCancel] = lambda m: self.cancel(m.order_reference_number, m.cancelled_shares)
        h[itch.OrderDelete] = lambda m: self.delete(m.order_reference_number)
        h[itch.OrderReplace] = lambda m: self.replace(
            m.original_order_reference_number, m.new_order_reference_number, m.price, m.shares
        )
        h[itch.Trade] = lambda m: self.hidden_trade(
            m.stock_locate, m.price, m.shares, timestamp_ns=m.timestamp_ns,
            match_number=m.match_number)  # fmt: skip
        h[itch.SystemEvent] = lambda m: self.system_event(m.event_code)
        h[itch.StockTradingAction] = lambda m: self.set_trading_state(
            m.stock_locate, m.trading_state
        )
        h[itch.StockDirectory] = self._on_directory

    def _on_directory(self, m: Any) -> None:
        self.symbols[m.stock_locate] = m.stock

    # ----------------------------------------------------------------- internals

    def _reduce(self, order: Order, shares: int) -> None:
        level = order.level
        order.shares -= shares
        level.shares -= shares
        if order.shares <= 0:
            del self.orders[order.ref]
            del level.orders[order.ref]
            if not level.orders:
                self._drop_level(level)
        elif self.debug:
            self._check_level(level)

    def _remove(self, order: Order) -> None:
        level = order.level
        del self.orders[order.ref]
        del level.orders[order.ref]
        level.shares -= order.shares
        if not level.orders:
            self._drop_level(level)
        elif self.debug:
            self._check_level(level)

    @staticmethod
    def _drop_level(level: Level) -> None:
        side = level.side
        del side.levels[level.price]
        keys = side.keys
        key = side.sign * level.price
        if keys[-1] == key:
            keys.pop()
        else:
            del keys[bisect_left(keys, key)]

    def _fault(self, kind: str, detail: str) -> None:
        if self.debug:
            raise BookInvariantError(detail)
        self.errors[kind] = self.errors.get(kind, 0) + 1

    def _check_after(self, book: SymbolBook, level: Level) -> None:
        self._check_level(level)
        if self.market_open and book.trading_state == _TRADING:
            self._check_uncrossed(book)

    def _check_uncrossed(self, book: SymbolBook) -> None:
        if self.is_crossed(book.locate):
            top = self.top_of_book(book.locate)
            raise BookInvariantError(
                f"locate {book.locate} crossed in continuous trading: "
                f"bid {top.bid_price} >= ask {top.ask_price}"
            )

    @staticmethod
    def _check_level(level: Level) -> None:
        total = sum(o.shares for o in level.orders.values())
        if total != level.shares or any(o.shares <= 0 for o in level.orders.values()):
            raise BookInvariantError(
                f"level {level.price}: total {level.shares} != sum of orders {total}"
            )
