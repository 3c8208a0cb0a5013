"""The time range options of the commands that read recordings or a Prometheus (show, explain):
``--since`` / ``--until`` and how their values are read."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated, Final

import typer

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h|d)?$")
_UNIT_S: Final = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}

# See parse_time for the forms.
SinceOption = Annotated[
    str | None,
    typer.Option("--since", help="Start: -5m (before the end), +30s, epoch s or ISO time."),
]
UntilOption = Annotated[str | None, typer.Option("--until", help="End, same forms as --since.")]


def parse_time(text: str, first_ns: int, last_ns: int) -> int:
    """``+D`` after the recording's start, ``-D`` before its end (D like 30s, 5m, 250ms),
    seconds since the epoch, or an ISO 8601 time (UTC unless it says otherwise)."""
    text = text.strip()
    if text[:1] in "+-":
        match = _DURATION.match(text[1:])
        if match is None:
            raise typer.BadParameter(f"bad duration {text!r} (e.g. -5m, +30s)")
        offset_ns = int(float(match[1]) * _UNIT_S[match[2] or "s"] * 1e9)
        return first_ns + offset_ns if text[0] == "+" else last_ns - offset_ns
    try:
        return int(float(text) * 1e9)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text)
    except ValueError as error:
        raise typer.BadParameter(f"bad time {text!r}: {error}") from error
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1e9)
