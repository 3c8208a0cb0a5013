"""``tailsight explain`` at the size of a real incident: 1 h x 100 cgroups x 4 probes.

Writes a synthetic recording with the real writer (collector/store/writer.py): per cgroup a
run-queue series, recvfrom and sendto socket syscall series, a TCP connect series and a
migration delay series, one 1 s interval each, plus retransmit, migration and displaced-wait
counters. At a known interval one cgroup's run-queue tail jumps (a new hog displaces it). Then
runs the real CLI, ``tailsight explain DIR --json``, in a subprocess, and prints its wall time
and peak RSS (wait4), and checks that the jump is found at that interval in that cgroup.

Same-run baselines: one bare pass over the recording (decode every interval, keep nothing), and
in ``--quick`` mode the dense explain, every series in memory (tests/analysis/dense_explain.py),
on the same data. Goal: <= 10 s and <= 1 GB at full size.

    python benchmarks/bench_explain_scale.py [--quick] [--minutes M] [--cgroups N]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import numpy.typing as npt

from tailsight.collector.store.writer import RecordingWriter
from tailsight.hist import NUM_BUCKETS, Histogram
from tailsight.intervals import Counter, HistDocument, Series

ROOT = Path(__file__).resolve().parent.parent
INTERVAL_NS = 1_000_000_000
START_NS = 1_790_000_000 * INTERVAL_NS
GOAL_S = 10.0
GOAL_RSS_MB = 1024.0


Shape = tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]


def _shape(peak: int, width: int, tail: list[tuple[int, float]]) -> Shape:
    """Buckets and probabilities: a bump of ``width`` buckets from ``peak``, plus a sparse tail."""
    body = np.arange(peak, peak + width)
    weights = np.exp(-0.5 * ((body - peak - width / 3) / (width / 4)) ** 2)
    buckets = np.concatenate([body, [b for b, _ in tail]]).astype(np.int64)
    share = sum(p for _, p in tail)
    probs = np.concatenate([weights / weights.sum() * (1 - share), [p for _, p in tail]])
    return buckets, probs


def series_shapes(wide: int = 1) -> tuple[list[tuple[dict[str, str], int, Shape]], Shape]:
    """Per series kind (labels beyond probe and cgroup, events per interval, shape) and the
    victim's run-queue shape after the jump; ``wide`` spreads every body over that many times
    more buckets (denser histograms: more nonzero buckets per series and interval)."""

    def tail(*points: tuple[int, float]) -> list[tuple[int, float]]:
        return [(min(b * wide, NUM_BUCKETS - 1) if b < 2000 else b, p) for b, p in points]

    series = [
        (
            {"probe": "runqueue"},
            2000,
            _shape(0, 12 * wide, tail((30, 0.004), (60, 0.002), (2049, 0.0005))),
        ),
        (
            {"probe": "netsyscall", "syscall": "recvfrom"},
            1500,
            _shape(2, 25 * wide, tail((80, 0.004), (400, 0.001))),
        ),
        (
            {"probe": "netsyscall", "syscall": "sendto"},
            1500,
            _shape(1, 10 * wide, tail((40, 0.005))),
        ),
        ({"probe": "tcpstate", "kind": "connect"}, 50, _shape(3, 8 * wide, tail((50, 0.02)))),
        ({"probe": "migration"}, 300, _shape(0, 6 * wide, tail((20, 0.01), (90, 0.003)))),
    ]
    hog = _shape(
        0, 12 * wide, tail((30, 0.004), (60, 0.002), (2049, 0.0005), (300, 0.03), (500, 0.02))
    )
    return series, hog


def generate(
    directory: Path, intervals: int, cgroups: int, victim: int, change: int, wide: int = 1
) -> None:
    """The recording: ``victim``'s run-queue tail jumps from interval ``change`` on."""
    rng = np.random.default_rng(7)
    kinds, hog_shape = series_shapes(wide)
    names = [f"/svc-{c:03d}" for c in range(cgroups)]
    with RecordingWriter(directory, fsync=False) as writer:
        for t in range(intervals):
            series = []
            for extra, events, (buckets, probs) in kinds:
                draws = list(rng.multinomial(rng.poisson(events, size=cgroups), probs))
                shapes = [buckets] * cgroups
                if extra["probe"] == "runqueue" and t >= change:
                    draws[victim] = rng.multinomial(rng.poisson(events), hog_shape[1])
                    shapes[victim] = hog_shape[0]
                for c, name in enumerate(names):
                    counts = np.zeros(NUM_BUCKETS + 1, dtype=np.int64)
                    counts[shapes[c]] = draws[c]  # the buckets of a shape are distinct
                    hist = Histogram(counts[:NUM_BUCKETS], overflow=int(counts[NUM_BUCKETS]))
                    series.append(Series({**extra, "cgroup": name}, hist))
            counters = []
            for c, name in enumerate(names):
                counters.append(
                    Counter(
                        "tcp_retransmits",
                        {"probe": "tcpstate", "cgroup": name},
                        int(rng.poisson(0.3)),
                    )
                )
                counters.append(
                    Counter(
                        "task_migrations",
                        {"probe": "migration", "cgroup": name},
                        int(rng.poisson(20)),
                    )
                )
                for a in (1, 2, 3):
                    aggressor = names[(c + a) % cgroups]
                    wait = int(rng.poisson(50)) * 1000
                    counters.append(
                        Counter(
                            "runqueue_displaced_wait_ns",
                            {"probe": "runqueue", "victim": name, "aggressor": aggressor},
                            wait,
                        )
                    )
            if t >= change:
                counters.append(
                    Counter(
                        "runqueue_displaced_wait_ns",
                        {"probe": "runqueue", "victim": names[victim], "aggressor": "/hog"},
                        int(rng.poisson(200)) * 100_000,
                    )
                )
            start = START_NS + t * INTERVAL_NS
            writer.append(HistDocument(start, start + INTERVAL_NS, series, counters))


def measure(code: str) -> tuple[float, float, str]:
    """Run ``python -c code`` from the repository root: wall s, peak RSS MB, stdout."""
    began = time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    out = child.stdout.read()
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - began
    if child.returncode != 0:
        raise SystemExit(f"child failed ({child.returncode}): {code}")
    return wall, usage.ru_maxrss / 1024.0, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10 min x 20 cgroups (CI)")
    parser.add_argument("--minutes", type=int, default=None)
    parser.add_argument("--cgroups", type=int, default=None)
    parser.add_argument("--keep", type=Path, default=None, help="write the recording here")
    parser.add_argument("--wide", type=int, default=1, help="denser histograms (x buckets)")
    args = parser.parse_args()
    minutes = args.minutes or (10 if args.quick else 60)
    cgroups = args.cgroups or (20 if args.quick else 100)
    intervals = minutes * 60
    victim, change = cgroups // 2 - 1, int(intervals * 0.6)
    with tempfile.TemporaryDirectory() as scratch:
        directory = args.keep or Path(scratch) / "recording"
        began = time.perf_counter()
        generate(directory, intervals, cgroups, victim, change, args.wide)
        size = sum(p.stat().st_size for p in directory.iterdir())
        print(
            f"recording: {minutes} min x {cgroups} cgroups x {len(series_shapes()[0])} series "
            f"per cgroup (histograms x{args.wide} wide) "
            f"({intervals} intervals, {size / 1e6:,.0f} MB), written in "
            f"{time.perf_counter() - began:.0f} s; jump at interval {change} in "
            f"/svc-{victim:03d}"
        )
        tailsight = str(Path(sys.executable).with_name("tailsight"))
        began = time.perf_counter()
        child = subprocess.Popen(
            [tailsight, "explain", str(directory), "--json"], stdout=subprocess.PIPE, text=True
        )
        assert child.stdout is not None
        out = child.stdout.read()
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - began
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit("tailsight explain failed")
        rss = usage.ru_maxrss / 1024.0
        report = json.loads(out)
        found = [
            i
            for i in report["incidents"]
            if i["headline"].get("cgroup") == f"/svc-{victim:03d}"
            and i["headline"].get("probe") == "runqueue"
        ]
        jumps = [j for j in report["jumps"] if j["series"] == found[0]["headline"]] if found else []
        at = jumps[0]["change_index"] if jumps else None
        ok = at is not None and abs(at - change) <= 1
        print(
            f"explain (CLI, streamed): {wall:.1f} s, peak RSS {rss:,.0f} MB; "
            f"{len(report['incidents'])} incident(s); jump found at interval {at} "
            f"({'right' if ok else 'WRONG'}: injected at {change})"
        )
        one_pass = (
            "from tailsight.collector.store.reader import Recording; "
            f"n = sum(1 for _ in Recording({str(directory)!r}).iter_intervals()); print(n)"
        )
        base_wall, base_rss, _ = measure(one_pass)
        print(
            f"baseline, one bare pass over the recording: {base_wall:.1f} s, peak RSS "
            f"{base_rss:,.0f} MB; explain = {wall / base_wall:.1f}x one pass"
        )
        if args.quick:
            dense = (
                "from tailsight.collector.store.reader import Recording; "
                "from tests.analysis.dense_explain import dense_explain; "
                f"r = dense_explain(Recording({str(directory)!r}).documents()); "
                "print(len(r.incidents))"
            )
            dense_wall, dense_rss, _ = measure(dense)
            print(
                f"baseline, dense explain: {dense_wall:.1f} s, peak RSS "
                f"{dense_rss:,.0f} MB; streamed = {dense_wall / wall:.1f}x faster, "
                f"{dense_rss / rss:.1f}x less memory"
            )
        if not args.quick:
            verdict = wall <= GOAL_S and rss <= GOAL_RSS_MB
            print(
                f"goal <= {GOAL_S:.0f} s and <= {GOAL_RSS_MB:,.0f} MB: "
                + ("met" if verdict else "NOT met")
            )
        if not ok:
            raise SystemExit(1)


if __name__ == "__main__":
    main()
