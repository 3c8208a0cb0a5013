"""``tailsight trading up/down``: foreground and detached runs leave nothing behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tailsight.cgroups import find_cgroup2_mount
from tailsight.cli.main import app

pytestmark = pytest.mark.kernel


def _require_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("kernel: network namespaces need root (CAP_NET_ADMIN, CAP_SYS_ADMIN)")


def _namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


def test_help_lists_the_commands() -> None:
    result = CliRunner().invoke(app, ["trading", "--help"])
    assert result.exit_code == 0
    assert "up" in result.output and "down" in result.output and "cleanup" in result.output


def test_up_runs_then_tears_down(tmp_path: Path) -> None:
    _require_root()
    tag = "cliup"
    base = f"tailsight-test/{os.getpid()}-cli"
    args = [
        "trading",
        "up",
        "--duration",
        "1.5",
        "--messages",
        "5000",
        "--symbols",
        "2",
        "--json",
        "--tag",
        tag,
        "--cgroup-base",
        base,
        "--state",
        str(tmp_path / "s.json"),
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output.strip().splitlines()[-1])
    assert sorted(summary["components"]) == ["exchange", "feed", "gateway", "strategy"]
    assert all(summary["alive_at_stop"].values())
    assert summary["exchange_stats"]["market_messages"] == 5000
    assert summary["exchange_ns"] not in _namespaces()
    assert not (find_cgroup2_mount() / base).exists()
    assert not (tmp_path / "s.json").exists()


def test_detached_up_is_stopped_by_down(tmp_path: Path) -> None:
    _require_root()
    state = tmp_path / "state.json"
    base = f"tailsight-test/{os.getpid()}-detached"
    runner = CliRunner()
    result = runner.invoke(
        app,
        [
            "trading",
            "up",
            "--detach",
            "--messages",
            "5000",
            "--json",
            "--tag",
            "clidet",
            "--cgroup-base",
            base,
            "--state",
            str(state),
        ],
    )
    assert result.exit_code == 0, result.output
    info = json.loads(state.read_text())
    assert info["exchange_ns"] in _namespaces()
    again = runner.invoke(app, ["trading", "up", "--state", str(state)])
    assert again.exit_code == 1  # one at a time
    result = runner.invoke(app, ["trading", "down", "--json", "--state", str(state)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["stopped_pid"] == info["pid"]
    with pytest.raises(ProcessLookupError):
        os.kill(info["pid"], 0)
    for component in info["components"].values():
        with pytest.raises(ProcessLookupError):
            os.kill(component["pid"], 0)
    assert info["exchange_ns"] not in _namespaces() and info["trading_ns"] not in _namespaces()
    assert not (find_cgroup2_mount() / base).exists()
    assert not state.exists()


def test_up_as_unprivileged_user_says_needs_root(tmp_path: Path) -> None:
    """As `nobody`, `trading up` says it needs root, not a traceback from `ip netns`."""
    _require_root()  # to switch to nobody
    tailsight = Path(sys.executable).with_name("tailsight")
    drop = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--inh-caps=-all"]
    run = subprocess.run(
        [*drop, str(tailsight), "trading", "up", "--duration", "1", "--state", "/tmp/none.json"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert run.returncode == 2, run.stderr
    assert "needs root" in run.stderr and "CAP_SYS_ADMIN" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr and "RuntimeError" not in run.stderr
