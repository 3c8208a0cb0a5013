"""Orders and fills as one side saw them, so the gateway's view and the exchange's can be diffed."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["AccountView", "FillRecord", "OrderRecord", "diff", "order_side"]


def order_side(ouch_side: str) -> str:
    """Book side of an OUCH side: "B" buys; "S", "T" (short), "E" (short exempt) sell."""
    return {"B": "B", "S": "S", "T": "S", "E": "S"}.get(ouch_side, ouch_side)


@dataclass(slots=True)
class OrderRecord:
    """One order by its UserRefNum: what was asked, what traded, what was canceled."""

    user_ref_num: int
    symbol: str
    side: str
    price: int
    quantity: int
    order_reference_number: int = 0  # the exchange's (ITCH) reference, once accepted
    executed: int = 0
    canceled: int = 0
    state: str = "pending"  # pending, live, done, rejected

    @property
    def open_shares(self) -> int:
        return self.quantity - self.executed - self.canceled if self.state == "live" else 0


@dataclass(frozen=True, slots=True)
class FillRecord:
    match_number: int
    user_ref_num: int
    side: str
    price: int
    shares: int
    liquidity_flag: str  # "A" added (our order rested), "R" removed (our order took)


@dataclass(slots=True)
class AccountView:
    orders: dict[int, OrderRecord] = field(default_factory=dict)
    fills: list[FillRecord] = field(default_factory=list)

    def position(self) -> dict[str, int]:
        """Net shares per symbol (buys positive)."""
        out: dict[str, int] = {}
        for fill in self.fills:
            symbol = self.orders[fill.user_ref_num].symbol
            signed = fill.shares if fill.side == "B" else -fill.shares
            out[symbol] = out.get(symbol, 0) + signed
        return out


def diff(ours: AccountView, theirs: AccountView) -> list[str]:
    """Every difference between two views (empty = they reconcile exactly)."""
    problems = []
    for ref in sorted(ours.orders.keys() | theirs.orders.keys()):
        mine, other = ours.orders.get(ref), theirs.orders.get(ref)
        if mine != other:
            problems.append(f"order {ref}: ours {mine} != theirs {other}")
    mine_fills = sorted(ours.fills, key=lambda f: (f.match_number, f.user_ref_num))
    other_fills = sorted(theirs.fills, key=lambda f: (f.match_number, f.user_ref_num))
    if mine_fills != other_fills:
        only_ours = set(mine_fills) - set(other_fills)
        only_theirs = set(other_fills) - set(mine_fills)
        problems.append(f"fills differ: only ours {only_ours}, only theirs {only_theirs}")
    return problems
