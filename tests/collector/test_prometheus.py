"""End to end with a real Prometheus scraping the collector every second: after a known CPU
contention workload, Prometheus' histogram_quantile over the exported buckets agrees with the P99
numpy takes from the full-resolution recording (within the coarse bucket holding it), counts and
counters agree exactly, and 200 short-lived cgroups do not grow the series count past K + 1."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from tailsight.cli.wiring import build_agent
from tailsight.collector.agent import Agent
from tailsight.collector.config import CollectorConfig
from tailsight.collector.endpoint import MetricsServer
from tailsight.collector.exporter import COARSE_BOUNDS_NS
from tailsight.collector.store.reader import Recording
from tailsight.hist import NUM_BUCKETS, bucket_lower_bounds_ns, bucket_upper_bounds_ns
from tailsight.testing.workload import (
    Task,
    Workload,
    contention,
    default_cpu,
    private_base,
    rmdir_retrying,
)
from tests.prometheus_server import PROMETHEUS, Prometheus, free_port, prometheus_scraping
from tests.statistical import run_tries

K = 4
CHURN_PASS_RATE = 0.9  # per try of the churn test: estimated (tests/README.md)

pytestmark = [pytest.mark.kernel, pytest.mark.slow]


@dataclass
class Collector:
    agent: Agent
    server: MetricsServer
    stop: threading.Event
    thread: threading.Thread

    def freeze(self) -> None:
        """Stop ticking (the final interval is emitted); /metrics keeps serving that state."""
        self.stop.set()
        self.thread.join(timeout=30)


@contextlib.contextmanager
def collector(config: CollectorConfig) -> Iterator[Collector]:
    agent = build_agent(config, log=lambda message: None, export=True)
    assert agent.exporter is not None
    agent.start()
    assert "runqueue" in agent.attached, agent.statuses
    server = MetricsServer(agent.exporter.exposition, config.address, config.port)
    stop = threading.Event()
    thread = threading.Thread(target=agent.run, args=(stop,), daemon=True)
    thread.start()
    try:
        yield Collector(agent, server, stop, thread)
    finally:
        stop.set()
        thread.join(timeout=30)
        server.close()
        agent.close()


def wait_for_scrape_of(
    prometheus: Prometheus, agent: Agent, timeout_s: float = 30, final: bool = True
) -> None:
    """Until Prometheus holds a scrape taken after the agent's last interval (``final``: the
    agent has stopped ticking), or any scrape with at least one interval."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        intervals = agent.exporter.intervals if agent.exporter else 0
        result = prometheus.query("tailsight_intervals_total")
        scraped = float(result[0]["value"][1]) if result else -1
        if (final and scraped == intervals) or (not final and scraped >= 1):
            time.sleep(1.2)  # and one more scrape, so the instant query sees the final state
            return
        time.sleep(0.3)
    raise AssertionError("prometheus never scraped the final state")


def test_prometheus_agrees_with_the_recording(kernel_ready: None, tmp_path: Path) -> None:
    if not Path(PROMETHEUS).exists():
        pytest.skip("kernel: /usr/bin/prometheus missing (run `make setup`)")
    base = private_base("prom")
    port = free_port()
    config = CollectorConfig(
        probes=("runqueue",),
        interval_s=0.5,
        port=port,
        quantile_windows_s=(5.0,),
        cgroup_allow=(rf"/{re.escape(base)}/.*",),
        top_k=K,
        record_dir=tmp_path / "rec",
    )
    with (
        collector(config) as running,
        prometheus_scraping({"tailsight": [f"127.0.0.1:{port}"]}, tmp_path) as prometheus,
        contention(base=base) as workload,
    ):
        time.sleep(5)
        running.freeze()
        victim = workload.cgroup_path("victim")
        wait_for_scrape_of(prometheus, running.agent)
        assert prometheus.scalar('up{job="tailsight"}') == 1
        recording = Recording(config.record_dir)  # type: ignore[arg-type]
        (series,) = recording.series(labels={"probe": "runqueue", "cgroup": victim})
        counts = series.counts.sum(axis=0)
        total = int(counts.sum())
        assert total > 100

        selector = f'{{cgroup="{victim}"}}'
        exported = prometheus.scalar(f"tailsight_runqueue_wait_seconds_count{selector}")
        assert exported == total
        fine_cumulative = np.cumsum(counts[:NUM_BUCKETS])
        uppers = bucket_upper_bounds_ns()
        for bound_ns in COARSE_BOUNDS_NS:
            le = f'{{cgroup="{victim}",le="{bound_ns / 1e9!r}"}}'
            in_le = prometheus.scalar(f"tailsight_runqueue_wait_seconds_bucket{le}")
            assert in_le == fine_cumulative[np.searchsorted(uppers, bound_ns)]

        # numpy's P99 from full resolution: the fine bucket holding rank 0.99 * total.
        fine = int(np.searchsorted(fine_cumulative, 0.99 * total, side="left"))
        true_low, true_high = int(bucket_lower_bounds_ns()[fine]), int(uppers[fine])
        coarse = int(np.searchsorted(COARSE_BOUNDS_NS, true_high, side="left"))
        coarse_low = 0 if coarse == 0 else COARSE_BOUNDS_NS[coarse - 1]
        coarse_high = COARSE_BOUNDS_NS[coarse]
        assert coarse_low <= true_low and true_high <= coarse_high
        p99_s = prometheus.scalar(
            f"histogram_quantile(0.99, tailsight_runqueue_wait_seconds_bucket{selector})"
        )
        assert coarse_low <= p99_s * 1e9 <= coarse_high, (p99_s, coarse_low, coarse_high)

        # Everything, folded or not, adds up to the recording's total; counters exactly too.
        everything = sum(
            int(s.counts.sum()) for s in recording.series(labels={"probe": "runqueue"})
        )
        assert prometheus.scalar("sum(tailsight_runqueue_wait_seconds_count)") == everything
        switches = sum(
            int(c.values.sum())
            for c in recording.counters(labels={"probe": "runqueue", "victim": victim})
            if c.name == "runqueue_displaced_switches"
        )
        exported_switches = prometheus.scalar(
            f'sum(tailsight_runqueue_displaced_switches_total{{victim="{victim}"}})'
        )
        assert exported_switches == switches > 0


def _short_lived(directory: Path, cpu: int) -> subprocess.Popen[bytes]:
    """A shell that moves itself into ``directory`` and spins briefly (dash starts in ~1 ms)."""
    script = (
        f"echo $$ > {directory}/cgroup.procs && i=0; while [ $i -lt 4000 ]; do i=$((i+1)); done"
    )
    proc = subprocess.Popen(["/bin/sh", "-c", script], stdin=subprocess.DEVNULL)
    with contextlib.suppress(ProcessLookupError):
        os.sched_setaffinity(proc.pid, {cpu})
    return proc


def test_cardinality_bounded_under_cgroup_churn(kernel_ready: None, tmp_path: Path) -> None:
    if not Path(PROMETHEUS).exists():
        pytest.skip("kernel: /usr/bin/prometheus missing (run `make setup`)")
    run_tries(lambda attempt: _churn_try(tmp_path / f"try{attempt}"), CHURN_PASS_RATE)


def _churn_try(tmp_path: Path) -> None:
    """One collector and Prometheus under 200 short-lived cgroups: at most K + 1 named."""
    tmp_path.mkdir()
    base = private_base("churn")
    port = free_port()
    config = CollectorConfig(
        probes=("runqueue",),
        interval_s=0.5,
        port=port,
        quantile_windows_s=(2.0,),
        cgroup_allow=(rf"/{re.escape(base)}/.*",),
        top_k=K,
    )
    cpu = default_cpu()
    # A steady spinner on the same CPU, so the short-lived ones wait on its run queue.
    steady = Workload([Task("steady", cpu=cpu)], base=base)
    # Per labelled cgroup: le buckets + _count + _sum, 4 quantiles x 2 windows, outlier events.
    per_cgroup = 22 + 2 + 4 * 2 + 1
    pairs = 2 * (K + 2) * (K + 3)  # displaced wait + switches per (victim, aggressor)
    seen_cgroups: set[str] = set()
    with (
        collector(config) as running,
        prometheus_scraping({"tailsight": [f"127.0.0.1:{port}"]}, tmp_path) as prometheus,
        steady,
    ):
        wait_for_scrape_of(prometheus, running.agent, final=False)
        churn_root = steady.mount / base / "churn"
        churn_root.mkdir()
        try:
            fixed = None
            checks = 0
            last_check = time.monotonic()
            previous: list[Path] = []
            churn_began = time.monotonic()
            for batch in range(10):
                # Pace the batches (at least 5 s in all): cgroups live across agent intervals
                # and Prometheus scrapes, and the series count is checked several times.
                time.sleep(max(0.0, churn_began + 0.5 * batch - time.monotonic()))
                dirs = [churn_root / f"{batch}-{n}" for n in range(20)]
                for directory in dirs:
                    directory.mkdir()
                procs = [_short_lived(directory, cpu) for directory in dirs]
                for proc in procs:
                    proc.wait(timeout=30)
                # Each batch's cgroups outlive the next batch, so some get read while they exist.
                for directory in previous:
                    rmdir_retrying(directory, timeout_s=5)
                previous = dirs
                if time.monotonic() - last_check >= 1.0:
                    last_check = time.monotonic()
                    checks += 1
                    labelled = prometheus.query(
                        "count by (cgroup) (tailsight_runqueue_wait_seconds_count)"
                    )
                    seen_cgroups.update(r["metric"].get("cgroup", "") for r in labelled)
                    assert len(labelled) <= K + 1
                    for label in ("cgroup", "victim", "aggressor"):
                        values = prometheus.query(
                            f'count by ({label}) ({{__name__=~"tailsight_.+"}})'
                        )
                        named = {r["metric"].get(label, "") for r in values} - {"", "idle"}
                        assert len(named) <= K + 1, (label, named)
                    if fixed is None:
                        fixed = prometheus.scalar(
                            'count({__name__=~"tailsight_.+",cgroup="",victim=""})'
                        )
                    total = prometheus.scalar('count({__name__=~"tailsight_.+"})')
                    assert total <= fixed + per_cgroup * (K + 1) + pairs, (total, fixed)
        finally:
            for directory in [d for d in churn_root.iterdir() if d.is_dir()]:
                with contextlib.suppress(OSError):
                    rmdir_retrying(directory, timeout_s=5)
            rmdir_retrying(churn_root, timeout_s=5)
        assert checks >= 2, f"{checks} checks in {time.monotonic() - churn_began:.1f} s"
        running.freeze()
        wait_for_scrape_of(prometheus, running.agent)
        labelled = prometheus.query("count by (cgroup) (tailsight_runqueue_wait_seconds_count)")
        assert len(labelled) <= K + 1
        # The churn reached the exporter: many cgroups competed for the K labels.
        folded = prometheus.scalar("max_over_time(tailsight_cgroups_folded[5m])")
        assert folded >= 10, (folded, seen_cgroups)
