"""Map fill self-metric: the kernel map's entry count, checked against the cells the probe read."""

from __future__ import annotations

import time

import pytest

from tailsight.probes.runqueue import MAX_SLOTS, RunQueueProbe
from tailsight.workload import contention, private_base

pytestmark = pytest.mark.kernel


def test_runqueue_map_fill_counts_the_cgroup_slots(kernel_ready: None) -> None:
    with RunQueueProbe() as probe, contention(base=private_base("mapfill")):
        time.sleep(1.0)
        # Read twice around the fill: cells are only ever added, so the fill lies in between.
        before = probe.read()
        fill = probe.map_fill()
        after = probe.read()

    # Histograms and pairs are arrays with a row per cgroup slot: what fills up is the slots
    # hash, one entry per cgroup seen as a victim or an aggressor (the idle aggressor has none).
    slots = round(fill["runqueue_slots"] * MAX_SLOTS)
    assert len(before.cgroup_ids()) <= slots <= len(after.cgroup_ids())
    assert len(before.histograms) >= 1
    assert all(0 <= ratio < 1 for ratio in fill.values()), fill
