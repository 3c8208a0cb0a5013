"""Matching engine vs a naive reference matcher (sort everything, every time) on random streams."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tailsight.trading_core.matching import BUY, SELL, MatchingEngine


@dataclass
class _Naive:
    ref: int
    side: str
    price: int
    shares: int
    seq: int


class NaiveMatcher:
    """Price-time priority by brute force: a flat list, sorted on every incoming order."""

    def __init__(self) -> None:
        self.orders: list[_Naive] = []
        self.seq = 0
        self.match = 0

    def submit(self, ref: int, side: str, price: int, shares: int, rest: bool):
        fills = []
        if side == BUY:
            crossing = [o for o in self.orders if o.side == SELL and o.price <= price]
            crossing.sort(key=lambda o: (o.price, o.seq))
        else:
            crossing = [o for o in self.orders if o.side == BUY and o.price >= price]
            crossing.sort(key=lambda o: (-o.price, o.seq))
        for resting in crossing:
            if not shares:
                break
            traded = min(shares, resting.shares)
            shares -= traded
            resting.shares -= traded
            self.match += 1
            fills.append((self.match, resting.price, traded, ref, resting.ref))
        self.orders = [o for o in self.orders if o.shares]
        if shares and rest:
            self.seq += 1
            self.orders.append(_Naive(ref, side, price, shares, self.seq))
        return fills, shares

    def reduce(self, ref: int, shares: int) -> int:
        for o in self.orders:
            if o.ref == ref:
                taken = min(shares, o.shares)
                o.shares -= taken
                self.orders = [x for x in self.orders if x.shares]
                return taken
        return 0

    def book(self):
        bids = sorted((o for o in self.orders if o.side == BUY), key=lambda o: (-o.price, o.seq))
        asks = sorted((o for o in self.orders if o.side == SELL), key=lambda o: (o.price, o.seq))
        return [(o.ref, o.price, o.shares) for o in bids], [
            (o.ref, o.price, o.shares) for o in asks
        ]


def engine_book(engine: MatchingEngine, locate: int):
    out = []
    for side in (engine.book(locate).bids, engine.book(locate).asks):
        rows = []
        for key in reversed(side.keys):
            for order in side.levels[side.sign * key].values():
                rows.append((order.ref, order.price, order.shares))
        out.append(rows)
    return tuple(out)


_submit = st.tuples(
    st.just("submit"),
    st.sampled_from([BUY, SELL]),
    st.integers(95, 105),
    st.integers(1, 60),
    st.booleans(),
)
_reduce = st.tuples(st.just("reduce"), st.integers(0, 200), st.integers(1, 80))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(_submit, _submit, _reduce), max_size=120))
def test_same_fills_and_book_as_naive_reference(ops) -> None:
    engine = MatchingEngine()
    naive = NaiveMatcher()
    next_ref = 1
    for op in ops:
        if op[0] == "submit":
            _, side, price, shares, rest = op
            result = engine.submit(7, next_ref, side, price, shares, owner="x", rest=rest)
            expected_fills, expected_left = naive.submit(next_ref, side, price, shares, rest)
            got = [
                (f.match_number, f.price, f.shares, f.aggressor_ref, f.resting_ref)
                for f in result.fills
            ]
            assert got == expected_fills
            assert result.remaining == expected_left
            next_ref += 1
        else:
            _, ref, shares = op
            assert engine.reduce(ref, shares) == naive.reduce(ref, shares)
        assert engine_book(engine, 7) == naive.book()
        bids, asks = naive.book()
        if bids and asks:
            assert bids[0][1] < asks[0][1]  # a price-time book never rests crossed


def test_fills_at_resting_price_in_time_priority() -> None:
    engine = MatchingEngine()
    engine.submit(1, 1, SELL, 101, 10)
    engine.submit(1, 2, SELL, 100, 5)
    engine.submit(1, 3, SELL, 100, 5)
    result = engine.submit(1, 4, BUY, 102, 12)
    assert [(f.resting_ref, f.price, f.shares) for f in result.fills] == [
        (2, 100, 5),
        (3, 100, 5),
        (1, 101, 2),
    ]
    assert result.remaining == 0 and not result.rested
    assert engine.depth(1) == ([], [(101, 8, 1)])


def test_ioc_remainder_does_not_rest_and_reduce_keeps_priority() -> None:
    engine = MatchingEngine()
    engine.submit(1, 1, BUY, 100, 10)
    engine.submit(1, 2, BUY, 100, 10)
    assert engine.reduce(1, 4) == 4  # partial cancel: 1 stays first in the queue
    assert engine.queue(1, BUY, 100) == [1, 2]
    result = engine.submit(1, 3, SELL, 99, 30, rest=False)
    assert [(f.resting_ref, f.shares) for f in result.fills] == [(1, 6), (2, 10)]
    assert result.remaining == 14 and not result.rested
    assert engine.depth(1) == ([], [])
    assert engine.delete(99) == 0


def test_rejects_bad_input() -> None:
    engine = MatchingEngine()
    engine.submit(1, 1, BUY, 100, 10)
    with pytest.raises(ValueError):
        engine.submit(1, 1, BUY, 100, 10)
    with pytest.raises(ValueError):
        engine.submit(1, 2, "X", 100, 10)
    with pytest.raises(ValueError):
        engine.submit(1, 2, BUY, 100, 0)
