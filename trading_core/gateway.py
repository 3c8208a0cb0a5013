"""OUCH 5.0 order-entry client over SoupBinTCP 4.1: login, orders, heartbeats, reconnect.

A background thread reads the session (or, with ``reader_thread=False``, the caller's own poll
loop calls ``on_readable`` and ``service``, so a tick-to-trade thread handles its responses
between ticks instead of fighting a second thread for the GIL): it tracks the next expected
sequence number (so a reconnect asks for exactly what was missed), keeps the account's orders
and fills as seen from here (an ``AccountView``, to reconcile with the exchange's), sends a
client heartbeat after a second without sending, and drops the session when the server is
silent for the timeout (SoupBinTCP 4.1: heartbeats every second, 15 s of silence means the
link is dead).
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Final

from tailsight.trading_core import ouch
from tailsight.trading_core import soupbintcp as soup
from tailsight.trading_core.netns import Topology, in_netns
from tailsight.trading_core.reconcile import AccountView, FillRecord, OrderRecord, order_side

__all__ = ["DAY", "IOC", "Gateway", "GatewayError", "LoginRejectedError"]

DAY: Final = "0"  # OUCH 5.0 Time In Force
IOC: Final = "3"


class GatewayError(ConnectionError):
    """The order-entry session is not (or no longer) usable."""


class LoginRejectedError(GatewayError):
    """Login Rejected: "A" not authorized, "S" session not available."""

    def __init__(self, reason_code: str) -> None:
        super().__init__(f"login rejected: {reason_code!r}")
        self.reason_code = reason_code


class Gateway:
    """One OUCH account's session to the exchange, from the trading namespace (``netns``)."""

    def __init__(
        self,
        topo: Topology,
        username: str,
        password: str,
        *,
        netns: str | None = None,
        session: str = "",
        heartbeat_interval_s: float = 1.0,
        heartbeat_timeout_s: float = 15.0,
        send_heartbeats: bool = True,
        on_message: Callable[[ouch.OutboundMessage], None] | None = None,
        reader_thread: bool = True,
    ) -> None:
        self.topo = topo
        self.reader_thread = reader_thread
        self.username = username
        self.password = password
        self.netns = topo.trading_ns if netns is None else netns
        self.session = session  # learned from Login Accepted
        self.heartbeat_interval_s = heartbeat_interval_s
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.send_heartbeats = send_heartbeats
        self.on_message = on_message
        self.next_sequence = 1  # of the next sequenced message expected
        self.next_user_ref_num = 1
        self.view = AccountView()
        self.messages: list[ouch.OutboundMessage] = []  # every sequenced message, in order
        self.disconnect_reason: str | None = None
        self.heartbeats_sent = 0
        self.heartbeats_received = 0
        self._sock: socket.socket | None = None
        self._send_lock = threading.Lock()
        self._state = threading.Condition()
        self._reader: threading.Thread | None = None
        self._framer = soup.SoupFramer()
        self._pending: deque[soup.Packet] = deque()  # read, not yet applied (a budget ran out)
        self._closing: str | None = None
        self._stop = threading.Event()
        self._last_sent = 0.0
        self._last_received = 0.0
        self.last_send_ns = 0  # perf_counter_ns just before the latest send() (tick-to-trade)

    @property
    def connected(self) -> bool:
        return self._sock is not None and self.disconnect_reason is None

    # -- session ----------------------------------------------------------------------------

    def connect(self, requested_sequence: int | None = None, timeout_s: float = 5.0) -> int:
        """Log in; returns the sequence number the server will send next.

        ``requested_sequence`` defaults to the next one expected, so after a reconnect the
        server replays everything missed (SoupBinTCP 4.1 Login Request).
        """
        if self.connected:
            raise GatewayError("already connected")
        self._close_socket()
        requested = self.next_sequence if requested_sequence is None else requested_sequence
        with in_netns(self.netns):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(timeout_s)
        try:
            sock.connect((self.topo.exchange_ip, self.topo.order_port))
            sock.sendall(
                soup.encode(
                    soup.LoginRequest(self.username, self.password, self.session, requested)
                )
            )
            framer = soup.SoupFramer()
            packets: list[soup.Packet] = []
            while not packets:
                data = sock.recv(65536)
                if not data:
                    raise GatewayError("connection closed during login")
                packets = framer.feed(data)
        except BaseException:
            sock.close()
            raise
        first = packets[0]
        if isinstance(first, soup.LoginRejected):
            sock.close()
            raise LoginRejectedError(first.reject_reason_code)
        if not isinstance(first, soup.LoginAccepted):
            sock.close()
            raise GatewayError(f"expected Login Accepted, got {first}")
        self.session = first.session
        self.next_sequence = first.sequence_number
        self._sock = sock
        self.disconnect_reason = None
        self._closing = None
        self._last_sent = self._last_received = time.monotonic()
        self._stop.clear()
        self._pending.clear()  # the old connection's: the login's sequence number replays them
        for packet in packets[1:]:
            self._on_packet(packet)
        self._framer = framer
        if self.reader_thread:
            self._reader = threading.Thread(target=self._read, name="gateway-reader", daemon=True)
            self._reader.start()
        return first.sequence_number

    def fileno(self) -> int:
        """The session socket, for an external poll loop (``reader_thread=False``)."""
        if self._sock is None:
            raise GatewayError("not connected")
        return self._sock.fileno()

    def logout(self, timeout_s: float = 2.0) -> None:
        """Send Logout Request, wait up to ``timeout_s`` for the server to close its side, and
        close: the server ends the session before it closes, so a login right after is not
        refused as a session still in use."""
        if self.connected:
            self._closing = "logout"  # the server closing its side now is this logout's doing
            with contextlib.suppress(OSError):
                self._send(soup.LogoutRequest())
                self._await_close(timeout_s)
        self._shutdown("logout")

    def _await_close(self, timeout_s: float) -> None:
        """Until the server closes the connection (or the time is up): read by the reader
        thread where there is one, else here."""
        if self._reader is not None and self._reader.is_alive():
            self.wait_for(lambda: self.disconnect_reason is not None, timeout_s)
            return
        assert self._sock is not None  # connected
        deadline = time.monotonic() + timeout_s
        with selectors.DefaultSelector() as selector:
            selector.register(self._sock, selectors.EVENT_READ)
            while self.disconnect_reason is None and (left := deadline - time.monotonic()) > 0:
                if selector.select(timeout=left):
                    self.on_readable()

    def close(self) -> None:
        """Drop the connection without logging out (what a crash looks like to the server)."""
        self._shutdown("closed")

    def _shutdown(self, reason: str) -> None:
        self._stop.set()
        with self._state:
            if self.disconnect_reason is None:
                self.disconnect_reason = reason
            self._state.notify_all()
        if self._reader is not None and self._reader is not threading.current_thread():
            self._reader.join(timeout=5)
        self._close_socket()

    def _close_socket(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
            self._sock.close()
            self._sock = None

    def __enter__(self) -> Gateway:
        self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.logout()

    # -- orders -----------------------------------------------------------------------------

    def enter_order(
        self,
        symbol: str,
        side: str,
        price: int,
        quantity: int,
        time_in_force: str = DAY,
        user_ref_num: int | None = None,
    ) -> int:
        """Send Enter Order; returns its UserRefNum (day-unique, increasing)."""
        ref = self.next_user_ref_num if user_ref_num is None else user_ref_num
        self.next_user_ref_num = max(self.next_user_ref_num, ref + 1)
        body = ouch.encode_enter_order(
            ref, side, quantity, symbol, price, time_in_force, "Y", "P", "N", "N", f"TS{ref:012d}"
        )
        wire = soup.encode_unsequenced(body)
        # Sent first, recorded after (off the tick-to-trade path); holding the state lock
        # across both keeps a reader thread from applying the response before the record.
        with self._state:
            self._send_wire(wire)
            self.view.orders.setdefault(
                ref, OrderRecord(ref, symbol, order_side(side), price, quantity)
            )
        return ref

    def cancel(self, user_ref_num: int, quantity: int = 0) -> None:
        """Cancel Order: reduce the order to ``quantity`` shares (0 cancels it)."""
        self._send(soup.UnsequencedData(ouch.encode(ouch.CancelOrder(user_ref_num, quantity))))

    def send_raw(self, message: ouch.InboundMessage) -> None:
        self._send(soup.UnsequencedData(ouch.encode(message)))

    def _send(self, packet: soup.Packet) -> None:
        self._send_wire(soup.encode(packet))

    def _send_wire(self, wire: bytes) -> None:
        sock = self._sock
        if sock is None or self.disconnect_reason is not None:
            raise GatewayError(f"not connected ({self.disconnect_reason})")
        with self._send_lock:
            self.last_send_ns = time.perf_counter_ns()
            sock.sendall(wire)
            self._last_sent = time.monotonic()

    def wait_for(self, predicate: Callable[[], bool], timeout_s: float = 5.0) -> bool:
        """Wait until ``predicate()`` (evaluated under the state lock) holds or the time is up."""
        with self._state:
            return self._state.wait_for(predicate, timeout_s)

    def snapshot(self) -> AccountView:
        """A consistent copy of our view of the account."""
        from dataclasses import replace

        with self._state:
            return AccountView(
                {ref: replace(order) for ref, order in self.view.orders.items()},
                list(self.view.fills),
            )

    # -- reading ----------------------------------------------------------------------------

    def on_readable(self, budget: int | None = None) -> None:
        """The socket is readable: take what arrived and apply it (never blocks for more).

        With ``budget``, at most that many packets are applied now; the rest wait in
        ``pending`` for ``apply_pending``, so a tick-to-trade loop goes back to the feed between
        slices instead of making a tick wait behind a burst of responses.
        """
        sock = self._sock
        if sock is None or self.disconnect_reason is not None:
            return
        try:
            data = sock.recv(65536)
        except (BlockingIOError, TimeoutError):
            return
        except OSError as error:
            self._lost(f"error: {error}")
            return
        if not data:
            self._lost("closed by peer")
            return
        self._last_received = time.monotonic()
        try:
            self._pending.extend(self._framer.feed(data))
        except ValueError as error:
            self._lost(f"error: {error}")
            return
        self.apply_pending(budget)

    @property
    def pending(self) -> int:
        """Packets read but not yet applied (``on_readable`` with a budget)."""
        return len(self._pending)

    def apply_pending(self, budget: int | None = None) -> None:
        """Apply up to ``budget`` (default: all) of the packets read but not yet applied."""
        pending = self._pending
        applied = 0
        try:
            while pending and (budget is None or applied < budget):
                packet = pending.popleft()
                applied += 1
                self._on_packet(packet)
                if isinstance(packet, soup.EndOfSession):
                    pending.clear()
                    self._lost("end of session")
                    return
        except ValueError as error:
            pending.clear()
            self._lost(f"error: {error}")

    def service(self) -> None:
        """Heartbeats and the silence timeout; call at least every ``heartbeat_interval_s``."""
        if self._sock is None or self.disconnect_reason is not None:
            return
        now = time.monotonic()
        if now - self._last_received > self.heartbeat_timeout_s:
            self._lost("heartbeat timeout")
        elif self.send_heartbeats and now - self._last_sent > self.heartbeat_interval_s:
            try:
                self._send(soup.ClientHeartbeat())
            except OSError as error:
                self._lost(f"error: {error}")
                return
            self.heartbeats_sent += 1

    def _lost(self, reason: str) -> None:
        with self._state:
            if self.disconnect_reason is None:
                self.disconnect_reason = self._closing or reason
            self._state.notify_all()

    def _read(self) -> None:
        sock = self._sock
        assert sock is not None
        selector = selectors.DefaultSelector()
        selector.register(sock, selectors.EVENT_READ)
        try:
            while not self._stop.is_set() and self.disconnect_reason is None:
                if selector.select(timeout=min(0.05, self.heartbeat_interval_s)):
                    self.on_readable()
                self.service()
        finally:
            selector.close()
            self._lost("closed" if self._stop.is_set() else "closed by peer")

    def _on_packet(self, packet: soup.Packet) -> None:
        if isinstance(packet, soup.ServerHeartbeat):
            self.heartbeats_received += 1
        elif isinstance(packet, soup.SequencedData):
            message = ouch.decode_outbound(packet.message)
            with self._state:
                self.next_sequence += 1
                self.messages.append(message)
                self._apply(message)
                self._state.notify_all()
            if self.on_message is not None:
                self.on_message(message)

    def _apply(self, message: ouch.OutboundMessage) -> None:
        """Update the account view from one response (the exchange applies the same rules)."""
        orders = self.view.orders
        if isinstance(message, ouch.OrderAccepted):
            order = orders.setdefault(
                message.user_ref_num,
                OrderRecord(
                    message.user_ref_num,
                    message.symbol,
                    order_side(message.side),
                    message.price,
                    message.quantity,
                ),
            )
            order.order_reference_number = message.order_reference_number
            if order.state == "pending":
                order.state = "live"
        elif isinstance(message, ouch.OrderExecuted):
            order = orders[message.user_ref_num]
            order.executed += message.quantity
            self.view.fills.append(
                FillRecord(
                    message.match_number,
                    message.user_ref_num,
                    order.side,
                    message.price,
                    message.quantity,
                    message.liquidity_flag,
                )
            )
            if order.executed + order.canceled >= order.quantity:
                order.state = "done"
        elif isinstance(message, ouch.OrderCanceled):
            order = orders[message.user_ref_num]
            order.canceled += message.quantity
            if order.executed + order.canceled >= order.quantity:
                order.state = "done"
        elif isinstance(message, ouch.OrderRejected):
            rejected = orders.get(message.user_ref_num)
            if rejected is not None and rejected.state == "pending":
                rejected.state = "rejected"
