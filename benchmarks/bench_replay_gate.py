"""Regression gate on real tick replays: A/A false fails and passes, power at +10 % in-system P99
(the strategy's calibration-only ``--inject-delay-us``), runs per side needed; Wilson intervals.

Each trial replays one generated ITCH day ``--runs`` times per set, interleaved A B A' A B A' ...
(fresh runs per trial): A/A = gate(A, A'), A/B = gate(A, B). As in ``make gate``, every run is its
own ``replay`` invocation (``--block`` runs per invocation to change that): runs of one
invocation share its state, which the rank test does not allow for. The delay is sized once,
from a pilot's in-system P99, so that B's P99 is 10 % above A's. "Runs per side needed" resamples
the measured runs (with replacement) at larger run counts; same-run baseline: a pooled per-event
test (all events of a side in one histogram) on the same A/A pairs. Needs root; run under the
heavy lock.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from tailsight.analysis.gate import DEFAULT_SERIES, GateConfig, Outcome, gate_documents
from tailsight.analysis.quantiles import run_quantiles, select_series
from tailsight.intervals import HistDocument, Series
from tailsight.testing.eval import Rate, pooled_event_test

CLI = "import sys; from tailsight.cli.main import app; sys.argv[0] = 'tailsight'; app()"
RESAMPLED_RUNS = (5, 10, 15, 20, 30, 40, 60)


def tailsight(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", CLI, *args], capture_output=True, text=True)


def replay_set(
    itch: Path, out: Path, args: argparse.Namespace, delay_us: float, runs: int
) -> tuple[list[HistDocument], int]:
    """One replay invocation of ``runs`` runs: the documents written, and failed runs."""
    command = ["replay", str(itch), "--runs", str(runs), "--duration", str(args.duration)]
    command += ["--path", args.path, "--out", str(out)]
    if args.placement:
        command += ["--placement", args.placement]
    if args.busy_poll:
        command += ["--busy-poll"]
    if delay_us:
        command += ["--inject-delay-us", f"{delay_us:.1f}"]
    result = tailsight(*command)
    documents = [HistDocument.read(p) for p in sorted(out.glob("*.json"))]
    if not documents:
        sys.exit(f"replay wrote no run (exit {result.returncode}):\n{result.stderr[-2000:]}")
    return documents, len(list(out.glob("*.failed")))


@contextlib.contextmanager
def held(lock: str) -> Iterator[None]:
    """Hold an flock on ``lock`` (the shared heavy-test lock) for one trial, or nothing."""
    if not lock:
        yield
        return
    with open(lock, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def in_system(documents: list[HistDocument], q: float) -> np.ndarray:
    (hists,) = select_series(documents, DEFAULT_SERIES).values()
    return run_quantiles(hists, [q])[0]


def pooled(documents: list[HistDocument]) -> list[HistDocument]:
    """Each run reduced to its in-system series (what the pooled test reads)."""
    (hists,) = select_series(documents, DEFAULT_SERIES).values()
    return [
        HistDocument(d.start_ns, d.end_ns, [Series(dict(DEFAULT_SERIES), h)])
        for d, h in zip(documents, hists, strict=True)
        if h is not None
    ]


def resampled(
    a_pool: list[HistDocument], b_pool: list[HistDocument], runs: int, trials: int, seed: int
) -> tuple[Rate, Rate, Rate]:
    """A/A false fails, A/A passes and A/B regressions at ``runs`` per side, resampling runs."""
    rng = np.random.default_rng(seed)
    false_fails = passes = caught = 0
    for _ in range(trials):
        pick = [a_pool[i] for i in rng.integers(0, len(a_pool), 2 * runs)]
        aa = gate_documents(pick[:runs], pick[runs:]).outcome
        ab = gate_documents(pick[:runs], [b_pool[i] for i in rng.integers(0, len(b_pool), runs)])
        false_fails += aa is Outcome.REGRESSION
        passes += aa is Outcome.PASS
        caught += ab.outcome is Outcome.REGRESSION
    return Rate(false_fails, trials), Rate(passes, trials), Rate(caught, trials)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (CI smoke test)")
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--runs", type=int, default=10, help="runs per side per trial")
    parser.add_argument("--block", type=int, default=1, help="runs per replay invocation")
    parser.add_argument("--duration", type=float, default=2.0, help="seconds per run")
    parser.add_argument("--rate", type=float, default=2_000.0, help="messages per second")
    parser.add_argument("--path", default="afxdp", choices=("afxdp", "udp"))
    parser.add_argument("--placement", default="")
    parser.add_argument("--busy-poll", action="store_true", help="replay --busy-poll")
    parser.add_argument("--ratio", type=float, default=1.10, help="target in-system P99 ratio")
    parser.add_argument(
        "--delay-us", type=float, default=0.0, help="B's delay (default: sized by a pilot)"
    )
    parser.add_argument(
        "--lock", default="", help="flock this file per trial (e.g. /tmp/tailsight-heavy.lock)"
    )
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench_replay_gate: needs root (namespaces, XDP, AF_XDP); skipped")
        return
    if args.quick:  # one invocation per set: the smoke test pays the set-up 3x, not 15x
        args.trials, args.runs, args.duration, args.block = 1, 5, 1.0, 5
    config = GateConfig()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-replay-gate-") as tmp:
        root = Path(tmp)
        itch = root / "day.itch"
        messages = round(args.rate * args.duration)
        made = tailsight("itch", "generate", str(itch), "--messages", str(messages))
        if made.returncode != 0:
            sys.exit(made.stderr)
        if args.delay_us:
            delay_us, sized = args.delay_us, "given"
        else:
            with held(args.lock):
                pilot, _ = replay_set(itch, root / "pilot", args, 0.0, args.runs)
            p99_us = float(np.nanmedian(in_system(pilot, 0.99))) / 1e3
            if not math.isfinite(p99_us):
                sys.exit("no in-system series in the pilot runs")
            # A busy-wait adds its length to every order only while the strategy keeps up; on
            # an overloaded pipeline it queues and multiplies (the B/A ratio tells): --delay-us.
            delay_us = (args.ratio - 1.0) * p99_us
            sized = f"pilot in-system P99 {p99_us:.1f} µs"
        print(
            f"replay gate calibration: {args.trials} trials x (A, B, A') x {args.runs} runs of "
            f"{args.duration:g} s, {args.block} per replay invocation, {messages:,} messages, "
            f"path {args.path}"
            f"{', placement ' + args.placement if args.placement else ''}\n"
            f"  {sized} -> --inject-delay-us {delay_us:.1f} "
            f"(+{args.ratio - 1:.0%} P99); gate: P50+P99, alpha {config.alpha}, "
            f"min effect max({config.min_effect:.0%}, {config.min_effect_ns / 1e3:g} µs)"
        )
        outcomes = {name: dict.fromkeys(Outcome, 0) for name in ("A/A", "A/B")}
        pooled_false = 0
        a_pool: list[HistDocument] = []
        b_pool: list[HistDocument] = []
        failed = 0
        measured_ratio: list[float] = []
        for trial in range(args.trials):
            sets: dict[str, list[HistDocument]] = {"A": [], "B": [], "A2": []}
            with held(args.lock):
                for block in range(math.ceil(args.runs / args.block)):
                    runs = min(args.block, args.runs - block * args.block)
                    for name, delay in (("A", 0.0), ("B", delay_us), ("A2", 0.0)):  # interleaved
                        out = root / f"t{trial}-{name}-{block}"
                        documents, lost = replay_set(itch, out, args, delay, runs)
                        sets[name] += documents
                        failed += lost
            aa = gate_documents(sets["A"], sets["A2"], config=config)
            ab = gate_documents(sets["A"], sets["B"], config=config)
            outcomes["A/A"][aa.outcome] += 1
            outcomes["A/B"][ab.outcome] += 1
            pooled_false += pooled_event_test(
                pooled(sets["A"]), pooled(sets["A2"]), 0.99, config.alpha
            )
            ratio = float(
                np.nanmedian(in_system(sets["B"], 0.99)) / np.nanmedian(in_system(sets["A"], 0.99))
            )
            measured_ratio.append(ratio)
            print(
                f"  trial {trial}: A/A {aa.outcome.value:<12} A/B {ab.outcome.value:<12} "
                f"(B/A median P99 {ratio:.3f}; {time.perf_counter() - started:.0f} s)",
                flush=True,
            )
            a_pool += sets["A"] + sets["A2"]
            b_pool += sets["B"]
        trials = args.trials
        print(f"\n  {'':<22}{'rate [Wilson 95 %] (hits/trials)':>36}")
        rows = [
            ("A/A false fails", Rate(outcomes["A/A"][Outcome.REGRESSION], trials)),
            ("A/A pass", Rate(outcomes["A/A"][Outcome.PASS], trials)),
            ("A/A inconclusive", Rate(outcomes["A/A"][Outcome.INCONCLUSIVE], trials)),
            (f"power at x{args.ratio:g} P99", Rate(outcomes["A/B"][Outcome.REGRESSION], trials)),
            ("A/B pass (missed)", Rate(outcomes["A/B"][Outcome.PASS], trials)),
            ("pooled test A/A fails", Rate(pooled_false, trials)),
        ]
        for name, rate in rows:
            print(f"  {name:<22}{rate!s:>36}")
        log_p99 = np.log(in_system(a_pool, 0.99))
        spread = 1.4826 * float(np.nanmedian(np.abs(log_p99 - np.nanmedian(log_p99))))
        print(
            f"  measured B/A P99 ratio: median {np.median(measured_ratio):.3f}; run-to-run "
            f"spread of in-system P99 (robust sd of log) {spread:.3f}; {failed} failed runs"
        )
        print(f"\n  resampled from the {len(a_pool)} A and {len(b_pool)} B runs, 200 trials each:")
        print(f"  {'runs':>4} {'A/A false fails':>30} {'A/A pass':>30} {'power':>30}")
        needed = None
        for runs in RESAMPLED_RUNS if not args.quick else RESAMPLED_RUNS[:3]:
            false_fails, passes, power = resampled(a_pool, b_pool, runs, 200, seed=runs)
            print(f"  {runs:>4} {false_fails!s:>30} {passes!s:>30} {power!s:>30}")
            if (
                needed is None
                and false_fails.value <= 0.1
                and min(passes.value, power.value) >= 0.8
            ):
                needed = runs
        verdict = f"{needed} runs per side" if needed else "more runs than tried"
        print(f"  runs per side needed for the goals (resampled): {verdict}")
        print(f"  ({time.perf_counter() - started:.0f} s in all)")


if __name__ == "__main__":
    main()
