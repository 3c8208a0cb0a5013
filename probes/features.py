"""Feature checks: what this host can do for tailsight, each failure with a one-line fix.

Checks probe the feature itself (load, attach, open a socket) rather than trusting kernel versions.
Filesystem roots are parameters (`Host`) so tests can point them at a fake tree.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import platform
import shutil
import socket
import struct
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

# Mount discovery (tailsight/cgroups.py) and the check types and privilege check (host.py) are
# re-exported for the callers that import them from here.
from tailsight.cgroups import DEFAULT_MOUNTS_PATH as DEFAULT_MOUNTS_PATH
from tailsight.cgroups import find_cgroup2_mount as find_cgroup2_mount
from tailsight.probes.btf import Btf, BtfError
from tailsight.probes.catalog import PROBE_TRACEPOINTS
from tailsight.probes.cgroupfiles import find_v1_mount
from tailsight.probes.host import FIX_ROOT as FIX_ROOT
from tailsight.probes.host import Check as Check
from tailsight.probes.host import Host as Host
from tailsight.probes.host import check_capabilities as check_capabilities
from tailsight.probes.loader import (
    RAW_TP,
    TP_BTF,
    ProbeError,
    load_tp_btf,
    preferred_attach_modes,
    raw_tracepoint_open_btf,
)
from tailsight.probes.offsets import OffsetCheckError, resolve_offsets, run_self_check

AF_XDP = 44
_NOOP_SOURCE = Path(__file__).resolve().parent / "features.bpf.c"
_NOOP_FUNCTION = "tailsight_noop"
_BTF_MAGIC_LE, _BTF_MAGIC_BE = b"\x9f\xeb", b"\xeb\x9f"  # BTF_MAGIC 0xeB9F, either byte order

# bpf(2) syscall numbers by `uname -m`; BPF_ENABLE_STATS and BPF_STATS_RUN_TIME from uapi bpf.h.
_BPF_SYSCALL_NR: dict[str, int] = {
    "x86_64": 321,
    "aarch64": 280,
    "riscv64": 280,
    "ppc64le": 361,
    "s390x": 351,
}
_BPF_ENABLE_STATS = 32
_BPF_STATS_RUN_TIME = 0

FIX_BTF = "boot a kernel built with CONFIG_DEBUG_INFO_BTF=y"
FIX_BPFTOOL = "apt-get install bpftool"
FIX_SETUP = "run `make setup`"
FIX_CGROUP2 = "mount -t cgroup2 none /sys/fs/cgroup/unified"
FIX_OFFSETS = "file a bug with the output of `tailsight doctor --json`"
FIX_AF_XDP = "kernel needs CONFIG_XDP_SOCKETS=y (feed falls back to UDP)"
FIX_AF_XDP_PERMISSION = "run as root: AF_XDP sockets need CAP_NET_RAW"
FIX_TP_BTF = "tp_btf needs Linux >= 5.5 and BTF; raw tracepoints work"
FIX_BPF_STATS = "needs Linux >= 5.1 for the kernel.bpf_stats_enabled sysctl"
FIX_CPU_CONTROLLER = "enable the cpu controller (no CPU limits without it)"
FIX_PSI = "boot with CONFIG_PSI=y and psi=1"


# -- individual checks ----------------------------------------------------------------------------


def check_btf(host: Host) -> Check:
    """The kernel exposes its BTF (struct layouts, tracepoint signatures)."""
    try:
        with open(host.btf_path, "rb") as blob:
            magic = blob.read(2)
        size_bytes = host.btf_path.stat().st_size
    except OSError as error:
        return Check("kernel BTF", False, f"{host.btf_path}: {error.strerror}", FIX_BTF, True)
    if magic not in (_BTF_MAGIC_LE, _BTF_MAGIC_BE):
        return Check("kernel BTF", False, f"{host.btf_path}: not BTF", FIX_BTF, True)
    return Check("kernel BTF", True, f"{host.btf_path} ({size_bytes >> 10} KiB)", None, True)


def check_bpftool(host: Host) -> Check:
    """bpftool, which turns BTF into JSON for the offset lookup."""
    found = shutil.which("bpftool", path=host.search_path)
    if found is None:
        return Check("bpftool", False, "bpftool not on PATH", FIX_BPFTOOL, True)
    return Check("bpftool", True, found, None, True)


def check_kernel_headers(host: Host) -> Check:
    """Some kernel headers for bcc to compile against (offsets never come from them)."""
    build = host.modules / host.kernel_release / "build"
    include = build / "include"
    if not include.is_dir():
        return Check("kernel headers", False, f"{include} missing", FIX_SETUP, True)
    release_file = include / "config" / "kernel.release"
    try:
        headers_release = release_file.read_text(encoding="utf-8").strip()
    except OSError:
        headers_release = build.resolve().name
    if headers_release != host.kernel_release:
        detail = f"generic {headers_release} (layouts from BTF)"
    else:
        detail = f"matching {headers_release}"
    return Check("kernel headers", True, detail, None, True)


def check_cgroup2(host: Host) -> Check:
    """A cgroup v2 mount, whose directory inodes are the ids our probes report."""
    try:
        mount = find_cgroup2_mount(host.mounts_path)
    except FileNotFoundError as error:
        detail = f"{error.filename}: {error.strerror}" if error.filename else str(error)
        return Check("cgroup v2", False, detail, FIX_CGROUP2, True)
    except OSError as error:
        return Check("cgroup v2", False, f"{host.mounts_path}: {error.strerror}", FIX_CGROUP2, True)
    return Check("cgroup v2", True, str(mount), None, True)


def check_cpu_controller(host: Host) -> Check:
    """A cpu controller (cgroup v2, or v1 on hybrid hosts): the CPU limits ``throttle`` reads."""
    name = "CPU limits"
    try:
        v2 = find_cgroup2_mount(host.mounts_path)
        controllers = (v2 / "cgroup.controllers").read_text().split()
    except OSError:
        controllers = []
    if "cpu" in controllers:
        return Check(name, True, "cpu controller on cgroup v2 (cpu.max, cpu.stat)", None, False)
    try:
        v1 = find_v1_mount("cpu", host.mounts_path)
    except OSError as error:
        return Check(
            name, False, f"{host.mounts_path}: {error.strerror}", FIX_CPU_CONTROLLER, False
        )
    if v1 is not None:
        return Check(name, True, f"cpu controller on cgroup v1 at {v1}", None, False)
    return Check(name, False, "no cpu controller on cgroup v2 or v1", FIX_CPU_CONTROLLER, False)


def check_psi(host: Host) -> Check:
    """Pressure stall information: what ``pressure`` reads."""
    name = "PSI"
    path = host.proc / "pressure" / "cpu"
    try:
        path.read_bytes()
    except OSError as error:
        return Check(name, False, f"{path}: {error.strerror}", FIX_PSI, False)
    return Check(name, True, f"{path} and each cgroup's *.pressure", None, False)


def check_af_xdp() -> Check:
    """AF_XDP sockets for the trading core's kernel-bypass feed path."""
    try:
        socket.socket(AF_XDP, socket.SOCK_RAW, 0).close()
    except OSError as error:
        denied = error.errno in (errno.EPERM, errno.EACCES)
        fix = FIX_AF_XDP_PERMISSION if denied else FIX_AF_XDP
        return Check("AF_XDP sockets", False, f"socket(44): {error.strerror}", fix, False)
    return Check("AF_XDP sockets", True, "socket(AF_XDP, SOCK_RAW) ok", None, False)


def check_bpf_stats(host: Host) -> Check:
    """BPF run-time statistics, for reporting probe overhead."""
    path = host.proc / "sys" / "kernel" / "bpf_stats_enabled"
    try:
        value = path.read_text(encoding="utf-8").strip()
    except OSError as error:
        return Check("BPF stats", False, f"{path}: {error.strerror}", FIX_BPF_STATS, False)
    state = "on" if value == "1" else "off, enabled on demand"
    return Check("BPF stats", True, f"kernel.bpf_stats_enabled={value} ({state})", None, False)


def check_bcc() -> tuple[Check, Any]:
    """bcc imports, compiles and loads a tiny raw tracepoint program; returns the loaded BPF."""
    try:
        import bcc
        from bcc import BPF
    except ImportError as error:
        return Check("bcc", False, f"import bcc: {error}", FIX_SETUP, True), None
    try:
        bpf = BPF(src_file=str(_NOOP_SOURCE).encode())
        bpf.load_func(_NOOP_FUNCTION.encode(), BPF.RAW_TRACEPOINT)
    except Exception as error:
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        return Check("bcc", False, f"compile/load failed: {message}", FIX_SETUP, True), None
    version = getattr(bcc, "__version__", "?")
    return Check("bcc", True, f"bcc {version} compiles and loads", None, True), bpf


def check_tracepoint(bpf: Any, tracepoint: str, probes: list[str], signature: str) -> Check:
    """Attach then detach the no-op program on one raw tracepoint."""
    name = f"tp {tracepoint}"
    used_by = ", ".join(probes)
    try:
        bpf.attach_raw_tracepoint(tp=tracepoint.encode(), fn_name=_NOOP_FUNCTION.encode())
        bpf.detach_raw_tracepoint(tp=tracepoint.encode())
    except Exception as error:
        fix = f"use a kernel that has it (needed by probe {used_by})"
        return Check(name, False, f"attach failed: {error}", fix, True)
    return Check(name, True, signature or f"attaches (used by {used_by})", None, True)


def check_attach_mode(bpf: Any) -> Check:
    """Which attach mode the probes get: tp_btf (typed tracepoints: direct loads, cheaper) if the
    kernel takes a tp_btf program, else raw tracepoints; ``TAILSIGHT_ATTACH_MODE`` forces one."""
    name = "attach mode"
    try:
        modes = preferred_attach_modes()
    except ProbeError as error:
        return Check(name, False, str(error), "unset TAILSIGHT_ATTACH_MODE", True)
    if modes == (RAW_TP,):
        return Check(name, True, "raw_tp (forced by TAILSIGHT_ATTACH_MODE)", None, False)
    try:
        prog_fd = load_tp_btf(bpf, _NOOP_FUNCTION, "sched_switch")
        try:
            os.close(raw_tracepoint_open_btf(prog_fd))
        finally:
            os.close(prog_fd)
    except (ProbeError, OSError) as error:
        if modes == (TP_BTF,):
            return Check(name, False, f"tp_btf forced but refused: {error}", FIX_TP_BTF, True)
        return Check(name, True, f"raw_tp (tp_btf refused: {error})", FIX_TP_BTF, False)
    return Check(name, True, "tp_btf (typed tracepoints, direct loads)", None, False)


def check_offsets(host: Host) -> Check:
    """Offsets resolve from BTF and the self-check reads our own task correctly."""
    try:
        offsets = resolve_offsets(Btf.load(host.btf_path))
        report = run_self_check(offsets, mounts_path=host.mounts_path)
    except (OffsetCheckError, BtfError, OSError) as error:
        return Check("BTF offsets", False, str(error), FIX_OFFSETS, True)
    detail = f"{len(offsets)} fields; self-check tid {report.tid} cgroup {report.cgroup_id} ok"
    return Check("BTF offsets", True, detail, None, True)


def _tracepoint_signature(host: Host, tracepoint: str) -> str:
    """Argument types from BTF, e.g. ``(struct task_struct *)``, or '' if unavailable."""
    try:
        args = Btf.load(host.btf_path).tracepoint_args(tracepoint)
    except BtfError:
        return ""
    return f"({', '.join(args)})"


def _not_run(name: str, required: bool, blocker: Check) -> Check:
    return Check(name, False, f"not checked: {blocker.name} failed", blocker.fix, required)


def run_checks(
    host: Host | None = None, probe_tracepoints: Mapping[str, tuple[str, ...]] | None = None
) -> list[Check]:
    """Every check, in dependency order; checks whose prerequisites failed report that instead."""
    host = host if host is not None else Host()
    probe_tracepoints = PROBE_TRACEPOINTS if probe_tracepoints is None else probe_tracepoints
    privileges = check_capabilities(host)
    btf = check_btf(host)
    bpftool = check_bpftool(host)
    headers = check_kernel_headers(host)
    cgroup2 = check_cgroup2(host)
    checks = [privileges, btf, bpftool, headers, cgroup2]

    def first_failed(*needed: Check) -> Check | None:
        return next((check for check in needed if not check.ok), None)

    users: dict[str, list[str]] = {}
    for probe, tracepoints in probe_tracepoints.items():
        for tracepoint in tracepoints:
            users.setdefault(tracepoint, []).append(probe)

    blocker = first_failed(privileges, headers)
    bpf: Any = None
    if blocker is not None:
        bcc_check = _not_run("bcc", True, blocker)
    else:
        bcc_check, bpf = check_bcc()
    checks.append(bcc_check)
    try:
        blocker = first_failed(btf, bpftool, bcc_check, cgroup2)
        checks.append(
            check_offsets(host) if blocker is None else _not_run("BTF offsets", True, blocker)
        )
        if bpf is not None and btf.ok and bpftool.ok:
            checks.append(check_attach_mode(bpf))
        with_signature = btf.ok and bpftool.ok
        for tracepoint, probes in users.items():
            if bpf is None:
                checks.append(_not_run(f"tp {tracepoint}", True, bcc_check))
                continue
            signature = _tracepoint_signature(host, tracepoint) if with_signature else ""
            checks.append(check_tracepoint(bpf, tracepoint, probes, signature))
    finally:
        if bpf is not None:
            bpf.cleanup()
    checks.append(check_cpu_controller(host))
    checks.append(check_psi(host))
    checks.append(check_af_xdp())
    checks.append(check_bpf_stats(host))
    return checks


# -- BPF run-time statistics ----------------------------------------------------------------------


def _enable_stats_fd() -> int:
    """BPF_ENABLE_STATS: stats stay on while the returned fd is open (raises OSError)."""
    number = _BPF_SYSCALL_NR.get(platform.machine())
    if number is None:
        raise OSError(f"bpf(2) syscall number unknown for {platform.machine()}")
    libc = ctypes.CDLL(None, use_errno=True)
    # union bpf_attr.enable_stats = { __u32 type; }, the rest zero.
    attr = ctypes.create_string_buffer(struct.pack("=I4x", _BPF_STATS_RUN_TIME), 8)
    fd = int(libc.syscall(ctypes.c_long(number), _BPF_ENABLE_STATS, attr, 8))
    if fd < 0:
        error = ctypes.get_errno()
        raise OSError(error, f"BPF_ENABLE_STATS: {os.strerror(error)}")
    return fd


@contextlib.contextmanager
def enable_bpf_stats(proc: Path = Path("/proc")) -> Iterator[str]:
    """Turn on BPF run_time_ns/run_cnt accounting for the block, then restore the previous state.

    Prefers the BPF_ENABLE_STATS fd (reference-counted by the kernel, so concurrent users do not
    switch each other off; the sysctl keeps showing its own value meanwhile); falls back to the
    sysctl. Yields the mechanism used.
    """
    try:
        fd = _enable_stats_fd()
    except OSError:
        fd = -1
    if fd >= 0:
        try:
            yield "BPF_ENABLE_STATS"
        finally:
            os.close(fd)
        return
    sysctl = proc / "sys" / "kernel" / "bpf_stats_enabled"
    previous = sysctl.read_text(encoding="utf-8").strip()
    sysctl.write_text("1\n", encoding="utf-8")
    try:
        yield "sysctl"
    finally:
        sysctl.write_text(f"{previous}\n", encoding="utf-8")
