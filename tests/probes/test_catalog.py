"""The probes' descriptors against their own sources: each names exactly the tracepoints its
BPF program has a handler for, and what reads them (exporter, explain, dashboards) uses them."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from tailsight.collector.exporter import PrometheusExporter
from tailsight.dashboards.metrics import KERNEL_LATENCIES
from tailsight.hist import Histogram
from tailsight.intervals import Counter, HistDocument, Series
from tailsight.probes.catalog import PROBES, series_title

PROBES_DIR = Path(__file__).resolve().parents[2] / "probes"


def test_tracepoints_are_the_handlers_of_each_bpf_program() -> None:
    for name, info in PROBES.items():
        if info.files:  # reads the kernel's files: no BPF program, no tracepoint
            assert not info.tracepoints and not (PROBES_DIR / f"{name}.bpf.c").exists(), name
            continue
        source = (PROBES_DIR / f"{name}.bpf.c").read_text()
        handlers = set(re.findall(r"^int on_(\w+)\(", source, re.MULTILINE))
        assert handlers == set(info.tracepoints), name


def test_exporter_help_and_names_come_from_the_descriptors() -> None:
    """A tcpstate connect series and a runqueue counter: their families are named and helped as
    the descriptors say (the exporter holds no per-probe text of its own)."""
    hist = Histogram.from_samples(np.array([100_000, 200_000]))
    document = HistDocument(
        0,
        10**9,
        [
            Series({"probe": "tcpstate", "cgroup": "/s", "kind": "connect"}, hist),
            Series({"probe": "runqueue", "cgroup": "/a"}, hist),
        ],
        [Counter("runqueue_displaced_switches", {"probe": "runqueue", "victim": "/a"}, 5)],
    )
    exporter = PrometheusExporter()
    exporter.update(document)
    helps = dict(re.findall(r"^# HELP (\S+) (.*)$", exporter.exposition().decode(), re.M))
    connect = PROBES["tcpstate"].series_info({"kind": "connect"})
    assert connect is not None
    assert helps["tailsight_tcpstate_connect_seconds"].startswith(connect.help)
    switches = PROBES["runqueue"].counter_info("runqueue_displaced_switches")
    assert switches is not None
    assert helps["tailsight_runqueue_displaced_switches_total"] == switches.help


def test_series_titles() -> None:
    """By the ``kind`` label where a probe records several series, else its only one; a series
    no descriptor knows keeps its probe's name."""
    assert series_title({"probe": "netsyscall", "syscall": "sendto"}) == "socket syscall time"
    assert series_title({"probe": "tcpstate", "kind": "lifetime"}) == "TCP connection lifetime"
    assert series_title({"probe": "tcpstate"}) == "TCP state time"
    assert series_title({"probe": "custom"}) == "custom"
    assert [m.title for m in KERNEL_LATENCIES][:2] == ["Run-queue wait", "Socket syscall time"]
