"""AF_XDP socket + XDP steering on a veth between two namespaces, checked against what was sent
and against the kernel's own view (XDP attach state, socket statistics, steering counters)."""

from __future__ import annotations

import socket
import struct
import subprocess
import time
from collections.abc import Iterator

import pytest

from tailsight.trading_core.afxdp import XDP_MODE, udp_payload
from tailsight.trading_core.feed import AfXdpPath
from tailsight.trading_core.netns import Topology, in_netns, topology, unique_topology

FEED_DATAGRAMS = 1009  # prime: an off-by-one anywhere shows
OTHER_DATAGRAMS = 13


def test_udp_payload_parses_a_hand_built_frame() -> None:
    payload = b"MOLD-PAYLOAD"
    ip = struct.pack(">BBHHHBBH4s4s", 0x45, 0, 20 + 8 + len(payload), 1, 0, 64, 17, 0,
                     bytes([10, 0, 0, 1]), bytes([10, 0, 0, 2]))  # fmt: skip
    udp = struct.pack(">HHHH", 40000, 26400, 8 + len(payload), 0)
    frame = b"\x02" * 6 + b"\x04" * 6 + b"\x08\x00" + ip + udp + payload + b"\x00" * 6  # padding
    assert udp_payload(frame) == payload
    assert udp_payload(frame, 26400) == payload
    assert udp_payload(frame, 26401) is None
    arp = frame[:12] + b"\x08\x06" + frame[14:]
    assert udp_payload(arp) is None


@pytest.fixture(scope="module")
def topo(kernel_ready: None) -> Iterator[Topology]:
    with topology(unique_topology("afxdp")) as up:
        yield up


def _xdp_attached(topo: Topology) -> str:
    out = subprocess.run(
        ["ip", "-n", topo.trading_ns, "-d", "link", "show", topo.trading_if],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return out


RING = 256


@pytest.fixture(scope="module")
def xdp_path(topo: Topology) -> Iterator[AfXdpPath]:
    """One compiled, attached steering program and socket for the module (compiling is slow)."""
    with in_netns(topo.trading_ns):
        path = AfXdpPath(topo.trading_if, topo.feed_port, frames=RING, ring_size=RING)
    try:
        yield path
    finally:
        with in_netns(topo.trading_ns):
            path.detach()
        path.close()
    assert "xdpgeneric" not in _xdp_attached(topo)


@pytest.fixture
def sender(topo: Topology) -> Iterator[socket.socket]:
    with in_netns(topo.exchange_ns):
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    yield sock
    sock.close()


@pytest.mark.kernel
def test_feed_port_goes_to_the_xsk_everything_else_to_the_stack(
    topo: Topology, xdp_path: AfXdpPath, sender: socket.socket
) -> None:
    path = xdp_path
    with in_netns(topo.trading_ns):
        other = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        other.bind((topo.trading_ip, topo.order_port))
    try:
        before = path.counters()
        assert path.xdp_mode == XDP_MODE == "copy/skb"
        assert "xdpgeneric" in _xdp_attached(topo)  # the kernel says: generic (SKB) mode
        sent = [b"tick-%05d" % i + bytes(i % 251) for i in range(FEED_DATAGRAMS)]
        received: list[tuple[bytes, int]] = []
        first_send_ns = time.perf_counter_ns()
        for index, payload in enumerate(sent):
            sender.sendto(payload, (topo.trading_ip, topo.feed_port))
            if index < OTHER_DATAGRAMS:
                sender.sendto(b"other-%d" % index, (topo.trading_ip, topo.order_port))
            if index % 32 == 31:  # stay well within the rings
                received += path.receive()
        deadline = time.monotonic() + 5
        while len(received) < len(sent) and time.monotonic() < deadline:
            received += path.receive()
            time.sleep(0.001)
        drained_ns = time.perf_counter_ns()
        assert [payload for payload, _ in received] == sent  # all, in order, byte for byte
        # The XDP program's bpf_ktime_get_ns, read from each frame's first bytes: the same clock
        # as perf_counter_ns, so it lies between our first send and the drain, in order.
        stamps = [stamp for _, stamp in received]
        assert all(first_send_ns <= s <= drained_ns for s in stamps), stamps[:3]
        assert stamps == sorted(stamps)
        other.settimeout(2)
        assert sorted(other.recv(100) for _ in range(OTHER_DATAGRAMS)) == sorted(
            b"other-%d" % i for i in range(OTHER_DATAGRAMS)
        )
        after = path.counters()
        assert after["xdp_redirected_frames"] - before["xdp_redirected_frames"] == FEED_DATAGRAMS
        assert after["xsk_frames"] - before["xsk_frames"] == FEED_DATAGRAMS
        assert after["xdp_passed_frames"] - before["xdp_passed_frames"] >= OTHER_DATAGRAMS
        assert after["xsk_rx_dropped"] == after["xsk_rx_ring_full"] == 0
        assert after["rx_unstamped"] == 0
    finally:
        other.close()


@pytest.mark.kernel
def test_frames_beyond_the_ring_are_dropped_and_counted_by_the_kernel(
    topo: Topology, xdp_path: AfXdpPath, sender: socket.socket
) -> None:
    # Nobody drains the socket: once the fill ring's chunks are used up the kernel drops, and
    # its socket statistics must account for every frame that did not fit.
    path = xdp_path
    path.receive()
    before = path.xsk.stats()
    total = RING + 37
    for index in range(total):
        sender.sendto(b"x%d" % index, (topo.trading_ip, topo.feed_port))
    time.sleep(0.2)
    stats = path.xsk.stats()
    frames = path.xsk.receive(limit=4 * RING)
    assert [udp_payload(f) for f in frames] == [b"x%d" % i for i in range(RING)]
    dropped = stats.rx_dropped - before.rx_dropped
    assert dropped == total - RING, stats
    # After draining, the recycled chunks take traffic again.
    sender.sendto(b"again", (topo.trading_ip, topo.feed_port))
    time.sleep(0.05)
    assert [udp_payload(f) for f in path.xsk.receive()] == [b"again"]


@pytest.mark.kernel
def test_feed_port_frames_reach_the_stack_intact_when_no_socket_is_bound(
    topo: Topology, xdp_path: AfXdpPath, sender: socket.socket
) -> None:
    """With no socket at the queue the program passes feed frames on to the kernel stack, which
    must get them as they came: the arrival stamp written over their MAC addresses is undone
    (else the stack sees a frame for another host and drops it)."""
    import ctypes as ct

    sockets = xdp_path._bpf[b"feed_sockets"]
    with in_netns(topo.trading_ns):
        plain = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        plain.bind((topo.trading_ip, topo.feed_port))
    del sockets[ct.c_int(0)]
    try:
        before = xdp_path.counters()
        sent = [b"fallback-%d" % i for i in range(OTHER_DATAGRAMS)]
        for payload in sent:
            sender.sendto(payload, (topo.trading_ip, topo.feed_port))
        plain.settimeout(2)
        assert [plain.recv(100) for _ in sent] == sent
        after = xdp_path.counters()
        assert after["xdp_passed_frames"] - before["xdp_passed_frames"] >= len(sent)
        assert after["xdp_redirected_frames"] == before["xdp_redirected_frames"]
    finally:
        sockets[ct.c_int(0)] = ct.c_int(xdp_path.xsk.fd)
        plain.close()
