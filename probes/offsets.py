"""The only way probes get kernel struct offsets: resolved from BTF, then proven on our own task.

`verified_offset_cflags()` resolves every `KERNEL_FIELDS` entry from BTF and, once per process,
loads ``selfcheck.bpf.c`` to read our own pid/tgid/comm/cgroup id through ``task.bpf.h``; any
disagreement with the BPF helpers or with what user space knows raises `OffsetCheckError`, so a
wrong offset can never be used silently.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tailsight.cgroups import DEFAULT_MOUNTS_PATH, NoCgroupV2Error, own_cgroup_id
from tailsight.probes.btf import Btf, BtfError

# -D macro -> (struct, member path). Probes that read more kernel fields add them here.
KERNEL_FIELDS: dict[str, tuple[str, str]] = {
    "TASK_PID_OFF": ("task_struct", "pid"),
    "TASK_TGID_OFF": ("task_struct", "tgid"),
    "TASK_COMM_OFF": ("task_struct", "comm"),
    "TASK_CGROUPS_OFF": ("task_struct", "cgroups"),
    "CSS_SET_DFL_CGRP_OFF": ("css_set", "dfl_cgrp"),
    "CGROUP_KN_OFF": ("cgroup", "kn"),
    "KERNFS_NODE_ID_OFF": ("kernfs_node", "id"),
}

# Read only by the probes that need them (not by task.bpf.h): each of those resolves them with
# `resolve_offsets(fields=...)` and proves them on ground truth of its own at attach time, so a
# kernel lacking one stops that probe alone.
SOCK_FIELDS: dict[str, tuple[str, str]] = {
    "SOCK_CGROUP_OFF": ("sock", "sk_cgrp_data.cgroup"),  # tcpstate: self-checked on a loopback
    "SOCK_NUM_OFF": ("sock", "__sk_common.skc_num"),  # connect from a cgroup of known id
    "SOCK_DPORT_OFF": ("sock", "__sk_common.skc_dport"),
    "SOCK_PROTOCOL_OFF": ("sock", "sk_protocol"),
}
# The CPU a task is on: `thread_info.cpu` with THREAD_INFO_IN_TASK since 5.16, `task_struct.cpu`
# before; the first that BTF has wins (migration self-checks it on its own migrated thread).
TASK_CPU_CANDIDATES: tuple[tuple[str, str], ...] = (
    ("task_struct", "thread_info.cpu"),
    ("task_struct", "cpu"),
)

_CGROUP_ID_MACROS = (
    "TASK_CGROUPS_OFF",
    "CSS_SET_DFL_CGRP_OFF",
    "CGROUP_KN_OFF",
    "KERNFS_NODE_ID_OFF",
)
_SELFCHECK_SOURCE = Path(__file__).resolve().parent / "selfcheck.bpf.c"
_SELFCHECK_TRIGGERS = 3
_SELFCHECK_COMM = "ts-offsetcheck"


class OffsetCheckError(RuntimeError):
    """BTF offsets could not be resolved, or reading our own task with them gave wrong values."""


def check_observed(observed: Mapping[str, tuple[object, object]], refusal: str) -> None:
    """Raise :class:`OffsetCheckError` (``refusal``, then each field that disagreed) unless every
    ``what: (read, expected)`` of a self-check agrees."""
    problems = [f"{what}: read {got}, expected {want}" for what, (got, want) in observed.items()
                if got != want]  # fmt: skip
    if problems:
        raise OffsetCheckError(f"{refusal}: " + "; ".join(problems))


@dataclass(frozen=True)
class SelfCheckReport:
    """What the self-check read about the checking thread (all values agreed)."""

    tgid: int
    tid: int
    comm: str
    cgroup_id: int
    hits: int


def include_dir() -> Path:
    """Directory holding the shared ``*.bpf.h`` headers (pass as ``-I``)."""
    return Path(__file__).resolve().parent / "include"


def resolve_offsets(
    btf: Btf | None = None, fields: Mapping[str, tuple[str, str]] = KERNEL_FIELDS
) -> dict[str, int]:
    """Byte offset of every field from BTF; `OffsetCheckError` names the first that fails."""
    try:
        btf = btf if btf is not None else Btf.load()
    except BtfError as error:
        raise OffsetCheckError(f"cannot read kernel BTF: {error}") from error
    offsets: dict[str, int] = {}
    for macro, (struct, path) in fields.items():
        try:
            offsets[macro] = btf.member(struct, path).byte_offset
        except BtfError as error:
            raise OffsetCheckError(f"cannot resolve {macro} ({struct}.{path}): {error}") from error
    return offsets


def offset_cflags(offsets: Mapping[str, int]) -> list[str]:
    """Compiler flags defining each offset macro, plus the include directory."""
    return [f"-D{macro}={value}" for macro, value in offsets.items()] + [f"-I{include_dir()}"]


def _proc_status_first_nspid(status_path: Path) -> int | None:
    """Outermost pid in ``NSpid:`` (what BPF helpers report, even inside a pid namespace)."""
    try:
        for line in status_path.read_text(encoding="utf-8").splitlines():
            if line.startswith("NSpid:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _own_cgroup_id(tid: int, mounts_path: Path) -> int:
    """Id of the checking thread's cgroup (what the self-check expects BPF to read)."""
    try:
        return own_cgroup_id(tid, mounts_path)
    except NoCgroupV2Error as error:
        raise OffsetCheckError(str(error)) from None


def run_self_check(
    offsets: Mapping[str, int], *, mounts_path: Path = DEFAULT_MOUNTS_PATH
) -> SelfCheckReport:
    """Read our own task through task.bpf.h with ``offsets``; raise on any disagreement.

    Runs in a fresh thread: in a main thread pid == tgid, so a pid offset pointing at tgid (or the
    reverse) would pass unnoticed.
    """
    outcome: list[SelfCheckReport | BaseException] = []

    def check_in_thread() -> None:
        try:
            outcome.append(_self_check_this_thread(offsets, mounts_path))
        except BaseException as error:
            outcome.append(error)

    worker = threading.Thread(target=check_in_thread, name="tailsight-selfcheck")
    worker.start()
    worker.join()
    result = outcome[0]
    if isinstance(result, BaseException):
        raise result
    return result


def _self_check_this_thread(offsets: Mapping[str, int], mounts_path: Path) -> SelfCheckReport:
    try:
        from bcc import BPF  # heavy import, only when checking
    except ImportError as error:
        raise OffsetCheckError(f"the offset self-check needs bcc: {error}") from error

    tgid = os.getpid()
    tid = threading.get_native_id()
    # BPF helpers report ids as seen from the initial pid namespace: NSpid's first entry.
    expected_tgid = _proc_status_first_nspid(Path("/proc/self/status")) or tgid
    expected_tid = _proc_status_first_nspid(Path(f"/proc/self/task/{tid}/status")) or tid
    # A thread name of our own makes the comm comparison tell this thread from the process.
    Path(f"/proc/self/task/{tid}/comm").write_text(_SELFCHECK_COMM, encoding="utf-8")
    cflags = [
        *offset_cflags(offsets),
        f"-DSELF_TGID={expected_tgid}",
        f"-DSELF_TID={expected_tid}",
    ]
    try:
        bpf = BPF(src_file=str(_SELFCHECK_SOURCE).encode(), cflags=cflags)
    except Exception as error:
        raise OffsetCheckError(f"self-check program failed to load: {error}") from error
    try:
        # The sys_enter probe attached on load; these syscalls come from this very thread.
        for _ in range(_SELFCHECK_TRIGGERS):
            os.getppid()
        record = bpf[b"selfcheck_records"][ctypes.c_int(0)]
    finally:
        bpf.cleanup()

    if record.hits == 0:
        raise OffsetCheckError(
            f"self-check saw no sys_enter from thread {expected_tid}: the raw tracepoint did not "
            "fire, or this /proc shows a pid namespace other than the kernel's initial one"
        )
    comm_path = Path(f"/proc/self/task/{tid}/comm")
    expected_comm = comm_path.read_bytes().rstrip(b"\n")
    expected_cgroup_id = _own_cgroup_id(tid, mounts_path)

    helper_tid = record.helper_pid_tgid & 0xFFFFFFFF
    helper_tgid = record.helper_pid_tgid >> 32
    rows: list[tuple[str, tuple[str, ...], object, object, object, str]] = [
        (
            "task_struct.pid",
            ("TASK_PID_OFF",),
            record.read_pid,
            helper_tid,
            expected_tid,
            "threading.get_native_id()",
        ),
        (
            "task_struct.tgid",
            ("TASK_TGID_OFF",),
            record.read_tgid,
            helper_tgid,
            expected_tgid,
            "os.getpid()",
        ),
        (
            "task_struct.comm",
            ("TASK_COMM_OFF",),
            bytes(record.read_comm),
            bytes(record.helper_comm),
            expected_comm,
            str(comm_path),
        ),
        (
            "task->cgroups->dfl_cgrp->kn->id",
            _CGROUP_ID_MACROS,
            record.read_cgroup_id,
            record.helper_cgroup_id,
            expected_cgroup_id,
            "cgroup v2 directory inode",
        ),
    ]
    problems = []
    for field, macros, read, helper, user, user_source in rows:
        if read == helper == user:
            continue
        where = ", ".join(f"{macro}={offsets.get(macro)}" for macro in macros)
        if helper != user:
            problems.append(
                f"{field}: BPF helper says {helper!r} but {user_source} says {user!r} "
                f"(namespaces?); read via {where}: {read!r}"
            )
        else:
            problems.append(f"{field} via {where}: read {read!r}, expected {helper!r}")
    if problems:
        raise OffsetCheckError(
            "BTF offsets disagree with the running kernel, refusing to use them: "
            + "; ".join(problems)
        )
    return SelfCheckReport(
        tgid=expected_tgid,
        tid=expected_tid,
        comm=expected_comm.decode(errors="replace"),
        cgroup_id=expected_cgroup_id,
        hits=int(record.hits),
    )


_verified_lock = threading.Lock()
_verified: tuple[str, ...] | None = None


def verified_offset_cflags() -> list[str]:
    """``-D<FIELD>_OFF=<n>`` for every `KERNEL_FIELDS` entry and ``-I`` include dir, self-checked.

    Resolves from BTF and runs the self-check once per process; raises `OffsetCheckError` with the
    field, the offset and expected vs read values when anything disagrees.
    """
    global _verified
    with _verified_lock:
        if _verified is None:
            offsets = resolve_offsets()
            run_self_check(offsets)
            _verified = tuple(offset_cflags(offsets))
        return list(_verified)
