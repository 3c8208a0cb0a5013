"""Compile a probe's ``.bpf.c`` with verified BTF offsets and attach it to raw tracepoints.

Attaching goes through the ``bpf()`` syscall directly (not bcc's autoload) so that a tracepoint
that cannot be attached is reported by name with the kernel's errno, and partial attaches can be
undone cleanly.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from bcc import BPF

PROBES_DIR: Final = Path(__file__).resolve().parent

# bpf(2) syscall numbers by `uname -m`.
_BPF_SYSCALL: Final = {"x86_64": 321, "aarch64": 280, "armv7l": 386, "riscv64": 280}
_BPF_PROG_TEST_RUN: Final = 10
_BPF_RAW_TRACEPOINT_OPEN: Final = 17
_MAX_BPF_FUNC_ARGS: Final = 12


class ProbeError(RuntimeError):
    """A probe could not be compiled, loaded or attached; the message says which and why."""


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


def _bpf_syscall(cmd: int, attr: ctypes.Structure) -> int:
    """Raw ``bpf(cmd, &attr, sizeof attr)``; raises OSError with the kernel's errno."""
    machine = platform.machine()
    number = _BPF_SYSCALL.get(machine)
    if number is None:
        raise ProbeError(f"bpf() syscall number unknown for architecture {machine!r}")
    libc = ctypes.CDLL(None, use_errno=True)
    result = int(libc.syscall(number, cmd, ctypes.byref(attr), ctypes.sizeof(attr)))
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return result


def raw_tracepoint_open(prog_fd: int, tracepoint: str) -> int:
    """Attach a loaded raw-tracepoint program by tracepoint name; returns the link fd."""
    name = ctypes.create_string_buffer(tracepoint.encode())
    attr = _RawTracepointOpenAttr(name=ctypes.addressof(name), prog_fd=prog_fd)
    return _bpf_syscall(_BPF_RAW_TRACEPOINT_OPEN, attr)


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
    """Compile ``probes/<name>.bpf.c`` with the self-checked BTF offset macros; attaches nothing."""
    from tailsight.probes.offsets import verified_offset_cflags

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
    """Links of one probe's programs to their raw tracepoints; ``close()`` detaches them."""

    name: str
    link_fds: dict[str, int] = field(default_factory=dict)

    def close(self) -> None:
        while self.link_fds:
            _, fd = self.link_fds.popitem()
            os.close(fd)


def attach_raw_tracepoints(
    bpf: Any, probe: str, tracepoints: Sequence[str], fn_prefix: str = "on_"
) -> AttachedProbe:
    """Load ``<fn_prefix><tracepoint>`` for each tracepoint and attach it, all or nothing.

    Every failing tracepoint is named with the reason (verifier rejection, unknown tracepoint,
    missing permission) in one AttachError; what did attach is detached again.
    """
    from bcc import BPF

    attached = AttachedProbe(probe)
    failures: dict[str, str] = {}
    for tracepoint in tracepoints:
        fn_name = f"{fn_prefix}{tracepoint}"
        try:
            fn = bpf.load_func(fn_name.encode(), BPF.RAW_TRACEPOINT)
        except Exception as error:  # bcc: bare Exception, verifier log on stderr
            failures[tracepoint] = f"program {fn_name} not loaded ({error})"
            continue
        try:
            attached.link_fds[tracepoint] = raw_tracepoint_open(fn.fd, tracepoint)
        except OSError as error:
            failures[tracepoint] = _attach_reason(error)
    if failures:
        attached.close()
        raise AttachError(probe, failures)
    return attached


def _attach_reason(error: OSError) -> str:
    hints = {
        errno.ENOENT: "no such raw tracepoint in this kernel",
        errno.EPERM: "permission denied (needs root or CAP_BPF + CAP_PERFMON)",
        errno.EACCES: "permission denied (needs root or CAP_BPF + CAP_PERFMON)",
        errno.EINVAL: "kernel rejected the attach (program type or arguments)",
    }
    name = errno.errorcode.get(error.errno or 0, "?")
    return f"{hints.get(error.errno or 0, error.strerror)} ({name})"
