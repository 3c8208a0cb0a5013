"""The reclaim probe against the kernel's own counts: a reader in a cgroup with a v1 memory limit
reads a file four times its limit, so its charges over the limit reclaim the cgroup's page cache
(memcg reclaim).  The stall time is compared with the v2 group's PSI memory "some" total
(``psi_memstall_enter`` brackets the very call the tracepoints bracket); the reader is pinned
because PSI weights each CPU's stall by the group's non-idle time there, so a task moving between
CPUs is under-counted.  The count is bounded by ``memory.failcnt`` (v1 keeps no count of reclaim
calls).  The descriptor and labels without a kernel."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tailsight.probes.base import Snapshot, labels
from tailsight.probes.bccprobe import table_items
from tailsight.probes.btf import Btf
from tailsight.probes.catalog import PROBES, create_probe
from tailsight.probes.loader import preferred_attach_modes
from tailsight.probes.reclaim import (
    DROPPED,
    INFO,
    KINDS,
    PAGES_RECLAIMED,
    ReclaimProbe,
    expected_tracepoint_args,
    stall_labels,
)
from tailsight.testing.inject import ResourceLimit
from tailsight.testing.workload import Task, Workload, default_cpu, private_base, python_task

LIMIT_MIB = 16
FILE_MIB = 4 * LIMIT_MIB
"""Read once, sequentially: each page is evicted long before it could be read again, so the
reads are no refaults of a working set (PSI would count those waits as memory stall too)."""
TOLERANCE = 0.10

# Once argv[3] exists (the task is then in its memory group), drops the file argv[2] from the
# page cache (its pages were charged to the writer), reads it in 1 MiB chunks, says done.
READER_CODE = """
import os, sys, time
path, go = sys.argv[2], sys.argv[3]
while not os.path.exists(go): time.sleep(0.005)
fd = os.open(path, os.O_RDONLY)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
while os.read(fd, 1 << 20): pass
print("done", flush=True)
sys.stdin.readline()
"""


# -- without a kernel -----------------------------------------------------------------------------


def test_the_catalog_describes_the_probe() -> None:
    assert PROBES["reclaim"] is INFO
    assert [series.what for series in INFO.series] == list(KINDS)
    assert INFO.series_info({"kind": "memcg"}) is INFO.series[1]
    assert {c.name for c in INFO.counters} == {PAGES_RECLAIMED, DROPPED}


def test_series_labels_name_the_kind() -> None:
    assert stall_labels(7, 0) == labels(cgroup=7, kind="direct")
    assert stall_labels(7, 1) == labels(cgroup=7, kind="memcg")
    assert stall_labels(7, 2) == labels(cgroup=7, kind="compaction")


# -- on the running kernel ------------------------------------------------------------------------


def memory_some_us(v2_dir: Path) -> int:
    """The v2 group's PSI memory "some" total (µs)."""
    for line in (v2_dir / "memory.pressure").read_text().splitlines():
        if line.startswith("some "):
            return int(line.rpartition("total=")[2])
    raise AssertionError(f"no 'some' line in {v2_dir}/memory.pressure")


@pytest.fixture(scope="module")
def probe(kernel_ready: None) -> Iterator[ReclaimProbe]:
    with ReclaimProbe() as attached:
        yield attached


@pytest.fixture
def big_file() -> Iterator[Path]:
    path = Path("/var/tmp") / f"tailsight-reclaim-{os.getpid()}"
    try:
        with path.open("wb") as out:
            block = os.urandom(1 << 20)
            for _ in range(FILE_MIB):
                out.write(block)
            out.flush()
            os.fsync(out.fileno())
        yield path
    finally:
        path.unlink(missing_ok=True)


@pytest.mark.kernel
def test_tracepoint_signatures_match_btf(kernel_ready: None) -> None:
    btf = Btf.load()
    for tracepoint, expected in expected_tracepoint_args().items():
        assert btf.tracepoint_args(tracepoint)[: len(expected)] == list(expected), tracepoint


@pytest.mark.kernel
def test_attaches_every_pair_the_kernel_has(probe: ReclaimProbe) -> None:
    assert probe.attach_mode == preferred_attach_modes()[0]  # tp_btf unless raw_tp is forced
    assert probe.has_compaction  # this kernel has CONFIG_COMPACTION
    assert set(probe.program_fds()) == set(INFO.tracepoints)
    assert isinstance(create_probe("reclaim"), ReclaimProbe)


def _stalls(snapshot: Snapshot, cgroup_id: int) -> dict[str, tuple[int, int]]:
    """kind -> (count, sum_ns) of one cgroup's series."""
    return {
        dict(key)["kind"]: (hist.count, hist.sum_ns)
        for key, hist in snapshot.histograms.items()
        if dict(key)["cgroup"] == cgroup_id
    }


@dataclass(frozen=True)
class Reading:
    """One read of the file under the limit: the probe's interval and the kernel's counts."""

    interval: Snapshot
    cgroup_id: int
    limit_hits: int
    """v1 ``memory.failcnt``: charges that hit the limit, each followed by one reclaim."""
    stall_us: int
    """The v2 group's PSI memory "some" total."""
    pages_in: int
    pages_out: int
    """v1 ``memory.stat`` pgpgin and pgpgout: what was charged, what uncharged (evicted)."""
    elapsed_s: float


def read_under_limit(probe: ReclaimProbe, big_file: Path, tag: str) -> Reading:
    """The reader, pinned, in a fresh cgroup limited to LIMIT_MIB, reads ``big_file`` once."""
    go = big_file.with_suffix(".go")
    reader = python_task("reader", READER_CODE, cpu=default_cpu(), pipes=True)
    task = Task(reader.group, (*reader.argv, str(big_file), str(go)), reader.cpu, reader.pipes)
    try:
        with (
            Workload([task], base=private_base(tag)) as workload,
            ResourceLimit("memory", workload.cgroup_path("reader")) as limit,
        ):
            if not limit.v1:
                pytest.skip("no cgroup v1 memory controller: memory.failcnt is v1's")
            limit.place(workload.pids())
            limit.limit_memory(LIMIT_MIB << 20)
            v2_dir = workload.cgroup_dir("reader")
            failcnt = limit.directory / "memory.failcnt"
            before = probe.read()
            hits, some_us = int(failcnt.read_text()), memory_some_us(v2_dir)
            stat = memory_stat(limit.directory)
            started = time.monotonic()
            go.touch()
            stdout = workload.process("reader").stdout
            assert stdout is not None
            assert stdout.readline() == b"done\n"
            elapsed_s = time.monotonic() - started
            hits = int(failcnt.read_text()) - hits
            some_us = memory_some_us(v2_dir) - some_us
            stat_after = memory_stat(limit.directory)
            pages_in, pages_out = (stat_after[k] - stat[k] for k in ("pgpgin", "pgpgout"))
            after = probe.read()
            return Reading(
                after - before,
                workload.cgroup_id("reader"),
                hits,
                some_us,
                pages_in,
                pages_out,
                elapsed_s,
            )
    finally:
        go.unlink(missing_ok=True)


def memory_stat(directory: Path) -> dict[str, int]:
    pairs = (line.split() for line in (directory / "memory.stat").read_text().splitlines())
    return {name: int(value) for name, value in pairs}


@pytest.mark.kernel
def test_memcg_stalls_agree_with_failcnt_and_psi(probe: ReclaimProbe, big_file: Path) -> None:
    reading = read_under_limit(probe, big_file, "reclaim")
    stalls = _stalls(reading.interval, reading.cgroup_id)
    count, sum_ns = stalls.get("memcg", (0, 0))
    print(
        f"memcg stalls {count} ({sum_ns / 1e6:.3f} ms) in {reading.elapsed_s:.2f} s; "
        f"failcnt +{reading.limit_hits}; PSI memory some +{reading.stall_us / 1e3:.3f} ms; "
        f"pgpgin +{reading.pages_in} pgpgout +{reading.pages_out}; pages reclaimed "
        f"{reading.interval.counters.get((PAGES_RECLAIMED, stall_labels(reading.cgroup_id, 1)))}"
    )
    # v1 keeps no count of reclaim calls: failcnt counts failed charges, the batch of 64 pages
    # first, then the folio itself; every reclaim follows at least one.
    assert 50 <= count <= reading.limit_hits
    # PSI counts the same calls (psi_memstall_enter around try_to_free_mem_cgroup_pages), its
    # window a little wider: 0.4-0.9 µs per stall, 2-7 % of stalls of 7-25 µs.
    assert abs(sum_ns / 1000 - reading.stall_us) <= TOLERANCE * reading.stall_us
    # Most of the file had to be evicted again to fit (reclaim frees the reader's other pages
    # too).
    pages = reading.interval.counters.get((PAGES_RECLAIMED, stall_labels(reading.cgroup_id, 1)))
    assert pages is not None and pages >= (FILE_MIB - LIMIT_MIB) * 256
    dropped = {
        dict(key)["reason"]: value
        for (name, key), value in reading.interval.counters.items()
        if name == DROPPED
    }
    assert dropped == {"series_full": 0, "tasks_full": 0, "unpaired_end": 0, "missed_run": 0}
    # The cgroup is gone: forgetting it clears its rows and gives its slot back.
    probe.forget({reading.cgroup_id})
    assert not _stalls(probe.read(), reading.cgroup_id)
    slots = probe._bpf[b"reclaim_slots"]  # the kernel's own slot table
    assert all(int(key.cgroup_id) != reading.cgroup_id for key, _ in table_items(slots))


@pytest.mark.kernel
def test_cgroup_filter_leaves_other_cgroups_out(probe: ReclaimProbe, big_file: Path) -> None:
    probe.set_cgroup_filter({1})  # no cgroup's id: the root's is 1, and nothing here runs there
    try:
        reading = read_under_limit(probe, big_file, "reclaim-filter")
    finally:
        probe.set_cgroup_filter(None)
    assert reading.limit_hits > 50
    assert not _stalls(reading.interval, reading.cgroup_id)
