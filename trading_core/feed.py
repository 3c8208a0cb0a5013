"""Feed handler: MoldUDP64/ITCH 5.0 into the L3 book, over one of two interchangeable receive paths.

``afxdp``: an XDP program (``xsk_redirect.bpf.c``, generic/SKB mode on the veth) steers the feed
port's datagrams into an AF_XDP socket (copy mode, see ``afxdp.XDP_MODE``). ``udp``: a plain UDP
socket drained with ``recvmmsg`` (one syscall per batch). Either way the handler tracks MoldUDP64
sequence numbers, re-requests gaps from the exchange's re-request service (its answers come back
to the request socket, which XDP passes to the stack), decodes each message and applies it to the
book, stamping every stage into an optional ``StageTimer``.

Each datagram carries the kernel's receive time on CLOCK_MONOTONIC (the clock of the stage
stamps): on UDP the socket's ``SO_TIMESTAMPNS`` (realtime, taken when the veth hands the frame to
the stack) moved onto CLOCK_MONOTONIC by its age at pickup; on AF_XDP the XDP program's
``bpf_ktime_get_ns`` written over the frame's MAC addresses.
"""

from __future__ import annotations

import ctypes
import select
import socket
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final, Protocol

from tailsight.probes.loader import compile_source
from tailsight.trading_core import itch
from tailsight.trading_core.afxdp import NO_STAMP, XDP_MODE, XskSocket, udp_payload
from tailsight.trading_core.book import Book, TradeEvent
from tailsight.trading_core.moldudp64 import (
    MoldReceiver,
    MoldRequest,
    decode_packet,
    encode_request,
)
from tailsight.trading_core.netns import Topology, in_netns
from tailsight.trading_core.timing import BOOK, DECODE, KERNEL_RX, RECEIVE, UNSET, StageTimer

PATHS: Final = ("afxdp", "udp")
XSK_PROGRAM: Final = Path(__file__).resolve().parent / "xsk_redirect.bpf.c"
_MSG_DONTWAIT: Final = 0x40
_SO_TIMESTAMPNS: Final = 35  # asm-generic/socket.h (SO_TIMESTAMPNS_OLD); SCM_ type is the same
_CONTROL_SLOT: Final = 64  # cmsghdr (16) + struct timespec (16), with room
_CMSG: Final = struct.Struct("=Qii")  # cmsg_len, cmsg_level, cmsg_type
_TIMESPEC: Final = struct.Struct("=qq")

OnMessage = Callable[[int, itch.Message, TradeEvent | None], None]
"""Called after the book took message ``sequence``: (sequence, message, trade it printed)."""
OnUpdate = Callable[[int, int, int, TradeEvent | None], None]
"""Called after the book took message ``sequence``: (sequence, type byte, stock locate, trade);
with only this callback the order messages are never built as objects (the live fast path)."""


class ReceivePath(Protocol):
    """Where feed datagrams come from; ``receive`` never blocks."""

    name: str
    xdp_mode: str

    def fileno(self) -> int: ...

    def receive(self) -> list[tuple[bytes, int]]:
        """Datagrams now queued, each with its kernel receive time (CLOCK_MONOTONIC ns, or
        ``UNSET`` when the kernel gave none)."""
        ...

    def counters(self) -> dict[str, int]: ...

    def close(self) -> None: ...


class _IoVec(ctypes.Structure):
    _fields_ = (("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t))


class _MsgHdr(ctypes.Structure):
    _fields_ = (
        ("msg_name", ctypes.c_void_p),
        ("msg_namelen", ctypes.c_uint32),
        ("msg_iov", ctypes.POINTER(_IoVec)),
        ("msg_iovlen", ctypes.c_size_t),
        ("msg_control", ctypes.c_void_p),
        ("msg_controllen", ctypes.c_size_t),
        ("msg_flags", ctypes.c_int),
    )


class _MMsgHdr(ctypes.Structure):
    _fields_ = (("msg_hdr", _MsgHdr), ("msg_len", ctypes.c_uint))


class UdpPath:
    """Plain UDP socket on (trading_ip, feed_port), drained ``batch`` datagrams per recvmmsg,
    each with its ``SO_TIMESTAMPNS`` kernel receive stamp."""

    name = "udp"
    xdp_mode = "none"

    def __init__(self, ip: str, port: int, batch: int = 64, slot: int = 2048) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self.sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
        self.sock.bind((ip, port))
        self.sock.setblocking(False)
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._slot = slot
        self._buffer = ctypes.create_string_buffer(batch * slot)
        self._view = memoryview(self._buffer).cast("B")
        self._control = ctypes.create_string_buffer(batch * _CONTROL_SLOT)
        self._iovecs = (_IoVec * batch)()
        self._headers = (_MMsgHdr * batch)()
        base = ctypes.addressof(self._buffer)
        control = ctypes.addressof(self._control)
        for index in range(batch):
            self._iovecs[index].iov_base = base + index * slot
            self._iovecs[index].iov_len = slot
            header = self._headers[index].msg_hdr
            header.msg_iov = ctypes.pointer(self._iovecs[index])
            header.msg_iovlen = 1
            header.msg_control = control + index * _CONTROL_SLOT
            header.msg_controllen = _CONTROL_SLOT
        self._batch = batch
        self.datagrams = 0
        self.syscalls = 0
        self.unstamped = 0

    def fileno(self) -> int:
        return self.sock.fileno()

    def receive(self) -> list[tuple[bytes, int]]:
        received: list[tuple[bytes, int]] = []
        headers, control = self._headers, self._control
        while True:
            count = self._libc.recvmmsg(
                self.sock.fileno(), headers, self._batch, _MSG_DONTWAIT, None
            )
            self.syscalls += 1
            if count <= 0:
                return received  # EAGAIN: drained
            # The stamps are realtime: their age now, subtracted from the monotonic clock,
            # puts them on the stage clock without trusting realtime over longer spans.
            real_now, mono_now = time.time_ns(), time.perf_counter_ns()
            view, slot = self._view, self._slot
            for index in range(count):
                start = index * slot
                header = headers[index]
                stamp = UNSET
                at = index * _CONTROL_SLOT
                if header.msg_hdr.msg_controllen >= _CMSG.size + _TIMESPEC.size:
                    _length, level, kind = _CMSG.unpack_from(control, at)
                    if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS:
                        seconds, nanoseconds = _TIMESPEC.unpack_from(control, at + _CMSG.size)
                        stamp = mono_now - (real_now - (seconds * 1_000_000_000 + nanoseconds))
                if stamp == UNSET:
                    self.unstamped += 1
                header.msg_hdr.msg_controllen = _CONTROL_SLOT  # the kernel shrank it
                received.append((bytes(view[start : start + header.msg_len]), stamp))
            self.datagrams += count
            if count < self._batch:
                return received

    def counters(self) -> dict[str, int]:
        return {
            "udp_datagrams": self.datagrams,
            "udp_recvmmsg_calls": self.syscalls,
            "rx_unstamped": self.unstamped,
        }

    def close(self) -> None:
        self._view.release()
        self.sock.close()


class AfXdpPath:
    """XDP redirect of the feed port to an AF_XDP socket on ``ifname`` queue 0 (copy mode).

    Construct it inside the interface's namespace: the attach resolves ``ifname`` there. The
    program is compiled once; ``detach``/``attach`` take it off the interface and put it back
    (a UDP run on the same interface must not have its datagrams steered away).
    """

    name = "afxdp"

    def __init__(
        self, ifname: str, port: int, queue_id: int = 0, frames: int = 4096, ring_size: int = 2048
    ) -> None:
        import ctypes as ct

        from bcc import BPF

        self.xdp_mode = XDP_MODE
        self._udp_payload = udp_payload
        self._no_stamp = NO_STAMP
        self.ifname = ifname
        self.port = port
        self._bpf = compile_source(XSK_PROGRAM, [f"-DFEED_PORT={port}"])
        self.xsk = XskSocket(ifname, queue_id, frames=frames, ring_size=ring_size)
        try:
            self._bpf[b"feed_sockets"][ct.c_int(queue_id)] = ct.c_int(self.xsk.fd)
            self._program = self._bpf.load_func(b"xsk_redirect", BPF.XDP)
        except Exception:
            self.xsk.close()
            self._bpf.cleanup()
            raise
        self._attached = False
        self.attach()
        self.not_feed = 0
        self.unstamped = 0

    def attach(self) -> None:
        """Put the program on the interface (call inside the namespace)."""
        from bcc import BPF

        if not self._attached:
            BPF.attach_xdp(self.ifname.encode(), self._program, BPF.XDP_FLAGS_SKB_MODE)
            self._attached = True

    def fileno(self) -> int:
        return self.xsk.fd

    def receive(self) -> list[tuple[bytes, int]]:
        payloads: list[tuple[bytes, int]] = []
        for frame, stamp in self.xsk.receive_stamped():
            payload = self._udp_payload(frame, self.port)
            if payload is None:
                self.not_feed += 1
                continue
            if stamp == self._no_stamp:
                self.unstamped += 1
                stamp = UNSET
            payloads.append((payload, stamp))
        return payloads

    def counters(self) -> dict[str, int]:
        redirected, passed = (int(v.value) for v in self._bpf[b"steering_frames"].values())
        stats = self.xsk.stats()
        return {
            "xdp_redirected_frames": redirected,
            "xdp_passed_frames": passed,
            "xsk_frames": self.xsk.frames_received,
            "xsk_rx_dropped": stats.rx_dropped,
            "xsk_rx_ring_full": stats.rx_ring_full,
            "xsk_fill_ring_empty": stats.rx_fill_ring_empty_descs,
            "rx_unstamped": self.unstamped,
        }

    def detach(self) -> None:
        """Remove the XDP program (call inside the namespace)."""
        from bcc import BPF

        if self._attached:
            BPF.remove_xdp(self.ifname.encode(), BPF.XDP_FLAGS_SKB_MODE)
            self._attached = False

    def close(self) -> None:
        self.xsk.close()
        self._bpf.cleanup()


def open_path(path: str, topo: Topology) -> ReceivePath:
    """Open a receive path for the feed of ``topo`` (inside its trading namespace)."""
    if path not in PATHS:
        raise ValueError(f"unknown receive path {path!r}; choose one of {', '.join(PATHS)}")
    with in_netns(topo.trading_ns):
        if path == "udp":
            return UdpPath(topo.trading_ip, topo.feed_port)
        return AfXdpPath(topo.trading_if, topo.feed_port)


class FeedHandler:
    """MoldUDP64 session -> sequence tracking -> ITCH decode -> L3 book, on one receive path.

    Gaps are re-requested from ``(exchange_ip, rerequest_port)``; an unanswered request is sent
    again after ``rerequest_timeout_ms``. ``on_message`` runs after the book took each message.
    """

    def __init__(
        self,
        topo: Topology,
        path: str | ReceivePath = "udp",
        *,
        book: Book | None = None,
        timer: StageTimer | None = None,
        on_message: OnMessage | None = None,
        on_update: OnUpdate | None = None,
        rerequest_timeout_ms: float = 20.0,
        session: str | None = None,
    ) -> None:
        self.topo = topo
        self.book = book if book is not None else Book()
        self.timer = timer
        self.on_message = on_message
        self.on_update = on_update
        # With ``session`` set, packets of any other (an earlier run's) are ignored.
        self.receiver = MoldReceiver(session=session)
        self.rerequest_timeout_ns = int(rerequest_timeout_ms * 1e6)
        # A path passed in open stays open (it outlives this session); one named here is ours.
        self._owns_path = isinstance(path, str)
        self.path = open_path(path, topo) if isinstance(path, str) else path
        if not self._owns_path:
            self.path.receive()  # what an earlier session left queued is not ours
        self._path_base = {} if self._owns_path else self.path.counters()
        with in_netns(topo.trading_ns):
            self.request_sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            self.request_sock.bind((topo.trading_ip, 0))
        self.request_sock.setblocking(False)
        self._poll = select.poll()
        self._poll.register(self.path.fileno(), select.POLLIN)
        self._poll.register(self.request_sock.fileno(), select.POLLIN)
        self._last_request: tuple[int, int, int] | None = None  # start, count, sent at ns
        self.packets = 0
        self.retransmitted_packets = 0
        self.recovered_messages = 0
        self.gaps_detected = 0
        self.rerequests_sent = 0
        self.decode_errors = 0
        self.missing_detected = 0
        self._feed_next = 1  # one past the highest sequence the live feed has carried
        self._done_ns = 0  # when the latest feed message's handling ended (perf_counter_ns)
        self._raw_handlers = self.book.raw_handlers()
        self._readers: dict[int, Callable[[], None]] = {}

    def add_reader(self, fd: int, callback: Callable[[], None]) -> None:
        """Also wait on ``fd`` in ``poll``; ``callback`` runs when it is readable (order acks)."""
        self._readers[fd] = callback
        self._poll.register(fd, select.POLLIN)

    @property
    def complete(self) -> bool:
        """End of session seen and every message up to it applied to the book."""
        return self.receiver.complete

    def poll(self, timeout_ms: int = 0) -> int:
        """Wait up to ``timeout_ms`` for datagrams, process all that arrived; returns messages."""
        events = self._poll.poll(timeout_ms)
        delivered = 0
        for payload, kernel_ns in self.path.receive():
            delivered += self._on_datagram(payload, kernel_ns, False)
        while True:
            try:
                payload = self.request_sock.recv(65536)
            except BlockingIOError:
                break
            delivered += self._on_datagram(payload, UNSET, True)
        self._maybe_rerequest()
        for fd, _event in events:
            reader = self._readers.get(fd)
            if reader is not None:
                reader()
        return delivered

    def _on_datagram(self, payload: bytes, kernel_ns: int, retransmission: bool) -> int:
        try:
            packet = decode_packet(payload)
        except ValueError:
            self.decode_errors += 1
            return 0
        self.packets += 1
        delivery = self.receiver.on_packet(packet)
        if retransmission:
            self.retransmitted_packets += 1
            first, end = packet.sequence_number, packet.next_sequence_number
            self.recovered_messages += sum(1 for seq, _ in delivery.messages if first <= seq < end)
        elif packet.sequence_number > self._feed_next:
            # A hole in the live feed (heartbeats and end of session count: they carry the next
            # sequence). Retransmissions fill holes in pieces, so they never open one.
            self.gaps_detected += 1
            self.missing_detected += packet.sequence_number - self._feed_next
        if not retransmission:
            self._feed_next = max(self._feed_next, packet.next_sequence_number)
        timer, book, on_message, on_update = self.timer, self.book, self.on_message, self.on_update
        clock, decode, apply = time.perf_counter_ns, itch.decode, book.apply
        # Without on_message nobody needs message objects: order messages go unpacked.
        raw_handlers = self._raw_handlers if on_message is None else {}
        capacity, stamps, ready = (
            (timer.capacity, timer.stamps, timer.ready_ns) if timer is not None else (0, None, None)
        )
        # A message is ready when it has arrived and the one before it is done: the wait behind
        # earlier messages (same packet, or a backlog) is the ``queue`` stage, not ours.
        done_ns = self._done_ns
        for sequence, raw in delivery.messages:
            row = sequence - 1
            timed = row < capacity
            if timed:
                assert stamps is not None and ready is not None
                stamps[row, RECEIVE] = clock()
                stamps[row, KERNEL_RX] = kernel_ns
                if kernel_ns != UNSET:
                    ready[row] = kernel_ns if kernel_ns > done_ns else done_ns
            fast = raw_handlers.get(raw[0]) if raw else None
            try:
                if fast is not None:
                    layout, handler = fast
                    if len(raw) < layout.size:
                        raise ValueError(f"truncated {raw[:1]!r} message")
                    values = layout.unpack_from(raw)
                    kind, locate = raw[0], values[1]
                else:
                    message = decode(raw)
                    kind, locate = message.message_type[0], message.stock_locate
            except ValueError:
                self.decode_errors += 1
                done_ns = clock()
                continue
            if timed:
                stamps[row, DECODE] = clock()  # type: ignore[index]
            trade = handler(values) if fast is not None else apply(message)
            if timed:
                stamps[row, BOOK] = clock()  # type: ignore[index]
            if on_message is not None:
                on_message(sequence, message, trade)
            if on_update is not None:
                on_update(sequence, kind, locate, trade)
            done_ns = clock()
        self._done_ns = done_ns
        return len(delivery.messages)

    def _maybe_rerequest(self) -> None:
        gap = self.receiver.gap()
        if gap is None or self.receiver.session is None:
            return
        start, count = gap
        count = min(count, self.receiver.max_request)
        now = time.perf_counter_ns()
        last = self._last_request
        if (
            last is not None
            and last[:2] == (start, count)
            and now - last[2] < self.rerequest_timeout_ns
        ):
            return
        request = encode_request(MoldRequest(self.receiver.session, start, count))
        self.request_sock.sendto(request, (self.topo.exchange_ip, self.topo.rerequest_port))
        self.rerequests_sent += 1
        self._last_request = (start, count, now)

    def run_until_complete(self, timeout_s: float) -> bool:
        """Poll until the session is complete or ``timeout_s`` passes; True when complete."""
        deadline = time.monotonic() + timeout_s
        while not self.complete:
            if time.monotonic() > deadline:
                return False
            self.poll(5)
        return True

    def counters(self) -> dict[str, int]:
        """Session, gap and receive-path counters for the run's result document."""
        return {
            "packets": self.packets,
            "messages": self.receiver.delivered,
            "duplicates": self.receiver.duplicates,
            "gaps_detected": self.gaps_detected,
            "missing_detected": self.missing_detected,
            "rerequests_sent": self.rerequests_sent,
            "retransmitted_packets": self.retransmitted_packets,
            "recovered_messages": self.recovered_messages,
            "decode_errors": self.decode_errors,
            "foreign_packets": self.receiver.foreign_packets,
            **{
                name: value - self._path_base.get(name, 0)
                for name, value in self.path.counters().items()
            },
        }

    def close(self) -> None:
        """Close the request socket; a path opened here is detached (XDP) and closed too."""
        if self._owns_path:
            if isinstance(self.path, AfXdpPath):
                with in_netns(self.topo.trading_ns):
                    self.path.detach()
            self.path.close()
        self.request_sock.close()

    def __enter__(self) -> FeedHandler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
