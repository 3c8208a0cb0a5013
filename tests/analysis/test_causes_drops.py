"""Packet drops (the drops probe's ``packets_dropped{cgroup, protocol, reason}``) as a cause of
an incident, worded by the kernel's drop reason."""

from __future__ import annotations

import numpy as np

from tailsight.analysis.explain.model import ExplainConfig
from tailsight.analysis.explain.pipeline import explain_documents
from tailsight.analysis.explain.text import describe_report
from tailsight.intervals import HistDocument, Series
from tests.analysis.synthetic import FAST, Interval, counter, hist, timeline

CONFIG = ExplainConfig(n_boot=100)


def feed_documents(drops_after: float) -> list[HistDocument]:
    """/feed's recvfrom tail rises at interval 30; its receive-buffer drops rise from ~0 to
    ``drops_after`` per interval. Steady drops elsewhere (a firewall rule of /other, host-wide
    drops with no socket) are no cause."""
    rng = np.random.default_rng(11)

    def interval(t: int, late: bool) -> Interval:
        model = FAST.with_component(0.05, 3e6, 0.2) if late else FAST
        series = [
            Series(
                {"probe": "netsyscall", "cgroup": "/feed", "syscall": "recvfrom"},
                hist(model, rng, 2000),
            )
        ]
        counters = [
            counter("packets_dropped", "drops", int(rng.poisson(drops_after if late else 0.05)),
                    cgroup="/feed", protocol="udp", reason="SOCKET_RCVBUFF"),
            counter("packets_dropped", "drops", int(rng.poisson(40)),
                    cgroup="/other", protocol="tcp", reason="NETFILTER_DROP"),
            counter("host_packets_dropped", "drops", int(rng.poisson(7)),
                    scope="host", protocol="udp", reason="NO_SOCKET"),
        ]  # fmt: skip
        return series, counters

    return timeline(interval)


def test_receive_buffer_drops_are_the_cause_in_the_kernels_words() -> None:
    report = explain_documents(feed_documents(drops_after=780.0), config=CONFIG)
    assert len(report.incidents) == 1, describe_report(report)
    causes = report.incidents[0].causes
    assert [(c.kind, c.cgroup, c.labels) for c in causes] == [
        ("packet_drops", "/feed", {"protocol": "udp", "reason": "SOCKET_RCVBUFF"})
    ], describe_report(report)
    # Ground truth: the drops drawn for /feed after the change, as the sentence counts them.
    truth = sum(
        c.value
        for d in feed_documents(drops_after=780.0)[30:]
        for c in d.counters
        if c.labels.get("cgroup") == "/feed"
    )
    words = " ".join(describe_report(report).split())
    assert (
        f"/feed lost UDP datagrams at a full socket receive buffer (the reader did not keep "
        f"up): {truth:,} in the 30 intervals since the change"
    ) in words, words


def test_steady_drops_are_no_cause() -> None:
    report = explain_documents(feed_documents(drops_after=0.05), config=CONFIG)
    assert all(c.kind != "packet_drops" for i in report.incidents for c in i.causes)
