"""`tailsight show` on a synthetic recording (figures against numpy / merged histograms), time
parsing, and on the kernel: `tailsight record`, killed with SIGKILL and restarted on the same
directory, leaves only complete, contiguous intervals with exactly one gap."""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from tailsight.cli.main import app
from tailsight.cli.record import parse_time
from tailsight.collector.store import Recording, RecordingWriter
from tailsight.hist import BUCKET_WIDTH_NS, Histogram
from tailsight.histfile import Counter, HistDocument, Series

T0_NS = 1_700_000_000 * 10**9
SECOND_NS = 10**9


def write_recording(directory: Path, n: int = 6) -> dict[str, list[np.ndarray]]:
    """Intervals with known samples for two cgroups; returns the samples per cgroup."""
    rng = np.random.default_rng(11)
    samples: dict[str, list[np.ndarray]] = {"/busy": [], "/quiet/with/a/long/cgroup/path": []}
    with RecordingWriter(directory) as writer:
        for t in range(n):
            series = []
            for k, cgroup in enumerate(samples):
                values = rng.integers(1_000, 400_000 // (k + 1), 300 // (k + 1))
                if t == 3 and k == 0:
                    values = np.concatenate([values, np.full(20, 9_000_000)])  # one bad second
                samples[cgroup].append(values)
                labels = {"probe": "runqueue", "cgroup": cgroup}
                series.append(Series(labels, Histogram.from_samples(values)))
            counters = [Counter("runqueue_dropped_events", {"probe": "runqueue"}, t)]
            start = T0_NS + t * SECOND_NS
            writer.append(HistDocument(start, start + SECOND_NS, series, counters))
    return samples


def test_show_json_matches_the_samples(tmp_path: Path) -> None:
    samples = write_recording(tmp_path)
    result = CliRunner().invoke(app, ["show", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["intervals"] == 6
    by_cgroup = {s["labels"]["cgroup"]: s for s in summary["series"]}
    for cgroup, per_interval in samples.items():
        entry = by_cgroup[cgroup]
        everything = np.concatenate(per_interval)
        assert entry["count"] == len(everything)
        assert entry["counts"] == [len(v) for v in per_interval]
        # Overall P99 from the recording agrees with numpy on the raw samples within a bucket.
        assert abs(entry["quantiles_ns"]["p99"] - np.quantile(everything, 0.99)) <= BUCKET_WIDTH_NS
        p99s = [row["p99"] for row in entry["interval_quantiles_ns"]]
        expected = [Histogram.from_samples(v).quantile(0.99) for v in per_interval]
        assert p99s == pytest.approx(expected)
    assert by_cgroup["/busy"]["worst_p99_end_ns"] == T0_NS + 4 * SECOND_NS
    assert summary["counters"][0]["total"] == sum(range(6))


def test_show_table_fits_80_columns_and_filters_time(tmp_path: Path) -> None:
    write_recording(tmp_path)
    runner = CliRunner()
    result = runner.invoke(app, ["show", str(tmp_path)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert max(map(len, result.stdout.splitlines())) <= 80
    assert "runqueue /busy" in result.stdout
    assert "6 intervals" in result.stdout
    window = runner.invoke(
        app, ["show", str(tmp_path), "--json", "--since", "+2s", "--until", "-1s"]
    )
    summary = json.loads(window.stdout)
    assert summary["intervals"] == 3  # (2 s, 5 s] of the 6 s recorded
    assert summary["start_ns"] == T0_NS + 2 * SECOND_NS


def test_parse_time_forms() -> None:
    first, last = T0_NS, T0_NS + 100 * SECOND_NS
    assert parse_time("+30s", first, last) == first + 30 * SECOND_NS
    assert parse_time("-5m", first, last) == last - 300 * SECOND_NS
    assert parse_time("-250ms", first, last) == last - 250_000_000
    assert parse_time("1700000000.5", first, last) == T0_NS + SECOND_NS // 2
    assert parse_time("2023-11-14T22:13:20", first, last) == T0_NS  # naive = UTC
    assert parse_time("2023-11-14T23:13:20+01:00", first, last) == T0_NS
    with pytest.raises(typer.BadParameter):
        parse_time("-5 parsecs", first, last)


def test_show_missing_directory(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["show", str(tmp_path / "nope")])
    assert result.exit_code == 2


def _record(directory: Path, *extra: str) -> subprocess.Popen[bytes]:
    command = [str(Path(sys.executable).with_name("tailsight")), "record", str(directory)]
    argv = ["--probe", "runqueue", "--interval", "0.2", *extra]
    return subprocess.Popen([*command, *argv], stderr=subprocess.DEVNULL)


@pytest.mark.kernel
@pytest.mark.slow
def test_kill_9_and_restart_loses_no_completed_interval(kernel_ready: None, tmp_path: Path) -> None:
    directory = tmp_path / "rec"
    first = _record(directory)
    try:
        deadline = time.monotonic() + 40
        while len(Recording(directory).documents()) < 8 if directory.exists() else True:
            assert first.poll() is None, "record exited early"
            assert time.monotonic() < deadline, "record wrote too few intervals"
            time.sleep(0.05)
        time.sleep(0.37)  # some time into the next interval, not on a tick boundary
        first.send_signal(signal.SIGKILL)
        first.wait()
        before = Recording(directory).documents()
        second = _record(directory, "--duration", "1.5")
        assert second.wait(timeout=60) == 0
    finally:
        for proc in (first, locals().get("second")):
            if isinstance(proc, subprocess.Popen) and proc.poll() is None:
                proc.kill()
                proc.wait()
    recording = Recording(directory)
    docs = recording.documents()
    assert recording.bad_records <= 1  # at most a torn record at the end of the killed segment
    assert len(list(directory.glob("*.tsrec"))) == 2  # the restart began its own segment
    assert [d.dumps() for d in docs[: len(before)]] == [d.dumps() for d in before]
    assert len(docs) > len(before) >= 8
    gaps = [n for n, (a, b) in enumerate(itertools.pairwise(docs)) if b.start_ns != a.end_ns]
    assert gaps == [len(before) - 1]  # contiguous except across the crash
    assert docs[len(before)].start_ns > docs[len(before) - 1].end_ns
    for doc in docs:
        assert doc.find(probe="runqueue"), "every interval has run-queue data"
