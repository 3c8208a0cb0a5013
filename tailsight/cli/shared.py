"""What more than one command does: the options they share, one-line reports on stderr, and the
exit status and message for a recording that cannot be read or written, or probes that cannot be
loaded."""

from __future__ import annotations

import errno
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

if TYPE_CHECKING:
    from tailsight.collector.store.reader import Recording

ProbeOption = Annotated[
    list[str] | None,
    typer.Option("--probe", help="Probe to load (repeatable; default: every probe but irq)."),
]
RetentionAgeOption = Annotated[
    float | None, typer.Option("--retention-age", min=1, help="Drop recordings older (s).")
]
RetentionBytesOption = Annotated[
    int | None, typer.Option("--retention-bytes", min=4096, help="Cap on recording bytes.")
]


def log_to_stderr(message: str) -> None:
    """One line per event (attach failures, resets) on stderr."""
    print(f"tailsight: {message}", file=sys.stderr, flush=True)


def disk_full(error: OSError) -> bool:
    return error.errno in (errno.ENOSPC, errno.EDQUOT)


def reason(error: OSError) -> str:
    if disk_full(error):
        return "disk full"
    if isinstance(error, FileExistsError):
        return "exists and is not a directory"
    if isinstance(error, NotADirectoryError):
        return "a parent of it is not a directory"
    return error.strerror or str(error)


def cannot_read(directory: Path, error: OSError) -> NoReturn:
    """A recording this user may not read (permissions): a clear message and exit 2."""
    where = error.filename or directory
    hint = " (recordings are 0600: run as their owner, or record with --group)"
    hint = hint if isinstance(error, PermissionError) else ""
    typer.echo(f"error: cannot read {where}: {reason(error)}{hint}", err=True)
    raise typer.Exit(2)


def report_problems(recording: Recording) -> None:
    """What the last read skipped or merged, one line each on stderr."""
    for line in recording.report():
        typer.echo(f"warning: {line}", err=True)


def check_probes_or_exit(probes: Sequence[str]) -> None:
    """Known probe names (else exit 2), and the privileges to load them: one message up front
    (exit 2), not a compile failure per probe."""
    # The wiring loads the collector (numpy, prometheus_client): not at `--help` time.
    from tailsight.cli.wiring import BadInput, check_probes
    from tailsight.probes.loader import PrivilegeError

    try:
        check_probes(probes)
    except BadInput as error:
        raise typer.BadParameter(str(error), param_hint=error.option) from None
    except PrivilegeError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2) from None
