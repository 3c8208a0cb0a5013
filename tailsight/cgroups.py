"""Cgroup v2, the one place for it: where the hierarchy is mounted, our own cgroup, id <-> path.
A cgroup's id (what BPF reports) is its directory's inode number."""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Final

UNKNOWN: Final = "unknown"
ROOT_PATH: Final = "/"
DEFAULT_MOUNTS_PATH: Final = Path("/proc/self/mounts")


class NoCgroupV2Error(LookupError):
    """A process (or thread) whose cgroup file has no cgroup v2 ("0::") line."""


def _unescape_mount_field(text: str) -> str:
    """Undo the octal escapes (``\\040`` for a space) the kernel uses in /proc/*/mounts."""
    out = []
    i = 0
    while i < len(text):
        if text[i] == "\\" and text[i + 1 : i + 4].isdigit():
            out.append(chr(int(text[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def find_cgroup2_mount(mounts_path: Path | str = DEFAULT_MOUNTS_PATH) -> Path:
    """Mount point of the cgroup v2 hierarchy (``/sys/fs/cgroup/unified`` on hybrid hosts)."""
    with open(mounts_path, encoding="utf-8") as mounts:
        for line in mounts:
            fields = line.split()
            if len(fields) >= 3 and fields[2] == "cgroup2":
                return Path(_unescape_mount_field(fields[1]))
    raise FileNotFoundError(f"no cgroup2 filesystem mounted (searched {mounts_path})")


def own_cgroup_path(tid: int | None = None, proc: Path | str = "/proc") -> str:
    """Our cgroup v2 path relative to the mount ("/user.slice/..."), or that of our thread
    ``tid``; NoCgroupV2Error if the kernel lists none."""
    cgroup_file = Path(proc) / "self" / ("cgroup" if tid is None else f"task/{tid}/cgroup")
    for line in cgroup_file.read_text(encoding="utf-8").splitlines():
        if line.startswith("0::"):
            return line[3:]
    raise NoCgroupV2Error(f"{cgroup_file} has no cgroup v2 ('0::') line")


def own_cgroup_id(tid: int | None = None, mounts_path: Path | str = DEFAULT_MOUNTS_PATH) -> int:
    """Id of our cgroup (or of our thread ``tid``'s): what ``bpf_get_current_cgroup_id()``
    returns in our context."""
    return directory_id(find_cgroup2_mount(mounts_path) / own_cgroup_path(tid).lstrip("/"))


def directory_id(directory: Path | str) -> int:
    """Id of the cgroup at a filesystem path (its directory's inode)."""
    return os.stat(directory).st_ino


class CgroupResolver:
    """Names cgroup ids as paths relative to the cgroup2 mount ("/", "/tailsight/feed").

    Cached (bounded, least recently used dropped first); an id not in the cache triggers at most
    one walk of the hierarchy per call, and ids still not found (removed cgroups) are "unknown".
    """

    def __init__(self, root: Path | str, max_entries: int = 4096) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be >= 1")
        self.root = Path(root)
        self.max_entries = max_entries
        self.walks = 0
        self._cache: OrderedDict[int, str] = OrderedDict()

    def resolve(self, cgroup_id: int) -> str:
        """Path of one cgroup id, or "unknown"."""
        return self.resolve_many([cgroup_id])[cgroup_id]

    def resolve_many(self, cgroup_ids: Iterable[int]) -> dict[int, str]:
        """Paths of several ids with at most one walk for all the misses together."""
        wanted = list(dict.fromkeys(cgroup_ids))
        missing = [i for i in wanted if i not in self._cache]
        found: dict[int, str] = {}
        if missing:
            tree = dict(self.walk())
            self.walks += 1
            found = {i: tree[i] for i in missing if i in tree}
        result: dict[int, str] = {}
        for cgroup_id in wanted:
            path = self._cache.get(cgroup_id) or found.get(cgroup_id)
            if path is None:
                result[cgroup_id] = UNKNOWN
                continue
            self._remember(cgroup_id, path)
            result[cgroup_id] = path
        return result

    def gone(self, cgroup_ids: Iterable[int]) -> set[int]:
        """The ids whose cgroup no longer exists (removed; ids are never reused): a cached path
        is checked with one stat, the rest (and renamed ones) with at most one walk."""
        unsure = []
        for cgroup_id in cgroup_ids:
            path = self._cache.get(cgroup_id)
            try:
                if path is not None and os.stat(self.absolute(path)).st_ino == cgroup_id:
                    continue
            except OSError:
                pass
            self._cache.pop(cgroup_id, None)
            unsure.append(cgroup_id)
        if not unsure:
            return set()
        present = {cgroup_id for cgroup_id, _ in self.walk()}
        self.walks += 1
        return {cgroup_id for cgroup_id in unsure if cgroup_id not in present}

    def walk(self, start: str = ROOT_PATH) -> Iterator[tuple[int, str]]:
        """Every (id, path) from ``start`` down, ``start`` first; vanished dirs are skipped."""
        start = normalize(start)
        try:
            yield os.stat(self.absolute(start)).st_ino, start
        except FileNotFoundError:
            return
        stack = [(self.absolute(start), "" if start == ROOT_PATH else start)]
        while stack:
            directory, relative = stack.pop()
            try:
                entries = list(os.scandir(directory))
            except (FileNotFoundError, NotADirectoryError, PermissionError):
                continue  # a cgroup removed during the walk is normal
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    path = f"{relative}/{entry.name}"
                    yield entry.inode(), path
                    stack.append((Path(entry.path), path))

    def id_of(self, path: str) -> int:
        """Id of the cgroup at a path relative to the root; FileNotFoundError if none."""
        return directory_id(self.absolute(path))

    def subtree_ids(self, path: str) -> dict[int, str]:
        """Ids and paths of a cgroup and all its descendants (for --cgroup filters)."""
        return dict(self.walk(path))

    def absolute(self, path: str) -> Path:
        """Filesystem path of a cgroup path relative to the root."""
        return self.root / normalize(path).lstrip("/")

    def _remember(self, cgroup_id: int, path: str) -> None:
        self._cache[cgroup_id] = path
        self._cache.move_to_end(cgroup_id)
        while len(self._cache) > self.max_entries:
            self._cache.popitem(last=False)


def normalize(path: str) -> str:
    """ "a/b/", "/a//b" -> "/a/b"; "" and "/" -> "/"."""
    parts = [p for p in path.split("/") if p]
    if any(p in (".", "..") for p in parts):
        raise ValueError(f"cgroup path {path!r} must not contain '.' or '..'")
    return "/" + "/".join(parts)


def is_within(path: str, ancestor: str) -> bool:
    """Whether cgroup `path` is `ancestor` or below it."""
    path, ancestor = normalize(path), normalize(ancestor)
    return ancestor == ROOT_PATH or path == ancestor or path.startswith(ancestor + "/")
