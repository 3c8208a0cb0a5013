"""Tick-to-trade of the real trading system under replay, AF_XDP against UDP in the same run.

Part 1, the book on the live path: latency *per message* (one ITCH message decoded and applied,
timed alone) of the Python ``Book`` and the numba ``FastBook`` on the same day; the lower one is
what the feed uses.

Part 2, replay: a generated day through exchange -> feed -> book -> ``Strategy`` (risk checks)
-> ``Gateway`` (OUCH over SoupBinTCP), set up once, runs of the two receive paths interleaved so
machine noise hits both alike. The gated series is in-system tick-to-trade: from when the tick
could be handled (its frame's kernel receive stamp, XDP program / SO_TIMESTAMPNS, or the end of
the previous feed message if later) to just before the order's send(); the wait behind earlier
messages is its own stage (queue), with queue + in-system as in_system_with_queue. Also reported:
open-loop tick-to-trade from the intended send time, the exchange's publish lag (apart), every
stage, and the exchange's order throughput (achieved, and its capacity from its handling time).
Goals on this machine: AF_XDP (copy mode) in-system P50 <= 30 µs, P99 <= 150 µs.

Usage: bench_tick_to_trade.py [--quick] [--runs N] [--messages N] [--rate MSG_PER_S]
       [--act-share X] [--placement exchange=0,trading=1|auto|none] [--no-busy-poll]
       [--out DIR]
(needs root and bcc for part 2; exits 0 with a note if not)
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from tailsight.hist import Histogram
from tailsight.trading_core import itch
from tailsight.trading_core.book import Book
from tailsight.trading_core.fastbook import FastBook
from tailsight.trading_core.itch_file import iter_itch
from tailsight.trading_core.market import write_day
from tailsight.trading_core.netns import topology, unique_topology
from tailsight.trading_core.replay import (
    Placement,
    ReplayConfig,
    ReplayResult,
    ReplaySystem,
    iter_runs,
    load_ticks,
    speed_for_duration,
)
from tailsight.trading_core.timing import (
    BOOK,
    DECISION,
    DECODE,
    IN_SYSTEM,
    KERNEL_RX,
    RECEIVE,
    SEND,
    SERIES,
    UNSET,
    StageTimer,
)

QUANTILES = (0.5, 0.99)
GOAL_P50_NS = 30_000
GOAL_P99_NS = 150_000


def _us(value_ns: float) -> str:
    return f"{value_ns / 1e3:9.1f}"


def book_latency(day: Path) -> None:
    """Part 1: per-message latency of both books over the same messages."""
    messages = [raw for _, raw in iter_itch(day)]
    framed = [len(raw).to_bytes(2, "big") + raw for raw in messages]
    clock = time.perf_counter_ns
    FastBook().apply_buffer(framed[0])  # compile (cached) before timing
    results = {}
    for name in ("Book", "Book raw", "FastBook"):
        spans = np.empty(len(messages), dtype=np.int64)
        if name == "Book raw":  # the live feed's path: order messages applied unpacked
            book = Book()
            handlers = book.raw_handlers()
            for index, raw in enumerate(messages):
                started = clock()
                entry = handlers.get(raw[0])
                if entry is None:
                    book.apply(itch.decode(raw))
                else:
                    entry[1](entry[0].unpack_from(raw))
                spans[index] = clock() - started
        elif name == "Book":
            book = Book()
            for index, raw in enumerate(messages):
                started = clock()
                book.apply(itch.decode(raw))
                spans[index] = clock() - started
        else:
            fast = FastBook()
            for index, frame in enumerate(framed):
                started = clock()
                fast.apply_buffer(frame)
                spans[index] = clock() - started
        results[name] = (np.percentile(spans, [50, 99]), spans.mean())
    print(f"\nbook, one message decoded and applied ({len(messages)} messages), µs")
    print(f"{'book':<10}{'P50':>9}{'P99':>9}{'mean':>9}")
    for name, ((p50, p99), mean) in results.items():
        print(f"{name:<10}{_us(p50)}{_us(p99)}{_us(mean)}")
    ratio = results["FastBook"][0][0] / results["Book raw"][0][0]
    print(f"FastBook/Book raw at P50: {ratio:.2f} (the live path uses the lower: Book raw)")


BREAKDOWN = ("receive", "decode", "book", "decision", "send")


def triggering_spans(timer: object) -> dict[str, np.ndarray]:
    """Per tick that led to an order: each in-system stage's span (they add up to in-system),
    the queue wait before it, and in-system itself."""
    assert isinstance(timer, StageTimer)
    stamps = timer.stamps
    ready = np.where(timer.ready_ns != UNSET, timer.ready_ns, stamps[:, KERNEL_RX])
    rows = (stamps[:, KERNEL_RX] != UNSET) & (stamps[:, SEND] != UNSET)
    rows &= (stamps[:, DECISION] != UNSET) & (stamps[:, SEND] >= ready)
    picked, start = stamps[rows], ready[rows]
    ends = (RECEIVE, DECODE, BOOK, DECISION, SEND)
    spans = {"queue": start - picked[:, KERNEL_RX]}
    begin = start
    for name, end in zip(BREAKDOWN, ends, strict=True):
        spans[name] = picked[:, end] - begin
        begin = picked[:, end]
    spans["in_system"] = picked[:, SEND] - start
    return spans


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small day, 2 runs per path")
    parser.add_argument("--runs", type=int, default=None, help="runs per path")
    parser.add_argument("--messages", type=int, default=None, help="messages in the day")
    parser.add_argument("--rate", type=float, default=None, help="average messages per second")
    parser.add_argument("--act-share", type=float, default=0.25, help="strategy's acting share")
    parser.add_argument(
        "--placement", default="auto", help="CPUs, e.g. exchange=0,trading=1 (auto, none)"
    )
    parser.add_argument(
        "--no-busy-poll", action="store_true", help="the trading loop sleeps in poll()"
    )
    parser.add_argument("--out", type=Path, default=None, help="write each run's result here")
    args = parser.parse_args(argv)
    runs = args.runs or (2 if args.quick else 5)
    messages = args.messages or (8_000 if args.quick else 40_000)
    rate = args.rate or 4_000.0

    scratch = tempfile.TemporaryDirectory()
    day = Path(scratch.name) / "day.itch"
    write_day(day, seed=2024, symbols=8, messages=messages)
    book_latency(day)
    if os.geteuid() != 0:
        print("\nbench_tick_to_trade: replay needs root (namespaces, XDP, AF_XDP); skipped")
        return 0
    try:
        import bcc  # noqa: F401
    except ImportError as error:
        print(f"\nbench_tick_to_trade: bcc not importable ({error}); replay skipped")
        return 0
    return replay(day, runs, messages, rate, args)


def replay(day: Path, runs: int, messages: int, rate: float, args: argparse.Namespace) -> int:
    """Part 2: interleaved runs on both paths, merged histograms per path."""
    paths = ("afxdp", "udp")
    ticks = load_ticks(day)
    duration_s = messages / rate
    speed = speed_for_duration(ticks.timestamps_ns, duration_s)
    config = ReplayConfig(speed=speed, act_share=args.act_share, busy_poll=not args.no_busy_poll)
    placement = Placement.parse(args.placement)
    print(
        f"\nreplay: {messages} messages per run at {rate:g} msg/s ({duration_s:.1f} s), "
        f"act share {args.act_share:g}, {runs} runs per path interleaved, "
        f"placement {placement.label()}, {'sleeping' if args.no_busy_poll else 'busy'} poll"
    )
    merged = {path: {stage: Histogram.empty() for stage in SERIES} for path in paths}
    per_run: dict[str, list[tuple[int, float, float]]] = {path: [] for path in paths}
    spans: dict[str, list[dict[str, np.ndarray]]] = {path: [] for path in paths}
    totals: dict[str, dict[str, int]] = {path: {} for path in paths}
    failed: list[str] = []
    modes: dict[str, str] = {}
    started = time.monotonic()
    with (
        topology(unique_topology("bench")) as topo,
        ReplaySystem(ticks, topo, paths, placement) as system,
    ):
        system.start()
        setup_s = time.monotonic() - started
        for run, path, outcome in iter_runs(system, runs, paths, config):
            if not isinstance(outcome, ReplayResult) or not outcome.complete:
                reason = outcome if not isinstance(outcome, ReplayResult) else "incomplete"
                failed.append(f"run {run} {path}: {reason}")
                continue
            document = outcome.document
            if args.out is not None:
                args.out.mkdir(parents=True, exist_ok=True)
                document.write(args.out / f"replay-{path}-{run:03d}.json")
            spans[path].append(triggering_spans(outcome.timer))
            for stage in SERIES:
                (series,) = document.find(stage=stage)
                merged[path][stage] = merged[path][stage] + series.hist
            (in_system,) = document.find(stage=IN_SYSTEM)
            modes[path] = in_system.labels["xdp_mode"]
            per_run[path].append(
                (
                    outcome.counters["orders"],
                    in_system.hist.quantile(0.5),
                    in_system.hist.quantile(0.99),
                )
            )
            for name, value in outcome.counters.items():
                totals[path][name] = totals[path].get(name, 0) + value
    elapsed = time.monotonic() - started
    print(f"set up once in {setup_s:.1f} s; {elapsed:.0f} s in all")
    for line in failed:
        print(f"FAILED {line}")
    if any(not per_run[path] for path in paths):
        print("no complete run on a path: no figures", file=sys.stderr)
        return 1

    print(f"\n{IN_SYSTEM} (µs, ready -> order send(); queue apart), all runs merged")
    print(f"{'path':<7}{'mode':<10}{'ticks':>8}{'P50':>10}{'P99':>10}  per run (orders P50/P99)")
    table = {}
    for path in paths:
        hist = merged[path][IN_SYSTEM]
        table[path] = hist.quantiles(QUANTILES)
        runs_text = " ".join(
            f"{o}:{p50 / 1e3:.0f}/{p99 / 1e3:.0f}" for o, p50, p99 in per_run[path]
        )
        print(
            f"{path:<7}{modes[path]:<10}{hist.count:>8}"
            + "".join(f"{_us(v):>10}" for v in table[path])
            + f"  {runs_text}"
        )
    ratios = [
        a / u if u else float("nan") for a, u in zip(table["afxdp"], table["udp"], strict=True)
    ]
    print(f"{'ratio afxdp/udp':<25}" + "".join(f"{r:>10.2f}" for r in ratios))
    p50, p99 = table["afxdp"]
    verdict = "met" if p50 <= GOAL_P50_NS and p99 <= GOAL_P99_NS else "NOT met"
    print(
        f"goal AF_XDP P50 <= {GOAL_P50_NS / 1e3:.0f} µs, "
        f"P99 <= {GOAL_P99_NS / 1e3:.0f} µs: {verdict}"
    )

    print(
        "\nwhere the in-system µs go: ticks that led to an order, per stage (means add up to "
        "in-system's; queue = wait behind earlier messages, before it)"
    )
    print(f"{'stage':<12}" + "".join(f"{path + ' mean':>12}{path + ' P50':>11}" for path in paths))
    joined = {
        path: {name: np.concatenate([run[name] for run in spans[path]]) for name in spans[path][0]}
        for path in paths
    }
    for name in ("queue", *BREAKDOWN, "in_system"):
        if name == "in_system":
            print(f"{'':<12}" + "".join(f"{'-' * 9:>12}{'':>11}" for _ in paths))
        cells = "".join(
            f"{joined[path][name].mean() / 1e3:>12.1f}{np.median(joined[path][name]) / 1e3:>11.1f}"
            for path in paths
        )
        print(f"{name:<12}{cells}")

    print("\nevery series, P50 / P99 µs (all runs merged)")
    print(f"{'series':<26}" + "".join(f"{path + ' P50':>12}{path + ' P99':>12}" for path in paths))
    for stage in SERIES:
        cells = ""
        for path in paths:
            hist = merged[path][stage]
            values = hist.quantiles(QUANTILES) if hist.count else [float("nan")] * 2
            cells += "".join(f"{v / 1e3:>12.1f}" for v in values)
        print(f"{stage:<26}{cells}")

    print("\nexchange throughput")
    for path in paths:
        total = totals[path]
        count = len(per_run[path])
        cpu_s = total.get("exchange_cpu_ns", 0) / 1e9
        print(
            f"{path}: {total['orders'] // count} orders/run, {total['orders_per_s'] // count} "
            f"orders/s achieved, capacity {total['exchange_order_capacity_per_s'] // count} "
            f"orders/s (orders / order-handling time), exchange CPU {cpu_s / count:.2f} s/run, "
            f"trading CPU {total.get('trading_cpu_ns', 0) / 1e9 / count:.2f} s/run, "
            f"reconcile differences {total['reconcile_differences']}"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
