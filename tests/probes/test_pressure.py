"""The pressure probe: the PSI file parser, the probe on fake cgroupfs and procfs trees (watched
cgroups and their ancestors, the host, skipped reads, filter, forget, removal), then against
the kernel's own ``cpu.pressure`` of a spinner sharing its CPU with a hog, and the host's
``/proc/pressure``, read by the test around each of the probe's reads."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from tailsight.probes.base import Snapshot, labels
from tailsight.probes.loader import ProbeError
from tailsight.probes.pressure import (
    FULL,
    HOST_FULL,
    HOST_SOME,
    RESOURCES,
    SOME,
    PressureProbe,
    parse_pressure,
)
from tailsight.testing.workload import Task, Workload, default_cpu, private_base

Stall = tuple[int, int]  # (some, full) ns


def pressure_text(some_us: int, full_us: int | None, avg: float = 0.0) -> str:
    """A pressure file as the kernel writes it (``psi_show``)."""
    lines = [f"some avg10={avg:.2f} avg60={avg:.2f} avg300={avg:.2f} total={some_us}\n"]
    if full_us is not None:
        lines.append(f"full avg10={avg:.2f} avg60={avg:.2f} avg300={avg:.2f} total={full_us}\n")
    return "".join(lines)


def test_parse_pressure_of_kernel_files() -> None:
    cgroup = b"some avg10=73.28 avg60=56.87 avg300=38.77 total=207682234\n" + (
        b"full avg10=1.00 avg60=0.50 avg300=0.10 total=901182\n"
    )
    assert parse_pressure(cgroup) == (207_682_234_000, 901_182_000)
    assert parse_pressure(b"some avg10=0.00 avg60=0.00 avg300=0.00 total=5\n") == (5000, 0)
    assert parse_pressure(b"") is None
    assert parse_pressure(b"full avg10=0.00 avg60=0.00 avg300=0.00 total=5\n") is None
    assert parse_pressure(b"some avg10=0.00 total=\nfull total=x\n") is None


@given(
    st.integers(min_value=0, max_value=2**64 // 1000),
    st.none() | st.integers(min_value=0, max_value=2**64 // 1000),
    st.floats(min_value=0, max_value=100),
)
def test_parse_pressure_reads_back_the_totals_in_ns(
    some_us: int, full_us: int | None, avg: float
) -> None:
    text = pressure_text(some_us, full_us, avg).encode()
    assert parse_pressure(text) == (some_us * 1000, (full_us or 0) * 1000)


@given(st.binary(max_size=200) | st.text("somefull tal=0123 .\n", max_size=80).map(str.encode))
@example(b"some total=\xd9\xa3\n")  # a non-ASCII digit
def test_parse_pressure_never_raises_on_garbage(text: bytes) -> None:
    parsed = parse_pressure(text)
    assert parsed is None or all(value >= 0 for value in parsed)


# --- fake cgroupfs and procfs ----------------------------------------------------------------


class FakeHost:
    """``v2/`` (cgroup v2 with pressure files), ``proc/pressure/``, in a temporary directory."""

    def __init__(self, root: Path) -> None:
        self.v2, self.proc = root / "v2", root / "proc"
        (self.proc / "pressure").mkdir(parents=True)
        self.v2.mkdir()
        for resource in RESOURCES:
            self.set_host(resource, (0, 0))

    def probe(self) -> PressureProbe:
        return PressureProbe(v2_root=self.v2, proc=self.proc)

    def set_host(self, resource: str, stall_us: Stall) -> None:
        full = None if resource == "cpu" and stall_us[1] == 0 else stall_us[1]
        (self.proc / "pressure" / resource).write_text(pressure_text(stall_us[0], full))

    def group(self, path: str) -> int:
        directory = self.v2 / path.lstrip("/")
        directory.mkdir(parents=True, exist_ok=True)
        for resource in RESOURCES:
            if not (directory / f"{resource}.pressure").exists():
                self.set(path, resource, (0, 0))
        return os.stat(directory).st_ino

    def set(self, path: str, resource: str, stall_us: Stall) -> None:
        file = self.v2 / path.lstrip("/") / f"{resource}.pressure"
        file.write_text(pressure_text(*stall_us))


def stalls(snapshot: Snapshot, cgroup_id: int | None, resource: str = "cpu") -> Stall | None:
    """(some, full) ns of a cgroup (None: the host) and resource, None if neither is named (an
    interval, ``Snapshot.delta``, names only the counters that moved)."""
    if cgroup_id is None:
        key = labels(resource=resource)
        names = (HOST_SOME, HOST_FULL)
    else:
        key = labels(cgroup=cgroup_id, resource=resource)
        names = (SOME, FULL)
    some, full = (snapshot.counters.get((name, key)) for name in names)
    if some is None and full is None:
        return None
    return some or 0, full or 0


def cgroup_ids(snapshot: Snapshot) -> set[int]:
    return {int(v) for _, key in snapshot.counters for k, v in key if k == "cgroup"}


@pytest.fixture
def host(tmp_path: Path) -> FakeHost:
    return FakeHost(tmp_path)


def test_watched_cgroups_and_their_ancestors_and_the_host(host: FakeHost) -> None:
    a, ab, c = host.group("/a"), host.group("/a/b"), host.group("/c")
    host.set("/a/b", "cpu", (100, 90))  # its past before the probe
    host.set_host("cpu", (1000, 0))
    probe = host.probe()
    probe.attach()
    probe.watch(["/a/b"])
    snapshot = probe.read()
    assert cgroup_ids(snapshot) == {a, ab}  # not /c, not the root
    assert stalls(snapshot, ab) == (0, 0)
    host.set("/a/b", "cpu", (130, 95))
    host.set("/a", "cpu", (40, 0))
    host.set("/a/b", "io", (7, 3))
    host.set("/c", "cpu", (500, 500))
    host.set_host("cpu", (1100, 0))
    host.set_host("memory", (20, 10))
    snapshot = probe.read()
    assert stalls(snapshot, ab) == (30_000, 5_000)  # µs -> ns
    assert stalls(snapshot, ab, "io") == (7_000, 3_000)
    assert stalls(snapshot, ab, "memory") == (0, 0)
    assert stalls(snapshot, a) == (40_000, 0)
    assert stalls(snapshot, None) == (100_000, 0)
    assert stalls(snapshot, None, "memory") == (20_000, 10_000)
    assert c not in cgroup_ids(snapshot)


def test_stalls_while_a_cgroup_was_not_watched_count_nowhere(host: FakeHost) -> None:
    """Stalls between two reads with unread intervals between: when they fell is not known."""
    a, c = host.group("/a"), host.group("/c")
    probe = host.probe()
    probe.attach()
    probe.watch(["/a"])
    probe.read()
    host.set("/a", "cpu", (10, 0))
    first = probe.read()
    probe.watch(["/c"])
    host.set("/a", "cpu", (50, 0))
    probe.read()
    probe.watch(["/a", "/c"])
    host.set("/a", "cpu", (70, 0))
    assert stalls(probe.read(), a) == (10_000, 0)  # the 40 µs unwatched and these 20: nowhere
    host.set("/a", "cpu", (75, 0))
    host.set("/c", "cpu", (9, 0))
    snapshot = probe.read()
    assert stalls(snapshot, a) == (15_000, 0)
    assert stalls(snapshot, c) == (9_000, 0)
    assert snapshot.delta(first).counters[(SOME, labels(cgroup=a, resource="cpu"))] == 5_000


def test_a_counter_that_goes_backwards_counts_nothing(host: FakeHost) -> None:
    a = host.group("/a")
    probe = host.probe()
    probe.attach()
    probe.watch(["/a"])
    host.set("/a", "cpu", (100, 50))
    probe.read()
    host.set("/a", "cpu", (5, 5))  # recreated between two reads, the old id cached
    assert stalls(probe.read(), a) == (0, 0)
    host.set("/a", "cpu", (8, 6))
    assert stalls(probe.read(), a) == (3_000, 1_000)


def test_the_cgroup_filter_reads_only_allowed_cgroups(host: FakeHost) -> None:
    a, b = host.group("/a"), host.group("/b")
    probe = host.probe()
    probe.set_cgroup_filter([b])
    probe.attach()
    probe.watch(["/a", "/b"])
    snapshot = probe.read()
    assert cgroup_ids(snapshot) == {b}
    assert stalls(snapshot, None) == (0, 0)  # the host is no cgroup: always read
    probe.set_cgroup_filter(None)
    assert cgroup_ids(probe.read()) == {a, b}


def test_a_removed_cgroup_is_skipped_then_forgotten(host: FakeHost) -> None:
    a, b = host.group("/a"), host.group("/b")
    probe = host.probe()
    probe.attach()
    probe.watch(["/a", "/b"])
    probe.read()
    host.set("/a", "cpu", (10, 0))
    before = probe.read()
    for resource in RESOURCES:
        (host.v2 / "a" / f"{resource}.pressure").unlink()
    (host.v2 / "a").rmdir()
    snapshot = probe.read()
    assert stalls(snapshot, a) == stalls(before, a) == (10_000, 0)
    probe.forget({a})
    assert cgroup_ids(probe.read()) == {b}


def test_a_missing_resource_file_leaves_the_others(host: FakeHost) -> None:
    a = host.group("/a")
    (host.v2 / "a" / "io.pressure").unlink()
    (host.proc / "pressure" / "io").unlink()
    probe = host.probe()
    probe.attach()
    probe.watch(["/a"])
    snapshot = probe.read()
    assert stalls(snapshot, a) == (0, 0) and stalls(snapshot, a, "io") is None
    assert stalls(snapshot, None) == (0, 0) and stalls(snapshot, None, "io") is None


def test_attach_needs_pressure_information_and_read_needs_attach(host: FakeHost) -> None:
    with pytest.raises(ProbeError, match="not attached"):
        host.probe().read()
    (host.proc / "pressure" / "cpu").unlink()
    with pytest.raises(ProbeError, match="psi=0"):
        host.probe().attach()


# --- the kernel: a spinner sharing its CPU with a hog ----------------------------------------


def psi_file(path: Path) -> Stall:
    parsed = parse_pressure(path.read_bytes())
    assert parsed is not None, path
    return parsed


class Files:
    """The kernel files the probe reads, read by the test: (some, full) ns per name."""

    def __init__(self, files: dict[str, Path]) -> None:
        self.files = files

    def read(self) -> dict[str, Stall]:
        return {name: psi_file(path) for name, path in self.files.items()}


def settled(files: Files, names: Sequence[str], timeout_s: float = 3.0) -> dict[str, Stall]:
    """Once the named files stand still (their tasks stopped), all the files."""
    deadline = time.monotonic() + timeout_s
    last = files.read()
    while True:
        time.sleep(0.05)
        now = files.read()
        if all(now[name] == last[name] for name in names):
            return now
        assert time.monotonic() < deadline, "the stopped groups' pressure never settled"
        last = now


@pytest.mark.kernel
def test_pressure_equals_the_kernel_pressure_files(kernel_ready: None) -> None:
    if not Path("/proc/pressure/cpu").exists():
        pytest.skip("kernel: no /proc/pressure (CONFIG_PSI off or psi=0)")
    cpu = default_cpu()
    base = private_base("pressure")
    with Workload([Task("victim", cpu=cpu), Task("hog", cpu=cpu)], base=base) as workload:
        victim, parent = workload.cgroup_dir("victim"), workload.cgroup_dir("victim").parent
        ids = {"victim": workload.cgroup_id("victim"), "parent": os.stat(parent).st_ino}
        names = {"victim": victim, "parent": parent}  # both hold only our tasks
        files: dict[str, Path] = {}
        keys: dict[str, tuple[int | None, str]] = {}
        for resource in RESOURCES:
            for name, directory in names.items():
                files[f"{name} {resource}"] = directory / f"{resource}.pressure"
                keys[f"{name} {resource}"] = (ids[name], resource)
            files[f"host {resource}"] = Path("/proc/pressure") / resource
            keys[f"host {resource}"] = (None, resource)
        kernel = Files(files)
        ours = [f"{name} {resource}" for name in names for resource in RESOURCES]
        probe = PressureProbe()
        probe.attach()
        probe.watch([workload.cgroup_path("victim")])
        pids = workload.pids()
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        start = settled(kernel, ours)
        first = probe.read()
        after_first = kernel.read()
        assert all(after_first[name] == start[name] for name in ours)
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
        previous, previous_before, previous_after = first, start, after_first
        for n in range(4):
            time.sleep(0.5)
            before = kernel.read()
            snapshot = probe.read()
            after = kernel.read()
            interval = snapshot.delta(previous)
            for name, (cgroup_id, resource) in keys.items():
                moved = stalls(interval, cgroup_id, resource) or (0, 0)
                for k in (0, 1):  # some, full
                    low = before[name][k] - previous_after[name][k]
                    high = after[name][k] - previous_before[name][k]
                    assert low <= moved[k] <= high, (n, name, ("some", "full")[k], low, moved, high)
            previous, previous_before, previous_after = snapshot, before, after
        # Two spinners on one CPU: the victim waits about half the time.
        victim_some = stalls(previous, ids["victim"])
        assert victim_some is not None and victim_some[0] > 0.2 * 4 * 0.5e9
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        end = settled(kernel, ours)
        last = probe.read()
        for name in ours:
            cgroup_id, resource = keys[name]
            moved = (end[name][0] - start[name][0], end[name][1] - start[name][1])
            assert stalls(last, cgroup_id, resource) == moved, name
        assert workload.cgroup_id("hog") not in cgroup_ids(last)  # not watched
