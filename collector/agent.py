"""The one collection loop, behind ``tailsight trace``, ``serve`` and ``record``: attach the
probes, read them every interval, turn cumulative maps into interval documents with cgroup paths
(one rule for a map that went backwards: that interval is skipped, counting restarts from the new
reading), and hand each document to its consumers: the Prometheus exporter, the recording store,
the live view's running total. ``tailsight/cli/wiring.py`` says which of them each command gets."""

from __future__ import annotations

import contextlib
import errno
import gc
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, Protocol

from tailsight.cgroups import is_within
from tailsight.collector.config import CollectorConfig
from tailsight.collector.exporter import Family, ProbeStatus, RecordingStatus
from tailsight.intervals import HistDocument, Series
from tailsight.probes.base import LabelMemo, Snapshot
from tailsight.probes.catalog import DEFAULT_PROBES, create_probe

FORGET_EVERY_INTERVALS: Final = 30
"""How often the agent looks for removed cgroups (one stat per cgroup it holds); a removed one
is forgotten at the check after the one that found it gone."""
FULL_COLLECTION_EVERY_INTERVALS: Final = 60
"""How often a running agent collects cyclic garbage (automatic collection is off meanwhile)."""

if TYPE_CHECKING:
    from tailsight.cgroups import CgroupResolver
    from tailsight.collector.exporter import PrometheusExporter
    from tailsight.collector.store.writer import RecordingWriter
    from tailsight.probes.base import Probe


class Verdicts(Protocol):
    """What the agent runs over each interval before the exporter (the live jump verdicts of
    ``analysis/verdicts.py``, which the application's wiring hands in): their metric families
    join the exporter's."""

    def update(self, document: HistDocument) -> object: ...

    def families(self) -> list[Family]: ...


VerdictsFactory = Callable[["PrometheusExporter", Callable[[str], None]], Verdicts]


def run_every(
    interval_s: float,
    tick: Callable[[], object],
    wait: Callable[[float], bool],
    duration_s: float | None = None,
) -> None:
    """Call ``tick`` every ``interval_s`` on a fixed schedule until ``wait`` (which waits up to
    the seconds it is given) returns True or the duration ends, then once more: the last, partial
    interval is collected too. The schedule of every command that collects."""
    began = time.monotonic()
    deadline = None if duration_s is None else began + duration_s
    next_tick = began + interval_s
    while True:
        wake = next_tick if deadline is None else min(next_tick, deadline)
        if wait(max(0.0, wake - time.monotonic())):
            break
        if deadline is not None and time.monotonic() >= deadline:
            break
        tick()
        next_tick += interval_s
        behind = time.monotonic() - next_tick
        if behind > 0:  # overran (suspended, overloaded): on to the next slot, in phase
            next_tick += (behind // interval_s + 1) * interval_s
    tick()


class RecordingFailed(OSError):
    """A recording write failed in an agent whose only output is the recording (``record``);
    keeps the errno (ENOSPC: disk full). With an exporter the agent stops recording instead."""


@dataclass
class _Attached:
    probe: Probe
    previous: Snapshot
    status: ProbeStatus
    # Snapshot.to_document's, interval to interval
    named: LabelMemo = field(default_factory=LabelMemo)


@dataclass
class Agent:
    """Owns the probes of one collector run; ``tick`` produces one interval document."""

    config: CollectorConfig
    resolver: CgroupResolver
    exporter: PrometheusExporter | None = None
    writer: RecordingWriter | None = None
    log: Callable[[str], None] = print
    create_probe: Callable[[str], Probe] | None = None
    attached: dict[str, _Attached] = field(default_factory=dict)
    statuses: dict[str, ProbeStatus] = field(default_factory=dict)
    started: list[str] = field(default_factory=list)
    last_end_ns: int = 0
    intervals: int = 0
    last_tick_cpu_s: float = 0.0
    interval_errors: int = 0
    recording: RecordingStatus = field(default_factory=RecordingStatus)
    # Builds the live verdicts over the exporter at start (the wiring passes live_verdicts).
    make_verdicts: VerdictsFactory | None = None
    verdicts: Verdicts | None = None
    # Further consumers of each interval document (trace's running total).
    listeners: list[Callable[[HistDocument], object]] = field(default_factory=list)
    started_ns: int = 0  # wall clock just before the baseline reads
    forgotten_cgroups: int = 0
    _removed: set[int] = field(default_factory=set)  # found removed, forgotten at next check
    _restore_gc: bool = False  # automatic collection was on before ``start`` turned it off

    def probe_names(self) -> list[str]:
        """The configured probes, or the catalog's default ones."""
        return list(dict.fromkeys(self.config.probes or DEFAULT_PROBES))

    def start(self) -> None:
        """Attach every probe that can be; failures are logged and exported, not fatal. With
        ``config.cgroup_filter`` each probe records only those cgroups' subtrees (in the kernel)."""
        make = self.create_probe or create_probe
        # Attach all first, then take every probe's baseline reading: a probe read right after
        # its own attach would carry the events of the others' attach (seconds of compiling)
        # into a first interval dated from the last attach.
        ready: list[tuple[str, Probe]] = []
        for name in self.probe_names():
            probe: Probe | None = None
            try:
                probe = make(name)
                if self.config.cgroup_filter:
                    probe.set_cgroup_filter([])  # nothing until the ids are resolved below
                probe.attach()
                ready.append((name, probe))
            except Exception as error:  # ProbeError, bcc's bare Exception, KeyError, ...
                self._not_attached(name, probe, error)
        self._set_filter(probe for _, probe in ready)
        self.started_ns = time.time_ns()
        for name, probe in ready:
            try:
                first = probe.read()
                fds = dict(probe.program_fds())
            except Exception as error:
                self._not_attached(name, probe, error)
                continue
            status = ProbeStatus(
                attached=True,
                program_fds=fds,
                map_fill=getattr(probe, "map_fill", None),
                mode=getattr(probe, "attach_mode", ""),
            )
            self.statuses[name] = status
            self.attached[name] = _Attached(probe, first, status)
        self.started = list(self.attached)
        # What start-up built (bcc's tables and modules, the probes' state) lives as long as the
        # agent: frozen out of every collection.  Automatic collection is off while the agent
        # runs: an interval leaves thousands of objects that live on for an interval or a window
        # (snapshots, window parts), so a busy host ran a full collection every few intervals
        # (100 busy cgroups: 13 ms per interval on average; one pass over the ~80k live objects
        # costs 40-125 ms here) to find the few dozen cyclic objects ten intervals leave (bcc's
        # ctypes types).  ``tick`` collects them every FULL_COLLECTION_EVERY_INTERVALS instead.
        gc.freeze()
        self._restore_gc = gc.isenabled()
        gc.disable()
        self.last_end_ns = max(
            (a.previous.taken_ns for a in self.attached.values()), default=time.time_ns()
        )
        if self.exporter is not None:
            self.exporter.probes = self.statuses
            if self.config.record_dir is not None:
                self.exporter.recording = self.recording
            if self.make_verdicts is not None:
                self.verdicts = self.make_verdicts(self.exporter, self.log)
                self.exporter.extra_families.append(self.verdicts.families)

    def _not_attached(self, name: str, probe: Probe | None, error: Exception) -> None:
        reason = " ".join(str(error).split()) or type(error).__name__
        self.log(f"probe {name}: not attached: {reason}")
        self.statuses[name] = ProbeStatus(attached=False, reason=reason)
        if probe is not None:
            _close_quietly(probe)

    def refresh_filter(self) -> None:
        """Re-walk the filtered subtrees so that cgroups created since are recorded too."""
        self._set_filter(entry.probe for entry in self.attached.values())

    def _set_filter(self, probes: Iterable[Probe]) -> None:
        if not self.config.cgroup_filter:
            return
        ids: set[int] = set()
        for path in self.config.cgroup_filter:
            ids.update(self.resolver.subtree_ids(path))
        for probe in probes:
            probe.set_cgroup_filter(ids)

    def tick(self) -> HistDocument:
        """Read every probe and emit the interval since the last tick (or since ``start``)."""
        began_cpu = time.process_time()
        document = HistDocument(start_ns=self.last_end_ns, end_ns=self.last_end_ns)
        busiest: list[str] | None = None
        for name, entry in self.attached.items():
            watch = getattr(entry.probe, "watch", None)
            if watch is not None:  # a file probe (throttle, pressure): after the BPF ones
                if busiest is None:
                    busiest = busiest_cgroups(document.series)
                watch(busiest)
            try:
                now = entry.probe.read()
            except Exception as error:
                entry.status.read_errors += 1
                self.log(f"probe {name}: read failed: {error}")
                continue
            try:
                interval = now.delta(entry.previous)
            except ValueError as error:  # a map went backwards: restart from this reading
                entry.status.read_errors += 1
                self.log(f"probe {name}: reset ({error}); interval skipped")
                entry.previous = now
                continue
            entry.previous = now
            keep = (
                self._keep
                if self.config.cgroup_filter or self.config.cgroup_subtree != "/"
                else None
            )
            part = interval.to_document(
                document.start_ns, self.resolver.resolve_many, keep, entry.named
            )
            document.series.extend(part.series)
            for counters in part.counter_parts():  # pair blocks stay blocks
                document.add_counters(counters)
            document.end_ns = max(document.end_ns, part.end_ns)
        if document.end_ns == document.start_ns:
            document.end_ns = max(time.time_ns(), document.start_ns)
        self.last_end_ns = document.end_ns
        # Each consumer gets the interval even if one before it fails (a bug in the exporter
        # must not cost the recording); the first failure is raised once all had their turn.
        failed: Exception | None = None
        consumers: list[Callable[[HistDocument], object]] = []
        # Verdicts first: the exporter's update starts a new exposition that must include them.
        if self.verdicts is not None:
            consumers.append(self.verdicts.update)
        if self.exporter is not None:
            consumers.append(self.exporter.update)
        consumers.extend(self.listeners)
        for consume in consumers:
            try:
                consume(document)
            except Exception as error:
                failed = failed or error
        if self.writer is not None:
            try:
                self.writer.append(document)
            except OSError as error:
                if self.exporter is None:  # the recording is all this agent makes (`record`)
                    raise RecordingFailed(error.errno, error.strerror, error.filename) from error
                self.stop_recording(error)
        self.intervals += 1
        if self.intervals % FORGET_EVERY_INTERVALS == 0:
            self._forget_removed_cgroups()
        if self.intervals % FULL_COLLECTION_EVERY_INTERVALS == 0:
            gc.collect()
        self.last_tick_cpu_s = time.process_time() - began_cpu
        if failed is not None:
            raise failed
        return document

    def _forget_removed_cgroups(self) -> None:
        """Probes drop the cgroups found removed at the previous check: every read since then
        (this tick's included) has exported their last events. Then look for newly removed
        ones. Without this, churn fills the probes' slots and maps and grows the agent."""
        for name, entry in self.attached.items():
            try:
                entry.probe.forget(self._removed)
            except Exception as error:  # its state stays; the next check tries again
                self.log(f"probe {name}: cannot forget removed cgroups: {error}")
                continue
            # A cgroup wrongly taken for removed then counts afresh, without a reset.
            entry.previous = entry.previous.without(self._removed)
        self.forgotten_cgroups += len(self._removed)
        seen = set().union(*(entry.previous.cgroup_ids() for entry in self.attached.values()))
        self._removed = self.resolver.gone(seen - self._removed)

    def _keep(self, cgroup: str) -> bool:
        """Whether a series of this cgroup is kept: it lies in ``--cgroup-root`` and, with a
        cgroup filter (trace's ``--cgroup``), in one of its subtrees."""
        if not is_within(cgroup, self.config.cgroup_subtree):
            return False
        filtered = self.config.cgroup_filter
        return not filtered or any(is_within(cgroup, path) for path in filtered)

    def run(self, stop: threading.Event, duration_s: float | None = None) -> None:
        """Tick every interval on a fixed schedule until ``stop`` is set or the duration ends;
        the last (partial) interval is emitted too, so nothing read is lost."""
        run_every(self.config.interval_s, self._tick_surviving, stop.wait, duration_s)

    def _tick_surviving(self) -> None:
        """One bad interval (a bug, an odd reading) is counted, logged and skipped: the agent
        keeps serving. Only a failed recording of ``record`` ends the run."""
        try:
            self.refresh_filter()
            self.tick()
        except RecordingFailed:
            raise
        except Exception as error:
            self.interval_errors += 1
            if self.exporter is not None:
                self.exporter.note_interval_error()
            self.log(f"interval skipped after an error ({type(error).__name__}: {error})")

    def stop_recording(self, error: OSError) -> None:
        """Degrade to "not recording" (``tailsight_recording_up 0``) with one log line."""
        reason = error.strerror or str(error)
        self.recording.up = False
        self.recording.errors += 1
        self.recording.reason = reason
        if self.writer is not None:
            with contextlib.suppress(OSError):
                self.writer.close()
            self.writer = None
        where = self.config.record_dir
        full = " (disk full)" if error.errno in (errno.ENOSPC, errno.EDQUOT) else ""
        self.log(f"recording to {where} stopped: {reason}{full}; /metrics keeps serving")
        if self.exporter is not None:
            self.exporter.changed()

    def close(self) -> None:
        """Detach every probe and close the recording; safe to call twice."""
        for name, entry in list(self.attached.items()):
            _close_quietly(entry.probe)
            entry.status.attached = False
            entry.status.reason = "stopped"
            entry.status.program_fds = {}
            del self.attached[name]
        if self.writer is not None:
            self.writer.close()
        if self._restore_gc:
            self._restore_gc = False
            gc.enable()


def busiest_cgroups(series: Iterable[Series]) -> list[str]:
    """The cgroups of these series, most events first: which ones the file probes read."""
    events: dict[str, int] = {}
    for s in series:
        cgroup = s.labels.get("cgroup")
        if cgroup is not None:
            events[cgroup] = events.get(cgroup, 0) + s.sparse.total
    return sorted(events, key=lambda cgroup: -events[cgroup])


def _close_quietly(probe: Probe) -> None:
    # Closing must not hide the error that caused the close.
    with contextlib.suppress(Exception):
        probe.close()
