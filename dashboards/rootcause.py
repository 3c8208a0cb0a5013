"""Root cause, for one victim cgroup (template variable ``victim``): its P99 with the jumps the
agent detected, who displaced it on the run queue (wait rate per aggressor, stacked), its CPU
throttling and stall time (PSI), and its syscall, TCP and migration series on the same time axis;
the live verdict last."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.models import dashboard

from tailsight.dashboards import metrics as m
from tailsight.dashboards.panels import (
    DATASOURCE,
    bar_panel,
    label_variable,
    latency_quantiles_panel,
    new_dashboard,
    quantile_gauge,
    query,
    rate,
    selector,
    table_panel,
    throttling_panels,
    timeseries_panel,
    window_variable,
)

UID = "tailsight-root-cause"
VICTIM = "$victim"
# Tags of the annotations `serve` posts through the Grafana API for each jump it detects.
JUMP_ANNOTATION_TAGS = ["tailsight", "tail-jump"]


def build() -> dash.Dashboard:
    displaced = rate(m.DISPLACED_WAIT, [m.AGGRESSOR], victim=VICTIM)
    over_range = (
        f"sum by (aggressor) (increase({m.DISPLACED_WAIT}{selector(victim=VICTIM)}[$__range]))"
    )
    share = f"{over_range} / ignoring (aggressor) group_left sum({over_range})"
    throttled_time, throttled_share = throttling_panels(VICTIM, cgroup=VICTIM)
    return (
        new_dashboard(
            UID,
            "tailsight / Root cause",
            "Why the victim cgroup's tail moved: its P99 with detected jumps, who displaced it, "
            "its CPU throttling and stalls, and its syscall, TCP and migration series aligned "
            "in time.",
        )
        .with_variable(label_variable("victim", m.CGROUP, m.RUNQUEUE_WAIT.count, "Victim cgroup"))
        .with_variable(window_variable(m.RUNQUEUE_WAIT))
        .annotation(
            dash.AnnotationQuery()
            .name("Tail jumps (agent verdicts)")
            .datasource(DATASOURCE)
            .enable(True)
            .icon_color("red")
            .expr(f"max by (probe) ({m.TAIL_JUMP}{selector(cgroup=VICTIM)}) > 0")
        )
        .annotation(
            dash.AnnotationQuery()
            .name("Tail jumps (posted by serve)")
            .datasource(dashboard.DataSourceRef(type_val="grafana", uid="-- Grafana --"))
            .enable(True)
            .icon_color("orange")
            .target(
                dash.AnnotationTarget()
                .type("tags")
                .tags(JUMP_ANNOTATION_TAGS)
                .match_any(False)
                .limit(100)
            )
        )
        .with_row(dash.Row("Symptom"))
        .with_panel(
            latency_quantiles_panel(
                m.RUNQUEUE_WAIT, "Run-queue wait of $victim", [m.CGROUP], cgroup=VICTIM
            ).span(24)
        )
        .with_row(dash.Row("Who displaced it"))
        .with_panel(
            timeseries_panel(
                "Wait caused per aggressor (s per s)",
                [query(displaced, "{{aggressor}}")],
                description="Seconds per second the victim's tasks waited runnable while a task "
                "of the aggressor cgroup held the CPU (idle: the CPU was idle, a wake-up delay).",
                stacked=True,
            )
        )
        .with_panel(
            bar_panel(
                "Share of the displaced wait over the range",
                share,
                "{{aggressor}}",
                "percentunit",
                "Each aggressor's share of all the wait it caused the victim over the time range.",
            )
        )
        .with_row(dash.Row("Its CPU limit and stalls"))
        .with_panel(throttled_time)
        .with_panel(throttled_share)
        .with_panel(
            timeseries_panel(
                "Stall time of $victim and of the host (PSI some, s per s)",
                [
                    query(
                        rate(m.PRESSURE_SOME, [m.RESOURCE], cgroup=VICTIM), "victim {{resource}}"
                    ),
                    query(rate(m.PRESSURE_HOST_SOME, [m.RESOURCE]), "host {{resource}}"),
                ],
                description="Pressure stall information: seconds per second in which at least "
                "one task of the victim waited for a CPU (throttled time included), for memory "
                "(reclaim, refaults, swap-in) or for IO (<cgroup>/<resource>.pressure, some), "
                "beside the same for the whole host (/proc/pressure/<resource>).",
            ).span(24)
        )
        .with_row(dash.Row("Its syscalls, TCP and migrations"))
        .with_panel(
            timeseries_panel(
                "Socket syscall P99 of $victim",
                [
                    query(
                        quantile_gauge(m.SYSCALL, 0.99, ["syscall"], cgroup=VICTIM),
                        "P99 {{syscall}}",
                    )
                ],
                log_scale=True,
            )
        )
        .with_panel(
            timeseries_panel(
                "Socket syscalls and errors per second",
                [
                    query(rate(m.SYSCALL.count, ["syscall"], cgroup=VICTIM), "{{syscall}}"),
                    query(
                        rate(m.SYSCALL_ERRORS, ["syscall", "errno"], cgroup=VICTIM),
                        "{{syscall}} {{errno}}",
                    ),
                ],
                unit="ops",
            )
        )
        .with_panel(
            timeseries_panel(
                "TCP connect P99 of $victim",
                [
                    query(
                        quantile_gauge(m.TCP_CONNECT, 0.99, [m.CGROUP], cgroup=VICTIM),
                        "connect P99",
                    )
                ],
                log_scale=True,
            )
        )
        .with_panel(
            timeseries_panel(
                "TCP retransmits of $victim per second",
                [
                    query(rate(m.TCP_RETRANSMITS, [m.CGROUP], cgroup=VICTIM), "retransmits"),
                    query(
                        rate(m.TCP_RETRANSMIT_FAILURES, [m.CGROUP], cgroup=VICTIM),
                        "failed retransmits",
                    ),
                ],
                unit="ops",
            )
        )
        .with_panel(
            timeseries_panel(
                "Packets dropped for $victim per second",
                [
                    query(
                        rate(m.PACKETS_DROPPED, [m.PROTOCOL, m.REASON], cgroup=VICTIM),
                        "{{protocol}} {{reason}}",
                    ),
                    query(
                        rate(m.HOST_PACKETS_DROPPED, [m.PROTOCOL, m.REASON]),
                        "host, no socket: {{protocol}} {{reason}}",
                    ),
                ],
                unit="ops",
                description="Drops of packets for the victim's sockets by the kernel's drop "
                "reason (SOCKET_RCVBUFF: its receive buffer was full), and the host's drops of "
                "packets no socket took.",
            )
        )
        .with_panel(
            timeseries_panel(
                "Migrations of $victim per second",
                [
                    query(rate(m.MIGRATIONS, [m.CGROUP], cgroup=VICTIM), "cross-CPU"),
                    query(rate(m.MIGRATIONS_CROSS_NODE, [m.CGROUP], cgroup=VICTIM), "cross-node"),
                    query(rate(m.NUMA_MOVES, [m.CGROUP], cgroup=VICTIM), "NUMA moves"),
                ],
                unit="ops",
            )
        )
        .with_row(dash.Row("Live verdict"))
        .with_panel(
            table_panel(
                "Active tail jumps of $victim",
                [
                    query(f"{m.TAIL_JUMP}{selector(cgroup=VICTIM)} > 0"),
                    query(f"{m.TAIL_JUMP_P99_BEFORE}{selector(cgroup=VICTIM)}"),
                    query(f"{m.TAIL_JUMP_P99_AFTER}{selector(cgroup=VICTIM)}"),
                ],
                "The agent's online jump detector: each active jump with its P99 before and "
                "after (seconds).",
            )
        )
        .with_panel(
            bar_panel(
                "Aggressor shares of the active jump",
                f"max by (aggressor) ({m.TAIL_JUMP_AGGRESSOR_SHARE}{selector(cgroup=VICTIM)})",
                "{{aggressor}}",
                "percentunit",
                "Share of the jump's excess wait each aggressor caused, while the jump is active.",
            ).span(24)
        )
    )
