"""Fault injections with known ground truth, for the root-cause accuracy suite.

Each injection records a real workload in real cgroups with ``tailsight record`` (all probes),
starts a fault at a known time and reports what the right answer is: the victim cgroup, the
cause kind(s) that count as right and the cgroup the cause lives in. :func:`score` then reads an
``explain`` report the way a reader would: the first incident that holds a jump of the victim is
the answer; top-1 / top-3 compare its ranked causes with the truth.

Kinds (:data:`KINDS`): a CPU hog on the victim's CPU (sibling cgroup), packet loss on the victim's
TCP connection (nftables ``numgen`` drop of the server's replies), forced CPU migrations of the
victim (affinity flipping), a neighbour hammering syscalls on the victim's socket path (a unix
datagram server both talk to), a second process in the victim's own cgroup stealing its CPU, the
victim's own CPU quota cut to 20 % (CFS bandwidth throttling), and its memory limit cut under
its page-cache working set (reclaim, refaults from disk, memory PSI), and a feed whose sender turns
to micro-bursts beyond the receiver's socket buffer (UDP receive-buffer drops, the socket's own
``drops`` column in ``/proc/net/udp`` as ground truth). The cpu and memory faults set limits
with :class:`ResourceLimit`: on hybrid hosts in a cgroup v1 group at the victim's v2 path, on
pure v2 hosts in the v2 group itself; the kernel's own counters of the limit (``cpu.stat``,
``memory.failcnt``, ``memory.pressure``) are read around the fault as its ground truth
(:attr:`Injection.kernel_counters`). Needs root, bcc and nftables; used by
``tests/analysis/test_rca_kernel.py`` and ``benchmarks/bench_rca_accuracy.py``.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Final

from tailsight.analysis.causes import Cause
from tailsight.analysis.explain.model import Report
from tailsight.cgroups import DEFAULT_MOUNTS_PATH, find_cgroup2_mount, is_within
from tailsight.collector.store.reader import Recording
from tailsight.intervals import HistDocument
from tailsight.probes.cgroupfiles import find_v1_mount
from tailsight.probes.runqueue import read_cpu_times_ns, read_steal_ns
from tailsight.testing.workload import (
    Task,
    Workload,
    private_base,
    python_task,
    rmdir_retrying,
    stop_process,
)

KINDS: Final = (
    "cpu_hog",
    "packet_loss",
    "migrations",
    "neighbour_syscalls",
    "own_cgroup",
    "cpu_throttle",
    "memory_pressure",
    "udp_drops",
)
QUIET: Final = "quiet"
"""No injection: the victim alone; a right report holds no incident of the victim."""
STEAL_DISTURBED: Final = 0.01
"""Steal of one CPU, as a share of a quiet recording's time, above which it was not quiet (quiet
runs measured on this 2-core host: about 0.2 %; a hypervisor taking a vCPU: 26-40 % for
seconds)."""
CPU: Final = 0
INTERVAL_S: Final = 0.5
FLIP_S: Final = 0.008
"""How long the migrations fault leaves the victim on each CPU (the ceiling of its waits)."""
SETTLE_S: Final = 1.0
"""Where the workload starts inside the recording: the start-up left out of what is explained."""
HIGH_PRIORITY: Final = "import os\nos.setpriority(os.PRIO_PROCESS, 0, -19)\n"
# Sleeps 1 ms, spins 2 ms: waits on the run queue whenever someone else holds its CPU.
VICTIM_LOOP: Final = (
    "import time\n"
    "while True:\n"
    "    time.sleep(0.001)\n"
    "    end = time.perf_counter() + 0.002\n"
    "    while time.perf_counter() < end: pass\n"
)
VICTIM_CODE: Final = HIGH_PRIORITY + VICTIM_LOOP
HOG_CODE: Final = HIGH_PRIORITY + "while True: pass\n"
THROTTLE_QUOTA_US: Final = 20_000
THROTTLE_PERIOD_US: Final = 100_000
"""cpu_throttle's limit: 20 ms of CPU per 100 ms period, under the victim's ~50 %."""
WORKING_SET_MIB: Final = 144
"""memory_pressure: the file the victim keeps re-reading (its page-cache working set)."""
MEMORY_LIMIT_MIB: Final = 128
"""memory_pressure's limit, for the file's pages and the victim's ~14 MiB of its own: the file
no longer fits, and what is evicted between two reads of a page (~30 MiB) is less than the
active list (about half the limit), so the kernel takes the refaults for thrashing of a working
set and counts their waits as memory stall (PSI). With a 256 MiB file the refaults came too
late to count: PSI io (the disk reads) rose 2-7x more than PSI memory."""
READY_TIMEOUT_S: Final = 60.0
# cpu_throttle's victim: sleeps 1 ms, spins 1 ms, so it wants half a CPU.
THROTTLED_VICTIM_CODE: Final = HIGH_PRIORITY + (
    "import time\n"
    "while True:\n"
    "    time.sleep(0.001)\n"
    "    end = time.perf_counter() + 0.001\n"
    "    while time.perf_counter() < end: pass\n"
)
# memory_pressure's victim: once the file argv[3] exists (it then is in its memory cgroup), it
# writes argv[4] MiB to the file argv[2] (page cache charged to it) and creates argv[3] +
# ".ready". Then each round re-reads the next 512 KiB of the file and receives 64 KiB from a
# socket pair into a private mapping of a random part of the file: the copy faults the file's
# pages in inside recvfrom (netsyscall times it), from the page cache until the limit drops under
# the working set, then one page at a time from the disk (MADV_RANDOM: no read-around, whose size
# is the disk's read_ahead_kb: 8 MiB here, and 800 MiB/s of reads). The re-reads keep the file's
# pages active, so that evicting them counts as thrashing. Its recvfrom P99 went 57-82 us ->
# 4.0-5.1 ms (9 recordings). At nice 0 beside other load on its CPU, its run-queue wait rose with
# that load 5 s into the fault, and explain dated the incident there (1 of 2 recordings).
MEMORY_VICTIM_CODE: Final = HIGH_PRIORITY + (
    "import mmap, os, random, socket, sys, time\n"
    "path, go, size = sys.argv[2], sys.argv[3], int(sys.argv[4]) << 20\n"
    "while not os.path.exists(go): time.sleep(0.01)\n"
    "fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)\n"
    "block = b'w' * (1 << 20)\n"
    "for _ in range(size >> 20): os.write(fd, block)\n"
    "os.fsync(fd)\n"
    "open(go + '.ready', 'w').close()\n"
    "sender, receiver = socket.socketpair()\n"
    "chunk, reread = 64 << 10, bytearray(512 << 10)\n"
    "payload, offset = b'x' * chunk, 0\n"
    "while True:\n"
    "    time.sleep(0.001)\n"
    "    offset = (offset + len(reread)) % size\n"
    "    os.preadv(fd, [reread], offset)\n"
    "    where = random.randrange(size // chunk) * chunk\n"
    "    page = mmap.mmap(fd, chunk, mmap.MAP_PRIVATE, offset=where)\n"
    "    page.madvise(mmap.MADV_RANDOM)\n"
    "    sender.sendall(payload)\n"
    "    view, got = memoryview(page), 0\n"
    "    while got < chunk: got += receiver.recv_into(view[got:])\n"
    "    view.release()\n"
    "    page.close()\n"
)
# The migrations fault's steady neighbour: spins 7 ms, sleeps 1 ms. It shares its CPU with the
# recorder; beside one that never sleeps, the recorder can stall for the whole fault (cause not
# known: a nice-0 sleeper beside it wakes within 4 ms on this 2-core host). The gap leaves that
# CPU idle now and then for whatever else must run there.
NEIGHBOUR_CODE: Final = HIGH_PRIORITY + (
    "import time\n"
    "while True:\n"
    "    end = time.perf_counter() + 0.007\n"
    "    while time.perf_counter() < end: pass\n"
    "    time.sleep(0.001)\n"
)
# A socket belongs to the cgroup of the task that created it (an accepted one to its listener's):
# the TCP ends create theirs only once Workload has moved them into their cgroup (argv[3]).
IN_MY_CGROUP: Final = (
    "import sys, time\n"
    "def mine(line): return line.startswith('0::') and line.strip().endswith('/' + sys.argv[3])\n"
    "while not any(mine(line) for line in open('/proc/self/cgroup')): time.sleep(0.001)\n"
)
TCP_SERVER: Final = IN_MY_CGROUP + (
    "import socket, sys\n"
    "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "s.bind(('127.0.0.1', int(sys.argv[2]))); s.listen(1)\n"
    "c, _ = s.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)\n"
    "while True:\n"
    "    data = c.recv(64)\n"
    "    if not data: break\n"
    "    c.sendall(data)\n"
)
TCP_CLIENT: Final = IN_MY_CGROUP + (
    "import socket, sys, time\n"
    "while True:\n"
    "    try:\n"
    "        c = socket.create_connection(('127.0.0.1', int(sys.argv[2]))); break\n"
    "    except OSError: time.sleep(0.05)\n"
    "c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)\n"
    "while True:\n"
    "    c.sendall(b'x' * 64)\n"
    "    got = 0\n"
    "    while got < 64: got += len(c.recv(64 - got))\n"
    "    time.sleep(0.002)\n"
)
# udp_drops: a feed receiver with a small socket buffer (its socket made in its own cgroup, so
# its drops are charged there) and a sender of a datagram per ms that, while the flag file
# exists, sends micro-bursts instead: BURST datagrams every 20 ms, more than the buffer holds
# (the receiver's recvfrom then waits up to 20 ms between bursts). At nice -19 the sender's own
# run-queue wait does not jump with the bursts (at nice 0 it did, behind the recorder: a jump of
# its own, which its calls then explained).
UDP_RECEIVER: Final = IN_MY_CGROUP + (
    "import socket, sys\n"
    "r = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
    f"r.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, {16 << 10})\n"
    "r.bind(('127.0.0.1', int(sys.argv[2])))\n"
    "while True: r.recvfrom(2048)\n"
)
BURST: Final = 100
UDP_SENDER: Final = HIGH_PRIORITY + (
    "import os, socket, sys, time\n"
    "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
    "to, bursts, payload = ('127.0.0.1', int(sys.argv[2])), sys.argv[3], b'x' * 200\n"
    "while True:\n"
    "    if os.path.exists(bursts):\n"
    f"        for _ in range({BURST}): s.sendto(payload, to)\n"
    "        time.sleep(0.02)\n"
    "    else:\n"
    "        s.sendto(payload, to)\n"
    "        time.sleep(0.001)\n"
)
UNIX_SERVER: Final = (
    "import socket, sys\n"
    "s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM); s.bind(sys.argv[2])\n"
    "while True:\n"
    "    data, peer = s.recvfrom(256)\n"
    "    if peer:\n"
    "        try: s.sendto(data, peer)\n"
    "        except OSError: pass\n"
)
UNIX_CLIENT: Final = (
    "import os, socket, sys, time\n"
    "me = sys.argv[2] + '.' + str(os.getpid())\n"
    "c = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM); c.bind(me)\n"
    "while not os.path.exists(sys.argv[2]): time.sleep(0.01)\n"
    "while True:\n"
    "    c.sendto(b'x' * 64, sys.argv[2])\n"
    "    c.recvfrom(256)\n"
    "    time.sleep(0.002)\n"
)
UNIX_FLOOD: Final = (
    "import socket, sys\n"
    "c = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)\n"
    "while True:\n"
    "    try: c.sendto(b'y' * 200, sys.argv[2])\n"
    "    except OSError: pass\n"
)


@dataclass(frozen=True)
class Injection:
    """One recorded injection and its ground truth."""

    kind: str
    documents: list[HistDocument]
    inject_ns: int
    victim: str
    culprit: str
    """The cgroup where the cause shows: the hog's, the retransmitting end's, the victim's."""
    expected: tuple[str, ...]
    """Cause kinds (``analysis.causes``) that name the injected fault."""
    kernel_counters: dict[str, int] = field(default_factory=dict)
    """How far the kernel's own counters of a limit moved during the fault (cpu_throttle,
    memory_pressure; :meth:`ResourceLimit.counters`): the fault's ground truth, read here and
    not by the code under test."""


@dataclass(frozen=True)
class Score:
    """How ``explain`` did on one injection."""

    kind: str
    found: bool
    top1: bool
    top3: bool
    time_error_s: float
    named: str
    """What the report gave as the likely cause (kind and cgroup), or why nothing."""


def _task(group: str, code: str, *args: str, cpu: int | None = None) -> Task:
    """A Python snippet as a task; ``args`` follow the parent pid (``sys.argv[2:]``)."""
    task = python_task(group, code, cpu=cpu)
    return Task(group, (*task.argv, *args), cpu)


def _recorder(directory: Path, stderr: IO[bytes]) -> subprocess.Popen[bytes]:
    command = [
        str(Path(sys.executable).with_name("tailsight")),
        "record",
        str(directory),
        "--interval",
        str(INTERVAL_S),
    ]
    recorder = subprocess.Popen(command, stderr=stderr)
    # Off the contended CPU and level with the spinners at nice -19, or its intervals stretch.
    others = os.sched_getaffinity(0) - {CPU}
    if others:
        os.sched_setaffinity(recorder.pid, others)
    os.setpriority(os.PRIO_PROCESS, recorder.pid, -19)
    return recorder


WATCH_S: Final = 0.5
"""How often :class:`RecorderWatch` samples the recorder's threads."""


class RecorderStalled(RuntimeError):
    """The recording holds too little of the workload: the recorder stopped writing intervals."""


@dataclass(frozen=True)
class _TaskState:
    comm: str
    state: str
    where: str
    """Its innermost kernel frames (``/proc/…/stack``, root only), else its wait channel."""
    ran_s: float
    waited_s: float
    """Run-queue wait (schedstat): starved of CPU rather than stuck in the kernel."""

    def __str__(self) -> str:
        return f"{self.comm} {self.state} in {self.where}"


def _task_states(pid: int) -> list[_TaskState]:
    """Every thread of ``pid`` and of its children (the symbolizer helper)."""
    pids = [pid]
    with contextlib.suppress(OSError, ValueError):
        pids += [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    states = []
    for owner in pids:
        for task in sorted(Path(f"/proc/{owner}/task").glob("*")):
            with contextlib.suppress(OSError, ValueError):
                comm = (task / "comm").read_text().strip()
                state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
                run_ns, wait_ns, _ = (task / "schedstat").read_text().split()
                states.append(
                    _TaskState(
                        f"{comm}/{task.name}",
                        state,
                        _kernel_frames(task),
                        int(run_ns) / 1e9,
                        int(wait_ns) / 1e9,
                    )
                )
    return states


def _kernel_frames(task: Path) -> str:
    try:
        lines = (task / "stack").read_text().splitlines()[:3]
    except OSError:
        lines = []
    frames = [re.sub(r"\+0x.*", "", line.split()[-1]) for line in lines if line.strip()]
    if frames:
        return " < ".join(frames)
    return (task / "wchan").read_text().strip() or "-"


def _threads(pid: int) -> str:
    """Each thread's state, kernel frames, CPU time and run-queue wait, one line each."""
    return "\n".join(
        f"{t} ran {t.ran_s:.1f} s waited {t.waited_s:.1f} s" for t in _task_states(pid)
    )


@dataclass
class RecorderWatch:
    """What the recorder's threads did while it recorded, sampled every WATCH_S, and what each
    CPU did meanwhile: where a recorder that stopped writing intervals was, and whether it was
    starved of CPU or blocked (the intervals alone cannot tell)."""

    pid: int
    seen: Counter[str] = field(default_factory=Counter)
    samples: int = 0
    first: dict[str, tuple[float, float]] = field(default_factory=dict)
    last: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Per thread: (ran, waited on a run queue) in seconds, at its first and last sample."""
    context: str = ""
    cpu_times_ns: dict[int, list[int]] = field(default_factory=dict)
    """Each CPU's /proc/stat times, cumulative until the run ends, then over the run."""
    said: str = ""
    """The recorder's stderr, once it has stopped."""

    def run(self, done: threading.Event) -> None:
        self.context = _scheduling_context(self.pid)
        self.cpu_times_ns = read_cpu_times_ns()
        while not done.wait(WATCH_S):
            for state in _task_states(self.pid):
                self.seen[str(state)] += 1
                self.first.setdefault(state.comm, (state.ran_s, state.waited_s))
                self.last[state.comm] = (state.ran_s, state.waited_s)
            self.samples += 1
        start = self.cpu_times_ns
        self.cpu_times_ns = {
            cpu: [after - before for before, after in zip(start[cpu], end, strict=True)]
            for cpu, end in read_cpu_times_ns().items()
            if cpu in start
        }

    def summary(self) -> str:
        lines = [f"the recorder ({self.context}), sampled {self.samples} times every {WATCH_S} s:"]
        lines += [f"  {n:4d}x {state}" for state, n in self.seen.most_common(12)]
        for comm, (ran_s, waited_s) in self.last.items():
            ran_0, waited_0 = self.first[comm]
            lines.append(f"  {comm}: ran {ran_s - ran_0:.2f} s, waited {waited_s - waited_0:.2f} s")
        lines.append("each CPU meanwhile (/proc/stat, ms): user nice system idle iowait irq "
                     "softirq steal")  # fmt: skip
        lines += [
            f"  cpu{cpu}: {' '.join(str(ns // 1_000_000) for ns in times[:8])}"
            for cpu, times in sorted(self.cpu_times_ns.items())
        ]
        lines += ["it said:", self.said[-3000:]]
        return "\n".join(lines)


def _scheduling_context(pid: int) -> str:
    """The recorder's nice, CPUs, autogroup and cgroups: what decides its share of a CPU."""
    parts = [f"nice {os.getpriority(os.PRIO_PROCESS, pid)}"]
    with contextlib.suppress(OSError):
        parts.append(f"CPUs {sorted(os.sched_getaffinity(pid))}")
    for name in ("autogroup", "cgroup"):
        with contextlib.suppress(OSError):
            text = Path(f"/proc/{pid}/{name}").read_text().split()
            parts.append(f"{name} {' '.join(text)}")
    return ", ".join(parts)


def _wait_first_interval(
    directory: Path, recorder: subprocess.Popen[bytes], stderr: IO[bytes]
) -> None:
    deadline = time.monotonic() + 300.0
    while True:
        with contextlib.suppress(FileNotFoundError):
            if Recording(directory).documents():
                return
        if recorder.poll() is not None or time.monotonic() > deadline:
            stderr.seek(0)
            said = stderr.read().decode(errors="replace")
            if recorder.returncode is not None:
                raise RuntimeError(f"record exited: {said}")
            raise RuntimeError(
                f"record wrote no interval in 300 s; it said:\n{said}\n{_threads(recorder.pid)}"
            )
        time.sleep(0.1)


@contextlib.contextmanager
def recording(directory: Path) -> Iterator[RecorderWatch]:
    """``tailsight record`` into ``directory`` (off the contended CPU) from its first interval
    until the block ends, watched."""
    with tempfile.TemporaryFile() as stderr:
        recorder = _recorder(directory, stderr)
        watch = RecorderWatch(recorder.pid)
        done = threading.Event()
        sampler = threading.Thread(target=watch.run, args=(done,), daemon=True)
        try:
            _wait_first_interval(directory, recorder, stderr)
            sampler.start()
            yield watch
        finally:
            done.set()
            if sampler.is_alive():
                sampler.join()
            stop_process(recorder, timeout_s=20.0)
            stderr.seek(0)
            watch.said = stderr.read().decode(errors="replace")


@contextlib.contextmanager
def _nft_drop(port: int, percent: int) -> Iterator[None]:
    """Lose ``percent`` % of the packets sent from ``port`` (the server's replies) on their way
    in: dropped at the receiver's input hook, after the sender's TCP handed them on as sent, as
    a lossy network would (a drop at the sender's output hook fails the send instead, so the
    sender queues the segment again without retransmitting it)."""
    table = f"tailsight_rca_{os.getpid()}_{port}"
    commands = [
        ["nft", "add", "table", "inet", table],
        ["nft", "add", "chain", "inet", table, "in",
         "{ type filter hook input priority 0 ; }"],
        ["nft", "add", "rule", "inet", table, "in", "tcp", "sport", str(port),
         "numgen", "random", "mod", "100", "<", str(percent), "drop"],
    ]  # fmt: skip
    try:
        for command in commands:
            subprocess.run(command, check=True, capture_output=True)
        yield
    finally:
        subprocess.run(["nft", "delete", "table", "inet", table], capture_output=True)


# The ground truth's own parsers, apart from the probes' (throttle, pressure) that it checks.
def _key_values(text: str) -> dict[str, int]:
    """``cpu.stat``'s, ``memory.stat``'s, ``memory.events``' "name value" lines."""
    pairs = (line.split() for line in text.splitlines())
    return {p[0]: int(p[1]) for p in pairs if len(p) == 2 and p[1].lstrip("-").isdigit()}


def _pressure_some_us(text: str) -> int:
    """The "some" line's ``total=`` of a PSI file (µs)."""
    for line in text.splitlines():
        if line.startswith("some "):
            return int(line.rpartition("total=")[2])
    raise ValueError(f"no 'some' line in {text!r}")


class ResourceLimit:
    """A CPU or memory limit on one v2 cgroup of a :class:`Workload`, set and lifted at known
    times, with the kernel's own counters of what the limit did.

    Hybrid hosts (the controller on cgroup v1): a v1 group at the same path as the v2 one, made
    here (the probes match the two by path), holding the group's tasks; closing lifts the limit
    and removes the v1 groups made here, after moving any task still in them to the v1 root.
    Pure v2 hosts: the v2 group itself, the controller enabled in each level above it (the host's
    root must enable it); the v2 limit is ``cpu.max`` or ``memory.high``. Paths are relative to
    the v2 mount ("/tailsight-test/123-rca-cpu_throttle/victim"); roots are passed in for tests.
    """

    def __init__(
        self,
        controller: str,
        path: str,
        v2_mount: Path | None = None,
        v1_mount: Path | None = None,
        mounts_path: Path | str = DEFAULT_MOUNTS_PATH,
    ) -> None:
        if controller not in ("cpu", "memory"):
            raise ValueError(f"no limit of controller {controller!r}: cpu or memory")
        self.controller = controller
        self.parts = [part for part in path.split("/") if part]
        self.v2_mount = v2_mount or find_cgroup2_mount(mounts_path)
        self.v1_mount = v1_mount or find_v1_mount(controller, mounts_path)
        if self.v1_mount is None:
            enabled = (self.v2_mount / "cgroup.controllers").read_text().split()
            if controller not in enabled:
                raise RuntimeError(
                    f"no {controller} controller: neither on cgroup v1 nor enabled at the "
                    f"cgroup v2 root ({self.v2_mount}/cgroup.controllers: {' '.join(enabled)})"
                )
        self._created: list[Path] = []

    @property
    def v1(self) -> bool:
        return self.v1_mount is not None

    @property
    def directory(self) -> Path:
        """The group whose limit is set: the v1 group on hybrid hosts, else the v2 one."""
        return (self.v1_mount or self.v2_mount).joinpath(*self.parts)

    def place(self, pids: Iterable[int]) -> None:
        """Put the tasks (already in the v2 group) under the controller, without a limit."""
        if self.v1_mount is not None:
            for n in range(1, len(self.parts) + 1):
                level = self.v1_mount.joinpath(*self.parts[:n])
                try:
                    level.mkdir()
                except FileExistsError:
                    continue  # a level shared with a concurrent run
                self._created.append(level)
            for pid in pids:
                (self.directory / "cgroup.procs").write_text(str(pid))
        else:
            for n in range(1, len(self.parts)):
                level = self.v2_mount.joinpath(*self.parts[:n])
                (level / "cgroup.subtree_control").write_text(f"+{self.controller}")
        self.lift()

    def limit_cpu(self, quota_us: int, period_us: int) -> None:
        """At most ``quota_us`` of CPU time per ``period_us`` (CFS bandwidth control)."""
        if self.v1:
            self._write("cpu.cfs_period_us", str(period_us))
            self._write("cpu.cfs_quota_us", str(quota_us))
        else:
            self._write("cpu.max", f"{quota_us} {period_us}")

    def limit_memory(self, limit_bytes: int) -> None:
        """Reclaim the group down to ``limit_bytes`` and keep it there."""
        self._write("memory.limit_in_bytes" if self.v1 else "memory.high", str(limit_bytes))

    def lift(self) -> None:
        """No limit."""
        if self.controller == "cpu":
            self._write(*(("cpu.cfs_quota_us", "-1") if self.v1 else ("cpu.max", "max")))
        else:
            self._write(*(("memory.limit_in_bytes", "-1") if self.v1 else ("memory.high", "max")))

    def counters(self) -> dict[str, int]:
        """The kernel's counters of the limit, cumulative: for cpu ``nr_periods``,
        ``nr_throttled`` and ``throttled_ns`` (``cpu.stat``); for memory ``limit_hits`` (v1
        ``memory.failcnt``, v2 ``memory.events`` high), ``refaults`` (page-cache pages read
        again after eviction, ``memory.stat``) and ``memory_stall_us`` (the v2 group's PSI
        "some" total; on every v2 group, hybrid or not, where the kernel keeps PSI)."""
        if self.controller == "cpu":
            stat = _key_values(self._read("cpu.stat"))
            throttled_ns = stat["throttled_time"] if self.v1 else 1000 * stat["throttled_usec"]
            return {
                "nr_periods": stat["nr_periods"],
                "nr_throttled": stat["nr_throttled"],
                "throttled_ns": throttled_ns,
            }
        memory = _key_values(self._read("memory.stat"))
        if self.v1:
            hits = int(self._read("memory.failcnt"))
        else:
            hits = _key_values(self._read("memory.events"))["high"]
        counters = {"limit_hits": hits, "refaults": memory["workingset_refault_file"]}
        with contextlib.suppress(OSError):  # a kernel without PSI
            pressure = self.v2_mount.joinpath(*self.parts, "memory.pressure").read_text()
            counters["memory_stall_us"] = _pressure_some_us(pressure)
        return counters

    def close(self) -> None:
        """Lift the limit and remove the v1 groups made here; idempotent."""
        if self.directory.exists():
            with contextlib.suppress(OSError):
                self.lift()
        while self._created:
            level = self._created.pop()
            if level != self.directory:  # a level above it, maybe shared with a concurrent run
                with contextlib.suppress(OSError):
                    level.rmdir()
                continue
            assert self.v1_mount is not None
            for pid in (level / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):  # exited meanwhile
                    (self.v1_mount / "cgroup.procs").write_text(pid)
            rmdir_retrying(level)

    def __enter__(self) -> ResourceLimit:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _write(self, name: str, value: str) -> None:
        (self.directory / name).write_text(value)

    def _read(self, name: str) -> str:
        return (self.directory / name).read_text()


def _flip_affinity(pids: Sequence[int], cpus: Sequence[int], stop: threading.Event) -> None:
    """Move the victim between CPUs every FLIP_S (each move is a forced migration)."""
    n = 0
    while not stop.is_set():
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, OSError):
                os.sched_setaffinity(pid, {cpus[n % len(cpus)]})
        n += 1
        time.sleep(FLIP_S)


def run_injection(
    kind: str, directory: Path, baseline_s: float = 10.0, fault_s: float = 10.0
) -> Injection:
    """Record ``baseline_s`` of the workload, then ``fault_s`` with the fault; return the truth."""
    if kind not in (*KINDS, QUIET):
        raise ValueError(f"unknown injection {kind!r}; one of {', '.join(KINDS)} or {QUIET}")
    base = private_base(f"rca-{kind}")
    port = 20_000 + os.getpid() % 20_000
    socket_path = str(directory.parent / f"rca-{os.getpid()}.sock")
    data_path = str(directory.parent / f"rca-{os.getpid()}.data")
    go_path = data_path + ".go"
    other = max(os.sched_getaffinity(0) - {CPU}, default=CPU)  # the CPU the victim is not on
    if kind == "packet_loss":
        tasks = [
            _task("server", TCP_SERVER, str(port), "server"),
            _task("client", TCP_CLIENT, str(port), "client"),
        ]
    elif kind == "neighbour_syscalls":
        tasks = [
            _task("server", UNIX_SERVER, socket_path, cpu=CPU),
            _task("victim", UNIX_CLIENT, socket_path, cpu=CPU),
        ]
    elif kind == "migrations":
        # A steady neighbour (NEIGHBOUR_CODE) runs at nice -19 on the other CPU all along; the
        # victim (nice 0) has CPU 0 to itself until the flipping sends it there for every other
        # FLIP_S, where it barely runs: waits up to FLIP_S, far above what other load on CPU 0
        # gives it. With 2 ms flips (the waits' ceiling) and the spinner at nice -5, other load
        # on CPU 0 gives the baseline waits as long as the fault's (no jump to detect). 8 ms
        # keeps the moves above FORCED_MIGRATIONS per interval (57 here; at 10 ms, 45: the
        # spinner's displacement then ranks first).
        tasks = [
            _task("victim", VICTIM_LOOP, cpu=CPU),
            _task("background", NEIGHBOUR_CODE, cpu=other),
        ]
    elif kind == "cpu_throttle":
        tasks = [_task("victim", THROTTLED_VICTIM_CODE, cpu=CPU)]
    elif kind == "udp_drops":
        tasks = [
            _task("victim", UDP_RECEIVER, str(port), "victim", cpu=CPU),
            _task("sender", UDP_SENDER, str(port), go_path, cpu=other),
        ]
    elif kind == "memory_pressure":
        if not _disk_backed(directory.parent):
            raise RuntimeError(
                f"memory_pressure needs its file on a disk, not in memory ({directory.parent} "
                "is tmpfs or ramfs: its pages cannot be reclaimed without swap); set TMPDIR"
            )
        tasks = [
            _task("victim", MEMORY_VICTIM_CODE, data_path, go_path, str(WORKING_SET_MIB), cpu=CPU)
        ]
    else:
        tasks = [_task("victim", VICTIM_CODE, cpu=CPU)]
    controller = {"cpu_throttle": "cpu", "memory_pressure": "memory"}.get(kind)
    kernel_counters: dict[str, int] = {}
    with contextlib.ExitStack() as started:
        # Recording first, on a quiet machine: the probes compile in seconds (beside the
        # migrations spinner a recorder can write nothing for 300 s), and they see the TCP
        # connection established, so they can tell which cgroup holds its other end
        # (tcp_retransmits_to_peer). The workload's start-up (imports, connect) is left out.
        watch = started.enter_context(recording(directory))
        load = Workload(tasks, base=base)
        # Closed after the workload: the v1 groups are removed once their tasks are gone.
        limit = None
        if controller is not None:
            limit = started.enter_context(ResourceLimit(controller, load.cgroup_path("victim")))
        started.enter_context(load)
        victim = load.cgroup_path("client" if kind == "packet_loss" else "victim")
        if limit is not None:
            limit.place(load.pids("victim"))
        if kind == "memory_pressure":
            Path(go_path).touch()
            _wait_ready(Path(go_path + ".ready"), load)
        time.sleep(SETTLE_S)
        settled_ns = time.time_ns()
        time.sleep(baseline_s)
        inject_ns = time.time_ns()
        culprit = victim
        if kind in ("cpu_hog", "own_cgroup"):
            group = "hog" if kind == "cpu_hog" else "victim"
            with Workload([_task(group, HOG_CODE, cpu=CPU)], base=base) as hog:
                culprit = hog.cgroup_path(group)
                time.sleep(fault_s)
        elif kind == "packet_loss":
            culprit = load.cgroup_path("server")
            with _nft_drop(port, 15):
                time.sleep(fault_s)
        elif kind == "udp_drops":
            before_drops = udp_socket_drops(port)
            Path(go_path).touch()
            time.sleep(fault_s)
            Path(go_path).unlink()
            time.sleep(0.1)  # a burst begun before the flag went: its drops are the fault's
            kernel_counters = {"udp_drops": udp_socket_drops(port) - before_drops}
        elif kind == "migrations":
            stop = threading.Event()
            flipper = threading.Thread(
                target=_flip_affinity, args=(load.pids("victim"), [CPU, other], stop)
            )
            flipper.start()
            try:
                time.sleep(fault_s)
            finally:
                stop.set()
                flipper.join()
        elif limit is not None:
            before = limit.counters()
            if kind == "cpu_throttle":
                limit.limit_cpu(THROTTLE_QUOTA_US, THROTTLE_PERIOD_US)
            else:
                limit.limit_memory(MEMORY_LIMIT_MIB << 20)
            time.sleep(fault_s)
            after = limit.counters()
            limit.lift()
            kernel_counters = {name: after[name] - before[name] for name in after}
        elif kind == QUIET:
            time.sleep(fault_s)
        else:  # neighbour_syscalls
            # On another CPU: the neighbour must hurt through the socket, not as a CPU hog.
            flood = [_task("neighbour", UNIX_FLOOD, socket_path, cpu=other)]
            with Workload(flood, base=base) as neighbour:
                culprit = neighbour.cgroup_path("neighbour")
                time.sleep(fault_s)
    for scratch in (socket_path, data_path):
        for leftover in Path(scratch).parent.glob(Path(scratch).name + "*"):
            leftover.unlink(missing_ok=True)
    expected = {
        "cpu_hog": ("displacement",),
        "own_cgroup": ("displacement",),
        "packet_loss": ("retransmits", "retransmit_failures"),
        "migrations": ("migrations", "cross_node_migrations"),
        "neighbour_syscalls": ("neighbour_calls",),
        "cpu_throttle": ("throttling",),
        "memory_pressure": ("memory_pressure",),
        "udp_drops": ("packet_drops",),
        QUIET: (),
    }[kind]
    # The first interval of a recording holds, for the probe attached first, every event since
    # its attach (the other probes compile meanwhile; collector/agent.py dates the interval from
    # the last attach): an outlier that is not part of the workload.
    documents = [d for d in Recording(directory).documents()[1:] if d.start_ns >= settled_ns]
    wanted = (baseline_s + fault_s) / INTERVAL_S
    longest_s = max((d.end_ns - d.start_ns for d in documents), default=0) / 1e9
    if len(documents) < 0.8 * wanted or longest_s > 5 * INTERVAL_S:
        raise RecorderStalled(
            f"the recording holds {len(documents)} of the workload's {wanted:.0f} intervals, "
            f"the longest {longest_s:.1f} s: the recorder stalled\n{watch.summary()}"
        )
    return Injection(
        kind=kind,
        documents=documents,
        inject_ns=inject_ns,
        victim=victim,
        culprit=culprit,
        expected=expected,
        kernel_counters=kernel_counters,
    )


def udp_socket_drops(port: int, proc_net: Path = Path("/proc/net")) -> int:
    """The kernel's ``drops`` column of the IPv4 UDP socket bound to ``port``."""
    for line in (proc_net / "udp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].split(":")[1], 16) == port:
            return int(fields[-1])
    raise RuntimeError(f"no UDP socket on port {port} in {proc_net / 'udp'}")


def _disk_backed(directory: Path) -> bool:
    """Whether files in ``directory`` have their pages on a disk (not tmpfs or ramfs)."""
    filesystem = subprocess.run(
        ["stat", "--file-system", "--format", "%T", str(directory)],
        capture_output=True,
        text=True,
        check=True,
    )
    return filesystem.stdout.strip() not in ("tmpfs", "ramfs")


def _wait_ready(marker: Path, load: Workload, timeout_s: float = READY_TIMEOUT_S) -> None:
    """Until a task of ``load`` has created ``marker`` (it has set up what it measures)."""
    deadline = time.monotonic() + timeout_s
    while not marker.exists():
        for _, process in load.processes:
            if process.poll() is not None:
                raise RuntimeError(f"task {process.args!r} exited ({process.returncode})")
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {marker} in {timeout_s} s")
        time.sleep(0.05)


def run_quiet(directory: Path, seconds: float) -> tuple[Injection, float]:
    """A quiet recording of ``seconds``, and the largest share of its time the hypervisor stole
    from one CPU (``/proc/stat``, read here, not by the code under test)."""
    steal_before, start_s = read_steal_ns(), time.monotonic()
    injection = run_injection(QUIET, directory, baseline_s=seconds / 2, fault_s=seconds / 2)
    wall_ns = (time.monotonic() - start_s) * 1e9
    stolen_ns = max((n - steal_before.get(cpu, n) for cpu, n in read_steal_ns().items()), default=0)
    return injection, stolen_ns / wall_ns


def steal_disturbed(result: Score, steal_share: float) -> bool:
    """True for a quiet recording that was not quiet: its incident is put on hypervisor steal,
    and a CPU really lost at least :data:`STEAL_DISTURBED` of the recording's time to it."""
    return result.found and result.named.startswith("steal") and steal_share >= STEAL_DISTURBED


def score(
    report: object, injection: Injection, tolerance_s: float = 3.0, own_causes: bool = False
) -> Score:
    """Top-1/top-3 of the first incident (within ``tolerance_s`` of the injection) that holds a
    jump of the victim cgroup; a displacement must name the culprit as the aggressor.
    ``own_causes``: rank only the causes shown in the victim's cgroup (its displacement), for an
    incident that also holds other cgroups' jumps with causes of their own (background load)."""
    assert isinstance(report, Report)
    for incident in report.incidents:
        error_s = (incident.start_ns - injection.inject_ns) / 1e9
        mine = any(j.labels.get("cgroup") == injection.victim for j in incident.jumps)
        mine = mine or injection.victim in incident.cgroups
        if not mine or abs(error_s) > tolerance_s:
            continue
        causes = incident.causes
        if own_causes:
            causes = [c for c in causes if c.cgroup == injection.victim]
        right = [_matches(c, injection) for c in causes]
        first = causes[0] if causes else None
        named = "none" if first is None else f"{first.kind} {first.cgroup} {first.labels}"
        return Score(injection.kind, True, any(right[:1]), any(right[:3]), error_s, named)
    return Score(injection.kind, False, False, False, float("nan"), "no incident of the victim")


def _matches(cause: object, injection: Injection) -> bool:
    assert isinstance(cause, Cause)
    if cause.kind not in injection.expected:
        return False
    if cause.kind == "displacement":
        return cause.cgroup == injection.victim and cause.labels.get("aggressor") == (
            injection.culprit
        )
    if cause.kind == "throttling":
        # A limit on a parent throttles the victim with it.
        return is_within(injection.victim, cause.cgroup)
    if cause.kind == "memory_pressure":
        return cause.cgroup == injection.victim
    if cause.kind.startswith("retransmit"):
        # Either end of the connection retransmits: the server its lost replies, the client its
        # requests whose acknowledgement was lost with them.
        return cause.cgroup in (injection.victim, injection.culprit)
    return cause.cgroup == injection.culprit
