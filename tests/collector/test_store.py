"""Recording store: round trip (format 2 by hand, format 1 from a committed fixture), torn tails,
corruption and stray files, linear resync, the writer lock and de-duplication, permissions, a
full disk (a real tmpfs), restarts, retention, and range / label queries checked against the
documents themselves."""

from __future__ import annotations

import contextlib
import errno
import grp
import json
import os
import shutil
import stat
import struct
import subprocess
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tailsight.collector.store import reader
from tailsight.collector.store.codec import RECORD_MAGIC, SEGMENT_HEADER, encode_record
from tailsight.collector.store.reader import ReadProblem, Recording, list_segments, scan_segment
from tailsight.collector.store.writer import RecordingBusyError, RecordingWriter, segment_name
from tailsight.hist import NUM_BUCKETS, Histogram
from tailsight.intervals import Counter, HistDocument, Series
from tailsight.probes.base import LabelMemo, Snapshot, labels

INTERVAL_NS = 1_000_000_000
T0_NS = 1_700_000_000 * 10**9
T1_NS = 1_764_600_010 * 10**9  # after the intervals of the format-1 fixture
FIXTURE = Path(__file__).parent / "data" / "rec-v1"


def make_documents(n: int, seed: int = 0, cgroups: int = 3) -> list[HistDocument]:
    """Contiguous one-second intervals with random latencies for a few cgroups."""
    rng = np.random.default_rng(seed)
    docs = []
    for t in range(n):
        series = []
        for c in range(cgroups):
            if rng.random() < 0.2:
                continue  # a cgroup idle for this interval
            samples = rng.exponential(40_000 * (c + 1), size=int(rng.integers(1, 200)))
            series.append(
                Series(
                    {"probe": "runqueue", "cgroup": f"/g{c}"},
                    Histogram.from_samples(samples.astype(np.int64)),
                )
            )
        counters = [Counter("runqueue_dropped_events", {"probe": "runqueue", "reason": "x"}, t)]
        start = T0_NS + t * INTERVAL_NS
        docs.append(HistDocument(start, start + INTERVAL_NS, series, counters))
    return docs


def texts(docs: list[HistDocument]) -> list[str]:
    return [d.dumps() for d in docs]


def test_round_trip_and_record_layout(tmp_path: Path) -> None:
    docs = make_documents(5)
    with RecordingWriter(tmp_path) as writer:
        for doc in docs:
            writer.append(doc)
    (segment,) = list_segments(tmp_path)
    data = segment.read_bytes()
    # Layout by hand (docs/recording.md): header, then magic | len | crc32 | zstd frame of
    # u32 meta length | meta JSON | nnz u32[n] | sum u64[n] | overflow u64[n] | index u16[k]
    # | count i64[k] | counter value u64[m].
    assert data.startswith(SEGMENT_HEADER) and SEGMENT_HEADER == b"tailsight.rec/2\n"
    position = len(SEGMENT_HEADER)
    for doc in docs:
        magic, length, crc = struct.unpack_from("<4sII", data, position)
        compressed = data[position + 12 : position + 12 + length]
        assert magic == RECORD_MAGIC == b"TSR2" and zlib.crc32(compressed) == crc
        raw = zstandard.ZstdDecompressor().decompress(compressed)
        (meta_len,) = struct.unpack_from("<I", raw)
        meta = json.loads(raw[4 : 4 + meta_len])
        assert meta == {
            "start_ns": doc.start_ns,
            "end_ns": doc.end_ns,
            "series": [s.labels for s in doc.series],
            "counters": [[c.name, c.labels] for c in doc.counters],
        }
        n, at = len(doc.series), 4 + meta_len
        nnz = np.frombuffer(raw, "<u4", n, at)
        sums = np.frombuffer(raw, "<u8", n, at + 4 * n)
        overflows = np.frombuffer(raw, "<u8", n, at + 12 * n)
        k = int(nnz.sum())
        indices = np.frombuffer(raw, "<u2", k, at + 20 * n)
        counts = np.frombuffer(raw, "<i8", k, at + 20 * n + 2 * k)
        values = np.frombuffer(raw, "<u8", len(doc.counters), at + 20 * n + 10 * k)
        assert len(raw) == at + 20 * n + 10 * k + 8 * len(doc.counters)
        bounds = np.cumsum([0, *nnz])
        for j, s in enumerate(doc.series):
            dense = np.zeros(NUM_BUCKETS, dtype=np.int64)
            dense[indices[bounds[j] : bounds[j + 1]]] = counts[bounds[j] : bounds[j + 1]]
            assert dense.tolist() == s.hist.counts.tolist()
            assert (sums[j], overflows[j]) == (s.hist.sum_ns, s.hist.overflow)
        assert values.tolist() == [c.value for c in doc.counters]
        position += 12 + length
    assert position == len(data)
    assert texts(Recording(tmp_path).documents()) == texts(docs)


def test_reads_format_1_recordings(tmp_path: Path) -> None:
    """A recording written by the format-1 writer (committed fixture) reads as it always did,
    also beside format-2 segments in one directory."""
    expected = (FIXTURE / "expected.txt").read_text()
    old = Recording(FIXTURE)
    assert "".join(texts(old.documents())) == expected
    assert old.problems == [] and len(old.documents()) == 3
    shutil.copytree(FIXTURE, tmp_path / "rec")
    later = make_documents(3, seed=9)
    for k, doc in enumerate(later):  # after the fixture's intervals
        doc.start_ns, doc.end_ns = T1_NS + k * INTERVAL_NS, T1_NS + (k + 1) * INTERVAL_NS
    with RecordingWriter(tmp_path / "rec") as writer:
        for doc in later:
            writer.append(doc)
    mixed = Recording(tmp_path / "rec")
    assert "".join(texts(mixed.documents())) == expected + "".join(texts(later))
    assert mixed.problems == []
    # The format-1 writer is kept as version=1: it reproduces the fixture byte for byte.
    with RecordingWriter(tmp_path / "again", version=1) as writer:
        for doc in old.documents():
            writer.append(doc)
    (fixture,) = list_segments(FIXTURE)
    assert list_segments(tmp_path / "again")[0].read_bytes() == fixture.read_bytes()


def test_values_beyond_64_bits_fall_back_to_format_1_records(tmp_path: Path) -> None:
    doc = make_documents(1)[0]
    doc.counters.append(Counter("huge", {}, 2**70))
    assert encode_record(doc)[:4] == b"TSR1"
    assert encode_record(make_documents(1)[0])[:4] == b"TSR2"
    with RecordingWriter(tmp_path) as writer:
        writer.append(doc)
    assert texts(Recording(tmp_path).documents()) == texts([doc])


def test_label_texts_kept_between_records_give_each_record_its_own_labels(
    tmp_path: Path,
) -> None:
    """The writer keeps each label set's JSON by its key object, which the agent hands again
    every interval: each record still reads back as its own document while keys repeat, new
    ones come and go, and counters of two names share labels."""
    memo = LabelMemo()
    paths = {1: '/a"é', 2: "/b\\c", 3: "/d"}
    docs = []
    with RecordingWriter(tmp_path) as writer:
        for t, ids in enumerate([(1, 2), (2, 3), (1, 2, 3), (3,)]):
            counters = {("runqueue_x", labels(cgroup=i)): t for i in ids}
            counters |= {("runqueue_y", labels(cgroup=i)): i for i in ids}
            reading = Snapshot(
                "runqueue",
                T0_NS + (t + 1) * INTERVAL_NS,
                {labels(cgroup=i): Histogram.from_samples([1_000 * i]) for i in ids},
                counters,
            )
            doc = reading.to_document(
                T0_NS + t * INTERVAL_NS, lambda wanted: {i: paths[i] for i in wanted}, None, memo
            )
            writer.append(doc)
            docs.append(doc)
    assert texts(Recording(tmp_path).documents()) == texts(docs)


def test_writer_refuses_what_readers_would_reject(tmp_path: Path) -> None:
    doc = make_documents(1)[0]
    doc.series.append(doc.series[0])  # the same labels twice
    with RecordingWriter(tmp_path) as writer, pytest.raises(ValueError, match="two series"):
        writer.append(doc)
    assert Recording(tmp_path).documents() == []


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(cut=st.integers(min_value=0, max_value=10**9))
def test_torn_tail_keeps_every_complete_record(tmp_path: Path, cut: int) -> None:
    docs = make_documents(4, seed=1)
    records = [encode_record(d) for d in docs]
    full = SEGMENT_HEADER + b"".join(records)
    cut %= len(full) + 1
    # The fixture's tmp_path is shared by every example, and two may reduce to the same cut.
    directory = Path(tempfile.mkdtemp(prefix=f"cut{cut}-", dir=tmp_path))
    (directory / "00000000000000000001-0000.tsrec").write_bytes(full[:cut])
    ends = np.cumsum([len(SEGMENT_HEADER), *map(len, records)])[1:]
    complete = int((ends <= cut).sum())
    recording = Recording(directory)
    assert texts(recording.documents()) == texts(docs[:complete])
    if cut < len(SEGMENT_HEADER):
        assert recording.skipped_bytes == cut  # a prefix of the header: an empty segment
    else:
        last_end = int(ends[complete - 1]) if complete else len(SEGMENT_HEADER)
        assert recording.skipped_bytes == cut - last_end


def test_corrupt_record_is_skipped_and_reading_resumes(tmp_path: Path) -> None:
    docs = make_documents(5, seed=2)
    with RecordingWriter(tmp_path) as writer:
        for doc in docs:
            writer.append(doc)
    (segment,) = list_segments(tmp_path)
    data = bytearray(segment.read_bytes())
    records = [encode_record(d) for d in docs]
    second = len(SEGMENT_HEADER) + len(records[0])
    data[second + 40] ^= 0xFF  # a byte inside record 1's payload: its CRC no longer matches
    segment.write_bytes(bytes(data))
    recording = Recording(tmp_path)
    assert texts(recording.documents()) == texts([docs[0], *docs[2:]])
    assert recording.bad_records == 1
    assert recording.skipped_bytes == len(records[1])


def killed_writer(directory: Path, docs: list[HistDocument], torn: bytes = b"") -> None:
    """A writer in a child process that appends ``docs`` and ``torn`` and dies without closing
    anything (its lock goes with it, as with SIGKILL)."""
    pid = os.fork()
    if pid == 0:
        try:
            writer = RecordingWriter(directory)
            for doc in docs:
                writer.append(doc)
            assert writer.segment is not None
            with writer.segment.open("ab") as handle:
                handle.write(torn)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def test_restart_appends_in_a_new_segment(tmp_path: Path) -> None:
    docs = make_documents(6, seed=3)
    killed_writer(tmp_path, docs[:3], torn=encode_record(docs[3])[:25])
    with RecordingWriter(tmp_path) as restarted:
        for doc in docs[3:]:
            restarted.append(doc)
    assert len(list_segments(tmp_path)) == 2
    recording = Recording(tmp_path)
    assert texts(recording.documents()) == texts(docs)
    assert recording.skipped_bytes == 25
    (problem,) = recording.problems
    assert problem.reason == "torn record at the end of the segment"
    assert problem.skipped_bytes == 25


def test_partial_segment_header_is_an_empty_segment(tmp_path: Path) -> None:
    (tmp_path / "00000000000000000005-0000.tsrec").write_bytes(SEGMENT_HEADER[:7])
    assert Recording(tmp_path).documents() == []


def good_recording(directory: Path, n: int = 6) -> list[HistDocument]:
    docs = make_documents(n, seed=12)
    with RecordingWriter(directory, segment_bytes=1) as writer:  # one segment per interval
        for doc in docs:
            writer.append(doc)
    assert len(list_segments(directory)) == n
    return docs


@pytest.mark.parametrize("bit", range(0, 128, 7))
def test_bit_flip_in_a_segment_header_is_reported_and_the_rest_read(
    tmp_path: Path, bit: int
) -> None:
    docs = good_recording(tmp_path)
    victim = list_segments(tmp_path)[2]
    data = bytearray(victim.read_bytes())
    data[bit // 8] ^= 1 << (bit % 8)
    victim.write_bytes(bytes(data))
    recording = Recording(tmp_path)
    assert texts(recording.documents()) == texts(docs)  # the records after the header check out
    (problem,) = recording.problems
    assert (problem.path, problem.offset) == (victim, 0)
    assert "damaged segment header" in problem.reason and victim.name in str(problem)


@pytest.mark.parametrize(
    "stray", [bytes(100), b"these are notes, not a recording\n" * 3, b"TSR2" + bytes(40)]
)
def test_stray_segment_files_are_skipped_and_reported(tmp_path: Path, stray: bytes) -> None:
    docs = good_recording(tmp_path)
    path = tmp_path / "00000000000000000000-0000.tsrec"  # sorts first
    path.write_bytes(stray)
    recording = Recording(tmp_path)
    assert texts(recording.documents()) == texts(docs)
    (problem,) = recording.problems
    assert problem == ReadProblem(path, 0, "not a tailsight recording segment", len(stray))
    assert recording.skipped_bytes == len(stray)
    scan = scan_segment(path)  # one segment alone: reported, not raised
    assert scan.documents == [] and scan.problems == [problem]


def test_time_bounds_skip_bad_segments(tmp_path: Path) -> None:
    docs = good_recording(tmp_path)
    (tmp_path / "00000000000000000000-0000.tsrec").write_bytes(bytes(100))
    (tmp_path / "99999999999999999999-0000.tsrec").write_text("junk")
    assert Recording(tmp_path).time_bounds() == (docs[0].start_ns, docs[-1].end_ns)


class CrcCount:
    """zlib with ``crc32`` counting the bytes it checksums: the reader's work, independent of
    how fast this machine is."""

    def __init__(self) -> None:
        self.bytes = 0

    def crc32(self, data: bytes, value: int = 0) -> int:
        self.bytes += len(data)
        return zlib.crc32(data, value)


def crafted_heads(size: int, magic: bytes) -> bytes:
    """A segment of record heads only, each claiming a payload up to the end of the file: a
    reader that checksums every claimed payload does quadratic work."""
    heads = bytearray(SEGMENT_HEADER)
    while len(heads) + 12 <= size:
        heads += struct.pack("<4sII", magic, size - len(heads) - 12, 0)
    return bytes(heads)


@pytest.mark.parametrize("magic", [b"TSR1", b"TSR2"])
def test_resync_is_linear_in_the_segment_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, magic: bytes
) -> None:
    checksummed = {}
    for size in (1 << 18, 1 << 20):
        path = tmp_path / f"{size:020d}-0000.tsrec"
        path.write_bytes(crafted_heads(size, magic))
        counter = CrcCount()
        monkeypatch.setattr(reader, "zlib", counter)
        scan = scan_segment(path)
        monkeypatch.undo()
        assert scan.documents == [] and scan.skipped_bytes == size - len(SEGMENT_HEADER)
        assert counter.bytes <= size  # a quadratic resync: size**2 / 24 (43 GB for 1 MiB)
        checksummed[size] = counter.bytes
    # Resync still finds a good record after damage that is all heads.
    docs = make_documents(2, seed=13)
    path = tmp_path / "00000000000000000001-0000.tsrec"
    path.write_bytes(crafted_heads(4096, magic) + b"".join(map(encode_record, docs)))
    assert texts(scan_segment(path).documents) == texts(docs)


def test_duplicated_segment_counts_once_and_is_reported(tmp_path: Path) -> None:
    docs = good_recording(tmp_path, n=4)
    originals = list_segments(tmp_path)
    first = originals[0]
    copy = tmp_path / first.name.replace("-0000", "-0001")
    shutil.copyfile(first, copy)
    (tmp_path / "99999999999999999999-0000.tsrec").write_bytes(
        SEGMENT_HEADER + b"".join(encode_record(d) for d in docs)  # all of it once more
    )
    recording = Recording(tmp_path)
    assert texts(recording.documents()) == texts(docs)
    assert recording.duplicates == 5
    assert [str(p) for p in recording.problems] == [
        f"{copy.name}: 1 intervals already read from {first.name}: counted once",
        *(
            f"99999999999999999999-0000.tsrec: 1 intervals already read from {p.name}: counted once"
            for p in originals
        ),
    ]
    (series,) = recording.series(labels={"cgroup": "/g0"})
    assert len(series.times_ns) == len(docs)


def test_overlapping_intervals_are_kept_and_reported(tmp_path: Path) -> None:
    docs = make_documents(4, seed=14)
    shifted = make_documents(2, seed=15)
    for doc in shifted:  # a second writer, half an interval later
        doc.start_ns += INTERVAL_NS // 2
        doc.end_ns += INTERVAL_NS // 2
    (tmp_path / segment_of(docs)).write_bytes(SEGMENT_HEADER + b"".join(map(encode_record, docs)))
    (tmp_path / segment_of(shifted)).write_bytes(
        SEGMENT_HEADER + b"".join(map(encode_record, shifted))
    )
    recording = Recording(tmp_path)
    assert len(recording.documents()) == 6 and recording.overlaps == 2
    (problem,) = recording.problems
    assert problem.path.name == segment_of(shifted) and "2 intervals overlap" in problem.reason


def segment_of(docs: list[HistDocument]) -> str:
    return segment_name(docs[0].start_ns)


def test_a_second_writer_is_refused_until_the_first_is_gone(tmp_path: Path) -> None:
    first = RecordingWriter(tmp_path)
    with pytest.raises(
        RecordingBusyError, match=rf"another writer records there \(pid {os.getpid()}\)"
    ) as err:
        RecordingWriter(tmp_path)
    assert err.value.errno == errno.EBUSY
    first.close()
    with RecordingWriter(tmp_path) as second:
        second.append(make_documents(1)[0])
    with pytest.raises(ValueError, match="closed"):
        second.append(make_documents(1)[0])
    # A writer that died (however) leaves the directory free.
    killed_writer(tmp_path, make_documents(2, seed=16))
    RecordingWriter(tmp_path).close()


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_permissions_private_by_default_and_group_readable_on_request(tmp_path: Path) -> None:
    old_umask = os.umask(0o002)  # a permissive umask must not widen them
    try:
        with RecordingWriter(tmp_path / "private") as writer:
            writer.append(make_documents(1)[0])
        (segment,) = list_segments(tmp_path / "private")
        assert mode(tmp_path / "private") == 0o700
        assert mode(segment) == mode(tmp_path / "private" / ".lock") == 0o600
        group = grp.getgrgid(os.getgid() if os.getgid() else 1)  # any group but ours
        os.umask(0o077)  # nor a strict one narrow the group's
        with RecordingWriter(tmp_path / "shared", group=group.gr_name) as writer:
            writer.append(make_documents(1)[0])
        (segment,) = list_segments(tmp_path / "shared")
        assert mode(tmp_path / "shared") == 0o750 and mode(segment) == 0o640
        assert (tmp_path / "shared").stat().st_gid == segment.stat().st_gid == group.gr_gid
    finally:
        os.umask(old_umask)
    with pytest.raises(ValueError, match="no group named 'no-such-group-x'"):
        RecordingWriter(tmp_path / "x", group="no-such-group-x")


@contextlib.contextmanager
def small_tmpfs(directory: Path, size: str) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    directory.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)], check=True
    )
    try:
        yield directory
    finally:
        subprocess.run(["umount", "-l", str(directory)], check=True)


def test_full_disk_raises_enospc_and_keeps_every_complete_interval(tmp_path: Path) -> None:
    docs = make_documents(400, seed=17, cgroups=30)
    with small_tmpfs(tmp_path / "fs", "64k") as fs:
        writer = RecordingWriter(fs / "rec", segment_bytes=20_000)  # several segments
        written = 0
        with pytest.raises(OSError) as raised:
            for doc in docs:
                writer.append(doc)
                written += 1
        assert raised.value.errno == errno.ENOSPC
        assert written > 5
        # Nothing half-written: every byte on disk belongs to a complete record.
        recording = Recording(fs / "rec")
        assert texts(recording.documents()) == texts(docs[:written])
        assert recording.problems == [] and recording.skipped_bytes == 0
        sizes = sum(p.stat().st_size for p in list_segments(fs / "rec"))
        headers = len(list_segments(fs / "rec")) * len(SEGMENT_HEADER)
        assert sizes == headers + sum(len(encode_record(d)) for d in docs[:written])
        # Space comes back (retention, an operator): the same writer carries on.
        for path in list_segments(fs / "rec")[:-1]:
            path.unlink()
        writer.append(docs[written])
        writer.close()
        assert texts(Recording(fs / "rec").documents())[-1] == docs[written].dumps()


def test_retention_by_bytes_keeps_the_newest(tmp_path: Path) -> None:
    docs = make_documents(60, seed=4)
    record_bytes = max(len(encode_record(d)) for d in docs)
    max_bytes = 8 * record_bytes
    with RecordingWriter(tmp_path, max_bytes=max_bytes, segment_bytes=2 * record_bytes) as writer:
        for doc in docs:
            writer.append(doc)
            writer.apply_retention()
            total = sum(p.stat().st_size for p in list_segments(tmp_path))
            assert total <= max_bytes + 2 * record_bytes + len(SEGMENT_HEADER)
    kept = Recording(tmp_path).documents()
    assert texts(kept) == texts(docs[-len(kept) :])  # a contiguous newest suffix
    assert 4 <= len(kept) < len(docs)


def test_retention_by_age(tmp_path: Path) -> None:
    docs = make_documents(6, seed=5)
    for doc in docs[:4]:
        with RecordingWriter(tmp_path) as old:  # four closed segments
            old.append(doc)
    now_s = 2_000_000_000.0
    segments = list_segments(tmp_path)
    for age_s, segment in zip((4000, 3000, 100, 10), segments, strict=True):
        os.utime(segment, (now_s - age_s, now_s - age_s))
    writer = RecordingWriter(tmp_path, max_age_s=3600)
    writer.append(docs[4])
    removed = writer.apply_retention(now_s)
    writer.close()
    assert removed == segments[:1]
    assert texts(Recording(tmp_path).documents()) == texts(docs[1:5])


def test_range_and_label_queries_match_the_documents(tmp_path: Path) -> None:
    docs = make_documents(20, seed=6)
    with RecordingWriter(tmp_path, segment_bytes=1_500) as writer:
        for doc in docs:
            writer.append(doc)
    assert len(list_segments(tmp_path)) > 2
    recording = Recording(tmp_path)
    since, until = T0_NS + 5 * INTERVAL_NS + 1, T0_NS + 12 * INTERVAL_NS - 1
    expected_docs = docs[5:12]
    (series,) = recording.series(since, until, labels={"cgroup": "/g1"})
    assert series.labels == {"probe": "runqueue", "cgroup": "/g1"}
    assert series.times_ns.tolist() == [d.end_ns for d in expected_docs]
    assert series.start_ns.tolist() == [d.start_ns for d in expected_docs]
    assert series.counts.shape == (len(expected_docs), NUM_BUCKETS + 1)
    for t, doc in enumerate(expected_docs):
        found = doc.find(cgroup="/g1")
        if not found:
            assert not series.counts[t].any() and series.sum_ns[t] == 0
            continue
        hist = found[0].hist
        assert series.counts[t, :NUM_BUCKETS].tolist() == hist.counts.tolist()
        assert series.counts[t, NUM_BUCKETS] == hist.overflow
        assert series.sum_ns[t] == hist.sum_ns
    assert {s.labels["cgroup"] for s in recording.series()} == {"/g0", "/g1", "/g2"}
    assert recording.series(labels={"cgroup": "/nope"}) == []
    (counter,) = recording.counters(since, until)
    assert counter.values.tolist() == list(range(5, 12))
