"""``tailsight gate``: regression gate between baseline and candidate runs (``tailsight.hist/1``).

Exit status: 0 pass, 1 regression, 3 inconclusive, 2 usage or input error.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Final

import typer

if TYPE_CHECKING:
    from tailsight.analysis.gate import Breakdown, GateResult
    from tailsight.intervals import LabelKey

VIEW_WIDTH: Final = 80
_STYLE: Final = {"pass": "green", "regression": "bold red", "inconclusive": "yellow"}


def format_ns(value_ns: float | None) -> str:
    """Latency with a unit that keeps 3-4 significant digits."""
    if value_ns is None or math.isnan(value_ns):
        return "-"
    if value_ns < 1e6:
        return f"{value_ns / 1e3:.1f}µs"
    if value_ns < 1e9:
        return f"{value_ns / 1e6:.3g}ms"
    return f"{value_ns / 1e9:.3g}s"


def _ratio(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.3f}"


def _split_labels(keys: list[LabelKey]) -> tuple[dict[str, str], list[str]]:
    """Labels shared by every gated series, and the names of those that tell them apart."""
    common = dict(keys[0]) if keys else {}
    for key in keys[1:]:
        labels = dict(key)
        common = {k: v for k, v in common.items() if labels.get(k) == v}
    varying = sorted({name for key in keys for name, _ in key} - set(common))
    return common, varying


def render(result: GateResult, width: int = VIEW_WIDTH) -> None:
    """One compact table of every comparison, the stage breakdown of what regressed, the verdict."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    # Loads numpy: kept out of `tailsight --help`.
    from tailsight.analysis.quantiles import describe, quantile_name

    console = Console(width=min(Console().width, width), highlight=False)
    config = result.config
    keys: list[LabelKey] = []
    for comparison in result.comparisons:
        if comparison.series not in keys:
            keys.append(comparison.series)
    common, varying = _split_labels(keys)
    console.print(f"gated: {describe(tuple(sorted(common.items())))}")
    console.print(
        f"{len(result.baseline_files)} baseline runs, {len(result.candidate_files)} candidate "
        f"runs; min effect max({config.min_effect:.0%}, {config.min_effect_ns / 1e3:g}µs); "
        f"alpha {config.alpha:g} family-wise (Holm-Bonferroni, {result.family_size} "
        f"comparisons)"
    )
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 0))
    columns = [("series", "left")] if varying else []
    columns += [
        ("q", "left"),
        ("runs", "right"),
        ("base", "right"),
        ("cand", "right"),
        ("ratio", "right"),
        (f"{1 - 2 * config.alpha:.0%} CI", "center"),
        ("limit", "right"),
        ("verdict", "left"),
    ]
    for name, justify in columns:
        table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for c in result.comparisons:
        labels = dict(c.series)
        row = [",".join(labels.get(name, "-") for name in varying)[:22]] if varying else []
        interval = "-" if math.isnan(c.ratio_low) else f"{c.ratio_low:.3f}-{c.ratio_high:.3f}"
        row += [
            quantile_name(c.quantile),
            f"{c.baseline_runs}/{c.candidate_runs}",
            format_ns(c.baseline_ns),
            format_ns(c.candidate_ns),
            _ratio(c.ratio),
            interval,
            _ratio(c.threshold),
            f"[{_STYLE[c.outcome.value]}]{c.outcome.value}[/]",
        ]
        table.add_row(*row)
    console.print(table)
    for c in result.comparisons:
        if c.outcome.value != "pass":
            where = f"{describe(c.series)} " if varying else ""
            console.print(f"  {where}{quantile_name(c.quantile)}: {c.reason}")
    for breakdown in result.breakdowns:
        _render_breakdown(console, breakdown, varying)
    for note in result.notes:
        console.print(f"note: {note}")
    verdict = result.outcome.value.upper()
    console.print(f"[{_STYLE[result.outcome.value]}]{verdict}[/] (exit {result.exit_code})")


def _render_breakdown(console: object, breakdown: Breakdown, varying: list[str]) -> None:
    """Per stage of the regressed series, so the reader sees where the time went."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    # Loads numpy: kept out of `tailsight --help`.
    from tailsight.analysis.quantiles import quantile_name

    assert isinstance(console, Console)
    if not breakdown.stages:
        return
    labels = dict(breakdown.series)
    which = ",".join(f"{k}={labels[k]}" for k in varying if k in labels)
    name = quantile_name(breakdown.quantile)
    console.print(f"where: stages at {name} (median per-run {name}){' ' + which if which else ''}")
    largest = max(breakdown.stages, key=lambda s: s.candidate_ns - s.baseline_ns)
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 0))
    for column, justify in (("stage", "left"), ("base", "right"), ("cand", "right")):
        table.add_column(column, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    table.add_column("ratio", justify="right", no_wrap=True)
    table.add_column("", no_wrap=True)
    for stage in breakdown.stages:
        mark = "◀ largest rise" if stage is largest and stage.ratio > 1 else ""
        table.add_row(
            stage.stage,
            format_ns(stage.baseline_ns),
            format_ns(stage.candidate_ns),
            _ratio(stage.ratio),
            mark,
        )
    console.print(table)


def gate(
    baseline: Annotated[
        list[Path],
        typer.Option(
            "--baseline", "-b", metavar="RUNS", help="baseline run file or directory (repeatable)"
        ),
    ],
    candidate: Annotated[
        list[Path],
        typer.Option(
            "--candidate", "-c", metavar="RUNS", help="candidate run file or directory (repeatable)"
        ),
    ],
    series: Annotated[
        list[str] | None,
        typer.Option(
            metavar="SELECTOR",
            help="label filter instead of the in-system tick-to-trade, e.g. stage=book "
            "(repeatable; Holm-Bonferroni over all comparisons)",
        ),
    ] = None,
    quantiles: Annotated[str, typer.Option(help="comma-separated quantiles")] = "0.5,0.99",
    alpha: Annotated[float, typer.Option(help="family-wise significance level")] = 0.05,
    min_effect: Annotated[float, typer.Option(help="smallest relative regression")] = 0.05,
    min_effect_us: Annotated[float, typer.Option(help="smallest absolute regression, µs")] = 5.0,
    min_runs: Annotated[int, typer.Option(help="runs needed per side")] = 5,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON document")] = False,
) -> None:
    """Compare per-run quantiles: exit 0 pass, 1 regression, 3 inconclusive, 2 bad input."""
    # Loads numpy: kept out of `tailsight --help`.
    from tailsight.analysis.gate import GateConfig, gate_paths
    from tailsight.analysis.quantiles import RunInputError, parse_quantiles, parse_selector

    try:
        config = GateConfig(
            quantiles=tuple(parse_quantiles(quantiles)),
            alpha=alpha,
            min_effect=min_effect,
            min_effect_ns=min_effect_us * 1e3,
            min_runs=min_runs,
        )
        selectors = [parse_selector(text) for text in series or []]
    except ValueError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2) from error
    try:
        result = gate_paths(baseline, candidate, selectors, config)
    except RunInputError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2) from error
    if as_json:
        typer.echo(json.dumps(result.to_json(), indent=2, ensure_ascii=False))
    else:
        render(result)
    raise typer.Exit(result.exit_code)
