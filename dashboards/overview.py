"""Overview: per probe, the 5 µs-bucket heatmap over time and exact P50/P99/P99.9 per cgroup;
migrations and syscall errors; CPU throttling and stall time (PSI) per cgroup and of the host;
then what the agent itself costs (BPF time per event, drops, map fill, export time)."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as dash

from tailsight.dashboards import metrics as m
from tailsight.dashboards.panels import (
    RATE,
    heatmap_panel,
    label_variable,
    latency_quantiles_panel,
    new_dashboard,
    query,
    rate,
    stat_panel,
    throttling_panels,
    timeseries_panel,
    window_variable,
)

UID = "tailsight-overview"
CGROUPS = "=~$cgroup"


def build() -> dash.Dashboard:
    board = (
        new_dashboard(
            UID,
            "tailsight / Overview",
            "Per-cgroup kernel latency from the tailsight agent: exact 5 µs histograms, exact "
            "quantiles, CPU throttling and stalls, and the agent's own cost.",
        )
        .with_variable(
            label_variable("cgroup", m.CGROUP, m.RUNQUEUE_WAIT.count, "Cgroup", multi=True)
        )
        .with_variable(window_variable(m.RUNQUEUE_WAIT))
    )
    for metric in m.KERNEL_LATENCIES:
        by = (m.CGROUP, *metric.by)
        board = (
            board.with_row(dash.Row(f"{metric.title} ({metric.probe})"))
            .with_panel(heatmap_panel(metric, f"{metric.title}: buckets", cgroup=CGROUPS))
            .with_panel(
                latency_quantiles_panel(
                    metric, f"{metric.title}: P50 / P99 / P99.9", by, cgroup=CGROUPS
                )
            )
        )
    board = (
        board.with_row(dash.Row("Migrations (migration)"))
        .with_panel(
            timeseries_panel(
                "Task migrations per second",
                [
                    query(rate(m.MIGRATIONS, [m.CGROUP], cgroup=CGROUPS), "{{cgroup}}"),
                    query(
                        rate(m.MIGRATIONS_CROSS_NODE, [m.CGROUP], cgroup=CGROUPS),
                        "cross-node {{cgroup}}",
                    ),
                ],
                unit="ops",
                description="Cross-CPU migrations of the cgroup's tasks (sched_migrate_task); "
                "cross-node ones where the machine has several NUMA nodes.",
            )
        )
        .with_panel(
            timeseries_panel(
                "Packets dropped per second",
                [
                    query(
                        rate(m.PACKETS_DROPPED, [m.CGROUP, m.PROTOCOL, m.REASON], cgroup=CGROUPS),
                        "{{cgroup}} {{protocol}} {{reason}}",
                    ),
                    query(
                        rate(m.HOST_PACKETS_DROPPED, [m.PROTOCOL, m.REASON]),
                        "host, no socket: {{protocol}} {{reason}}",
                    ),
                ],
                unit="ops",
                description="kfree_skb drops by the kernel's drop reason, per cgroup of the "
                "packet's socket (probe drops).",
            )
        )
        .with_panel(
            timeseries_panel(
                "Network syscall errors per second",
                [
                    query(
                        rate(m.SYSCALL_ERRORS, [m.CGROUP, "syscall", "errno"], cgroup=CGROUPS),
                        "{{cgroup}} {{syscall}} {{errno}}",
                    )
                ],
                unit="ops",
            )
        )
    )
    return _agent_cost(_limits_and_stalls(board))


def _limits_and_stalls(board: dash.Dashboard) -> dash.Dashboard:
    throttled_time, throttled_share = throttling_panels("each cgroup", cgroup=CGROUPS)
    by = [m.CGROUP, m.RESOURCE]
    return (
        board.with_row(dash.Row("CPU limits and stalls (throttle, pressure)"))
        .with_panel(throttled_time)
        .with_panel(throttled_share)
        .with_panel(
            timeseries_panel(
                "Stall time per cgroup (PSI, s per s)",
                [
                    query(
                        rate(m.PRESSURE_SOME, by, cgroup=CGROUPS), "some {{cgroup}} {{resource}}"
                    ),
                    query(
                        rate(m.PRESSURE_FULL, by, cgroup=CGROUPS), "full {{cgroup}} {{resource}}"
                    ),
                ],
                description="Pressure stall information of each cgroup "
                "(<cgroup>/<resource>.pressure): seconds per second in which some (at least "
                "one) or all of its non-idle tasks waited for a CPU (throttled time included), "
                "for memory or for IO.",
            )
        )
        .with_panel(
            timeseries_panel(
                "Host stall time (PSI, s per s)",
                [
                    query(rate(m.PRESSURE_HOST_SOME, [m.RESOURCE]), "some {{resource}}"),
                    query(rate(m.PRESSURE_HOST_FULL, [m.RESOURCE]), "full {{resource}}"),
                ],
                description="The same for the whole host (/proc/pressure/<resource>); the "
                "host's CPU full is always 0.",
            )
        )
    )


def _agent_cost(board: dash.Dashboard) -> dash.Dashboard:
    per_event = (
        f"sum by (probe) (rate({m.BPF_RUN_TIME}[{RATE}])) "
        f"/ sum by (probe) (rate({m.BPF_RUNS}[{RATE}]))"
    )
    drops = f'sum by (probe, reason) (rate({{__name__=~"{m.DROPPED_NAME_RE}"}}[{RATE}]))'
    return (
        board.with_row(dash.Row("Agent's own cost"))
        .with_panel(stat_panel("Probes attached", f"sum({m.PROBE_ATTACHED})", "attached", "none"))
        .with_panel(
            stat_panel(
                "Cgroups folded into other",
                f"max({m.CGROUPS_FOLDED})",
                "folded",
                "none",
            )
        )
        .with_panel(
            stat_panel(
                "Intervals exported per second",
                f"sum(rate({m.INTERVALS}[{RATE}]))",
                "intervals",
                "hertz",
            )
        )
        .with_panel(
            stat_panel(
                "Probe read errors per second",
                f"sum(rate({m.READ_ERRORS}[{RATE}]))",
                "errors",
                "ops",
            )
        )
        .with_panel(
            timeseries_panel(
                "BPF time per event",
                [query(per_event, "{{probe}}")],
                description=(
                    "Kernel BPF stats: run time / runs of the probe's programs (only with "
                    "serve --bpf-stats, which costs every BPF program two clock reads per run)."
                ),
            )
        )
        .with_panel(
            timeseries_panel(
                "BPF CPU use (s per s)",
                [query(rate(m.BPF_RUN_TIME, ["probe", "program"]), "{{probe}} {{program}}")],
                description=(
                    "Seconds of kernel time per second spent in each program (serve --bpf-stats)."
                ),
                stacked=True,
            )
        )
        .with_panel(
            timeseries_panel(
                "Agent CPU use (s per s)",
                [query(rate(m.AGENT_CPU, ["process"]), "{{process}}")],
                description=(
                    "CPU of the agent's process and of its symbolizer helpers (they name the "
                    "user frames of outlier stacks), beside the BPF time above."
                ),
                stacked=True,
            )
        )
        .with_panel(
            timeseries_panel(
                "Dropped events per second",
                [
                    query(drops, "{{probe}} {{reason}}"),
                    query(
                        rate(m.BPF_MISSED_RUNS, ["probe", "program"]),
                        "{{probe}} {{program}} missed",
                    ),
                ],
                unit="ops",
                description="Anything a probe could not record (full maps, ring buffer, "
                "rate limit), and events the kernel did not run a program for (already running "
                "on that CPU): non-zero means histograms undercount.",
            )
        )
        .with_panel(
            timeseries_panel(
                "Map fill",
                [query(f"max by (probe, map) ({m.MAP_FILL})", "{{probe}} {{map}}")],
                unit="percentunit",
                description="Entries used / max entries of each hash map; at 100% new keys drop.",
            )
        )
        .with_panel(
            timeseries_panel(
                "Export time",
                [
                    query(f"max({m.EXPORT_TIME})", "interval export"),
                    query(f"max({m.SCRAPE_TIME})", "previous /metrics collection"),
                ],
                description="Wall time the agent spends turning an interval into metrics, "
                "and serving a scrape.",
            )
        )
    )
