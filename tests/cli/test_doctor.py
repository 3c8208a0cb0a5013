"""`tailsight doctor` through typer's CliRunner: all green here, failures with fixes and exit 1 on
a fake unprivileged tree, tables within 80 columns."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tailsight.cli import main
from tailsight.probes.catalog import PROBE_TRACEPOINTS
from tailsight.probes.features import FIX_BPFTOOL, FIX_ROOT
from tailsight.probes.runqueue import RunQueueProbe

FAKE_ROOT = Path(__file__).parents[1] / "fixtures" / "doctor" / "unprivileged"


def _fake_args(tmp_path: Path) -> list[str]:
    return [
        "doctor",
        "--proc",
        str(FAKE_ROOT / "proc"),
        "--sys",
        str(tmp_path),
        "--modules",
        str(tmp_path),
        "--search-path",
        str(tmp_path),
    ]


def test_fake_unprivileged_tree_fails_with_fixes_json(tmp_path: Path) -> None:
    result = CliRunner().invoke(main.app, [*_fake_args(tmp_path), "--json"])
    assert result.exit_code == 1, result.output
    checks = {check["name"]: check for check in json.loads(result.output)}
    assert set(next(iter(checks.values()))) == {"name", "ok", "detail", "fix", "required"}
    assert checks["privileges"] == {
        "name": "privileges",
        "ok": False,
        "detail": "missing CAP_SYS_ADMIN, CAP_PERFMON, CAP_BPF",
        "fix": FIX_ROOT,
        "required": True,
    }
    assert checks["bpftool"]["fix"] == FIX_BPFTOOL
    for check in checks.values():
        assert check["ok"] or check["fix"], check


def test_fake_unprivileged_tree_table_fits_80_columns(tmp_path: Path) -> None:
    # A wide terminal must not widen the table past 80 columns.
    result = CliRunner().invoke(main.app, _fake_args(tmp_path), env={"COLUMNS": "200"})
    assert result.exit_code == 1
    lines = result.output.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert f"fix privileges: {FIX_ROOT}" in lines
    assert f"fix bpftool: {FIX_BPFTOOL}" in lines
    assert len([line for line in lines if line.startswith("fix ")]) == len(
        {line for line in lines if line.startswith("fix ")}
    )
    assert "required check(s) failed" in lines[-1]


@pytest.mark.kernel
def test_doctor_json_all_ok_here(kernel_ready: None) -> None:
    result = CliRunner().invoke(main.app, ["doctor", "--json"])
    assert result.exit_code == 0, result.output
    checks = json.loads(result.output)
    assert [check for check in checks if not check["ok"]] == []
    names = {check["name"] for check in checks}
    for tracepoints in PROBE_TRACEPOINTS.values():
        assert {f"tp {tp}" for tp in tracepoints} <= names
    assert {"privileges", "kernel BTF", "bpftool", "bcc", "BTF offsets", "cgroup v2"} <= names
    # This kernel takes tp_btf: doctor says the probes use it (TAILSIGHT_ATTACH_MODE unset).
    mode = next(check for check in checks if check["name"] == "attach mode")
    assert mode["detail"].startswith("tp_btf"), mode


@pytest.mark.kernel
def test_doctor_says_raw_tp_when_forced_and_the_probes_use_it(
    kernel_ready: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TAILSIGHT_ATTACH_MODE", "raw_tp")
    result = CliRunner().invoke(main.app, ["doctor", "--json"])
    assert result.exit_code == 0, result.output
    mode = next(check for check in json.loads(result.output) if check["name"] == "attach mode")
    assert mode["ok"] and mode["detail"].startswith("raw_tp"), mode
    with RunQueueProbe() as probe:
        assert probe.attach_mode == "raw_tp"
    monkeypatch.delenv("TAILSIGHT_ATTACH_MODE")
    with RunQueueProbe() as probe:
        assert probe.attach_mode == "tp_btf"


@pytest.mark.kernel
def test_doctor_table_here(kernel_ready: None) -> None:
    result = CliRunner().invoke(main.app, ["doctor"])
    assert result.exit_code == 0, result.output
    assert max(len(line) for line in result.output.splitlines()) <= 80
    assert result.output.rstrip().endswith("all required checks passed")


def test_noise_option_adds_one_check_per_cpu(tmp_path: Path) -> None:
    result = CliRunner().invoke(main.app, [*_fake_args(tmp_path), "--json", "--noise", "0.05"])
    assert result.exit_code == 1, result.output  # the fake tree's own failures, as above
    noise = [c for c in json.loads(result.output) if c["name"].startswith("noise ")]
    assert [c["name"] for c in noise] == [
        f"noise cpu{cpu}" for cpu in sorted(os.sched_getaffinity(0))
    ]
    assert all(not c["required"] and " of 0.05 s lost: " in c["detail"] for c in noise)
