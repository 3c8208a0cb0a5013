"""Incidents and causes across probes on synthetic recordings whose cause is known by construction:
a TCP pair whose replies get retransmitted, a victim whose tasks start migrating, a victim whose
syscalls start failing, and two unrelated incidents that must stay apart."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from tailsight.analysis.explain.html import render_html
from tailsight.analysis.explain.model import ExplainConfig, Report
from tailsight.analysis.explain.pipeline import explain_documents
from tailsight.analysis.explain.text import describe_report, jump_title
from tailsight.intervals import Counter, HistDocument, Series
from tailsight.testing.eval import LatencyModel
from tests.analysis.synthetic import (
    FAST,
    STALLED,
    Interval,
    counter,
    hist,
    migration_documents,
    tcp_documents,
    timeline,
)

CONFIG = ExplainConfig(n_boot=100)


def test_tcp_loss_is_one_incident_caused_by_retransmits() -> None:
    report = explain_documents(tcp_documents(), config=CONFIG)
    assert len(report.incidents) == 1, describe_report(report)
    incident = report.incidents[0]
    head = incident.headline
    assert head.labels["syscall"] == "recvfrom" and not head.aggregate
    assert abs(head.change_index - 30) <= 1
    # Both ends' recvfrom are in it; aggregates that one cgroup explains are folded, not shown.
    shown = {(j.labels.get("cgroup"), j.labels.get("syscall")) for j in incident.jumps}
    assert shown == {("/client", "recvfrom"), ("/server", "recvfrom")}, describe_report(report)
    assert all(j.aggregate for j in incident.folded)
    cause = incident.causes[0]
    assert (cause.kind, cause.cgroup) == ("retransmits", "/server")
    # The decoys did not change: not discovered.
    assert not [c for c in incident.causes if c.cgroup == "/" or c.kind == "migrations"]
    words = " ".join(describe_report(report).split())
    assert "Likely cause: recvfrom waited on TCP retransmissions" in words
    assert "retransmission timeout" in words
    assert all(len(line) <= 80 for line in describe_report(report).splitlines())


def test_retransmits_of_an_unrecorded_peer_are_named_as_the_peer() -> None:
    """Only the client's series are recorded: the retransmits rise in another cgroup, which the
    probes cannot tie to the connection, so it is named as probably the other end."""
    documents = tcp_documents(seed=1, server_series=False)
    report = explain_documents(documents, {"cgroup": "/client"}, CONFIG)
    assert len(report.incidents) == 1
    cause = report.incidents[0].causes[0]
    assert (cause.kind, cause.cgroup, cause.peer) == ("retransmits", "/server", True)
    assert "probably the other end" in " ".join(describe_report(report).split())


def test_migrations_are_the_cause_when_nobody_displaces_more() -> None:
    report = explain_documents(migration_documents(), config=CONFIG)
    assert len(report.incidents) == 1
    incident = report.incidents[0]
    assert incident.headline.labels == {"probe": "runqueue", "cgroup": "/victim"}
    kinds = [(c.kind, c.cgroup) for c in incident.causes]
    assert kinds[0] == ("migrations", "/victim"), kinds
    assert ("displacement", "/victim") not in kinds and ("syscall_errors", "/victim") not in kinds
    assert "moved between CPUs" in " ".join(describe_report(report).split())


def test_syscall_errors_by_errno() -> None:
    rng = np.random.default_rng(3)

    def interval(t: int, late: bool) -> Interval:
        model = FAST.with_component(0.05, 2e6, 0.2) if late else FAST
        series = [
            Series(
                {"probe": "netsyscall", "cgroup": "/app", "syscall": "connect"},
                hist(model, rng, 2000),
            )
        ]
        counters = [
            counter(
                "netsyscall_errors",
                "netsyscall",
                int(rng.poisson(60 if late else 0.1)),
                cgroup="/app",
                syscall="connect",
                errno="ECONNREFUSED",
            ),
            counter(
                "netsyscall_errors",
                "netsyscall",
                int(rng.poisson(5)),
                cgroup="/app",
                syscall="connect",
                errno="EINPROGRESS",
            ),
        ]
        return series, counters

    report = explain_documents(timeline(interval), config=CONFIG)
    causes = report.incidents[0].causes
    assert [(c.kind, c.labels) for c in causes] == [
        ("syscall_errors", {"syscall": "connect", "errno": "ECONNREFUSED"})
    ]
    assert "connect in /app failed with ECONNREFUSED" in " ".join(describe_report(report).split())


def _two_incidents(second_at: int = 55) -> Report:
    rng = np.random.default_rng(4)
    calm = LatencyModel()
    slow = calm.with_component(0.05, 400_000.0, 0.3)

    def interval(t: int, late: bool) -> Interval:
        series = [
            Series(
                {"probe": "runqueue", "cgroup": "/a"}, hist(slow if t >= 20 else calm, rng, 3000)
            ),
            Series(
                {"probe": "runqueue", "cgroup": "/b"},
                hist(slow if t >= second_at else calm, rng, 3000),
            ),
        ]
        return series, []

    return explain_documents(timeline(interval, intervals=80), config=CONFIG)


def test_unrelated_jumps_are_separate_incidents() -> None:
    report = _two_incidents()
    heads = [(i.headline.labels["cgroup"], i.headline.change_index) for i in report.incidents]
    assert [h[0] for h in heads] == ["/a", "/b"], heads
    assert abs(heads[0][1] - 20) <= 1 and abs(heads[1][1] - 55) <= 1
    assert "No cause found" in describe_report(report)


def test_simultaneous_jumps_of_unrelated_cgroups_stay_apart() -> None:
    """The all-cgroups aggregate rises with both; it must not bridge them into one incident."""
    report = _two_incidents(second_at=20)
    assert sorted(i.headline.labels["cgroup"] for i in report.incidents) == ["/a", "/b"]
    folded = [j for i in report.incidents for j in i.folded]
    assert [jump_title(j) for j in folded] == ["run-queue wait of all cgroups"]


def test_html_has_one_section_per_incident_with_the_cause_beside_the_symptom() -> None:
    import xml.etree.ElementTree as ET

    documents = tcp_documents(seed=5)
    report = explain_documents(documents, config=CONFIG)
    page = render_html(report, documents)
    root = ET.fromstring(page.removeprefix("<!DOCTYPE html>"))
    sections = [e for e in root.iter("section") if e.get("data-role") == "incident"]
    assert len(sections) == len(report.incidents) == 1
    items = [li.text or "" for li in sections[0].iter("li")]
    assert items[1].startswith("Likely cause: recvfrom waited on TCP retransmissions")
    cause = [p for p in sections[0].iter() if p.get("data-series") == "cause"]
    assert len(cause) == 1
    # One point per interval, and it rises where the retransmits start.
    points = [float(xy.split(",")[1]) for xy in (cause[0].get("points") or "").split()]
    assert len(points) == len(documents)
    assert max(points[:25]) > min(points[35:])  # SVG y grows downwards


def test_aggregate_raised_by_a_new_aggressor_folds_into_the_victims_incident() -> None:
    """Seen end to end: hogs start in a new cgroup; their own (new) waits raise the all-cgroups
    aggregate. One incident (the victim's, caused by the hogs), the aggregate folded into it."""
    rng = np.random.default_rng(6)
    calm = LatencyModel()
    slow = calm.with_component(0.05, 400_000.0, 0.3)
    hogs = LatencyModel(components=((1.0, 3_000_000.0, 0.2),))

    def interval(t: int, late: bool) -> Interval:
        series = [
            Series({"probe": "runqueue", "cgroup": "/victim"},
                   hist(slow if late else calm, rng, 3000)),
        ]  # fmt: skip
        counters = [
            counter("runqueue_displaced_wait_ns", "runqueue", int(rng.gamma(8, 1e6 / 8)),
                    victim="/victim", aggressor="/"),
        ]  # fmt: skip
        if late:
            series.append(Series({"probe": "runqueue", "cgroup": "/hogs"}, hist(hogs, rng, 500)))
            counters.append(
                counter("runqueue_displaced_wait_ns", "runqueue", int(rng.gamma(8, 4e8 / 8)),
                        victim="/victim", aggressor="/hogs")
            )  # fmt: skip
        return series, counters

    report = explain_documents(timeline(interval), config=CONFIG)
    assert len(report.incidents) == 1, describe_report(report)
    incident = report.incidents[0]
    assert incident.headline.labels == {"probe": "runqueue", "cgroup": "/victim"}
    assert incident.causes[0].labels == {"aggressor": "/hogs"}
    assert [jump_title(j) for j in incident.folded] == ["run-queue wait of all cgroups"]


def test_retransmits_with_a_known_other_end_name_both_ends() -> None:
    """The probe tied the retransmits to the connection's other end: /server's retransmits
    towards /client come first (the data /client waits for), named with both ends and not as
    "probably"; /client's own retransmits towards /server (acknowledgements lost with the
    replies) come after; a decoy's retransmits to a third cgroup are no candidate at all."""
    documents = tcp_documents(seed=4)
    rng = np.random.default_rng(5)
    for t, document in enumerate(documents):
        late = t >= 30
        server = sum(c.value for c in document.counters if c.labels.get("cgroup") == "/server")
        client = int(rng.poisson(0.5 if late else 0.01))
        decoy = int(rng.poisson(3.0 if late else 0.5))
        document.counters.extend(
            [
                counter("tcp_retransmits_to_peer", "tcpstate", server, cgroup="/server",
                        victim="/client"),
                counter("tcp_retransmits", "tcpstate", client, cgroup="/client"),
                counter("tcp_retransmits_to_peer", "tcpstate", client, cgroup="/client",
                        victim="/server"),
                counter("tcp_retransmits", "tcpstate", decoy, cgroup="/decoy"),
                # Another cgroup's call burst at the same time: circumstantial, ranked after.
                counter("netsyscall_calls", "netsyscall", 30_000 if late else 10,
                        cgroup="/busy", syscall="recvfrom"),
                counter("tcp_retransmits_to_peer", "tcpstate", decoy, cgroup="/decoy",
                        victim="/elsewhere"),
            ]
        )  # fmt: skip
    report = explain_documents(documents, config=CONFIG)
    assert len(report.incidents) == 1, describe_report(report)
    causes = report.incidents[0].causes
    first = causes[0]
    assert (first.kind, first.cgroup, first.labels, first.peer) == (
        "retransmits", "/server", {"other_end": "/client"}, False,
    )  # fmt: skip
    # Counted once: the raw /server counter holds only retransmits of known other end.
    assert not [c for c in causes if c.cgroup == "/server" and "other_end" not in c.labels]
    assert not [c for c in causes if c.cgroup == "/decoy"]
    assert ("neighbour_calls", "/busy") in [(c.kind, c.cgroup) for c in causes]
    words = " ".join(describe_report(report).split())
    assert "by /server's sockets to /client (the other end of the connection)" in words
    assert "about one TCP retransmission timeout" in words


def test_failing_calls_of_a_starved_cgroup_rank_after_what_starved_it() -> None:
    """/victim's recvfrom tail (the headline: it moved most) and its run-queue wait rise as
    /worker displaces it 5x more than before; its non-blocking calls start failing with EAGAIN
    (new, so the largest effect). The failures are a consequence of waiting for CPUs, whichever
    series heads the incident: the displacement comes first, also when the headline is not the
    run-queue wait."""
    rng = np.random.default_rng(7)
    calm = LatencyModel()

    def interval(t: int, late: bool) -> Interval:
        series = [
            Series({"probe": "netsyscall", "cgroup": "/victim", "syscall": "recvfrom"},
                   hist(STALLED if late else FAST, rng, 3000)),
            Series({"probe": "runqueue", "cgroup": "/victim"},
                   hist(calm.with_component(0.05, 400_000.0, 0.3) if late else calm, rng, 3000)),
        ]  # fmt: skip
        counters = [
            counter("runqueue_displaced_wait_ns", "runqueue",
                    int(rng.gamma(8, (5e6 if late else 1e6) / 8)),
                    victim="/victim", aggressor="/worker"),
            counter("netsyscall_errors", "netsyscall", int(rng.poisson(40 if late else 0.02)),
                    cgroup="/victim", syscall="recvfrom", errno="EAGAIN"),
        ]  # fmt: skip
        return series, counters

    report = explain_documents(timeline(interval), config=CONFIG)
    assert len(report.incidents) == 1, describe_report(report)
    incident = report.incidents[0]
    assert incident.headline.labels["probe"] == "netsyscall", describe_report(report)
    kinds = [(c.kind, c.labels.get("aggressor")) for c in incident.causes]
    assert kinds[0] == ("displacement", "/worker"), kinds
    assert ("syscall_errors", None) in kinds, kinds


def test_failing_calls_rank_after_what_starved_them_under_an_all_cgroups_headline() -> None:
    """Only the all-cgroups run-queue wait jumps: /victim called too rarely before the change for
    its own wait to be tested (20 events per interval), /bulk's is steady. /victim, the largest
    source of the rise, is starved by /worker, and its sends fail with EAGAIN (new). The
    displacement comes first: the all-cgroups wait counts its largest source as starved, not
    only a cgroup's own wait."""
    rng = np.random.default_rng(13)
    calm = LatencyModel()

    def interval(t: int, late: bool) -> Interval:
        series = [
            Series({"probe": "runqueue", "cgroup": "/victim"},
                   hist(calm.with_component(0.3, 3e6, 0.3) if late else calm, rng, 20)),
            Series({"probe": "runqueue", "cgroup": "/bulk"}, hist(calm, rng, 3000)),
        ]  # fmt: skip
        counters = [
            counter("runqueue_displaced_wait_ns", "runqueue",
                    int(rng.gamma(8, (30e6 if late else 1e5) / 8)),
                    victim="/victim", aggressor="/worker"),
            counter("netsyscall_errors", "netsyscall", int(rng.poisson(6 if late else 0.001)),
                    cgroup="/victim", syscall="sendto", errno="EAGAIN"),
        ]  # fmt: skip
        return series, counters

    report = explain_documents(timeline(interval), config=CONFIG)
    assert len(report.incidents) == 1, describe_report(report)
    incident = report.incidents[0]
    assert [jump_title(j) for j in incident.jumps] == ["run-queue wait of all cgroups"]
    kinds = [(c.kind, c.cgroup, c.labels.get("aggressor")) for c in incident.causes]
    assert kinds[0] == ("displacement", "/victim", "/worker"), kinds
    assert ("syscall_errors", "/victim", None) in kinds, kinds


def test_a_flooding_neighbour_is_named_though_the_server_answering_it_calls_more() -> None:
    """/neighbour floods the unix socket of /server, which /victim also talks to: /victim's
    sendto tail rises, /server (busier: it answers the flood) displaces /victim more, and its
    own recvfrom tail and volume rise with it, above the neighbour's; the neighbour's run-queue
    wait rises too. The neighbour's calls, new and larger than what the symptoms called before,
    are the cause (with the symptoms' volume after the change as the floor, and the neighbour,
    a run-queue symptom, counted as one of them, /server's displacement would rank first)."""
    rng = np.random.default_rng(11)
    calm = LatencyModel()
    slow_server = FAST.with_component(0.05, 2e6, 0.3)

    def interval(t: int, late: bool) -> Interval:
        series = [
            Series({"probe": "netsyscall", "cgroup": "/victim", "syscall": "sendto"},
                   hist(STALLED if late else FAST, rng, 3000)),
            Series({"probe": "netsyscall", "cgroup": "/server", "syscall": "recvfrom"},
                   hist(slow_server if late else FAST, rng, 33_000 if late else 3000)),
            Series({"probe": "runqueue", "cgroup": "/neighbour"},
                   hist(calm.with_component(0.05, 400_000.0, 0.3) if late else calm, rng,
                        3000 if late else 300)),
        ]  # fmt: skip
        if late:
            series.append(
                Series({"probe": "netsyscall", "cgroup": "/neighbour", "syscall": "sendto"},
                       hist(FAST, rng, 30_000))
            )  # fmt: skip
        counters = [
            counter("runqueue_displaced_wait_ns", "runqueue",
                    int(rng.gamma(8, (3e6 if late else 1e6) / 8)),
                    victim="/victim", aggressor="/server"),
        ]  # fmt: skip
        return series, counters

    report = explain_documents(timeline(interval), config=CONFIG)
    victims = [i for i in report.incidents if "/victim" in i.cgroups]
    assert victims, describe_report(report)
    first = victims[0].causes[0]
    assert (first.kind, first.cgroup) == ("neighbour_calls", "/neighbour"), describe_report(report)


def _run_queue_jump(
    cgroup: str,
    slow: LatencyModel,
    rng: np.random.Generator,
    counters: Callable[[bool], list[Counter]],
) -> list[HistDocument]:
    """60 intervals of ``cgroup``'s run-queue wait, calm then ``slow`` from interval 30, with
    ``counters(late)`` drawn after each interval's histogram."""

    def interval(t: int, late: bool) -> Interval:
        wait = hist(slow if late else LatencyModel(), rng, 3000)
        return [Series({"probe": "runqueue", "cgroup": cgroup}, wait)], counters(late)

    return timeline(interval)


def test_a_hogs_displacement_outranks_a_neighbours_call_burst_for_a_run_queue_wait() -> None:
    """As in the demo: /noisy starts spinning on /trading's CPU and takes all of the rise of
    /trading's run-queue wait; meanwhile /exchange (no displacer) polls 10x more and retransmits
    to the starved /trading. For a wait for CPUs the hog is the answer, the calls and
    retransmits side effects, however much they rose. The counter-case (the displacer's own
    calls rose) is the flooding-neighbour test above."""
    rng = np.random.default_rng(13)

    def counters(late: bool) -> list[Counter]:
        return [
            counter("runqueue_displaced_wait_ns", "runqueue",
                    int(rng.gamma(8, (384e6 if late else 147e6) / 8)),
                    victim="/trading", aggressor="/noisy"),
            counter("netsyscall_calls", "netsyscall", int(rng.poisson(1500 if late else 150)),
                    cgroup="/exchange", syscall="recvfrom"),
            # The starved receiver acknowledges late: the exchange retransmits to it (as in the
            # demo on this 2-core host: 31 in 30 intervals before, 159 in 27 after).
            counter("tcp_retransmits_to_peer", "tcpstate", int(rng.poisson(6 if late else 1)),
                    cgroup="/exchange", victim="/trading"),
        ]  # fmt: skip

    slow = LatencyModel().with_component(0.05, 6_000_000.0, 0.3)
    documents = _run_queue_jump("/trading", slow, rng, counters)
    report = explain_documents(documents, config=CONFIG)
    assert len(report.incidents) == 1, describe_report(report)
    causes = [(c.kind, c.cgroup, c.labels) for c in report.incidents[0].causes]
    assert causes[0] == ("displacement", "/trading", {"aggressor": "/noisy"}), causes
    assert ("neighbour_calls", "/exchange", {"syscall": "recvfrom"}) in causes, causes
    assert ("retransmits", "/exchange", {"other_end": "/trading"}) in causes, causes


def _steal_documents(hog: bool, seed: int) -> list[HistDocument]:
    """/victim's run-queue wait rises from interval 30. Without ``hog``: it waits while its CPU
    looks idle (displaced by idle) as CPU 0's steal time rises 40 -> 400 ms per interval (as in
    the quiet runs on this VM). With ``hog``: /hog displaces it, and steal rises a little on
    CPU 1 at the same time (background). CPU 1's steal is steady in the first case."""
    rng = np.random.default_rng(seed)

    def counters(late: bool) -> list[Counter]:
        steal_0 = rng.gamma(8, (400e6 if late and not hog else 40e6) / 8)
        steal_1 = rng.gamma(8, (80e6 if late and hog else 40e6) / 8)
        return [
            counter("runqueue_displaced_wait_ns", "runqueue",
                    int(rng.gamma(8, (5e6 if late else 0.2e6) / 8)),
                    victim="/victim", aggressor="/hog" if hog else "idle"),
            counter("host_cpu_steal_ns", "runqueue", int(steal_0), cpu="0"),
            counter("host_cpu_steal_ns", "runqueue", int(steal_1), cpu="1"),
        ]  # fmt: skip

    slow = LatencyModel().with_component(0.05, 400_000.0, 0.3)
    return _run_queue_jump("/victim", slow, rng, counters)


def test_steal_time_explains_a_wait_displaced_by_idle() -> None:
    """On a VM the hypervisor running another guest looks idle to the kernel: the victim's wait
    rises "displaced by idle". CPU 0's steal rising at the same time is the cause, named with
    its CPU and in words; CPU 1's steady steal is no candidate."""
    report = explain_documents(_steal_documents(hog=False, seed=17), config=CONFIG)
    assert len(report.incidents) == 1, describe_report(report)
    causes = report.incidents[0].causes
    assert (causes[0].kind, causes[0].labels) == ("steal", {"cpu": "0"}), causes
    assert not [c for c in causes if c.kind == "steal" and c.labels == {"cpu": "1"}]
    words = " ".join(describe_report(report).split())
    assert "Likely cause: the hypervisor ran something else on CPU 0 (steal time" in words


def test_steal_time_ranks_after_a_hog_that_displaced_the_wait() -> None:
    """Steal that rises beside a real hog (CPU 1: 40 -> 80 ms per interval) is background."""
    report = explain_documents(_steal_documents(hog=True, seed=19), config=CONFIG)
    assert len(report.incidents) == 1, describe_report(report)
    causes = [(c.kind, c.labels) for c in report.incidents[0].causes]
    assert causes[0] == ("displacement", {"aggressor": "/hog"}), causes
