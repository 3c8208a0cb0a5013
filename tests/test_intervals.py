"""``tailsight.hist/1``: round trips, every reject rule, atomic writes, the documented example."""

from __future__ import annotations

import copy
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tailsight.hist import NUM_BUCKETS, Histogram
from tailsight.intervals import FORMAT, Counter, HistDocument, HistFormatError, Series

DOC_PATH = Path(__file__).resolve().parents[1] / "docs" / "hist-format.md"

# The machine is shared and small: per-example timing is not a property under test.
relaxed = settings(deadline=None)


def documented_example() -> str:
    """The ```json block of docs/hist-format.md, byte for byte."""
    text = DOC_PATH.read_text(encoding="utf-8")
    blocks = re.findall(r"```json\n(.*?)```", text, flags=re.DOTALL)
    assert len(blocks) == 1, "docs/hist-format.md must hold exactly one json example"
    return str(blocks[0])


label_text = st.text(min_size=0, max_size=12)
labels_strategy = st.dictionaries(st.text(min_size=1, max_size=8), label_text, max_size=4)


@st.composite
def histograms(draw: st.DrawFn) -> Histogram:
    buckets = draw(
        st.dictionaries(st.integers(0, NUM_BUCKETS - 1), st.integers(1, 2**40), max_size=20)
    )
    overflow = draw(st.integers(0, 2**40))
    sum_ns = draw(st.integers(0, 2**80))
    return Histogram.from_sparse(buckets.items(), overflow=overflow, sum_ns=sum_ns)


@st.composite
def documents(draw: st.DrawFn) -> HistDocument:
    start_ns = draw(st.integers(0, 2**63))
    end_ns = start_ns + draw(st.integers(0, 10**12))
    series_labels = draw(
        st.lists(labels_strategy, max_size=4, unique_by=lambda d: tuple(sorted(d.items())))
    )
    series = [Series(labels=labels, hist=draw(histograms())) for labels in series_labels]
    counter_keys = draw(
        st.lists(
            st.tuples(st.text(min_size=1, max_size=10), labels_strategy),
            max_size=4,
            unique_by=lambda t: (t[0], tuple(sorted(t[1].items()))),
        )
    )
    counters = [
        Counter(name=name, labels=labels, value=draw(st.integers(0, 2**64)))
        for name, labels in counter_keys
    ]
    return HistDocument(start_ns=start_ns, end_ns=end_ns, series=series, counters=counters)


# -- round trips ------------------------------------------------------------------------------


@relaxed
@given(documents())
def test_text_round_trip(doc: HistDocument) -> None:
    text = doc.dumps()
    back = HistDocument.loads(text)
    assert back == doc
    assert back.dumps() == text  # canonical output is a fixed point
    # Any JSON library's output of the same object reads back too (whitespace/order are free).
    assert HistDocument.loads(json.dumps(doc.to_json(), indent=3)) == doc


@settings(relaxed, max_examples=25)
@given(documents())
def test_file_round_trip(tmp_path_factory: pytest.TempPathFactory, doc: HistDocument) -> None:
    path = tmp_path_factory.mktemp("rt") / "interval.json"
    doc.write(path)
    assert HistDocument.read(path) == doc


def test_json_fields_are_exactly_the_documented_ones() -> None:
    hist = Histogram.from_samples([1, 6_000, 6_001, 20_000_000_000])
    doc = HistDocument(1, 2, [Series({"probe": "p"}, hist)], [Counter("drops", {}, 5)])
    obj = doc.to_json()
    assert list(obj) == ["format", "bucket_width_ns", "start_ns", "end_ns", "series", "counters"]
    assert obj["format"] == FORMAT == "tailsight.hist/1"
    assert obj["bucket_width_ns"] == 5000
    assert obj["series"] == [
        {
            "labels": {"probe": "p"},
            "count": 4,
            "sum_ns": 1 + 6_000 + 6_001 + 20_000_000_000,
            "buckets": [[0, 1], [1, 2]],
            "overflow": 1,
        }
    ]
    assert obj["counters"] == [{"labels": {}, "name": "drops", "value": 5}]


def test_non_ascii_labels_survive(tmp_path: Path) -> None:
    doc = HistDocument(0, 1, [Series({"cgroup": "/système/ü"}, Histogram.from_samples([3]))])
    doc.write(tmp_path / "x.json")
    assert HistDocument.read(tmp_path / "x.json") == doc


def test_find_by_label_subset() -> None:
    a = Series({"probe": "runqueue", "cgroup": "/a"}, Histogram.from_samples([1]))
    b = Series({"probe": "runqueue", "cgroup": "/b"}, Histogram.from_samples([2]))
    c = Series({"probe": "syscall", "cgroup": "/a"}, Histogram.from_samples([3]))
    doc = HistDocument(0, 1, [a, b, c])
    assert doc.find(probe="runqueue") == [a, b]
    assert doc.find(cgroup="/a") == [a, c]
    assert doc.find(probe="runqueue", cgroup="/b") == [b]
    assert doc.find(probe="tcp") == []
    assert doc.find() == [a, b, c]


# -- the documented example -------------------------------------------------------------------


def test_documented_example_parses_and_is_canonical() -> None:
    text = documented_example()
    doc = HistDocument.loads(text)
    assert doc.dumps() == text
    book = doc.find(cgroup="/trading/book")[0].hist
    assert book.count == 20 and book.sum_ns == 30_094_000
    # The worked quantiles in the document, computed by hand there.
    assert book.quantile(0.5) == pytest.approx(4_166.67, abs=0.01)
    assert book.quantile(0.9) == 17_500.0
    assert book.quantile(0.99) == pytest.approx(36_864_000.0)
    batch = doc.find(cgroup="/batch")[0].hist
    assert batch.overflow == 1 and batch.count == 4
    assert [(c.name, c.value) for c in doc.counters] == [("events_dropped", 0)]


# -- reject rules -----------------------------------------------------------------------------

Mutation = Callable[[dict[str, Any]], None]


def _set(path: list[Any], value: Any) -> Mutation:
    def mutate(obj: dict[str, Any]) -> None:
        target: Any = obj
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return mutate


def _delete(path: list[Any]) -> Mutation:
    def mutate(obj: dict[str, Any]) -> None:
        target: Any = obj
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]

    return mutate


def _append_duplicate_series(obj: dict[str, Any]) -> None:
    obj["series"].append(copy.deepcopy(obj["series"][0]))


def _append_duplicate_counter(obj: dict[str, Any]) -> None:
    obj["counters"].append(copy.deepcopy(obj["counters"][0]))


REJECTS: list[tuple[str, Mutation, str]] = [
    ("other version", _set(["format"], "tailsight.hist/2"), "found format 'tailsight.hist/2'"),
    ("no version", _delete(["format"]), "no 'format' field"),
    ("bucket width", _set(["bucket_width_ns"], 1000), "bucket_width_ns is 1000"),
    ("missing top field", _delete(["end_ns"]), "missing field(s) end_ns"),
    ("missing series field", _delete(["series", 0, "overflow"]), "missing field(s) overflow"),
    ("missing counter field", _delete(["counters", 0, "value"]), "missing field(s) value"),
    ("unknown field", _set(["bucket_upper_bounds_ns"], [5000]), "unknown field(s)"),
    ("unknown series field", _set(["series", 1, "p99"], 7), "unknown field(s) p99"),
    ("count mismatch", _set(["series", 0, "count"], 21), "count is 21 but buckets"),
    ("overflow mismatch", _set(["series", 1, "overflow"], 0), "add up to 3"),
    ("index out of range", _set(["series", 0, "buckets", 3], [NUM_BUCKETS, 1]), "out of range"),
    ("duplicate index", _set(["series", 0, "buckets", 1], [0, 5]), "duplicate bucket index 0"),
    ("not ascending", _set(["series", 0, "buckets", 2], [0, 2]), "must be ascending"),
    ("negative count", _set(["series", 0, "buckets", 0], [0, -12]), "negative value -12"),
    ("negative index", _set(["series", 0, "buckets", 0], [-1, 12]), "negative value -1"),
    ("negative overflow", _set(["series", 1, "overflow"], -1), "overflow: negative"),
    ("negative counter", _set(["counters", 0, "value"], -1), "value: negative"),
    ("float count", _set(["series", 0, "count"], 20.0), "expected a non-negative integer"),
    ("bool count", _set(["series", 1, "overflow"], True), "expected a non-negative integer"),
    ("string sum", _set(["series", 0, "sum_ns"], "30094000"), "sum_ns: expected"),
    ("float time", _set(["start_ns"], 1.5), "start_ns: expected"),
    ("bad pair", _set(["series", 0, "buckets", 0], [0, 12, 1]), "expected [index, count]"),
    ("series not array", _set(["series"], {}), "expected a JSON array"),
    ("series not object", _set(["series", 0], [1]), "expected a JSON object"),
    ("label not string", _set(["series", 0, "labels", "cgroup"], 5), "label 'cgroup'"),
    ("empty counter name", _set(["counters", 0, "name"], ""), "non-empty string"),
    ("time reversed", _set(["end_ns"], 0), "before start_ns"),
    ("duplicate series labels", _append_duplicate_series, "same series as series[0]"),
    ("duplicate counter", _append_duplicate_counter, "same counter as counters[0]"),
    ("huge count", _set(["series", 0, "buckets", 0], [0, 2**63]), "does not fit in int64"),
    (
        "huge total",
        _set(
            ["series", 1],
            {
                "labels": {},
                "count": 2**63,
                "sum_ns": 0,
                "buckets": [[0, 2**62], [1, 2**62]],
                "overflow": 0,
            },
        ),
        "total count does not fit in int64",
    ),
]


@pytest.mark.parametrize(
    ("mutation", "message"), [r[1:] for r in REJECTS], ids=[r[0] for r in REJECTS]
)
def test_reject_rules(mutation: Mutation, message: str) -> None:
    obj = json.loads(documented_example())
    HistDocument.from_json(copy.deepcopy(obj))  # the unmutated example is valid
    mutation(obj)
    with pytest.raises(HistFormatError) as raised:
        HistDocument.from_json(obj)
    assert message in str(raised.value)
    with pytest.raises(HistFormatError):  # and the same through the text path
        HistDocument.loads(json.dumps(obj))


def test_version_message_names_both_versions() -> None:
    obj = json.loads(documented_example())
    obj["format"] = "tailsight.hist/2"
    with pytest.raises(HistFormatError, match=r"tailsight\.hist/2.*supports 'tailsight\.hist/1'"):
        HistDocument.from_json(obj)


def test_series_errors_name_the_series() -> None:
    obj = json.loads(documented_example())
    obj["series"][1]["count"] = 99
    with pytest.raises(HistFormatError, match=r"series\[1\] \{cgroup='/batch', probe='runqueue'\}"):
        HistDocument.from_json(obj)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "not valid JSON"),
        ('{"format": "tailsight.hist/1", "format": "tailsight.hist/1"}', "duplicate JSON key"),
        ("[]", "expected a JSON object"),
        ("null", "expected a JSON object"),
        (b"\xff\xfe", "not valid JSON"),
    ],
)
def test_reject_malformed_json(text: str | bytes, message: str) -> None:
    with pytest.raises(HistFormatError, match=message):
        HistDocument.loads(text)


def test_reject_nan() -> None:
    text = documented_example().replace('"sum_ns": 30094000', '"sum_ns": NaN')
    with pytest.raises(HistFormatError, match="NaN"):
        HistDocument.loads(text)


def test_read_error_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text(documented_example().replace('"count": 20', '"count": 19'), encoding="utf-8")
    with pytest.raises(HistFormatError, match=r"broken\.json: series\[0\].*count is 19"):
        HistDocument.read(path)


# -- atomic writes ----------------------------------------------------------------------------


def test_write_leaves_no_temp_files(tmp_path: Path) -> None:
    doc = HistDocument.loads(documented_example())
    target = tmp_path / "interval.json"
    doc.write(target)
    doc.write(target)  # overwrite in place
    assert sorted(p.name for p in tmp_path.iterdir()) == ["interval.json"]
    assert target.read_text(encoding="utf-8") == documented_example()


def test_failed_write_keeps_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "interval.json"
    old = HistDocument(0, 1)
    old.write(target)
    before = target.read_bytes()

    def broken_replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        raise OSError("disk on fire")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk on fire"):
        HistDocument.loads(documented_example()).write(target)
    assert target.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["interval.json"]


def test_write_into_missing_directory_fails_cleanly(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        HistDocument(0, 1).write(tmp_path / "missing" / "x.json")
    assert list(tmp_path.iterdir()) == []


def test_writer_refuses_invalid_documents(tmp_path: Path) -> None:
    hist = Histogram.from_samples([1])
    twins = HistDocument(0, 1, [Series({"a": "1"}, hist), Series({"a": "1"}, hist)])
    with pytest.raises(HistFormatError, match="same series"):
        twins.dumps()
    not_string = HistDocument(0, 1, [Series({"cgroup_id": 7}, hist)])  # type: ignore[dict-item]
    with pytest.raises(HistFormatError, match="label 'cgroup_id'"):
        not_string.write(tmp_path / "x.json")
    assert list(tmp_path.iterdir()) == []


def test_zero_count_buckets_are_accepted_and_dropped() -> None:
    obj = json.loads(documented_example())
    obj["series"][0]["buckets"].insert(2, [2, 0])
    doc = HistDocument.from_json(obj)
    assert doc.dumps() == documented_example()


def test_label_order_does_not_make_series_distinct() -> None:
    obj = json.loads(documented_example())
    twin = copy.deepcopy(obj["series"][0])
    twin["labels"] = dict(reversed(list(twin["labels"].items())))
    obj["series"].append(twin)
    with pytest.raises(HistFormatError, match=r"series\[2\]: same series as series\[0\]"):
        HistDocument.from_json(obj)


def test_sum_is_not_checked_against_buckets() -> None:
    """A map read racing the kernel can tear sum from counts by one event; that is still data."""
    torn = HistDocument(0, 1, [Series({"probe": "p"}, Histogram.from_sparse([], 0, 4_200))])
    assert HistDocument.loads(torn.dumps()) == torn
