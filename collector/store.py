"""The recording store: full-resolution interval histograms (one ``tailsight.hist/1`` document per
interval) in append-only segment files with bounded retention, and a reader that turns a time
range and a label filter into numpy arrays. Layout and crash rules: ``docs/recording.md``."""

from __future__ import annotations

import contextlib
import os
import struct
import time
import zlib
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import numpy as np
import numpy.typing as npt

from tailsight.hist import NUM_BUCKETS
from tailsight.histfile import HistDocument, HistFormatError

SEGMENT_HEADER: Final = b"tailsight.rec/1\n"
RECORD_MAGIC: Final = b"TSR1"
_RECORD_HEAD: Final = struct.Struct("<4sII")  # magic, payload length, crc32(payload)
SEGMENT_SUFFIX: Final = ".tsrec"
MAX_RECORD_BYTES: Final = 256 << 20
DEFAULT_SEGMENT_BYTES: Final = 64 << 20
DEFAULT_SEGMENT_S: Final = 3600.0

LabelKey = tuple[tuple[str, str], ...]


def segment_name(first_start_ns: int, sequence: int = 0) -> str:
    """``<start_ns, 20 digits>-<sequence, 4 digits>.tsrec``: names sort by time."""
    return f"{first_start_ns:020d}-{sequence:04d}{SEGMENT_SUFFIX}"


def encode_record(document: HistDocument) -> bytes:
    """One record: magic, payload length, CRC-32 of the payload, canonical document text."""
    payload = document.dumps().encode("utf-8")
    return _RECORD_HEAD.pack(RECORD_MAGIC, len(payload), zlib.crc32(payload)) + payload


class RecordingWriter:
    """Appends interval documents to the newest segment of a directory; one writer per directory.

    Every run starts a new segment (a torn tail left by a killed writer stays the last bytes of
    its own segment). Retention removes whole closed segments, oldest first.
    """

    def __init__(
        self,
        directory: Path | str,
        max_age_s: float | None = None,
        max_bytes: int | None = None,
        segment_bytes: int | None = None,
        segment_s: float = DEFAULT_SEGMENT_S,
        fsync: bool = True,
    ) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.max_age_s = max_age_s
        self.max_bytes = max_bytes
        if segment_bytes is None:
            segment_bytes = DEFAULT_SEGMENT_BYTES
            if max_bytes is not None:
                segment_bytes = max(4096, min(segment_bytes, max_bytes // 8))
        self.segment_bytes = segment_bytes
        self.segment_s = segment_s
        self.fsync = fsync
        self.records_written = 0
        self.bytes_written = 0
        self._fd: int | None = None
        self._segment: Path | None = None
        self._segment_size = 0
        self._segment_opened = 0.0

    @property
    def segment(self) -> Path | None:
        """The segment being appended to, if any."""
        return self._segment

    def append(self, document: HistDocument) -> None:
        """Write one interval; durable on return when ``fsync`` (the default)."""
        record = encode_record(document)
        if self._fd is not None and (
            self._segment_size + len(record) > self.segment_bytes
            or time.monotonic() - self._segment_opened > self.segment_s
        ):
            self._close_segment()
        opened = self._fd is None
        if opened:
            self._open_segment(document.start_ns)
        assert self._fd is not None
        _write_all(self._fd, record)
        if self.fsync:
            os.fsync(self._fd)
        self._segment_size += len(record)
        self.records_written += 1
        self.bytes_written += len(record)
        if opened or self.records_written % 16 == 0:
            self.apply_retention()

    def apply_retention(self, now_s: float | None = None) -> list[Path]:
        """Delete closed segments older than ``max_age_s`` or beyond ``max_bytes``; returns them."""
        now_s = time.time() if now_s is None else now_s
        closed = [p for p in list_segments(self.directory) if p != self._segment]
        removed: list[Path] = []
        sizes: dict[Path, int] = {}
        for path in closed:
            try:
                stat = path.stat()
            except FileNotFoundError:
                continue
            if self.max_age_s is not None and now_s - stat.st_mtime > self.max_age_s:
                removed.append(path)
            else:
                sizes[path] = stat.st_size
        if self.max_bytes is not None:
            total = sum(sizes.values()) + self._segment_size
            for path in sorted(sizes):
                if total <= self.max_bytes:
                    break
                removed.append(path)
                total -= sizes[path]
        for path in removed:
            path.unlink(missing_ok=True)
        if removed:
            _fsync_directory(self.directory)
        return removed

    def close(self) -> None:
        """Flush and close the current segment; safe to call twice."""
        self._close_segment()

    def __enter__(self) -> RecordingWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _open_segment(self, start_ns: int) -> None:
        for sequence in range(10_000):
            path = self.directory / segment_name(start_ns, sequence)
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
            except FileExistsError:
                continue
            break
        else:
            raise FileExistsError(f"no free segment name for start {start_ns} in {self.directory}")
        _write_all(fd, SEGMENT_HEADER)
        if self.fsync:
            os.fsync(fd)
            _fsync_directory(self.directory)
        self._fd, self._segment = fd, path
        self._segment_size = len(SEGMENT_HEADER)
        self._segment_opened = time.monotonic()

    def _close_segment(self) -> None:
        if self._fd is None:
            return
        fd, self._fd, self._segment = self._fd, None, None
        try:
            if self.fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        self._segment_size = 0


def list_segments(directory: Path | str) -> list[Path]:
    """Segment files of a recording, oldest first."""
    return sorted(
        p for p in Path(directory).iterdir() if p.name.endswith(SEGMENT_SUFFIX) and p.is_file()
    )


@dataclass
class SegmentScan:
    """What reading one segment found: documents, and bytes skipped as torn or corrupt."""

    path: Path
    documents: list[HistDocument] = field(default_factory=list)
    skipped_bytes: int = 0
    bad_records: int = 0


def scan_segment(path: Path | str) -> SegmentScan:
    """Every valid record of a segment; a torn tail or corrupt record is skipped, not fatal."""
    scan = SegmentScan(Path(path))
    scan.documents = list(iter_segment(scan.path, scan))
    return scan


def iter_segment(path: Path, scan: SegmentScan) -> Iterator[HistDocument]:
    """The documents of a segment one at a time (a segment can hold gigabytes once parsed);
    what was skipped is added to ``scan``."""
    data = path.read_bytes()
    if not data.startswith(SEGMENT_HEADER):
        # A writer killed while creating the segment leaves a prefix of the header.
        if SEGMENT_HEADER.startswith(data):
            scan.skipped_bytes += len(data)
            return
        raise HistFormatError(f"{path}: not a tailsight recording segment")
    position = len(SEGMENT_HEADER)
    while position < len(data):
        found = _record_at(data, position)
        if found is not None:
            yield found[0]
            position = found[1]
            continue
        # Torn or corrupt: resynchronise at the next magic whose record checks out.
        scan.bad_records += 1
        next_magic = data.find(RECORD_MAGIC, position + 1)
        while next_magic != -1 and _record_at(data, next_magic) is None:
            next_magic = data.find(RECORD_MAGIC, next_magic + 1)
        end = len(data) if next_magic == -1 else next_magic
        scan.skipped_bytes += end - position
        position = end


def _record_at(data: bytes, position: int) -> tuple[HistDocument, int] | None:
    head = _RECORD_HEAD.size
    if len(data) - position < head:
        return None
    magic, length, crc = _RECORD_HEAD.unpack_from(data, position)
    end = position + head + length
    if magic != RECORD_MAGIC or length > MAX_RECORD_BYTES or end > len(data):
        return None
    payload = data[position + head : end]
    if zlib.crc32(payload) != crc:
        return None
    try:
        return HistDocument.loads(payload), end
    except HistFormatError:
        return None


@dataclass(frozen=True)
class SeriesArrays:
    """One labelled series over time; row ``t`` is the interval ``(start_ns[t], times_ns[t]]``.

    ``counts[:, NUM_BUCKETS]`` is the overflow bucket. Intervals where the series had no
    observations are rows of zeros, so every series of a query shares the same time axis.
    """

    labels: Mapping[str, str]
    start_ns: npt.NDArray[np.int64]
    times_ns: npt.NDArray[np.int64]
    counts: npt.NDArray[np.int64]
    sum_ns: npt.NDArray[np.int64]


@dataclass(frozen=True)
class CounterArrays:
    """One labelled counter over time (per-interval values, zero where absent)."""

    name: str
    labels: Mapping[str, str]
    times_ns: npt.NDArray[np.int64]
    values: npt.NDArray[np.int64]


class Recording:
    """Reads a recording directory (possibly while a writer appends to it)."""

    def __init__(self, directory: Path | str) -> None:
        self.directory = Path(directory)
        if not self.directory.is_dir():
            raise FileNotFoundError(f"no recording directory {self.directory}")
        self.skipped_bytes = 0
        self.bad_records = 0

    def documents(
        self, since_ns: int | None = None, until_ns: int | None = None
    ) -> list[HistDocument]:
        """Intervals overlapping ``[since_ns, until_ns]``, in time order."""
        return sorted(self.iter_documents(since_ns, until_ns), key=lambda d: (d.start_ns, d.end_ns))

    def iter_documents(
        self, since_ns: int | None = None, until_ns: int | None = None
    ) -> Iterator[HistDocument]:
        """:meth:`documents` one at a time, segment by segment (bounded memory)."""
        self.skipped_bytes = self.bad_records = 0
        for path in list_segments(self.directory):
            if until_ns is not None and _segment_start(path) > until_ns:
                break
            scan = SegmentScan(path)
            try:
                # The last append sets mtime, after the end of the segment's last interval.
                if since_ns is not None and path.stat().st_mtime_ns < since_ns:
                    continue
                for d in iter_segment(path, scan):
                    if (since_ns is None or d.end_ns >= since_ns) and (
                        until_ns is None or d.start_ns <= until_ns
                    ):
                        yield d
            except FileNotFoundError:
                continue  # removed by retention while we read
            finally:
                self.skipped_bytes += scan.skipped_bytes
                self.bad_records += scan.bad_records

    def time_bounds(self) -> tuple[int, int] | None:
        """(start of the first interval, end of the last), or None for an empty recording."""
        segments = list_segments(self.directory)
        first = last = None
        for path in segments:  # the first segment with a document gives the start
            first = next(iter_segment(path, SegmentScan(path)), None)
            if first is not None:
                break
        for path in reversed(segments):
            tail = deque(iter_segment(path, SegmentScan(path)), maxlen=1)
            if tail:
                last = tail[0]
                break
        if first is None or last is None:
            return None
        return first.start_ns, last.end_ns

    def series(
        self,
        since_ns: int | None = None,
        until_ns: int | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> list[SeriesArrays]:
        """Every series whose labels include ``labels``, as arrays over the matching intervals."""
        return series_arrays(self.documents(since_ns, until_ns), labels)

    def counters(
        self,
        since_ns: int | None = None,
        until_ns: int | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> list[CounterArrays]:
        """Every counter whose labels include ``labels``, per interval."""
        return counter_arrays(self.documents(since_ns, until_ns), labels)

    def __iter__(self) -> Iterator[HistDocument]:
        return iter(self.documents())


def series_arrays(
    docs: list[HistDocument], labels: Mapping[str, str] | None = None
) -> list[SeriesArrays]:
    """Series of ``docs`` whose labels include ``labels``, one row per document."""
    wanted = dict(labels or {})
    rows: dict[LabelKey, list[tuple[int, int]]] = {}
    for t, doc in enumerate(docs):
        for k, s in enumerate(doc.series):
            if all(s.labels.get(name) == value for name, value in wanted.items()):
                rows.setdefault(_key(s.labels), []).append((t, k))
    start = np.array([d.start_ns for d in docs], dtype=np.int64)
    end = np.array([d.end_ns for d in docs], dtype=np.int64)
    out: list[SeriesArrays] = []
    for key, hits in sorted(rows.items()):
        counts = np.zeros((len(docs), NUM_BUCKETS + 1), dtype=np.int64)
        sums = np.zeros(len(docs), dtype=np.int64)
        for t, k in hits:
            hist = docs[t].series[k].hist
            counts[t, :NUM_BUCKETS] += hist.counts
            counts[t, NUM_BUCKETS] += hist.overflow
            sums[t] += hist.sum_ns
        out.append(SeriesArrays(dict(key), start.copy(), end.copy(), counts, sums))
    return out


def counter_arrays(
    docs: list[HistDocument], labels: Mapping[str, str] | None = None
) -> list[CounterArrays]:
    """Counters of ``docs`` whose labels include ``labels``, one value per document."""
    wanted = dict(labels or {})
    values: dict[tuple[str, LabelKey], npt.NDArray[np.int64]] = {}
    for t, doc in enumerate(docs):
        for c in doc.counters:
            if all(c.labels.get(name) == value for name, value in wanted.items()):
                slot = values.setdefault(
                    (c.name, _key(c.labels)), np.zeros(len(docs), dtype=np.int64)
                )
                slot[t] += c.value
    end = np.array([d.end_ns for d in docs], dtype=np.int64)
    return [
        CounterArrays(name, dict(key), end.copy(), series)
        for (name, key), series in sorted(values.items())
    ]


def _key(labels: Mapping[str, str]) -> LabelKey:
    return tuple(sorted(labels.items()))


def _segment_start(path: Path) -> int:
    try:
        return int(path.name.split("-", 1)[0])
    except ValueError:
        return 0


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _fsync_directory(directory: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
