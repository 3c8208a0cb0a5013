"""Cgroup churn: more cgroups come and go than the probes have slots for. Each removed cgroup is
forgotten (its rows cleared, its slot given back), so every new one is still measured exactly:
a known number of socket calls per cgroup, run-queue waits within the kernel's own count, and a
long-lived victim whose exact wait sum (schedstat's run_delay) survives its aggressors' removal."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import pytest

from tailsight.cgroups import CgroupResolver, find_cgroup2_mount
from tailsight.probes.base import Snapshot, labels
from tailsight.probes.netsyscall import MAX_SERIES, NetSyscallProbe
from tailsight.probes.runqueue import DISPLACED_WAIT, MAX_SLOTS, RunQueueProbe
from tailsight.testing.workload import Task, Workload, default_cpu, private_base, python_task

pytestmark = [pytest.mark.kernel, pytest.mark.slow]

PER_ROUND = 11
ROUNDS = 29  # 319 cgroups > 256 run-queue slots; x 2 syscalls = 638 series > 512
CALLS = 7  # sendto and recvfrom each, per cgroup (prime)
assert PER_ROUND * ROUNDS > MAX_SLOTS and 2 * PER_ROUND * ROUNDS > MAX_SERIES

# CALLS datagrams to itself on loopback (sendto + recvfrom each), then blocks until told to exit.
CHURN_CODE = f"""
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("127.0.0.1", 0))
for _ in range({CALLS}):
    s.sendto(b"x", s.getsockname())
    s.recvfrom(16)
sys.stdout.write("done\\n"); sys.stdout.flush()
sys.stdin.readline()
"""


def schedstat(pid: int) -> tuple[int, int]:
    """(run_delay ns, timeslices) from /proc/<pid>/schedstat."""
    _, run_delay_ns, timeslices = Path(f"/proc/{pid}/schedstat").read_text().split()
    return int(run_delay_ns), int(timeslices)


def calls(snapshot: Snapshot, cgroup_id: int, syscall: str) -> int:
    hist = snapshot.histograms.get(labels(cgroup=cgroup_id, syscall=syscall))
    return 0 if hist is None else hist.count


def test_removed_cgroups_give_their_slots_to_new_ones(kernel_ready: None) -> None:
    cpu = default_cpu()
    resolver = CgroupResolver(find_cgroup2_mount())
    with (
        RunQueueProbe() as runqueue,
        NetSyscallProbe() as netsyscall,
        Workload([Task("victim", cpu=cpu)], base=private_base("churn-victim")) as victim,
        contextlib.ExitStack() as stack,
    ):
        victim_pid = victim.pids()[0]
        victim_id = victim.cgroup_id("victim")
        os.kill(victim_pid, signal.SIGSTOP)  # no wait in flight while both sides are read
        time.sleep(0.05)
        before_rq, before_stat = runqueue.read(), schedstat(victim_pid)
        os.kill(victim_pid, signal.SIGCONT)
        previous_rq, previous_net = before_rq, netsyscall.read()
        keepers: list[Workload] = []  # one cgroup per round stays: freed slots lie between used
        for round_ in range(ROUNDS):
            keeper = Workload([python_task("k", CHURN_CODE, cpu=cpu, pipes=True)],
                              base=private_base(f"churn-keep-{round_}"))  # fmt: skip
            keepers.append(stack.enter_context(keeper))
            tasks = [
                python_task(f"c{n}", CHURN_CODE, cpu=cpu, pipes=True) for n in range(PER_ROUND)
            ]
            with Workload(tasks, base=private_base(f"churn-{round_}")) as workload:
                for n in range(PER_ROUND):
                    stdout = workload.process(f"c{n}").stdout
                    assert stdout is not None and stdout.readline() == b"done\n"
                timeslices = {n: schedstat(workload.pids(f"c{n}")[0])[1] for n in range(PER_ROUND)}
                now_rq, now_net = runqueue.read(), netsyscall.read()
                interval_rq, interval_net = now_rq - previous_rq, now_net - previous_net
                ids = {n: workload.cgroup_id(f"c{n}") for n in range(PER_ROUND)}
                for n, cgroup_id in ids.items():
                    for syscall in ("sendto", "recvfrom"):
                        assert calls(interval_net, cgroup_id, syscall) == CALLS, (round_, syscall)
                    waits = interval_rq.histograms[labels(cgroup=cgroup_id)].count
                    assert 1 <= waits <= timeslices[n] + 2, (round_, n)
                previous_rq, previous_net = now_rq, now_net
            kept = {victim_id, *(k.cgroup_id("k") for k in keepers)}
            gone = resolver.gone(set(ids.values()) | kept)
            assert gone == set(ids.values())  # removed; the victim and keepers live on
            runqueue.forget(gone)
            netsyscall.forget(gone)
        os.kill(victim_pid, signal.SIGSTOP)
        time.sleep(0.05)
        after_rq, after_stat = runqueue.read(), schedstat(victim_pid)
        os.kill(victim_pid, signal.SIGCONT)

    rq_drops = {dict(k)["reason"]: v for (name, k), v in after_rq.counters.items()
                if name.endswith("_dropped_events")}  # fmt: skip
    net_drops = {dict(k)["reason"]: v for (name, k), v in now_net.counters.items()
                 if name.endswith("_dropped_events")}  # fmt: skip
    assert rq_drops["slots_full"] == 0 and net_drops["series_full"] == 0
    # The victim was displaced by churn cgroups that are gone: its exact wait sum still matches
    # the kernel's, although their (victim, aggressor) cells were cleared.
    whole = after_rq - before_rq
    run_delay_ns = after_stat[0] - before_stat[0]
    assert run_delay_ns > 1e6
    assert whole.histograms[labels(cgroup=victim_id)].sum_ns == pytest.approx(
        run_delay_ns, rel=0.02
    )
    charged = sum(
        v for (name, k), v in whole.counters.items()
        if name == DISPLACED_WAIT and dict(k)["victim"] == victim_id
    )  # fmt: skip
    assert 0 < charged <= run_delay_ns * 1.02  # only the pairs still alive are named
