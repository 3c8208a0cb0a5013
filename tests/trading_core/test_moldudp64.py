"""MoldUDP64: spec byte vectors, round trips, packing, and the receiver against a lossy network."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from vectors import (
    ITCH_ORDER_DELETE,
    ITCH_SYSTEM_EVENT,
    MOLD_END_OF_SESSION,
    MOLD_HEARTBEAT,
    MOLD_PACKET_TWO_MESSAGES,
    MOLD_REQUEST,
)

from tailsight.trading_core.moldudp64 import (
    HEADER_LENGTH,
    MoldDecodeError,
    MoldPacket,
    MoldReceiver,
    MoldRequest,
    decode_packet,
    decode_request,
    encode_packet,
    encode_request,
    pack_messages,
)

SPEC_VECTORS = [
    (MOLD_PACKET_TWO_MESSAGES, MoldPacket("SESSION001", 1, (ITCH_SYSTEM_EVENT, ITCH_ORDER_DELETE))),
    (MOLD_HEARTBEAT, MoldPacket("SESSION001", 42)),
    (MOLD_END_OF_SESSION, MoldPacket("SESSION001", 1000, (), end_of_session=True)),
]


@pytest.mark.parametrize(("wire", "packet"), SPEC_VECTORS)
def test_spec_vectors_both_ways(wire: bytes, packet: MoldPacket) -> None:
    assert decode_packet(wire) == packet
    assert encode_packet(packet) == wire


def test_request_vector_both_ways() -> None:
    request = MoldRequest("SESSION001", 4, 3)
    assert decode_request(MOLD_REQUEST) == request
    assert encode_request(request) == MOLD_REQUEST


def test_heartbeat_and_end_of_session_flags() -> None:
    assert decode_packet(MOLD_HEARTBEAT).is_heartbeat
    eos = decode_packet(MOLD_END_OF_SESSION)
    assert eos.end_of_session and not eos.is_heartbeat


sessions = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=10)
payloads = st.lists(st.binary(max_size=80), max_size=20).map(tuple)


@given(sessions, st.integers(0, 2**64 - 1), payloads)
def test_packet_round_trip(session: str, sequence: int, messages: tuple[bytes, ...]) -> None:
    packet = MoldPacket(session, sequence, messages)
    wire = encode_packet(packet)
    assert len(wire) == HEADER_LENGTH + sum(2 + len(m) for m in messages)
    assert decode_packet(wire) == packet


@given(sessions, st.integers(0, 2**64 - 1), st.integers(1, 0xFFFE))
def test_request_round_trip(session: str, sequence: int, count: int) -> None:
    request = MoldRequest(session, sequence, count)
    assert decode_request(encode_request(request)) == request


@pytest.mark.parametrize(
    "wire",
    [
        MOLD_PACKET_TWO_MESSAGES[:19],  # short header
        MOLD_PACKET_TWO_MESSAGES[:-1],  # last block truncated
        MOLD_PACKET_TWO_MESSAGES + b"\x00",  # trailing byte
        MOLD_PACKET_TWO_MESSAGES[:20 + 2 + 12],  # count says 2, one block present
        MOLD_END_OF_SESSION + b"\x00\x00",  # end of session with a payload
    ],
)  # fmt: skip
def test_malformed_packets_are_rejected(wire: bytes) -> None:
    with pytest.raises(MoldDecodeError):
        decode_packet(wire)


def test_encode_rejects_invalid_packets() -> None:
    with pytest.raises(ValueError):
        encode_packet(MoldPacket("TOO-LONG-SESSION", 1))
    with pytest.raises(ValueError):
        encode_packet(MoldPacket("S", 1, (b"x",), end_of_session=True))
    with pytest.raises(ValueError):
        encode_packet(MoldPacket("S", -1))


# -- packing ---------------------------------------------------------------------------------


@given(
    messages=st.lists(st.binary(min_size=1, max_size=60), max_size=200),
    first=st.integers(1, 2**40),
    max_payload=st.integers(HEADER_LENGTH + 62, 1500),
)
def test_pack_messages_fills_packets_and_preserves_order(
    messages: list[bytes], first: int, max_payload: int
) -> None:
    packets = pack_messages("S1", first, messages, max_payload)
    decoded = [decode_packet(p) for p in packets]
    assert all(len(p) <= max_payload for p in packets)
    assert [m for p in decoded for m in p.messages] == messages
    sequence = first
    for index, packet in enumerate(decoded):
        assert packet.sequence_number == sequence
        sequence += len(packet.messages)
        if index + 1 < len(decoded):  # greedy: the next message would not have fit
            assert len(packets[index]) + 2 + len(decoded[index + 1].messages[0]) > max_payload


def test_pack_messages_rejects_a_message_too_big_for_any_packet() -> None:
    with pytest.raises(ValueError):
        pack_messages("S", 1, [b"x" * 1379], max_payload=1400)
    assert len(pack_messages("S", 1, [b"x" * 1378], max_payload=1400)[0]) == 1400


# -- receiver ------------------------------------------------------------------------------


def packet(sequence: int, *messages: bytes) -> MoldPacket:
    return MoldPacket("SESSION001", sequence, messages)


def test_in_order_delivery() -> None:
    receiver = MoldReceiver()
    delivery = receiver.on_packet(encode_packet(packet(1, b"a", b"b")))
    assert delivery.messages == [(1, b"a"), (2, b"b")] and delivery.request is None
    assert receiver.on_packet(packet(3, b"c")).messages == [(3, b"c")]
    assert receiver.session == "SESSION001" and receiver.next_sequence == 4


def test_gap_is_reported_then_filled_by_retransmission() -> None:
    receiver = MoldReceiver()
    receiver.on_packet(packet(1, b"1", b"2", b"3"))
    delivery = receiver.on_packet(packet(7, b"7", b"8"))
    assert delivery.messages == []
    assert delivery.request == MoldRequest("SESSION001", 4, 3)
    delivery = receiver.on_packet(packet(4, b"4", b"5", b"6"))  # the retransmission
    assert delivery.messages == [(4, b"4"), (5, b"5"), (6, b"6"), (7, b"7"), (8, b"8")]
    assert delivery.request is None


def test_partial_fill_requests_the_rest() -> None:
    receiver = MoldReceiver()
    receiver.on_packet(packet(1, b"1"))
    receiver.on_packet(packet(10, b"10"))
    delivery = receiver.on_packet(packet(2, b"2", b"3"))
    assert [s for s, _ in delivery.messages] == [2, 3]
    assert delivery.request == MoldRequest("SESSION001", 4, 6)


def test_heartbeat_reveals_a_gap_at_the_tail() -> None:
    receiver = MoldReceiver()
    receiver.on_packet(packet(1, b"1"))
    delivery = receiver.on_packet(packet(5))  # heartbeat: next message will be 5
    assert delivery.request == MoldRequest("SESSION001", 2, 3)


def test_duplicates_are_dropped_and_counted() -> None:
    receiver = MoldReceiver()
    receiver.on_packet(packet(1, b"1", b"2"))
    delivery = receiver.on_packet(packet(2, b"2", b"3"))
    assert delivery.messages == [(3, b"3")] and delivery.duplicates == 1
    assert receiver.on_packet(packet(1, b"1")).duplicates == 1
    assert receiver.duplicates == 2 and receiver.delivered == 3


def test_end_of_session_state() -> None:
    receiver = MoldReceiver()
    receiver.on_packet(packet(1, b"1"))
    delivery = receiver.on_packet(MoldPacket("SESSION001", 3, end_of_session=True))
    assert delivery.end_of_session and receiver.ended and not receiver.complete
    assert delivery.request == MoldRequest("SESSION001", 2, 1)
    receiver.on_packet(packet(2, b"2"))
    assert receiver.complete


def test_other_sessions_are_ignored() -> None:
    receiver = MoldReceiver(session="SESSION001")
    assert receiver.on_packet(MoldPacket("OTHER", 1, (b"x",))).messages == []
    assert receiver.foreign_packets == 1 and receiver.next_sequence == 1


def test_request_size_is_capped() -> None:
    receiver = MoldReceiver(max_request=100)
    receiver.on_packet(packet(1_000, b"x"))
    delivery = receiver.on_packet(packet(1_001))
    assert delivery.request == MoldRequest("SESSION001", 1, 100)


@settings(max_examples=150, deadline=None)
@given(
    count=st.integers(1, 300),
    seed=st.integers(0, 2**32),
    loss=st.floats(0, 0.5),
    duplication=st.floats(0, 0.3),
    max_held=st.integers(1, 400),
)
def test_lossy_reordering_network_delivers_everything_once_in_order(
    count: int, seed: int, loss: float, duplication: float, max_held: int
) -> None:
    rng = random.Random(seed)
    messages = [f"message {i}".encode() for i in range(1, count + 1)]
    packets = [decode_packet(p) for p in pack_messages("SESSION001", 1, messages, 120)]
    packets.append(MoldPacket("SESSION001", count + 1, end_of_session=True))
    network = [p for p in packets if rng.random() >= loss] + [
        p for p in packets if rng.random() < duplication
    ]
    rng.shuffle(network)
    network.append(packets[-1])  # the feed keeps announcing the end of the session
    receiver = MoldReceiver(max_held=max_held)
    delivered: list[tuple[int, bytes]] = []
    for arriving in network:
        delivered += receiver.on_packet(encode_packet(arriving)).messages
    rounds = 0
    while not receiver.complete:  # a re-request server answering the receiver's requests
        rounds += 1
        assert rounds < 10_000
        request = receiver.gap()
        assert request is not None
        start, missing = request
        answer = MoldPacket("SESSION001", start, tuple(messages[start - 1 : start - 1 + missing]))
        delivered += receiver.on_packet(answer).messages
    assert delivered == list(enumerate(messages, start=1))
