"""Feature checks on fake filesystem trees (failures carry fixes) and on this machine (all pass),
plus enable_bpf_stats() against the kernel's own per-program run counters."""

from __future__ import annotations

import errno
import os
import socket
import stat
import subprocess
from pathlib import Path

import pytest

from tailsight.probes import features
from tailsight.probes.catalog import PROBE_TRACEPOINTS
from tailsight.probes.features import (
    FIX_BPFTOOL,
    FIX_CGROUP2,
    FIX_ROOT,
    FIX_SETUP,
    Host,
    check_bpf_stats,
    check_bpftool,
    check_btf,
    check_capabilities,
    check_cgroup2,
    check_cpu_controller,
    check_kernel_headers,
    check_psi,
    enable_bpf_stats,
    find_cgroup2_mount,
    run_checks,
)

FAKE_ROOT = Path(__file__).parents[1] / "fixtures" / "doctor" / "unprivileged"
CGROUP2_SUPER_MAGIC = 0x63677270  # include/uapi/linux/magic.h


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


# -- cgroup2 mount --------------------------------------------------------------------------------


def test_find_cgroup2_mount_unescapes_and_skips_v1(tmp_path: Path) -> None:
    mounts = _write(
        tmp_path / "mounts",
        "cgroup /sys/fs/cgroup/cpu cgroup rw,cpu 0 0\n"
        "cgroup2 /run/my\\040cgroups cgroup2 rw,nsdelegate 0 0\n",
    )
    assert find_cgroup2_mount(mounts) == Path("/run/my cgroups")


def test_find_cgroup2_mount_missing(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no cgroup2 filesystem"):
        find_cgroup2_mount(FAKE_ROOT / "proc" / "self" / "mounts")
    check = check_cgroup2(Host(proc=FAKE_ROOT / "proc"))
    assert (check.ok, check.fix) == (False, FIX_CGROUP2)
    check = check_cgroup2(Host(proc=tmp_path))
    assert not check.ok and "No such file" in check.detail


def test_find_cgroup2_mount_here_is_a_cgroup2_filesystem() -> None:
    # Ground truth from statfs(2) via stat(1), not from the mount table parsed here.
    mount = find_cgroup2_mount()
    fs_magic = subprocess.run(
        ["stat", "-f", "-c", "%t", str(mount)], capture_output=True, text=True, check=True
    ).stdout
    assert int(fs_magic, 16) == CGROUP2_SUPER_MAGIC


# -- capabilities ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cap_eff", "missing"),
    [
        (0, ["CAP_SYS_ADMIN", "CAP_PERFMON", "CAP_BPF"]),
        (1 << 21, ["CAP_PERFMON", "CAP_BPF"]),
        ((1 << 38) | (1 << 39), ["CAP_SYS_ADMIN"]),
        ((1 << 21) | (1 << 38) | (1 << 39), []),
    ],
)
def test_capabilities_from_cap_eff(tmp_path: Path, cap_eff: int, missing: list[str]) -> None:
    _write(tmp_path / "self" / "status", f"Name:\tx\nCapEff:\t{cap_eff:016x}\n")
    check = check_capabilities(Host(proc=tmp_path))
    assert check.ok == (not missing)
    assert check.required
    if missing:
        assert check.detail == "missing " + ", ".join(missing)
        assert check.fix == FIX_ROOT


def test_capabilities_unreadable(tmp_path: Path) -> None:
    check = check_capabilities(Host(proc=tmp_path))
    assert (check.ok, check.fix) == (False, FIX_ROOT)
    _write(tmp_path / "self" / "status", "Name:\tx\n")
    assert "no CapEff" in check_capabilities(Host(proc=tmp_path)).detail


# -- files and tools ------------------------------------------------------------------------------


def test_btf_magic(tmp_path: Path) -> None:
    host = Host(sys=tmp_path)
    assert not check_btf(host).ok
    _write(host.btf_path, "not btf")
    assert check_btf(host).detail.endswith("not BTF")
    host.btf_path.write_bytes(b"\x9f\xeb\x01\x00" + bytes(60))
    assert check_btf(host).ok


def test_bpftool_search_path(tmp_path: Path) -> None:
    check = check_bpftool(Host(search_path=str(tmp_path)))
    assert (check.ok, check.fix) == (False, FIX_BPFTOOL)
    tool = _write(tmp_path / "bpftool", "#!/bin/sh\n")
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    assert check_bpftool(Host(search_path=str(tmp_path))).detail == str(tool)


def test_kernel_headers_generic_matching_and_missing(tmp_path: Path) -> None:
    host = Host(modules=tmp_path, kernel_release="6.18.44-test")
    check = check_kernel_headers(host)
    assert (check.ok, check.fix) == (False, FIX_SETUP)
    release = _write(
        tmp_path / "6.18.44-test" / "build" / "include" / "config" / "kernel.release", ""
    )
    release.write_text("6.1.192\n", encoding="utf-8")
    assert check_kernel_headers(host).detail == "generic 6.1.192 (layouts from BTF)"
    release.write_text("6.18.44-test\n", encoding="utf-8")
    assert check_kernel_headers(host).detail == "matching 6.18.44-test"


def test_bpf_stats_missing_is_a_warning(tmp_path: Path) -> None:
    check = check_bpf_stats(Host(proc=tmp_path))
    assert (check.ok, check.required) == (False, False)
    assert check.fix is not None
    _write(tmp_path / "sys" / "kernel" / "bpf_stats_enabled", "1\n")
    assert check_bpf_stats(Host(proc=tmp_path)).detail.startswith("kernel.bpf_stats_enabled=1")


def test_cpu_limits_on_v2_or_v1_else_a_warning(tmp_path: Path) -> None:
    mounts = tmp_path / "self" / "mounts"
    v2 = tmp_path / "unified"
    _write(mounts, f"cgroup2 {v2} cgroup2 rw 0 0\n")
    _write(v2 / "cgroup.controllers", "memory io\n")
    check = check_cpu_controller(Host(proc=tmp_path))
    assert (check.ok, check.required, check.fix) == (False, False, features.FIX_CPU_CONTROLLER)
    _write(mounts, f"cgroup2 {v2} cgroup2 rw 0 0\ncgroup /c/cpu cgroup rw,cpu 0 0\n")
    assert (
        check_cpu_controller(Host(proc=tmp_path)).detail == "cpu controller on cgroup v1 at /c/cpu"
    )
    _write(v2 / "cgroup.controllers", "cpu memory io\n")
    assert check_cpu_controller(Host(proc=tmp_path)).detail.startswith(
        "cpu controller on cgroup v2"
    )


def test_psi_missing_is_a_warning(tmp_path: Path) -> None:
    check = check_psi(Host(proc=tmp_path))
    assert (check.ok, check.required, check.fix) == (False, False, features.FIX_PSI)
    _write(tmp_path / "pressure" / "cpu", "some avg10=0.00 avg60=0.00 avg300=0.00 total=1\n")
    assert check_psi(Host(proc=tmp_path)).ok


def test_unprivileged_fake_host_fails_without_touching_bpf(tmp_path: Path) -> None:
    host = Host(
        proc=FAKE_ROOT / "proc",
        sys=tmp_path,
        modules=tmp_path,
        kernel_release="6.18.44-test",
        search_path=str(tmp_path),
    )
    checks = {check.name: check for check in run_checks(host, {"probe": ("tp_a", "tp_b")})}
    for name in ["privileges", "kernel BTF", "bpftool", "kernel headers", "cgroup v2", "bcc"]:
        assert not checks[name].ok, name
        assert checks[name].required
        assert checks[name].fix, name
    # Dependent checks are not attempted; they point at the fix of what blocked them.
    assert checks["bcc"].detail == "not checked: privileges failed"
    assert checks["bcc"].fix == FIX_ROOT
    assert checks["BTF offsets"].detail == "not checked: kernel BTF failed"
    assert checks["tp tp_a"].fix == checks["tp tp_b"].fix == FIX_ROOT
    assert not checks["BPF stats"].ok and not checks["BPF stats"].required
    assert all(check.fix is None for check in checks.values() if check.ok)


# -- this machine ---------------------------------------------------------------------------------


@pytest.mark.kernel
def test_every_check_passes_here(kernel_ready: None) -> None:
    checks = run_checks()
    failed = [check for check in checks if not check.ok]
    assert not failed
    names = {check.name for check in checks}
    for tracepoints in PROBE_TRACEPOINTS.values():
        assert {f"tp {tp}" for tp in tracepoints} <= names
    assert len(names) == len(checks)


@pytest.mark.kernel
def test_unknown_tracepoint_fails_with_fix(kernel_ready: None) -> None:
    checks = {
        check.name: check
        for check in run_checks(probe_tracepoints={"ghost": ("tailsight_no_such_tp",)})
    }
    check = checks["tp tailsight_no_such_tp"]
    assert not check.ok and check.required
    assert check.fix is not None and "ghost" in check.fix


@pytest.mark.kernel
def test_af_xdp_agrees_with_socket_call(kernel_ready: None) -> None:
    try:
        socket.socket(features.AF_XDP, socket.SOCK_RAW, 0).close()
        expected = True
    except OSError:
        expected = False
    assert features.check_af_xdp().ok == expected


def _run_count(prog_fd: int) -> int:
    """The kernel's run_cnt for one of our program fds (/proc/self/fdinfo, Linux >= 5.1)."""
    fdinfo = Path(f"/proc/self/fdinfo/{prog_fd}").read_text(encoding="utf-8")
    return int(next(line.split()[1] for line in fdinfo.splitlines() if line.startswith("run_cnt:")))


def _stats_sysctl() -> str:
    return Path("/proc/sys/kernel/bpf_stats_enabled").read_text(encoding="utf-8").strip()


@pytest.mark.kernel
@pytest.mark.parametrize("mechanism", ["BPF_ENABLE_STATS", "sysctl"])
def test_enable_bpf_stats_counts_runs_and_restores(
    kernel_ready: None, monkeypatch: pytest.MonkeyPatch, mechanism: str
) -> None:
    from bcc import BPF

    if mechanism == "sysctl":

        def unavailable() -> int:
            raise OSError("forced fallback")

        monkeypatch.setattr(features, "_enable_stats_fd", unavailable)
    before = _stats_sysctl()
    bpf = BPF(src_file=str(features._NOOP_SOURCE).encode())
    try:
        bpf.attach_raw_tracepoint(tp=b"sys_enter", fn_name=b"tailsight_noop")
        prog_fd = bpf.funcs[b"tailsight_noop"].fd
        # Runs before the block may or may not be counted (another process may have stats on),
        # so the check is on the increase over our own syscalls inside it.
        with enable_bpf_stats() as used:
            assert used == mechanism
            # The sysctl shows only its own setting, not fds from BPF_ENABLE_STATS.
            assert _stats_sysctl() == ("1" if mechanism == "sysctl" else before)
            start = _run_count(prog_fd)
            for _ in range(97):
                os.getppid()
            assert _run_count(prog_fd) - start >= 97
    finally:
        bpf.cleanup()
    assert _stats_sysctl() == before


def test_every_fix_fits_one_80_column_line() -> None:
    # Printed as "fix <first failing check>: <fix>"; the longest fixed check name has 14 chars.
    fixes = [value for name, value in vars(features).items() if name.startswith("FIX_")]
    assert len(fixes) >= 9
    for fix in fixes:
        assert len(f"fix {'AF_XDP sockets'}: {fix}") <= 80, fix


@pytest.mark.parametrize(
    ("error", "fix"),
    [
        (PermissionError(errno.EPERM, "Operation not permitted"), features.FIX_AF_XDP_PERMISSION),
        (OSError(errno.EAFNOSUPPORT, "Address family not supported"), features.FIX_AF_XDP),
    ],
)
def test_af_xdp_failure_fix_depends_on_errno(
    monkeypatch: pytest.MonkeyPatch, error: OSError, fix: str
) -> None:
    def refuse(*args: object) -> socket.socket:
        raise error

    monkeypatch.setattr(features.socket, "socket", refuse)
    check = features.check_af_xdp()
    assert (check.ok, check.required, check.fix) == (False, False, fix)
