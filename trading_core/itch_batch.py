"""Vectorized ITCH 5.0 decoding of whole buffers of NASDAQ-framed messages (2-byte BE length).

Two passes, both numpy: ``frame_starts`` finds where the messages are (the length prefixes chain
each message to the next, so this is a reachability problem over candidate starts), and
``decode_batch`` gathers the records of each type into a contiguous block and views it through a
structured dtype that mirrors the wire layout. Only well-formed frames are handled here (prefix ==
spec length of the type); anything else stops the run and is left to ``itch_file``'s framer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields

import numpy as np
import numpy.typing as npt

from tailsight.trading_core import itch

__all__ = [
    "OUTPUT_DTYPES",
    "WIRE_DTYPES",
    "BatchResult",
    "decode_batch",
    "decode_records",
    "frame_starts",
    "frame_starts_scalar",
]

_TOKEN = re.compile(r"(\d*)([cHIQs])")
_WIRE_CODE = {"H": ">u2", "I": ">u4", "Q": ">u8"}


def _wire_dtype(cls: type[itch.Message]) -> np.dtype[np.void]:
    names = [f.name for f in fields(cls)][3:]
    body = []
    for name, (count, code) in zip(names, _TOKEN.findall(cls.body_layout), strict=True):
        if code in "cs":
            body.append((name, f"S{count or 1}"))
        else:
            body.append((name, _WIRE_CODE[code]))
    # Packed (no alignment padding), exactly as on the wire; the 6-byte timestamp is split.
    return np.dtype(
        [
            ("message_type", "S1"),
            ("stock_locate", ">u2"),
            ("tracking_number", ">u2"),
            ("timestamp_hi", ">u2"),
            ("timestamp_lo", ">u4"),
            *body,
        ]
    )


def _output_dtype(wire: np.dtype[np.void]) -> np.dtype[np.void]:
    names = wire.names or ()
    body = [(n, wire.fields[n][0]) for n in names[5:]] if wire.fields else []
    return np.dtype(
        [
            ("offset", "<i8"),
            ("stock_locate", ">u2"),
            ("tracking_number", ">u2"),
            ("timestamp_ns", "<u8"),
            *body,
        ]
    )


WIRE_DTYPES: dict[bytes, np.dtype[np.void]] = {
    t: _wire_dtype(cls) for t, cls in itch.MESSAGE_CLASSES.items()
}
"""Type byte -> packed big-endian dtype whose itemsize is the spec message length."""

OUTPUT_DTYPES: dict[bytes, np.dtype[np.void]] = {
    t: _output_dtype(d) for t, d in WIRE_DTYPES.items()
}
"""Type byte -> the dtype ``decode_batch`` returns: wire fields, timestamp_ns as uint64, the
message's byte offset in the buffer, field names as in the ``itch`` record classes."""

# Spec length by type byte (0 = unknown type): lets numpy test every position at once.
_SPEC_LENGTH = np.zeros(256, dtype=np.uint8)
for _type, _length in itch.MESSAGE_LENGTHS.items():
    _SPEC_LENGTH[_type[0]] = _length
_MIN_LENGTH = min(itch.MESSAGE_LENGTHS.values())
FRAME_WINDOW = 1 << 18  # bytes framed per numpy pass
_MAX_LENGTH = max(itch.MESSAGE_LENGTHS.values())


def _as_array(buf: bytes | bytearray | memoryview) -> npt.NDArray[np.uint8]:
    return np.frombuffer(buf, dtype=np.uint8)


def frame_starts(
    buf: bytes | bytearray | memoryview, start: int = 0, end: int | None = None
) -> tuple[npt.NDArray[np.int64], int]:
    """Offsets of the length prefixes of the unbroken run of well-formed frames from ``start``.

    Returns (prefix offsets, end of the run). The run stops at the first frame that is not
    ``prefix == spec length of its type`` and complete before ``end``: a zero prefix, a wrong
    length, an unknown type, garbage or a partial frame. Empty run: (empty, start). When the
    run stops short of the buffer's end, its last frame is unconfirmed (nothing after it lines
    up: it may hold inserted bytes) and the one before rests on it alone; ``itch_file`` checks
    both before delivering them, so damaged data should be read through it.
    Works window by window so that temporaries stay small and cache-resident; windows start
    small and grow, so a run that breaks early (a damaged file) costs little.
    """
    stop = len(buf) if end is None else min(end, len(buf))
    runs: list[npt.NDArray[np.int64]] = []
    position, window = start, 1 << 12
    while position < stop:
        prefixes, run_end = _frame_window(buf, position, min(position + window, stop))
        if run_end == position:
            break  # a bad frame right here
        runs.append(prefixes)
        position = run_end
        window = min(window * 4, FRAME_WINDOW)
    if not runs:
        return np.zeros(0, dtype=np.int64), start
    return np.concatenate(runs), position


def _frame_window(
    buf: bytes | bytearray | memoryview, start: int = 0, end: int | None = None
) -> tuple[npt.NDArray[np.int64], int]:
    """``frame_starts`` on one window: temporaries are a few bytes per window byte."""
    data = _as_array(buf)
    stop = len(data) if end is None else min(end, len(data))
    window = data[start:stop]
    size = len(window)
    empty = np.zeros(0, dtype=np.int64)
    if size < 3:
        return empty, start
    # Every spec length is below 256, so a frame's prefix is 0x00 then a byte in the spec length
    # range: a cheap filter on all positions; the type lookup runs on the survivors only.
    high, low = window[:-2], window[1:-1]
    plausible = np.flatnonzero((high == 0) & (low >= _MIN_LENGTH) & (low <= _MAX_LENGTH))
    spec = _SPEC_LENGTH.take(window[plausible + 2])
    matches = low[plausible] == spec
    candidates, lengths = plausible[matches], spec[matches].astype(np.int64)
    if len(candidates) == 0 or candidates[0] != 0:
        return empty, start
    ends = candidates + 2 + lengths
    complete = ends <= size
    candidates, ends = candidates[complete], ends[complete]
    if len(candidates) == 0:
        return empty, start
    count = len(candidates)
    # Fast path: every candidate chains to the next one (no false candidates inside bodies).
    if count == 1 or np.array_equal(ends[:-1], candidates[1:]):
        return candidates + start, int(ends[-1]) + start
    # General case: candidate k jumps to the candidate starting where it ends (or a sentinel);
    # mark everything reachable from candidate 0 by pointer doubling, O(count log count).
    following = np.searchsorted(candidates, ends)
    following_clipped = np.minimum(following, count - 1)
    linked = (following < count) & (candidates[following_clipped] == ends)
    jump = np.where(linked, following, count)
    jump = np.append(jump, count)  # the sentinel jumps to itself
    reached = np.zeros(count + 1, dtype=bool)
    reached[0] = True
    rounds = int(np.ceil(np.log2(count + 1))) + 1
    for _ in range(rounds):
        reached[jump[reached]] = True
        jump = jump[jump]
    chain = candidates[reached[:count]]
    last = int(np.flatnonzero(reached[:count])[-1])
    return chain + start, int(ends[last]) + start


def frame_starts_scalar(
    buf: bytes | bytearray | memoryview, start: int = 0, end: int | None = None
) -> tuple[npt.NDArray[np.int64], int]:
    """Reference (pure Python loop) for ``frame_starts``: same contract, used as a baseline."""
    data = bytes(buf) if not isinstance(buf, bytes) else buf
    stop = len(data) if end is None else min(end, len(data))
    lengths = {t[0]: n for t, n in itch.MESSAGE_LENGTHS.items()}
    starts: list[int] = []
    position = start
    while position + 3 <= stop:
        length = (data[position] << 8) | data[position + 1]
        if length == 0 or lengths.get(data[position + 2]) != length:
            break
        if position + 2 + length > stop:
            break
        starts.append(position)
        position += 2 + length
    return np.asarray(starts, dtype=np.int64), position


@dataclass
class BatchResult:
    """Decoded messages grouped by type, plus the stream order to interleave them back."""

    records: dict[bytes, npt.NDArray[np.void]] = field(default_factory=dict)
    message_starts: npt.NDArray[np.int64] = field(
        default_factory=lambda: np.zeros(0, dtype=np.int64)
    )
    message_types: npt.NDArray[np.uint8] = field(
        default_factory=lambda: np.zeros(0, dtype=np.uint8)
    )
    end: int = 0

    @property
    def count(self) -> int:
        return len(self.message_starts)


def decode_records(
    buf: bytes | bytearray | memoryview, message_starts: npt.NDArray[np.int64]
) -> BatchResult:
    """Decode the messages whose first (type) byte is at each of ``message_starts``."""
    data = _as_array(buf)
    starts = np.asarray(message_starts, dtype=np.int64)
    result = BatchResult(message_starts=starts)
    if len(starts) == 0:
        return result
    types = data[starts]
    result.message_types = types
    for type_value in np.unique(types):
        type_byte = bytes([int(type_value)])
        wire_dtype = WIRE_DTYPES.get(type_byte)
        if wire_dtype is None:
            raise itch.ItchDecodeError(
                f"unknown message type {type_byte!r}", int(starts[types == type_value][0])
            )
        selected = starts[types == type_value]
        length = wire_dtype.itemsize
        if int(selected[-1]) + length > len(data):
            raise itch.ItchDecodeError(f"truncated {type_byte!r} message", int(selected[-1]))
        # One row per message, copied out of a strided window view: no index array needed.
        rows = np.lib.stride_tricks.sliding_window_view(data, length)[selected]
        wire = np.ascontiguousarray(rows).view(wire_dtype).reshape(-1)
        out = np.empty(len(selected), dtype=OUTPUT_DTYPES[type_byte])
        out["offset"] = selected
        out["timestamp_ns"] = (wire["timestamp_hi"].astype(np.uint64) << np.uint64(32)) | wire[
            "timestamp_lo"
        ]
        for name in (wire_dtype.names or ())[1:]:
            if not name.startswith("timestamp_"):
                out[name] = wire[name]
        result.records[type_byte] = out
    return result


def decode_batch(
    buf: bytes | bytearray | memoryview, start: int = 0, end: int | None = None
) -> BatchResult:
    """Frame and decode the unbroken run of well-formed framed messages from ``start``.

    ``result.end`` is where that run stops; it equals ``len(buf)`` for a clean buffer. Meant
    for clean buffers such as ``itch_file.iter_itch_chunks`` yields (see ``frame_starts``).
    """
    prefixes, run_end = frame_starts(buf, start, end)
    result = decode_records(buf, prefixes + 2)
    result.end = run_end
    return result
