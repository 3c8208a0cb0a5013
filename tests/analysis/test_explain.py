"""``explain_documents`` on synthetic recordings with a known incident: the jump's interval, the
victim, the aggressor, the stack and the volume/rate split are known by construction; plus the
text (80 columns), strict JSON and the offline HTML report checked structurally."""

from __future__ import annotations

import json
import math
import re
import xml.etree.ElementTree as ET
from collections.abc import Sequence

import numpy as np

from tailsight.analysis.explain.html import render_html
from tailsight.analysis.explain.model import ExplainConfig, Report
from tailsight.analysis.explain.pipeline import explain_documents
from tailsight.analysis.explain.text import describe_report, jump_sentences, report_json
from tailsight.intervals import Counter, Series
from tailsight.testing.eval import LatencyModel
from tests.analysis.synthetic import (
    COMMON_STACK,
    SPIKE_STACK,
    Interval,
    hist,
    hog_documents,
    incident_documents,
    mix_documents,
    timeline,
)


def _find(report: Report, **labels: str) -> list[int]:
    return [n for n, j in enumerate(report.jumps) if dict(j.series) == labels]


def test_incident_names_victim_aggressor_and_stack() -> None:
    documents = incident_documents()
    report = explain_documents(documents, config=ExplainConfig(n_boot=200))
    found = _find(report, probe="runqueue", cgroup="/trading")
    assert found, [j.series for j in report.jumps]
    jump = report.jumps[found[0]]
    assert jump.direction == "up"
    assert abs(jump.change_index - 30) <= 1
    # P99 before/after agree with the pooled histograms of the true segments (within a bucket).
    rows = [d.find(cgroup="/trading")[0].hist for d in documents]
    truth_before = sum(rows[1:30], rows[0]).quantile(0.99)
    truth_after = sum(rows[31:], rows[30]).quantile(0.99)
    assert abs(jump.before_ns - truth_before) <= 0.1 * truth_before
    assert abs(jump.after_ns - truth_after) <= 0.1 * truth_after
    # The leaf series is its own single source: all of its excess is its rate.
    assert [s.source for s in jump.decomposition.sources] == [jump.series]
    assert jump.decomposition.rate_share.value > 0.95
    displacement = jump.displacement
    assert displacement is not None and displacement.victim == "/trading"
    top = displacement.aggressors[0]
    assert top.aggressor == "/batch"
    assert top.share.low <= 1.0 <= top.share.high or top.share.value > 0.9
    assert top.share_of_wait_before < 0.3 < 0.7 < top.share_of_wait_after
    assert jump.stacks[0].kernel_stack == SPIKE_STACK and jump.stacks[0].discovered
    assert not [s for s in jump.stacks if s.kernel_stack == COMMON_STACK and s.discovered]
    # Nothing changed in /batch or / : no jump reported there.
    assert not _find(report, probe="runqueue", cgroup="/batch")
    assert not _find(report, probe="runqueue", cgroup="/")
    text = describe_report(report)
    assert all(len(line) <= 80 for line in text.splitlines()), text
    words = " ".join(text.split())
    assert "run-queue wait of /trading rose" in words and "displaced by /batch" in words


def test_mix_shift_is_reported_as_volume_of_the_slow_source() -> None:
    report = explain_documents(mix_documents(), config=ExplainConfig(n_boot=200))
    found = _find(report, probe="netsyscall")
    assert found, [j.series for j in report.jumps]
    jump = report.jumps[found[0]]
    assert jump.aggregate and abs(jump.change_index - 25) <= 1
    d = jump.decomposition
    assert dict(d.sources[0].source)["cgroup"] == "/slow"
    # The truth: all of the excess is volume (neither source's own tail moved).
    assert d.volume_share.value > 0.9 and d.volume_share.low <= 1.0 <= d.volume_share.high
    assert d.rate_share.low <= 0.0 <= d.rate_share.high
    assert math.isclose(sum(s.share.value for s in d.sources), 1.0)
    # Neither leaf moved, so neither is reported as a jump of its own.
    assert not [j for j in report.jumps if not j.aggregate]
    assert "more traffic" in " ".join(describe_report(report).split())


def test_stationary_recording_has_no_jumps() -> None:
    rng = np.random.default_rng(7)

    def interval(t: int, late: bool) -> Interval:
        series = [
            Series({"probe": "runqueue", "cgroup": f"/g{g}"}, hist(LatencyModel(), rng, 3000))
            for g in range(4)
        ]
        return series, []

    report = explain_documents(timeline(interval), config=ExplainConfig(n_boot=50))
    assert report.jumps == []
    assert report.tested == 5  # four cgroups and their {probe} aggregate
    assert "0 jumps" in " ".join(describe_report(report).split())


def test_selector_and_json_are_strict() -> None:
    documents = incident_documents(seed=3)
    report = explain_documents(documents, {"cgroup": "/batch"}, ExplainConfig(n_boot=50))
    assert report.jumps == []
    report = explain_documents(documents, config=ExplainConfig(n_boot=50))
    text = json.dumps(report_json(report), allow_nan=False)
    back = json.loads(text)
    assert back["jumps"][0]["summary"][0].startswith("run-queue wait of /trading rose")
    shares = back["jumps"][0]["displacement"]["aggressors"]
    assert math.isclose(sum(a["share"]["value"] for a in shares), 1.0)


def test_empty_range() -> None:
    report = explain_documents([])
    assert report.jumps == [] and "nothing to explain" in describe_report(report)


# -- HTML ----------------------------------------------------------------------------------------

SVG = "{http://www.w3.org/2000/svg}"


def _elements(root: ET.Element, tag: str) -> Sequence[ET.Element]:
    return [e for e in root.iter() if e.tag in (tag, SVG + tag)]


def test_html_is_self_contained_and_marks_the_jump() -> None:
    documents = incident_documents()
    report = explain_documents(documents, config=ExplainConfig(n_boot=100))
    page = render_html(report, documents)
    assert page.startswith("<!DOCTYPE html>")
    # Offline: no script, no external fetch of any kind.
    assert not re.search(r"<script|<link|<iframe|@import|url\(", page, re.IGNORECASE)
    assert not re.search(r"(src|href)\s*=\s*[\"']?(https?:)?//", page, re.IGNORECASE)
    root = ET.fromstring(page.removeprefix("<!DOCTYPE html>"))  # well-formed (XHTML-style)
    svgs = _elements(root, "svg")
    assert len(svgs) >= 3 * len(report.jumps)
    jump = report.jumps[0]
    # The quantile plot: one polyline per plotted quantile, one point per non-empty interval.
    lines = [p for p in _elements(root, "polyline") if p.get("data-series") == "p99"]
    assert lines and len(lines[0].get("points", "").split()) == len(documents)
    marker = [e for e in _elements(root, "line") if e.get("data-role") == "change"]
    assert marker and marker[0].get("data-index") == str(jump.change_index)
    # The heatmap: one column of cells per interval; the share bars: one per aggressor.
    cells = [r for r in _elements(root, "rect") if r.get("data-role") == "cell"]
    assert {int(c.get("data-t", "-1")) for c in cells} == set(range(len(documents)))
    bars = [r for r in _elements(root, "rect") if r.get("data-role") == "share"]
    assert bars
    assert "run-queue wait of /trading" in page


# -- falls, and shares of a rise beside them -----------------------------------------------------


PERCENT = re.compile(r"(-?\d+)%")


def test_falls_are_not_jumps_by_default() -> None:
    """The hog's falling P99 is no jump, so it is not 'explained' with the victim's
    displacement; on request it is listed alone, without causes."""
    documents = hog_documents()
    report = explain_documents(documents, config=ExplainConfig(n_boot=200))
    assert [j.labels.get("cgroup") for j in report.jumps] == ["/victim"]
    assert all(j.direction == "up" for j in report.jumps)
    assert report.falls_hidden == 1
    words = " ".join(describe_report(report).split())
    assert "/hog rose" not in words and "/hog fell" not in words
    assert "1 tail got faster (not shown; --falls)" in words
    # On request the fall is listed, alone and without causes.
    shown = explain_documents(documents, config=ExplainConfig(n_boot=200, falls=True))
    falls = [i for i in shown.incidents if i.headline.direction == "down"]
    assert [i.headline.labels["cgroup"] for i in falls] == ["/hog"]
    assert falls[0].causes == [] and len(jump_sentences(falls[0].headline)) == 1
    assert "run-queue wait of /hog fell" in " ".join(describe_report(shown).split())


def test_shares_stay_in_range_and_falls_are_said_in_units() -> None:
    """With idle's displaced wait falling, shares of the net excess would be 117 % for /hog and
    -13 % for idle. Shares are of the gross rise, in [0, 1], summing to 1; what fell is said in
    milliseconds."""
    report = explain_documents(hog_documents(), config=ExplainConfig(n_boot=200))
    jump = report.jumps[0]
    assert jump.displacement is not None
    shares = {a.aggressor: a.share for a in jump.displacement.aggressors}
    for share in shares.values():
        assert 0.0 <= share.value <= 1.0
        assert 0.0 <= share.low <= share.value <= share.high <= 1.0 or math.isnan(share.low)
    assert math.isclose(sum(s.value for s in shares.values()), 1.0)
    # Ground truth: /hog went 0 -> 20 ms, / stayed at 1 ms, idle fell 4 -> 1 ms per interval.
    assert shares["/hog"].value > 0.9 and shares["idle"].value == 0.0
    text = describe_report(report)
    percents = [int(p) for p in PERCENT.findall(text)]
    assert percents and all(0 <= p <= 100 for p in percents), text
    words = " ".join(text.split())
    assert "displaced by /hog (new)" in words
    assert "less time went to an idle CPU (nobody) (-" in words
    assert "Likely cause: /victim waited for CPUs held by /hog, new since the change" in words


def test_headline_is_the_newcomers_victim_not_the_tasks_it_crowded() -> None:
    # A hog (/noisy, new) takes /trading's CPU; /crowd, pushed onto the other CPU, now waits on
    # /exchange there and moves more (x10 against x3). One incident: its headline and first cause
    # are /trading displaced by /noisy.
    rng = np.random.default_rng(7)
    base = LatencyModel()
    slower = {
        "/trading": base.with_component(0.05, 400_000.0, 0.3),
        "/crowd": base.with_component(0.05, 4_000_000.0, 0.3),
    }
    waits = {  # displaced wait (ms per interval) of each victim by each aggressor: before, after
        "/trading": {"/noisy": (1.0, 200.0), "/exchange": (2.0, 2.0)},
        "/crowd": {"/noisy": (1.0, 5.0), "/exchange": (100.0, 400.0)},  # as in the demo
    }

    def interval(t: int, late: bool) -> Interval:
        series, counters = [], []
        for victim, after in slower.items():
            model = after if late else base
            series.append(Series({"probe": "runqueue", "cgroup": victim}, hist(model, rng, 3000)))
            # The hog shows a little before the change: it started inside that interval.
            for aggressor, (before_ms, after_ms) in waits[victim].items():
                mean_ns = (after_ms if late else before_ms) * 1e6
                labels = {"probe": "runqueue", "victim": victim, "aggressor": aggressor}
                wait = int(rng.gamma(8.0, mean_ns / 8))
                switches = int(rng.poisson(50))
                counters.append(Counter("runqueue_displaced_wait_ns", labels, wait))
                counters.append(Counter("runqueue_displaced_switches", labels, switches))
        return series, counters

    report = explain_documents(timeline(interval), config=ExplainConfig(n_boot=100))
    assert len(report.incidents) == 1, [i.headline.series for i in report.incidents]
    incident = report.incidents[0]
    assert {j.labels.get("cgroup") for j in incident.jumps} >= {"/trading", "/crowd"}
    assert incident.headline.labels["cgroup"] == "/trading"
    first = incident.causes[0]
    assert first.cgroup == "/trading" and first.labels.get("aggressor") == "/noisy"
