"""Kernel tests skip with the missing feature's name, except under TAILSIGHT_REQUIRE_KERNEL=1
(CI), where a skipped kernel test is reported as a failure."""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator

import pytest

REQUIRE_KERNEL = os.environ.get("TAILSIGHT_REQUIRE_KERNEL") == "1"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    if REQUIRE_KERNEL and report.skipped and item.get_closest_marker("kernel") is not None:
        report.outcome = "failed"
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.longrepr = f"kernel test skipped under TAILSIGHT_REQUIRE_KERNEL=1: {reason}"


@pytest.fixture(autouse=True)
def automatic_gc_back_on() -> Iterator[None]:
    """A running Agent turns automatic collection off until its close(); tests that leave an
    agent unclosed must not leave it off for the rest of the session."""
    yield
    gc.enable()


@pytest.fixture(scope="session")
def kernel_ready() -> None:
    """Skip (or, in CI, fail) unless running as root with bcc importable."""
    if os.geteuid() != 0:
        pytest.skip("kernel: needs root (CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN)")
    try:
        import bcc  # noqa: F401
    except ImportError as error:
        pytest.skip(f"kernel: bcc not importable ({error})")
