"""The generic Snapshot: interval deltas, reset detection, naming cgroups (merge by path,
idle/unknown names, the --cgroup filter), all against hand-computed expectations."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import pytest

from tailsight.hist import Histogram
from tailsight.histfile import HistDocument
from tailsight.probes.base import Snapshot, labels

WAIT = "runqueue_displaced_wait_ns"
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
