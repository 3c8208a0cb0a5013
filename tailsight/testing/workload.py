"""A built-in CPU contention workload, each group of processes in its own cgroup v2.

Used by the demo and the kernel tests: busy loops pinned to one CPU so that they displace each
other on its run queue.  Context manager; always kills its processes and removes its cgroups.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Final

from tailsight.cgroups import directory_id, find_cgroup2_mount

BASE_CGROUP: Final = "tailsight-test"

# Children die with this process even if it is SIGKILLed (prctl PR_SET_PDEATHSIG = 1, SIGKILL = 9);
# the getppid check closes the race with a parent that died before the prctl.
_DIE_WITH_PARENT: Final = (
    "import ctypes, os, sys\n"
    "ctypes.CDLL(None).prctl(1, 9)\n"
    "if os.getppid() != int(sys.argv[1]): os._exit(1)\n"
)
SPIN_CODE: Final = _DIE_WITH_PARENT + "while True: pass\n"


@dataclass(frozen=True)
class Task:
    """One process: ``argv`` run in cgroup ``group``, pinned to ``cpu`` if given."""

    group: str
    argv: tuple[str, ...] = ()
    cpu: int | None = None
    pipes: bool = False  # stdin/stdout pipes, for processes driven by the caller

    def command(self) -> list[str]:
        if self.argv:
            return list(self.argv)
        return [sys.executable, "-S", "-c", SPIN_CODE, str(os.getpid())]


def python_task(group: str, code: str, cpu: int | None = None, pipes: bool = False) -> Task:
    """A Python snippet as a task that dies with its parent."""
    argv = (sys.executable, "-S", "-c", _DIE_WITH_PARENT + code, str(os.getpid()))
    return Task(group, argv, cpu, pipes)


def socket_task_code(spin_s: float = 0.0003, sleep_s: float = 0.01, connect_every: int = 20) -> str:
    """A task for every probe at once: each round spins ``spin_s``, sleeps ``sleep_s`` and makes
    a UDP sendto/recvfrom to itself (netsyscall); every ``connect_every`` rounds a TCP connect +
    accept + close on loopback (tcpstate). Many of them waking on a host's CPUs wait on each
    other's run queues and migrate (runqueue, displacement pairs, migration). The defaults: 30
    such tasks take ~1 CPU."""
    return f"""
import socket, time
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
udp.bind(("127.0.0.1", 0))
me = udp.getsockname()
listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen(8)
there = listener.getsockname()
n = 0
while True:
    end = time.perf_counter() + {spin_s!r}
    while time.perf_counter() < end:
        pass
    time.sleep({sleep_s!r})
    udp.sendto(b"x", me)
    udp.recvfrom(16)
    n += 1
    if n % {connect_every!r} == 0:
        client = socket.create_connection(there)
        server, _ = listener.accept()
        client.close()
        server.close()
"""


def stop_process(proc: subprocess.Popen[Any], timeout_s: float) -> None:
    """SIGTERM, then SIGKILL if it has not exited within ``timeout_s``; reaped either way."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def private_base(tag: str) -> str:
    """A base cgroup of our own under tailsight-test (tests run concurrently with each other)."""
    return f"{BASE_CGROUP}/{os.getpid()}-{tag}"


def default_cpu() -> int:
    """The highest CPU this process may run on (the demo and tests pin their contention there)."""
    return max(os.sched_getaffinity(0))


class Workload:
    """Processes in cgroups ``<cgroup2 mount>/<base>/<group>``, started on enter, killed on exit.

    ``base`` may be nested ("tailsight-test/1234-rq": concurrent runs use their own)."""

    def __init__(
        self, tasks: Sequence[Task], base: str = BASE_CGROUP, mount: Path | None = None
    ) -> None:
        self.tasks = list(tasks)
        self.base = base.strip("/")
        self._mount = mount
        self.processes: list[tuple[Task, subprocess.Popen[bytes]]] = []
        self._created: list[Path] = []

    @property
    def mount(self) -> Path:
        if self._mount is None:
            self._mount = find_cgroup2_mount()
        return self._mount

    @property
    def groups(self) -> list[str]:
        return list(dict.fromkeys(t.group for t in self.tasks))

    def cgroup_path(self, group: str) -> str:
        """Path relative to the cgroup2 root, e.g. "/tailsight-test/victim"."""
        return f"/{self.base}/{group}"

    def cgroup_dir(self, group: str) -> Path:
        return self.mount / self.base / group

    def cgroup_id(self, group: str) -> int:
        """The cgroup's v2 id (its directory's inode), as the probes report it."""
        return directory_id(self.cgroup_dir(group))

    def pids(self, group: str | None = None) -> list[int]:
        return [p.pid for t, p in self.processes if group is None or t.group == group]

    def process(self, group: str, n: int = 0) -> subprocess.Popen[bytes]:
        return [p for t, p in self.processes if t.group == group][n]

    def start(self) -> None:
        """Create the cgroups, start every task in its cgroup, pinned if asked."""
        try:
            levels = [
                self.mount.joinpath(*self.base.split("/")[: n + 1])
                for n in range(len(self.base.split("/")))
            ]
            for directory in (*levels, *map(self.cgroup_dir, self.groups)):
                try:
                    directory.mkdir()
                except FileExistsError:
                    continue  # a level shared with another workload, or left from a crash
                self._created.append(directory)
            for task in self.tasks:
                pipe = subprocess.PIPE if task.pipes else subprocess.DEVNULL
                argv = _in_cgroup(self.cgroup_dir(task.group), task.cpu, task.command())
                proc = subprocess.Popen(argv, stdin=pipe, stdout=pipe)
                self.processes.append((task, proc))
            for task, proc in self.processes:
                _wait_placed(proc, self.cgroup_dir(task.group), task.cpu)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Kill and reap every process, remove the cgroups it created; idempotent."""
        while self.processes:
            _, proc = self.processes.pop()
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGKILL)
            proc.wait()
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    stream.close()
        while self._created:
            directory = self._created.pop()
            if directory.parent == self.mount.joinpath(*self.base.split("/")):
                rmdir_retrying(directory)
            else:
                with contextlib.suppress(OSError):  # a base shared with a concurrent workload
                    directory.rmdir()

    def __enter__(self) -> Workload:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def contention(
    cpu: int | None = None, victims: int = 2, neighbours: int = 1, base: str = BASE_CGROUP
) -> Workload:
    """The demo's scene: a "victim" cgroup and a "noisy" neighbour spinning on the same CPU."""
    cpu = default_cpu() if cpu is None else cpu
    tasks = [Task("victim", cpu=cpu) for _ in range(victims)]
    tasks += [Task("noisy", cpu=cpu) for _ in range(neighbours)]
    return Workload(tasks, base=base)


def _in_cgroup(directory: Path, cpu: int | None, argv: list[str]) -> list[str]:
    """``argv`` run already inside cgroup ``directory`` and pinned to ``cpu``.

    The process joins before it execs: moved after start, a task under CPU pressure can make
    its first syscalls in the parent's cgroup.  A shell rather than ``preexec_fn``, which
    is unsafe in a process with threads."""
    pin = ["taskset", "--cpu-list", str(cpu)] if cpu is not None else []
    join = 'echo $$ > "$0" && exec "$@"'
    return ["sh", "-c", join, str(directory / "cgroup.procs"), *pin, *argv]


def _wait_placed(
    proc: subprocess.Popen[bytes], directory: Path, cpu: int | None, timeout_s: float = 10.0
) -> None:
    """Return once ``proc`` is in its cgroup and pinned, so callers see the placement."""
    deadline = time.monotonic() + timeout_s
    while True:
        joined = str(proc.pid) in (directory / "cgroup.procs").read_text().split()
        if joined and (cpu is None or os.sched_getaffinity(proc.pid) == {cpu}):
            return
        if proc.poll() is not None:
            raise RuntimeError(f"task {proc.args!r} exited ({proc.returncode}) before it started")
        if time.monotonic() > deadline:
            raise TimeoutError(f"task {proc.pid} not in {directory} on CPU {cpu} in {timeout_s} s")
        time.sleep(0.001)


def rmdir_retrying(directory: Path, timeout_s: float = 2.0) -> None:
    """Remove a cgroup directory (gone already: fine). A killed task leaves its cgroup
    asynchronously after reaping: rmdir says EBUSY briefly."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            directory.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as error:
            if error.errno != errno.EBUSY or time.monotonic() > deadline:
                raise
            time.sleep(0.01)
