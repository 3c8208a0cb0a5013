"""``tailsight trace`` through typer's CliRunner: --json on the built-in workload, and the view."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

import tailsight.cli.trace as trace_module
from tailsight.cli.main import app
from tailsight.cli.trace_view import KEY_HELP, SPARK_BOUNDS_NS, VIEW_WIDTH, render, sparkline
from tailsight.cli.wiring import open_session, wait_until
from tailsight.hist import Histogram
from tailsight.intervals import FORMAT, Counter, HistDocument, Series
from tailsight.testing.workload import Task, Workload, default_cpu, private_base, python_task

runner = CliRunner()


@pytest.mark.kernel
def test_trace_json_on_workload(kernel_ready: None) -> None:
    cpu = default_cpu()
    tasks = [Task("victim", cpu=cpu), Task("victim", cpu=cpu), Task("noisy", cpu=cpu)]
    base = private_base("cli")
    with Workload(tasks, base=base) as workload:
        # The kernel's own name for each workload cgroup (/proc/<pid>/cgroup "0::" line).
        kernel_paths = {
            Path(f"/proc/{pid}/cgroup").read_text().split("0::", 1)[1].strip()
            for pid in workload.pids()
        }
        result = runner.invoke(
            app,
            ["trace", "--json", "--probe", "runqueue", "--duration", "2", "--cgroup", f"/{base}"],
        )
    assert result.exit_code == 0, result.output
    assert '"format": "tailsight.hist/1"' in result.stdout
    doc = HistDocument.loads(result.stdout)
    assert 1.9e9 <= doc.end_ns - doc.start_ns <= 5e9
    paths = {s.labels["cgroup"] for s in doc.series}
    assert {s.labels["probe"] for s in doc.series} == {"runqueue"}
    assert paths == kernel_paths == {f"/{base}/victim", f"/{base}/noisy"}

    for series in doc.series:
        path = series.labels["cgroup"]
        assert series.hist.count > 10
        waits = [c for c in doc.counters if c.labels.get("victim") == path]
        wait_ns = sum(c.value for c in waits if c.name == "runqueue_displaced_wait_ns")
        switches = sum(c.value for c in waits if c.name == "runqueue_displaced_switches")
        # the maps are read one after another while the workload runs: a few events apart
        assert abs(switches - series.hist.count) <= 3
        assert wait_ns == pytest.approx(series.hist.sum_ns, rel=0.05)
    names = {c.name for c in doc.counters}
    assert {"runqueue_displaced_wait_ns", "runqueue_dropped_events"} <= names
    aggressors = {
        (c.labels["victim"], c.labels["aggressor"])
        for c in doc.counters
        if c.name == "runqueue_displaced_switches"
    }
    assert (f"/{base}/victim", f"/{base}/noisy") in aggressors


class FakeSession:
    """Stands in for the attached probes: a fixed document, one interval per advance."""

    def __init__(self, document: HistDocument) -> None:
        self.doc = document
        self.probes = {"runqueue": object()}
        self.closed = False

    def refresh_filter(self) -> None:
        pass

    def document(self) -> HistDocument:
        return self.doc

    def advance(self) -> tuple[HistDocument, HistDocument]:
        return self.doc, self.doc

    def close(self) -> None:
        self.closed = True


def known_document() -> HistDocument:
    return HistDocument(
        1_700_000_000_000_000_000,
        1_700_000_002_000_000_000,
        [
            Series(
                {"probe": "runqueue", "cgroup": "/victim"},
                Histogram.from_samples([3_000, 7_000, 7_000, 40_000_000]),
            )
        ],
        [Counter("runqueue_dropped_events", {"reason": "ringbuf"}, 2)],
    )


def test_json_output_is_the_document_byte_for_byte(monkeypatch: pytest.MonkeyPatch) -> None:
    session = FakeSession(known_document())
    monkeypatch.setattr(trace_module, "open_session", lambda *args: session)
    result = runner.invoke(app, ["trace", "--json", "--duration", "0"])
    assert result.exit_code == 0, result.output
    # exactly one tailsight.hist/1 document, nothing else on stdout (no view, no help line)
    assert result.stdout == known_document().dumps()
    assert result.stdout.startswith('{\n  "format": "tailsight.hist/1"')
    assert HistDocument.loads(result.stdout).series[0].hist.count == 4
    assert session.closed


def test_view_without_a_terminal_prints_summary_and_heatmap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    session = FakeSession(known_document())
    monkeypatch.setattr(trace_module, "open_session", lambda *args: session)
    result = runner.invoke(app, ["trace", "--duration", "0.15", "--interval", "0.05"])
    assert result.exit_code == 0, result.output
    assert "summary over 2.0 s" in result.stdout
    assert "▶/victim" in result.stdout and "run-queue wait (runqueue): /victim" in result.stdout
    assert "P99 per interval" in result.stdout and "dropped events: 2" in result.stdout
    assert KEY_HELP not in result.stdout  # no TTY: no keys are read, so none are offered
    assert max(len(line) for line in result.stdout.splitlines()) <= VIEW_WIDTH
    assert session.closed


def test_unknown_probe_and_cgroup_are_rejected() -> None:
    result = runner.invoke(app, ["trace", "--probe", "nosuch", "--json", "--duration", "0"])
    assert result.exit_code == 2
    assert "nosuch" in result.output


def test_sparkline_uses_exact_coarse_buckets() -> None:
    assert sparkline(Histogram.empty()) == " " * (len(SPARK_BOUNDS_NS) + 1)
    # 4 x 3 µs (column 0), 2 x 7 µs (column 1), 1 x 1 s (last column: above 160 ms)
    line = sparkline(Histogram.from_samples([3_000] * 4 + [7_000] * 2 + [1_000_000_000]))
    assert line[0] == "█" and line[1] == "▅" and line[-1] == "▃"
    assert line[2:-1].strip() == ""


def test_render_fits_80_columns() -> None:
    from rich.console import Console

    hist = Histogram.from_samples([5_000, 12_000, 3_000_000])
    doc = HistDocument(
        0,
        10**9,
        [
            Series({"probe": "runqueue", "cgroup": "/a/very/long/cgroup/path/" * 4}, hist),
            Series({"probe": "netsyscall", "cgroup": "/net", "syscall": "recvfrom"}, hist),
        ],
        [
            Counter("runqueue_displaced_wait_ns", {"victim": "/a", "aggressor": "idle"}, 7),
            Counter("runqueue_displaced_switches", {"victim": "/a", "aggressor": "idle"}, 1),
            Counter(
                "netsyscall_outlier_events",
                {
                    "probe": "netsyscall",
                    "cgroup": "/net/a/rather/long/path/" * 3,
                    "kernel_stack": ";".join(f"kernel_function_number_{i}" for i in range(40)),
                    "user_stack": "[unknown];__libc_recvfrom",
                },
                5,
            ),
        ],
    )
    console = Console(width=200, record=True)
    console.print(render(doc, "test"))
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= VIEW_WIDTH
    assert "idle" in text and FORMAT not in text
    # one table per probe, the syscall in the row heading, the outlier stack's leaf end
    assert "run-queue wait (runqueue)" in text and "(netsyscall)" in text
    assert "/net recvfrom" in text
    assert "…;kernel_function_number_37" in text and "number_36" not in text
    assert "[unknown];__libc_recvfrom" in text


@pytest.mark.kernel
def test_cgroup_filter_follows_new_descendants_only(kernel_ready: None) -> None:
    cpu = default_cpu()
    base, outside = private_base("filter"), private_base("outside")
    warnings: list[str] = []
    with Workload([Task("early", cpu=cpu)], base=base), Workload([Task("x", cpu=cpu)], outside):
        session = open_session(["runqueue"], [f"/{base}"], warnings.append)
        try:
            # created after the trace started: recorded once the filter is refreshed
            with Workload([Task("late", cpu=cpu)], base=f"{base}/sub"):
                wait_until(session, 1.5, 0.2)
                doc = session.document()
        finally:
            session.close()
    assert warnings == []
    paths = {s.labels["cgroup"] for s in doc.series}
    assert paths == {f"/{base}/early", f"/{base}/sub/late"}
    assert all(c.labels["victim"] in paths for c in doc.counters if "victim" in c.labels)


@pytest.mark.kernel
def test_session_intervals_add_up_to_the_total(kernel_ready: None) -> None:
    cpu = default_cpu()
    base = private_base("advance")
    with Workload([Task("a", cpu=cpu), Task("b", cpu=cpu)], base=base):
        session = open_session(["runqueue"], [f"/{base}"], pytest.fail)
        try:
            intervals = []
            for _ in range(4):
                time.sleep(0.3)
                total, interval = session.advance()
                intervals.append(interval)
        finally:
            session.close()
    assert [i.start_ns for i in intervals[1:]] == [i.end_ns for i in intervals[:-1]]
    # the baseline is read just after the session's start time is taken
    assert 0 <= intervals[0].start_ns - total.start_ns < 100_000_000
    assert intervals[-1].end_ns == total.end_ns
    for series in total.series:
        assert series.hist.count > 10
        summed = Histogram.empty()
        for interval in intervals:
            for part in interval.find(**series.labels):
                summed = summed + part.hist
        assert summed == series.hist


@pytest.mark.kernel
def test_session_over_several_probes_groups_by_probe(kernel_ready: None) -> None:
    from rich.console import Console

    sends = 31  # prime
    code = (
        "import socket\n"
        "sys.stdin.readline()\n"
        "rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); rx.bind(('127.0.0.1', 0))\n"
        f"for _ in range({sends}): rx.sendto(b'x', rx.getsockname()); rx.recvfrom(4)\n"
        "sys.stdout.write('done\\n'); sys.stdout.flush()\n"
        "sys.stdin.readline()\n"
    )
    base = private_base("multi")
    warnings: list[str] = []
    with Workload([python_task("udp", code, pipes=True)], base=base) as workload:
        session = open_session(["netsyscall", "runqueue"], [f"/{base}"], warnings.append)
        try:
            proc = workload.process("udp")
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(b"go\n")
            proc.stdin.flush()
            assert proc.stdout.readline() == b"done\n"
            doc = session.document()
        finally:
            session.close()
    assert warnings == []
    path = f"/{base}/udp"
    (sendto,) = doc.find(probe="netsyscall", cgroup=path, syscall="sendto")
    (recvfrom,) = doc.find(probe="netsyscall", cgroup=path, syscall="recvfrom")
    assert sendto.hist.count == recvfrom.hist.count == sends
    assert {s.labels["cgroup"] for s in doc.series} == {path}
    console = Console(width=200, record=True)
    console.print(render(doc, "multi"))
    text = console.export_text()
    assert "socket syscall time (netsyscall)" in text and "run-queue wait (runqueue)" in text
    assert "sendto" in text and "recvfrom" in text


def _as_nobody(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    if os.geteuid() != 0:
        pytest.skip("needs root to become an unprivileged user")
    drop = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--inh-caps=-all"]
    cwd.chmod(0o755)
    return subprocess.run(
        [*drop, *argv], capture_output=True, text=True, cwd=cwd, timeout=120, check=False
    )


def test_unprivileged_trace_says_root_or_capabilities_once(tmp_path: Path) -> None:
    """As a plain user, trace says once what it needs, instead of bcc's "Failed to compile BPF
    module ... Operation not permitted" once per probe."""
    tailsight = str(Path(sys.executable).with_name("tailsight"))
    run = _as_nobody(tailsight, "trace", "--duration", "1", cwd=tmp_path)
    assert run.returncode == 2, run.stderr
    assert run.stderr.count("needs root") == 1, run.stderr
    assert "CAP_BPF" in run.stderr and "CAP_PERFMON" in run.stderr, run.stderr
    assert "Failed to compile" not in run.stderr and "Traceback" not in run.stderr


@pytest.mark.parametrize(
    "command", [["serve", "--duration", "1"], ["record", "rec", "--duration", "1"]]
)
def test_unprivileged_serve_and_record_say_root_or_capabilities_once(
    tmp_path: Path, command: list[str]
) -> None:
    """As a plain user, serve and record say once what they need (exit 2), not one "not
    attached" line per probe."""
    tailsight = str(Path(sys.executable).with_name("tailsight"))
    run = _as_nobody(tailsight, *command, cwd=tmp_path)
    assert run.returncode == 2, run.stderr
    assert run.stderr.count("needs root") == 1, run.stderr
    assert "CAP_BPF" in run.stderr and "Traceback" not in run.stderr, run.stderr
    assert "not attached" not in run.stderr, run.stderr
    assert not (tmp_path / "rec").exists()


def test_unprivileged_probe_attach_raises_the_privilege_error(tmp_path: Path) -> None:
    """What serve and record get from every BPF probe: the same clear error, before bcc runs
    (the file probes read world-readable cgroup files and need no privilege)."""
    code = (
        "from tailsight.probes.catalog import BPF_PROBES, create_probe\n"
        "from tailsight.probes.loader import PrivilegeError\n"
        "for name in BPF_PROBES:\n"
        "    try:\n"
        "        create_probe(name).attach()\n"
        "    except PrivilegeError as error:\n"
        "        print(name, error)\n"
    )
    run = _as_nobody(sys.executable, "-c", code, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert [line.split()[0] for line in lines] == [
        "runqueue",
        "netsyscall",
        "tcpstate",
        "migration",
        "drops",
        "irq",
        "reclaim",
    ]
    assert all("needs root" in line and "CAP_BPF" in line for line in lines), lines
    assert "Failed to compile" not in run.stderr
