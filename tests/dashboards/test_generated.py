"""The committed dashboard JSON is what the code builds; the provisioning folder points Grafana at
it and at a Prometheus whose scrape interval the rate windows respect; every panel query follows
the conventions (data source variable, seconds, rate windows of $__rate_interval)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import yaml
from dashboard_queries import QUOTED, expressions, panels
from typer.testing import CliRunner

from tailsight.cli.main import app
from tailsight.dashboards import metrics
from tailsight.dashboards.generate import (
    BUILDERS,
    GENERATED_DIR,
    PROVISIONING_DIR,
    render,
    to_text,
)

runner = CliRunner()
RANGE = re.compile(r"\[([^\]]+)\]")


def test_committed_json_is_in_sync_with_the_code() -> None:
    committed = sorted(p.name for p in GENERATED_DIR.glob("*.json"))
    assert committed == sorted(f"{name}.json" for name in BUILDERS)
    for name in BUILDERS:
        text = (GENERATED_DIR / f"{name}.json").read_text(encoding="utf-8")
        assert text == to_text(render(name)), (
            f"dashboards/generated/{name}.json is stale: run `tailsight dashboards generate`"
        )


def test_generate_check_detects_a_stale_file(tmp_path: Path) -> None:
    for name in BUILDERS:
        shutil.copy(GENERATED_DIR / f"{name}.json", tmp_path)
    ok = runner.invoke(app, ["dashboards", "generate", "--out", str(tmp_path), "--check"])
    assert ok.exit_code == 0, ok.stderr
    stale = tmp_path / "trading.json"
    stale.write_text(stale.read_text().replace("Tick-to-trade", "Tick to trade"))
    result = runner.invoke(app, ["dashboards", "generate", "--out", str(tmp_path), "--check"])
    assert result.exit_code == 1
    assert "trading.json" in result.stderr


def test_generate_writes_every_dashboard_and_refuses_a_missing_directory(tmp_path: Path) -> None:
    result = runner.invoke(app, ["dashboards", "generate", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.stderr
    for name in BUILDERS:
        assert (tmp_path / f"{name}.json").read_text() == to_text(render(name))
    missing = runner.invoke(app, ["dashboards", "generate", "--out", str(tmp_path / "nope")])
    assert missing.exit_code == 2
    assert not (tmp_path / "nope").exists()


def test_panels_follow_the_conventions() -> None:
    uids = set()
    for name in BUILDERS:
        document = render(name)
        uids.add(document["uid"])
        assert document["tags"] == ["tailsight"]
        ids = [p["id"] for p in document["panels"]]
        assert len(ids) == len(set(ids))
        for panel in panels(document):
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert panel.get("targets"), panel["title"]
            unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit")
            if panel["type"] == "timeseries":
                assert unit in {"s", "ops", "percentunit"}, (panel["title"], unit)
            if panel["type"] == "heatmap":
                assert panel["options"]["yAxis"]["unit"] == "s"
                assert panel["options"]["calculate"] is False
        for expr in expressions(document):
            for window in RANGE.findall(QUOTED.sub("", expr)):
                assert window in ("$__rate_interval", "$__range"), (name, expr)
    assert len(uids) == len(BUILDERS)


def test_every_latency_panel_queries_a_seconds_metric() -> None:
    for name in BUILDERS:
        for expr in expressions(render(name)):
            for metric_name in re.findall(r"tailsight_[a-z0-9_]+", expr):
                if metric_name.endswith(("_bucket", "_count")):
                    assert "_seconds_" in metric_name, expr


def test_root_cause_has_the_victim_variable_and_jump_annotations() -> None:
    document = render("root-cause")
    names = [v["name"] for v in document["templating"]["list"]]
    assert names == ["datasource", "victim", "window"]
    annotations = document["annotations"]["list"]
    assert any(metrics.TAIL_JUMP in a.get("expr", "") for a in annotations)
    assert any(a.get("target", {}).get("tags") == ["tailsight", "tail-jump"] for a in annotations)
    exprs = expressions(document)
    assert any(metrics.DISPLACED_WAIT in e and "by (aggressor)" in e for e in exprs)
    stacked = [
        p
        for p in panels(document)
        if any(metrics.DISPLACED_WAIT in t["expr"] for t in p["targets"])
        and p["type"] == "timeseries"
    ]
    assert stacked[0]["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] == "normal"


def test_provisioning_points_at_the_generated_dashboards_and_a_prometheus() -> None:
    (provider,) = yaml.safe_load((PROVISIONING_DIR / "dashboards" / "tailsight.yaml").read_text())[
        "providers"
    ]
    assert provider["type"] == "file" and provider["folderUid"] == "tailsight"
    assert provider["options"]["path"].startswith("/")
    (source,) = yaml.safe_load((PROVISIONING_DIR / "datasources" / "prometheus.yaml").read_text())[
        "datasources"
    ]
    assert source["type"] == "prometheus" and source["access"] == "proxy"
    # $__rate_interval = max(4 x timeInterval, step + timeInterval): it needs the scrape interval.
    assert re.fullmatch(r"\d+s", source["jsonData"]["timeInterval"])


def test_throttling_and_stall_panels_name_the_limit_and_the_resource() -> None:
    for name, subject in (("root-cause", 'cgroup="$victim"'), ("overview", 'cgroup=~"$cgroup"')):
        targets = [(p, t) for p in panels(render(name)) for t in p["targets"]]
        throttling = {
            p["fieldConfig"]["defaults"]["unit"]: t
            for p, t in targets
            if "tailsight_throttle_" in t["expr"]
        }
        per_limit = "sum by (cgroup, cpu_max) (rate({}{{" + subject + "}}[$__rate_interval]))"
        assert throttling["s"]["expr"] == per_limit.format(metrics.THROTTLE_THROTTLED_TIME)
        assert throttling["percentunit"]["expr"] == " / ".join(
            per_limit.format(counter)
            for counter in (metrics.THROTTLE_THROTTLED_PERIODS, metrics.THROTTLE_PERIODS)
        )
        assert all("{{cpu_max}}" in t["legendFormat"] for t in throttling.values()), throttling
        stalls = [t for _, t in targets if "tailsight_pressure_" in t["expr"]]
        assert any(metrics.PRESSURE_SOME in t["expr"] and subject in t["expr"] for t in stalls)
        assert any(metrics.PRESSURE_HOST_SOME in t["expr"] for t in stalls)
        for target in stalls:
            assert re.match(r"sum by \((cgroup, )?resource\)", target["expr"]), target
            assert "{{resource}}" in target["legendFormat"], target
