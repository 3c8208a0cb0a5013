"""``tailsight dashboards``: the Grafana dashboards as code: write their JSON, push them to a
Grafana, or render the root-cause view of a recording as a static HTML page.

Exit status: 0 done, 1 ``generate --check`` found stale files or Grafana refused the push,
2 usage or input error.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from tailsight.cli.shared import cannot_read

app = typer.Typer(
    help="Grafana dashboards: generate their JSON, push them, or render the root-cause page.",
    no_args_is_help=True,
)


@app.command()
def generate(
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Directory to write into (default: dashboards/generated)."),
    ] = None,
    check: Annotated[
        bool, typer.Option("--check", help="Write nothing; exit 1 if a file is out of date.")
    ] = False,
) -> None:
    """Write every dashboard's Grafana JSON (one file per dashboard)."""
    # Loads the Grafana SDK and numpy: kept out of `tailsight --help`.
    from tailsight.dashboards.generate import BUILDERS, GENERATED_DIR, render, to_text, write_all

    directory = GENERATED_DIR if out is None else out
    if not directory.is_dir():
        raise typer.BadParameter(f"{directory} is not a directory", param_hint="--out")
    if check:
        stale = [
            name
            for name in BUILDERS
            if not (directory / f"{name}.json").is_file()
            or (directory / f"{name}.json").read_text(encoding="utf-8") != to_text(render(name))
        ]
        for name in stale:
            print(f"out of date: {directory / f'{name}.json'}", file=sys.stderr)
        if stale:
            raise typer.Exit(1)
        return
    try:
        written = write_all(directory)
    except OSError as error:
        print(f"error: cannot write into {directory}: {error.strerror or error}", file=sys.stderr)
        raise typer.Exit(2) from None
    for path in written:
        print(path)


@app.command()
def push(
    url: Annotated[str, typer.Option("--url", help="Grafana root URL, e.g. http://grafana:3000.")],
    token: Annotated[
        str,
        typer.Option(
            "--token",
            envvar="TAILSIGHT_GRAFANA_TOKEN",
            help="Service-account token (Editor); or $TAILSIGHT_GRAFANA_TOKEN.",
        ),
    ],
    folder: Annotated[
        str, typer.Option("--folder", help="Folder uid (and title) to put them in.")
    ] = "tailsight",
    json_output: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Create or overwrite every dashboard in a Grafana folder (created if missing)."""
    # Loads the Grafana SDK and numpy: kept out of `tailsight --help`.
    from tailsight.dashboards.push import PushError, connect, push_all

    try:
        api = connect(url, token)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from error
    try:
        pushed = push_all(api, folder_uid=folder, folder_title=folder)
    except PushError as error:
        print(f"error: push to {url} failed: {error}", file=sys.stderr)
        raise typer.Exit(1) from None
    if json_output:
        rows = [vars(p) for p in pushed]
        sys.stdout.write(json.dumps({"url": url, "folder": folder, "dashboards": rows}) + "\n")
        return
    for p in pushed:
        print(f"{p.name}: uid {p.uid}, version {p.version}, {url.rstrip('/')}{p.url}")


@app.command("html")
def html_page(
    recording: Annotated[Path, typer.Argument(help="Recording directory (tailsight record).")],
    victim: Annotated[str, typer.Option("--victim", help="Cgroup path, e.g. /trading/feed.")],
    out: Annotated[Path, typer.Option("--out", help="HTML file to write.")],
) -> None:
    """The root-cause dashboard of a recording as one offline HTML page (no Grafana needed)."""
    # Loads numpy: kept out of `tailsight --help`.
    from tailsight.analysis.explain.html import write_report
    from tailsight.collector.store.reader import Recording
    from tailsight.dashboards.rootcause_html import render_root_cause

    try:
        documents = Recording(recording).documents()
    except FileNotFoundError as error:
        raise typer.BadParameter(str(error), param_hint="RECORDING") from error
    except OSError as error:
        cannot_read(recording, error)
    known = {
        labels.get(name)
        for d in documents
        for labels in [s.labels for s in d.series] + [c.labels for c in d.counters]
        for name in ("cgroup", "victim")
    }
    if victim not in known:
        raise typer.BadParameter(
            f"no series of cgroup {victim!r} in {recording}", param_hint="--victim"
        )
    try:
        write_report(out, render_root_cause(documents, victim))
    except OSError as error:
        print(f"error: cannot write {out}: {error.strerror or error}", file=sys.stderr)
        raise typer.Exit(2) from None
    print(out)
