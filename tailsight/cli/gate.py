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
    from tailsight.analysis.gate import GateResult

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


def render(result: GateResult, width: int = VIEW_WIDTH) -> None:
    """One table per series, then the verdict and the reasons for anything not passing."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    from tailsight.analysis.quantiles import describe, quantile_name

    console = Console(width=min(Console().width, width), highlight=False)
    config = result.config
    console.print(
        f"{len(result.baseline_files)} baseline runs, {len(result.candidate_files)} candidate "
        f"runs; alpha {config.alpha:g}, min effect max({config.min_effect:.0%}, "
        f"{config.min_effect_ns / 1e3:g}µs)"
    )
    series_order: list[tuple[tuple[str, str], ...]] = []
    for comparison in result.comparisons:
        if comparison.series not in series_order:
            series_order.append(comparison.series)
    level = f"{1 - 2 * config.alpha:.0%} CI"
    for key in series_order:
        rows = [c for c in result.comparisons if c.series == key]
        table = Table(
            title=describe(key)[: width - 2],
            title_justify="left",
            box=box.SIMPLE_HEAD,
            pad_edge=False,
        )
        for name, justify in (
            ("q", "left"),
            ("runs", "right"),
            ("base", "right"),
            ("cand", "right"),
            ("ratio", "right"),
            (level, "center"),
            ("p", "right"),
            ("verdict", "left"),
        ):
            table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
        for c in rows:
            interval = (
                "-" if math.isnan(c.ratio_low) else f"{_ratio(c.ratio_low)}-{_ratio(c.ratio_high)}"
            )
            table.add_row(
                quantile_name(c.quantile),
                f"{c.baseline_runs}/{c.candidate_runs}",
                format_ns(c.baseline_ns),
                format_ns(c.candidate_ns),
                _ratio(c.ratio),
                interval,
                "-" if math.isnan(c.p_value) else f"{c.p_value:.2g}",
                f"[{_STYLE[c.outcome.value]}]{c.outcome.value}[/]",
            )
        console.print(table)
        for c in rows:
            if c.outcome.value != "pass":
                console.print(f"  {quantile_name(c.quantile)}: {c.reason}")
    for note in result.notes:
        console.print(f"note: {note}")
    verdict = result.outcome.value.upper()
    console.print(f"[{_STYLE[result.outcome.value]}]{verdict}[/] (exit {result.exit_code})")


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
        str, typer.Option(help="label filter, e.g. probe=replay,stage=tick_to_trade")
    ] = "",
    quantiles: Annotated[str, typer.Option(help="comma-separated quantiles")] = "0.5,0.99,0.999",
    alpha: Annotated[float, typer.Option(help="significance level per comparison")] = 0.05,
    min_effect: Annotated[float, typer.Option(help="smallest relative regression")] = 0.05,
    min_effect_us: Annotated[float, typer.Option(help="smallest absolute regression, µs")] = 10.0,
    min_runs: Annotated[int, typer.Option(help="runs needed per side")] = 5,
    bootstrap: Annotated[int, typer.Option(help="bootstrap resamples")] = 2000,
    seed: Annotated[int, typer.Option(help="bootstrap seed: same seed, same result")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON document")] = False,
) -> None:
    """Compare per-run quantiles: exit 0 pass, 1 regression, 3 inconclusive, 2 bad input."""
    from tailsight.analysis.gate import GateConfig, gate_paths
    from tailsight.analysis.quantiles import RunInputError, parse_quantiles, parse_selector

    try:
        config = GateConfig(
            quantiles=tuple(parse_quantiles(quantiles)),
            alpha=alpha,
            min_effect=min_effect,
            min_effect_ns=min_effect_us * 1e3,
            min_runs=min_runs,
            bootstrap=bootstrap,
            seed=seed,
        )
        selector = parse_selector(series)
    except ValueError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2) from error
    try:
        result = gate_paths(baseline, candidate, selector, config)
    except RunInputError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2) from error
    if as_json:
        typer.echo(json.dumps(result.to_json(), indent=2, ensure_ascii=False))
    else:
        render(result)
    raise typer.Exit(result.exit_code)
