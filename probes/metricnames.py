"""How the probes' series and counters are named in Prometheus: the one rule the exporter names
them by, the dashboards query them by and the Prometheus reader (``analysis/promsource.py``)
reads them back by. ebpf_exporter's convention: the unit is in the name."""

from __future__ import annotations

import re
from typing import Final

PREFIX: Final = "tailsight_"
HISTOGRAM_UNIT: Final = "_seconds"
"""A latency family is ``<base>_seconds`` (samples ``_bucket``, ``_count``, ``_sum``)."""
QUANTILE_UNIT: Final = "_quantile_seconds"
"""Its exact-quantile gauge is ``<base>_quantile_seconds``."""
COUNTER_SAMPLE: Final = "_total"
"""A counter family's sample, as Prometheus names it."""
NS_UNIT: Final = "_ns"
"""A document counter in nanoseconds, exported in seconds."""
_NAME_BAD: Final = re.compile(r"[^a-zA-Z0-9_]")


def histogram_base(probe: str, what: str) -> str:
    """``tailsight_<probe>_<what>``: a probe's latency series before its unit."""
    return _NAME_BAD.sub("_", f"{PREFIX}{probe}_{what}")


def histogram_family(base: str) -> str:
    return base + HISTOGRAM_UNIT


def quantile_family(base: str) -> str:
    return base + QUANTILE_UNIT


def counter_family(name: str, probe: str) -> tuple[str, float]:
    """A document counter's family name (without ``_total``) and the scale to its unit: prefixed
    with its probe unless the name already is, ``_ns`` in seconds."""
    stem = name if name.startswith(f"{probe}_") or not probe else f"{probe}_{name}"
    scale = 1.0
    if stem.endswith(NS_UNIT):
        stem, scale = stem.removesuffix(NS_UNIT) + HISTOGRAM_UNIT, 1e-9
    stem = stem.removesuffix(COUNTER_SAMPLE)
    return _NAME_BAD.sub("_", f"{PREFIX}{stem}"), scale


def counter_sample(name: str, probe: str) -> str:
    """The sample a query names for a document counter: ``tailsight_<probe>_<name>_total``."""
    return counter_family(name, probe)[0] + COUNTER_SAMPLE


def document_counter(stem: str) -> tuple[str, float]:
    """The document counter name and scale of an exported counter's ``stem`` (its sample name
    less ``tailsight_`` and ``_total``): seconds back to ``_ns``. The probe prefix stays."""
    if stem.endswith(HISTOGRAM_UNIT):
        return stem.removesuffix(HISTOGRAM_UNIT) + NS_UNIT, 1e9
    return stem, 1.0
