"""The recording store: full-resolution interval histograms (one interval document per record)
in append-only, zstd-compressed segment files with bounded retention, one locked writer per
directory, and a reader that skips and reports whatever is damaged, de-duplicates intervals and
turns a time range and a label filter into numpy arrays. Layout and crash rules:
``docs/recording.md``."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import grp
import json
import os
import re
import struct
import time
import zlib
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import zstandard

from tailsight.hist import NUM_BUCKETS, Histogram
from tailsight.intervals import (
    Counter,
    HistDocument,
    HistFormatError,
    LabelKey,
    Series,
    fsync_directory,
    in_range,
    key_of,
    label_key,
)

SEGMENT_HEADER: Final = b"tailsight.rec/2\n"
SEGMENT_HEADER_V1: Final = b"tailsight.rec/1\n"
RECORD_MAGIC: Final = b"TSR2"  # payload: zstd frame of the binary interval layout
RECORD_MAGIC_V1: Final = b"TSR1"  # payload: tailsight.hist/1 text
_RECORD_HEAD: Final = struct.Struct("<4sII")  # magic, payload length, crc32(payload)
_ANY_MAGIC: Final = re.compile(b"TSR[12]")
SEGMENT_SUFFIX: Final = ".tsrec"
LOCK_NAME: Final = ".lock"
MAX_RECORD_BYTES: Final = 256 << 20
DEFAULT_SEGMENT_BYTES: Final = 64 << 20
DEFAULT_SEGMENT_S: Final = 3600.0
ZSTD_LEVEL: Final = 3

_INT64_MAX: Final = 2**63 - 1
_UINT64_LIMIT: Final = 2**64
_META_LEN: Final = struct.Struct("<I")
_ROW_STRIDE: Final = 4096  # > NUM_BUCKETS


class RecordingBusyError(OSError):
    """Another writer holds the recording directory's lock."""


def segment_name(first_start_ns: int, sequence: int = 0) -> str:
    """``<start_ns, 20 digits>-<sequence, 4 digits>.tsrec``: names sort by time."""
    return f"{first_start_ns:020d}-{sequence:04d}{SEGMENT_SUFFIX}"


def encode_record(
    document: HistDocument, version: int = 2, texts: LabelTexts | None = None
) -> bytes:
    """One record: magic, payload length, CRC-32 of the payload, payload.

    Version 2 (what writers write) packs the interval in binary and compresses it; a document
    with a value that does not fit in 64 bits falls back to version 1, the canonical
    ``tailsight.hist/1`` text that earlier releases wrote. ``texts``: a writer's, kept from one
    record to the next."""
    payload = _pack_interval(document, texts or LabelTexts()) if version == 2 else None
    if payload is None:
        text = document.dumps().encode("utf-8")
        return _RECORD_HEAD.pack(RECORD_MAGIC_V1, len(text), zlib.crc32(text)) + text
    compressed = zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(payload)
    return _RECORD_HEAD.pack(RECORD_MAGIC, len(compressed), zlib.crc32(compressed)) + compressed


class LabelTexts:
    """Each label set as the JSON text of the record metadata, kept by the identity of its key:
    the agent hands the same key object for a series every interval (``LabelMemo``), and the
    JSON of a busy host's thousands of label sets would be a record's largest cost."""

    def __init__(self) -> None:
        self._texts: dict[int, tuple[LabelKey, str]] = {}  # id(key) -> (key, text)
        self._names: dict[str, str] = {}  # counter name -> its JSON string

    def of(self, key: LabelKey) -> str:
        held = self._texts.get(id(key))
        if held is None:  # the key is held with its text: no other object takes its id
            held = self._texts[id(key)] = (key, _json(dict(key)))
        return held[1]

    def counter(self, name: str, key: LabelKey) -> str:
        quoted = self._names.get(name)
        if quoted is None:
            quoted = self._names[name] = _json(name)
        return f"[{quoted},{self.of(key)}]"

    def keep_at_most(self, entries: int) -> None:
        if len(self._texts) > entries:  # keys of series long gone
            self._texts.clear()
        if len(self._names) > entries:
            self._names.clear()


_json = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
"""``json.dumps`` as the metadata is written (one encoder: ``dumps`` with options makes one per
call)."""


def _pack_interval(document: HistDocument, texts: LabelTexts) -> bytes | None:
    """The binary layout of docs/recording.md from the document's own objects (never by
    re-parsing text); None when a value needs more than 64 bits."""
    series_keys, counter_keys = _check_writable(document)
    series = document.series
    sums = [s.sparse.sum_ns for s in series]
    values = [c.value for c in document.counters]
    if max((*sums, *values, document.end_ns), default=0) >= _UINT64_LIMIT:
        return None
    # The metadata as json.dumps writes {"start_ns", "end_ns", "series": [labels, ...],
    # "counters": [[name, labels], ...]}, each label set's text made once (``texts``).
    series_text = ",".join([texts.of(key) for key in series_keys])
    counters_text = ",".join([texts.counter(name, key) for name, key in counter_keys])
    meta_bytes = (
        f'{{"start_ns":{document.start_ns},"end_ns":{document.end_ns},'
        f'"series":[{series_text}],"counters":[{counters_text}]}}'
    ).encode()
    texts.keep_at_most(4 * (len(series_keys) + len(counter_keys)) + 1024)
    nonzero = [s.sparse.index for s in series]
    indices = np.concatenate(nonzero) if series else np.zeros(0)
    counts = np.concatenate([s.sparse.count for s in series]) if series else np.zeros(0)
    return b"".join(
        (
            _META_LEN.pack(len(meta_bytes)),
            meta_bytes,
            np.array([len(k) for k in nonzero], dtype="<u4").tobytes(),
            np.array(sums, dtype="<u8").tobytes(),
            np.array([s.sparse.overflow for s in series], dtype="<u8").tobytes(),
            indices.astype("<u2").tobytes(),
            counts.astype("<i8").tobytes(),
            np.array(values, dtype="<u8").tobytes(),
        )
    )


def _check_writable(
    document: HistDocument,
) -> tuple[list[LabelKey], list[tuple[str, LabelKey]]]:
    """What readers would reject and the objects themselves do not rule out (histograms check
    their own counts): a writer never writes a record that reads back as damaged. The keys of
    the series and of the counters."""
    if not 0 <= document.start_ns <= document.end_ns <= _INT64_MAX:
        raise HistFormatError(f"interval [{document.start_ns}, {document.end_ns}] is not valid")
    seen: set[object] = set()
    series_keys = []
    for s in document.series:
        key = _checked_key(s)
        if key in seen:
            raise HistFormatError(f"two series with labels {dict(key)}")
        seen.add(key)
        series_keys.append(key)
    counter_keys = []
    for c in document.counters:
        if not isinstance(c.name, str) or not c.name:
            raise HistFormatError(f"counter name must be a non-empty string, got {c.name!r}")
        if not isinstance(c.value, int) or c.value < 0:
            raise HistFormatError(f"counter {c.name!r}: value {c.value!r} is not a count")
        counter_key = (c.name, _checked_key(c))
        if counter_key in seen:
            raise HistFormatError(f"two counters {c.name!r} with labels {dict(counter_key[1])}")
        seen.add(counter_key)
        counter_keys.append(counter_key)
    return series_keys, counter_keys


def _checked_key(item: Series | Counter) -> LabelKey:
    """Its labels' key, checked to map strings to strings: the key it carries where it has one
    (``to_document``'s, sorted: a busy host's interval holds thousands, sorted afresh here
    before), else made from the labels once they are checked."""
    key = item.key
    for name, value in item.labels.items() if key is None else key:
        if not isinstance(name, str) or not isinstance(value, str):
            raise HistFormatError(f"labels must map strings to strings, got {dict(item.labels)!r}")
    return label_key(item.labels) if key is None else key


def _unpack_interval(payload: bytes) -> HistDocument:
    """Inverse of :func:`_pack_interval`, validating what a hist/1 reader validates."""
    return _unpack_arrays(payload).document()


@dataclass(frozen=True, eq=False)
class Layout:
    """The labels of an interval's series and counters, validated once and shared by every
    interval that has the same (the usual case: a recording's series rarely change)."""

    series: tuple[LabelKey, ...]
    counters: tuple[tuple[str, LabelKey], ...]

    @classmethod
    def of(cls, labels: Any, counter_meta: Any) -> Layout:
        """From the ``series`` and ``counters`` metadata; HistFormatError as a reader says it."""
        if not isinstance(labels, list) or not isinstance(counter_meta, list):
            raise HistFormatError("interval metadata: series and counters must be lists")
        for entry in counter_meta:
            if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str)):
                raise HistFormatError(f"interval metadata: bad counter {entry!r}")
        series = tuple(label_key(_labels(value)) for value in labels)
        counters = tuple((name, label_key(_labels(value))) for name, value in counter_meta)
        seen: set[object] = set()
        for key in series:
            if key in seen:
                raise HistFormatError(f"two series with labels {dict(key)}")
            seen.add(key)
        for name, key in counters:
            if not name:
                raise HistFormatError(f"counter name must be a non-empty string, got {name!r}")
            if (name, key) in seen:
                raise HistFormatError(f"two counters {name!r} with labels {dict(key)}")
            seen.add((name, key))
        return cls(series, counters)


@dataclass(frozen=True, eq=False)
class IntervalArrays:
    """One interval as sparse arrays (what the analysis streams; no Histogram objects):
    series ``k`` holds ``nnz[k]`` nonzero buckets, at ``indices`` with ``counts`` from offset
    ``nnz[:k].sum()``; ``values`` are the counters' values in ``layout.counters`` order."""

    start_ns: int
    end_ns: int
    layout: Layout
    nnz: npt.NDArray[np.int64]
    indices: npt.NDArray[np.int64]
    counts: npt.NDArray[np.int64]
    overflows: npt.NDArray[np.int64]
    sums: npt.NDArray[Any]
    """uint64 (object for a text record's values beyond 64 bits); so are ``values``."""
    values: npt.NDArray[Any]
    source: HistDocument | None = None
    """The document a text record or a caller gave (returned as is by :meth:`document`)."""

    @functools.cached_property
    def series_of_entries(self) -> npt.NDArray[np.int64]:
        """The series index of every nonzero bucket entry."""
        return np.repeat(np.arange(len(self.nnz)), self.nnz)

    def totals(self) -> npt.NDArray[np.float64]:
        """Events per series, overflow included (float64: exact below 2**53)."""
        per_series = np.bincount(
            self.series_of_entries, weights=self.counts, minlength=len(self.nnz)
        )
        return np.asarray(per_series + self.overflows, dtype=np.float64)

    def document(self) -> HistDocument:
        """The interval as a :class:`HistDocument` (what :meth:`Recording.documents` returns)."""
        if self.source is not None:
            return self.source
        n = len(self.nnz)
        dense = np.zeros((n, NUM_BUCKETS), dtype=np.int64)
        dense[self.series_of_entries, self.indices] = self.counts
        series: list[Series] = []
        try:
            for k in range(n):
                hist = Histogram(
                    dense[k], overflow=int(self.overflows[k]), sum_ns=int(self.sums[k])
                )
                series.append(Series(dict(self.layout.series[k]), hist))
        except ValueError as error:
            raise HistFormatError(f"interval payload: {error}") from error
        counters = [
            Counter(name, dict(labels), int(self.values[j]))
            for j, (name, labels) in enumerate(self.layout.counters)
        ]
        return HistDocument(self.start_ns, self.end_ns, series, counters)

    @classmethod
    def of(cls, document: HistDocument) -> IntervalArrays:
        """A document as arrays (text records, and documents handed to the analysis)."""
        layout = Layout(
            tuple(key_of(s) for s in document.series),
            tuple((c.name, key_of(c)) for c in document.counters),
        )
        series = document.series
        nonzero = [s.sparse.index for s in series]
        return cls(
            document.start_ns,
            document.end_ns,
            layout,
            np.array([len(k) for k in nonzero], dtype=np.int64),
            np.concatenate(nonzero).astype(np.int64) if series else np.zeros(0, np.int64),
            np.concatenate([s.sparse.count for s in series]) if series else np.zeros(0, np.int64),
            np.array([s.sparse.overflow for s in series], dtype=np.int64),
            _unsigned([s.sparse.sum_ns for s in series]),
            _unsigned([c.value for c in document.counters]),
            document,
        )


def _unsigned(values: list[int]) -> npt.NDArray[Any]:
    """uint64, or Python ints where a value does not fit (text records allow any size)."""
    if max(values, default=0) < _UINT64_LIMIT:
        return np.array(values, dtype=np.uint64)
    return np.array(values, dtype=object)


_FAST_META: Final = re.compile(rb'\{"start_ns":(0|[1-9][0-9]{0,18}),"end_ns":(0|[1-9][0-9]{0,18})')
_LAYOUT_CACHE_SIZE: Final = 64


def _unpack_arrays(payload: bytes, layouts: dict[bytes, Layout] | None = None) -> IntervalArrays:
    """:func:`_unpack_interval` without Histogram objects; ``layouts`` caches the validated
    labels by their metadata bytes (the writer's metadata puts the times first)."""
    if len(payload) < _META_LEN.size:
        raise HistFormatError("interval payload shorter than its header")
    (meta_len,) = _META_LEN.unpack_from(payload)
    offset = _META_LEN.size + meta_len
    meta_bytes = payload[_META_LEN.size : offset]
    fast = _FAST_META.match(meta_bytes)
    layout = None
    if fast is not None and layouts is not None:
        rest = meta_bytes[fast.end() :]
        layout = layouts.get(rest)
        if layout is None:
            layout = _layout_of(b"{" + rest[1:]) if rest[:1] == b"," else None
            if layout is not None:
                if len(layouts) >= _LAYOUT_CACHE_SIZE:
                    layouts.clear()
                layouts[rest] = layout
    if layout is not None and fast is not None:
        start_ns, end_ns = int(fast[1]), int(fast[2])
    else:  # anything unusual: the full parse, which says what is wrong
        try:
            meta = json.loads(meta_bytes, object_pairs_hook=_unique_keys)
        except (ValueError, RecursionError) as error:
            raise HistFormatError(f"interval metadata: {error}") from error
        if not isinstance(meta, dict) or set(meta) != {"start_ns", "end_ns", "series", "counters"}:
            raise HistFormatError("interval metadata: wrong fields")
        start_ns, end_ns = meta["start_ns"], meta["end_ns"]
        if not all(type(t) is int for t in (start_ns, end_ns)):
            raise HistFormatError(f"interval metadata: bad interval [{start_ns!r}, {end_ns!r}]")
        layout = Layout.of(meta["series"], meta["counters"])
    if not 0 <= start_ns <= end_ns <= _INT64_MAX:
        raise HistFormatError(f"interval metadata: bad interval [{start_ns!r}, {end_ns!r}]")
    n, m = len(layout.series), len(layout.counters)
    nnz = _array_at(payload, offset, "<u4", n)
    offset += 4 * n
    total = int(nnz.sum(dtype=np.int64))
    if len(payload) != offset + 16 * n + 10 * total + 8 * m:
        raise HistFormatError("interval payload length does not match its counts")
    sums = _array_at(payload, offset, "<u8", n)
    overflows = _array_at(payload, offset + 8 * n, "<u8", n)
    offset += 16 * n
    indices = _array_at(payload, offset, "<u2", total).astype(np.int64)
    counts = _array_at(payload, offset + 2 * total, "<i8", total)
    values = _array_at(payload, offset + 10 * total, "<u8", m)
    rows = np.repeat(np.arange(n), nnz)
    # Within a series indices ascend strictly; a new series may start anywhere: with indices
    # below NUM_BUCKETS, (series, index) keys ascend strictly across the whole interval.
    if (
        (total and (indices.max() >= NUM_BUCKETS or counts.min() < 0))
        or (total and np.any(np.diff(rows * _ROW_STRIDE + indices) <= 0))
        or (n and overflows.max() > _INT64_MAX)
    ):
        raise HistFormatError("interval payload: bucket index, count or overflow out of range")
    overflows = overflows.astype(np.int64)
    # What Histogram checks: every series' total count fits in int64 (exactly, when a bound
    # from the largest values does not already rule it out).
    bound = float(counts.max()) * float(nnz.max()) if total else 0.0
    if n and bound + float(overflows.max()) >= 2.0**62:
        events = np.bincount(rows, weights=counts.astype(np.float64), minlength=n) + overflows
        if float(events.max()) >= 2.0**63:
            raise HistFormatError("interval payload: total count does not fit in int64")
    interval = IntervalArrays(
        start_ns,
        end_ns,
        layout,
        nnz.astype(np.int64),
        indices,
        counts.astype(np.int64, copy=False),
        overflows,
        sums.astype(np.uint64, copy=False),
        values.astype(np.uint64, copy=False),
    )
    interval.__dict__["series_of_entries"] = rows  # seeds the cached property: computed here
    return interval


def _layout_of(text: bytes) -> Layout | None:
    """The layout of metadata without its times, or None where it is not exactly that."""
    try:
        meta = json.loads(text, object_pairs_hook=_unique_keys)
    except (ValueError, RecursionError):
        return None
    if not isinstance(meta, dict) or set(meta) != {"series", "counters"}:
        return None
    try:
        return Layout.of(meta["series"], meta["counters"])
    except HistFormatError:
        return None


def _array_at(payload: bytes, offset: int, dtype: str, count: int) -> npt.NDArray[Any]:
    if offset + np.dtype(dtype).itemsize * count > len(payload):
        raise HistFormatError("interval payload truncated")
    return np.frombuffer(payload, dtype=dtype, count=count, offset=offset)


def _labels(value: Any) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise HistFormatError(f"interval metadata: labels must be strings, got {value!r}")
    return value


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        raise HistFormatError("interval metadata: duplicate JSON key")
    return result


class RecordingWriter:
    """Appends interval documents to the newest segment of a directory it holds locked.

    Every run starts a new segment (a torn tail left by a killed writer stays the last bytes of
    its own segment). Retention removes whole closed segments, oldest first. Files are 0600 and a
    directory it creates 0700; with ``group`` 0640 / 0750 and owned by that group. A failed write
    raises its ``OSError`` (errno kept, ENOSPC for a full disk) after undoing the partial record.
    ``version=1`` writes the format of earlier releases (text records), for comparisons and tests.
    """

    def __init__(
        self,
        directory: Path | str,
        max_age_s: float | None = None,
        max_bytes: int | None = None,
        segment_bytes: int | None = None,
        segment_s: float = DEFAULT_SEGMENT_S,
        fsync: bool = True,
        group: str | int | None = None,
        version: int = 2,
    ) -> None:
        if version not in (1, 2):
            raise ValueError(f"recording format version {version}: this writer has 1 and 2")
        self.version = version
        self.directory = Path(directory)
        self.gid = group_id(group)
        self.file_mode = 0o600 if self.gid is None else 0o640
        created = not self.directory.exists()
        self.directory.mkdir(parents=True, exist_ok=True)
        if created or self.gid is not None:
            if self.gid is not None:
                os.chown(self.directory, -1, self.gid)
            os.chmod(self.directory, 0o700 if self.gid is None else 0o750)  # whatever the umask
        self._lock_fd: int | None = self._lock()
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
        self._texts = LabelTexts()

    @property
    def segment(self) -> Path | None:
        """The segment being appended to, if any."""
        return self._segment

    def append(self, document: HistDocument) -> None:
        """Write one interval; durable on return when ``fsync`` (the default)."""
        if self._lock_fd is None:
            raise ValueError(f"recording writer for {self.directory} is closed")
        record = encode_record(document, self.version, self._texts)
        if self._fd is not None and (
            self._segment_size + len(record) > self.segment_bytes
            or time.monotonic() - self._segment_opened > self.segment_s
        ):
            self._close_segment()
        opened = self._fd is None
        if opened:
            self._open_segment(document.start_ns)
        assert self._fd is not None
        try:
            _write_all(self._fd, record)
            if self.fsync:
                os.fsync(self._fd)
        except OSError:
            self._undo_partial_record()
            raise
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
            fsync_directory(self.directory)
        return removed

    def close(self) -> None:
        """Flush and close the current segment and release the directory; safe to call twice."""
        try:
            self._close_segment()
        finally:
            if self._lock_fd is not None:
                os.close(self._lock_fd)  # releases the flock
                self._lock_fd = None

    def __enter__(self) -> RecordingWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _lock(self) -> int:
        """flock ``DIR/.lock`` (released by the kernel when the writer dies, however it dies)."""
        path = self.directory / LOCK_NAME
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, self.file_mode)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode("ascii", "replace").strip() or "?"
            os.close(fd)
            raise RecordingBusyError(
                errno.EBUSY, f"another writer records there (pid {holder})", str(self.directory)
            ) from None
        except BaseException:
            os.close(fd)
            raise
        self._set_mode(fd)
        with contextlib.suppress(OSError):  # the pid only makes the message above better
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return fd

    def _set_mode(self, fd: int) -> None:
        if self.gid is not None:
            os.fchown(fd, -1, self.gid)
        os.fchmod(fd, self.file_mode)  # exact, whatever the umask

    def _open_segment(self, start_ns: int) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC
        for sequence in range(10_000):
            path = self.directory / segment_name(start_ns, sequence)
            try:
                fd = os.open(path, flags, self.file_mode)
            except FileExistsError:
                continue
            break
        else:
            raise FileExistsError(f"no free segment name for start {start_ns} in {self.directory}")
        try:
            self._set_mode(fd)
            _write_all(fd, SEGMENT_HEADER if self.version == 2 else SEGMENT_HEADER_V1)
            if self.fsync:
                os.fsync(fd)
                fsync_directory(self.directory)
        except BaseException:  # no header-less segment left behind (a full disk, say)
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        self._fd, self._segment = fd, path
        self._segment_size = len(SEGMENT_HEADER)  # both versions: 16 bytes
        self._segment_opened = time.monotonic()

    def _undo_partial_record(self) -> None:
        """Cut the segment back to its last complete record; if even that fails, stop using
        it (readers skip a torn tail)."""
        assert self._fd is not None
        try:
            os.ftruncate(self._fd, self._segment_size)
        except OSError:
            with contextlib.suppress(OSError):
                self._close_segment()

    def _close_segment(self) -> None:
        if self._fd is None:
            return
        fd, self._fd, self._segment = self._fd, None, None
        self._segment_size = 0
        try:
            if self.fsync:
                os.fsync(fd)
        finally:
            os.close(fd)


def group_id(group: str | int | None) -> int | None:
    """A group name or id as a gid; ValueError names a group that does not exist."""
    if group is None or isinstance(group, int):
        return group
    if group.isdigit():
        return int(group)
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise ValueError(f"no group named {group!r}") from None


def list_segments(directory: Path | str) -> list[Path]:
    """Segment files of a recording, oldest first."""
    return sorted(
        p for p in Path(directory).iterdir() if p.name.endswith(SEGMENT_SUFFIX) and p.is_file()
    )


@dataclass(frozen=True)
class ReadProblem:
    """Something a reader skipped: which segment, where (byte offset, if in a segment), why."""

    path: Path
    offset: int | None
    reason: str
    skipped_bytes: int = 0

    def __str__(self) -> str:
        where = self.path.name if self.offset is None else f"{self.path.name} byte {self.offset}"
        skipped = f" ({self.skipped_bytes:,} bytes skipped)" if self.skipped_bytes else ""
        return f"{where}: {self.reason}{skipped}"


@dataclass
class SegmentScan:
    """What reading one segment found: documents, and what was skipped as torn or corrupt."""

    path: Path
    documents: list[HistDocument] = field(default_factory=list)
    skipped_bytes: int = 0
    bad_records: int = 0
    scanned_bytes: int = 0  # bytes checksummed: at most about the segment's size (linear)
    problems: list[ReadProblem] = field(default_factory=list)

    def skip(self, offset: int | None, length: int, reason: str) -> None:
        self.skipped_bytes += length
        self.problems.append(ReadProblem(self.path, offset, reason, length))


def scan_segment(path: Path | str) -> SegmentScan:
    """Every valid record of a segment; whatever is torn or corrupt is skipped and reported."""
    scan = SegmentScan(Path(path))
    scan.documents = list(iter_segment(scan.path, scan))
    return scan


def iter_segment(path: Path, scan: SegmentScan) -> Iterator[HistDocument]:
    """The documents of a segment one at a time (a segment can hold gigabytes once parsed);
    what was skipped is added to ``scan``. Reading errors (permissions) raise OSError."""
    for interval in iter_segment_arrays(path, scan):
        yield interval.document()


def iter_segment_arrays(
    path: Path, scan: SegmentScan, layouts: dict[bytes, Layout] | None = None
) -> Iterator[IntervalArrays]:
    """:func:`iter_segment` as :class:`IntervalArrays` (``layouts``: see :func:`_unpack_arrays`)."""
    data = path.read_bytes()
    header = data[: len(SEGMENT_HEADER)]
    if len(data) < len(SEGMENT_HEADER) and (
        SEGMENT_HEADER.startswith(data) or SEGMENT_HEADER_V1.startswith(data)
    ):
        if data:  # a writer killed while creating the segment: an empty segment
            scan.skip(0, len(data), "segment header incomplete (writer killed while creating it)")
        return
    found_any = False
    problems_before = len(scan.problems)
    position = len(SEGMENT_HEADER)
    while position < len(data):
        found = _record_at(data, position, len(data), scan, layouts)
        if isinstance(found, tuple):
            found_any = True
            yield found[0]
            position = found[1]
            continue
        # Torn or corrupt: resynchronise at the next magic whose record checks out and ends
        # before the magic after it, so every byte is checksummed at most once (linear).
        scan.bad_records += 1
        reason, candidate = found, _next_magic(data, position + 1)
        resumed: tuple[IntervalArrays, int] | None = None
        while candidate != -1:
            following = _next_magic(data, candidate + 1)
            limit = len(data) if following == -1 else following
            attempt = _record_at(data, candidate, limit, scan, layouts)
            if isinstance(attempt, tuple):
                resumed = attempt
                break
            candidate = following
        end = len(data) if resumed is None else candidate
        scan.skip(position, end - position, reason)
        if resumed is None:
            break
        found_any = True
        yield resumed[0]
        position = resumed[1]
    if header not in (SEGMENT_HEADER, SEGMENT_HEADER_V1):
        if found_any:
            scan.problems.insert(
                problems_before,
                ReadProblem(path, 0, f"damaged segment header {header!r}; records after it read"),
            )
        else:  # a stray file: one problem for all of it
            scan.skipped_bytes -= sum(p.skipped_bytes for p in scan.problems[problems_before:])
            del scan.problems[problems_before:]
            scan.skip(0, len(data), "not a tailsight recording segment")


def _next_magic(data: bytes, start: int) -> int:
    match = _ANY_MAGIC.search(data, start)
    return -1 if match is None else match.start()


def _record_at(
    data: bytes,
    position: int,
    limit: int,
    scan: SegmentScan,
    layouts: dict[bytes, Layout] | None = None,
) -> tuple[IntervalArrays, int] | str:
    """The record at ``position`` if it checks out and ends by ``limit``, else why not."""
    head = _RECORD_HEAD.size
    if len(data) - position < head:
        return "torn record at the end of the segment"
    magic, length, crc = _RECORD_HEAD.unpack_from(data, position)
    end = position + head + length
    if magic not in (RECORD_MAGIC, RECORD_MAGIC_V1):
        return f"no record magic (found {data[position : position + 4]!r})"
    if length > MAX_RECORD_BYTES:
        return f"record length {length} is beyond any record"
    if end > len(data):
        return "torn record at the end of the segment"
    if end > limit:
        return "record overlaps the next record"
    payload = data[position + head : end]
    scan.scanned_bytes += length
    if zlib.crc32(payload) != crc:
        return "record checksum mismatch"
    try:
        if magic == RECORD_MAGIC_V1:
            return IntervalArrays.of(HistDocument.loads(payload)), end
        return _unpack_arrays(_decompress(payload), layouts), end
    except HistFormatError as error:
        return f"record does not decode: {error}"


def _decompress(payload: bytes) -> bytes:
    try:
        size = zstandard.frame_content_size(payload)
        if not 0 <= size <= MAX_RECORD_BYTES:  # -1: unknown; never written so
            raise HistFormatError(f"compressed frame of unknown or huge size {size}")
        return zstandard.ZstdDecompressor().decompress(payload, max_output_size=size)
    except zstandard.ZstdError as error:
        raise HistFormatError(f"zstd: {error}") from error


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
    """Reads a recording directory (possibly while a writer appends to it).

    Damaged or stray segments are skipped and listed in ``problems``; an interval read twice
    (same start and end, e.g. a copied segment) counts once; intervals that overlap others are
    kept and reported. Only a segment that cannot be read at all (permissions) raises OSError.
    """

    def __init__(self, directory: Path | str) -> None:
        self.directory = Path(directory)
        if not self.directory.is_dir():
            raise FileNotFoundError(f"no recording directory {self.directory}")
        self.skipped_bytes = 0
        self.bad_records = 0
        self.duplicates = 0
        self.overlaps = 0
        self.problems: list[ReadProblem] = []
        self._layouts: dict[bytes, Layout] = {}

    def documents(
        self, since_ns: int | None = None, until_ns: int | None = None
    ) -> list[HistDocument]:
        """Intervals overlapping ``[since_ns, until_ns)`` (:func:`~tailsight.intervals.in_range`),
        in time order."""
        return sorted(self.iter_documents(since_ns, until_ns), key=lambda d: (d.start_ns, d.end_ns))

    def iter_documents(
        self, since_ns: int | None = None, until_ns: int | None = None
    ) -> Iterator[HistDocument]:
        """:meth:`documents` one at a time, segment by segment (bounded memory)."""
        for interval in self.iter_intervals(since_ns, until_ns):
            yield interval.document()

    def iter_intervals(
        self, since_ns: int | None = None, until_ns: int | None = None
    ) -> Iterator[IntervalArrays]:
        """:meth:`iter_documents` as :class:`IntervalArrays`, in file order (not sorted):
        what the analysis streams, several times over, without building histograms."""
        self.skipped_bytes = self.bad_records = self.duplicates = self.overlaps = 0
        self.problems = []
        first_seen: dict[tuple[int, int], Path] = {}
        latest: tuple[int, Path] | None = None  # the latest interval end so far, and where
        for path in list_segments(self.directory):
            if until_ns is not None and _segment_start(path) > until_ns:
                break
            scan = SegmentScan(path)
            duplicates: dict[Path, int] = {}
            overlaps: dict[Path, int] = {}
            try:
                # The last append sets mtime, after the end of the segment's last interval.
                if since_ns is not None and path.stat().st_mtime_ns < since_ns:
                    continue
                for d in iter_segment_arrays(path, scan, self._layouts):
                    interval = (d.start_ns, d.end_ns)
                    original = first_seen.get(interval)
                    if original is not None:
                        duplicates[original] = duplicates.get(original, 0) + 1
                        continue
                    first_seen[interval] = path
                    if latest is not None and d.start_ns < latest[0]:
                        overlaps[latest[1]] = overlaps.get(latest[1], 0) + 1
                    if latest is None or d.end_ns > latest[0]:
                        latest = (d.end_ns, path)
                    if in_range(d.start_ns, d.end_ns, since_ns, until_ns):
                        yield d
            except FileNotFoundError:
                continue  # removed by retention while being read
            finally:
                self._add(scan, duplicates, overlaps)

    def _add(
        self, scan: SegmentScan, duplicates: dict[Path, int], overlaps: dict[Path, int]
    ) -> None:
        self.skipped_bytes += scan.skipped_bytes
        self.bad_records += scan.bad_records
        self.problems.extend(scan.problems)
        for original, n in duplicates.items():
            self.duplicates += n
            self.problems.append(
                ReadProblem(
                    scan.path,
                    None,
                    f"{n} intervals already read from {original.name}: counted once",
                )
            )
        for other, n in overlaps.items():
            self.overlaps += n
            self.problems.append(
                ReadProblem(
                    scan.path,
                    None,
                    f"{n} intervals overlap intervals of {other.name} "
                    "(two writers at once, or the clock stepped back): kept",
                )
            )

    def report(self) -> list[str]:
        """One line per problem of the last read, for people."""
        return [str(p) for p in self.problems]

    def time_bounds(self) -> tuple[int, int] | None:
        """(start of the first interval, end of the last), or None for an empty recording."""
        segments = list_segments(self.directory)
        first = last = None
        for path in segments:  # the first segment with a document gives the start
            with contextlib.suppress(FileNotFoundError):  # retention may remove it meanwhile
                first = next(iter_segment_arrays(path, SegmentScan(path), self._layouts), None)
            if first is not None:
                break
        for path in reversed(segments):
            tail: deque[IntervalArrays] = deque(maxlen=1)
            with contextlib.suppress(FileNotFoundError):
                tail.extend(iter_segment_arrays(path, SegmentScan(path), self._layouts))
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
                rows.setdefault(label_key(s.labels), []).append((t, k))
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
                    (c.name, label_key(c.labels)), np.zeros(len(docs), dtype=np.int64)
                )
                slot[t] += c.value
    end = np.array([d.end_ns for d in docs], dtype=np.int64)
    return [
        CounterArrays(name, dict(key), end.copy(), series)
        for (name, key), series in sorted(values.items())
    ]


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
