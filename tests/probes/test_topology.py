"""CPU -> NUMA node map from sysfs trees: synthetic multi-node layouts, the running machine, and
the cross-node rule the migration probe applies."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tailsight.probes.topology import (
    CpuTopology,
    TopologyError,
    parse_cpulist,
    possible_cpu_ids,
)


def _node_tree(root: Path, nodes: dict[int, str], possible: str = "0-7") -> Path:
    base = root / "devices" / "system"
    for node, cpulist in nodes.items():
        (base / "node" / f"node{node}").mkdir(parents=True)
        (base / "node" / f"node{node}" / "cpulist").write_text(cpulist + "\n")
    (base / "node").mkdir(parents=True, exist_ok=True)
    (base / "node" / "online").write_text("0\n")  # not a node directory: ignored
    (base / "cpu").mkdir(parents=True, exist_ok=True)
    (base / "cpu" / "possible").write_text(possible + "\n")
    return root


@pytest.mark.parametrize(
    ("text", "cpus"),
    [
        ("0-3,8,10-11", [0, 1, 2, 3, 8, 10, 11]),
        ("0", [0]),
        ("", []),
        ("\n", []),
        ("5-5", [5]),
    ],
)
def test_parse_cpulist(text: str, cpus: list[int]) -> None:
    assert parse_cpulist(text) == cpus


@pytest.mark.parametrize("text", ["3-1", "a", "1-", "-2", "0-x"])
def test_parse_cpulist_rejects_garbage(text: str) -> None:
    with pytest.raises(TopologyError):
        parse_cpulist(text)


@given(st.sets(st.integers(0, 300), max_size=60), st.booleans())
def test_parse_cpulist_matches_a_naive_encoding(cpus: set[int], as_ranges: bool) -> None:
    ordered = sorted(cpus)
    if as_ranges:  # consecutive runs as "a-b", the way the kernel prints them
        runs = [
            [cpu for _, cpu in group]
            for _, group in itertools.groupby(enumerate(ordered), lambda pair: pair[1] - pair[0])
        ]
        text = ",".join(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]) for run in runs)
    else:
        text = ",".join(map(str, reversed(ordered)))
    assert parse_cpulist(text) == ordered


def test_two_node_tree(tmp_path: Path) -> None:
    root = _node_tree(tmp_path, {0: "0-3", 1: "4-7"})
    topology = CpuTopology.from_sysfs(root)
    assert topology.nodes == [0, 1]
    assert [topology.node_of(cpu) for cpu in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert not topology.is_cross_node(1, 3)
    assert topology.is_cross_node(3, 4)
    assert topology.node_of(99) == 0  # unknown CPUs count as node 0, like the BPF array


def test_interleaved_sparse_nodes(tmp_path: Path) -> None:
    # Node ids need not be dense and CPUs may interleave (SNC / some AMD layouts).
    root = _node_tree(tmp_path, {0: "0,2", 3: "1,3"})
    topology = CpuTopology.from_sysfs(root)
    assert topology.cpu_node == {0: 0, 2: 0, 1: 3, 3: 3}
    assert topology.is_cross_node(0, 1)
    assert not topology.is_cross_node(1, 3)


def test_memory_only_node_has_no_cpus(tmp_path: Path) -> None:
    root = _node_tree(tmp_path, {0: "0-1", 1: ""})  # CXL / HBM node without CPUs
    assert CpuTopology.from_sysfs(root).nodes == [0]


def test_cpu_in_two_nodes_is_an_error(tmp_path: Path) -> None:
    root = _node_tree(tmp_path, {0: "0-2", 1: "2-3"})
    with pytest.raises(TopologyError, match="CPU 2"):
        CpuTopology.from_sysfs(root)


def test_no_numa_support_means_one_node(tmp_path: Path) -> None:
    (tmp_path / "devices" / "system" / "cpu").mkdir(parents=True)
    (tmp_path / "devices" / "system" / "cpu" / "possible").write_text("0-5\n")
    topology = CpuTopology.from_sysfs(tmp_path)
    assert topology.cpu_node == {cpu: 0 for cpu in range(6)}


@pytest.mark.parametrize(("possible", "ids"), [("0\n", 1), ("0-5\n", 6), ("0,2-3,7\n", 8)])
def test_possible_cpu_ids_is_the_highest_possible_cpu_plus_one(
    tmp_path: Path, possible: str, ids: int
) -> None:
    (tmp_path / "devices" / "system" / "cpu").mkdir(parents=True)
    (tmp_path / "devices" / "system" / "cpu" / "possible").write_text(possible)
    assert possible_cpu_ids(tmp_path) == ids


def test_running_machine_bounds_our_cpu_ids() -> None:
    # Ground truth: the CPUs this process may run on, and the kernel's own cpuN directories.
    assert max(os.sched_getaffinity(0)) < possible_cpu_ids()
    cpus = [int(d.name[3:]) for d in Path("/sys/devices/system/cpu").glob("cpu[0-9]*")]
    assert max(cpus) < possible_cpu_ids()


def test_running_machine_covers_our_cpus() -> None:
    topology = CpuTopology.from_sysfs()
    assert set(os.sched_getaffinity(0)) <= set(topology.cpu_node)
    # Ground truth from a second source: each CPU's own node<N> link in its sysfs directory.
    for cpu in os.sched_getaffinity(0):
        links = list(Path(f"/sys/devices/system/cpu/cpu{cpu}").glob("node*"))
        if links:
            assert topology.node_of(cpu) == int(links[0].name[4:])
