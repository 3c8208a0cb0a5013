"""Tick replay: an ITCH file driven open loop through exchange -> feed -> book -> decision -> order.

The project's ``Exchange``, forked into its own process (sockets in the exchange namespace),
publishes the file as MoldUDP64 at the file's own pace divided by ``speed``: message ``i`` is due
at ``t0 + round((max(ts_0..ts_i) - ts_0) / speed)`` and goes out in the first packet sent at or
after that instant, however late. Both sides compute that schedule from the same ``t0``; the
trading side measures every tick from its *intended* time, so when the pipeline (or the publisher)
stalls the backlog shows up as latency instead of silently delaying later ticks (no coordinated
omission). The same exchange answers re-requests and matches our OUCH orders.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import pickle
import socket
import struct
import subprocess
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from tailsight.histfile import HistDocument
from tailsight.trading_core import itch, ouch, soupbintcp
from tailsight.trading_core.book import Book, TradeEvent
from tailsight.trading_core.exchange import Exchange
from tailsight.trading_core.gateway import IOC
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
ORDER_USER: Final = "replay"  # the exchange account the replay trades on
ORDER_PASSWORD: Final = "replay"
_PR_SET_TIMERSLACK: Final = 29
# MoldUDP64 heartbeats while the file is quiet, end of session repeated after it (and SoupBinTCP
# server heartbeats): often enough that a lost end of session costs little drain time.
_HEARTBEAT_S: Final = 0.05
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


def _exchange_child(
    topo: Topology, ticks: TickFile, cfg: ReplayConfig, control_fd: int, report_fd: int
) -> bytes:
    """Run the project's ``Exchange`` on the file until told to stop; the pickled report."""
    # Per thread, inherited by threads created later: set before the exchange starts its own.
    _set_timer_slack_ns(1)
    sent_ns = np.full(len(ticks.messages), -1, dtype=np.int64)

    def on_sent(first_sequence: int, count: int, stamp_ns: int) -> None:
        sent_ns[first_sequence - 1 : first_sequence - 1 + count] = stamp_ns

    exchange = Exchange(
        topo,
        ticks.messages,
        session=cfg.session,
        speed=cfg.speed,
        max_payload=cfg.max_payload,
        accounts={ORDER_USER: ORDER_PASSWORD},
        heartbeat_interval_s=_HEARTBEAT_S,
        # The replay client does not heartbeat: its session lasts as long as the run.
        heartbeat_timeout_s=math.inf,
        autostart_market=False,
        on_sent=on_sent,
    ).start()
    try:
        os.write(report_fd, b"R")
        command = os.read(control_fd, 8)  # t0 (one atomic pipe write), or "S"/EOF to give up
        if len(command) == 8:
            (t0_ns,) = struct.unpack("=q", command)
            exchange.start_market(int(t0_ns))
            os.read(control_fd, 1)  # "S" or EOF: stop
    finally:
        exchange.stop()
    counters = {f"exchange_{name}": int(value) for name, value in asdict(exchange.stats).items()}
    return pickle.dumps((counters, sent_ns))


class _ExchangeProcess:
    """The exchange forked into its own process, so its threads never take the trading side's
    GIL; ``go(t0)``, then ``stop()``."""

    def __init__(self, topo: Topology, ticks: TickFile, cfg: ReplayConfig) -> None:
        control_r, self._control_w = os.pipe()
        self._report_r, report_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # child: never returns
            os.close(self._control_w)
            os.close(self._report_r)
            status = 0
            try:
                os.write(report_w, _exchange_child(topo, ticks, cfg, control_r, report_w))
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
        it first sent each message (perf_counter_ns, -1 if never)."""
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
    They are immediate-or-cancel on the bid (ask) side at that bid (ask): they cannot cross a book
    that never crosses, so the exchange cancels them unfilled and publishes nothing of ours, and
    the feed's final book stays the file's.
    """

    def __init__(self, book: Book, timer: StageTimer, connection: socket.socket) -> None:
        self.book = book
        self.timer = timer
        self.connection = connection
        self.framer = soupbintcp.SoupFramer()
        self.orders = 0
        self.acks = 0
        self.rejects = 0

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
            time_in_force=IOC,
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
                elif isinstance(reply, ouch.OrderRejected):
                    self.rejects += 1


def _connect_orders(topo: Topology, session: str, timeout_s: float = 5.0) -> socket.socket:
    """SoupBinTCP login to the exchange's order port from the trading namespace."""
    with in_netns(topo.trading_ns):
        connection = socket.create_connection(
            (topo.exchange_ip, topo.order_port), timeout=timeout_s
        )
    connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    login = soupbintcp.LoginRequest(ORDER_USER, ORDER_PASSWORD, session, 1)
    connection.sendall(soupbintcp.encode(login))
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
    exchange = _ExchangeProcess(topo, ticks, cfg)
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
        counters = {
            **feed.counters(),
            "orders": strategy.orders,
            "acks": strategy.acks,
            "order_rejects": strategy.rejects,
        }
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
    lag_ns, _ = timer.receive_split_ns()
    counters["exchange_max_send_lag_ns"] = int(lag_ns.max()) if lag_ns.size else 0
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
