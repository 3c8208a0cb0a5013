"""Tests whose single try passes only most of the time (a recording on a shared 2-core machine, a
gate built for a stated false-fail rate), decided by one rule instead of hand-written retries.

Each such test states its per-try pass rate p (measured, listed in tests/README.md) and needs k
passes. It runs the fewest tries n for which a correct implementation fails the test at most
FALSE_FAILURE_TARGET of the time: P(fewer than k passes in n tries) <= target, tries independent
at rate p (for k = 1: (1 - p)^n <= target). A broken implementation, whose tries all fail, fails
after n tries, each try's evidence in the message. A rate so low that n would exceed MAX_TRIES is
not retried more: that test is fixed at its cause."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

FALSE_FAILURE_TARGET = 1e-3  # a correct build fails a statistical test in at most 1 of 1,000 runs
MAX_TRIES = 5
# Rates are stated to a few digits: (1 - 0.9)^3 is 1e-3 give or take the last bit of a float.
_RELATIVE_SLACK = 1e-9


def failure_probability(tries: int, pass_rate: float, needed: int = 1) -> float:
    """P(fewer than ``needed`` passes in ``tries`` independent tries, each passing at
    ``pass_rate``): the binomial distribution's lower tail."""
    return sum(
        math.comb(tries, passes) * pass_rate**passes * (1 - pass_rate) ** (tries - passes)
        for passes in range(min(needed, tries + 1))
    )


def tries_needed(pass_rate: float, needed: int = 1, target: float = FALSE_FAILURE_TARGET) -> int:
    """The fewest tries n with P(fewer than ``needed`` passes in n) <= ``target``."""
    if not 0 < pass_rate <= 1:
        raise ValueError(f"pass rate {pass_rate} is not in (0, 1]")
    if not 0 < target < 1:
        raise ValueError(f"target {target} is not in (0, 1)")
    tries = needed
    while failure_probability(tries, pass_rate, needed) > target * (1 + _RELATIVE_SLACK):
        tries += 1
        if tries > MAX_TRIES:
            raise ValueError(
                f"a per-try pass rate of {pass_rate} needs more than {MAX_TRIES} tries for "
                f"{needed} passes at a false-failure rate <= {target}: fix the test's cause"
            )
    return tries


def run_tries(
    trial: Callable[[int], None],
    pass_rate: float,
    needed: int = 1,
    target: float = FALSE_FAILURE_TARGET,
) -> list[str]:
    """Run ``trial(attempt)`` until ``needed`` tries passed (returns each try's outcome) or too
    few tries are left to get there (fails the test with every try's evidence). A try fails by
    raising AssertionError; any other exception (pytest.fail or skip included) ends the test at
    once: a broken premise is not a statistical miss."""
    tries = tries_needed(pass_rate, needed, target)
    outcomes: list[str] = []
    passes = 0
    for attempt in range(tries):
        try:
            trial(attempt)
        except AssertionError as error:
            outcomes.append(f"try {attempt + 1} of {tries} failed: {error}")
        else:
            passes += 1
            outcomes.append(f"try {attempt + 1} of {tries} passed")
            if passes == needed:
                if len(outcomes) > needed:  # in the captured output (pytest -rP shows it)
                    print("\n\n".join(outcomes))
                return outcomes
        if passes + tries - (attempt + 1) < needed:
            break
    pytest.fail(
        f"{passes} of {len(outcomes)} tries passed, {needed} needed: at the stated per-try pass "
        f"rate {pass_rate}, {tries} tries fail a correct build in at most {target:g} of runs\n\n"
        + "\n\n".join(outcomes),
        pytrace=False,
    )
