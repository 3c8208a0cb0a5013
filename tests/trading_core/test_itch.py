"""ITCH 5.0 codec: spec byte vectors both ways, spec lengths, lossless round trips, errors."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from itch_strategies import any_record
from vectors import ITCH_SPEC_LENGTHS, ITCH_VECTORS

from tailsight.trading_core import itch

ALL_TYPES = sorted(ITCH_SPEC_LENGTHS)


def test_message_lengths_match_the_spec_tables() -> None:
    assert itch.MESSAGE_LENGTHS == ITCH_SPEC_LENGTHS
    assert set(itch.MESSAGE_CLASSES) == set(ITCH_SPEC_LENGTHS)
    assert len(ITCH_SPEC_LENGTHS) == 23
    assert {wire[:1] for wire, _ in ITCH_VECTORS} == set(ITCH_SPEC_LENGTHS)  # a vector per type


@pytest.mark.parametrize(("wire", "record"), ITCH_VECTORS, ids=lambda v: type(v).__name__)
def test_spec_vector_decodes_to_record(wire: bytes, record: itch.Message) -> None:
    assert len(wire) == ITCH_SPEC_LENGTHS[wire[:1]]
    assert itch.decode(wire) == record


@pytest.mark.parametrize(("wire", "record"), ITCH_VECTORS, ids=lambda v: type(v).__name__)
def test_record_encodes_to_spec_vector(wire: bytes, record: itch.Message) -> None:
    assert itch.encode(record) == wire


def test_decode_at_offset_in_a_larger_buffer_and_memoryview() -> None:
    wire = b"".join(w for w, _ in ITCH_VECTORS)
    offset = 0
    for expected_wire, record in ITCH_VECTORS:
        assert itch.decode(memoryview(wire), offset) == record
        offset += len(expected_wire)
    assert offset == len(wire)


# -- lossless round trips -------------------------------------------------------------------


@settings(max_examples=300)
@given(type_byte=st.sampled_from(ALL_TYPES), data=st.data())
def test_any_bytes_of_a_known_type_round_trip_exactly(
    type_byte: bytes, data: st.DataObject
) -> None:
    body = data.draw(
        st.binary(
            min_size=ITCH_SPEC_LENGTHS[type_byte] - 1, max_size=ITCH_SPEC_LENGTHS[type_byte] - 1
        )
    )
    wire = type_byte + body
    assert itch.encode(itch.decode(wire)) == wire


_ANY_RECORD = any_record


@settings(max_examples=500)
@given(_ANY_RECORD)
def test_record_round_trips_and_has_spec_length(record: itch.Message) -> None:
    wire = itch.encode(record)
    assert len(wire) == ITCH_SPEC_LENGTHS[record.message_type]
    assert wire[:1] == record.message_type
    assert itch.decode(wire) == record


# -- header is at the same place in every message (spec section 1) --------------------------


@given(_ANY_RECORD)
def test_header_fields_are_at_fixed_offsets(record: itch.Message) -> None:
    wire = itch.encode(record)
    assert int.from_bytes(wire[1:3], "big") == record.stock_locate
    assert int.from_bytes(wire[3:5], "big") == record.tracking_number
    assert int.from_bytes(wire[5:11], "big") == record.timestamp_ns


def test_alpha_fields_strip_right_padding_only() -> None:
    record = itch.decode(b"A" + bytes(10) + bytes(8) + b"B" + bytes(4) + b" BRK A  " + bytes(4))
    assert isinstance(record, itch.AddOrder)
    assert record.stock == " BRK A"


def test_records_are_frozen() -> None:
    record = ITCH_VECTORS[0][1]
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.stock_locate = 3  # type: ignore[misc]


# -- errors ---------------------------------------------------------------------------------


def test_unknown_type_reports_offset() -> None:
    with pytest.raises(itch.ItchDecodeError) as info:
        itch.decode(b"\x00\x00Z" + bytes(40), 2)
    assert info.value.offset == 2


def test_truncated_message_reports_offset() -> None:
    wire = ITCH_VECTORS[5][0]
    with pytest.raises(itch.ItchDecodeError) as info:
        itch.decode(b"xx" + wire[:-1], 2)
    assert info.value.offset == 2
    assert "truncated" in str(info.value)


@pytest.mark.parametrize("offset", [-1, 0, 5])
def test_offset_outside_buffer(offset: int) -> None:
    with pytest.raises(itch.ItchDecodeError):
        itch.decode(b"" if offset == 0 else b"S" * 3, offset)


@pytest.mark.parametrize(
    "record",
    [
        itch.AddOrder(1, 1, 1, 1, "B", 100, "TOOLONGSYM", 1),  # alpha wider than 8
        itch.AddOrder(1, 1, 1, 1, "BS", 100, "AAPL", 1),  # 2 chars in a 1-byte field
        itch.AddOrder(1, 1, 1, 1, "", 100, "AAPL", 1),  # empty 1-byte field
        itch.AddOrder(1, 1, 1, -1, "B", 100, "AAPL", 1),  # negative integer
        itch.AddOrder(1, 1, 1, 1, "B", 2**32, "AAPL", 1),  # shares wider than 4 bytes
        itch.AddOrder(0x10000, 1, 1, 1, "B", 1, "AAPL", 1),  # locate wider than 2 bytes
        itch.AddOrder(1, 1, 2**48, 1, "B", 1, "AAPL", 1),  # timestamp wider than 6 bytes
        itch.AddOrder(1, 1, -1, 1, "B", 1, "AAPL", 1),  # negative timestamp
        itch.AddOrder(1, 1, 1, 1, "B", 1, "€", 1),  # not representable in one byte
    ],
)
def test_encode_rejects_out_of_range_fields(record: itch.Message) -> None:
    with pytest.raises(ValueError):
        itch.encode(record)
