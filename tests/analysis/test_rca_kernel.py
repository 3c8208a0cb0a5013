"""Root-cause accuracy, one quick injection of each kind into real cgroups, recorded with every
probe by `tailsight record`: `explain` must put the injected fault first among the causes of the
victim's incident, dated within a few intervals of the injection; and a quiet recording (the
victim alone) must hold no incident of the victim. The faults that set a limit are first checked
against the kernel's own counters of it. The benchmark (benchmarks/bench_rca_accuracy.py)
repeats these for top-1/top-3 rates."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tailsight.analysis.explain.html import render_html
from tailsight.analysis.explain.model import ExplainConfig, Report
from tailsight.analysis.explain.pipeline import explain_documents
from tailsight.analysis.explain.text import describe_report
from tailsight.probes.cgroupfiles import find_v1_mount
from tailsight.testing.inject import (
    INTERVAL_S,
    KINDS,
    THROTTLE_PERIOD_US,
    WORKING_SET_MIB,
    Injection,
    RecorderStalled,
    run_injection,
    run_quiet,
    score,
    steal_disturbed,
)
from tailsight.testing.workload import private_base
from tests.statistical import run_tries

FAULT_S = 8.0
INJECTION_PASS_RATE = 0.95  # per recording of one kind: measured (tests/README.md)
QUIET_PASS_RATE = 0.9  # per 16 s quiet recording: measured, below the 0.95 goal (tests/README.md)


def fault_happened(injection: Injection) -> list[str]:
    """What the kernel's own counters (read by the injection around the fault, not by the code
    under test) say went wrong with a limit's fault: the limit did not bite, or its v1 groups
    were left behind."""
    counters = injection.kernel_counters
    least: dict[str, float] = {}
    if injection.kind == "cpu_throttle":
        # Measured: every period throttled (80 of 80 in 8 s).
        least = {"nr_throttled": 0.5 * FAULT_S * 1e6 / THROTTLE_PERIOD_US}
    elif injection.kind == "memory_pressure":
        # Measured in 8 s: 240-340k limit hits, 510-640k pages refaulted, 0.7-1.4 s of stall.
        least = {"limit_hits": 1, "refaults": (WORKING_SET_MIB << 20) // 4096}
        if "memory_stall_us" in counters:  # a kernel with PSI
            least["memory_stall_us"] = 0.01 * FAULT_S * 1e6
    elif injection.kind == "udp_drops":
        least = {"udp_drops": FAULT_S / 0.02}  # at least one drop per burst
    wrong = [
        f"{name} rose {counters.get(name, 0)}, not >= {n:.0f}"
        for name, n in least.items()
        if counters.get(name, 0) < n
    ]
    controller = {"cpu_throttle": "cpu", "memory_pressure": "memory"}.get(injection.kind)
    v1 = None if controller is None else find_v1_mount(controller)
    left = None if v1 is None else v1 / private_base(f"rca-{injection.kind}")
    if left is not None and left.exists():
        wrong.append(f"{left} was left behind")
    return wrong


@pytest.mark.kernel
@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_injected_fault_is_the_top_cause(kernel_ready: None, tmp_path: Path, kind: str) -> None:
    if kind == "packet_loss" and shutil.which("nft") is None:
        pytest.skip("kernel: packet loss needs nftables (nft)")
    # Up to three tries: on this shared 2-core machine an 8 s fault can leave no tail jump at all
    # ("0 incidents"), a neighbour's flood can raise the victim's P99 only 2.5 s in (its rate
    # quadrupled then, 1 run of 5), and a packet loss can be dated 2.6 s early.
    # Each try is a new recording; explain must get one right: the injected fault first, dated
    # within a few intervals (bench_rca_accuracy.py reports the rates over many).
    # A recorder that stopped writing is a failed try too, with what its threads were doing.
    # A limit that did not bite is no try: the injection is broken, and fails at once.
    # memory_pressure was named first in 7 of 11 recordings here (all dated within 0.3 s); the
    # others led with the victim's run-queue wait behind kernel workers of the root cgroup (its
    # reclaim yields to them at cond_resched; kblockd ran 19 ms per 2 s on its CPU; displaced
    # 0 -> 11 ms per interval), with the root's own wait behind the victim, or with PSI io
    # (refault reads count as io too: io rose 0.65-0.75x as much as memory, once 1.3x).
    passed: list[tuple[Report, Injection]] = []

    def injection_try(attempt: int) -> None:
        try:
            injection = run_injection(kind, tmp_path / f"rec{attempt}", FAULT_S, FAULT_S)
        except RecorderStalled as stalled:
            raise AssertionError(str(stalled)) from stalled
        wrong = fault_happened(injection)
        if wrong:
            pytest.fail(f"{kind}: {'; '.join(wrong)} ({injection.kernel_counters})")
        if kind == "udp_drops":  # the drops probe against the socket's own drops column
            recorded = sum(
                c.value
                for d in injection.documents
                for c in d.counters
                if c.name == "packets_dropped" and c.labels.get("cgroup") == injection.victim
            )
            assert recorded == injection.kernel_counters["udp_drops"], injection.kernel_counters
        report = explain_documents(injection.documents, config=ExplainConfig(n_boot=100))
        result = score(report, injection)
        dated = abs(result.time_error_s) <= 3 * INTERVAL_S + 0.5
        assert result.found and dated and result.top1, f"{result}\n{describe_report(report)}"
        passed.append((report, injection))

    run_tries(injection_try, INJECTION_PASS_RATE)
    ((report, injection),) = passed
    # The HTML report carries the incident and its cause.
    page = render_html(report, injection.documents)
    assert 'data-role="incident"' in page and 'data-series="cause"' in page


@pytest.mark.kernel
@pytest.mark.slow
def test_quiet_recording_has_no_incident_of_the_victim(kernel_ready: None, tmp_path: Path) -> None:
    # The goal is no incident in >= 95 % of quiet recordings, so a recording may hold one up to
    # 1 in 20 by design (e.g. the victim's P99 rising 15 -> 26 us, p=0.007, 1.7 events per
    # interval above 25 us), and this VM's hypervisor now and then takes a vCPU (26-40 % of
    # CPU 0 for seconds), when the victim's wait really rises: each failed try says
    # how much a CPU lost to steal (/proc/stat, read by run_quiet, not by the code under test).
    run_tries(lambda attempt: quiet_try(tmp_path / f"rec{attempt}"), QUIET_PASS_RATE)


def quiet_try(directory: Path) -> None:
    """One quiet recording of 16 s: no incident of the victim."""
    injection, steal_share = run_quiet(directory, 16.0)
    report = explain_documents(injection.documents, config=ExplainConfig(n_boot=100))
    result = score(report, injection, tolerance_s=float("inf"))
    disturbed = " (not quiet: put on steal)" if steal_disturbed(result, steal_share) else ""
    assert not result.found, (
        f"steal {steal_share:.1%} of a CPU{disturbed}; {result}\n{describe_report(report)}"
    )
