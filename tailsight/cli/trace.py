"""``tailsight trace``: live per-cgroup latency histograms from the probes, or one
``tailsight.hist/1`` document with ``--json``."""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, Final, Protocol

import typer

from tailsight.cli.trace_view import (
    HISTORY_INTERVALS,
    KEY_QUIT,
    VIEW_WIDTH,
    KeySource,
    Selection,
    apply_key,
    render,
    resolve_selection,
    terminal_keys,
)
from tailsight.probes.catalog import PROBE_CLASSES

if TYPE_CHECKING:
    from tailsight.collector.cgroups import CgroupResolver
    from tailsight.histfile import HistDocument
    from tailsight.probes.base import Probe, Snapshot

KNOWN_PROBES: Final = tuple(PROBE_CLASSES)


class TraceSource(Protocol):
    """What the live loop needs from a session (a fake in tests)."""

    def refresh_filter(self) -> None: ...

    def advance(self) -> tuple[HistDocument, HistDocument]: ...


@dataclass
class Session:
    """Attached probes, the cgroup filter and the cumulative baseline of one trace."""

    resolver: CgroupResolver
    cgroup_filter: list[str]
    probes: dict[str, Probe] = field(default_factory=dict)
    baseline: dict[str, Snapshot] = field(default_factory=dict)
    last: dict[str, Snapshot] = field(default_factory=dict)
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

    def advance(self) -> tuple[HistDocument, HistDocument]:
        """One read of every probe: (everything since the start, the interval since the previous
        ``advance``); both from the same snapshot, so they agree exactly."""
        from tailsight.histfile import HistDocument

        now_ns = time.time_ns()
        total = HistDocument(start_ns=self.start_ns, end_ns=now_ns)
        interval = HistDocument(start_ns=now_ns, end_ns=now_ns)
        for name, probe in self.probes.items():
            snapshot = probe.read()
            previous = self.last.get(name, self.baseline[name])
            self.last[name] = snapshot
            since_start = snapshot - self.baseline[name]
            since_previous = snapshot - previous
            for merged, part in (
                (
                    total,
                    since_start.to_document(self.start_ns, self.resolver.resolve_many, self.keep),
                ),
                (
                    interval,
                    since_previous.to_document(
                        previous.taken_ns, self.resolver.resolve_many, self.keep
                    ),
                ),
            ):
                merged.series.extend(part.series)
                merged.counters.extend(part.counters)
                merged.start_ns = min(merged.start_ns, part.start_ns)
                merged.end_ns = max(merged.end_ns, part.end_ns)
        return total, interval

    def close(self) -> None:
        for probe in self.probes.values():
            probe.close()
        self.probes.clear()


def open_session(
    probes: Sequence[str], cgroups: Sequence[str], warn: Callable[[str], None]
) -> Session:
    """Attach what can be attached (each failure reported through ``warn``)."""
    from tailsight.collector.cgroups import CgroupResolver, find_cgroup2_mount, normalize
    from tailsight.probes.catalog import create_probe

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
    session.last = dict(session.baseline)
    return session


def wait_until(session: TraceSource, duration_s: float | None, interval_s: float) -> None:
    """Sleep for the duration (or until Ctrl-C), refreshing the cgroup filter every interval."""
    deadline = None if duration_s is None else time.monotonic() + duration_s
    try:
        while deadline is None or time.monotonic() < deadline:
            remaining = interval_s if deadline is None else deadline - time.monotonic()
            time.sleep(max(0.0, min(interval_s, remaining)))
            session.refresh_filter()
    except KeyboardInterrupt:
        pass


@dataclass
class LiveResult:
    """What a live trace leaves: the whole run, its last intervals and the final selection."""

    summary: HistDocument
    intervals: list[HistDocument]
    selection: Selection | None


def run_live(
    session: TraceSource,
    duration_s: float | None,
    interval_s: float,
    console: Any,
    title: str = "latency per cgroup",
    keys: KeySource | None = None,
    selection: Selection | None = None,
) -> LiveResult:
    """Refresh the view every interval until the duration ends, Ctrl-C or ``q``; keys (if any)
    move the selection between refreshes and redraw at once."""
    from rich.live import Live

    intervals: deque[HistDocument] = deque(maxlen=HISTORY_INTERVALS)
    document, _ = session.advance()  # the moments since the session opened: not an interval
    selection = resolve_selection(document, selection)
    deadline = None if duration_s is None else time.monotonic() + duration_s
    height = max(10, int(getattr(console, "height", 40)) - 1)

    def view() -> Any:
        elapsed_s = (document.end_ns - document.start_ns) / 1e9
        return render(
            document,
            f"{title}, {elapsed_s:.0f} s",
            selection=selection,
            intervals=list(intervals),
            height=height,
            keys_help=keys is not None,
        )

    with Live(view(), console=console, auto_refresh=False, transient=True) as live:
        next_refresh = time.monotonic()
        try:
            while True:
                # On a fixed schedule, so that columns of the heatmap are equal intervals.
                next_refresh = max(next_refresh + interval_s, time.monotonic())
                if deadline is not None:
                    next_refresh = min(next_refresh, deadline)
                stop = False
                try:
                    while (remaining_s := next_refresh - time.monotonic()) > 0:
                        if keys is None:
                            time.sleep(remaining_s)
                            break
                        key = keys.read(remaining_s)
                        if key == KEY_QUIT:
                            stop = True
                            break
                        if key is not None:
                            selection = apply_key(document, selection, key)
                            live.update(view(), refresh=True)
                except KeyboardInterrupt:
                    stop = True
                # Always at least one interval, and the last (partial) one when stopped early.
                session.refresh_filter()
                document, interval = session.advance()
                intervals.append(interval)
                selection = resolve_selection(document, selection)
                if stop or (deadline is not None and time.monotonic() >= deadline):
                    break
                live.update(view(), refresh=True)
        except KeyboardInterrupt:
            pass
    return LiveResult(document, list(intervals), selection)


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
    from tailsight.probes.loader import PrivilegeError, require_bpf_privileges

    try:  # one message up front, not a compile failure per probe
        require_bpf_privileges()
    except PrivilegeError as error:
        errors.print(f"tailsight trace: {error}", markup=False, soft_wrap=True)
        raise typer.Exit(2) from None
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
        with terminal_keys() as keys:
            result = run_live(session, duration, interval, console, keys=keys)
        summary = result.summary
        elapsed_s = (summary.end_ns - summary.start_ns) / 1e9
        console.print(
            render(
                summary,
                f"summary over {elapsed_s:.1f} s",
                selection=result.selection,
                intervals=result.intervals,
            )
        )
    finally:
        session.close()
