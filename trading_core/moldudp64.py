"""MoldUDP64 1.0: packets that carry sequenced messages over UDP, and a sequence-tracking receiver.

Spec: "MoldUDP64 Protocol Specification" (Nasdaq). Downstream packet = header (Session 10 alpha,
Sequence Number 8 = sequence of the first message in the packet, Message Count 2) followed by
message blocks (Message Length 2, Message Data). A Message Count of 0 is a heartbeat and 0xFFFF
marks the end of the session; both carry the sequence number of the *next* message. A request
packet (Session, Sequence Number, Requested Message Count) asks the re-request server for a range.
All integers big-endian; sequence numbers start at 1.
"""

from __future__ import annotations

import heapq
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = [
    "END_OF_SESSION_COUNT",
    "HEADER_LENGTH",
    "MoldDecodeError",
    "MoldDelivery",
    "MoldPacket",
    "MoldReceiver",
    "MoldRequest",
    "decode_packet",
    "decode_request",
    "encode_packet",
    "encode_request",
    "pack_messages",
]

_HEADER = struct.Struct(">10sQH")
HEADER_LENGTH = _HEADER.size  # 20
END_OF_SESSION_COUNT = 0xFFFF
MAX_MESSAGES_PER_PACKET = 0xFFFE  # 0xFFFF is reserved for end of session
SESSION_LENGTH = 10


class MoldDecodeError(ValueError):
    """A malformed MoldUDP64 packet; ``offset`` is where in the packet it went wrong."""

    def __init__(self, message: str, offset: int | None = None) -> None:
        super().__init__(message if offset is None else f"{message} (at byte offset {offset})")
        self.offset = offset


@dataclass(frozen=True, slots=True)
class MoldPacket:
    """One downstream packet. No messages and not end of session = heartbeat."""

    session: str
    sequence_number: int
    messages: tuple[bytes, ...] = ()
    end_of_session: bool = False

    @property
    def is_heartbeat(self) -> bool:
        return not self.messages and not self.end_of_session

    @property
    def next_sequence_number(self) -> int:
        return self.sequence_number + len(self.messages)


@dataclass(frozen=True, slots=True)
class MoldRequest:
    """A retransmission request for ``count`` messages starting at ``sequence_number``."""

    session: str
    sequence_number: int
    count: int


def _session_bytes(session: str) -> bytes:
    raw = session.encode("ascii")
    if len(raw) > SESSION_LENGTH:
        raise ValueError(f"session {session!r} is longer than {SESSION_LENGTH} bytes")
    return raw.ljust(SESSION_LENGTH, b" ")


def _session_str(raw: bytes) -> str:
    return raw.decode("latin-1").rstrip(" ")


def encode_packet(packet: MoldPacket) -> bytes:
    """Wire bytes of a downstream packet."""
    if packet.end_of_session and packet.messages:
        raise ValueError("an end-of-session packet carries no messages")
    if len(packet.messages) > MAX_MESSAGES_PER_PACKET:
        raise ValueError(f"{len(packet.messages)} messages do not fit one packet")
    count = END_OF_SESSION_COUNT if packet.end_of_session else len(packet.messages)
    try:
        parts = [_HEADER.pack(_session_bytes(packet.session), packet.sequence_number, count)]
    except struct.error as error:
        raise ValueError(f"sequence number out of range: {error}") from error
    for message in packet.messages:
        if len(message) > 0xFFFF:
            raise ValueError(f"message of {len(message)} bytes does not fit a 2-byte length")
        parts.append(len(message).to_bytes(2, "big"))
        parts.append(message)
    return b"".join(parts)


def decode_packet(data: bytes | bytearray | memoryview) -> MoldPacket:
    """Parse a downstream packet; every message block must be complete and nothing may follow."""
    if len(data) < HEADER_LENGTH:
        raise MoldDecodeError(f"packet of {len(data)} bytes is shorter than the header", 0)
    session, sequence_number, count = _HEADER.unpack_from(data, 0)
    if count == END_OF_SESSION_COUNT:
        if len(data) != HEADER_LENGTH:
            raise MoldDecodeError("end-of-session packet with a payload", HEADER_LENGTH)
        return MoldPacket(_session_str(session), sequence_number, (), True)
    view = memoryview(data)
    messages = []
    offset = HEADER_LENGTH
    for index in range(count):
        if offset + 2 > len(data):
            raise MoldDecodeError(f"message block {index} of {count} missing", offset)
        length = (view[offset] << 8) | view[offset + 1]
        if offset + 2 + length > len(data):
            raise MoldDecodeError(f"message block {index} truncated: {length} bytes", offset)
        messages.append(bytes(view[offset + 2 : offset + 2 + length]))
        offset += 2 + length
    if offset != len(data):
        raise MoldDecodeError(f"{len(data) - offset} bytes after {count} message blocks", offset)
    return MoldPacket(_session_str(session), sequence_number, tuple(messages))


def encode_request(request: MoldRequest) -> bytes:
    """Wire bytes of a request packet (same layout as a downstream header)."""
    if not 0 < request.count <= MAX_MESSAGES_PER_PACKET:
        raise ValueError(f"requested count {request.count} out of range")
    try:
        return _HEADER.pack(_session_bytes(request.session), request.sequence_number, request.count)
    except struct.error as error:
        raise ValueError(f"sequence number out of range: {error}") from error


def decode_request(data: bytes | bytearray | memoryview) -> MoldRequest:
    if len(data) != HEADER_LENGTH:
        raise MoldDecodeError(f"request packet must be {HEADER_LENGTH} bytes, is {len(data)}")
    session, sequence_number, count = _HEADER.unpack_from(data, 0)
    return MoldRequest(_session_str(session), sequence_number, count)


def pack_messages(
    session: str, first_seq: int, messages: Iterable[bytes], max_payload: int = 1400
) -> list[bytes]:
    """Split messages into as few packets as fit ``max_payload`` bytes each (header included)."""
    packets: list[bytes] = []
    batch: list[bytes] = []
    size = HEADER_LENGTH
    sequence = first_seq
    for message in messages:
        block = 2 + len(message)
        if HEADER_LENGTH + block > max_payload:
            raise ValueError(f"message of {len(message)} bytes cannot fit a {max_payload} packet")
        if size + block > max_payload or len(batch) == MAX_MESSAGES_PER_PACKET:
            packets.append(encode_packet(MoldPacket(session, sequence, tuple(batch))))
            sequence += len(batch)
            batch, size = [], HEADER_LENGTH
        batch.append(message)
        size += block
    if batch:
        packets.append(encode_packet(MoldPacket(session, sequence, tuple(batch))))
    return packets


@dataclass
class MoldDelivery:
    """What one packet changed: messages now deliverable in order, a range to re-request."""

    messages: list[tuple[int, bytes]] = field(default_factory=list)  # (sequence, message)
    request: MoldRequest | None = None
    duplicates: int = 0
    end_of_session: bool = False


@dataclass
class MoldReceiver:
    """Sequence tracking for one session: in-order delivery, gaps, duplicates, end of session.

    Messages that arrive ahead of a gap are held (up to ``max_held``) and released once the
    gap is filled, e.g. by a retransmission; the gap to re-request is reported on every packet
    that leaves one open. Packets of another session are ignored and counted.
    """

    session: str | None = None  # adopted from the first packet when None
    next_sequence: int = 1
    max_held: int = 100_000
    max_request: int = MAX_MESSAGES_PER_PACKET
    ended: bool = False
    end_sequence: int | None = None  # next sequence announced by the end-of-session packet
    delivered: int = 0
    duplicates: int = 0
    foreign_packets: int = 0
    dropped_held: int = 0
    _held: dict[int, bytes] = field(default_factory=dict, init=False, repr=False)
    # Min-heap of held sequences (entries already released are skipped lazily).
    _held_order: list[int] = field(default_factory=list, init=False, repr=False)
    _highest_seen: int = field(default=0, init=False)  # one past the highest known to exist

    @property
    def complete(self) -> bool:
        """Session over and every message up to its end delivered."""
        return (
            self.ended
            and self.end_sequence is not None
            and (self.next_sequence >= self.end_sequence)
        )

    def gap(self) -> tuple[int, int] | None:
        """(first missing sequence, count) of the oldest open gap, or None."""
        if self._highest_seen <= self.next_sequence:
            return None
        # Everything held is beyond the gap, so the lowest held sequence ends it.
        while self._held_order and self._held_order[0] not in self._held:
            heapq.heappop(self._held_order)
        end = self._held_order[0] if self._held_order else self._highest_seen
        return self.next_sequence, end - self.next_sequence

    def on_packet(self, packet: MoldPacket | bytes) -> MoldDelivery:
        """Feed one received packet (decoded or wire bytes)."""
        if not isinstance(packet, MoldPacket):
            packet = decode_packet(packet)
        delivery = MoldDelivery()
        if self.session is None:
            self.session = packet.session
        elif packet.session != self.session:
            self.foreign_packets += 1
            return delivery
        first = packet.sequence_number
        self._highest_seen = max(self._highest_seen, packet.next_sequence_number)
        if packet.end_of_session:
            self.ended = True
            self.end_sequence = first
        for index, message in enumerate(packet.messages):
            sequence = first + index
            if sequence < self.next_sequence or sequence in self._held:
                delivery.duplicates += 1
            elif sequence == self.next_sequence:
                delivery.messages.append((sequence, message))
                self.next_sequence += 1
                self._release_held(delivery)
            elif len(self._held) < self.max_held:
                self._held[sequence] = message
                heapq.heappush(self._held_order, sequence)
            else:
                self.dropped_held += 1  # will be re-requested with the gap
        self.delivered += len(delivery.messages)
        self.duplicates += delivery.duplicates
        delivery.end_of_session = self.ended
        open_gap = self.gap()
        if open_gap is not None:
            start, count = open_gap
            delivery.request = MoldRequest(self.session, start, min(count, self.max_request))
        return delivery

    def _release_held(self, delivery: MoldDelivery) -> None:
        while self.next_sequence in self._held:
            delivery.messages.append((self.next_sequence, self._held.pop(self.next_sequence)))
            self.next_sequence += 1
