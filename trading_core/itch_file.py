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

Files from the wild whose every prefix is 0x0000, each message right after it, are read by the
spec lengths once such messages chain up (``ZERO_CHAIN``), and reported once with a count. Gzip
is inflated by ``GzipReader``: damage keeps all that inflates before it. Paths that are not
regular files are refused before a byte is read (``ItchInputError``, an ``OSError``).
"""

from __future__ import annotations

import gzip as gzip_module
import io
import os
import stat
import tempfile
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import numpy.typing as npt

from tailsight.trading_core import itch
from tailsight.trading_core.itch_batch import frame_starts

__all__ = [
    "CHUNK_SIZE",
    "FramingIssue",
    "FramingReport",
    "GzipReader",
    "IssueKind",
    "ItchInputError",
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
# A run of messages each right behind a 0x0000 prefix (files written that way exist) is read
# by spec lengths once this many chain up (fewer at the stream's end); each link is a zero pair
# and a known type, a pattern common in ITCH bodies, so the file's first run must be longer.
ZERO_CHAIN = 3
ZERO_CHAIN_FIRST = 8
# Kinds reported once (the first offset), with a count: a property of the file, not damage.
SUMMARIZED_KINDS = frozenset({"zero_prefixed"})
# How well the frame after a frame confirms it (``_Framer.successor``).
NONE, WEAK, STRONG = 0, 1, 2


class IssueKind:
    """The kinds of anomaly a ``FramingReport`` counts."""

    ZERO_LENGTH = "zero_length"  # a 0x0000 prefix; skipped
    ZERO_PREFIXED = "zero_prefixed"  # a message right after a 0x0000 prefix; read, reported once
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

    def add(self, offset: int, kind: str, detail: str, count: int = 1) -> None:
        first = kind not in self.counts
        self.counts[kind] = self.counts.get(kind, 0) + count
        if len(self.issues) < self.max_issues and (first or kind not in SUMMARIZED_KINDS):
            self.issues.append(FramingIssue(offset, kind, detail))

    def summary(self) -> str:
        kinds = ", ".join(f"{k}={v}" for k, v in sorted(self.counts.items())) or "clean"
        return f"{self.messages} messages, {self.bytes_read} bytes: {kinds}"


_SPEC = {t[0]: n for t, n in itch.MESSAGE_LENGTHS.items()}
_SPEC_TABLE = np.zeros(256, dtype=np.int64)
for _t, _n in _SPEC.items():
    _SPEC_TABLE[_t] = _n


class ItchInputError(OSError):
    """A path that cannot be read as an ITCH file: missing, unreadable, a directory, a FIFO, a
    device. An ``OSError``, so callers that already map I/O errors to a message keep working."""


def _open_regular(path: str | Path) -> BinaryIO:
    """Open a regular file for reading, refusing anything else before reading a byte.

    ``O_NONBLOCK`` keeps the open of a FIFO from waiting for a writer; ``fstat`` on the open
    descriptor judges what was opened (no race with a rename in between).
    """
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError as error:
        raise ItchInputError(f"{path}: no such file") from error
    except PermissionError as error:
        raise ItchInputError(f"{path}: permission denied") from error
    except OSError as error:
        raise ItchInputError(f"{path}: {error.strerror or error}") from error
    mode = os.fstat(descriptor).st_mode
    if not stat.S_ISREG(mode):
        os.close(descriptor)
        what = "is a directory" if stat.S_ISDIR(mode) else f"not a regular file ({_kind(mode)})"
        raise ItchInputError(f"{path}: {what}")
    os.set_blocking(descriptor, True)
    return os.fdopen(descriptor, "rb")


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):  # fmt: skip
        if test(mode):
            return name
    return "special file"


class GzipReader(io.RawIOBase):
    """Decompress gzip members with ``zlib.decompressobj`` and keep every byte that inflates.

    ``gzip.GzipFile`` raises on damage and drops what the failing read had inflated. Here the
    input goes in pieces; a piece that fails is retried in halves from a copy of the
    decompressor, down to the byte at which zlib fails, so all output before it is kept and the
    failing byte's compressed offset is exact. Damage ends the stream (deflate has no resync
    points); ``problem`` then says what happened and where.
    """

    # Compressed bytes per decompress call: small, since one call's output is unbounded (deflate
    # expands up to ~1000x: 16 MiB at most here).
    PIECE = 1 << 14

    def __init__(self, raw: BinaryIO) -> None:
        super().__init__()
        self.raw = raw
        self.inflate = zlib.decompressobj(wbits=31)  # gzip header and CRC-32/ISIZE checked
        self.in_member = False
        self.tail = b""  # compressed bytes read but not yet fed
        self.consumed = 0  # compressed bytes fed to zlib (or skipped as padding)
        self.produced = 0  # decompressed bytes handed out
        self.pending = bytearray()
        self.finished = False
        self.problem: str | None = None  # what went wrong in the gzip layer, if anything
        self.problem_offset = 0  # decompressed offset where the output stops because of it

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        out = self.read(len(view))
        view[: len(out)] = out
        return len(out)

    def read(self, size: int | None = -1) -> bytes:
        size = -1 if size is None else size
        while (size < 0 or len(self.pending) < size) and not self.finished:
            self._inflate_piece()
        count = len(self.pending) if size < 0 else min(size, len(self.pending))
        out = bytes(self.pending[:count])
        del self.pending[:count]
        self.produced += count
        return out

    def close(self) -> None:
        self.raw.close()
        super().close()

    def _fail(self, detail: str) -> None:
        self.problem = detail
        self.problem_offset = self.produced + len(self.pending)
        self.finished = True

    def _inflate_piece(self) -> None:
        if not self.tail:
            self.tail = self.raw.read(self.PIECE)
            if not self.tail:
                if self.in_member:
                    self._fail(f"compressed byte {self.consumed}: file ends inside a gzip "
                               "member (cut short, or damaged before)")  # fmt: skip
                self.finished = True
                return
        if not self.in_member:
            # Between members: NUL padding may follow one, another member may (concatenated).
            data = self.tail.lstrip(b"\0")
            self.consumed += len(self.tail) - len(data)
            self.tail = data
            if not data:
                return
            if not GZIP_MAGIC.startswith(data[: len(GZIP_MAGIC)]):
                self._fail(f"compressed byte {self.consumed}: trailing bytes, not a gzip member")
                return
            self.inflate = zlib.decompressobj(wbits=31)
            self.in_member = True
        data, self.tail = self.tail, b""
        self.tail = self._feed(data)

    def _feed(self, data: bytes) -> bytes:
        """Inflate ``data`` into ``pending``; returns the bytes after the member's end, if it
        ended. On a zlib error, keeps the output of every byte before the failing one."""
        saved = self.inflate.copy()
        try:
            out = self.inflate.decompress(data)
        except zlib.error as error:
            self.inflate = saved
            if len(data) == 1:
                self._fail(f"compressed byte {self.consumed}: {_zlib_reason(error)}")
                return b""
            half = len(data) // 2
            rest = self._feed(data[:half])
            if self.finished or not self.in_member:  # failed, or the member ended
                return rest + data[half:]
            return self._feed(data[half:])
        self.pending += out
        if self.inflate.eof:
            rest = self.inflate.unused_data
            self.consumed += len(data) - len(rest)
            self.in_member = False
            return rest
        self.consumed += len(data)
        return b""


def _zlib_reason(error: zlib.error) -> str:
    text = str(error)
    if "incorrect data check" in text:
        return "CRC-32 mismatch (inflated, but not to what was compressed)"
    if "incorrect length check" in text:
        return "ISIZE mismatch (the length in the gzip trailer)"
    return text.split(": ", 1)[-1]


def _open_stream(path: str | Path) -> BinaryIO:
    """The file's (decompressed) byte stream: gzip when it starts like gzip and inflates.

    Raises ``ItchInputError`` for a path that is not a readable regular file.
    """
    raw = _open_regular(path)
    magic = raw.read(len(GZIP_MAGIC))
    raw.seek(0)
    if magic != GZIP_MAGIC:
        return raw
    probe = GzipReader(io.BytesIO(raw.read(GzipReader.PIECE)))
    if not probe.read(1) and probe.problem is not None:
        raw.seek(0)  # only looked like gzip (nothing inflates): read it as it is
        return raw
    raw.seek(0)
    return GzipReader(raw)  # type: ignore[return-value]


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
        self.zero_seen = False  # a run of zero-prefixed messages was read
        self.last_timestamp = -1  # of the last message delivered (``zero_chain``)
        self.zero_next: int | None = None  # buf offset where a zero-prefixed run continues

    # -- buffer ---------------------------------------------------------------------------

    def fill(self) -> None:
        """Make sure LOOKAHEAD bytes are buffered past ``pos`` unless the stream has ended."""
        while not self.eof and len(self.buf) - self.pos < LOOKAHEAD:
            if self.pos:
                del self.buf[: self.pos]
                self.base += self.pos
                if self.zero_next is not None:  # a run that continues past the framed bytes
                    self.zero_next = (
                        self.zero_next - self.pos if self.zero_next >= self.pos else None
                    )
                self.pos = 0
            chunk = self.stream.read(self.chunk_size)
            if not chunk:
                self.eof = True
                if isinstance(self.stream, GzipReader) and self.stream.problem is not None:
                    self.report.add(
                        self.stream.problem_offset, IssueKind.STREAM_ERROR, self.stream.problem
                    )
            else:
                self.buf += chunk
                self.report.bytes_read += len(chunk)
            if self.zero_next is not None:
                self.give_spec_prefixes(self.zero_next)

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

    # -- zero-prefixed messages -------------------------------------------------------------

    def zero_frame_end(self, at: int) -> int | None:
        """End of the message right behind a 0x0000 prefix at ``at`` (by its type's spec length),
        or None when ``at`` holds no zero prefix and known type."""
        buf = self.buf
        if at + 3 > len(buf) or buf[at] or buf[at + 1]:
            return None
        spec = _SPEC.get(buf[at + 2])
        return None if spec is None else at + 2 + spec

    def zero_chain(self, at: int) -> bool:
        """Whether zero-prefixed messages chain up from ``at``: ZERO_CHAIN of them (the file's
        first run: ZERO_CHAIN_FIRST), in time order after the last message delivered. Without
        the length byte, a known type in a damaged message's body whose spec length lands on
        the next real message would pass the chain test alone; its 6 bytes of "timestamp"
        between two real ones would not."""
        need = ZERO_CHAIN if self.zero_seen else ZERO_CHAIN_FIRST
        previous = self.last_timestamp
        for _ in range(need):
            end = self.zero_frame_end(at)
            if end is None or end + 2 > len(self.buf):
                return False
            timestamp = self.timestamp(at + 2)
            if timestamp < previous:
                return False
            previous, at = timestamp, end
        return True

    def timestamp(self, message_at: int) -> int:
        """The 6-byte timestamp of the message whose type byte is at ``message_at``."""
        return int.from_bytes(self.buf[message_at + 5 : message_at + 11], "big")

    def delivered(self, message_at: int) -> None:
        """Note the last message delivered (its type byte at ``message_at``)."""
        self.last_timestamp = self.timestamp(message_at)

    def zero_chain_to_end(self, at: int) -> bool:
        """A short run of zero-prefixed messages that ends the stream exactly (a small file)."""
        if not self.eof or not (self.zero_seen or self.base + at == 0):
            return False
        while (end := self.zero_frame_end(at)) is not None:
            at = end
        return at == len(self.buf)

    def give_spec_prefixes(self, at: int) -> None:
        """Rewrite, in the buffer, the zero prefixes of the run of zero-prefixed messages from
        ``at`` to their spec lengths: from then on they are ordinary frames, judged (confirmed,
        dropped at damage) like any other. Continues after each refill until the run breaks."""
        buf, size = self.buf, len(self.buf)
        first, count, more = at, 0, False  # more: the buffer ended before the run did
        while True:
            if at + 3 > size:
                more = True
                break
            end = self.zero_frame_end(at)
            if end is None:
                break
            if end > size and not self.eof:
                more = True
                break
            buf[at + 1] = end - at - 2
            count += 1
            at = end
        self.zero_next = at if more and not self.eof else None
        if count:
            self.zero_seen = True
            self.report.add(
                self.base + first,
                IssueKind.ZERO_PREFIXED,
                "prefixes are 0x0000: read by spec lengths",
                count,
            )

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
            # A well-formed header, or a known type behind a zero prefix (``zero_chain``).
            hits = np.flatnonzero(((prefix == spec) | (prefix == 0)) & (spec != 0)).tolist()
            lengths = spec[hits].tolist()
            zeros = (prefix[hits] == 0).tolist()
            del window, prefix, spec  # release the buffer export before the buffer may resize
            for offset, length, zero in zip(hits, lengths, zeros, strict=True):
                candidate = search_from + offset
                if zero:
                    if self.zero_chain(candidate):
                        return candidate
                    continue
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
            if not self.lines_up(at) and (self.zero_chain(at) or self.zero_chain_to_end(at)):
                self.give_spec_prefixes(at)
                return None
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
                self.delivered(at + 2)
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
            self.delivered(at + 2)
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
                    framer.delivered(int(prefixes[-1]) + 2)
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
                    framer.delivered(int(prefixes[-1]) + 2)
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
