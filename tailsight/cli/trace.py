"""``tailsight trace``: live per-cgroup latency histograms from the probes, or one
``tailsight.hist/1`` document with ``--json``."""

from __future__ import annotations

import contextlib
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

import typer

from tailsight.cli.shared import ProbeOption
from tailsight.cli.trace_view import (
    HISTORY_INTERVALS,
    KEY_QUIT,
    VIEW_WIDTH,
    HeatInterval,
    KeySource,
    Selection,
    apply_key,
    render,
    resolve_selection,
    terminal_keys,
)

if TYPE_CHECKING:
    from tailsight.cli.wiring import LiveSession, LiveSource
    from tailsight.intervals import HistDocument


def open_session(
    probes: Sequence[str], cgroups: Sequence[str], warn: Callable[[str], None], interval_s: float
) -> LiveSession:
    """The collector's live session; a ``--cgroup`` that is not there is bad input (exit 2)."""
    # Loads numpy: kept out of `tailsight --help`.
    from tailsight.cli.wiring import BadInput
    from tailsight.cli.wiring import open_session as open_live_session

    try:
        return open_live_session(probes, cgroups, warn, interval_s)
    except BadInput as error:
        raise typer.BadParameter(str(error), param_hint=error.option) from None


@dataclass
class LiveResult:
    """What a live trace leaves: the whole run, its last intervals and the final selection."""

    summary: HistDocument
    intervals: list[HeatInterval]
    selection: Selection | None


def run_live(
    session: LiveSource,
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

    # Loads numpy: kept out of `tailsight --help`.
    from tailsight.collector.agent import run_every

    intervals: deque[HeatInterval] = deque(maxlen=HISTORY_INTERVALS)
    document, _ = session.advance()  # the moments since the session opened: not an interval
    selection = resolve_selection(document, selection)
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

        def wait(timeout_s: float) -> bool:
            """Until the next refresh keys move the selection and redraw; q or Ctrl-C stops."""
            nonlocal selection
            until = time.monotonic() + timeout_s
            try:
                while (remaining_s := until - time.monotonic()) > 0:
                    if keys is None:
                        time.sleep(remaining_s)
                        break
                    key = keys.read(remaining_s)
                    if key == KEY_QUIT:
                        return True
                    if key is not None:
                        selection = apply_key(document, selection, key)
                        live.update(view(), refresh=True)
            except KeyboardInterrupt:
                return True
            return False

        def refresh() -> None:
            nonlocal document, selection
            session.refresh_filter()
            document, interval = session.advance()
            intervals.append(HeatInterval.of(interval))
            selection = resolve_selection(document, selection)
            live.update(view(), refresh=True)

        # The collectors' schedule: fixed, so that columns of the heatmap are equal intervals;
        # always at least one interval, and the last (partial) one when stopped early.
        with contextlib.suppress(KeyboardInterrupt):
            run_every(interval_s, refresh, wait, duration_s)
    return LiveResult(document, list(intervals), selection)


def trace(
    probe: ProbeOption = None,
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

    # Loads numpy: kept out of `tailsight --help`.
    from tailsight.cli.wiring import NOTHING_ATTACHED, BadInput, check_probes, wait_until
    from tailsight.probes.catalog import DEFAULT_PROBES
    from tailsight.probes.loader import PrivilegeError

    probes = list(dict.fromkeys(probe or DEFAULT_PROBES))
    errors = Console(stderr=True)
    try:  # one message up front, not a compile failure per probe
        check_probes(probes)
    except BadInput as error:
        raise typer.BadParameter(str(error), param_hint=error.option) from None
    except PrivilegeError as error:
        errors.print(f"tailsight trace: {error}", markup=False, soft_wrap=True)
        raise typer.Exit(2) from None
    session = open_session(probes, cgroup or [], lambda m: errors.print(m, markup=False), interval)
    if not session.probes:
        errors.print(NOTHING_ATTACHED, markup=False)
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
