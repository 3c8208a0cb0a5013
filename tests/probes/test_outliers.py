"""Outlier events: the pure folding/threshold/ranking logic against hand-computed values, and
live events with stacks from both probes, counted against what the workload truly did."""

from __future__ import annotations

import ctypes
import errno
import math
import os
import signal
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tailsight.hist import Histogram, bucket_index, bucket_upper_bounds_ns
from tailsight.intervals import Counter, HistDocument
from tailsight.probes import outliers
from tailsight.probes.base import HistogramRows, Labels, Snapshot, labels
from tailsight.probes.netsyscall import NetSyscallProbe
from tailsight.probes.outliers import (
    LOST_STACK,
    MIN_THRESHOLD_SAMPLES,
    NO_THRESHOLD_NS,
    OUTLIER_QUANTILE,
    OutlierEvent,
    OutlierStream,
    fold,
    outlier_cflags,
    p99_bucket_upper_bounds_ns,
    short_stack,
    top_outlier_stacks,
)
from tailsight.probes.runqueue import DROPPED, RunQueueProbe
from tailsight.testing.workload import Task, Workload, default_cpu, private_base, python_task

FLOOR_NS = 1_000_000
DELAYED_RECVS = 7  # prime; each waits ~20 ms for a sender that sleeps first
SENDER_SLEEP_S = 0.02
RATE_PER_S = 3

# A receiver blocked in recvfrom until a thread that sleeps 20 ms sends: DELAYED_RECVS slow calls.
DELAYED_RECV_CODE = f"""
import socket, threading, time
sys.stdin.readline()
rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
rx.bind(("127.0.0.1", 0))
tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
def send():
    for _ in range({DELAYED_RECVS}):
        time.sleep({SENDER_SLEEP_S})
        tx.sendto(b"x", rx.getsockname())
sender = threading.Thread(target=send)
sender.start()
for _ in range({DELAYED_RECVS}):
    rx.recvfrom(16)
sender.join()
sys.stdout.write("done\\n"); sys.stdout.flush()
sys.stdin.readline()
"""


def test_fold_is_leaf_last_without_tracing_frames_or_unknown_runs() -> None:
    walked = ["bpf_trace_run2", "__bpf_trace_sys_exit", "leaf", "mid", "root"]
    assert fold(walked, strip_tracing=True) == "root;mid;leaf"
    assert fold(walked) == "root;mid;leaf;__bpf_trace_sys_exit;bpf_trace_run2"
    assert fold(["recvfrom", "[unknown]", "[unknown]", "[unknown]", "main"]) == (
        "main;[unknown];recvfrom"
    )
    assert fold([]) == ""


def test_short_stack_keeps_the_leaf_end() -> None:
    assert short_stack("a;b;c;d;e") == "…;c;d;e"
    assert short_stack("a;b") == "a;b"
    assert short_stack("") == "-"


def p99_bucket_upper_bound_ns(hist: Histogram) -> int:
    """The naive reference: the P99 rank's bucket found by walking one histogram's counts; its
    upper bound from the histogram model (tested in tests/test_hist.py)."""
    rank = OUTLIER_QUANTILE * hist.count
    seen = 0
    for index, count in enumerate(hist.counts.tolist()):
        seen += count
        if hist.count and seen >= rank:
            return int(bucket_upper_bounds_ns()[index])
    return NO_THRESHOLD_NS


def block_bounds(added: list[Histogram], earlier: list[Histogram] | None = None) -> list[int]:
    """The block form's bounds of the samples ``added`` to cumulative rows that held ``earlier``
    (none by default); it must count exactly the added samples too."""
    earlier = earlier or [Histogram.empty()] * len(added)
    before = HistogramRows.of(dict(enumerate(earlier))).rows
    now = HistogramRows.of(
        {row: was.merge(more) for row, (was, more) in enumerate(zip(earlier, added, strict=True))}
    ).rows
    bounds, totals = p99_bucket_upper_bounds_ns(now, before)
    assert totals.tolist() == [hist.count for hist in added]
    return [int(bound) for bound in bounds]


def test_p99_bucket_upper_bound_against_a_sorted_sample() -> None:
    rng = np.random.default_rng(7)
    values = rng.integers(1, 3_000_000, size=1_000)
    hist = Histogram.from_samples(values)
    # the 990th smallest value (rank ceil(0.99 n)) lies in the P99 bucket: its upper bound
    p99_value = int(np.sort(values)[989])
    expected = 5_000 * (bucket_index(p99_value) + 1)
    overflowing = Histogram.from_samples([20 * 10**9] * 5)
    assert block_bounds([hist, Histogram.empty(), overflowing]) == [
        expected,
        NO_THRESHOLD_NS,
        NO_THRESHOLD_NS,
    ]
    assert p99_bucket_upper_bound_ns(hist) == expected


_HISTOGRAM = st.lists(st.integers(0, 12 * 10**9), max_size=300).map(Histogram.from_samples)


@given(st.lists(st.tuples(_HISTOGRAM, _HISTOGRAM), min_size=1, max_size=6))
def test_the_block_p99_bounds_are_each_rows_own(rows: list[tuple[Histogram, Histogram]]) -> None:
    """Each row's bound is that of the samples added to it alone (by a naive walk), whatever
    its earlier samples and the rows beside it."""
    earlier, added = [was for was, _ in rows], [more for _, more in rows]
    assert block_bounds(added, earlier) == [p99_bucket_upper_bound_ns(hist) for hist in added]


def test_the_block_p99_bounds_refuse_a_count_that_went_down() -> None:
    now = HistogramRows.of({1: Histogram.from_samples([10_000] * 3)}).rows
    before = HistogramRows.of({1: Histogram.from_samples([10_000] * 4)}).rows
    with pytest.raises(ValueError, match="went down"):
        p99_bucket_upper_bounds_ns(now, before)


def test_top_outlier_stacks_ranks_counters_of_any_probe() -> None:
    def stack(probe: str, kernel: str, events: int) -> Counter:
        where = {"probe": probe, "cgroup": "/a", "kernel_stack": kernel, "user_stack": "u"}
        return Counter(f"{probe}_outlier_events", where, events)

    doc = HistDocument(
        0,
        1,
        [],
        [
            stack("runqueue", "k1", 2),
            stack("netsyscall", "k2", 9),
            stack("runqueue", "k3", 0),
            Counter("runqueue_outlier_dropped", {"probe": "runqueue", "reason": "x"}, 50),
        ],
    )
    ranked = top_outlier_stacks(doc)
    assert [(s.probe, s.kernel_stack, s.events) for s in ranked] == [
        ("netsyscall", "k2", 9),
        ("runqueue", "k1", 2),
    ]


def test_outlier_cflags_reject_nonsense() -> None:
    assert outlier_cflags(5, 7) == ["-DOUTLIER_FLOOR_NS=5ULL", "-DOUTLIER_RATE_PER_S=7ULL"]
    with pytest.raises(ValueError):
        outlier_cflags(0, 0)


def _outliers(snapshot: Snapshot, probe: str) -> dict[Labels, int]:
    name = f"{probe}_outlier_events"
    return {key: n for (counter, key), n in snapshot.counters.items() if counter == name and n}


def _dropped(snapshot: Snapshot, probe: str) -> dict[str, int]:
    name = f"{probe}_outlier_dropped"
    return {dict(k)["reason"]: n for (c, k), n in snapshot.counters.items() if c == name}


def _run_delayed_receiver(probe: object, tag: str, cpu: int | None = None) -> tuple[int, Snapshot]:
    assert isinstance(probe, NetSyscallProbe)
    task = python_task("receiver", DELAYED_RECV_CODE, cpu=cpu, pipes=True)
    with Workload([task], base=private_base(tag)) as w:
        cgroup_id = w.cgroup_id("receiver")
        probe.set_cgroup_filter([cgroup_id])
        before = probe.read()
        proc = w.process("receiver")
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(b"go\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == b"done\n"
        after = probe.read()
    return cgroup_id, after - before


@pytest.mark.kernel
def test_netsyscall_outliers_carry_the_receivers_stacks(kernel_ready: None) -> None:
    with NetSyscallProbe(cgroup_ids=[], outlier_floor_ns=FLOOR_NS) as probe:
        cgroup_id, interval = _run_delayed_receiver(probe, "out-ns")
    events = _outliers(interval, "netsyscall")
    recv = {k: n for k, n in events.items() if dict(k)["syscall"] == "recvfrom"}
    assert sum(recv.values()) == DELAYED_RECVS
    for key in recv:
        where = dict(key)
        assert where["cgroup"] == cgroup_id
        # Taken at sys_exit: the kernel stack is the syscall exit path (the recv frames have
        # returned); the user stack starts in libc's recvfrom wrapper (no frame pointers in
        # libc/python here, so the unwinder usually stops there).
        assert "do_syscall_64" in str(where["kernel_stack"]).split(";")
        assert str(where["user_stack"]).split(";")[-1] in ("recvfrom", "__libc_recvfrom")
    # the histogram agrees: exactly that many recvfrom calls above the floor
    hist = interval.histograms[(("cgroup", cgroup_id), ("syscall", "recvfrom"))]
    above_floor = int(hist.counts[bucket_index(FLOOR_NS) + 1 :].sum()) + hist.overflow
    assert above_floor == DELAYED_RECVS
    assert _dropped(interval, "netsyscall") == {"rate_limited": 0, "ringbuf_full": 0,
                                                "stack_lost": 0}  # fmt: skip


@pytest.mark.kernel
def test_netsyscall_outliers_are_rate_limited_per_cpu(kernel_ready: None) -> None:
    with NetSyscallProbe(cgroup_ids=[], outlier_rate_per_s=RATE_PER_S) as probe:
        _, interval = _run_delayed_receiver(probe, "out-rate", cpu=default_cpu())
    sent = sum(n for k, n in _outliers(interval, "netsyscall").items()
               if dict(k)["syscall"] == "recvfrom")  # fmt: skip
    limited = _dropped(interval, "netsyscall")["rate_limited"]
    # one CPU, a full bucket of RATE_PER_S at the start, refilled at RATE_PER_S per second
    # over a run of ~0.15 s (at most one more token even on a slow, loaded machine)
    assert sent + limited == DELAYED_RECVS
    assert RATE_PER_S <= sent <= RATE_PER_S + 1


def _stop(pids: list[int]) -> None:
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 5
    for pid in pids:
        while Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
            assert time.monotonic() < deadline
            time.sleep(0.005)


def _above(hist: Histogram, floor_ns: int) -> int:
    return int(hist.counts[bucket_index(floor_ns) + 1 :].sum()) + hist.overflow


@pytest.mark.kernel
def test_runqueue_outliers_under_contention_carry_victim_stacks(kernel_ready: None) -> None:
    cpu = default_cpu()
    tasks = [Task("victim", cpu=cpu), Task("victim", cpu=cpu), Task("noisy", cpu=cpu)]
    with (
        Workload(tasks, base=private_base("out-rq")) as w,
        RunQueueProbe(
            cgroup_ids=[w.cgroup_id("victim"), w.cgroup_id("noisy")], outlier_floor_ns=FLOOR_NS
        ) as probe,
    ):
        time.sleep(1.5)
        # Stopped tasks leave the CPU: every pending outlier is sent before the read.
        _stop(w.pids())
        snapshot = probe.read()
        victim = w.cgroup_id("victim")
        pids = w.pids()
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    events = _outliers(snapshot, "runqueue")
    victims = {k: n for k, n in events.items() if dict(k)["cgroup"] == victim}
    assert sum(victims.values()) > 0
    kernel_stacks = {str(dict(k)["kernel_stack"]) for k in victims}
    user_stacks = {str(dict(k)["user_stack"]) for k in victims}
    # The victim's own stacks at its next switch-out: preempted by the timer interrupt on its
    # way back to user space, while running the interpreter loop of `while True: pass`.
    assert all(s.endswith(";__schedule") for s in kernel_stacks - {LOST_STACK})
    assert any("asm_sysvec_apic_timer_interrupt" in s for s in kernel_stacks)
    assert any("_PyEval_EvalFrameDefault" in s for s in user_stacks)
    # every wait above the floor (no per-cgroup threshold before the first read) is either an
    # event or counted as dropped; a pending one is lost only with an untraced switch
    above = sum(_above(h, FLOOR_NS) for h in snapshot.histograms.values())
    dropped = _dropped(snapshot, "runqueue")
    accounted = sum(events.values()) + dropped["rate_limited"] + dropped["ringbuf_full"]
    untraced = snapshot.counters[(DROPPED, (("reason", "untraced_switch"),))]
    assert accounted <= above <= accounted + untraced + 2
    assert isinstance(snapshot.histograms, Mapping)


class _FakeTable(dict[Any, Any]):
    """Just enough of a bcc table: keys and leaves are plain values."""

    def __init__(self) -> None:
        super().__init__()
        self.callback: Any = None

    @staticmethod
    def Key(value: int) -> int:
        return value

    Leaf = Key

    def open_ring_buffer(self, callback: Any) -> None:
        self.callback = callback

    def walk(self, stack_id: int) -> Any:
        return iter(self[stack_id])  # KeyError for an id that is gone, like bcc

    def sum(self, index: int) -> Any:
        return SimpleNamespace(value=self.get(index, 0))


class _FakeBpf:
    def __init__(self) -> None:
        self.tables: dict[str, _FakeTable] = defaultdict(_FakeTable)
        self.pending: list[OutlierEvent] = []
        self.symbolized: list[tuple[int, int]] = []

    def __getitem__(self, name: bytes) -> _FakeTable:
        return self.tables[name.decode()]

    def ring_buffer_consume(self) -> None:
        callback = self.tables["x_outlier_events"].callback
        while self.pending:
            event = self.pending.pop(0)
            callback(None, ctypes.addressof(event), ctypes.sizeof(event))

    def user_symbols(self, tgid: int, addresses: Sequence[int]) -> list[str]:
        self.symbolized += [(address, tgid) for address in addresses]
        return [f"u{address}" if address != 99 else "[unknown]" for address in addresses]


def _event(cgroup_id: int, kernel: int, user: int, tgid: int = 10, detail: int = 0) -> OutlierEvent:
    return OutlierEvent(cgroup_id, 5_000_000, tgid, tgid, kernel, user, detail, 0)


def test_stream_counts_symbolizes_once_and_recycles_the_stack_map(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bpf = _FakeBpf()
    stacks = bpf.tables["x_outlier_stacks"]
    stacks[1] = [0xA2, 0xA1, 0xA0]  # kernel, leaf first
    stacks[2] = [2, 99, 99, 1]  # user, leaf first
    bpf.tables["x_outlier_dropped"][0] = 4
    kernel_names = {0xA2: b"bpf_trace_run2", 0xA1: b"leaf", 0xA0: b"root"}
    looked_up: list[int] = []

    def ksym(address: int) -> bytes:
        looked_up.append(address)
        return kernel_names[address]

    stream = OutlierStream(
        bpf, "x", ("syscall", lambda n: f"nr{n}"), kernel_symbol=ksym, user_symbols=bpf.user_symbols
    )
    bpf.pending = [_event(5, 1, 2, detail=45), _event(5, 1, 2, detail=45),
                   _event(6, -errno.EEXIST, -errno.EFAULT, detail=44)]  # fmt: skip
    stream.drain()
    counters = stream.counters("x")
    events = {k: n for (name, k), n in counters.items() if name == "x_outlier_events"}
    assert events == {
        labels(cgroup=5, kernel_stack="root;leaf", user_stack="u1;[unknown];u2", syscall="nr45"): 2,
        labels(cgroup=6, kernel_stack=LOST_STACK, user_stack="", syscall="nr44"): 1,
    }
    assert counters[("x_outlier_dropped", labels(reason="rate_limited"))] == 4
    assert sorted(looked_up) == [0xA0, 0xA1, 0xA2]  # each address once, each stack folded once
    assert sorted(bpf.symbolized) == [(1, 10), (2, 10), (99, 10)]
    assert stream.callback_errors == 0

    monkeypatch.setattr(outliers, "STACK_MAP_RECYCLE", 2)
    bpf.pending = [_event(5, 1, 2, detail=45)]
    stream.drain()
    assert 1 not in stacks and 2 not in stacks  # symbolized ids freed for new stacks
    bpf.pending = [_event(5, 1, 2, detail=45)]  # in flight across the recycling: lost, counted
    stream.drain()
    events = {k: n for (name, k), n in stream.counters("x").items() if name == "x_outlier_events"}
    assert events[labels(cgroup=5, kernel_stack=LOST_STACK, user_stack=LOST_STACK,
                         syscall="nr45")] == 1  # fmt: skip


def test_thresholds_follow_the_interval_p99_with_enough_samples() -> None:
    bpf = _FakeBpf()
    stream = OutlierStream(bpf, "x")
    thresholds = bpf.tables["x_outlier_threshold"]
    fast = Histogram.from_samples([10_000] * 100)  # P99 in bucket (5, 10] µs
    few = Histogram.from_samples([10_000] * 99)
    assert stream.update_thresholds(HistogramRows.of({1: fast, 2: few})) == {1: 10_000}
    assert dict(thresholds) == {1: 10_000}
    # the next interval (cumulative minus what was seen) is slower: the threshold follows it
    slower = fast.merge(Histogram.from_samples([2_000_000] * 100))
    stream.update_thresholds(HistogramRows.of({1: slower, 2: few}))
    assert thresholds[1] == 2_000_000
    # too few new samples: kept
    stream.update_thresholds(HistogramRows.of({1: slower.merge(Histogram.from_samples([1] * 50))}))
    assert thresholds[1] == 2_000_000


# Per interval, per cgroup: (value, how many times), so that counts near the minimum are common.
_SAMPLES = st.lists(st.tuples(st.integers(1, 3_000_000), st.integers(1, 60)), max_size=3)


@given(st.lists(st.dictionaries(st.integers(1, 5), _SAMPLES, max_size=4), min_size=1, max_size=6))
def test_thresholds_are_the_p99_since_each_cgroups_last_threshold(
    runs: list[dict[int, list[tuple[int, int]]]],
) -> None:
    """Cgroups come, go and change order between calls: each threshold is the P99 bucket of the
    samples since that cgroup's last threshold (by a naive scan), once there are enough."""
    stream = OutlierStream(_FakeBpf(), "x")
    bounds = bucket_upper_bounds_ns()
    cumulative: dict[int, list[int]] = {}
    pending: dict[int, list[int]] = {}  # samples since the last threshold, per cgroup
    expected: dict[int, int] = {}
    for run in runs:
        interval = {i: [v for v, n in pairs for _ in range(n)] for i, pairs in run.items()}
        for cgroup_id, samples in interval.items():
            cumulative.setdefault(cgroup_id, []).extend(samples)
            pending.setdefault(cgroup_id, []).extend(samples)
        shown = sorted(interval, reverse=len(interval) % 2 == 1)  # order changes too
        got = stream.update_thresholds(
            HistogramRows.of(
                {i: Histogram.from_samples(cumulative[i]) for i in shown if i in cumulative}
            )
        )
        for cgroup_id in shown:
            samples = sorted(pending.get(cgroup_id, []))
            if len(samples) >= MIN_THRESHOLD_SAMPLES:
                rank = math.ceil(OUTLIER_QUANTILE * len(samples))
                expected[cgroup_id] = int(bounds[bucket_index(samples[max(rank, 1) - 1])])
                pending[cgroup_id] = []
        assert got == expected
