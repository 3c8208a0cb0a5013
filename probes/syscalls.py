"""Socket syscall numbers and where the syscall number sits in ``struct pt_regs``, per
``uname -m`` (numbers from the kernel's uapi headers: asm/unistd_64.h on x86_64,
asm-generic/unistd.h on aarch64)."""

from __future__ import annotations

import platform
from typing import Final

NET_SYSCALLS: Final = ("sendto", "recvfrom", "sendmsg", "recvmsg", "recvmmsg", "sendmmsg")

SYSCALL_NUMBERS: Final[dict[str, dict[str, int]]] = {
    "x86_64": {
        "sendto": 44,
        "recvfrom": 45,
        "sendmsg": 46,
        "recvmsg": 47,
        "recvmmsg": 299,
        "sendmmsg": 307,
    },
    "aarch64": {
        "sendto": 206,
        "recvfrom": 207,
        "sendmsg": 211,
        "recvmsg": 212,
        "recvmmsg": 243,
        "sendmmsg": 269,
    },
}

# The syscall number as the kernel keeps it for the whole call (syscall_get_nr()).
PT_REGS_SYSCALL_NR_FIELD: Final = {"x86_64": "orig_ax", "aarch64": "syscallno"}


class UnsupportedArchitecture(RuntimeError):
    """No syscall table for this machine."""


def net_syscall_numbers(machine: str | None = None) -> dict[str, int]:
    """Name -> number of the socket syscalls netsyscall traces, on ``machine`` (default: ours)."""
    machine = machine or platform.machine()
    try:
        return dict(SYSCALL_NUMBERS[machine])
    except KeyError:
        raise UnsupportedArchitecture(
            f"no socket syscall table for {machine!r}; known: {sorted(SYSCALL_NUMBERS)}"
        ) from None


def syscall_nr_field(machine: str | None = None) -> str:
    """The ``struct pt_regs`` member holding the syscall number on ``machine``."""
    machine = machine or platform.machine()
    try:
        return PT_REGS_SYSCALL_NR_FIELD[machine]
    except KeyError:
        raise UnsupportedArchitecture(f"no pt_regs syscall field known for {machine!r}") from None
