"""Causes across probes: which other signal of an incident's cgroups changed at the same time?

Every candidate compares the same before/after windows as the symptom (per-interval rates):

- **counters** (:data:`COUNTER_CAUSES`): TCP retransmits and retransmit failures, packet drops by
  (protocol, kernel drop reason), task migrations (cross-CPU, cross-node), socket syscall errors
  by (syscall, errno).
- **interrupt time** charged to an incident cgroup (``irq_charged_ns``, the irq probe: softirqs
  and hard interrupts that ran on its tasks' CPU time), per CPU and vector, where it adds at least
  :data:`MIN_STALL_NS` per interval. One-sided conditional
  binomial test that the counter's rate rose (:func:`rate_increase_p_value`).
- **neighbour calls**: socket syscalls per interval of cgroups *outside* the incident (from the
  netsyscall histograms' counts) that at least doubled (:data:`MIN_CALL_RATIO`) and now call
  more often than the symptoms' cgroups (those whose socket syscall time jumped) did before:
  a neighbour hammering the same socket path.
- **run-queue displacement**: each aggressor's displaced wait of an incident cgroup
  (``runqueue_displaced_wait_ns``), one-sided Mann-Whitney test of after > before per interval.
  An aggressor equal to the victim is another task of the victim's own cgroup.

Benjamini-Hochberg at ``fdr`` runs across all candidates of an incident; the discoveries are ranked
by effect size, the log of the smoothed after/before rate ratio.

**TCP peers.** The tcpstate probe counts retransmits by the cgroup holding the connection's other
end where that end is a socket of this host that connected while the probe ran
(``tcp_retransmits_to_peer{cgroup, victim}``): retransmits towards an incident cgroup (or by one)
are candidates as such, named with both ends. The rest of a cgroup's retransmits (other end
unknown: remote, or connected before the probe) are tested in every cgroup: one outside the
incident whose retransmits rise at the same time is reported as "probably the other end". Either
merges the retransmitting cgroup's jumps into the incident.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from tailsight.analysis.attribution import (
    CounterRows,
    Windows,
    counter_rows,
    rate_increase_p_value,
)
from tailsight.analysis.jumps import benjamini_hochberg
from tailsight.cgroups import is_within
from tailsight.intervals import HistDocument
from tailsight.probes.base import IDLE_CGROUP_NAME
from tailsight.probes.drops import DROPPED_PACKETS
from tailsight.probes.irq import CHARGED_NS as IRQ_CHARGED
from tailsight.probes.irq import SOFTIRQ
from tailsight.probes.migration import CROSS_NODE_MIGRATIONS
from tailsight.probes.migration import TASK_MIGRATIONS as MIGRATIONS
from tailsight.probes.netsyscall import ERRORS
from tailsight.probes.netsyscall import PROBE_NAME as NETSYSCALL
from tailsight.probes.pressure import SOME as PRESSURE_SOME
from tailsight.probes.runqueue import DISPLACED_WAIT, STEAL
from tailsight.probes.tcpstate import PEER_RETRANSMITS, RETRANSMIT_FAILURES, RETRANSMITS
from tailsight.probes.throttle import (
    LIMIT_LABEL,
    PERIODS,
    THROTTLED,
    THROTTLED_PERIODS,
    cpu_max_text,
)

CALLS: Final = "netsyscall_calls"
"""Socket syscalls per (cgroup, syscall): the event count of the netsyscall histograms."""
COUNTER_CAUSES: Final = {
    RETRANSMITS: "retransmits",
    RETRANSMIT_FAILURES: "retransmit_failures",
    PEER_RETRANSMITS: "retransmits",
    MIGRATIONS: "migrations",
    CROSS_NODE_MIGRATIONS: "cross_node_migrations",
    ERRORS: "syscall_errors",
    CALLS: "neighbour_calls",
    DROPPED_PACKETS: "packet_drops",
}
DROP_REASON_WORDS: Final = {
    "SOCKET_RCVBUFF": "at a full socket receive buffer (the reader did not keep up)",
    "SOCKET_BACKLOG": "at a full socket backlog",
    "PROTO_MEM": "at the protocol's memory limit",
    "NETFILTER_DROP": "to a firewall rule (netfilter)",
    "SOCKET_FILTER": "to a socket filter",
    "QDISC_DROP": "in a queueing discipline (tc)",
    "NO_SOCKET": "with no socket to take them",
}
"""The kernel's drop reasons (``enum skb_drop_reason``) in words; others are named as such."""
MIN_CALL_RATIO: Final = 2.0
"""A neighbour's calls must at least double: with thousands of calls per interval any small
drift is significant, and only a burst explains someone else's latency."""
MIN_NEIGHBOUR_CALLS: Final = 10.0
"""Calls per interval below which no neighbour counts as hammering."""
PEER_COUNTERS: Final = frozenset({RETRANSMITS, RETRANSMIT_FAILURES})
"""Counters tested in every cgroup: a connection's other end may sit in any of them."""
OTHER_END: Final = "other_end"
"""Label of a retransmit cause naming the cgroup that holds the connection's other end."""
MIN_RTO_NS: Final = 200e6  # TCP_RTO_MIN on Linux
FORCED_MIGRATIONS: Final = 50.0
"""Moves per interval (100/s at 0.5 s intervals) from which a rising migration rate reads as
forced (affinity or cpuset flipping) rather than the scheduler's own balancing."""
FORCED_MIGRATIONS_RATIO: Final = 5.0
INTERRUPTS: Final = "interrupts"
"""Interrupt time (the irq probe's ``irq_charged_ns``) taken from an incident cgroup's tasks on
one CPU by one vector: time they were runnable and running, yet did not run."""
PRESSURE_CAUSES: Final = {"memory": "memory_pressure", "io": "io_pressure"}
"""Stall kinds that are candidate causes of any rise (cpu stalls are a run-queue wait itself)."""
THROTTLE_COUNTERS: Final = frozenset({PERIODS, THROTTLED_PERIODS, THROTTLED})
IDLE_CPU: Final = "idle_cpu"
"""A wait the kernel saw displaced by nobody (the idle task), with no throttling to explain it:
a wake-up that found its CPU idle (leaving a deep idle state), or hypervisor steal."""
LATE_INTERVALS: Final = 3
"""A cause whose own change comes more than this many intervals after the symptom's began
after it: a consequence, or the symptom's rise was dated early."""
WAIT_FLOOR_NS: Final = 100_000.0  # smoothing of displaced wait ratios (0.1 ms per interval)
STEAL_FLOOR_NS: Final = 10_000_000.0  # smoothing of steal ratios (one 10 ms tick per interval)
MIN_STALL_NS: Final = 1_000_000.0
"""Throttled or stalled time per interval that must be added to make a candidate: a rise of
microseconds explains no tail. Their ratios are smoothed as displaced wait's (WAIT_FLOOR_NS), so
that a stall and a displacement of the same cgroup rank by one measure."""


@dataclass(frozen=True)
class Cause:
    """One signal that changed with the symptom: per-interval means before and after."""

    kind: str
    cgroup: str
    labels: dict[str, str]
    before: float
    after: float
    total_before: float
    total_after: float
    p_value: float
    effect: float
    """Log of the smoothed after/before ratio: the ranking key."""
    intervals_before: int = 0
    intervals_after: int = 0
    values: tuple[float, ...] = ()
    """The signal per interval over the whole range (for plots)."""
    peer: bool = False
    """Outside the incident's cgroups (TCP counters only): probably the other end."""
    discovered: bool = False
    late_s: float = 0.0
    """How long after the symptom's rise this signal's own rise came, where it came later
    than :data:`LATE_INTERVALS` (0 otherwise): not the symptom's cause."""

    @property
    def new(self) -> bool:
        return self.total_before == 0 and self.total_after > 0

    @property
    def forced_migrations(self) -> bool:
        """Cross-CPU moves at a rate and rise the scheduler does not reach on its own: the
        moves are the fault, and waits on the CPUs they lead to are their consequence."""
        return (
            self.kind == "migrations"
            and self.after >= FORCED_MIGRATIONS
            and self.effect >= math.log(FORCED_MIGRATIONS_RATIO)
        )

    def sentence(self, symptom: str = "", symptom_after_ns: float = math.nan) -> str:
        """The mechanism in words."""
        where = self.cgroup + (" (probably the other end of the connection)" if self.peer else "")
        counts = (
            f"{_count(self.total_after)} in the {self.intervals_after} intervals since the "
            f"change, {_count(self.total_before) if self.total_before else 'none'} in the "
            f"{self.intervals_before} before"
        )
        if self.kind in ("retransmits", "retransmit_failures"):
            what = "TCP retransmissions" if self.kind == "retransmits" else "failed retransmissions"
            other_end = self.labels.get(OTHER_END)
            if other_end is not None:
                to = "the same cgroup" if other_end == self.cgroup else other_end
                where = f"by {self.cgroup}'s sockets to {to} (the other end of the connection)"
            else:
                where = "in " + where
            line = f"{symptom + ' waited on ' if symptom else ''}{what} {where}: {counts}"
            if symptom_after_ns >= 0.7 * MIN_RTO_NS:
                # k lost tries in a row wait 200 + 400 + ... = 200 * (2^k - 1) ms.
                retries = max(1, round(math.log2(symptom_after_ns / MIN_RTO_NS + 1)))
                about = (
                    "one TCP retransmission timeout (200 ms minimum)"
                    if retries == 1
                    else f"{retries} TCP retransmission timeouts in a row (200 ms, doubling)"
                )
                line += f"; the new tail ({_ms(symptom_after_ns)} ms) is about {about}"
            return line
        if self.kind in ("migrations", "cross_node_migrations"):
            scope = "across NUMA nodes" if self.kind == "cross_node_migrations" else "between CPUs"
            forced = (
                ", beyond what the scheduler's own balancing does: most likely forced "
                "(affinity or cpuset changes); each move a cold cache and a new run queue, "
                "where it waits behind whoever runs there"
                if self.forced_migrations
                else " (each move: a cold cache and a new run queue)"
            )
            return (
                f"tasks of {where} were moved {scope} {self.before:.1f} -> {self.after:.1f} "
                f"times per interval{forced}"
            )
        if self.kind == "packet_drops":
            protocol = self.labels.get("protocol", "")
            reason = self.labels.get("reason", "?")
            what = {"udp": "UDP datagrams", "tcp": "TCP segments"}.get(
                protocol, f"{protocol or 'network'} packets"
            )
            why = DROP_REASON_WORDS.get(reason, f"(kernel drop reason {reason})")
            return f"{self.cgroup} lost {what} {why}: {counts}"
        if self.kind == "neighbour_calls":
            call = self.labels.get("syscall", "syscalls")
            return (
                f"a neighbour, {self.cgroup}, started calling {call} at the same time: "
                f"{_count(self.before)} -> {_count(self.after)} calls per interval (the probes "
                "cannot tell whether it shares the victim's socket)"
            )
        if self.kind == "syscall_errors":
            call = self.labels.get("syscall", "syscalls")
            return (
                f"{call} in {where} failed with {self.labels.get('errno', '?')} "
                f"{self.before:.1f} -> {self.after:.1f} times per interval"
            )
        if self.kind == "steal":
            return (
                f"the hypervisor ran something else on CPU {self.labels.get('cpu', '?')} "
                f"(steal time, /proc/stat): {_ms(self.before)} -> {_ms(self.after)} ms per "
                "interval"
            )
        if self.kind == "displacement":
            aggressor = self.labels.get("aggressor", "?")
            who = f"another task of {self.cgroup} itself" if aggressor == self.cgroup else aggressor
            return (
                f"{self.cgroup} waited for CPUs held by {who}"
                f"{', new since the change' if self.new else ''}: displaced wait "
                f"{_ms(self.before)} -> {_ms(self.after)} ms per interval"
            )
        if self.kind == IDLE_CPU:
            # The kernel saw the CPU idle while the task waited, and no limit parked it: a
            # wake-up leaving a deep idle state, or on a VM the hypervisor running another guest
            # (steal, ranked first where /proc/stat shows it; quiet runs here: CPU 0's steal
            # rose from ~6 % to 26-40 % as the victim's wait jumped).
            return (
                f"{self.cgroup} waited to run on CPUs that were idle (no task held them, no CPU "
                "limit parked it: a wake-up from a deep idle state, or hypervisor steal the "
                f"guest cannot see): {_ms(self.before)} -> {_ms(self.after)} ms per interval"
            )
        if self.kind == "throttling":
            limit = cpu_max_text(self.labels.get(LIMIT_LABEL, "?"))
            periods = float(self.labels.get("periods", "0"))
            throttled = float(self.labels.get("throttled_periods", "0"))
            victim = self.labels.get("ancestor_of")
            whose = "its own" if victim is None else "an ancestor's"
            return (
                f"{victim or self.cgroup} was throttled by {whose} CPU limit "
                f"(cpu.max {limit} at {self.cgroup}): "
                f"{throttled:.0f} of {periods:.0f} periods, {_ms(self.after)} ms per interval"
                f" ({_ms(self.before)} before)"
            )
        if self.kind == INTERRUPTS:
            which = "softirq" if self.labels.get("kind") == SOFTIRQ else "hard interrupt"
            return (
                f"{self.labels.get('vector', '?')} {which} took {_ms(self.after)} ms per interval "
                f"from {self.cgroup} on CPU {self.labels.get('cpu', '?')} "
                f"({_ms(self.before)} before)"
            )
        if self.kind in PRESSURE_CAUSES.values():
            resource = self.kind.removesuffix("_pressure")
            what = "reclaiming or faulting in memory" if resource == "memory" else "waiting on io"
            return (
                f"tasks of {self.cgroup} stalled {what} (PSI {resource} some): "
                f"{_ms(self.before)} -> {_ms(self.after)} ms per interval"
            )
        return f"{self.kind} in {where}: {self.before:.1f} -> {self.after:.1f} per interval"

    def timed_sentence(self, symptom: str = "", symptom_after_ns: float = math.nan) -> str:
        """``sentence``, and when it began, where that was after the symptom's rise."""
        line = self.sentence(symptom, symptom_after_ns)
        if self.late_s:
            line += f" (began {self.late_s:.0f} s after the rise: a consequence, not its cause)"
        return line

    def to_json(self) -> dict[str, Any]:
        """Plain JSON-able dict."""
        return {
            "kind": self.kind,
            "cgroup": self.cgroup,
            "labels": self.labels,
            "before": self.before,
            "after": self.after,
            "total_before": self.total_before,
            "total_after": self.total_after,
            "new": self.new,
            "p_value": self.p_value,
            "effect": self.effect,
            "peer": self.peer,
            "discovered": self.discovered,
            "late_s": self.late_s,
            "sentence": self.timed_sentence(),
        }


@dataclass(frozen=True)
class CounterTable:
    """Every counter of a recording range as a per-interval row, read once."""

    rows: dict[tuple[str, tuple[tuple[str, str], ...]], npt.NDArray[np.float64]]

    @classmethod
    def of(cls, documents: Sequence[HistDocument]) -> CounterTable:
        rows = counter_rows(documents, wanted_counter)
        for t, document in enumerate(documents):
            for series in document.series:
                if series.labels.get("probe") == NETSYSCALL:
                    key = (CALLS, tuple(sorted(series.labels.items())))
                    rows.setdefault(key, np.zeros(len(documents)))[t] += series.hist.count
        return cls.of_rows(rows)

    @classmethod
    def of_rows(cls, counters: CounterRows) -> CounterTable:
        """From a range's counter rows (and :data:`CALLS` rows of the netsyscall series):
        the wanted ones, summed over probes, in label order."""
        rows: dict[tuple[str, tuple[tuple[str, str], ...]], npt.NDArray[np.float64]] = {}
        for (name, key), values in sorted(counters.items(), key=lambda item: item[0]):
            if name == CALLS or wanted_counter(name):
                labels = tuple((k, v) for k, v in key if k != "probe")
                row = rows.setdefault((name, labels), np.zeros(len(values)))
                row += values
        return cls(rows)


def wanted_counter(name: str) -> bool:
    """A counter that :func:`find_causes` tests."""
    return (
        name in COUNTER_CAUSES
        or name in (DISPLACED_WAIT, STEAL, PRESSURE_SOME, IRQ_CHARGED)
        or name in THROTTLE_COUNTERS
    )


def find_causes(
    table: CounterTable,
    windows: Windows,
    cgroups: Collection[str],
    fdr: float = 0.05,
    symptoms: Collection[str] = (),
) -> list[Cause]:
    """Every candidate cause of the incident's cgroups (and TCP peers), discoveries first,
    ranked by effect size; BH at ``fdr`` across all of them. ``symptoms``: the cgroups whose
    socket syscall time jumped (their call volume is the volume term of its decomposition, not a
    cause)."""
    n_before = windows.change - windows.before_start
    n_after = windows.after_stop - windows.change
    # A neighbour "hammers" only when it calls more often than the symptoms' cgroups did before
    # the change: a busy machine's other processes start a few calls at any moment, and a
    # symptom's volume after it may be the neighbour's own (a server answering the flood).
    own_calls = sum(
        float(row[windows.before].mean())
        for (name, key), row in table.rows.items()
        if name == CALLS and dict(key).get("cgroup") in symptoms
    )
    calls_floor = max(own_calls, MIN_NEIGHBOUR_CALLS)
    throttled = throttled_intervals(table.rows, cgroups)
    candidates: list[Cause] = []
    for (name, key), row in _with_known_peers(table.rows).items():
        labels = dict(key)
        if name == PEER_RETRANSMITS:
            # Known ends: a candidate when either end is in the incident.
            if labels.get("cgroup") not in cgroups and labels.get("victim") not in cgroups:
                continue
            labels = {"cgroup": labels.get("cgroup", ""), OTHER_END: labels.get("victim", "")}
        before_row, after_row = row[windows.before], row[windows.after]
        if name == DISPLACED_WAIT:
            victim = labels.get("victim", "")
            if victim not in cgroups:
                continue
            # Only the intervals in which no CPU limit parked the victim: a throttled task waits
            # on whoever runs meanwhile (idle, or a neighbour), and that wait is the limit's.
            parked = throttled.get(victim)
            if parked is not None:
                before_row = before_row[~parked[windows.before]]
                after_row = after_row[~parked[windows.after]]
                if len(before_row) < 2 or len(after_row) < 2:
                    continue
            if after_row.mean() > before_row.mean():
                aggressor = labels.get("aggressor", "?")
                kind = IDLE_CPU if aggressor == IDLE_CGROUP_NAME else "displacement"
                candidates.append(
                    _rise_of_time(
                        kind,
                        victim,
                        {} if kind == IDLE_CPU else {"aggressor": aggressor},
                        row,
                        (before_row, after_row),
                        WAIT_FLOOR_NS,
                    )
                )
            continue
        if name == THROTTLED:
            limited = labels.get("cgroup", "")
            throttles = sorted(c for c in cgroups if is_within(c, limited))
            if throttles and after_row.mean() - before_row.mean() >= MIN_STALL_NS:
                counts = {
                    counter: float(table.rows.get((counter, key), row)[windows.after].mean())
                    for counter in (PERIODS, THROTTLED_PERIODS)
                }
                detail = {
                    LIMIT_LABEL: labels.get(LIMIT_LABEL, "?"),
                    "periods": f"{counts[PERIODS]:.1f}",
                    "throttled_periods": f"{counts[THROTTLED_PERIODS]:.1f}",
                }
                if limited not in cgroups:  # a parent's limit: name whom it throttled
                    detail["ancestor_of"] = throttles[0]
                candidates.append(
                    _rise_of_time(
                        "throttling",
                        limited,
                        detail,
                        row,
                        (before_row, after_row),
                        WAIT_FLOOR_NS,
                    )
                )
            continue
        if name in THROTTLE_COUNTERS:
            continue  # periods: read with the throttled time above
        if name == PRESSURE_SOME:
            stall = PRESSURE_CAUSES.get(labels.get("resource", ""))
            stalled = labels.get("cgroup", "")
            rise_ns = after_row.mean() - before_row.mean()
            if stall is not None and stalled in cgroups and rise_ns >= MIN_STALL_NS:
                candidates.append(
                    _rise_of_time(stall, stalled, {}, row, (before_row, after_row), WAIT_FLOOR_NS)
                )
            continue
        if name == IRQ_CHARGED:
            interrupted = labels.get("cgroup", "")
            rise_ns = after_row.mean() - before_row.mean()
            if interrupted in cgroups and rise_ns >= MIN_STALL_NS:
                detail = {k: labels[k] for k in ("cpu", "kind", "vector") if k in labels}
                candidates.append(
                    _rise_of_time(
                        INTERRUPTS, interrupted, detail, row, (before_row, after_row), WAIT_FLOOR_NS
                    )
                )
            continue
        if name == STEAL:
            # Host-wide, per CPU: a candidate for any incident (explain ranks it for a wait
            # mostly "displaced by idle", which is what steal looks like to the kernel).
            if after_row.mean() > before_row.mean():
                cpu = {"cpu": labels.get("cpu", "?")}
                candidates.append(
                    _rise_of_time("steal", "", cpu, row, (before_row, after_row), STEAL_FLOOR_NS)
                )
            continue
        cgroup = labels.get("cgroup", "")
        inside = cgroup in cgroups
        if name == CALLS and cgroup in symptoms:
            continue  # a symptom's own traffic is the volume term of its decomposition
        known_end = name == PEER_RETRANSMITS
        if not inside and not known_end and name not in PEER_COUNTERS and name != CALLS:
            continue
        events_before, events_after = int(before_row.sum()), int(after_row.sum())
        ratio_floor = MIN_CALL_RATIO if name == CALLS else 1.0
        if events_after * n_before <= ratio_floor * events_before * n_after:
            continue  # not a rise: no candidate
        if name == CALLS and events_after / n_after < calls_floor:
            continue
        p_value = rate_increase_p_value(events_before, events_after, n_before, n_after)
        effect = math.log(((events_after + 0.5) / n_after) / ((events_before + 0.5) / n_before))
        candidates.append(
            Cause(
                kind=COUNTER_CAUSES[name],
                cgroup=cgroup,
                labels={k: v for k, v in labels.items() if k != "cgroup"},
                before=events_before / n_before,
                after=events_after / n_after,
                total_before=events_before,
                total_after=events_after,
                p_value=p_value,
                effect=effect,
                values=tuple(row.tolist()),
                intervals_before=n_before,
                intervals_after=n_after,
                peer=not inside and name != CALLS and not known_end,
            )
        )
    if not candidates:
        return []
    found = benjamini_hochberg([c.p_value for c in candidates], fdr)
    ranked = [
        Cause(**{**c.__dict__, "discovered": bool(f)})
        for c, f in zip(candidates, found, strict=True)
    ]
    ranked.sort(key=lambda c: (not c.discovered, -c.effect, c.p_value, c.cgroup))
    return ranked


def _with_known_peers(
    rows: dict[tuple[str, tuple[tuple[str, str], ...]], npt.NDArray[np.float64]],
) -> dict[tuple[str, tuple[tuple[str, str], ...]], npt.NDArray[np.float64]]:
    """``rows`` with each cgroup's retransmits less those whose other end is known (counted
    again, by other end, in the :data:`PEER_RETRANSMITS` rows): no retransmit is a candidate
    twice, and what stays under ``tcp_retransmits`` has an unknown other end."""
    known: dict[str, npt.NDArray[np.float64]] = {}
    for (name, key), row in rows.items():
        if name == PEER_RETRANSMITS:
            cgroup = dict(key).get("cgroup", "")
            known[cgroup] = known.get(cgroup, np.zeros(len(row))) + row
    if not known:
        return rows
    out = dict(rows)
    for (name, key), row in rows.items():
        if name == RETRANSMITS and dict(key).get("cgroup", "") in known:
            out[(name, key)] = np.maximum(row - known[dict(key).get("cgroup", "")], 0.0)
    return out


def throttled_intervals(
    rows: Mapping[tuple[str, tuple[tuple[str, str], ...]], npt.NDArray[np.float64]],
    cgroups: Collection[str],
) -> dict[str, npt.NDArray[np.bool_]]:
    """Per cgroup of ``cgroups`` that a CPU limit (its own or an ancestor's) ever parked, in
    which intervals it did (from a range's counter rows)."""
    out: dict[str, npt.NDArray[np.bool_]] = {}
    for (name, key), row in rows.items():
        if name != THROTTLED or not row.any():
            continue
        limited = dict(key).get("cgroup", "")
        for cgroup in cgroups:
            if is_within(cgroup, limited):
                parked = row > 0
                out[cgroup] = out[cgroup] | parked if cgroup in out else parked
    return out


def _rise_of_time(
    kind: str,
    cgroup: str,
    labels: dict[str, str],
    row: npt.NDArray[np.float64],
    compared: tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]],
    floor_ns: float,
) -> Cause:
    """A cause from a per-interval time (ns) that rose: Mann-Whitney on the ``compared``
    (before, after) intervals, effect the log of their means smoothed by ``floor_ns``."""
    before_row, after_row = compared
    before, after = float(before_row.mean()), float(after_row.mean())
    return Cause(
        kind=kind,
        cgroup=cgroup,
        labels=labels,
        before=before,
        after=after,
        total_before=float(before_row.sum()),
        total_after=float(after_row.sum()),
        p_value=_shift_up_p_value(before_row, after_row),
        effect=math.log((after + floor_ns) / (before + floor_ns)),
        values=tuple(row.tolist()),
        intervals_before=len(before_row),
        intervals_after=len(after_row),
    )


def _shift_up_p_value(before: npt.NDArray[np.float64], after: npt.NDArray[np.float64]) -> float:
    """One-sided Mann-Whitney p-value that per-interval values rose."""
    from scipy.stats import mannwhitneyu

    if (
        before.size == 0
        or after.size == 0
        or (np.all(before == before[0]) and np.all(after == before[0]))
    ):
        return 1.0
    return float(mannwhitneyu(after, before, alternative="greater").pvalue)


def _count(value: float) -> str:
    return f"{value:,.0f}"


def _ms(value_ns: float) -> str:
    value_ms = value_ns / 1e6
    return f"{value_ms:,.0f}" if value_ms >= 10 else f"{value_ms:.1f}"
