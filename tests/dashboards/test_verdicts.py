"""Live jump verdicts on a synthetic incident with a known change interval and aggressor: the
verdict comes within a few intervals of the change, names /batch, is exported while active and
then expires; its Grafana annotation reaches the Grafana API double with the jump's times."""

from __future__ import annotations

import pytest
from dashboard_incident import AGGRESSOR, VICTIM, incident
from grafana_double import grafana_double

from tailsight.analysis.verdicts import JumpVerdicts, Verdict
from tailsight.cli.wiring import live_verdicts
from tailsight.collector.exporter import PrometheusExporter
from tailsight.dashboards.annotations import GrafanaAnnotator
from tests.analysis.synthetic import INTERVAL_NS, START_NS

CHANGE = 45  # after the detector's 30 reference intervals
HOLD = 10
TOKEN = "glsa_verdicts"


def _samples(verdicts: JumpVerdicts) -> dict[str, list[tuple[dict[str, str], float]]]:
    return {
        family.name: [(dict(labels), value) for _, labels, _, value in family.samples]
        for family in verdicts.families()
    }


def test_verdict_names_the_aggressor_soon_after_the_change_then_expires() -> None:
    verdicts = JumpVerdicts(hold_intervals=HOLD)
    found: list[tuple[int, Verdict]] = []
    exported_while_active = None
    for t, document in enumerate(incident(change_at=CHANGE, intervals=CHANGE + 2 * HOLD)):
        for verdict in verdicts.update(document):
            found.append((t, verdict))
            exported_while_active = _samples(verdicts)
    runqueue = [(t, v) for t, v in found if v.labels == {"probe": "runqueue", "cgroup": VICTIM}]
    assert len(runqueue) == 1, found
    alarm_at, verdict = runqueue[0]
    assert CHANGE <= alarm_at <= CHANGE + 3
    # Dated by the CUSUM's last zero: at the change or the interval before it.
    assert abs(verdict.jump.change_start_ns - (START_NS + CHANGE * INTERVAL_NS)) <= INTERVAL_NS
    assert verdict.jump.after_ns > 1.5 * verdict.jump.before_ns
    top, share = verdict.aggressor_shares[0]
    assert top == AGGRESSOR and share > 0.8
    assert exported_while_active is not None
    (jump,) = [
        s
        for s in exported_while_active["tailsight_tail_jump"]
        if s[0]["cgroup"] == VICTIM and s[0]["probe"] == "runqueue"
    ]
    assert jump[1] == 1.0 and jump[0]["q"] == "0.99" and jump[0]["direction"] == "up"
    (before,) = [
        v
        for labels, v in exported_while_active["tailsight_tail_jump_p99_before_seconds"]
        if labels["probe"] == "runqueue"
    ]
    assert before == verdict.jump.before_ns / 1e9  # seconds
    shares = exported_while_active["tailsight_tail_jump_aggressor_share"]
    assert any(labels["aggressor"] == AGGRESSOR for labels, _ in shares)
    # HOLD intervals after the alarm the verdict is no longer active.
    assert verdicts.active == []
    assert _samples(verdicts)["tailsight_tail_jump"] == []


def test_no_verdict_without_a_change() -> None:
    verdicts = JumpVerdicts()
    for document in incident(change_at=10_000, intervals=90):
        assert verdicts.update(document) == []


def test_each_new_verdict_becomes_one_grafana_annotation() -> None:
    with grafana_double(TOKEN) as grafana:
        logged: list[str] = []
        annotator = GrafanaAnnotator(grafana.url, TOKEN, logged.append)
        verdicts = JumpVerdicts(annotate=annotator.post)
        for document in incident(change_at=CHANGE, intervals=CHANGE + 10):
            verdicts.update(document)
        assert logged == []
        runqueue = [a for a in grafana.annotations if "runqueue" in a["tags"]]
        assert len(runqueue) == 1, grafana.annotations
        (note,) = runqueue
        assert note["tags"][:2] == ["tailsight", "tail-jump"]
        assert abs(note["time"] - (START_NS + CHANGE * INTERVAL_NS) // 1_000_000) <= 1000
        assert note["timeEnd"] >= note["time"]
        assert VICTIM in note["text"] and AGGRESSOR in note["text"]
        calls = {(r.method, r.path) for r in grafana.requests}
        assert calls == {("POST", "/api/annotations")}


def test_an_unreachable_grafana_is_logged_not_raised() -> None:
    with grafana_double(TOKEN) as grafana:
        url = grafana.url
    logged: list[str] = []
    annotator = GrafanaAnnotator(url, TOKEN, logged.append)
    verdicts = JumpVerdicts(annotate=annotator.post)
    for document in incident(change_at=CHANGE, intervals=CHANGE + 5):
        verdicts.update(document)
    assert logged and all("grafana annotation failed" in line for line in logged)


def test_serve_posts_annotations_only_with_url_and_token(monkeypatch: pytest.MonkeyPatch) -> None:
    exporter = PrometheusExporter()
    monkeypatch.delenv("TAILSIGHT_GRAFANA_URL", raising=False)
    monkeypatch.delenv("TAILSIGHT_GRAFANA_TOKEN", raising=False)
    assert live_verdicts(exporter, print).annotate is None
    with grafana_double(TOKEN) as grafana:
        monkeypatch.setenv("TAILSIGHT_GRAFANA_URL", grafana.url)
        monkeypatch.setenv("TAILSIGHT_GRAFANA_TOKEN", TOKEN)
        verdicts = live_verdicts(exporter, print)
        assert verdicts.annotate is not None
        # Only cgroups the exporter labels get a detector (bounded memory).
        for document in incident(change_at=CHANGE, intervals=5):
            exporter.update(document)
            verdicts.update(document)
        assert {dict(key)["cgroup"] for key, _ in verdicts._detectors} == exporter.kept_cgroups(
            "runqueue"
        )


def test_active_verdict_is_in_the_exporters_exposition() -> None:
    """Wired as the agent wires it: the verdict families are served with the exporter's own and
    the exposition rendered after the interval that raised the alarm already shows the jump."""
    exporter = PrometheusExporter()
    verdicts = JumpVerdicts(hold_intervals=HOLD)
    exporter.extra_families.append(verdicts.families)
    seen = b""
    for document in incident(change_at=CHANGE, intervals=CHANGE + 3):
        alarms = verdicts.update(document)
        exporter.update(document)
        if alarms:
            seen = exporter.exposition()
    line = next(x for x in seen.splitlines() if x.startswith(b"tailsight_tail_jump{"))
    assert f'cgroup="{VICTIM}"'.encode() in line and line.endswith(b" 1.0")
    assert f'aggressor="{AGGRESSOR}"'.encode() in seen


def test_detectors_of_series_that_stopped_are_dropped() -> None:
    """A removed cgroup's detector (dense reference rows) must not outlive it: churn would grow
    the agent without bound."""
    verdicts = JumpVerdicts(idle_intervals=20)
    documents = incident(change_at=10_000, intervals=45)
    for document in documents[:5]:
        verdicts.update(document)
    held = {key for key, _ in verdicts._detectors}
    assert {dict(key)["cgroup"] for key in held} == {VICTIM, AGGRESSOR}
    for document in documents[5:]:  # the aggressor's cgroup is gone: only the victim reports
        document.series = [s for s in document.series if s.labels.get("cgroup") != AGGRESSOR]
        verdicts.update(document)
    assert {dict(key)["cgroup"] for key, _ in verdicts._detectors} == {VICTIM}


def test_the_statistics_library_loads_when_the_verdicts_start_not_in_an_interval() -> None:
    """scipy.stats' first import takes ~0.5 s; inside the interval that sets the detectors'
    first references (the 30th) it held that interval up. A fresh interpreter shows where it
    loads."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from tailsight.analysis.verdicts import JumpVerdicts\n"
        "before = 'scipy.stats' in sys.modules\n"
        "JumpVerdicts()\n"
        "print(before, 'scipy.stats' in sys.modules)\n"
    )
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert shown.stdout.split() == ["False", "True"]
