"""Tick replay: an ITCH file driven open loop through the real trading system.

exchange -> feed (AF_XDP or UDP) -> L3 book -> ``Strategy`` (risk checks included) -> ``Gateway``
(OUCH 5.0 over SoupBinTCP) -> the exchange's acks and fills, reconciled with the exchange's own
account view after every run.

The project's ``Exchange`` publishes the file as MoldUDP64 at the file's own pace divided by
``speed``: message ``i`` is due at ``t0 + round((max(ts_0..ts_i) - ts_0) / speed)`` and goes out
in the first packet sent at or after that instant, however late. Both sides compute that schedule
from the same ``t0``, so the open-loop tick-to-trade counts from the *intended* time (no
coordinated omission); the in-system series counts from the frame's kernel receive stamp.

A ``ReplaySystem`` is set up once per invocation and runs many times: the exchange and the
trading side are two long-lived processes (the XDP program is compiled once), each run a fresh
exchange session, book, strategy and gateway login. Cgroups: ``<base>/exchange`` holds the
exchange process, ``<base>/trading`` the trading process, whose one thread is the whole
tick-to-trade path: receive, decode, book, strategy, order send, and between ticks the order
session's responses (acks, fills, heartbeats). One thread because that is how tick-to-trade paths
are built and because a second one costs more than it saves here: with the gateway's reader in
its own thread, the two fight for the GIL and in-system P50 is 31 ms instead of tens of µs (a
process hop instead costs two wakeups per tick). A run that fails is reported as
``ReplayRunError`` with its reason; the system restarts what died and the next run goes on.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import math
import os
import signal
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from tailsight.cgroups import find_cgroup2_mount
from tailsight.intervals import Counter, HistDocument, Series
from tailsight.trading_core import ouch
from tailsight.trading_core.book import Book, TopOfBook, TradeEvent
from tailsight.trading_core.components import join_cgroup, remove_cgroup_tree
from tailsight.trading_core.exchange import Exchange
from tailsight.trading_core.feed import AfXdpPath, FeedHandler, open_path
from tailsight.trading_core.gateway import Gateway
from tailsight.trading_core.inference import stage as inference
from tailsight.trading_core.inference.stage import InferenceConfig
from tailsight.trading_core.itch_file import iter_itch
from tailsight.trading_core.netns import Topology, in_netns
from tailsight.trading_core.reconcile import AccountView, diff
from tailsight.trading_core.strategy import DAY, Strategy, StrategyConfig
from tailsight.trading_core.timing import ACK, DECISION, SEND, UNSET, StageTimer, replay_labels

ORDER_USER: Final = "replay"  # the exchange account the replay trades on
ORDER_PASSWORD: Final = "replay"
PLACEMENT_COMPONENTS: Final = ("exchange", "trading")
_PR_SET_TIMERSLACK: Final = 29
_PR_SET_PDEATHSIG: Final = 1
# MoldUDP64 heartbeats while the file is quiet, end of session repeated after it (and SoupBinTCP
# server heartbeats): often enough that a lost end of session costs little drain time.
_HEARTBEAT_S: Final = 0.05
_LOSS_TABLE: Final = "tailsight_loss"
_MOLD_HEADER_UDP_LENGTH: Final = 28  # UDP header + MoldUDP64 header: heartbeats and end of session
_BOOK_UPDATES: Final = frozenset(b"AFECXDU")
# Order responses applied per turn of the loop before it looks at the feed again: a burst of
# acks and cancels (framed and applied: ~20 µs each, measured) makes the next tick wait. One per
# turn: busy polling, 10 runs each, in-system P99 59-79 us against 61-109 us at two (measured on
# this 2-core host).
_RESPONSE_SLICE: Final = 1
_SETUP_TIMEOUT_S: Final = 60.0  # a child's answer to "set up" (the XDP compile is the slow part)


class ReplayRunError(RuntimeError):
    """One run failed; the message is the reason recorded for it."""


@dataclass(frozen=True)
class Placement:
    """CPUs per process (``exchange``, ``trading``); a component not named runs anywhere."""

    cpus: Mapping[str, frozenset[int]] = field(default_factory=dict)

    @classmethod
    def auto(cls) -> Placement:
        """The exchange on the first CPU this process may use, trading alone on the last (none
        on one CPU): unpinned, the scheduler places them anew each run, and the in-system P99
        follows (4 runs each, measured on this 2-core host: P99 336-446 us unpinned, 121-126 us
        pinned)."""
        available = sorted(os.sched_getaffinity(0))
        if len(available) < 2:
            return cls()
        return cls({"exchange": frozenset(available[:1]), "trading": frozenset(available[-1:])})

    @classmethod
    def parse(cls, text: str) -> Placement:
        """``exchange=0,trading=1`` (CPU lists like ``0-1`` or ``0+2`` too); "auto" =
        :meth:`auto`; "" or "none" = unpinned."""
        cpus: dict[str, frozenset[int]] = {}
        if text.strip() == "auto":
            return cls.auto()
        if text.strip() == "none":
            return cls()
        available = os.sched_getaffinity(0)
        for item in filter(None, (part.strip() for part in text.split(","))):
            name, _, value = item.partition("=")
            if name not in PLACEMENT_COMPONENTS or not value:
                raise ValueError(
                    f"placement {item!r}: expected COMPONENT=CPUS with COMPONENT one of "
                    f"{', '.join(PLACEMENT_COMPONENTS)}"
                )
            chosen: set[int] = set()
            for piece in value.split("+"):
                low, _, high = piece.partition("-")
                if not low.isdigit() or (high and not high.isdigit()):
                    raise ValueError(f"placement {item!r}: {piece!r} is not a CPU or range")
                chosen.update(range(int(low), int(high or low) + 1))
            if not chosen <= available:
                raise ValueError(
                    f"placement {item!r}: CPU(s) {sorted(chosen - available)} not available "
                    f"(have {sorted(available)})"
                )
            cpus[name] = frozenset(chosen)
        return cls(cpus)

    def label(self) -> str:
        """What run labels record, e.g. ``exchange=0,trading=1`` (``*`` = unpinned)."""
        return ",".join(
            f"{name}={'+'.join(map(str, sorted(self.cpus[name]))) if name in self.cpus else '*'}"
            for name in PLACEMENT_COMPONENTS
        )

    def pin(self, component: str, tid: int = 0) -> None:
        if component in self.cpus:
            os.sched_setaffinity(tid, self.cpus[component])


@dataclass(frozen=True)
class ReplayConfig:
    """One replay run: receive path, pace, what the strategy does, per-run drain timeout."""

    path: str = "afxdp"
    speed: float = 1.0
    max_payload: int = 1400
    start_delay_ms: float = 50.0
    drain_timeout_s: float = 10.0
    act_share: float = 0.0  # the strategy also acts on this share of all book updates
    inject_delay_us: float = 0.0  # calibration only: busy-wait before each order's send
    inference_model: str | None = None  # a signal stage's model (docs/inference.md); None: off
    # Spin on the feed instead of sleeping in poll(): waking a halted vCPU dominates the
    # in-system P99 otherwise (receive P99 245 -> 81 us unpinned, 4 runs each, measured on this
    # 2-core host).
    busy_poll: bool = False


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
    published: list[bytes] = field(default_factory=list)  # what the exchange sent, in sequence
    reconcile_problems: list[str] = field(default_factory=list)
    timer: StageTimer | None = None  # every tick's stamps, for per-tick breakdowns


def load_ticks(path: str | Path) -> TickFile:
    """Read every message of an ITCH file (plain or gzip) with its 6-byte timestamp."""
    if not Path(path).is_file():
        raise ValueError(f"{path}: not a regular file (a FIFO, device or directory cannot replay)")
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


# ------------------------------------------------------------------ child processes


def _set_timer_slack_ns(slack_ns: int) -> None:
    """Tighter sleeps than the default 50 µs slack: the publisher wakes at the due time."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_TIMERSLACK, slack_ns, 0, 0, 0)


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """No cyclic-GC pause during a run: collections on the tick-to-trade thread took 0.3-7 ms
    here (gc.callbacks over a day's messages and orders), straight into the P99. What set-up
    made is collected and frozen first; in the run, reference counting frees the garbage."""
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.unfreeze()


def _spawn(name: str, cgroup: Path, main: Any) -> tuple[int, Connection]:
    """Fork a long-lived child in ``cgroup`` that serves commands on a socket pair."""
    parent_end, child_end = socket.socketpair()
    pid = os.fork()
    if pid == 0:  # child: never returns
        status = 0
        try:
            parent_end.close()
            ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
            join_cgroup(cgroup)
            main(Connection(child_end.detach()))
        except (EOFError, KeyboardInterrupt, BrokenPipeError):
            pass
        except BaseException:
            status = 1
            sys.stderr.write(f"tailsight replay: {name} failed:\n{traceback.format_exc()}")
        finally:
            sys.stderr.flush()
            os._exit(status)
    child_end.close()
    return pid, Connection(parent_end.detach())


def _serve(connection: Connection, handle: Any) -> None:
    """Answer commands until told to quit; a failed command answers ("error", traceback)."""
    while True:
        command = connection.recv()
        if command[0] == "quit":
            return
        try:
            handle(connection, command)
        except Exception:
            connection.send(("error", traceback.format_exc(limit=8)))


def _exchange_main(
    topo: Topology, ticks: TickFile, placement: Placement, connection: Connection
) -> None:
    # Per thread, inherited by threads created later: set before the exchange starts its own.
    _set_timer_slack_ns(1)
    placement.pin("exchange")
    connection.send(("ready",))

    def handle(connection: Connection, command: tuple[Any, ...]) -> None:
        _, session, speed, max_payload, capacity = command
        sent_ns = np.full(capacity, UNSET, dtype=np.int64)

        def on_sent(first_sequence: int, count: int, stamp_ns: int) -> None:
            sent_ns[first_sequence - 1 : first_sequence - 1 + count] = stamp_ns

        exchange = Exchange(
            topo,
            ticks.messages,
            session=session,
            speed=speed,
            max_payload=max_payload,
            accounts={ORDER_USER: ORDER_PASSWORD},
            heartbeat_interval_s=_HEARTBEAT_S,
            heartbeat_timeout_s=math.inf,  # the run's length bounds the session
            autostart_market=False,
            on_sent=on_sent,
        ).start()
        try:
            with _gc_paused():
                connection.send(("ready",))
                command = connection.recv()
                cpu_started_ns = time.process_time_ns()
                if command[0] == "go":
                    exchange.start_market(int(command[1]))
                    command = connection.recv()  # "stop"
        finally:
            exchange.stop()
        counters = {
            f"exchange_{name}": int(value) for name, value in asdict(exchange.stats).items()
        }
        counters["exchange_cpu_ns"] = time.process_time_ns() - cpu_started_ns
        published = exchange.published()
        connection.send(
            (
                "done",
                counters,
                sent_ns[: len(published)],
                np.asarray(exchange.sources, dtype=np.int64),
                exchange.account_view(ORDER_USER),
                published,
            )
        )

    _serve(connection, handle)


class _TimedSink:
    """The strategy's ``OrderSink``: the real ``Gateway``, stamping the tick being handled.

    ``row`` is the tick (sequence - 1) the strategy is reacting to; its first order stamps
    DECISION (the strategy is done, risk checks passed) and SEND (the gateway's stamp just before
    ``send()``), and that order's Order Accepted stamps ACK.
    """

    def __init__(self, timer: StageTimer) -> None:
        self.timer = timer
        self.gateway: Gateway | None = None
        self.strategy: Strategy | None = None
        self.row = -1
        self.orders = 0
        self.answered = 0
        self.accepted = 0
        self.rejected = 0
        self.cancels = 0
        self.account_query_answered = False
        self._ack_rows: dict[int, int] = {}

    def enter_order(
        self, symbol: str, side: str, price: int, quantity: int, time_in_force: str = DAY
    ) -> int:
        gateway, stamps, row = self.gateway, self.timer.stamps, self.row
        assert gateway is not None
        first = 0 <= row < self.timer.capacity and stamps[row, SEND] == UNSET
        if first:
            stamps[row, DECISION] = time.perf_counter_ns()
        ref = gateway.enter_order(symbol, side, price, quantity, time_in_force)
        if first:
            stamps[row, SEND] = gateway.last_send_ns
            self._ack_rows[ref] = row
        self.orders += 1
        return ref

    def cancel(self, user_ref_num: int, quantity: int = 0) -> None:
        assert self.gateway is not None
        self.gateway.cancel(user_ref_num, quantity)
        self.cancels += 1

    def on_response(self, message: ouch.OutboundMessage) -> None:
        """The order session answered: stamp acks, count answers, pass it on to the strategy."""
        now = time.perf_counter_ns()
        if isinstance(message, ouch.OrderAccepted):
            self.accepted += 1
            self.answered += 1
            row = self._ack_rows.pop(message.user_ref_num, None)
            if row is not None:
                self.timer.stamps[row, ACK] = now
        elif isinstance(message, ouch.OrderRejected):
            self.rejected += 1
            self.answered += 1
        elif isinstance(message, ouch.AccountQueryResponse):
            self.account_query_answered = True
        if self.strategy is not None:
            self.strategy.on_response(message)


class _Driver:
    """Feed callback: after each book update, the strategy sees the symbol's top of book."""

    def __init__(
        self, book: Book, strategy: Strategy, sink: _TimedSink, source: Any = None
    ) -> None:
        self.book = book
        self.strategy = strategy
        self.sink = sink
        self.source = source  # an inference stage's BookSignalSource, or None
        self.last_top: dict[int, TopOfBook] = {}

    def on_update(self, sequence: int, kind: int, locate: int, trade: TradeEvent | None) -> None:
        if kind not in _BOOK_UPDATES or not self.book.market_open:
            return
        top = self.book.top_of_book(locate)
        changed = top != self.last_top.get(locate)
        self.last_top[locate] = top
        self.sink.row = sequence - 1
        self.strategy.on_update(locate, top, changed)
        if self.source is not None:  # after the decision: the order is not kept waiting
            self.source.on_update(locate, changed, trade)


class _TradingSide:
    """The trading process: receive paths opened once, a fresh session per run."""

    def __init__(self, topo: Topology, ticks: TickFile, paths: Sequence[str]) -> None:
        self.topo = topo
        self.ticks = ticks
        self.paths = {name: open_path(name, topo) for name in paths}

    def use_path(self, name: str) -> Any:
        """The path for this run; the XDP program is on the interface only for AF_XDP runs."""
        for other, path in self.paths.items():
            if isinstance(path, AfXdpPath):
                with in_netns(self.topo.trading_ns):
                    path.attach() if other == name else path.detach()
        return self.paths[name]

    def run(self, connection: Connection, command: tuple[Any, ...]) -> None:
        _, session, cfg, capacity = command
        timer = StageTimer(capacity)
        book = Book()
        sink = _TimedSink(timer)
        stage = source = None
        if cfg.inference_model is not None:
            stage = inference.InferenceStage(
                inference.InferenceConfig(model=cfg.inference_model),
                cgroup=inference.sibling_cgroup("inference"),
            ).start()
            source = inference.BookSignalSource(stage, book)
        strategy = Strategy(
            sink,
            book.symbols,
            StrategyConfig(
                act_share=cfg.act_share, inject_delay_ns=round(cfg.inject_delay_us * 1000)
            ),
            signal=stage.hook if stage is not None else None,
        )
        sink.strategy = strategy
        feed = FeedHandler(
            self.topo, self.use_path(cfg.path), book=book, timer=timer, session=session
        )
        gateway = Gateway(
            self.topo,
            ORDER_USER,
            ORDER_PASSWORD,
            on_message=sink.on_response,
            reader_thread=False,
        )
        sink.gateway = gateway
        try:
            gateway.connect()
            feed.add_reader(gateway.fileno(), lambda: gateway.on_readable(_RESPONSE_SLICE))
            feed.on_update = _Driver(book, strategy, sink, source).on_update
            with _gc_paused():
                connection.send(("ready",))
                command = connection.recv()
                if command[0] != "go":
                    raise ReplayRunError("run called off before it started")
                deadline_ns = command[1]
                cpu_started_ns = time.thread_time_ns()
                while time.perf_counter_ns() < deadline_ns:
                    if feed.complete and sink.answered >= sink.orders:
                        break
                    feed.poll(0 if gateway.pending or cfg.busy_poll else 5)
                    gateway.apply_pending(_RESPONSE_SLICE)
                    gateway.service()
            complete = feed.complete and sink.answered >= sink.orders
            cpu_ns = time.thread_time_ns() - cpu_started_ns
            # Account Query is answered after everything sequenced before it: once it is in,
            # our view has every ack and fill the exchange sent, and the two must agree.
            gateway.send_raw(ouch.AccountQueryRequest())
            query_deadline = time.monotonic() + 5.0
            while not sink.account_query_answered and time.monotonic() < query_deadline:
                feed.poll(0 if gateway.pending else 5)
                gateway.apply_pending()
            gateway.logout()
            view = gateway.snapshot()
            counters = {
                **feed.counters(),
                "orders": sink.orders,
                "acks": sink.accepted,
                "order_rejects": sink.rejected,
                "cancels": sink.cancels,
                "gateway_disconnect": int(gateway.disconnect_reason not in ("logout", None)),
                "trading_cpu_ns": cpu_ns,
                **{f"risk_reject_{k}": v for k, v in strategy.risk_rejects.items()},
            }
            extra = (stage.series({}), stage.counters({})) if stage is not None else ([], [])
            connection.send(
                (
                    "done",
                    (timer.stamps, timer.ready_ns),
                    counters,
                    view,
                    book,
                    complete,
                    feed.path.xdp_mode,
                    extra,
                )
            )
        finally:
            if stage is not None:
                stage.close()
            gateway.close()
            feed.close()


def _trading_main(
    topo: Topology,
    ticks: TickFile,
    paths: Sequence[str],
    placement: Placement,
    connection: Connection,
) -> None:
    placement.pin("trading")
    side = _TradingSide(topo, ticks, paths)  # compiles the XDP program: once
    connection.send(("ready",))
    _serve(connection, side.run)


# ------------------------------------------------------------------ the system


class ReplaySystem:
    """Exchange and trading processes set up once; ``run()`` as often as wanted, then close."""

    def __init__(
        self,
        ticks: TickFile,
        topo: Topology,
        paths: Sequence[str] = ("afxdp",),
        placement: Placement = Placement(),
        cgroup_base: str | None = None,
        cgroup_mount: Path | None = None,
    ) -> None:
        self.ticks = ticks
        self.topo = topo
        self.paths = list(paths)
        self.placement = placement
        mount = find_cgroup2_mount() if cgroup_mount is None else cgroup_mount
        self.cgroup_root = mount / (cgroup_base or f"tailsight-replay-{os.getpid()}")
        self._children: dict[str, tuple[int, Connection]] = {}
        self._session = 0

    def __enter__(self) -> ReplaySystem:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def capacity(self) -> int:
        # Our trading adds messages to the stream (resting quotes, fills): room for them.
        return 2 * len(self.ticks.messages) + 100_000

    def _start(self, name: str) -> Connection:
        child = self._children.get(name)
        if child is not None:
            return child[1]
        cgroup = self.cgroup_root / name
        cgroup.mkdir(parents=True, exist_ok=True)
        if name == "exchange":
            topo, ticks, placement = self.topo, self.ticks, self.placement

            def main(connection: Connection) -> None:
                _exchange_main(topo, ticks, placement, connection)
        else:
            topo, ticks, paths, placement = self.topo, self.ticks, self.paths, self.placement

            def main(connection: Connection) -> None:
                _trading_main(topo, ticks, paths, placement, connection)

        pid, connection = _spawn(name, cgroup, main)
        self._children[name] = (pid, connection)
        try:
            _expect(connection, "ready", _SETUP_TIMEOUT_S, f"{name} setup")
        except ReplayRunError:
            self._kill(name)
            raise
        return connection

    def start(self) -> ReplaySystem:
        """Start both processes now (otherwise the first run does)."""
        self._start("exchange")
        self._start("trading")
        return self

    def _kill(self, name: str) -> None:
        child = self._children.pop(name, None)
        if child is None:
            return
        pid, connection = child
        connection.close()
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)

    def close(self) -> None:
        for name in list(self._children):
            pid, connection = self._children[name]
            with contextlib.suppress(OSError):
                connection.send(("quit",))
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                with contextlib.suppress(ChildProcessError):
                    if os.waitpid(pid, os.WNOHANG)[0]:
                        self._children.pop(name)
                        connection.close()
                        break
                time.sleep(0.02)
            else:
                self._kill(name)
        remove_cgroup_tree(self.cgroup_root)

    def run(self, cfg: ReplayConfig) -> ReplayResult:
        """One open-loop run; a failure raises ``ReplayRunError`` (the system stays usable)."""
        if cfg.path not in self.paths:
            raise ValueError(f"path {cfg.path!r} was not set up (have {', '.join(self.paths)})")
        try:
            return self._run(cfg)
        except ReplayRunError:
            raise
        except (OSError, EOFError) as error:
            # A child is gone or wedged: start both afresh for the next run.
            self._kill("exchange")
            self._kill("trading")
            raise ReplayRunError(f"{type(error).__name__}: {error}") from error

    def _run(self, cfg: ReplayConfig) -> ReplayResult:
        ticks = self.ticks
        self._session += 1
        session = f"TSRPL{os.getpid() % 1000:03d}{self._session:02d}"[:10].ljust(10)
        capacity = self.capacity
        exchange = self._start("exchange")
        trading = self._start("trading")
        exchange.send(("run", session, cfg.speed, cfg.max_payload, capacity))
        try:
            _expect(exchange, "ready", _SETUP_TIMEOUT_S, "exchange session start")
            trading.send(("run", session, cfg, capacity))
            try:
                # With a signal stage, "ready" follows its model's load, which has its own bound
                # (a load takes 38-58 s on a busy VM).
                start_timeout_s = _SETUP_TIMEOUT_S
                if cfg.inference_model is not None:
                    start_timeout_s += InferenceConfig(model=cfg.inference_model).load_timeout_s
                _expect(trading, "ready", start_timeout_s, "trading session start")
                offsets = intended_offsets_ns(ticks.timestamps_ns, cfg.speed)
                start_wall_ns = time.time_ns()
                t0_ns = time.perf_counter_ns() + int(cfg.start_delay_ms * 1e6)
                exchange.send(("go", t0_ns))
                last_due_ns = t0_ns + int(offsets[-1])
                trading.send(("go", last_due_ns + int(cfg.drain_timeout_s * 1e9)))
                run_s = float(offsets[-1]) / 1e9 + cfg.start_delay_ms / 1e3
                reply = _expect(trading, "done", run_s + cfg.drain_timeout_s + 30, "trading run")
            except ReplayRunError as error:
                if "no answer" in str(error):
                    self._kill("trading")  # wedged: the next run starts it afresh
                raise
            end_wall_ns = time.time_ns()
        except BaseException:
            self._stop_exchange()
            raise
        exchange_reply = self._stop_exchange()
        _, stamps, counters, view, book, complete, xdp_mode, inference = reply
        _, exchange_counters, sent_ns, sources, exchange_view, published = exchange_reply
        return self._result(
            cfg, stamps, sent_ns, sources, offsets + t0_ns, start_wall_ns, end_wall_ns,
            {**counters, **exchange_counters}, view, exchange_view, book, complete, xdp_mode,
            published, inference,
        )  # fmt: skip

    def _stop_exchange(self) -> tuple[Any, ...]:
        """End the exchange's session; its report (a failure kills it for a fresh start)."""
        if "exchange" not in self._children:
            raise ReplayRunError("the exchange process is gone")
        exchange = self._children["exchange"][1]
        try:
            with contextlib.suppress(OSError):
                exchange.send(("stop",))
            return _expect(exchange, "done", 30, "exchange stop")
        except BaseException:
            self._kill("exchange")
            raise

    def _result(
        self,
        cfg: ReplayConfig,
        stamps: tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]],
        sent_ns: npt.NDArray[np.int64],
        sources: npt.NDArray[np.int64],
        intended_ns: npt.NDArray[np.int64],
        start_wall_ns: int,
        end_wall_ns: int,
        counters: dict[str, int],
        view: AccountView,
        exchange_view: AccountView,
        book: Book,
        complete: bool,
        xdp_mode: str,
        published: list[bytes],
        inference: tuple[list[Series], list[Counter]] = ([], []),
    ) -> ReplayResult:
        # Rows are published sequences; a message our trading caused has no intended time.
        published_count = len(sources)
        timer = StageTimer(published_count)
        timer.stamps[:] = stamps[0][:published_count]
        timer.ready_ns[:] = stamps[1][:published_count]
        timer.sent_ns[:] = sent_ns[:published_count]
        from_file = sources >= 0
        timer.intended_ns[from_file] = intended_ns[sources[from_file]]
        problems = diff(view, exchange_view)
        orders = counters["orders"]
        run_s = max((end_wall_ns - start_wall_ns) / 1e9, 1e-9)
        handling_ns = counters.get("exchange_order_handling_ns", 0)
        counters.update(
            reconcile_differences=len(problems),
            published_from_file=int(from_file.sum()),
            fills=len(view.fills),
            orders_per_s=round(orders / run_s),
            exchange_order_capacity_per_s=(
                round(counters["exchange_orders"] * 1e9 / handling_ns) if handling_ns else 0
            ),
            inject_delay_ns=round(cfg.inject_delay_us * 1000),
            act_share_ppm=round(cfg.act_share * 1e6),
        )
        lag = timer.sent_ns[from_file] - timer.intended_ns[from_file]
        known = lag[timer.sent_ns[from_file] != UNSET]
        counters["exchange_max_send_lag_ns"] = int(known.max()) if known.size else 0
        labels = replay_labels(cfg.path, xdp_mode, self.placement.label())
        document = timer.document(labels, start_wall_ns, end_wall_ns, counters)
        # The inference stage's series and counters (its model and runtime in their labels).
        document.series += [Series({**labels, **s.labels}, s.hist) for s in inference[0]]
        document.counters += [
            Counter(c.name, {**labels, **c.labels}, c.value) for c in inference[1]
        ]
        return ReplayResult(document, book, counters, complete, published, problems, timer)


def _expect(connection: Connection, kind: str, timeout_s: float, what: str) -> tuple[Any, ...]:
    """The child's next reply, which must be ``kind``; anything else is a failed run."""
    if not connection.poll(timeout_s):
        raise ReplayRunError(f"{what}: no answer within {timeout_s:.0f} s")
    reply = connection.recv()
    if reply[0] == "error":
        raise ReplayRunError(f"{what} failed: {reply[1].strip().splitlines()[-1]}")
    if reply[0] != kind:
        raise ReplayRunError(f"{what}: unexpected reply {reply[0]!r}")
    return tuple(reply)


def iter_runs(
    system: ReplaySystem, runs: int, paths: Sequence[str], cfg: ReplayConfig
) -> Iterator[tuple[int, str, ReplayResult | ReplayRunError]]:
    """``runs`` runs per path, interleaved path by path; a failed run yields its error."""
    from dataclasses import replace

    for run in range(runs):
        for path in paths:
            try:
                yield run, path, system.run(replace(cfg, path=path))
            except ReplayRunError as error:
                yield run, path, error
