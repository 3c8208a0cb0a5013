"""Strategy decisions on scripted books, risk limits at their boundaries, and a property test:
whatever the market does, position plus open orders never exceeds the limit (counted here from
the orders actually sent and filled, not from the strategy's own bookkeeping)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tailsight.trading_core import ouch
from tailsight.trading_core.book import TopOfBook
from tailsight.trading_core.strategy import (
    IOC,
    RiskCheck,
    RiskLimits,
    SignalHook,
    Strategy,
    StrategyConfig,
)

SYMBOLS = {1: "ACME"}


class FakeSink:
    def __init__(self) -> None:
        self.log: list[tuple] = []
        self.next_ref = 1

    def enter_order(self, symbol, side, price, quantity, time_in_force="0") -> int:  # type: ignore[no-untyped-def]
        ref = self.next_ref
        self.next_ref += 1
        self.log.append(("enter", ref, symbol, side, price, quantity, time_in_force))
        return ref

    def cancel(self, user_ref_num: int, quantity: int = 0) -> None:
        self.log.append(("cancel", user_ref_num, quantity))


def executed(ref: int, shares: int, price: int = 100_000) -> ouch.OrderExecuted:
    return ouch.OrderExecuted(0, ref, shares, price, "A", 1)


def canceled(ref: int, shares: int) -> ouch.OrderCanceled:
    return ouch.OrderCanceled(0, ref, shares, "U")


def test_risk_limits_at_their_boundaries() -> None:
    risk = RiskCheck(
        RiskLimits(max_order_shares=500, max_position_shares=2_000, price_band_bps=500)
    )
    mid = 100_000
    assert risk.check("B", mid, 500, 0, 0, 0, mid) is None
    assert risk.check("B", mid, 501, 0, 0, 0, mid) == "max_order_shares"
    assert risk.check("B", mid, 0, 0, 0, 0, mid) == "max_order_shares"
    assert risk.check("B", mid, 100, 1_800, 100, 0, mid) is None  # 1800 + 100 + 100 = 2000
    assert risk.check("B", mid, 101, 1_800, 100, 0, mid) == "max_position"
    assert risk.check("S", mid, 100, -1_800, 0, 100, mid) is None
    assert risk.check("S", mid, 101, -1_800, 0, 100, mid) == "max_position"
    assert risk.check("S", mid, 100, 1_800, 5_000, 0, mid) is None  # selling reduces a long
    assert risk.check("B", 105_000, 100, 0, 0, 0, mid) is None  # 5 % of 10.00 = 0.50
    assert risk.check("B", 105_001, 100, 0, 0, 0, mid) == "price_band"
    assert risk.check("S", 94_999, 100, 0, 0, 0, mid) == "price_band"
    assert risk.check("S", mid, 100, 0, 0, 0, 0) == "price_band"


def test_quotes_join_or_improve_and_cancel_when_left_behind() -> None:
    sink = FakeSink()
    strategy = Strategy(sink, SYMBOLS, StrategyConfig(take_threshold=9))
    # Spread of 2 ticks: join the touch.
    strategy.on_book(1, TopOfBook(100_000, 300, 100_200, 300))
    assert sink.log == [
        ("enter", 1, "ACME", "B", 100_000, 100, "0"),
        ("enter", 2, "ACME", "S", 100_200, 100, "0"),
    ]
    # The touch moves up by 1 tick: still within requote_ticks, nothing to do.
    strategy.on_book(1, TopOfBook(100_100, 300, 100_300, 300))
    assert len(sink.log) == 2
    # Two ticks up: the bid is left behind (cancel it); the ask at 10.02 now improves the
    # market's 10.04 by two ticks, which is ahead, not behind: kept.
    strategy.on_book(1, TopOfBook(100_200, 300, 100_400, 300))
    assert sink.log[2:] == [("cancel", 1, 0)]
    strategy.on_book(1, TopOfBook(100_200, 300, 100_400, 300))
    assert len(sink.log) == 3  # the cancel is not repeated while pending
    strategy.on_response(canceled(1, 100))
    # Spread of 3 ticks now: the new bid goes one tick inside.
    strategy.on_book(1, TopOfBook(100_200, 300, 100_500, 300))
    assert sink.log[3:] == [("enter", 3, "ACME", "B", 100_300, 100, "0")]


def test_no_quotes_on_one_sided_or_crossed_books_or_unknown_symbols() -> None:
    sink = FakeSink()
    strategy = Strategy(sink, SYMBOLS)
    strategy.on_book(1, TopOfBook(100_000, 100, 0, 0))
    strategy.on_book(1, TopOfBook(100_000, 100, 100_000, 100))
    strategy.on_book(1, TopOfBook(100_100, 100, 100_000, 100))
    strategy.on_book(2, TopOfBook(100_000, 100, 100_100, 100))
    assert sink.log == []


def test_takes_on_imbalance_and_signal_then_cools_down() -> None:
    hook = SignalHook()
    sink = FakeSink()
    config = StrategyConfig(take_threshold=0.8, take_cooldown_events=3, quote_shares=100)
    strategy = Strategy(sink, SYMBOLS, config, RiskLimits(max_position_shares=10_000), hook)
    balanced = TopOfBook(100_000, 500, 100_100, 500)
    strategy.on_book(1, balanced)
    assert [e for e in sink.log if e[-1] == IOC] == []
    hook.publish(1, -0.9, 123)  # an inference stage says: sell
    strategy.on_book(1, balanced)
    assert [e for e in sink.log if e[-1] == IOC] == [("enter", 3, "ACME", "S", 100_000, 100, IOC)]
    strategy.on_book(1, balanced)  # cooling down
    hook.publish(1, 0.0, 124)
    heavy_bid = TopOfBook(100_000, 950, 100_100, 50)  # imbalance 0.9: buy at the ask
    strategy.on_book(1, heavy_bid)
    strategy.on_book(1, heavy_bid)
    takes = [e for e in sink.log if e[-1] == IOC]
    assert takes[1:] == [("enter", 4, "ACME", "B", 100_100, 100, IOC)]


def test_position_limit_stops_further_buying() -> None:
    sink = FakeSink()
    limits = RiskLimits(max_order_shares=100, max_position_shares=250)
    strategy = Strategy(sink, SYMBOLS, StrategyConfig(take_threshold=9), limits)
    top = TopOfBook(100_000, 100, 100_200, 100)
    strategy.on_book(1, top)
    strategy.on_response(executed(1, 100))  # bid filled: long 100
    strategy.on_book(1, top)  # re-bid: 100 + 100 open = 200 <= 250
    strategy.on_response(executed(3, 100))  # long 200
    strategy.on_book(1, top)  # 200 + 100 > 250: no bid
    assert strategy.position(1) == 200
    assert strategy.risk_rejects["max_position"] == 1
    bids = [e for e in sink.log if e[0] == "enter" and e[3] == "B"]
    assert len(bids) == 2


tops = st.builds(
    lambda bid, spread, bid_size, ask_size: TopOfBook(
        bid * 100, bid_size, (bid + spread) * 100, ask_size
    ),
    st.integers(900, 1_100),
    st.integers(1, 5),
    st.integers(1, 1_000),
    st.integers(1, 1_000),
)
events = st.lists(
    st.one_of(
        st.tuples(st.just("book"), tops),
        st.tuples(st.just("fill"), st.integers(0, 40), st.integers(1, 100)),
        st.tuples(st.just("cancel"), st.integers(0, 40)),
    ),
    max_size=200,
)


def _run_checked(script, signal_value):  # type: ignore[no-untyped-def]
    limits = RiskLimits(max_order_shares=100, max_position_shares=300)
    sink = FakeSink()
    hook = SignalHook()
    hook.publish(1, signal_value, 0)
    strategy = Strategy(sink, SYMBOLS, StrategyConfig(take_cooldown_events=5), limits, hook)
    # Independent bookkeeping from what was sent and what the "exchange" did.
    open_shares: dict[int, int] = {}
    side_of: dict[int, str] = {}
    position = 0
    for event in script:
        if event[0] == "book":
            before = len(sink.log)
            strategy.on_book(1, event[1])
            for entry in sink.log[before:]:
                if entry[0] == "enter":
                    _, ref, _, side, _, quantity, _ = entry
                    open_shares[ref], side_of[ref] = quantity, side
        elif event[0] == "fill" and open_shares:
            ref = sorted(open_shares)[event[1] % len(open_shares)]
            shares = min(event[2], open_shares[ref])
            open_shares[ref] -= shares
            position += shares if side_of[ref] == "B" else -shares
            strategy.on_response(executed(ref, shares))
        elif event[0] == "cancel" and open_shares:
            ref = sorted(open_shares)[event[1] % len(open_shares)]
            strategy.on_response(canceled(ref, open_shares[ref]))
            open_shares[ref] = 0
        open_shares = {ref: left for ref, left in open_shares.items() if left}
        long_exposure = position + sum(q for r, q in open_shares.items() if side_of[r] == "B")
        short_exposure = position - sum(q for r, q in open_shares.items() if side_of[r] == "S")
        assert long_exposure <= 300 and short_exposure >= -300
        assert strategy.position(1) == position
    return sink.log


@settings(max_examples=150, deadline=None)
@given(events, st.floats(-1.5, 1.5))
def test_position_plus_open_orders_stay_within_the_limit(script, signal_value) -> None:  # type: ignore[no-untyped-def]
    log = _run_checked(script, signal_value)
    assert _run_checked(script, signal_value) == log  # deterministic


def test_act_share_sends_that_share_of_updates_as_non_crossing_iocs() -> None:
    sink = FakeSink()
    strategy = Strategy(sink, SYMBOLS, StrategyConfig(act_share=0.25))
    top = TopOfBook(100_000, 300, 100_200, 300)
    strategy.on_update(1, top, top_changed=True)  # quotes both sides once
    quotes = len(sink.log)
    for _ in range(99):
        strategy.on_update(1, top, top_changed=False)
        # The exchange answers each IOC at once: canceled, nothing filled, nothing left open.
        last = sink.log[-1]
        if last[0] == "enter" and last[6] == IOC:
            strategy.on_response(canceled(last[1], last[5]))
    acts = [entry for entry in sink.log[quotes:] if entry[0] == "enter"]
    assert len(acts) == 25  # exactly 0.25 of 100 updates, evenly spread
    assert {entry[6] for entry in acts} == {IOC}
    assert [entry[3] for entry in acts[:4]] == ["B", "S", "B", "S"]
    # Each joins its own side's touch, so it cannot cross.
    assert all(e[4] == (100_000 if e[3] == "B" else 100_200) for e in acts)
    assert strategy.position(1) == 0


def test_act_share_orders_still_pass_the_risk_checks() -> None:
    sink = FakeSink()
    limits = RiskLimits(max_position_shares=300)
    strategy = Strategy(sink, SYMBOLS, StrategyConfig(act_share=1.0), limits)
    top = TopOfBook(100_000, 300, 100_200, 300)
    for _ in range(20):  # never answered: open shares pile up against the position limit
        strategy.on_update(1, top, top_changed=False)
    buys = [e for e in sink.log if e[0] == "enter" and e[3] == "B"]
    assert sum(e[5] for e in buys) <= 300
    assert strategy.risk_rejects["max_position"] > 0


def test_inject_delay_busy_waits_before_each_order() -> None:
    import time

    sink = FakeSink()
    strategy = Strategy(sink, SYMBOLS, StrategyConfig(act_share=1.0, inject_delay_ns=2_000_000))
    top = TopOfBook(100_000, 300, 100_200, 300)
    started = time.perf_counter_ns()
    strategy.on_update(1, top, top_changed=False)
    assert len(sink.log) == 1
    assert time.perf_counter_ns() - started >= 2_000_000
