"""The CI latency gate end to end: the example GitHub workflow's gate step run as written (tiny
sizes, BASE=CAND=HEAD, expecting pass), and real replays where a calibration-only injected delay
is called a regression while an unchanged build is not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.statistical import run_tries

REPO = Path(__file__).resolve().parents[2]
WORKFLOW = REPO / ".github" / "workflows" / "latency-gate.yml"
CLI = "import sys; from tailsight.cli.main import app; sys.argv[0] = 'tailsight'; app()"
AA_PASS_RATE = 0.9  # per A/A comparison: the gate's design goal, and measured (tests/README.md)


def _job() -> dict[str, Any]:
    workflow = yaml.safe_load(WORKFLOW.read_text())
    job: dict[str, Any] = workflow["jobs"]["latency-gate"]
    return job


def _gate_step() -> dict[str, Any]:
    (step,) = [s for s in _job()["steps"] if s.get("name") == "latency gate"]
    return step


def test_workflow_runs_make_gate_with_the_recommended_runs() -> None:
    job, step = _job(), _gate_step()
    assert "make gate" in step["run"] and "$BASE" in step["run"] and "$CAND" in step["run"]
    assert job["env"]["RUNS"] == "30"  # docs/ci-gate.md's recommendation
    assert "pull_request.base.sha" in step["env"]["BASE"]
    assert "pull_request.head.sha" in step["env"]["CAND"]
    checkout = next(
        s for s in job["steps"] if str(s.get("uses", "")).startswith("actions/checkout")
    )
    assert checkout["with"]["fetch-depth"] == 0  # both revisions must be in the clone
    # What make runs for it: the worktree script with the same sizes and gate options.
    dry = subprocess.run(
        ["make", "-n", "gate", "BASE=a", "CAND=b", "RUNS=7", "DURATION=2", "GATE_ARGS=--json"],
        cwd=REPO, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert 'scripts/gate_revs.py --base "a" --cand "b" --runs 7' in dry.stdout
    assert "--duration 2" in dry.stdout and "-- --json" in dry.stdout
    # The script's defaults (placement auto, busy poll, one run per block) unless overridden.
    assert "--placement" not in dry.stdout and "busy-poll" not in dry.stdout
    override = subprocess.run(
        ["make", "-n", "gate", "BASE=a", "CAND=b", "PLACEMENT=none", "BUSY_POLL=0", "BLOCK=5"],
        cwd=REPO, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert '--placement "none"' in override.stdout and "--no-busy-poll" in override.stdout
    assert "--block 5" in override.stdout


def test_gate_revs_refuses_an_unknown_revision() -> None:
    result = subprocess.run(
        [sys.executable, "scripts/gate_revs.py", "--base", "no-such-rev", "--cand", "HEAD"],
        cwd=REPO, capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 2 and "'no-such-rev' is not a commit" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.kernel
@pytest.mark.slow
def test_workflow_gate_step_passes_head_against_itself(kernel_ready: None, tmp_path: Path) -> None:
    # A fresh checkout of HEAD, as the CI job has; the shared venv stands in for `make setup`.
    # Changes to the command: `sudo` dropped (the test runs as root; sudo would reset VENV).
    checkout = tmp_path / "checkout"
    subprocess.run(
        ["git", "worktree", "add", "--detach", "--quiet", str(checkout), "HEAD"],
        cwd=REPO, check=True,
    )  # fmt: skip
    try:
        step = _gate_step()
        env = {
            **os.environ,
            **_job()["env"],
            "BASE": "HEAD",
            "CAND": "HEAD",
            "RUNS": "5",
            "DURATION": "1",
            "GATE_ARGS": "--min-effect 0.5",  # 5 runs of 1 s cannot show a 5 % bound
            "VENV": str(REPO / ".venv"),
        }
        command = step["run"].replace("sudo ", "")
        result = subprocess.run(
            ["bash", "-eo", "pipefail", "-c", command],
            cwd=checkout, env=env, capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        report = (checkout / "latency-gate.txt").read_text()
        assert "built base: HEAD" in report and "built cand: HEAD" in report
        assert "stage=in_system_tick_to_t" in report  # the default series, gated
        assert "5 baseline runs, 5 candidate runs" in report
        # The script's defaults: one run per block (A B A B ...), pinned (auto on two CPUs).
        assert "in 5 interleaved blocks" in report
        assert "== noise floor before: cpu0 " in report and "== noise floor after: cpu0 " in report
        assert "placement=exchange=0,trading=1" in report.replace("\n", "")
        # Ground truth: the same commit on both sides is no regression. Expected: PASS; on this
        # shared 2-core VM five 1 s runs vary too much (run P50s 0.2-6 ms) to show even a 50 %
        # bound, so INCONCLUSIVE is accepted too (make turns its exit 3 into 2); never an error.
        verdicts = [
            x for x in report.splitlines() if x in ("PASS (exit 0)", "INCONCLUSIVE (exit 3)")
        ]
        assert len(verdicts) == 1, report[-3000:]
        expected_rc = 0 if verdicts[0] == "PASS (exit 0)" else 2  # make turns exit 3 into 2
        assert result.returncode == expected_rc, report[-3000:]
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(checkout)], cwd=REPO)


def _replay(itch: Path, out: Path, runs: int, delay_us: float = 0.0) -> Path:
    command = [sys.executable, "-c", CLI, "replay", str(itch), "--runs", str(runs)]
    command += [
        "--duration",
        "1.5",
        "--out",
        str(out),
    ]  # 2,000 messages/s: what this VM keeps up with
    if delay_us:
        command += ["--inject-delay-us", str(delay_us)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert sorted(out.glob("*.json")), result.stderr[-3000:]
    return out


def _replay_interleaved(
    itch: Path, root: Path, delays_us: dict[str, float], blocks: int, runs: int
) -> dict[str, list[Path]]:
    """Block by block, each side in turn, as `make gate` does: a slow drift of the shared machine
    then hits every side alike (A and A' run one after the other can differ by 18 % at the P50,
    a false regression). Every other block runs in reverse (A B A', A' B A, ...), so each side
    has each place in a block and each predecessor equally often. In a fixed order A' always
    runs last, after the busy-waiting B, and all A' runs' P99s can land above all A's (ratio
    >= 1.5-1.9, called a regression). Cause not known: an after-B slowdown does not show alone
    (3 groups A B A' A'' on this 2-core host: P99 median 280 µs after B, 285-302 µs otherwise),
    so this is a guard against order and drift within a block, not a proven fix."""
    folders: dict[str, list[Path]] = {side: [] for side in delays_us}
    for block in range(blocks):
        order = list(delays_us.items())
        for side, delay_us in order if block % 2 == 0 else reversed(order):
            folders[side].append(_replay(itch, root / side / f"block{block}", runs, delay_us))
    return folders


def _gate(base: list[Path], cand: list[Path]) -> dict[str, Any]:
    command = [sys.executable, "-c", CLI, "gate", "--json"]
    command += [arg for folder in base for arg in ("-b", str(folder))]
    command += [arg for folder in cand for arg in ("-c", str(folder))]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode in (0, 1, 3), result.stderr
    report: dict[str, Any] = json.loads(result.stdout)
    assert report["exit_code"] == result.returncode
    return report


@pytest.mark.kernel
@pytest.mark.slow
def test_injected_delay_is_a_regression_and_an_unchanged_build_is_not(
    kernel_ready: None, tmp_path: Path
) -> None:
    itch = tmp_path / "day.itch"
    subprocess.run(
        [sys.executable, "-c", CLI, "itch", "generate", str(itch), "--messages", "3000"],
        check=True, capture_output=True,
    )  # fmt: skip
    delay_us = 300.0  # far above the in-system P50: unmistakable
    sides = _replay_interleaved(itch, tmp_path, {"A": 0.0, "B": delay_us, "A2": 0.0}, 4, 2)
    base, slow, same = sides["A"], sides["B"], sides["A2"]

    ab = _gate(base, slow)
    assert ab["outcome"] == "regression", json.dumps(ab["comparisons"], indent=1)
    by_name = {c["name"]: c for c in ab["comparisons"]}
    # Ground truth: every order busy-waited delay_us in the strategy before its send, so the
    # median rose by at least about that much. Not asserted for the P99: a 1.5 s run's P99 is
    # close to its max, set by scheduling hiccups of either side (it can come out 135 us lower).
    rise_us = (by_name["p50"]["candidate_ns"] - by_name["p50"]["baseline_ns"]) / 1e3
    assert rise_us > 0.7 * delay_us, rise_us
    # The breakdown shows it in the stage that holds the wait (book -> decision). Not asserted:
    # that no other stage rose more; the acks, read by the same busy thread, wait longer too.
    (median,) = [b for b in ab["breakdowns"] if b["name"] == "p50"]
    (decision,) = [s for s in median["stages"] if s["stage"] == "decision"]
    assert decision["candidate_ns"] - decision["baseline_ns"] > 0.7 * delay_us * 1e3, decision

    # A gate built for at most one false fail in 10 A/A comparisons fails an A/A up to that
    # often by design; what this test rejects is a false regression in each of the tries
    # tests/statistical.py gives that rate: the first A/A pair above, then fresh interleaved ones.
    def aa_try(attempt: int) -> None:
        pair = [base, same]
        if attempt:
            again = _replay_interleaved(
                itch, tmp_path / f"again{attempt}", {"A": 0.0, "A2": 0.0}, 4, 2
            )
            pair = [again["A"], again["A2"]]
        aa = _gate(*pair)
        assert aa["outcome"] != "regression", json.dumps(aa["comparisons"], indent=1)

    run_tries(aa_try, AA_PASS_RATE)
