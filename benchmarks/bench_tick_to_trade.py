"""Tick-to-trade of the replay pipeline on the AF_XDP path and the UDP path, in the same run.

A generated day is replayed open loop (intended send times from the file, compressed to an
average message rate) through exchange -> feed -> book -> decision -> OUCH order, runs of the two
paths interleaved so that machine noise hits both alike. Tick-to-trade is from each tick's
intended send time to its order leaving; histograms of all runs of a path are merged (5 µs
buckets), per-run P50s show the spread. AF_XDP runs in copy mode via generic (SKB) XDP on a veth.

Usage: bench_tick_to_trade.py [--quick] [--runs N] [--messages N] [--rate MSG_PER_S] [--out DIR]
(needs root and bcc; exits 0 with a note if not)
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

QUANTILES = (0.5, 0.99, 0.999)


def _us(value_ns: float) -> str:
    return f"{value_ns / 1e3:9.1f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small day, 2 runs per path")
    parser.add_argument("--runs", type=int, default=None, help="runs per path")
    parser.add_argument("--messages", type=int, default=None, help="messages in the day")
    parser.add_argument("--rate", type=float, default=None, help="average messages per second")
    parser.add_argument("--out", type=Path, default=None, help="write each run's result here")
    args = parser.parse_args(argv)
    runs = args.runs or (2 if args.quick else 5)
    messages = args.messages or (3_000 if args.quick else 20_000)
    rate = args.rate or 2_000.0
    if os.geteuid() != 0:
        print("bench_tick_to_trade: needs root (namespaces, XDP, AF_XDP); skipped")
        return 0
    try:
        import bcc  # noqa: F401
    except ImportError as error:
        print(f"bench_tick_to_trade: bcc not importable ({error}); skipped")
        return 0

    from tailsight.hist import Histogram
    from tailsight.trading_core.market import write_day
    from tailsight.trading_core.netns import topology, unique_topology
    from tailsight.trading_core.replay import (
        ReplayConfig,
        load_ticks,
        replay_once,
        speed_for_duration,
    )
    from tailsight.trading_core.timing import PUBLISH_LAG, TICK_TO_TRADE, WIRE

    paths = ("afxdp", "udp")
    with tempfile.TemporaryDirectory() as scratch:
        day = Path(scratch) / "day.itch"
        write_day(day, seed=2024, symbols=8, messages=messages)
        ticks = load_ticks(day)
    duration_s = messages / rate
    speed = speed_for_duration(ticks.timestamps_ns, duration_s)
    print(
        f"{messages} messages per run at {rate:g} msg/s on average ({duration_s:.1f} s, "
        f"speed {speed:.0f}x), {runs} runs per path, interleaved"
    )
    stages = (TICK_TO_TRADE, WIRE, PUBLISH_LAG)
    merged = {path: {stage: Histogram.empty() for stage in stages} for path in paths}
    per_run_p50: dict[str, list[float]] = {path: [] for path in paths}
    modes: dict[str, str] = {}
    counters: dict[str, dict[str, int]] = {path: {} for path in paths}
    started = time.monotonic()
    with topology(unique_topology("bench")) as topo:
        for run in range(runs):
            for path in paths:
                result = replay_once(ticks, topo, ReplayConfig(path=path, speed=speed))
                if not result.complete:
                    print(f"run {run} {path}: session incomplete", file=sys.stderr)
                    return 1
                if args.out is not None:
                    args.out.mkdir(parents=True, exist_ok=True)
                    result.document.write(args.out / f"replay-{path}-{run:03d}.json")
                for stage in stages:
                    (series,) = result.document.find(stage=stage)
                    merged[path][stage] = merged[path][stage] + series.hist
                (t2t,) = result.document.find(stage=TICK_TO_TRADE)
                per_run_p50[path].append(t2t.hist.quantile(0.5))
                modes[path] = t2t.labels["xdp_mode"]
                for name, value in result.counters.items():
                    combine = max if "_max_" in name else sum
                    counters[path][name] = combine((counters[path].get(name, 0), value))
    elapsed = time.monotonic() - started

    print(f"\ntick-to-trade (µs, intended send -> order sent), all runs merged; {elapsed:.0f} s")
    print(f"{'path':<7}{'mode':<10}{'orders':>8}{'P50':>10}{'P99':>10}{'P99.9':>10}  run P50s")
    table: dict[str, list[float]] = {}
    for path in paths:
        hist = merged[path][TICK_TO_TRADE]
        table[path] = hist.quantiles(QUANTILES)
        spread = " ".join(f"{v / 1e3:.0f}" for v in per_run_p50[path])
        print(
            f"{path:<7}{modes[path]:<10}{hist.count:>8}"
            + "".join(f"{_us(v):>10}" for v in table[path])
            + f"  {spread}"
        )
    ratios = [
        a / u if u else float("nan") for a, u in zip(table["afxdp"], table["udp"], strict=True)
    ]
    print(f"{'ratio afxdp/udp':<25}" + "".join(f"{r:>10.2f}" for r in ratios))

    for stage, title in (
        (WIRE, "wire (µs, exchange send() -> datagram in user space): the receive path itself"),
        (PUBLISH_LAG, "publish lag (µs, intended -> actual send): the exchange's own delay"),
    ):
        print(f"\n{title}, all messages")
        wire: dict[str, list[float]] = {}
        for path in paths:
            hist = merged[path][stage]
            wire[path] = hist.quantiles(QUANTILES)
            print(f"{path:<7}{hist.count:>10} msgs" + "".join(f"{_us(v):>10}" for v in wire[path]))
        ratios = [
            a / u if u else float("nan") for a, u in zip(wire["afxdp"], wire["udp"], strict=True)
        ]
        print(f"{'ratio afxdp/udp':<22}" + "".join(f"{r:>10.2f}" for r in ratios))
    for path in paths:
        c = counters[path]
        print(
            f"{path}: packets {c.get('packets', 0)}, gaps {c.get('gaps_detected', 0)}, "
            f"publisher max send lag {c.get('exchange_max_send_lag_ns', 0) / 1e3:.0f} µs"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
