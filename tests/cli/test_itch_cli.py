"""``tailsight itch`` through typer's CliRunner: generate, stats (text and JSON), damaged files."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from typer.testing import CliRunner

from tailsight.cli.main import app
from tailsight.trading_core import itch
from tailsight.trading_core.market import generate_day
from tailsight.trading_core.naive_book import NaiveBook

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
