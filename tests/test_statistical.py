"""The statistical tests' rule (tests/statistical.py): the number of tries against its closed form
and the binomial distribution, a trial that always fails failing, one that passes at a known
seeded rate passing."""

from __future__ import annotations

import math
import random

import pytest
from scipy.stats import binom

from tests.statistical import (
    FALSE_FAILURE_TARGET,
    MAX_TRIES,
    failure_probability,
    run_tries,
    tries_needed,
)


@pytest.mark.parametrize("pass_rate", [0.5, 0.7, 0.8, 0.9, 0.95, 0.99, 0.999, 1.0])
@pytest.mark.parametrize("target", [1e-2, FALSE_FAILURE_TARGET])
def test_one_pass_needed_is_the_closed_form(pass_rate: float, target: float) -> None:
    # The smallest n with (1 - p)^n <= target: ceil(log target / log(1 - p)), 1 for p = 1.
    if pass_rate == 1.0:
        expected = 1
    else:
        expected = math.ceil(round(math.log(target) / math.log(1 - pass_rate), 9))
    if expected > MAX_TRIES:
        with pytest.raises(ValueError, match="fix the test's cause"):
            tries_needed(pass_rate, target=target)
        return
    tries = tries_needed(pass_rate, target=target)
    assert tries == expected
    assert (1 - pass_rate) ** tries <= target * (1 + 1e-9)
    assert tries == 1 or (1 - pass_rate) ** (tries - 1) > target


def test_rates_of_the_suite() -> None:
    # The rates tests/README.md states: 0.9 -> 3 tries, 0.95 -> 3, 0.99 -> 2 at 1 in 1,000.
    assert [tries_needed(p) for p in (0.9, 0.95, 0.99)] == [3, 3, 2]
    with pytest.raises(ValueError, match="more than 5 tries"):
        tries_needed(0.7)  # 6 tries: such a test is fixed at its cause


@pytest.mark.parametrize("tries", range(1, 8))
@pytest.mark.parametrize("needed", range(1, 4))
@pytest.mark.parametrize("pass_rate", [0.6, 0.9, 0.97])
def test_failure_probability_is_the_binomial_lower_tail(
    tries: int, needed: int, pass_rate: float
) -> None:
    expected = float(binom.cdf(needed - 1, tries, pass_rate))
    assert failure_probability(tries, pass_rate, needed) == pytest.approx(expected, abs=1e-15)


@pytest.mark.parametrize(("pass_rate", "needed"), [(0.9, 2), (0.95, 2), (0.99, 3)])
def test_k_of_n_is_the_smallest_n_within_the_target(pass_rate: float, needed: int) -> None:
    tries = tries_needed(pass_rate, needed)
    assert binom.cdf(needed - 1, tries, pass_rate) <= FALSE_FAILURE_TARGET
    assert binom.cdf(needed - 1, tries - 1, pass_rate) > FALSE_FAILURE_TARGET


def test_a_trial_that_always_fails_fails_after_every_try_with_each_ones_evidence() -> None:
    calls: list[int] = []

    def trial(attempt: int) -> None:
        calls.append(attempt)
        assert attempt < 0, f"wrong answer {attempt}"

    with pytest.raises(pytest.fail.Exception) as failed:
        run_tries(trial, pass_rate=0.9)
    assert calls == [0, 1, 2]
    message = str(failed.value)
    assert "0 of 3 tries passed, 1 needed" in message
    for attempt in range(3):
        assert f"try {attempt + 1} of 3 failed: wrong answer {attempt}" in message


def test_k_of_n_stops_once_too_few_tries_are_left() -> None:
    calls: list[int] = []

    def trial(attempt: int) -> None:
        calls.append(attempt)
        assert attempt == 0, "broken"

    tries = tries_needed(0.95, needed=2)  # 4
    with pytest.raises(pytest.fail.Exception, match="1 of 4 tries passed, 2 needed"):
        run_tries(trial, pass_rate=0.95, needed=2)
    assert calls == list(range(tries))


def test_a_premise_failure_is_not_retried() -> None:
    calls: list[int] = []

    def trial(attempt: int) -> None:
        calls.append(attempt)
        raise RuntimeError("the injection did not bite")

    with pytest.raises(RuntimeError):
        run_tries(trial, pass_rate=0.9)
    assert calls == [0]


def test_a_trial_at_its_stated_rate_passes_the_target_share_of_runs() -> None:
    # 2,000 seeded runs of a trial passing at 0.9: the test fails at most as often as the rule
    # promises (1e-3, so about 2 here), far less than the 200 a single try would fail.
    rng = random.Random(20261207)
    failed = 0
    for _ in range(2_000):
        try:
            run_tries(lambda attempt: None if rng.random() < 0.9 else _miss(), pass_rate=0.9)
        except pytest.fail.Exception:
            failed += 1
    assert failed <= 8  # P(Binomial(2000, 1e-3) > 8) < 1e-3


def test_a_pass_returns_each_try() -> None:
    outcomes = run_tries(lambda attempt: _miss() if attempt == 0 else None, pass_rate=0.9)
    assert outcomes == ["try 1 of 3 failed: miss", "try 2 of 3 passed"]


def _miss() -> None:
    raise AssertionError("miss")
