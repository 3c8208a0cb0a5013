"""CgroupResolver on a temp tree (ids = inodes) and on the real cgroup2 mount."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tailsight.cgroups import (
    UNKNOWN,
    CgroupResolver,
    NoCgroupV2Error,
    find_cgroup2_mount,
    is_within,
    normalize,
    own_cgroup_id,
    own_cgroup_path,
)


def _tree(root: Path) -> dict[str, int]:
    for rel in ("a", "a/b", "a/b/c", "a/bc", "z"):
        (root / rel).mkdir()
    (root / "a" / "cgroup.procs").write_text("")  # files are not cgroups
    return {
        "/" + str(p.relative_to(root)) if p != root else "/": os.stat(p).st_ino
        for p in [root, *root.rglob("*")]
        if p.is_dir()
    }


def test_resolves_ids_to_relative_paths(tmp_path: Path) -> None:
    expected = _tree(tmp_path)
    resolver = CgroupResolver(tmp_path)
    by_id = {ino: path for path, ino in expected.items()}
    assert resolver.resolve_many(by_id) == by_id
    assert resolver.walks == 1  # one walk for all misses
    assert resolver.resolve(expected["/a/b/c"]) == "/a/b/c"
    assert resolver.walks == 1  # cached
    assert resolver.id_of("a/b/") == expected["/a/b"]
    assert set(resolver.subtree_ids("/a/b").values()) == {"/a/b", "/a/b/c"}  # not /a/bc
    assert resolver.subtree_ids("/") == by_id
    assert resolver.subtree_ids("/nope") == {}


def test_unknown_and_new_cgroups(tmp_path: Path) -> None:
    expected = _tree(tmp_path)
    resolver = CgroupResolver(tmp_path)
    assert resolver.resolve(expected["/z"]) == "/z"
    missing_id = max(expected.values()) + 10_000
    assert resolver.resolve(missing_id) == UNKNOWN
    assert resolver.walks == 2  # a miss re-walks, once per call
    (tmp_path / "new").mkdir()
    assert resolver.resolve(os.stat(tmp_path / "new").st_ino) == "/new"


def test_cache_is_bounded(tmp_path: Path) -> None:
    expected = _tree(tmp_path)
    resolver = CgroupResolver(tmp_path, max_entries=2)
    for path, cgroup_id in sorted(expected.items()):  # "/" first, "/z" last
        assert resolver.resolve(cgroup_id) == path
    walks = resolver.walks
    assert resolver.resolve(expected["/z"]) == "/z"  # most recent: still cached
    assert resolver.walks == walks
    assert resolver.resolve(expected["/"]) == "/"  # evicted long ago: found by a new walk
    assert resolver.walks == walks + 1


def test_gone_names_removed_cgroups_only(tmp_path: Path) -> None:
    for name in ("a", "b", "c", "d"):
        (tmp_path / name).mkdir()
    ids = {name: os.stat(tmp_path / name).st_ino for name in ("a", "b", "c", "d")}
    resolver = CgroupResolver(tmp_path)
    resolver.resolve_many([ids["a"], ids["b"], ids["c"]])  # d: never resolved
    walks = resolver.walks
    assert resolver.gone(ids.values()) == set()
    assert resolver.walks == walks + 1  # one walk, for d only
    (tmp_path / "b").rmdir()
    (tmp_path / "c").rename(tmp_path / "c2")  # same cgroup (id), new path: alive
    (tmp_path / "d").rmdir()
    assert resolver.gone(ids.values()) == {ids["b"], ids["d"]}
    assert resolver.resolve(ids["c"]) == "/c2"


def test_paths() -> None:
    assert normalize("a//b/") == "/a/b"
    assert normalize("") == "/"
    assert is_within("/a/b", "/a") and is_within("/a", "/") and not is_within("/ab", "/a")
    with pytest.raises(ValueError):
        normalize("/a/../b")


def test_own_cgroup_path_from_a_fake_proc(tmp_path: Path) -> None:
    task = tmp_path / "self" / "task" / "42"
    task.mkdir(parents=True)
    (tmp_path / "self" / "cgroup").write_text("1:name=systemd:/v1\n0::/user.slice/x y\n")
    (task / "cgroup").write_text("0::/user.slice/x y/worker\n")
    assert own_cgroup_path(proc=tmp_path) == "/user.slice/x y"
    assert own_cgroup_path(42, proc=tmp_path) == "/user.slice/x y/worker"
    (tmp_path / "self" / "cgroup").write_text("1:name=systemd:/v1\n")  # cgroup v1 only
    with pytest.raises(NoCgroupV2Error, match="no cgroup v2"):
        own_cgroup_path(proc=tmp_path)


def test_own_cgroup_id_is_our_directory_here() -> None:
    mount = find_cgroup2_mount()
    own = Path("/proc/self/cgroup").read_text().split("0::", 1)[1].strip()
    assert own_cgroup_id() == os.stat(mount / own.lstrip("/")).st_ino
    assert CgroupResolver(mount).resolve(own_cgroup_id()) == own


@pytest.mark.kernel
def test_real_mount_matches_proc_self_cgroup(kernel_ready: None, tmp_path: Path) -> None:
    mount = find_cgroup2_mount()
    resolver = CgroupResolver(mount)
    # The kernel's own name for our cgroup: the "0::" line of /proc/self/cgroup.
    own = next(
        line[3:] for line in Path("/proc/self/cgroup").read_text().splitlines() if line[:3] == "0::"
    )
    assert resolver.resolve(os.stat(mount / own.lstrip("/")).st_ino) == own
    assert resolver.resolve(os.stat(mount).st_ino) == "/"
    child = mount / f"tailsight-test-resolver-{os.getpid()}"
    child.mkdir()
    try:
        assert resolver.resolve(os.stat(child).st_ino) == f"/{child.name}"
    finally:
        child.rmdir()
