"""How an injection is scored: the first incident holding the victim's jump near the injection,
its causes ranked as the report ranks them (or only the victim's own, for the demo); and where
the limits of cpu_throttle and memory_pressure are written (fake cgroup trees; the kernel test
sets them for real)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tailsight.analysis.causes import Cause
from tailsight.analysis.explain.model import ExplainConfig, Incident, Report
from tailsight.testing.inject import Injection, ResourceLimit, score

T0 = 1_000_000_000_000
VICTIM, HOG = "/demo/trading", "/demo/noisy"
EXCHANGE, BACKGROUND = "/demo/exchange", "/background"


def _displacement(victim: str, aggressor: str, effect: float) -> Cause:
    return Cause(
        "displacement", victim, {"aggressor": aggressor}, 0.0, 1.0, 0.0, 30.0, 1e-9, effect,
        discovered=True,
    )  # fmt: skip


def _jump(cgroup: str, at_ns: int) -> Any:
    # Only what scoring reads of a JumpExplanation: its labels and when it started.
    return SimpleNamespace(labels={"probe": "runqueue", "cgroup": cgroup}, change_start_ns=at_ns)


def _report(*incidents: Incident) -> Report:
    return Report(T0, T0 + 60 * 10**9, 120, {}, 10, [], ExplainConfig(), list(incidents))


def test_the_victims_incident_is_scored_and_its_top_cause_must_name_the_culprit() -> None:
    truth = Injection("cpu_hog", [], T0 + 20 * 10**9, VICTIM, HOG, ("displacement",))
    earlier = Incident(
        [_jump(EXCHANGE, T0)], [], [_displacement(EXCHANGE, HOG, 9.0)], 1, [EXCHANGE]
    )
    mine = Incident(
        [_jump(VICTIM, truth.inject_ns + 400_000_000)], [], [_displacement(VICTIM, HOG, 5.0)], 1,
        [VICTIM],
    )  # fmt: skip
    result = score(_report(earlier, mine), truth)
    assert result.found and result.top1 and abs(result.time_error_s - 0.4) < 1e-9
    # Too far from the injection: not the victim's incident.
    late = Injection("cpu_hog", [], T0 + 10 * 10**9, VICTIM, HOG, ("displacement",))
    assert not score(_report(mine), late).found


def test_own_causes_ranks_only_the_victims_displacement() -> None:
    # Background load: the exchange's jump headlines the incident and its cause comes first.
    truth = Injection("cpu_hog", [], T0, VICTIM, HOG, ("displacement",))
    incident = Incident(
        [_jump(EXCHANGE, T0), _jump(VICTIM, T0)], [],
        [_displacement(EXCHANGE, BACKGROUND, 9.0), _displacement(VICTIM, HOG, 5.0)], 2,
        [EXCHANGE, VICTIM],
    )  # fmt: skip
    assert not score(_report(incident), truth).top1
    own = score(_report(incident), truth, own_causes=True)
    assert own.top1 and HOG in own.named
    # A victim whose own causes do not name the culprit is still wrong.
    wrong = Incident([_jump(VICTIM, T0)], [], [_displacement(VICTIM, BACKGROUND, 5.0)], 1, [VICTIM])
    assert not score(_report(wrong), truth, own_causes=True).top1


def _cause(kind: str, cgroup: str) -> Cause:
    return Cause(kind, cgroup, {}, 0.0, 1.0, 0.0, 30.0, 1e-9, 3.0)


@pytest.mark.parametrize(
    ("kind", "cause", "cgroup", "right"),
    [
        ("cpu_throttle", "throttling", VICTIM, True),
        ("cpu_throttle", "throttling", "/demo", True),  # a parent's limit parks it too
        ("cpu_throttle", "throttling", "/", True),
        ("cpu_throttle", "throttling", "/demo/trading-other", False),
        ("cpu_throttle", "throttling", HOG, False),
        ("memory_pressure", "memory_pressure", VICTIM, True),
        ("memory_pressure", "memory_pressure", "/demo", False),
        ("memory_pressure", "io_pressure", VICTIM, False),  # the refaults' reads, not the limit
    ],
)
def test_a_limit_is_named_where_it_bites(kind: str, cause: str, cgroup: str, right: bool) -> None:
    expected = {"cpu_throttle": ("throttling",), "memory_pressure": ("memory_pressure",)}[kind]
    truth = Injection(kind, [], T0, VICTIM, VICTIM, expected)
    incident = Incident([_jump(VICTIM, T0)], [], [_cause(cause, cgroup)], 1, [VICTIM])
    assert score(_report(incident), truth).top1 is right


def _tree(root: Path, path: str, files: dict[str, str]) -> Path:
    directory = root / path.strip("/")
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (directory / name).write_text(text)
    return directory


def test_on_a_hybrid_host_the_limit_is_set_in_the_v1_group_at_the_victims_v2_path(
    tmp_path: Path,
) -> None:
    v2, v1 = tmp_path / "unified", tmp_path / "cpu"
    _tree(v2, "tailsight-test/9-rca/victim", {})
    _tree(v1, "tailsight-test", {})  # a level of a concurrent run's
    limit = ResourceLimit("cpu", "/tailsight-test/9-rca/victim", v2_mount=v2, v1_mount=v1)
    limit.place([4242])
    group = v1 / "tailsight-test/9-rca/victim"
    assert limit.directory == group
    assert (group / "cgroup.procs").read_text() == "4242"
    assert (group / "cpu.cfs_quota_us").read_text() == "-1"
    limit.limit_cpu(20_000, 100_000)
    assert (group / "cpu.cfs_quota_us").read_text() == "20000"
    assert (group / "cpu.cfs_period_us").read_text() == "100000"
    (group / "cpu.stat").write_text(
        "nr_periods 80\nnr_throttled 79\nthrottled_time 4660192756\nnr_bursts 0\n"
    )
    assert limit.counters() == {
        "nr_periods": 80,
        "nr_throttled": 79,
        "throttled_ns": 4_660_192_756,
    }
    limit.lift()
    assert (group / "cpu.cfs_quota_us").read_text() == "-1"


def test_on_a_pure_v2_host_the_limit_is_the_v2_groups_own(tmp_path: Path) -> None:
    v2 = tmp_path / "cgroup"
    mounts = tmp_path / "mounts"
    mounts.write_text(f"cgroup2 {v2} cgroup2 rw,nosuid 0 0\n")
    _tree(v2, "", {"cgroup.controllers": "cpuset cpu io memory pids\n"})
    group = _tree(
        v2,
        "tailsight-test/9-rca/victim",
        {
            "memory.stat": "anon 1000\nfile 2000\nworkingset_refault_file 510\n",
            "memory.events": "low 0\nhigh 7\nmax 0\noom 0\noom_kill 0\n",
            "memory.pressure": "some avg10=1.00 avg60=0.20 avg300=0.04 total=1234\n"
            "full avg10=0.50 avg60=0.10 avg300=0.02 total=999\n",
        },
    )
    limit = ResourceLimit("memory", "/tailsight-test/9-rca/victim", mounts_path=mounts)
    assert not limit.v1 and limit.directory == group
    limit.place([4242])  # already in the group: the controller is enabled above it
    for level in ("tailsight-test", "tailsight-test/9-rca"):
        assert (v2 / level / "cgroup.subtree_control").read_text() == "+memory"
    assert not (v2 / "cgroup.subtree_control").exists()  # the root's is the host's
    limit.limit_memory(128 << 20)
    assert (group / "memory.high").read_text() == str(128 << 20)
    assert limit.counters() == {"limit_hits": 7, "refaults": 510, "memory_stall_us": 1234}
    limit.close()
    assert (group / "memory.high").read_text() == "max"


def test_a_host_without_the_controller_is_told_so(tmp_path: Path) -> None:
    mounts = tmp_path / "mounts"
    mounts.write_text(f"cgroup2 {tmp_path} cgroup2 rw 0 0\n")
    (tmp_path / "cgroup.controllers").write_text("memory pids\n")
    with pytest.raises(RuntimeError, match="no cpu controller"):
        ResourceLimit("cpu", "/a/b", mounts_path=mounts)
