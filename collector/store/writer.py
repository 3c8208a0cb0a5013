"""The recording writer: appends interval documents as records to segment files of a directory
it holds locked (one writer per directory), with bounded retention. Crash rules:
``docs/recording.md``."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import grp
import os
import time
from pathlib import Path
from typing import Final

from tailsight.collector.store.codec import (
    SEGMENT_HEADER,
    SEGMENT_HEADER_V1,
    SEGMENT_SUFFIX,
    LabelTexts,
    encode_record,
)
from tailsight.collector.store.reader import list_segments
from tailsight.intervals import HistDocument, fsync_directory

LOCK_NAME: Final = ".lock"
DEFAULT_SEGMENT_BYTES: Final = 64 << 20
DEFAULT_SEGMENT_S: Final = 3600.0


class RecordingBusyError(OSError):
    """Another writer holds the recording directory's lock."""


def segment_name(first_start_ns: int, sequence: int = 0) -> str:
    """``<start_ns, 20 digits>-<sequence, 4 digits>.tsrec``: names sort by time."""
    return f"{first_start_ns:020d}-{sequence:04d}{SEGMENT_SUFFIX}"


class RecordingWriter:
    """Appends interval documents to the newest segment of a directory it holds locked.

    Every run starts a new segment (a torn tail left by a killed writer stays the last bytes of
    its own segment). Retention removes whole closed segments, oldest first. Files are 0600 and a
    directory it creates 0700; with ``group`` 0640 / 0750 and owned by that group. A failed write
    raises its ``OSError`` (errno kept, ENOSPC for a full disk) after undoing the partial record.
    ``version=1`` writes the format of earlier releases (text records), for comparisons and tests.
    """

    def __init__(
        self,
        directory: Path | str,
        max_age_s: float | None = None,
        max_bytes: int | None = None,
        segment_bytes: int | None = None,
        segment_s: float = DEFAULT_SEGMENT_S,
        fsync: bool = True,
        group: str | int | None = None,
        version: int = 2,
    ) -> None:
        if version not in (1, 2):
            raise ValueError(f"recording format version {version}: this writer has 1 and 2")
        self.version = version
        self.directory = Path(directory)
        self.gid = group_id(group)
        self.file_mode = 0o600 if self.gid is None else 0o640
        created = not self.directory.exists()
        self.directory.mkdir(parents=True, exist_ok=True)
        if created or self.gid is not None:
            if self.gid is not None:
                os.chown(self.directory, -1, self.gid)
            os.chmod(self.directory, 0o700 if self.gid is None else 0o750)  # whatever the umask
        self._lock_fd: int | None = self._lock()
        self.max_age_s = max_age_s
        self.max_bytes = max_bytes
        if segment_bytes is None:
            segment_bytes = DEFAULT_SEGMENT_BYTES
            if max_bytes is not None:
                segment_bytes = max(4096, min(segment_bytes, max_bytes // 8))
        self.segment_bytes = segment_bytes
        self.segment_s = segment_s
        self.fsync = fsync
        self.records_written = 0
        self.bytes_written = 0
        self._fd: int | None = None
        self._segment: Path | None = None
        self._segment_size = 0
        self._segment_opened = 0.0
        self._texts = LabelTexts()

    @property
    def segment(self) -> Path | None:
        """The segment being appended to, if any."""
        return self._segment

    def append(self, document: HistDocument) -> None:
        """Write one interval; durable on return when ``fsync`` (the default)."""
        if self._lock_fd is None:
            raise ValueError(f"recording writer for {self.directory} is closed")
        record = encode_record(document, self.version, self._texts)
        if self._fd is not None and (
            self._segment_size + len(record) > self.segment_bytes
            or time.monotonic() - self._segment_opened > self.segment_s
        ):
            self._close_segment()
        opened = self._fd is None
        if opened:
            self._open_segment(document.start_ns)
        assert self._fd is not None
        try:
            _write_all(self._fd, record)
            if self.fsync:
                os.fsync(self._fd)
        except OSError:
            self._undo_partial_record()
            raise
        self._segment_size += len(record)
        self.records_written += 1
        self.bytes_written += len(record)
        if opened or self.records_written % 16 == 0:
            self.apply_retention()

    def apply_retention(self, now_s: float | None = None) -> list[Path]:
        """Delete closed segments older than ``max_age_s`` or beyond ``max_bytes``; returns them."""
        now_s = time.time() if now_s is None else now_s
        closed = [p for p in list_segments(self.directory) if p != self._segment]
        removed: list[Path] = []
        sizes: dict[Path, int] = {}
        for path in closed:
            try:
                stat = path.stat()
            except FileNotFoundError:
                continue
            if self.max_age_s is not None and now_s - stat.st_mtime > self.max_age_s:
                removed.append(path)
            else:
                sizes[path] = stat.st_size
        if self.max_bytes is not None:
            total = sum(sizes.values()) + self._segment_size
            for path in sorted(sizes):
                if total <= self.max_bytes:
                    break
                removed.append(path)
                total -= sizes[path]
        for path in removed:
            path.unlink(missing_ok=True)
        if removed:
            fsync_directory(self.directory)
        return removed

    def close(self) -> None:
        """Flush and close the current segment and release the directory; safe to call twice."""
        try:
            self._close_segment()
        finally:
            if self._lock_fd is not None:
                os.close(self._lock_fd)  # releases the flock
                self._lock_fd = None

    def __enter__(self) -> RecordingWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _lock(self) -> int:
        """flock ``DIR/.lock`` (released by the kernel when the writer dies, however it dies)."""
        path = self.directory / LOCK_NAME
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, self.file_mode)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode("ascii", "replace").strip() or "?"
            os.close(fd)
            raise RecordingBusyError(
                errno.EBUSY, f"another writer records there (pid {holder})", str(self.directory)
            ) from None
        except BaseException:
            os.close(fd)
            raise
        self._set_mode(fd)
        with contextlib.suppress(OSError):  # the pid only makes the message above better
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return fd

    def _set_mode(self, fd: int) -> None:
        if self.gid is not None:
            os.fchown(fd, -1, self.gid)
        os.fchmod(fd, self.file_mode)  # exact, whatever the umask

    def _open_segment(self, start_ns: int) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC
        for sequence in range(10_000):
            path = self.directory / segment_name(start_ns, sequence)
            try:
                fd = os.open(path, flags, self.file_mode)
            except FileExistsError:
                continue
            break
        else:
            raise FileExistsError(f"no free segment name for start {start_ns} in {self.directory}")
        try:
            self._set_mode(fd)
            _write_all(fd, SEGMENT_HEADER if self.version == 2 else SEGMENT_HEADER_V1)
            if self.fsync:
                os.fsync(fd)
                fsync_directory(self.directory)
        except BaseException:  # no header-less segment left behind (a full disk, say)
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        self._fd, self._segment = fd, path
        self._segment_size = len(SEGMENT_HEADER)  # both versions: 16 bytes
        self._segment_opened = time.monotonic()

    def _undo_partial_record(self) -> None:
        """Cut the segment back to its last complete record; if even that fails, stop using
        it (readers skip a torn tail)."""
        assert self._fd is not None
        try:
            os.ftruncate(self._fd, self._segment_size)
        except OSError:
            with contextlib.suppress(OSError):
                self._close_segment()

    def _close_segment(self) -> None:
        if self._fd is None:
            return
        fd, self._fd, self._segment = self._fd, None, None
        self._segment_size = 0
        try:
            if self.fsync:
                os.fsync(fd)
        finally:
            os.close(fd)


def group_id(group: str | int | None) -> int | None:
    """A group name or id as a gid; ValueError names a group that does not exist."""
    if group is None or isinstance(group, int):
        return group
    if group.isdigit():
        return int(group)
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise ValueError(f"no group named {group!r}") from None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
