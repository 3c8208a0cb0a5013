"""End to end with the inference stage: tick -> signal -> order through the trading
system, and what the stage costs the fast path.

A generated day is replayed twice through one system (UDP feed, unpinned): without inference
(the same-run baseline) and with ``--inference`` (the default model, its worker beside the
trading process). Printed: the in-system tick-to-trade P50/P99 of both and their ratio (the
stage's CPU use shares the machine with the fast path); for the inference run, the stage's
queue wait, prefill and decode, and the signal's age when the strategy decides (features taken
-> decision: tick -> signal -> order, less the order's send), each P50/P99; and the stage's
share of that age (its P50s over the age's P50).

Usage: bench_inference_replay.py [--quick] [--seconds S]
  --quick: 6 s runs (CI); default 20 s.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from tailsight.cli.demo import fast_forward_off_hours
from tailsight.intervals import HistDocument
from tailsight.trading_core.inference.stage import DECODE, PREFILL, QUEUE_WAIT, SIGNAL_AGE
from tailsight.trading_core.netns import topology, unique_topology
from tailsight.trading_core.replay import (
    ReplayConfig,
    ReplaySystem,
    load_ticks,
    speed_for_duration,
)
from tailsight.trading_core.timing import IN_SYSTEM


def _p50_p99_us(document: HistDocument, stage: str) -> tuple[float, float]:
    (series,) = document.find(stage=stage)
    p50, p99 = series.hist.quantiles([0.5, 0.99])
    return p50 / 1e3, p99 / 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="6 s runs (CI)")
    parser.add_argument("--seconds", type=float, default=None, help="seconds per run")
    args = parser.parse_args()
    seconds = args.seconds or (6.0 if args.quick else 20.0)
    with tempfile.TemporaryDirectory(prefix="bench-inference-replay-") as work:
        day = Path(work) / "day.itch"
        subprocess.run(
            [str(Path(sys.executable).with_name("tailsight")), "itch", "generate", str(day),
             "--messages", "20000"],
            check=True, stdout=subprocess.DEVNULL,
        )  # fmt: skip
        ticks = fast_forward_off_hours(load_ticks(day))
    speed = speed_for_duration(ticks.timestamps_ns, seconds)
    plain = ReplayConfig(path="udp", speed=speed, act_share=0.25)
    with_inference = ReplayConfig(
        path="udp", speed=speed, act_share=0.25, inference_model="smollm2"
    )
    with (
        topology(unique_topology("benchinf")) as topo,
        ReplaySystem(ticks, topo, ["udp"]) as system,
    ):
        base = system.run(plain)
        run = system.run(with_inference)
    if not (base.complete and run.complete):
        print("a run did not complete", file=sys.stderr)
        return 1
    model = next(s.labels["model"] for s in run.document.find(stage=PREFILL))
    print(f"{len(ticks.messages):,} messages in {seconds:g} s per run, UDP, model {model}")
    print(f"{'':34}{'P50':>12}{'P99':>12}")
    (b50, b99), (i50, i99) = (
        _p50_p99_us(base.document, IN_SYSTEM),
        _p50_p99_us(run.document, IN_SYSTEM),
    )
    print(f"{'in-system, no inference':34}{b50:10,.1f}us{b99:10,.1f}us")
    print(f"{'in-system, inference on':34}{i50:10,.1f}us{i99:10,.1f}us")
    print(f"{'  ratio to no inference':34}{i50 / b50:11.2f}x{i99 / b99:11.2f}x")
    stage_p50 = 0.0
    for name in (QUEUE_WAIT, PREFILL, DECODE):
        p50, p99 = _p50_p99_us(run.document, name)
        stage_p50 += p50
        print(f"{name:34}{p50 / 1e3:10,.1f}ms{p99 / 1e3:10,.1f}ms")
    age50, age99 = _p50_p99_us(run.document, SIGNAL_AGE)
    print(f"{'signal age at decision':34}{age50 / 1e3:10,.1f}ms{age99 / 1e3:10,.1f}ms")
    print(
        f"tick -> signal -> order: the stage (queue + prefill + decode, P50s) is "
        f"{stage_p50 / age50:.0%} of the signal's age at decision (P50); orders "
        f"{base.counters['orders']:,} without, {run.counters['orders']:,} with inference"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
