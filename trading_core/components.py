"""The live trading system as four processes, each in its own cgroup v2 and network namespace.

``exchange`` (exchange namespace) replays a market; ``feed`` (K's ``FeedHandler``, UDP path by
default) builds the book and sends top-of-book events to ``strategy``, which sends order intents
to ``gateway`` (the OUCH session) and gets its responses back. Processes talk over AF_UNIX
SOCK_SEQPACKET pairs made before the fork (AF_UNIX ignores network namespaces). Cgroups are
``<cgroup2 mount>/<base>/<component>`` (base "tailsight"), so probes attribute time by component.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import pickle
import select
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from tailsight.cgroups import find_cgroup2_mount
from tailsight.trading_core import ouch
from tailsight.trading_core.book import Book, TopOfBook
from tailsight.trading_core.exchange import Exchange
from tailsight.trading_core.feed import FeedHandler
from tailsight.trading_core.gateway import Gateway
from tailsight.trading_core.market import generate_day
from tailsight.trading_core.netns import Topology, in_netns
from tailsight.trading_core.strategy import Strategy

__all__ = [
    "BASE_CGROUP",
    "COMPONENTS",
    "LiveConfig",
    "LiveSystem",
    "cgroup_dir",
    "join_cgroup",
    "remove_cgroup_tree",
    "remove_cgroups",
]

BASE_CGROUP: Final = "tailsight"
COMPONENTS: Final = ("exchange", "feed", "strategy", "gateway")
_PR_SET_PDEATHSIG: Final = 1


def _mount(mount: Path | None) -> Path:
    if mount is not None:
        return mount

    return find_cgroup2_mount()


def cgroup_dir(component: str, base: str = BASE_CGROUP, mount: Path | None = None) -> Path:
    """Create (if needed) and return ``<mount>/<base>/<component>``."""
    directory = _mount(mount) / base.strip("/") / component
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def join_cgroup(directory: Path, pid: int = 0) -> None:
    """Move ``pid`` (0 = the calling process) into the cgroup."""
    (directory / "cgroup.procs").write_text(f"{pid}\n")


def remove_cgroup_tree(root: Path) -> list[str]:
    """Remove ``root`` and every cgroup below it, deepest first; returns what was removed."""
    if not root.is_dir():
        return []
    directories = sorted(
        (p for p in root.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True
    )
    return [str(d) for d in [*directories, root] if _rmdir_retrying(d)]


def remove_cgroups(base: str = BASE_CGROUP, mount: Path | None = None) -> list[str]:
    """Remove the component cgroups under ``base`` (and ``base``); returns what was removed.

    A cgroup still holding processes (a component that is still running) is left in place.
    """
    root = _mount(mount) / base.strip("/")
    removed: list[str] = []
    if not root.is_dir():
        return removed
    for directory in sorted((p for p in root.iterdir() if p.is_dir()), reverse=True):
        if _rmdir_retrying(directory):
            removed.append(str(directory))
    if _rmdir_retrying(root):
        removed.append(str(root))
    return removed


def _rmdir_retrying(directory: Path, timeout_s: float = 2.0) -> bool:
    # A reaped task leaves its cgroup asynchronously: rmdir reports EBUSY for a moment.
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            directory.rmdir()
            return True
        except FileNotFoundError:
            return False
        except OSError as error:
            if error.errno != errno.EBUSY or time.monotonic() > deadline:
                return False
            time.sleep(0.01)


@dataclass(frozen=True)
class LiveConfig:
    """What the live system trades: a generated day (seed, symbols, messages) or an ITCH file."""

    itch_file: str | None = None
    seed: int = 1
    symbols: int = 4
    messages: int = 200_000
    speed: float | None = None  # file time / speed; None = as fast as max_packets_per_s
    max_packets_per_s: float | None = 2_000.0
    feed_path: str = "udp"
    username: str = "TS0001"
    password: str = "tailsight"
    cgroup_base: str = BASE_CGROUP


@dataclass
class _Child:
    name: str
    pid: int
    cgroup: Path | None


def _send(sock: socket.socket, item: object) -> None:
    with contextlib.suppress(OSError):
        sock.send(pickle.dumps(item))


def _recv(sock: socket.socket) -> Any:
    data = sock.recv(65536)
    if not data:
        raise EOFError
    return pickle.loads(data)


def _exchange_main(topo: Topology, config: LiveConfig, control: socket.socket) -> None:
    market: Any
    if config.itch_file is not None:
        market = config.itch_file
    else:
        market = generate_day(config.seed, config.symbols, config.messages)
    exchange = Exchange(
        topo,
        market,
        speed=config.speed,
        max_packets_per_s=config.max_packets_per_s,
        accounts={config.username: config.password},
        end_session_when_done=False,
    )
    exchange.start()
    try:
        control.recv(1)  # the parent writes or closes: time to stop
    finally:
        exchange.stop()
        _send(control, ("exchange", exchange.stats.__dict__))


def _feed_main(topo: Topology, config: LiveConfig, to_strategy: socket.socket) -> None:
    book = Book()
    directory_sent: set[int] = set()

    def on_message(sequence: int, message: Any, trade: Any) -> None:
        locate = message.stock_locate
        if locate not in directory_sent and locate in book.symbols:
            directory_sent.add(locate)
            _send(to_strategy, ("symbol", locate, book.symbols[locate]))
        if book.market_open and message.message_type in b"AFECXDU":
            _send(to_strategy, ("top", locate, tuple(book.top_of_book(locate))))

    with FeedHandler(topo, config.feed_path, book=book, on_message=on_message) as feed:
        while True:
            feed.poll(50)


def _strategy_main(config: LiveConfig, from_feed: socket.socket, gateway: socket.socket) -> None:
    class Sink:
        """Order intents to the gateway process; UserRefNums are assigned here."""

        next_ref = 1

        def enter_order(
            self, symbol: str, side: str, price: int, quantity: int, time_in_force: str = "0"
        ) -> int:
            ref = self.next_ref
            self.next_ref += 1
            _send(gateway, ("enter", symbol, side, price, quantity, time_in_force, ref))
            return ref

        def cancel(self, user_ref_num: int, quantity: int = 0) -> None:
            _send(gateway, ("cancel", user_ref_num, quantity))

    symbols: dict[int, str] = {}
    strategy = Strategy(Sink(), symbols)
    while True:
        readable, _, _ = select.select([from_feed, gateway], [], [])
        for sock in readable:
            item = _recv(sock)
            if item[0] == "symbol":
                symbols[item[1]] = item[2]
            elif item[0] == "top":
                strategy.on_book(item[1], TopOfBook(*item[2]))
            elif item[0] == "response":
                strategy.on_response(ouch.decode_outbound(item[1]))


def _gateway_main(topo: Topology, config: LiveConfig, strategy: socket.socket) -> None:
    def forward(message: ouch.OutboundMessage) -> None:
        _send(strategy, ("response", ouch.encode(message)))

    gateway = Gateway(topo, config.username, config.password, on_message=forward)
    for attempt in range(50):  # the exchange may still be binding its port
        try:
            gateway.connect()
            break
        except ConnectionRefusedError:
            if attempt == 49:
                raise
            time.sleep(0.1)
    while True:
        item = _recv(strategy)
        if item[0] == "enter":
            _, symbol, side, price, quantity, tif, ref = item
            gateway.enter_order(symbol, side, price, quantity, tif, user_ref_num=ref)
        elif item[0] == "cancel":
            gateway.cancel(item[1], item[2])


@dataclass
class LiveSystem:
    """Start with ``start()``, stop with ``stop()``: processes, cgroups; not the topology."""

    topo: Topology
    config: LiveConfig = field(default_factory=LiveConfig)
    children: list[_Child] = field(default_factory=list)
    exchange_stats: dict[str, int] = field(default_factory=dict)
    _control: socket.socket | None = None

    def start(self) -> LiveSystem:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        control_parent, control_child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        feed_out, strategy_in = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        strategy_gw, gateway_in = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        topo, config = self.topo, self.config
        plan: Sequence[tuple[str, str | None, Callable[[], None], list[socket.socket]]] = [
            (
                "exchange",
                topo.exchange_ns,
                lambda: _exchange_main(topo, config, control_child),
                [control_child],
            ),
            (
                "gateway",
                topo.trading_ns,
                lambda: _gateway_main(topo, config, gateway_in),
                [gateway_in],
            ),
            (
                "strategy",
                None,
                lambda: _strategy_main(config, strategy_in, strategy_gw),
                [strategy_in, strategy_gw],
            ),
            ("feed", topo.trading_ns, lambda: _feed_main(topo, config, feed_out), [feed_out]),
        ]
        everything = [control_parent, control_child, feed_out, strategy_in, strategy_gw, gateway_in]
        for name, netns, main, keep in plan:
            cgroup = cgroup_dir(name, config.cgroup_base)
            pid = _spawn(name, netns, cgroup, main, [s for s in everything if s not in keep])
            self.children.append(_Child(name, pid, cgroup))
            if name == "exchange":
                time.sleep(0.2)  # let it bind before the gateway connects and the feed listens
        for sock in everything:
            if sock is not control_parent:
                sock.close()
        self._control = control_parent

    def alive(self) -> dict[str, bool]:
        out = {}
        for child in self.children:
            try:
                pid, _ = os.waitpid(child.pid, os.WNOHANG)
            except ChildProcessError:
                pid = child.pid
            out[child.name] = pid == 0
        return out

    def stop(self) -> None:
        """Stop the exchange cleanly (stats come back), kill the rest, remove the cgroups."""
        if self._control is not None:
            with contextlib.suppress(OSError):
                self._control.send(b"x")
            self._control.settimeout(5)
            with contextlib.suppress(OSError, EOFError, pickle.UnpicklingError):
                _, stats = _recv(self._control)
                self.exchange_stats = stats
            self._control.close()
            self._control = None
        for child in reversed(self.children):
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(child.pid, 0)
        self.children.clear()
        remove_cgroups(self.config.cgroup_base)

    def __enter__(self) -> LiveSystem:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _spawn(
    name: str,
    netns: str | None,
    cgroup: Path | None,
    main: Callable[[], None],
    close: list[socket.socket],
) -> int:
    """Fork a component: cgroup, namespace, die with the parent, run ``main`` until killed."""
    ready_read, ready_write = os.pipe()
    pid = os.fork()
    if pid:
        os.close(ready_write)
        with os.fdopen(ready_read, "rb") as ready:
            if ready.read(1) != b"1":  # placed in its cgroup and namespace before going on
                raise RuntimeError(f"component {name} failed to start")
        return pid
    os.close(ready_read)
    status = 0
    try:
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        for sock in close:
            sock.close()
        if cgroup is not None:
            join_cgroup(cgroup)
        # A freshly forked child has one thread, so entering for that thread is for good.
        with in_netns(netns) if netns is not None else contextlib.nullcontext():
            os.write(ready_write, b"1")
            os.close(ready_write)
            main()
    except (KeyboardInterrupt, EOFError):
        pass
    except BaseException:
        status = 1
        sys.stderr.write(f"tailsight trading: {name} failed:\n{traceback.format_exc()}")
    finally:
        sys.stderr.flush()
        os._exit(status)
