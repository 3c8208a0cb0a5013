"""Batch decoder: wire dtypes, differential against the per-message codec, framing pass."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from itch_strategies import any_record, framed
from vectors import ITCH_SPEC_LENGTHS, ITCH_VECTORS

from tailsight.trading_core import itch, itch_batch


def _row_as_record(row: np.void, type_byte: bytes) -> itch.Message:
    cls = itch.MESSAGE_CLASSES[type_byte]
    values = []
    for f in dataclasses.fields(cls):
        value = row[f.name]
        if isinstance(value, bytes):
            text = value.decode("latin-1")
            values.append(text.rstrip(" ") if row.dtype[f.name].itemsize > 1 else text)
        else:
            values.append(int(value))
    return cls(*values)


def _batch_in_stream_order(result: itch_batch.BatchResult) -> list[itch.Message]:
    by_offset: dict[int, itch.Message] = {}
    for type_byte, rows in result.records.items():
        for row in rows:
            by_offset[int(row["offset"])] = _row_as_record(row, type_byte)
    return [by_offset[int(start)] for start in result.message_starts]


def test_wire_dtypes_have_the_spec_lengths() -> None:
    assert {t: d.itemsize for t, d in itch_batch.WIRE_DTYPES.items()} == ITCH_SPEC_LENGTHS


def test_wire_dtype_views_spec_vector_fields_at_spec_offsets() -> None:
    wire = next(w for w, r in ITCH_VECTORS if isinstance(r, itch.AddOrder))
    view = np.frombuffer(wire, dtype=itch_batch.WIRE_DTYPES[b"A"])[0]
    assert view["order_reference_number"] == 123456789
    assert view["stock"] == b"AAPL    "  # the padding is kept, as on the wire
    assert view["price"] == 1_500_000
    assert itch_batch.WIRE_DTYPES[b"A"].fields["price"][1] == 32  # spec offset of Price


def test_spec_vectors_decode_the_same_in_batch() -> None:
    buffer = framed([r for _, r in ITCH_VECTORS])
    result = itch_batch.decode_batch(buffer)
    assert result.end == len(buffer)
    assert _batch_in_stream_order(result) == [r for _, r in ITCH_VECTORS]


@settings(max_examples=150)
@given(st.lists(any_record, max_size=60))
def test_batch_equals_per_message_decoder(records: list[itch.Message]) -> None:
    buffer = framed(records)
    result = itch_batch.decode_batch(buffer)
    assert result.end == len(buffer)
    assert result.count == len(records)
    offsets, position = [], 0
    for record in records:
        offsets.append(position + 2)
        position += 2 + itch.MESSAGE_LENGTHS[record.message_type]
    assert result.message_starts.tolist() == offsets
    per_message = [itch.decode(buffer, offset) for offset in offsets]
    assert _batch_in_stream_order(result) == per_message == records


@settings(max_examples=300)
@given(
    records=st.lists(any_record, min_size=1, max_size=30),
    damage=st.lists(
        st.tuples(st.integers(0, 10**6), st.binary(min_size=1, max_size=6)), max_size=3
    ),
    start=st.integers(0, 4),
    end=st.none() | st.integers(0, 2000),
)
def test_vectorized_framing_equals_the_scalar_loop(
    records: list[itch.Message], damage: list[tuple[int, bytes]], start: int, end: int | None
) -> None:
    buffer = bytearray(framed(records))
    for position, junk in damage:
        at = position % (len(buffer) + 1)
        buffer[at:at] = junk
    fast_starts, fast_end = itch_batch.frame_starts(bytes(buffer), start, end)
    slow_starts, slow_end = itch_batch.frame_starts_scalar(bytes(buffer), start, end)
    assert fast_starts.tolist() == slow_starts.tolist()
    assert fast_end == slow_end


def test_false_candidates_inside_bodies_do_not_break_the_chain() -> None:
    # Shares 0x00002441 puts "00 24 41" (a plausible Add Order frame header) inside the body,
    # so the fast all-candidates-chain path cannot be taken; pointer doubling must sort it out.
    tricky = itch.AddOrder(1, 2, 3, 4, "B", 0x2441, "AB", 0x00244100)
    records = [tricky, itch.OrderDelete(1, 2, 3, 4)] * 50
    buffer = framed(records)
    starts, end = itch_batch.frame_starts(buffer)
    assert end == len(buffer)
    assert starts.tolist() == itch_batch.frame_starts_scalar(buffer)[0].tolist()
    assert _batch_in_stream_order(itch_batch.decode_batch(buffer)) == records


@pytest.mark.parametrize(
    ("damage", "stops_at"),
    [
        (b"\x00\x00", 0),  # zero prefix
        (b"\x00\x05Zhello", 0),  # unknown type
        (b"\x00\x30A" + bytes(0x30 - 1), 0),  # Add Order behind a wrong length
    ],
)
def test_run_stops_at_the_first_bad_frame(damage: bytes, stops_at: int) -> None:
    head = framed([r for _, r in ITCH_VECTORS[:3]])
    tail = framed([r for _, r in ITCH_VECTORS[3:6]])
    starts, end = itch_batch.frame_starts(head + damage + tail)
    assert end == len(head) + stops_at
    assert len(starts) == 3


@pytest.mark.parametrize("junk", [b"\xff\xff", b"\xff\xffA", b"\xff\xffZ" + bytes(40)])
def test_oversized_prefix_stops_the_run(junk: bytes) -> None:
    # Review case 1: a prefix above every spec length (50) is never a frame, whatever follows.
    head = framed([r for _, r in ITCH_VECTORS[:3]])
    tail = framed([r for _, r in ITCH_VECTORS])
    buffer = head + junk + tail
    starts, end = itch_batch.frame_starts(buffer)
    assert (len(starts), end) == (3, len(head))
    assert end == itch_batch.frame_starts_scalar(buffer)[1]


def test_bytes_inserted_inside_a_message_end_the_run_right_after_it() -> None:
    # Review case 2: "00 00" inside message 3. Its frame still looks well-formed, so the run
    # takes it and stops at its (wrong) end: the last frame of a run that stops short of the
    # buffer's end is unconfirmed, which is why itch_file re-checks a run's last frames.
    records = [r for _, r in ITCH_VECTORS]
    clean = framed(records)
    third = len(framed(records[:3]))
    at = third + 2 + 10  # inside the timestamp of message 3
    buffer = clean[:at] + b"\x00\x00" + clean[at:]
    starts, end = itch_batch.frame_starts(buffer)
    assert starts.tolist()[:3] == itch_batch.frame_starts(clean)[0].tolist()[:3]
    assert len(starts) == 4 and starts[3] == third
    assert end == third + 2 + len(itch.encode(records[3])) < len(buffer)


def test_truncated_last_frame_ends_the_run_before_it() -> None:
    buffer = framed([r for _, r in ITCH_VECTORS])
    last = 2 + len(ITCH_VECTORS[-1][0])
    starts, end = itch_batch.frame_starts(buffer[:-1])
    assert end == len(buffer) - last
    assert len(starts) == len(ITCH_VECTORS) - 1


def test_timestamp_is_the_full_48_bits() -> None:
    record = itch.OrderDelete(1, 2, 2**48 - 1, 5)
    rows = itch_batch.decode_batch(framed([record])).records[b"D"]
    assert int(rows["timestamp_ns"][0]) == 2**48 - 1
    assert rows.dtype["timestamp_ns"] == np.dtype("<u8")


def test_decode_records_rejects_unknown_type() -> None:
    with pytest.raises(itch.ItchDecodeError):
        itch_batch.decode_records(b"Zxxxx", np.array([0]))
