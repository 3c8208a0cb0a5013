"""Offsets from BTF and the start-up self-check: passes here, catches deliberately wrong offsets,
and reads a non-root cgroup's id equal to its directory inode."""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tailsight.cgroups import find_cgroup2_mount
from tailsight.probes.btf import Btf
from tailsight.probes.offsets import (
    KERNEL_FIELDS,
    OffsetCheckError,
    include_dir,
    offset_cflags,
    resolve_offsets,
    run_self_check,
    verified_offset_cflags,
)

FIXTURE_PATH = Path(__file__).parents[1] / "fixtures" / "btf" / "small.json"

# -- without a kernel -----------------------------------------------------------------------------


def test_include_dir_holds_task_header() -> None:
    header = include_dir() / "task.bpf.h"
    text = header.read_text(encoding="utf-8")
    # Every offset the header uses must be a hard error when undefined: no silent defaults.
    for macro in KERNEL_FIELDS:
        assert f"#ifndef {macro}\n#error" in text, macro


def test_offset_cflags_define_every_macro_and_include_dir() -> None:
    flags = offset_cflags({"TASK_PID_OFF": 1264, "TASK_TGID_OFF": 1268})
    assert flags == ["-DTASK_PID_OFF=1264", "-DTASK_TGID_OFF=1268", f"-I{include_dir()}"]


def test_resolve_offsets_names_the_missing_field() -> None:
    btf = Btf.from_json(json.loads(FIXTURE_PATH.read_text(encoding="utf-8")))
    fields = {"OUTER_Y_OFF": ("outer", "y"), "OUTER_GONE_OFF": ("outer", "gone")}
    with pytest.raises(OffsetCheckError, match=r"OUTER_GONE_OFF \(outer\.gone\).*no member gone"):
        resolve_offsets(btf, fields)
    assert resolve_offsets(btf, {"OUTER_Y_OFF": ("outer", "y")}) == {"OUTER_Y_OFF": 12}


def test_resolve_offsets_refuses_bitfields() -> None:
    btf = Btf.from_json(json.loads(FIXTURE_PATH.read_text(encoding="utf-8")))
    with pytest.raises(OffsetCheckError, match=r"OUTER_MODE_OFF .*bitfield"):
        resolve_offsets(btf, {"OUTER_MODE_OFF": ("outer", "mode")})


# -- on the running kernel ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def offsets(kernel_ready: None) -> dict[str, int]:
    return resolve_offsets()


@pytest.mark.kernel
def test_verified_cflags_cover_every_field_and_are_cached(kernel_ready: None) -> None:
    flags = verified_offset_cflags()
    defined = dict(re.fullmatch(r"-D(\w+)=(\d+)", f).groups() for f in flags[:-1])  # type: ignore[union-attr]
    assert set(defined) == set(KERNEL_FIELDS)
    assert flags[-1] == f"-I{include_dir()}"
    again = verified_offset_cflags()
    assert again == flags and again is not flags  # cached, but callers get their own list


@pytest.mark.kernel
def test_self_check_matches_user_space_truth(offsets: dict[str, int]) -> None:
    report = run_self_check(offsets)
    assert report.tgid == os.getpid()
    # The check runs in a fresh thread so that pid != tgid and a swapped offset shows.
    assert report.tid != os.getpid()
    assert report.tid != threading.get_native_id()
    assert report.comm == "ts-offsetcheck"
    relative = next(
        line[3:]
        for line in Path("/proc/self/cgroup").read_text(encoding="utf-8").splitlines()
        if line.startswith("0::")
    )
    cgroup_dir = find_cgroup2_mount() / relative.lstrip("/")
    assert report.cgroup_id == cgroup_dir.stat().st_ino
    assert report.hits >= 1


@pytest.mark.kernel
@pytest.mark.parametrize(
    ("macro", "delta_bytes"),
    [
        ("TASK_PID_OFF", 4),  # lands on tgid: only a non-main thread can tell
        ("TASK_TGID_OFF", -4),  # lands on pid
        ("TASK_COMM_OFF", 1),
        ("TASK_CGROUPS_OFF", 8),
        ("CGROUP_KN_OFF", 8),
        ("KERNFS_NODE_ID_OFF", 8),
    ],
)
def test_wrong_offset_is_refused_with_its_name(
    offsets: dict[str, int], macro: str, delta_bytes: int
) -> None:
    wrong = dict(offsets)
    wrong[macro] += delta_bytes
    with pytest.raises(OffsetCheckError, match=rf"{macro}={wrong[macro]}.*read .*expected"):
        run_self_check(wrong)


@pytest.mark.kernel
def test_missing_macro_does_not_compile(offsets: dict[str, int]) -> None:
    partial = {k: v for k, v in offsets.items() if k != "TASK_COMM_OFF"}
    with pytest.raises(OffsetCheckError, match="failed to load"):
        run_self_check(partial)


@contextlib.contextmanager
def _process_in_new_cgroup() -> Iterator[Path]:
    """Move this process into a fresh cgroup v2 child for the block, then back."""
    mount = find_cgroup2_mount()
    original = next(
        line[3:]
        for line in Path("/proc/self/cgroup").read_text(encoding="utf-8").splitlines()
        if line.startswith("0::")
    )
    child = mount / f"tailsight-offsets-test-{os.getpid()}"
    child.mkdir()
    try:
        (child / "cgroup.procs").write_text(str(os.getpid()), encoding="utf-8")
        try:
            yield child
        finally:
            home = mount / original.lstrip("/")
            (home / "cgroup.procs").write_text(str(os.getpid()), encoding="utf-8")
    finally:
        child.rmdir()


@pytest.mark.kernel
def test_self_check_reads_non_root_cgroup_id(offsets: dict[str, int]) -> None:
    with _process_in_new_cgroup() as child:
        report = run_self_check(offsets)
        expected = child.stat().st_ino
    assert report.cgroup_id == expected
    assert report.cgroup_id != find_cgroup2_mount().stat().st_ino
