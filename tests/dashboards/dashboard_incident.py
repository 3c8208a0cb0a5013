"""A synthetic recording with a known incident: ``/batch`` starts displacing ``/trading`` at
interval ``change_at``; /trading's run-queue tail rises, its socket syscalls and migrations carry
on as before. Ground truth for the root-cause page and the live verdicts."""

from __future__ import annotations

import numpy as np

from tailsight.hist import NUM_BUCKETS, Histogram
from tailsight.intervals import Counter, HistDocument, Series
from tailsight.testing.eval import LatencyModel

INTERVAL_NS = 1_000_000_000
START_NS = 1_790_000_000 * INTERVAL_NS
INTERVALS, CHANGE_AT = 60, 30
VICTIM, AGGRESSOR = "/trading", "/batch"


def _hist(model: LatencyModel, rng: np.random.Generator, events: int) -> Histogram:
    counts = model.sample_counts(rng, events)
    return Histogram(counts[:NUM_BUCKETS], overflow=int(counts[NUM_BUCKETS]))


def incident(change_at: int = CHANGE_AT, intervals: int = INTERVALS) -> list[HistDocument]:
    """/trading's run-queue tail rises at CHANGE_AT because /batch displaces it; its socket
    syscalls and migrations carry on as before."""
    rng = np.random.default_rng(7)
    before = LatencyModel()
    after = before.with_component(0.05, 400_000.0, 0.3)
    syscalls = LatencyModel(components=((1.0, 12_000.0, 0.2),))
    documents = []
    for t in range(intervals):
        late = t >= change_at
        series = [
            Series(
                {"probe": "runqueue", "cgroup": VICTIM},
                _hist(after if late else before, rng, int(rng.poisson(3000))),
            ),
            Series({"probe": "runqueue", "cgroup": AGGRESSOR}, _hist(before, rng, 2000)),
            Series(
                {"probe": "netsyscall", "cgroup": VICTIM, "syscall": "sendto"},
                _hist(syscalls, rng, 500),
            ),
        ]
        counters = [Counter("task_migrations", {"probe": "migration", "cgroup": VICTIM}, 40)]
        for aggressor, mean_ns in {AGGRESSOR: 20e6 if late else 1e6, "/": 3e6}.items():
            labels = {"probe": "runqueue", "victim": VICTIM, "aggressor": aggressor}
            wait = int(rng.gamma(8.0, mean_ns / 8))
            counters.append(Counter("runqueue_displaced_wait_ns", labels, wait))
            counters.append(Counter("runqueue_displaced_switches", labels, 50))
        start = START_NS + t * INTERVAL_NS
        documents.append(HistDocument(start, start + INTERVAL_NS, series, counters))
    return documents
