"""User-space symbols, resolved in a helper process that is replaced after a few pids.

bcc keeps one symbol cache per pid it has symbolized (``BPF._sym_caches``, ~0.9 MiB each) and
never drops it; under cgroup churn an agent would grow without bound. Freeing a cache with
``bcc_free_symcache`` closes file descriptors bcc had already closed, i.e. other parts' sockets
and locks. So the caches live in a child (``python -m tailsight.probes.symbolizer``) that is
retired after ``RECYCLE_PIDS`` distinct pids: its memory goes with it, the agent's fds are never
touched. One JSON line per request (``[pid, [address, ...]]``) and per answer (``[name, ...]``).
"""

from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import IO, Final

UNKNOWN_FRAME: Final = "[unknown]"  # bcc's name for an address it cannot symbolize
RECYCLE_PIDS: Final = 32
"""Distinct pids one helper serves before it is replaced (bounds its caches at ~30 MiB)."""
ANSWER_TIMEOUT_S: Final = 5.0
"""A helper that takes longer (a huge binary, a stuck /proc read) is killed; frames unknown."""
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

    def resolve(self, pid: int, addresses: Sequence[int]) -> list[str]:
        if not addresses:
            return []
        with self._lock:
            if time.monotonic() < self._resting_until:
                return [UNKNOWN_FRAME] * len(addresses)
            if pid not in self._pids and len(self._pids) >= self.recycle_pids:
                self._retire()
            for _ in range(2):  # a helper that died (killed, OOM) gets one fresh successor
                self._pids.add(pid)
                try:
                    return self._ask(pid, addresses)
                except (OSError, ValueError, TimeoutError) as error:
                    self.failures += 1
                    self._retire()
                    if isinstance(error, TimeoutError):
                        # Slow, not dead: do not stall the caller twice, nor the next callers.
                        self._resting_until = time.monotonic() + self.rest_s
                        break
            return [UNKNOWN_FRAME] * len(addresses)

    def close(self) -> None:
        with self._lock:
            self._retire()

    @property
    def helper_pid(self) -> int | None:
        return None if self._helper is None else self._helper.pid

    def _ask(self, pid: int, addresses: Sequence[int]) -> list[str]:
        helper = self._start()
        assert helper.stdin is not None and helper.stdout is not None
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
        return self._helper

    def _retire(self) -> None:
        helper, self._helper = self._helper, None
        self._pids.clear()
        if helper is None:
            return
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
