"""Hypothesis strategies for ITCH 5.0 records, shared by the codec, batch and file tests."""

from __future__ import annotations

import re

from hypothesis import strategies as st

from tailsight.trading_core import itch

_TOKEN = re.compile(r"(\d*)([cHIQs])")
_INT_BITS = {"H": 16, "I": 32, "Q": 64}
_PRINTABLE = st.characters(min_codepoint=0x20, max_codepoint=0x7E)


def record_strategy(cls: type[itch.Message]) -> st.SearchStrategy[itch.Message]:
    """Records of one class with every field in range (alpha fields printable ASCII)."""
    body: list[st.SearchStrategy[object]] = []
    for count, code in _TOKEN.findall(cls.body_layout):
        if code == "c":
            body.append(_PRINTABLE)
        elif code == "s":
            text = st.text(alphabet=_PRINTABLE, max_size=int(count))
            body.append(text.map(lambda s: s.rstrip(" ")))
        else:
            body.append(st.integers(0, 2 ** _INT_BITS[code] - 1))
    header = [st.integers(0, 0xFFFF), st.integers(0, 0xFFFF), st.integers(0, 2**48 - 1)]
    return st.tuples(*header, *body).map(lambda values: cls(*values))


any_record = st.one_of([record_strategy(c) for c in itch.MESSAGE_CLASSES.values()])


def framed(messages: list[itch.Message]) -> bytes:
    """NASDAQ file framing written out independently of itch_file: 2-byte BE length + message."""
    out = bytearray()
    for message in messages:
        wire = itch.encode(message)
        out += len(wire).to_bytes(2, "big") + wire
    return bytes(out)
