"""Live verdicts tell a container's own CPU limit from a neighbour and from the idle CPU, on
synthetic intervals whose cause is known by construction."""

from __future__ import annotations

import numpy as np

from tailsight.analysis.verdicts import JumpVerdicts, Verdict
from tailsight.intervals import Counter, Series
from tailsight.testing.eval import LatencyModel
from tests.analysis.synthetic import Interval, hist, timeline

CHANGE = 45  # after the detector's 30 reference intervals
QUOTA = "20000 100000"
CALM = LatencyModel()
PARKED = CALM.with_component(0.05, 60_000_000.0, 0.3)


def _verdict(throttled: bool, holder: str) -> Verdict:
    """/pod/victim's wait rises at CHANGE; ``holder`` ran on its CPU meanwhile, and (with
    ``throttled``) /pod's limit parked it 80 ms of every second."""
    rng = np.random.default_rng(11)

    def interval(t: int, late: bool) -> Interval:
        series = [
            Series(
                {"probe": "runqueue", "cgroup": "/pod/victim"},
                hist(PARKED if late else CALM, rng, 3000),
            )
        ]
        wait = int(rng.gamma(8, (4e8 if late else 1e5) / 8))
        counters = [
            Counter(
                "runqueue_displaced_wait_ns",
                {"probe": "runqueue", "victim": "/pod/victim", "aggressor": holder},
                wait,
            ),
            Counter(
                "runqueue_displaced_wait_ns",
                {"probe": "runqueue", "victim": "/pod/victim", "aggressor": "/other"},
                int(rng.gamma(8, 1e5 / 8)),
            ),
        ]
        if throttled:
            labels = {"probe": "throttle", "cgroup": "/pod", "cpu_max": QUOTA}
            counters.append(Counter("throttle_throttled_ns", labels, 80_000_000 if late else 0))
        return series, counters

    verdicts = JumpVerdicts()
    found = []
    for document in timeline(interval, CHANGE + 6, CHANGE):
        found += verdicts.update(document)
    (verdict,) = found
    return verdict


def test_a_parents_limit_is_the_verdict_and_who_ran_meanwhile_is_not_blamed() -> None:
    verdict = _verdict(throttled=True, holder="/neighbour")
    assert verdict.throttled is not None
    limited, cpu_max, share = verdict.throttled
    assert (limited, cpu_max) == ("/pod", QUOTA) and abs(share - 0.08) < 0.005
    assert verdict.aggressor_shares == () and verdict.idle_share == 0.0
    assert (
        "throttled by a parent's CPU limit (cpu.max 20 ms per 100 ms at /pod) 8% of the time"
        in verdict.text()
    )


def test_a_neighbour_is_named_when_no_limit_parked_the_victim() -> None:
    verdict = _verdict(throttled=False, holder="/neighbour")
    assert verdict.throttled is None
    assert verdict.aggressor_shares[0][0] == "/neighbour" and verdict.aggressor_shares[0][1] > 0.9
    assert "displaced by /neighbour" in verdict.text()


def test_the_idle_task_is_never_an_aggressor() -> None:
    verdict = _verdict(throttled=False, holder="idle")
    assert "idle" not in dict(verdict.aggressor_shares)
    assert verdict.idle_share > 0.9
    assert "waited on idle CPUs" in verdict.text() and "displaced by" not in verdict.text()
