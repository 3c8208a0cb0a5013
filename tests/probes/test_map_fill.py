"""Map fill self-metric: the kernel map's entry count, checked against the cells the probe read."""

from __future__ import annotations

import time
from collections.abc import Mapping

import pytest

from tailsight.hist import Histogram
from tailsight.probes.base import Labels
from tailsight.probes.runqueue import RunQueueProbe
from tailsight.workload import contention, private_base

pytestmark = pytest.mark.kernel

HIST_CELLS = 65536  # RUNQUEUE_MAX_CELLS in runqueue.bpf.c
CGROUPS = 4096  # RUNQUEUE_MAX_CGROUPS


def test_runqueue_map_fill_counts_the_histogram_cells(kernel_ready: None) -> None:
    with RunQueueProbe() as probe, contention(base=private_base("mapfill")):
        time.sleep(1.0)
        # Read twice around the fill: cells are only ever added, so the fill lies in between.
        before = probe.read()
        fill = probe.map_fill()
        after = probe.read()

    def cells(histograms: Mapping[Labels, Histogram]) -> int:
        return sum(len(h.sparse_buckets()) + (1 if h.overflow else 0) for h in histograms.values())

    assert cells(before.histograms) <= fill["runqueue_wait_hist"] * HIST_CELLS
    assert fill["runqueue_wait_hist"] * HIST_CELLS <= cells(after.histograms)
    assert len(before.histograms) <= fill["runqueue_wait_totals"] * CGROUPS
    assert fill["runqueue_wait_totals"] * CGROUPS <= len(after.histograms)
    assert all(0 < ratio < 1 for ratio in fill.values() if ratio), fill
