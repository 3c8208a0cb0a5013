"""SoupBinTCP 4.1: Nasdaq's session layer over TCP (login, sequenced delivery, heartbeats).

Spec: "SoupBinTCP 4.1" (Nasdaq). Every packet is Packet Length (2, big-endian, counts the type
byte and the payload but not itself), Packet Type (1 ASCII), payload. Login fields are ASCII:
Username/Password are alpha, left-justified and padded on the right with spaces; Session and the
Sequence Number (a decimal number in ASCII) are padded on the left with spaces (spec: Login
Accepted). Decoding accepts either padding for those two, since implementations differ.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, TypeAlias

__all__ = [
    "ClientHeartbeat",
    "Debug",
    "EndOfSession",
    "LoginAccepted",
    "LoginRejected",
    "LoginRequest",
    "LogoutRequest",
    "Packet",
    "SequencedData",
    "ServerHeartbeat",
    "SoupDecodeError",
    "SoupFramer",
    "UnsequencedData",
    "decode",
    "decode_payload",
    "encode",
]

MAX_PACKET_LENGTH = 0xFFFF  # the length field; it includes the type byte


class SoupDecodeError(ValueError):
    """A malformed SoupBinTCP packet; ``offset`` locates it in the buffer or stream."""

    def __init__(self, message: str, offset: int | None = None) -> None:
        super().__init__(message if offset is None else f"{message} (at byte offset {offset})")
        self.offset = offset


@dataclass(frozen=True, slots=True)
class Debug:
    """ "+": free-form human-readable text, either direction."""

    packet_type: ClassVar[bytes] = b"+"
    text: str


@dataclass(frozen=True, slots=True)
class LoginAccepted:
    """ "A" (server): the session logged into and the next sequence number it will send."""

    packet_type: ClassVar[bytes] = b"A"
    session: str
    sequence_number: int


@dataclass(frozen=True, slots=True)
class LoginRejected:
    """ "J" (server): "A" not authorized, "S" session not available."""

    packet_type: ClassVar[bytes] = b"J"
    reject_reason_code: str


@dataclass(frozen=True, slots=True)
class SequencedData:
    """ "S" (server): one sequenced application message (e.g. an OUCH outbound message)."""

    packet_type: ClassVar[bytes] = b"S"
    message: bytes


@dataclass(frozen=True, slots=True)
class ServerHeartbeat:
    """ "H" (server): sent when nothing else was sent for a second."""

    packet_type: ClassVar[bytes] = b"H"


@dataclass(frozen=True, slots=True)
class EndOfSession:
    """ "Z" (server): the session is over; the server closes the connection."""

    packet_type: ClassVar[bytes] = b"Z"


@dataclass(frozen=True, slots=True)
class LoginRequest:
    """ "L" (client): blank session = the current one; sequence 0 = start at the newest."""

    packet_type: ClassVar[bytes] = b"L"
    username: str
    password: str
    requested_session: str = ""
    requested_sequence_number: int = 1


@dataclass(frozen=True, slots=True)
class UnsequencedData:
    """ "U" (client): one application message (e.g. an OUCH inbound message)."""

    packet_type: ClassVar[bytes] = b"U"
    message: bytes


@dataclass(frozen=True, slots=True)
class ClientHeartbeat:
    """ "R" (client)."""

    packet_type: ClassVar[bytes] = b"R"


@dataclass(frozen=True, slots=True)
class LogoutRequest:
    """ "O" (client)."""

    packet_type: ClassVar[bytes] = b"O"


Packet: TypeAlias = (
    Debug
    | LoginAccepted
    | LoginRejected
    | SequencedData
    | ServerHeartbeat
    | EndOfSession
    | LoginRequest
    | UnsequencedData
    | ClientHeartbeat
    | LogoutRequest
)

_EMPTY: dict[bytes, Packet] = {
    b"H": ServerHeartbeat(),
    b"Z": EndOfSession(),
    b"R": ClientHeartbeat(),
    b"O": LogoutRequest(),
}


def _alpha_left(value: str, width: int, name: str) -> bytes:
    raw = value.encode("ascii")
    if len(raw) > width:
        raise ValueError(f"{name} {value!r} is longer than {width} bytes")
    return raw.ljust(width, b" ")


def _alpha_right(value: str, width: int, name: str) -> bytes:
    raw = value.encode("ascii")
    if len(raw) > width:
        raise ValueError(f"{name} {value!r} is longer than {width} bytes")
    return raw.rjust(width, b" ")


def _numeric(value: int, width: int, name: str) -> bytes:
    if value < 0:
        raise ValueError(f"{name} {value} is negative")
    return _alpha_right(str(value), width, name)


def _parse_numeric(raw: bytes, name: str) -> int:
    text = raw.decode("latin-1").strip(" ")
    if not text.isdigit() or not text.isascii():
        raise SoupDecodeError(f"{name} {raw!r} is not an ASCII decimal number")
    return int(text)


def _payload(packet: Packet) -> bytes:
    if isinstance(packet, Debug):
        return packet.text.encode("ascii")
    if isinstance(packet, LoginAccepted):
        return _alpha_right(packet.session, 10, "session") + _numeric(
            packet.sequence_number, 20, "sequence number"
        )
    if isinstance(packet, LoginRejected):
        return _alpha_left(packet.reject_reason_code, 1, "reject reason code")
    if isinstance(packet, SequencedData | UnsequencedData):
        return packet.message
    if isinstance(packet, LoginRequest):
        return b"".join(
            [
                _alpha_left(packet.username, 6, "username"),
                _alpha_left(packet.password, 10, "password"),
                _alpha_right(packet.requested_session, 10, "requested session"),
                _numeric(packet.requested_sequence_number, 20, "requested sequence number"),
            ]
        )
    return b""


def encode(packet: Packet) -> bytes:
    """Wire bytes of one packet, length prefix included."""
    body = packet.packet_type + _payload(packet)
    if len(body) > MAX_PACKET_LENGTH:
        raise ValueError(f"packet of {len(body)} bytes does not fit the 2-byte length")
    return len(body).to_bytes(2, "big") + body


def encode_unsequenced(message: bytes) -> bytes:
    """``encode(UnsequencedData(message))`` without the packet object (the order path)."""
    if len(message) + 1 > MAX_PACKET_LENGTH:
        raise ValueError(f"packet of {len(message) + 1} bytes does not fit the 2-byte length")
    return (len(message) + 1).to_bytes(2, "big") + b"U" + message


_FIXED_PAYLOAD = {b"A": 30, b"J": 1, b"L": 46, b"H": 0, b"Z": 0, b"R": 0, b"O": 0}


def decode_payload(packet_type: bytes, payload: bytes) -> Packet:
    """Build a packet from its type byte and payload (the bytes after the type)."""
    expected = _FIXED_PAYLOAD.get(packet_type)
    if expected is not None and len(payload) != expected:
        raise SoupDecodeError(
            f"{packet_type!r} packet payload must be {expected} bytes, is {len(payload)}"
        )
    if packet_type in _EMPTY:
        return _EMPTY[packet_type]
    if packet_type == b"S":
        return SequencedData(bytes(payload))
    if packet_type == b"U":
        return UnsequencedData(bytes(payload))
    if packet_type == b"+":
        return Debug(payload.decode("latin-1"))
    if packet_type == b"A":
        return LoginAccepted(
            payload[:10].decode("latin-1").strip(" "),
            _parse_numeric(payload[10:30], "sequence number"),
        )
    if packet_type == b"J":
        return LoginRejected(payload.decode("latin-1"))
    if packet_type == b"L":
        return LoginRequest(
            payload[:6].decode("latin-1").rstrip(" "),
            payload[6:16].decode("latin-1").rstrip(" "),
            payload[16:26].decode("latin-1").strip(" "),
            _parse_numeric(payload[26:46], "requested sequence number"),
        )
    raise SoupDecodeError(f"unknown packet type {packet_type!r}")


def decode(buf: bytes | bytearray | memoryview, offset: int = 0) -> tuple[Packet, int]:
    """Decode the packet at ``offset``; returns it and the offset just past it."""
    if offset + 3 > len(buf):
        raise SoupDecodeError("incomplete packet", offset)
    length = (buf[offset] << 8) | buf[offset + 1]
    if length == 0:
        raise SoupDecodeError("packet length 0 (no packet type)", offset)
    end = offset + 2 + length
    if end > len(buf):
        raise SoupDecodeError(f"incomplete packet: {length} bytes announced", offset)
    packet_type = bytes(buf[offset + 2 : offset + 3])
    try:
        return decode_payload(packet_type, bytes(buf[offset + 3 : end])), end
    except SoupDecodeError as error:
        raise SoupDecodeError(str(error), offset) from None


class SoupFramer:
    """Reassembles packets from a TCP byte stream: feed whatever ``recv`` returned."""

    def __init__(self) -> None:
        self._pending = bytearray()
        self._consumed = 0  # stream offset of _pending[0]

    @property
    def buffered(self) -> int:
        """Bytes received but not yet part of a complete packet."""
        return len(self._pending)

    def feed(self, data: bytes | bytearray | memoryview) -> list[Packet]:
        """Add received bytes; return every packet they complete, in order.

        Raises ``SoupDecodeError`` (offset = stream offset) on a malformed packet; the stream
        cannot be resynchronized after that, as SoupBinTCP has no frame markers.
        """
        self._pending += data
        packets: list[Packet] = []
        position = 0
        pending = self._pending
        while len(pending) - position >= 2:
            length = (pending[position] << 8) | pending[position + 1]
            if length == 0:
                raise SoupDecodeError("packet length 0 (no packet type)", self._consumed + position)
            end = position + 2 + length
            if end > len(pending):
                break
            packet_type = bytes(pending[position + 2 : position + 3])
            try:
                packets.append(decode_payload(packet_type, bytes(pending[position + 3 : end])))
            except SoupDecodeError as error:
                raise SoupDecodeError(str(error), self._consumed + position) from None
            position = end
        del pending[:position]
        self._consumed += position
        return packets
