"""The inference stage as a noisy neighbour: the trading system replays a day with its CPUs
pinned apart, recorded by `tailsight record`; a first run without inference, a second with
the default model, whose worker inherits the trading CPU. Ground truth: when the worker
started (and when it began scoring beside the feed). `explain` on the recording must put the
inference cgroup first as what displaced the trading process's run-queue wait, dated within a
few intervals of a start.

The trading CPU holds the trading process, then its worker, and nothing else the test starts:
the recorder (``inject.recording`` keeps it off ``inject.CPU``), the exchange and this test run
on the other CPUs. With the recorder (nice -10, symbolizing the worker's stacks) on the trading
CPU, the worker's load can take 38 s instead of ~6 s, the recorder's intervals stretch to 8-14 s
over the second run, and the trading process's own jump is not found (only that of /).

A recording whose trading jump is dated more than an interval before the worker started is
void (foreign work on the trading CPU, which a shared development machine can have) and counts
as a miss; a pass needs one recording whose explain names the worker first, within the tries
tests/statistical.py gives the stated per-recording rate."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tailsight.analysis.explain.model import Report
from tailsight.analysis.explain.pipeline import explain_documents
from tailsight.analysis.explain.text import describe_report
from tailsight.cli.demo import fast_forward_off_hours
from tailsight.collector.store.reader import Recording
from tailsight.intervals import HistDocument
from tailsight.testing.inject import CPU, INTERVAL_S, Injection, recording, score
from tailsight.testing.workload import private_base
from tailsight.trading_core.netns import topology, unique_topology
from tailsight.trading_core.replay import (
    Placement,
    ReplayConfig,
    ReplaySystem,
    TickFile,
    load_ticks,
    speed_for_duration,
)
from tests.statistical import run_tries

pytestmark = [pytest.mark.kernel, pytest.mark.slow]

RUN_S = 15.0  # each run: a before window and an after window of the explain's 30 intervals
NEIGHBOUR_PASS_RATE = 0.9  # per recording: the goal, and measured (tests/README.md)


def _run_queue_table(documents: list[HistDocument], start_ns: int) -> str:
    """Per interval, events and P99 of each cgroup's run-queue wait (for a failure's message)."""
    names = sorted(
        {
            s.labels["cgroup"]
            for d in documents
            for s in d.series
            if s.labels.get("probe") == "runqueue" and set(s.labels) == {"cgroup", "probe"}
        }
    )
    lines = ["t_s " + " ".join(f"{n.rsplit('/', 1)[-1] or '/':>18}" for n in names)]
    for document in documents:
        cells = []
        for name in names:
            found = document.find(probe="runqueue", cgroup=name)
            hist = next((s.hist for s in found if len(s.labels) == 2), None)
            count = hist.count if hist is not None else 0
            p99_us = hist.quantile(0.99) / 1e3 if count else 0.0
            cells.append(f"{count:>8} {p99_us:>7.0f}us")
        lines.append(f"{(document.start_ns - start_ns) / 1e9:5.1f} " + " ".join(cells))
    return "\n".join(lines)


@dataclass(frozen=True)
class _Outcome:
    base: str
    documents: list[HistDocument]
    report: Report
    worker_start_ns: int
    scoring_start_ns: int

    @property
    def victim(self) -> str:
        return f"/{self.base}/trading"

    def disturbed(self) -> bool:
        """The trading process's run-queue jump dated more than an interval before the worker
        existed: not the worker's doing, but foreign work on the trading CPU (on a shared
        machine, another job's). The trading process is idle while the model loads, so its
        tail is flat from such a disturbance to the scoring and the change is dated at it."""
        for incident in self.report.incidents:
            for jump in incident.jumps:
                if jump.labels == {"cgroup": self.victim, "probe": "runqueue"}:
                    return jump.change_start_ns < self.worker_start_ns - INTERVAL_S * 1e9
        return False

    def text(self) -> str:
        first_ns = self.documents[0].start_ns
        return (
            f"{describe_report(self.report)}\nworker started at "
            f"{(self.worker_start_ns - first_ns) / 1e9:.1f} s, scoring from "
            f"{(self.scoring_start_ns - first_ns) / 1e9:.1f} s\n"
            f"{_run_queue_table(self.documents, first_ns)}"
        )


def _scenario(directory: Path, ticks: TickFile, speed: float, tag: str) -> _Outcome:
    """One recording: a run without inference, then one with it (the worker on the trading
    CPU), and explain's report on it."""
    others = frozenset(os.sched_getaffinity(0)) - {CPU}
    base = private_base(tag)
    placement = Placement({"exchange": others, "trading": frozenset({CPU})})
    quiet = ReplayConfig(path="udp", speed=speed, act_share=0.25)
    with_inference = ReplayConfig(
        path="udp", speed=speed, act_share=0.25, inference_model="smollm2"
    )
    affinity = os.sched_getaffinity(0)
    with contextlib.ExitStack() as stack:
        # This test's own process (and what it forks before pinning) off the trading CPU.
        os.sched_setaffinity(0, others)
        stack.callback(os.sched_setaffinity, 0, affinity)
        topo = stack.enter_context(topology(unique_topology("infnb")))
        system = stack.enter_context(
            ReplaySystem(ticks, topo, ["udp"], placement, cgroup_base=base)
        )
        system.start()
        with recording(directory / "rec"):
            before = system.run(quiet)
            worker_start_ns = time.time_ns()  # the run starts the worker, which loads the model
            after = system.run(with_inference)
    # Broken premises, not misses: they fail the test at once instead of another try.
    if not (before.complete and after.complete):
        pytest.fail(f"a run did not complete: {before.complete=} {after.complete=}")
    # The model's series are in the second run's document only.
    if not after.document.find(stage="inference_prefill") or before.document.find(
        stage="inference_prefill"
    ):
        pytest.fail("the inference_prefill stage is not in the second run's document only")
    # The first interval holds the events since the first probe attached (see inject.py).
    documents = Recording(directory / "rec").documents()[1:]
    report = explain_documents(documents)
    return _Outcome(base, documents, report, worker_start_ns, after.document.start_ns)


def test_explain_names_the_inference_worker_on_the_feeds_cpu(
    kernel_ready: None, tmp_path: Path
) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2 or CPU not in cpus:
        pytest.skip(f"kernel: needs two CPUs, CPU {CPU} among them (trading and exchange apart)")
    day = tmp_path / "day.itch"
    subprocess.run(
        [str(Path(sys.executable).with_name("tailsight")), "itch", "generate", str(day),
         "--messages", "20000"],
        check=True, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    ticks = fast_forward_off_hours(load_ticks(day))
    speed = speed_for_duration(ticks.timestamps_ns, RUN_S)
    # The accuracy goal is 90 % top-1, so a recording misses up to 1 in 10 by design (e.g. the
    # jump dated 2.3 s after scoring began, beyond the 2 s tolerance, or the worker ranked second
    # after a syscall_errors cause). A recording disturbed before the worker started is a
    # miss too.
    run_tries(
        lambda attempt: neighbour_try(
            tmp_path / f"rec{attempt}", ticks, speed, f"inference-neighbour-{attempt}"
        ),
        NEIGHBOUR_PASS_RATE,
    )


def neighbour_try(directory: Path, ticks: TickFile, speed: float, tag: str) -> None:
    """One recording whose explain names the worker first at the trading's jump."""
    outcome = _scenario(directory, ticks, speed, tag)
    text = outcome.text()
    assert not outcome.disturbed(), f"disturbed before the worker started:\n{text}"
    # It starts twice: loading the model (seconds of CPU on the trading CPU, while the trading
    # process readies the run), then scoring beside the feed once the run goes. The trading's
    # wait is found rising at one of them (which one varies from run to run); that incident's
    # causes of the trading's own wait must name the worker first. Other cgroups' jumps in the
    # same incident (/, whose kernel threads the worker also displaces) have causes of their own.
    results = [
        score(
            outcome.report,
            Injection("cpu_hog", outcome.documents, start_ns, outcome.victim,
                      f"/{outcome.base}/inference", ("displacement",)),
            tolerance_s=3 * INTERVAL_S + 0.5,
            own_causes=True,
        )
        for start_ns in (outcome.worker_start_ns, outcome.scoring_start_ns)
    ]  # fmt: skip
    found = [r for r in results if r.found]
    assert found and all(r.top1 for r in found), f"{found or results}\n{text}"
