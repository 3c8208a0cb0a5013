"""The streaming explain (three passes over sparse intervals, what ``tailsight explain`` runs on
a recording) gives the same report as the dense oracle on recordings with known jumps:
the same text, the same JSON, the same plot quantiles; read back from a real recording too."""

from __future__ import annotations

from pathlib import Path

import pytest

from tailsight.analysis.explain.model import ExplainConfig, Report
from tailsight.analysis.explain.pipeline import explain_documents, explain_recording
from tailsight.analysis.explain.text import describe_report, report_json
from tailsight.collector.store.reader import Recording
from tailsight.collector.store.writer import RecordingWriter
from tailsight.hist import Histogram
from tailsight.intervals import HistDocument, Series
from tests.analysis.dense_explain import dense_explain
from tests.analysis.synthetic import (
    hog_documents,
    incident_documents,
    migration_documents,
    mix_documents,
    tcp_documents,
)

CONFIG = ExplainConfig(n_boot=60)
CASES = {
    "hog": hog_documents,
    "incident": incident_documents,
    "mix": mix_documents,
    "tcp": tcp_documents,
    "migration": migration_documents,
}


def _same(streamed: Report, dense: Report) -> None:
    assert describe_report(streamed) == describe_report(dense)
    assert report_json(streamed) == report_json(dense)
    assert [j.interval_quantiles_ns for j in streamed.jumps] == [
        j.interval_quantiles_ns for j in dense.jumps
    ]


@pytest.mark.parametrize("case", sorted(CASES))
def test_streaming_equals_dense(case: str, tmp_path: Path) -> None:
    documents: list[HistDocument] = CASES[case]()
    dense = dense_explain(documents, config=CONFIG)
    assert dense.incidents, "the case must have a jump to compare"
    _same(explain_documents(documents, config=CONFIG), dense)
    with RecordingWriter(tmp_path / "rec", fsync=False) as writer:
        for document in reversed(documents):  # file order is not time order: sorted on read
            writer.append(document)
    _same(explain_recording(Recording(tmp_path / "rec"), config=CONFIG), dense)
    # Too big to keep after the first pass: the later passes read the recording again.
    reread = explain_recording(Recording(tmp_path / "rec"), config=CONFIG, cache_bytes=0)
    _same(reread, dense)


def test_streaming_equals_dense_with_selector_and_range(tmp_path: Path) -> None:
    documents = tcp_documents(seed=3)
    with RecordingWriter(tmp_path / "rec", fsync=False) as writer:
        for document in documents:
            writer.append(document)
    since, until = documents[5].end_ns - 1, documents[55].start_ns + 1
    inside = [d for d in documents if d.end_ns > since and d.start_ns < until]
    selector = {"cgroup": "/client"}
    dense = dense_explain(inside, selector, CONFIG)
    assert dense.incidents
    streamed = explain_recording(Recording(tmp_path / "rec"), selector, CONFIG, since, until)
    _same(streamed, dense)
    assert streamed.intervals == len(inside) == 51


@pytest.mark.parametrize("scale", [70_000, 2**33])  # counts beyond uint16, beyond uint32
def test_large_counts_keep_their_width(scale: int, tmp_path: Path) -> None:
    documents = [
        HistDocument(
            d.start_ns,
            d.end_ns,
            [
                Series(s.labels, Histogram(s.hist.counts * scale, overflow=s.hist.overflow))
                for s in d.series
            ],
            d.counters,
        )
        for d in hog_documents()
    ]
    dense = dense_explain(documents, config=CONFIG)
    assert dense.incidents
    with RecordingWriter(tmp_path / "rec", fsync=False) as writer:
        for document in documents:
            writer.append(document)
    _same(explain_recording(Recording(tmp_path / "rec"), config=CONFIG), dense)
