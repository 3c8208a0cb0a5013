"""Recording cost: bytes and CPU per interval for 100 cgroups x 4 probes (the collector's own
interval documents, from bench_collector's synthetic probes), format 2 (binary + zstd, written
from the objects) against format 1 (canonical hist/1 text, validated by re-parsing) in the same
run; reading both back; and resync over a crafted segment of record heads (must be linear).

Usage: bench_recording.py [--quick] [--cgroups N] [--intervals N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import struct
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench_collector import SyntheticProbe

from tailsight.cgroups import CgroupResolver
from tailsight.collector.agent import Agent
from tailsight.collector.config import CollectorConfig
from tailsight.collector.store.codec import SEGMENT_HEADER, LabelTexts, encode_record
from tailsight.collector.store.reader import Recording, scan_segment
from tailsight.collector.store.writer import RecordingWriter
from tailsight.probes.catalog import BPF_PROBES


def interval_documents(cgroups: int, intervals: int, root: Path) -> list[Any]:
    """What the agent hands the writer: one document per tick over every catalog probe."""
    for n in range(cgroups):
        (root / f"cg{n}").mkdir(parents=True, exist_ok=True)
    ids = [os.stat(root / f"cg{n}").st_ino for n in range(cgroups)]
    probes = {name: SyntheticProbe(name, ids, seed) for seed, name in enumerate(BPF_PROBES)}
    agent = Agent(
        CollectorConfig(top_k=20),
        CgroupResolver(root),
        log=lambda m: None,
        create_probe=probes.__getitem__,
    )
    agent.start()
    agent.tick()
    return [agent.tick() for _ in range(intervals)]


def cpu_each(function: Callable[[Any], Any], items: list[Any]) -> tuple[list[float], list[Any]]:
    costs, results = [], []
    for item in items:
        began = time.process_time()
        results.append(function(item))
        costs.append(time.process_time() - began)
    return costs, results


def ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1e3:7.2f} ms"


def crafted(size: int) -> bytes:
    """Format-1 record heads only, each claiming a payload up to the end of the segment."""
    data = bytearray(SEGMENT_HEADER)
    while len(data) + 12 <= size:
        data += struct.pack("<4sII", b"TSR1", size - len(data) - 12, 0)
    return bytes(data)


def resync_cpu(path: Path) -> float:
    began = time.process_time()
    scan = scan_segment(path)
    assert not scan.documents
    return time.process_time() - began


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short run for CI")
    parser.add_argument("--cgroups", type=int, default=100)
    parser.add_argument("--intervals", type=int, default=None)
    args = parser.parse_args(argv)
    intervals = args.intervals or (5 if args.quick else 30)

    with tempfile.TemporaryDirectory() as temp:
        docs = interval_documents(args.cgroups, intervals, Path(temp) / "cgroup")
        print(
            f"{args.cgroups} cgroups x 4 probes: {len(docs[0].series)} series, "
            f"{len(docs[0].counters)} counters per interval, {intervals} intervals"
        )
        old_cpu, old_records = cpu_each(lambda d: encode_record(d, version=1), docs)
        texts = LabelTexts()  # as a writer encodes: label sets' text kept between records
        new_cpu, new_records = cpu_each(lambda d: encode_record(d, texts=texts), docs)
        old_bytes = statistics.mean(map(len, old_records))
        new_bytes = statistics.mean(map(len, new_records))
        print(
            f"format 1 (hist/1 text, baseline): {old_bytes / 1024:7.1f} KiB/interval, "
            f"encode {ms(old_cpu)} CPU, {old_bytes * 86400 / 1e9:5.1f} GB/day at 1 s"
        )
        print(
            f"format 2 (binary + zstd)        : {new_bytes / 1024:7.1f} KiB/interval, "
            f"encode {ms(new_cpu)} CPU, {new_bytes * 86400 / 1e9:5.1f} GB/day at 1 s"
        )
        print(
            f"  ratio format 2 / format 1: bytes {new_bytes / old_bytes:.3f} "
            f"({old_bytes / new_bytes:.1f}x smaller), encode CPU "
            f"{statistics.median(new_cpu) / statistics.median(old_cpu):.3f}"
        )

        # The writer end to end (fsync off: the disk is not what is measured) and reading back.
        reads = {}
        for version in (1, 2):
            directory = Path(temp) / f"rec{version}"
            with RecordingWriter(directory, fsync=False, version=version) as writer:
                writer_cost, _ = cpu_each(writer.append, docs)
            began = time.process_time()
            read = Recording(directory).documents()
            reads[version] = (time.process_time() - began) / len(read)
            assert [d.dumps() for d in read] == [d.dumps() for d in docs]
            print(
                f"format {version}: append {ms(writer_cost)} CPU, read back "
                f"{reads[version] * 1e3:7.2f} ms CPU per interval"
            )
        print(f"  ratio read CPU format 2 / format 1: {reads[2] / reads[1]:.3f}")

        # Resync over crafted heads: a reader quadratic in them would take ~20 s for 1 MiB.
        sizes = (1 << 16, 1 << 20) if args.quick else (1 << 16, 1 << 20, 1 << 24)
        times = {}
        for size in sizes:
            path = Path(temp) / f"crafted{size}.tsrec"
            path.write_bytes(crafted(size))
            times[size] = resync_cpu(path)
            print(
                f"resync over {size >> 10:6,} KiB of record heads: {times[size] * 1e3:8.1f} ms CPU"
            )
        small, large = sizes[0], sizes[-1]
        print(
            f"  ratio CPU {large >> 10} KiB / {small >> 10} KiB: {times[large] / times[small]:.0f} "
            f"for {large // small}x the bytes (linear: ~{large // small}, quadratic: "
            f"~{(large // small) ** 2})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
