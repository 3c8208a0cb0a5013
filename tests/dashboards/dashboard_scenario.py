"""A workload that exercises every probe at once, each part in its own cgroup under ``base``:

- ``victim``: UDP round trips (sendto/recvfrom), EAGAIN reads and TCP connects to its own
  loopback listener, sleeping 1 ms between rounds, pinned to the CPU where ``noisy`` spins
  (run-queue waits and displacement by ``noisy``; netsyscall; tcpstate; its CPU stall time,
  pressure), and a thread of it hopping between all CPUs (migration);
- ``noisy``: a busy loop on that CPU;
- ``limited``: a busy loop on the lowest CPU under a CPU limit of ``CPU_MAX`` (1 ms per
  100 ms): throttled in every period, for nearly all of it (throttle). The victim's hopping
  thread lands on that CPU too: at 20 ms per 100 ms the loop's bursts held it up to 20 ms, up
  to 0.17 s per s of displaced wait, above the pinned spinner's; at 1 ms, about 0.001.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from tailsight.probes.cgroupfiles import find_v1_mount
from tailsight.testing.workload import Task, Workload, default_cpu, python_task, rmdir_retrying

CPU_MAX: Final = "1000 100000"  # quota and period in µs, as cgroup v2's cpu.max writes them

VICTIM_CODE = """
import os, socket, threading, time
listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen(64)
def serve():
    while True:
        conn, _ = listener.accept()
        conn.close()
threading.Thread(target=serve, daemon=True).start()
def move():  # this thread hops between all CPUs: the victim's migrations
    cpus = sorted(os.sched_getaffinity(os.getppid()))
    i = 0
    while True:
        os.sched_setaffinity(0, {cpus[i % len(cpus)]})
        i += 1
        time.sleep(0.005)
threading.Thread(target=move, daemon=True).start()
rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
rx.bind(("127.0.0.1", 0))
tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
n = 0
while True:
    tx.sendto(b"x", rx.getsockname())
    rx.recvfrom(16)
    n += 1
    if n % 10 == 0:
        try:
            rx.recvfrom(16, socket.MSG_DONTWAIT)  # empty: EAGAIN, the errors series
        except BlockingIOError:
            pass
        sock = socket.create_connection(listener.getsockname())
        sock.close()
    time.sleep(0.001)
"""


@contextlib.contextmanager
def every_probe(base: str) -> Iterator[Workload]:
    """The workload above, running; on exit its processes are killed and every cgroup it made
    (v2, and the v1 cpu groups of a hybrid host) removed."""
    cpu = default_cpu()
    workload = Workload(
        [
            python_task("victim", VICTIM_CODE, cpu=cpu),
            Task("noisy", cpu=cpu),
            Task("limited", cpu=min(os.sched_getaffinity(0))),
        ],
        base=base,
    )
    v1_created: list[Path] = []
    try:
        with workload:
            limit_cpu(workload, "limited", CPU_MAX, v1_created)
            yield workload
    finally:  # the tasks are gone: their v1 groups can go
        for directory in reversed(v1_created):
            _rmdir(directory, shared=directory != v1_created[-1])


def limit_cpu(workload: Workload, group: str, cpu_max: str, v1_created: list[Path]) -> None:
    """Put ``group`` under the CPU limit ``cpu_max``. Where the cpu controller is on cgroup v2
    (the root delegates it): enabled on the levels below the root down to the group, all of them
    tests' own, and the group's ``cpu.max`` written. On a hybrid host (cpu on v1): a v1 cpu group
    of the same path, made here (each level made is added to ``v1_created``), with the quota and
    the group's tasks."""
    parts = workload.cgroup_path(group).strip("/").split("/")
    if "cpu" in _words(workload.mount / "cgroup.subtree_control"):
        levels = [workload.mount.joinpath(*parts[:n]) for n in range(1, len(parts) + 1)]
        for level in levels[:-1]:
            if "cpu" not in _words(level / "cgroup.subtree_control"):
                (level / "cgroup.subtree_control").write_text("+cpu")
        (levels[-1] / "cpu.max").write_text(cpu_max)
        return
    v1_mount = find_v1_mount("cpu")
    if v1_mount is None:
        raise RuntimeError("no cpu controller, on cgroup v2 or v1: cannot limit a group's CPU")
    directory = v1_mount
    for part in parts:
        directory /= part
        try:
            directory.mkdir()
        except FileExistsError:
            continue  # a level shared with a concurrent test, or left from a crash
        v1_created.append(directory)
    quota_us, period_us = cpu_max.split()
    (directory / "cpu.cfs_period_us").write_text(period_us)
    (directory / "cpu.cfs_quota_us").write_text(quota_us)
    for pid in workload.pids(group):
        (directory / "cgroup.procs").write_text(str(pid))  # v1: moves every thread


def _words(path: Path) -> list[str]:
    return path.read_text().split()


def _rmdir(directory: Path, shared: bool) -> None:
    """Remove a group of ours (a killed task leaves it asynchronously). A level above the leaf
    may hold a concurrent test's groups: left to it."""
    if not shared:
        rmdir_retrying(directory)
        return
    try:
        directory.rmdir()
    except FileNotFoundError:
        pass
    except OSError as error:
        if error.errno not in (errno.EBUSY, errno.ENOTEMPTY):
            raise
