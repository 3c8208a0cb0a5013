"""The recycled symbolizer helper: names against the dynamic linker's own addresses (dlsym in
the target process), one question to the helper per place in a file however many processes map
it, a new helper after every few pids with the old one gone, and nothing of bcc's per-pid state
(caches, fds) left in the calling process."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tailsight.probes.symbolizer import UNKNOWN_FRAME, Symbolizer

# Prints the addresses of two libc functions and one of the interpreter's own, as the target
# process's loader resolved them.
LIBC_FUNCTIONS = ("getpid", "qsort", "getppid", "atoi", "rand")  # no alias of another name
TARGET_CODE = f"""
import ctypes, sys
libc = ctypes.CDLL(None)
address = lambda f: ctypes.cast(f, ctypes.c_void_p).value
print(*[address(getattr(libc, name)) for name in {LIBC_FUNCTIONS}])
print(address(ctypes.pythonapi.Py_GetVersion))
sys.stdout.flush()
sys.stdin.readline()
"""
TARGETS = 5  # prime: with two pids per helper, three helpers


class Target:
    def __init__(self, executable: str = sys.executable) -> None:
        self.proc = subprocess.Popen(
            [executable, "-c", TARGET_CODE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        libc = [int(address) for address in self.proc.stdout.readline().split()]
        self.libc = dict(zip(LIBC_FUNCTIONS, libc, strict=True))
        self.addresses = libc[:2]  # getpid, qsort
        self.interpreter_address = int(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.kill()
        self.proc.communicate()  # reaps it and closes both pipes


@pytest.fixture
def targets() -> Iterator[list[Target]]:
    started = [Target() for _ in range(TARGETS)]
    yield started
    for target in started:
        target.close()


@pytest.fixture
def copied_targets(tmp_path: Path) -> Iterator[list[Target]]:
    """Targets each running its own copy of the interpreter: the same code in distinct files."""
    started = []
    for n in range(TARGETS):
        copy = tmp_path / f"python-{n}"
        shutil.copy2(os.path.realpath(sys.executable), copy)
        started.append(Target(str(copy)))
    yield started
    for target in started:
        target.close()


def plain(name: str) -> str:
    """glibc's aliases of one function (``__getpid``, ``__GI_qsort``): bcc picks any of them."""
    return name.lstrip("_").removeprefix("GI_").lstrip("_")


def names_ok(names: list[str]) -> bool:
    return [plain(name) for name in names] == ["getpid", "qsort"]


def open_fds() -> set[int]:
    return {int(fd) for fd in os.listdir("/proc/self/fd")}


def test_one_question_per_place_in_a_file_whatever_the_process(targets: list[Target]) -> None:
    symbolizer = Symbolizer(recycle_pids=2)
    try:
        for target in targets:
            assert names_ok(symbolizer.resolve(target.proc.pid, target.addresses))
        # Each process maps libc at its own address (ASLR), yet the helper was asked once.
        assert len({tuple(target.addresses) for target in targets}) == TARGETS
        assert symbolizer.asked == 2 and symbolizer.helpers_started == 1
        cpu_s = symbolizer.helper_cpu_s()
        assert cpu_s > 0  # it imported bcc and read libc's symbols
    finally:
        symbolizer.close()
    assert symbolizer.helper_cpu_s() >= cpu_s  # a retired helper's CPU still counts


def test_a_file_is_asked_of_one_live_process_that_maps_it(targets: list[Target]) -> None:
    """Each process asks for another libc function: the helper is asked of the first one's
    pid (one pid: never replaced), then of a live one when that one has exited."""
    symbolizer = Symbolizer(recycle_pids=1)  # a second pid asked of would replace the helper
    try:
        for target, function in zip(targets[:-1], LIBC_FUNCTIONS, strict=False):
            names = symbolizer.resolve(target.proc.pid, [target.libc[function]])
            assert [plain(name) for name in names] == [function]
        assert symbolizer.asked == TARGETS - 1 and symbolizer.helpers_started == 1
        targets[0].close()  # the process the helper was asked of
        last, function = targets[-1], LIBC_FUNCTIONS[-1]
        names = symbolizer.resolve(last.proc.pid, [last.libc[function]])
        assert [plain(name) for name in names] == [function]
        assert symbolizer.asked == TARGETS and symbolizer.helpers_started == 2
    finally:
        symbolizer.close()


def test_names_match_the_loader_and_helpers_are_recycled(copied_targets: list[Target]) -> None:
    import bcc

    caches_before = dict(bcc.BPF._sym_caches)
    symbolizer = Symbolizer(recycle_pids=2)
    helpers: list[int] = []
    fds_before = open_fds()
    try:
        for target in copied_targets:
            # libc is one file (asked for once); each interpreter copy is a file of its own.
            addresses = [*target.addresses, target.interpreter_address]
            names = symbolizer.resolve(target.proc.pid, addresses)
            assert names_ok(names[:2]) and names[2] == "Py_GetVersion", names
            assert symbolizer.resolve(target.proc.pid, addresses) == names  # same helper
            assert symbolizer.helper_pid is not None
            if symbolizer.helper_pid not in helpers:
                helpers.append(symbolizer.helper_pid)
        assert symbolizer.asked == 2 + TARGETS
        assert symbolizer.helpers_started == len(helpers) == 3, (helpers, symbolizer.failures)
        for retired in helpers[:-1]:
            assert not Path(f"/proc/{retired}").exists()  # killed and reaped
        assert len(open_fds()) == len(fds_before) + 2  # only the live helper's two pipes
        assert symbolizer.failures == 0
    finally:
        symbolizer.close()
    assert not Path(f"/proc/{helpers[-1]}").exists()
    assert bcc.BPF._sym_caches == caches_before  # no per-pid cache in this process
    assert open_fds() == fds_before


def test_a_killed_helper_is_replaced_and_a_gone_pid_reads_unknown(targets: list[Target]) -> None:
    symbolizer = Symbolizer()
    try:
        first = targets[0]
        assert names_ok(symbolizer.resolve(first.proc.pid, first.addresses))
        assert symbolizer.helper_pid is not None
        os.kill(symbolizer.helper_pid, 9)
        interpreter = [first.interpreter_address]  # not asked for yet
        assert symbolizer.resolve(first.proc.pid, interpreter) == ["Py_GetVersion"]
        assert symbolizer.helpers_started == 2 and symbolizer.failures <= 1
        gone = targets[1]
        gone.close()
        assert symbolizer.resolve(gone.proc.pid, gone.addresses) == [UNKNOWN_FRAME] * 2
        assert symbolizer.resolve(first.proc.pid, []) == []
    finally:
        symbolizer.close()


def test_a_stuck_helper_costs_one_timeout_then_frames_read_unknown_for_a_while(
    targets: list[Target],
) -> None:
    symbolizer = Symbolizer(answer_timeout_s=0.5, rest_s=2.0)
    try:
        first = targets[0]
        assert names_ok(symbolizer.resolve(first.proc.pid, first.addresses))
        assert symbolizer.helper_pid is not None
        stuck = symbolizer.helper_pid
        os.kill(stuck, signal.SIGSTOP)  # alive, never answers
        interpreter = [first.interpreter_address]  # not asked for yet
        started = time.monotonic()
        answer: list[list[str]] = []
        waiting = threading.Thread(
            target=lambda: answer.append(symbolizer.resolve(first.proc.pid, interpreter))
        )
        waiting.start()
        time.sleep(0.1)
        cpu_s = symbolizer.helper_cpu_s()  # a scrape does not wait behind the stuck answer
        assert time.monotonic() - started < 0.4 and waiting.is_alive()
        waiting.join()
        assert answer == [[UNKNOWN_FRAME]]
        assert 0.5 <= time.monotonic() - started < 1.5  # one timeout, no second try
        assert symbolizer.helper_cpu_s() >= cpu_s  # the killed helper's CPU still counts
        assert not Path(f"/proc/{stuck}").exists()  # killed and reaped
        started = time.monotonic()
        for target in targets:  # resting: no helper, no wait; names known already still are
            addresses = [*target.addresses, target.interpreter_address]
            names = symbolizer.resolve(target.proc.pid, addresses)
            assert names_ok(names[:2]) and names[2] == UNKNOWN_FRAME, names
        assert time.monotonic() - started < 0.2 and symbolizer.helper_pid is None
        time.sleep(2.0)
        assert symbolizer.resolve(first.proc.pid, interpreter) == ["Py_GetVersion"]
        assert symbolizer.helpers_started == 2 and symbolizer.failures == 1
    finally:
        symbolizer.close()
