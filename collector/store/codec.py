"""The recording format's codec: an interval document as one checksummed record (format 2: the
binary interval layout, zstd-compressed; format 1: ``tailsight.hist/1`` text) and a record's
payload back as :class:`IntervalArrays`, validated as a hist/1 reader validates. Byte layout:
``docs/recording.md``."""

from __future__ import annotations

import functools
import json
import re
import struct
import zlib
from dataclasses import dataclass
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
    key_of,
    label_key,
)

SEGMENT_HEADER: Final = b"tailsight.rec/2\n"
SEGMENT_HEADER_V1: Final = b"tailsight.rec/1\n"
RECORD_MAGIC: Final = b"TSR2"  # payload: zstd frame of the binary interval layout
RECORD_MAGIC_V1: Final = b"TSR1"  # payload: tailsight.hist/1 text
RECORD_HEAD: Final = struct.Struct("<4sII")  # magic, payload length, crc32(payload)
_ANY_MAGIC: Final = re.compile(b"TSR[12]")
SEGMENT_SUFFIX: Final = ".tsrec"
MAX_RECORD_BYTES: Final = 256 << 20
ZSTD_LEVEL: Final = 3

_INT64_MAX: Final = 2**63 - 1
_UINT64_LIMIT: Final = 2**64
_META_LEN: Final = struct.Struct("<I")
_ROW_STRIDE: Final = 4096  # > NUM_BUCKETS


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
        return RECORD_HEAD.pack(RECORD_MAGIC_V1, len(text), zlib.crc32(text)) + text
    compressed = zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(payload)
    return RECORD_HEAD.pack(RECORD_MAGIC, len(compressed), zlib.crc32(compressed)) + compressed


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


def decode_payload(
    magic: bytes, payload: bytes, layouts: dict[bytes, Layout] | None = None
) -> IntervalArrays:
    """A checksummed record payload as arrays, by its record's magic (``layouts``: see
    :func:`_unpack_arrays`); HistFormatError where it does not decode."""
    if magic == RECORD_MAGIC_V1:
        return IntervalArrays.of(HistDocument.loads(payload))
    return _unpack_arrays(_decompress(payload), layouts)


def next_magic(data: bytes, start: int) -> int:
    """Where the next record may start (a record magic) from ``start``, -1 if nowhere."""
    match = _ANY_MAGIC.search(data, start)
    return -1 if match is None else match.start()


def _decompress(payload: bytes) -> bytes:
    try:
        size = zstandard.frame_content_size(payload)
        if not 0 <= size <= MAX_RECORD_BYTES:  # -1: unknown; never written so
            raise HistFormatError(f"compressed frame of unknown or huge size {size}")
        return zstandard.ZstdDecompressor().decompress(payload, max_output_size=size)
    except zstandard.ZstdError as error:
        raise HistFormatError(f"zstd: {error}") from error
