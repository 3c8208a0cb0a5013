"""Interrupt time charged to an incident cgroup (the irq probe's ``irq_charged_ns{cgroup, cpu,
kind, vector}``) as a cause, named with its vector and CPU."""

from __future__ import annotations

import numpy as np

from tailsight.analysis.explain.model import ExplainConfig
from tailsight.analysis.explain.pipeline import explain_documents
from tailsight.analysis.explain.text import describe_report
from tailsight.intervals import HistDocument, Series
from tests.analysis.synthetic import FAST, Interval, counter, hist, timeline

CONFIG = ExplainConfig(n_boot=100)


def softirq_documents(net_rx_after_ns: float) -> list[HistDocument]:
    """/trading's recvfrom tail rises at interval 30 while NET_RX softirqs on CPU 1 take
    ``net_rx_after_ns`` per interval from its tasks (0.2 ms before); TIMER softirqs charged to
    it and NET_RX charged to /other stay as they were."""
    rng = np.random.default_rng(5)

    def interval(t: int, late: bool) -> Interval:
        model = FAST.with_component(0.05, 2e6, 0.2) if late else FAST
        series = [
            Series(
                {"probe": "netsyscall", "cgroup": "/trading", "syscall": "recvfrom"},
                hist(model, rng, 2000),
            )
        ]
        net_rx = rng.gamma(8, (net_rx_after_ns if late else 2e5) / 8)
        counters = [
            counter("irq_charged_ns", "irq", int(net_rx),
                    cgroup="/trading", cpu="1", kind="softirq", vector="NET_RX"),
            counter("irq_charged_ns", "irq", int(rng.gamma(8, 3e5 / 8)),
                    cgroup="/trading", cpu="1", kind="softirq", vector="TIMER"),
            counter("irq_charged_ns", "irq", int(rng.gamma(8, 5e6 / 8)),
                    cgroup="/other", cpu="0", kind="softirq", vector="NET_RX"),
        ]  # fmt: skip
        return series, counters

    return timeline(interval)


def test_net_rx_softirq_time_taken_from_the_victim_is_the_cause() -> None:
    report = explain_documents(softirq_documents(net_rx_after_ns=16e6), config=CONFIG)
    assert len(report.incidents) == 1, describe_report(report)
    causes = report.incidents[0].causes
    assert [(c.kind, c.cgroup, c.labels) for c in causes] == [
        ("interrupts", "/trading", {"cpu": "1", "kind": "softirq", "vector": "NET_RX"})
    ], describe_report(report)
    # Ground truth: the mean of the NET_RX time drawn for /trading after the change.
    drawn = [
        c.value
        for d in softirq_documents(net_rx_after_ns=16e6)[30:]
        for c in d.counters
        if c.labels.get("vector") == "NET_RX" and c.labels.get("cgroup") == "/trading"
    ]
    words = " ".join(describe_report(report).split())
    expected_ms = f"{np.mean(drawn) / 1e6:,.0f}"
    assert f"NET_RX softirq took {expected_ms} ms per interval from /trading on CPU 1" in words, (
        words
    )


def test_interrupt_time_below_a_millisecond_more_is_no_cause() -> None:
    report = explain_documents(softirq_documents(net_rx_after_ns=6e5), config=CONFIG)
    assert all(c.kind != "interrupts" for i in report.incidents for c in i.causes)
