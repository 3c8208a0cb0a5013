"""CPU / NUMA-node migrations and NUMA balancing per cgroup of the migrated task: user side of
``migration.bpf.c`` (what it counts and how it attributes is documented there).

Counters (``Snapshot.counters``; cgroup values are ids until ``to_document``):
``task_migrations{cgroup}``, ``task_migrations_cross_node{cgroup}``, ``numa_task_moves{cgroup}``,
``numa_task_swaps{cgroup}``, ``numa_task_sticks{cgroup}``, ``migration_dropped_events{reason}``,
and host-wide page migration from /proc/vmstat as ``host_<vmstat name>{scope="host"}``.
"""

from __future__ import annotations

import ctypes
import os
import re
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import numpy as np

from tailsight.probes.base import CounterInfo, Labels, ProbeInfo, Snapshot, labels
from tailsight.probes.bccprobe import (
    BccProbe,
    MappedArray,
    drops_help,
    release_slots,
    set_config,
    slot_ids,
    steer_slot_hint,
)
from tailsight.probes.btf import Btf, BtfError
from tailsight.probes.offsets import TASK_CPU_CANDIDATES, OffsetCheckError
from tailsight.probes.topology import DEFAULT_SYSFS_ROOT, CpuTopology, possible_cpu_ids

PROBE_NAME: Final = "migration"
# KIND_* in migration.bpf.c -> counter name.
TASK_MIGRATIONS: Final = "task_migrations"
CROSS_NODE_MIGRATIONS: Final = "task_migrations_cross_node"
NUMA_MOVES: Final = "numa_task_moves"
KINDS: Final = (
    TASK_MIGRATIONS,
    CROSS_NODE_MIGRATIONS,
    NUMA_MOVES,
    "numa_task_swaps",
    "numa_task_sticks",
)
DROPPED: Final = "migration_dropped_events"
DROP_REASONS: Final = ("counter_full", "cpu_out_of_range")
REQUIRED_TRACEPOINT: Final = "sched_migrate_task"
# Host-wide page migration counters (not per cgroup: the kernel keeps them per host/node only).
VMSTAT_COUNTERS: Final = ("pgmigrate_success", "pgmigrate_fail", "numa_pages_migrated")
_VMSTAT_LINE: Final = re.compile(
    rb"^(%b) (\d+)$" % b"|".join(n.encode() for n in VMSTAT_COUNTERS), re.M
)
HOST_PREFIX: Final = "host_"
HOST_LABELS: Final = labels(scope="host")
INFO: Final = ProbeInfo(
    name=PROBE_NAME,
    title="CPU and NUMA migrations",
    tracepoints=("sched_migrate_task", "sched_move_numa", "sched_swap_numa", "sched_stick_numa"),
    counters=(
        CounterInfo(KINDS[0], "Tasks of the cgroup moved to another CPU."),
        CounterInfo(KINDS[1], "Moves to a CPU of another NUMA node."),
        CounterInfo(KINDS[2], "NUMA balancing moves of a task to its preferred node."),
        CounterInfo(KINDS[3], "NUMA balancing swaps of two tasks between nodes."),
        CounterInfo(KINDS[4], "NUMA balancing moves or swaps of a task that failed (it stays)."),
        CounterInfo(DROPPED, drops_help("Events", DROP_REASONS)),
        *(
            CounterInfo(HOST_PREFIX + name, f"The host's {name} from /proc/vmstat (all cgroups).")
            for name in VMSTAT_COUNTERS
        ),
    ),
)
MAX_CPUS: Final = 8192  # MIGRATION_MAX_CPUS in migration.bpf.c
MAX_SLOTS: Final = 1024
"""Cgroups the probe tells apart (-DMIGRATION_MAX_SLOTS): one 64-byte counter row each per CPU
(64 KiB per CPU), plus an 8-entry slot cache per CPU."""
KINDS_ROW: Final = 8  # counters per slot row in migration.bpf.c
COUNTS_BYTES_PER_CPU: Final = MAX_SLOTS * KINDS_ROW * 8
"""What each CPU adds to migration_counts (an array, yet one row per CPU and slot)."""
# migration_config words (0 is the cgroup filter's).
_CONFIG_SELFCHECK_TID: Final = 1
_CONFIG_CROSS_NODE: Final = 2


def read_vmstat(proc_root: Path | str = "/proc") -> dict[str, int]:
    """The VMSTAT_COUNTERS this kernel has (``<proc_root>/vmstat``); missing ones are left out."""
    try:
        text = (Path(proc_root) / "vmstat").read_bytes()
    except OSError:
        return {}
    # One search for three names among ~190 lines: splitting them all was ~2/5 of a read.
    return {name.decode(): int(value) for name, value in _VMSTAT_LINE.findall(text)}


def resolve_task_cpu_offset(btf: Any) -> int:
    """Byte offset of the task's CPU field: the first of TASK_CPU_CANDIDATES that BTF has."""
    tried = []
    for struct, path in TASK_CPU_CANDIDATES:
        try:
            return int(btf.member(struct, path).byte_offset)
        except BtfError as error:
            tried.append(f"{struct}.{path}: {error}")
    raise OffsetCheckError("cannot resolve TASK_CPU_OFF: " + "; ".join(tried))


class MigrationProbe(BccProbe):
    """Loads, attaches, self-checks and reads the migration probe.

    ``topology``: CPU -> NUMA node map for the cross-node counter (default: read from
    ``sysfs_root``).  ``cgroup_ids``: count only tasks of these cgroups (None: all).
    """

    name = PROBE_NAME
    drop_reasons = DROP_REASONS

    def __init__(
        self,
        topology: CpuTopology | None = None,
        cgroup_ids: Iterable[int] | None = None,
        *,
        sysfs_root: Path | str = DEFAULT_SYSFS_ROOT,
        proc_root: Path | str = "/proc",
        self_check: bool = True,
        task_cpu_offset_override: int | None = None,
    ) -> None:
        super().__init__(cgroup_ids)
        self._topology = topology
        self._sysfs_root = Path(sysfs_root)
        self._proc_root = Path(proc_root)
        self._self_check = self_check
        self._cpu_offset: int | None = task_cpu_offset_override
        self._cpu_ids = 0
        """Counter rows per slot (-DMIGRATION_NR_CPUS), set at attach."""
        self.tracepoints: tuple[str, ...] = ()
        """The tracepoints attached (NUMA ones only where the kernel has them); () detached."""
        self.cpu_offset_verified = False

    @property
    def topology(self) -> CpuTopology:
        if self._topology is None:
            self._topology = CpuTopology.from_sysfs(self._sysfs_root)
        return self._topology

    def attach_tracepoints(self) -> Sequence[str]:
        """NUMA-balancing tracepoints the kernel lacks (no ``btf_trace_<name>``) are left out;
        sched_migrate_task is required."""
        btf = Btf.load()
        self.tracepoints = tuple(
            tp for tp in INFO.tracepoints if tp == REQUIRED_TRACEPOINT or _has_tracepoint(btf, tp)
        )
        return self.tracepoints

    def extra_cflags(self) -> list[str]:
        self._cpu_ids = possible_cpu_ids()  # the real kernel's, whatever topology is loaded
        if self._cpu_offset is None:
            self._cpu_offset = resolve_task_cpu_offset(Btf.load())
        return [
            f"-DTASK_CPU_OFF={self._cpu_offset}",
            f"-DMIGRATION_MAX_SLOTS={MAX_SLOTS}",
            f"-DMIGRATION_NR_CPUS={self._cpu_ids}",
        ]

    def prepare(self, bpf: Any) -> None:
        self.load_topology(self.topology)

    def self_check(self, bpf: Any) -> None:
        """The CPU offset, read on our own thread moved between CPUs (OffsetCheckError)."""
        if self._self_check:
            assert self._cpu_offset is not None
            self.cpu_offset_verified = check_task_cpu_offset(bpf, self._cpu_offset)

    def load_topology(self, topology: CpuTopology) -> None:
        """Replace the kernel CPU -> node map (CPUs not in ``topology`` count as node 0)."""
        self._topology = topology
        if self._bpf is None:
            return
        table = self._bpf[b"migration_cpu_node"]
        too_big = [cpu for cpu in topology.cpu_node if not 0 <= cpu < MAX_CPUS]
        if too_big:
            raise ValueError(f"CPUs beyond the node map ({MAX_CPUS}): {too_big[:5]}")
        for cpu in range(MAX_CPUS):
            node = topology.node_of(cpu)
            if node or cpu in topology.cpu_node:
                table[ctypes.c_int(cpu)] = ctypes.c_uint32(node)
        # Unmapped CPUs are node 0: with every node 0 no move crosses nodes, and the program
        # skips the map.
        set_config(self._bpf, PROBE_NAME, _CONFIG_CROSS_NODE, any(topology.cpu_node.values()))

    def read(self) -> Snapshot:
        """Cumulative per-cgroup counters, drops and host-wide page migration, as of now."""
        bpf = self._require_bpf()
        taken_ns = time.time_ns()
        counters: dict[tuple[str, Labels], int] = {}
        cgroup_of = slot_ids(bpf[b"migration_slots"])
        slots = sorted(cgroup_of)
        steer_slot_hint(bpf, PROBE_NAME, slots, 0, MAX_SLOTS)
        rows = self._mapped_counts().array[:, slots, : len(KINDS)].sum(axis=0)
        for row, slot in zip(rows, slots, strict=True):
            for kind in row.nonzero()[0]:
                counters[(KINDS[kind], labels(cgroup=cgroup_of[slot]))] = int(row[kind])
        counters.update(self.drop_counters())
        for name, value in read_vmstat(self._proc_root).items():
            counters[(HOST_PREFIX + name, HOST_LABELS)] = value
        return Snapshot(PROBE_NAME, taken_ns, {}, counters)

    def forget(self, cgroup_ids: set[int]) -> None:
        """Clear removed cgroups' counter rows and give their slots back."""
        bpf = self._require_bpf()
        table = bpf[b"migration_slots"]
        gone = sorted(
            slot for slot, cgroup_id in slot_ids(table).items() if cgroup_id in cgroup_ids
        )
        if gone:
            self._mapped_counts().zero(np.s_[:, gone])
            release_slots(bpf, PROBE_NAME, [table.Key(cgroup_id) for cgroup_id in cgroup_ids])

    def _mapped_counts(self) -> MappedArray:
        return self.mapped("migration_counts", np.uint64, (self._cpu_ids, MAX_SLOTS, KINDS_ROW))

    def close(self) -> None:
        """Detach and free the maps; safe to call twice."""
        super().close()
        self.tracepoints = ()


def _has_tracepoint(btf: Any, name: str) -> bool:
    try:
        btf.tracepoint_args(name)
    except BtfError:
        return False
    return True


def _kernel_tid(tid: int) -> int:
    """Outermost pid of a thread (``NSpid:``): what the kernel's task->pid holds."""
    try:
        for line in Path(f"/proc/self/task/{tid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return tid


def check_task_cpu_offset(bpf: Any, cpu_offset: int) -> bool:
    """Move a thread of ours from one CPU to another and check the probe saw exactly that.

    Returns False (nothing to check) with fewer than two CPUs to move between, where no task
    can migrate; raises OffsetCheckError on any disagreement.
    """
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return False
    source_cpu, dest_cpu = cpus[0], cpus[1]
    outcome: list[Any] = []

    def move_self() -> None:
        try:
            tid = _kernel_tid(threading.get_native_id())
            os.sched_setaffinity(0, {source_cpu})  # 0: the calling thread
            set_config(bpf, PROBE_NAME, _CONFIG_SELFCHECK_TID, tid)
            bpf[b"migration_selfcheck_record"].clear()
            os.sched_setaffinity(0, {dest_cpu})
            outcome.append(bpf[b"migration_selfcheck_record"][ctypes.c_int(0)])
        except BaseException as error:
            outcome.append(error)
        finally:
            set_config(bpf, PROBE_NAME, _CONFIG_SELFCHECK_TID, 0)

    worker = threading.Thread(target=move_self, name="tailsight-cpucheck")
    worker.start()
    worker.join()
    record = outcome[0]
    if isinstance(record, BaseException):
        raise record
    seen = (int(record.hits), int(record.src_cpu), int(record.dest_cpu))
    if seen[0] < 1 or seen[1:] != (source_cpu, dest_cpu):
        raise OffsetCheckError(
            f"task CPU offset TASK_CPU_OFF={cpu_offset} disagrees with a migration of our own "
            f"thread from CPU {source_cpu} to {dest_cpu}: saw {seen[0]} migrations, last "
            f"{seen[1]} -> {seen[2]}; refusing to use it"
        )
    return True


def expected_tracepoint_args() -> Mapping[str, Sequence[str]]:
    """The raw tracepoint signatures migration.bpf.c reads (``ctx->args[i]``), for BTF checks."""
    task = "struct task_struct *"
    return {
        "sched_migrate_task": [task, "int"],
        "sched_move_numa": [task, "int", "int"],
        "sched_swap_numa": [task, "int", task, "int"],
        "sched_stick_numa": [task, "int", task, "int"],
    }
