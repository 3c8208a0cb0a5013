"""Every metric and label name the dashboards query, in one place. The probes' metrics are named
by ``probes/metricnames.py`` from their descriptors, the rule the exporter names them by; titles
and labels come from the descriptors too. The panel-query test against a real Prometheus checks
every name here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from tailsight import stages
from tailsight.analysis.verdicts import TAIL_JUMP as TAIL_JUMP  # re-exported (and below)
from tailsight.analysis.verdicts import TAIL_JUMP_AGGRESSOR_SHARE as TAIL_JUMP_AGGRESSOR_SHARE
from tailsight.analysis.verdicts import TAIL_JUMP_P99_AFTER as TAIL_JUMP_P99_AFTER
from tailsight.analysis.verdicts import TAIL_JUMP_P99_BEFORE as TAIL_JUMP_P99_BEFORE
from tailsight.collector.exporter import QUANTILE_LABEL as QUANTILE_LABEL  # re-exported
from tailsight.probes import (
    drops,
    metricnames,
    migration,
    netsyscall,
    pressure,
    runqueue,
    tcpstate,
    throttle,
)
from tailsight.probes.base import ProbeInfo

# The exact-quantile gauges' window label ("60s"); QUANTILE_LABEL names their quantile ("0.99").
WINDOW_LABEL: Final = "window"
CGROUP: Final = "cgroup"
VICTIM: Final = "victim"
AGGRESSOR: Final = "aggressor"
PROBE: Final = "probe"


@dataclass(frozen=True)
class LatencyMetric:
    """One latency histogram family of the exporter, ``tailsight_<probe>_<what>_seconds``, and
    its exact-quantile gauge ``tailsight_<probe>_<what>_quantile_seconds``."""

    probe: str
    what: str
    title: str
    by: tuple[str, ...] = ()  # series labels besides cgroup (legend, grouping)

    @property
    def base(self) -> str:
        return metricnames.histogram_base(self.probe, self.what)

    @property
    def bucket(self) -> str:
        return f"{metricnames.histogram_family(self.base)}_bucket"

    @property
    def count(self) -> str:
        return f"{metricnames.histogram_family(self.base)}_count"

    @property
    def quantile(self) -> str:
        return metricnames.quantile_family(self.base)


def _latency(probe: ProbeInfo, what: str) -> LatencyMetric:
    """A probe's histogram family, titled and labelled as its descriptor says."""
    series = probe.series_info({"kind": what})
    assert series is not None, (probe.name, what)
    return LatencyMetric(probe.name, what, series.title[0].upper() + series.title[1:], series.by)


def _counter(probe: ProbeInfo, name: str) -> str:
    """The sample of a counter the probe's descriptor describes (``..._total``)."""
    assert probe.counter_info(name) is not None, (probe.name, name)
    return metricnames.counter_sample(name, probe.name)


RUNQUEUE_WAIT: Final = _latency(runqueue.INFO, "wait")
SYSCALL: Final = _latency(netsyscall.INFO, "syscall")
TCP_CONNECT: Final = _latency(tcpstate.INFO, "connect")
TCP_LIFETIME: Final = _latency(tcpstate.INFO, "lifetime")
TCP_TIME_IN_STATE: Final = _latency(tcpstate.INFO, "time_in_state")
KERNEL_LATENCIES: Final = (RUNQUEUE_WAIT, SYSCALL, TCP_CONNECT, TCP_LIFETIME, TCP_TIME_IN_STATE)

# Counters (Prometheus names, with _total).
DISPLACED_WAIT: Final = _counter(runqueue.INFO, runqueue.DISPLACED_WAIT)
DISPLACED_SWITCHES: Final = _counter(runqueue.INFO, runqueue.DISPLACED_SWITCHES)
SYSCALL_ERRORS: Final = _counter(netsyscall.INFO, netsyscall.ERRORS)  # + syscall, errno
TCP_RETRANSMITS: Final = _counter(tcpstate.INFO, tcpstate.RETRANSMITS)
TCP_RETRANSMIT_FAILURES: Final = _counter(tcpstate.INFO, tcpstate.RETRANSMIT_FAILURES)
MIGRATIONS: Final = _counter(migration.INFO, migration.TASK_MIGRATIONS)
MIGRATIONS_CROSS_NODE: Final = _counter(migration.INFO, migration.CROSS_NODE_MIGRATIONS)
NUMA_MOVES: Final = _counter(migration.INFO, migration.NUMA_MOVES)
# CFS bandwidth control per cgroup (probe throttle, from cpu.stat), labelled with the limit as
# cgroup v2 writes it in cpu.max: "<quota_us> <period_us>" ("20000 100000": 20 ms per 100 ms).
THROTTLE_PERIODS: Final = _counter(throttle.INFO, throttle.PERIODS)
THROTTLE_THROTTLED_PERIODS: Final = _counter(throttle.INFO, throttle.THROTTLED_PERIODS)
THROTTLE_THROTTLED_TIME: Final = _counter(throttle.INFO, throttle.THROTTLED)
CPU_MAX: Final = throttle.LIMIT_LABEL
# Pressure stall information (probe pressure): stall time per cgroup (<cgroup>/<resource>.pressure)
# and host-wide (/proc/pressure/<resource>); some: at least one task stalled, full: all of them.
PRESSURE_SOME: Final = _counter(pressure.INFO, pressure.SOME)
PRESSURE_FULL: Final = _counter(pressure.INFO, pressure.FULL)
PRESSURE_HOST_SOME: Final = _counter(pressure.INFO, pressure.HOST_SOME)
PRESSURE_HOST_FULL: Final = _counter(pressure.INFO, pressure.HOST_FULL)
RESOURCE: Final = "resource"  # cpu | memory | io
# Packet drops (probe drops, kfree_skb) by the kernel's drop reason, per cgroup of the socket the
# packet was for, and host-wide for packets without one.
PACKETS_DROPPED: Final = _counter(drops.INFO, drops.DROPPED_PACKETS)
HOST_PACKETS_DROPPED: Final = _counter(drops.INFO, drops.HOST_DROPPED_PACKETS)
PROTOCOL: Final = "protocol"
REASON: Final = "reason"
# Drops of every probe: <probe>_dropped_events{reason} and <probe>_outlier_dropped{reason}.
DROPPED_NAME_RE: Final = "tailsight_[a-z]+_(dropped_events|outlier_dropped)_total"
OUTLIER_EVENTS_NAME_RE: Final = "tailsight_[a-z]+_outlier_events_total"

# The agent's own cost.
BPF_RUN_TIME: Final = "tailsight_bpf_program_run_time_seconds_total"
BPF_RUNS: Final = "tailsight_bpf_program_runs_total"
BPF_MISSED_RUNS: Final = "tailsight_bpf_program_missed_runs_total"
AGENT_CPU: Final = "tailsight_cpu_seconds_total"  # + process: agent, symbolizer
MAP_FILL: Final = "tailsight_map_fill_ratio"
EXPORT_TIME: Final = "tailsight_interval_export_seconds"
SCRAPE_TIME: Final = "tailsight_scrape_duration_seconds"
PROBE_ATTACHED: Final = "tailsight_probe_attached"
READ_ERRORS: Final = "tailsight_probe_read_errors_total"
CGROUPS_FOLDED: Final = "tailsight_cgroups_folded"
INTERVALS: Final = "tailsight_intervals_total"

# Live jump verdicts (TAIL_JUMP*: 1 while a jump of the series is active): imported above from
# analysis/verdicts.py, which exports them.

# Trading: a replay's tailsight.hist/1 document (trading_core/timing.py, probe="replay", one
# series per ``stage``) as the exporter names it; the feed's counters become replay_<name>_total.
REPLAY: Final = stages.PROBE
STAGE_LATENCY: Final = LatencyMetric(REPLAY, "latency", "Stage latency", ("stage",))
STAGE: Final = "stage"
# Stage names as the replay writes them (tailsight/stages.py; trading_core/timing.py says what
# each one spans).
PIPELINE_STAGES: Final = (stages.WIRE, stages.QUEUE, *stages.STAGES[1:])
IN_SYSTEM_STAGE: Final = stages.IN_SYSTEM
IN_SYSTEM_WITH_QUEUE_STAGE: Final = stages.IN_SYSTEM_WITH_QUEUE
TICK_TO_TRADE_STAGE: Final = stages.TICK_TO_TRADE
FEED_GAPS: Final = metricnames.counter_sample("gaps_detected", REPLAY)
FEED_RECOVERED: Final = metricnames.counter_sample("recovered_messages", REPLAY)
FEED_REREQUESTS: Final = metricnames.counter_sample("rerequests_sent", REPLAY)
FEED_DECODE_ERRORS: Final = metricnames.counter_sample("decode_errors", REPLAY)
