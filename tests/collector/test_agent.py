"""The collector loop with scripted fake probes (cumulative maps from known samples), and one
kernel test: `tailsight serve --record` under SIGTERM detaches and flushes the last interval."""

from __future__ import annotations

import contextlib
import errno
import gc
import itertools
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
import weakref
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import numpy as np
import pytest

from tailsight.cgroups import CgroupResolver
from tailsight.cli.wiring import build_agent
from tailsight.collector.agent import (
    FORGET_EVERY_INTERVALS,
    FULL_COLLECTION_EVERY_INTERVALS,
    Agent,
    RecordingFailed,
)
from tailsight.collector.config import CollectorConfig
from tailsight.collector.endpoint import MetricsServer
from tailsight.collector.exporter import PrometheusExporter
from tailsight.collector.store.reader import Recording
from tailsight.collector.store.writer import RecordingWriter
from tailsight.hist import Histogram
from tailsight.intervals import HistDocument
from tailsight.probes.base import Snapshot, labels
from tailsight.probes.loader import ProbeError


class FakeProbe:
    """Cumulative histograms per cgroup id; each read() first adds the next scripted samples."""

    def __init__(self, name: str, script: list[dict[int, np.ndarray]], fail: str | None = None):
        self.name = name
        self.script = list(script)
        self.fail = fail
        self.state: dict[int, Histogram] = {}
        self.drops = 0
        self.closed = 0
        self.reads = 0
        self.forgotten: list[set[int]] = []

    def attach(self) -> None:
        if self.fail:
            raise ProbeError(self.fail)

    def read(self) -> Snapshot:
        if self.reads and self.script:
            for cgroup_id, samples in self.script.pop(0).items():
                hist = self.state.get(cgroup_id, Histogram.empty())
                self.state[cgroup_id] = hist.merge(Histogram.from_samples(samples))
            self.drops += 1
        self.reads += 1
        histograms = {labels(cgroup=i): h.copy() for i, h in self.state.items()}
        counters = {(f"{self.name}_dropped_events", labels(reason="full")): self.drops}
        return Snapshot(self.name, time.time_ns(), histograms, counters)

    def set_cgroup_filter(self, cgroup_ids: Iterable[int] | None) -> None:
        pass

    def program_fds(self) -> Mapping[str, int]:
        return {"on_event": 1}

    def forget(self, cgroup_ids: set[int]) -> None:
        self.forgotten.append(set(cgroup_ids))
        for cgroup_id in cgroup_ids:
            self.state.pop(cgroup_id, None)

    def close(self) -> None:
        self.closed += 1


@pytest.fixture
def tree(tmp_path: Path) -> tuple[CgroupResolver, dict[str, int]]:
    root = tmp_path / "cg"
    for name in ("a", "b"):
        (root / name).mkdir(parents=True)
    ids = {f"/{n}": os.stat(root / n).st_ino for n in ("a", "b")}
    return CgroupResolver(root), ids


def script(ids: dict[str, int], n: int, seed: int) -> list[dict[int, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        {ids["/a"]: rng.integers(0, 10**6, 50), ids["/b"]: rng.integers(0, 10**5, 7)}
        for _ in range(n)
    ]


def test_ticks_are_exact_contiguous_intervals(
    tree: tuple[CgroupResolver, dict[str, int]], tmp_path: Path
) -> None:
    resolver, ids = tree
    steps = script(ids, 4, seed=1)
    fakes = {
        "runqueue": FakeProbe("runqueue", steps),
        "broken": FakeProbe("broken", [], fail="attach failed: EPERM"),
    }
    config = CollectorConfig(probes=("runqueue", "broken"), record_dir=tmp_path / "rec")
    exporter = PrometheusExporter(config)
    agent = Agent(
        config,
        resolver,
        exporter=exporter,
        writer=RecordingWriter(tmp_path / "rec"),
        log=lambda message: None,
        create_probe=fakes.__getitem__,
    )
    agent.start()
    assert sorted(agent.attached) == ["runqueue"]
    assert exporter.probes["broken"].attached is False
    assert "EPERM" in exporter.probes["broken"].reason
    assert fakes["broken"].closed == 1
    docs = [agent.tick() for _ in range(4)]
    agent.close()
    assert fakes["runqueue"].closed == 1
    for step, doc in zip(steps, docs, strict=True):
        for path, cgroup_id in ids.items():
            (series,) = doc.find(probe="runqueue", cgroup=path)
            assert series.hist == Histogram.from_samples(step[cgroup_id])
        (dropped,) = [c for c in doc.counters if c.name == "runqueue_dropped_events"]
        assert dropped.value == 1
    assert all(later.start_ns == earlier.end_ns for earlier, later in itertools.pairwise(docs))
    recorded = Recording(tmp_path / "rec").documents()
    assert [d.dumps() for d in recorded] == [d.dumps() for d in docs]
    total_a = sum(len(step[ids["/a"]]) for step in steps)
    assert exporter.intervals == 4
    (slot,) = [v for (_, key), v in exporter._cumulative.items() if ("cgroup", "/a") in key]
    assert int(slot.coarse.sum()) == total_a


class EventsDuringAttach(FakeProbe):
    """Attaching it takes time during which another probe sees events (as compiling does)."""

    def __init__(self, other: FakeProbe, cgroup_id: int, samples: np.ndarray) -> None:
        super().__init__("netsyscall", [])
        self.other, self.cgroup_id, self.samples = other, cgroup_id, samples

    def attach(self) -> None:
        hist = self.other.state.get(self.cgroup_id, Histogram.empty())
        self.other.state[self.cgroup_id] = hist.merge(Histogram.from_samples(self.samples))


def test_removed_cgroups_are_forgotten_after_their_last_interval(
    tree: tuple[CgroupResolver, dict[str, int]], tmp_path: Path
) -> None:
    resolver, ids = tree
    every = FORGET_EVERY_INTERVALS
    steps = script(ids, 4 * every, seed=3)
    probe = FakeProbe("runqueue", steps)
    config = CollectorConfig(probes=("runqueue",))
    agent = Agent(config, resolver, log=lambda m: None, create_probe=lambda name: probe)
    agent.start()
    docs = [agent.tick() for _ in range(every + 2)]
    # /b is removed; samples scripted for it after that stand for a mis-detected live cgroup
    (tmp_path / "cg" / "b").rmdir()
    docs += [agent.tick() for _ in range(3 * every - 2)]
    assert probe.forgotten == [set(), set(), {ids["/b"]}, set()]
    assert agent.forgotten_cgroups == 1 and agent.interval_errors == 0
    # every interval exact, before and after the forgetting (no reset, nothing counted twice)
    for step, doc in zip(steps, docs, strict=True):
        (series,) = doc.find(probe="runqueue", cgroup="/a")
        assert series.hist == Histogram.from_samples(step[ids["/a"]])
        b = [s.hist for s in doc.series if s.labels.get("cgroup") in ("/b", "unknown")]
        assert b == [Histogram.from_samples(step[ids["/b"]])]


def test_cyclic_garbage_is_collected_on_schedule_and_gc_restored_on_close(
    tree: tuple[CgroupResolver, dict[str, int]],
) -> None:
    """Automatic collection is off while the agent runs: a reference cycle made during the
    intervals lives until the scheduled full collection, not longer; close() turns it back on."""
    resolver, ids = tree
    every = FULL_COLLECTION_EVERY_INTERVALS
    probe = FakeProbe("runqueue", script(ids, every + 1, seed=5))
    agent = Agent(
        CollectorConfig(probes=("runqueue",)),
        resolver,
        log=lambda m: None,
        create_probe=lambda name: probe,
    )
    assert gc.isenabled()
    agent.start()
    try:
        assert not gc.isenabled()

        class Node:
            pass

        cycle = Node()
        cycle.self = cycle  # type: ignore[attr-defined]
        alive = weakref.ref(cycle)
        del cycle
        for _ in range(every - 1):
            agent.tick()
        assert alive() is not None  # no automatic collection found it
        agent.tick()  # the scheduled one
        assert alive() is None
    finally:
        agent.close()
    assert gc.isenabled()


def test_first_interval_holds_no_events_from_before_the_last_attach(
    tree: tuple[CgroupResolver, dict[str, int]],
) -> None:
    resolver, ids = tree
    steps = script(ids, 1, seed=3)
    first = FakeProbe("runqueue", steps)
    slow = EventsDuringAttach(first, ids["/a"], np.full(997, 40_000))  # prime count
    fakes: dict[str, FakeProbe] = {"runqueue": first, "netsyscall": slow}
    config = CollectorConfig(probes=("runqueue", "netsyscall"))
    agent = Agent(config, resolver, log=lambda m: None, create_probe=fakes.__getitem__)
    agent.start()
    doc = agent.tick()
    agent.close()
    (series,) = doc.find(probe="runqueue", cgroup="/a")
    assert series.hist == Histogram.from_samples(steps[0][ids["/a"]])


def test_counter_reset_skips_one_interval(tree: tuple[CgroupResolver, dict[str, int]]) -> None:
    resolver, ids = tree
    probe = FakeProbe("runqueue", script(ids, 3, seed=2))
    messages: list[str] = []
    agent = Agent(CollectorConfig(), resolver, log=messages.append, create_probe=lambda name: probe)
    agent.config = CollectorConfig(probes=("runqueue",))
    agent.start()
    agent.tick()
    probe.state = {}  # the maps were recreated: cumulative values went down
    doc = agent.tick()
    assert doc.series == []
    assert agent.statuses["runqueue"].read_errors == 1
    assert any("reset" in m for m in messages)
    assert agent.tick().series  # counting resumes from the new baseline


def test_run_stops_on_event_and_emits_the_last_interval(
    tree: tuple[CgroupResolver, dict[str, int]],
) -> None:
    resolver, ids = tree
    probe = FakeProbe("runqueue", script(ids, 100, seed=3))
    agent = Agent(
        CollectorConfig(probes=("runqueue",), interval_s=0.1),
        resolver,
        log=lambda m: None,
        create_probe=lambda name: probe,
    )
    agent.start()
    stop = threading.Event()
    timer = threading.Timer(0.55, stop.set)
    timer.start()
    began = time.monotonic()
    agent.run(stop)
    assert time.monotonic() - began < 2
    assert 4 <= agent.intervals <= 7  # ~5 on schedule plus the final partial one
    agent.close()
    agent.close()
    assert probe.closed == 1


def free_port() -> int:
    with contextlib.closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.kernel
@pytest.mark.slow
def test_serve_sigterm_detaches_and_flushes(kernel_ready: None, tmp_path: Path) -> None:
    port = free_port()
    record_dir = tmp_path / "rec"
    command = [str(Path(sys.executable).with_name("tailsight"))]
    argv = ["serve", "--probe", "runqueue", "--listen", f"127.0.0.1:{port}"]
    argv += ["--record", str(record_dir), "--interval", "0.5", "--bpf-stats"]
    proc = subprocess.Popen([*command, *argv], stderr=subprocess.PIPE, text=True)
    try:
        body = ""
        deadline = time.monotonic() + 30
        while "tailsight_runqueue_wait_seconds_count" not in body:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "no runqueue series on /metrics"
            time.sleep(0.3)
            with contextlib.suppress(OSError):
                url = f"http://127.0.0.1:{port}/metrics"
                body = urllib.request.urlopen(url, timeout=5).read().decode()
        # this kernel has tp_btf (probes fall back to raw_tp only where it is missing)
        assert 'tailsight_probe_attached{probe="runqueue",reason="",mode="tp_btf"} 1.0' in body
        assert "tailsight_bpf_stats_enabled 1.0" in body
        assert kernel_counted_runs("on_sched_switch") > 0
        time.sleep(0.8)
        signalled_ns = time.time_ns()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr:
            proc.stderr.close()
    docs = Recording(record_dir).documents()
    assert len(docs) >= 2
    assert all(b.start_ns == a.end_ns for a, b in itertools.pairwise(docs))
    assert docs[-1].end_ns >= signalled_ns  # the partial interval after SIGTERM was written
    with pytest.raises(OSError):  # the endpoint is gone
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)


class FaultyExporter(PrometheusExporter):
    """Fault-injection double: the real exporter, except that one chosen interval raises, as any
    bug on a rare input would (e.g. a KeyError)."""

    def __init__(self, config: CollectorConfig, fail_on: int) -> None:
        super().__init__(config)
        self.fail_on = fail_on
        self.calls = 0

    def update(self, document: HistDocument) -> None:
        self.calls += 1
        if self.calls == self.fail_on:
            raise KeyError(("netsyscall", "/"))
        super().update(document)


def test_one_bad_interval_is_counted_logged_and_skipped(
    tree: tuple[CgroupResolver, dict[str, int]], tmp_path: Path
) -> None:
    resolver, ids = tree
    probe = FakeProbe("runqueue", script(ids, 100, seed=4))
    config = CollectorConfig(probes=("runqueue",), interval_s=0.05, record_dir=tmp_path / "rec")
    exporter = FaultyExporter(config, fail_on=3)
    messages: list[str] = []
    agent = Agent(
        config,
        resolver,
        exporter=exporter,
        writer=RecordingWriter(tmp_path / "rec"),
        log=messages.append,
        create_probe=lambda n: probe,
    )
    agent.start()
    server = MetricsServer(exporter.exposition, "127.0.0.1", 0)
    stop = threading.Event()
    runner = threading.Thread(target=agent.run, args=(stop,))
    runner.start()
    try:
        deadline = time.monotonic() + 20
        while exporter.intervals < 8:
            assert runner.is_alive() and time.monotonic() < deadline
            time.sleep(0.05)
        body = urllib.request.urlopen(server.url, timeout=5).read().decode()
    finally:
        stop.set()
        runner.join(timeout=10)
        server.close()
        agent.close()
    assert "tailsight_interval_errors_total 1.0" in body
    assert agent.interval_errors == 1
    assert exporter.intervals == exporter.calls - 1  # every other interval exported
    (line,) = [m for m in messages if "interval skipped" in m]
    assert "KeyError" in line and "netsyscall" in line
    # The interval the exporter choked on is still recorded: the recording has no gap.
    recorded = Recording(tmp_path / "rec").documents()
    assert len(recorded) == exporter.calls
    assert all(b.start_ns == a.end_ns for a, b in itertools.pairwise(recorded))


@contextlib.contextmanager
def full_tmpfs(path: Path) -> Iterator[Path]:
    """A 256 KiB tmpfs at ``path``, mounted for the test (root only); ``filler`` fills it."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def fill(directory: Path) -> None:
    """Write until the filesystem says ENOSPC."""
    fd = os.open(directory / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, b"\0" * 4096)
    finally:
        os.close(fd)


@pytest.mark.kernel
def test_full_disk_stops_recording_not_serving(
    tree: tuple[CgroupResolver, dict[str, int]], tmp_path: Path
) -> None:
    """A real full filesystem: the write fails with ENOSPC, the agent says so
    once, exports tailsight_recording_up 0 and goes on serving every interval."""
    resolver, ids = tree
    with full_tmpfs(tmp_path / "small") as mount:
        probe = FakeProbe("runqueue", script(ids, 100, seed=5))
        config = CollectorConfig(
            probes=("runqueue",), record_dir=mount / "rec", cgroup_root=resolver.root
        )
        messages: list[str] = []
        agent = build_agent(config, messages.append, export=True)
        agent.create_probe = lambda name: probe
        assert agent.exporter is not None
        agent.start()
        server = MetricsServer(agent.exporter.exposition, "127.0.0.1", 0)
        try:
            for _ in range(3):
                agent.tick()
            before = urllib.request.urlopen(server.url, timeout=5).read().decode()
            fill(mount)
            ticks = 3
            # A record can still land in the segment's last partly used page: tick until one
            # needs a new page.
            while agent.recording.up and ticks < 100:
                agent.tick()
                ticks += 1
            for _ in range(3):
                agent.tick()
            ticks += 3
            after = urllib.request.urlopen(server.url, timeout=5).read().decode()
        finally:
            server.close()
            agent.close()
        kept = Recording(mount / "rec").documents()
    assert 'tailsight_recording_up{reason=""} 1.0' in before
    assert 'tailsight_recording_up{reason="No space left on device"} 0.0' in after
    assert "tailsight_recording_errors_total 1.0" in after
    assert f"tailsight_intervals_total {ticks}.0" in after  # export never stopped
    (line,) = [m for m in messages if "record" in m]
    assert "disk full" in line and "keeps serving" in line and "cannot serve" not in line
    assert 3 <= len(kept) <= ticks - 4  # what was written before the disk filled still reads


def kernel_counted_runs(program_name: str) -> int:
    """Runs the kernel counted for loaded programs of this name (bpftool; 0 with stats off)."""
    shown = subprocess.run(
        ["bpftool", "-j", "prog", "show"], check=True, capture_output=True, text=True
    ).stdout
    programs = json.loads(shown)
    return sum(int(prog.get("run_cnt", 0)) for prog in programs if prog.get("name") == program_name)


def serve_process(argv: list[str]) -> subprocess.Popen[str]:
    command = [str(Path(sys.executable).with_name("tailsight")), "serve", *argv]
    return subprocess.Popen(command, stderr=subprocess.PIPE, text=True)


def wait_for_body(
    proc: subprocess.Popen[str], url: str, needle: str, context: ssl.SSLContext | None = None
) -> str:
    deadline = time.monotonic() + 60
    body = ""
    while needle not in body:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert time.monotonic() < deadline, f"{needle!r} not on {url}"
        time.sleep(0.3)
        with contextlib.suppress(OSError):
            body = urllib.request.urlopen(url, timeout=5, context=context).read().decode()
    return body


def intervals_total(body: str) -> float:
    counted = re.search(r"^tailsight_intervals_total (\S+)$", body, re.M)
    assert counted is not None
    return float(counted[1])


def stop_process(proc: subprocess.Popen[str]) -> str:
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    if proc.stderr is None:
        return ""
    with proc.stderr:
        return proc.stderr.read()


@pytest.mark.kernel
@pytest.mark.slow
def test_serve_tls_hostile_clients_sigterm_detaches_in_3s(
    kernel_ready: None, tmp_path: Path
) -> None:
    """End to end: silent TCP clients, a stalled handshake and slowloris heads on the
    HTTPS port delay no scrape, and SIGTERM still ends serve (probes detached) within 3 s."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    command = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
    command += ["-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1"]
    subprocess.run(
        [*command, "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True
    )
    port = free_port()
    url = f"https://127.0.0.1:{port}/metrics"
    context = ssl.create_default_context(cafile=str(cert))
    argv = ["--probe", "runqueue", "--listen", f"127.0.0.1:{port}", "--interval", "0.5"]
    proc = serve_process([*argv, "--tls-cert", str(cert), "--tls-key", str(key)])
    hostile: list[socket.socket] = []
    try:
        body = wait_for_body(proc, url, "tailsight_runqueue_wait_seconds_count", context)
        # Without --bpf-stats the host's BPF programs are not timed: the kernel counts no runs.
        assert "tailsight_bpf_stats_enabled 0.0" in body
        assert not re.search(r"^tailsight_bpf_program_runs_total\{", body, re.M)
        assert kernel_counted_runs("on_sched_switch") == 0
        for n in range(30):
            sock = socket.create_connection(("127.0.0.1", port))
            if n % 3 == 1:
                sock.sendall(b"\x16\x03\x01")  # the first bytes of a ClientHello, no more
            elif n % 3 == 2:
                sock.sendall(b"GET /metrics HTTP/1.1\r\n")  # plain HTTP on the TLS port
            hostile.append(sock)
        for _ in range(3):  # each well inside the 5 s the hostile ones may hold
            urllib.request.urlopen(url, timeout=2, context=context).read()
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=3) == 0
        assert time.monotonic() - signalled < 3
    finally:
        for sock in hostile:
            sock.close()
        stop_process(proc)


@pytest.mark.kernel
@pytest.mark.slow
def test_serve_record_on_full_disk_keeps_serving(kernel_ready: None, tmp_path: Path) -> None:
    """End to end: `serve --record` on a full filesystem goes on serving
    with tailsight_recording_up 0 and says the recording stopped (not that the listener
    failed); listening on 0.0.0.0 without TLS or auth gets a warning."""
    port = free_port()
    with full_tmpfs(tmp_path / "small") as mount:
        fill(mount)
        argv = ["--probe", "runqueue", "--listen", f"0.0.0.0:{port}", "--interval", "0.5"]
        proc = serve_process([*argv, "--record", str(mount / "rec")])
        try:
            url = f"http://127.0.0.1:{port}/metrics"
            # The first records may still land in a partly used page: wait for the failure.
            down = 'tailsight_recording_up{reason="No space left on device"} 0.0'
            body = wait_for_body(proc, url, down)
            failed_at = intervals_total(body)
            deadline = time.monotonic() + 30
            while intervals_total(body) < failed_at + 3:  # still exporting after the failure
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.3)
                body = urllib.request.urlopen(url, timeout=5).read().decode()
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=10) == 0
        finally:
            stderr = stop_process(proc)
    assert "tailsight_recording_errors_total 1.0" in body
    assert "disk full" in stderr and "cannot serve" not in stderr, stderr
    assert "warning: /metrics on 0.0.0.0" in stderr, stderr


@pytest.mark.kernel
def test_full_disk_ends_a_record_only_agent_with_enospc(
    tree: tuple[CgroupResolver, dict[str, int]], tmp_path: Path
) -> None:
    """Without an exporter (`tailsight record`) the recording is the point: a failed write ends
    the run with the errno kept (the CLI says "disk full"), instead of being survived."""
    resolver, ids = tree
    with full_tmpfs(tmp_path / "small") as mount:
        probe = FakeProbe("runqueue", script(ids, 200, seed=6))
        config = CollectorConfig(probes=("runqueue",), interval_s=0.01)
        agent = Agent(
            config,
            resolver,
            writer=RecordingWriter(mount / "rec"),
            log=lambda m: None,
            create_probe=lambda name: probe,
        )
        agent.start()
        fill(mount)
        with pytest.raises(RecordingFailed) as raised:
            agent.run(threading.Event(), duration_s=10)
        agent.close()
    assert raised.value.errno == errno.ENOSPC
    assert agent.interval_errors == 0
