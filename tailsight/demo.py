"""``python -m tailsight.demo`` (what ``make demo`` runs): a live run-queue trace of the built-in
contention workload, then who displaced whom, where the slowest waits left the victims and the
victim's 5 µs histogram over time."""

from __future__ import annotations

import argparse
import sys

from tailsight.histfile import HistDocument
from tailsight.probes.outliers import short_stack, top_outlier_stacks
from tailsight.probes.runqueue import top_pairs

DEMO_SECONDS = 6.0
DEMO_INTERVAL_S = 0.25


def narrate(document: HistDocument, groups: dict[str, str]) -> list[str]:
    """One sentence per workload cgroup: its P99 wait, the cgroup that displaced it most and the
    stack of its most frequent outlier wait."""
    lines = []
    for group, path in groups.items():
        found = document.find(probe="runqueue", cgroup=path)
        if not found:
            lines.append(f"{path}: no run-queue waits recorded")
            continue
        hist = found[0].hist
        p99_ms = hist.quantile(0.99) / 1e6
        pairs = [p for p in top_pairs(document, limit=1000) if p[0] == path]
        total_ns = sum(w for _, _, w, _ in pairs) or 1
        victim_line = f"{path} ({group}): {hist.count:,} waits, P99 {p99_ms:.2f} ms"
        if pairs:
            _, aggressor, wait_ns, _ = pairs[0]
            share = 100 * wait_ns / total_ns
            victim_line += f"; displaced most by {aggressor} ({share:.0f}% of its wait)"
        lines.append(victim_line)
        stacks = [s for s in top_outlier_stacks(document, 1000) if s.cgroup == path]
        if stacks:
            events = sum(s.events for s in stacks)
            top = stacks[0]
            lines.append(
                f"  {events} outlier waits; most often it then left the CPU at "
                f"{short_stack(top.kernel_stack, 2)} | {short_stack(top.user_stack, 2)}"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console

    from tailsight.cli.trace import open_session, run_live
    from tailsight.cli.trace_view import (
        VIEW_WIDTH,
        Selection,
        heatmap,
        render,
        series_key,
        terminal_keys,
    )
    from tailsight.workload import contention, default_cpu

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--duration", type=float, default=DEMO_SECONDS, help="seconds to trace")
    args = parser.parse_args(argv)

    console = Console(width=min(Console().width, VIEW_WIDTH))
    cpu = default_cpu()
    console.print(
        f"tailsight demo: 2 busy loops in cgroup 'victim' and 1 in 'noisy', all pinned to "
        f"CPU {cpu}; tracing run-queue wait for {args.duration:.0f} s (Ctrl-C ends early).",
        markup=False,
    )
    with contention(cpu=cpu) as workload:
        groups = {g: workload.cgroup_path(g) for g in workload.groups}
        victim = Selection(
            "runqueue", series_key({"probe": "runqueue", "cgroup": groups["victim"]})
        )
        # Exactly the workload's groups: tests may run their own workloads under the same base.
        session = open_session(["runqueue"], list(groups.values()), console.print)
        if not session.probes:
            console.print("nothing attached: run `tailsight doctor` to see why")
            return 1
        try:
            with terminal_keys() as keys:
                result = run_live(
                    session, args.duration, DEMO_INTERVAL_S, console, keys=keys, selection=victim
                )
        finally:
            session.close()
    summary = result.summary
    elapsed_s = (summary.end_ns - summary.start_ns) / 1e9
    console.print(render(summary, f"summary: run-queue wait over {elapsed_s:.1f} s"))
    for line in narrate(summary, groups):
        console.print(line, markup=False)
    console.print()
    console.print(
        "How the victim's waits were spread, interval by interval (newest on the right):",
        markup=False,
    )
    # The victim's heatmap, whatever was selected live: the demo's story is about the victim.
    console.print(heatmap(result.intervals, victim, console.width))
    return 0


if __name__ == "__main__":
    sys.exit(main())
