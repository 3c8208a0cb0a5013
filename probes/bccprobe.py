"""What the bcc-based probes share: compile with verified offsets, attach their raw
tracepoints all or nothing, keep the kernel cgroup allow-list, expose program fds, close."""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Hashable, Iterable, Sequence
from types import TracebackType
from typing import Any, Self, TypeVar

from tailsight.hist import Histogram
from tailsight.probes.base import Snapshot
from tailsight.probes.outliers import OutlierStream, outlier_cflags

SeriesKey = TypeVar("SeriesKey", bound=Hashable)


def read_histograms(
    bucket_map: Any,
    totals_map: Any,
    series_of_cell: Callable[[Any], SeriesKey],
    series_of_totals: Callable[[Any], SeriesKey],
) -> dict[SeriesKey, Histogram]:
    """User side of ``hist.bpf.h``: (series, bucket) -> count cells plus per-series totals,
    read from their bcc tables into one cumulative Histogram per series."""
    histograms: dict[SeriesKey, Histogram] = {}

    def histogram(series: SeriesKey) -> Histogram:
        hist = histograms.get(series)
        if hist is None:
            hist = histograms[series] = Histogram.empty()
        return hist

    for cell, count in bucket_map.items():
        histogram(series_of_cell(cell)).add_bucket(int(cell.bucket), int(count.value))
    for series, totals in totals_map.items():
        histogram(series_of_totals(series)).sum_ns = int(totals.sum_ns)
    return histograms


def hash_map_fill(bpf: Any) -> dict[str, float]:
    """Entries / max entries of each plain hash map the probe has opened (an LRU map evicts
    instead of filling up, so it is left out); counting walks the keys."""
    from bcc.table import BPF_MAP_TYPE_HASH

    return {
        (name.decode() if isinstance(name, bytes) else str(name)): len(table) / table.max_entries
        for name, table in bpf.tables.items()
        if table.ttype == BPF_MAP_TYPE_HASH and table.max_entries
    }


def sync_cgroup_allow(table: Any, wanted: set[int]) -> None:
    """Make a probe's ``<name>_cgroup_allow`` hash hold exactly the ``wanted`` cgroup ids."""
    present = {key.value for key in table}
    for cgroup_id in present - wanted:
        del table[table.Key(cgroup_id)]
    for cgroup_id in wanted - present:
        table[table.Key(cgroup_id)] = ctypes.c_uint8(1)


class BccProbe:
    """Base of a probe ``probes/<name>.bpf.c`` whose programs are ``on_<tracepoint>``.

    Subclasses set ``name``/``tracepoints`` and implement ``read``.  With a cgroup filter the
    source is compiled with ``-D<NAME>_CGROUP_FILTER`` and ``<name>_cgroup_allow`` holds the ids.
    """

    name: str
    tracepoints: Sequence[str]

    def __init__(
        self,
        cgroup_ids: Iterable[int] | None,
        outlier_floor_ns: int,
        outlier_rate_per_s: int,
    ) -> None:
        self._filter = None if cgroup_ids is None else set(cgroup_ids)
        self._outlier_cflags = outlier_cflags(outlier_floor_ns, outlier_rate_per_s)
        self._bpf: Any = None
        self._attached: Any = None
        self.outliers: OutlierStream | None = None

    def extra_cflags(self) -> list[str]:
        """Probe specific -D flags (offsets beyond task.bpf.h's, syscall numbers...)."""
        return []

    def outlier_detail(self) -> tuple[str, Callable[[int], str]] | None:
        """Label for the outlier events' detail field (None: the probe sets none)."""
        return None

    def attach(self) -> None:
        """Compile with verified offsets and attach every tracepoint (all or nothing)."""
        from tailsight.probes.loader import attach_raw_tracepoints, compile_probe

        if self._bpf is not None:
            return
        cflags = [*self.extra_cflags(), *self._outlier_cflags]
        if self._filter is not None:
            cflags.append(f"-D{self.name.upper()}_CGROUP_FILTER")
        bpf = compile_probe(self.name, cflags)
        try:
            self._bpf = bpf
            self.outliers = OutlierStream(bpf, self.name, self.outlier_detail())
            if self._filter is not None:
                self._sync_filter()
            self._attached = attach_raw_tracepoints(bpf, self.name, self.tracepoints)
        except BaseException:
            self._bpf = self.outliers = None
            bpf.cleanup()
            raise

    def set_cgroup_filter(self, cgroup_ids: Iterable[int] | None) -> None:
        """Record only these cgroup ids (None: all).

        Before ``attach`` this chooses whether the filter is compiled in; once attached, only
        the id set can change (ValueError on switching between None and a set).
        """
        wanted = None if cgroup_ids is None else set(cgroup_ids)
        if self._bpf is not None and (wanted is None) != (self._filter is None):
            raise ValueError(f"{self.name}: cgroup filtering on/off is fixed at attach")
        self._filter = wanted
        if self._bpf is not None and wanted is not None:
            self._sync_filter()

    def _sync_filter(self) -> None:
        assert self._filter is not None
        sync_cgroup_allow(self._bpf[f"{self.name}_cgroup_allow".encode()], self._filter)

    def _require_bpf(self) -> Any:
        if self._bpf is None:
            raise RuntimeError(f"probe {self.name} not attached")
        return self._bpf

    def read(self) -> Snapshot:
        raise NotImplementedError

    def program_fds(self) -> dict[str, int]:
        """Program fd per attached tracepoint (for BPF run-time stats via /proc/self/fdinfo)."""
        bpf = self._require_bpf()
        return {tp: bpf.funcs[f"on_{tp}".encode()].fd for tp in self.tracepoints}

    def map_fill(self) -> dict[str, float]:
        """Fill ratio per hash map (a full map drops events: see the drop counters)."""
        return hash_map_fill(self._require_bpf())

    def close(self) -> None:
        """Detach and free the maps; safe to call twice."""
        if self._attached is not None:
            self._attached.close()
            self._attached = None
        if self._bpf is not None:
            self._bpf.cleanup()
            self._bpf = self.outliers = None

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
