"""The irq probe against the CPU time a pinned spinner loses to a UDP flood whose receive
processing RPS steers onto the spinner's CPU, and its vector and irq naming without a kernel.

Ground truth: without CONFIG_IRQ_TIME_ACCOUNTING the kernel adds the interrupts that hit a task
to its runtime (``/proc/<pid>/schedstat`` field 1), so runtime against wall time does not show
them; and a loop's iteration rate varies here by 10 % with the other CPU's load, so counting
iterations does not either.  The spinner (C) reads the clock in a loop and sums every gap
between two reads above GAP_NS: the time it was not running its loop, off the CPU (wall time
less its runtime) or interrupted on it.  Gaps less time off the CPU is the time interrupts took.
A calibration phase, the flood's receive work on the sender's own CPU, gives the rate of the
spinner's losses the probe cannot see (the hypervisor's, the local APIC timer's): the measured
phase's losses less that rate are compared with the time charged to the spinner's cgroup.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import shutil
import socket
import struct
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tailsight.probes.base import Snapshot, labels
from tailsight.probes.btf import Btf, BtfError
from tailsight.probes.catalog import DEFAULT_PROBES, PROBES, create_probe
from tailsight.probes.irq import (
    CHARGED_NS,
    HARDIRQ,
    INFO,
    IRQ_VECTOR_FLAG,
    SOFTIRQ,
    SOFTIRQ_NAMES,
    IrqProbe,
    charged_ns,
    expected_tracepoint_args,
    read_irq_names,
    softirq_names,
    vector_labels,
)
from tailsight.testing.workload import Task, Workload, private_base

RPS_PATH = Path("/sys/class/net/lo/queues/rx-0/rps_cpus")
CALIBRATE_S = 2.0
MEASURE_S = 3.0
TOLERANCE = 0.10

GAP_NS = 500  # a loop round (one vDSO clock read) takes ~30 ns here; an interrupt, µs

# Sums the gaps above GAP_NS between its clock reads into the first u64 of the file argv[1]
# (the second counts them); dies with its parent.
SPINNER_C = r"""
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <time.h>
static uint64_t now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}
int main(int argc, char **argv)
{
    int fd = open(argv[1], O_RDWR);
    volatile uint64_t *gaps;
    uint64_t before, after;

    prctl(PR_SET_PDEATHSIG, SIGKILL);
    gaps = mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (fd < 0 || gaps == MAP_FAILED)
        return 1;
    before = now_ns();
    for (;;) {
        after = now_ns();
        if (after - before > GAP_NS) {
            gaps[0] += after - before;
            gaps[1]++;
        }
        before = after;
    }
}
"""

FLOOD_PAUSE_US = 300
# Sends bursts of 64 datagrams (one sendmmsg) to 127.0.0.1 port argv[1], FLOOD_PAUSE_US apart.
# Within a burst the receiving CPU falls behind (the socket filter's work), so one NET_RX run,
# started by one IPI, handles many: here each interrupt costs its task ~1.6 µs outside the
# softirq (the IPI's delivery in the VM, entry and exit), which a datagram per run would make
# half the lost time.  Between bursts the backlog drains: the receive work stays in interrupt
# context, not in ksoftirqd.
FLOOD_C = r"""
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>
#define BATCH 64
int main(int argc, char **argv)
{
    struct sockaddr_in to = {.sin_family = AF_INET};
    static char payload[64];
    struct iovec iov = {payload, sizeof(payload)};
    struct mmsghdr messages[BATCH];
    int fd = socket(AF_INET, SOCK_DGRAM, 0);

    prctl(PR_SET_PDEATHSIG, SIGKILL);
    to.sin_port = htons(atoi(argv[1]));
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    memset(messages, 0, sizeof(messages));
    for (int i = 0; i < BATCH; i++) {
        messages[i].msg_hdr.msg_name = &to;
        messages[i].msg_hdr.msg_namelen = sizeof(to);
        messages[i].msg_hdr.msg_iov = &iov;
        messages[i].msg_hdr.msg_iovlen = 1;
    }
    for (;;) {
        sendmmsg(fd, messages, BATCH, 0);
        usleep(PAUSE_US);
    }
}
"""


FILTER_LOADS = 1000
"""Packet loads of the receiver's socket filter: microseconds of work per datagram inside the
receiving CPU's NET_RX softirq, more than the sender spends on one."""
_SO_ATTACH_FILTER = 26


def _attach_slow_filter(receiver: socket.socket) -> None:
    """A classic BPF filter on ``receiver`` that loads a packet word FILTER_LOADS times, then
    drops the packet (nothing is queued: the test never reads)."""
    load_word, drop = (0x20, 0, 0, 0), (0x06, 0, 0, 0)  # ld [0]; ret #0
    program = b"".join(struct.pack("HBBI", *insn) for insn in [load_word] * FILTER_LOADS)
    program += struct.pack("HBBI", *drop)
    buffer = ctypes.create_string_buffer(program)
    fprog = struct.pack("HxxxxxxQ", FILTER_LOADS + 1, ctypes.addressof(buffer))
    receiver.setsockopt(socket.SOL_SOCKET, _SO_ATTACH_FILTER, fprog)


def _compile(compiler: str, source: str, output: Path, *flags: str) -> Path:
    output.with_suffix(".c").write_text(source)
    subprocess.run(
        [compiler, "-O2", *flags, "-o", str(output), str(output.with_suffix(".c"))], check=True
    )
    return output


# -- without a kernel -----------------------------------------------------------------------------


class _FakeBtf:
    def __init__(self, values: dict[str, int] | None) -> None:
        self.values = values

    def enum_with(self, enumerator: str) -> dict[str, int]:
        if self.values is None or enumerator not in self.values:
            raise BtfError(f"no enum with {enumerator} in BTF")
        return self.values


def test_softirq_names_from_the_kernels_enum() -> None:
    values = {"HI_SOFTIRQ": 0, "NET_RX_SOFTIRQ": 1, "NEW_SOFTIRQ": 2, "NR_SOFTIRQS": 3}
    assert softirq_names(_FakeBtf(values)) == ("HI", "NET_RX", "NEW")
    assert softirq_names(_FakeBtf(None)) == SOFTIRQ_NAMES
    gap = {"HI_SOFTIRQ": 0, "NET_RX_SOFTIRQ": 2}
    assert softirq_names(_FakeBtf(gap)) == SOFTIRQ_NAMES


def test_irq_names_from_a_fake_procfs(tmp_path: Path) -> None:
    (tmp_path / "interrupts").write_text(
        "           CPU0       CPU1\n"
        "  0:         12          0   IO-APIC   2-edge      timer\n"
        " 24:          1          0  IO-APIC   5-edge      ACPI:Ged\n"
        " 29:        100          3  PCI-MSIX-0000:00:02.0   1-edge      virtio0-input.0\n"
        " 31:          0          0\n"
        "NMI:          0          0   Non-maskable interrupts\n"
    )
    assert read_irq_names(tmp_path) == {0: "timer", 24: "ACPI:Ged", 29: "virtio0-input.0"}
    assert read_irq_names(tmp_path / "missing") == {}


def test_vector_codes_are_named() -> None:
    assert vector_labels(3, SOFTIRQ_NAMES, {}) == labels(kind=SOFTIRQ, vector="NET_RX")
    assert vector_labels(12, SOFTIRQ_NAMES, {}) == labels(kind=SOFTIRQ, vector="12")
    hard = IRQ_VECTOR_FLAG | 29
    assert vector_labels(hard, SOFTIRQ_NAMES, {29: "virtio0-input.0"}) == labels(
        kind=HARDIRQ, vector="29:virtio0-input.0"
    )
    assert vector_labels(hard, SOFTIRQ_NAMES, {}) == labels(kind=HARDIRQ, vector="29")


def test_idle_and_cgroups_are_named_in_documents() -> None:
    key = labels(cgroup=0, cpu="1", kind=SOFTIRQ, vector="NET_RX")
    busy = labels(cgroup=9, cpu="1", kind=SOFTIRQ, vector="NET_RX")
    snapshot = Snapshot("irq", 2, {}, {(CHARGED_NS, key): 5, (CHARGED_NS, busy): 7})
    assert charged_ns(snapshot, 9) == 7
    assert charged_ns(snapshot, 9, "TIMER") == 0
    document = snapshot.to_document(1, lambda ids: {i: "/trading" for i in ids})
    assert {c.labels["cgroup"]: c.value for c in document.counters} == {"idle": 5, "/trading": 7}


def test_the_catalog_describes_the_probe() -> None:
    assert PROBES["irq"] is INFO
    assert isinstance(create_probe("irq"), IrqProbe)
    assert set(INFO.tracepoints) == set(expected_tracepoint_args())
    assert {series.what for series in INFO.series} == {SOFTIRQ, HARDIRQ}
    assert "irq" not in DEFAULT_PROBES  # attached only with --probe irq: an event per softirq


# -- on the running kernel ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def probe(kernel_ready: None) -> Iterator[IrqProbe]:
    with IrqProbe() as attached:
        yield attached


@pytest.mark.kernel
def test_tracepoint_signatures_match_btf(kernel_ready: None) -> None:
    btf = Btf.load()
    for tracepoint, args in expected_tracepoint_args().items():
        assert btf.tracepoint_args(tracepoint) == list(args)
    assert softirq_names(btf)[:10] == SOFTIRQ_NAMES


@contextlib.contextmanager
def _rps_on(cpu_mask: int) -> Iterator[None]:
    """lo's receive processing steered to the CPUs of ``cpu_mask``; restored whatever happens."""
    before = RPS_PATH.read_text().strip()
    try:
        RPS_PATH.write_text(f"{cpu_mask:x}\n")
        yield
    finally:
        RPS_PATH.write_text(f"{before}\n")


def _runtime_ns(pid: int) -> int:
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])


def _sample(probe: IrqProbe, gaps: mmap.mmap, pid: int) -> tuple[int, int, int, Snapshot]:
    """(wall clock, the spinner's gaps, its runtime, the probe's snapshot) now, in ns."""
    return time.monotonic_ns(), struct.unpack_from("Q", gaps)[0], _runtime_ns(pid), probe.read()


def _phase(
    start: tuple[int, int, int, Snapshot], end: tuple[int, int, int, Snapshot], cgroup_id: int
) -> tuple[int, int, int, Snapshot]:
    """(wall ns, ns the spinner lost on its CPU, ns charged to it, the probe's interval)."""
    wall_ns, gap_ns, runtime_ns = (
        after - before for after, before in zip(end[:3], start[:3], strict=True)
    )
    interval = end[3] - start[3]
    return wall_ns, gap_ns - (wall_ns - runtime_ns), charged_ns(interval, cgroup_id), interval


@pytest.mark.kernel
def test_charged_softirq_time_is_the_cpu_time_the_spinner_lost(
    probe: IrqProbe, tmp_path: Path
) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("cpu: needs two CPUs (a sender's and the spinner's)")
    if not RPS_PATH.exists():
        pytest.skip("rps: the kernel has no RPS on lo (CONFIG_RPS)")
    compiler = shutil.which("cc")
    if compiler is None:
        pytest.skip("cc: no C compiler for the spinner")
    sender_cpu, spinner_cpu = cpus[0], cpus[-1]
    spinner = _compile(compiler, SPINNER_C, tmp_path / "spinner", f"-DGAP_NS={GAP_NS}")
    flooder = _compile(compiler, FLOOD_C, tmp_path / "flood", f"-DPAUSE_US={FLOOD_PAUSE_US}")
    gaps_file = tmp_path / "gaps"
    gaps_file.write_bytes(bytes(4096))
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    _attach_slow_filter(receiver)
    receiver.bind(("127.0.0.1", 0))
    port = receiver.getsockname()[1]
    flood = Task("flood", (str(flooder), str(port)), sender_cpu)
    tasks = [Task("trading", (str(spinner), str(gaps_file)), spinner_cpu), flood]
    with (
        receiver,
        gaps_file.open("r+b") as file,
        mmap.mmap(file.fileno(), 4096) as gaps,
        Workload(tasks, base=private_base("irq")) as workload,
    ):
        pid = workload.process("trading").pid
        cgroup_id = workload.cgroup_id("trading")
        phases = []
        for rps_cpu, seconds in ((sender_cpu, CALIBRATE_S), (spinner_cpu, MEASURE_S)):
            with _rps_on(1 << rps_cpu):
                time.sleep(0.2)
                start = _sample(probe, gaps, pid)
                time.sleep(seconds)
                phases.append(_phase(start, _sample(probe, gaps, pid), cgroup_id))
    (base_wall, base_lost, base_charged, _), (wall_ns, lost_ns, charged, interval) = phases
    # Gaps on a quiet CPU the probe cannot see (the hypervisor's, the local timer's): at the
    # calibration's rate, not the flood's doing.
    unseen_ns = (base_lost - base_charged) * wall_ns / base_wall
    flood_lost_ns = lost_ns - unseen_ns
    net_rx = charged_ns(interval, cgroup_id, "NET_RX")
    detail = (
        f"charged {charged / 1e6:.1f} ms (NET_RX {net_rx / 1e6:.1f} ms), lost "
        f"{flood_lost_ns / 1e6:.1f} ms ({lost_ns / 1e6:.1f} ms less {unseen_ns / 1e6:.1f} ms "
        f"unseen at the quiet rate) in {wall_ns / 1e6:.1f} ms"
    )
    print(detail)
    assert net_rx > 0.05 * wall_ns, f"the flood hardly reached the spinner's CPU: {detail}"
    assert abs(charged - flood_lost_ns) <= TOLERANCE * flood_lost_ns, detail
    drops = {key: value for (name, key), value in interval.counters.items() if "dropped" in name}
    assert not any(drops.values()), drops


@pytest.mark.kernel
def test_cgroup_filter_charges_only_the_allowed(probe: IrqProbe) -> None:
    probe.set_cgroup_filter({1})  # no task's cgroup here but the root's
    try:
        before = probe.read()
        time.sleep(0.3)
        interval = probe.read() - before
    finally:
        probe.set_cgroup_filter(None)
    charged = {dict(key)["cgroup"] for name, key in interval.counters if name == CHARGED_NS}
    assert charged <= {0, 1}
    assert interval.histograms, "no softirq ran in 0.3 s (the timer's, at least, should)"
