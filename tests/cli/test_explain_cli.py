"""`tailsight explain` through typer's CliRunner on a synthetic recording with a known incident:
text within 80 columns, strict JSON, --series and --since/--until filters, the HTML file."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

from typer.testing import CliRunner

from tailsight.cli.main import app
from tailsight.collector.store.writer import RecordingWriter
from tests.analysis.synthetic import INTERVAL_NS, START_NS, hog_documents, incident_documents


def _write(directory: Path) -> None:
    with RecordingWriter(directory, fsync=False) as writer:
        for document in incident_documents(seed=5, intervals=50, change_at=25):
            writer.append(document)


def test_text_names_the_jump_and_fits_80_columns(tmp_path: Path) -> None:
    _write(tmp_path)
    result = CliRunner().invoke(app, ["explain", str(tmp_path)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert max(map(len, result.stdout.splitlines())) <= 80
    words = " ".join(result.stdout.split())
    assert "50 intervals" in words
    assert "run-queue wait of /trading rose" in words
    assert "displaced by /batch" in words


def test_json_and_filters(tmp_path: Path) -> None:
    _write(tmp_path)
    runner = CliRunner()
    result = runner.invoke(app, ["explain", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    leaf = [
        j for j in report["jumps"] if j["series"] == {"probe": "runqueue", "cgroup": "/trading"}
    ]
    assert leaf and abs(leaf[0]["change_start_ns"] - (START_NS + 25 * INTERVAL_NS)) <= INTERVAL_NS
    assert leaf[0]["displacement"]["aggressors"][0]["aggressor"] == "/batch"
    # A filter that leaves out the victim leaves nothing to explain.
    result = runner.invoke(app, ["explain", str(tmp_path), "--json", "--series", "cgroup=/batch"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["jumps"] == []
    # A range that ends before the change holds no jump either.
    result = runner.invoke(app, ["explain", str(tmp_path), "--json", "--until", "+20s"])
    filtered = json.loads(result.stdout)
    assert filtered["intervals"] == 20 and filtered["jumps"] == []
    bad = runner.invoke(app, ["explain", str(tmp_path), "--series", "cgroup"])
    assert bad.exit_code == 2
    missing = runner.invoke(app, ["explain", str(tmp_path / "nope")])
    assert missing.exit_code == 2


def test_html_file(tmp_path: Path) -> None:
    recording = tmp_path / "rec"
    _write(recording)
    out = tmp_path / "report.html"
    result = CliRunner().invoke(app, ["explain", str(recording), "--html", str(out)])
    assert result.exit_code == 0, result.output
    page = out.read_text(encoding="utf-8")
    root = ET.fromstring(page.removeprefix("<!DOCTYPE html>"))
    assert root.tag == "html"
    assert "run-queue wait of /trading" in page


def test_html_to_a_bad_path_keeps_the_text_and_exits_2(tmp_path: Path) -> None:
    """A missing directory or an unwritable path for --html: the text report still, then a
    message and exit 2, not a traceback."""
    recording = tmp_path / "rec"
    _write(recording)
    taken = tmp_path / "taken"  # a directory where the file should go: unwritable, even for root
    taken.mkdir()
    for target in (tmp_path / "missing" / "report.html", taken):
        result = CliRunner().invoke(app, ["explain", str(recording), "--html", str(target)])
        assert result.exit_code == 2, result.output
        assert "run-queue wait of /trading rose" in " ".join(result.stdout.split())
        assert "cannot write the HTML report" in result.stderr
        assert "Traceback" not in result.output
    # Nothing half-written: no directory made, no temporary file left beside the target.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rec", "taken"]
    assert list(taken.iterdir()) == []


def test_html_is_written_atomically_over_an_old_report(tmp_path: Path) -> None:
    recording = tmp_path / "rec"
    _write(recording)
    out = tmp_path / "report.html"
    out.write_text("old", encoding="utf-8")
    result = CliRunner().invoke(app, ["explain", str(recording), "--html", str(out), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["jumps"]
    assert out.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rec", "report.html"]  # no temp left


def test_falls_flag_lists_tails_that_got_faster(tmp_path: Path) -> None:
    with RecordingWriter(tmp_path, fsync=False) as writer:
        for document in hog_documents():
            writer.append(document)
    runner = CliRunner()
    plain = runner.invoke(app, ["explain", str(tmp_path)])
    assert plain.exit_code == 0, plain.output
    words = " ".join(plain.stdout.split())
    assert "/hog fell" not in words and "1 tail got faster (not shown; --falls)" in words
    falls = runner.invoke(app, ["explain", str(tmp_path), "--falls", "--json"])
    assert falls.exit_code == 0, falls.output
    report = json.loads(falls.stdout)
    directions = sorted(j["direction"] for j in report["jumps"])
    assert directions == ["down", "up"] and report["falls_hidden"] == 0
    assert [i["headline"]["cgroup"] for i in report["incidents"]] == ["/victim", "/hog"]
