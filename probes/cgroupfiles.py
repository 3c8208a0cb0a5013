"""What the kernel already counts per cgroup, read from cgroupfs beside the BPF probes.

CPU throttling (``throttle.py``) and pressure stalls (``pressure.py``) need no tracepoint: the
kernel keeps them in each cgroup's files. A file probe reads them once per interval for the
cgroups worth it (:class:`WatchedCgroups`), and hands on counters keyed by cgroup v2 id like
every probe, cumulative since it first saw each one (so a cgroup found later starts at 0, not
at its lifetime's total).

Hybrid hosts (cgroup v2 mounted beside v1 controllers, as systemd's "hybrid" mode) keep the
``cpu`` controller on v1: a v1 group is matched to the v2 cgroup of the same path, or, where
paths differ, to the v2 cgroup of its first task (``/proc/PID/cgroup``).
"""

from __future__ import annotations

import operator
import os
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Final

from tailsight.cgroups import DEFAULT_MOUNTS_PATH, find_cgroup2_mount, normalize
from tailsight.probes.loader import ProbeError

WATCHED_BUSIEST: Final = 32
"""The busiest cgroups of an interval (by the probes' events) whose files are read: what the
exporter's top-K and ``explain`` look at, a bounded read on a host of thousands of cgroups."""
RESCAN_INTERVALS: Final = 10
"""Every this many reads the hierarchy is walked again for cgroups given a limit since, the walk
spread over the reads until the next (over more of them: see WALKED_PER_READ)."""
WALKED_PER_READ: Final = 48
"""At most this many directories are walked per read: a directory costs ~20 µs to list and to
test for a limit on cgroupfs (``benchmarks/bench_cgroup_files.py``), so a host of thousands of
cgroups takes more reads per walk instead of ms more per read."""


def find_v1_mount(controller: str, mounts_path: Path | str = DEFAULT_MOUNTS_PATH) -> Path | None:
    """Where a cgroup v1 controller is mounted ("/sys/fs/cgroup/cpu"), or None."""
    with open(mounts_path, encoding="utf-8") as mounts:
        for line in mounts:
            fields = line.split()
            if len(fields) >= 4 and fields[2] == "cgroup" and controller in fields[3].split(","):
                return Path(fields[1])
    return None


def read_file(path: str) -> bytes | None:
    """A small kernel file's bytes, or None where it is gone (a removed cgroup): one open, one
    read (``Path.read_bytes`` costs three times as much)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)


def key_values(text: bytes) -> dict[bytes, int]:
    """``cpu.stat``'s "name value" lines."""
    out = {}
    for line in text.splitlines():
        name, _, value = line.partition(b" ")
        if value.strip().removeprefix(b"-").isdigit():  # one sign at most: int() takes no "--5"
            out[name] = int(value)
    return out


def v2_path_of_task(pid: int, proc: Path | str = "/proc") -> str | None:
    """The cgroup v2 path of a task ("0::" line of ``/proc/PID/cgroup``), or None."""
    text = read_file(f"{proc}/{pid}/cgroup")
    for line in (text or b"").splitlines():
        if line.startswith(b"0::"):
            return line[3:].decode("utf-8", "replace")
    return None


def walk_paths(root: Path) -> Iterator[str]:
    """Every cgroup path under a hierarchy's mount, "/" first; vanished dirs skipped. Each
    directory is listed when the next path is asked for, so a walk taken a few paths at a time
    lists as many directories as it yields (50 leaves under one parent cost 50 listings then
    rather than at once)."""
    stack = [(str(root), "")]
    while stack:
        directory, relative = stack.pop()
        yield relative or "/"
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                stack.append((entry.path, f"{relative}/{entry.name}"))


class WatchedCgroups:
    """Which v2 cgroups a file probe reads: the busiest of the last interval (handed in by the
    agent, :meth:`watch`), each with its ancestors (a parent's limit throttles its children),
    and whatever the probe keeps on its own (cgroups with a limit). Ids come from the
    directories' inodes, as ``bpf_get_current_cgroup_id`` gives them."""

    def __init__(self, v2_root: Path) -> None:
        self.v2_root = v2_root
        self.busy: list[str] = []
        self.allowed: set[int] | None = None
        self._ids: dict[str, int] = {}

    def watch(self, paths: Iterable[str]) -> None:
        """The busiest cgroups of the interval, busiest first (at most WATCHED_BUSIEST kept)."""
        self.busy = [normalize(p) for p in paths if p.startswith("/")][:WATCHED_BUSIEST]

    def with_ancestors(self, paths: Iterable[str]) -> list[str]:
        """These paths and their ancestors up to (not including) the root, each once."""
        out: dict[str, None] = {}
        for path in paths:
            while path != "/" and path not in out:
                out[path] = None
                path = path.rsplit("/", 1)[0] or "/"
        return list(out)

    def id_of(self, path: str) -> int | None:
        """The v2 id of a path (None: gone, or filtered out by ``allowed``)."""
        cgroup_id = self._ids.get(path)
        if cgroup_id is None:
            try:
                cgroup_id = os.stat(self.v2_root / path.lstrip("/")).st_ino
            except OSError:
                return None
            self._ids[path] = cgroup_id
        if self.allowed is not None and cgroup_id not in self.allowed:
            return None
        return cgroup_id

    def forget(self, cgroup_ids: set[int]) -> None:
        self._ids = {p: i for p, i in self._ids.items() if i not in cgroup_ids}


class Increments:
    """What moved between two consecutive reads of each key's raw counters. A key not read in
    the read before (first seen, or skipped while it was not among the busiest) moved by
    nothing: when its stalls fell is not known, and they must not land in one interval."""

    def __init__(self) -> None:
        self.reads = 0
        self._raw: dict[Hashable, tuple[int, tuple[int, ...]]] = {}

    def next_read(self) -> None:
        self.reads += 1

    def since_last(self, key: Hashable, now: tuple[int, ...]) -> tuple[int, ...]:
        before = self._raw.get(key)
        self._raw[key] = (self.reads, now)
        if before is None or before[0] != self.reads - 1 or len(now) != len(before[1]):
            return (0,) * len(now)
        moved = tuple(map(operator.sub, now, before[1]))  # a fifth of what generators cost
        return (0,) * len(now) if min(moved) < 0 else moved  # < 0: a recreated group

    def forget(self, gone: Callable[[Hashable], bool]) -> None:
        self._raw = {key: raw for key, raw in self._raw.items() if not gone(key)}


class FileProbe:
    """What the file probes share: the cgroup v2 hierarchy found at attach, the cgroups to read
    (:class:`WatchedCgroups`), the cgroup filter; no BPF program."""

    name: str
    attach_mode = "cgroupfs"

    def __init__(self, v2_root: Path | str | None, mounts_path: Path | str) -> None:
        self._v2_root = None if v2_root is None else Path(v2_root)
        self._mounts_path = mounts_path
        self._watched: WatchedCgroups | None = None
        self._allowed: set[int] | None = None

    def _find_v2_root(self) -> Path:
        """The v2 hierarchy (given, or found); ProbeError naming the probe where there is none."""
        if self._v2_root is None:
            try:
                self._v2_root = find_cgroup2_mount(self._mounts_path)
            except FileNotFoundError as error:
                raise ProbeError(f"{self.name}: {error}") from None
        return self._v2_root

    def _start_watching(self) -> None:
        """The last step of ``attach``: from now on ``read`` works."""
        self._watched = WatchedCgroups(self._find_v2_root())
        self._watched.allowed = self._allowed

    def _attached(self) -> WatchedCgroups:
        if self._watched is None:
            raise ProbeError(f"{self.name}: not attached")
        return self._watched

    def watch(self, paths: Iterable[str]) -> None:
        """The busiest cgroups of the last interval, busiest first (the agent's, each interval)."""
        if self._watched is not None:
            self._watched.watch(paths)

    def set_cgroup_filter(self, cgroup_ids: Iterable[int] | None) -> None:
        self._allowed = None if cgroup_ids is None else set(cgroup_ids)
        if self._watched is not None:
            self._watched.allowed = self._allowed

    def program_fds(self) -> Mapping[str, int]:
        return {}

    def forget(self, cgroup_ids: set[int]) -> None:
        if self._watched is not None:
            self._watched.forget(cgroup_ids)

    def close(self) -> None:
        self._watched = None
