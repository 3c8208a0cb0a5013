"""The folders-as-subpackages layout must survive both a wheel install and an editable install."""

from __future__ import annotations

import re
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


def kernel_sources() -> set[str]:
    """Every ``.bpf.c``/``.bpf.h`` the installed code may open, as wheel paths: the kernel
    sources in the packaged folders (probes load theirs by name, the feed its XDP program),
    and every file they ``#include``, which must then exist among them."""
    found: dict[str, Path] = {}
    for package in ("tailsight", *SUBPACKAGES):
        for source in sorted((REPO / package).rglob("*.bpf.[ch]")):
            installed = "tailsight" if package == "tailsight" else f"tailsight/{package}"
            found[f"{installed}/{source.relative_to(REPO / package).as_posix()}"] = source
    names = set(found)
    for wheel_path, source in found.items():
        for included in re.findall(r'^#include\s+"([^"]+)"', source.read_text(), re.MULTILINE):
            here = wheel_path.rsplit("/", 1)[0]
            candidates = {f"{here}/{included}", f"{here}/include/{included}"}
            assert candidates & names, f"{source} includes {included}, which is not in the tree"
    return names


def test_kernel_sources_are_found() -> None:
    # The discovery above must see the sources the code names (a wrong root finds nothing).
    sources = kernel_sources()
    assert "tailsight/trading_core/xsk_redirect.bpf.c" in sources
    assert "tailsight/probes/runqueue.bpf.c" in sources
    assert "tailsight/probes/include/hist.bpf.h" in sources


@pytest.mark.slow
def test_wheel_install_imports_every_subpackage_with_kernel_sources(tmp_path: Path) -> None:
    wheel_dir, target = tmp_path / "wheel", tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "-q"]
    build = [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheel_dir), str(REPO)]
    subprocess.run(build, check=True, capture_output=True)
    (wheel,) = wheel_dir.glob("tailsight-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert sorted(kernel_sources() - names) == []
    install = [*pip, "install", "--no-deps", "--target", str(target), str(wheel)]
    subprocess.run(install, check=True, capture_output=True)
    where = run_python(f"{IMPORT_ALL}; print(tailsight.probes.__file__)", tmp_path, str(target))
    assert Path(where).is_relative_to(target)
    # The path the AF_XDP feed opens, as the installed package computes it.
    code = "from tailsight.trading_core.feed import XSK_PROGRAM as p; print(p.is_file(), p)"
    is_file, path = run_python(code, tmp_path, str(target)).split(" ", 1)
    assert is_file == "True" and Path(path).is_relative_to(target)


def test_editable_install_maps_folders_to_subpackages(tmp_path: Path) -> None:
    code = IMPORT_ALL + "; " + "; ".join(f"print(tailsight.{p}.__file__)" for p in SUBPACKAGES)
    files = run_python(code, tmp_path).splitlines()
    assert [Path(f).parent for f in files] == [REPO / p for p in SUBPACKAGES]
