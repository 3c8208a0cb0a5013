"""Topology: namespaces, veth, addresses (checked with iproute2), idempotence, cleanup, setns."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading

import pytest
from trading_netns import require_netns, topo_fixture, udp_socket  # noqa: F401

from tailsight.trading_core import netns
from tailsight.trading_core.netns import Topology

pytestmark = pytest.mark.kernel


def _addresses(ns: str) -> dict[str, tuple[bool, list[str]]]:
    out = subprocess.run(["ip", "-n", ns, "-j", "addr"], capture_output=True, text=True, check=True)
    return {
        link["ifname"]: (
            "UP" in link["flags"],  # operstate follows the carrier asynchronously (linkwatch)
            [f"{a['local']}/{a['prefixlen']}" for a in link["addr_info"] if a["family"] == "inet"],
        )
        for link in json.loads(out.stdout)
    }


def test_up_creates_veth_with_private_addresses(topo: Topology) -> None:
    ex = _addresses(topo.exchange_ns)
    tr = _addresses(topo.trading_ns)
    assert ex[topo.exchange_if][1] == [f"{topo.exchange_ip}/30"]
    assert tr[topo.trading_if][1] == [f"{topo.trading_ip}/30"]
    assert ex[topo.exchange_if][0] and tr[topo.trading_if][0] and ex["lo"][0] and tr["lo"][0]
    assert ex["lo"][1] == ["127.0.0.1/8"] and tr["lo"][1] == ["127.0.0.1/8"]
    # Nothing leaks to the host namespace.
    host = subprocess.run(["ip", "-j", "addr"], capture_output=True, text=True, check=True).stdout
    assert topo.exchange_ip not in host and topo.trading_ip not in host


def test_up_is_idempotent_and_down_removes_everything(topo: Topology) -> None:
    assert netns.up(topo) == topo
    assert netns.up(topo) == topo
    assert _addresses(topo.exchange_ns)[topo.exchange_if][1] == [f"{topo.exchange_ip}/30"]
    netns.down(topo)
    netns.down(topo)
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert topo.exchange_ns not in listed and topo.trading_ns not in listed


def test_up_repairs_half_a_topology(topo: Topology) -> None:
    subprocess.run(["ip", "-n", topo.exchange_ns, "link", "del", topo.exchange_if], check=True)
    assert topo.trading_if not in _addresses(topo.trading_ns)  # a veth dies with its peer
    netns.up(topo)
    assert _addresses(topo.trading_ns)[topo.trading_if][1] == [f"{topo.trading_ip}/30"]


def test_udp_crosses_the_veth_between_namespaces(topo: Topology) -> None:
    receiver = udp_socket(topo.trading_ns, (topo.trading_ip, topo.feed_port))
    sender = udp_socket(topo.exchange_ns)
    try:
        receiver.settimeout(2)
        sender.sendto(b"tick", (topo.trading_ip, topo.feed_port))
        data, (source, _) = receiver.recvfrom(64)
        assert (data, source) == (b"tick", topo.exchange_ip)
    finally:
        receiver.close()
        sender.close()


def test_in_netns_is_per_thread_and_restores(topo: Topology) -> None:
    before = os.readlink("/proc/thread-self/ns/net")
    seen_by_other_thread: list[str] = []
    entered = threading.Event()

    def look() -> None:
        entered.wait(5)
        seen_by_other_thread.append(os.readlink("/proc/thread-self/ns/net"))

    other = threading.Thread(target=look)  # started before: it keeps its namespace
    other.start()
    with netns.in_netns(topo.exchange_ns):
        inside = os.readlink("/proc/thread-self/ns/net")
        entered.set()
        other.join()
    assert seen_by_other_thread == [before]
    assert os.readlink("/proc/thread-self/ns/net") == before
    assert inside != before
    assert inside == f"net:[{os.stat(netns.NETNS_DIR / topo.exchange_ns).st_ino}]"


def _interfaces() -> list[str]:
    return (
        sorted(socket.if_nameindex_names())
        if hasattr(socket, "if_nameindex_names")
        else sorted(name for _, name in socket.if_nameindex())
    )


def test_run_in_netns_returns_results_and_raises_errors(topo: Topology) -> None:
    names = netns.run_in_netns(topo.trading_ns, _interfaces)
    assert names == sorted(["lo", topo.trading_if])
    with pytest.raises(ZeroDivisionError):
        netns.run_in_netns(topo.trading_ns, lambda: 1 // 0)
    assert topo.trading_if not in _interfaces()  # the parent never changed namespace


def test_cleanup_removes_namespaces_by_prefix() -> None:
    require_netns()
    prefix = f"ts-cl{os.getpid()}"
    mine = Topology(exchange_ns=f"{prefix}-ex", trading_ns=f"{prefix}-tr")
    try:
        netns.up(mine)
        removed = netns.cleanup(prefix)
        assert sorted(removed) == [f"netns {prefix}-ex", f"netns {prefix}-tr"]
        assert netns.list_namespaces(prefix) == []
    finally:
        netns.down(mine)


def test_topology_validates_names() -> None:
    with pytest.raises(ValueError, match="start with"):
        Topology(exchange_ns="exchange")
    with pytest.raises(ValueError, match="15 bytes"):
        Topology(exchange_if="ts-an-interface-name")
