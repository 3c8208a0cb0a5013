"""User-space symbols, resolved in a helper process that is replaced after a few pids.

bcc keeps one symbol cache per pid it has symbolized (``BPF._sym_caches``, ~0.9 MiB each) and
never drops it; under cgroup churn an agent would grow without bound. Freeing a cache with
``bcc_free_symcache`` closes file descriptors bcc had already closed, i.e. other parts' sockets
and locks. So the caches live in a child (``python -m tailsight.probes.symbolizer``) that is
retired after ``RECYCLE_PIDS`` distinct pids: its memory goes with it, the agent's fds are never
touched. One JSON line per request (``[pid, [address, ...]]``) and per answer (``[name, ...]``).

Names are kept by file and offset (``/proc/<pid>/maps``), not by pid, and a place in a file is
asked of one live process that maps it: a host runs many processes of the same binaries, each
mapped at its own addresses, and asking the helper of each one loaded the same symbol tables once
per pid and replaced the helper every RECYCLE_PIDS pids (on a busy host most of its CPU).
"""

from __future__ import annotations

import atexit
import bisect
import json
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import IO, Final

UNKNOWN_FRAME: Final = "[unknown]"  # bcc's name for an address it cannot symbolize
RECYCLE_PIDS: Final = 32
"""Distinct pids one helper serves before it is replaced (bounds its caches at ~30 MiB)."""
ANSWER_TIMEOUT_S: Final = 5.0
"""A helper that takes longer (a huge binary, a stuck /proc read) is killed; frames unknown."""
MAX_NAMES: Final = 65536
"""Names kept by (file, offset); the cache starts over past this."""
REST_S: Final = 30.0
"""After a timeout, frames read unknown without asking for this long: a slow machine must not
stall the agent ANSWER_TIMEOUT_S per stack, interval after interval."""


class Symbolizer:
    """``resolve(pid, addresses) -> names``; thread-safe, never raises for a failed helper."""

    def __init__(
        self,
        recycle_pids: int = RECYCLE_PIDS,
        answer_timeout_s: float = ANSWER_TIMEOUT_S,
        rest_s: float = REST_S,
    ) -> None:
        self.recycle_pids = recycle_pids
        self.answer_timeout_s = answer_timeout_s
        self.rest_s = rest_s
        self.helpers_started = 0
        self.failures = 0
        self._resting_until = 0.0
        self._lock = threading.Lock()
        self._helper: subprocess.Popen[bytes] | None = None
        self._pids: set[int] = set()
        self._names: dict[FileOffset, str] = {}  # the same code in every process mapping it
        self._representatives: dict[tuple[int, int], int] = {}  # (device, inode) -> pid asked
        self.asked = 0  # addresses the helpers were asked for
        # The helpers' CPU, under a lock of its own: a scrape reads it, and must not wait
        # behind a resolve waiting up to answer_timeout_s for a helper.
        self._cpu_lock = threading.Lock()
        self._retired_cpu_s = 0.0  # CPU of the helpers retired so far
        self._live_pid: int | None = None
        self._live_cpu_s = 0.0  # the live helper's, as last read (a dead one reads 0)

    def resolve(self, pid: int, addresses: Sequence[int]) -> list[str]:
        if not addresses:
            return []
        with self._lock:
            maps = _FileMaps.read(pid)
            places = [None if maps is None else maps.place(a) for a in addresses]
            # Outside every file, only a JIT's perf map can name an address (bcc reads it);
            # without one it is a frame the unwinder got wrong: unknown, the helper not asked.
            outside = UNKNOWN_FRAME if None in places and not _has_perf_map(pid) else None
            names = [outside if place is None else self._names.get(place) for place in places]
            unnamed = [i for i, name in enumerate(names) if name is None]
            if len(self._names) + len(unnamed) > MAX_NAMES:
                self._names.clear()
                self._representatives.clear()
            questions = self._questions(pid, maps, addresses, places, unnamed)
            for asked_pid, asked in questions.items():
                answers = None
                if time.monotonic() >= self._resting_until:
                    answers = self._ask_any(asked_pid, [address for _, address in asked])
                if answers is None:  # no helper to answer now: unknown, asked again next time
                    continue
                # "[unknown]" is kept too (bcc has no symbol there), unless the process may
                # have exited before the helper read it: alive after the answer, it was alive
                # during it.
                unknown_kept = UNKNOWN_FRAME not in answers or os.path.exists(f"/proc/{asked_pid}")
                for (i, _), answer in zip(asked, answers, strict=True):
                    names[i] = answer
                    place = places[i]
                    if place is not None and (unknown_kept or answer != UNKNOWN_FRAME):
                        self._names[place] = answer
            return [UNKNOWN_FRAME if name is None else name for name in names]

    def _questions(
        self,
        pid: int,
        maps: _FileMaps | None,
        addresses: Sequence[int],
        places: Sequence[FileOffset | None],
        unnamed: Sequence[int],
    ) -> dict[int, list[tuple[int, int]]]:
        """The unnamed addresses as questions to the helper: pid -> [(index, address there)].

        A place in a file is asked of that file's representative, the first live process seen
        mapping it, at its own address there: the helper then serves a few pids (one per set of
        binaries), not every process on the host, and is seldom replaced."""
        questions: dict[int, list[tuple[int, int]]] = {}
        maps_of: dict[int, _FileMaps | None] = {pid: maps}
        for i in unnamed:
            place = places[i]
            asked_pid, address = pid, addresses[i]
            if place is not None:
                file = place[:2]
                representative = self._representatives.get(file, pid)
                if representative != pid:
                    if representative not in maps_of:
                        maps_of[representative] = _FileMaps.read(representative)
                    there = maps_of[representative]
                    address_there = None if there is None else there.address(place)
                    if address_there is not None:  # else gone, or it no longer maps the file
                        asked_pid, address = representative, address_there
                self._representatives[file] = asked_pid
            questions.setdefault(asked_pid, []).append((i, address))
        return questions

    def helper_cpu_s(self) -> float:
        """CPU seconds of every helper so far, the live one's included: the agent's cost too."""
        with self._cpu_lock:
            if self._live_pid is not None:
                self._live_cpu_s = max(self._live_cpu_s, _cpu_s(self._live_pid))
            return self._retired_cpu_s + self._live_cpu_s

    def _ask_any(self, pid: int, addresses: Sequence[int]) -> list[str] | None:
        """The helper's names, or None (helper dead twice, or too slow)."""
        if pid not in self._pids and len(self._pids) >= self.recycle_pids:
            self._retire()
        for _ in range(2):  # a helper that died (killed, OOM) gets one fresh successor
            try:
                return self._ask(pid, addresses)
            except (OSError, ValueError, TimeoutError) as error:
                self.failures += 1
                self._retire()
                if isinstance(error, TimeoutError):
                    # Slow, not dead: do not stall the caller twice, nor the next callers.
                    self._resting_until = time.monotonic() + self.rest_s
                    break
        return None

    def close(self) -> None:
        with self._lock:
            self._retire()

    @property
    def helper_pid(self) -> int | None:
        return None if self._helper is None else self._helper.pid

    def _ask(self, pid: int, addresses: Sequence[int]) -> list[str]:
        helper = self._start()  # a fresh one serves no pid yet
        assert helper.stdin is not None and helper.stdout is not None
        self._pids.add(pid)
        self.asked += len(addresses)
        helper.stdin.write(json.dumps([pid, list(addresses)]).encode() + b"\n")
        helper.stdin.flush()
        line = _read_line(helper.stdout, self.answer_timeout_s)
        names = json.loads(line)
        if not isinstance(names, list) or len(names) != len(addresses):
            raise ValueError(f"symbolizer answered {line[:80]!r}")
        return [str(name) for name in names]

    def _start(self) -> subprocess.Popen[bytes]:
        if self._helper is None or self._helper.poll() is not None:
            self._retire()
            # Its own session: a Ctrl-C meant for the agent does not kill it mid-answer; it
            # exits when its stdin closes (the agent exited or retired it).
            self._helper = subprocess.Popen(
                [sys.executable, "-m", "tailsight.probes.symbolizer"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                start_new_session=True,
            )
            self.helpers_started += 1
            with self._cpu_lock:
                self._live_pid, self._live_cpu_s = self._helper.pid, 0.0
        return self._helper

    def _retire(self) -> None:
        helper, self._helper = self._helper, None
        self._pids.clear()
        if helper is None:
            return
        with self._cpu_lock:  # all it used (it is killed next), or as last read if it died
            self._retired_cpu_s += max(_cpu_s(helper.pid), self._live_cpu_s)
            self._live_pid, self._live_cpu_s = None, 0.0
        helper.kill()
        helper.wait()
        for pipe in (helper.stdin, helper.stdout):
            if pipe is not None:
                pipe.close()


def _read_line(stream: IO[bytes], timeout_s: float) -> bytes:
    """One line from a pipe, or TimeoutError; the helper answers in one write."""
    fd = stream.fileno()
    chunks: list[bytes] = []
    while True:
        ready, _, _ = select.select([fd], [], [], timeout_s)
        if not ready:
            raise TimeoutError("symbolizer did not answer")
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            raise OSError("symbolizer exited")
        chunks.append(chunk)
        if chunk.endswith(b"\n"):
            return b"".join(chunks)


FileOffset = tuple[int, int, int]
"""(device, inode, offset in the file) of mapped code: the same name in every process."""


@dataclass(frozen=True)
class _FileMaps:
    """The file-backed mappings of one process (``/proc/<pid>/maps``), by start address."""

    starts: list[int]
    spans: list[tuple[int, int, int, int]]  # end, offset in the file less start, device, inode

    @classmethod
    def read(cls, pid: int) -> _FileMaps | None:
        """Read at each call (None if the process is gone): a reused pid maps other files."""
        try:
            with open(f"/proc/{pid}/maps", "rb") as maps:
                lines = maps.read().splitlines()
        except OSError:
            return None
        starts: list[int] = []
        spans: list[tuple[int, int, int, int]] = []
        for line in lines:
            fields = line.split(maxsplit=5)
            inode = int(fields[4])
            if not inode:  # anonymous: heap, stacks, JIT code
                continue
            start, end = (int(bound, 16) for bound in fields[0].split(b"-"))
            major, minor = (int(part, 16) for part in fields[3].split(b":"))
            starts.append(start)
            spans.append((end, int(fields[2], 16) - start, os.makedev(major, minor), inode))
        return cls(starts, spans)

    def place(self, address: int) -> FileOffset | None:
        """Where the address lies in a mapped file, or None (outside every file)."""
        i = bisect.bisect_right(self.starts, address) - 1
        if i < 0 or address >= self.spans[i][0]:
            return None
        _, shift, device, inode = self.spans[i]
        return (device, inode, address + shift)

    def address(self, place: FileOffset) -> int | None:
        """This process's address of a place in a file, or None if it does not map it there."""
        device, inode, offset = place
        for start, (end, shift, mapped_device, mapped_inode) in zip(
            self.starts, self.spans, strict=True
        ):
            if (mapped_inode, mapped_device) == (inode, device) and start <= offset - shift < end:
                return offset - shift
        return None


def _has_perf_map(pid: int) -> bool:
    """Whether the process wrote a perf map (``/tmp/perf-<pid>.map`` in its own mount and pid
    namespaces), where JIT runtimes name the code they generate."""
    try:
        with open(f"/proc/{pid}/status", "rb") as status:
            ns_pids = next(line for line in status if line.startswith(b"NSpid:")).split()
    except (OSError, StopIteration):
        return False
    return os.path.exists(f"/proc/{pid}/root/tmp/perf-{int(ns_pids[-1])}.map")


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live process (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


_shared: Symbolizer | None = None


def shared_symbolizer() -> Symbolizer:
    """The process's one symbolizer (all probes share its helper)."""
    global _shared
    if _shared is None:
        _shared = Symbolizer()
        atexit.register(_shared.close)  # its helper would outlive us until its stdin closed
    return _shared


def serve(requests: IO[bytes], answers: IO[bytes]) -> None:
    """The helper's loop: answer each request line until stdin closes."""
    from bcc import BPF

    for line in requests:
        pid, addresses = json.loads(line)
        names = [BPF.sym(int(a), int(pid)).decode(errors="replace") for a in addresses]
        answers.write(json.dumps(names).encode() + b"\n")
        answers.flush()


if __name__ == "__main__":
    serve(sys.stdin.buffer, sys.stdout.buffer)
