"""Deliberately naive reference L3 book: plain dicts, every query recomputed by brute force.

It shares no code with ``book.py`` and keeps no price structure at all: live orders are plain
lists in a dict per symbol, tagged with an arrival sequence number for time priority, and the top
of book, depth and queues are rebuilt by sorting all live orders on every call. It is the ground
truth for the differential tests, so it mirrors the fault rules of ``Book`` (and of ``itch-book``):
unknown references ignored, duplicate adds evict, oversized executes and cancels clamp, zero-share
or zero-price adds rejected.
"""

from __future__ import annotations

from typing import Any

# Indices into an order record [locate, side, price, shares, arrival].
_LOCATE, _SIDE, _PRICE, _SHARES, _ARRIVAL = range(5)


class NaiveBook:
    """Brute-force book; same queries as ``Book`` as plain tuples and lists."""

    def __init__(self) -> None:
        self.by_locate: dict[int, dict[int, list[int | str]]] = {}
        self.where: dict[int, int] = {}  # ref -> locate
        self.errors: dict[str, int] = {}
        self.arrivals = 0

    def apply(self, msg: Any) -> tuple[int, int, str] | None:
        """Apply one decoded ITCH message; an execution returns (price, shares, aggressor)."""
        kind = type(msg).__name__
        if kind in ("AddOrder", "AddOrderMPID"):
            self.add(msg.stock_locate, msg.order_reference_number, msg.side, msg.price, msg.shares)
        elif kind == "OrderExecuted":
            return self.execute(msg.order_reference_number, msg.executed_shares, None)
        elif kind == "OrderExecutedWithPrice":
            return self.execute(
                msg.order_reference_number, msg.executed_shares, msg.execution_price
            )
        elif kind == "Trade":
            return (msg.price, msg.shares, "N")
        elif kind == "OrderCancel":
            self.cancel(msg.order_reference_number, msg.cancelled_shares)
        elif kind == "OrderDelete":
            self.delete(msg.order_reference_number)
        elif kind == "OrderReplace":
            self.replace(
                msg.original_order_reference_number,
                msg.new_order_reference_number,
                msg.price,
                msg.shares,
            )
        return None

    def add(self, locate: int, ref: int, side: str, price: int, shares: int) -> None:
        if shares <= 0 or price <= 0:
            self._count("rejected_add")
            return
        if ref in self.where:
            self._count("duplicate_ref")
            self.delete(ref)
        self.arrivals += 1
        self.by_locate.setdefault(locate, {})[ref] = [locate, side, price, shares, self.arrivals]
        self.where[ref] = locate

    def execute(self, ref: int, shares: int, price: int | None) -> tuple[int, int, str] | None:
        order = self._find(ref)
        if order is None:
            return None
        filled = min(shares, int(order[_SHARES]))
        if shares > filled:
            self._count("oversized_execute")
        self._take(ref, filled)
        aggressor = "S" if order[_SIDE] == "B" else "B"
        return (int(order[_PRICE]) if price is None else price, filled, aggressor)

    def cancel(self, ref: int, shares: int) -> None:
        order = self._find(ref)
        if order is None:
            return
        if shares > int(order[_SHARES]):
            self._count("oversized_cancel")
        self._take(ref, min(shares, int(order[_SHARES])))

    def delete(self, ref: int) -> None:
        if self._find(ref) is None:
            return
        del self.by_locate[self.where.pop(ref)][ref]

    def replace(self, old_ref: int, new_ref: int, price: int, shares: int) -> None:
        order = self._find(old_ref)
        if order is None:
            return
        self.delete(old_ref)
        self.add(int(order[_LOCATE]), new_ref, str(order[_SIDE]), price, shares)

    def levels(self, locate: int, side: str) -> list[tuple[int, int, int]]:
        """All levels of one side as (price, shares, orders), best first, rebuilt from scratch."""
        totals: dict[int, list[int]] = {}
        for order in self.by_locate.get(locate, {}).values():
            if order[_SIDE] == side:
                entry = totals.setdefault(int(order[_PRICE]), [0, 0])
                entry[0] += int(order[_SHARES])
                entry[1] += 1
        prices = sorted(totals, reverse=(side == "B"))
        return [(p, totals[p][0], totals[p][1]) for p in prices]

    def top_of_book(self, locate: int) -> tuple[int, int, int, int]:
        bids = self.levels(locate, "B")
        asks = self.levels(locate, "S")
        bid = bids[0] if bids else (0, 0, 0)
        ask = asks[0] if asks else (0, 0, 0)
        return (bid[0], bid[1], ask[0], ask[1])

    def depth(self, locate: int, n: int) -> tuple[list[tuple[int, int, int]], ...]:
        return (self.levels(locate, "B")[:n], self.levels(locate, "S")[:n])

    def queue(self, locate: int, side: str, price: int) -> list[int]:
        """References at one price in time priority: sorted by arrival number."""
        live = self.by_locate.get(locate, {})
        refs = [r for r, o in live.items() if o[_SIDE] == side and o[_PRICE] == price]
        return sorted(refs, key=lambda r: int(live[r][_ARRIVAL]))

    def _find(self, ref: int) -> list[int | str] | None:
        locate = self.where.get(ref)
        if locate is None:
            self._count("unknown_ref")
            return None
        return self.by_locate[locate][ref]

    def _take(self, ref: int, shares: int) -> None:
        order = self.by_locate[self.where[ref]][ref]
        order[_SHARES] = int(order[_SHARES]) - shares
        if order[_SHARES] == 0:
            del self.by_locate[self.where.pop(ref)][ref]

    def _count(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1
