"""The claim hint steering (bccprobe.steer_slot_hint) against a brute-force reference: after
slots are given back in the middle, the kernel's next claims (a walk of a few slots up from the
hint) must find free slots."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from tailsight.probes.bccprobe import STEER_RUN, steer_slot_hint

LIMIT = 64


class HintTable(dict[int, Any]):
    """A one-entry bcc array (``Key``/``Leaf`` constructors, ``.value`` leaves)."""

    def Key(self, value: int) -> int:
        return value

    def Leaf(self, value: int) -> SimpleNamespace:
        return SimpleNamespace(value=value)


def reference(used: set[int], hint: int, first: int) -> int:
    def run(slot: int) -> int:
        n = 0
        while slot + n < LIMIT and slot + n not in used and n < STEER_RUN:
            n += 1
        return n

    if first <= hint < LIMIT and run(hint) >= min(STEER_RUN, LIMIT - hint):
        return hint
    runs = [(slot, run(slot)) for slot in range(first, LIMIT)]
    long = [slot for slot, n in runs if n >= STEER_RUN]
    if long:
        return long[0]
    best = max((n for _, n in runs), default=0)
    return next((slot for slot, n in runs if n == best), hint) if best else hint


@given(st.sets(st.integers(0, LIMIT - 1)), st.integers(0, LIMIT + 2), st.integers(0, 1))
def test_hint_moves_to_the_first_long_free_run(used: set[int], hint: int, first: int) -> None:
    table = HintTable({0: SimpleNamespace(value=hint)})
    steer_slot_hint({b"p_slot_hint": table}, "p", used, first, LIMIT)
    assert table[0].value == reference(used, hint, first)
