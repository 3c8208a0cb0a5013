"""The contention workload: processes land in their cgroups on their CPU, and everything is
cleaned up even when the body raises."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tailsight.testing.workload import Task, Workload, default_cpu, private_base


@pytest.mark.kernel
def test_workload_places_pins_and_cleans_up(kernel_ready: None) -> None:
    cpu = default_cpu()
    base = private_base("workload")
    workload = Workload([Task("a", cpu=cpu), Task("b")], base=base)
    with pytest.raises(KeyboardInterrupt), workload:
        pids = workload.pids()
        directory = workload.cgroup_dir("a")
        for pid, group in zip(pids, ("a", "b"), strict=True):
            # the kernel's view: /proc/<pid>/cgroup and the affinity mask
            cgroup_line = Path(f"/proc/{pid}/cgroup").read_text().split("0::", 1)[1].strip()
            assert cgroup_line == f"/{base}/{group}"
        assert os.sched_getaffinity(pids[0]) == {cpu}
        raise KeyboardInterrupt
    assert not directory.exists() and not directory.parent.exists()
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists()
