"""Compile a probe's ``.bpf.c`` with verified BTF offsets and attach it to raw tracepoints.

Attaching goes through the ``bpf()`` syscall directly (not bcc's autoload) so that a tracepoint
that cannot be attached is reported by name with the kernel's errno, and partial attaches can be
undone cleanly.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import platform
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, NamedTuple

from tailsight.probes.btf import Btf, BtfError
from tailsight.probes.host import Host, check_capabilities
from tailsight.probes.offsets import verified_offset_cflags

if TYPE_CHECKING:
    from bcc import BPF

PROBES_DIR: Final = Path(__file__).resolve().parent

# bpf(2) syscall numbers by `uname -m`.
_BPF_SYSCALL: Final = {"x86_64": 321, "aarch64": 280, "armv7l": 386, "riscv64": 280}
_BPF_PROG_LOAD: Final = 5
_BPF_PROG_TEST_RUN: Final = 10
_BPF_RAW_TRACEPOINT_OPEN: Final = 17
_BPF_OBJ_GET_INFO_BY_FD: Final = 15
# struct bpf_prog_info (uapi; fields are only ever appended): run_time_ns, run_cnt and
# recursion_misses are its u64 words 24, 25 and 26 (Linux 5.1, 5.1, 5.12; BTF agrees). A
# kernel whose struct is shorter leaves the words it lacks at 0.
_PROG_INFO_WORDS: Final = 27
_PROG_INFO_RUN_TIME_NS, _PROG_INFO_RUN_CNT, _PROG_INFO_RECURSION_MISSES = 24, 25, 26
_BPF_PROG_TYPE_TRACING: Final = 26
_BPF_TRACE_RAW_TP: Final = 23
_MAX_BPF_FUNC_ARGS: Final = 12
_VERIFIER_LOG_BYTES: Final = 1 << 20

TP_BTF: Final = "tp_btf"
RAW_TP: Final = "raw_tp"
ATTACH_MODES: Final = (TP_BTF, RAW_TP)
ATTACH_MODE_ENV: Final = "TAILSIGHT_ATTACH_MODE"
"""Environment variable forcing one attach mode (``raw_tp`` or ``tp_btf``); unset: the best."""
TP_BTF_CFLAG: Final = "-DTAILSIGHT_TP_BTF"
"""Defined when a probe is compiled for tp_btf: ``kread.bpf.h`` then reads by direct loads."""


class ProbeError(RuntimeError):
    """A probe could not be compiled, loaded or attached; the message says which and why."""


class PrivilegeError(ProbeError):
    """This process may not load eBPF programs: one message for every probe, said up front."""


def require_bpf_privileges() -> None:
    """Raise PrivilegeError, naming what is missing and the fix, unless this process has the
    capabilities tracing needs (root has them all); checked before anything is compiled."""
    check = check_capabilities(Host())
    if not check.ok:
        raise PrivilegeError(
            "loading eBPF probes needs root, or the capabilities CAP_BPF, CAP_PERFMON and "
            f"CAP_SYS_ADMIN ({check.detail}): run as root (sudo) or grant them"
        )


class AttachError(ProbeError):
    """One or more raw tracepoints of a probe failed to attach (``failures``: tracepoint -> why)."""

    def __init__(self, probe: str, failures: dict[str, str]) -> None:
        self.probe = probe
        self.failures = dict(failures)
        detail = "; ".join(f"{tp}: {why}" for tp, why in failures.items())
        super().__init__(f"probe {probe!r} cannot attach: {detail}")


class _RawTracepointOpenAttr(ctypes.Structure):
    _fields_ = (
        ("name", ctypes.c_uint64),
        ("prog_fd", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
        ("cookie", ctypes.c_uint64),
    )


class _ObjInfoAttr(ctypes.Structure):
    _fields_ = (
        ("bpf_fd", ctypes.c_uint32),
        ("info_len", ctypes.c_uint32),
        ("info", ctypes.c_uint64),
    )


class _ProgLoadAttr(ctypes.Structure):
    _fields_ = (
        ("prog_type", ctypes.c_uint32),
        ("insn_cnt", ctypes.c_uint32),
        ("insns", ctypes.c_uint64),
        ("license", ctypes.c_uint64),
        ("log_level", ctypes.c_uint32),
        ("log_size", ctypes.c_uint32),
        ("log_buf", ctypes.c_uint64),
        ("kern_version", ctypes.c_uint32),
        ("prog_flags", ctypes.c_uint32),
        ("prog_name", ctypes.c_char * 16),
        ("prog_ifindex", ctypes.c_uint32),
        ("expected_attach_type", ctypes.c_uint32),
        ("prog_btf_fd", ctypes.c_uint32),
        ("func_info_rec_size", ctypes.c_uint32),
        ("func_info", ctypes.c_uint64),
        ("func_info_cnt", ctypes.c_uint32),
        ("line_info_rec_size", ctypes.c_uint32),
        ("line_info", ctypes.c_uint64),
        ("line_info_cnt", ctypes.c_uint32),
        ("attach_btf_id", ctypes.c_uint32),
        ("attach_prog_fd", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
    )


class _TestRunAttr(ctypes.Structure):
    _fields_ = (
        ("prog_fd", ctypes.c_uint32),
        ("retval", ctypes.c_uint32),
        ("data_size_in", ctypes.c_uint32),
        ("data_size_out", ctypes.c_uint32),
        ("data_in", ctypes.c_uint64),
        ("data_out", ctypes.c_uint64),
        ("repeat", ctypes.c_uint32),
        ("duration", ctypes.c_uint32),
        ("ctx_size_in", ctypes.c_uint32),
        ("ctx_size_out", ctypes.c_uint32),
        ("ctx_in", ctypes.c_uint64),
        ("ctx_out", ctypes.c_uint64),
        ("flags", ctypes.c_uint32),
        ("cpu", ctypes.c_uint32),
        ("batch_size", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
    )


@functools.cache
def _bpf_syscall_of_machine() -> tuple[Any, int]:
    """libc's ``syscall`` and the bpf(2) number of this machine."""
    machine = platform.machine()
    number = _BPF_SYSCALL.get(machine)
    if number is None:
        raise ProbeError(f"bpf() syscall number unknown for architecture {machine!r}")
    return ctypes.CDLL(None, use_errno=True).syscall, number


def _bpf_syscall(cmd: int, attr: ctypes.Structure) -> int:
    """Raw ``bpf(cmd, &attr, sizeof attr)``; raises OSError with the kernel's errno."""
    syscall, number = _bpf_syscall_of_machine()
    result = int(syscall(number, cmd, ctypes.byref(attr), ctypes.sizeof(attr)))
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return result


def raw_tracepoint_open(prog_fd: int, tracepoint: str) -> int:
    """Attach a loaded raw-tracepoint program by tracepoint name; returns the link fd."""
    name = ctypes.create_string_buffer(tracepoint.encode())
    attr = _RawTracepointOpenAttr(name=ctypes.addressof(name), prog_fd=prog_fd)
    return _bpf_syscall(_BPF_RAW_TRACEPOINT_OPEN, attr)


def raw_tracepoint_open_btf(prog_fd: int) -> int:
    """Attach a loaded tp_btf program to the tracepoint it was loaded for; returns the link fd."""
    return _bpf_syscall(_BPF_RAW_TRACEPOINT_OPEN, _RawTracepointOpenAttr(prog_fd=prog_fd))


class TpBtfLoadError(ProbeError):
    """The kernel refused a program as tp_btf (``errno``); the verifier log's tail says why."""

    def __init__(self, fn_name: str, errno_value: int, log_tail: str) -> None:
        self.errno = errno_value
        name = errno.errorcode.get(errno_value, str(errno_value))
        super().__init__(f"{fn_name}: tp_btf load failed ({name}): {log_tail}")


def load_tp_btf(bpf: Any, fn_name: str, tracepoint: str) -> int:
    """Load the instructions bcc compiled for ``fn_name`` as a tp_btf program on ``tracepoint``.

    bcc cannot set the attach type and BTF id a tp_btf program needs, so its instructions (map
    fds already relocated) go to BPF_PROG_LOAD directly: program type tracing, expected attach
    type BPF_TRACE_RAW_TP, target the BTF id of ``btf_trace_<tracepoint>``.  Returns the fd.
    """
    from bcc.libbcc import lib

    try:
        btf_id = Btf.load().tracepoint_btf_id(tracepoint)
    except BtfError as error:
        raise TpBtfLoadError(fn_name, errno.ENOENT, str(error)) from error
    insns = ctypes.create_string_buffer(bpf.dump_func(fn_name.encode()))
    license_text = ctypes.create_string_buffer(lib.bpf_module_license(bpf.module) or b"GPL")
    attr = _ProgLoadAttr(
        prog_type=_BPF_PROG_TYPE_TRACING,
        insn_cnt=(len(insns) - 1) // 8,  # create_string_buffer adds a NUL byte
        insns=ctypes.addressof(insns),
        license=ctypes.addressof(license_text),
        prog_name=fn_name.encode()[:15],
        expected_attach_type=_BPF_TRACE_RAW_TP,
        attach_btf_id=btf_id,
    )
    try:
        return _bpf_syscall(_BPF_PROG_LOAD, attr)
    except OSError as error:
        if error.errno == errno.EPERM:  # no privileges: no other mode would load either
            raise
        first_errno = error.errno or 0  # EACCES/EINVAL: the verifier's refusal, in its log
    log = ctypes.create_string_buffer(_VERIFIER_LOG_BYTES)
    attr.log_level, attr.log_size, attr.log_buf = 1, len(log), ctypes.addressof(log)
    try:
        return _bpf_syscall(_BPF_PROG_LOAD, attr)  # with a log it may pass: take it
    except OSError:
        lines = log.value.decode(errors="replace").strip().splitlines()
        raise TpBtfLoadError(fn_name, first_errno, " | ".join(lines[-3:]) or "no log") from None


class ProgramStats(NamedTuple):
    """A BPF program's counters (bpf_prog_info): kernel BPF stats, and the runs it missed."""

    run_time_ns: int
    run_cnt: int
    missed_runs: int
    """``recursion_misses``: events the kernel dropped because the program was already running on
    that CPU (an interrupt during it); counted whether or not BPF stats are on."""


def read_program_stats(fd: int) -> ProgramStats | None:
    """A BPF program fd's counters (``BPF_OBJ_GET_INFO_BY_FD``: what ``/proc/self/fdinfo``
    shows, in one syscall instead of three and a text parse, 2 vs 13 µs here: every probe reads
    it every interval, and the exporter at every render); None if the fd is no program now."""
    info = (ctypes.c_uint64 * _PROG_INFO_WORDS)()
    attr = _ObjInfoAttr(bpf_fd=fd, info_len=ctypes.sizeof(info), info=ctypes.addressof(info))
    try:
        _bpf_syscall(_BPF_OBJ_GET_INFO_BY_FD, attr)
    except (OSError, ProbeError):
        return None
    return ProgramStats(
        info[_PROG_INFO_RUN_TIME_NS], info[_PROG_INFO_RUN_CNT], info[_PROG_INFO_RECURSION_MISSES]
    )


def preferred_attach_modes() -> tuple[str, ...]:
    """Attach modes to try, best first: tp_btf then raw_tp, or the one ATTACH_MODE_ENV forces."""
    forced = os.environ.get(ATTACH_MODE_ENV, "").strip()
    if not forced:
        return ATTACH_MODES
    if forced not in ATTACH_MODES:
        raise ProbeError(f"{ATTACH_MODE_ENV}={forced!r}: expected one of {', '.join(ATTACH_MODES)}")
    return (forced,)


def prog_test_run_raw_tp(prog_fd: int, args: Sequence[int]) -> int:
    """Run a raw-tracepoint program once on ``args`` (BPF_PROG_TEST_RUN); returns its retval."""
    if not 0 < len(args) <= _MAX_BPF_FUNC_ARGS:
        raise ValueError(f"a raw tracepoint takes 1..{_MAX_BPF_FUNC_ARGS} arguments")
    ctx = (ctypes.c_uint64 * len(args))(*args)
    attr = _TestRunAttr(
        prog_fd=prog_fd, ctx_size_in=ctypes.sizeof(ctx), ctx_in=ctypes.addressof(ctx)
    )
    _bpf_syscall(_BPF_PROG_TEST_RUN, attr)
    return int(attr.retval)


def probe_source(name: str) -> Path:
    """Path of ``probes/<name>.bpf.c`` (installed as package data next to this module)."""
    path = PROBES_DIR / f"{name}.bpf.c"
    if not path.is_file():
        raise ProbeError(f"no probe source {path}")
    return path


def compile_probe(name: str, cflags: Sequence[str] = ()) -> BPF:
    """Compile ``probes/<name>.bpf.c`` with the self-checked BTF offset macros; attaches nothing.

    Raises PrivilegeError first if this process cannot load BPF at all (rather than bcc's
    "Failed to compile BPF module ... Operation not permitted" for each probe).
    """
    require_bpf_privileges()
    return compile_source(probe_source(name), [*verified_offset_cflags(), *cflags])


def compile_source(path: Path, cflags: Sequence[str]) -> BPF:
    """Compile any ``.bpf.c`` file with bcc (tests use it for harness programs)."""
    from bcc import BPF

    try:
        return BPF(src_file=str(path).encode(), cflags=list(cflags))
    except Exception as error:  # bcc raises bare Exception; the compiler output went to stderr
        raise ProbeError(f"cannot compile {path.name}: {error}") from error


@dataclass
class AttachedProbe:
    """Links of one probe's programs to their tracepoints; ``close()`` detaches them.

    ``prog_fds`` (tracepoint -> program fd) feed the BPF run-time stats; in tp_btf mode the
    programs are ours (loaded past bcc) and closed here too.
    """

    name: str
    mode: str = RAW_TP
    link_fds: dict[str, int] = field(default_factory=dict)
    prog_fds: dict[str, int] = field(default_factory=dict)

    def detach(self) -> None:
        """Unlink the programs from their tracepoints, keeping them loaded (``reattach``)."""
        while self.link_fds:
            _, fd = self.link_fds.popitem()
            os.close(fd)

    def reattach(self) -> None:
        """Link the loaded programs to their tracepoints again (after ``detach``)."""
        for tracepoint, prog_fd in self.prog_fds.items():
            if tracepoint not in self.link_fds:
                self.link_fds[tracepoint] = (
                    raw_tracepoint_open_btf(prog_fd)
                    if self.mode == TP_BTF
                    else raw_tracepoint_open(prog_fd, tracepoint)
                )

    def close(self) -> None:
        self.detach()
        while self.prog_fds:
            _, fd = self.prog_fds.popitem()
            if self.mode == TP_BTF:
                os.close(fd)


def attach_raw_tracepoints(
    bpf: Any, probe: str, tracepoints: Sequence[str], fn_prefix: str = "on_", mode: str = RAW_TP
) -> AttachedProbe:
    """Load ``<fn_prefix><tracepoint>`` for each tracepoint and attach it, all or nothing.

    ``mode`` raw_tp loads through bcc as a raw tracepoint program; tp_btf loads the same
    instructions as a BTF-typed tracepoint program (`load_tp_btf`), where a refusal raises
    TpBtfLoadError at once so the caller can fall back.  Every other failing tracepoint is
    named with the reason (verifier rejection, unknown tracepoint, missing permission) in one
    AttachError; what did attach is detached again.
    """
    from bcc import BPF

    attached = AttachedProbe(probe, mode)
    failures: dict[str, str] = {}
    for tracepoint in tracepoints:
        fn_name = f"{fn_prefix}{tracepoint}"
        try:
            if mode == TP_BTF:
                prog_fd = load_tp_btf(bpf, fn_name, tracepoint)
            else:
                prog_fd = bpf.load_func(fn_name.encode(), BPF.RAW_TRACEPOINT).fd
        except TpBtfLoadError:
            attached.close()
            raise
        except OSError as error:  # tp_btf: EPERM
            failures[tracepoint] = f"program {fn_name} not loaded: {_attach_reason(error)}"
            continue
        except Exception as error:  # bcc: bare Exception, verifier log on stderr
            failures[tracepoint] = f"program {fn_name} not loaded ({error})"
            continue
        attached.prog_fds[tracepoint] = prog_fd
        try:
            if mode == TP_BTF:
                attached.link_fds[tracepoint] = raw_tracepoint_open_btf(prog_fd)
            else:
                attached.link_fds[tracepoint] = raw_tracepoint_open(prog_fd, tracepoint)
        except OSError as error:
            failures[tracepoint] = _attach_reason(error)
    if failures:
        attached.close()
        raise AttachError(probe, failures)
    return attached


def attach_best(
    probe: str,
    compile_with: Callable[[list[str]], Any],
    prepare: Callable[[Any], None],
    tracepoints: Sequence[str],
) -> tuple[Any, AttachedProbe, str | None]:
    """Compile (``compile_with(extra cflags)``), ``prepare`` the maps and attach, in the best
    attach mode the kernel takes: tp_btf, else raw tracepoints (`preferred_attach_modes`).

    Returns (bpf, attached, why tp_btf was refused or None).  On any failure the module is
    cleaned up and the error raised.
    """
    modes = preferred_attach_modes()
    refused: str | None = None
    for mode in modes:
        bpf = compile_with([TP_BTF_CFLAG] if mode == TP_BTF else [])
        try:
            prepare(bpf)
            return bpf, attach_raw_tracepoints(bpf, probe, tracepoints, mode=mode), refused
        except TpBtfLoadError as error:
            bpf.cleanup()
            refused = str(error)
            if mode == modes[-1]:
                raise
        except BaseException:
            bpf.cleanup()
            raise
    raise AssertionError("unreachable: preferred_attach_modes() is never empty")


def _attach_reason(error: OSError) -> str:
    hints = {
        errno.ENOENT: "no such raw tracepoint in this kernel",
        errno.EPERM: "permission denied (needs root or CAP_BPF + CAP_PERFMON)",
        errno.EACCES: "permission denied (needs root or CAP_BPF + CAP_PERFMON)",
        errno.EINVAL: "kernel rejected the attach (program type or arguments)",
    }
    name = errno.errorcode.get(error.errno or 0, "?")
    return f"{hints.get(error.errno or 0, error.strerror)} ({name})"
