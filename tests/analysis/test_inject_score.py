"""How an injection is scored: the first incident holding the victim's jump near the injection,
its causes ranked as the report ranks them (or only the victim's own, for the demo)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from tailsight.analysis.causes import Cause
from tailsight.analysis.explain import ExplainConfig, Incident, Report
from tailsight.analysis.inject import Injection, score

T0 = 1_000_000_000_000
VICTIM, HOG = "/demo/trading", "/demo/noisy"
EXCHANGE, BACKGROUND = "/demo/exchange", "/background"


def _displacement(victim: str, aggressor: str, effect: float) -> Cause:
    return Cause(
        "displacement", victim, {"aggressor": aggressor}, 0.0, 1.0, 0.0, 30.0, 1e-9, effect,
        discovered=True,
    )  # fmt: skip


def _jump(cgroup: str, at_ns: int) -> Any:
    # Only what scoring reads of a JumpExplanation: its labels and when it started.
    return SimpleNamespace(labels={"probe": "runqueue", "cgroup": cgroup}, change_start_ns=at_ns)


def _report(*incidents: Incident) -> Report:
    return Report(T0, T0 + 60 * 10**9, 120, {}, 10, [], ExplainConfig(), list(incidents))


def test_the_victims_incident_is_scored_and_its_top_cause_must_name_the_culprit() -> None:
    truth = Injection("cpu_hog", [], T0 + 20 * 10**9, VICTIM, HOG, ("displacement",))
    earlier = Incident(
        [_jump(EXCHANGE, T0)], [], [_displacement(EXCHANGE, HOG, 9.0)], 1, [EXCHANGE]
    )
    mine = Incident(
        [_jump(VICTIM, truth.inject_ns + 400_000_000)], [], [_displacement(VICTIM, HOG, 5.0)], 1,
        [VICTIM],
    )  # fmt: skip
    result = score(_report(earlier, mine), truth)
    assert result.found and result.top1 and abs(result.time_error_s - 0.4) < 1e-9
    # Too far from the injection: not the victim's incident.
    late = Injection("cpu_hog", [], T0 + 10 * 10**9, VICTIM, HOG, ("displacement",))
    assert not score(_report(mine), late).found


def test_own_causes_ranks_only_the_victims_displacement() -> None:
    # Background load: the exchange's jump headlines the incident and its cause comes first.
    truth = Injection("cpu_hog", [], T0, VICTIM, HOG, ("displacement",))
    incident = Incident(
        [_jump(EXCHANGE, T0), _jump(VICTIM, T0)], [],
        [_displacement(EXCHANGE, BACKGROUND, 9.0), _displacement(VICTIM, HOG, 5.0)], 2,
        [EXCHANGE, VICTIM],
    )  # fmt: skip
    assert not score(_report(incident), truth).top1
    own = score(_report(incident), truth, own_causes=True)
    assert own.top1 and HOG in own.named
    # A victim whose own causes do not name the culprit is still wrong.
    wrong = Incident([_jump(VICTIM, T0)], [], [_displacement(VICTIM, BACKGROUND, 5.0)], 1, [VICTIM])
    assert not score(_report(wrong), truth, own_causes=True).top1
