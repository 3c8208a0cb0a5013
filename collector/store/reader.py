"""The recording reader: reads a recording directory (possibly while a writer appends), skips and
reports whatever is damaged, de-duplicates intervals and turns a time range and a label filter into
numpy arrays. Crash rules: ``docs/recording.md``."""

from __future__ import annotations

import contextlib
import zlib
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

from tailsight.collector.store.codec import (
    MAX_RECORD_BYTES,
    RECORD_HEAD,
    RECORD_MAGIC,
    RECORD_MAGIC_V1,
    SEGMENT_HEADER,
    SEGMENT_HEADER_V1,
    SEGMENT_SUFFIX,
    IntervalArrays,
    Layout,
    decode_payload,
    next_magic,
)
from tailsight.hist import NUM_BUCKETS
from tailsight.intervals import HistDocument, HistFormatError, LabelKey, in_range, label_key


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
    """:func:`iter_segment` as :class:`IntervalArrays` (``layouts``: see
    :func:`~tailsight.collector.store.codec.decode_payload`)."""
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
        reason, candidate = found, next_magic(data, position + 1)
        resumed: tuple[IntervalArrays, int] | None = None
        while candidate != -1:
            following = next_magic(data, candidate + 1)
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


def _record_at(
    data: bytes,
    position: int,
    limit: int,
    scan: SegmentScan,
    layouts: dict[bytes, Layout] | None = None,
) -> tuple[IntervalArrays, int] | str:
    """The record at ``position`` if it checks out and ends by ``limit``, else why not."""
    head = RECORD_HEAD.size
    if len(data) - position < head:
        return "torn record at the end of the segment"
    magic, length, crc = RECORD_HEAD.unpack_from(data, position)
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
        return decode_payload(magic, payload, layouts), end
    except HistFormatError as error:
        return f"record does not decode: {error}"


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
    docs: Sequence[HistDocument], labels: Mapping[str, str] | None = None
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
    docs: Sequence[HistDocument], labels: Mapping[str, str] | None = None
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
