"""Every metric and label name the dashboards query, in one place: a rename in the exporter
(``collector/exporter.py``) is a one-line change here, and the panel-query test against a real
Prometheus fails until it is made. Latency titles and labels come from the probes' descriptors."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from tailsight import stages
from tailsight.collector.exporter import QUANTILE_LABEL as QUANTILE_LABEL  # re-exported
from tailsight.probes.catalog import PROBES

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
        return f"tailsight_{self.probe}_{self.what}"

    @property
    def bucket(self) -> str:
        return f"{self.base}_seconds_bucket"

    @property
    def count(self) -> str:
        return f"{self.base}_seconds_count"

    @property
    def quantile(self) -> str:
        return f"{self.base}_quantile_seconds"


def _latency(probe: str, what: str) -> LatencyMetric:
    """A probe's histogram family, titled and labelled as its descriptor says."""
    series = PROBES[probe].series_info({"kind": what})
    assert series is not None, (probe, what)
    return LatencyMetric(probe, what, series.title[0].upper() + series.title[1:], series.by)


RUNQUEUE_WAIT: Final = _latency("runqueue", "wait")
SYSCALL: Final = _latency("netsyscall", "syscall")
TCP_CONNECT: Final = _latency("tcpstate", "connect")
TCP_LIFETIME: Final = _latency("tcpstate", "lifetime")
TCP_TIME_IN_STATE: Final = _latency("tcpstate", "time_in_state")
KERNEL_LATENCIES: Final = (RUNQUEUE_WAIT, SYSCALL, TCP_CONNECT, TCP_LIFETIME, TCP_TIME_IN_STATE)

# Counters (Prometheus names, with _total).
DISPLACED_WAIT: Final = "tailsight_runqueue_displaced_wait_seconds_total"
DISPLACED_SWITCHES: Final = "tailsight_runqueue_displaced_switches_total"
SYSCALL_ERRORS: Final = "tailsight_netsyscall_errors_total"  # + syscall, errno
TCP_RETRANSMITS: Final = "tailsight_tcpstate_tcp_retransmits_total"
TCP_RETRANSMIT_FAILURES: Final = "tailsight_tcpstate_tcp_retransmit_failures_total"
MIGRATIONS: Final = "tailsight_migration_task_migrations_total"
MIGRATIONS_CROSS_NODE: Final = "tailsight_migration_task_migrations_cross_node_total"
NUMA_MOVES: Final = "tailsight_migration_numa_task_moves_total"
# CFS bandwidth control per cgroup (probe throttle, from cpu.stat), labelled with the limit as
# cgroup v2 writes it in cpu.max: "<quota_us> <period_us>" ("20000 100000": 20 ms per 100 ms).
THROTTLE_PERIODS: Final = "tailsight_throttle_periods_total"
THROTTLE_THROTTLED_PERIODS: Final = "tailsight_throttle_throttled_periods_total"
THROTTLE_THROTTLED_TIME: Final = "tailsight_throttle_throttled_seconds_total"
CPU_MAX: Final = "cpu_max"
# Pressure stall information (probe pressure): stall time per cgroup (<cgroup>/<resource>.pressure)
# and host-wide (/proc/pressure/<resource>); some: at least one task stalled, full: all of them.
PRESSURE_SOME: Final = "tailsight_pressure_some_seconds_total"
PRESSURE_FULL: Final = "tailsight_pressure_full_seconds_total"
PRESSURE_HOST_SOME: Final = "tailsight_pressure_host_some_seconds_total"
PRESSURE_HOST_FULL: Final = "tailsight_pressure_host_full_seconds_total"
RESOURCE: Final = "resource"  # cpu | memory | io
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

# Live jump verdicts: 1 while a jump of the series is active.
TAIL_JUMP: Final = "tailsight_tail_jump"
TAIL_JUMP_P99_BEFORE: Final = "tailsight_tail_jump_p99_before_seconds"
TAIL_JUMP_P99_AFTER: Final = "tailsight_tail_jump_p99_after_seconds"
TAIL_JUMP_AGGRESSOR_SHARE: Final = "tailsight_tail_jump_aggressor_share"

# Trading: a replay's tailsight.hist/1 document (trading_core/timing.py, probe="replay", one
# series per ``stage``) as the exporter names it; the feed's counters become replay_<name>_total.
STAGE_LATENCY: Final = LatencyMetric("replay", "latency", "Stage latency", ("stage",))
STAGE: Final = "stage"
# Stage names as the replay writes them (tailsight/stages.py; trading_core/timing.py says what
# each one spans).
PIPELINE_STAGES: Final = (stages.WIRE, stages.QUEUE, *stages.STAGES[1:])
IN_SYSTEM_STAGE: Final = stages.IN_SYSTEM
IN_SYSTEM_WITH_QUEUE_STAGE: Final = stages.IN_SYSTEM_WITH_QUEUE
TICK_TO_TRADE_STAGE: Final = stages.TICK_TO_TRADE
FEED_GAPS: Final = "tailsight_replay_gaps_detected_total"
FEED_RECOVERED: Final = "tailsight_replay_recovered_messages_total"
FEED_REREQUESTS: Final = "tailsight_replay_rerequests_sent_total"
FEED_DECODE_ERRORS: Final = "tailsight_replay_decode_errors_total"
