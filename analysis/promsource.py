"""Interval documents from a Prometheus HTTP API (Prometheus, Thanos, Mimir, VictoriaMetrics,
Cortex): what ``tailsight serve`` exported, read back with ``query_range`` into the
``HistDocument`` sequence ``explain_documents`` and ``show`` take from a recording.

Per step (default: the scrape interval) and series, the increase of every cumulative ``le``
bucket is the interval's coarse histogram; each coarse bucket's events are placed at its upper
bound in the 5 µs model, except that the exact quantile gauges of a window equal to the step
pin, inside its coarse bucket, where the events below a quantile lie (``_pin``). Counters with
a cgroup label become document counters. docs/analysis.md says what is lost against a recording.
"""

from __future__ import annotations

import base64
import itertools
import json
import math
import re
import ssl
import statistics
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from tailsight.collector.exporter import (
    CGROUP_LABELS,
    COARSE_BOUNDS_NS,
    QUANTILE_LABEL,
    default_what,
    window_label,
)
from tailsight.hist import NUM_BUCKETS, Histogram, bucket_upper_bounds_ns
from tailsight.intervals import Counter, HistDocument, Series
from tailsight.probes.metricnames import (
    COUNTER_SAMPLE,
    HISTOGRAM_UNIT,
    PREFIX,
    QUANTILE_UNIT,
    document_counter,
    histogram_family,
)

DEFAULT_WINDOW_S: Final = 15 * 60.0
# Prometheus refuses a range query of more than 11,000 points per series.
MAX_POINTS: Final = 10_000
# Labels of the scrape target, not of a series: pushed into PromQL; every other selector label
# is applied after the read (causes need the counters and neighbours the selector leaves out).
TARGET_LABELS: Final = ("instance", "job")
# Dropped from the documents' labels: the scrape config's name says nothing about the series.
DROPPED_LABELS: Final = frozenset({"__name__", "job"})
# The label that names what a tcpstate histogram measures, consumed into the metric name.
WHAT_LABEL: Final = "kind"
# The exporter's names (probes/metricnames.py), as the reader finds them: each names the stem.
_BUCKETS: Final = f"{PREFIX}.+{HISTOGRAM_UNIT}_bucket"
_SUMS: Final = f"{PREFIX}.+{HISTOGRAM_UNIT}_sum"
_QUANTILES: Final = f"{PREFIX}.+{QUANTILE_UNIT}"
_COUNTERS: Final = f"{PREFIX}.+{COUNTER_SAMPLE}"
_BUCKET_NAME = re.compile(f"^{PREFIX}(.+){HISTOGRAM_UNIT}_bucket$")
_QUANTILE_NAME = re.compile(f"^{PREFIX}(.+){QUANTILE_UNIT}$")
_COUNTER_NAME = re.compile(f"^{PREFIX}(.+){COUNTER_SAMPLE}$")
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
# Fine bucket (5 µs model) whose upper bound is each coarse bound; the last coarse bucket, +Inf,
# is the model's overflow.
_FINE_OF_COARSE: Final = np.searchsorted(
    bucket_upper_bounds_ns(), np.array(COARSE_BOUNDS_NS, dtype=np.int64)
)
_UPPER_BOUNDS_NS: Final = bucket_upper_bounds_ns()

LabelKey = tuple[tuple[str, str], ...]


class PrometheusError(Exception):
    """The API could not be read or refused the query; the message is one line for the user."""


@dataclass(frozen=True)
class PrometheusSource:
    """One Prometheus-compatible HTTP API endpoint and how to authenticate to it."""

    url: str
    basic_auth: tuple[str, str] | None = None
    bearer_token: str | None = None
    ca_file: Path | None = None
    insecure_skip_verify: bool = False
    timeout_s: float = 60.0

    def __post_init__(self) -> None:
        parsed = urllib.parse.urlsplit(self.url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise PrometheusError(f"bad Prometheus URL {self.url!r} (want http(s)://host:port)")
        if self.basic_auth is not None and self.bearer_token is not None:
            raise PrometheusError("give basic auth or a bearer token, not both")

    def _context(self) -> ssl.SSLContext | None:
        if not self.url.startswith("https:"):
            return None
        try:
            context = ssl.create_default_context(
                cafile=None if self.ca_file is None else str(self.ca_file)
            )
        except (OSError, ssl.SSLError) as error:
            raise PrometheusError(f"cannot load CA file {self.ca_file}: {error}") from None
        if self.insecure_skip_verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return context

    def get(self, path: str, params: Mapping[str, str]) -> Any:
        """``data`` of a successful API answer; PrometheusError with the API's reason else."""
        url = f"{self.url.rstrip('/')}{path}"
        body = urllib.parse.urlencode(params).encode()
        request = urllib.request.Request(url, data=body, method="POST")
        request.add_header("Content-Type", "application/x-www-form-urlencoded")
        if self.basic_auth is not None:
            token = base64.b64encode(":".join(self.basic_auth).encode()).decode()
            request.add_header("Authorization", f"Basic {token}")
        if self.bearer_token is not None:
            request.add_header("Authorization", f"Bearer {self.bearer_token}")
        try:
            with urllib.request.urlopen(
                request, timeout=self.timeout_s, context=self._context()
            ) as response:
                answer = json.load(response)
        except urllib.error.HTTPError as error:
            raise PrometheusError(f"{url}: HTTP {error.code}: {_api_reason(error)}") from None
        except urllib.error.URLError as error:
            raise PrometheusError(f"cannot reach {url}: {error.reason}") from None
        except (OSError, ValueError) as error:  # timeouts, resets, a body that is not JSON
            raise PrometheusError(f"{url}: {error}") from None
        if not isinstance(answer, dict) or answer.get("status") != "success":
            reason = answer.get("error", answer) if isinstance(answer, dict) else answer
            raise PrometheusError(f"{url}: {reason}")
        return answer.get("data")

    def query_range(self, expr: str, times_ms: Sequence[int]) -> dict[LabelKey, dict[int, float]]:
        """Per series (all labels, ``__name__`` included), value per evaluation time (ms) of an
        evenly spaced grid; long grids are read in chunks of at most MAX_POINTS steps."""
        out: dict[LabelKey, dict[int, float]] = {}
        step_ms = times_ms[1] - times_ms[0] if len(times_ms) > 1 else 1000
        for first in range(0, len(times_ms), MAX_POINTS):
            chunk = times_ms[first : first + MAX_POINTS]
            data = self.get(
                "/api/v1/query_range",
                {
                    "query": expr,
                    "start": f"{chunk[0] / 1000:.3f}",
                    "end": f"{chunk[-1] / 1000:.3f}",
                    "step": f"{step_ms / 1000:.3f}",
                },
            )
            for entry in _result(data, "matrix"):
                key = tuple(sorted(entry["metric"].items()))
                points = out.setdefault(key, {})
                for t, value in entry["values"]:
                    points[round(float(t) * 1000)] = float(value)
        return out

    def raw_samples(self, expr: str, range_s: float, at_s: float) -> list[list[float]]:
        """Timestamps of the raw samples of ``expr[range_s]`` at ``at_s``, one list per series."""
        data = self.get(
            "/api/v1/query", {"query": f"{expr}[{max(1, int(range_s))}s]", "time": repr(at_s)}
        )
        return [[float(t) for t, _ in entry["values"]] for entry in _result(data, "matrix")]


def _api_reason(error: urllib.error.HTTPError) -> str:
    try:
        body = json.load(error)
    except (OSError, ValueError):
        return str(error.reason)
    if isinstance(body, dict) and "error" in body:
        return " ".join(str(body["error"]).split())
    return str(error.reason)


def _result(data: Any, kind: str) -> list[dict[str, Any]]:
    if not isinstance(data, dict) or data.get("resultType") != kind:
        raise PrometheusError(f"unexpected answer (want a {kind}): {str(data)[:200]}")
    result: list[dict[str, Any]] = data["result"]
    return result


def matchers(selector: Mapping[str, str]) -> str:
    """The selector's target labels (TARGET_LABELS) as PromQL label matchers."""
    parts = []
    for name in TARGET_LABELS:
        if name in selector:
            parts.append(f"{name}={json.dumps(selector[name])}")
    return ",".join(parts)


def scrape_interval_s(
    source: PrometheusSource, selector: Mapping[str, str], end_s: float, range_s: float
) -> float:
    """The median spacing of ``tailsight_intervals_total`` samples: how often the agents are
    scraped (asked of the data, so that it works on Thanos and Mimir too)."""
    where = matchers(selector)
    expr = f"tailsight_intervals_total{{{where}}}"
    gaps = []
    for times in source.raw_samples(expr, min(range_s, 3600.0), end_s):
        gaps += [b - a for a, b in itertools.pairwise(times)]
    if not gaps:
        raise PrometheusError(
            f"no tailsight_intervals_total samples at {source.url} in the "
            f"{min(range_s, 3600.0):.0f} s before the window's end: is it scraping "
            "`tailsight serve`? (or give --step)"
        )
    return float(statistics.median(gaps))


def read_documents(
    source: PrometheusSource,
    start_s: float,
    end_s: float,
    step_s: float | None = None,
    selector: Mapping[str, str] | None = None,
) -> tuple[list[HistDocument], float]:
    """The documents of ``[start_s, end_s]``, one per step, and the step used. Evaluation
    times are multiples of the step (so that two reads of one window agree)."""
    selector = dict(selector or {})
    if not end_s > start_s:
        raise PrometheusError(
            f"empty window: its end {end_s:.0f} is not after its start {start_s:.0f}"
        )
    if step_s is None:
        step_s = scrape_interval_s(source, selector, end_s, end_s - start_s)
    if not (math.isfinite(step_s) and step_s >= 0.001):
        raise PrometheusError(f"bad step {step_s} s")
    step_ms = round(step_s * 1000)
    first_ms = math.ceil(start_s * 1000 / step_ms) * step_ms
    times_ms = list(range(first_ms, math.floor(end_s * 1000) + 1, step_ms))
    if len(times_ms) < 2:
        raise PrometheusError(f"the window holds no whole step of {step_ms / 1000:g} s")
    where = matchers(selector)
    extra = f",{where}" if where else ""

    def read(pattern: str, more: str = "") -> dict[LabelKey, dict[int, float]]:
        return source.query_range(f'{{__name__=~"{pattern}"{more}{extra}}}', times_ms)

    buckets = read(_BUCKETS)
    sums = read(_SUMS)
    counters = read(_COUNTERS, ',probe!=""')
    gauges = read(_QUANTILES, f',window="{window_label(step_ms / 1000)}"')
    documents = [
        HistDocument(start_ns=a * 1_000_000, end_ns=b * 1_000_000)
        for a, b in itertools.pairwise(times_ms)
    ]
    pins = _pins(gauges)
    for labels, cumulative in _histograms(buckets, times_ms).items():
        total = cumulative[:, -1]
        sum_points = sums.get(_with_name(labels, f"{HISTOGRAM_UNIT}_sum"), {})
        for k in range(1, len(times_ms)):
            if np.isnan(total[k - 1]) or np.isnan(total[k]):
                continue  # no sample on one side (absent, stale): nothing known of the step
            reset = bool(total[k] < total[k - 1])  # the agent restarted: counts from zero
            step_cumulative = cumulative[k] if reset else cumulative[k] - cumulative[k - 1]
            per_bucket = np.diff(np.concatenate(([0.0], step_cumulative)))
            coarse = np.maximum(np.rint(per_bucket), 0).astype(np.int64)
            if not coarse.sum():
                continue
            sum_ns = _increase(sum_points, times_ms[k - 1], times_ms[k], reset)
            hist = _model_histogram(coarse, pins.get((labels, times_ms[k]), ()), sum_ns)
            documents[k - 1].series.append(Series(_series_labels(labels), hist))
    for key, points in counters.items():
        named = dict(key)
        match = _COUNTER_NAME.match(named.get("__name__", ""))
        if match is None or not any(name in named for name in CGROUP_LABELS):
            continue  # self-metrics (programs, read errors) carry no cgroup
        name, scale = document_counter(match[1])
        kept = {k: v for k, v in named.items() if k not in DROPPED_LABELS}
        for k in range(1, len(times_ms)):
            before, now = points.get(times_ms[k - 1]), points.get(times_ms[k])
            if before is None or now is None:
                continue
            value = round((now if now < before else now - before) * scale)
            if value > 0:
                documents[k - 1].counters.append(Counter(name, kept, value))
    return documents, step_ms / 1000


def _with_name(labels: LabelKey, suffix: str) -> LabelKey:
    named = dict(labels)
    named["__name__"] = named["__name__"].removesuffix(f"{HISTOGRAM_UNIT}_bucket") + suffix
    return tuple(sorted(named.items()))


def _histograms(
    buckets: Mapping[LabelKey, Mapping[int, float]], times_ms: Sequence[int]
) -> dict[LabelKey, npt.NDArray[np.float64]]:
    """Per histogram series (labels without ``le``): ``[times, coarse buckets]`` cumulative
    counts, NaN where a time has no sample; series without every ``le`` of the exporter's are
    not ours and are left out."""
    les = {repr(b / 1e9): i for i, b in enumerate(COARSE_BOUNDS_NS)}
    les["+Inf"] = len(COARSE_BOUNDS_NS)
    grouped: dict[LabelKey, dict[int, Mapping[int, float]]] = {}
    for key, points in buckets.items():
        named = dict(key)
        index = les.get(_le_text(named.pop("le", "")))
        if index is not None and _BUCKET_NAME.match(named.get("__name__", "")) is not None:
            grouped.setdefault(tuple(sorted(named.items())), {})[index] = points
    position = {t: n for n, t in enumerate(times_ms)}
    out: dict[LabelKey, npt.NDArray[np.float64]] = {}
    for labels, by_le in grouped.items():
        if len(by_le) != len(les):
            continue
        array = np.full((len(times_ms), len(les)), np.nan)
        for index, points in by_le.items():
            for t, value in points.items():
                if t in position:
                    array[position[t], index] = value
        # A time where some le is missing (a scrape cut short) is unknown as a whole.
        array[np.isnan(array).any(axis=1)] = np.nan
        out[labels] = array
    return out


def _le_text(text: str) -> str:
    """``le`` as the exporter writes it (Prometheus may hand back "1e-05" or "0.00001")."""
    if text in ("+Inf", ""):
        return text
    try:
        return repr(float(text))
    except ValueError:
        return text


def _increase(points: Mapping[int, float], before_ms: int, now_ms: int, reset: bool) -> int:
    before, now = points.get(before_ms), points.get(now_ms)
    if before is None or now is None:
        return 0
    return max(0, round((now if reset or now < before else now - before) * 1e9))


def _series_labels(labels: LabelKey) -> dict[str, str]:
    """The document labels of an exported histogram series: its own labels, ``instance`` kept,
    and the measured thing the metric name holds restored as ``kind`` where it is not the
    probe's default (tcpstate's connect / lifetime / time_in_state)."""
    named = dict(labels)
    match = _BUCKET_NAME.match(named["__name__"])
    assert match is not None
    probe = named.get("probe", "")
    what = match[1].removeprefix(f"{probe}_") if probe else match[1]
    out = {k: v for k, v in named.items() if k not in DROPPED_LABELS}
    if probe and what != default_what(probe) and WHAT_LABEL not in out:
        out[WHAT_LABEL] = what
    return out


def _pins(
    gauges: Mapping[LabelKey, Mapping[int, float]],
) -> dict[tuple[LabelKey, int], list[tuple[float, float]]]:
    """Exact (quantile, value ns) per histogram series and time, from the gauges of the
    step-long window, keyed like the bucket series (``__name__`` of ``_bucket``)."""
    out: dict[tuple[LabelKey, int], list[tuple[float, float]]] = {}
    for key, points in gauges.items():
        named = dict(key)
        match = _QUANTILE_NAME.match(named.pop("__name__", ""))
        try:
            q = float(named.pop(QUANTILE_LABEL, ""))
        except ValueError:
            continue
        if match is None or not 0 < q < 1:
            continue
        named.pop("window", None)
        named["__name__"] = f"{histogram_family(PREFIX + match[1])}_bucket"
        series = tuple(sorted(named.items()))
        for t, value in points.items():
            if math.isfinite(value):
                out.setdefault((series, t), []).append((q, value * 1e9))
    return out


def _model_histogram(
    coarse: npt.NDArray[np.int64], pins: Iterable[tuple[float, float]], sum_ns: int
) -> Histogram:
    """A 5 µs model histogram with these coarse counts: each coarse bucket's events at its
    upper bound, but the ``rank - below`` events under an exact quantile inside a coarse bucket
    at that quantile's value, so the model's quantile of the step is the exact one."""
    counts = np.zeros(NUM_BUCKETS, dtype=np.int64)
    finite = coarse[:-1].copy()
    total = int(coarse.sum())
    cumulative_below = np.concatenate(([0], np.cumsum(coarse)[:-1]))
    for q, value_ns in sorted(pins):
        coarse_index = int(np.searchsorted(np.array(COARSE_BOUNDS_NS), value_ns, side="left"))
        if coarse_index >= len(finite) or finite[coarse_index] == 0:
            continue
        fine = int(np.searchsorted(_UPPER_BOUNDS_NS, value_ns, side="left"))
        if fine >= _FINE_OF_COARSE[coarse_index]:
            continue
        below = math.ceil(q * total) - int(cumulative_below[coarse_index])
        moved = min(
            max(below - int(counts[_lower_fines(coarse_index)].sum()), 0), int(finite[coarse_index])
        )
        counts[fine] += moved
        finite[coarse_index] -= moved
    counts[_FINE_OF_COARSE] += finite
    return Histogram(counts, overflow=int(coarse[-1]), sum_ns=sum_ns)


def _lower_fines(coarse_index: int) -> slice:
    """Fine buckets of one coarse bucket."""
    low = 0 if coarse_index == 0 else int(_FINE_OF_COARSE[coarse_index - 1]) + 1
    return slice(low, int(_FINE_OF_COARSE[coarse_index]) + 1)


def label_name_ok(name: str) -> bool:
    """Whether a selector's label name is a valid Prometheus label name."""
    return _LABEL_NAME.match(name) is not None
