"""Recording store: round trip, torn tails and corruption, restarts, retention, and range / label
queries checked against the documents themselves."""

from __future__ import annotations

import os
import struct
import tempfile
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tailsight.collector.store import (
    RECORD_MAGIC,
    SEGMENT_HEADER,
    Recording,
    RecordingWriter,
    encode_record,
    list_segments,
    scan_segment,
)
from tailsight.hist import NUM_BUCKETS, Histogram
from tailsight.histfile import Counter, HistDocument, Series

INTERVAL_NS = 1_000_000_000
T0_NS = 1_700_000_000 * 10**9


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
    # Layout by hand (docs/recording.md): header, then magic | len | crc32 | canonical text.
    assert data.startswith(SEGMENT_HEADER)
    position = len(SEGMENT_HEADER)
    for doc in docs:
        payload = doc.dumps().encode()
        assert data[position : position + 12] == struct.pack(
            "<4sII", RECORD_MAGIC, len(payload), zlib.crc32(payload)
        )
        assert data[position + 12 : position + 12 + len(payload)] == payload
        position += 12 + len(payload)
    assert position == len(data)
    assert texts(Recording(tmp_path).documents()) == texts(docs)


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


def test_restart_appends_in_a_new_segment(tmp_path: Path) -> None:
    docs = make_documents(6, seed=3)
    crashed = RecordingWriter(tmp_path)
    for doc in docs[:3]:
        crashed.append(doc)
    # No close(): a killed writer. Its torn last record stays at the end of its own segment.
    assert crashed.segment is not None
    with crashed.segment.open("ab") as handle:
        handle.write(encode_record(docs[3])[:25])
    with RecordingWriter(tmp_path) as restarted:
        for doc in docs[3:]:
            restarted.append(doc)
    assert len(list_segments(tmp_path)) == 2
    recording = Recording(tmp_path)
    assert texts(recording.documents()) == texts(docs)
    assert recording.skipped_bytes == 25
    crashed.close()


def test_partial_segment_header_is_an_empty_segment(tmp_path: Path) -> None:
    (tmp_path / "00000000000000000005-0000.tsrec").write_bytes(SEGMENT_HEADER[:7])
    assert Recording(tmp_path).documents() == []
    (tmp_path / "00000000000000000006-0000.tsrec").write_bytes(b"garbage here")
    with pytest.raises(ValueError, match="not a tailsight recording segment"):
        scan_segment(tmp_path / "00000000000000000006-0000.tsrec")


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
    with RecordingWriter(tmp_path, segment_bytes=8_000) as writer:
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
