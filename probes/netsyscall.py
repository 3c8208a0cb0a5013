"""Socket syscall latency per (cgroup, syscall) as 5 µs histograms, errors per errno, outlier
stacks: user side of ``netsyscall.bpf.c`` (what it measures and attributes is documented there)."""

from __future__ import annotations

import errno
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Final

import numpy as np

from tailsight.probes.base import (
    HIST_ROW,
    CounterInfo,
    Labels,
    ProbeInfo,
    SeriesInfo,
    Snapshot,
    labels,
)
from tailsight.probes.bccprobe import (
    BccProbe,
    cgroup_slots,
    delete_where,
    drops_help,
    release_slots,
    slot_histograms,
    steer_slot_hint,
    table_items,
)
from tailsight.probes.offsets import OffsetCheckError, resolve_offsets
from tailsight.probes.outliers import (
    DEFAULT_OUTLIER_FLOOR_NS,
    DEFAULT_OUTLIER_RATE_PER_S,
    outlier_counters,
)
from tailsight.probes.syscalls import net_syscall_numbers, syscall_nr_field

PROBE_NAME: Final = "netsyscall"
# Index i of the kernel's netsyscall_dropped_events array (DROP_* in netsyscall.bpf.c).
DROP_REASONS: Final = ("thread_collision", "series_full", "error_full")
MAX_SERIES: Final = 512
"""(cgroup, syscall) series the probe can tell apart: 8.4 MiB of histogram rows shared by all
CPUs (-DNETSYSCALL_MAX_SERIES)."""
ERRORS: Final = "netsyscall_errors"
DROPPED: Final = "netsyscall_dropped_events"
INFO: Final = ProbeInfo(
    name=PROBE_NAME,
    title="socket syscall time",
    tracepoints=("sys_enter", "sys_exit"),
    series=(
        SeriesInfo(
            "syscall",
            "socket syscall time",
            "Time in a socket syscall (send/recv family), entry to exit, by cgroup and syscall.",
            ("syscall",),
        ),
    ),
    counters=(
        CounterInfo(ERRORS, "Socket syscalls that returned an error, by syscall and errno."),
        CounterInfo(DROPPED, drops_help("Calls", DROP_REASONS)),
        *outlier_counters(PROBE_NAME),
    ),
)


def errno_name(value: int) -> str:
    """``EAGAIN`` for 11; the number itself for one Python does not know."""
    return errno.errorcode.get(value, str(value))


class NetSyscallProbe(BccProbe):
    """Loads, attaches and reads the socket syscall probe.

    ``cgroup_ids``: if given, only calls from exactly these cgroup ids are recorded.  Calls
    slower than ``max(outlier_floor_ns, P99 bucket of the cgroup)`` become outlier events with
    the caller's stacks, at most ``outlier_rate_per_s`` per CPU.
    """

    name = PROBE_NAME
    tracepoints = INFO.tracepoints
    drop_reasons = DROP_REASONS
    has_outliers = True

    def __init__(
        self,
        cgroup_ids: Iterable[int] | None = None,
        outlier_floor_ns: int = DEFAULT_OUTLIER_FLOOR_NS,
        outlier_rate_per_s: int = DEFAULT_OUTLIER_RATE_PER_S,
    ) -> None:
        super().__init__(cgroup_ids, outlier_floor_ns, outlier_rate_per_s)
        self.numbers = net_syscall_numbers()
        self._names = {number: name for name, number in self.numbers.items()}

    def extra_cflags(self) -> list[str]:
        """Syscall numbers of this architecture and the BTF offset of the pt_regs member
        holding the syscall number (read at sys_exit)."""
        field = syscall_nr_field()
        offsets = resolve_offsets(fields={"PT_REGS_SYSCALL_NR_OFF": ("pt_regs", field)})
        if offsets["PT_REGS_SYSCALL_NR_OFF"] % 4:
            raise OffsetCheckError(f"pt_regs.{field} is not 4-byte aligned")
        flags = [f"-D{macro}={value}" for macro, value in offsets.items()]
        flags += [f"-DNR_{name.upper()}={number}" for name, number in self.numbers.items()]
        return [*flags, f"-DNETSYSCALL_MAX_SERIES={MAX_SERIES}"]

    def outlier_detail(self) -> tuple[str, Callable[[int], str]]:
        """Outlier events carry the syscall: at sys_exit the kernel stack no longer shows it."""
        return ("syscall", self.syscall_name)

    def syscall_name(self, number: int) -> str:
        return self._names.get(number, str(number))

    def read(self) -> Snapshot:
        """Cumulative latency per (cgroup, syscall), errors per errno, drops, outlier stacks."""
        bpf = self._require_bpf()
        taken_ns = time.time_ns()
        series_of = {
            int(slot.value): (int(key.cgroup_id), int(key.nr))
            for key, slot in table_items(bpf[b"netsyscall_slots"])
        }
        slots = sorted(series_of)
        steer_slot_hint(bpf, PROBE_NAME, slots, 0, MAX_SERIES)
        hist_rows = self.mapped_array("netsyscall_latency_hist", np.uint64, (MAX_SERIES, HIST_ROW))
        sum_ns = self.mapped_array("netsyscall_sum_ns", np.uint64, (MAX_SERIES,))
        # Sums first: a sample lands in its bucket before the sum, so a racing read never has a
        # sum larger than the buckets explain.
        sums = sum_ns[slots]  # fancy indexing copies: one read each
        rows = hist_rows[slots]
        latency = slot_histograms([series_of[slot] for slot in slots], rows, sums.tolist())
        counters: dict[tuple[str, Labels], int] = {}
        for error, count in table_items(bpf[b"netsyscall_errors"]):
            key = labels(
                cgroup=error.cgroup_id,
                syscall=self.syscall_name(error.nr),
                errno=errno_name(error.errno_value),
            )
            counters[(ERRORS, key)] = counters.get((ERRORS, key), 0) + int(count.value)
        counters.update(self.drop_counters())
        assert self.outliers is not None
        self.outliers.drain()
        # Thresholds per cgroup, of all its syscalls together.
        self.outliers.update_thresholds(latency.merged([cgroup_id for cgroup_id, _ in latency]))
        counters.update(self.outliers.counters(PROBE_NAME))
        histograms = latency.with_keys(
            [labels(cgroup=cgroup_id, syscall=self.syscall_name(nr)) for cgroup_id, nr in latency]
        )
        return Snapshot(PROBE_NAME, taken_ns, histograms, counters)

    def forget(self, cgroup_ids: set[int]) -> None:
        """Clear removed cgroups' series rows, give their slots back, drop their errors."""
        bpf = self._require_bpf()
        gone = cgroup_slots(bpf, PROBE_NAME, cgroup_ids)
        if gone:
            rows = sorted(slot for _, slot in gone)
            self.mapped("netsyscall_sum_ns", np.uint64, (MAX_SERIES,)).zero(rows)
            self.mapped("netsyscall_latency_hist", np.uint64, (MAX_SERIES, HIST_ROW)).zero(rows)
            release_slots(bpf, PROBE_NAME, [key for key, _ in gone])
        delete_where(bpf[b"netsyscall_errors"], lambda key: int(key.cgroup_id) in cgroup_ids)
        assert self.outliers is not None
        self.outliers.forget(cgroup_ids)


def expected_tracepoint_args() -> Mapping[str, Sequence[str]]:
    """The raw tracepoint signatures netsyscall.bpf.c reads (``ctx->args[i]``), for BTF checks."""
    return {
        "sys_enter": ["struct pt_regs *", "long int"],
        "sys_exit": ["struct pt_regs *", "long int"],
    }
