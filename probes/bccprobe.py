"""The one lifecycle of every probe: compile with verified offsets, attach its tracepoints all
or nothing (tp_btf where the kernel allows, else raw tracepoints), self-check, keep the kernel
cgroup filter, map arrays for reading, expose program fds, close."""

from __future__ import annotations

import ctypes
import errno
import math
import mmap
from collections.abc import Callable, Iterable, Sequence
from types import TracebackType
from typing import Any, Final, Self

import numpy as np
import numpy.typing as npt

from tailsight.probes.base import HistogramRows, K, Labels, Snapshot, labels
from tailsight.probes.loader import (
    attach_best,
    compile_probe,
    read_program_stats,
    require_bpf_privileges,
)
from tailsight.probes.outliers import (
    DEFAULT_OUTLIER_FLOOR_NS,
    DEFAULT_OUTLIER_RATE_PER_S,
    OutlierStream,
    outlier_cflags,
)


class MappedArray:
    """A ``BPF_F_MMAPABLE`` array map as a numpy array: reading is a memory copy, not a
    syscall per entry (a bcc table read costs ~10 µs per entry).  ``array`` is read-only;
    ``zero`` clears the rows of a removed cgroup's slot before the slot is given back."""

    def __init__(self, table: Any, dtype: npt.DTypeLike, shape: tuple[int, ...]) -> None:
        size_bytes = table.max_entries * ctypes.sizeof(table.Leaf)
        length = -(-size_bytes // mmap.PAGESIZE) * mmap.PAGESIZE
        self._mmap: mmap.mmap | None = mmap.mmap(
            table.map_fd, length, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE
        )
        count = math.prod(shape)
        if np.dtype(dtype).itemsize * count != size_bytes:
            raise ValueError(f"{shape} of {dtype} does not cover the map's {size_bytes} bytes")
        self._writable = np.frombuffer(self._mmap, dtype=dtype, count=count).reshape(shape)
        self.array: npt.NDArray[Any] = self._writable.view()
        self.array.flags.writeable = False

    def zero(self, index: Any) -> None:
        """Clear ``array[index]`` (only for slots nothing in the kernel writes any more)."""
        self._writable[index] = 0

    def close(self) -> None:
        if self._mmap is not None:
            del self.array, self._writable
            self._mmap.close()
            self._mmap = None


def slot_histograms(
    keys: Sequence[K], rows: npt.NDArray[np.uint64], sums_ns: Sequence[int]
) -> HistogramRows[K]:
    """The histograms of the slot rows that hold an observation, under their keys (``keys[i]``
    is row i's), from rows of a ``HIST_ROW`` array (finite buckets, then overflow) and the exact
    sums beside them (``hist.bpf.h``'s bucket layout). The block is checked once (each row's
    total fits in int64), not row by row: a busy host's read holds hundreds."""
    peaks = rows.max(axis=1)
    # A row's total is at most its width times its largest count: below that bound no total
    # can reach 2^63, and the float sums (six times the cost of the maxima) are not needed.
    if peaks.size and int(peaks.max()) >= 2**63 // rows.shape[1]:
        totals = rows.sum(axis=1, dtype=np.float64)
        if float(totals.max()) >= 2.0**63:
            raise ValueError("bucket count does not fit in int64")
    kept = np.flatnonzero(peaks).tolist()
    # Reinterpreted as int64 (every count is below 2^63, checked above); copied only if rows
    # are left out: a copy of hundreds of rows costs a page fault per 4 KiB.
    counts = np.ascontiguousarray(rows).view(np.int64)
    if len(kept) < len(keys):
        counts = counts[kept]
    return HistogramRows([keys[row] for row in kept], counts, [int(sums_ns[row]) for row in kept])


def table_items(table: Any) -> list[tuple[Any, Any]]:
    """Every (key, value) of a bcc hash table: one ``BPF_MAP_LOOKUP_BATCH`` syscall (walking the
    keys costs two syscalls and ~10 µs per entry); the walk where the kernel has no batch ops
    (before 5.6)."""
    try:
        batch = list(table.items_lookup_batch())
    except Exception:  # bcc raises a bare Exception with the errno's text
        return list(table.items())
    # An array of a plain C integer type hands back Python ints: wrap them as the walk does.
    key, leaf = table.Key, table.Leaf
    return [
        (key(k) if isinstance(k, int) else k, leaf(v) if isinstance(v, int) else v)
        for k, v in batch
    ]


def slot_ids(table: Any) -> dict[int, int]:
    """slot -> cgroup id (or any u64 key) from a probe's ``<name>_slots`` hash."""
    return {int(slot.value): int(key.value) for key, slot in table_items(table)}


def cgroup_slots(bpf: Any, prefix: str, cgroup_ids: set[int]) -> list[tuple[Any, int]]:
    """The (key, slot) entries of ``<prefix>_slots`` whose key's ``cgroup_id`` is one of
    ``cgroup_ids``: the series a probe's ``forget`` zeroes and releases."""
    return [
        (key, int(slot.value))
        for key, slot in table_items(bpf[f"{prefix}_slots".encode()])
        if int(key.cgroup_id) in cgroup_ids
    ]


def release_slots(bpf: Any, prefix: str, keys: Iterable[Any]) -> list[int]:
    """Give back the slots of these ``<prefix>_slots`` keys (their rows already zeroed):
    unmapped, unclaimed, and the claim hint moved down to the lowest freed slot so that the
    kernel's next claim (a no-exist insert walking up from the hint) finds it.  The slots ->
    list of freed slots.  A CPU's slot cache may still name a removed cgroup: harmless, since
    cgroup ids are never reused."""
    slots = bpf[f"{prefix}_slots".encode()]
    owner = bpf[f"{prefix}_slot_owner".encode()]
    freed = []
    for key in keys:
        try:
            slot = int(slots[key].value)
            del slots[key]
            del owner[owner.Key(slot)]
        except KeyError:
            continue
        freed.append(slot)
    if freed:
        move_slot_hint(bpf, prefix, min(freed))
    return freed


def delete_where(table: Any, doomed: Callable[[Any], bool]) -> None:
    """Delete the entries of a bcc hash table whose key is ``doomed``."""
    for key in [key for key, _ in table_items(table) if doomed(key)]:
        try:
            del table[key]
        except KeyError:
            continue


SLOT_CLAIM_TRIES: Final = 16
"""Slots the kernel tries from the hint for one new key (SLOT_CLAIM_TRIES in slots.bpf.h)."""
STEER_RUN: Final = 32
"""New keys the claim hint should be able to take before the next read (a burst of new cgroups:
a churn of 11 cgroups x 2 syscalls in one interval once lost a whole series with 8)."""


def steer_slot_hint(bpf: Any, prefix: str, used: Iterable[int], first: int, limit: int) -> None:
    """Keep the kernel's claim hint where its claims succeed. A claim walks SLOT_CLAIM_TRIES
    slots up from the hint (slots.bpf.h) and leaves the hint after the slot it took: after slots
    are given back in the middle, a hint before a long stretch of used slots would drop every
    new key until the next read. The hint stays if STEER_RUN claims in a row from it succeed
    (or as many as from any slot), else moves to the lowest free slot from which they do."""
    hint = bpf[f"{prefix}_slot_hint".encode()]
    zero = hint.Key(0)
    taken = set(used)
    current = max(int(hint[zero].value), first)
    if current + STEER_RUN <= limit and taken.isdisjoint(range(current, current + STEER_RUN)):
        return  # the usual case, decided without walking every slot: the hint is good
    claims = claim_runs(taken, first, limit)
    free = [slot for slot in range(first, limit) if claims[slot - first] and slot not in taken]
    if not free:
        return
    want = min(STEER_RUN, max(claims[slot - first] for slot in free))
    if current < limit and claims[current - first] >= want:
        return
    hint[zero] = hint.Leaf(next(slot for slot in free if claims[slot - first] >= want))


def claim_runs(taken: set[int], first: int, limit: int) -> list[int]:
    """For each hint in [first, limit): how many new keys in a row the kernel's claims from it
    would place before one finds no free slot (capped at STEER_RUN)."""
    runs = [0] * (limit - first + 1)
    next_free = None
    for slot in range(limit - 1, first - 1, -1):
        if slot not in taken:
            next_free = slot
        if next_free is not None and next_free - slot < SLOT_CLAIM_TRIES:
            runs[slot - first] = min(STEER_RUN, 1 + runs[next_free + 1 - first])
    return runs[:-1]


def move_slot_hint(bpf: Any, prefix: str, slot: int) -> None:
    """Start the kernel's next slot claim at ``slot`` if that is below the current hint."""
    hint = bpf[f"{prefix}_slot_hint".encode()]
    zero = hint.Key(0)
    if slot < int(hint[zero].value):
        hint[zero] = hint.Leaf(slot)


def hash_map_entries(table: Any) -> int:
    """Entries in a bcc hash table now: ``BPF_MAP_LOOKUP_BATCH`` into one buffer, counted without
    making a Python object per entry (``table_items`` makes two; every scrape counts every map,
    ~1 µs an entry on a busy host)."""
    from bcc.libbcc import lib

    if table.max_entries == 0:
        return 0
    keys = (table.Key * table.max_entries)()
    values = (table.Leaf * table.max_entries)()
    batch, count = ctypes.c_uint32(0), ctypes.c_uint32(0)
    total = 0
    while total < table.max_entries:
        count.value = table.max_entries - total
        result = lib.bpf_lookup_batch(
            table.map_fd,
            ctypes.byref(batch) if total else None,
            ctypes.byref(batch),
            ctypes.byref(keys, ctypes.sizeof(table.Key) * total),
            ctypes.byref(values, ctypes.sizeof(table.Leaf) * total),
            ctypes.byref(count),
        )
        error = ctypes.get_errno()
        total += count.value
        if result != 0 and error == errno.ENOENT:
            break  # the last batch
        if result != 0:  # no batch ops (before 5.6) or another failure: walk the keys
            return len(table_items(table))
        if count.value == 0:  # no progress (a bucket grew meanwhile): as counted so far
            break
    return total


def hash_map_fill(bpf: Any) -> dict[str, float]:
    """Entries / max entries of each plain hash map the probe has opened."""
    from bcc.table import BPF_MAP_TYPE_HASH

    return {
        (name.decode() if isinstance(name, bytes) else str(name)): hash_map_entries(table)
        / table.max_entries
        for name, table in bpf.tables.items()
        if table.ttype == BPF_MAP_TYPE_HASH and table.max_entries
    }


def sync_cgroup_allow(table: Any, wanted: set[int]) -> None:
    """Make a probe's ``<name>_cgroup_allow`` hash hold exactly the ``wanted`` cgroup ids."""
    present = {key.value for key, _ in table_items(table)}
    for cgroup_id in present - wanted:
        del table[table.Key(cgroup_id)]
    for cgroup_id in wanted - present:
        table[table.Key(cgroup_id)] = ctypes.c_uint8(1)


CONFIG_FILTER_ON: Final = 0
"""Slot of ``<name>_config`` that turns the cgroup filter on (every probe's source has it)."""


def set_config(bpf: Any, probe: str, slot: int, value: int) -> None:
    """Write word ``slot`` of the probe's config, u32 words only user space sets.

    ``<probe>_config`` is an array of the words, or a per-CPU array of one value that starts
    with them (``config``) and goes on with that CPU's slot cache, so that an event reads one
    cache line for both (migration).  Each CPU's copy gets the words, and its cache is emptied
    (the value is written whole, while programs on other CPUs may read it: only zeros are
    written there, which the program reads as a miss); an unchanged word is not written, so a
    filter synced every interval does not empty the caches every interval.
    """
    from bcc.table import PerCpuArray

    table = bpf[f"{probe}_config".encode()]
    if not isinstance(table, PerCpuArray):
        table[ctypes.c_int(slot)] = ctypes.c_uint32(value)
        return
    key = ctypes.c_int(0)
    words = list(table[key][0].config)  # the same in every copy: BPF never writes them
    if words[slot] == value:
        return
    words[slot] = value
    fresh = table.Leaf()
    for copy in fresh:
        copy.config[:] = words
    table[key] = fresh


MISSED_RUN: Final = "missed_run"
"""Drop reason of the events the kernel did not run a program for (its ``recursion_misses``:
the program was already running on that CPU, e.g. interrupted by a softirq that fired the same
tracepoint)."""


def drops_help(what: str, reasons: Sequence[str]) -> str:
    """Help text of a probe's ``<name>_dropped_events``: ``what`` was not counted, and why."""
    return f"{what} not counted, by reason ({', '.join((*reasons, MISSED_RUN))})."


class BccProbe:
    """Base of every probe ``probes/<name>.bpf.c`` whose programs are ``on_<tracepoint>``.

    ``attach`` compiles with ``extra_cflags``, lets ``prepare`` fill the maps, attaches
    ``attach_tracepoints()`` and runs ``self_check`` (a failure detaches again); subclasses
    implement ``read`` and ``forget``.  The cgroup filter works alike in every probe and can
    change at any time: ``<name>_config[CONFIG_FILTER_ON]`` turns it on and
    ``<name>_cgroup_allow`` holds the ids it lets through.  Probes whose source has outlier maps
    set ``has_outliers``.
    """

    name: str
    tracepoints: Sequence[str]
    drop_reasons: Sequence[str] = ()
    """Reasons of ``<name>_dropped_events``, the kernel's per-CPU array, in index order."""
    has_outliers: bool = False

    def __init__(
        self,
        cgroup_ids: Iterable[int] | None = None,
        outlier_floor_ns: int = DEFAULT_OUTLIER_FLOOR_NS,
        outlier_rate_per_s: int = DEFAULT_OUTLIER_RATE_PER_S,
    ) -> None:
        self._filter = None if cgroup_ids is None else set(cgroup_ids)
        self._outlier_cflags = outlier_cflags(outlier_floor_ns, outlier_rate_per_s)
        self._bpf: Any = None
        self._attached: Any = None
        self._mapped: dict[str, MappedArray] = {}
        self.outliers: OutlierStream | None = None
        self.attach_mode: str | None = None
        """``tp_btf`` or ``raw_tp`` once attached (None before)."""
        self.attach_fallback: str | None = None
        """Why tp_btf was refused, when it was."""

    # -- what a probe adds to the lifecycle ---------------------------------------------------

    def extra_cflags(self) -> list[str]:
        """Probe specific -D flags (offsets beyond task.bpf.h's, syscall numbers...)."""
        return []

    def attach_tracepoints(self) -> Sequence[str]:
        """The tracepoints to attach (all required): ``tracepoints`` unless the probe picks."""
        return self.tracepoints

    def prepare(self, bpf: Any) -> None:
        """Fill the probe's own maps, before its programs are attached."""

    def self_check(self, bpf: Any) -> None:
        """Prove what the programs read on a known case once attached (raise: not attached)."""

    def outlier_detail(self) -> tuple[str, Callable[[int], str]] | None:
        """Label for the outlier events' detail field (None: the probe sets none)."""
        return None

    # -- the lifecycle ------------------------------------------------------------------------

    def attach(self) -> None:
        """Compile with verified offsets and attach every tracepoint (all or nothing): as tp_btf
        if the kernel takes it, else (or if ``TAILSIGHT_ATTACH_MODE=raw_tp``) as raw
        tracepoints; ``attach_mode`` says which, ``attach_fallback`` why tp_btf was not used.
        Then ``self_check``; if that fails, nothing stays attached."""
        if self._bpf is not None:
            return
        require_bpf_privileges()
        cflags = self.extra_cflags()
        if self.has_outliers:
            cflags += self._outlier_cflags

        def prepare(bpf: Any) -> None:
            self._close_mapped()
            self._bpf = bpf
            if self.has_outliers:
                self.outliers = OutlierStream(bpf, self.name, self.outlier_detail())
            self.prepare(bpf)
            self._sync_filter()

        try:
            bpf, self._attached, self.attach_fallback = attach_best(
                self.name,
                lambda extra: compile_probe(self.name, [*cflags, *extra]),
                prepare,
                self.attach_tracepoints(),
            )
        except BaseException:
            self._close_mapped()
            self._bpf = self.outliers = None
            raise
        self.attach_mode = self._attached.mode
        try:
            self.self_check(bpf)
        except BaseException:
            self.close()
            raise

    def set_cgroup_filter(self, cgroup_ids: Iterable[int] | None) -> None:
        """Record only these cgroup ids (None: all); takes effect at once, attached or not."""
        self._filter = None if cgroup_ids is None else set(cgroup_ids)
        if self._bpf is not None:
            self._sync_filter()

    def _sync_filter(self) -> None:
        bpf = self._bpf
        sync_cgroup_allow(bpf[f"{self.name}_cgroup_allow".encode()], self._filter or set())
        set_config(bpf, self.name, CONFIG_FILTER_ON, self._filter is not None)

    def _close_mapped(self) -> None:
        for mapped in self._mapped.values():
            mapped.close()
        self._mapped.clear()

    def mapped_array(self, map_name: str, dtype: npt.DTypeLike, shape: tuple[int, ...]) -> Any:
        """The probe's mmap-able array ``map_name`` as a live read-only numpy array."""
        return self.mapped(map_name, dtype, shape).array

    def mapped(self, map_name: str, dtype: npt.DTypeLike, shape: tuple[int, ...]) -> MappedArray:
        """The probe's mmap-able array ``map_name`` (mapped once)."""
        mapped = self._mapped.get(map_name)
        if mapped is None:
            table = self._require_bpf()[map_name.encode()]
            mapped = self._mapped[map_name] = MappedArray(table, dtype, shape)
        return mapped

    def forget(self, cgroup_ids: set[int]) -> None:
        """Drop every trace of removed cgroups, in the kernel and here (see ``Probe``)."""
        raise NotImplementedError

    def drop_counters(self) -> dict[tuple[str, Labels], int]:
        """``<name>_dropped_events`` by reason: the program's own (``drop_reasons``) and the
        runs the kernel skipped (MISSED_RUN), each an event missing from the counts."""
        name = f"{self.name}_dropped_events"
        drops = self._require_bpf()[name.encode()]
        counters = {
            (name, labels(reason=reason)): int(drops.sum(index).value)
            for index, reason in enumerate(self.drop_reasons)
        }
        stats = [read_program_stats(fd) for fd in self.program_fds().values()]
        missed = sum(stat.missed_runs for stat in stats if stat is not None)
        counters[(name, labels(reason=MISSED_RUN))] = missed
        return counters

    def _require_bpf(self) -> Any:
        if self._bpf is None:
            raise RuntimeError(f"probe {self.name} not attached")
        return self._bpf

    def read(self) -> Snapshot:
        raise NotImplementedError

    def attachment(self) -> Any:
        """The probe's AttachedProbe (links and program fds), e.g. to detach it for a while."""
        self._require_bpf()
        return self._attached

    def program_fds(self) -> dict[str, int]:
        """Program fd per attached tracepoint (for BPF run-time stats via read_program_stats)."""
        self._require_bpf()
        return dict(self._attached.prog_fds)

    def map_fill(self) -> dict[str, float]:
        """Fill ratio per hash map (a full map drops events: see the drop counters)."""
        return hash_map_fill(self._require_bpf())

    def close(self) -> None:
        """Detach and free the maps; safe to call twice."""
        if self._attached is not None:
            self._attached.close()
            self._attached = None
        self._close_mapped()
        if self._bpf is not None:
            self._bpf.cleanup()
            self._bpf = self.outliers = None
        self.attach_mode = None

    def __enter__(self) -> Self:
        self.attach()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
