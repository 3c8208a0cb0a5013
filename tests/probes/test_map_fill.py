"""Map fill self-metric: the kernel map's entry count, checked against the cells the probe read."""

from __future__ import annotations

import ctypes
import time

import pytest

from tailsight.probes.bccprobe import hash_map_entries, table_items
from tailsight.probes.netsyscall import NetSyscallProbe
from tailsight.probes.runqueue import MAX_SLOTS, RunQueueProbe
from tailsight.testing.workload import contention, private_base

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


def test_hash_map_entries_counts_what_user_space_put_in(kernel_ready: None) -> None:
    # A prime number of keys, far more than a quiet host's map holds (one batch takes them all:
    # the buffer is max_entries long).
    with NetSyscallProbe() as probe:
        table = probe._bpf[b"netsyscall_errors"]
        for n in range(1, 1_500):
            key = table.Key(cgroup_id=n, nr=44, errno_value=11)
            table[key] = ctypes.c_uint64(n)
        wanted = 1_499
        assert hash_map_entries(table) == len(table_items(table)) == wanted
        assert probe.map_fill()["netsyscall_errors"] == wanted / table.max_entries
        table.clear()
        assert hash_map_entries(table) == 0
