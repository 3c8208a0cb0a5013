"""``tailsight explain RECORDING`` (or ``--prometheus URL``): the tail jumps of a recording, or of
the series a Prometheus holds, and their ranked causes, as plain text (80 columns), JSON, or a
self-contained HTML report.

Exit status: 0 (whether or not jumps were found), 2 usage or input error.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

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
from tailsight.cli.shared import cannot_read, report_problems
from tailsight.cli.timerange import SinceOption, UntilOption, parse_time

if TYPE_CHECKING:
    from tailsight.collector.store.reader import Recording


def explain(
    recording: Annotated[
        Path | None, typer.Argument(help="Recording directory (tailsight record).")
    ] = None,
    since: SinceOption = None,
    until: UntilOption = None,
    series: Annotated[
        str | None,
        typer.Option(
            "--series", "--selector", help="Only series with these labels, e.g. probe=runqueue."
        ),
    ] = None,
    quantiles: Annotated[
        str, typer.Option("--quantiles", help="Tail quantiles to test, e.g. 0.99,0.999.")
    ] = "0.99",
    json_output: Annotated[bool, typer.Option("--json", help="Print JSON, no text.")] = False,
    html: Annotated[
        Path | None, typer.Option("--html", help="Also write an offline HTML report here.")
    ] = None,
    falls: Annotated[
        bool, typer.Option("--falls", help="Also list tails that got faster (no causes).")
    ] = False,
    seed: Annotated[int, typer.Option("--seed", help="Bootstrap seed.")] = 0,
    prometheus: PrometheusOption = None,
    step: StepOption = None,
    basic_auth: BasicAuthOption = None,
    bearer_token_file: BearerTokenFileOption = None,
    ca_file: CaFileOption = None,
    insecure_skip_verify: InsecureOption = False,
) -> None:
    """Find tail rises, group them into incidents and explain each: when, what rose, by how much,
    the most likely cause across probes, then the per-series detail."""
    # Loads numpy: kept out of `tailsight --help`.
    from tailsight.analysis.explain.model import ExplainConfig
    from tailsight.analysis.explain.pipeline import explain_documents, explain_recording
    from tailsight.analysis.explain.text import describe_report, report_json
    from tailsight.analysis.quantiles import parse_quantiles, parse_selector
    from tailsight.collector.store.reader import Recording

    try:
        selector = parse_selector(series)
        qs = tuple(parse_quantiles(quantiles))
    except ValueError as error:
        raise typer.BadParameter(str(error)) from error
    if (recording is None) == (prometheus is None):
        raise typer.BadParameter("give a RECORDING or --prometheus URL (one of them)")
    store: Recording | None = None
    config = ExplainConfig(quantiles=qs, seed=seed, falls=falls)
    since_ns = until_ns = None
    if prometheus is not None:
        documents = read_prometheus(
            prometheus,
            since,
            until,
            step,
            basic_auth,
            bearer_token_file,
            ca_file,
            insecure_skip_verify,
            selector,
        )
        source_name = prometheus
    else:
        assert recording is not None
        source_name = recording.name
        try:  # streamed: a recording's histograms never all sit in memory at once
            store = Recording(recording)
            bounds = _bounds(store) if since is not None or until is not None else None
            if bounds is not None:
                since_ns = None if since is None else parse_time(since, *bounds)
                until_ns = None if until is None else parse_time(until, *bounds)
            report = explain_recording(store, selector, config, since_ns, until_ns)
        except FileNotFoundError as error:
            raise typer.BadParameter(str(error), param_hint="RECORDING") from error
        except OSError as error:
            cannot_read(recording, error)
    if prometheus is not None:
        report = explain_documents(documents, selector, config)
    # The report goes out first: a bad --html path must not cost the reader the analysis.
    if json_output:
        sys.stdout.write(json.dumps(report_json(report), indent=1, allow_nan=False) + "\n")
    else:
        sys.stdout.write(describe_report(report))
    sys.stdout.flush()
    if store is not None:
        report_problems(store)
    if html is not None:
        # Loads numpy: kept out of `tailsight --help`.
        from tailsight.analysis.explain.html import render_html, write_report

        if store is not None:  # the heatmaps need the histograms: only this reads them all
            documents = store.documents(since_ns, until_ns)
        page = render_html(report, documents, title=f"tailsight explain {source_name}")
        try:
            write_report(html, page)
        except OSError as error:
            reason = error.strerror or str(error)
            print(f"error: cannot write the HTML report to {html}: {reason}", file=sys.stderr)
            raise typer.Exit(2) from None
        if not json_output:
            sys.stdout.write(f"HTML report: {html}\n")


def _bounds(store: Recording) -> tuple[int, int] | None:
    """Start of the first interval and end of the last, in (start, end) order: what relative
    ``--since``/``--until`` times count from."""
    keys = [(i.start_ns, i.end_ns) for i in store.iter_intervals()]
    return (min(keys)[0], max(keys)[1]) if keys else None
