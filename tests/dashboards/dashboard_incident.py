"""A synthetic recording with a known incident: ``/batch`` starts displacing ``/trading`` at
interval ``change_at``; /trading's run-queue tail rises, its socket syscalls and migrations carry
on as before. Ground truth for the root-cause page and the live verdicts."""

from __future__ import annotations

import numpy as np

from tailsight.intervals import Counter, HistDocument, Series
from tailsight.testing.eval import LatencyModel
from tests.analysis.synthetic import Interval, hist, timeline

INTERVALS, CHANGE_AT = 60, 30
VICTIM, AGGRESSOR = "/trading", "/batch"


def incident(change_at: int = CHANGE_AT, intervals: int = INTERVALS) -> list[HistDocument]:
    """/trading's run-queue tail rises at CHANGE_AT because /batch displaces it; its socket
    syscalls and migrations carry on as before."""
    rng = np.random.default_rng(7)
    before = LatencyModel()
    after = before.with_component(0.05, 400_000.0, 0.3)
    syscalls = LatencyModel(components=((1.0, 12_000.0, 0.2),))

    def interval(t: int, late: bool) -> Interval:
        series = [
            Series(
                {"probe": "runqueue", "cgroup": VICTIM},
                hist(after if late else before, rng, int(rng.poisson(3000))),
            ),
            Series({"probe": "runqueue", "cgroup": AGGRESSOR}, hist(before, rng, 2000)),
            Series(
                {"probe": "netsyscall", "cgroup": VICTIM, "syscall": "sendto"},
                hist(syscalls, rng, 500),
            ),
        ]
        counters = [Counter("task_migrations", {"probe": "migration", "cgroup": VICTIM}, 40)]
        for aggressor, mean_ns in {AGGRESSOR: 20e6 if late else 1e6, "/": 3e6}.items():
            labels = {"probe": "runqueue", "victim": VICTIM, "aggressor": aggressor}
            wait = int(rng.gamma(8.0, mean_ns / 8))
            counters.append(Counter("runqueue_displaced_wait_ns", labels, wait))
            counters.append(Counter("runqueue_displaced_switches", labels, 50))
        return series, counters

    return timeline(interval, intervals, change_at)
