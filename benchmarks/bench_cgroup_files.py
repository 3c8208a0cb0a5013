"""File probes' cost per interval on a host of many cgroups: N cgroup v2 groups and v1 cpu groups
of the same paths (N/50 parents of 50 each; 20 with a CPU quota), the throttle and pressure
probes' ``read()`` with the agent's default watch of the 32 busiest (``watch()`` with 32 paths;
their ancestors are read too), median and p90 over the reads. Each read includes its share of
the throttle probe's walk for cgroups given a limit since (at most WALKED_PER_READ directories);
the first read, which walks every group at once, is shown apart. The baseline, measured in the
same run and interleaved, is the floor of the same work: the file-system calls of the read
before, made raw (each file opened, read and closed, each directory listed, each path tested);
the ratio is what the probes' Python adds to what the kernel takes.

Root with cgroupfs (v2 + the v1 cpu controller) uses the real hierarchies (groups made under
tailsight-test/, removed afterwards, on error too); otherwise a fake tree of plain files in a
temporary directory, which is cheaper to read than cgroupfs: its figures only keep the code run.

Usage: bench_cgroup_files.py [--quick] [--cgroups N] [--reads N]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType

from tailsight.cgroups import find_cgroup2_mount
from tailsight.probes import cgroupfiles, pressure, throttle
from tailsight.probes.cgroupfiles import WATCHED_BUSIEST, find_v1_mount
from tailsight.probes.pressure import PressureProbe
from tailsight.probes.throttle import ThrottleProbe
from tailsight.testing.workload import private_base

GOAL_MS = 5.0  # per interval, at 1,000 cgroups
LIMITED = 20  # cgroups with a CPU quota
PER_PARENT = 50
QUOTA_US = 20000

Call = tuple[str, str]  # (kind, path): "read", "list" or "test"


@contextlib.contextmanager
def recorded(calls: list[Call]) -> Iterator[None]:
    """The probes' file-system calls while inside, appended to ``calls`` (the calls are made)."""
    read_file, scandir = cgroupfiles.read_file, os.scandir
    exists, isdir = os.path.exists, os.path.isdir

    def reading(path: str) -> bytes | None:
        calls.append(("read", path))
        return read_file(path)

    def listing(path: str) -> Iterator[os.DirEntry[str]]:
        calls.append(("list", path))
        return scandir(path)

    def testing(test: Callable[[str], bool]) -> Callable[[str], bool]:
        def tested(path: str) -> bool:
            calls.append(("test", path))
            return test(path)

        return tested

    modules = (cgroupfiles, throttle, pressure)
    try:
        for module in modules:
            module.read_file = reading  # type: ignore[attr-defined]
        os.scandir = listing  # type: ignore[assignment]
        os.path.exists, os.path.isdir = testing(exists), testing(isdir)
        yield
    finally:
        for module in modules:
            module.read_file = read_file  # type: ignore[attr-defined]
        os.scandir = scandir
        os.path.exists, os.path.isdir = exists, isdir


def replay(calls: list[Call]) -> None:
    """The same calls, raw: open + read + close, a directory's listing, a stat."""
    for kind, path in calls:
        try:
            if kind == "read":
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.read(fd, 4096)
                finally:
                    os.close(fd)
            elif kind == "list":
                with os.scandir(path) as entries:
                    for entry in entries:
                        entry.is_dir(follow_symlinks=False)
            else:
                os.stat(path)
        except OSError:
            pass


class Hierarchies:
    """v2 groups and v1 cpu groups of the same paths under ``base``; removed on close."""

    def __init__(self, v2_root: Path, v1_root: Path, base: str, real: bool) -> None:
        self.v2_root, self.v1_root, self.base, self.real = v2_root, v1_root, base, real
        self.made: list[Path] = []
        self.paths: list[str] = []
        self.limited: list[str] = []

    def make(self, cgroups: int) -> None:
        parents = [f"/{self.base}/p{n}" for n in range(-(-cgroups // PER_PARENT))]
        self.paths = [f"{parents[n // PER_PARENT]}/c{n}" for n in range(cgroups)]
        for root in (self.v2_root, self.v1_root):
            self._mkdir(root, self.base.split("/"))
            for path in (*parents, *self.paths):
                self._mkdir(root, path.strip("/").split("/")[-1:], Path(path).parent.as_posix())
        step = max(1, cgroups // LIMITED)
        self.limited = self.paths[::step][:LIMITED]
        for path in self.limited:
            (self.v1_root / path.lstrip("/") / "cpu.cfs_quota_us").write_text(str(QUOTA_US))

    def _mkdir(self, root: Path, parts: list[str], under: str = "/") -> None:
        directory = root / under.lstrip("/")
        for part in parts:
            directory = directory / part
            try:
                directory.mkdir()
            except FileExistsError:
                continue
            self.made.append(directory)
            if not self.real:
                fake_files(directory, v1=root == self.v1_root)

    def close(self) -> None:
        """Deepest first; a level shared with concurrent runs (tailsight-test) is left."""
        while self.made:
            directory = self.made.pop()
            if not self.real:
                for file in directory.iterdir():
                    if file.is_file():
                        file.unlink()
            with contextlib.suppress(FileNotFoundError):
                try:
                    directory.rmdir()
                except OSError:
                    if directory.name != "tailsight-test":
                        raise


def fake_files(directory: Path, v1: bool) -> None:
    """What cgroupfs shows in a group, as plain files."""
    if v1:
        (directory / "cpu.cfs_quota_us").write_text("-1\n")
        (directory / "cpu.cfs_period_us").write_text("100000\n")
        (directory / "cgroup.procs").write_text("")
        stat = "nr_periods 0\nnr_throttled 0\nthrottled_time 0\nnr_bursts 0\nburst_time 0\n"
        (directory / "cpu.stat").write_text(stat)
    else:
        psi = "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
        for resource in ("cpu", "memory", "io"):
            (directory / f"{resource}.pressure").write_text(psi + psi.replace("some", "full"))
        (directory / "cpu.stat").write_text("usage_usec 0\nuser_usec 0\nsystem_usec 0\n")


def fake_host(root: Path) -> tuple[Path, Path, Path]:
    """(v2 root, v1 cpu root, proc) of a fake host in ``root``."""
    v2, v1, proc = root / "v2", root / "cpu", root / "proc"
    for directory in (v2, v1, proc / "pressure"):
        directory.mkdir(parents=True)
    fake_files(v2, v1=False)
    fake_files(v1, v1=True)
    (v2 / "cgroup.controllers").write_text("\n")
    (v2 / "cgroup.subtree_control").write_text("\n")
    for resource in ("cpu", "memory", "io"):
        (proc / "pressure" / resource).write_text("some avg10=0.00 total=0\nfull total=0\n")
    return v2, v1, proc


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def ms(values: list[float]) -> str:
    median, p90 = statistics.median(values) * 1e3, quantile(values, 0.9) * 1e3
    return f"median {median:6.2f} ms, p90 {p90:6.2f} ms"


def ratio(values: list[float], baseline: list[float]) -> str:
    return f"{statistics.median(values) / statistics.median(baseline):5.2f}x"


def measure(hierarchies: Hierarchies, proc: Path, reads: int, log: Callable[[str], None]) -> None:
    """Time the reads and print the figures."""
    throttle_probe = ThrottleProbe(hierarchies.v2_root, hierarchies.v1_root, proc=proc)
    pressure_probe = PressureProbe(hierarchies.v2_root, proc=proc)
    throttle_probe.attach()
    pressure_probe.attach()
    busiest = random.Random(7).sample(
        hierarchies.paths, min(WATCHED_BUSIEST, len(hierarchies.paths))
    )
    for probe in (throttle_probe, pressure_probe):
        probe.watch(busiest)
    began = time.perf_counter()
    throttle_probe.read()  # the first read walks every group at once
    first_s = time.perf_counter() - began
    pressure_probe.read()
    # Reads alternate: one recorded (its calls are the next one's floor), one timed.
    both, floor, calls_per_read, walked = [], [], [], []
    own: dict[str, list[float]] = {"throttle": [], "pressure": []}
    for _ in range(reads):
        calls: list[Call] = []
        for probe in (throttle_probe, pressure_probe):
            probe.watch(busiest)  # as the agent does every interval
        with recorded(calls):
            throttle_probe.read()
            pressure_probe.read()
        for probe in (throttle_probe, pressure_probe):
            probe.watch(busiest)
        began = time.perf_counter()
        throttle_probe.read()
        between = time.perf_counter()
        pressure_probe.read()
        ended = time.perf_counter()
        own["throttle"].append(between - began)
        own["pressure"].append(ended - between)
        both.append(ended - began)
        began = time.perf_counter()
        replay(calls)
        floor.append(time.perf_counter() - began)
        calls_per_read.append(len(calls))
        walked.append(sum(kind == "list" for kind, _ in calls))
    found = {dict(key)["cgroup"] for _, key in throttle_probe.read().counters}
    ours = {os.stat(hierarchies.v2_root / path.lstrip("/")).st_ino for path in hierarchies.limited}
    assert ours <= found, f"{len(ours - found)} of the limited cgroups not found"
    throttle_probe.close()
    pressure_probe.close()
    watched = len(cgroupfiles.WatchedCgroups(hierarchies.v2_root).with_ancestors(busiest))
    log(
        f"  {len(hierarchies.paths):,} cgroups ({len(hierarchies.limited)} with a quota), "
        f"{len(busiest)} watched ({watched} with ancestors), {reads} reads timed"
    )
    log(f"  first read, walks every group at once: {first_s * 1e3:6.2f} ms (once)")
    log(f"  floor, the same calls raw (baseline) : {ms(floor)}")
    log(
        f"    ({statistics.median(calls_per_read):.0f} calls per interval, "
        f"{statistics.median(walked):.0f} directories of a walk among them)"
    )
    for name in ("throttle", "pressure"):
        log(f"  {name} read                        : {ms(own[name])}")
    log(f"  both, per interval                   : {ms(both)}  {ratio(both, floor)} the floor")
    if len(hierarchies.paths) >= 1000:
        median, p90 = statistics.median(both) * 1e3, quantile(both, 0.9) * 1e3
        verdict = ", ".join(
            f"{name} {'met' if value <= GOAL_MS else 'missed'}"
            for name, value in (("median", median), ("p90", p90))
        )
        log(f"  goal {GOAL_MS:g} ms per interval at 1,000 cgroups: {verdict}")


def terminate(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # so that the groups are removed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short run for CI")
    parser.add_argument("--cgroups", type=int, action="append", help="repeatable")
    parser.add_argument("--reads", type=int, default=None)
    args = parser.parse_args(argv)
    sizes = args.cgroups or ([100] if args.quick else [100, 1000])
    reads = args.reads or (30 if args.quick else 200)
    signal.signal(signal.SIGTERM, terminate)
    v1_root = find_v1_mount("cpu")
    real = os.geteuid() == 0 and v1_root is not None
    with contextlib.ExitStack() as stack:
        if real:
            assert v1_root is not None
            v2_root, proc = find_cgroup2_mount(), Path("/proc")
            print(f"cgroupfs: v2 at {v2_root}, v1 cpu at {v1_root}")
        else:
            temp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            v2_root, v1_root, proc = fake_host(temp)
            print("fake cgroupfs of plain files (not root, or no v1 cpu controller)")
        for cgroups in sizes:
            hierarchies = Hierarchies(v2_root, v1_root, private_base("bench-cgroup-files"), real)
            try:
                began = time.perf_counter()
                hierarchies.make(cgroups)
                made_s = time.perf_counter() - began
                print(f"{cgroups:,} cgroups made in {made_s:.1f} s")
                measure(hierarchies, proc, reads, print)
            finally:
                hierarchies.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
