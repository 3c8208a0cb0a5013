"""The few panel shapes the dashboards are made of, on grafana-foundation-sdk builders, so that
every dashboard gets the same data source, rate window, units and legends."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from grafana_foundation_sdk.builders import bargauge, heatmap, stat, table, timeseries
from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.builders import prometheus as prom
from grafana_foundation_sdk.models import common, dashboard
from grafana_foundation_sdk.models import heatmap as heatmap_models
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from tailsight.dashboards import metrics

DATASOURCE_VARIABLE: Final = "datasource"
DATASOURCE: Final = dashboard.DataSourceRef(
    type_val="prometheus", uid=f"${{{DATASOURCE_VARIABLE}}}"
)
# Grafana's own window for rate(): max(step + scrape interval, 4 x scrape interval), with the
# scrape interval taken from the data source's timeInterval (provisioning/datasources/*.yaml).
RATE: Final = "$__rate_interval"
SECONDS: Final = "s"
QUANTILES: Final = ((0.5, "P50"), (0.99, "P99"), (0.999, "P99.9"))
TAGS: Final = ["tailsight"]


def query(expr: str, legend: str = "", ref: str = "A") -> prom.Dataquery:
    """A range query on the dashboard's Prometheus."""
    return prom.Dataquery().expr(expr).legend_format(legend or "__auto").ref_id(ref)


def selector(**labels: str) -> str:
    """``{name="value",...}``; a value starting with ``=~`` is a regex match."""
    parts = []
    for name, value in labels.items():
        op, value = ("=~", value[2:]) if value.startswith("=~") else ("=", value)
        parts.append(f'{name}{op}"{value}"')
    return "{" + ",".join(parts) + "}"


def rate(name: str, by: Sequence[str], **labels: str) -> str:
    """Per-second rate of a counter, summed by ``by``."""
    return f"sum by ({', '.join(by)}) (rate({name}{selector(**labels)}[{RATE}]))"


def quantile_gauge(
    metric: metrics.LatencyMetric, q: float, by: Sequence[str], **labels: str
) -> str:
    """The exporter's exact quantile over the chosen window (full 5 µs resolution)."""
    labels = {**labels, metrics.QUANTILE_LABEL: str(q), metrics.WINDOW_LABEL: "$window"}
    return f"max by ({', '.join(by)}) ({metric.quantile}{selector(**labels)})"


def timeseries_panel(
    title: str,
    targets: Sequence[prom.Dataquery],
    unit: str = SECONDS,
    description: str = "",
    stacked: bool = False,
    width: int = 12,
    height: int = 8,
    log_scale: bool = False,
) -> timeseries.Panel:
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .span(width)
        .height(height)
        .line_width(1)
        .fill_opacity(30 if stacked else 0)
        .legend(
            common_builders.VizLegendOptions()
            .display_mode(common.LegendDisplayMode.TABLE)
            .placement(common.LegendPlacement.RIGHT)
            .show_legend(True)
            .calcs(["max", "lastNotNull"])
        )
        .tooltip(
            common_builders.VizTooltipOptions()
            .mode(common.TooltipDisplayMode.MULTI)
            .sort(common.SortOrder.DESCENDING)
        )
    )
    if stacked:
        panel = panel.stacking(common_builders.StackingConfig().mode(common.StackingMode.NORMAL))
    if log_scale:
        panel = panel.scale_distribution(
            common_builders.ScaleDistributionConfig().type(common.ScaleDistribution.LOG).log(10)
        )
    for n, target in enumerate(targets):
        panel = panel.with_target(target.ref_id(chr(ord("A") + n)))
    return panel


def ratio_of_rates(numerator: str, denominator: str, by: Sequence[str], **labels: str) -> str:
    """Rate of one counter over the rate of another, per ``by``."""
    return f"{rate(numerator, by, **labels)} / {rate(denominator, by, **labels)}"


def throttling_panels(subject: str, **labels: str) -> tuple[timeseries.Panel, timeseries.Panel]:
    """CFS bandwidth throttling per cgroup, its limit (``cpu.max``) in the legend: the time
    throttled per second, and the share of enforcement periods that ran out of quota."""
    by = [metrics.CGROUP, metrics.CPU_MAX]
    legend = "{{cgroup}} (cpu.max {{cpu_max}})"
    throttled_time = rate(metrics.THROTTLE_THROTTLED_TIME, by, **labels)
    share = ratio_of_rates(
        metrics.THROTTLE_THROTTLED_PERIODS, metrics.THROTTLE_PERIODS, by, **labels
    )
    return (
        timeseries_panel(
            f"Throttled time of {subject} (s per s)",
            [query(throttled_time, legend)],
            description="Seconds per second the cgroup's run queues were throttled: it had used "
            "its quota (cpu.max: quota and period in µs) before the period ended, and its "
            "runnable tasks waited for the next period (cpu.stat throttled_usec; cgroup v1 "
            "throttled_time). Summed over CPUs: above 1 when several CPUs were throttled.",
        ),
        timeseries_panel(
            f"Throttled share of {subject}'s CFS periods",
            [query(share, legend)],
            unit="percentunit",
            description="Periods in which the cgroup ran out of quota / enforcement periods "
            "(cpu.stat nr_throttled / nr_periods; periods elapse only while it has runnable "
            "tasks). Near 100 %, the limit sets the pace, not the work.",
        ),
    )


def latency_quantiles_panel(
    metric: metrics.LatencyMetric, title: str, by: Sequence[str], **labels: str
) -> timeseries.Panel:
    """P50 / P99 / P99.9 per ``by`` from the exact quantile gauges."""
    legend = " ".join("{{" + name + "}}" for name in by)
    targets = [
        query(quantile_gauge(metric, q, by, **labels), f"{name} {legend}") for q, name in QUANTILES
    ]
    return timeseries_panel(
        title,
        targets,
        description=f"Exact quantiles of `{metric.quantile}` over the window `$window` "
        "(computed by the agent from full-resolution 5 µs buckets, not from `le` buckets).",
        log_scale=True,
    )


def heatmap_panel(
    metric: metrics.LatencyMetric, title: str, width: int = 12, **labels: str
) -> heatmap.Panel:
    """Events per second per bucket over time; every ``le`` bound is a 5 µs-aligned bucket edge
    of the model, so the counts in each cell are exact."""
    expr = f"sum by (le) (rate({metric.bucket}{selector(**labels)}[{RATE}]))"
    return (
        heatmap.Panel()
        .title(title)
        .description(
            f"`{metric.bucket}`: rate per bucket; bounds are exact re-bucketings of the 5 µs model."
        )
        .datasource(DATASOURCE)
        .span(width)
        .height(8)
        .with_target(query(expr, "{{le}}").format(PromQueryFormat.HEATMAP).interval_factor(1))
        .calculate(False)
        .cell_gap(1)
        .color(
            heatmap.HeatmapColorOptions()
            .mode(heatmap_models.HeatmapColorMode.SCHEME)
            .scheme("Viridis")
            .scale(heatmap_models.HeatmapColorScale.EXPONENTIAL)
            .exponent(0.5)
            .fill("dark-orange")
            .steps(64)
        )
        .y_axis(heatmap.YAxisConfig().unit(SECONDS).axis_placement(common.AxisPlacement.LEFT))
        .rows_frame(heatmap.RowsHeatmapOptions().layout(common.HeatmapCellLayout.LE))
        .cell_values(heatmap.CellValues().unit("reqps"))
        .mode(common.TooltipDisplayMode.SINGLE)
        .show_y_histogram()
        .show_legend()
    )


def stat_panel(title: str, expr: str, legend: str, unit: str, width: int = 6) -> stat.Panel:
    return (
        stat.Panel()
        .title(title)
        .datasource(DATASOURCE)
        .unit(unit)
        .span(width)
        .height(4)
        .with_target(query(expr, legend))
        .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]))
    )


def bar_panel(title: str, expr: str, legend: str, unit: str, description: str) -> bargauge.Panel:
    return (
        bargauge.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .span(12)
        .height(8)
        .with_target(query(expr, legend).instant())
        .orientation(common.VizOrientation.HORIZONTAL)
        .display_mode(common.BarGaugeDisplayMode.BASIC)
        .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]))
    )


def table_panel(
    title: str, targets: Sequence[prom.Dataquery], description: str, width: int = 24
) -> table.Panel:
    panel = (
        table.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .span(width)
        .height(6)
    )
    for n, target in enumerate(targets):
        panel = panel.with_target(
            target.instant().format(PromQueryFormat.TABLE).ref_id(chr(ord("A") + n))
        )
    return panel.with_transformation(dashboard.DataTransformerConfig(id_val="merge", options={}))


def datasource_variable() -> dash.DatasourceVariable:
    return dash.DatasourceVariable(DATASOURCE_VARIABLE).label("Prometheus").type("prometheus")


def label_variable(
    name: str, label: str, metric: str, title: str, multi: bool = False
) -> dash.QueryVariable:
    """A variable over the values of ``label`` of ``metric``, refreshed when the time changes."""
    variable = (
        dash.QueryVariable(name)
        .label(title)
        .datasource(DATASOURCE)
        .query(f"label_values({metric}, {label})")
        .refresh(dashboard.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dashboard.VariableSort.ALPHABETICAL_ASC)
    )
    if multi:
        variable = variable.multi(True).include_all(True).all_value(".+")
    return variable


def window_variable(metric: metrics.LatencyMetric) -> dash.QueryVariable:
    return label_variable("window", metrics.WINDOW_LABEL, metric.quantile, "Quantile window")


def new_dashboard(uid: str, title: str, description: str) -> dash.Dashboard:
    return (
        dash.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(TAGS)
        .editable()
        .refresh("10s")
        .time("now-30m", "now")
        .timezone("browser")
        .tooltip(dashboard.DashboardCursorSync.CROSSHAIR)
        .link(
            dash.DashboardLink("tailsight")
            .type(dashboard.DashboardLinkType.DASHBOARDS)
            .tags(TAGS)
            .as_dropdown(True)
            .include_vars(True)
            .keep_time(True)
        )
        .annotation(
            dash.AnnotationQuery()
            .name("Annotations & Alerts")
            .datasource(dashboard.DataSourceRef(type_val="grafana", uid="-- Grafana --"))
            .built_in(1)
            .enable(True)
            .hide(True)
            .icon_color("rgba(0, 211, 255, 1)")
            .type("dashboard")
        )
        .with_variable(datasource_variable())
    )
