"""Live verdicts as Grafana annotations (``POST /api/annotations``), tagged as the root-cause
dashboard's annotation query expects them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from grafana_client.client import GrafanaException
from niquests.exceptions import RequestException

from tailsight.analysis.verdicts import Verdict
from tailsight.dashboards.push import connect

ANNOTATION_TAGS: Final = ("tailsight", "tail-jump")


class GrafanaAnnotator:
    """Posts one Grafana annotation per verdict (``POST /api/annotations``); failures are
    reported to ``log``, never raised: the agent must keep running without Grafana."""

    def __init__(self, url: str, token: str, log: Callable[[str], None]) -> None:
        self.api = connect(url, token, timeout_s=5.0)
        self.log = log
        self.posted = 0

    def post(self, verdict: Verdict) -> None:
        jump = verdict.jump
        start_ns = jump.change_start_ns or 0
        end_ns = jump.alarm_start_ns or start_ns
        tags = [*ANNOTATION_TAGS, verdict.labels.get("probe", "")]
        try:
            self.api.annotations.add_annotation(  # type: ignore[no-untyped-call]
                time_from=start_ns // 1_000_000,
                time_to=end_ns // 1_000_000,
                tags=[t for t in tags if t],
                text=verdict.text(),
            )
            self.posted += 1
        except (GrafanaException, RequestException) as error:
            self.log(f"grafana annotation failed: {error}")
