"""The live system: four processes, each in its cgroup and namespace (as the kernel reports it),
trading end to end; everything removed afterwards."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from trading_netns import topo_fixture  # noqa: F401

from tailsight.probes.features import find_cgroup2_mount
from tailsight.trading_core.components import LiveConfig, LiveSystem
from tailsight.trading_core.netns import NETNS_DIR, Topology

pytestmark = pytest.mark.kernel


def _netns_inode(pid: int) -> int:
    return os.stat(f"/proc/{pid}/ns/net").st_ino


def test_components_run_in_their_cgroups_and_namespaces(topo: Topology) -> None:
    base = f"tailsight-test/{os.getpid()}-live"
    config = LiveConfig(messages=8_000, symbols=2, max_packets_per_s=2_000, cgroup_base=base)
    root = find_cgroup2_mount() / base
    with LiveSystem(topo, config) as system:
        children = {child.name: child.pid for child in system.children}
        assert sorted(children) == ["exchange", "feed", "gateway", "strategy"]
        for name, pid in children.items():
            membership = Path(f"/proc/{pid}/cgroup").read_text()  # "0::/<path>" on cgroup v2
            assert f"0::/{base}/{name}\n" in membership, membership
        exchange_ns = os.stat(NETNS_DIR / topo.exchange_ns).st_ino
        trading_ns = os.stat(NETNS_DIR / topo.trading_ns).st_ino
        assert _netns_inode(children["exchange"]) == exchange_ns
        assert _netns_inode(children["feed"]) == trading_ns
        assert _netns_inode(children["gateway"]) == trading_ns
        assert _netns_inode(children["strategy"]) == _netns_inode(os.getpid())  # no network
        time.sleep(1.5)
        assert all(system.alive().values())
    stats = system.exchange_stats
    assert stats["market_messages"] == 8_000
    assert stats["orders"] > 0 and stats["logins"] == 1
    assert not root.exists()
