"""AF_XDP sockets from Python: UMEM, fill/completion/RX rings mapped with mmap, driven via ctypes.

Uapi: ``include/uapi/linux/if_xdp.h``. The socket is bound with ``XDP_COPY``: on a veth the XDP
program runs in generic (SKB) mode, where the kernel copies each frame into the UMEM; zero-copy
needs driver support a veth does not have, so every result carries ``XDP_MODE`` ("copy/skb").
Ring indices are free-running u32 counters; the producer publishes after the descriptor is
written. On x86-64 (TSO) stores are not reordered with stores nor loads with loads, which is the
ordering the rings need; CPython's bytecode boundaries act as the compiler barrier.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import select
import socket
import struct
from dataclasses import dataclass
from typing import Final

AF_XDP: Final = 44
SOL_XDP: Final = 283
XDP_MMAP_OFFSETS: Final = 1
XDP_RX_RING: Final = 2
XDP_UMEM_REG: Final = 4
XDP_UMEM_FILL_RING: Final = 5
XDP_UMEM_COMPLETION_RING: Final = 6
XDP_STATISTICS: Final = 7
XDP_COPY: Final = 1 << 1
XDP_PGOFF_RX_RING: Final = 0
XDP_UMEM_PGOFF_FILL_RING: Final = 0x100000000
XDP_UMEM_PGOFF_COMPLETION_RING: Final = 0x180000000

XDP_MODE: Final = "copy/skb"
"""How frames reach the socket here: generic XDP, copied. Never zero-copy on a veth."""

_RING_OFFSET = struct.Struct("=QQQQ")  # struct xdp_ring_offset: producer, consumer, desc, flags
_DESC = struct.Struct("=QII")  # struct xdp_desc: addr, len, options
_U64 = struct.Struct("=Q")
_U32 = struct.Struct("=I")
# struct xdp_umem_reg: addr, len, chunk_size, headroom, flags, tx_metadata_len.
_UMEM_REG = struct.Struct("=QQIIII")
# struct xdp_statistics: rx_dropped, rx_invalid_descs, tx_invalid_descs, rx_ring_full,
# rx_fill_ring_empty_descs, tx_ring_empty_descs.
_STATS = struct.Struct("=QQQQQQ")
_SOCKADDR_XDP = struct.Struct("=HHIII")  # family, flags, ifindex, queue_id, shared_umem_fd
# struct rx_stamp of xsk_redirect.bpf.c: written by the XDP program over the frame's MACs.
_RX_STAMP = struct.Struct("=QI")
RX_STAMP_MAGIC: Final = 0x78727374
NO_STAMP: Final = -1

_libc = ctypes.CDLL(None, use_errno=True)


class XskError(OSError):
    """An AF_XDP setup step failed; the message names the step."""


def _check(result: int, step: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise XskError(err, f"{step}: {os.strerror(err)}")
    return result


class _Ring:
    """One mmap'ed ring: producer/consumer u32 indices and ``size`` entries of ``entry`` bytes."""

    def __init__(self, fd: int, size: int, entry: int, offsets: bytes, pgoff: int) -> None:
        producer, consumer, desc, _flags = _RING_OFFSET.unpack(offsets)
        self.size = size
        self.mask = size - 1
        self.entry = entry
        self.map = mmap.mmap(
            fd,
            desc + size * entry,
            flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0),
            prot=mmap.PROT_READ | mmap.PROT_WRITE,
            offset=pgoff,
        )
        self.producer_at = producer
        self.consumer_at = consumer
        self.desc_at = desc

    def producer(self) -> int:
        return int(_U32.unpack_from(self.map, self.producer_at)[0])

    def consumer(self) -> int:
        return int(_U32.unpack_from(self.map, self.consumer_at)[0])

    def set_producer(self, value: int) -> None:
        _U32.pack_into(self.map, self.producer_at, value & 0xFFFFFFFF)

    def set_consumer(self, value: int) -> None:
        _U32.pack_into(self.map, self.consumer_at, value & 0xFFFFFFFF)

    def close(self) -> None:
        self.map.close()


@dataclass(frozen=True)
class XskStats:
    """Kernel counters of one socket (``XDP_STATISTICS``)."""

    rx_dropped: int
    rx_invalid_descs: int
    tx_invalid_descs: int
    rx_ring_full: int
    rx_fill_ring_empty_descs: int
    tx_ring_empty_descs: int


class XskSocket:
    """An AF_XDP RX socket on (ifindex, queue) with its own UMEM, in copy mode.

    Create it inside the interface's namespace. ``receive()`` yields frame bytes (Ethernet and
    up) and returns their chunks to the fill ring at once, so the UMEM never runs dry.
    """

    def __init__(
        self,
        ifname: str,
        queue_id: int = 0,
        frames: int = 4096,
        frame_size: int = 4096,
        ring_size: int = 2048,
    ) -> None:
        if ring_size & (ring_size - 1) or frames < ring_size:
            raise ValueError("ring_size must be a power of two and at most frames")
        self.ifname = ifname
        self.ifindex = socket.if_nametoindex(ifname)
        self.queue_id = queue_id
        self.frame_size = frame_size
        self.sock = socket.socket(AF_XDP, socket.SOCK_RAW, 0)
        self.fd = self.sock.fileno()
        self.umem = mmap.mmap(-1, frames * frame_size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self._umem_view = memoryview(self.umem)
        umem_addr = ctypes.addressof(ctypes.c_char.from_buffer(self.umem))
        try:
            self.sock.setsockopt(
                SOL_XDP,
                XDP_UMEM_REG,
                _UMEM_REG.pack(umem_addr, len(self.umem), frame_size, 0, 0, 0),
            )
            for option in (XDP_UMEM_FILL_RING, XDP_UMEM_COMPLETION_RING, XDP_RX_RING):
                self.sock.setsockopt(SOL_XDP, option, _U32.pack(ring_size))
            offsets = self.sock.getsockopt(SOL_XDP, XDP_MMAP_OFFSETS, 4 * _RING_OFFSET.size)
        except OSError as error:
            self.close()
            raise XskError(error.errno, f"AF_XDP setup on {ifname}: {error.strerror}") from error
        size = _RING_OFFSET.size
        rx_off, fill_off, comp_off = (
            offsets[0:size],
            offsets[2 * size : 3 * size],
            offsets[3 * size :],
        )
        self.rx = _Ring(self.fd, ring_size, _DESC.size, rx_off, XDP_PGOFF_RX_RING)
        self.fill = _Ring(self.fd, ring_size, _U64.size, fill_off, XDP_UMEM_PGOFF_FILL_RING)
        self.completion = _Ring(
            self.fd, ring_size, _U64.size, comp_off, XDP_UMEM_PGOFF_COMPLETION_RING
        )
        # Hand the kernel ring_size chunks to copy frames into before anyone can send.
        for index in range(ring_size):
            _U64.pack_into(self.fill.map, self.fill.desc_at + index * _U64.size, index * frame_size)
        self.fill.set_producer(ring_size)
        address = _SOCKADDR_XDP.pack(AF_XDP, XDP_COPY, self.ifindex, queue_id, 0)
        _check(_libc.bind(self.fd, address, len(address)), f"bind AF_XDP to {ifname}:{queue_id}")
        self._poll = select.poll()
        self._poll.register(self.fd, select.POLLIN)
        self.frames_received = 0

    def receive(self, timeout_ms: int = 0, limit: int = 256) -> list[bytes]:
        """Up to ``limit`` frames now in the RX ring, waiting at most ``timeout_ms`` for one."""
        return [frame for frame, _ in self.receive_stamped(timeout_ms, limit)]

    def receive_stamped(self, timeout_ms: int = 0, limit: int = 256) -> list[tuple[bytes, int]]:
        """Like ``receive``, each frame with the XDP program's arrival stamp (CLOCK_MONOTONIC
        ns) from its first 12 bytes (over the MAC addresses), or ``NO_STAMP`` if it has none."""
        rx, fill = self.rx, self.fill
        consumer = rx.consumer()
        available = (rx.producer() - consumer) & 0xFFFFFFFF
        if not available and timeout_ms:
            self._poll.poll(timeout_ms)
            available = (rx.producer() - consumer) & 0xFFFFFFFF
        if not available:
            return []
        count = min(available, limit)
        frames: list[tuple[bytes, int]] = []
        fill_producer = fill.producer()
        rx_map, umem, view, chunk = rx.map, self.umem, self._umem_view, self.frame_size
        stamp_unpack, stamp_size, magic = _RX_STAMP.unpack_from, _RX_STAMP.size, RX_STAMP_MAGIC
        for step in range(count):
            addr, length, _options = _DESC.unpack_from(
                rx_map, rx.desc_at + ((consumer + step) & rx.mask) * _DESC.size
            )
            stamp = NO_STAMP
            if length >= stamp_size:
                rx_ns, found = stamp_unpack(umem, addr)
                if found == magic:
                    stamp = rx_ns
            frames.append((bytes(view[addr : addr + length]), stamp))
            # Aligned mode: the chunk base goes back, whatever headroom the kernel used.
            _U64.pack_into(
                fill.map,
                fill.desc_at + ((fill_producer + step) & fill.mask) * _U64.size,
                addr - addr % chunk,
            )
        rx.set_consumer(consumer + count)
        fill.set_producer(fill_producer + count)
        self.frames_received += count
        return frames

    def stats(self) -> XskStats:
        """The kernel's drop and ring-full counters for this socket."""
        raw = self.sock.getsockopt(SOL_XDP, XDP_STATISTICS, _STATS.size)
        return XskStats(*_STATS.unpack(raw))

    def close(self) -> None:
        for name in ("rx", "fill", "completion"):
            ring = getattr(self, name, None)
            if ring is not None:
                ring.close()
                setattr(self, name, None)
        self.sock.close()
        view = getattr(self, "_umem_view", None)
        if view is not None:
            view.release()
            self._umem_view = None  # type: ignore[assignment]
        # The kernel pinned the UMEM pages; they are released with the socket above.
        if not self.umem.closed:
            with contextlib.suppress(BufferError):  # a live export: freed when collected
                self.umem.close()

    def __enter__(self) -> XskSocket:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def udp_payload(frame: bytes, port: int | None = None) -> bytes | None:
    """The UDP payload of an Ethernet/IPv4/UDP frame (optionally only to ``port``), else None."""
    if len(frame) < 42 or frame[12:14] != b"\x08\x00" or frame[23] != 17:
        return None
    ip_header = (frame[14] & 0x0F) * 4
    udp_at = 14 + ip_header
    if port is not None and (frame[udp_at + 2] << 8 | frame[udp_at + 3]) != port:
        return None
    udp_length = frame[udp_at + 4] << 8 | frame[udp_at + 5]
    return frame[udp_at + 8 : udp_at + udp_length]
