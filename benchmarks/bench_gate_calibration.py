"""Calibration of the regression gate and the tail-jump detector on synthetic data with known truth:
gate false-fail rate and power next to a pooled per-event test on the same runs; CUSUM false-alarm
rate and detection delay next to a Shewhart test and a dashboard rule on the same series; realized
FDR of offline detection with Benjamini-Hochberg."""

from __future__ import annotations

import argparse
import math
import time

from tailsight.analysis.gate import GateConfig
from tailsight.analysis.jumps import JumpConfig
from tailsight.testing.eval import (
    IntervalNoise,
    RunNoise,
    fdr_calibration,
    gate_calibration,
    jump_calibration,
)


def gate_section(trials: int, run_counts: list[int]) -> None:
    noise = RunNoise()
    config = GateConfig()
    print(
        f"gate (in-system P50 + P99, Holm over 2): {trials} trials per row; alpha "
        f"{config.alpha}, min effect {config.min_effect:.0%};\n  noise: per-run scale jitter "
        f"{noise.scale_sigma:.0%}, {noise.noisy_run_prob:.0%} noisy runs, "
        f"{noise.events_per_run:,} events per run; rates with Wilson 95 % intervals"
    )
    print(f"  {'runs':>4}  {'true P99':<8} {'regression':>27} {'pass':>27} "
          f"{'inconclusive':>27}  pooled")  # fmt: skip
    for runs in run_counts:
        for ratio in (1.0, 1.05, 1.10, 0.90):
            start = time.perf_counter()
            result = gate_calibration(ratio, trials, runs, noise, config, seed=runs)
            per_trial_ms = (time.perf_counter() - start) / trials * 1e3
            print(
                f"  {runs:>4}  x{ratio:<7.2f} {result.regression!s:>27} {result.passed!s:>27} "
                f"{result.inconclusive!s:>27}  {result.pooled_regression.value:5.3f}"
                f"  ({per_trial_ms:.0f} ms/trial)"
            )
    print(
        "  (x1.00: regression = false-fail rate, pass = A/A shown within the bound; x1.10:\n"
        "   regression = power; 'pooled' = one-sided two-proportion test on all events pooled\n"
        "   per side, the naive gate, same runs; goals: false fails <= 0.1, A/A pass >= 0.8,\n"
        "   power >= 0.8 at the recommended 30 runs per side)"
    )


def jump_section(series: int, intervals: int) -> None:
    config = JumpConfig()
    noise = IntervalNoise(scale_sigma=0.03)
    change_at = intervals // 2
    print(
        f"\njump detector (P99): {series} stationary + {series} changed series x {intervals} "
        f"intervals, change at {change_at},\n  {noise.events_per_interval:,} events/interval, "
        f"interval jitter {noise.scale_sigma:.0%}, nominal false-alarm rate "
        f"{config.false_alarm_rate:g} per series-interval"
    )
    print(f"  {'P99 x':<6}{'detector':<15}{'false alarms/interval':>36} {'found':>6} "
          f"{'early':>5}  delay median/mean/p90")  # fmt: skip
    for ratio in (1.1, 1.2, 1.5):
        start = time.perf_counter()
        result = jump_calibration(series, intervals, ratio, change_at, config, noise, seed=7)
        elapsed = time.perf_counter() - start
        for score in result.scores:
            delay = score.delay_summary()
            shown = "/".join("-" if math.isnan(v) else f"{v:.1f}" for v in delay.values())
            print(
                f"  {ratio:<6}{score.name:<15}{score.false_alarms!s:>36} "
                f"{score.detected.value:6.2f} {score.early_alarms:>5}  {shown}"
            )
        print(f"        ({elapsed:.1f} s incl. simulation)")


def fdr_section(trials: int) -> None:
    print(f"\noffline detection + Benjamini-Hochberg (P99, level 0.05), {trials} trials:")
    for ratio in (1.1, 1.3):
        result = fdr_calibration(
            trials, series=40, changed=8, intervals=60, ratio=ratio, noise=IntervalNoise(0.03)
        )
        print(
            f"  40 series, 8 with a P99 x{ratio} jump: realized FDR {result.fdr:.3f} "
            f"(nominal <= {0.05 * 32 / 40:.3f}), power {result.power:.3f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes (CI)")
    args = parser.parse_args()
    if args.quick:
        gate_section(trials=40, run_counts=[30])
        jump_section(series=8, intervals=120)
        fdr_section(trials=2)
    else:
        gate_section(trials=400, run_counts=[10, 15, 20, 30, 40])
        jump_section(series=100, intervals=300)
        fdr_section(trials=20)


if __name__ == "__main__":
    main()
