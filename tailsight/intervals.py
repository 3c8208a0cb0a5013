"""Interval documents, the model every layer passes on: labelled sparse histograms and counters
for one interval, live in memory, read and written as ``tailsight.hist/1``, strict and
human-readable JSON (spec: ``docs/hist-format.md``)."""

from __future__ import annotations

import itertools
import json
import operator
import os
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Generic, TypeVar

import numpy as np
import numpy.typing as npt

from tailsight.hist import BUCKET_WIDTH_NS, NUM_BUCKETS, Histogram, SparseHistogram

FORMAT: Final = "tailsight.hist/1"

_INT64_MAX: Final = 2**63 - 1
_TOP_FIELDS: Final = ("format", "bucket_width_ns", "start_ns", "end_ns", "series", "counters")
_SERIES_FIELDS: Final = ("labels", "count", "sum_ns", "buckets", "overflow")
_COUNTER_FIELDS: Final = ("labels", "name", "value")


LabelKey = tuple[tuple[str, str], ...]
C = TypeVar("C", int, str)


def label_key(labels: Mapping[str, str]) -> LabelKey:
    """A label set as sorted (name, value) pairs: hashable, one per set."""
    return tuple(sorted(labels.items()))


def key_of(item: Series | Counter) -> LabelKey:
    """A series' or counter's labels as ``label_key`` gives them (``key`` where it was given)."""
    return item.key if item.key is not None else label_key(item.labels)


class HistFormatError(ValueError):
    """Not valid ``tailsight.hist/1``; the message names the file, series and field at fault."""


class Series:
    """One labelled histogram (e.g. ``{"probe": "runqueue", "cgroup": "/trading"}``), given
    dense (``hist``) or as its non-zero buckets (``sparse``: an interval's, from
    ``Snapshot.delta``); the other form is made at its first use and kept. Not changed once
    made: every consumer of a document shares its series."""

    __slots__ = ("_hist", "_sparse", "key", "labels")

    def __init__(
        self,
        labels: Mapping[str, str],
        hist: Histogram | None = None,
        key: LabelKey | None = None,
        sparse: SparseHistogram | None = None,
    ) -> None:
        if hist is None and sparse is None:
            raise TypeError("a Series needs its histogram, dense or sparse")
        self.labels = labels
        # The labels as sorted (name, value) pairs where the producer had them
        # (Snapshot.to_document): consumers keyed by label set (the exporter) need not sort
        # each set again. Not compared.
        self.key = key
        self._hist = hist
        self._sparse = sparse

    @property
    def hist(self) -> Histogram:
        """The dense histogram (16 KiB: the collector's consumers read ``sparse`` instead)."""
        hist = self._hist
        if hist is None:
            assert self._sparse is not None
            hist = self._hist = self._sparse.dense()
        return hist

    @property
    def sparse(self) -> SparseHistogram:
        """The non-zero buckets, overflow and sum: what the exporter, the recording and the
        live view read, taken once for all of them."""
        sparse = self._sparse
        if sparse is None:
            assert self._hist is not None
            sparse = self._sparse = SparseHistogram.of(self._hist)
        return sparse

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Series):
            return NotImplemented
        return self.labels == other.labels and self.hist == other.hist

    __hash__ = None  # type: ignore[assignment]  # equal by value, and mutable labels

    def __repr__(self) -> str:
        return f"Series(labels={self.labels!r}, hist={self.hist!r})"


@dataclass(frozen=True)
class Counter:
    """One labelled monotonic counter for the interval (drops, lost events, ...)."""

    name: str
    labels: Mapping[str, str]
    value: int
    key: LabelKey | None = field(default=None, compare=False, repr=False)  # as Series.key


@dataclass(frozen=True, eq=False)
class PairCells(Generic[C]):
    """Victim x aggressor counters as arrays: counter ``names[k]`` of the pair
    (``cgroups[victim[i]]``, ``cgroups[aggressor[i]]``) is ``values[i, k]`` where ``moved[i, k]``
    (an interval's hold the pairs whose counters moved, and leave out the still ones; 0 there).
    ``cgroups`` are ids as read (``PairCounters.pair_delta``) or paths once named."""

    names: tuple[str, ...]
    cgroups: tuple[C, ...]
    victim: npt.NDArray[np.intp]
    aggressor: npt.NDArray[np.intp]
    values: npt.NDArray[np.uint64]
    moved: npt.NDArray[np.bool_]

    def moved_cells(self, k: int) -> tuple[list[C], list[C], list[int]]:
        """(victim, aggressor, value) of the pairs whose counter ``names[k]`` moved."""
        rows = np.flatnonzero(self.moved[:, k])
        cgroups = self.cgroups
        return (
            [cgroups[v] for v in self.victim[rows].tolist()],
            [cgroups[a] for a in self.aggressor[rows].tolist()],
            self.values[rows, k].tolist(),
        )


@dataclass(frozen=True, eq=False)
class CounterPairs:
    """One probe's counters of an interval with its victim x aggressor ``pairs`` held as arrays
    (a busy host moves thousands of pairs per interval; the exporter folds them to its top-K,
    the live verdicts sum them), labelled ``probe``, ``victim`` and ``aggressor``; ``others``
    are the probe's other counters. ``labels``: each pair's labels as made, (victim, aggressor)
    -> (key, labels, their sort text), kept by the caller from one interval to the next (the
    recording keeps its label JSON by key object)."""

    probe: str
    pairs: PairCells[str]
    others: list[Counter]
    labels: dict[tuple[str, str], tuple[LabelKey, dict[str, str], str]] = field(
        default_factory=dict
    )

    def counters(self) -> list[Counter]:
        """Every counter as a ``Counter``, sorted as ``Snapshot.to_document`` sorts a probe's:
        by name, then the labels' names and values joined by NUL."""
        made = [(counter_sort_text(c), c) for c in self.others]
        labels = self.labels
        for k, name in enumerate(self.pairs.names):
            for victim, aggressor, value in zip(*self.pairs.moved_cells(k), strict=True):
                held = labels.get((victim, aggressor))
                if held is None:
                    key = (("aggressor", aggressor), ("probe", self.probe), ("victim", victim))
                    held = labels[(victim, aggressor)] = (key, dict(key), label_text(key))
                made.append((f"{name}\0{held[2]}", Counter(name, held[1], value, held[0])))
        made.sort(key=operator.itemgetter(0))
        return [counter for _, counter in made]


def in_range(start_ns: int, end_ns: int, since_ns: int | None, until_ns: int | None) -> bool:
    """Whether the interval ``[start_ns, end_ns)`` overlaps ``[since_ns, until_ns)`` by more than
    an endpoint (None: unbounded): the one time-range rule of every reader."""
    return (since_ns is None or end_ns > since_ns) and (until_ns is None or start_ns < until_ns)


def label_text(key: LabelKey) -> str:
    """Sorted labels' names and values joined by NUL: sorts as the tuples do (no label holds a
    NUL), twice as fast. A counter sorts by its name, NUL, then this."""
    return "\0".join(part for pair in key for part in pair)


def counter_sort_text(counter: Counter) -> str:
    """What a counter sorts by in a document: its name and ``label_text``, joined by NUL."""
    return f"{counter.name}\0{label_text(key_of(counter))}"


class HistDocument:
    """Everything measured over ``[start_ns, end_ns]`` (wall-clock ns since the Unix epoch).

    ``counters`` are all its counters. An interval fresh from the probes may hold some as
    ``CounterPairs`` (``counter_parts``, ``add_counters``); they become ``Counter``s at the first
    look at ``counters``, so that consumers that fold the pairs (the exporter, the live
    verdicts) do not make thousands of them each interval."""

    __slots__ = ("_parts", "end_ns", "series", "start_ns")

    def __init__(
        self,
        start_ns: int,
        end_ns: int,
        series: list[Series] | None = None,
        counters: list[Counter] | None = None,
    ) -> None:
        self.start_ns = start_ns
        self.end_ns = end_ns
        self.series: list[Series] = [] if series is None else series
        self._parts: list[list[Counter] | CounterPairs] = [[] if counters is None else counters]

    @property
    def counters(self) -> list[Counter]:
        parts = self._parts
        if len(parts) > 1 or isinstance(parts[0], CounterPairs):
            made: list[Counter] = []
            for part in parts:
                made.extend(part.counters() if isinstance(part, CounterPairs) else part)
            self._parts = parts = [made]
        counters = parts[0]
        assert isinstance(counters, list)
        return counters

    @counters.setter
    def counters(self, counters: list[Counter]) -> None:
        self._parts = [counters]

    def counter_parts(self) -> list[list[Counter] | CounterPairs]:
        """The counters as held, in order: lists of ``Counter``s and ``CounterPairs``."""
        return self._parts

    def add_counters(self, part: list[Counter] | CounterPairs) -> None:
        """Append counters (a block stays a block until ``counters`` is looked at)."""
        last = self._parts[-1]
        if isinstance(part, CounterPairs):
            if isinstance(last, list) and not last:
                self._parts[-1] = part
            else:
                self._parts.append(part)
        elif isinstance(last, list):
            last.extend(part)
        else:
            self._parts.append(list(part))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, HistDocument):
            return NotImplemented
        return (self.start_ns, self.end_ns, self.series, self.counters) == (
            other.start_ns,
            other.end_ns,
            other.series,
            other.counters,
        )

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return (
            f"HistDocument(start_ns={self.start_ns!r}, end_ns={self.end_ns!r}, "
            f"series={self.series!r}, counters={self.counters!r})"
        )

    def __getstate__(self) -> tuple[int, int, list[Series], list[Counter]]:
        return (self.start_ns, self.end_ns, self.series, self.counters)

    def __setstate__(self, state: tuple[int, int, list[Series], list[Counter]]) -> None:
        self.start_ns, self.end_ns, self.series, counters = state
        self._parts = [counters]

    # -- JSON object model ------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """The document as plain JSON-able objects, fields in documented order."""
        return {
            "format": FORMAT,
            "bucket_width_ns": BUCKET_WIDTH_NS,
            "start_ns": self.start_ns,
            "end_ns": self.end_ns,
            "series": [
                {
                    "labels": _sorted_labels(s.labels),
                    "count": s.sparse.total,
                    "sum_ns": s.sparse.sum_ns,
                    "buckets": _sparse_pairs(s.sparse),
                    "overflow": s.sparse.overflow,
                }
                for s in self.series
            ],
            "counters": [
                {"labels": _sorted_labels(c.labels), "name": c.name, "value": c.value}
                for c in self.counters
            ],
        }

    @classmethod
    def from_json(cls, obj: Any) -> HistDocument:
        """Validate a parsed document and build it; HistFormatError says what is wrong where."""
        top = _object(obj, "document")
        version = top.get("format", None)
        if version != FORMAT:
            found = "no 'format' field" if "format" not in top else f"format {version!r}"
            raise HistFormatError(f"document: found {found}; this reader supports {FORMAT!r} only")
        _exact_fields(top, _TOP_FIELDS, "document")
        width = _integer(top["bucket_width_ns"], "document: bucket_width_ns")
        if width != BUCKET_WIDTH_NS:
            raise HistFormatError(
                f"document: bucket_width_ns is {width}; {FORMAT} requires {BUCKET_WIDTH_NS}"
            )
        start_ns = _integer(top["start_ns"], "document: start_ns")
        end_ns = _integer(top["end_ns"], "document: end_ns")
        if end_ns < start_ns:
            raise HistFormatError(f"document: end_ns {end_ns} is before start_ns {start_ns}")

        series_list = _array(top["series"], "document: series")
        series = [_parse_series(item, n) for n, item in enumerate(series_list)]
        _reject_duplicates(
            ((label_key(s.labels), f"series[{n}]") for n, s in enumerate(series)), "series"
        )
        counter_list = _array(top["counters"], "document: counters")
        counters = [_parse_counter(item, n) for n, item in enumerate(counter_list)]
        _reject_duplicates(
            (((c.name, label_key(c.labels)), f"counters[{n}]") for n, c in enumerate(counters)),
            "counter",
        )
        return cls(start_ns=start_ns, end_ns=end_ns, series=series, counters=counters)

    # -- text -------------------------------------------------------------------------------

    def dumps(self) -> str:
        """Canonical text: one field per line, one series or counter per line, newline at end.

        The document is validated first, so a writer never produces a file readers reject.
        """
        obj = self.to_json()
        HistDocument.from_json(obj)
        lines = ["{"]
        for name in ("format", "bucket_width_ns", "start_ns", "end_ns"):
            lines.append(f"  {json.dumps(name)}: {_compact(obj[name])},")
        for name, last in (("series", False), ("counters", True)):
            items = obj[name]
            tail = "" if last else ","
            if not items:
                lines.append(f"  {json.dumps(name)}: []{tail}")
                continue
            lines.append(f"  {json.dumps(name)}: [")
            lines.extend(
                f"    {_compact(item)}{',' if n < len(items) - 1 else ''}"
                for n, item in enumerate(items)
            )
            lines.append(f"  ]{tail}")
        lines.append("}")
        return "\n".join(lines) + "\n"

    @classmethod
    def loads(cls, text: str | bytes) -> HistDocument:
        """Parse and validate; rejects duplicate keys and NaN/Infinity as well as bad content."""
        try:
            obj = json.loads(
                text, object_pairs_hook=_no_duplicate_keys, parse_constant=_no_constant
            )
        except HistFormatError:
            raise
        except RecursionError as error:
            raise HistFormatError(
                "not a tailsight.hist/1 document: JSON nested too deeply"
            ) from error
        except ValueError as error:  # JSONDecodeError, UnicodeDecodeError, over-long integers
            raise HistFormatError(f"not valid JSON: {error}") from error
        return cls.from_json(obj)

    # -- files ------------------------------------------------------------------------------

    def write(self, path: str | os.PathLike[str]) -> None:
        """Write atomically (temp file in the same directory, fsync, rename, fsync directory)."""
        target = Path(path)
        data = self.dumps().encode("utf-8")
        fd, temp_name = tempfile.mkstemp(
            dir=target.parent, prefix=f".{target.name}.", suffix=".tmp"
        )
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.chmod(temp_name, 0o644)
            os.replace(temp_name, target)
        except BaseException:
            Path(temp_name).unlink(missing_ok=True)
            raise
        fsync_directory(target.parent)

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> HistDocument:
        """Read and validate a file; errors are HistFormatError prefixed with the path."""
        data = Path(path).read_bytes()
        try:
            return cls.loads(data)
        except HistFormatError as error:
            raise HistFormatError(f"{os.fspath(path)}: {error}") from error

    # -- queries ----------------------------------------------------------------------------

    def find(self, **labels: str) -> list[Series]:
        """Series whose labels include all of ``labels``."""
        return [s for s in self.series if all(s.labels.get(k) == v for k, v in labels.items())]


# -- validation helpers ---------------------------------------------------------------------


def _parse_series(item: Any, n: int) -> Series:
    where = f"series[{n}]"
    entry = _object(item, where)
    _exact_fields(entry, _SERIES_FIELDS, where)
    labels = _labels(entry["labels"], where)
    where = f"series[{n}] {_describe(labels)}"
    count = _integer(entry["count"], f"{where}: count")
    sum_ns = _integer(entry["sum_ns"], f"{where}: sum_ns")
    overflow = _integer(entry["overflow"], f"{where}: overflow")
    if overflow > _INT64_MAX:
        raise HistFormatError(f"{where}: overflow {overflow} does not fit in int64")

    buckets = _array(entry["buckets"], f"{where}: buckets")
    counts = _bucket_counts_fast(buckets)
    if counts is None:
        counts = _bucket_counts_checked(buckets, where)
    try:
        hist = Histogram(counts, overflow=overflow, sum_ns=sum_ns)
    except ValueError as error:
        raise HistFormatError(f"{where}: {error}") from error
    if hist.count != count:
        raise HistFormatError(
            f"{where}: count is {count} but buckets + overflow add up to {hist.count}"
        )
    return Series(labels=labels, hist=hist)


def _sparse_pairs(sparse: SparseHistogram) -> list[list[int]]:
    """``[[index, count], ...]`` of the non-zero buckets, built by numpy rather than per bucket."""
    pairs: list[list[int]] = np.stack([sparse.index, sparse.count], axis=1).tolist()
    return pairs


def _bucket_counts_fast(buckets: list[Any]) -> npt.NDArray[np.int64] | None:
    """Dense counts when every pair is valid (the common case, vectorized); None otherwise."""
    counts = np.zeros(NUM_BUCKETS, dtype=np.int64)
    if not buckets:
        return counts
    # Type checks via map() stay in C; `type(x) is int` also excludes bool.
    if set(map(type, buckets)) != {list} or set(map(len, buckets)) != {2}:
        return None
    if set(map(type, itertools.chain.from_iterable(buckets))) != {int}:
        return None
    try:
        pairs = np.array(buckets, dtype=np.int64)
    except OverflowError:
        return None
    indices, values = pairs[:, 0], pairs[:, 1]
    if indices[0] < 0 or indices[-1] >= NUM_BUCKETS or np.any(np.diff(indices) <= 0):
        return None
    if np.any(values < 0):
        return None
    counts[indices] = values
    return counts


def _bucket_counts_checked(buckets: list[Any], where: str) -> npt.NDArray[np.int64]:
    """Pair-by-pair validation that names the first bad pair."""
    counts = np.zeros(NUM_BUCKETS, dtype=np.int64)
    previous = -1
    for k, pair in enumerate(buckets):
        at = f"{where}: buckets[{k}]"
        if not isinstance(pair, list) or len(pair) != 2:
            raise HistFormatError(f"{at}: expected [index, count], got {pair!r}")
        index = _integer(pair[0], f"{at} index")
        bucket_count = _integer(pair[1], f"{at} count")
        if index >= NUM_BUCKETS:
            raise HistFormatError(f"{at}: index {index} out of range [0, {NUM_BUCKETS})")
        if index == previous:
            raise HistFormatError(f"{at}: duplicate bucket index {index}")
        if index < previous:
            raise HistFormatError(f"{at}: index {index} after {previous}; must be ascending")
        if bucket_count > _INT64_MAX:
            raise HistFormatError(f"{at}: count {bucket_count} does not fit in int64")
        previous = index
        counts[index] = bucket_count
    return counts


def _parse_counter(item: Any, n: int) -> Counter:
    where = f"counters[{n}]"
    entry = _object(item, where)
    _exact_fields(entry, _COUNTER_FIELDS, where)
    labels = _labels(entry["labels"], where)
    name = entry["name"]
    if not isinstance(name, str) or not name:
        raise HistFormatError(f"{where}: name must be a non-empty string, got {name!r}")
    value = _integer(entry["value"], f"{where} {name!r}: value")
    return Counter(name=name, labels=labels, value=value)


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise HistFormatError(f"{where}: expected a JSON object, got {_json_type(value)}")
    return value


def _array(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise HistFormatError(f"{where}: expected a JSON array, got {_json_type(value)}")
    return value


def _integer(value: Any, where: str) -> int:
    """A non-negative JSON integer (no bools, no 5.0)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise HistFormatError(f"{where}: expected a non-negative integer, got {value!r}")
    if value < 0:
        raise HistFormatError(f"{where}: negative value {value}")
    return value


def _labels(value: Any, where: str) -> dict[str, str]:
    labels = _object(value, f"{where}: labels")
    for key, label in labels.items():
        if not isinstance(label, str):
            raise HistFormatError(f"{where}: label {key!r} must be a string, got {label!r}")
    return dict(labels)


def _exact_fields(entry: Mapping[str, Any], expected: tuple[str, ...], where: str) -> None:
    missing = [name for name in expected if name not in entry]
    if missing:
        raise HistFormatError(f"{where}: missing field(s) {', '.join(missing)}")
    unknown = sorted(set(entry) - set(expected))
    if unknown:
        raise HistFormatError(f"{where}: unknown field(s) {', '.join(unknown)} in {FORMAT}")


def _reject_duplicates(keyed: Iterator[tuple[object, str]], what: str) -> None:
    first_seen: dict[object, str] = {}
    for key, where in keyed:
        if key in first_seen:
            raise HistFormatError(f"{where}: same {what} as {first_seen[key]}")
        first_seen[key] = where


def _sorted_labels(labels: Mapping[str, str]) -> dict[str, str]:
    return dict(sorted(labels.items()))


def _describe(labels: Mapping[str, str]) -> str:
    return "{" + ", ".join(f"{k}={v!r}" for k, v in sorted(labels.items())) + "}"


def _json_type(value: Any) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise HistFormatError(f"duplicate JSON key {key!r}")
        result[key] = value
    return result


def _no_constant(name: str) -> Any:
    raise HistFormatError(f"{name} is not valid JSON")


def fsync_directory(directory: Path) -> None:
    """Make the rename itself durable (POSIX: the directory entry lives in the directory)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
