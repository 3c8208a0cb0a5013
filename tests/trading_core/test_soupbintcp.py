"""SoupBinTCP 4.1: spec byte vectors, round trips, and the stream framer under partial reads."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st
from vectors import (
    SOUP_CLIENT_HEARTBEAT,
    SOUP_DEBUG,
    SOUP_END_OF_SESSION,
    SOUP_LOGIN_ACCEPTED,
    SOUP_LOGIN_REJECTED,
    SOUP_LOGIN_REQUEST,
    SOUP_LOGOUT_REQUEST,
    SOUP_SEQUENCED_DATA,
    SOUP_SERVER_HEARTBEAT,
    SOUP_UNSEQUENCED_DATA,
)

from tailsight.trading_core import soupbintcp as soup

SPEC_VECTORS: list[tuple[bytes, soup.Packet]] = [
    (SOUP_LOGIN_REQUEST, soup.LoginRequest("trader", "s3cret", "", 1)),
    (SOUP_LOGIN_ACCEPTED, soup.LoginAccepted("ABC123", 1001)),
    (SOUP_LOGIN_REJECTED, soup.LoginRejected("S")),
    (SOUP_SERVER_HEARTBEAT, soup.ServerHeartbeat()),
    (SOUP_END_OF_SESSION, soup.EndOfSession()),
    (SOUP_CLIENT_HEARTBEAT, soup.ClientHeartbeat()),
    (SOUP_LOGOUT_REQUEST, soup.LogoutRequest()),
    (SOUP_DEBUG, soup.Debug("hello")),
    (SOUP_SEQUENCED_DATA, soup.SequencedData(b"0123456789")),
    (SOUP_UNSEQUENCED_DATA, soup.UnsequencedData(b"abc")),
]


@pytest.mark.parametrize(("wire", "packet"), SPEC_VECTORS, ids=lambda v: type(v).__name__)
def test_spec_vectors_both_ways(wire: bytes, packet: soup.Packet) -> None:
    assert soup.encode(packet) == wire
    assert soup.decode(wire) == (packet, len(wire))


def test_session_and_sequence_accept_right_padding_too() -> None:
    wire = b"\x00\x1fA" + b"ABC123    " + b"1001" + b" " * 16
    assert soup.decode(wire)[0] == soup.LoginAccepted("ABC123", 1001)


_ALNUM = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=6)
packets = st.one_of(
    st.builds(soup.Debug, st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E))),
    st.builds(soup.LoginAccepted, _ALNUM, st.integers(0, 10**20 - 1)),
    st.builds(soup.LoginRejected, st.sampled_from(["A", "S"])),
    st.builds(soup.SequencedData, st.binary(max_size=200)),
    st.builds(soup.UnsequencedData, st.binary(max_size=200)),
    st.builds(
        soup.LoginRequest,
        _ALNUM,
        st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=10),
        _ALNUM,
        st.integers(0, 10**20 - 1),
    ),
    st.sampled_from(
        [soup.ServerHeartbeat(), soup.EndOfSession(), soup.ClientHeartbeat(), soup.LogoutRequest()]
    ),
)


@given(packets)
def test_round_trip(packet: soup.Packet) -> None:
    wire = soup.encode(packet)
    assert int.from_bytes(wire[:2], "big") == len(wire) - 2
    assert wire[2:3] == packet.packet_type
    assert soup.decode(wire) == (packet, len(wire))


@given(st.lists(packets, max_size=20), st.lists(st.integers(0, 400), max_size=30))
def test_framer_reassembles_any_split_of_the_stream(
    stream_packets: list[soup.Packet], cuts: list[int]
) -> None:
    stream = b"".join(soup.encode(p) for p in stream_packets)
    bounds = sorted({c % (len(stream) + 1) for c in cuts} | {0, len(stream)})
    framer = soup.SoupFramer()
    received: list[soup.Packet] = []
    for start, end in itertools.pairwise(bounds):
        received += framer.feed(stream[start:end])
    assert received == stream_packets
    assert framer.buffered == 0


def test_framer_byte_at_a_time_keeps_the_partial_packet() -> None:
    stream = b"".join(w for w, _ in SPEC_VECTORS)
    framer = soup.SoupFramer()
    received = []
    for index in range(len(stream)):
        received += framer.feed(stream[index : index + 1])
        if index == 0:
            assert framer.buffered == 1
    assert received == [p for _, p in SPEC_VECTORS]


@pytest.mark.parametrize(
    "wire",
    [
        b"\x00\x00",  # length 0: no packet type
        b"\x00\x01Q",  # unknown packet type
        b"\x00\x02AX",  # Login Accepted with a 1-byte payload
        b"\x00\x1fA" + b"ABC123    " + b"12x4" + b" " * 16,  # non-numeric sequence number
        b"\x00\x02H!",  # heartbeat with a payload
    ],
)
def test_malformed_packets(wire: bytes) -> None:
    with pytest.raises(soup.SoupDecodeError):
        soup.decode(wire)


def test_framer_error_reports_the_stream_offset() -> None:
    framer = soup.SoupFramer()
    framer.feed(SOUP_SERVER_HEARTBEAT)
    with pytest.raises(soup.SoupDecodeError) as info:
        framer.feed(SOUP_DEBUG + b"\x00\x01Q")
    assert info.value.offset == len(SOUP_SERVER_HEARTBEAT) + len(SOUP_DEBUG)


def test_incomplete_packet_is_not_decoded() -> None:
    with pytest.raises(soup.SoupDecodeError):
        soup.decode(SOUP_LOGIN_ACCEPTED[:-1])


@pytest.mark.parametrize(
    "packet",
    [
        soup.LoginRequest("toolong", "x"),
        soup.LoginRequest("u", "p", "", -1),
        soup.LoginAccepted("ELEVENCHARS", 1),
        soup.LoginAccepted("S", 10**20),  # 21 digits
        soup.SequencedData(b"x" * 0xFFFF),  # type + payload exceed the 2-byte length
    ],
)
def test_encode_rejects_what_does_not_fit(packet: soup.Packet) -> None:
    with pytest.raises(ValueError):
        soup.encode(packet)
