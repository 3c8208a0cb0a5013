"""The claim hint steering (bccprobe.steer_slot_hint) against a brute-force simulation of the
kernel's claims: after slots are given back in the middle, the next claims (each a walk of a few
slots up from the hint) must find free slots, as many in a row as a burst of new cgroups needs."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from tailsight.probes.bccprobe import SLOT_CLAIM_TRIES, STEER_RUN, claim_runs, steer_slot_hint

LIMIT = 64


class HintTable(dict[int, Any]):
    """A one-entry bcc array (``Key``/``Leaf`` constructors, ``.value`` leaves)."""

    def Key(self, value: int) -> int:
        return value

    def Leaf(self, value: int) -> SimpleNamespace:
        return SimpleNamespace(value=value)


def claims(used: set[int], hint: int, first: int) -> int:
    """Brute force: the kernel's claims (slots.bpf.h) one after another, up to STEER_RUN."""
    taken, placed = set(used), 0
    while placed < STEER_RUN:
        start = max(hint, first)
        tried = [slot for slot in range(start, start + SLOT_CLAIM_TRIES) if slot < LIMIT]
        found = [slot for slot in tried if slot not in taken]
        if not found:
            return placed
        taken.add(found[0])
        hint, placed = found[0] + 1, placed + 1
    return placed


@given(st.sets(st.integers(0, LIMIT - 1)), st.integers(0, LIMIT + 2), st.integers(0, 1))
def test_hint_moves_where_the_next_claims_succeed(used: set[int], hint: int, first: int) -> None:
    table = HintTable({0: SimpleNamespace(value=hint)})
    steer_slot_hint({b"p_slot_hint": table}, "p", used, first, LIMIT)
    steered = table[0].value
    free = [slot for slot in range(first, LIMIT) if slot not in used]
    best = max((claims(used, slot, first) for slot in free), default=0)
    if claims(used, hint, first) >= min(STEER_RUN, best):
        assert steered == hint  # a good hint stays
    else:
        # Moved to the lowest free slot from which as many claims succeed as from any.
        want = min(STEER_RUN, best)
        assert steered == next(slot for slot in free if claims(used, slot, first) >= want)


def test_a_burst_of_new_keys_is_not_stopped_by_a_short_free_run() -> None:
    # 10 free slots, then 20 used, then free to the end: 22 new keys in one interval need the
    # hint past the used stretch (the kernel's walk of 16 slots cannot cross it).
    used = set(range(10, 30))
    table = HintTable({0: SimpleNamespace(value=0)})
    steer_slot_hint({b"p_slot_hint": table}, "p", used, 0, LIMIT)
    assert claims(used, table[0].value, 0) >= 22


@given(st.sets(st.integers(0, LIMIT - 1)), st.integers(0, 1))
def test_claim_runs_match_the_simulated_kernel(used: set[int], first: int) -> None:
    runs = claim_runs(used, first, LIMIT)
    assert runs == [claims(used, hint, first) for hint in range(first, LIMIT)]
