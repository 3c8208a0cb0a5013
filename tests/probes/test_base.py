"""The generic Snapshot: interval deltas, reset detection, naming cgroups (merge by path,
idle/unknown names, the --cgroup filter), all against hand-computed expectations."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from tailsight.hist import NUM_BUCKETS, Histogram, SparseHistogram
from tailsight.intervals import HistDocument
from tailsight.probes import base
from tailsight.probes.base import (
    HIST_ROW,
    MEMO_GENERATION_INTERVALS,
    HistogramRows,
    LabelMemo,
    PairCounters,
    Snapshot,
    labels,
)

WAIT = "runqueue_displaced_wait_ns"
SWITCHES = "runqueue_displaced_switches"
DROPPED = "runqueue_dropped_events"


def _hist(*values_ns: int) -> Histogram:
    return Histogram.from_samples(list(values_ns))


def _names(mapping: dict[int, str]) -> Callable[[Iterable[int]], dict[int, str]]:
    def resolve(ids: Iterable[int]) -> dict[int, str]:
        return {i: mapping[i] for i in ids if i in mapping}

    return resolve


EARLY = Snapshot(
    "runqueue",
    1_000,
    {labels(cgroup=10): _hist(3_000), labels(cgroup=11): _hist(1)},
    {
        (WAIT, labels(victim=10, aggressor=11)): 3_000,
        (DROPPED, labels(reason="hist_full")): 1,
    },
)
LATE = Snapshot(
    "runqueue",
    2_000,
    {
        labels(cgroup=10): _hist(3_000, 7_000, 20_000_000),
        labels(cgroup=11): _hist(1),
        labels(cgroup=12): _hist(9),
    },
    {
        (WAIT, labels(victim=10, aggressor=11)): 10_000,
        (WAIT, labels(victim=10, aggressor=0)): 20_000_000,
        (WAIT, labels(victim=12, aggressor=0)): 9,
        (DROPPED, labels(reason="hist_full")): 4,
    },
)


def test_delta_subtracts_and_drops_empty_histograms() -> None:
    interval = LATE - EARLY
    assert interval.taken_ns == 2_000 and interval.probe == "runqueue"
    assert interval.histograms == {
        labels(cgroup=10): _hist(7_000, 20_000_000),
        labels(cgroup=12): _hist(9),
    }  # cgroup 11 saw nothing in the interval
    assert interval.counters == {
        (WAIT, labels(victim=10, aggressor=11)): 7_000,
        (WAIT, labels(victim=10, aggressor=0)): 20_000_000,
        (WAIT, labels(victim=12, aggressor=0)): 9,
        (DROPPED, labels(reason="hist_full")): 3,
    }
    assert interval.cgroup_ids() == {10, 11, 12}


def test_reset_or_mismatched_probe_is_an_error() -> None:
    with pytest.raises(ValueError):
        EARLY - LATE  # histogram went backwards
    counter_reset = Snapshot("runqueue", 3_000, {}, {(DROPPED, labels(reason="hist_full")): 0})
    with pytest.raises(ValueError, match="backwards"):
        counter_reset - EARLY
    with pytest.raises(ValueError, match="netsyscall"):
        Snapshot("runqueue", 1) - Snapshot("netsyscall", 0)


def test_document_merges_by_path_and_names_idle() -> None:
    # 12 is /a recreated: same path as 10, merged; 11 is gone: "unknown"; aggressor 0: "idle".
    resolve = _names({10: "/a", 12: "/a"})
    doc = HistDocument.loads((LATE - EARLY).to_document(1_000, resolve).dumps())
    assert (doc.start_ns, doc.end_ns) == (1_000, 2_000)
    (series,) = doc.series
    assert series.labels == {"probe": "runqueue", "cgroup": "/a"}
    assert series.hist == _hist(7_000, 20_000_000, 9)
    counters = {(c.name, tuple(sorted(c.labels.items()))): c.value for c in doc.counters}
    assert counters == {
        (WAIT, (("aggressor", "idle"), ("probe", "runqueue"), ("victim", "/a"))): 20_000_009,
        (WAIT, (("aggressor", "unknown"), ("probe", "runqueue"), ("victim", "/a"))): 7_000,
        (DROPPED, (("probe", "runqueue"), ("reason", "hist_full"))): 3,
    }


@pytest.mark.parametrize("names", [{10: "/a", 12: "/b"}, {10: "/a", 12: "/a"}])
def test_document_series_carry_their_nonzero_buckets(names: dict[int, str]) -> None:
    """The non-zero buckets the interval's delta took (or, for ids merged into one path, taken
    anew) are those of each series' histogram, by a naive scan."""
    for series in (LATE - EARLY).to_document(1_000, _names(names)).series:
        naive = [(i, n) for i, n in enumerate(series.hist.counts.tolist()) if n]
        sparse = series.sparse
        assert list(zip(sparse.index.tolist(), sparse.count.tolist(), strict=True)) == naive
        assert (sparse.overflow, sparse.sum_ns) == (series.hist.overflow, series.hist.sum_ns)


def test_document_keys_are_the_sorted_labels() -> None:
    """The key each series and counter carries (the exporter and recorder use it instead of
    sorting labels again) is its labels sorted, also where ids merged into one path."""
    doc = (LATE - EARLY).to_document(1_000, _names({10: "/a", 12: "/a"}))
    items = [*doc.series, *doc.counters]
    assert len(items) == 4
    for item in items:
        assert item.key == tuple(sorted(item.labels.items()))


def test_keep_filters_on_cgroup_or_victim_but_keeps_unlabelled_counters() -> None:
    resolve = _names({10: "/a", 11: "/b", 12: "/c"})
    doc = (LATE - EARLY).to_document(1_000, resolve, keep=lambda path: path == "/c")
    assert [s.labels["cgroup"] for s in doc.series] == ["/c"]
    assert {(c.name, c.labels.get("victim"), c.value) for c in doc.counters} == {
        (WAIT, "/c", 9),
        (DROPPED, None, 3),
    }


@st.composite
def _pair_snapshots(draw: st.DrawFn) -> tuple[Snapshot, Snapshot]:
    """Two cumulative readings of a pair matrix whose slots changed between them (ids taken,
    given back, reordered): counters grow, a pair's switches may still be 0."""
    pool = st.lists(st.sampled_from([0, 10, 11, 12, 13, 14]), unique=True, max_size=5)
    ids_before, ids_now = draw(pool), draw(pool)
    cell = st.integers(0, 3)
    earlier = {(v, a): (draw(cell), draw(cell)) for v in ids_before for a in ids_before}
    later = {}
    for v in ids_now:
        for a in ids_now:
            wait, switches = earlier.get((v, a), (0, 0))
            later[(v, a)] = (wait + draw(cell), switches + draw(cell))

    def reading(taken_ns: int, ids: list[int], cells: dict[tuple[int, int], tuple[int, int]]):
        values = np.array([[cells[(v, a)] for a in ids] for v in ids], dtype=np.uint64).reshape(
            len(ids), len(ids), 2
        )
        others = {(DROPPED, labels(reason="hist_full")): taken_ns}
        pairs = PairCounters(others, (WAIT, SWITCHES), tuple(ids), values, present=1)
        return Snapshot("runqueue", taken_ns, {}, pairs)

    return reading(1, ids_before, earlier), reading(2, ids_now, later)


@given(_pair_snapshots())
def test_pair_matrix_delta_matches_the_counter_by_counter_one(
    readings: tuple[Snapshot, Snapshot],
) -> None:
    """Subtracting pair matrices gives what subtracting their mappings one counter at a time
    gives (pairs keyed as ``labels`` would, new ones at their value, still ones left out)."""
    earlier, later = readings
    plain_earlier, plain_later = (
        Snapshot(s.probe, s.taken_ns, {}, dict(s.counters.items())) for s in readings
    )
    assert (later - earlier).counters == (plain_later - plain_earlier).counters
    assert later.cgroup_ids() == plain_later.cgroup_ids()
    assert all(key[1] == labels(**dict(key[1])) for key in later.counters)
    assert later.without(set()) is later


@given(
    _pair_snapshots(),
    st.dictionaries(st.sampled_from([10, 11, 12, 13, 14]), st.sampled_from(["/a", "/b", "/c"])),
    st.sampled_from([None, "/b"]),
)
def test_pairs_named_as_arrays_give_the_counters_named_one_by_one(
    readings: tuple[Snapshot, Snapshot], paths: dict[int, str], refused: str | None
) -> None:
    """An interval's pairs stay arrays through ``to_document`` (``CounterPairs``); made into
    counters they are those of the same interval named counter by counter, in the same order:
    ids of one path merged, idle and unknown named, pairs of a refused victim left out."""
    earlier, later = readings
    plain_earlier, plain_later = (
        Snapshot(s.probe, s.taken_ns, {}, dict(s.counters.items())) for s in readings
    )
    keep = None if refused is None else (lambda path: path != refused)
    blocks = (later - earlier).to_document(0, _names(paths), keep)
    one_by_one = (plain_later - plain_earlier).to_document(0, _names(paths), keep)
    parts = blocks.counter_parts()
    assert len(parts) == 1 and not isinstance(parts[0], list)  # held as arrays until asked
    assert blocks.counters == one_by_one.counters
    assert [c.key for c in blocks.counters] == [c.key for c in one_by_one.counters]
    assert blocks == one_by_one


def test_pairs_keep_their_label_objects_from_one_interval_to_the_next() -> None:
    """Made into counters with the same memo, a pair's labels are the same objects every
    interval of a generation (the recording keeps each label set's JSON by its key object), and
    new ones after it."""
    names = (WAIT, SWITCHES)
    memo = LabelMemo()
    made = []
    for t in range(3):
        matrix = np.full((2, 2, 2), t + 1, dtype=np.uint64)
        made.append(Snapshot("runqueue", t, {}, PairCounters({}, names, (0, 10), matrix, 1)))
    keys = [
        {
            (c.name, c.key): c.key
            for c in (b - a).to_document(0, _names({10: "/a"}), None, memo).counters
        }
        for a, b in itertools.pairwise(made)
    ]
    assert keys[0] == keys[1] and len(keys[0]) == 8
    assert all(keys[0][k] is keys[1][k] for k in keys[0])
    for _ in range(MEMO_GENERATION_INTERVALS):
        memo.recall([])
    again = (made[2] - made[1]).to_document(0, _names({10: "/a"}), None, memo).counters
    assert all(c.key is not keys[0][(c.name, c.key)] for c in again)


def test_a_pair_going_backwards_is_named() -> None:
    before = np.array([[[5, 1]]], dtype=np.uint64)
    after = np.array([[[4, 1]]], dtype=np.uint64)
    readings = [
        Snapshot("runqueue", t, {}, PairCounters({}, (WAIT, SWITCHES), (10,), m, present=1))
        for t, m in ((1, before), (2, after))
    ]
    with pytest.raises(ValueError, match=r"victim', 10.*went backwards by 1"):
        readings[1] - readings[0]


Cells = dict[int, int]  # bucket (NUM_BUCKETS: overflow) -> count


def _rows_reading(taken_ns: int, held: dict[int, tuple[Cells, int]]) -> Snapshot:
    rows = np.zeros((len(held), HIST_ROW), dtype=np.int64)
    for row, (cells, _) in enumerate(held.values()):
        for bucket, count in cells.items():
            rows[row, bucket] = count
    sums = [sum_ns for _, sum_ns in held.values()]
    keys = [labels(cgroup=cgroup_id) for cgroup_id in held]
    return Snapshot("runqueue", taken_ns, HistogramRows(keys, rows, sums))


@st.composite
def _rows_readings(draw: st.DrawFn) -> tuple[Snapshot, Snapshot]:
    """Two cumulative readings of histogram rows whose series changed between them (came, went,
    reordered): counts, overflow and sums grow or stay, a row may be still or hold nothing."""
    pool = st.lists(st.sampled_from([10, 11, 12, 13, 14]), unique=True, max_size=5)
    keys_before, keys_now = draw(pool), draw(pool)
    bucket = st.sampled_from([0, NUM_BUCKETS - 1, NUM_BUCKETS]) | st.integers(0, HIST_ROW - 1)
    cells = st.dictionaries(bucket, st.integers(0, 3), max_size=4)
    earlier = {key: (draw(cells), draw(st.integers(0, 9))) for key in keys_before}
    later = {}
    for key in keys_now:
        was, sum_was = earlier.get(key, ({}, 0))
        more = draw(cells)
        grown = {b: was.get(b, 0) + more.get(b, 0) for b in was | more}
        later[key] = (grown, sum_was + draw(st.integers(0, 2)))
    return _rows_reading(1, earlier), _rows_reading(2, later)


def _as_lists(parts: dict[base.Labels, SparseHistogram]) -> dict[base.Labels, tuple]:
    return {
        key: (part.index.tolist(), part.count.tolist(), part.overflow, part.sum_ns)
        for key, part in parts.items()
    }


@given(_rows_readings())
def test_rows_delta_matches_the_histogram_by_histogram_one(
    readings: tuple[Snapshot, Snapshot],
) -> None:
    """Subtracting histogram blocks gives what subtracting their histograms one at a time
    gives: changed rows only (a torn sum alone included), new keys at their value."""
    earlier, later = readings
    plain_earlier, plain_later = (
        Snapshot(s.probe, s.taken_ns, dict(s.histograms.items())) for s in readings
    )
    interval, plain = later - earlier, plain_later - plain_earlier
    assert _as_lists(dict(interval.sparse)) == _as_lists(dict(plain.sparse))
    assert interval.histograms == plain.histograms


def test_rows_going_down_are_named() -> None:
    earlier = _rows_reading(1, {10: ({}, 0), 11: ({5: 2, NUM_BUCKETS: 3}, 9)})
    for cells, sum_ns, match in (
        ({5: 1, NUM_BUCKETS: 3}, 9, r"bucket 5 of \(\('cgroup', 11\),\) went down \(2 -> 1\)"),
        ({5: 2, NUM_BUCKETS: 2}, 9, r"overflow of .*11.* went down \(3 -> 2\)"),
        ({5: 2, NUM_BUCKETS: 3}, 8, r"sum_ns of .*11.* went down \(9 -> 8\)"),
    ):
        later = _rows_reading(2, {11: (cells, sum_ns), 10: ({}, 0)})  # moved rows, too
        with pytest.raises(ValueError, match=match):
            later - earlier


@given(st.lists(st.tuples(st.sampled_from("abc"), st.lists(st.integers(0, 10**8))), max_size=6))
def test_rows_merged_by_group_are_their_histograms_merged(
    rows: list[tuple[str, list[int]]],
) -> None:
    hists = [Histogram.from_samples(samples) for _, samples in rows]
    block = HistogramRows.of(dict(enumerate(hists)))
    expected: dict[str, Histogram] = {}
    for (group, _), hist in zip(rows, hists, strict=True):
        expected[group] = expected[group].merge(hist) if group in expected else hist
    merged = block.merged([group for group, _ in rows])
    assert merged == expected and list(merged) == list(expected)


def test_label_memo_names_as_without_it_and_forgets_keys_unused_for_a_generation() -> None:
    """A document named with the memo equals one named afresh; an id not found yet is asked
    again later; a key unused for two generations is no longer held."""
    memo = LabelMemo()
    interval = LATE - EARLY
    first = interval.to_document(1_000, _names({10: "/a"}), memo=memo)
    assert first == interval.to_document(1_000, _names({10: "/a"}))
    later = interval.to_document(1_000, _names({10: "/a", 12: "/c"}), memo=memo)
    assert "/c" in {s.labels["cgroup"] for s in later.series}  # 12 was unknown, now found
    only_then = Snapshot("runqueue", 3_000, {}, {(DROPPED, labels(reason="gone")): 1})
    lone = Snapshot("runqueue", 3_000, {}, {(DROPPED, labels(reason="hist_full")): 1})
    only_then.to_document(2_000, _names({}), memo=memo)
    assert labels(reason="gone") in memo.current
    for _ in range(2 * MEMO_GENERATION_INTERVALS):
        lone.to_document(2_000, _names({}), memo=memo)
    assert labels(reason="gone") not in {*memo.current, *memo.previous}
    assert labels(reason="hist_full") in memo.current


_TEXT = st.characters(min_codepoint=1)  # no NUL, as in label values


@given(
    st.lists(st.text(_TEXT, max_size=4), min_size=3, max_size=3),
    st.lists(st.text(_TEXT, min_size=1, max_size=3), min_size=2, max_size=3, unique=True),
)
@example(["a", "b", "c"], ["b", "ba"])  # "b" + "aggressor..." sorts after "ba" + "aggressor..."
def test_document_counters_come_sorted_as_their_label_pairs(
    paths: list[str], counter_names: list[str]
) -> None:
    """Counters sort by (name, sorted labels) as tuples would, paths and names that are
    prefixes of each other included (the document sorts them as text)."""
    counters = {
        (name, labels(victim=v, aggressor=a)): 1
        for name in counter_names
        for v in (10, 11, 12)
        for a in (0, 10, 11, 12)
    }
    names = {10 + i: "/" + path for i, path in enumerate(paths)}
    doc = Snapshot("runqueue", 2, {}, counters).to_document(1, _names(names))
    keys = [(c.name, c.key) for c in doc.counters]
    assert keys == sorted(keys)


def test_label_memo_holds_at_most_two_generations_of_keys_under_churn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """New cgroups every interval (churn): a generation ends at MEMO_GENERATION_KEYS keys, so
    the memo holds at most two generations' worth plus one interval's."""
    monkeypatch.setattr(base, "MEMO_GENERATION_KEYS", 10)
    memo = LabelMemo()
    for interval in range(50):
        counters = {(DROPPED, labels(cgroup=1000 * interval + n)): 1 for n in range(4)}
        every_path = {1000 * interval + n: f"/c{interval}-{n}" for n in range(4)}
        Snapshot("runqueue", 2, {}, counters).to_document(1, _names(every_path), memo=memo)
        assert len(memo.current) + len(memo.previous) <= 2 * (10 + 4)
