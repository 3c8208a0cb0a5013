"""Root-cause accuracy of `tailsight explain` on real injections into real cgroups (needs root, bcc,
nftables): per fault kind, top-1 and top-3 cause and the time error of the incident's start;
quiet recordings (no injection) and how often a report names an incident of the victim there.

Same-run baseline: the answer without causes across probes, i.e. only the run-queue aggressor
of a jump of the victim (right for the CPU hog kinds, blind to the others; a
throttled victim waits behind nobody). The faults that set a limit print the kernel's own
counters of it beside their score (cpu.stat, memory.failcnt, PSI): whether the fault bit.

Each injection takes the shared heavy-test lock (/tmp/tailsight-heavy.lock) for itself only, so
the full run (28 injections + quiet runs, about 20 minutes) never holds it for long.

    python benchmarks/bench_rca_accuracy.py            # 4 per kind + 5 quiet runs of 30 s
    python benchmarks/bench_rca_accuracy.py --quick    # cpu_hog and cpu_throttle once, 1 quiet
    python benchmarks/bench_rca_accuracy.py --kind memory_pressure --per-kind 2 --quiet-runs 0
    python benchmarks/bench_rca_accuracy.py --per-kind 0 --quiet-runs 10 --quiet-s 120
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import math
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from tailsight.analysis.explain.model import ExplainConfig, Report
from tailsight.analysis.explain.pipeline import explain_documents
from tailsight.analysis.explain.text import incident_sentences
from tailsight.testing.eval import Rate
from tailsight.testing.inject import (
    KINDS,
    QUIET,
    Injection,
    Score,
    run_injection,
    run_quiet,
    score,
    steal_disturbed,
)

LOCK = Path("/tmp/tailsight-heavy.lock")


@contextlib.contextmanager
def heavy_lock() -> Iterator[None]:
    with LOCK.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def baseline_top1(report: Report, injection: Injection) -> bool:
    """The run-queue-only answer: the first aggressor of the victim's run-queue jump."""
    for jump in report.jumps:
        if jump.labels.get("cgroup") != injection.victim or jump.displacement is None:
            continue
        rising = [a for a in jump.displacement.aggressors if a.excess_ns > 0]
        return (
            bool(rising)
            and "displacement" in injection.expected
            and (rising[0].aggressor == injection.culprit)
        )
    return False


class Run(NamedTuple):
    """One injection (or quiet recording), scored."""

    score: Score
    baseline_top1: bool
    explain_s: float
    headline: str
    steal_share: float
    """The largest share of the recording one CPU lost to hypervisor steal (quiet ones only)."""
    kernel_counters: dict[str, int]
    """How far the kernel's counters of a limit moved during the fault (limit kinds only)."""


def one(kind: str, baseline_s: float, fault_s: float) -> Run:
    """One injection (or quiet recording) scored."""
    steal_share = 0.0
    with tempfile.TemporaryDirectory(prefix="rca-bench-") as scratch:
        with heavy_lock():
            if kind == QUIET:
                injection, steal_share = run_quiet(Path(scratch) / "rec", baseline_s + fault_s)
            else:
                injection = run_injection(kind, Path(scratch) / "rec", baseline_s, fault_s)
        start = time.perf_counter()
        report = explain_documents(injection.documents, config=ExplainConfig(n_boot=100))
        explain_s = time.perf_counter() - start
        headline = (
            incident_sentences(report.incidents[0])[0] if report.incidents else "(no incident)"
        )
        # A quiet recording has no injection time to be near: any incident of the victim counts,
        # not only those within 3 s of its midpoint (as for injections).
        tolerance_s = math.inf if kind == QUIET else 3.0
        result = score(report, injection, tolerance_s=tolerance_s)
        return Run(
            result,
            baseline_top1(report, injection),
            explain_s,
            headline,
            steal_share,
            injection.kernel_counters,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="CI: two kinds once and one quiet run, shorter (the kernel tests cover every kind)",
    )
    parser.add_argument("--kind", action="append", choices=KINDS, help="only these (repeatable)")
    parser.add_argument("--per-kind", type=int, default=4, help="0: the quiet runs only")
    parser.add_argument("--quiet-runs", type=int, default=5)
    parser.add_argument("--quiet-s", type=float, default=30.0, help="length of a quiet recording")
    args = parser.parse_args()
    per_kind = 1 if args.quick else args.per_kind
    quiet_runs = 1 if args.quick else args.quiet_runs
    baseline_s, fault_s = (6.0, 6.0) if args.quick else (10.0, 10.0)
    kinds = args.kind or (["cpu_hog", "cpu_throttle"] if args.quick else list(KINDS))
    results: dict[str, list[Run]] = {k: [] for k in kinds}
    for n in range(per_kind):
        for kind in kinds:
            run = one(kind, baseline_s, fault_s)
            results[kind].append(run)
            s = run.score
            truth = " ".join(f"{name}={value}" for name, value in run.kernel_counters.items())
            print(
                f"  [{n + 1}/{per_kind}] {kind:<19} found={s.found!s:<5} top1={s.top1!s:<5} "
                f"top3={s.top3!s:<5} dt={s.time_error_s:+.2f}s  named: {s.named}"
                + (f"\n      kernel, during the fault: {truth}" if truth else ""),
                flush=True,
            )
    if per_kind:
        table(results, per_kind, baseline_s, fault_s)
    quiet_s = 12.0 if args.quick else args.quiet_s
    clean = any_incident = disturbed = 0
    for n in range(quiet_runs):
        s, _, _, headline, steal_share, _ = one(QUIET, quiet_s / 2, quiet_s / 2)
        clean += not s.found
        any_incident += headline != "(no incident)"
        disturbed += steal_disturbed(s, steal_share)
        print(f"  quiet [{n + 1}/{quiet_runs}] incident of the victim: {s.found} (cause: "
              f"{s.named}); steal {steal_share:.1%} of a CPU; first headline: {headline}",
              flush=True)  # fmt: skip
    print(f"quiet recordings ({quiet_runs} x {quiet_s:.0f} s, victim alone), Wilson 95 %: no "
          f"incident of the victim {Rate(clean, quiet_runs)}; no incident at all (machine's other "
          f"load included) {Rate(quiet_runs - any_incident, quiet_runs)}")  # fmt: skip
    undisturbed = quiet_runs - disturbed
    if disturbed:
        print(f"  {disturbed} of them not quiet (an incident put on hypervisor steal, a CPU losing "
              f">= 1 % of the recording to it by /proc/stat); of the {undisturbed} quiet ones: no "
              f"incident of the victim {Rate(clean, undisturbed)}")  # fmt: skip


def table(
    results: dict[str, list[Run]],
    per_kind: int,
    baseline_s: float,
    fault_s: float,
) -> None:
    print(f"\nroot-cause accuracy ({per_kind} injection(s) per kind, {baseline_s:.0f} s baseline "
          f"+ {fault_s:.0f} s fault, 0.5 s intervals, all probes)")  # fmt: skip
    print(f"  {'kind':<19} {'n':>3} {'found':>6} {'top-1':>6} {'top-3':>6} "
          f"{'|dt| median':>12} {'baseline top-1':>15} {'explain s':>10}")  # fmt: skip
    totals = [0, 0, 0, 0, 0]
    for kind, rows in results.items():
        scores = [r.score for r in rows]
        found = sum(s.found for s in scores)
        top1 = sum(s.top1 for s in scores)
        top3 = sum(s.top3 for s in scores)
        base = sum(r.baseline_top1 for r in rows)
        errors = [abs(s.time_error_s) for s in scores if not math.isnan(s.time_error_s)]
        median = f"{statistics.median(errors):.2f} s" if errors else "-"
        seconds = statistics.mean(r.explain_s for r in rows)
        print(f"  {kind:<19} {len(rows):>3} {found:>6} {top1:>6} {top3:>6} {median:>12} "
              f"{base:>15} {seconds:>10.1f}")  # fmt: skip
        for i, value in enumerate((len(rows), found, top1, top3, base)):
            totals[i] += value
    n, found, top1, top3, base = totals
    print(f"  {'all':<19} {n:>3} {found:>6} {top1:>6} {top3:>6} {'':>12} {base:>15}")
    print(f"  top-1 {top1 / n:.0%}, top-3 {top3 / n:.0%}; same-run baseline (run-queue aggressor "
          f"only) top-1 {base / n:.0%}; ratio {top1 / max(base, 1):.1f}x")  # fmt: skip


if __name__ == "__main__":
    main()
