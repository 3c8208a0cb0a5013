"""``tailsight record`` (full-resolution intervals to a recording directory) and ``tailsight show``
(quantiles over time per probe and cgroup from one, as a table or JSON)."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import threading
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Final

import typer

from tailsight.cli.promread import (
    BasicAuthOption,
    BearerTokenFileOption,
    CaFileOption,
    InsecureOption,
    PrometheusOption,
    StepOption,
    read_prometheus,
)
from tailsight.cli.shared import (
    ProbeOption,
    RetentionAgeOption,
    RetentionBytesOption,
    cannot_read,
    check_probes_or_exit,
    disk_full,
    log_to_stderr,
    reason,
    report_problems,
)
from tailsight.cli.timerange import SinceOption, UntilOption, parse_time

if TYPE_CHECKING:
    from tailsight.intervals import HistDocument

VIEW_WIDTH: Final = 80
SHOW_QUANTILES: Final = (0.5, 0.99, 0.999)


def record(
    directory: Annotated[Path, typer.Argument(help="Recording directory (created; appended to).")],
    duration: Annotated[
        float | None,
        typer.Option(
            "--duration", min=0.0, help="Seconds to record (default: until SIGTERM / Ctrl-C)."
        ),
    ] = None,
    probe: ProbeOption = None,
    interval: Annotated[
        float, typer.Option("--interval", min=0.05, help="Seconds per recorded interval.")
    ] = 1.0,
    retention_age: RetentionAgeOption = None,
    retention_bytes: RetentionBytesOption = None,
    group: Annotated[
        str | None,
        typer.Option(
            "--group", help="Group that may read the recording (0640/0750; default 0600/0700)."
        ),
    ] = None,
) -> None:
    """Record per-cgroup latency histograms, one document per interval."""
    # Loads numpy: kept out of `tailsight --help`.
    from tailsight.cli.wiring import open_recording, stop_on_signals
    from tailsight.cli.wiring import record as run_record
    from tailsight.collector.config import CollectorConfig

    try:
        config = CollectorConfig(
            probes=tuple(probe or ()),
            interval_s=interval,
            record_dir=directory,
            retention_max_age_s=retention_age,
            retention_max_bytes=retention_bytes,
        )
    except ValueError as error:
        raise typer.BadParameter(str(error)) from error
    check_probes_or_exit(config.probes)
    # The writer is made here, before anything is attached, so that a bad directory, a busy
    # one or a bad group is an input error (exit 2) that costs nothing.
    try:
        writer = open_recording(dataclasses.replace(config, record_group=group))
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--group") from error
    except OSError as error:
        typer.echo(f"error: cannot record to {directory}: {reason(error)}", err=True)
        raise typer.Exit(1 if disk_full(error) else 2) from None
    assert writer is not None
    stop = threading.Event()
    with stop_on_signals(stop):
        agent, failure = run_record(
            dataclasses.replace(config, record_dir=None), writer, stop, log_to_stderr, duration
        )
    if not agent.started:
        raise typer.Exit(1)
    if failure is not None:
        typer.echo(
            f"error: recording to {directory} stopped: {reason(failure)}; the "
            f"{writer.records_written} intervals written before stay readable "
            f"(tailsight show {directory})",
            err=True,
        )
        raise typer.Exit(1)
    log_to_stderr(f"{writer.records_written} intervals recorded in {directory}")


def summarize(documents: Iterable[HistDocument]) -> dict[str, Any]:
    """Per series: overall quantiles, the worst interval's P99, and counts and quantiles of every
    interval where it had observations. Streams: memory grows with series, not intervals."""
    # Loads numpy: kept out of `tailsight --help`.
    from tailsight.hist import Histogram
    from tailsight.intervals import LabelKey, key_of

    intervals = 0
    start_ns = end_ns = None
    totals: dict[LabelKey, Histogram] = {}
    rows: dict[LabelKey, list[tuple[int, int, list[float]]]] = {}
    counter_totals: dict[tuple[str, LabelKey], int] = {}
    for doc in documents:
        intervals += 1
        start_ns = doc.start_ns if start_ns is None else min(start_ns, doc.start_ns)
        end_ns = doc.end_ns if end_ns is None else max(end_ns, doc.end_ns)
        for series in doc.series:
            key = key_of(series)
            total = totals.get(key)
            if total is None:
                total = totals[key] = Histogram.empty()
            total.add(series.hist)
            quantiles = series.hist.quantiles(SHOW_QUANTILES)
            rows.setdefault(key, []).append((doc.end_ns, series.hist.count, quantiles))
        for counter in doc.counters:
            counter_key = (counter.name, key_of(counter))
            counter_totals[counter_key] = counter_totals.get(counter_key, 0) + counter.value
    summary: dict[str, Any] = {
        "intervals": intervals,
        "start_ns": start_ns,
        "end_ns": end_ns,
        "series": [],
        "counters": [],
    }
    for key, total in sorted(totals.items()):
        history = sorted(rows[key])
        p99s = [-1.0 if math.isnan(q[1]) else q[1] for _, _, q in history]
        worst = max(range(len(history)), key=p99s.__getitem__)
        summary["series"].append(
            {
                "labels": dict(key),
                "count": total.count,
                "quantiles_ns": _named(total.quantiles(SHOW_QUANTILES)),
                "worst_p99_ns": _finite(history[worst][2][1]),
                "worst_p99_end_ns": history[worst][0],
                "times_ns": [t for t, _, _ in history],
                "counts": [n for _, n, _ in history],
                "interval_quantiles_ns": [_named(q) for _, _, q in history],
            }
        )
    for (name, labels), value in sorted(counter_totals.items()):
        summary["counters"].append({"name": name, "labels": dict(labels), "total": value})
    return summary


def _named(values: list[float]) -> dict[str, float | None]:
    return {f"p{q * 100:g}": _finite(v) for q, v in zip(SHOW_QUANTILES, values, strict=True)}


def _finite(value: float) -> float | None:
    return None if math.isnan(value) else value


def _us(value_ns: float | None) -> str:
    if value_ns is None:
        return "-"
    return f"{value_ns / 1e3:,.0f}" if value_ns >= 10_000 else f"{value_ns / 1e3:.1f}"


def render(summary: dict[str, Any]) -> None:
    """One row per probe series: events, P50/P99/P99.9 over the range, worst interval P99."""
    from rich.console import Console
    from rich.table import Table

    console = Console(width=min(Console().width, VIEW_WIDTH), highlight=False)
    span_s = 0.0
    if summary["intervals"]:
        span_s = (summary["end_ns"] - summary["start_ns"]) / 1e9
        started = datetime.fromtimestamp(summary["start_ns"] / 1e9, UTC)
        console.print(
            f"{summary['intervals']} intervals over {span_s:,.1f} s from "
            f"{started:%Y-%m-%d %H:%M:%S} UTC",
            markup=False,
        )
    table = Table(width=VIEW_WIDTH, pad_edge=False, title_justify="left")
    table.add_column("probe / cgroup", overflow="fold", ratio=1)
    for heading in ("events", "P50 µs", "P99 µs", "P99.9 µs", "worst P99"):
        table.add_column(heading, justify="right", no_wrap=True)
    for entry in sorted(summary["series"], key=lambda e: (-e["count"], str(e["labels"]))):
        labels = dict(entry["labels"])
        parts = [labels.pop("probe", "?")]
        parts += [labels.pop(k) for k in ("what", "kind") if k in labels]
        parts.append(labels.pop("cgroup", labels.pop("victim", "")))
        parts += [value for _, value in sorted(labels.items())]
        name = " ".join(p for p in parts if p)
        q = entry["quantiles_ns"]
        table.add_row(
            name,
            f"{entry['count']:,}",
            _us(q["p50"]),
            _us(q["p99"]),
            _us(q["p99.9"]),
            _us(entry["worst_p99_ns"]),
        )
    console.print(table)


def show(
    directory: Annotated[Path | None, typer.Argument(help="Recording directory.")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print JSON, no table.")] = False,
    since: SinceOption = None,
    until: UntilOption = None,
    prometheus: PrometheusOption = None,
    selector: Annotated[
        str | None,
        typer.Option("--selector", help="--prometheus: only series with these labels (a=b,...)."),
    ] = None,
    step: StepOption = None,
    basic_auth: BasicAuthOption = None,
    bearer_token_file: BearerTokenFileOption = None,
    ca_file: CaFileOption = None,
    insecure_skip_verify: InsecureOption = False,
) -> None:
    """Summarize a recording, or what a Prometheus holds (--prometheus): quantiles over time per
    probe and cgroup."""
    # Loads numpy: kept out of `tailsight --help`.
    from tailsight.collector.store.reader import Recording

    if (directory is None) == (prometheus is None):
        raise typer.BadParameter("give a recording DIR or --prometheus URL (one of them)")
    if prometheus is not None:
        # Loads numpy: kept out of `tailsight --help`.
        from tailsight.analysis.quantiles import matches, parse_selector

        try:
            wanted = parse_selector(selector)
        except ValueError as error:
            raise typer.BadParameter(str(error), param_hint="--selector") from error
        read = read_prometheus(
            prometheus,
            since,
            until,
            step,
            basic_auth,
            bearer_token_file,
            ca_file,
            insecure_skip_verify,
            wanted,
        )
        for document in read:
            document.series = [s for s in document.series if matches(s.labels, wanted)]
        from_prometheus = summarize(read)
        if json_output:
            sys.stdout.write(json.dumps(from_prometheus, indent=1) + "\n")
        else:
            render(from_prometheus)
        return
    assert directory is not None
    try:
        recording = Recording(directory)
        since_ns = until_ns = None
        bounds = recording.time_bounds() if since is not None or until is not None else None
        if bounds is not None:
            since_ns = None if since is None else parse_time(since, *bounds)
            until_ns = None if until is None else parse_time(until, *bounds)
        summary = summarize(recording.iter_documents(since_ns, until_ns))
    except FileNotFoundError as error:
        raise typer.BadParameter(str(error), param_hint="DIR") from error
    except OSError as error:
        cannot_read(directory, error)
    summary["skipped_bytes"] = recording.skipped_bytes
    summary["problems"] = [
        {
            "segment": p.path.name,
            "offset": p.offset,
            "reason": p.reason,
            "skipped_bytes": p.skipped_bytes,
        }
        for p in recording.problems
    ]
    if json_output:
        sys.stdout.write(json.dumps(summary, indent=1) + "\n")
    else:
        render(summary)
    report_problems(recording)
