"""NASDAQ binary ITCH files: each message behind a 2-byte big-endian length; plain or gzip.

Reading streams in fixed-size chunks (constant memory) and never crashes on damaged files. A
message is delivered only when its frame is confirmed: prefix == spec length of its type *and*
the frame after it is well-formed (or the stream ends there). A frame followed by anything else
(garbage, an odd frame) reads exactly like a frame with bytes inserted into it, so it is
reported as unconfirmed and dropped, never guessed: damage costs the frames it touches and the
one before it. Zero-length prefixes are skipped; a wrong prefix (at most 50) on a known type is
repaired when its spec length lines up with the two frames after it; anything else, including
any prefix above the longest spec length, is garbage, skipped up to the earliest position where
two consecutive frames line up. Every anomaly is counted in a ``FramingReport`` with its byte
offset in the uncompressed stream.
"""

from __future__ import annotations

import gzip as gzip_module
import os
import tempfile
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import numpy as np
import numpy.typing as npt

from tailsight.trading_core import itch
from tailsight.trading_core.itch_batch import frame_starts

__all__ = [
    "CHUNK_SIZE",
    "FramingIssue",
    "FramingReport",
    "IssueKind",
    "iter_itch",
    "iter_itch_chunks",
    "scan_itch",
    "write_itch",
]

CHUNK_SIZE = 1 << 20
GZIP_MAGIC = b"\x1f\x8b\x08"  # RFC 1952: ID1, ID2, CM = deflate
# ITCH 5.0 messages are at most 50 bytes: a longer prefix is never a frame to skip or wait for.
MAX_SPEC_LENGTH = max(itch.MESSAGE_LENGTHS.values())
# Every ITCH 5.0 message starts with type, stock locate, tracking number and timestamp: a
# shorter frame of unknown type is garbage, not a message to skip.
MIN_MESSAGE_LENGTH = 1 + 2 + 2 + 6
# Runs of zero prefixes between two frames are skipped, up to this many.
MAX_ZERO_PREFIXES_BETWEEN = 64
# Unread bytes needed to judge a frame: itself, a zero run, the frame after it, another zero
# run, the header after that and the frames that may start inside the second (about 420 bytes).
LOOKAHEAD = 1024
# How well the frame after a frame confirms it (``_Framer.successor``).
NONE, WEAK, STRONG = 0, 1, 2


class IssueKind:
    """The kinds of anomaly a ``FramingReport`` counts."""

    ZERO_LENGTH = "zero_length"  # a 0x0000 prefix; skipped
    LENGTH_REPAIRED = "length_repaired"  # prefix (<= 50) != spec, spec length lines up; used
    BAD_LENGTH = "bad_length"  # known type, prefix (11-50) lines up, not the spec length; skipped
    UNKNOWN_TYPE = "unknown_type"  # a frame (11-50 bytes) lines up, type not ITCH 5.0; skipped
    GARBAGE = "garbage"  # bytes no frame accounts for; skipped until resynchronized
    UNCONFIRMED = "unconfirmed"  # well-formed, but the next frame does not line up; dropped
    TRUNCATED = "truncated_tail"  # the stream ends inside a frame
    STREAM_ERROR = "stream_error"  # the gzip layer failed (corrupt or cut); reading stops


@dataclass(frozen=True, slots=True)
class FramingIssue:
    offset: int  # byte offset of the anomaly (its length prefix) in the uncompressed stream
    kind: str
    detail: str


@dataclass
class FramingReport:
    """What a read found: message count, anomaly counts by kind, the first anomalies in detail."""

    max_issues: int = 100
    messages: int = 0
    bytes_read: int = 0
    skipped_bytes: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    issues: list[FramingIssue] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.counts

    def add(self, offset: int, kind: str, detail: str) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1
        if len(self.issues) < self.max_issues:
            self.issues.append(FramingIssue(offset, kind, detail))

    def summary(self) -> str:
        kinds = ", ".join(f"{k}={v}" for k, v in sorted(self.counts.items())) or "clean"
        return f"{self.messages} messages, {self.bytes_read} bytes: {kinds}"


_SPEC = {t[0]: n for t, n in itch.MESSAGE_LENGTHS.items()}
_SPEC_TABLE = np.zeros(256, dtype=np.int64)
for _t, _n in _SPEC.items():
    _SPEC_TABLE[_t] = _n


def _open_stream(path: str | Path) -> BinaryIO:
    """The file's (decompressed) byte stream: gzip when it starts like gzip and inflates."""
    with open(path, "rb") as probe:
        magic = probe.read(len(GZIP_MAGIC))
    if magic == GZIP_MAGIC:
        try:
            with gzip_module.open(path, "rb") as trial:
                trial.read(1)
        except (OSError, EOFError, zlib.error):
            return open(path, "rb")  # only looked like gzip: read it as it is
        return gzip_module.open(path, "rb")  # type: ignore[return-value]
    return open(path, "rb")


class _Framer:
    """Incremental framer over a chunked stream: ``step`` judges the frame at ``pos``."""

    def __init__(self, stream: BinaryIO, report: FramingReport, chunk_size: int) -> None:
        self.stream = stream
        self.report = report
        self.chunk_size = max(chunk_size, 4096)
        self.buf = bytearray()
        self.base = 0  # stream offset of buf[0]
        self.pos = 0  # next unframed byte in buf
        self.eof = False
        self.garbage_start: int | None = None  # stream offset of an open garbage run

    # -- buffer ---------------------------------------------------------------------------

    def fill(self) -> None:
        """Make sure LOOKAHEAD bytes are buffered past ``pos`` unless the stream has ended."""
        while not self.eof and len(self.buf) - self.pos < LOOKAHEAD:
            if self.pos:
                del self.buf[: self.pos]
                self.base += self.pos
                self.pos = 0
            try:
                chunk = self.stream.read(self.chunk_size)
            except (OSError, EOFError, zlib.error) as error:  # a corrupt or cut gzip stream
                self.report.add(
                    self.base + len(self.buf), IssueKind.STREAM_ERROR, f"{error!r}"[:200]
                )
                chunk = b""
            if not chunk:
                self.eof = True
            else:
                self.buf += chunk
                self.report.bytes_read += len(chunk)

    # -- frame tests ----------------------------------------------------------------------

    def prefix(self, at: int) -> int:
        return (self.buf[at] << 8) | self.buf[at + 1]

    def header_ok(self, at: int) -> bool:
        """A well-formed frame header at ``at``: prefix == spec length of the type after it."""
        if at + 3 > len(self.buf):
            return False
        length = self.prefix(at)
        return length != 0 and _SPEC.get(self.buf[at + 2]) == length

    def lines_up(self, at: int) -> bool:
        """Whether a frame may legitimately start at ``at`` (after skipping zero prefixes):
        a well-formed header does, and so does the end of the stream."""
        size = len(self.buf)
        for _ in range(MAX_ZERO_PREFIXES_BETWEEN):
            if at + 3 > size:
                return self.eof  # the end, or a short tail reported as truncated when reached
            if self.prefix(at) != 0:
                return self.header_ok(at)
            at += 2
        return False

    def successor(self, at: int) -> int:
        """How well the frame starting at ``at`` (after zero prefixes) confirms the one before.

        STRONG: the stream ends, or a well-formed frame whose own successor lines up. WEAK: a
        well-formed frame whose successor does not line up and inside which no confirmed frame
        starts (damage after it, or a chance match in the bytes after a frame that gained
        bytes). NONE: anything else, odd frames included: ITCH bodies are full of "00 xx" that
        read as a prefix, so a frame off the spec proves nothing about the one before it.
        """
        size = len(self.buf)
        for _ in range(MAX_ZERO_PREFIXES_BETWEEN):
            if at + 3 > size:
                return STRONG if self.eof else NONE
            length = self.prefix(at)
            if length != 0:
                spec = _SPEC.get(self.buf[at + 2])
                if spec == length:
                    end = at + 2 + length
                    if self.lines_up(end):
                        return STRONG
                    return WEAK if self.find_sync(at + 1, min(end, size)) is None else NONE
                return NONE
            at += 2
        return NONE

    @staticmethod
    def odd_length(length: int) -> bool:
        """Whether a frame off the spec (unknown type, bad length) may be skipped as a frame."""
        return MIN_MESSAGE_LENGTH <= length <= MAX_SPEC_LENGTH

    def repairable(self, at: int, spec: int) -> bool:
        """Whether the frame at ``at`` may be taken with its spec length despite its prefix:
        nothing well-formed starts inside it and the two frames after it line up."""
        end = at + 2 + spec
        return (
            end <= len(self.buf)
            and not self.header_inside(at + 1, end)
            and self.successor(end) == STRONG
        )

    def frame_confirmed(self, at: int, length: int) -> bool:
        """Trust a frame whose prefix is off the spec only if the next frame lines up after it
        and no well-formed frame starts inside it (frames are dense, so landing on one by chance
        is likely; a well-formed header inside a real message is not)."""
        end = at + 2 + length
        return end <= len(self.buf) and self.lines_up(end) and not self.header_inside(at + 1, end)

    def header_inside(self, search_from: int, search_to: int) -> bool:
        """Whether a well-formed frame header starts in [search_from, search_to)."""
        window = np.frombuffer(self.buf, dtype=np.uint8)[search_from : search_to + 2]
        prefix = (window[:-2].astype(np.int64) << 8) | window[1:-1]
        spec = _SPEC_TABLE[window[2:]]
        found = bool(np.any((prefix == spec) & (spec != 0)))
        del window, prefix, spec  # release the buffer export before the buffer may resize
        return found

    # -- stepping -------------------------------------------------------------------------

    def close_garbage(self, at: int) -> None:
        if self.garbage_start is not None:
            skipped = self.base + at - self.garbage_start
            if skipped:
                self.report.skipped_bytes += skipped
                self.report.add(self.garbage_start, IssueKind.GARBAGE, f"skipped {skipped} bytes")
            self.garbage_start = None

    def find_sync(self, search_from: int, search_to: int) -> int | None:
        """First position in [search_from, search_to) where a well-formed frame starts and the
        frame after it lines up: the earliest point where the stream is confirmed again."""
        size = len(self.buf)
        step = 1 << 9  # damage is usually short: look close first, then further
        while search_from < search_to:
            window_end = min(search_to, search_from + step)
            step = min(step * 8, 1 << 16)
            window = np.frombuffer(self.buf, dtype=np.uint8)[search_from : window_end + 2]
            prefix = (window[:-2].astype(np.int64) << 8) | window[1:-1]
            spec = _SPEC_TABLE[window[2:]]
            hits = np.flatnonzero((prefix == spec) & (spec != 0)).tolist()
            lengths = spec[hits].tolist()
            del window, prefix, spec  # release the buffer export before the buffer may resize
            for offset, length in zip(hits, lengths, strict=True):
                candidate = search_from + offset
                following = candidate + 2 + length
                if following <= size and self.lines_up(following):
                    return candidate
            search_from = window_end
        return None

    def resync(self, search_from: int) -> None:
        """Skip bytes from ``pos`` to the next position where two frames line up."""
        if self.garbage_start is None:
            self.garbage_start = self.base + self.pos
        size = len(self.buf)
        # Candidates must leave room to check the following frame unless the stream has ended.
        search_to = size - 2 if self.eof else size - LOOKAHEAD + 1
        found = self.find_sync(search_from, search_to)
        if found is not None:
            self.pos = found
            self.close_garbage(found)
        elif self.eof:
            self.pos = size
            self.close_garbage(size)
        else:
            self.pos = max(self.pos, search_to)  # keep the garbage run open across the refill

    def step(self) -> tuple[int, int] | None:
        """Handle the frame at ``pos``: (buffer start, length) of a message, or None."""
        buf, at, size = self.buf, self.pos, len(self.buf)
        if self.garbage_start is not None:
            # Inside a garbage run only a frame that the next frame confirms ends it.
            self.resync(at)
            return None
        if size - at < 3:
            if at < size:  # at EOF: 1-2 bytes of a prefix, or a prefix with nothing after it
                if size - at == 2 and self.prefix(at) == 0:
                    self.report.add(self.base + at, IssueKind.ZERO_LENGTH, "zero length prefix")
                else:
                    self.report.add(
                        self.base + at, IssueKind.TRUNCATED, f"{size - at} bytes at end of stream"
                    )
                self.pos = size
            return None
        length = self.prefix(at)
        if length == 0:
            if not self.lines_up(at):
                # Not a run of zero prefixes before a real frame: a stray zero byte, say.
                self.resync(at + 1)
                return None
            self.report.add(self.base + at, IssueKind.ZERO_LENGTH, "zero length prefix")
            self.pos = at + 2
            return None
        type_byte = buf[at + 2]
        spec = _SPEC.get(type_byte)
        end = at + 2 + length
        if spec == length:
            confirmation = self.successor(end) if end <= size else NONE
            # A weak successor may be a chance match in the bytes after a frame that lost bytes:
            # then the real next frame starts inside this one, confirmed.
            if confirmation == STRONG or (
                confirmation == WEAK and self.find_sync(at + 1, end) is None
            ):
                self.pos = end
                return at + 2, length
            # Not confirmed. If a confirmed frame starts inside it, this was never a frame (bytes
            # deleted, or garbage that looks like a header); else it may straddle damage (bytes
            # inserted or overwritten in it) or be sound with garbage after it: no way to know.
            inner = self.find_sync(at + 1, min(end, size))
            if inner is not None:
                self.garbage_start = self.base + at
                self.pos = inner
                self.close_garbage(inner)
            elif end > size:  # only at EOF: the buffer holds LOOKAHEAD bytes otherwise
                self.report.add(
                    self.base + at,
                    IssueKind.TRUNCATED,
                    f"{chr(type_byte)!r} frame of {length} bytes, {size - at - 2} present",
                )
                self.pos = size
            else:
                self.report.add(
                    self.base + at,
                    IssueKind.UNCONFIRMED,
                    f"{chr(type_byte)!r} frame of {length} bytes: next frame does not line up",
                )
                self.report.skipped_bytes += 2 + length
                self.pos = end  # what follows is judged afresh: an odd frame, garbage, ...
            return None
        if length > MAX_SPEC_LENGTH:
            # Not a damaged prefix of a known frame nor a frame to skip: garbage (a repair here
            # would turn random bytes with a type letter in them into messages).
            self.resync(at + 1)
            return None
        if spec is not None and self.repairable(at, spec):
            self.report.add(
                self.base + at,
                IssueKind.LENGTH_REPAIRED,
                f"{chr(type_byte)!r} prefix {length}, used spec length {spec}",
            )
            self.pos = at + 2 + spec
            return at + 2, spec
        if self.odd_length(length) and self.frame_confirmed(at, length):
            if spec is not None:
                kind, detail = IssueKind.BAD_LENGTH, f"{chr(type_byte)!r} prefix {length} != {spec}"
            else:
                kind, detail = IssueKind.UNKNOWN_TYPE, f"type 0x{type_byte:02x}, {length} bytes"
            self.report.add(self.base + at, kind, detail)
            self.report.skipped_bytes += 2 + length
            self.pos = end
            return None
        if self.eof and end > size and self.find_sync(at + 1, size - 2) is None:
            # Nothing after this point lines up: a frame cut off by the end of the stream.
            self.report.add(
                self.base + at, IssueKind.TRUNCATED, f"{size - at} bytes at end of stream"
            )
            self.pos = size
            return None
        self.resync(at + 1)
        return None

    def done(self) -> bool:
        self.fill()
        return self.eof and self.pos >= len(self.buf)


def _confirmed(
    framer: _Framer, prefixes: npt.NDArray[np.int64], run_end: int
) -> tuple[npt.NDArray[np.int64], int]:
    """Leave a run's last two frames to ``_Framer.step`` unless the run ends the stream: the
    last has no successor in the run, and the one before has only a successor that may be a
    chance match (the run then stops right after it because it is not a real frame)."""
    if len(prefixes) and not (framer.eof and run_end == len(framer.buf)):
        keep = max(len(prefixes) - 2, 0)
        return prefixes[:keep], int(prefixes[keep])
    return prefixes, run_end


def iter_itch(
    path: str | Path, report: FramingReport | None = None, chunk_size: int = CHUNK_SIZE
) -> Iterator[tuple[int, bytes]]:
    """Yield (stream offset of the message's type byte, message bytes) for every message.

    Pass a ``FramingReport`` to learn what was repaired or skipped; it is complete once the
    iterator is exhausted. Memory stays at about one chunk whatever the file size.
    """
    report = report if report is not None else FramingReport()
    with _open_stream(path) as stream:
        framer = _Framer(stream, report, chunk_size)
        while not framer.done():
            if framer.garbage_start is None:
                # Fast path: the clean run ahead, found by the vectorized framer.
                prefixes, run_end = frame_starts(
                    framer.buf, framer.pos, framer.pos + framer.chunk_size
                )
                prefixes, run_end = _confirmed(framer, prefixes, run_end)
                if len(prefixes):
                    buf, base = framer.buf, framer.base
                    for prefix_at in prefixes.tolist():
                        length = (buf[prefix_at] << 8) | buf[prefix_at + 1]
                        yield (
                            base + prefix_at + 2,
                            bytes(buf[prefix_at + 2 : prefix_at + 2 + length]),
                        )
                    report.messages += len(prefixes)
                    framer.pos = run_end
                    continue
            found = framer.step()
            if found is not None:
                start, length = found
                report.messages += 1
                yield framer.base + start, bytes(framer.buf[start : start + length])


def iter_itch_chunks(
    path: str | Path, report: FramingReport | None = None, chunk_size: int = CHUNK_SIZE
) -> Iterator[bytes]:
    """Yield buffers of complete, well-formed framed messages (prefix == spec length).

    Repaired frames get a corrected prefix, skipped ones are left out, so each buffer can go
    straight to ``itch_batch.decode_batch``. Buffers are about ``chunk_size`` bytes.
    """
    report = report if report is not None else FramingReport()
    pending = bytearray()
    with _open_stream(path) as stream:
        framer = _Framer(stream, report, chunk_size)
        while not framer.done():
            if framer.garbage_start is None:
                prefixes, run_end = frame_starts(
                    framer.buf, framer.pos, framer.pos + framer.chunk_size
                )
                prefixes, run_end = _confirmed(framer, prefixes, run_end)
                if len(prefixes):
                    pending += framer.buf[framer.pos : run_end]
                    report.messages += len(prefixes)
                    framer.pos = run_end
                    if len(pending) >= framer.chunk_size:
                        yield bytes(pending)
                        pending.clear()
                    continue
            found = framer.step()
            if found is not None:
                start, length = found
                report.messages += 1
                pending += length.to_bytes(2, "big")
                pending += framer.buf[start : start + length]
    if pending:
        yield bytes(pending)


def scan_itch(path: str | Path, chunk_size: int = CHUNK_SIZE) -> FramingReport:
    """Read a whole file only to check its framing."""
    report = FramingReport()
    for _ in iter_itch_chunks(path, report, chunk_size):
        pass
    return report


def write_itch(
    path: str | Path,
    messages: Iterable[itch.Message | bytes],
    gzip: bool | None = None,
) -> int:
    """Write messages (records or raw message bytes) with 2-byte length prefixes; atomically.

    ``gzip=None`` compresses when the name ends in ".gz". The file appears complete or not at
    all (temp file in the same directory, fsync, rename). Returns the number of messages.
    """
    target = Path(path)
    compress = target.suffix == ".gz" if gzip is None else gzip
    descriptor, temp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    count = 0
    try:
        with os.fdopen(descriptor, "wb") as raw:
            sink: BinaryIO = (
                gzip_module.GzipFile(fileobj=raw, mode="wb", compresslevel=6, mtime=0)  # type: ignore[assignment]
                if compress
                else raw
            )
            pending = bytearray()
            for message in messages:
                wire = message if isinstance(message, bytes | bytearray) else itch.encode(message)
                if not 0 < len(wire) <= 0xFFFF:
                    raise ValueError(f"message {count} has length {len(wire)}, not 1..65535")
                pending += len(wire).to_bytes(2, "big")
                pending += wire
                count += 1
                if len(pending) >= CHUNK_SIZE:
                    sink.write(pending)
                    pending.clear()
            sink.write(pending)
            if compress:
                sink.close()  # writes the gzip trailer; leaves ``raw`` open
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(temp_name, target)
    except BaseException:
        Path(temp_name).unlink(missing_ok=True)
        raise
    return count
