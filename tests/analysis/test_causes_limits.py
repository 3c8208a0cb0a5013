"""A container's own CPU limit, pressure stalls and the idle CPU as causes, on synthetic
recordings whose cause is known by construction; and causes that began after their symptom."""

from __future__ import annotations

import numpy as np

from tailsight.analysis.explain.model import ExplainConfig
from tailsight.analysis.explain.pipeline import explain_documents
from tailsight.analysis.explain.text import describe_report
from tailsight.intervals import HistDocument, Series
from tailsight.testing.eval import LatencyModel
from tests.analysis.synthetic import INTERVAL_NS, START_NS, Interval, counter, hist, timeline

CONFIG = ExplainConfig(n_boot=100)
CALM = LatencyModel()
PARKED = CALM.with_component(0.05, 60_000_000.0, 0.3)  # 5 % of waits last a throttled period
QUOTA = "20000 100000"


def throttled_documents(
    seed: int = 0,
    victim: str = "/victim",
    limited: str = "/victim",
    neighbour: bool = False,
    change_at: int = 30,
    intervals: int = 60,
) -> list[HistDocument]:
    """``victim``'s run-queue wait rises from ``change_at``, when the CPU limit of ``limited`` (the
    victim or a parent) parks it in 10 of 10 periods, 80 ms per interval; meanwhile the CPU sits
    idle, or (``neighbour``) /neighbour runs on it."""
    rng = np.random.default_rng(seed)

    def interval(t: int, late: bool) -> Interval:
        series = [
            Series({"probe": "runqueue", "cgroup": victim},
                   hist(PARKED if late else CALM, rng, 3000)),
        ]  # fmt: skip
        parked_ns = 80_000_000 if late else 0
        holder = "/neighbour" if neighbour else "idle"
        counters = [
            counter("runqueue_displaced_wait_ns", "runqueue", int(rng.gamma(8, 1e5 / 8)),
                    victim=victim, aggressor=holder),
            counter("throttle_periods", "throttle", 10, cgroup=limited, cpu_max=QUOTA),
            counter("throttle_throttled_periods", "throttle", 10 if late else 0,
                    cgroup=limited, cpu_max=QUOTA),
            counter("throttle_throttled_ns", "throttle", parked_ns, cgroup=limited,
                    cpu_max=QUOTA),
            counter("pressure_some_ns", "pressure", int(rng.gamma(4, 1e4)),
                    cgroup=victim, resource="memory"),
        ]  # fmt: skip
        if late:  # the parked wait, charged to whoever ran meanwhile
            counters.append(
                counter("runqueue_displaced_wait_ns", "runqueue", parked_ns * 5,
                        victim=victim, aggressor=holder)
            )  # fmt: skip
        return series, counters

    return timeline(interval, intervals, change_at)


def test_own_limit_comes_first_and_the_idle_cpu_is_no_aggressor() -> None:
    report = explain_documents(throttled_documents(), config=CONFIG)
    assert len(report.incidents) == 1, describe_report(report)
    incident = report.incidents[0]
    first = incident.causes[0]
    assert (first.kind, first.cgroup, first.labels["cpu_max"]) == ("throttling", "/victim", QUOTA)
    # The wait on the idle CPU is the limit's: no cause of its own, no aggressor named "idle".
    assert [c.kind for c in incident.causes if c.cgroup == "/victim"] == ["throttling"]
    words = " ".join(describe_report(report).split())
    assert (
        "Likely cause: /victim was throttled by its own CPU limit "
        "(cpu.max 20 ms per 100 ms at /victim): "
        "10 of 10 periods, 80 ms per interval"
    ) in words, words


def test_a_parents_limit_is_named_as_such() -> None:
    report = explain_documents(
        throttled_documents(victim="/pod/victim", limited="/pod"), config=CONFIG
    )
    incident = report.incidents[0]
    first = incident.causes[0]
    assert (first.kind, first.cgroup) == ("throttling", "/pod"), describe_report(report)
    assert (
        "/pod/victim was throttled by an ancestor's CPU limit (cpu.max 20 ms per 100 ms at /pod)"
        in " ".join(describe_report(report).split())
    )


def test_a_neighbour_running_while_the_victim_is_throttled_is_not_blamed() -> None:
    """What ran on the CPU while the limit parked the victim displaced nothing: the neighbour is
    no candidate (every interval after the change was throttled)."""
    report = explain_documents(throttled_documents(neighbour=True), config=CONFIG)
    causes = report.incidents[0].causes
    assert causes[0].kind == "throttling", describe_report(report)
    assert not [c for c in causes if c.labels.get("aggressor") == "/neighbour"]
    assert "/neighbour" not in describe_report(report)  # nor in the wait's split by aggressor


def idle_documents(seed: int = 0, steal: bool = False) -> list[HistDocument]:
    """/victim's wait rises, charged to the idle task, with no limit (and ``steal``: CPU 0's
    steal time rises with it)."""
    rng = np.random.default_rng(seed)

    def interval(t: int, late: bool) -> Interval:
        series = [
            Series({"probe": "runqueue", "cgroup": "/victim"},
                   hist(PARKED if late else CALM, rng, 3000)),
        ]  # fmt: skip
        counters = [
            counter("runqueue_displaced_wait_ns", "runqueue",
                    int(rng.gamma(8, (3e8 if late else 1e5) / 8)), victim="/victim",
                    aggressor="idle"),
            counter("host_cpu_steal_ns", "runqueue",
                    int(rng.gamma(8, (4e8 if late and steal else 1e6) / 8)), cpu="0"),
        ]  # fmt: skip
        return series, counters

    return timeline(interval)


def test_a_wait_on_an_idle_cpu_without_limit_or_steal_reads_as_a_wake_up() -> None:
    report = explain_documents(idle_documents(), config=CONFIG)
    first = report.incidents[0].causes[0]
    assert (first.kind, first.cgroup, first.labels) == ("idle_cpu", "/victim", {})
    words = " ".join(describe_report(report).split())
    assert "waited to run on CPUs that were idle" in words and "held by" not in words


def test_a_wait_on_an_idle_cpu_with_steal_reads_as_steal() -> None:
    report = explain_documents(idle_documents(steal=True), config=CONFIG)
    kinds = [c.kind for c in report.incidents[0].causes]
    assert kinds[:2] == ["steal", "idle_cpu"], describe_report(report)


def test_memory_pressure_is_a_candidate_with_its_own_words() -> None:
    rng = np.random.default_rng(3)

    def interval(t: int, late: bool) -> Interval:
        series = [
            Series({"probe": "netsyscall", "cgroup": "/feed", "syscall": "recvfrom"},
                   hist(PARKED if late else CALM, rng, 3000)),
        ]  # fmt: skip
        counters = [
            counter("pressure_some_ns", "pressure", int(rng.gamma(8, (9e7 if late else 1e5) / 8)),
                    cgroup="/feed", resource="memory"),
            counter("pressure_some_ns", "pressure", int(rng.gamma(8, 1e5 / 8)),
                    cgroup="/feed", resource="io"),
        ]  # fmt: skip
        return series, counters

    report = explain_documents(timeline(interval), config=CONFIG)
    causes = report.incidents[0].causes
    assert [(c.kind, c.cgroup) for c in causes] == [("memory_pressure", "/feed")]
    assert "tasks of /feed stalled reclaiming or faulting in memory (PSI memory some)" in " ".join(
        describe_report(report).split()
    )


def late_documents(second_step: bool, seed: int = 0) -> list[HistDocument]:
    """/trading's wait rises at interval 30; /hog's displacement of it begins at 45. With
    ``second_step`` the wait rises a little at 30 and mostly at 45, else all of it at 30."""
    rng = np.random.default_rng(seed)
    small = CALM.with_component(0.03, 2_000_000.0, 0.3)

    def interval(t: int, late: bool) -> Interval:
        if second_step:
            model = PARKED if t >= 45 else small if t >= 30 else CALM
        else:
            model = PARKED if t >= 30 else CALM
        series = [Series({"probe": "runqueue", "cgroup": "/trading"}, hist(model, rng, 3000))]
        counters = [
            counter("runqueue_displaced_wait_ns", "runqueue",
                    int(rng.gamma(8, (3e8 if t >= 45 else 1e5) / 8)), victim="/trading",
                    aggressor="/hog"),
        ]  # fmt: skip
        return series, counters

    return timeline(interval, intervals=75)


def test_a_cause_that_began_after_the_symptom_is_not_its_cause() -> None:
    report = explain_documents(late_documents(second_step=False), config=CONFIG)
    incident = report.incidents[0]
    assert abs(incident.headline.change_index - 30) <= 1, describe_report(report)
    hog = next(c for c in incident.causes if c.labels.get("aggressor") == "/hog")
    assert 13 <= hog.late_s <= 17
    words = " ".join(describe_report(report).split())
    assert "No cause found that began with the rise" in words, words
    assert "a consequence, not its cause" in words


def test_a_symptom_that_rose_mostly_with_a_later_cause_is_dated_by_it() -> None:
    report = explain_documents(late_documents(second_step=True), config=CONFIG)
    incident = next(i for i in report.incidents if i.causes)
    first = incident.causes[0]
    assert first.labels.get("aggressor") == "/hog" and not first.late_s, describe_report(report)
    assert abs(incident.start_ns - (START_NS + 45 * INTERVAL_NS)) <= INTERVAL_NS
    assert "Likely cause: /trading waited for CPUs held by /hog" in " ".join(
        describe_report(report).split()
    )


def test_a_later_cause_beside_one_in_time_neither_redates_nor_leads() -> None:
    """/hog displaces /trading from the change; /other's load comes 15 intervals later: the
    incident stays dated at the change, /hog first, /other late."""
    rng = np.random.default_rng(4)

    def interval(t: int, late: bool) -> Interval:
        model = PARKED if t >= 30 else CALM
        series = [Series({"probe": "runqueue", "cgroup": "/trading"}, hist(model, rng, 3000))]
        counters = [
            counter("runqueue_displaced_wait_ns", "runqueue",
                    int(rng.gamma(8, (8e7 if t >= 30 else 1e5) / 8)), victim="/trading",
                    aggressor="/hog"),
            counter("runqueue_displaced_wait_ns", "runqueue",
                    int(rng.gamma(8, (3e8 if t >= 45 else 1e5) / 8)), victim="/trading",
                    aggressor="/other"),
        ]  # fmt: skip
        return series, counters

    report = explain_documents(timeline(interval, intervals=75), config=CONFIG)
    incident = next(i for i in report.incidents if i.causes)
    assert incident.dated_ns is None and abs(incident.headline.change_index - 30) <= 1
    by_aggressor = {c.labels.get("aggressor"): c for c in incident.causes}
    assert incident.causes[0].labels == {"aggressor": "/hog"}, describe_report(report)
    assert 13 <= by_aggressor["/other"].late_s <= 17


def test_io_stalls_beside_memory_stalls_are_its_consequence() -> None:
    """Pages read back after reclaim stall on io too, here more than on memory: memory first."""
    rng = np.random.default_rng(5)

    def interval(t: int, late: bool) -> Interval:
        series = [
            Series({"probe": "netsyscall", "cgroup": "/feed", "syscall": "recvfrom"},
                   hist(PARKED if late else CALM, rng, 3000)),
        ]  # fmt: skip
        counters = [
            counter("pressure_some_ns", "pressure", int(rng.gamma(8, (6e7 if late else 1e5) / 8)),
                    cgroup="/feed", resource="memory"),
            counter("pressure_some_ns", "pressure", int(rng.gamma(8, (9e7 if late else 1e5) / 8)),
                    cgroup="/feed", resource="io"),
            # Kernel workers run on its CPU meanwhile: a small displacement, after the stalls.
            counter("runqueue_displaced_wait_ns", "runqueue",
                    int(rng.gamma(8, (1e7 if late else 1e4) / 8)), victim="/feed", aggressor="/"),
        ]  # fmt: skip
        return series, counters

    report = explain_documents(timeline(interval), config=CONFIG)
    kinds = [c.kind for c in report.incidents[0].causes]
    assert kinds[0] == "memory_pressure", describe_report(report)
    assert sorted(kinds) == ["displacement", "io_pressure", "memory_pressure"]


def test_kernel_threads_running_while_a_cgroup_reclaims_are_the_stall_not_a_neighbour() -> None:
    """A run-queue rise of a cgroup stalled on memory, on CPUs kswapd and the I/O workers (cgroup
    /) held meanwhile, their displacement rising more than the stall: the stall comes first."""
    rng = np.random.default_rng(7)

    def interval(t: int, late: bool) -> Interval:
        series = [
            Series({"probe": "runqueue", "cgroup": "/victim"},
                   hist(PARKED if late else CALM, rng, 3000)),
        ]  # fmt: skip
        counters = [
            counter("pressure_some_ns", "pressure", int(rng.gamma(8, (9e7 if late else 1e5) / 8)),
                    cgroup="/victim", resource="memory"),
            counter("runqueue_displaced_wait_ns", "runqueue",
                    int(rng.gamma(8, (1e8 if late else 1e4) / 8)), victim="/victim",
                    aggressor="/"),
        ]  # fmt: skip
        return series, counters

    report = explain_documents(timeline(interval), config=CONFIG)
    causes = report.incidents[0].causes
    assert [(c.kind, c.cgroup) for c in causes] == [
        ("memory_pressure", "/victim"),
        ("displacement", "/victim"),
    ], describe_report(report)
