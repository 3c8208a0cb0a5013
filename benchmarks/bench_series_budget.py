"""Series budget of one host at the default top-K (20 cgroups per probe): every probe attached
for real, the series counted in the real exporter's exposition, first with this host's own
cgroups (baseline), then with top-K + 10 busy cgroups (UDP syscalls, TCP connects, run-queue
contention and migrations in each), so every probe's top-K is full; then what that means at a
scrape interval of 15 s and for 1,000 hosts (README, "Budget at scale").

Bytes per sample from a real Prometheus TSDB: every exposition of the busy phase (one per
1 s interval) is written as OpenMetrics with timestamps 15 s apart, as 15 s scrapes would store
them, and `promtool tsdb create-blocks-from openmetrics` builds a TSDB block of it; its chunk
bytes over its sample count are set beside the Prometheus documentation's published 1-2 bytes
per sample ("Storage": "On average, Prometheus uses only around 1-2 bytes per sample").

Usage: bench_series_budget.py [--quick] [--seconds S] [--samples N]   (root: real probes)
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections import Counter
from pathlib import Path

from tailsight.cli.wiring import build_agent
from tailsight.collector.config import DEFAULT_TOP_K, CollectorConfig
from tailsight.testing.workload import Workload, private_base, python_task, socket_task_code

SCRAPE_INTERVAL_S = 15
HOSTS = 1_000
PUBLISHED_BYTES_PER_SAMPLE = (1.0, 2.0)  # prometheus.io/docs/prometheus/latest/storage/


def series_of(exposition: bytes) -> list[str]:
    """One entry per series: every sample line of the text exposition (a bucket is a series)."""
    return [line for line in exposition.decode().splitlines() if line and line[0] != "#"]


def breakdown(series: list[str]) -> Counter[str]:
    """Series by kind: histogram / quantile gauge / counter, per probe, and self-metrics."""
    kinds: Counter[str] = Counter()
    for line in series:
        name = line.split("{", 1)[0].split(" ", 1)[0]
        probe = name.split("_")[1] if name.count("_") >= 2 else ""
        if name.endswith(("_bucket", "_seconds_count", "_seconds_sum")) and "quantile" not in name:
            kind = f"{probe} histogram"
        elif "_quantile_seconds" in name:
            kind = f"{probe} quantile"
        elif name.endswith("_total") and probe in {
            "runqueue",
            "netsyscall",
            "tcpstate",
            "migration",
        }:
            kind = f"{probe} counter"
        else:
            kind = "self-metrics"
        kinds[kind] += 1
    return kinds


def tsdb_block(expositions: list[bytes], directory: Path) -> dict[str, int]:
    """Sizes and stats of the TSDB block Prometheus' own tooling builds from these expositions
    taken as scrapes 15 s apart: numSamples, numSeries, numChunks, chunk_bytes, index_bytes."""
    promtool = shutil.which("promtool")
    if promtool is None:
        raise FileNotFoundError("promtool (Debian's prometheus package) is not installed")
    # Every sample name as an OpenMetrics family of type unknown (storage keeps no type), each
    # series' points together and in time order, as OpenMetrics requires.
    families: dict[str, dict[str, list[str]]] = {}
    start_s = 1_700_000_000
    for i, exposition in enumerate(expositions):
        stamp = start_s + i * SCRAPE_INTERVAL_S
        for line in series_of(exposition):
            series, value = line.rsplit(" ", 1)
            name = series.split("{", 1)[0]
            points = families.setdefault(name, {}).setdefault(series, [])
            points.append(f"{series} {value} {stamp}\n")
    text = directory / "scrapes.om"
    with text.open("w") as out:
        for name, members in families.items():
            out.write(f"# TYPE {name} unknown\n")
            for points in members.values():
                out.writelines(points)
        out.write("# EOF\n")
    blocks = directory / "blocks"
    subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(text), str(blocks)],
        check=True,
        capture_output=True,
    )
    (block,) = [d for d in blocks.iterdir() if (d / "meta.json").exists()]
    stats: dict[str, int] = json.loads((block / "meta.json").read_text())["stats"]
    stats["chunk_bytes"] = sum(f.stat().st_size for f in (block / "chunks").iterdir())
    stats["index_bytes"] = (block / "index").stat().st_size
    return stats


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short run for CI")
    parser.add_argument("--seconds", type=float, help="seconds of the idle phase (default 5)")
    parser.add_argument(
        "--samples", type=int, help="busy intervals = samples per series (default 120; quick 12)"
    )
    args = parser.parse_args(argv)
    seconds = args.seconds or 5.0
    samples = args.samples or (12 if args.quick else 120)  # 120: one full TSDB chunk
    if os.geteuid() != 0:
        print("bench_series_budget: skipped (needs root for BPF)")
        return 0

    config = CollectorConfig()
    cgroups = DEFAULT_TOP_K + 10
    agent = build_agent(config, lambda message: None, export=True)
    assert agent.exporter is not None
    stop = threading.Event()
    try:
        agent.start()
        if not agent.attached:
            print("bench_series_budget: no probe attached (run `tailsight doctor`)")
            return 1
        attached = sorted(agent.attached)
        agent.run(stop, seconds)
        idle = agent.exporter.exposition()
        tasks = [python_task(f"c{i:02d}", socket_task_code()) for i in range(cgroups)]
        exporter = agent.exporter
        expositions: list[bytes] = []

        def capture() -> None:  # every interval's exposition, as a scrape per interval sees it
            seen = exporter.generation
            while not stop.wait(0.05):
                if exporter.generation != seen:
                    seen = exporter.generation
                    expositions.append(exporter.exposition())

        with Workload(tasks, base=private_base("budget")):
            agent.run(stop, seconds)  # the busy cgroups enter every probe's top-K
            capturing = threading.Thread(target=capture)
            capturing.start()
            try:
                agent.run(stop, samples * config.interval_s)
            finally:
                stop.set()
                capturing.join()
            busy = exporter.exposition()
    finally:
        agent.close()

    idle_series, busy_series = series_of(idle), series_of(busy)
    print(
        f"probes attached: {', '.join(attached)}; "
        f"top-K {config.top_k}, quantile windows {config.quantile_windows_s} s + the interval"
    )
    print(f"series per host, this host's own cgroups (baseline): {len(idle_series):6,d}")
    print(
        f"series per host, {cgroups} busy cgroups (top-K full)   : {len(busy_series):6,d}  "
        f"({len(busy_series) / max(1, len(idle_series)):.2f}x baseline)"
    )
    for kind, n in sorted(breakdown(busy_series).items()):
        print(f"  {kind:<22} {n:6,d}")
    compressed = len(gzip.compress(busy))
    print(
        f"exposition per scrape: {len(busy):,} B ({len(busy) / len(busy_series):.0f} B/series), "
        f"gzip {compressed:,} B (baseline host: {len(idle):,} B)"
    )
    with tempfile.TemporaryDirectory(prefix="tailsight-budget-") as scratch:
        block = tsdb_block(expositions, Path(scratch))
    per_sample = block["chunk_bytes"] / block["numSamples"]
    low, high = PUBLISHED_BYTES_PER_SAMPLE
    print(
        f"TSDB block of {len(expositions)} scrapes (promtool; chunks hold up to 120 samples, "
        f"so fewer scrapes pay more per-chunk header): {block['numSeries']:,} series, "
        f"{block['numSamples']:,} samples in {block['numChunks']:,} chunks: "
        f"{per_sample:.2f} B/sample ({per_sample / high:.2f}x the published {high:g} B), "
        f"index {block['index_bytes'] / block['numSeries']:.0f} B/series"
    )
    n = len(busy_series)
    per_s = n / SCRAPE_INTERVAL_S
    day_bytes = n * 86_400 / SCRAPE_INTERVAL_S * per_sample
    print(
        f"at a {SCRAPE_INTERVAL_S} s scrape: {per_s:,.0f} samples/s, {day_bytes / 1e6:,.1f} MB/day "
        "of chunks per host"
    )
    print(
        f"{HOSTS:,} hosts: {n * HOSTS:,} series, {per_s * HOSTS:,.0f} samples/s, "
        f"{day_bytes * HOSTS / 1e9:,.1f} GB/day of chunks at {per_sample:.2f} B/sample "
        f"({day_bytes * HOSTS * low / per_sample / 1e9:,.1f}-"
        f"{day_bytes * HOSTS * high / per_sample / 1e9:,.1f} at the published {low:g}-{high:g} B)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
