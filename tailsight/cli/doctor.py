"""``tailsight doctor``: can this host run tailsight, and if not, the one-line fix for each gap."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from tailsight.probes.noise import noise_checks

if TYPE_CHECKING:
    from tailsight.probes.features import Check

_TABLE_WIDTH_MAX = 80


def doctor(
    json_output: Annotated[
        bool, typer.Option("--json", help="Print the checks as a JSON list.")
    ] = False,
    noise: Annotated[
        float,
        typer.Option(
            "--noise",
            min=0.0,
            help="Also measure each CPU's noise floor for this many seconds (one CPU at a time).",
        ),
    ] = 0.0,
    proc_root: Annotated[Path, typer.Option("--proc", hidden=True)] = Path("/proc"),
    sys_root: Annotated[Path, typer.Option("--sys", hidden=True)] = Path("/sys"),
    modules_root: Annotated[Path, typer.Option("--modules", hidden=True)] = Path("/lib/modules"),
    search_path: Annotated[str | None, typer.Option(hidden=True)] = None,
) -> None:
    """Check privileges, BTF, bcc, offsets and tracepoints; exit 1 if a required check fails.

    With --noise, also how much of each CPU a task that never blocks loses (a warning above 1 %).
    """
    # Loads numpy: kept out of `tailsight --help`.
    from tailsight.probes.features import Host, run_checks

    checks = run_checks(
        Host(proc=proc_root, sys=sys_root, modules=modules_root, search_path=search_path)
    )
    if noise > 0:
        checks += noise_checks(noise)
    if json_output:
        typer.echo(json.dumps([dataclasses.asdict(check) for check in checks], indent=2))
    else:
        _print_table(checks)
    if any(check.required and not check.ok for check in checks):
        raise typer.Exit(1)


def _print_table(checks: list[Check]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.width = min(console.width, _TABLE_WIDTH_MAX)
    table = Table(title="tailsight doctor", title_justify="left")
    table.add_column("check", no_wrap=True)
    table.add_column("", no_wrap=True)
    table.add_column("detail", overflow="fold")
    for check in checks:
        if check.ok:
            verdict = "[green]ok[/]"
        else:
            verdict = "[red]FAIL[/]" if check.required else "[yellow]warn[/]"
        table.add_row(check.name, verdict, check.detail)
    console.print(table)
    failed = [check for check in checks if not check.ok]
    # Checks skipped because of an earlier failure carry its fix: print each fix once, one line,
    # never wrapped, so it can be copied as is.
    fixes: dict[str, str] = {}
    for check in failed:
        if check.fix is not None:
            fixes.setdefault(check.fix, check.name)
    for fix, name in fixes.items():
        console.print(f"fix {name}: {fix}", soft_wrap=True, markup=False)
    broken = sum(check.required for check in failed)
    if broken:
        console.print(f"[red]{broken} required check(s) failed[/]")
    else:
        console.print("[green]all required checks passed[/]")
