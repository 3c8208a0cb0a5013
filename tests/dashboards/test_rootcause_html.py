"""The root-cause page on a synthetic recording with a known incident (``/batch`` starts
displacing ``/trading`` at interval CHANGE_AT), checked as XML and opened in headless Chromium
(Debian's ``chromium``): what the browser renders names the aggressor, and the screenshot is a
real, non-blank picture of the page."""

from __future__ import annotations

import shutil
import struct
import subprocess
import xml.etree.ElementTree as ET
import zlib
from datetime import UTC, datetime
from pathlib import Path

import pytest
from dashboard_incident import AGGRESSOR, CHANGE_AT, VICTIM, incident
from typer.testing import CliRunner

from tailsight.cli.main import app
from tailsight.collector.store.writer import RecordingWriter
from tailsight.dashboards.rootcause_html import render_root_cause
from tests.analysis.synthetic import INTERVAL_NS, START_NS

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
)
SVG = "{http://www.w3.org/2000/svg}"


def test_page_shows_the_jump_the_aggressor_and_the_aligned_series() -> None:
    page = render_root_cause(incident(), VICTIM)
    root = ET.fromstring(page.split("\n", 1)[1])  # well-formed XML after the doctype
    text = "".join(root.itertext())
    change = datetime.fromtimestamp((START_NS + CHANGE_AT * INTERVAL_NS) / 1e9, UTC)
    assert f"Root cause: {VICTIM}" in text
    assert AGGRESSOR in text and f"{change:%H:%M:%S}" in text
    lines = {p.get("data-series") for p in root.iter(f"{SVG}polyline")}
    assert {AGGRESSOR, "/", "netsyscall sendto", "task_migrations"} <= lines
    # The stacked displacement plot lists the injected aggressor first (largest in total).
    stacked = [p.get("data-series") for p in root.iter(f"{SVG}polyline")]
    assert stacked.index(AGGRESSOR) < stacked.index("/")


def _png_pixels(path: Path) -> tuple[int, int, bytes]:
    """Width, height and the inflated scanlines of a PNG (no imaging library needed)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    idat, offset = b"", 8
    while offset < len(data):
        (length,) = struct.unpack(">I", data[offset : offset + 4])
        kind = data[offset + 4 : offset + 8]
        if kind == b"IDAT":
            idat += data[offset + 8 : offset + 8 + length]
        offset += 12 + length
    return width, height, zlib.decompress(idat)


def chromium(page: Path, out_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Headless Chromium on ``page`` with a fresh profile in ``out_dir``."""
    binary = shutil.which("chromium")
    assert binary, "chromium missing: run `make setup` (scripts/setup.sh installs it)"
    profile = out_dir / "profile"
    command = [binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args, page.as_uri()]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.slow
def test_chromium_renders_the_page_and_takes_a_screenshot(tmp_path: Path) -> None:
    recording = tmp_path / "rec"
    writer = RecordingWriter(recording)
    for document in incident():
        writer.append(document)
    writer.close()
    page = tmp_path / "root-cause.html"
    result = CliRunner().invoke(
        app, ["dashboards", "html", str(recording), "--victim", VICTIM, "--out", str(page)]
    )
    assert result.exit_code == 0, result.stderr
    dom = chromium(page, tmp_path, "--dump-dom")
    assert dom.returncode == 0, dom.stderr
    assert f"Root cause: {VICTIM}" in dom.stdout and AGGRESSOR in dom.stdout
    shot = tmp_path / "shot.png"
    taken = chromium(page, tmp_path, f"--screenshot={shot}", "--window-size=900,1600")
    assert taken.returncode == 0 and shot.exists(), taken.stderr
    width, height, pixels = _png_pixels(shot)
    assert (width, height) == (900, 1600)
    # A page of plots, not a blank or error page: many distinct byte values in the scanlines.
    assert len(set(pixels)) > 64


def test_unknown_victim_and_missing_recording_are_usage_errors(tmp_path: Path) -> None:
    recording = tmp_path / "rec"
    writer = RecordingWriter(recording)
    for document in incident()[:3]:
        writer.append(document)
    writer.close()
    out = tmp_path / "page.html"
    for argv in (
        [str(recording), "--victim", "/nobody"],
        [str(tmp_path / "missing"), "--victim", VICTIM],
    ):
        result = CliRunner().invoke(app, ["dashboards", "html", *argv, "--out", str(out)])
        assert result.exit_code == 2, result.output
        assert not out.exists()
