"""CPU -> NUMA node map, read from sysfs (``<root>/devices/system/node/node*/cpulist``).

The migration probe loads it into a BPF array to tell cross-node migrations from cross-CPU ones.
The sysfs root is a parameter so tests can build synthetic multi-node trees.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

DEFAULT_SYSFS_ROOT: Final = Path("/sys")
_NODE_DIR: Final = re.compile(r"node(\d+)")


class TopologyError(ValueError):
    """A cpulist could not be parsed, or a CPU is claimed by two nodes."""


def parse_cpulist(text: str) -> list[int]:
    """CPUs of a kernel cpulist such as ``"0-3,8,10-11"`` (empty text: none), sorted."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        first, dash, last = part.partition("-")
        try:
            low = int(first)
            high = int(last) if dash else low
        except ValueError as error:
            raise TopologyError(f"bad cpulist entry {part!r} in {text!r}") from error
        if low < 0 or high < low:
            raise TopologyError(f"bad cpulist range {part!r} in {text!r}")
        cpus.update(range(low, high + 1))
    return sorted(cpus)


def possible_cpu_ids(root: Path | str = DEFAULT_SYSFS_ROOT) -> int:
    """How many CPU ids the kernel may use (``nr_cpu_ids``: the highest possible CPU + 1), which
    bounds ``bpf_get_smp_processor_id()``."""
    possible = Path(root) / "devices" / "system" / "cpu" / "possible"
    return max(parse_cpulist(possible.read_text(encoding="ascii")), default=0) + 1


@dataclass(frozen=True)
class CpuTopology:
    """Which NUMA node each CPU belongs to; a CPU not in the map counts as node 0."""

    cpu_node: Mapping[int, int]

    @classmethod
    def single_node(cls, cpus: int) -> CpuTopology:
        """Every CPU on node 0 (a kernel without NUMA support exposes no node directories)."""
        return cls({cpu: 0 for cpu in range(cpus)})

    @classmethod
    def from_sysfs(cls, root: Path | str = DEFAULT_SYSFS_ROOT) -> CpuTopology:
        """Read ``<root>/devices/system/node/node<N>/cpulist``; no node dirs -> one node."""
        node_root = Path(root) / "devices" / "system" / "node"
        cpu_node: dict[int, int] = {}
        node_dirs = sorted(node_root.glob("node*")) if node_root.is_dir() else []
        for node_dir in node_dirs:
            match = _NODE_DIR.fullmatch(node_dir.name)
            if match is None or not (node_dir / "cpulist").is_file():
                continue
            node = int(match.group(1))
            for cpu in parse_cpulist((node_dir / "cpulist").read_text(encoding="ascii")):
                if cpu in cpu_node and cpu_node[cpu] != node:
                    raise TopologyError(f"CPU {cpu} listed in node{cpu_node[cpu]} and node{node}")
                cpu_node[cpu] = node
        if not cpu_node:
            possible = Path(root) / "devices" / "system" / "cpu" / "possible"
            text = possible.read_text(encoding="ascii") if possible.is_file() else "0"
            return cls({cpu: 0 for cpu in parse_cpulist(text)})
        return cls(cpu_node)

    def node_of(self, cpu: int) -> int:
        return self.cpu_node.get(cpu, 0)

    @property
    def nodes(self) -> list[int]:
        return sorted(set(self.cpu_node.values()))

    def is_cross_node(self, src_cpu: int, dst_cpu: int) -> bool:
        """The rule migration.bpf.c applies: the two CPUs sit on different nodes."""
        return self.node_of(src_cpu) != self.node_of(dst_cpu)
