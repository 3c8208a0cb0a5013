"""Fixtures for tests that need the two-namespace topology: unique names, always torn down."""

from __future__ import annotations

import itertools
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest

from tailsight.trading_core.moldudp64 import (
    MoldReceiver,
    MoldRequest,
    decode_packet,
    encode_request,
)
from tailsight.trading_core.netns import Topology, in_netns, topology, unique_topology

_counter = itertools.count()


def require_netns() -> None:
    """Skip (failing under TAILSIGHT_REQUIRE_KERNEL=1 via the kernel marker) without the tools."""
    import os

    if os.geteuid() != 0:
        pytest.skip("kernel: network namespaces need root (CAP_NET_ADMIN, CAP_SYS_ADMIN)")
    if shutil.which("ip") is None:
        pytest.skip("kernel: iproute2 `ip` not found")
    try:
        import pyroute2  # noqa: F401
    except ImportError as error:
        pytest.skip(f"kernel: pyroute2 not importable ({error})")


@pytest.fixture(name="topo")
def topo_fixture() -> Iterator[Topology]:
    """A fresh topology named after our pid and a counter; removed whatever the test does."""
    require_netns()
    with topology(unique_topology(f"t{next(_counter)}")) as topo:
        yield topo


def udp_socket(netns: str, bind: tuple[str, int] | None = None) -> socket.socket:
    with in_netns(netns):
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        if bind is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
            sock.bind(bind)
    return sock


def drop_every_nth(netns: str, port: int, n: int) -> None:
    """Real packet loss: nftables in ``netns`` drops every n-th UDP datagram to ``port``."""
    rules = (
        "table ip tsloss {\n chain input {\n type filter hook input priority 0; policy accept;\n"
        f" udp dport {port} numgen inc mod {n} == 0 counter drop\n }}\n}}\n"
    )
    subprocess.run(
        ["ip", "netns", "exec", netns, "nft", "-f", "-"], input=rules, text=True, check=True
    )


def dropped_packets(netns: str) -> int:
    out = subprocess.run(
        ["ip", "netns", "exec", netns, "nft", "list", "table", "ip", "tsloss"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return int(out.split("counter packets ")[1].split()[0])


class FeedListener:
    """A plain MoldUDP64 receiver in the trading namespace: re-requests gaps, runs a callback."""

    def __init__(self, topo: Topology, on_message=None) -> None:  # type: ignore[no-untyped-def]
        self.topo = topo
        self.receiver = MoldReceiver()
        self.messages: list[bytes] = []
        self.packets = 0
        self.heartbeats: list[int] = []  # next-sequence numbers they announced
        self.requests = 0
        self.on_message = on_message
        self.sock = udp_socket(topo.trading_ns, (topo.trading_ip, topo.feed_port))
        self.sock.settimeout(0.05)
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> FeedListener:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self.thread.join(5)
        self.sock.close()

    def wait_complete(self, timeout_s: float = 20.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not self.receiver.complete:
            time.sleep(0.01)
        return self.receiver.complete

    def _request(self, start: int, count: int) -> None:
        assert self.receiver.session is not None
        request = encode_request(MoldRequest(self.receiver.session, start, count))
        # Requests go from the same socket, so retransmissions come back to it.
        self.sock.sendto(request, (self.topo.exchange_ip, self.topo.rerequest_port))
        self.requests += 1

    def _run(self) -> None:
        last_request = 0.0
        while not self._stop.is_set():
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                gap = self.receiver.gap()
                if gap is not None:
                    self._request(*gap)
                continue
            packet = decode_packet(data)
            self.packets += 1
            if packet.is_heartbeat:
                self.heartbeats.append(packet.sequence_number)
            delivery = self.receiver.on_packet(packet)
            for _, message in delivery.messages:
                self.messages.append(message)
                if self.on_message is not None:
                    self.on_message(message)
            now = time.monotonic()
            if delivery.request is not None and now - last_request > 0.02:
                last_request = now
                self._request(delivery.request.sequence_number, delivery.request.count)
