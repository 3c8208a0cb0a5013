"""The probes by name, each with its descriptor (:class:`~tailsight.probes.base.ProbeInfo`,
beside its code): tracepoints (read by `doctor` and the docs), series and counters with titles and
help (read by the exporter, `explain`, the trace view and the dashboards), and the class."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from tailsight.probes import (
    drops,
    irq,
    migration,
    netsyscall,
    pressure,
    reclaim,
    runqueue,
    tcpstate,
    throttle,
)
from tailsight.probes.base import Probe, ProbeInfo

PROBES: Final[dict[str, ProbeInfo]] = {
    info.name: info
    for info in (
        runqueue.INFO,
        netsyscall.INFO,
        tcpstate.INFO,
        migration.INFO,
        drops.INFO,
        irq.INFO,
        reclaim.INFO,
        throttle.INFO,
        pressure.INFO,
    )
}
OFF_BY_DEFAULT: Final = frozenset({irq.PROBE_NAME})
"""Probes attached only when named (``--probe irq``): irq's programs run on every softirq,
~200 ns each on this VM, up to hundreds of thousands a second on a busy network host."""
DEFAULT_PROBES: Final = tuple(name for name in PROBES if name not in OFF_BY_DEFAULT)
"""What ``serve``, ``record`` and ``trace`` attach without ``--probe``."""
BPF_PROBES: Final = tuple(name for name, info in PROBES.items() if not info.files)
"""The probes that load BPF programs (the others read the kernel's per-cgroup files)."""
PROBE_TRACEPOINTS: Final[dict[str, tuple[str, ...]]] = {
    name: info.tracepoints for name, info in PROBES.items()
}
_CLASSES: Final[dict[str, type]] = {
    runqueue.PROBE_NAME: runqueue.RunQueueProbe,
    netsyscall.PROBE_NAME: netsyscall.NetSyscallProbe,
    tcpstate.PROBE_NAME: tcpstate.TcpStateProbe,
    migration.PROBE_NAME: migration.MigrationProbe,
    drops.PROBE_NAME: drops.DropsProbe,
    irq.PROBE_NAME: irq.IrqProbe,
    reclaim.PROBE_NAME: reclaim.ReclaimProbe,
    throttle.PROBE_NAME: throttle.ThrottleProbe,
    pressure.PROBE_NAME: pressure.PressureProbe,
}


def create_probe(name: str) -> Probe:
    """A new, unattached probe by name; KeyError names the known ones."""
    if name not in _CLASSES:
        raise KeyError(f"unknown probe {name!r}; known: {sorted(PROBES)}")
    probe: Probe = _CLASSES[name]()
    return probe


def probe_title(probe: str) -> str:
    """What a probe measures, as a heading ("run-queue wait"); an unknown one by its name."""
    info = PROBES.get(probe)
    return probe if info is None else info.title


def series_title(labels: Mapping[str, str]) -> str:
    """The words for a histogram series ("TCP connect time"), from its ``probe`` (and ``kind``)
    label; the probe's title where the series is not one it describes."""
    probe = labels.get("probe", "")
    info = PROBES.get(probe)
    series = None if info is None else info.series_info(labels)
    return series.title if series is not None else probe_title(probe) or "latency"


def counter_help(name: str, probe: str) -> str:
    """The help text of a probe's counter (a generic one for a counter it does not describe)."""
    info = PROBES.get(probe)
    counter = None if info is None else info.counter_info(name)
    return "Probe counter since the collector started." if counter is None else counter.help
