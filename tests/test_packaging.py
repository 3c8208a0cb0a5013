"""The folders-as-subpackages layout must survive both a wheel install and an editable install."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SUBPACKAGES = ("probes", "collector", "analysis", "dashboards", "trading_core")
IMPORT_ALL = "; ".join(
    ["import tailsight.cli.main", *(f"import tailsight.{p}" for p in SUBPACKAGES)]
)


def run_python(code: str, cwd: Path, pythonpath: str | None = None) -> str:
    env = {"PATH": "/usr/bin:/bin"} | ({"PYTHONPATH": pythonpath} if pythonpath else {})
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, check=True
    )
    return result.stdout.strip()


@pytest.mark.slow
def test_wheel_install_imports_every_subpackage_with_probe_sources(tmp_path: Path) -> None:
    wheel_dir, target = tmp_path / "wheel", tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "-q"]
    build = [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheel_dir), str(REPO)]
    subprocess.run(build, check=True, capture_output=True)
    (wheel,) = wheel_dir.glob("tailsight-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "tailsight/probes/runqueue.bpf.c" in names
    assert "tailsight/probes/include/hist.bpf.h" in names
    install = [*pip, "install", "--no-deps", "--target", str(target), str(wheel)]
    subprocess.run(install, check=True, capture_output=True)
    where = run_python(f"{IMPORT_ALL}; print(tailsight.probes.__file__)", tmp_path, str(target))
    assert Path(where).is_relative_to(target)


def test_editable_install_maps_folders_to_subpackages(tmp_path: Path) -> None:
    code = IMPORT_ALL + "; " + "; ".join(f"print(tailsight.{p}.__file__)" for p in SUBPACKAGES)
    files = run_python(code, tmp_path).splitlines()
    assert [Path(f).parent for f in files] == [REPO / p for p in SUBPACKAGES]
