"""The throttle probe: on fake cgroupfs trees (hybrid v1 cpu controller matched by path or by
task, pure cgroup v2, limits set and changed, filter, forget, removal), then against the
kernel's own v1 ``cpu.stat`` of a CPU spinner under a quota, read by the test around each of
the probe's reads."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

import pytest

from tailsight.cgroups import find_cgroup2_mount
from tailsight.probes import throttle
from tailsight.probes.base import Snapshot
from tailsight.probes.cgroupfiles import RESCAN_INTERVALS, WALKED_PER_READ, find_v1_mount, read_file
from tailsight.probes.loader import ProbeError
from tailsight.probes.throttle import COUNTERS, LIMIT_LABEL, ThrottleProbe, cpu_max_text
from tailsight.testing.workload import Task, Workload, default_cpu, private_base, rmdir_retrying

Counts = tuple[int, int, int]  # (periods, throttled periods, throttled ns)


def by_limit(snapshot: Snapshot, cgroup_id: int) -> dict[str, Counts]:
    """A cgroup's (periods, throttled periods, throttled ns) per ``cpu_max`` label."""
    out: dict[str, list[int]] = {}
    for (name, key), value in snapshot.counters.items():
        found = dict(key)
        if found.get("cgroup") == cgroup_id:
            out.setdefault(str(found[LIMIT_LABEL]), [0, 0, 0])[COUNTERS.index(name)] = value
    return {limit: (c[0], c[1], c[2]) for limit, c in out.items()}


def cgroup_ids(snapshot: Snapshot) -> set[int]:
    return {int(dict(key)["cgroup"]) for _, key in snapshot.counters}


# --- a fake hybrid host: cgroup v2 without controllers, the cpu controller on v1 ---------------


class FakeHost:
    """``v2/`` (cgroup v2, no controllers unless ``v2_cpu``), ``cpu/`` (v1 cpu controller),
    ``proc/`` and a mounts file, in a temporary directory."""

    def __init__(self, root: Path, v2_cpu: bool = False, v1: bool = True) -> None:
        self.v2, self.v1, self.proc = root / "v2", root / "cpu", root / "proc"
        self.mounts = root / "mounts"
        self.v2.mkdir()
        self.proc.mkdir()
        controllers = "cpu memory" if v2_cpu else ""
        (self.v2 / "cgroup.controllers").write_text(controllers + "\n")
        (self.v2 / "cgroup.subtree_control").write_text(controllers + "\n")
        lines = [f"cgroup2 {self.v2} cgroup2 rw 0 0"]
        if v1:
            lines.append(f"cgroup {self.v1} cgroup rw,relatime,cpu 0 0")
            self.v1_group("/")
        self.mounts.write_text("\n".join(lines) + "\n")

    def probe(self) -> ThrottleProbe:
        return ThrottleProbe(mounts_path=self.mounts, proc=self.proc)

    def v2_group(self, path: str) -> int:
        directory = self.v2 / path.lstrip("/")
        directory.mkdir(parents=True, exist_ok=True)
        return os.stat(directory).st_ino

    def v1_group(self, path: str, quota_us: int = -1, procs: Sequence[int] = ()) -> Path:
        directory = self.v1 / path.lstrip("/")
        directory.mkdir(parents=True, exist_ok=True)
        self.set_quota(path, quota_us)
        (directory / "cpu.cfs_period_us").write_text("100000\n")
        (directory / "cgroup.procs").write_text("".join(f"{pid}\n" for pid in procs))
        self.set_v1_stat(path, (0, 0, 0))
        return directory

    def set_quota(self, path: str, quota_us: int) -> None:
        (self.v1 / path.lstrip("/") / "cpu.cfs_quota_us").write_text(f"{quota_us}\n")

    def set_v1_stat(self, path: str, counts: Counts) -> None:
        periods, throttled, throttled_ns = counts
        (self.v1 / path.lstrip("/") / "cpu.stat").write_text(
            f"nr_periods {periods}\nnr_throttled {throttled}\nthrottled_time {throttled_ns}\n"
            "nr_bursts 0\nburst_time 0\n"
        )

    def v2_limited(self, path: str, cpu_max: str, counts: Counts) -> int:
        """A v2 group with its own cpu controller files; ``counts`` in (.., .., µs) as v2."""
        cgroup_id = self.v2_group(path)
        (self.v2 / path.lstrip("/") / "cpu.max").write_text(cpu_max + "\n")
        self.set_v2_stat(path, counts)
        return cgroup_id

    def set_v2_stat(self, path: str, counts: Counts) -> None:
        periods, throttled, throttled_us = counts
        (self.v2 / path.lstrip("/") / "cpu.stat").write_text(
            f"usage_usec 900\nuser_usec 800\nsystem_usec 100\nnr_periods {periods}\n"
            f"nr_throttled {throttled}\nthrottled_usec {throttled_us}\nnr_bursts 0\n"
            "burst_usec 0\n"
        )

    def task(self, pid: int, v2_path: str) -> None:
        (self.proc / str(pid)).mkdir()
        (self.proc / str(pid) / "cgroup").write_text(f"1:cpu:/whatever\n0::{v2_path}\n")


@pytest.fixture
def host(tmp_path: Path) -> FakeHost:
    return FakeHost(tmp_path)


def test_cpu_max_text() -> None:
    assert cpu_max_text("20000 100000") == "20 ms per 100 ms"
    assert cpu_max_text("2500 10000") == "2.5 ms per 10 ms"
    assert cpu_max_text("max 100000") == "max 100000"


def test_a_v1_limit_counts_for_the_v2_cgroup_of_the_same_path(host: FakeHost) -> None:
    app = host.v2_group("/svc/app")
    host.v1_group("/svc/app", quota_us=20000)
    host.set_v1_stat("/svc/app", (100, 40, 9_000_000))  # its past before the probe
    probe = host.probe()
    probe.attach()
    assert by_limit(probe.read(), app) == {"20000 100000": (0, 0, 0)}
    host.set_v1_stat("/svc/app", (107, 45, 9_300_000))
    assert by_limit(probe.read(), app) == {"20000 100000": (7, 5, 300_000)}
    host.set_v1_stat("/svc/app", (110, 45, 9_300_000))
    snapshot = probe.read()
    assert by_limit(snapshot, app) == {"20000 100000": (10, 5, 300_000)}
    assert cgroup_ids(snapshot) == {app}  # the unlimited root and /svc are not named


def test_a_v1_group_of_another_path_counts_for_its_first_task_v2_cgroup(host: FakeHost) -> None:
    """Docker on a hybrid host: the v1 group's path is no v2 cgroup; its task says which is."""
    scope = host.v2_group("/system.slice/docker-abc.scope")
    probe = host.probe()
    probe.attach()
    probe.read()  # the first read's walk: no limit yet
    host.task(4242, "/system.slice/docker-abc.scope")
    host.v1_group("/docker/abc", quota_us=50000, procs=[4242, 4243])
    host.set_v1_stat("/docker/abc", (3, 1, 1000))
    reads = 1
    while scope not in cgroup_ids(snapshot := probe.read()):  # not watched: found by a walk
        reads += 1
        assert reads <= 2 * RESCAN_INTERVALS, "no walk found the limit"
    assert reads > RESCAN_INTERVALS  # the next walk began RESCAN_INTERVALS reads after the first
    assert by_limit(snapshot, scope) == {"50000 100000": (0, 0, 0)}
    host.set_v1_stat("/docker/abc", (8, 4, 5000))
    assert by_limit(probe.read(), scope) == {"50000 100000": (5, 3, 4000)}


def test_a_walk_is_spread_over_reads_with_a_bounded_share_each(
    host: FakeHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A host of many cgroups: each read tests at most WALKED_PER_READ of them for a limit, and
    a walk still visits every one."""
    groups = (RESCAN_INTERVALS + 1) * WALKED_PER_READ  # more than a walk per 10 reads takes
    for n in range(groups):
        host.v2_group(f"/g{n}")
        host.v1_group(f"/g{n}", quota_us=10000 if n == groups - 1 else -1)
    tested: list[str] = []

    def reading(path: str) -> bytes | None:
        if path.endswith("/cpu.cfs_quota_us"):
            tested.append(path)
        return read_file(path)

    monkeypatch.setattr(throttle, "read_file", reading)
    probe = host.probe()
    probe.attach()
    probe.read()
    assert len(tested) == groups + 2  # the first read walks all (the root too), then reads /g..
    per_read = []
    for _ in range(4 * RESCAN_INTERVALS):
        tested.clear()
        probe.read()
        per_read.append(len(tested) - 1)  # the limited group's own read
    assert max(per_read) == WALKED_PER_READ
    assert sum(per_read) >= 2 * (groups + 1)  # two walks (or more) in these reads
    assert per_read[: RESCAN_INTERVALS - 1] == [0] * (RESCAN_INTERVALS - 1)  # none until due


def test_a_v1_group_without_tasks_or_v2_cgroup_counts_for_nobody(host: FakeHost) -> None:
    host.v1_group("/docker/gone", quota_us=50000)
    host.v1_group("/docker/left", quota_us=50000, procs=[99])  # its task's /proc is gone
    probe = host.probe()
    probe.attach()
    host.set_v1_stat("/docker/gone", (5, 5, 5))
    assert probe.read().counters == {}
    assert probe.read().counters == {}


def test_a_pure_v2_limit_reads_cpu_max_and_throttled_usec(tmp_path: Path) -> None:
    host = FakeHost(tmp_path, v2_cpu=True, v1=False)
    app = host.v2_limited("/app", "50000 100000", (10, 2, 1000))
    free = host.v2_limited("/free", "max 100000", (10, 0, 0))
    probe = host.probe()
    probe.attach()
    probe.watch(["/free", "/app"])
    assert by_limit(probe.read(), app) == {"50000 100000": (0, 0, 0)}
    host.set_v2_stat("/app", (13, 4, 1250))
    host.set_v2_stat("/free", (20, 0, 0))
    snapshot = probe.read()
    assert by_limit(snapshot, app) == {"50000 100000": (3, 2, 250_000)}  # µs -> ns
    assert free not in cgroup_ids(snapshot)


def test_a_cgroup_without_a_limit_yields_no_counters(host: FakeHost) -> None:
    free = host.v2_group("/free")
    host.v1_group("/free")  # cfs_quota_us -1
    probe = host.probe()
    probe.attach()
    probe.watch(["/free"])
    for periods in (0, 5, 9):
        host.set_v1_stat("/free", (periods, 0, 0))
        assert free not in cgroup_ids(probe.read())


def test_a_limit_set_on_a_watched_cgroup_counts_from_its_first_interval(host: FakeHost) -> None:
    app = host.v2_group("/svc/app")
    host.v1_group("/svc/app")
    probe = host.probe()
    probe.attach()
    probe.watch(["/svc/app"])
    host.set_v1_stat("/svc/app", (10, 0, 0))
    probe.read()
    host.set_v1_stat("/svc/app", (15, 3, 700))
    host.set_quota("/svc/app", 30000)  # between two reads: its interval counts under it
    assert by_limit(probe.read(), app) == {"30000 100000": (5, 3, 700)}


def test_a_limit_set_on_a_parent_is_read_for_its_busy_child(host: FakeHost) -> None:
    """A parent's limit throttles its children: a watched cgroup's ancestors are read too."""
    svc, app = host.v2_group("/svc"), host.v2_group("/svc/app")
    host.v1_group("/svc/app")
    host.v1_group("/svc")
    probe = host.probe()
    probe.attach()
    probe.read()  # the walk saw no limit
    host.set_quota("/svc", 50000)
    assert svc not in cgroup_ids(probe.read())  # not watched: no walk since
    probe.watch(["/svc/app"])
    assert by_limit(probe.read(), svc) == {"50000 100000": (0, 0, 0)}
    host.set_v1_stat("/svc", (4, 4, 4))
    snapshot = probe.read()
    assert by_limit(snapshot, svc) == {"50000 100000": (4, 4, 4)}
    assert app not in cgroup_ids(snapshot)


def test_a_changed_quota_starts_a_new_label_set_counts_carried_over(host: FakeHost) -> None:
    app = host.v2_group("/app")
    host.v1_group("/app", quota_us=20000)
    probe = host.probe()
    probe.attach()
    probe.read()
    host.set_v1_stat("/app", (10, 8, 1000))
    probe.read()
    host.set_quota("/app", 40000)
    host.set_v1_stat("/app", (15, 9, 1500))
    snapshot = probe.read()
    assert by_limit(snapshot, app) == {"20000 100000": (10, 8, 1000), "40000 100000": (5, 1, 500)}
    host.set_quota("/app", -1)  # no limit: nothing more counted, the label sets stay
    host.set_v1_stat("/app", (20, 9, 1500))
    assert by_limit(probe.read(), app) == by_limit(snapshot, app)
    delta = probe.read().delta(snapshot)
    assert delta.counters == {}


def test_the_cgroup_filter_reads_only_allowed_cgroups(host: FakeHost) -> None:
    a, b = host.v2_group("/a"), host.v2_group("/b")
    host.v1_group("/a", quota_us=10000)
    host.v1_group("/b", quota_us=10000)
    probe = host.probe()
    probe.set_cgroup_filter([a])  # before attach: kept
    probe.attach()
    assert cgroup_ids(probe.read()) == {a}
    host.set_v1_stat("/a", (1, 1, 1))
    host.set_v1_stat("/b", (1, 1, 1))
    probe.set_cgroup_filter(None)
    snapshot = probe.read()
    assert by_limit(snapshot, a) == {"10000 100000": (1, 1, 1)}
    assert by_limit(snapshot, b) == {"10000 100000": (0, 0, 0)}  # unread before: nothing
    probe.set_cgroup_filter([b])
    host.set_v1_stat("/a", (2, 2, 2))
    host.set_v1_stat("/b", (2, 2, 2))
    snapshot = probe.read()
    assert by_limit(snapshot, a) == {"10000 100000": (1, 1, 1)}  # kept, not read
    assert by_limit(snapshot, b) == {"10000 100000": (1, 1, 1)}


def test_a_removed_cgroup_is_skipped_then_forgotten(host: FakeHost) -> None:
    a, b = host.v2_group("/a"), host.v2_group("/b")
    host.v1_group("/a", quota_us=10000)
    host.v1_group("/b", quota_us=10000)
    probe = host.probe()
    probe.attach()
    probe.read()
    host.set_v1_stat("/a", (3, 3, 3))
    host.set_v1_stat("/b", (3, 3, 3))
    before = probe.read()
    for name in os.listdir(host.v1 / "a"):
        (host.v1 / "a" / name).unlink()
    (host.v1 / "a").rmdir()
    (host.v2 / "a").rmdir()
    host.set_v1_stat("/b", (5, 3, 3))
    snapshot = probe.read()
    assert by_limit(snapshot, a) == by_limit(before, a)  # its last counts, nothing more
    assert by_limit(snapshot, b) == {"10000 100000": (5, 3, 3)}
    probe.forget({a})
    snapshot = probe.read()
    assert cgroup_ids(snapshot) == {b}
    # Recreated at the same path: a new id, counted from its first read.
    new_a = host.v2_group("/a")
    host.v1_group("/a", quota_us=10000)
    host.set_v1_stat("/a", (50, 50, 50))
    probe.watch(["/a"])
    assert by_limit(probe.read(), new_a) == {"10000 100000": (0, 0, 0)}


def test_attach_needs_a_cpu_controller_and_read_needs_attach(tmp_path: Path) -> None:
    host = FakeHost(tmp_path, v2_cpu=False, v1=False)
    with pytest.raises(ProbeError, match="no cpu controller"):
        host.probe().attach()
    with pytest.raises(ProbeError, match="not attached"):
        host.probe().read()
    mounts = tmp_path / "no-cgroup2"
    mounts.write_text("sysfs /sys sysfs rw 0 0\n")
    with pytest.raises(ProbeError, match="cgroup2"):
        ThrottleProbe(mounts_path=mounts).attach()


# --- the kernel: a CPU spinner under a v1 CFS quota -------------------------------------------


def v1_cpu_root() -> Path:
    root = find_v1_mount("cpu")
    if root is None:
        pytest.skip("kernel: no cgroup v1 cpu controller mounted (a hybrid host has one)")
    if "cpu" in (find_cgroup2_mount() / "cgroup.controllers").read_text().split():
        pytest.skip("kernel: the cpu controller is on cgroup v2 here, not on v1")
    return root


@contextlib.contextmanager
def v1_groups(root: Path, paths: Sequence[str]) -> Iterator[dict[str, Path]]:
    """v1 cpu groups at these paths (made level by level), removed on exit, deepest first; a
    level that was there already (tailsight-test, shared with concurrent tests) is left."""
    made: list[Path] = []
    try:
        out = {}
        for path in paths:
            directory = root
            for part in path.strip("/").split("/"):
                directory = directory / part
                try:
                    directory.mkdir()
                except FileExistsError:
                    continue
                made.append(directory)
            out[path] = directory
        yield out
    finally:
        for directory in reversed(made):
            if directory.name == "tailsight-test":
                with contextlib.suppress(OSError):  # another test's groups may be in it
                    directory.rmdir()
            else:
                rmdir_retrying(directory)


def v1_stat(directory: Path) -> Counts:
    values = dict(line.split() for line in (directory / "cpu.stat").read_text().splitlines())
    return int(values["nr_periods"]), int(values["nr_throttled"]), int(values["throttled_time"])


def stopped_and_settled(pids: Sequence[int], directory: Path, timeout_s: float = 3.0) -> Counts:
    """Stop the tasks and wait until the group's counters stand still (the period timer counts
    a period or two more after the last runnable task), so that they can be compared exactly."""
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout_s
    last = v1_stat(directory)
    while True:
        time.sleep(0.25)  # 2.5 periods
        now = v1_stat(directory)
        if now == last:
            return now
        assert time.monotonic() < deadline, f"{directory}/cpu.stat never settled"
        last = now


def between(low: Counts, value: Counts, high: Counts) -> bool:
    return all(lo <= v <= hi for lo, v, hi in zip(low, value, high, strict=True))


def minus(a: Counts, b: Counts) -> Counts:
    return a[0] - b[0], a[1] - b[1], a[2] - b[2]


def bracketed_reads(
    probe: ThrottleProbe, directory: Path, intervals: int, interval_s: float
) -> list[tuple[Counts, Snapshot, Counts]]:
    """(file before, probe reading, file after) for each interval."""
    out = []
    for _ in range(intervals):
        time.sleep(interval_s)
        before = v1_stat(directory)
        snapshot = probe.read()
        after = v1_stat(directory)
        out.append((before, snapshot, after))
    return out


def check_intervals(
    start: Counts,
    first: Snapshot,
    reads: list[tuple[Counts, Snapshot, Counts]],
    cgroup_id: int,
) -> None:
    """Each interval's counters (summed over the limits) lie within what the file moved between
    the reads around the probe's: the probe's own read of the file fell between them."""
    previous_after, previous_before, previous = start, start, first
    for n, (before, snapshot, after) in enumerate(reads):
        moved = [0, 0, 0]
        for counts in by_limit(snapshot.delta(previous), cgroup_id).values():
            moved = [m + c for m, c in zip(moved, counts, strict=True)]
        low, high = minus(before, previous_after), minus(after, previous_before)
        assert between(low, (moved[0], moved[1], moved[2]), high), (n, low, moved, high)
        previous_after, previous_before, previous = after, before, snapshot


class Spinner(NamedTuple):
    directory: Path  # its v1 cpu group
    pid: int
    cgroup_id: int
    cgroup_path: str  # its v2 cgroup


@contextlib.contextmanager
def limited_spinner(name: str) -> Iterator[Spinner]:
    """A CPU spinner in /<private base>/limited, v1 and v2 alike, its v1 group limited to 20 ms
    of every 100 ms period."""
    v1_root = v1_cpu_root()
    base = private_base(name)
    with (
        v1_groups(v1_root, [f"/{base}/limited"]) as v1,
        Workload([Task("limited", cpu=default_cpu())], base=base) as workload,
    ):
        directory, pid = v1[f"/{base}/limited"], workload.pids()[0]
        (directory / "cpu.cfs_period_us").write_text("100000")
        (directory / "cpu.cfs_quota_us").write_text("20000")
        (directory / "cgroup.procs").write_text(str(pid))
        yield Spinner(
            directory, pid, workload.cgroup_id("limited"), workload.cgroup_path("limited")
        )


@pytest.mark.kernel
def test_throttle_counts_equal_the_kernel_v1_cpu_stat(kernel_ready: None) -> None:
    with limited_spinner("throttle") as (directory, pid, cgroup_id, cgroup_path):
        probe = ThrottleProbe()
        probe.attach()
        probe.watch([cgroup_path])  # as the agent does for a busy one
        start = stopped_and_settled([pid], directory)
        first = probe.read()
        assert v1_stat(directory) == start
        assert by_limit(first, cgroup_id) == {"20000 100000": (0, 0, 0)}
        os.kill(pid, signal.SIGCONT)
        reads = bracketed_reads(probe, directory, intervals=5, interval_s=0.5)
        check_intervals(start, first, reads, cgroup_id)
        end = stopped_and_settled([pid], directory)
        last = probe.read()
        moved = minus(end, start)
        assert by_limit(last, cgroup_id) == {"20000 100000": moved}
        # A spinner allowed 20 ms of every 100 ms is throttled in most periods (the last ones
        # counted, once it is stopped, are not; a busy CPU can delay the quota's end).
        assert moved[0] >= 15 and moved[1] >= moved[0] // 2 and moved[2] > 0
        probe.close()


@pytest.mark.kernel
def test_a_quota_changed_mid_run_starts_a_new_label_set(kernel_ready: None) -> None:
    with limited_spinner("throttle-change") as (directory, pid, cgroup_id, _):
        probe = ThrottleProbe()
        probe.attach()  # not watched: found by the first read's walk
        start = stopped_and_settled([pid], directory)
        first = probe.read()
        os.kill(pid, signal.SIGCONT)
        reads = bracketed_reads(probe, directory, intervals=2, interval_s=0.5)
        (directory / "cpu.cfs_quota_us").write_text("30000")
        reads += bracketed_reads(probe, directory, intervals=2, interval_s=0.5)
        check_intervals(start, first, reads, cgroup_id)
        end = stopped_and_settled([pid], directory)
        last = by_limit(probe.read(), cgroup_id)
        assert set(last) == {"20000 100000", "30000 100000"}
        before_change, _, after_change = reads[1]
        assert between(
            minus(before_change, start), last["20000 100000"], minus(after_change, start)
        )
        total = [a + b for a, b in zip(last["20000 100000"], last["30000 100000"], strict=True)]
        assert tuple(total) == minus(end, start)  # nothing counted twice, nothing lost
        assert last["30000 100000"][0] > 0


@pytest.mark.kernel
def test_a_v1_group_of_another_path_is_found_through_its_task(kernel_ready: None) -> None:
    v1_root = v1_cpu_root()
    base = private_base("throttle-task")
    v1_path = f"/{private_base('throttle-task-v1')}/limited"  # no v2 cgroup of this path
    with (
        v1_groups(v1_root, [v1_path]) as v1,
        Workload([Task("app", cpu=default_cpu())], base=base) as workload,
    ):
        directory, pid = v1[v1_path], workload.pids()[0]
        cgroup_id = workload.cgroup_id("app")
        probe = ThrottleProbe()
        probe.attach()
        assert cgroup_id not in cgroup_ids(probe.read())  # the walk: no limit there yet
        (directory / "cpu.cfs_period_us").write_text("100000")
        (directory / "cpu.cfs_quota_us").write_text("20000")
        (directory / "cgroup.procs").write_text(str(pid))
        for _ in range(10 * RESCAN_INTERVALS):  # the next walk finds it
            before = v1_stat(directory)
            first = probe.read()
            after = v1_stat(directory)
            if cgroup_id in cgroup_ids(first):
                break
        assert by_limit(first, cgroup_id) == {"20000 100000": (0, 0, 0)}
        reads = bracketed_reads(probe, directory, intervals=2, interval_s=0.5)
        previous_before, previous_after, previous = before, after, first
        for before, snapshot, after in reads:
            moved = by_limit(snapshot.delta(previous), cgroup_id)["20000 100000"]
            low, high = minus(before, previous_after), minus(after, previous_before)
            assert between(low, moved, high), (low, moved, high)
            previous_before, previous_after, previous = before, after, snapshot
        assert by_limit(reads[-1][1], cgroup_id)["20000 100000"][1] > 0


@pytest.mark.kernel
def test_a_busy_cgroup_without_a_limit_has_no_throttle_counters(kernel_ready: None) -> None:
    v1_root = v1_cpu_root()
    base = private_base("throttle-free")
    with (
        v1_groups(v1_root, [f"/{base}/free"]) as v1,
        Workload([Task("free", cpu=default_cpu())], base=base) as workload,
    ):
        (v1[f"/{base}/free"] / "cgroup.procs").write_text(str(workload.pids()[0]))
        probe = ThrottleProbe()
        probe.attach()
        probe.watch([workload.cgroup_path("free")])
        for _ in range(3):
            assert workload.cgroup_id("free") not in cgroup_ids(probe.read())
            time.sleep(0.2)
