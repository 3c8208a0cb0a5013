"""``tailsight itch`` through typer's CliRunner: generate, stats (text and JSON), damaged files."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tailsight.cli.main import app
from tailsight.trading_core import itch
from tailsight.trading_core.market import generate_day
from tests.trading_core.naive_book import NaiveBook

runner = CliRunner()


def test_generate_then_stats_json_matches_independent_replay(tmp_path: Path) -> None:
    out = tmp_path / "day.itch"
    result = runner.invoke(
        app, ["itch", "generate", str(out), "--seed", "5", "--messages", "4000", "--symbols", "3"]
    )
    assert result.exit_code == 0, result.output
    assert "4,000 messages" in result.output
    result = runner.invoke(app, ["itch", "stats", str(out), "--json"])
    assert result.exit_code == 0, result.output
    stats = json.loads(result.output)

    # Ground truth: the generator's messages, counted and replayed through the naive book.
    messages = list(generate_day(5, symbols=3, messages=4000))
    counts: dict[str, int] = {}
    for msg in messages:
        kind = msg.message_type.decode()
        counts[kind] = counts.get(kind, 0) + 1
    naive = NaiveBook()
    for msg in messages:
        naive.apply(msg)
    assert stats["messages"] == 4000
    assert {k: v["count"] for k, v in stats["counts"].items()} == counts
    assert stats["counts"]["A"]["name"] == "AddOrder"
    assert stats["symbols"] == 3
    assert stats["framing"]["clean"] and stats["framing"]["issues"] == []
    assert stats["book_errors"] == {}
    assert stats["last_system_event"] == "C"
    assert {row["symbol"] for row in stats["top_of_book"]} == {"AAPL", "MSFT", "NVDA"}
    for row in stats["top_of_book"]:
        expected = naive.top_of_book(row["locate"])
        got = (row["bid_price"], row["bid_shares"], row["ask_price"], row["ask_shares"])
        assert got == expected


def test_stats_text_view_fits_80_columns(tmp_path: Path) -> None:
    out = tmp_path / "day.itch.gz"
    result = runner.invoke(
        app, ["itch", "generate", str(out), "--messages", "3000", "--symbols", "AAPL,QQQ"]
    )
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:2] == b"\x1f\x8b"  # .gz suffix compresses by default
    result = runner.invoke(app, ["itch", "stats", str(out)])
    assert result.exit_code == 0, result.output
    assert "framing: clean" in result.output
    assert "AAPL (1)" in result.output and "QQQ (2)" in result.output
    assert max(len(line) for line in result.output.splitlines()) < 80


def test_generate_is_deterministic(tmp_path: Path) -> None:
    paths = [tmp_path / "a.itch", tmp_path / "b.itch", tmp_path / "c.itch"]
    for path, seed in zip(paths, ("9", "9", "10"), strict=True):
        args = ["itch", "generate", str(path), "--seed", seed, "--messages", "2000"]
        assert runner.invoke(app, args).exit_code == 0
    assert paths[0].read_bytes() == paths[1].read_bytes() != paths[2].read_bytes()


def test_stats_reports_framing_errors_with_offsets(tmp_path: Path) -> None:
    good = [itch.encode(m) for m in generate_day(3, symbols=2, messages=500)]
    framed = [struct.pack(">H", len(b)) + b for b in good]
    garbage_at = sum(len(f) for f in framed[:100])
    data = b"".join(framed[:100]) + b"\x07garbage" + b"".join(framed[100:]) + framed[0][:5]
    path = tmp_path / "damaged.itch"
    path.write_bytes(data)
    result = runner.invoke(app, ["itch", "stats", str(path), "--json"])
    assert result.exit_code == 0, result.output
    stats = json.loads(result.output)
    # The frame just before garbage cannot be confirmed (its tail may be the damage): it is
    # reported as unconfirmed and dropped, never delivered mis-framed.
    assert stats["messages"] == 499
    assert not stats["framing"]["clean"]
    offsets = {issue["kind"]: issue["offset"] for issue in stats["framing"]["issues"]}
    assert offsets["unconfirmed"] == garbage_at - len(framed[99])
    assert offsets["garbage"] == garbage_at
    assert offsets["truncated_tail"] == len(data) - 5
    text = runner.invoke(app, ["itch", "stats", str(path)]).output
    assert f"@{garbage_at}" in text


def test_bad_inputs_exit_nonzero(tmp_path: Path) -> None:
    assert runner.invoke(app, ["itch", "stats", str(tmp_path / "missing")]).exit_code == 2
    empty = tmp_path / "empty.itch"
    empty.write_bytes(b"")
    assert runner.invoke(app, ["itch", "stats", str(empty)]).exit_code == 1
    bad = ["itch", "generate", str(tmp_path / "x.itch"), "--symbols", "TOOLONGNAME"]
    assert runner.invoke(app, bad).exit_code == 2


# -- zero length prefixes, paths that are not files, bad targets ------------------------------


def _counts(messages: list[itch.Message]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for msg in messages:
        counts[msg.message_type.decode()] = counts.get(msg.message_type.decode(), 0) + 1
    return counts


def test_stats_reads_a_file_whose_length_prefixes_are_all_zero(tmp_path: Path) -> None:
    # Framing by prefix alone would read such a file as one garbage run of 0 messages.
    messages = list(generate_day(4, symbols=3, messages=5000))
    path = tmp_path / "zero.itch"
    path.write_bytes(b"".join(b"\x00\x00" + itch.encode(m) for m in messages))
    result = runner.invoke(app, ["itch", "stats", str(path), "--json"])
    assert result.exit_code == 0, result.output
    stats = json.loads(result.output)
    assert stats["messages"] == len(messages)
    assert {k: v["count"] for k, v in stats["counts"].items()} == _counts(messages)
    # The deviation is reported once, with its count, not once per message.
    assert stats["framing"]["counts"] == {"zero_prefixed": len(messages)}
    assert [i["kind"] for i in stats["framing"]["issues"]] == ["zero_prefixed"]
    assert stats["book_errors"] == {}


def test_stats_on_what_is_not_a_regular_file_says_what_it_is(tmp_path: Path) -> None:
    # Each is named for what it is, not "no such file"; a FIFO would block the open forever.
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path, what in [(tmp_path, "is a directory"), (fifo, "not a regular file (a FIFO)"),
                       (Path("/dev/zero"), "not a regular file (a character device)"),
                       (tmp_path / "missing", "no such file")]:  # fmt: skip
        result = runner.invoke(app, ["itch", "stats", str(path)])
        assert result.exit_code == 2, (path, result.output)
        assert isinstance(result.exception, SystemExit)  # a message, not a traceback
        assert f"{path}: {what}" in result.output


def test_stats_refuses_a_fifo_even_with_a_writer_waiting(tmp_path: Path) -> None:
    # With a writer the open would succeed, and reading would wait for the writer's bytes.
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    writer = os.open(fifo, os.O_RDWR)  # holds the FIFO open for writing, writes nothing
    try:
        result = runner.invoke(app, ["itch", "stats", str(fifo)])
    finally:
        os.close(writer)
    assert result.exit_code == 2 and "not a regular file" in result.output


@pytest.mark.parametrize(
    ("target", "args", "message"),
    [
        ("missing/day.itch", [], "directory {tmp}/missing does not exist"),
        (".", [], "{tmp} is a directory"),
        ("day.itch", ["--symbols", "100000"], "at most 65,535 symbols"),
    ],
)
def test_generate_bad_target_or_symbols_is_exit_2_and_writes_nothing(
    tmp_path: Path, target: str, args: list[str], message: str
) -> None:
    # Each is a message before anything is written, not a traceback (FileNotFoundError,
    # IsADirectoryError, ValueError from the encoder after part of the day was generated).
    out = tmp_path / "out"
    out.mkdir()
    path = str(out / target).rstrip("/.") if target == "." else str(out / target)
    result = runner.invoke(app, ["itch", "generate", path, "--messages", "2000", *args])
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit)
    assert message.format(tmp=out) in result.output
    assert list(out.iterdir()) == []


def test_generate_into_an_unwritable_directory_is_exit_2() -> None:
    # sysfs refuses new files even to root: the temp file cannot be created.
    result = runner.invoke(app, ["itch", "generate", "/sys/day.itch", "--messages", "100"])
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit)
    assert "cannot write /sys/day.itch: Permission denied" in result.output
