"""OUCH 5.0: spec byte vectors, lengths, the TLV appendage, directions, round trips."""

from __future__ import annotations

import dataclasses
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from vectors import (
    OUCH_ACCOUNT_QUERY_REQUEST,
    OUCH_CANCEL_ORDER,
    OUCH_ENTER_ORDER,
    OUCH_MODIFY_ORDER,
    OUCH_ORDER_ACCEPTED,
    OUCH_ORDER_CANCELED,
    OUCH_ORDER_CANCELED_WITHOUT_APPENDAGE_LENGTH,
    OUCH_ORDER_EXECUTED,
    OUCH_ORDER_REJECTED,
    OUCH_ORDER_REPLACED,
    OUCH_REPLACE_ORDER,
    OUCH_SYSTEM_EVENT,
)

from tailsight.trading_core import ouch
from tailsight.trading_core import soupbintcp as soup
from tailsight.trading_core.ouch import OptionTag, TagValue

T = 34_200_000_012_345
GSCO = TagValue(OptionTag.FIRM, "GSCO")

INBOUND_VECTORS: list[tuple[bytes, ouch.InboundMessage]] = [
    (
        OUCH_ENTER_ORDER,
        ouch.EnterOrder(
            7, "B", 300, "AAPL", 1_500_100, "0", "Y", "A", "N", "N", "ORDER-0000007",
            (GSCO, TagValue(3, 100), TagValue(7, -100), TagValue(99, b"\x01\x02")),
        ),
    ),
    (
        OUCH_REPLACE_ORDER,
        ouch.ReplaceOrder(7, 8, 200, 1_500_000, "0", "Y", "N", "ORDER-0000008"),
    ),
    (OUCH_CANCEL_ORDER, ouch.CancelOrder(8, 0)),
    (OUCH_MODIFY_ORDER, ouch.ModifyOrder(8, "T", 100)),
    (OUCH_ACCOUNT_QUERY_REQUEST, ouch.AccountQueryRequest()),
]  # fmt: skip

OUTBOUND_VECTORS: list[tuple[bytes, ouch.OutboundMessage]] = [
    (OUCH_SYSTEM_EVENT, ouch.SystemEvent(T, "S")),
    (
        OUCH_ORDER_ACCEPTED,
        ouch.OrderAccepted(
            T, 7, "B", 300, "AAPL", 1_500_100, "0", "Y", 123456789, "A", "N", "N", "L",
            "ORDER-0000007", (GSCO,),
        ),
    ),
    (
        OUCH_ORDER_REPLACED,
        ouch.OrderReplaced(
            T, 7, 8, "B", 200, "AAPL", 1_500_000, "0", "Y", 123456790, "A", "N", "N", "L",
            "ORDER-0000008",
        ),
    ),
    (OUCH_ORDER_CANCELED, ouch.OrderCanceled(T, 8, 200, "U")),
    (OUCH_ORDER_EXECUTED, ouch.OrderExecuted(T, 7, 100, 1_500_100, "A", 1000)),
    (OUCH_ORDER_REJECTED, ouch.OrderRejected(T, 9, 0x17, "ORDER-0000009")),
]  # fmt: skip

# Lengths with an empty appendage, summed by hand from the spec tables (2.x and 3.x).
SPEC_INBOUND_LENGTHS = {b"O": 47, b"U": 40, b"X": 11, b"M": 12, b"C": 19, b"D": 11, b"E": 11,
                        b"Q": 3}  # fmt: skip
SPEC_OUTBOUND_LENGTHS = {
    b"S": 10, b"A": 64, b"U": 68, b"C": 20, b"D": 34, b"E": 36, b"B": 38, b"J": 31, b"P": 15,
    b"I": 15, b"T": 32, b"M": 20, b"R": 16, b"X": 27, b"G": 19, b"K": 19, b"Q": 15,
}  # fmt: skip


def test_lengths_match_the_spec_tables() -> None:
    assert ouch.INBOUND_LENGTHS == SPEC_INBOUND_LENGTHS
    assert ouch.OUTBOUND_LENGTHS == SPEC_OUTBOUND_LENGTHS


@pytest.mark.parametrize(("wire", "message"), INBOUND_VECTORS, ids=lambda v: type(v).__name__)
def test_inbound_vectors_both_ways(wire: bytes, message: ouch.InboundMessage) -> None:
    assert ouch.encode(message) == wire
    assert ouch.decode_inbound(wire) == message


@pytest.mark.parametrize(("wire", "message"), OUTBOUND_VECTORS, ids=lambda v: type(v).__name__)
def test_outbound_vectors_both_ways(wire: bytes, message: ouch.OutboundMessage) -> None:
    assert ouch.encode(message) == wire
    assert ouch.decode_outbound(wire) == message


def test_the_direction_decides_what_a_type_letter_means() -> None:
    assert isinstance(ouch.decode_inbound(OUCH_REPLACE_ORDER), ouch.ReplaceOrder)
    assert isinstance(ouch.decode_outbound(OUCH_ORDER_REPLACED), ouch.OrderReplaced)
    with pytest.raises(ouch.OuchDecodeError):
        ouch.decode_outbound(OUCH_REPLACE_ORDER)  # 40 bytes cannot be an Order Replaced


def test_outbound_without_appendage_length_round_trips() -> None:
    message = ouch.decode_outbound(OUCH_ORDER_CANCELED_WITHOUT_APPENDAGE_LENGTH)
    assert message == ouch.OrderCanceled(T, 8, 200, "U", appendage=None)
    assert ouch.encode(message) == OUCH_ORDER_CANCELED_WITHOUT_APPENDAGE_LENGTH


# -- appendage -------------------------------------------------------------------------------


def test_known_tag_of_unexpected_size_stays_raw() -> None:
    options = ouch.decode_appendage(bytes([3, OptionTag.MIN_QTY, 0, 100]))
    assert options == (TagValue(OptionTag.MIN_QTY, b"\x00\x64"),)
    assert ouch.encode_appendage(options) == bytes([3, OptionTag.MIN_QTY, 0, 100])


@pytest.mark.parametrize(
    "appendage",
    [
        bytes([0, 2]),  # element length 0 (must count at least the tag)
        bytes([5, 2, 65, 66]),  # element runs past the end
        bytes([1]),  # length without a tag
    ],
)
def test_malformed_appendage(appendage: bytes) -> None:
    with pytest.raises(ouch.OuchDecodeError):
        ouch.decode_appendage(appendage)


@pytest.mark.parametrize(
    "wire",
    [
        OUCH_CANCEL_ORDER[:-1],  # half an Appendage Length
        OUCH_CANCEL_ORDER[:-2] + b"\x00\x05",  # Appendage Length beyond the message
        OUCH_CANCEL_ORDER + b"\x00",  # a byte after an empty appendage
        OUCH_CANCEL_ORDER[:4],  # truncated fixed part
        b"Z" + bytes(20),  # unknown type
        b"",
    ],
)
def test_malformed_inbound(wire: bytes) -> None:
    with pytest.raises(ouch.OuchDecodeError):
        ouch.decode_inbound(wire)


def test_system_event_has_no_appendage() -> None:
    with pytest.raises(ouch.OuchDecodeError):
        ouch.decode_outbound(OUCH_SYSTEM_EVENT + b"\x00\x00")


@pytest.mark.parametrize(
    "message",
    [
        ouch.CancelOrder(1, 2**32),  # quantity wider than 4 bytes
        ouch.EnterOrder(1, "BB", 1, "A", 1, "0", "Y", "A", "N", "N", "x"),  # 2-char side
        ouch.EnterOrder(1, "B", 1, "TOOLONGSYM", 1, "0", "Y", "A", "N", "N", "x"),
        ouch.CancelOrder(1, 0, (TagValue(99, 5),)),  # unknown tag needs raw bytes
        ouch.CancelOrder(1, 0, (TagValue(OptionTag.MIN_QTY, 2**32),)),
        ouch.CancelOrder(1, 0, (TagValue(OptionTag.PEG_OFFSET, 2**31),)),  # signed 4 bytes
        ouch.CancelOrder(1, 0, (TagValue(OptionTag.FIRM, "TOOLONG"),)),
        ouch.CancelOrder(1, 0, (TagValue(OptionTag.FIRM, 5),)),
        ouch.CancelOrder(1, 0, (TagValue(256, b""),)),
    ],
)
def test_encode_rejects_what_does_not_fit(message: ouch.InboundMessage) -> None:
    with pytest.raises(ValueError):
        ouch.encode(message)


# -- round trips -------------------------------------------------------------------------------

_TOKEN = re.compile(r"(\d*)([cHIQs])")
_PRINTABLE = st.characters(min_codepoint=0x20, max_codepoint=0x7E)
_OPTION_VALUES = {
    "u": lambda size: st.integers(0, 2 ** (8 * size) - 1),
    "i": lambda size: st.integers(-(2 ** (8 * size - 1)), 2 ** (8 * size - 1) - 1),
}
_KNOWN = {  # Appendix A sizes and kinds, written out again for the test
    1: (8, "u"), 2: (4, "a"), 3: (4, "u"), 4: (1, "a"), 5: (4, "u"), 6: (1, "a"), 7: (4, "i"),
    9: (8, "u"), 10: (1, "a"), 11: (4, "i"), 12: (1, "a"), 13: (4, "u"), 14: (4, "a"),
    15: (4, "u"), 16: (1, "a"), 17: (1, "a"), 18: (1, "a"), 22: (4, "u"), 23: (8, "u"),
    24: (2, "u"), 25: (1, "a"), 26: (4, "a"), 27: (1, "a"),
}  # fmt: skip


def _option(tag: int) -> st.SearchStrategy[TagValue]:
    if tag not in _KNOWN:
        return st.binary(max_size=20).map(lambda raw: TagValue(tag, raw))
    size, kind = _KNOWN[tag]
    if kind == "a":
        text = _PRINTABLE if size == 1 else st.text(_PRINTABLE, max_size=size).map(str.rstrip)
        return text.map(lambda value: TagValue(tag, value))
    return _OPTION_VALUES[kind](size).map(lambda value: TagValue(tag, value))


options = st.lists(st.integers(0, 255).flatmap(_option), max_size=6).map(tuple)


def _message(cls: type[ouch.Message]) -> st.SearchStrategy[ouch.Message]:
    values: list[st.SearchStrategy[object]] = []
    for count, code in _TOKEN.findall(cls.body_layout):
        if code == "c":
            values.append(_PRINTABLE)
        elif code == "s":
            values.append(st.text(_PRINTABLE, max_size=int(count)).map(str.rstrip))
        else:
            values.append(st.integers(0, 2 ** (8 * {"H": 2, "I": 4, "Q": 8}[code]) - 1))
    has_appendage = any(f.name == "appendage" for f in dataclasses.fields(cls))
    if has_appendage:
        values.append(options)
    return st.tuples(*values).map(lambda v: cls(*v))


INBOUND_CLASSES = [type(m) for _, m in INBOUND_VECTORS] + [
    ouch.MassCancelRequest, ouch.DisableOrderEntryRequest, ouch.EnableOrderEntryRequest,
]  # fmt: skip
OUTBOUND_CLASSES = [
    ouch.SystemEvent, ouch.OrderAccepted, ouch.OrderReplaced, ouch.OrderCanceled,
    ouch.AIQCanceled, ouch.OrderExecuted, ouch.BrokenTrade, ouch.OrderRejected,
    ouch.CancelPending, ouch.CancelReject, ouch.OrderPriorityUpdate, ouch.OrderModified,
    ouch.OrderRestated, ouch.MassCancelResponse, ouch.DisableOrderEntryResponse,
    ouch.EnableOrderEntryResponse, ouch.AccountQueryResponse,
]  # fmt: skip


@settings(max_examples=300)
@given(st.one_of([_message(c) for c in INBOUND_CLASSES]))
def test_inbound_round_trip(message: ouch.InboundMessage) -> None:
    wire = ouch.encode(message)
    assert ouch.decode_inbound(wire) == message
    assert len(wire) >= ouch.INBOUND_LENGTHS[message.message_type]


@settings(max_examples=300)
@given(st.one_of([_message(c) for c in OUTBOUND_CLASSES]))
def test_outbound_round_trip(message: ouch.OutboundMessage) -> None:
    wire = ouch.encode(message)
    assert ouch.decode_outbound(wire) == message


@settings(max_examples=300)
@given(st.sampled_from(sorted(SPEC_OUTBOUND_LENGTHS)), st.binary(max_size=90))
def test_arbitrary_bytes_either_fail_cleanly_or_round_trip_exactly(
    type_byte: bytes, rest: bytes
) -> None:
    wire = type_byte + rest
    try:
        message = ouch.decode_outbound(wire)
    except ouch.OuchDecodeError:
        return
    assert ouch.encode(message) == wire


def test_ouch_rides_in_soupbintcp_data_packets() -> None:
    stream = soup.encode(soup.UnsequencedData(OUCH_ENTER_ORDER)) + soup.encode(
        soup.SequencedData(OUCH_ORDER_ACCEPTED)
    )
    inbound, outbound = soup.SoupFramer().feed(stream)
    assert isinstance(inbound, soup.UnsequencedData)
    assert isinstance(outbound, soup.SequencedData)
    assert ouch.decode_inbound(inbound.message) == INBOUND_VECTORS[0][1]
    assert ouch.decode_outbound(outbound.message) == OUTBOUND_VECTORS[1][1]
