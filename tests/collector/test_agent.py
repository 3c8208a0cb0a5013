"""The collector loop with scripted fake probes (cumulative maps from known samples), and one
kernel test: `tailsight serve --record` under SIGTERM detaches and flushes the last interval."""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from tailsight.collector.agent import Agent, as_snapshot
from tailsight.collector.cgroups import CgroupResolver
from tailsight.collector.config import CollectorConfig
from tailsight.collector.exporter import PrometheusExporter
from tailsight.collector.store import Recording, RecordingWriter
from tailsight.hist import Histogram
from tailsight.probes.base import Snapshot, labels
from tailsight.probes.loader import ProbeError


class FakeProbe:
    """Cumulative histograms per cgroup id; each read() first adds the next scripted samples."""

    def __init__(self, name: str, script: list[dict[int, np.ndarray]], fail: str | None = None):
        self.name = name
        self.script = list(script)
        self.fail = fail
        self.state: dict[int, Histogram] = {}
        self.drops = 0
        self.closed = 0
        self.reads = 0

    def attach(self) -> None:
        if self.fail:
            raise ProbeError(self.fail)

    def read(self) -> Snapshot:
        if self.reads and self.script:
            for cgroup_id, samples in self.script.pop(0).items():
                hist = self.state.get(cgroup_id, Histogram.empty())
                self.state[cgroup_id] = hist.merge(Histogram.from_samples(samples))
            self.drops += 1
        self.reads += 1
        histograms = {labels(cgroup=i): h.copy() for i, h in self.state.items()}
        counters = {(f"{self.name}_dropped_events", labels(reason="full")): self.drops}
        return Snapshot(self.name, time.time_ns(), histograms, counters)

    def set_cgroup_filter(self, cgroup_ids: Iterable[int] | None) -> None:
        pass

    def program_fds(self) -> Mapping[str, int]:
        return {"on_event": 1}

    def close(self) -> None:
        self.closed += 1


@pytest.fixture
def tree(tmp_path: Path) -> tuple[CgroupResolver, dict[str, int]]:
    root = tmp_path / "cg"
    for name in ("a", "b"):
        (root / name).mkdir(parents=True)
    ids = {f"/{n}": os.stat(root / n).st_ino for n in ("a", "b")}
    return CgroupResolver(root), ids


def script(ids: dict[str, int], n: int, seed: int) -> list[dict[int, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        {ids["/a"]: rng.integers(0, 10**6, 50), ids["/b"]: rng.integers(0, 10**5, 7)}
        for _ in range(n)
    ]


def test_ticks_are_exact_contiguous_intervals(
    tree: tuple[CgroupResolver, dict[str, int]], tmp_path: Path
) -> None:
    resolver, ids = tree
    steps = script(ids, 4, seed=1)
    fakes = {
        "runqueue": FakeProbe("runqueue", steps),
        "broken": FakeProbe("broken", [], fail="attach failed: EPERM"),
    }
    config = CollectorConfig(probes=("runqueue", "broken"), record_dir=tmp_path / "rec")
    exporter = PrometheusExporter(config)
    agent = Agent(
        config,
        resolver,
        exporter=exporter,
        writer=RecordingWriter(tmp_path / "rec"),
        log=lambda message: None,
        create_probe=fakes.__getitem__,
    )
    agent.start()
    assert sorted(agent.attached) == ["runqueue"]
    assert exporter.probes["broken"].attached is False
    assert "EPERM" in exporter.probes["broken"].reason
    assert fakes["broken"].closed == 1
    docs = [agent.tick() for _ in range(4)]
    agent.close()
    assert fakes["runqueue"].closed == 1
    for step, doc in zip(steps, docs, strict=True):
        for path, cgroup_id in ids.items():
            (series,) = doc.find(probe="runqueue", cgroup=path)
            assert series.hist == Histogram.from_samples(step[cgroup_id])
        (dropped,) = [c for c in doc.counters if c.name == "runqueue_dropped_events"]
        assert dropped.value == 1
    assert all(later.start_ns == earlier.end_ns for earlier, later in itertools.pairwise(docs))
    recorded = Recording(tmp_path / "rec").documents()
    assert [d.dumps() for d in recorded] == [d.dumps() for d in docs]
    total_a = sum(len(step[ids["/a"]]) for step in steps)
    assert exporter.intervals == 4
    (slot,) = [v for (_, key), v in exporter._cumulative.items() if ("cgroup", "/a") in key]
    assert int(slot.coarse.sum()) == total_a


def test_counter_reset_skips_one_interval(tree: tuple[CgroupResolver, dict[str, int]]) -> None:
    resolver, ids = tree
    probe = FakeProbe("runqueue", script(ids, 3, seed=2))
    messages: list[str] = []
    agent = Agent(CollectorConfig(), resolver, log=messages.append, create_probe=lambda name: probe)
    agent.config = CollectorConfig(probes=("runqueue",))
    agent.start()
    agent.tick()
    probe.state = {}  # the maps were recreated: cumulative values went down
    doc = agent.tick()
    assert doc.series == []
    assert agent.statuses["runqueue"].read_errors == 1
    assert any("reset" in m for m in messages)
    assert agent.tick().series  # counting resumes from the new baseline


def test_run_stops_on_event_and_emits_the_last_interval(
    tree: tuple[CgroupResolver, dict[str, int]],
) -> None:
    resolver, ids = tree
    probe = FakeProbe("runqueue", script(ids, 100, seed=3))
    agent = Agent(
        CollectorConfig(probes=("runqueue",), interval_s=0.1),
        resolver,
        log=lambda m: None,
        create_probe=lambda name: probe,
    )
    agent.start()
    stop = threading.Event()
    timer = threading.Timer(0.55, stop.set)
    timer.start()
    began = time.monotonic()
    agent.run(stop)
    assert time.monotonic() - began < 2
    assert 4 <= agent.intervals <= 7  # ~5 on schedule plus the final partial one
    agent.close()
    agent.close()
    assert probe.closed == 1


@dataclass
class _Pair:
    wait_ns: int
    switches: int


@dataclass
class _LegacySnapshot:
    taken_ns: int
    wait: dict[int, Histogram]
    displaced: dict[tuple[int, int], _Pair]
    dropped: dict[str, int]


def test_as_snapshot_converts_the_old_runqueue_snapshot() -> None:
    hist = Histogram.from_samples(np.array([1, 2, 3]))
    legacy = _LegacySnapshot(5, {7: hist}, {(7, 0): _Pair(100, 2)}, {"hist_full": 4})
    snapshot = as_snapshot("runqueue", legacy)
    assert snapshot.histograms == {labels(cgroup=7): hist}
    assert snapshot.counters == {
        ("runqueue_displaced_wait_ns", labels(victim=7, aggressor=0)): 100,
        ("runqueue_displaced_switches", labels(victim=7, aggressor=0)): 2,
        ("runqueue_dropped_events", labels(reason="hist_full")): 4,
    }
    assert as_snapshot("runqueue", snapshot) is snapshot


def free_port() -> int:
    with contextlib.closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.kernel
@pytest.mark.slow
def test_serve_sigterm_detaches_and_flushes(kernel_ready: None, tmp_path: Path) -> None:
    port = free_port()
    record_dir = tmp_path / "rec"
    command = [str(Path(sys.executable).with_name("tailsight"))]
    argv = ["serve", "--probe", "runqueue", "--listen", f"127.0.0.1:{port}"]
    argv += ["--record", str(record_dir), "--interval", "0.5"]
    proc = subprocess.Popen([*command, *argv], stderr=subprocess.PIPE, text=True)
    try:
        body = ""
        deadline = time.monotonic() + 30
        while "tailsight_runqueue_wait_seconds_count" not in body:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "no runqueue series on /metrics"
            time.sleep(0.3)
            with contextlib.suppress(OSError):
                url = f"http://127.0.0.1:{port}/metrics"
                body = urllib.request.urlopen(url, timeout=5).read().decode()
        assert 'tailsight_probe_attached{probe="runqueue",reason=""} 1.0' in body
        assert "tailsight_bpf_stats_enabled 1.0" in body
        time.sleep(0.8)
        signalled_ns = time.time_ns()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr:
            proc.stderr.close()
    docs = Recording(record_dir).documents()
    assert len(docs) >= 2
    assert all(b.start_ns == a.end_ns for a, b in itertools.pairwise(docs))
    assert docs[-1].end_ns >= signalled_ns  # the partial interval after SIGTERM was written
    with pytest.raises(OSError):  # the endpoint is gone
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)
