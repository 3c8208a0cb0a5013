"""``tailsight itch``: statistics of an ITCH 5.0 file and synthetic trading days."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

app = typer.Typer(
    help="NASDAQ TotalView-ITCH 5.0 files: statistics, final book, synthetic days.",
    no_args_is_help=True,
    add_completion=False,
)

_PRICE4_SCALE = 10_000


def file_stats(path: Path) -> dict[str, Any]:
    """Read a (plain or gzip) ITCH file once: counts, framing issues, final top of book."""
    import numpy as np

    # Loads numpy: kept out of `tailsight --help`.
    from tailsight.trading_core.book import Book
    from tailsight.trading_core.itch_batch import decode_batch
    from tailsight.trading_core.itch_file import FramingReport, iter_itch_chunks

    report = FramingReport()
    book = Book()
    by_type = np.zeros(256, dtype=np.int64)
    first_ns = last_ns = None
    # The chunks hold only frames that passed the framing checks, so decoding cannot fail here;
    # everything skipped or repaired is in the report with its offset.
    for chunk in iter_itch_chunks(path, report):
        batch = decode_batch(chunk)
        if not batch.count:
            continue
        by_type += np.bincount(batch.message_types, minlength=256)
        types = batch.message_types
        if first_ns is None:
            first_ns = int(batch.records[bytes([types[0]])]["timestamp_ns"][0])
        last_ns = int(batch.records[bytes([types[-1]])]["timestamp_ns"][-1])
        book.apply_batch(batch)
    counts = {chr(t): int(n) for t, n in enumerate(by_type.tolist()) if n}
    top = []
    for locate in sorted(set(book.books) | set(book.symbols)):
        tob = book.top_of_book(locate)
        top.append(
            {
                "locate": locate,
                "symbol": book.symbols.get(locate, ""),
                "bid_price": tob.bid_price,
                "bid_shares": tob.bid_shares,
                "ask_price": tob.ask_price,
                "ask_shares": tob.ask_shares,
                "live_orders": book.order_count(locate),
            }
        )
    return {
        "file": str(path),
        "messages": report.messages,
        "bytes": report.bytes_read,
        "first_timestamp_ns": first_ns,
        "last_timestamp_ns": last_ns,
        "counts": {
            k: {"name": _type_name(k), "count": v}
            for k, v in sorted(counts.items(), key=lambda kv: -kv[1])
        },
        "symbols": len(book.symbols),
        "framing": {
            "clean": report.clean,
            "skipped_bytes": report.skipped_bytes,
            "counts": dict(report.counts),
            "issues": [
                {"offset": i.offset, "kind": i.kind, "detail": i.detail} for i in report.issues
            ],
        },
        "book_errors": dict(book.errors),
        "live_orders": len(book.orders),
        "last_system_event": book.last_system_event,
        "top_of_book": top,
    }


def _type_name(kind: str) -> str:
    # Builds its message structs on import (~19 ms): kept out of `tailsight --help`.
    from tailsight.trading_core.itch import MESSAGE_CLASSES

    cls = MESSAGE_CLASSES.get(kind.encode("latin-1"))
    return cls.__name__ if cls is not None else "unknown"


def _price(price: int) -> str:
    return f"{price / _PRICE4_SCALE:.4f}" if price else "-"


def _clock(ns: int | None) -> str:
    if ns is None:
        return "-"
    seconds, nanos = divmod(ns, 1_000_000_000)
    hours, rest = divmod(seconds, 3600)
    return f"{hours:02d}:{rest // 60:02d}:{rest % 60:02d}.{nanos:09d}"


def _render(stats: dict[str, Any], limit: int) -> str:
    lines = [
        f"{stats['file']}",
        f"  {stats['messages']:,} messages, {stats['bytes']:,} bytes, {stats['symbols']} symbols",
        f"  {_clock(stats['first_timestamp_ns'])} .. {_clock(stats['last_timestamp_ns'])}",
        "",
        "messages by type",
    ]
    for kind, entry in stats["counts"].items():
        share = entry["count"] / max(1, stats["messages"])
        lines.append(f"  {kind}  {entry['name']:<30} {entry['count']:>12,} {share:>7.2%}")
    framing = stats["framing"]
    lines += ["", "framing: " + ("clean" if framing["clean"] else "ISSUES")]
    for kind, count in sorted(framing["counts"].items()):
        lines.append(f"  {kind:<20} {count:>10,}")
    if framing["skipped_bytes"]:
        lines.append(f"  skipped bytes        {framing['skipped_bytes']:>10,}")
    for issue in framing["issues"][:limit]:
        lines.append(f"  @{issue['offset']:<12} {issue['kind']:<16} {issue['detail']}"[:79])
    book_errors = ", ".join(f"{k}={v}" for k, v in sorted(stats["book_errors"].items()))
    lines += [
        "",
        f"book: {stats['live_orders']:,} live orders, errors: {book_errors or 'none'}, "
        f"last system event {stats['last_system_event'] or '-'}",
        "",
        f"{'final top of book':<21}{'bid':>12} {'size':>9}  {'ask':>12} {'size':>9} {'orders':>7}",
    ]
    rows = stats["top_of_book"]
    for row in rows[:limit]:
        name = f"{row['symbol'] or '?'} ({row['locate']})"
        lines.append(
            f"  {name:<19}{_price(row['bid_price']):>12} {row['bid_shares']:>9,}  "
            f"{_price(row['ask_price']):>12} {row['ask_shares']:>9,} {row['live_orders']:>7,}"
        )
    if len(rows) > limit:
        lines.append(f"  ... {len(rows) - limit} more (--limit, or --json for all)")
    return "\n".join(lines)


@app.command()
def stats(
    file: Annotated[Path, typer.Argument(help="ITCH 5.0 file, plain or gzip")],
    as_json: Annotated[bool, typer.Option("--json", help="one JSON document")] = False,
    limit: Annotated[int, typer.Option(help="rows per list in the text view")] = 20,
) -> None:
    """Message counts by type, symbols, framing errors with offsets, final top of book."""
    try:
        result = file_stats(file)
    except OSError as error:  # itch_file.ItchInputError says what the path is instead
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2) from error
    typer.echo(json.dumps(result, indent=2) if as_json else _render(result, limit))
    if not result["messages"]:
        raise typer.Exit(1)


@app.command()
def generate(
    out: Annotated[Path, typer.Argument(help="output file (.gz compresses)")],
    seed: Annotated[int, typer.Option(help="random seed: same seed, same bytes")] = 1,
    messages: Annotated[int, typer.Option(min=1, help="messages in the day")] = 100_000,
    symbols: Annotated[str, typer.Option(help="a count, or comma-separated tickers")] = "8",
    gzip: Annotated[
        bool | None, typer.Option("--gzip/--no-gzip", help="default: by the .gz suffix")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON document")] = False,
) -> None:
    """Write a synthetic, deterministic ITCH 5.0 trading day."""
    # Loads numpy: kept out of `tailsight --help`.
    from tailsight.trading_core.itch_file import write_itch
    from tailsight.trading_core.market import generate_day, symbol_names

    try:
        names = symbol_names(int(symbols) if symbols.isdigit() else symbols.split(","))
    except ValueError as error:
        typer.echo(f"--symbols: {error}", err=True)
        raise typer.Exit(2) from error
    if out.is_dir():
        typer.echo(f"error: {out} is a directory; give a file name", err=True)
        raise typer.Exit(2)
    if not out.parent.is_dir():
        typer.echo(f"error: directory {out.parent} does not exist", err=True)
        raise typer.Exit(2)
    try:  # write_itch is atomic: a failed write leaves no file behind
        count = write_itch(out, generate_day(seed, names, messages), gzip=gzip)
    except OSError as error:
        typer.echo(f"error: cannot write {out}: {error.strerror or error}", err=True)
        raise typer.Exit(2) from error
    summary = {"file": str(out), "messages": count, "seed": seed, "symbols": names,
               "bytes": out.stat().st_size}  # fmt: skip
    if as_json:
        typer.echo(json.dumps(summary))
    else:
        typer.echo(f"{out}: {count:,} messages, {len(names)} symbols, seed {seed}, "
                   f"{summary['bytes']:,} bytes")  # fmt: skip
