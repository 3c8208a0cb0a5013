"""Per-run quantiles from ``tailsight.hist/1`` documents, series selectors and run discovery.

The regression gate compares *runs*, so this module turns one document per run into one quantile per
(series, q, run); quantiles themselves come from :meth:`tailsight.hist.Histogram.quantiles`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from tailsight.collector.store.reader import series_arrays
from tailsight.hist import NUM_BUCKETS, Histogram
from tailsight.intervals import HistDocument, HistFormatError, LabelKey, label_key


class RunInputError(ValueError):
    """A run file or directory cannot be used (missing, unreadable, wrong format or version)."""


def describe(key: LabelKey) -> str:
    """``probe=replay,stage=tick_to_trade`` (the selector syntax, so it can be pasted back)."""
    return ",".join(f"{name}={value}" for name, value in key) or "(no labels)"


def parse_selector(text: str | None) -> dict[str, str]:
    """``"probe=replay,stage=tick_to_trade"`` -> label filter; empty or None selects everything."""
    selector: dict[str, str] = {}
    if not text:
        return selector
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep or not name:
            raise ValueError(f"selector term {part!r} is not name=value")
        if name in selector:
            raise ValueError(f"selector names label {name!r} twice")
        selector[name] = value.strip()
    return selector


def matches(labels: Mapping[str, str], selector: Mapping[str, str]) -> bool:
    """True when every ``name=value`` of the selector is among the labels."""
    return all(labels.get(name) == value for name, value in selector.items())


def parse_quantiles(text: str) -> list[float]:
    """``"0.5,0.99,0.999"`` -> sorted unique quantiles, each strictly inside (0, 1)."""
    values: set[float] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            q = float(part)
        except ValueError as error:
            raise ValueError(f"quantile {part!r} is not a number") from error
        if not 0.0 < q < 1.0:
            raise ValueError(f"quantile {part} outside (0, 1)")
        values.add(q)
    if not values:
        raise ValueError("no quantiles given")
    return sorted(values)


def quantile_name(q: float) -> str:
    """``0.999`` -> ``p99.9`` (table and JSON keys)."""
    return "p" + f"{q * 100:.6f}".rstrip("0").rstrip(".")


# -- runs ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """One run: the file it came from and its document."""

    path: Path
    document: HistDocument


def expand_run_paths(paths: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """Files as given, directories as their ``*.json`` files (sorted); RunInputError if none."""
    found: list[Path] = []
    for entry in paths:
        path = Path(entry)
        if path.is_dir():
            files = sorted(p for p in path.glob("*.json") if p.is_file())
            if not files:
                raise RunInputError(f"{path}: directory holds no *.json run files")
            found.extend(files)
        elif path.is_file():
            found.append(path)
        else:
            raise RunInputError(f"{path}: no such file or directory")
    return found


def load_runs(paths: Iterable[str | os.PathLike[str]]) -> list[Run]:
    """Read every run file; any unreadable or invalid one is a RunInputError naming it."""
    runs: list[Run] = []
    for path in expand_run_paths(paths):
        try:
            runs.append(Run(path, HistDocument.read(path)))
        except HistFormatError as error:
            raise RunInputError(str(error)) from error
        except OSError as error:
            raise RunInputError(f"{path}: {error.strerror or error}") from error
    return runs


def select_series(
    documents: Sequence[HistDocument], selector: Mapping[str, str]
) -> dict[LabelKey, list[Histogram | None]]:
    """Per matching label set, its histogram in each document (None where a document lacks it)."""
    found: dict[LabelKey, list[Histogram | None]] = {}
    for n, document in enumerate(documents):
        for series in document.series:
            if not matches(series.labels, selector):
                continue
            per_document = found.setdefault(label_key(series.labels), [None] * len(documents))
            per_document[n] = series.hist
    return dict(sorted(found.items()))


def run_quantiles(
    hists: Sequence[Histogram | None], quantiles: Sequence[float]
) -> npt.NDArray[np.float64]:
    """Array ``[len(quantiles), runs]`` of per-run quantiles in ns; nan for absent or empty runs."""
    out = np.full((len(quantiles), len(hists)), math.nan)
    for n, hist in enumerate(hists):
        if hist is not None and hist.count:
            out[:, n] = hist.quantiles(list(quantiles))
    return out


def tail_events(hists: Sequence[Histogram | None], q: float) -> list[float]:
    """Expected number of events above ``q`` in each present, non-empty run (``count * (1-q)``)."""
    return [hist.count * (1.0 - q) for hist in hists if hist is not None and hist.count]


# -- dense interval arrays (jump detection) ------------------------------------------------------


def dense_counts(hist: Histogram) -> npt.NDArray[np.int64]:
    """Finite bucket counts followed by overflow: shape ``[NUM_BUCKETS + 1]``."""
    return np.concatenate([hist.counts, np.array([hist.overflow], dtype=np.int64)])


def dense_counts_by_series(
    documents: Sequence[HistDocument], selector: Mapping[str, str] | None = None
) -> tuple[npt.NDArray[np.int64], dict[LabelKey, npt.NDArray[np.int64]]]:
    """Interval start times and, per matching label set, the counts of
    :func:`~tailsight.collector.store.reader.series_arrays` (``[intervals, NUM_BUCKETS + 1]``,
    zeros where the series is absent): what the jump detectors take."""
    starts = np.array([d.start_ns for d in documents], dtype=np.int64)
    return starts, {label_key(s.labels): s.counts for s in series_arrays(documents, selector)}


def histogram_from_dense(counts: npt.NDArray[np.int64]) -> Histogram:
    """Inverse of :func:`dense_counts` (``sum_ns`` is not carried by dense rows, so it is 0)."""
    return Histogram(counts[:NUM_BUCKETS].copy(), overflow=int(counts[NUM_BUCKETS]))
