"""Synthetic recordings whose incident is known by construction: the builders the analysis and
dashboard tests share (``hist``, ``counter``, ``timeline``) and the recordings used by more than
one test file. Every random draw happens inside ``build``, interval by interval, so a seed gives
the same documents whichever test builds them."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from tailsight.hist import NUM_BUCKETS, Histogram
from tailsight.intervals import Counter, HistDocument, Series
from tailsight.testing.eval import LatencyModel

INTERVAL_NS = 1_000_000_000
START_NS = 1_790_000_000 * INTERVAL_NS
FAST = LatencyModel(components=((1.0, 30_000.0, 0.3),))
SLOW = LatencyModel(components=((1.0, 2_000_000.0, 0.1),))
STALLED = FAST.with_component(0.03, 300e6, 0.2)  # 3 % of calls wait ~300 ms (one RTO and more)
SPIKE_STACK = "entry_SYSCALL_64;do_syscall_64;asm_sysvec_apic_timer_interrupt;schedule;__schedule"
COMMON_STACK = "entry_SYSCALL_64;do_syscall_64;__x64_sys_nanosleep;schedule;__schedule"

Interval = tuple[list[Series], list[Counter]]


def hist(model: LatencyModel, rng: np.random.Generator, events: int) -> Histogram:
    """``events`` latencies drawn from ``model``, bucketed."""
    counts = model.sample_counts(rng, events)
    return Histogram(counts[:NUM_BUCKETS], overflow=int(counts[NUM_BUCKETS]))


def counter(name: str, probe: str, value: int, **labels: str) -> Counter:
    return Counter(name, {"probe": probe, **labels}, value)


def timeline(
    build: Callable[[int, bool], Interval],
    intervals: int = 60,
    change_at: int = 30,
    start_ns: int = START_NS,
) -> list[HistDocument]:
    """One document per interval ``t``, one ``INTERVAL_NS`` each from ``start_ns``, holding the
    series and counters of ``build(t, late)`` (``late``: ``t >= change_at``)."""
    documents = []
    for t in range(intervals):
        series, counters = build(t, t >= change_at)
        start = start_ns + t * INTERVAL_NS
        documents.append(HistDocument(start, start + INTERVAL_NS, series, counters))
    return documents


# -- recordings shared by several test files -----------------------------------------------------


def incident_documents(
    seed: int = 0, intervals: int = 60, change_at: int = 30, start_ns: int = START_NS
) -> list[HistDocument]:
    """/trading's run-queue tail rises at ``change_at`` because /batch displaces it; one outlier
    stack becomes frequent; /batch and / stay as they were."""
    rng = np.random.default_rng(seed)
    before = LatencyModel()
    after = before.with_component(0.05, 400_000.0, 0.3)

    def interval(t: int, late: bool) -> Interval:
        series = [
            Series(
                {"probe": "runqueue", "cgroup": "/trading"},
                hist(after if late else before, rng, int(rng.poisson(3000))),
            ),
            Series({"probe": "runqueue", "cgroup": "/batch"}, hist(before, rng, 2000)),
            Series({"probe": "runqueue", "cgroup": "/"}, hist(before, rng, 1000)),
        ]
        waits = {"/batch": 20e6 if late else 1e6, "/": 3e6, "idle": 2e6}
        counters = []
        for aggressor, mean_ns in waits.items():
            labels = {"probe": "runqueue", "victim": "/trading", "aggressor": aggressor}
            counters.append(
                Counter("runqueue_displaced_wait_ns", labels, int(rng.gamma(8.0, mean_ns / 8)))
            )
            counters.append(Counter("runqueue_displaced_switches", labels, int(rng.poisson(50))))
        for stack, rate in ((SPIKE_STACK, 15.0 if late else 0.5), (COMMON_STACK, 3.0)):
            labels = {
                "probe": "runqueue",
                "cgroup": "/trading",
                "kernel_stack": stack,
                "user_stack": "main;spin",
            }
            counters.append(Counter("runqueue_outlier_events", labels, int(rng.poisson(rate))))
        return series, counters

    return timeline(interval, intervals, change_at, start_ns)


def mix_documents(seed: int = 1, intervals: int = 50, change_at: int = 25) -> list[HistDocument]:
    """No cgroup gets slower; /slow (always ~2 ms) sends 10x more calls from ``change_at`` on."""
    rng = np.random.default_rng(seed)

    def interval(t: int, late: bool) -> Interval:
        slow_events = int(rng.poisson(200 if late else 20))
        series = [
            Series(
                {"probe": "netsyscall", "cgroup": "/slow", "syscall": "recvfrom"},
                hist(SLOW, rng, slow_events),
            ),
            Series(
                {"probe": "netsyscall", "cgroup": "/fast", "syscall": "sendto"},
                hist(FAST, rng, int(rng.poisson(5000))),
            ),
        ]
        return series, []

    return timeline(interval, intervals, change_at)


def hog_documents(seed: int = 11, intervals: int = 60, change_at: int = 30) -> list[HistDocument]:
    """At ``change_at`` /hog starts displacing /victim (victim's tail rises); the idle CPU time
    the victim used to get falls (the idle 'aggressor' loses displaced wait), and /hog's own
    run-queue tail falls (it now runs on a CPU it used to share with a third, stopped job)."""
    rng = np.random.default_rng(seed)
    calm = LatencyModel()
    slow = calm.with_component(0.05, 400_000.0, 0.3)

    def interval(t: int, late: bool) -> Interval:
        series = [
            Series(
                {"probe": "runqueue", "cgroup": "/victim"}, hist(slow if late else calm, rng, 3000)
            ),
            Series(
                {"probe": "runqueue", "cgroup": "/hog"}, hist(calm if late else slow, rng, 3000)
            ),
        ]
        waits = {"/hog": 20e6 if late else 0.0, "idle": 1e6 if late else 4e6, "/": 1e6}
        counters = []
        for aggressor, mean_ns in waits.items():
            labels = {"probe": "runqueue", "victim": "/victim", "aggressor": aggressor}
            value = int(rng.gamma(8.0, mean_ns / 8)) if mean_ns else 0
            counters.append(Counter("runqueue_displaced_wait_ns", labels, value))
            switches = int(rng.poisson(50)) if mean_ns else 0
            counters.append(Counter("runqueue_displaced_switches", labels, switches))
        return series, counters

    return timeline(interval, intervals, change_at)


def tcp_documents(
    seed: int = 0, intervals: int = 60, change_at: int = 30, server_series: bool = True
) -> list[HistDocument]:
    """/client and /server talk over loopback; from ``change_at`` the server's replies are
    dropped now and then: both ends' recvfrom tails rise to an RTO, /server retransmits. Decoys:
    / retransmits at a steady rate, /client migrates at a steady rate."""
    rng = np.random.default_rng(seed)

    def interval(t: int, late: bool) -> Interval:
        model = STALLED if late else FAST
        calls = int(rng.poisson(3000 if late else 5000))
        series = [
            Series(
                {"probe": "netsyscall", "cgroup": "/client", "syscall": "recvfrom"},
                hist(model, rng, calls),
            ),
            Series(
                {"probe": "netsyscall", "cgroup": "/client", "syscall": "sendto"},
                hist(FAST, rng, calls),
            ),
            Series({"probe": "runqueue", "cgroup": "/client"}, hist(LatencyModel(), rng, 2000)),
        ]
        if server_series:
            series.append(
                Series(
                    {"probe": "netsyscall", "cgroup": "/server", "syscall": "recvfrom"},
                    hist(model, rng, calls),
                )
            )
        counters = [
            counter(
                "tcp_retransmits",
                "tcpstate",
                int(rng.poisson(1.5 if late else 0.02)),
                cgroup="/server",
            ),
            counter("tcp_retransmits", "tcpstate", int(rng.poisson(2.0)), cgroup="/"),
            counter("task_migrations", "migration", int(rng.poisson(5.0)), cgroup="/client"),
        ]
        return series, counters

    return timeline(interval, intervals, change_at)


def migration_documents(
    seed: int = 2, intervals: int = 60, change_at: int = 30
) -> list[HistDocument]:
    """/victim's run-queue tail rises while its tasks start migrating (x20); nobody displaces it
    more than before."""
    rng = np.random.default_rng(seed)
    before = LatencyModel()
    after = before.with_component(0.04, 300_000.0, 0.3)

    def interval(t: int, late: bool) -> Interval:
        series = [
            Series(
                {"probe": "runqueue", "cgroup": "/victim"},
                hist(after if late else before, rng, 3000),
            ),
            Series({"probe": "runqueue", "cgroup": "/other"}, hist(before, rng, 3000)),
        ]
        counters = [
            counter(
                "task_migrations",
                "migration",
                int(rng.poisson(40 if late else 2)),
                cgroup="/victim",
            ),
            counter("task_migrations", "migration", int(rng.poisson(10)), cgroup="/other"),
            counter(
                "runqueue_displaced_wait_ns",
                "runqueue",
                int(rng.gamma(8, 2e6 / 8)),
                victim="/victim",
                aggressor="/other",
            ),
            counter(
                "netsyscall_errors",
                "netsyscall",
                int(rng.poisson(3)),
                cgroup="/victim",
                syscall="sendto",
                errno="EAGAIN",
            ),
        ]
        return series, counters

    return timeline(interval, intervals, change_at)
