"""``tailsight trace``: live per-cgroup latency histograms from the probes, or one
``tailsight.hist/1`` document with ``--json``."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, Final

import typer

from tailsight.probes.catalog import PROBE_CLASSES

if TYPE_CHECKING:
    from rich.console import RenderableType
    from rich.table import Table

    from tailsight.collector.cgroups import CgroupResolver
    from tailsight.hist import Histogram
    from tailsight.histfile import HistDocument, Series
    from tailsight.probes.base import Probe, Snapshot

KNOWN_PROBES: Final = tuple(PROBE_CLASSES)
VIEW_WIDTH: Final = 80
PROBE_HEADINGS: Final = {
    "runqueue": "run-queue wait",
    "netsyscall": "socket syscall latency",
}
# Sparkline columns: exact coarse buckets (each an upper bound of the 5 µs model), then "more".
SPARK_BOUNDS_NS: Final = (
    5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000, 2_500_000,
    5_000_000, 10_240_000, 20_480_000, 40_960_000, 81_920_000, 163_840_000,
)  # fmt: skip
SPARK_LEGEND: Final = "5µs ... 160ms+"
_BLOCKS: Final = "▁▂▃▄▅▆▇█"


@dataclass
class Session:
    """Attached probes, the cgroup filter and the cumulative baseline of one trace."""

    resolver: CgroupResolver
    cgroup_filter: list[str]
    probes: dict[str, Probe] = field(default_factory=dict)
    baseline: dict[str, Snapshot] = field(default_factory=dict)
    start_ns: int = 0

    def keep(self, path: str) -> bool:
        from tailsight.collector.cgroups import is_within

        return not self.cgroup_filter or any(is_within(path, c) for c in self.cgroup_filter)

    def refresh_filter(self) -> None:
        """Re-walk the filtered subtrees so descendants created since are recorded too."""
        if not self.cgroup_filter:
            return
        ids: set[int] = set()
        for path in self.cgroup_filter:
            ids.update(self.resolver.subtree_ids(path))
        for probe in self.probes.values():
            probe.set_cgroup_filter(ids)

    def document(self) -> HistDocument:
        """Everything since the trace started, all probes in one document."""
        from tailsight.histfile import HistDocument

        merged = HistDocument(start_ns=self.start_ns, end_ns=time.time_ns())
        for name, probe in self.probes.items():
            interval = probe.read() - self.baseline[name]
            doc = interval.to_document(self.start_ns, self.resolver.resolve_many, self.keep)
            merged.series.extend(doc.series)
            merged.counters.extend(doc.counters)
            merged.end_ns = max(merged.end_ns, doc.end_ns)
        return merged

    def close(self) -> None:
        for probe in self.probes.values():
            probe.close()
        self.probes.clear()


def open_session(
    probes: Sequence[str], cgroups: Sequence[str], warn: Callable[[str], None]
) -> Session:
    """Attach what can be attached (each failure reported through ``warn``)."""
    from tailsight.collector.cgroups import CgroupResolver, normalize
    from tailsight.probes.catalog import create_probe
    from tailsight.probes.features import find_cgroup2_mount

    resolver = CgroupResolver(find_cgroup2_mount())
    wanted = [normalize(c) for c in cgroups]
    for path in wanted:
        if not resolver.absolute(path).is_dir():
            raise typer.BadParameter(
                f"no cgroup {path} under {resolver.root}", param_hint="--cgroup"
            )
    session = Session(resolver, wanted)
    for name in probes:
        try:
            probe = create_probe(name)
            probe.set_cgroup_filter([] if wanted else None)
            probe.attach()
        except Exception as error:  # ProbeError, OffsetCheckError, bcc's bare Exception
            warn(f"probe {name}: not attached: {error}")
            continue
        session.probes[name] = probe
    session.refresh_filter()
    session.start_ns = time.time_ns()
    session.baseline = {name: p.read() for name, p in session.probes.items()}
    return session


def sparkline(hist: Histogram) -> str:
    """One character per coarse bucket, height relative to the fullest (blank = empty)."""
    counts = hist.rebucket(SPARK_BOUNDS_NS).tolist()
    peak = max(counts)
    if peak == 0:
        return " " * len(counts)
    return "".join(
        " " if n == 0 else _BLOCKS[min(len(_BLOCKS) - 1, int(len(_BLOCKS) * n / peak))]
        for n in counts
    )


def _us(value_ns: float) -> str:
    if math.isnan(value_ns):
        return "-"
    return f"{value_ns / 1_000:,.0f}" if value_ns >= 10_000 else f"{value_ns / 1_000:.1f}"


def series_name(labels: Mapping[str, str]) -> str:
    """A series' row heading: its cgroup, then any other labels (e.g. the syscall)."""
    extra = [v for k, v in sorted(labels.items()) if k not in ("probe", "cgroup")]
    return " ".join([labels.get("cgroup", "?"), *extra])


def _latency_table(title: str, series: list[Series]) -> Table:
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title, width=VIEW_WIDTH, title_justify="left", pad_edge=False)
    table.add_column("cgroup", overflow="fold", ratio=1)
    for heading in ("count", "P50 µs", "P99 µs", "P99.9 µs"):
        table.add_column(heading, justify="right", no_wrap=True)
    table.add_column(SPARK_LEGEND, no_wrap=True, width=len(SPARK_BOUNDS_NS) + 1)
    for s in sorted(series, key=lambda s: (-s.hist.count, series_name(s.labels))):
        p50, p99, p999 = s.hist.quantiles([0.5, 0.99, 0.999])
        table.add_row(
            Text(series_name(s.labels)),
            f"{s.hist.count:,}",
            _us(p50),
            _us(p99),
            _us(p999),
            sparkline(s.hist),
        )
    return table


def render(document: HistDocument, title: str, top: int = 5) -> RenderableType:
    """One latency table per probe (count, P50/P99/P99.9 µs, sparkline), the top displaced
    pairs, the top outlier stacks and the drop count."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    from tailsight.probes.outliers import short_stack, top_outlier_stacks
    from tailsight.probes.runqueue import top_pairs

    by_probe: dict[str, list[Series]] = {}
    for s in document.series:
        by_probe.setdefault(s.labels.get("probe", "?"), []).append(s)
    parts: list[RenderableType] = [Text(title, style="bold")]
    for probe in sorted(by_probe):
        heading = PROBE_HEADINGS.get(probe, probe)
        parts.append(_latency_table(f"{heading} ({probe})", by_probe[probe]))
    pairs = top_pairs(document, top)
    if pairs:
        table = Table(
            title="run-queue wait: victim <- aggressor",
            width=VIEW_WIDTH,
            title_justify="left",
            pad_edge=False,
        )
        table.add_column("victim", overflow="fold", ratio=1)
        table.add_column("aggressor", overflow="fold", ratio=1)
        table.add_column("wait ms", justify="right", no_wrap=True)
        table.add_column("switches", justify="right", no_wrap=True)
        for victim, aggressor, wait_ns, switches in pairs:
            table.add_row(Text(victim), Text(aggressor), f"{wait_ns / 1e6:,.1f}", f"{switches:,}")
        parts.append(table)
    stacks = top_outlier_stacks(document, top)
    if stacks:
        table = Table(
            title="top outlier stacks (leaf last)",
            width=VIEW_WIDTH,
            title_justify="left",
            pad_edge=False,
        )
        table.add_column("probe cgroup", overflow="fold", ratio=2)
        table.add_column("events", justify="right", no_wrap=True)
        table.add_column("kernel | user", overflow="fold", ratio=3)
        for stack in stacks:
            frames = f"{short_stack(stack.kernel_stack)} | {short_stack(stack.user_stack)}"
            where = " ".join(filter(None, (stack.probe, stack.cgroup, stack.detail)))
            table.add_row(Text(where), f"{stack.events:,}", Text(frames))
        parts.append(table)
    dropped = sum(c.value for c in document.counters if c.name.endswith("_dropped_events"))
    if dropped:
        parts.append(Text(f"dropped events: {dropped}"))
    return Group(*parts)


def wait_until(session: Session, duration_s: float | None, interval_s: float) -> None:
    """Sleep for the duration (or until Ctrl-C), refreshing the cgroup filter every interval."""
    deadline = None if duration_s is None else time.monotonic() + duration_s
    try:
        while deadline is None or time.monotonic() < deadline:
            remaining = interval_s if deadline is None else deadline - time.monotonic()
            time.sleep(max(0.0, min(interval_s, remaining)))
            session.refresh_filter()
    except KeyboardInterrupt:
        pass


def run_live(
    session: Session,
    duration_s: float | None,
    interval_s: float,
    console: Any,
    title: str = "latency per cgroup",
) -> HistDocument:
    """Refresh the view every interval until the duration ends or Ctrl-C; returns the summary."""
    from rich.live import Live

    deadline = None if duration_s is None else time.monotonic() + duration_s
    document = session.document()
    with Live(render(document, title), console=console, auto_refresh=False, transient=True) as live:
        try:
            while deadline is None or time.monotonic() < deadline:
                remaining = interval_s if deadline is None else deadline - time.monotonic()
                time.sleep(max(0.0, min(interval_s, remaining)))
                session.refresh_filter()
                document = session.document()
                elapsed_s = (document.end_ns - document.start_ns) / 1e9
                live.update(render(document, f"{title}, {elapsed_s:.0f} s"), refresh=True)
        except KeyboardInterrupt:
            pass
    return session.document()


def trace(
    probe: Annotated[
        list[str] | None,
        typer.Option(
            "--probe", help=f"Probe to attach (repeatable; default all: {', '.join(KNOWN_PROBES)})."
        ),
    ] = None,
    duration: Annotated[
        float | None, typer.Option("--duration", min=0.0, help="Seconds to run (default: Ctrl-C).")
    ] = None,
    cgroup: Annotated[
        list[str] | None,
        typer.Option(
            "--cgroup",
            help="Only this cgroup and its descendants, path relative to the cgroup2 root "
            "(repeatable).",
        ),
    ] = None,
    interval: Annotated[
        float, typer.Option("--interval", min=0.05, help="Seconds between refreshes.")
    ] = 1.0,
    json_output: Annotated[
        bool, typer.Option("--json", help="Print one tailsight.hist/1 document, no live view.")
    ] = False,
) -> None:
    """Trace latency per cgroup live (Ctrl-C ends with the summary)."""
    from rich.console import Console

    probes = list(dict.fromkeys(probe or KNOWN_PROBES))
    unknown = [p for p in probes if p not in KNOWN_PROBES]
    if unknown:
        raise typer.BadParameter(f"unknown probe(s) {unknown}; known: {list(KNOWN_PROBES)}")
    errors = Console(stderr=True)
    session = open_session(probes, cgroup or [], lambda m: errors.print(m, markup=False))
    if not session.probes:
        errors.print("nothing attached: run `tailsight doctor` to see why", markup=False)
        raise typer.Exit(1)
    try:
        if json_output:
            wait_until(session, duration, interval)
            sys.stdout.write(session.document().dumps())
            return
        console = Console(width=min(Console().width, VIEW_WIDTH))
        summary = run_live(session, duration, interval, console)
        elapsed_s = (summary.end_ns - summary.start_ns) / 1e9
        console.print(render(summary, f"summary over {elapsed_s:.1f} s"))
    finally:
        session.close()
