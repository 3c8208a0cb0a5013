"""``--prometheus URL`` of ``explain`` and ``show``: the options (window, step, auth, TLS) and
the read of the exported series into interval documents (``analysis/promsource.py``)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Final

import typer

from tailsight.cli.timerange import parse_time

if TYPE_CHECKING:
    from tailsight.intervals import HistDocument

BASIC_AUTH_ENV: Final = "TAILSIGHT_PROMETHEUS_BASIC_AUTH"
DEFAULT_WINDOW: Final = "-15m"

PrometheusOption = Annotated[
    str | None,
    typer.Option(
        "--prometheus",
        help="Read the exported series from this Prometheus HTTP API (Prometheus, Thanos, "
        "Mimir, ...) instead of a recording; default window the last 15 min.",
    ),
]
StepOption = Annotated[
    float | None,
    typer.Option("--step", min=0.001, help="--prometheus: seconds per interval (default: scrape)."),
]
BasicAuthOption = Annotated[
    str | None,
    typer.Option(
        "--basic-auth",
        envvar=BASIC_AUTH_ENV,
        help="--prometheus: USER:PASSWORD.",
        show_default=False,
    ),
]
BearerTokenFileOption = Annotated[
    Path | None,
    typer.Option("--bearer-token-file", help="--prometheus: file holding a bearer token."),
]
CaFileOption = Annotated[
    Path | None, typer.Option("--ca-file", help="--prometheus: CA bundle (PEM) for https.")
]
InsecureOption = Annotated[
    bool,
    typer.Option("--insecure-skip-verify", help="--prometheus: do not verify the TLS certificate."),
]


def fail(message: str) -> typer.Exit:
    """One line on stderr; the caller raises the returned exit (status 2)."""
    print(f"error: {message}", file=sys.stderr)
    return typer.Exit(2)


def read_prometheus(
    url: str,
    since: str | None,
    until: str | None,
    step_s: float | None,
    basic_auth: str | None,
    bearer_token_file: Path | None,
    ca_file: Path | None,
    insecure_skip_verify: bool,
    selector: dict[str, str] | None = None,
) -> list[HistDocument]:
    """The window's documents; every problem is one line on stderr and exit 2."""
    # Loads numpy: kept out of `tailsight --help`.
    from tailsight.analysis.promsource import PrometheusError, PrometheusSource, read_documents

    credentials = None
    if basic_auth is not None:
        user, sep, password = basic_auth.partition(":")
        if not sep or not user:
            raise fail(f"--basic-auth (or ${BASIC_AUTH_ENV}) must be USER:PASSWORD")
        credentials = (user, password)
    token = None
    if bearer_token_file is not None:
        try:
            token = bearer_token_file.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as error:
            reason = getattr(error, "strerror", None) or str(error)
            raise fail(f"cannot read --bearer-token-file {bearer_token_file}: {reason}") from None
        if not token:
            raise fail(f"--bearer-token-file {bearer_token_file} is empty")
    if ca_file is not None and not os.access(ca_file, os.R_OK):
        raise fail(f"cannot read --ca-file {ca_file}")
    now_ns = time.time_ns()
    try:
        # -D / +D count from the default window: the last 15 minutes up to now.
        until_ns = now_ns if until is None else parse_time(until, now_ns, now_ns)
        default_start = parse_time(DEFAULT_WINDOW, until_ns, until_ns)
        since_ns = default_start if since is None else parse_time(since, default_start, until_ns)
    except typer.BadParameter as error:
        raise fail(str(error.message)) from None
    try:
        source = PrometheusSource(
            url,
            basic_auth=credentials,
            bearer_token=token,
            ca_file=ca_file,
            insecure_skip_verify=insecure_skip_verify,
        )
        documents, _ = read_documents(source, since_ns / 1e9, until_ns / 1e9, step_s, selector)
    except PrometheusError as error:
        raise fail(str(error)) from None
    return documents
