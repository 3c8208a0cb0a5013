"""The probes by name: raw tracepoints each attaches to (read by `doctor` and the docs) and the
class implementing it (imported only when used, so the CLI starts fast)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from tailsight.probes.base import Probe

PROBE_TRACEPOINTS: Final[dict[str, tuple[str, ...]]] = {
    "runqueue": ("sched_switch",),
    "netsyscall": ("sys_enter", "sys_exit"),
    "tcpstate": ("inet_sock_set_state", "tcp_retransmit_skb"),
    "migration": ("sched_migrate_task", "sched_move_numa", "sched_swap_numa", "sched_stick_numa"),
}
PROBE_CLASSES: Final[dict[str, str]] = {
    "runqueue": "tailsight.probes.runqueue:RunQueueProbe",
    "netsyscall": "tailsight.probes.netsyscall:NetSyscallProbe",
    "tcpstate": "tailsight.probes.tcpstate:TcpStateProbe",
    "migration": "tailsight.probes.migration:MigrationProbe",
}


def create_probe(name: str) -> Probe:
    """A new, unattached probe by name; KeyError names the known ones."""
    if name not in PROBE_CLASSES:
        raise KeyError(f"unknown probe {name!r}; known: {sorted(PROBE_CLASSES)}")
    module_name, class_name = PROBE_CLASSES[name].split(":")
    probe: Probe = getattr(importlib.import_module(module_name), class_name)()
    return probe
