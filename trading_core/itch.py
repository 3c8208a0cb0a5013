"""Nasdaq TotalView-ITCH 5.0 message codec: one frozen record per message type, byte-exact.

Spec: "Nasdaq TotalView-ITCH 5.0" (section numbers below refer to it). All integers are
big-endian and unsigned; alpha fields are ASCII, left justified and padded on the right with
spaces; Price(4) has 4 implied decimals, Price(8) has 8. Every message starts with the same
11-byte header: type (1), stock locate (2), tracking number (2), timestamp (6, ns since midnight).

Decoding is lossless: for any well-typed input, ``encode(decode(b)) == b``. Alpha fields are
returned with their right padding removed (``"AAPL"``), one-byte codes as one-character strings.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, fields
from typing import ClassVar, TypeAlias

__all__ = [
    "MESSAGE_CLASSES",
    "MESSAGE_LENGTHS",
    "NOII",
    "PRICE4_SCALE",
    "PRICE8_SCALE",
    "RPII",
    "AddOrder",
    "AddOrderMPID",
    "BrokenTrade",
    "CrossTrade",
    "DirectListingWithCapitalRaise",
    "ItchDecodeError",
    "LULDAuctionCollar",
    "MWCBDeclineLevel",
    "MWCBStatus",
    "MarketParticipantPosition",
    "Message",
    "OperationalHalt",
    "OrderCancel",
    "OrderDelete",
    "OrderExecuted",
    "OrderExecutedWithPrice",
    "OrderReplace",
    "QuotingPeriodUpdate",
    "RegSHORestriction",
    "StockDirectory",
    "StockTradingAction",
    "SystemEvent",
    "Trade",
    "decode",
    "encode",
]

PRICE4_SCALE = 10_000  # Price(4): integer units of 1e-4 dollars
PRICE8_SCALE = 100_000_000  # Price(8): integer units of 1e-8 dollars (MWCB levels only)
TIMESTAMP_LIMIT_NS = 1 << 48  # the 6-byte timestamp field


class ItchDecodeError(ValueError):
    """A buffer that does not hold a complete, known ITCH 5.0 message at ``offset``."""

    def __init__(self, message: str, offset: int | None = None) -> None:
        super().__init__(message if offset is None else f"{message} (at byte offset {offset})")
        self.offset = offset


# Body layouts use struct codes: "c" a one-byte alpha code, "Ns" an N-byte padded alpha field,
# "H"/"I"/"Q" unsigned 2/4/8-byte integers (prices included). The header is added in front.


@dataclass(frozen=True, slots=True)
class _Header:
    stock_locate: int
    tracking_number: int
    timestamp_ns: int


@dataclass(frozen=True, slots=True)
class SystemEvent(_Header):
    """1.1 System Event ("S"): market/feed events, e.g. "O" start of messages."""

    message_type: ClassVar[bytes] = b"S"
    body_layout: ClassVar[str] = "c"
    event_code: str


@dataclass(frozen=True, slots=True)
class StockDirectory(_Header):
    """1.2.1 Stock Directory ("R"): per-symbol reference data at start of day."""

    message_type: ClassVar[bytes] = b"R"
    body_layout: ClassVar[str] = "8sccIcc2scccccIc"
    stock: str
    market_category: str
    financial_status_indicator: str
    round_lot_size: int
    round_lots_only: str
    issue_classification: str
    issue_sub_type: str
    authenticity: str
    short_sale_threshold_indicator: str
    ipo_flag: str
    luld_reference_price_tier: str
    etp_flag: str
    etp_leverage_factor: int
    inverse_indicator: str


@dataclass(frozen=True, slots=True)
class StockTradingAction(_Header):
    """1.2.2 Stock Trading Action ("H"): halted / paused / quotation-only / trading."""

    message_type: ClassVar[bytes] = b"H"
    body_layout: ClassVar[str] = "8scc4s"
    stock: str
    trading_state: str
    reserved: str
    reason: str


@dataclass(frozen=True, slots=True)
class RegSHORestriction(_Header):
    """1.2.3 Reg SHO Short Sale Price Test Restricted Indicator ("Y")."""

    message_type: ClassVar[bytes] = b"Y"
    body_layout: ClassVar[str] = "8sc"
    stock: str
    reg_sho_action: str


@dataclass(frozen=True, slots=True)
class MarketParticipantPosition(_Header):
    """1.2.4 Market Participant Position ("L"): market maker status per MPID and symbol."""

    message_type: ClassVar[bytes] = b"L"
    body_layout: ClassVar[str] = "4s8sccc"
    mpid: str
    stock: str
    primary_market_maker: str
    market_maker_mode: str
    market_participant_state: str


@dataclass(frozen=True, slots=True)
class MWCBDeclineLevel(_Header):
    """1.2.5.1 MWCB Decline Level ("V"); the three levels are Price(8), i.e. 1e-8 units."""

    message_type: ClassVar[bytes] = b"V"
    body_layout: ClassVar[str] = "QQQ"
    level_1: int
    level_2: int
    level_3: int


@dataclass(frozen=True, slots=True)
class MWCBStatus(_Header):
    """1.2.5.2 MWCB Status ("W"): which decline level was breached."""

    message_type: ClassVar[bytes] = b"W"
    body_layout: ClassVar[str] = "c"
    breached_level: str


@dataclass(frozen=True, slots=True)
class QuotingPeriodUpdate(_Header):
    """1.2.6 IPO Quoting Period Update ("K"); release time is seconds since midnight."""

    message_type: ClassVar[bytes] = b"K"
    body_layout: ClassVar[str] = "8sIcI"
    stock: str
    ipo_quotation_release_time_s: int
    ipo_quotation_release_qualifier: str
    ipo_price: int


@dataclass(frozen=True, slots=True)
class LULDAuctionCollar(_Header):
    """1.2.7 LULD Auction Collar ("J"); all three prices are Price(4), not Price(8)."""

    message_type: ClassVar[bytes] = b"J"
    body_layout: ClassVar[str] = "8sIIII"
    stock: str
    auction_collar_reference_price: int
    upper_auction_collar_price: int
    lower_auction_collar_price: int
    auction_collar_extension: int


@dataclass(frozen=True, slots=True)
class OperationalHalt(_Header):
    """1.2.8 Operational Halt ("h"): a halt on one market center (Q, B or X)."""

    message_type: ClassVar[bytes] = b"h"
    body_layout: ClassVar[str] = "8scc"
    stock: str
    market_code: str
    operational_halt_action: str


@dataclass(frozen=True, slots=True)
class AddOrder(_Header):
    """1.3.1 Add Order, no MPID attribution ("A"); price is Price(4)."""

    message_type: ClassVar[bytes] = b"A"
    body_layout: ClassVar[str] = "QcI8sI"
    order_reference_number: int
    side: str
    shares: int
    stock: str
    price: int


@dataclass(frozen=True, slots=True)
class AddOrderMPID(_Header):
    """1.3.2 Add Order with MPID attribution ("F")."""

    message_type: ClassVar[bytes] = b"F"
    body_layout: ClassVar[str] = "QcI8sI4s"
    order_reference_number: int
    side: str
    shares: int
    stock: str
    price: int
    attribution: str


@dataclass(frozen=True, slots=True)
class OrderExecuted(_Header):
    """1.4.1 Order Executed ("E"): executed at the resting order's price."""

    message_type: ClassVar[bytes] = b"E"
    body_layout: ClassVar[str] = "QIQ"
    order_reference_number: int
    executed_shares: int
    match_number: int


@dataclass(frozen=True, slots=True)
class OrderExecutedWithPrice(_Header):
    """1.4.2 Order Executed With Price ("C"): executed at a price other than the order's."""

    message_type: ClassVar[bytes] = b"C"
    body_layout: ClassVar[str] = "QIQcI"
    order_reference_number: int
    executed_shares: int
    match_number: int
    printable: str
    execution_price: int


@dataclass(frozen=True, slots=True)
class OrderCancel(_Header):
    """1.4.3 Order Cancel ("X"): partial cancellation, the order stays on the book."""

    message_type: ClassVar[bytes] = b"X"
    body_layout: ClassVar[str] = "QI"
    order_reference_number: int
    cancelled_shares: int


@dataclass(frozen=True, slots=True)
class OrderDelete(_Header):
    """1.4.4 Order Delete ("D"): the whole remaining order leaves the book."""

    message_type: ClassVar[bytes] = b"D"
    body_layout: ClassVar[str] = "Q"
    order_reference_number: int


@dataclass(frozen=True, slots=True)
class OrderReplace(_Header):
    """1.4.5 Order Replace ("U"): cancel + add with a new reference number, same side/stock."""

    message_type: ClassVar[bytes] = b"U"
    body_layout: ClassVar[str] = "QQII"
    original_order_reference_number: int
    new_order_reference_number: int
    shares: int
    price: int


@dataclass(frozen=True, slots=True)
class Trade(_Header):
    """1.5.1 Trade, non-cross ("P"): execution against a non-displayed order."""

    message_type: ClassVar[bytes] = b"P"
    body_layout: ClassVar[str] = "QcI8sIQ"
    order_reference_number: int
    side: str
    shares: int
    stock: str
    price: int
    match_number: int


@dataclass(frozen=True, slots=True)
class CrossTrade(_Header):
    """1.5.2 Cross Trade ("Q"); shares is 8 bytes here, unlike every order message."""

    message_type: ClassVar[bytes] = b"Q"
    body_layout: ClassVar[str] = "Q8sIQc"
    shares: int
    stock: str
    cross_price: int
    match_number: int
    cross_type: str


@dataclass(frozen=True, slots=True)
class BrokenTrade(_Header):
    """1.5.3 Broken Trade / Order Execution ("B")."""

    message_type: ClassVar[bytes] = b"B"
    body_layout: ClassVar[str] = "Q"
    match_number: int


@dataclass(frozen=True, slots=True)
class NOII(_Header):
    """1.6 Net Order Imbalance Indicator ("I")."""

    message_type: ClassVar[bytes] = b"I"
    body_layout: ClassVar[str] = "QQc8sIIIcc"
    paired_shares: int
    imbalance_shares: int
    imbalance_direction: str
    stock: str
    far_price: int
    near_price: int
    current_reference_price: int
    cross_type: str
    price_variation_indicator: str


@dataclass(frozen=True, slots=True)
class RPII(_Header):
    """1.7 Retail Price Improvement Indicator ("N")."""

    message_type: ClassVar[bytes] = b"N"
    body_layout: ClassVar[str] = "8sc"
    stock: str
    interest_flag: str


@dataclass(frozen=True, slots=True)
class DirectListingWithCapitalRaise(_Header):
    """1.8 Direct Listing with Capital Raise Price Discovery ("O"); prices Price(4).

    ``near_execution_time`` is an 8-byte integer the spec only calls "the time at which the near
    execution price was set"; it is kept as the raw integer.
    """

    message_type: ClassVar[bytes] = b"O"
    body_layout: ClassVar[str] = "8scIIIQII"
    stock: str
    open_eligibility_status: str
    minimum_allowable_price: int
    maximum_allowable_price: int
    near_execution_price: int
    near_execution_time: int
    lower_price_range_collar: int
    upper_price_range_collar: int


Message: TypeAlias = (
    SystemEvent
    | StockDirectory
    | StockTradingAction
    | RegSHORestriction
    | MarketParticipantPosition
    | MWCBDeclineLevel
    | MWCBStatus
    | QuotingPeriodUpdate
    | LULDAuctionCollar
    | OperationalHalt
    | AddOrder
    | AddOrderMPID
    | OrderExecuted
    | OrderExecutedWithPrice
    | OrderCancel
    | OrderDelete
    | OrderReplace
    | Trade
    | CrossTrade
    | BrokenTrade
    | NOII
    | RPII
    | DirectListingWithCapitalRaise
)

_ALL_CLASSES: tuple[type[Message], ...] = (
    SystemEvent,
    StockDirectory,
    StockTradingAction,
    RegSHORestriction,
    MarketParticipantPosition,
    MWCBDeclineLevel,
    MWCBStatus,
    QuotingPeriodUpdate,
    LULDAuctionCollar,
    OperationalHalt,
    AddOrder,
    AddOrderMPID,
    OrderExecuted,
    OrderExecutedWithPrice,
    OrderCancel,
    OrderDelete,
    OrderReplace,
    Trade,
    CrossTrade,
    BrokenTrade,
    NOII,
    RPII,
    DirectListingWithCapitalRaise,
)

# Header: type, locate, tracking number, then the 6-byte timestamp as a 2-byte high part and a
# 4-byte low part (struct has no 48-bit integer).
_HEADER_LAYOUT = ">cHHHI"


@dataclass(frozen=True, slots=True)
class _Codec:
    cls: type[Message]
    packer: struct.Struct
    field_names: tuple[str, ...]  # body fields, in wire order
    alpha_widths: tuple[tuple[int, int], ...]  # (body field index, width) for every alpha field


def _build_codec(cls: type[Message]) -> _Codec:
    packer = struct.Struct(_HEADER_LAYOUT + cls.body_layout)
    body_names = tuple(f.name for f in fields(cls))[3:]
    # Walk the body layout to learn which fields are alpha and how wide.
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
    if index != len(body_names):
        raise AssertionError(f"{cls.__name__}: layout has {index} fields, class {len(body_names)}")
    return _Codec(cls, packer, body_names, tuple(alpha_widths))


_CODECS: dict[bytes, _Codec] = {cls.message_type: _build_codec(cls) for cls in _ALL_CLASSES}

MESSAGE_CLASSES: dict[bytes, type[Message]] = {t: c.cls for t, c in _CODECS.items()}
"""Type byte -> record class."""

MESSAGE_LENGTHS: dict[bytes, int] = {t: c.packer.size for t, c in _CODECS.items()}
"""Type byte -> total message length in bytes, type byte included (spec section 1)."""


def wire_struct(message_type: bytes) -> struct.Struct:
    """The whole message's layout (header fields, then the body's in wire order) of a type."""
    return _CODECS[message_type].packer


def decode(buf: bytes | bytearray | memoryview, offset: int = 0) -> Message:
    """Decode the one message that starts at ``offset``; its length comes from its type byte."""
    if offset < 0 or offset >= len(buf):
        raise ItchDecodeError("no message: offset outside the buffer", offset)
    type_byte = bytes(buf[offset : offset + 1])
    codec = _CODECS.get(type_byte)
    if codec is None:
        raise ItchDecodeError(f"unknown message type {type_byte!r}", offset)
    if offset + codec.packer.size > len(buf):
        raise ItchDecodeError(
            f"truncated {type_byte!r} message: need {codec.packer.size} bytes, "
            f"have {len(buf) - offset}",
            offset,
        )
    values = codec.packer.unpack_from(buf, offset)
    timestamp_ns = (values[3] << 32) | values[4]
    if not codec.alpha_widths:  # the hot order messages (E, X, D, U) are integers only
        return codec.cls(values[1], values[2], timestamp_ns, *values[5:])
    body: list[object] = list(values[5:])
    for index, width in codec.alpha_widths:
        raw: bytes = body[index]  # type: ignore[assignment]
        # latin-1 maps every byte to one code point, so decode never fails and encode inverts it.
        text = raw.decode("latin-1")
        body[index] = text.rstrip(" ") if width > 1 else text
    return codec.cls(values[1], values[2], timestamp_ns, *body)  # type: ignore[arg-type]


def encode(msg: Message) -> bytes:
    """Encode one message to its exact wire bytes (no framing)."""
    codec = _CODECS.get(msg.message_type)
    if codec is None or type(msg) is not codec.cls:
        raise TypeError(f"not an ITCH 5.0 message: {type(msg).__name__}")
    timestamp_ns = msg.timestamp_ns
    if not 0 <= timestamp_ns < TIMESTAMP_LIMIT_NS:
        raise ValueError(f"timestamp_ns {timestamp_ns} does not fit in 6 bytes")
    body: list[object] = [getattr(msg, name) for name in codec.field_names]
    for index, width in codec.alpha_widths:
        value = body[index]
        if not isinstance(value, str):
            raise ValueError(f"{codec.field_names[index]} must be str, got {value!r}")
        raw = value.encode("latin-1")
        if width == 1 and len(raw) != 1:
            raise ValueError(f"{codec.field_names[index]} must be one character, got {value!r}")
        if len(raw) > width:
            raise ValueError(f"{codec.field_names[index]} {value!r} is longer than {width} bytes")
        body[index] = raw.ljust(width, b" ")
    try:
        return codec.packer.pack(
            msg.message_type,
            msg.stock_locate,
            msg.tracking_number,
            timestamp_ns >> 32,
            timestamp_ns & 0xFFFFFFFF,
            *body,
        )
    except struct.error as error:
        raise ValueError(f"{type(msg).__name__}: field out of range ({error})") from error
