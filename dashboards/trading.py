"""Trading: the reference system's stage latencies, in-system tick-to-trade and the feed's gaps
and recoveries, from a replay's document as the exporter names it (``probe="replay"``)."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as dash

from tailsight.dashboards import metrics as m
from tailsight.dashboards.panels import (
    heatmap_panel,
    latency_quantiles_panel,
    new_dashboard,
    quantile_gauge,
    query,
    rate,
    timeseries_panel,
    window_variable,
)

UID = "tailsight-trading"
PIPELINE = "=~" + "|".join(m.PIPELINE_STAGES)


def build() -> dash.Dashboard:
    return (
        new_dashboard(
            UID,
            "tailsight / Trading",
            "The reference trading system: where each tick's time goes, stage by stage, and "
            "how the feed handler kept up.",
        )
        .with_variable(window_variable(m.STAGE_LATENCY))
        .with_row(dash.Row("Tick to trade"))
        .with_panel(
            latency_quantiles_panel(
                m.STAGE_LATENCY,
                "In-system tick-to-trade (kernel receive to order sent)",
                [m.STAGE],
                stage=m.IN_SYSTEM_STAGE,
            )
        )
        .with_panel(
            heatmap_panel(
                m.STAGE_LATENCY, "In-system tick-to-trade buckets", stage=m.IN_SYSTEM_STAGE
            )
        )
        .with_panel(
            latency_quantiles_panel(
                m.STAGE_LATENCY,
                "In-system with the feed queue (kernel receive to order sent)",
                [m.STAGE],
                stage=m.IN_SYSTEM_WITH_QUEUE_STAGE,
            )
        )
        .with_panel(
            latency_quantiles_panel(
                m.STAGE_LATENCY,
                "Tick-to-trade from the intended send time",
                [m.STAGE],
                stage=m.TICK_TO_TRADE_STAGE,
            )
        )
        .with_row(dash.Row("Stages"))
        .with_panel(
            timeseries_panel(
                "P99 per stage",
                [
                    query(
                        quantile_gauge(m.STAGE_LATENCY, 0.99, [m.STAGE], stage=PIPELINE),
                        "{{stage}}",
                    )
                ],
                description="Each stage from the previous one's stamp (wire: the exchange's "
                "send to the kernel's receive; queue: the wait behind earlier feed messages); "
                "stacked, they add up to the tick's path.",
                stacked=True,
                width=24,
            )
        )
        .with_row(dash.Row("Feed"))
        .with_panel(
            timeseries_panel(
                "Gaps and recoveries per second",
                [
                    query(rate(m.FEED_GAPS, ["path"]), "gaps {{path}}"),
                    query(rate(m.FEED_REREQUESTS, ["path"]), "re-requests {{path}}"),
                    query(rate(m.FEED_RECOVERED, ["path"]), "recovered messages {{path}}"),
                    query(rate(m.FEED_DECODE_ERRORS, ["path"]), "decode errors {{path}}"),
                ],
                unit="ops",
                width=24,
            )
        )
    )
