"""The throttle and pressure probes' counters as the exporter serves them: names, units and help
from their descriptors, the limit as a label, and the top-K of a probe that counts only time."""

from __future__ import annotations

import re

import numpy as np

from tailsight.collector.config import CollectorConfig
from tailsight.collector.exporter import PrometheusExporter
from tailsight.intervals import Counter
from tailsight.probes.pressure import INFO as PRESSURE
from tailsight.probes.throttle import INFO as THROTTLE
from tests.collector.test_exporter import doc, scrape

QUOTA = "20000 100000"


def test_throttling_with_its_limit_and_stalls_in_seconds() -> None:
    exporter = PrometheusExporter()
    limited = {"probe": "throttle", "cgroup": "/v", "cpu_max": QUOTA}
    for t in range(3):
        exporter.update(
            doc(
                t,
                {"/v": np.array([1000])},
                [
                    Counter("throttle_periods", limited, 10),
                    Counter("throttle_throttled_periods", limited, 7),
                    Counter("throttle_throttled_ns", limited, 61_000_000),
                    Counter(
                        "pressure_some_ns",
                        {"probe": "pressure", "cgroup": "/v", "resource": "memory"},
                        2_000_000,
                    ),
                    Counter(
                        "pressure_host_some_ns", {"probe": "pressure", "resource": "io"}, 5_000
                    ),
                ],
            )
        )
    samples = scrape(exporter)
    labels = ("cgroup=/v", f"cpu_max={QUOTA}", "probe=throttle")
    assert samples[("tailsight_throttle_periods_total", *labels)] == 30
    assert samples[("tailsight_throttle_throttled_periods_total", *labels)] == 21
    assert abs(samples[("tailsight_throttle_throttled_seconds_total", *labels)] - 0.183) < 1e-9
    memory = ("cgroup=/v", "probe=pressure", "resource=memory")
    assert abs(samples[("tailsight_pressure_some_seconds_total", *memory)] - 0.006) < 1e-9
    host = ("probe=pressure", "resource=io")
    assert abs(samples[("tailsight_pressure_host_some_seconds_total", *host)] - 15e-6) < 1e-12
    helps = dict(re.findall(r"^# HELP (\S+) (.*)$", exporter.exposition().decode(), re.M))
    throttled = THROTTLE.counter_info("throttle_throttled_ns")
    some = PRESSURE.counter_info("pressure_some_ns")
    assert throttled is not None and some is not None
    assert helps["tailsight_throttle_throttled_seconds_total"] == throttled.help
    assert helps["tailsight_pressure_some_seconds_total"] == some.help


def test_pressure_ranks_its_cgroups_by_stall_time() -> None:
    """Pressure counts no events: its top-K goes to the most stalled cgroups, not to "other"."""
    exporter = PrometheusExporter(CollectorConfig(top_k=1))
    for t in range(3):
        exporter.update(
            doc(
                t,
                {},
                [
                    Counter(
                        "pressure_some_ns",
                        {"probe": "pressure", "cgroup": cgroup, "resource": "cpu"},
                        stalled_ns,
                    )
                    for cgroup, stalled_ns in (("/calm", 1_000), ("/stalled", 9_000_000))
                ],
            )
        )
    samples = scrape(exporter)
    stalled = ("tailsight_pressure_some_seconds_total", "cgroup=/stalled", "probe=pressure")
    assert abs(samples[(*stalled, "resource=cpu")] - 0.027) < 1e-9
    other = ("tailsight_pressure_some_seconds_total", "cgroup=other", "probe=pressure")
    assert abs(samples[(*other, "resource=cpu")] - 3e-6) < 1e-12
