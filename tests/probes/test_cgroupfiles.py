"""The shared code of the file probes (``probes/cgroupfiles.py``) on fake cgroupfs and procfs
trees: mounts, the ``cpu.stat`` parser, the tree walk, the watched cgroups and ``Increments``."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from tailsight.probes.cgroupfiles import (
    WATCHED_BUSIEST,
    Increments,
    WatchedCgroups,
    find_v1_mount,
    key_values,
    read_file,
    v2_path_of_task,
    walk_paths,
)

MOUNTS = """\
sysfs /sys sysfs rw,nosuid 0 0
cgroup /sys/fs/cgroup/cpuacct cgroup rw,relatime,cpuacct 0 0
cgroup /sys/fs/cgroup/cpu,cpuset cgroup rw,relatime,cpu,cpuset 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0
"""


def test_find_v1_mount_matches_the_controller_among_the_options(tmp_path: Path) -> None:
    mounts = tmp_path / "mounts"
    mounts.write_text(MOUNTS)
    assert find_v1_mount("cpu", mounts) == Path("/sys/fs/cgroup/cpu,cpuset")
    assert find_v1_mount("cpuacct", mounts) == Path("/sys/fs/cgroup/cpuacct")
    assert find_v1_mount("memory", mounts) is None  # and cgroup2 is not a v1 mount


def test_read_file_returns_none_for_a_missing_file(tmp_path: Path) -> None:
    (tmp_path / "cpu.stat").write_bytes(b"nr_periods 3\n")
    assert read_file(str(tmp_path / "cpu.stat")) == b"nr_periods 3\n"
    assert read_file(str(tmp_path / "gone" / "cpu.stat")) is None
    assert read_file(str(tmp_path)) is None  # a directory: EISDIR on read


def test_key_values_of_a_kernel_cpu_stat() -> None:
    v1 = b"nr_periods 13\nnr_throttled 9\nthrottled_time 730806052\nnr_bursts 0\nburst_time 0\n"
    assert key_values(v1) == {
        b"nr_periods": 13,
        b"nr_throttled": 9,
        b"throttled_time": 730806052,
        b"nr_bursts": 0,
        b"burst_time": 0,
    }
    v2 = b"usage_usec 5\nuser_usec 3\nsystem_usec 2\nnr_periods 4\nthrottled_usec 7\n"
    assert key_values(v2)[b"throttled_usec"] == 7
    assert key_values(b"") == {}
    assert key_values(b"a -3\nb x\nc\nd 1 2\n") == {b"a": -3}


NAMES = st.binary(min_size=1, max_size=12).filter(lambda name: not set(name) & set(b" \n\r"))


@given(st.dictionaries(NAMES, st.integers(min_value=-(2**63), max_value=2**64 - 1), max_size=8))
def test_key_values_reads_back_what_was_written(values: dict[bytes, int]) -> None:
    text = b"".join(b"%s %d\n" % (name, value) for name, value in values.items())
    assert key_values(text) == values


@given(st.binary(max_size=200) | st.text("ab -+0189_\n\t", max_size=60).map(str.encode))
@example(b"nr_periods --5\n")
def test_key_values_never_raises_on_garbage(text: bytes) -> None:
    for name, value in key_values(text).items():
        assert isinstance(name, bytes) and isinstance(value, int)


def test_v2_path_of_task_reads_the_unified_line(tmp_path: Path) -> None:
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "cgroup").write_text("1:cpu:/docker/abc\n0::/system.slice/x.scope\n")
    (tmp_path / "43").mkdir()
    (tmp_path / "43" / "cgroup").write_text("1:cpu:/docker/abc\n")  # pure v1
    assert v2_path_of_task(42, tmp_path) == "/system.slice/x.scope"
    assert v2_path_of_task(43, tmp_path) is None
    assert v2_path_of_task(44, tmp_path) is None  # exited


def test_walk_paths_yields_every_directory_once_root_first(tmp_path: Path) -> None:
    for path in ("a/b/c", "a/d", "e"):
        (tmp_path / path).mkdir(parents=True)
    (tmp_path / "a" / "cpu.stat").write_text("")  # files are not cgroups
    (tmp_path / "link").symlink_to(tmp_path / "a")  # nor links: a walk must not loop
    paths = list(walk_paths(tmp_path))
    assert paths[0] == "/"
    assert sorted(paths) == ["/", "/a", "/a/b", "/a/b/c", "/a/d", "/e"]
    assert list(walk_paths(tmp_path / "gone")) == ["/"]


def test_a_walk_taken_a_few_paths_at_a_time_lists_as_many_directories(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a read's share of a walk costs is bounded by the paths it takes, even where one
    parent has many children (each child is listed when the walk gets to it)."""
    for n in range(50):
        (tmp_path / "parent" / f"leaf{n}").mkdir(parents=True)
    listed: list[str] = []
    scandir = os.scandir

    def listing(path: str) -> Iterator[os.DirEntry[str]]:
        listed.append(path)
        return scandir(path)

    monkeypatch.setattr(os, "scandir", listing)
    walk = walk_paths(tmp_path)
    taken = 0
    while step := list(itertools.islice(walk, 5)):
        taken += len(step)
        assert len(listed) <= taken, (taken, len(listed))
    assert taken == len(listed) == 52


def test_watch_keeps_the_busiest_absolute_paths_normalized(tmp_path: Path) -> None:
    watched = WatchedCgroups(tmp_path)
    watched.watch(["/a/", "unknown", "//b", *(f"/c{n}" for n in range(40))])
    assert watched.busy[:2] == ["/a", "/b"]
    assert len(watched.busy) == WATCHED_BUSIEST
    watched.watch([])
    assert watched.busy == []


def test_with_ancestors_lists_each_path_once_without_the_root(tmp_path: Path) -> None:
    watched = WatchedCgroups(tmp_path)
    assert watched.with_ancestors(["/a/b/c", "/a/d", "/a/b", "/"]) == [
        "/a/b/c",
        "/a/b",
        "/a",
        "/a/d",
    ]


def test_id_of_is_the_directory_inode_cached_filtered_and_forgotten(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    watched = WatchedCgroups(tmp_path)
    a_id, b_id = os.stat(tmp_path / "a").st_ino, os.stat(tmp_path / "a" / "b").st_ino
    assert watched.id_of("/a") == a_id and watched.id_of("/a/b") == b_id
    assert watched.id_of("/") == os.stat(tmp_path).st_ino
    assert watched.id_of("/missing") is None
    watched.allowed = {b_id}
    assert watched.id_of("/a") is None and watched.id_of("/a/b") == b_id
    watched.allowed = None
    (tmp_path / "a" / "b").rmdir()
    assert watched.id_of("/a/b") == b_id  # cached until forgotten
    watched.forget({b_id})
    assert watched.id_of("/a/b") is None
    assert watched.id_of("/a") == a_id


def test_increments_count_what_moved_between_consecutive_reads() -> None:
    moved = Increments()
    moved.next_read()
    assert moved.since_last("k", (5, 100)) == (0, 0)  # first seen: its past is not ours
    moved.next_read()
    assert moved.since_last("k", (7, 130)) == (2, 30)
    moved.next_read()
    assert moved.since_last("k", (7, 130)) == (0, 0)


def test_increments_count_nothing_for_a_key_skipped_in_the_read_before() -> None:
    moved = Increments()
    moved.next_read()
    moved.since_last("k", (1,))
    moved.next_read()  # "k" not read (not among the busiest)
    moved.next_read()
    assert moved.since_last("k", (50,)) == (0,)
    moved.next_read()
    assert moved.since_last("k", (52,)) == (2,)


def test_increments_count_nothing_for_a_counter_that_went_backwards() -> None:
    moved = Increments()
    moved.next_read()
    moved.since_last("k", (10, 10))
    moved.next_read()
    assert moved.since_last("k", (3, 20)) == (0, 0)  # a recreated group: all of it
    moved.next_read()
    assert moved.since_last("k", (4, 21)) == (1, 1)


def test_increments_forget_drops_the_keys() -> None:
    moved = Increments()
    moved.next_read()
    moved.since_last(("a", 1), (1,))
    moved.since_last(("b", 2), (1,))
    moved.forget(lambda key: isinstance(key, tuple) and key[1] == 1)
    moved.next_read()
    assert moved.since_last(("a", 1), (9,)) == (0,)  # new again
    assert moved.since_last(("b", 2), (9,)) == (8,)


@given(
    st.lists(
        st.tuples(st.booleans(), st.integers(min_value=0, max_value=1000)), min_size=1, max_size=30
    )
)
def test_increments_sum_to_the_moves_between_consecutive_reads(
    reads: list[tuple[bool, int]],
) -> None:
    """A monotonic counter read in some intervals: the increments add up to what moved between
    reads of consecutive intervals, never to more than the counter moved in all."""
    moved = Increments()
    value = 0
    last: tuple[int, int] | None = None  # (interval, value) of the last read
    total = expected = 0
    for interval, (read, step) in enumerate(reads):
        moved.next_read()
        value += step
        if read:
            total += moved.since_last("k", (value,))[0]
            if last is not None and last[0] == interval - 1:
                expected += value - last[1]
            last = (interval, value)
    assert total == expected <= value
