"""Feed handler on both receive paths: a generated day with deliberately missing packets must be
re-requested and end in the same book as decoding the file directly."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from feed_helpers import book_state, reference_book

from tailsight.trading_core import itch
from tailsight.trading_core.exchange import Exchange
from tailsight.trading_core.feed import FeedHandler, UdpPath
from tailsight.trading_core.itch_file import iter_itch
from tailsight.trading_core.market import write_day
from tailsight.trading_core.moldudp64 import (
    MoldPacket,
    decode_packet,
    decode_request,
    encode_packet,
    pack_messages,
)
from tailsight.trading_core.netns import Topology, in_netns, topology, unique_topology
from tailsight.trading_core.timing import IN_SYSTEM, QUEUE, RECEIVE, StageTimer

SESSION = "TSFEEDTEST"
# Packet indices the "exchange" never sends: four separate gaps, one of them five packets long.
SKIPPED = {10, 11, 50, 200, 201, 202, 203, 204, 377}
SKIPPED_RUNS = 4


@pytest.fixture(scope="module")
def day(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("feed") / "day.itch"
    write_day(path, seed=11, symbols=6, messages=3001)
    return path


@pytest.fixture(scope="module")
def topo(kernel_ready: None) -> Iterator[Topology]:
    with topology(unique_topology("feed")) as up:
        yield up


@pytest.mark.kernel
def test_udp_path_drains_every_datagram_in_batches(topo: Topology) -> None:
    count = 1009
    with in_netns(topo.trading_ns):
        path = UdpPath(topo.trading_ip, topo.feed_port, batch=64)
    with in_netns(topo.exchange_ns):
        sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sent = [b"d%04d" % i + bytes(i % 97) for i in range(count)]
        first_send_ns = time.perf_counter_ns()
        for payload in sent:
            sender.sendto(payload, (topo.trading_ip, topo.feed_port))
        received: list[tuple[bytes, int]] = []
        deadline = time.monotonic() + 5
        while len(received) < count and time.monotonic() < deadline:
            received += path.receive()
        drained_ns = time.perf_counter_ns()
        assert [payload for payload, _ in received] == sent
        # SO_TIMESTAMPNS, moved onto the monotonic clock: between our first send and the
        # drain (100 µs of slack for reading two clocks one after the other).
        stamps = [stamp for _, stamp in received]
        assert all(first_send_ns - 100_000 <= s <= drained_ns for s in stamps), stamps[:3]
        counters = path.counters()
        assert counters["udp_datagrams"] == count
        assert counters["udp_recvmmsg_calls"] < count // 8  # batched, not one per datagram
        assert counters["rx_unstamped"] == 0
    finally:
        path.close()
        sender.close()


@pytest.mark.kernel
@pytest.mark.parametrize("path", ["udp", "afxdp"])
def test_gaps_are_rerequested_and_the_book_matches_the_file(
    topo: Topology, day: Path, path: str
) -> None:
    messages = [raw for _, raw in iter_itch(day)]
    packets = pack_messages(SESSION, 1, messages, 200)  # ~6 messages a packet
    packets.append(encode_packet(MoldPacket(SESSION, len(messages) + 1, (), end_of_session=True)))
    missing = sum(len(decode_packet(packets[i]).messages) for i in SKIPPED)
    with in_netns(topo.exchange_ns):
        publisher = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        rerequests = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        rerequests.bind((topo.exchange_ip, topo.rerequest_port))
    rerequests.setblocking(False)
    answered = 0

    def serve_rerequests() -> None:
        nonlocal answered
        while True:
            try:
                data, requester = rerequests.recvfrom(100)
            except BlockingIOError:
                return
            request = decode_request(data)
            start = request.sequence_number
            for packet in pack_messages(
                SESSION, start, messages[start - 1 : start - 1 + request.count], 200
            ):
                rerequests.sendto(packet, requester)
            answered += 1

    feed = FeedHandler(topo, path, rerequest_timeout_ms=50)
    try:
        for index, packet in enumerate(packets):
            if index not in SKIPPED:
                publisher.sendto(packet, (topo.trading_ip, topo.feed_port))
            if index % 16 == 15:
                feed.poll(0)
                serve_rerequests()
        deadline = time.monotonic() + 10
        while not feed.complete and time.monotonic() < deadline:
            feed.poll(2)
            serve_rerequests()
        assert feed.complete
        counters = feed.counters()
        assert counters["messages"] == len(messages)
        assert counters["gaps_detected"] == SKIPPED_RUNS
        assert counters["missing_detected"] == counters["recovered_messages"] == missing
        assert counters["rerequests_sent"] >= SKIPPED_RUNS
        assert answered >= SKIPPED_RUNS
        assert book_state(feed.book) == book_state(reference_book(day))
        assert feed.book.errors == reference_book(day).errors
    finally:
        feed.close()
        publisher.close()
        rerequests.close()


@pytest.mark.kernel
@pytest.mark.parametrize("path", ["udp", "afxdp"])
def test_exchange_simulator_feed_builds_the_file_book(topo: Topology, day: Path, path: str) -> None:
    # The exchange simulator (helper J's) replaying the file as fast as it may: the feed handler
    # must see its whole session, including its end, and hold the file's book.
    feed = FeedHandler(topo, path)
    exchange = Exchange(topo, day, max_packets_per_s=20_000, heartbeat_interval_s=0.05)
    try:
        exchange.start()
        assert feed.run_until_complete(timeout_s=20)
        assert exchange.market_error is None
        assert feed.counters()["messages"] == sum(1 for _ in iter_itch(day))
        assert book_state(feed.book) == book_state(reference_book(day))
    finally:
        exchange.stop()
        feed.close()


@pytest.mark.kernel
def test_a_message_waiting_behind_an_earlier_one_is_queued_not_in_system(topo: Topology) -> None:
    """The second message of a packet is not charged the first one's handling in in-system
    tick-to-trade: a 300 µs first message (busy-waited in the callback, its end
    stamped here as ground truth) shows up as the second one's ``queue``, not its in-system."""
    packets = 5
    messages = [itch.encode(itch.SystemEvent(0, 0, index, "O")) for index in range(2 * packets)]
    timer = StageTimer(len(messages))
    handled_until: dict[int, int] = {}

    def on_message(sequence: int, message: object, trade: object) -> None:
        if sequence % 2 == 1:  # the first message of its packet
            until = time.perf_counter_ns() + 300_000
            while time.perf_counter_ns() < until:
                pass
        handled_until[sequence] = time.perf_counter_ns()

    with in_netns(topo.exchange_ns):
        publisher = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    feed = FeedHandler(topo, "udp", timer=timer, on_message=on_message)
    try:
        for first in range(1, len(messages), 2):
            (packet,) = pack_messages(SESSION, first, messages[first - 1 : first + 1])
            publisher.sendto(packet, (topo.trading_ip, topo.feed_port))
            deadline = time.monotonic() + 5
            while len(handled_until) < first + 1 and time.monotonic() < deadline:
                feed.poll(5)
        assert len(handled_until) == len(messages)
        for second in range(2, len(messages) + 1, 2):
            row = second - 1
            # Ready once the first was done (our own stamp says when that was), never before.
            assert timer.ready_ns[row] >= handled_until[second - 1]
        queue, in_system = timer.latencies_ns(QUEUE), timer.latencies_ns(IN_SYSTEM)
        assert min(queue[1::2]) >= 300_000, queue
        assert in_system.size == 0  # no orders here: the per-message spans are what is checked
        receive = timer.stamps[1::2, RECEIVE] - timer.ready_ns[1::2]
        assert (receive >= 0).all() and (receive < 300_000).all(), receive
    finally:
        feed.close()
        publisher.close()
