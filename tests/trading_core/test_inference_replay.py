"""``replay --inference``: the real SmolLM2 signal stage inside a real replay (namespaces, XDP,
strategy, gateway). Ground truth: the exchange's account view still reconciles, and the stage's
own counters (requests, results, stale/fresh reads) match its histograms' counts."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tailsight.cli.main import app
from tailsight.intervals import HistDocument
from tailsight.trading_core.inference.stage import STAGES
from tailsight.trading_core.market import write_day
from tailsight.trading_core.netns import Topology, topology, unique_topology
from tailsight.trading_core.replay import ReplayConfig, ReplaySystem, load_ticks, speed_for_duration


@pytest.fixture(scope="module")
def day(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("replay-inference") / "day.itch"
    write_day(path, seed=7, symbols=4, messages=4001)
    return path


@pytest.fixture(scope="module")
def topo(kernel_ready: None) -> Iterator[Topology]:
    with topology(unique_topology("replay-inf")) as up:
        yield up


@pytest.mark.kernel
@pytest.mark.slow
def test_replay_with_the_inference_stage_records_its_series(day: Path, topo: Topology) -> None:
    ticks = load_ticks(day)
    speed = speed_for_duration(ticks.timestamps_ns, 8.0)  # the model needs ~1 s a signal
    with ReplaySystem(ticks, topo, ["udp"]) as system:
        result = system.run(ReplayConfig(path="udp", speed=speed, inference_model="smollm2"))
    counters = result.counters
    assert result.complete and counters["reconcile_differences"] == 0, counters
    document = HistDocument.loads(result.document.dumps())
    inference = {s.labels["stage"]: s for s in document.series if "model" in s.labels}
    assert set(inference) == set(STAGES)
    for series in inference.values():
        assert series.labels["model"] == "SmolLM2-135M-Instruct.Q4_1"
        assert series.labels["probe"] == "replay" and series.labels["path"] == "udp"
    stage_counters = {c.name: c.value for c in document.counters if "model" in c.labels}
    assert stage_counters["inference_requests"] > 0
    assert stage_counters["inference_results"] > 0
    for name in ("inference_queue_wait", "inference_prefill", "inference_decode"):
        assert inference[name].hist.count == stage_counters["inference_results"]
    reads = stage_counters["signal_fresh"] + stage_counters["signal_stale"]
    assert inference["signal_age"].hist.count == reads


def test_replay_inference_with_a_missing_model_is_exit_2(day: Path) -> None:
    result = CliRunner().invoke(
        app, ["replay", str(day), "--inference", "--model", "/nonexistent/model.gguf"]
    )
    assert result.exit_code == 2
    assert "no such file" in result.output and "Traceback" not in result.output
