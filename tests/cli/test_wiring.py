"""What trace, serve and record run (tailsight/cli/wiring.py) with scripted fake probes: trace's
live session is the agent's loop, so its whole-run total is exactly the last reading minus the
first, and a map that went backwards costs it one interval, as it does the agent."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from tailsight.cgroups import CgroupResolver
from tailsight.cli.wiring import BadInput, RunningTotal, check_probes, open_session
from tailsight.hist import Histogram
from tailsight.intervals import Counter, HistDocument, Series
from tailsight.probes.base import Snapshot
from tests.collector.test_agent import FakeProbe, script


@pytest.fixture
def tree(tmp_path: Path) -> tuple[CgroupResolver, dict[str, int]]:
    root = tmp_path / "cg"
    for name in ("a", "b", "a/x"):
        (root / name).mkdir(parents=True)
    ids = {f"/{n}": os.stat(root / n).st_ino for n in ("a", "b", "a/x")}
    return CgroupResolver(root), ids


class Recorded(FakeProbe):
    """A FakeProbe that keeps every reading and the cgroup filters it was given."""

    def __init__(self, name: str, steps: list[dict[int, np.ndarray]]) -> None:
        super().__init__(name, steps)
        self.readings: list[Snapshot] = []
        self.filters: list[set[int] | None] = []

    def read(self) -> Snapshot:
        self.readings.append(super().read())
        return self.readings[-1]

    def set_cgroup_filter(self, cgroup_ids: object) -> None:
        self.filters.append(None if cgroup_ids is None else set(cgroup_ids))  # type: ignore[call-overload]


def test_session_total_is_the_cumulative_difference(
    tree: tuple[CgroupResolver, dict[str, int]],
) -> None:
    resolver, ids = tree
    fakes = {
        "runqueue": Recorded("runqueue", script(ids, 5, seed=7)),
        "netsyscall": Recorded("netsyscall", script(ids, 5, seed=8)),
    }
    warnings: list[str] = []
    session = open_session(
        ["runqueue", "netsyscall"],
        [],
        warnings.append,
        resolver=resolver,
        create_probe=fakes.__getitem__,
    )
    intervals = [session.advance()[1] for _ in range(4)]
    total = session.document()
    session.close()
    assert warnings == []
    # Ground truth: last reading minus the baseline, named once, probes in attach order.
    expected = HistDocument(start_ns=session.total.start_ns, end_ns=total.end_ns)
    for probe in fakes.values():
        part = (probe.readings[-1] - probe.readings[0]).to_document(
            session.total.start_ns, resolver.resolve_many
        )
        expected.series.extend(part.series)
        expected.counters.extend(part.counters)
    assert total.dumps() == expected.dumps()
    assert [i.start_ns for i in intervals[1:]] == [i.end_ns for i in intervals[:-1]]
    assert intervals[0].start_ns - total.start_ns >= 0


def test_session_skips_the_interval_of_a_reset_like_the_agent(
    tree: tuple[CgroupResolver, dict[str, int]],
) -> None:
    resolver, ids = tree
    steps = script(ids, 4, seed=9)
    probe = Recorded("runqueue", steps)
    warnings: list[str] = []
    session = open_session(
        ["runqueue"], [], warnings.append, resolver=resolver, create_probe=lambda n: probe
    )
    session.advance()
    probe.state = {}  # the maps were recreated: cumulative values went down
    _, skipped = session.advance()
    total, after = session.advance()
    session.close()
    assert skipped.series == []
    assert any("reset" in w and "interval skipped" in w for w in warnings)
    assert session.agent.statuses["runqueue"].read_errors == 1
    # The total holds the first interval and the one after the reset, nothing of the reset's.
    (series,) = total.find(probe="runqueue", cgroup="/a")
    first = Histogram.from_samples(steps[0][ids["/a"]])
    resumed = Histogram.from_samples(steps[2][ids["/a"]])
    assert series.hist == first + resumed
    assert after.find(probe="runqueue", cgroup="/a")[0].hist == resumed


def test_session_filter_follows_the_subtrees(
    tree: tuple[CgroupResolver, dict[str, int]], tmp_path: Path
) -> None:
    resolver, ids = tree
    probe = Recorded("runqueue", script(ids, 3, seed=10))
    session = open_session(
        ["runqueue"], ["a/"], lambda m: None, resolver=resolver, create_probe=lambda n: probe
    )
    # Compiled in before attach, then the subtree's ids; a new descendant once refreshed.
    assert probe.filters == [set(), {ids["/a"], ids["/a/x"]}]
    (tmp_path / "cg" / "a" / "new").mkdir()
    session.refresh_filter()
    assert probe.filters[-1] == {ids["/a"], ids["/a/x"], os.stat(tmp_path / "cg/a/new").st_ino}
    total, _ = session.advance()
    session.close()
    # The fake counts /b too; what the kernel would not have counted is not shown.
    assert {s.labels["cgroup"] for s in total.series} == {"/a"}


def test_session_rejects_a_missing_cgroup(tree: tuple[CgroupResolver, dict[str, int]]) -> None:
    resolver, _ = tree
    with pytest.raises(BadInput, match="no cgroup /nope under") as raised:
        open_session(["runqueue"], ["/nope"], lambda m: None, resolver=resolver)
    assert raised.value.option == "--cgroup"
    with pytest.raises(BadInput):
        open_session(["runqueue"], ["/a/../b"], lambda m: None, resolver=resolver)


def test_unknown_probes_are_bad_input_before_privileges() -> None:
    with pytest.raises(BadInput, match=r"unknown probe\(s\) \['nosuch'\]") as raised:
        check_probes(["runqueue", "nosuch"])
    assert raised.value.option == "--probe"


def test_running_total_sums_by_labels_in_probe_order() -> None:
    hist = Histogram.from_samples([3_000, 9_000])
    total = RunningTotal(100, order=["runqueue", "netsyscall"])
    for end_ns in (200, 300):
        total.add(
            HistDocument(
                end_ns - 100,
                end_ns,
                [
                    Series({"probe": "netsyscall", "cgroup": "/a", "syscall": "sendto"}, hist),
                    Series({"probe": "runqueue", "cgroup": "/b"}, hist),
                    Series({"probe": "runqueue", "cgroup": "/a"}, hist),
                ],
                [Counter("runqueue_dropped_events", {"probe": "runqueue", "reason": "x"}, 2)],
            )
        )
    document = total.document()
    assert (document.start_ns, document.end_ns) == (100, 300)
    assert [(s.labels["probe"], s.labels["cgroup"]) for s in document.series] == [
        ("runqueue", "/a"),
        ("runqueue", "/b"),
        ("netsyscall", "/a"),
    ]
    assert all(s.hist == hist + hist for s in document.series)
    assert [c.value for c in document.counters] == [4]
