"""The inference stage as a noisy neighbour (issue 13, item 6): the trading system replays a
day with its CPUs pinned apart (exchange on one, trading on the other), recorded by
`tailsight record`; a first run without inference, a second with the default model, whose worker
inherits the trading CPU. Ground truth: when the worker started (and when it began scoring beside
the feed). `explain` on the recording must put the inference cgroup first as what displaced the
trading process's run-queue wait, dated within a few intervals of a start.

Opt-in (not collected by `make test`): it passed 3 of 3 runs here by hand, but in one CI run
the trading process's own jump was not detected (only that of /, which the worker displaced
too). Run it with `pytest tests/trading_core/check_inference_neighbour.py`."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tailsight.analysis.explain import explain_documents
from tailsight.analysis.inject import INTERVAL_S, Injection, recording, score
from tailsight.collector.store import Recording
from tailsight.demo import fast_forward_off_hours
from tailsight.trading_core.netns import topology, unique_topology
from tailsight.trading_core.replay import (
    Placement,
    ReplayConfig,
    ReplaySystem,
    load_ticks,
    speed_for_duration,
)
from tailsight.workload import private_base

pytestmark = [pytest.mark.kernel, pytest.mark.slow]

RUN_S = 15.0  # each run: a before window and an after window of the explain's 30 intervals


def test_explain_names_the_inference_worker_on_the_feeds_cpu(
    kernel_ready: None, tmp_path: Path
) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("kernel: needs two CPUs (exchange and trading pinned apart)")
    day = tmp_path / "day.itch"
    subprocess.run(
        [str(Path(sys.executable).with_name("tailsight")), "itch", "generate", str(day),
         "--messages", "20000"],
        check=True, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    ticks = fast_forward_off_hours(load_ticks(day))
    speed = speed_for_duration(ticks.timestamps_ns, RUN_S)
    base = private_base("inference-neighbour")
    placement = Placement({"exchange": frozenset(cpus[:1]), "trading": frozenset(cpus[1:2])})
    quiet = ReplayConfig(path="udp", speed=speed, act_share=0.25)
    with_inference = ReplayConfig(
        path="udp", speed=speed, act_share=0.25, inference_model="smollm2"
    )
    with (
        topology(unique_topology("infnb")) as topo,
        ReplaySystem(ticks, topo, ["udp"], placement, cgroup_base=base) as system,
    ):
        system.start()
        with recording(tmp_path / "rec"):
            before = system.run(quiet)
            worker_start_ns = time.time_ns()  # the run starts the worker, which loads the model
            after = system.run(with_inference)
    assert before.complete and after.complete
    # The model's series are in the second run's document only.
    assert after.document.find(stage="inference_prefill")
    assert not before.document.find(stage="inference_prefill")
    # The first interval holds the events since the first probe attached (see inject.py).
    documents = Recording(tmp_path / "rec").documents()[1:]
    report = explain_documents(documents)
    text = report.render_text()
    # It starts twice: loading the model (seconds of CPU on the trading CPU, while the trading
    # process readies the run), then scoring beside the feed once the run goes. The trading's
    # wait is found rising at one of them (which one varies from run to run); that incident's
    # causes of the trading's own wait must name the worker first. Other cgroups' jumps in the
    # same incident (/, whose kernel threads the worker also displaces) have causes of their own.
    results = [
        score(
            report,
            Injection("cpu_hog", documents, start_ns, f"/{base}/trading", f"/{base}/inference",
                      ("displacement",)),
            tolerance_s=3 * INTERVAL_S + 0.5,
            own_causes=True,
        )
        for start_ns in (worker_start_ns, after.document.start_ns)
    ]  # fmt: skip
    found = [r for r in results if r.found]
    assert found, text
    assert all(r.top1 for r in found), (found, text)
