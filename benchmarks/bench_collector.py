"""Collector cost: CPU time per interval with 100 active cgroups on every catalog probe (synthetic
cumulative snapshots through the real delta / naming / export / record path; the synthetic
reads' own CPU is timed apart and left out), against the same loop with no cgroups; the
per-interval render against prometheus-client rendering the same families; `/metrics` scrape
latency (cached bytes) against rendering per scrape, same server code; one real read of every
probe (root only); and the real agent end to end (root, bcc): every probe attached, N cgroups
each holding a process that makes socket calls, TCP connections and run-queue waits, CPU per
interval of the whole collection (reads, deltas, naming, export) plus its one render, against
the same agent on this host without them (same run).

Usage: bench_collector.py [--quick] [--cgroups N] [--intervals N] [--busy-cgroups N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import numpy as np

from tailsight.cgroups import CgroupResolver
from tailsight.cli.wiring import build_agent, live_verdicts
from tailsight.collector.agent import Agent
from tailsight.collector.config import CollectorConfig
from tailsight.collector.endpoint import MetricsServer
from tailsight.collector.exporter import PrometheusExporter
from tailsight.collector.store.writer import RecordingWriter
from tailsight.hist import NUM_BUCKETS
from tailsight.probes.base import HIST_ROW, HistogramRows, Snapshot, labels
from tailsight.probes.catalog import BPF_PROBES, PROBES, create_probe
from tailsight.probes.symbolizer import shared_symbolizer
from tailsight.testing.workload import Workload, private_base, python_task, socket_task_code


class SyntheticProbe:
    """Cumulative histograms and counters for ``cgroups`` cgroup ids, advanced on every read,
    held as the real probes hold theirs: one block of slot rows (``HistogramRows``)."""

    def __init__(self, name: str, cgroup_ids: list[int], seed: int) -> None:
        self.name = name
        self.keys = [labels(cgroup=i) for i in cgroup_ids]
        self.rng = np.random.default_rng(seed)
        self.rows = np.zeros((len(cgroup_ids), HIST_ROW), dtype=np.int64)
        self.sums_ns = np.zeros(len(cgroup_ids), dtype=np.int64)
        self.counters = {
            (f"{name}_displaced_switches", labels(victim=i, aggressor=0)): 0 for i in cgroup_ids
        }
        self.read_cpu_s = 0.0  # this stand-in's own cost, not the collector's

    def attach(self) -> None:
        pass

    def read(self):  # type: ignore[no-untyped-def]
        began = time.process_time()
        # ~40 distinct buckets per cgroup and interval, mostly below 1 ms, a few in the tail.
        shape = (len(self.keys), 40)
        buckets = np.minimum(self.rng.geometric(0.02, shape), NUM_BUCKETS - 1)
        rows = np.broadcast_to(np.arange(shape[0])[:, None], shape)
        np.add.at(self.rows, (rows, buckets), self.rng.integers(1, 50, shape))
        self.sums_ns += buckets.sum(axis=1) * 5_000
        for key in self.counters:
            self.counters[key] += 3
        histograms = HistogramRows(self.keys, self.rows.copy(), self.sums_ns.tolist())
        snapshot = Snapshot(self.name, time.time_ns(), histograms, dict(self.counters))
        self.read_cpu_s += time.process_time() - began
        return snapshot

    def set_cgroup_filter(self, cgroup_ids: Iterable[int] | None) -> None:
        pass

    def program_fds(self) -> Mapping[str, int]:
        return {}

    def close(self) -> None:
        pass


def tick_cost(
    cgroups: int, intervals: int, root: Path, record: Path | None
) -> tuple[list[float], int, int]:
    """CPU seconds per tick (the synthetic reads' own left out), series exported, bytes
    recorded."""
    ids = [os.stat(root / f"cg{n}").st_ino for n in range(cgroups)]
    config = CollectorConfig(top_k=20)
    probes = {name: SyntheticProbe(name, ids, seed) for seed, name in enumerate(BPF_PROBES)}
    writer = RecordingWriter(record) if record is not None else None
    exporter = PrometheusExporter(config)
    agent = Agent(
        config,
        CgroupResolver(root),
        exporter=exporter,
        writer=writer,
        log=lambda m: None,
        create_probe=probes.__getitem__,
        make_verdicts=live_verdicts,  # as `serve` runs it
    )
    agent.start()
    agent.tick()  # warm the cgroup name cache, as a running agent has
    costs = []
    for _ in range(intervals):
        reads = sum(probe.read_cpu_s for probe in probes.values())
        began = time.process_time()
        document = agent.tick()
        reads = sum(probe.read_cpu_s for probe in probes.values()) - reads
        costs.append(time.process_time() - began - reads)
    agent.close()
    bytes_recorded = writer.bytes_written if writer is not None else 0
    return costs, len(document.series), bytes_recorded


def scrape_latency(render: Callable[[], bytes], scrapes: int) -> tuple[list[float], int]:
    """Wall seconds per GET /metrics over loopback, and the body size."""
    server = MetricsServer(render, "127.0.0.1", 0)
    try:
        times, size = [], 0
        for _ in range(scrapes):
            began = time.perf_counter()
            with urllib.request.urlopen(server.url, timeout=10) as response:
                size = len(response.read())
            times.append(time.perf_counter() - began)
        return times, size
    finally:
        server.close()


def real_reads(reads: int) -> tuple[list[str], float]:
    """``reads`` reads of every catalog probe, each 0.5 s after the one before (the first after
    the baseline read), as a running agent reads it; needs root and bcc.  Report lines (median
    and slowest, wall / CPU) and the sum of the probes' median CPU s.  The slowest holds the
    one-time costs of a process, e.g. bcc loading /proc/kallsyms (~60 ms) at the first outlier
    stack it names."""
    lines = []
    total_cpu = 0.0
    for name in PROBES:
        probe = create_probe(name)
        try:
            probe.attach()
            probe.read()  # the agent's baseline: the first read builds what later ones reuse
            walls, cpus = [], []
            for _ in range(reads):
                time.sleep(0.5)
                wall, cpu = time.perf_counter(), time.process_time()
                snapshot = probe.read()
                walls.append(time.perf_counter() - wall)
                cpus.append(time.process_time() - cpu)
            total_cpu += statistics.median(cpus)
            lines.append(
                f"  {name:<10} read: median {statistics.median(walls) * 1e3:6.2f} ms wall, "
                f"{statistics.median(cpus) * 1e3:6.2f} ms CPU; slowest {max(cpus) * 1e3:6.2f} ms "
                f"CPU ({len(snapshot.histograms)} histograms, {len(snapshot.counters)} counters)"
            )
        except Exception as error:  # a probe this host cannot attach is reported, not fatal
            lines.append(f"  {name:<10} not attached: {' '.join(str(error).split())[:60]}")
        finally:
            probe.close()
    return lines, total_cpu


def agent_cost(intervals: int, interval_s: float) -> tuple[list[float], int, set[str]]:
    """The real agent (every probe, exporter, one render per interval): CPU seconds per
    interval, its symbolizer helper's included, series in the last interval, probes attached."""

    def cpu_s() -> float:
        return time.process_time() + shared_symbolizer().helper_cpu_s()

    agent = build_agent(CollectorConfig(top_k=20, interval_s=interval_s), print, export=True)
    exporter = agent.exporter
    assert exporter is not None
    agent.start()
    try:
        costs, series = [], 0
        for n in range(intervals + 1):
            time.sleep(interval_s)
            began = cpu_s()
            series = len(agent.tick().series)
            exporter.exposition()
            if n:  # the first interval holds the attach; a running agent is past it
                costs.append(cpu_s() - began)
        return costs, series, set(agent.attached)
    finally:
        agent.close()


def loaded_agent_cost(cgroups: int, intervals: int, interval_s: float) -> list[str]:
    """``agent_cost`` without and with ``cgroups`` busy cgroups, as report lines."""
    idle, idle_series, attached = agent_cost(intervals, interval_s)
    # Every probe busy in every cgroup at ~1 CPU in all, so the agent still gets its share.
    code = socket_task_code(spin_s=0.0001, sleep_s=0.02, connect_every=10)
    tasks = [python_task(f"cg{n}", code) for n in range(cgroups)]
    with Workload(tasks, base=private_base("bench-collector")):
        loaded, loaded_series, _ = agent_cost(intervals, interval_s)
    ratio = statistics.median(loaded) / statistics.median(idle)
    return [
        f"real agent ({', '.join(sorted(attached))} attached), {interval_s:g} s intervals, "
        "reads + deltas + naming + export + render:",
        f"  this host, no added cgroups (baseline): {ms(idle)} ({idle_series} series)",
        f"  {cgroups} busy cgroups                  : {ms(loaded)} ({loaded_series} series; "
        f"goal 10 ms)",
        f"  loaded / baseline                      : {ratio:.2f}x",
    ]


def ms(values: list[float]) -> str:
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    # The mean too: the agent's full garbage collection comes once in 60 intervals.
    return (
        f"median {statistics.median(values) * 1e3:7.2f} ms, p90 {p90 * 1e3:7.2f} ms, "
        f"mean {statistics.mean(values) * 1e3:7.2f} ms"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short run for CI")
    parser.add_argument("--cgroups", type=int, default=100)
    parser.add_argument(
        "--busy-cgroups", type=int, default=100, help="busy cgroups for the real agent (0: skip)"
    )
    parser.add_argument("--intervals", type=int, default=None)
    args = parser.parse_args(argv)
    intervals = args.intervals or (10 if args.quick else 60)
    scrapes = 20 if args.quick else 100

    from prometheus_client import generate_latest

    with tempfile.TemporaryDirectory() as temp:
        root = Path(temp) / "cgroup"
        for n in range(args.cgroups):
            (root / f"cg{n}").mkdir(parents=True)
        probes = ", ".join(BPF_PROBES)
        print(f"{args.cgroups} cgroups on each of {len(BPF_PROBES)} probes ({probes}), top-K 20")
        empty, _, _ = tick_cost(0, intervals, root, None)
        export_only, series, _ = tick_cost(args.cgroups, intervals, root, None)
        full, _, recorded = tick_cost(args.cgroups, intervals, root, Path(temp) / "rec")
        print(f"CPU per interval, no cgroups (baseline) : {ms(empty)}")
        print(f"CPU per interval, export only          : {ms(export_only)}")
        print(f"CPU per interval, export + record      : {ms(full)}")
        print(
            f"  {series} series per interval, {recorded / (intervals + 1) / 1024:.0f} KiB "
            f"recorded per interval (fsync included)"
        )

        # The scraped exporter holds what a running agent holds after a few intervals.
        exporter = PrometheusExporter(CollectorConfig(top_k=20))
        ids = [os.stat(root / f"cg{n}").st_ino for n in range(args.cgroups)]
        fakes = {name: SyntheticProbe(name, ids, seed) for seed, name in enumerate(BPF_PROBES)}
        agent = Agent(
            CollectorConfig(top_k=20),
            CgroupResolver(root),
            exporter=exporter,
            log=lambda m: None,
            create_probe=fakes.__getitem__,
            make_verdicts=live_verdicts,  # as `serve` runs it
        )
        agent.start()
        renders, client_renders = [], []
        registry = exporter.register()
        for _ in range(max(5, intervals)):
            agent.tick()
            began = time.perf_counter()
            exporter.exposition()  # the one render of this interval
            renders.append(time.perf_counter() - began)
            began = time.perf_counter()
            generate_latest(registry)  # the same families through prometheus-client
            client_renders.append(time.perf_counter() - began)
        print(f"render, prometheus-client (baseline)  : {ms(client_renders)}")
        print(f"render once per interval (served)     : {ms(renders)}")
        ratio = statistics.median(renders) / statistics.median(client_renders)
        print(f"  own render / prometheus-client render: {ratio:.2f}x")
        baseline_times, baseline_size = scrape_latency(lambda: generate_latest(registry), scrapes)
        ours_times, ours_size = scrape_latency(exporter.exposition, scrapes)
        print(f"/metrics, render per scrape (baseline) : {ms(baseline_times)}, {baseline_size:,} B")
        print(
            f"/metrics, {args.cgroups} cgroups, top-K 20, cached: {ms(ours_times)}, {ours_size:,} B"
        )
        ratio = statistics.median(ours_times) / statistics.median(baseline_times)
        print(f"  cached scrape / render-per-scrape    : {ratio:.2f}x")

    if os.geteuid() != 0:
        print("real probe reads: skipped (needs root for BPF)")
        return 0
    try:
        import bcc  # noqa: F401
    except ImportError:
        print("real probe reads: skipped (bcc not importable)")
        return 0
    reads = 3 if args.quick else 9
    print(f"real probe reads ({reads} each, 0.5 s apart, after the baseline read):")
    lines, reads_cpu = real_reads(reads)
    for line in lines:
        print(line)
    print(
        f"CPU per interval, export + this host's real reads: "
        f"{(statistics.median(export_only) + reads_cpu) * 1e3:.2f} ms "
        f"({statistics.median(export_only) * 1e3:.2f} + {reads_cpu * 1e3:.2f}; goal 10 ms)"
    )
    if args.busy_cgroups:
        for line in loaded_agent_cost(args.busy_cgroups, 3 if args.quick else 10, 1.0):
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
