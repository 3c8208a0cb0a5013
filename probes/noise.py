"""The host's own noise floor: how much of a CPU's time a task that never blocks loses anyway.

A loop pinned to one CPU reads the clock back to back; any step longer than ``threshold_ns`` is
time the CPU ran something else (interrupts, kernel threads, other tasks, or, on a VM, the
hypervisor), as in sysjitter. No BPF: it needs no privilege and sees what tracepoints cannot
(the hypervisor's share). A latency quantile at about the share of time lost moves with it: on
the 2-core VM this project is measured on, 1.5-3.8 % of each CPU is lost in gaps of ~40 µs,
which is where the replay's in-system P99 sits (docs/ci-gate.md).
"""

from __future__ import annotations

import os
import time
from array import array
from dataclasses import dataclass

from tailsight.probes.host import Check

GAP_THRESHOLD_NS = 20_000
"""Longer than any step of the loop itself (~0.1 µs) by far; shorter than a timer interrupt here."""
LOST_OK = 0.01
"""Up to this share of a CPU lost, the noise floor does not warn."""
FIX_NOISY = (
    "isolate the CPUs the system under test uses (isolcpus=, nohz_full=) or use a quieter host"
)


@dataclass(frozen=True)
class NoiseFloor:
    """One CPU's interruptions during ``seconds`` of spinning."""

    cpu: int
    seconds: float
    gaps_ns: tuple[int, ...]  # each interruption longer than the threshold, in order

    @property
    def lost_ns(self) -> int:
        return sum(self.gaps_ns)

    @property
    def lost_fraction(self) -> float:
        return self.lost_ns / (self.seconds * 1e9)

    @property
    def gaps_per_s(self) -> float:
        return len(self.gaps_ns) / self.seconds

    def describe(self) -> str:
        """One line: share lost, gap rate, median and longest gap."""
        return (
            f"{self.lost_fraction:.1%} of {self.seconds:g} s lost: {self.gaps_per_s:.0f} gaps/s "
            f"> {GAP_THRESHOLD_NS / 1e3:g} µs, median {self.gap_quantile_ns(0.5) / 1e3:.0f} µs, "
            f"max {self.gap_quantile_ns(1.0) / 1e3:.0f} µs"
        )

    def gap_quantile_ns(self, q: float) -> int:
        """Nearest-rank quantile of the gap lengths (0 when there were none)."""
        if not self.gaps_ns:
            return 0
        ordered = sorted(self.gaps_ns)
        return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def measure_noise(
    cpu: int, seconds: float = 1.0, threshold_ns: int = GAP_THRESHOLD_NS
) -> NoiseFloor:
    """Spin on ``cpu`` for ``seconds`` (this thread pinned there meanwhile) and time the gaps."""
    if seconds <= 0:
        raise ValueError(f"seconds must be > 0, got {seconds}")
    previous = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        clock = time.perf_counter_ns
        gaps = array("q")
        last = clock()
        end = last + round(seconds * 1e9)
        while last < end:
            now = clock()
            if now - last > threshold_ns:
                gaps.append(now - last)
            last = now
    finally:
        os.sched_setaffinity(0, previous)
    return NoiseFloor(cpu, seconds, tuple(gaps))


def noise_check(floor: NoiseFloor) -> Check:
    """The doctor's line for one CPU: never required, a warning above ``LOST_OK``."""
    ok = floor.lost_fraction <= LOST_OK
    fix = None if ok else FIX_NOISY
    return Check(f"noise cpu{floor.cpu}", ok, floor.describe(), fix, required=False)


def noise_checks(seconds: float) -> list[Check]:
    """One check per CPU this process may use, measured one after the other."""
    return [noise_check(measure_noise(cpu, seconds)) for cpu in sorted(os.sched_getaffinity(0))]
