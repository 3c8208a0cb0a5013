"""A small deterministic market-making/taking strategy with pre-trade risk checks.

On each top-of-book change of a symbol it keeps one quote per side: joining the touch, or one
tick inside when the spread is wide, and cancels a quote the market has moved away from. It takes
liquidity (an immediate-or-cancel order at the touch) when the queue imbalance, plus the latest
external signal, passes a threshold. The signal comes from ``SignalHook``: an inference stage
publishes into it asynchronously and the strategy only reads the latest value, never waits.
Every order passes ``RiskLimits`` (max order size, max position, price band around the mid) first.

For latency measurement ``act_share`` makes it also act on that share of *all* book updates
(not only top changes): an immediate-or-cancel order joining its own side's touch (sides taking
turns), which cannot cross so it costs the exchange one accept and one cancel and moves no
position. ``inject_delay_ns`` (calibration only) busy-waits that long before each order is sent,
a known regression for checking that a latency gate sees one.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, NamedTuple, Protocol

from tailsight.trading_core import ouch
from tailsight.trading_core.book import TopOfBook

__all__ = [
    "OrderSink",
    "RiskCheck",
    "RiskLimits",
    "Signal",
    "SignalHook",
    "Strategy",
    "StrategyConfig",
]

DAY: Final = "0"
IOC: Final = "3"


class OrderSink(Protocol):
    """Where orders go: the OUCH ``Gateway`` or a test double."""

    def enter_order(
        self, symbol: str, side: str, price: int, quantity: int, time_in_force: str = DAY
    ) -> int: ...

    def cancel(self, user_ref_num: int, quantity: int = 0) -> None: ...


class Signal(NamedTuple):
    value: float  # > 0 favours buying, < 0 selling; about -1..1
    timestamp_ns: int


class SignalHook:
    """Latest signal per stock locate; written by an asynchronous stage, read without waiting."""

    def __init__(self) -> None:
        self._latest: dict[int, Signal] = {}
        self._lock = threading.Lock()

    def publish(self, locate: int, value: float, timestamp_ns: int) -> None:
        with self._lock:
            self._latest[locate] = Signal(value, timestamp_ns)

    def latest(self, locate: int) -> Signal | None:
        with self._lock:
            return self._latest.get(locate)


@dataclass(frozen=True)
class RiskLimits:
    max_order_shares: int = 500
    max_position_shares: int = 2_000  # per symbol, counting open orders as if filled
    price_band_bps: int = 500  # an order price must lie within this of the mid


class RiskCheck:
    """Pre-trade checks; ``check`` returns None (pass) or the name of the failed limit."""

    def __init__(self, limits: RiskLimits) -> None:
        self.limits = limits

    def check(
        self,
        side: str,
        price: int,
        shares: int,
        position: int,
        open_buy_shares: int,
        open_sell_shares: int,
        mid_price: int,
    ) -> str | None:
        limits = self.limits
        if not 0 < shares <= limits.max_order_shares:
            return "max_order_shares"
        if side == "B" and position + open_buy_shares + shares > limits.max_position_shares:
            return "max_position"
        if side == "S" and position - open_sell_shares - shares < -limits.max_position_shares:
            return "max_position"
        # Integer form of |price - mid| / mid <= bps / 10^4.
        if mid_price <= 0 or abs(price - mid_price) * 10_000 > mid_price * limits.price_band_bps:
            return "price_band"
        return None


@dataclass(frozen=True)
class StrategyConfig:
    tick: int = 100  # Price(4) units: $0.01
    quote_shares: int = 100
    wide_spread_ticks: int = 3  # at or above, quote one tick inside
    requote_ticks: int = 2  # cancel a quote this far behind the touch
    take_shares: int = 100
    take_threshold: float = 0.8  # imbalance + signal needed to take
    take_cooldown_events: int = 50  # book events per symbol between two takes
    act_share: float = 0.0  # also send a non-crossing IOC on this share of all book updates
    inject_delay_ns: int = 0  # calibration only: busy-wait before each order goes out

    def __post_init__(self) -> None:
        if not 0.0 <= self.act_share <= 1.0:
            raise ValueError(f"act_share must be in [0, 1], got {self.act_share}")
        if self.inject_delay_ns < 0:
            raise ValueError(f"inject_delay_ns must be >= 0, got {self.inject_delay_ns}")


@dataclass
class _Order:
    user_ref_num: int
    locate: int
    side: str
    price: int
    open_shares: int
    cancel_sent: bool = False


@dataclass
class _SymbolState:
    quotes: dict[str, int | None] = field(default_factory=lambda: {"B": None, "S": None})
    position: int = 0
    events: int = 0
    last_take_event: int = -(10**9)


class Strategy:
    """Reacts to ``on_book`` (feed thread) and ``on_response`` (gateway thread); thread-safe."""

    def __init__(
        self,
        sink: OrderSink,
        symbols: Mapping[int, str],
        config: StrategyConfig = StrategyConfig(),
        limits: RiskLimits = RiskLimits(),
        signal: SignalHook | None = None,
    ) -> None:
        self.sink = sink
        self.symbols = symbols  # locate -> symbol, e.g. a live ``Book.symbols``
        self.config = config
        self.risk = RiskCheck(limits)
        self.signal = signal
        self.orders: dict[int, _Order] = {}
        self.state: dict[int, _SymbolState] = {}
        self.risk_rejects: Counter[str] = Counter()
        self.orders_sent = 0
        self.cancels_sent = 0
        self.halted = False
        # Open shares per (locate, side), kept as orders go out and responses come in: the
        # position check needs them on every order, and a scan of all open orders would be O(n).
        self._open_shares: dict[tuple[int, str], int] = {}
        self._share_credit = 0.0
        self._probe_side = "B"
        self._lock = threading.RLock()

    def halt(self) -> None:
        """Kill switch: send nothing more (responses are still applied)."""
        with self._lock:
            self.halted = True

    def position(self, locate: int) -> int:
        return self.state[locate].position if locate in self.state else 0

    def on_book(self, locate: int, top: TopOfBook) -> int:
        """React to the symbol's new top of book; returns how many orders/cancels were sent."""
        if self.halted or not (top.bid_price and top.ask_price) or top.bid_price >= top.ask_price:
            return 0  # one-sided or locked/crossed (halt, auction): stand aside
        symbol = self.symbols.get(locate)
        if symbol is None:
            return 0
        with self._lock:
            state = self.state.setdefault(locate, _SymbolState())
            state.events += 1
            actions = self._requote(locate, symbol, state, top)
            actions += self._maybe_take(locate, symbol, state, top)
            return actions

    def on_update(self, locate: int, top: TopOfBook, top_changed: bool) -> int:
        """A book update of ``locate``: ``on_book`` when the top changed, plus the ``act_share``
        orders; returns how many orders/cancels were sent."""
        actions = self.on_book(locate, top) if top_changed else 0
        share = self.config.act_share
        if share:
            # Deterministic spacing: exactly round(share * updates) orders, evenly spread.
            self._share_credit += share
            if self._share_credit >= 1.0:
                self._share_credit -= 1.0
                actions += self._act(locate, top)
        return actions

    def _act(self, locate: int, top: TopOfBook) -> int:
        if self.halted or not (top.bid_price and top.ask_price) or top.bid_price >= top.ask_price:
            return 0
        symbol = self.symbols.get(locate)
        if symbol is None:
            return 0
        with self._lock:
            side = self._probe_side
            self._probe_side = "S" if side == "B" else "B"
            price = top.bid_price if side == "B" else top.ask_price
            shares = self.config.quote_shares
            return int(self._submit(locate, symbol, side, price, shares, IOC, top) is not None)

    def _requote(self, locate: int, symbol: str, state: _SymbolState, top: TopOfBook) -> int:
        config = self.config
        spread = top.ask_price - top.bid_price
        improve = config.tick if spread >= config.wide_spread_ticks * config.tick else 0
        actions = 0
        for side in ("B", "S"):
            ref = state.quotes[side]
            if ref is not None:
                order = self.orders.get(ref)
                if order is None:
                    state.quotes[side] = None
                else:
                    behind = (
                        top.bid_price - order.price if side == "B" else order.price - top.ask_price
                    )
                    if behind >= config.requote_ticks * config.tick and not order.cancel_sent:
                        order.cancel_sent = True
                        self.sink.cancel(ref, 0)
                        self.cancels_sent += 1
                        actions += 1
                    continue
            price = top.bid_price + improve if side == "B" else top.ask_price - improve
            sent = self._submit(locate, symbol, side, price, config.quote_shares, DAY, top)
            if sent is not None:
                state.quotes[side] = sent
                actions += 1
        return actions

    def _maybe_take(self, locate: int, symbol: str, state: _SymbolState, top: TopOfBook) -> int:
        config = self.config
        if state.events - state.last_take_event < config.take_cooldown_events:
            return 0
        total = top.bid_shares + top.ask_shares
        imbalance = (top.bid_shares - top.ask_shares) / total if total else 0.0
        signal = self.signal.latest(locate) if self.signal is not None else None
        score = imbalance + (signal.value if signal is not None else 0.0)
        if abs(score) < config.take_threshold:
            return 0
        side, price = ("B", top.ask_price) if score > 0 else ("S", top.bid_price)
        state.last_take_event = state.events
        return int(
            self._submit(locate, symbol, side, price, config.take_shares, IOC, top) is not None
        )

    def _submit(
        self,
        locate: int,
        symbol: str,
        side: str,
        price: int,
        shares: int,
        time_in_force: str,
        top: TopOfBook,
    ) -> int | None:
        open_buy = self._open_shares.get((locate, "B"), 0)
        open_sell = self._open_shares.get((locate, "S"), 0)
        mid = (top.bid_price + top.ask_price) // 2
        failed = self.risk.check(
            side, price, shares, self.position(locate), open_buy, open_sell, mid
        )
        if failed is not None:
            self.risk_rejects[failed] += 1
            return None
        if self.config.inject_delay_ns:
            until = time.perf_counter_ns() + self.config.inject_delay_ns
            while time.perf_counter_ns() < until:
                pass
        ref = self.sink.enter_order(symbol, side, price, shares, time_in_force)
        self.orders[ref] = _Order(ref, locate, side, price, shares)
        self._open_shares[locate, side] = self._open_shares.get((locate, side), 0) + shares
        self.orders_sent += 1
        return ref

    def on_response(self, message: ouch.OutboundMessage) -> None:
        """Apply an OUCH response (a ``Gateway.on_message`` callback): fills, cancels, rejects."""
        with self._lock:
            ref = getattr(message, "user_ref_num", None)
            order = self.orders.get(ref) if isinstance(ref, int) else None
            if order is None:
                return
            before = order.open_shares
            if isinstance(message, ouch.OrderExecuted):
                signed = message.quantity if order.side == "B" else -message.quantity
                self.state.setdefault(order.locate, _SymbolState()).position += signed
                order.open_shares -= message.quantity
            elif isinstance(message, ouch.OrderCanceled):
                order.open_shares -= message.quantity
            elif isinstance(message, ouch.OrderRejected):
                order.open_shares = 0
            elif isinstance(message, ouch.CancelReject):
                order.cancel_sent = False
            key = (order.locate, order.side)
            self._open_shares[key] -= before - max(order.open_shares, 0)
            if order.open_shares <= 0:
                del self.orders[order.user_ref_num]
