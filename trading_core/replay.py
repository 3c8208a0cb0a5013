"""Tick replay: an ITCH file driven open loop through exchange -> feed -> book -> decision -> order.

A forked exchange process (in the exchange namespace) publishes the file as MoldUDP64 at the file's
own pace divided by ``speed``: message ``i`` is due at ``t0 + (ts_i - ts_0) / speed`` and goes out
in the first packet sent at or after that instant, however late. The trading side measures every
tick from that *intended* time, so when the pipeline (or the publisher) stalls the backlog shows up
as latency instead of silently delaying later ticks (no coordinated omission). The exchange also
answers re-requests and acknowledges orders (OUCH 5.0 over SoupBinTCP 4.1) on the same veth.
"""

from __future__ import annotations

import bisect
import contextlib
import ctypes
import os
import pickle
import select
import socket
import struct
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from tailsight.histfile import HistDocument
from tailsight.trading_core import itch, ouch, soupbintcp
from tailsight.trading_core.book import Book, TradeEvent
from tailsight.trading_core.moldudp64 import (
    MoldPacket,
    decode_request,
    encode_packet,
    pack_messages,
)
from tailsight.trading_core.netns import Topology, in_netns
from tailsight.trading_core.timing import (
    ACK,
    DECISION,
    ENCODE,
    RECEIVE,
    SEND,
    StageTimer,
    replay_labels,
)

SESSION: Final = "TSREPLAY01"
_PR_SET_TIMERSLACK: Final = 29
_EOS_REPEAT_NS: Final = 20_000_000  # end of session is re-sent until the feed side is done
_HEARTBEAT_NS: Final = 50_000_000  # MoldUDP64 heartbeats while the file is quiet
_LOSS_TABLE: Final = "tailsight_loss"
_MOLD_HEADER_UDP_LENGTH: Final = 28  # UDP header + MoldUDP64 header: heartbeats and end of session


@dataclass(frozen=True)
class ReplayConfig:
    """One replay run: receive path, pace, session, per-run timeout after the last tick."""

    path: str = "afxdp"
    speed: float = 1.0
    session: str = SESSION
    max_payload: int = 1400
    start_delay_ms: float = 50.0
    drain_timeout_s: float = 10.0


@dataclass(frozen=True)
class TickFile:
    """An ITCH file in memory: message bytes and their exchange timestamps (ns since midnight)."""

    messages: list[bytes]
    timestamps_ns: npt.NDArray[np.int64]


@dataclass
class ReplayResult:
    """What one run produced: the result document, the feed's final book, all counters."""

    document: HistDocument
    book: Book
    counters: dict[str, int] = field(default_factory=dict)
    complete: bool = False


def load_ticks(path: str | Path) -> TickFile:
    """Read every message of an ITCH file (plain or gzip) with its 6-byte timestamp."""
    from tailsight.trading_core.itch_file import iter_itch

    messages = [raw for _, raw in iter_itch(path)]
    if not messages:
        raise ValueError(f"{path}: no ITCH messages")
    # Header: type 1, locate 2, tracking 2, timestamp 6 (big-endian) -> bytes 5..10.
    stamps = np.fromiter(
        (int.from_bytes(raw[5:11], "big") for raw in messages), dtype=np.int64, count=len(messages)
    )
    return TickFile(messages, stamps)


def intended_offsets_ns(
    timestamps_ns: npt.NDArray[np.int64], speed: float
) -> npt.NDArray[np.int64]:
    """Due time of each tick after the start, ns; never earlier than the tick before it."""
    if not speed > 0:
        raise ValueError(f"speed must be positive, got {speed}")
    # A feed is sent in sequence order: a timestamp that steps back is due with its predecessor.
    monotone = np.maximum.accumulate(timestamps_ns - timestamps_ns[0])
    return np.asarray(np.round(monotone / speed), dtype=np.int64)


def speed_for_duration(timestamps_ns: npt.NDArray[np.int64], duration_s: float) -> float:
    """The speed that replays the whole file in ``duration_s`` seconds."""
    span_ns = int(timestamps_ns.max() - timestamps_ns[0])
    return max(span_ns / (duration_s * 1e9), 1e-9)


# ------------------------------------------------------------------ loss injection (tests, demos)


def inject_feed_loss(topo: Topology, percent: int) -> None:
    """Drop ``percent`` % of the exchange's feed datagrams that carry messages (nftables numgen).

    The rule sits on the exchange namespace's output hook, before the veth and so before any XDP
    program; the publisher sees each drop as EPERM from send(), which it counts as ground truth.
    """
    if not 0 < percent < 100:
        raise ValueError(f"loss percent must be in 1..99, got {percent}")
    rules = (
        f"table inet {_LOSS_TABLE} {{\n chain output {{\n"
        "  type filter hook output priority 0; policy accept;\n"
        f"  udp dport {topo.feed_port} udp length > {_MOLD_HEADER_UDP_LENGTH} "
        f"numgen random mod 100 < {percent} counter drop\n }}\n}}\n"
    )
    _nft(topo.exchange_ns, ["-f", "-"], rules)


def feed_loss_dropped(topo: Topology) -> int:
    """Packets the loss rule dropped so far (its nftables counter)."""
    listing = _nft(topo.exchange_ns, ["list", "table", "inet", _LOSS_TABLE], "")
    for line in listing.splitlines():
        if "counter packets" in line:
            return int(line.split("counter packets")[1].split()[0])
    return 0


def remove_feed_loss(topo: Topology) -> None:
    with contextlib.suppress(RuntimeError):
        _nft(topo.exchange_ns, ["delete", "table", "inet", _LOSS_TABLE], "")


def _nft(namespace: str, args: list[str], stdin: str) -> str:
    result = subprocess.run(
        ["ip", "netns", "exec", namespace, "nft", *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"nft {' '.join(args)} in {namespace}: {result.stderr.strip()}")
    return result.stdout


# ------------------------------------------------------------------ exchange side (child process)


def _set_timer_slack_ns(slack_ns: int) -> None:
    """Tighter sleeps than the default 50 µs slack: the publisher wakes at the due time."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_TIMERSLACK, slack_ns, 0, 0, 0)


def _read_exact(fd: int, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = os.read(fd, size - len(data))
        if not chunk:
            raise EOFError("pipe closed")
        data += chunk
    return data


class _ReplayExchange:
    """The exchange loop: paced publisher, re-request server, order acknowledgements."""

    def __init__(
        self, topo: Topology, ticks: TickFile, offsets_ns: npt.NDArray[np.int64], cfg: ReplayConfig
    ) -> None:
        self.topo = topo
        self.messages = ticks.messages
        self.offsets = offsets_ns.tolist()
        self.cfg = cfg
        self.publisher = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.publisher.bind((topo.exchange_ip, 0))
        self.publisher.connect((topo.trading_ip, topo.feed_port))
        self.rerequests = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.rerequests.bind((topo.exchange_ip, topo.rerequest_port))
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind((topo.exchange_ip, topo.order_port))
        self.listener.listen(4)
        self.sessions: dict[socket.socket, soupbintcp.SoupFramer] = {}
        self.sent_ns = np.full(len(self.messages), -1, dtype=np.int64)
        self.counters = {
            "exchange_packets": 0,
            "exchange_dropped_packets": 0,
            "exchange_dropped_messages": 0,
            "exchange_refused_packets": 0,
            "exchange_retransmitted_packets": 0,
            "exchange_orders": 0,
            "exchange_max_send_lag_ns": 0,
        }

    def wait_for_start(self, control_fd: int) -> int:
        """Serve order-entry logins until the parent sends t0 (perf_counter_ns)."""
        while True:
            sources: list[int | socket.socket] = [control_fd, self.listener, *self.sessions]
            readable, _, _ = select.select(sources, [], [])
            for source in readable:
                self._serve(source, 0)
            if control_fd in readable:
                (t0_ns,) = struct.unpack("=q", _read_exact(control_fd, 8))
                return int(t0_ns)

    def _serve(self, source: object, next_sequence: int) -> None:
        if source is self.rerequests:
            self._answer_rerequest(next_sequence)
        elif source is self.listener:
            connection, _ = self.listener.accept()
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.sessions[connection] = soupbintcp.SoupFramer()
        elif isinstance(source, socket.socket):
            self._serve_orders(source)

    def run(self, t0_ns: int, control_fd: int) -> None:
        due = [t0_ns + offset for offset in self.offsets]
        count, sent, sequence = len(due), 0, 1
        session, max_payload = self.cfg.session, self.cfg.max_payload
        last_send = t0_ns
        last_eos = 0
        counters = self.counters
        while True:
            now = time.perf_counter_ns()
            if sent < count and due[sent] <= now:
                end = bisect.bisect_right(due, now, sent)
                counters["exchange_max_send_lag_ns"] = max(
                    counters["exchange_max_send_lag_ns"], now - due[sent]
                )
                first = sent
                for packet in pack_messages(
                    session, sequence, self.messages[sent:end], max_payload
                ):
                    carried = int.from_bytes(packet[18:20], "big")
                    # Stamped before send(): on a veth the receiver may run inside that call.
                    self.sent_ns[first : first + carried] = time.perf_counter_ns()
                    self._publish(packet)
                    first += carried
                sequence += end - sent
                sent, last_send = end, now
                continue
            if sent == count:
                if now - last_eos >= _EOS_REPEAT_NS:
                    self._publish(encode_packet(MoldPacket(session, sequence, (), True)))
                    last_eos = now
                wait_ns = _EOS_REPEAT_NS
            else:
                if now - last_send >= _HEARTBEAT_NS:
                    self._publish(encode_packet(MoldPacket(session, sequence, ())))
                    last_send = now
                wait_ns = min(due[sent] - now, _HEARTBEAT_NS)
            sources: list[int | socket.socket] = [
                control_fd,
                self.rerequests,
                self.listener,
                *self.sessions,
            ]
            readable, _, _ = select.select(sources, [], [], wait_ns / 1e9)
            for source in readable:
                self._serve(source, sequence)
            if control_fd in readable:
                return

    def _publish(self, packet: bytes) -> None:
        try:
            self.publisher.send(packet)
            self.counters["exchange_packets"] += 1
        except PermissionError:  # an nftables drop on the output hook
            self.counters["exchange_dropped_packets"] += 1
            self.counters["exchange_dropped_messages"] += int.from_bytes(packet[18:20], "big")
        except ConnectionRefusedError:
            # An ICMP port unreachable for an earlier datagram, reported on this connected
            # socket: the feed side closed while end of session was still being repeated.
            self.counters["exchange_refused_packets"] += 1

    def _answer_rerequest(self, next_sequence: int) -> None:
        data, requester = self.rerequests.recvfrom(65536)
        try:
            request = decode_request(data)
        except ValueError:
            return
        start = request.sequence_number
        count = min(request.count, next_sequence - start)  # only what was published
        if request.session != self.cfg.session or start < 1 or count <= 0:
            return
        messages = self.messages[start - 1 : start - 1 + count]
        for packet in pack_messages(self.cfg.session, start, messages, self.cfg.max_payload):
            self.rerequests.sendto(packet, requester)
            self.counters["exchange_retransmitted_packets"] += 1

    def _serve_orders(self, connection: socket.socket) -> None:
        data = connection.recv(65536)
        if not data:
            del self.sessions[connection]
            connection.close()
            return
        replies: list[soupbintcp.Packet] = []
        for packet in self.sessions[connection].feed(data):
            if isinstance(packet, soupbintcp.LoginRequest):
                replies.append(soupbintcp.LoginAccepted(self.cfg.session, 1))
            elif isinstance(packet, soupbintcp.UnsequencedData):
                order = ouch.decode_inbound(packet.message)
                if isinstance(order, ouch.EnterOrder):
                    self.counters["exchange_orders"] += 1
                    accepted = ouch.OrderAccepted(
                        time.time_ns() % 86_400_000_000_000, order.user_ref_num, order.side,
                        order.quantity, order.symbol, order.price, order.time_in_force,
                        order.display, self.counters["exchange_orders"], order.capacity,
                        order.intermarket_sweep_eligibility, order.cross_type, "L",
                        order.cl_ord_id,
                    )  # fmt: skip
                    replies.append(soupbintcp.SequencedData(ouch.encode(accepted)))
        if replies:
            connection.sendall(b"".join(soupbintcp.encode(reply) for reply in replies))

    def close(self) -> None:
        for connection in self.sessions:
            connection.close()
        for sock in (self.publisher, self.rerequests, self.listener):
            sock.close()


class _ExchangeProcess:
    """The replay exchange forked into the exchange namespace; ``go(t0)``, then ``stop()``."""

    def __init__(
        self, topo: Topology, ticks: TickFile, offsets_ns: npt.NDArray[np.int64], cfg: ReplayConfig
    ) -> None:
        control_r, self._control_w = os.pipe()
        self._report_r, report_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # child: never returns
            os.close(self._control_w)
            os.close(self._report_r)
            status = 0
            try:
                _set_timer_slack_ns(1)
                with in_netns(topo.exchange_ns):
                    exchange = _ReplayExchange(topo, ticks, offsets_ns, cfg)
                os.write(report_w, b"R")
                exchange.run(exchange.wait_for_start(control_r), control_r)
                exchange.close()
                os.write(report_w, pickle.dumps((exchange.counters, exchange.sent_ns)))
            except BaseException as error:
                status = 1
                with contextlib.suppress(OSError):
                    os.write(report_w, b"E" + repr(error).encode()[:4000])
            finally:
                os._exit(status)
        os.close(control_r)
        os.close(report_w)
        ready = os.read(self._report_r, 1)
        if ready != b"R":
            detail = os.read(self._report_r, 4096).decode(errors="replace")
            self._reap()
            raise RuntimeError(f"replay exchange failed to start: {detail or 'died'}")

    def go(self, t0_ns: int) -> None:
        os.write(self._control_w, struct.pack("=q", t0_ns))

    def stop(self) -> tuple[dict[str, int], npt.NDArray[np.int64]]:
        """Stop the exchange: its counters (publisher drops are kernel ground truth) and when
        it actually sent each message (perf_counter_ns, -1 if never)."""
        with contextlib.suppress(OSError):
            os.write(self._control_w, b"S")
            # EOF too: a child still waiting for t0 gives up instead of blocking forever.
            os.close(self._control_w)
        chunks = []
        while chunk := os.read(self._report_r, 1 << 16):
            chunks.append(chunk)
        self._reap()
        payload = b"".join(chunks)
        if not payload or payload.startswith(b"E"):
            raise RuntimeError(f"replay exchange failed: {payload[1:].decode(errors='replace')}")
        counters, sent_ns = pickle.loads(payload)
        return counters, sent_ns

    def _reap(self) -> None:
        for fd in (self._control_w, self._report_r):
            with contextlib.suppress(OSError):
                os.close(fd)
        # The report pipe hit EOF, so the child has exited or is exiting.
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)


# ------------------------------------------------------------------ trading side


class JoinTouchStrategy:
    """Decision stage: when an add opens a new best price level, join it with a 100-share order.

    Deterministic and cheap, so tick-to-trade measures the pipeline, not the strategy. Orders go
    out as OUCH Enter Order in SoupBinTCP unsequenced data; ``user_ref_num`` is the tick's sequence.
    """

    def __init__(self, book: Book, timer: StageTimer, connection: socket.socket) -> None:
        self.book = book
        self.timer = timer
        self.connection = connection
        self.framer = soupbintcp.SoupFramer()
        self.orders = 0
        self.acks = 0

    def on_message(self, sequence: int, message: itch.Message, trade: TradeEvent | None) -> None:
        row = sequence - 1
        timer = self.timer
        order = None
        if type(message) is itch.AddOrder or type(message) is itch.AddOrderMPID:
            symbol = self.book.books.get(message.stock_locate)
            if symbol is not None:
                side = symbol.bids if message.side == "B" else symbol.asks
                level = side.levels.get(message.price)
                if level is not None and len(level.orders) == 1 and side.best() is level:
                    order = message
        if row >= timer.capacity:
            return
        timer.stamps[row, DECISION] = time.perf_counter_ns()
        if order is None:
            return
        enter = ouch.EnterOrder(
            user_ref_num=sequence,
            side=order.side,
            quantity=100,
            symbol=order.stock,
            price=order.price,
            time_in_force="0",  # day
            display="Y",
            capacity="A",
            intermarket_sweep_eligibility="N",
            cross_type="N",
            cl_ord_id=f"T{sequence}",
        )
        wire = soupbintcp.encode(soupbintcp.UnsequencedData(ouch.encode(enter)))
        timer.stamps[row, ENCODE] = time.perf_counter_ns()
        self.connection.send(wire)
        timer.stamps[row, SEND] = time.perf_counter_ns()
        self.orders += 1

    def on_readable(self) -> None:
        """Order-entry socket readable: stamp the ack of every Order Accepted."""
        try:
            data = self.connection.recv(65536)
        except BlockingIOError:
            return
        now = time.perf_counter_ns()
        for packet in self.framer.feed(data):
            if isinstance(packet, soupbintcp.SequencedData):
                reply = ouch.decode_outbound(packet.message)
                if isinstance(reply, ouch.OrderAccepted):
                    row = reply.user_ref_num - 1
                    if 0 <= row < self.timer.capacity:
                        self.timer.stamps[row, ACK] = now
                    self.acks += 1


def _connect_orders(topo: Topology, session: str, timeout_s: float = 5.0) -> socket.socket:
    """SoupBinTCP login to the exchange's order port from the trading namespace."""
    with in_netns(topo.trading_ns):
        connection = socket.create_connection(
            (topo.exchange_ip, topo.order_port), timeout=timeout_s
        )
    connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    connection.sendall(soupbintcp.encode(soupbintcp.LoginRequest("replay", "replay", session, 1)))
    framer = soupbintcp.SoupFramer()
    packets: list[Any] = []
    while not packets:
        data = connection.recv(4096)
        if not data:
            raise RuntimeError("order entry closed during login")
        packets = framer.feed(data)
    if not isinstance(packets[0], soupbintcp.LoginAccepted):
        raise RuntimeError(f"order entry login failed: {packets[0]!r}")
    connection.setblocking(False)
    return connection


def replay_once(ticks: TickFile, topo: Topology, cfg: ReplayConfig) -> ReplayResult:
    """One open-loop run of ``ticks`` through the whole pipeline on ``cfg.path``."""
    from tailsight.trading_core.feed import FeedHandler

    offsets = intended_offsets_ns(ticks.timestamps_ns, cfg.speed)
    timer = StageTimer(len(ticks.messages))
    book = Book()
    exchange = _ExchangeProcess(topo, ticks, offsets, cfg)
    feed: FeedHandler | None = None
    connection: socket.socket | None = None
    try:
        feed = FeedHandler(topo, cfg.path, book=book, timer=timer)
        connection = _connect_orders(topo, cfg.session)
        strategy = JoinTouchStrategy(book, timer, connection)
        feed.on_message = strategy.on_message
        feed.add_reader(connection.fileno(), strategy.on_readable)
        start_wall_ns = time.time_ns()
        t0_ns = time.perf_counter_ns() + int(cfg.start_delay_ms * 1e6)
        np.add(offsets, t0_ns, out=timer.intended_ns)
        exchange.go(t0_ns)
        deadline_ns = int(timer.intended_ns[-1]) + int(cfg.drain_timeout_s * 1e9)
        while time.perf_counter_ns() < deadline_ns:
            if feed.complete and strategy.acks >= strategy.orders:
                break
            feed.poll(5)
        end_wall_ns = time.time_ns()
        complete = feed.complete
        counters = {**feed.counters(), "orders": strategy.orders, "acks": strategy.acks}
        counters["late_ticks_over_1ms"] = int(
            np.count_nonzero(timer.stage_latencies_ns(RECEIVE) > 1_000_000)
        )
        xdp_mode = feed.path.xdp_mode
    except BaseException:
        with contextlib.suppress(Exception):
            exchange.stop()  # the original error matters more than the exchange's view of it
        raise
    finally:
        if connection is not None:
            connection.close()
        if feed is not None:
            feed.close()
    exchange_counters, timer.sent_ns[:] = exchange.stop()
    counters.update(exchange_counters)
    document = timer.document(
        replay_labels(cfg.path, xdp_mode), start_wall_ns, end_wall_ns, counters
    )
    return ReplayResult(document, book, counters, complete)


def replay_runs(
    file: str | Path,
    topo: Topology,
    paths: Sequence[str],
    runs: int,
    speed: float,
    out_dir: Path | None = None,
) -> list[tuple[str, int, ReplayResult]]:
    """``runs`` runs per path, interleaved path by path; each result written to ``out_dir``."""
    ticks = load_ticks(file)
    results = []
    for run in range(runs):
        for path in paths:
            result = replay_once(ticks, topo, ReplayConfig(path=path, speed=speed))
            if out_dir is not None:
                out_dir.mkdir(parents=True, exist_ok=True)
                result.document.write(out_dir / f"replay-{path}-{run:03d}.json")
            results.append((path, run, result))
    return results
