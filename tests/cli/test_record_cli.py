"""`tailsight show` on a synthetic recording (figures against numpy / merged histograms), time
parsing, damaged and unreadable recordings, bad record targets (exit 2, a message, no
traceback), and on the kernel: `tailsight record`, killed with SIGKILL and restarted on the same
directory, leaves only complete, contiguous intervals with exactly one gap; on a full disk it
says so and keeps what it wrote."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from tailsight.cli.main import app
from tailsight.cli.record import parse_time
from tailsight.collector.store.reader import Recording, list_segments
from tailsight.collector.store.writer import RecordingWriter
from tailsight.hist import BUCKET_WIDTH_NS, Histogram
from tailsight.intervals import Counter, HistDocument, Series

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


def test_show_and_explain_report_bad_segments_and_read_the_rest(tmp_path: Path) -> None:
    samples = write_recording(tmp_path / "one", n=3)
    write_recording(tmp_path / "two", n=6)
    later = sorted((tmp_path / "two").glob("*.tsrec"))[0]  # same intervals, own segment
    shutil.copyfile(later, tmp_path / "one" / later.name.replace("-0000", "-0001"))
    (tmp_path / "one" / "00000000000000000000-0000.tsrec").write_bytes(bytes(100))
    (tmp_path / "one" / "00000000000000000001-0000.tsrec").write_text("not a segment\n")
    good = Recording(tmp_path / "one")
    result = CliRunner().invoke(app, ["show", str(tmp_path / "one"), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["intervals"] == 6  # 3 + the 3 later ones of the copy, none twice
    busy = next(s for s in summary["series"] if s["labels"]["cgroup"] == "/busy")
    assert busy["counts"][:3] == [len(v) for v in samples["/busy"]]
    assert [p["segment"] for p in summary["problems"]] == [
        "00000000000000000000-0000.tsrec",
        "00000000000000000001-0000.tsrec",
        later.name.replace("-0000", "-0001"),
    ]
    assert summary["problems"][0] == {
        "segment": "00000000000000000000-0000.tsrec",
        "offset": 0,
        "reason": "not a tailsight recording segment",
        "skipped_bytes": 100,
    }
    assert "3 intervals already read" in summary["problems"][2]["reason"]
    assert "Traceback" not in result.output
    for command in (["show"], ["explain"]):
        result = CliRunner().invoke(app, [*command, str(tmp_path / "one")])
        assert result.exit_code == 0, result.output
        assert (
            "warning: 00000000000000000000-0000.tsrec byte 0: not a tailsight recording segment "
            "(100 bytes skipped)" in result.stderr
        )
        assert "3 intervals already read from" in result.stderr
    assert len(good.documents()) == 6


def test_duplicated_segment_does_not_make_a_jump(tmp_path: Path) -> None:
    """Copies of segments (one interval each) beside the originals change nothing: `explain`
    reads each interval once and gives the same report, no jump."""
    rng = np.random.default_rng(5)
    with RecordingWriter(tmp_path, segment_bytes=1) as writer:  # a segment per interval
        for t in range(40):
            values = rng.integers(1_000, 60_000, 400)
            series = [
                Series({"probe": "runqueue", "cgroup": "/app"}, Histogram.from_samples(values))
            ]
            start = T0_NS + t * SECOND_NS
            writer.append(HistDocument(start, start + SECOND_NS, series, []))
    clean = CliRunner().invoke(app, ["explain", str(tmp_path), "--json"])
    assert clean.exit_code == 0, clean.output
    for segment in list_segments(tmp_path)[20:30]:
        shutil.copyfile(segment, segment.with_name(segment.name.replace("-0000", "-0001")))
    copied = CliRunner().invoke(app, ["explain", str(tmp_path), "--json"])
    assert copied.exit_code == 0, copied.output
    assert json.loads(copied.stdout) == json.loads(clean.stdout)


@pytest.fixture
def public_dir() -> Iterator[Path]:
    """A directory another user can reach (pytest's own are 0700), for tests run as nobody."""
    if os.geteuid() != 0:
        pytest.skip("needs root to become another user")
    directory = Path(tempfile.mkdtemp(prefix="tailsight-public-"))
    directory.chmod(0o755)
    yield directory
    shutil.rmtree(directory)


def tailsight_as_nobody(*argv: str) -> subprocess.CompletedProcess[str]:
    executable = str(Path(sys.executable).with_name("tailsight"))
    return subprocess.run(
        [executable, *argv], capture_output=True, text=True, user="nobody", timeout=120
    )


def test_show_on_unreadable_recordings_exit_2(public_dir: Path) -> None:
    tmp_path = public_dir
    write_recording(tmp_path / "rec", n=2)  # 0700 / 0600, owned by root
    result = tailsight_as_nobody("show", str(tmp_path / "rec"))
    assert result.returncode == 2, result.stderr
    assert "Invalid value" in result.stderr and "readable" in result.stderr  # typer checks
    assert "Traceback" not in result.stderr
    (tmp_path / "rec").chmod(0o755)  # the directory readable, a segment not
    result = tailsight_as_nobody("show", str(tmp_path / "rec"))
    assert result.returncode == 2, result.stderr
    (segment, *_) = list_segments(tmp_path / "rec")
    assert f"error: cannot read {segment}: Permission denied" in result.stderr
    assert "Traceback" not in result.stderr


@contextlib.contextmanager
def tmpfs(directory: Path, options: str) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    directory.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(directory)], check=True)
    try:
        yield directory
    finally:
        subprocess.run(["umount", "-l", str(directory)], check=True)


def test_record_to_bad_targets_exits_2_before_attaching(tmp_path: Path) -> None:
    runner = CliRunner()
    (tmp_path / "file").write_text("mine")
    cases = {
        str(tmp_path / "file"): "exists and is not a directory",
        str(tmp_path / "file" / "rec"): "a parent of it is not a directory",
    }
    with tmpfs(tmp_path / "ro", "ro,size=64k") as read_only:
        cases[str(read_only / "rec")] = "Read-only file system"
        for target, message in cases.items():
            result = runner.invoke(app, ["record", target, "--probe", "runqueue"])
            assert result.exit_code == 2, result.output
            assert f"error: cannot record to {target}: {message}" in result.stderr
            assert result.exception is None or isinstance(result.exception, SystemExit)
    assert (tmp_path / "file").read_text() == "mine"
    result = runner.invoke(app, ["record", str(tmp_path / "g"), "--group", "no-such-group-x"])
    assert result.exit_code == 2 and "no group named 'no-such-group-x'" in result.output


def test_second_record_into_one_directory_exits_2(tmp_path: Path) -> None:
    with RecordingWriter(tmp_path / "rec"):  # a `record` or `serve --record` at work
        result = CliRunner().invoke(app, ["record", str(tmp_path / "rec"), "--probe", "runqueue"])
    assert result.exit_code == 2, result.output
    assert (
        f"error: cannot record to {tmp_path / 'rec'}: another writer records there (pid"
        in result.stderr
    )
    assert result.exception is None or isinstance(result.exception, SystemExit)


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


@pytest.mark.kernel
@pytest.mark.slow
def test_record_on_a_full_disk_says_so_and_keeps_what_it_wrote(
    kernel_ready: None, tmp_path: Path
) -> None:
    with tmpfs(tmp_path / "fs", "size=128k") as fs:
        # Leave room for a few intervals: ~10 KB, whatever the record size.
        filler = os.open(fs / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
        with contextlib.suppress(OSError):
            while True:
                os.write(filler, b"\0" * 4096)
        os.close(filler)
        os.truncate(fs / "filler", os.path.getsize(fs / "filler") - 12 * 4096)
        command = [str(Path(sys.executable).with_name("tailsight")), "record", str(fs / "rec")]
        argv = ["--probe", "runqueue", "--interval", "0.05", "--duration", "60"]
        # Busy enough that every interval has a few hundred wake-ups to record.
        with subprocess.Popen(["sh", "-c", "while :; do :; done"]) as hog:
            try:
                result = subprocess.run(
                    [*command, *argv], capture_output=True, text=True, timeout=120
                )
            finally:
                hog.kill()
        assert result.returncode == 1, result.stderr
        assert "Traceback" not in result.stderr
        assert f"error: recording to {fs / 'rec'} stopped: disk full; the " in result.stderr
        written = int(result.stderr.split("stopped: disk full; the ")[1].split()[0])
        recording = Recording(fs / "rec")
        docs = recording.documents()
        assert len(docs) == written > 3
        assert recording.problems == []  # nothing half-written
        shown = CliRunner().invoke(app, ["show", str(fs / "rec"), "--json"])
        assert json.loads(shown.stdout)["intervals"] == written
