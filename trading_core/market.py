"""Synthetic ITCH 5.0 trading day: deterministic per seed, many symbols, a realistic message mix.

The day follows the spec's system event sequence (section 1.1: O, S, Q, M, E, C), a stock
directory (R) and a trading action (H "T") per symbol before the open, one halt, quotation-only
period and resume in market hours, then order flow: adds dominate, deletes and partial cancels
follow, with executions at the touch, replaces, a few executions with price (C) and hidden-order
trades (P). Prices sit on a one-cent grid (Price(4) units: 100 = $0.01) around a drifting mid per
symbol, and the generator keeps its own ``Book`` so no book ever crosses: an add that would cross
becomes an execution against the resting order at the opposite touch instead.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

import numpy as np

from tailsight.trading_core.book import Book, Order
from tailsight.trading_core.itch import (
    AddOrder,
    AddOrderMPID,
    Message,
    OrderCancel,
    OrderDelete,
    OrderExecuted,
    OrderExecutedWithPrice,
    OrderReplace,
    StockDirectory,
    StockTradingAction,
    SystemEvent,
    Trade,
    encode,
)
from tailsight.trading_core.itch_file import write_itch
from tailsight.trading_core.moldudp64 import MoldPacket, decode_packet, encode_packet, pack_messages

TICK = 100  # $0.01 in Price(4) units
MAX_SYMBOLS = 0xFFFF  # locates 1..65535: the 2-byte stock locate
_NS_PER_HOUR = 3_600_000_000_000
_NS_PER_MINUTE = 60_000_000_000

# Wall-clock schedule of the day (ns since midnight, as ITCH timestamps are).
START_OF_MESSAGES_NS = 3 * _NS_PER_HOUR
START_OF_SYSTEM_HOURS_NS = 4 * _NS_PER_HOUR
START_OF_MARKET_HOURS_NS = 9 * _NS_PER_HOUR + 30 * _NS_PER_MINUTE
END_OF_MARKET_HOURS_NS = 16 * _NS_PER_HOUR
END_OF_SYSTEM_HOURS_NS = 20 * _NS_PER_HOUR
END_OF_MESSAGES_NS = 20 * _NS_PER_HOUR + 5 * _NS_PER_MINUTE

# Share of the order flow in pre-market, market hours and post-market.
_PHASE_SHARES = (0.08, 0.87, 0.05)

# Event mix of the order flow (before the book's state forces a substitution): the cumulative
# thresholds for add, delete, partial cancel, execute, replace, execute-with-price, trade.
_MIX = (
    ("add", 0.63),
    ("delete", 0.22),
    ("cancel", 0.05),
    ("execute", 0.04),
    ("replace", 0.035),
    ("execute_price", 0.005),
    ("trade", 0.02),
)
_THRESHOLDS = tuple(float(x) for x in np.cumsum([share for _, share in _MIX]))

# Live orders per symbol the flow is steered towards: above it, adds turn into deletes.
_TARGET_LIVE_ORDERS = 400
_MPID_SHARE = 0.05
_MPIDS = ("GSCO", "MSCO", "UBSS", "CDRG", "NITE", "VIRT")
_MID_MOVE_PROB = 0.02  # per message of the symbol, the mid moves one tick
_HALT_REASON = "T1"  # halt, news pending (spec Appendix: trading action reason codes)

DEFAULT_SYMBOLS = (
    "AAPL", "MSFT", "NVDA", "AMZN", "GOOGL", "META", "TSLA", "AMD",
    "INTC", "CSCO", "NFLX", "ADBE", "QQQ", "PEP", "COST", "AVGO",
)  # fmt: skip


def symbol_names(symbols: int | Sequence[str]) -> list[str]:
    """Symbol names for a count (well-known tickers first, then SYM0017-style) or a name list."""
    if not isinstance(symbols, int):
        names = [s.upper() for s in symbols]
    elif symbols > MAX_SYMBOLS:
        raise ValueError(f"at most {MAX_SYMBOLS:,} symbols (the stock locate is 2 bytes), "
                         f"not {symbols:,}")  # fmt: skip
    else:
        names = list(DEFAULT_SYMBOLS[:symbols])
        names += [f"SYM{i:04d}" for i in range(len(names), symbols)]
    if not names or len(set(names)) != len(names) or any(not 0 < len(s) <= 8 for s in names):
        raise ValueError("symbols must be 1..8 characters, unique, at least one")
    if len(names) > MAX_SYMBOLS:
        raise ValueError(f"at most {MAX_SYMBOLS:,} symbols (the stock locate is 2 bytes)")
    return names


class _Symbol:
    """Generator-side state of one symbol: mid price and the live references to pick from."""

    __slots__ = ("halted", "live", "locate", "mid_ticks", "name", "position", "quoting_only")

    def __init__(self, locate: int, name: str, mid_ticks: int) -> None:
        self.locate = locate
        self.name = name
        self.mid_ticks = mid_ticks
        self.live: list[int] = []
        self.position: dict[int, int] = {}
        self.halted = False
        self.quoting_only = False

    def track(self, ref: int) -> None:
        self.position[ref] = len(self.live)
        self.live.append(ref)

    def forget(self, ref: int) -> None:
        # Swap-remove keeps random picks O(1).
        index = self.position.pop(ref)
        last = self.live.pop()
        if index < len(self.live):
            self.live[index] = last
            self.position[last] = index


def _geometric(u: float, p: float) -> int:
    """Failures before the first success, from one uniform draw (0, 1, 2, ...)."""
    return int(math.log(1.0 - u) / math.log(1.0 - p))


class _Generator:
    def __init__(self, seed: int, names: list[str], messages: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.book = Book()
        self.symbols = [
            _Symbol(locate, name, int(self.rng.integers(5, 500)) * 100)
            for locate, name in enumerate(names, start=1)
        ]
        weights = 1.0 / np.arange(1, len(names) + 1) ** 0.8  # a few busy names, a long tail
        self.weights = weights / weights.sum()
        self.messages = messages
        self.next_ref = 1
        self.next_match = 1

    def run(self) -> Iterator[Message]:
        symbols = self.symbols
        halting = symbols[1] if len(symbols) > 1 else None
        admin = 6 + 2 * len(symbols) + (3 if halting else 0)
        flow = max(0, self.messages - admin)
        yield SystemEvent(0, 0, START_OF_MESSAGES_NS, "O")
        for s in symbols:
            yield _directory(s, START_OF_MESSAGES_NS + s.locate * 1000)
        for s in symbols:
            yield StockTradingAction(s.locate, 0, START_OF_MESSAGES_NS + 10**9 + s.locate, s.name,
                                     "T", " ", "")  # fmt: skip
        yield SystemEvent(0, 0, START_OF_SYSTEM_HOURS_NS, "S")
        counts = [round(flow * share) for share in _PHASE_SHARES]
        counts[1] = flow - counts[0] - counts[2]
        windows = (
            (START_OF_SYSTEM_HOURS_NS + 1, START_OF_MARKET_HOURS_NS),
            (START_OF_MARKET_HOURS_NS + 1, END_OF_MARKET_HOURS_NS),
            (END_OF_MARKET_HOURS_NS + 1, END_OF_SYSTEM_HOURS_NS),
        )
        closing = ("Q", START_OF_MARKET_HOURS_NS), ("M", END_OF_MARKET_HOURS_NS), None
        for phase, (count, (start_ns, end_ns), close) in enumerate(
            zip(counts, windows, closing, strict=True)
        ):
            times = self._timestamps(count, start_ns, end_ns)
            # One halt in market hours: halt at 40 % of the phase, quote at 45 %, resume at 50 %.
            marks: dict[int, list[str]] = {}
            if phase == 1 and halting is not None:
                for at, state in ((0.40, "H"), (0.45, "Q"), (0.50, "T")):
                    marks.setdefault(int(count * at), []).append(state)
            yield from self._flow(times, marks, halting)
            if close is not None:
                yield SystemEvent(0, 0, close[1], close[0])
        yield SystemEvent(0, 0, END_OF_SYSTEM_HOURS_NS, "E")
        yield SystemEvent(0, 0, END_OF_MESSAGES_NS, "C")

    def _timestamps(self, count: int, start_ns: int, end_ns: int) -> list[int]:
        """``count`` strictly increasing timestamps in [start_ns, end_ns)."""
        if count == 0:
            return []
        span = max(1, end_ns - start_ns - count)
        raw = np.sort(self.rng.integers(0, span, size=count, dtype=np.int64))
        return (raw + np.arange(count, dtype=np.int64) + start_ns).tolist()  # type: ignore[no-any-return]

    def _flow(
        self, times: list[int], marks: dict[int, list[str]], halting: _Symbol | None
    ) -> Iterator[Message]:
        block = 8192
        nsym = len(self.symbols)
        for begin in range(0, len(times), block):
            size = min(block, len(times) - begin)
            picks = self.rng.choice(nsym, size=size, p=self.weights).tolist()
            draws = self.rng.random((size, 6)).tolist()
            for i in range(size):
                index = begin + i
                if index in marks and halting is not None:
                    for state in marks[index]:
                        yield self._trading_action(halting, state, times[index])
                yield self._event(self.symbols[picks[i]], times[index], draws[i])

    def _trading_action(self, s: _Symbol, state: str, ts: int) -> Message:
        s.halted = state == "H"
        s.quoting_only = state == "Q"
        self.book.set_trading_state(s.locate, state)
        return StockTradingAction(
            s.locate, 0, ts, s.name, state, " ", _HALT_REASON if state != "T" else ""
        )

    def _event(self, s: _Symbol, ts: int, u: list[float]) -> Message:
        if u[3] < _MID_MOVE_PROB:
            s.mid_ticks += 1 if u[3] < _MID_MOVE_PROB / 2 else -1
            s.mid_ticks = max(s.mid_ticks, 10)
        x = u[0]
        kind = "trade"
        for (name, _), threshold in zip(_MIX, _THRESHOLDS, strict=True):
            if x < threshold:
                kind = name
                break
        live = len(s.live)
        if kind == "add" and live > _TARGET_LIVE_ORDERS and u[1] < 0.5:
            kind = "delete"
        elif kind != "add" and live < 4:
            kind = "add"
        if s.halted and kind not in ("delete", "cancel"):
            kind = "delete" if live else "add"
        if s.halted and kind == "add":
            # Halted with an empty book there is nothing to delete; orders are still accepted
            # during a halt, and a passive one cannot cross.
            return self._add(s, ts, u, passive_only=True)
        if s.quoting_only and kind in ("execute", "execute_price", "trade"):
            kind = "add"
        if kind == "add":
            return self._add(s, ts, u, passive_only=s.quoting_only)
        if kind == "delete":
            order = self._random_order(s, u[1])
            self.book.delete(order.ref)
            s.forget(order.ref)
            return OrderDelete(s.locate, 0, ts, order.ref)
        if kind == "cancel":
            order = self._random_order(s, u[1])
            if order.shares < 2:
                self.book.delete(order.ref)
                s.forget(order.ref)
                return OrderDelete(s.locate, 0, ts, order.ref)
            shares = 1 + int(u[2] * (order.shares - 1))
            self.book.cancel(order.ref, shares)
            return OrderCancel(s.locate, 0, ts, order.ref, shares)
        if kind == "replace":
            return self._replace(s, ts, u)
        if kind == "trade":
            return self._hidden_trade(s, ts, u)
        return self._execute_touch(s, ts, u, with_price=kind == "execute_price")

    def _random_order(self, s: _Symbol, u: float) -> Order:
        return self.book.orders[s.live[int(u * len(s.live))]]

    def _shares(self, u: float) -> int:
        if u < 0.1:
            return 1 + int(u * 10 * 99)  # odd lot
        return 100 * (1 + _geometric((u - 0.1) / 0.9, 0.45))

    def _add(self, s: _Symbol, ts: int, u: list[float], passive_only: bool) -> Message:
        is_buy = u[1] < 0.5
        depth_ticks = _geometric(u[2], 0.3)
        shares = self._shares(u[4])
        top = self.book.top_of_book(s.locate)
        if is_buy:
            price = max(TICK, (s.mid_ticks - 1 - depth_ticks) * TICK)
            opposite = top.ask_price
            crosses = opposite and price >= opposite
        else:
            price = (s.mid_ticks + 1 + depth_ticks) * TICK
            opposite = top.bid_price
            crosses = opposite and price <= opposite
        if crosses:
            if not passive_only:
                return self._execute_against(s, ts, not is_buy, shares, None)
            # Halted or quoting only: join the book one tick behind the opposite touch.
            price = opposite - TICK if is_buy else opposite + TICK
        ref = self.next_ref
        self.next_ref += 1
        side = "B" if is_buy else "S"
        self.book.add(s.locate, ref, side, price, shares)
        s.track(ref)
        if u[5] < _MPID_SHARE:
            mpid = _MPIDS[int(u[5] / _MPID_SHARE * len(_MPIDS))]
            return AddOrderMPID(s.locate, 0, ts, ref, side, shares, s.name, price, mpid)
        return AddOrder(s.locate, 0, ts, ref, side, shares, s.name, price)

    def _execute_touch(self, s: _Symbol, ts: int, u: list[float], with_price: bool) -> Message:
        top = self.book.top_of_book(s.locate)
        resting_buy = u[1] < 0.5
        if not (top.bid_price if resting_buy else top.ask_price):
            resting_buy = not resting_buy
        if not (top.bid_price if resting_buy else top.ask_price):
            return self._add(s, ts, u, passive_only=False)
        order = self._head(s, resting_buy)
        shares = order.shares if u[2] < 0.8 else 1 + int(u[2] * (order.shares - 1))
        price = None
        if with_price:
            price = max(TICK, order.price + (TICK if resting_buy else -TICK) * int(u[3] * 3))
        return self._execute_against(s, ts, resting_buy, shares, price, u[2] < 0.8)

    def _head(self, s: _Symbol, resting_buy: bool) -> Order:
        book = self.book.books[s.locate]
        level = (book.bids if resting_buy else book.asks).best()
        assert level is not None
        return next(iter(level.orders.values()))

    def _execute_against(
        self,
        s: _Symbol,
        ts: int,
        resting_buy: bool,
        shares: int,
        price: int | None,
        printable: bool = True,
    ) -> Message:
        """Fill the FIFO head of the opposite touch (an aggressive order), up to ``shares``."""
        order = self._head(s, resting_buy)
        shares = min(shares, order.shares)
        match = self.next_match
        self.next_match += 1
        ref = order.ref
        self.book.execute(ref, shares)
        if ref not in self.book.orders:
            s.forget(ref)
        if price is None:
            return OrderExecuted(s.locate, 0, ts, ref, shares, match)
        return OrderExecutedWithPrice(
            s.locate, 0, ts, ref, shares, match, "Y" if printable else "N", price
        )

    def _replace(self, s: _Symbol, ts: int, u: list[float]) -> Message:
        order = self._random_order(s, u[1])
        top = self.book.top_of_book(s.locate)
        move = _geometric(u[2], 0.5) * (1 if u[3] < 0.5 else -1)
        price = max(TICK, order.price + move * TICK)
        # Keep the new price behind the opposite touch so the replace cannot cross.
        if order.is_buy and top.ask_price and price >= top.ask_price:
            price = top.ask_price - TICK
        if not order.is_buy and top.bid_price and price <= top.bid_price:
            price = top.bid_price + TICK
        if price <= 0:
            price = order.price
        shares = max(1, int(order.shares * (0.5 + u[3])))
        new_ref = self.next_ref
        self.next_ref += 1
        old_ref = order.ref
        self.book.replace(old_ref, new_ref, price, shares)
        s.forget(old_ref)
        s.track(new_ref)
        return OrderReplace(s.locate, 0, ts, old_ref, new_ref, shares, price)

    def _hidden_trade(self, s: _Symbol, ts: int, u: list[float]) -> Message:
        """A P message: a non-displayed order executes inside the spread, the book is untouched."""
        top = self.book.top_of_book(s.locate)
        low = top.bid_price or (s.mid_ticks - 1) * TICK
        high = top.ask_price or (s.mid_ticks + 1) * TICK
        price = max(TICK, (low + high) // 2 // TICK * TICK)
        match = self.next_match
        self.next_match += 1
        # The side field is always "B" on NASDAQ's feed (the hidden side is not disclosed).
        return Trade(s.locate, 0, ts, 0, "B", self._shares(u[2]), s.name, price, match)


def _directory(s: _Symbol, ts: int) -> StockDirectory:
    # Q = NASDAQ Global Select, N = normal financial status, C = common stock, Z = no sub-type...
    return StockDirectory(s.locate, 0, ts, s.name, "Q", "N", 100, "N", "C", "Z", "P", "N", "N",
                          "1", "N", 0, "N")  # fmt: skip


def generate_day(
    seed: int, symbols: int | Sequence[str] = 8, messages: int = 100_000
) -> Iterator[Message]:
    """Yield one synthetic trading day of ``messages`` ITCH messages (at least the admin ones)."""
    return _Generator(seed, symbol_names(symbols), messages).run()


def write_day(
    path: str | Path,
    seed: int,
    symbols: int | Sequence[str] = 8,
    messages: int = 100_000,
    gzip: bool | None = None,
) -> None:
    """Write a generated day as a standard NASDAQ ITCH file (2-byte length prefixes)."""
    write_itch(path, generate_day(seed, symbols, messages), gzip=gzip)


def write_moldudp64(
    target: str | Path | BinaryIO,
    seed: int,
    symbols: int | Sequence[str] = 8,
    messages: int = 100_000,
    session: str = "TAILSIGHT0",
    max_payload: int = 1400,
) -> int:
    """Write the day as MoldUDP64 packets (sequence from 1, then end of session); returns the count.

    Each packet sits behind a 2-byte big-endian length, standing in for UDP datagram boundaries.
    """

    def write_to(sink: BinaryIO) -> int:
        written = 0

        def put(packet: bytes) -> None:
            nonlocal written
            sink.write(len(packet).to_bytes(2, "big") + packet)
            written += 1

        sequence = 1
        carry: list[bytes] = []  # the last, possibly part-full packet of a group, re-packed
        group: list[bytes] = []
        for msg in generate_day(seed, symbols, messages):
            group.append(encode(msg))
            if len(group) < 10_000:
                continue
            packets = pack_messages(session, sequence, carry + group, max_payload)
            for packet in packets[:-1]:
                put(packet)
            last = decode_packet(packets[-1])
            sequence, carry, group = last.sequence_number, list(last.messages), []
        for packet in pack_messages(session, sequence, carry + group, max_payload):
            put(packet)
            sequence = decode_packet(packet).next_sequence_number
        put(encode_packet(MoldPacket(session, sequence, (), end_of_session=True)))
        return written

    if isinstance(target, str | Path):
        with open(target, "wb") as sink:
            return write_to(sink)
    return write_to(target)
