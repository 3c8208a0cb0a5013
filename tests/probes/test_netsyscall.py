"""The socket syscall probe against workloads whose syscalls are known exactly: a prime number of
UDP sendto/recvfrom on loopback, EAGAIN errors, and the cgroup filter; the syscall table against
the installed uapi headers."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tailsight.cgroups import own_cgroup_id
from tailsight.probes.base import Snapshot, labels
from tailsight.probes.btf import Btf
from tailsight.probes.netsyscall import (
    DROP_REASONS,
    DROPPED,
    ERRORS,
    NetSyscallProbe,
    errno_name,
    expected_tracepoint_args,
)
from tailsight.probes.syscalls import (
    NET_SYSCALLS,
    UnsupportedArchitecture,
    net_syscall_numbers,
    syscall_nr_field,
)
from tailsight.testing.workload import Workload, private_base, python_task

ROUND_TRIPS = 101  # prime: a sendto and a recvfrom each
EMPTY_READS = 53  # prime: recvfrom(MSG_DONTWAIT) on an empty socket -> EAGAIN
UAPI_HEADERS = {
    "x86_64": Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h"),
    "aarch64": Path("/usr/include/asm-generic/unistd.h"),
}

# Blocked on stdin until told to go, so the probe's filter is in place before the first call.
UDP_CODE = f"""
import socket
sys.stdin.readline()
rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
rx.bind(("127.0.0.1", 0))
tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _ in range({ROUND_TRIPS}):
    tx.sendto(b"x", rx.getsockname())
    rx.recvfrom(16)
for _ in range({EMPTY_READS}):
    try:
        rx.recvfrom(16, socket.MSG_DONTWAIT)
    except BlockingIOError:
        pass
sys.stdout.write("done\\n"); sys.stdout.flush()
sys.stdin.readline()
"""

# Forked processes blocked in recvfrom all at once (a prefork server's workers): they share their
# user stack pointer and their code, so only their kernel stacks tell their calls apart.
FORKED = 257  # prime
FORKED_CODE = f"""
import os, socket, time
sys.stdin.readline()
socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range({FORKED})]
for sock in socks:
    sock.bind(("127.0.0.1", 0))
children = []
for sock in socks:
    pid = os.fork()
    if pid == 0:
        sock.recvfrom(16)
        os._exit(0)
    children.append(pid)
def blocked(pid):
    with open(f"/proc/{{pid}}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] == "S"
while not all(blocked(pid) for pid in children):
    time.sleep(0.01)
time.sleep(0.2)
tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for sock in socks:
    tx.sendto(b"x", sock.getsockname())
for pid in children:
    os.waitpid(pid, 0)
sys.stdout.write("done\\n"); sys.stdout.flush()
sys.stdin.readline()
"""


@pytest.fixture(scope="module")
def probe(kernel_ready: None) -> Iterator[NetSyscallProbe]:
    with NetSyscallProbe(cgroup_ids=[]) as attached:
        yield attached


def _run_udp(
    probe: NetSyscallProbe, tag: str, traced: bool, code: str = UDP_CODE
) -> tuple[int, Snapshot]:
    """Run ``code`` in its own cgroup; (cgroup id, interval snapshot over the run)."""
    with Workload([python_task("udp", code, pipes=True)], base=private_base(tag)) as w:
        cgroup_id = w.cgroup_id("udp")
        if traced:
            probe.set_cgroup_filter([cgroup_id])
        before = probe.read()
        proc = w.process("udp")
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(b"go\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == b"done\n"
        after = probe.read()
    probe.set_cgroup_filter([])
    return cgroup_id, after - before


@pytest.mark.kernel
def test_tracepoint_signatures_match_btf(kernel_ready: None) -> None:
    btf = Btf.load()
    for tracepoint, args in expected_tracepoint_args().items():
        assert btf.tracepoint_args(tracepoint) == list(args)
    assert btf.member("pt_regs", syscall_nr_field()).size_bytes in (4, 8)


@pytest.mark.kernel
def test_counts_every_call_and_every_error_exactly(probe: NetSyscallProbe) -> None:
    cgroup_id, interval = _run_udp(probe, "ns", traced=True)
    sendto = interval.histograms[labels(cgroup=cgroup_id, syscall="sendto")]
    recvfrom = interval.histograms[labels(cgroup=cgroup_id, syscall="recvfrom")]
    assert sendto.count == ROUND_TRIPS
    assert recvfrom.count == ROUND_TRIPS + EMPTY_READS
    # only this cgroup is recorded, and it made no other socket syscalls
    assert set(interval.histograms) == {
        labels(cgroup=cgroup_id, syscall="sendto"),
        labels(cgroup=cgroup_id, syscall="recvfrom"),
    }
    errors = {key: n for (name, key), n in interval.counters.items() if name == ERRORS and n}
    assert errors == {labels(cgroup=cgroup_id, syscall="recvfrom", errno="EAGAIN"): EMPTY_READS}
    # loopback UDP calls take microseconds, not the milliseconds of a broken clock pairing
    assert 0 < sendto.sum_ns / sendto.count < 1_000_000
    for reason in DROP_REASONS:
        assert interval.counters[(DROPPED, labels(reason=reason))] == 0


@pytest.mark.kernel
def test_calls_in_flight_at_once_in_forked_processes_each_count(probe: NetSyscallProbe) -> None:
    cgroup_id, interval = _run_udp(probe, "ns-forked", traced=True, code=FORKED_CODE)
    assert interval.histograms[labels(cgroup=cgroup_id, syscall="recvfrom")].count == FORKED
    assert interval.histograms[labels(cgroup=cgroup_id, syscall="sendto")].count == FORKED
    for reason in DROP_REASONS:
        assert interval.counters[(DROPPED, labels(reason=reason))] == 0


def _own_cgroup_id() -> int:
    return own_cgroup_id()


@pytest.mark.kernel
def test_filter_records_only_the_allowed_cgroups(probe: NetSyscallProbe) -> None:
    import socket

    own = _own_cgroup_id()
    probe.set_cgroup_filter([own])
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.sendto(b"x", ("127.0.0.1", 9))  # discard port: nobody needs to listen
    workload_id, interval = _run_udp(probe, "ns-untraced", traced=False)
    recorded = {dict(key)["cgroup"] for key in interval.histograms}
    assert workload_id not in recorded
    # ours was allowed all along (others in our cgroup may add calls of their own)
    probe.set_cgroup_filter([own])
    before = probe.read()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.sendto(b"x", ("127.0.0.1", 9))
    sent = (probe.read() - before).histograms[labels(cgroup=own, syscall="sendto")]
    probe.set_cgroup_filter([])
    assert sent.count >= 1
    # The filter is switched off and on again while attached, as for every probe.
    probe.set_cgroup_filter(None)
    workload_id, interval = _run_udp(probe, "ns-unfiltered", traced=False)
    assert workload_id in {dict(key)["cgroup"] for key in interval.histograms}


def test_errno_names() -> None:
    assert errno_name(11) == "EAGAIN"
    assert errno_name(4095) == "4095"


@pytest.mark.parametrize("machine", sorted(UAPI_HEADERS))
def test_syscall_table_matches_uapi_headers(machine: str) -> None:
    header = UAPI_HEADERS[machine]
    if not header.is_file():
        pytest.skip(f"{header} not installed")
    defined = {
        m.group(1): int(m.group(2))
        for m in re.finditer(r"#define __NR_(\w+)\s+(\d+)\b", header.read_text())
    }
    assert net_syscall_numbers(machine) == {name: defined[name] for name in NET_SYSCALLS}


def test_unknown_architecture_is_refused() -> None:
    with pytest.raises(UnsupportedArchitecture):
        net_syscall_numbers("pdp11")
    with pytest.raises(UnsupportedArchitecture):
        syscall_nr_field("pdp11")
