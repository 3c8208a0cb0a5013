"""Reading the generated dashboards the way Grafana does: their panels and every PromQL they run."""

from __future__ import annotations

import re
from typing import Any, Final

QUOTED: Final = re.compile(r'"[^"]*"')


def panels(document: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel but the rows."""
    return [p for p in document["panels"] if p["type"] != "row"]


def expressions(document: dict[str, Any]) -> list[str]:
    """Every PromQL the dashboard runs: panel targets and Prometheus annotations."""
    exprs = [t["expr"] for p in panels(document) for t in p.get("targets", [])]
    exprs += [a["expr"] for a in document["annotations"]["list"] if "expr" in a]
    return exprs
