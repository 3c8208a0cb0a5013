"""Exchange simulator: ITCH 5.0 over MoldUDP64 out, OUCH 5.0 over SoupBinTCP 4.1 in.

Runs in the exchange namespace of a ``Topology`` (sockets are created there; the threads may live
in any process). The market is a replayed ITCH stream (a file or generated messages) applied to a
price-time ``MatchingEngine`` that also holds the clients' orders, so what is published is the
market as changed by our trading:

* a client order matches resting market and client orders; fills print ``E`` on the resting
  order and the remainder is published as an ``A`` add with an exchange reference >= 2**40;
* a replayed add (or replace) that crosses a resting *client* order trades with it first (the
  client is filled passively); replayed market orders never trade with each other here, the file
  is authoritative for those;
* later replayed messages on a market order that our trading consumed are clamped or dropped.

With no client orders the published stream is exactly the replayed one. The feed goes to
(trading_ip, feed_port) with heartbeats and an end of session; the re-request service on
rerequest_port answers MoldUDP64 request packets with the stored messages, unicast.
"""

from __future__ import annotations

import contextlib
import queue
import selectors
import socket
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TypeAlias

from tailsight.trading_core import itch, ouch
from tailsight.trading_core import soupbintcp as soup
from tailsight.trading_core.itch_file import iter_itch
from tailsight.trading_core.matching import BUY, SELL, Fill, MatchingEngine
from tailsight.trading_core.moldudp64 import (
    END_OF_SESSION_COUNT,
    MAX_MESSAGES_PER_PACKET,
    MoldPacket,
    decode_request,
    encode_packet,
    pack_messages,
)
from tailsight.trading_core.netns import Topology, in_netns
from tailsight.trading_core.reconcile import AccountView, FillRecord, OrderRecord, order_side

__all__ = [
    "CLIENT_REF_BASE",
    "DEFAULT_ACCOUNTS",
    "REJECT_CLOSED",
    "REJECT_INVALID_PRICE",
    "REJECT_INVALID_QUANTITY",
    "REJECT_INVALID_SIDE",
    "REJECT_UNKNOWN_SYMBOL",
    "REJECT_USER_REF_NUM",
    "Exchange",
    "ExchangeStats",
    "directory_messages",
]

CLIENT_REF_BASE: Final = 1 << 40  # first client order reference and match number (days stay below)
DEFAULT_ACCOUNTS: Final = {"TS0001": "tailsight"}
IOC: Final = "3"  # OUCH 5.0 Time In Force: 0 = day, 3 = immediate or cancel
MAX_ORDER_SHARES: Final = 1_000_000
# OUCH 5.0 "Rejected Order" reasons are 2-byte codes; the simulator uses these (spec-listed
# meanings: invalid quantity, invalid price, invalid side, unknown symbol, UserRefNum out of
# sequence, exchange closed).
REJECT_INVALID_QUANTITY: Final = 0x01
REJECT_INVALID_PRICE: Final = 0x02
REJECT_INVALID_SIDE: Final = 0x03
REJECT_UNKNOWN_SYMBOL: Final = 0x04
REJECT_USER_REF_NUM: Final = 0x05
REJECT_CLOSED: Final = 0x06
_MAX_RETRANSMIT_PACKETS: Final = 64  # per request: a gap larger than that takes more requests
_NS_PER_DAY: Final = 86_400_000_000_000


def _clock_ns() -> int:
    """Wall clock as ns since midnight UTC (OUCH outbound timestamps)."""
    return time.time_ns() % _NS_PER_DAY


def directory_messages(symbols: Sequence[str], timestamp_ns: int = 0) -> list[itch.Message]:
    """Start of day for a market without a replay: system events O, S, Q, a directory and T."""
    out: list[itch.Message] = [
        itch.SystemEvent(0, 0, timestamp_ns, "O"),
        itch.SystemEvent(0, 0, timestamp_ns, "S"),
    ]
    for locate, name in enumerate(symbols, start=1):
        out.append(
            itch.StockDirectory(
                locate,
                0,
                timestamp_ns,
                name,
                "Q",
                "N",
                100,
                "N",
                "C",
                "Z",
                "P",
                "N",
                "N",
                "1",
                "N",
                0,
                "N",
            )
        )
        out.append(itch.StockTradingAction(locate, 0, timestamp_ns, name, "T", " ", ""))
    out.append(itch.SystemEvent(0, 0, timestamp_ns, "Q"))
    return out


@dataclass
class ExchangeStats:
    """Counters of one run (read them after ``stop`` or while holding no expectations)."""

    market_messages: int = 0  # replayed messages taken from the market source
    published_messages: int = 0  # sequenced ITCH messages (market + our trading)
    packets: int = 0
    heartbeats: int = 0
    retransmit_requests: int = 0
    retransmitted_messages: int = 0
    orders: int = 0
    rejects: int = 0
    fills: int = 0
    logins: int = 0
    login_rejects: int = 0
    heartbeat_timeouts: int = 0
    undecodable: int = 0  # replayed messages passed on without being understood
    dropped_packets: int = 0  # feed packets with messages refused by the kernel (EPERM: a firewall)
    dropped_messages: int = 0  # the messages those packets carried
    order_handling_ns: int = 0  # time spent handling client messages: orders / this = capacity


@dataclass
class _Account:
    password: str
    stream: list[bytes] = field(default_factory=list)  # sequenced OUCH messages, seq = index + 1
    view: AccountView = field(default_factory=AccountView)
    by_exchange_ref: dict[int, int] = field(default_factory=dict)  # ITCH ref -> UserRefNum
    last_user_ref_num: int = 0
    connection: _Connection | None = None


class _Connection:
    """One SoupBinTCP session socket; sends are serialized by a lock."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.lock = threading.Lock()
        self.last_sent = time.monotonic()
        self.last_received = time.monotonic()
        self.closed = False

    def send(self, packet: soup.Packet) -> bool:
        with self.lock:
            if self.closed:
                return False
            try:
                self.sock.sendall(soup.encode(packet))
            except OSError:
                self.closed = True
                return False
            self.last_sent = time.monotonic()
            return True


MarketSource: TypeAlias = (
    "str | Path | Iterable[itch.Message | bytes] | queue.Queue[itch.Message | bytes | None]"
)


def _market_messages(market: MarketSource, stop: threading.Event) -> Iterator[bytes]:
    """Wire bytes of the market's messages; b"" = nothing more for now (publish the batch)."""
    if isinstance(market, queue.Queue):
        while not stop.is_set():
            try:
                item = market.get_nowait()
            except queue.Empty:
                yield b""
                try:
                    item = market.get(timeout=0.1)
                except queue.Empty:
                    continue
            if item is None:
                return
            yield bytes(item) if isinstance(item, bytes | bytearray) else itch.encode(item)
        return
    if isinstance(market, str | Path):
        for _, raw in iter_itch(market):
            yield raw
        return
    for message in market:
        yield bytes(message) if isinstance(message, bytes | bytearray) else itch.encode(message)


class Exchange:
    """The simulator: ``start()`` binds and runs it in the background, ``stop()`` ends it.

    ``market``: an ITCH file, messages (records or wire bytes), or a queue of them for a live
    market (None ends it); ``symbols`` only (no market) publishes a start of day for them and
    the book holds client orders alone. ``speed`` paces the replay at file time / speed; None
    sends as fast as ``max_packets_per_s`` allows. Without ``start()``, ``step_market`` and
    ``handle`` run it offline: the same rules, published messages stored but not sent.
    ``on_sent(first_sequence, count, stamp_ns)`` sees each first transmission of messages, stamped
    (perf_counter_ns) just before ``sendto``, so a paced replay can time its own publisher.
    """

    def __init__(
        self,
        topo: Topology,
        market: MarketSource | None = None,
        *,
        symbols: Sequence[str] = (),
        session: bytes | str = b"TSEXCH0001",
        speed: float | None = None,
        max_packets_per_s: float | None = None,
        accounts: Mapping[str, str] = DEFAULT_ACCOUNTS,
        heartbeat_interval_s: float = 1.0,
        heartbeat_timeout_s: float = 15.0,
        max_payload: int = 1400,
        end_session_when_done: bool = True,
        autostart_market: bool = True,
        on_sent: Callable[[int, int, int], None] | None = None,
    ) -> None:
        self.topo = topo
        self.session = session.decode("ascii") if isinstance(session, bytes) else session
        if market is None:
            market = directory_messages(symbols)
        self._stop = threading.Event()
        self._market: Iterator[bytes] = _market_messages(market, self._stop)
        self.speed = speed
        self.max_packets_per_s = max_packets_per_s
        self.heartbeat_interval_s = heartbeat_interval_s
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.max_payload = max_payload
        self.end_session_when_done = end_session_when_done
        self.autostart_market = autostart_market
        self.on_sent = on_sent
        self._market_start_ns: int | None = None
        self.stats = ExchangeStats()
        # Match numbers are day-unique in ITCH: ours start above any a replayed day uses.
        self.engine = MatchingEngine(first_match_number=CLIENT_REF_BASE)
        self.locates: dict[str, int] = {}  # symbol -> stock locate, from the directory
        self.symbols: dict[int, str] = {}
        self._accounts = {name: _Account(password) for name, password in accounts.items()}
        self._store: list[bytes] = []  # published ITCH messages, sequence = index + 1
        # Per published message: the index of the replayed message it came from, or -1 when
        # our trading caused it (a resting client order's add, a client fill).
        self.sources: list[int] = []
        self._consumed: dict[int, tuple[int, str]] = {}  # market ref -> (locate, side)
        self._next_client_ref = CLIENT_REF_BASE
        self._market_ts_ns = 0
        self._lock = threading.RLock()
        self._market_go = threading.Event()
        self.market_done = threading.Event()
        self.market_error: str | None = None  # the traceback if the replay failed
        self.session_ended = False
        self._threads: list[threading.Thread] = []
        self._feed: socket.socket | None = None
        self._rerequest: socket.socket | None = None
        self._listener: socket.socket | None = None
        self._last_packet = time.monotonic()

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> Exchange:
        """Create the sockets in the exchange namespace and start the service threads."""
        try:
            with in_netns(self.topo.exchange_ns):
                self._feed = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                self._feed.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
                self._rerequest = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                self._rerequest.bind((self.topo.exchange_ip, self.topo.rerequest_port))
                self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                self._listener.bind((self.topo.exchange_ip, self.topo.order_port))
                self._listener.listen(8)
        except BaseException:
            for sock in (self._feed, self._rerequest, self._listener):
                if sock is not None:
                    sock.close()
            self._feed = self._rerequest = self._listener = None
            raise
        # Timeouts let the service threads notice ``stop`` whatever shutdown does to them.
        self._rerequest.settimeout(0.1)
        self._listener.settimeout(0.1)
        for target, name in (
            (self._run_market, "market"),
            (self._run_heartbeats, "feed-heartbeat"),
            (self._run_rerequests, "rerequest"),
            (self._run_order_entry, "order-entry"),
        ):
            thread = threading.Thread(target=target, name=f"exchange-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        if self.autostart_market:
            self._market_go.set()
        return self

    def start_market(self, start_ns: int | None = None) -> None:
        """Begin the replay (when constructed with ``autostart_market=False``).

        ``start_ns`` (perf_counter_ns, may lie ahead) anchors the pacing: message ``i`` is due
        at ``start_ns + round((max(ts_0..ts_i) - ts_0) / speed)``, which callers can compute too.
        """
        self._market_start_ns = start_ns
        self._market_go.set()

    def wait_market_done(self, timeout_s: float | None = None) -> bool:
        return self.market_done.wait(timeout_s)

    def stop(self) -> None:
        """End the session on both channels, close every socket, join the threads."""
        with self._lock:
            if not self.session_ended:
                self._end_session()
            for account in self._accounts.values():
                if account.connection is not None:
                    account.connection.send(soup.EndOfSession())
        self._stop.set()
        self._market_go.set()
        for sock in (self._listener, self._rerequest):
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        for thread in self._threads:
            thread.join(timeout=5)
        for sock in (self._feed, self._rerequest, self._listener):
            if sock is not None:
                sock.close()
        for account in self._accounts.values():
            if account.connection is not None:
                self._drop(account.connection)
                account.connection = None

    def __enter__(self) -> Exchange:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- views ------------------------------------------------------------------------------

    @property
    def next_sequence(self) -> int:
        """MoldUDP64 sequence number of the next message to be published."""
        return len(self._store) + 1

    def published(self) -> list[bytes]:
        """Every sequenced ITCH message published so far (a copy)."""
        with self._lock:
            return list(self._store)

    def account_view(self, username: str) -> AccountView:
        """The exchange's record of one account's orders and fills (a deep copy)."""
        with self._lock:
            view = self._accounts[username].view
            return AccountView(
                {ref: _copy_order(order) for ref, order in view.orders.items()},
                list(view.fills),
            )

    def sequenced_messages(self, username: str) -> list[bytes]:
        """The account's SoupBinTCP sequenced stream (OUCH outbound messages) so far."""
        with self._lock:
            return list(self._accounts[username].stream)

    # -- offline simulation (no sockets: nothing is sent, everything is stored) ---------------

    def step_market(self, messages: Iterable[itch.Message | bytes]) -> None:
        """Apply replayed market messages now, in this thread (instead of the market thread)."""
        with self._lock:
            out: list[itch.Message | bytes] = []
            sources: list[int] = []
            for message in messages:
                raw = message if isinstance(message, bytes) else itch.encode(message)
                index = self.stats.market_messages
                self._apply_market(raw, out)
                sources.extend([index] * (len(out) - len(sources)))
            self._publish(out, sources)

    def handle(self, username: str, message: ouch.InboundMessage) -> None:
        """Process one OUCH message from ``username`` as if it came over its session."""
        self._on_message(username, ouch.encode(message))

    # -- feed -------------------------------------------------------------------------------

    def _send_packet(self, packet: bytes) -> None:
        if self._feed is None:
            return  # not started: an offline simulation (``step_market``/``handle``) only stores
        count = int.from_bytes(packet[18:20], "big")  # MoldUDP64 header: message count
        if self.on_sent is not None and 0 < count != END_OF_SESSION_COUNT:
            # Stamped before sendto(): on a veth the receiver may run inside that call.
            self.on_sent(int.from_bytes(packet[10:18], "big"), count, time.perf_counter_ns())
        try:
            self._feed.sendto(packet, (self.topo.trading_ip, self.topo.feed_port))
        except PermissionError:  # an nftables drop on the output hook: ground truth for loss tests
            self.stats.dropped_packets += 1
            self.stats.dropped_messages += count if count != END_OF_SESSION_COUNT else 0
        except OSError:
            pass  # ENOBUFS/ECONNREFUSED on a datagram: the receiver recovers it by re-request
        self.stats.packets += 1
        self._last_packet = time.monotonic()

    def _publish(
        self, messages: Sequence[itch.Message | bytes], sources: Sequence[int] | None = None
    ) -> None:
        """Sequence, store and send (caller holds the lock, so packets leave in sequence)."""
        if not messages:
            return
        wire = [m if isinstance(m, bytes) else itch.encode(m) for m in messages]
        first = len(self._store) + 1
        self._store.extend(wire)
        self.sources.extend([-1] * len(wire) if sources is None else sources)
        self.stats.published_messages += len(wire)
        for packet in pack_messages(self.session, first, wire, self.max_payload):
            self._send_packet(packet)

    def _end_session(self) -> None:
        self.session_ended = True
        self._send_packet(
            encode_packet(MoldPacket(self.session, self.next_sequence, (), end_of_session=True))
        )

    def _run_heartbeats(self) -> None:
        while not self._stop.wait(min(0.05, self.heartbeat_interval_s)):
            with self._lock:
                if time.monotonic() - self._last_packet < self.heartbeat_interval_s:
                    continue
                # After the end of session it is repeated instead, for late or lossy receivers.
                self._send_packet(
                    encode_packet(
                        MoldPacket(
                            self.session, self.next_sequence, (), end_of_session=self.session_ended
                        )
                    )
                )
                self.stats.heartbeats += 1

    def _run_rerequests(self) -> None:
        assert self._rerequest is not None and self._feed is not None
        while not self._stop.is_set():
            try:
                data, address = self._rerequest.recvfrom(2048)
            except TimeoutError:
                continue
            except OSError:
                return
            if not data:
                continue  # shutdown wakes recvfrom with an empty datagram
            try:
                request = decode_request(data)
            except ValueError:
                continue
            if request.session != self.session or request.sequence_number < 1:
                continue
            with self._lock:
                self.stats.retransmit_requests += 1
                first = request.sequence_number
                count = min(request.count, MAX_MESSAGES_PER_PACKET)
                messages = self._store[first - 1 : first - 1 + count]
            packets = pack_messages(self.session, first, messages, self.max_payload)
            for packet in packets[:_MAX_RETRANSMIT_PACKETS]:
                with contextlib.suppress(OSError):
                    self._rerequest.sendto(packet, address)
                self.stats.retransmitted_messages += int.from_bytes(packet[18:20], "big")

    def _run_market(self) -> None:
        try:
            self._replay()
        except Exception:
            self.market_error = traceback.format_exc()
            self.market_done.set()
            raise

    def _replay(self) -> None:
        self._market_go.wait()
        if self._stop.is_set():
            return
        start_ns = self._market_start_ns
        if start_ns is None:
            start_ns = time.perf_counter_ns()
        first_ts: int | None = None
        offset_ns = 0
        min_gap_s = 1.0 / self.max_packets_per_s if self.max_packets_per_s else 0.0
        batch: list[bytes] = []
        batch_bytes = 20
        next_packet_at = time.monotonic()

        def flush() -> None:
            nonlocal batch, batch_bytes, next_packet_at
            if not batch:
                return
            if min_gap_s:
                delay = next_packet_at - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                next_packet_at = max(next_packet_at, time.monotonic()) + min_gap_s
            with self._lock:
                out: list[itch.Message | bytes] = []
                sources: list[int] = []
                for raw in batch:
                    index = self.stats.market_messages
                    self._apply_market(raw, out)
                    sources.extend([index] * (len(out) - len(sources)))
                self._publish(out, sources)
            batch, batch_bytes = [], 20

        for raw in self._market:
            if self._stop.is_set():
                return
            if not raw:
                flush()
                continue
            if self.speed is not None and len(raw) >= 11:
                timestamp_ns = int.from_bytes(raw[5:11], "big")
                if first_ts is None:
                    first_ts = timestamp_ns
                # Sent in sequence order: a timestamp that steps back is due with its predecessor.
                offset_ns = max(offset_ns, timestamp_ns - first_ts)
                due_ns = start_ns + round(offset_ns / self.speed)
                if due_ns > time.perf_counter_ns():
                    flush()
                    # Loop: never publish before the due time, which replay measures from.
                    while (wait_ns := due_ns - time.perf_counter_ns()) > 0:
                        if self._stop.wait(wait_ns / 1e9):
                            return
            # One batch per packet: applying it publishes about one packet.
            if batch_bytes + 2 + len(raw) > self.max_payload:
                flush()
            batch.append(raw)
            batch_bytes += 2 + len(raw)
        flush()
        self.market_done.set()
        if self.end_session_when_done:
            with self._lock:
                if not self.session_ended:
                    self._end_session()

    # -- market replay ----------------------------------------------------------------------

    def _apply_market(self, raw: bytes, out: list[itch.Message | bytes]) -> None:
        """Apply one replayed message to the engine; append what is to be published to ``out``."""
        self.stats.market_messages += 1
        try:
            message = itch.decode(raw)
        except ValueError:
            self.stats.undecodable += 1
            out.append(raw)  # not ours to judge: pass it on as the file has it
            return
        self._market_ts_ns = message.timestamp_ns
        engine = self.engine
        if isinstance(message, itch.StockDirectory):
            self.locates[message.stock] = message.stock_locate
            self.symbols[message.stock_locate] = message.stock
            out.append(raw)
        elif isinstance(message, itch.AddOrder | itch.AddOrderMPID):
            self._market_add(
                message,
                message.order_reference_number,
                message.side,
                message.price,
                message.shares,
                raw,
                out,
            )
        elif isinstance(message, itch.OrderExecuted | itch.OrderExecutedWithPrice):
            taken = engine.reduce(message.order_reference_number, message.executed_shares)
            if taken == message.executed_shares:
                out.append(raw)
            elif taken:
                out.append(_with(message, executed_shares=taken))
        elif isinstance(message, itch.OrderCancel):
            taken = engine.reduce(message.order_reference_number, message.cancelled_shares)
            if taken == message.cancelled_shares:
                out.append(raw)
            elif taken:
                out.append(_with(message, cancelled_shares=taken))
        elif isinstance(message, itch.OrderDelete):
            if engine.delete(message.order_reference_number):
                out.append(raw)
            self._consumed.pop(message.order_reference_number, None)
        elif isinstance(message, itch.OrderReplace):
            self._market_replace(message, raw, out)
        else:
            out.append(raw)

    def _market_add(
        self,
        message: itch.Message,
        ref: int,
        side: str,
        price: int,
        shares: int,
        original: bytes | None,
        out: list[itch.Message | bytes],
    ) -> None:
        """A replayed order: trade it against crossing client orders, then rest the rest."""
        locate = message.stock_locate
        # A live reference added again: the stale order goes first (as the L3 book does it).
        self.engine.delete(ref)
        remaining = shares
        fills = self._cross_clients(locate, ref, side, price, shares)
        for fill in fills:
            remaining -= fill.shares
            out.append(self._execution_message(fill))
        if remaining:
            self.engine.add_resting(locate, ref, side, price, remaining)
            if original is not None and remaining == shares:
                out.append(original)
            else:
                stock = self.symbols.get(locate, "")
                out.append(
                    itch.AddOrder(
                        locate, 0, message.timestamp_ns, ref, side, remaining, stock, price
                    )
                )
        else:
            self._consumed[ref] = (locate, side)

    def _market_replace(
        self, message: itch.OrderReplace, raw: bytes, out: list[itch.Message | bytes]
    ) -> None:
        old = self.engine.orders.get(message.original_order_reference_number)
        if old is not None:
            locate, side = old.locate, old.side
        elif message.original_order_reference_number in self._consumed:
            locate, side = self._consumed.pop(message.original_order_reference_number)
        else:
            return  # unknown order: nothing to replace
        new_ref = message.new_order_reference_number
        if old is not None and not self._crosses_client(locate, side, message.price):
            self.engine.delete(old.ref)
            self.engine.delete(new_ref)  # a stale order on the new reference is evicted
            self.engine.add_resting(locate, new_ref, side, message.price, message.shares)
            out.append(raw)
            return
        if old is not None:
            self.engine.delete(old.ref)
            out.append(itch.OrderDelete(locate, 0, message.timestamp_ns, old.ref))
        add = itch.AddOrder(
            locate,
            0,
            message.timestamp_ns,
            new_ref,
            side,
            message.shares,
            self.symbols.get(locate, ""),
            message.price,
        )
        self._market_add(add, new_ref, side, message.price, message.shares, None, out)

    def _crosses_client(self, locate: int, side: str, price: int) -> bool:
        book = self.engine.book(locate)
        opposite = book.asks if side == BUY else book.bids
        for key in reversed(opposite.keys):
            level_price = opposite.sign * key
            if (side == BUY and level_price > price) or (side == SELL and level_price < price):
                return False
            if any(order.owner for order in opposite.levels[level_price].values()):
                return True
        return False

    def _cross_clients(
        self, locate: int, ref: int, side: str, price: int, shares: int
    ) -> list[Fill]:
        """Fill a replayed order against crossing client orders only, in price-time priority."""
        if not self._crosses_client(locate, side, price):
            return []
        book = self.engine.book(locate)
        opposite = book.asks if side == BUY else book.bids
        candidates = []
        for key in reversed(opposite.keys):
            level_price = opposite.sign * key
            if (side == BUY and level_price > price) or (side == SELL and level_price < price):
                break
            candidates += [o for o in opposite.levels[level_price].values() if o.owner]
        fills = []
        remaining = shares
        for resting in candidates:
            if not remaining:
                break
            traded = min(remaining, resting.shares)
            remaining -= traded
            self.engine.reduce(resting.ref, traded)
            fill = Fill(
                self.engine.next_match_number,
                locate,
                resting.price,
                traded,
                ref,
                side,
                "",
                resting.ref,
                resting.owner,
                resting.shares,
            )
            self.engine.next_match_number += 1
            fills.append(fill)
            self._client_fill(resting.owner, resting.ref, fill, "A")
        return fills

    def _execution_message(self, fill: Fill) -> itch.Message:
        return itch.OrderExecuted(
            fill.locate, 0, self._market_ts_ns, fill.resting_ref, fill.shares, fill.match_number
        )

    # -- clients ----------------------------------------------------------------------------

    def _sequenced(self, account: _Account, message: ouch.OutboundMessage) -> None:
        account.stream.append(ouch.encode(message))
        if account.connection is not None:
            account.connection.send(soup.SequencedData(account.stream[-1]))

    def _client_fill(self, owner: str, exchange_ref: int, fill: Fill, liquidity: str) -> None:
        account = self._accounts[owner]
        user_ref = account.by_exchange_ref[exchange_ref]
        order = account.view.orders[user_ref]
        order.executed += fill.shares
        if order.executed + order.canceled >= order.quantity:
            order.state = "done"
        account.view.fills.append(
            FillRecord(fill.match_number, user_ref, order.side, fill.price, fill.shares, liquidity)
        )
        self.stats.fills += 1
        self._sequenced(
            account,
            ouch.OrderExecuted(
                _clock_ns(), user_ref, fill.shares, fill.price, liquidity, fill.match_number
            ),
        )

    def _reject(self, account: _Account, user_ref: int, reason: int, cl_ord_id: str) -> None:
        self.stats.rejects += 1
        self._sequenced(account, ouch.OrderRejected(_clock_ns(), user_ref, reason, cl_ord_id))

    def _on_enter(self, username: str, message: ouch.EnterOrder) -> None:
        account = self._accounts[username]
        self.stats.orders += 1
        side = order_side(message.side) if message.side in ("B", "S", "T", "E") else None
        locate = self.locates.get(message.symbol)
        reason = None
        if message.user_ref_num <= account.last_user_ref_num:
            reason = REJECT_USER_REF_NUM  # OUCH 5.0: UserRefNum must increase per session
        elif self.session_ended:
            reason = REJECT_CLOSED
        elif side is None:
            reason = REJECT_INVALID_SIDE
        elif locate is None:
            reason = REJECT_UNKNOWN_SYMBOL
        elif not 0 < message.quantity <= MAX_ORDER_SHARES:
            reason = REJECT_INVALID_QUANTITY
        elif not 0 < message.price < 0xFFFFFFFF:  # must fit ITCH's Price(4)
            reason = REJECT_INVALID_PRICE
        if message.user_ref_num > account.last_user_ref_num:
            account.last_user_ref_num = message.user_ref_num
        if reason is not None or side is None or locate is None:
            if message.user_ref_num not in account.view.orders:
                account.view.orders[message.user_ref_num] = OrderRecord(
                    message.user_ref_num,
                    message.symbol,
                    order_side(message.side),
                    message.price,
                    message.quantity,
                    state="rejected",
                )
            self._reject(account, message.user_ref_num, reason or 0, message.cl_ord_id)
            return
        exchange_ref = self._next_client_ref
        self._next_client_ref += 1
        order = OrderRecord(
            message.user_ref_num,
            message.symbol,
            side,
            message.price,
            message.quantity,
            exchange_ref,
            state="live",
        )
        account.view.orders[message.user_ref_num] = order
        account.by_exchange_ref[exchange_ref] = message.user_ref_num
        result = self.engine.submit(
            locate,
            exchange_ref,
            side,
            message.price,
            message.quantity,
            owner=username,
            rest=message.time_in_force != IOC,
        )
        self._sequenced(
            account,
            ouch.OrderAccepted(
                _clock_ns(),
                message.user_ref_num,
                message.side,
                message.quantity,
                message.symbol,
                message.price,
                message.time_in_force,
                message.display,
                exchange_ref,
                message.capacity,
                message.intermarket_sweep_eligibility,
                message.cross_type,
                "L" if result.rested or result.fills else "D",
                message.cl_ord_id,
            ),
        )
        published: list[itch.Message] = []
        for fill in result.fills:
            published.append(self._execution_message(fill))
            self._client_fill(username, exchange_ref, fill, "R")
            if fill.resting_owner:
                self._client_fill(fill.resting_owner, fill.resting_ref, fill, "A")
            else:
                self._note_consumed(fill)
        if result.rested:
            published.append(
                itch.AddOrder(
                    locate,
                    0,
                    self._market_ts_ns,
                    exchange_ref,
                    side,
                    result.remaining,
                    message.symbol,
                    message.price,
                )
            )
        elif result.remaining:
            order.canceled += result.remaining
            order.state = "done"
            self._sequenced(
                account,
                ouch.OrderCanceled(_clock_ns(), message.user_ref_num, result.remaining, "I"),
            )
        self._publish(published)

    def _note_consumed(self, fill: Fill) -> None:
        if fill.resting_left == 0:
            side = SELL if fill.aggressor_side == BUY else BUY
            self._consumed[fill.resting_ref] = (fill.locate, side)

    def _on_cancel(self, username: str, message: ouch.CancelOrder) -> None:
        account = self._accounts[username]
        order = account.view.orders.get(message.user_ref_num)
        live = None if order is None else self.engine.orders.get(order.order_reference_number)
        if order is None or live is None or message.quantity >= live.shares:
            self._sequenced(account, ouch.CancelReject(_clock_ns(), message.user_ref_num))
            return
        decrement = live.shares - message.quantity
        locate = live.locate
        self.engine.reduce(live.ref, decrement)
        order.canceled += decrement
        if message.quantity == 0:
            order.state = "done"
            self._publish([itch.OrderDelete(locate, 0, self._market_ts_ns, live.ref)])
        else:
            self._publish([itch.OrderCancel(locate, 0, self._market_ts_ns, live.ref, decrement)])
        self._sequenced(
            account, ouch.OrderCanceled(_clock_ns(), message.user_ref_num, decrement, "U")
        )

    def _on_message(self, username: str, data: bytes) -> None:
        started_ns = time.perf_counter_ns()
        try:
            self._handle_message(username, data)
        finally:
            self.stats.order_handling_ns += time.perf_counter_ns() - started_ns

    def _handle_message(self, username: str, data: bytes) -> None:
        account = self._accounts[username]
        message = ouch.decode_inbound(data)
        with self._lock:
            if isinstance(message, ouch.EnterOrder):
                self._on_enter(username, message)
            elif isinstance(message, ouch.CancelOrder):
                self._on_cancel(username, message)
            elif isinstance(message, ouch.AccountQueryRequest):
                self._sequenced(
                    account, ouch.AccountQueryResponse(_clock_ns(), account.last_user_ref_num + 1)
                )
            else:
                user_ref = getattr(message, "user_ref_num", 0)
                self._reject(account, user_ref, REJECT_INVALID_SIDE, "")

    # -- order entry (SoupBinTCP server) ----------------------------------------------------

    def _run_order_entry(self) -> None:
        assert self._listener is not None
        while not self._stop.is_set():
            try:
                sock, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            thread = threading.Thread(
                target=self._serve, args=(sock,), name="exchange-session", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def _drop(self, connection: _Connection) -> None:
        with connection.lock:
            connection.closed = True
            with contextlib.suppress(OSError):
                connection.sock.shutdown(socket.SHUT_RDWR)
            connection.sock.close()

    def _serve(self, sock: socket.socket) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(2.0)  # bounds sendall to a stuck client
        connection = _Connection(sock)
        framer = soup.SoupFramer()
        username: str | None = None
        selector = selectors.DefaultSelector()
        selector.register(sock, selectors.EVENT_READ)
        try:
            while not self._stop.is_set() and not connection.closed:
                ready = selector.select(timeout=min(0.05, self.heartbeat_interval_s))
                now = time.monotonic()
                if ready:
                    try:
                        data = sock.recv(65536)
                    except OSError:
                        return
                    if not data:
                        return
                    connection.last_received = now
                    for packet in framer.feed(data):
                        if username is None:
                            username = self._login(connection, packet)
                            if username is None:
                                return
                        elif isinstance(packet, soup.UnsequencedData):
                            self._on_message(username, packet.message)
                        elif isinstance(packet, soup.LogoutRequest):
                            return
                        elif isinstance(packet, soup.LoginRequest):
                            return  # a second login on one connection is a protocol error
                if now - connection.last_received > self.heartbeat_timeout_s:
                    self.stats.heartbeat_timeouts += 1
                    return
                if username is not None and now - connection.last_sent > self.heartbeat_interval_s:
                    connection.send(soup.ServerHeartbeat())
        except (ValueError, OSError):
            return  # malformed stream (SoupDecodeError/OuchDecodeError) or a dead socket
        finally:
            selector.close()
            with self._lock:
                if username is not None:
                    account = self._accounts[username]
                    if account.connection is connection:
                        account.connection = None
            self._drop(connection)

    def _login(self, connection: _Connection, packet: soup.Packet) -> str | None:
        """Handle the first packet of a connection; returns the username when accepted."""
        if not isinstance(packet, soup.LoginRequest):
            return None
        account = self._accounts.get(packet.username)
        with self._lock:
            if account is None or account.password != packet.password:
                self.stats.login_rejects += 1
                connection.send(soup.LoginRejected("A"))  # not authorized
                return None
            session_ok = packet.requested_session in ("", self.session)
            if not session_ok or account.connection is not None:
                self.stats.login_rejects += 1
                connection.send(soup.LoginRejected("S"))  # session not available
                return None
            # Sequence 0 = start with the next new message; past the end likewise (spec 4.1).
            requested = packet.requested_sequence_number
            next_seq = len(account.stream) + 1
            start = next_seq if requested == 0 or requested > next_seq else requested
            connection.send(soup.LoginAccepted(self.session, start))
            for message in account.stream[start - 1 :]:
                connection.send(soup.SequencedData(message))
            account.connection = connection
            self.stats.logins += 1
            return str(packet.username)


def _with(message: Any, **changes: int) -> itch.Message:
    """The message with some integer fields changed (a clamped execution or cancel)."""
    from dataclasses import replace

    changed: itch.Message = replace(message, **changes)
    return changed


def _copy_order(order: OrderRecord) -> OrderRecord:
    from dataclasses import replace

    return replace(order)
