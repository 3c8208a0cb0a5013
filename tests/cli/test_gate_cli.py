"""``tailsight gate`` through typer's CliRunner on run files written with HistDocument.write: exit
codes 0/1/3 against the generator's known effect, 2 for bad input, JSON, the 80-column view."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from tailsight.analysis.gate import DEFAULT_STAGE
from tailsight.cli.main import app
from tailsight.testing.eval import LatencyModel, RunNoise, simulate_runs

runner = CliRunner()
MODEL = LatencyModel()
CALM = RunNoise(scale_sigma=0.01, noisy_run_prob=0.0, events_per_run=200_000)


def _write_runs(folder: Path, model: LatencyModel, runs: int, seed: int) -> Path:
    folder.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    for n, document in enumerate(simulate_runs(model, runs, rng, CALM)):
        document.write(folder / f"run{n:02d}.json")
    return folder


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("runs")
    return {
        "base": _write_runs(root / "base", MODEL, 10, 1),
        "worse": _write_runs(root / "worse", MODEL.with_tail_ratio(1.3), 10, 2),
        "better": _write_runs(root / "better", MODEL.with_tail_ratio(0.9), 10, 3),
        "few": _write_runs(root / "few", MODEL, 3, 4),
    }


def _gate(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["gate", *args])
    return result.exit_code, result.output


def test_regression_exits_1_and_names_the_quantile(runs: dict[str, Path]) -> None:
    code, output = _gate("-b", str(runs["base"]), "-c", str(runs["worse"]))
    assert code == 1, output
    assert "REGRESSION" in output and "p99" in output
    assert max(len(line) for line in output.splitlines()) <= 80


def test_improvement_exits_0(runs: dict[str, Path]) -> None:
    code, output = _gate("-b", str(runs["base"]), "-c", str(runs["better"]))
    assert code == 0, output
    assert "PASS" in output


def test_too_few_runs_exits_3_and_says_how_many(runs: dict[str, Path]) -> None:
    code, output = _gate("-b", str(runs["base"]), "-c", str(runs["few"]))
    assert code == 3, output
    assert "at least 5" in output


def test_json_is_deterministic_and_matches_the_exit_code(runs: dict[str, Path]) -> None:
    args = ["-b", str(runs["base"]), "-c", str(runs["worse"]), "--json"]
    code, output = _gate(*args)
    again_code, again = _gate(*args)
    assert code == again_code == 1 and output == again
    report = json.loads(output)
    assert report["format"] == "tailsight.gate/2"
    assert report["outcome"] == "regression" and report["exit_code"] == 1
    assert report["multiple_comparisons"] == {"method": "holm", "family_size": 2}
    assert report["baseline"]["runs"] == 10 and report["candidate"]["runs"] == 10
    by_name = {c["name"]: c for c in report["comparisons"]}
    assert set(by_name) == {"p50", "p99"}  # the default: in-system tick-to-trade P50 and P99
    assert by_name["p99"]["outcome"] == "regression"
    assert by_name["p99"]["ratio"] == pytest.approx(1.3, rel=0.03)  # the generator's effect
    assert by_name["p99"]["p_worse_adjusted"] < 0.05
    assert by_name["p50"]["outcome"] == "pass"  # the tail-only regression leaves the body


def test_files_can_be_listed_one_by_one_and_series_selected(runs: dict[str, Path]) -> None:
    files = sorted(runs["worse"].glob("*.json"))
    args = ["-b", str(runs["base"]), "--quantiles", "0.99,0.999", "--series", "probe=replay"]
    for file in files:
        args += ["-c", str(file)]
    code, output = _gate(*args, "--json")
    assert code == 1
    report = json.loads(output)
    assert report["candidate"]["files"] == [str(f) for f in files]
    assert [c["name"] for c in report["comparisons"]] == ["p99", "p99.9"]


def test_wrong_version_file_exits_2_with_a_clear_message(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    bad = tmp_path / "bad.json"
    text = (runs["base"] / "run00.json").read_text().replace("tailsight.hist/1", "tailsight.hist/2")
    bad.write_text(text)
    code, output = _gate("-b", str(runs["base"]), "-c", str(bad))
    assert code == 2
    assert "bad.json" in output and "tailsight.hist/2" in output


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--series", "probe=nothing"], "no series matches"),
        (["--series", "probe"], "not name=value"),
        (["--quantiles", "1.5"], "outside (0, 1)"),
    ],
)
def test_usage_errors_exit_2(runs: dict[str, Path], extra: list[str], message: str) -> None:
    code, output = _gate("-b", str(runs["base"]), "-c", str(runs["better"]), *extra)
    assert code == 2 and message in output


def test_missing_path_and_empty_directory_exit_2(runs: dict[str, Path], tmp_path: Path) -> None:
    code, output = _gate("-b", str(runs["base"]), "-c", str(tmp_path / "nope"))
    assert code == 2 and "no such file" in output
    (tmp_path / "empty").mkdir()
    code, output = _gate("-b", str(runs["base"]), "-c", str(tmp_path / "empty"))
    assert code == 2 and "no *.json" in output


# -- bad input is exit 2 with a message, never a traceback or a verdict ---------------------------


def _variant(runs: dict[str, Path], tmp_path: Path, name: str, edit: Callable[[str], str]) -> Path:
    text = (runs["base"] / "run00.json").read_text()
    path = tmp_path / name
    path.write_text(edit(text))
    return path


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda _: "[" * 200_000 + "]" * 200_000, "nested too deeply"),
        (lambda t: re.sub(r'"start_ns": \d+', '"start_ns": ' + "9" * 5000, t), "digits"),
    ],
    ids=["nested-arrays", "5000-digit-start"],
)
def test_hostile_run_files_exit_2(
    runs: dict[str, Path], tmp_path: Path, edit: Callable[[str], str], message: str
) -> None:
    bad = _variant(runs, tmp_path, "bad.json", edit)
    result = runner.invoke(app, ["gate", "-b", str(runs["base"]), "-c", str(bad)])
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "bad.json" in result.output and message in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    "option",
    [
        ["--min-effect", "nan"],
        ["--min-effect", "inf"],
        ["--min-effect", "-0.1"],
        ["--min-effect-us", "nan"],
        ["--min-effect-us", "inf"],
        ["--alpha", "nan"],
        ["--quantiles", "nan"],
    ],
)
def test_non_finite_parameters_exit_2(runs: dict[str, Path], option: list[str]) -> None:
    # Taken as values, inf would pass a 30 % slowdown (exit 0), nan make every verdict
    # inconclusive (exit 3).
    code, output = _gate("-b", str(runs["base"]), "-c", str(runs["worse"]), *option)
    assert code == 2 and "error:" in output, output


def test_series_on_one_side_only_exit_2(runs: dict[str, Path], tmp_path: Path) -> None:
    other = _variant(runs, tmp_path, "other.json", lambda t: t.replace(DEFAULT_STAGE, "book"))
    code, output = _gate("-b", str(runs["base"]), "-c", str(other))
    assert code == 2 and "only in the baseline" in output
    code, output = _gate("-b", str(runs["base"]), "-c", str(other), "--series", "stage=book")
    assert code == 2 and "only in the candidate" in output


def test_failed_replay_runs_are_named_in_a_note(runs: dict[str, Path], tmp_path: Path) -> None:
    cand = tmp_path / "cand"
    cand.mkdir()
    for file in sorted(runs["better"].glob("*.json")):
        (cand / file.name).write_text(file.read_text())
    (cand / "replay-afxdp-007.failed").write_text("trading run failed: ...\n")
    code, output = _gate("-b", str(runs["base"]), "-c", str(cand), "--json")
    assert code == 0
    (note,) = [n for n in json.loads(output)["notes"] if "failed" in n]
    assert note.startswith("candidate: 1 failed run(s) not gated") and "007.failed" in note
