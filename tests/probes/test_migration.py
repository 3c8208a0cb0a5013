"""The migration probe against the kernel's own se.nr_migrations (/proc/<pid>/sched) for a task
that moves itself between CPUs, the cross-node rule on a synthetic two-node map loaded into the
live probe, the CPU-offset self-check catching a wrong offset, and host-wide vmstat reading."""

from __future__ import annotations

import os
import re
import select
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tailsight.probes.base import Snapshot, labels
from tailsight.probes.btf import Btf
from tailsight.probes.catalog import create_probe
from tailsight.probes.loader import prog_test_run_raw_tp
from tailsight.probes.migration import (
    HOST_LABELS,
    KINDS,
    MigrationProbe,
    expected_tracepoint_args,
    read_vmstat,
)
from tailsight.probes.offsets import OffsetCheckError
from tailsight.probes.topology import CpuTopology
from tailsight.testing.workload import Workload, private_base, python_task

FLIPS = 23  # prime: a stray or missing migration cannot hide in a round number

# Waits for "go", then moves itself FLIPS times between two CPUs by changing its own affinity
# (each change forces a migration), says "done" and sleeps on stdin again.
MOVER_CODE = """
import os, sys
first, second, flips = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
sys.stdin.readline()
for i in range(flips):
    os.sched_setaffinity(0, {second if i % 2 == 0 else first})
print("done", flush=True)
sys.stdin.readline()
"""


def _nr_migrations(pid: int) -> int:
    text = Path(f"/proc/{pid}/sched").read_text()
    match = re.search(r"^se\.nr_migrations\s*:\s*(\d+)", text, re.MULTILINE)
    assert match, f"no se.nr_migrations in /proc/{pid}/sched"
    return int(match.group(1))


def _wait_sleeping(pid: int, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat[stat.rindex(")") + 2] == "S":
            return
        assert time.monotonic() < deadline, f"pid {pid} never went to sleep"
        time.sleep(0.005)


def _two_cpus() -> tuple[int, int]:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("cpu: needs two CPUs to migrate between")
    return cpus[0], cpus[1]


def _run_mover(probe: MigrationProbe, tag: str) -> tuple[int, int, Snapshot]:
    """(cgroup id, kernel nr_migrations delta, probe interval) around FLIPS self-migrations."""
    first, second = _two_cpus()
    task = python_task("mover", MOVER_CODE, cpu=first, pipes=True)
    task = type(task)("mover", (*task.argv, str(first), str(second), str(FLIPS)), first, True)
    with Workload([task], base=private_base(tag)) as workload:
        process = workload.process("mover")
        assert process.stdin is not None and process.stdout is not None
        _wait_sleeping(process.pid)  # asleep on stdin: it cannot migrate during the read
        kernel_before, before = _nr_migrations(process.pid), probe.read()
        process.stdin.write(b"go\n")
        process.stdin.flush()
        assert select.select([process.stdout], [], [], 10)[0], "mover never finished"
        assert process.stdout.readline() == b"done\n"
        _wait_sleeping(process.pid)
        kernel_after, after = _nr_migrations(process.pid), probe.read()
        return workload.cgroup_id("mover"), kernel_after - kernel_before, after - before


@pytest.fixture(scope="module")
def probe(kernel_ready: None) -> Iterator[MigrationProbe]:
    with MigrationProbe() as attached:
        yield attached


@pytest.fixture(scope="module")
def raw_tp_probe(kernel_ready: None) -> Iterator[MigrationProbe]:
    """The same probe on raw tracepoints: BPF_PROG_TEST_RUN runs raw_tp programs, not tp_btf."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TAILSIGHT_ATTACH_MODE", "raw_tp")
        attached = MigrationProbe()
        attached.attach()
    with attached:
        assert attached.attach_mode == "raw_tp"
        yield attached


# -- without a kernel -----------------------------------------------------------------------------


def test_created_by_name_with_no_arguments() -> None:
    assert isinstance(create_probe("migration"), MigrationProbe)


def test_vmstat_counters_from_a_fake_procfs(tmp_path: Path) -> None:
    (tmp_path / "vmstat").write_text(
        "nr_free_pages 1000\npgmigrate_success 42\npgmigrate_fail 3\nnuma_hit 9\n"
    )
    assert read_vmstat(tmp_path) == {"pgmigrate_success": 42, "pgmigrate_fail": 3}
    assert read_vmstat(tmp_path / "missing") == {}


def test_document_labels_host_counters_as_host_wide() -> None:
    snapshot = Snapshot(
        "migration",
        2,
        {},
        {
            ("task_migrations", labels(cgroup=9)): 4,
            ("host_pgmigrate_success", HOST_LABELS): 11,
        },
    )
    document = snapshot.to_document(1, lambda ids: {i: "/app" for i in ids})
    assert {(c.name, tuple(sorted(c.labels.items())), c.value) for c in document.counters} == {
        ("task_migrations", (("cgroup", "/app"), ("probe", "migration")), 4),
        ("host_pgmigrate_success", (("probe", "migration"), ("scope", "host")), 11),
    }


# -- on the running kernel ------------------------------------------------------------------------


@pytest.mark.kernel
def test_tracepoint_signatures_match_btf(kernel_ready: None) -> None:
    btf = Btf.load()
    for tracepoint, args in expected_tracepoint_args().items():
        assert btf.tracepoint_args(tracepoint) == list(args)


@pytest.mark.kernel
def test_attach_checked_the_cpu_offset(probe: MigrationProbe) -> None:
    assert probe.cpu_offset_verified == (len(os.sched_getaffinity(0)) >= 2)
    assert "sched_migrate_task" in probe.tracepoints
    assert set(probe.program_fds()) == set(probe.tracepoints)


@pytest.mark.kernel
def test_self_migrations_match_nr_migrations(probe: MigrationProbe) -> None:
    cgroup_id, kernel_delta, interval = _run_mover(probe, "mig")
    counted = interval.counters.get(("task_migrations", labels(cgroup=cgroup_id)), 0)
    cross_node = interval.counters.get(("task_migrations_cross_node", labels(cgroup=cgroup_id)), 0)
    assert kernel_delta >= FLIPS
    assert counted == kernel_delta
    first, second = _two_cpus()
    expected_cross = FLIPS if probe.topology.is_cross_node(first, second) else 0
    assert cross_node == expected_cross  # 0 on a one-node machine
    for kind in KINDS[2:]:  # NUMA balancing never acts on a one-node machine / a 2 s run
        assert interval.counters.get((kind, labels(cgroup=cgroup_id)), 0) == 0


@pytest.mark.kernel
def test_cross_node_counts_with_a_synthetic_two_node_map(probe: MigrationProbe) -> None:
    first, second = _two_cpus()
    real = probe.topology
    probe.load_topology(CpuTopology({first: 0, second: 1}))
    try:
        cgroup_id, kernel_delta, interval = _run_mover(probe, "numa")
    finally:
        probe.load_topology(real)
    counted = interval.counters.get(("task_migrations", labels(cgroup=cgroup_id)), 0)
    cross_node = interval.counters.get(("task_migrations_cross_node", labels(cgroup=cgroup_id)), 0)
    # The mover only ever runs on `first` and `second`: every migration crosses the fake nodes.
    assert counted == kernel_delta >= FLIPS
    assert cross_node == counted


@pytest.mark.kernel
def test_forget_clears_the_row_and_gives_the_slot_back(probe: MigrationProbe) -> None:
    cgroup_id, kernel_delta, _ = _run_mover(probe, "forget")
    key = ("task_migrations", labels(cgroup=cgroup_id))
    assert probe.read().counters[key] >= kernel_delta >= FLIPS
    probe.forget({cgroup_id})
    assert key not in probe.read().counters
    slots = probe._bpf[b"migration_slots"]  # the kernel's own slot table
    assert cgroup_id not in {int(key.value) for key in slots}
    # The freed slot serves the next new cgroup, counted from zero: exactly its migrations.
    other_id, other_delta, interval = _run_mover(probe, "after")
    assert interval.counters[("task_migrations", labels(cgroup=other_id))] == other_delta


@pytest.mark.kernel
def test_cgroup_filter_excludes_other_cgroups(probe: MigrationProbe) -> None:
    probe.set_cgroup_filter([1])  # the root cgroup only; the mover lives elsewhere
    try:
        cgroup_id, kernel_delta, interval = _run_mover(probe, "filt")
    finally:
        probe.set_cgroup_filter(None)
    assert kernel_delta >= FLIPS
    assert ("task_migrations", labels(cgroup=cgroup_id)) not in interval.counters


@pytest.mark.kernel
def test_wrong_cpu_offset_refuses_to_attach(kernel_ready: None) -> None:
    _two_cpus()

    pid_offset = Btf.load().member("task_struct", "pid").byte_offset  # a plausible wrong field
    probe = MigrationProbe(task_cpu_offset_override=pid_offset)
    with pytest.raises(OffsetCheckError, match="TASK_CPU_OFF"):
        probe.attach()
    assert probe.tracepoints == ()


@pytest.mark.kernel
def test_host_counters_come_from_vmstat(probe: MigrationProbe) -> None:
    snapshot = probe.read()
    host = {name: value for (name, key), value in snapshot.counters.items() if key == HOST_LABELS}
    assert set(host) == {f"host_{name}" for name in read_vmstat()}
    for name, value in host.items():
        assert value <= read_vmstat()[name.removeprefix("host_")]  # monotonic, read later


@pytest.mark.kernel
@pytest.mark.parametrize(
    ("tracepoint", "args", "counter", "expected"),
    [
        ("sched_move_numa", [0, 0, 1], "numa_task_moves", 1),
        ("sched_swap_numa", [0, 0, 8, 1], "numa_task_swaps", 2),  # both tasks count
        ("sched_swap_numa", [0, 0, 0, 1], "numa_task_swaps", 1),  # no second task
        ("sched_stick_numa", [0, 0, 8, 1], "numa_task_sticks", 1),  # only the stuck task
    ],
)
def test_numa_programs_count_the_right_kind(
    raw_tp_probe: MigrationProbe, tracepoint: str, args: list[int], counter: str, expected: int
) -> None:
    # NUMA balancing never runs on one node, so feed each program synthetic arguments
    # (BPF_PROG_TEST_RUN): task pointers that cannot be read resolve to cgroup id 0.
    probe = raw_tp_probe
    if tracepoint not in probe.tracepoints:
        pytest.skip(f"{tracepoint}: not in this kernel")
    before = probe.read()
    prog_test_run_raw_tp(probe.program_fds()[tracepoint], args)
    interval = probe.read() - before
    zero = labels(cgroup=0)
    changed = {name: n for (name, key), n in interval.counters.items() if key == zero and n}
    assert changed == {counter: expected}
