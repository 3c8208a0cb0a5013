"""Nasdaq OUCH 5.0 order entry codec: inbound (client) and outbound (exchange) messages.

Spec: "OUCH 5.0 Order Entry Specification" (Nasdaq; section 2 inbound, 3 outbound, Appendix A
optional fields). Integers are big-endian and unsigned; alpha fields are left-justified and
padded on the right with spaces; Price fields are 8 bytes with 4 implied decimals; outbound
Timestamps are 8-byte ns since midnight. Orders are identified by UserRefNum (4 bytes,
day-unique and increasing per port). Most messages end with Appendage Length (2) and an
optional appendage of TagValue elements: Length (1, counts tag + value), OptionTag (1), value.

Both directions reuse type letters ("U" is Replace Order inbound, Order Replaced outbound), so
decoding needs the direction: ``decode_inbound`` / ``decode_outbound``. One message is one
SoupBinTCP data packet, so a message is decoded from exactly its bytes.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, ClassVar, TypeAlias

__all__ = [
    "AIQCanceled",
    "AccountQueryRequest",
    "AccountQueryResponse",
    "BrokenTrade",
    "CancelOrder",
    "CancelPending",
    "CancelReject",
    "DisableOrderEntryRequest",
    "DisableOrderEntryResponse",
    "EnableOrderEntryRequest",
    "EnableOrderEntryResponse",
    "EnterOrder",
    "InboundMessage",
    "MassCancelRequest",
    "MassCancelResponse",
    "ModifyOrder",
    "OptionTag",
    "OrderAccepted",
    "OrderCanceled",
    "OrderExecuted",
    "OrderModified",
    "OrderPriorityUpdate",
    "OrderRejected",
    "OrderReplaced",
    "OrderRestated",
    "OuchDecodeError",
    "OutboundMessage",
    "ReplaceOrder",
    "SystemEvent",
    "TagValue",
    "decode_appendage",
    "decode_inbound",
    "decode_outbound",
    "encode",
    "encode_appendage",
]

MARKET_PRICE = 0x7FFFFFFF  # Price value of a market order (cross orders only)


class OuchDecodeError(ValueError):
    """Bytes that are not one complete OUCH 5.0 message; ``offset`` is where it went wrong."""

    def __init__(self, message: str, offset: int | None = None) -> None:
        super().__init__(message if offset is None else f"{message} (at byte offset {offset})")
        self.offset = offset


# -- optional appendage (Appendix A) ---------------------------------------------------------


class OptionTag(enum.IntEnum):
    """OptionTag values of the optional appendage."""

    SECONDARY_ORD_REF_NUM = 1
    FIRM = 2
    MIN_QTY = 3
    CUSTOMER_TYPE = 4
    MAX_FLOOR = 5
    PRICE_TYPE = 6
    PEG_OFFSET = 7
    DISCRETION_PRICE = 9
    DISCRETION_PRICE_TYPE = 10
    DISCRETION_PEG_OFFSET = 11
    POST_ONLY = 12
    RANDOM_RESERVES = 13
    ROUTE = 14
    EXPIRE_TIME = 15
    TRADE_NOW = 16
    HANDLE_INST = 17
    BBO_WEIGHT_INDICATOR = 18
    DISPLAY_QUANTITY = 22
    DISPLAY_PRICE = 23
    GROUP_ID = 24
    SHARES_LOCATED = 25
    LOCATE_BROKER = 26
    SIDE = 27


# Tag -> (value size, kind): "u" unsigned int, "i" signed int (the peg offsets are signed
# Price(4)), "a" alpha. Unknown tags, or a known tag with another size, stay raw bytes.
_OPTION_FORMATS: dict[int, tuple[int, str]] = {
    OptionTag.SECONDARY_ORD_REF_NUM: (8, "u"),
    OptionTag.FIRM: (4, "a"),
    OptionTag.MIN_QTY: (4, "u"),
    OptionTag.CUSTOMER_TYPE: (1, "a"),
    OptionTag.MAX_FLOOR: (4, "u"),
    OptionTag.PRICE_TYPE: (1, "a"),
    OptionTag.PEG_OFFSET: (4, "i"),
    OptionTag.DISCRETION_PRICE: (8, "u"),
    OptionTag.DISCRETION_PRICE_TYPE: (1, "a"),
    OptionTag.DISCRETION_PEG_OFFSET: (4, "i"),
    OptionTag.POST_ONLY: (1, "a"),
    OptionTag.RANDOM_RESERVES: (4, "u"),
    OptionTag.ROUTE: (4, "a"),
    OptionTag.EXPIRE_TIME: (4, "u"),
    OptionTag.TRADE_NOW: (1, "a"),
    OptionTag.HANDLE_INST: (1, "a"),
    OptionTag.BBO_WEIGHT_INDICATOR: (1, "a"),
    OptionTag.DISPLAY_QUANTITY: (4, "u"),
    OptionTag.DISPLAY_PRICE: (8, "u"),
    OptionTag.GROUP_ID: (2, "u"),
    OptionTag.SHARES_LOCATED: (1, "a"),
    OptionTag.LOCATE_BROKER: (4, "a"),
    OptionTag.SIDE: (1, "a"),
}


@dataclass(frozen=True, slots=True)
class TagValue:
    """One appendage element. ``value`` is int/str for known tags, raw bytes otherwise."""

    tag: int
    value: int | str | bytes

    def value_bytes(self) -> bytes:
        if isinstance(self.value, bytes):
            return self.value
        known = _OPTION_FORMATS.get(self.tag)
        if known is None:
            raise ValueError(f"option tag {self.tag} is not known: give its value as bytes")
        size, kind = known
        if kind == "a":
            if not isinstance(self.value, str):
                raise ValueError(f"option {self.tag} takes text, got {self.value!r}")
            raw = self.value.encode("latin-1")
            if len(raw) > size or (size == 1 and len(raw) != 1):
                raise ValueError(f"option {self.tag} value {self.value!r} must fit {size} bytes")
            return raw.ljust(size, b" ")
        if not isinstance(self.value, int):
            raise ValueError(f"option {self.tag} takes an integer, got {self.value!r}")
        try:
            return self.value.to_bytes(size, "big", signed=kind == "i")
        except OverflowError as error:
            raise ValueError(f"option {self.tag} value {self.value} out of range") from error


def encode_appendage(options: tuple[TagValue, ...]) -> bytes:
    """The appendage bytes (without the Appendage Length in front)."""
    out = bytearray()
    for option in options:
        if not 0 <= option.tag <= 0xFF:
            raise ValueError(f"option tag {option.tag} does not fit one byte")
        value = option.value_bytes()
        if 1 + len(value) > 0xFF:
            raise ValueError(f"option {option.tag} value of {len(value)} bytes is too long")
        out += bytes([1 + len(value), option.tag]) + value
    return bytes(out)


def decode_appendage(data: bytes, offset: int = 0) -> tuple[TagValue, ...]:
    """Parse TagValue elements that exactly fill ``data`` (``offset`` only labels errors)."""
    options = []
    position = 0
    while position < len(data):
        length = data[position]  # counts the tag byte and the value
        if length == 0 or position + 1 + length > len(data):
            raise OuchDecodeError(
                f"malformed TagValue element (length {length})", offset + position
            )
        tag = data[position + 1]
        raw = data[position + 2 : position + 1 + length]
        known = _OPTION_FORMATS.get(tag)
        value: int | str | bytes = raw
        if known is not None and known[0] == len(raw):
            if known[1] == "a":
                text = raw.decode("latin-1")
                value = text.rstrip(" ") if len(raw) > 1 else text
            else:
                value = int.from_bytes(raw, "big", signed=known[1] == "i")
        options.append(TagValue(tag, value))
        position += 1 + length
    return tuple(options)


# -- messages ---------------------------------------------------------------------------------
# body_layout: struct codes after the type byte ("c" one-byte alpha, "Ns" N-byte alpha,
# "H"/"I"/"Q" unsigned 2/4/8 bytes). ``appendage`` is None only for a decoded outbound message
# that came without an Appendage Length (older revisions omit it on some outbound types).


@dataclass(frozen=True, slots=True)
class EnterOrder:
    """2.1 Enter Order ("O")."""

    message_type: ClassVar[bytes] = b"O"
    body_layout: ClassVar[str] = "IcI8sQccccc14s"
    user_ref_num: int
    side: str
    quantity: int
    symbol: str
    price: int
    time_in_force: str
    display: str
    capacity: str
    intermarket_sweep_eligibility: str
    cross_type: str
    cl_ord_id: str
    appendage: tuple[TagValue, ...] | None = ()


@dataclass(frozen=True, slots=True)
class ReplaceOrder:
    """2.2 Replace Order ("U"): a new UserRefNum replaces OrigUserRefNum."""

    message_type: ClassVar[bytes] = b"U"
    body_layout: ClassVar[str] = "IIIQccc14s"
    orig_user_ref_num: int
    user_ref_num: int
    quantity: int
    price: int
    time_in_force: str
    display: str
    intermarket_sweep_eligibility: str
    cl_ord_id: str
    appendage: tuple[TagValue, ...] | None = ()


@dataclass(frozen=True, slots=True)
class CancelOrder:
    """2.3 Cancel Order ("X"): reduce the order to ``quantity`` shares (0 cancels it)."""

    message_type: ClassVar[bytes] = b"X"
    body_layout: ClassVar[str] = "II"
    user_ref_num: int
    quantity: int
    appendage: tuple[TagValue, ...] | None = ()


@dataclass(frozen=True, slots=True)
class ModifyOrder:
    """2.4 Modify Order ("M"): change side (e.g. sell <-> short) or reduce quantity."""

    message_type: ClassVar[bytes] = b"M"
    body_layout: ClassVar[str] = "IcI"
    user_ref_num: int
    side: str
    quantity: int
    appendage: tuple[TagValue, ...] | None = ()


@dataclass(frozen=True, slots=True)
class MassCancelRequest:
    """2.5 Mass Cancel Request ("C")."""

    message_type: ClassVar[bytes] = b"C"
    body_layout: ClassVar[str] = "I4s8s"
    user_ref_num: int
    firm: str
    symbol: str
    appendage: tuple[TagValue, ...] | None = ()


@dataclass(frozen=True, slots=True)
class DisableOrderEntryRequest:
    """2.6 Disable Order Entry Request ("D")."""

    message_type: ClassVar[bytes] = b"D"
    body_layout: ClassVar[str] = "I4s"
    user_ref_num: int
    firm: str
    appendage: tuple[TagValue, ...] | None = ()


@dataclass(frozen=True, slots=True)
class EnableOrderEntryRequest:
    """2.7 Enable Order Entry Request ("E")."""

    message_type: ClassVar[bytes] = b"E"
    body_layout: ClassVar[str] = "I4s"
    user_ref_num: int
    firm: str
    appendage: tuple[TagValue, ...] | None = ()


@dataclass(frozen=True, slots=True)
class AccountQueryRequest:
    """2.8 Account Query Request ("Q"): asks for the next UserRefNum to use."""

    message_type: ClassVar[bytes] = b"Q"
    body_layout: ClassVar[str] = ""
    appendage: tuple[TagValue, ...] | None = ()


@dataclass(frozen=True, slots=True)
class SystemEvent:
    """3.1 System Event ("S"): "S" start of day, "E" end of day. No appendage."""

    message_type: ClassVar[bytes] = b"S"
    body_layout: ClassVar[str] = "Qc"
    timestamp_ns: int
    event_code: str


@dataclass(frozen=True, slots=True)
class OrderAccepted:
    """3.2 Order Accepted ("A"); order_reference_number is the one on the ITCH feed."""

    message_type: ClassVar[bytes] = b"A"
    body_layout: ClassVar[str] = "QIcI8sQccQcccc14s"
    timestamp_ns: int
    user_ref_num: int
    side: str
    quantity: int
    symbol: str
    price: int
    time_in_force: str
    display: str
    order_reference_number: int
    capacity: str
    intermarket_sweep_eligibility: str
    cross_type: str
    order_state: str
    cl_ord_id: str
    appendage: tuple[TagValue, ...] | None = ()


@dataclass(frozen=True, slots=True)
class OrderReplaced:
    """3.3 Order Replaced ("U")."""

    message_type: ClassVar[bytes] = b"U"
    body_layout: ClassVar[str] = "QIIcI8sQccQcccc14s"
    timestamp_ns: int
    orig_user_ref_num: int
    user_ref_num: int
    side: str
    quantity: int
    symbol: str
    price: int
    time_in_force: str
    display: str
    order_reference_number: int
    capacity: str
    intermarket_sweep_eligibility: str
    cross_type: str
    order_state: str
    cl_ord_id: str
    appendage: tuple[TagValue, ...] | None = ()


@dataclass(frozen=True, slots=True)
class OrderCanceled:
    """3.4 Order Canceled ("C"); ``quantity`` is the decrement."""

    message_type: ClassVar[bytes] = b"C"
    body_layout: ClassVar[str] = "QIIc"
    timestamp_ns: int
    user_ref_num: int
    quantity: int
    reason: str
    appendage: tuple[TagValue, ...] | None = ()


@dataclass(frozen=True, slots=True)
class AIQCanceled:
    """3.5 AIQ Canceled ("D"): cancel caused by anti-internalization (self-match prevention)."""

    message_type: ClassVar[bytes] = b"D"
    body_layout: ClassVar[str] = "QIIcIQcc"
    timestamp_ns: int
    user_ref_num: int
    decrement_shares: int
    reason: str
    quantity_prevented_from_trading: int
    execution_price: int
    liquidity_flag: str
    aiq_strategy: str
    appendage: tuple[TagValue, ...] | None = ()


@dataclass(frozen=True, slots=True)
class OrderExecuted:
    """3.6 Order Executed ("E")."""

    message_type: ClassVar[bytes] = b"E"
    body_layout: ClassVar[str] = "QIIQcQ"
    timestamp_ns: int
    user_ref_num: int
    quantity: int
    price: int
    liquidity_flag: str
    match_number: int
    appendage: tuple[TagValue, ...] | None = ()


@dataclass(frozen=True, slots=True)
class BrokenTrade:
    """3.7 Broken Trade ("B")."""

    message_type: ClassVar[bytes] = b"B"
    body_layout: ClassVar[str] = "QIQc14s"
    timestamp_ns: int
    user_ref_num: int
    match_number: int
    reason: str
    cl_ord_id: str
    appendage: tuple[TagValue, ...] | None = ()


@dataclass(frozen=True, slots=True)
class OrderRejected:
    """3.8 Rejected ("J"); ``reason`` is a 2-byte numeric code, not a letter."""

    message_type: ClassVar[bytes] = b"J"
    body_layout: ClassVar[str] = "QIH14s"
    timestamp_ns: int
    user_ref_num: int
    reason: int
    cl_ord_id: str
    appendage: tuple[TagValue, ...] | None = ()


@dataclass(frozen=True, slots=True)
class CancelPending:
    """3.9 Cancel Pending ("P")."""

    message_type: ClassVar[bytes] = b"P"
    body_layout: ClassVar[str] = "QI"
    timestamp_ns: int
    user_ref_num: int
    appendage: tuple[TagValue, ...] | None = ()


@dataclass(frozen=True, slots=True)
class CancelReject:
    """3.10 Cancel Reject ("I")."""

    message_type: ClassVar[bytes] = b"I"
    body_layout: ClassVar[str] = "QI"
    timestamp_ns: int
    user_ref_num: int
    appendage: tuple[TagValue, ...] | None = ()


@dataclass(frozen=True, slots=True)
class OrderPriorityUpdate:
    """3.11 Order Priority Update ("T")."""

    message_type: ClassVar[bytes] = b"T"
    body_layout: ClassVar[str] = "QIQcQ"
    timestamp_ns: int
    user_ref_num: int
    price: int
    display: str
    order_reference_number: int
    appendage: tuple[TagValue, ...] | None = ()


@dataclass(frozen=True, slots=True)
class OrderModified:
    """3.12 Order Modified ("M")."""

    message_type: ClassVar[bytes] = b"M"
    body_layout: ClassVar[str] = "QIcI"
    timestamp_ns: int
    user_ref_num: int
    side: str
    quantity: int
    appendage: tuple[TagValue, ...] | None = ()


@dataclass(frozen=True, slots=True)
class OrderRestated:
    """3.13 Order Restated ("R"): e.g. reserve refresh; the new values are in the appendage."""

    message_type: ClassVar[bytes] = b"R"
    body_layout: ClassVar[str] = "QIc"
    timestamp_ns: int
    user_ref_num: int
    reason: str
    appendage: tuple[TagValue, ...] | None = ()


@dataclass(frozen=True, slots=True)
class MassCancelResponse:
    """3.14 Mass Cancel Response ("X")."""

    message_type: ClassVar[bytes] = b"X"
    body_layout: ClassVar[str] = "QI4s8s"
    timestamp_ns: int
    user_ref_num: int
    firm: str
    symbol: str
    appendage: tuple[TagValue, ...] | None = ()


@dataclass(frozen=True, slots=True)
class DisableOrderEntryResponse:
    """3.15 Disable Order Entry Response ("G")."""

    message_type: ClassVar[bytes] = b"G"
    body_layout: ClassVar[str] = "QI4s"
    timestamp_ns: int
    user_ref_num: int
    firm: str
    appendage: tuple[TagValue, ...] | None = ()


@dataclass(frozen=True, slots=True)
class EnableOrderEntryResponse:
    """3.16 Enable Order Entry Response ("K")."""

    message_type: ClassVar[bytes] = b"K"
    body_layout: ClassVar[str] = "QI4s"
    timestamp_ns: int
    user_ref_num: int
    firm: str
    appendage: tuple[TagValue, ...] | None = ()


@dataclass(frozen=True, slots=True)
class AccountQueryResponse:
    """3.17 Account Query Response ("Q")."""

    message_type: ClassVar[bytes] = b"Q"
    body_layout: ClassVar[str] = "QI"
    timestamp_ns: int
    next_user_ref_num: int
    appendage: tuple[TagValue, ...] | None = ()


InboundMessage: TypeAlias = (
    EnterOrder
    | ReplaceOrder
    | CancelOrder
    | ModifyOrder
    | MassCancelRequest
    | DisableOrderEntryRequest
    | EnableOrderEntryRequest
    | AccountQueryRequest
)
OutboundMessage: TypeAlias = (
    SystemEvent
    | OrderAccepted
    | OrderReplaced
    | OrderCanceled
    | AIQCanceled
    | OrderExecuted
    | BrokenTrade
    | OrderRejected
    | CancelPending
    | CancelReject
    | OrderPriorityUpdate
    | OrderModified
    | OrderRestated
    | MassCancelResponse
    | DisableOrderEntryResponse
    | EnableOrderEntryResponse
    | AccountQueryResponse
)
Message: TypeAlias = InboundMessage | OutboundMessage

_INBOUND: tuple[type[InboundMessage], ...] = (
    EnterOrder,
    ReplaceOrder,
    CancelOrder,
    ModifyOrder,
    MassCancelRequest,
    DisableOrderEntryRequest,
    EnableOrderEntryRequest,
    AccountQueryRequest,
)
_OUTBOUND: tuple[type[OutboundMessage], ...] = (
    SystemEvent,
    OrderAccepted,
    OrderReplaced,
    OrderCanceled,
    AIQCanceled,
    OrderExecuted,
    BrokenTrade,
    OrderRejected,
    CancelPending,
    CancelReject,
    OrderPriorityUpdate,
    OrderModified,
    OrderRestated,
    MassCancelResponse,
    DisableOrderEntryResponse,
    EnableOrderEntryResponse,
    AccountQueryResponse,
)


@dataclass(frozen=True, slots=True)
class _Codec:
    cls: type[Message]
    packer: struct.Struct  # type byte + fixed fields
    field_names: tuple[str, ...]  # fixed fields in wire order
    alpha_widths: tuple[tuple[int, int], ...]  # (field index, width) of alpha fields
    has_appendage: bool


def _build_codec(cls: type[Message]) -> _Codec:
    packer = struct.Struct(">c" + cls.body_layout)
    names = tuple(f.name for f in fields(cls) if f.name != "appendage")
    alpha_widths: list[tuple[int, int]] = []
    index, count = 0, ""
    for char in cls.body_layout:
        if char.isdigit():
            count += char
            continue
        if char in "cs":
            alpha_widths.append((index, int(count or "1")))
        index += 1
        count = ""
    if index != len(names):
        raise AssertionError(f"{cls.__name__}: layout has {index} fields, class {len(names)}")
    has_appendage = any(f.name == "appendage" for f in fields(cls))
    return _Codec(cls, packer, names, tuple(alpha_widths), has_appendage)


_INBOUND_CODECS = {cls.message_type: _build_codec(cls) for cls in _INBOUND}
_OUTBOUND_CODECS = {cls.message_type: _build_codec(cls) for cls in _OUTBOUND}

INBOUND_LENGTHS: dict[bytes, int] = {
    t: c.packer.size + (2 if c.has_appendage else 0) for t, c in _INBOUND_CODECS.items()
}
"""Type byte -> length with an empty appendage (Appendage Length included)."""
OUTBOUND_LENGTHS: dict[bytes, int] = {
    t: c.packer.size + (2 if c.has_appendage else 0) for t, c in _OUTBOUND_CODECS.items()
}


def encode(msg: Message) -> bytes:
    """Wire bytes of one message, Appendage Length and appendage included."""
    codec = (_INBOUND_CODECS if isinstance(msg, _INBOUND) else _OUTBOUND_CODECS).get(
        msg.message_type
    )
    if codec is None or type(msg) is not codec.cls:
        raise TypeError(f"not an OUCH 5.0 message: {type(msg).__name__}")
    values: list[object] = [getattr(msg, name) for name in codec.field_names]
    for index, width in codec.alpha_widths:
        value = values[index]
        if not isinstance(value, str):
            raise ValueError(f"{codec.field_names[index]} must be str, got {value!r}")
        raw = value.encode("latin-1")
        if (width == 1 and len(raw) != 1) or len(raw) > width:
            raise ValueError(f"{codec.field_names[index]} {value!r} does not fit {width} bytes")
        values[index] = raw.ljust(width, b" ")
    try:
        fixed = codec.packer.pack(msg.message_type, *values)
    except struct.error as error:
        raise ValueError(f"{type(msg).__name__}: field out of range ({error})") from error
    if not codec.has_appendage:
        return fixed
    appendage: tuple[TagValue, ...] | None = getattr(msg, "appendage", ())
    if appendage is None:
        return fixed
    body = encode_appendage(appendage)
    if len(body) > 0xFFFF:
        raise ValueError("appendage longer than 65535 bytes")
    return fixed + len(body).to_bytes(2, "big") + body


_ENTER_ORDER = struct.Struct(">cIcI8sQccccc14sH")  # EnterOrder, empty appendage (length 0)
_CHAR: dict[str, bytes] = {
    chr(code): bytes([code]) for code in range(256)
}  # latin-1, one byte each
_SYMBOLS: dict[str, bytes] = {}  # symbol -> its padded field: a day trades few symbols


def encode_enter_order(
    user_ref_num: int,
    side: str,
    quantity: int,
    symbol: str,
    price: int,
    time_in_force: str,
    display: str,
    capacity: str,
    intermarket_sweep_eligibility: str,
    cross_type: str,
    cl_ord_id: str,
) -> bytes:
    """``encode(EnterOrder(...))`` without building the message: the order path's hot call.

    Same bytes for valid fields; a bad field (a wrong width, out of range) raises ValueError.
    """
    if len(symbol) > 8 or len(cl_ord_id) > 14:  # struct's "Ns" would cut them silently
        raise ValueError(f"EnterOrder: symbol {symbol!r} or ClOrdID {cl_ord_id!r} too long")
    try:
        symbol_field = _SYMBOLS.get(symbol)
        if symbol_field is None:
            symbol_field = symbol.encode("latin-1").ljust(8)
            if len(_SYMBOLS) < 10_000:
                _SYMBOLS[symbol] = symbol_field
        char = _CHAR
        return _ENTER_ORDER.pack(
            b"O",
            user_ref_num,
            char[side],
            quantity,
            symbol_field,
            price,
            char[time_in_force],
            char[display],
            char[capacity],
            char[intermarket_sweep_eligibility],
            char[cross_type],
            cl_ord_id.encode("latin-1").ljust(14),
            0,
        )
    except KeyError as error:  # not one latin-1 character
        raise ValueError(f"EnterOrder: {error} is not a one-character code") from error
    except (struct.error, UnicodeEncodeError) as error:
        raise ValueError(f"EnterOrder: field out of range ({error})") from error


def _decode(data: bytes | bytearray | memoryview, codecs: dict[bytes, _Codec]) -> Message:
    data = bytes(data)
    if not data:
        raise OuchDecodeError("empty message", 0)
    codec = codecs.get(data[:1])
    if codec is None:
        raise OuchDecodeError(f"unknown message type {data[:1]!r}", 0)
    fixed = codec.packer.size
    if len(data) < fixed:
        raise OuchDecodeError(f"{data[:1]!r} message of {len(data)} bytes, need {fixed}", 0)
    build: Callable[..., Message] = (
        codec.cls
    )  # the layout check in _build_codec guarantees the field count
    values: list[Any] = list(codec.packer.unpack_from(data, 0)[1:])
    for index, width in codec.alpha_widths:
        text = values[index].decode("latin-1")
        values[index] = text.rstrip(" ") if width > 1 else text
    if not codec.has_appendage:
        if len(data) != fixed:
            raise OuchDecodeError(f"{len(data) - fixed} bytes after the message", fixed)
        return build(*values)
    if len(data) == fixed:
        return build(*values, appendage=None)
    if len(data) < fixed + 2:
        raise OuchDecodeError("truncated Appendage Length", fixed)
    length = int.from_bytes(data[fixed : fixed + 2], "big")
    if fixed + 2 + length != len(data):
        raise OuchDecodeError(
            f"Appendage Length {length} but {len(data) - fixed - 2} bytes follow", fixed
        )
    appendage = decode_appendage(data[fixed + 2 :], fixed + 2)
    return build(*values, appendage=appendage)


def decode_inbound(data: bytes | bytearray | memoryview) -> InboundMessage:
    """Decode one client-to-exchange message from exactly its bytes."""
    return _decode(data, _INBOUND_CODECS)  # type: ignore[return-value]


def decode_outbound(data: bytes | bytearray | memoryview) -> OutboundMessage:
    """Decode one exchange-to-client message from exactly its bytes."""
    return _decode(data, _OUTBOUND_CODECS)  # type: ignore[return-value]
