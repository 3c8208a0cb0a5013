"""Series budget of one host at the default top-K (20 cgroups per probe): every probe attached
for real, the series counted in the real exporter's exposition, first with this host's own
cgroups (baseline), then with top-K + 10 busy cgroups (UDP syscalls, TCP connects, run-queue
contention and migrations in each), so every probe's top-K is full; then what that means at a
scrape interval of 15 s and for 1,000 hosts (README, "Budget at scale").

Bytes per sample: not measured here (a TSDB needs hours of head chunks to show its steady
state); the Prometheus documentation's published figure of 1-2 bytes per compressed sample
("Storage" page, "On average, Prometheus uses only around 1-2 bytes per sample") is used, and
the exposition's own size is measured.

Usage: bench_series_budget.py [--quick] [--seconds S]   (root: the probes are real)
"""

from __future__ import annotations

import argparse
import gzip
import os
import sys
import threading
from collections import Counter

SCRAPE_INTERVAL_S = 15
HOSTS = 1_000
PUBLISHED_BYTES_PER_SAMPLE = (1.0, 2.0)  # prometheus.io/docs/prometheus/latest/storage/

# One busy process per cgroup: 2 ms of CPU between a UDP sendto/recvfrom (netsyscall), a TCP
# connect + accept + close every 20 rounds (tcpstate); 30 of them on this host's CPUs wait on
# each other's run queues and migrate (runqueue, displacement pairs, migration).
TASK_CODE = """
import socket, time
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
udp.bind(("127.0.0.1", 0))
me = udp.getsockname()
listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen(8)
there = listener.getsockname()
n = 0
while True:
    end = time.perf_counter() + 0.002
    while time.perf_counter() < end:
        pass
    udp.sendto(b"x", me)
    udp.recvfrom(16)
    n += 1
    if n % 20 == 0:
        client = socket.create_connection(there)
        server, _ = listener.accept()
        client.close()
        server.close()
"""


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short run for CI")
    parser.add_argument("--seconds", type=float, help="seconds per phase (default 5; quick 3)")
    args = parser.parse_args(argv)
    seconds = args.seconds or (3.0 if args.quick else 5.0)
    if os.geteuid() != 0:
        print("bench_series_budget: skipped (needs root for BPF)")
        return 0

    from tailsight.cli.serve import build_agent
    from tailsight.collector.config import DEFAULT_TOP_K, CollectorConfig
    from tailsight.workload import Workload, private_base, python_task

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
        tasks = [python_task(f"c{i:02d}", TASK_CODE) for i in range(cgroups)]
        with Workload(tasks, base=private_base("budget")):
            agent.run(stop, seconds * 2)
            busy = agent.exporter.exposition()
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
    n = len(busy_series)
    per_s = n / SCRAPE_INTERVAL_S
    low, high = PUBLISHED_BYTES_PER_SAMPLE
    day = 86_400 / SCRAPE_INTERVAL_S
    print(f"at a {SCRAPE_INTERVAL_S} s scrape: {per_s:,.0f} samples/s per host")
    print(
        f"{HOSTS:,} hosts: {n * HOSTS:,} series, {per_s * HOSTS:,.0f} samples/s, "
        f"{n * HOSTS * day * low / 1e9:.1f}-{n * HOSTS * day * high / 1e9:.1f} GB/day of samples "
        f"at the published {low:g}-{high:g} B/sample (index and WAL not included)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
