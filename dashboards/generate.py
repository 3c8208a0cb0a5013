"""The dashboards as Grafana JSON: built from code, written to ``dashboards/generated/`` (kept in
sync by a test) and pushed by ``tailsight dashboards push``."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.cog.encoder import JSONEncoder

from tailsight.dashboards import overview, rootcause, trading

GENERATED_DIR: Final = Path(__file__).parent / "generated"
PROVISIONING_DIR: Final = Path(__file__).parent / "provisioning"
BUILDERS: Final[dict[str, Callable[[], dash.Dashboard]]] = {
    "overview": overview.build,
    "root-cause": rootcause.build,
    "trading": trading.build,
}


def render(name: str) -> dict[str, Any]:
    """One dashboard as the JSON object Grafana stores (``id`` null: Grafana assigns it)."""
    built = BUILDERS[name]().build()
    document: dict[str, Any] = json.loads(json.dumps(built, cls=JSONEncoder))
    # Stable panel ids (the builders leave them unset; links and annotations refer to them).
    for number, panel in enumerate(document.get("panels", []), 1):
        panel["id"] = number
    return document


def to_text(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def write_all(directory: Path) -> list[Path]:
    """Write ``<name>.json`` for every dashboard into ``directory``, each atomically."""
    written = []
    for name in BUILDERS:
        path = directory / f"{name}.json"
        fd, temp = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(to_text(render(name)))
            os.chmod(temp, 0o644)
            os.replace(temp, path)
        except BaseException:
            Path(temp).unlink(missing_ok=True)
            raise
        written.append(path)
    return written
