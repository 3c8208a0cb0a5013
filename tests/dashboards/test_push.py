"""`tailsight dashboards push` against a Grafana HTTP API double (grafana_double.py: a real HTTP
server that checks each request against Grafana's documented API; no Grafana runs here)."""

from __future__ import annotations

import json
import socket
from contextlib import closing
from pathlib import Path

from grafana_double import grafana_double
from typer.testing import CliRunner

from tailsight.cli.main import app
from tailsight.dashboards.generate import BUILDERS, GENERATED_DIR

TOKEN = "glsa_double_token_123"
runner = CliRunner()


def _push(url: str, token: str = TOKEN, *extra: str) -> tuple[int, str, str]:
    result = runner.invoke(app, ["dashboards", "push", "--url", url, "--token", token, *extra])
    return result.exit_code, result.stdout, result.stderr


def _committed(name: str) -> dict[str, object]:
    document: dict[str, object] = json.loads((GENERATED_DIR / f"{name}.json").read_text())
    return document


def test_push_creates_the_folder_then_every_dashboard_in_it() -> None:
    with grafana_double(TOKEN) as grafana:
        code, out, err = _push(grafana.url, TOKEN, "--json")
        assert code == 0, err
        calls = [(r.method, r.path) for r in grafana.requests]
        assert calls == [
            ("GET", "/api/folders/tailsight"),
            ("POST", "/api/folders"),
            *[("POST", "/api/dashboards/db")] * len(BUILDERS),
        ]
        assert all(r.headers["authorization"] == f"Bearer {TOKEN}" for r in grafana.requests)
        assert grafana.requests[1].body == {"title": "tailsight", "uid": "tailsight"}
        for request, name in zip(grafana.requests[2:], BUILDERS, strict=True):
            assert request.body["folderUid"] == "tailsight"
            assert request.body["overwrite"] is True
            # What Grafana receives is exactly the committed JSON a file provisioner would load.
            assert request.body["dashboard"] == _committed(name)
        report = json.loads(out)
        uids = {d["uid"] for d in report["dashboards"]}
        assert uids == set(grafana.dashboards) == {_committed(n)["uid"] for n in BUILDERS}
        assert all(d["version"] == 1 and d["url"].startswith("/d/") for d in report["dashboards"])


def test_second_push_reuses_the_folder_and_overwrites() -> None:
    with grafana_double(TOKEN) as grafana:
        assert _push(grafana.url)[0] == 0
        first = len(grafana.requests)
        code, out, err = _push(grafana.url)
        assert code == 0, err
        calls = [(r.method, r.path) for r in grafana.requests[first:]]
        assert ("POST", "/api/folders") not in calls
        assert len(grafana.folders) == 1
        assert {d["version"] for d in grafana.dashboards.values()} == {2}
        assert "version 2" in out


def test_wrong_token_fails_cleanly_and_creates_nothing() -> None:
    with grafana_double(TOKEN) as grafana:
        code, out, err = _push(grafana.url, "not-the-token")
        assert code == 1
        assert "401" in err and "Unauthorized" in err
        assert "Traceback" not in err + out
        assert grafana.folders == {} and grafana.dashboards == {}


def test_unreachable_grafana_is_a_clear_error() -> None:
    with closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connection refused
        code, out, err = _push(f"http://127.0.0.1:{port}")
    assert code == 1
    assert "cannot reach Grafana" in err
    assert "Traceback" not in err + out


def test_bad_url_and_empty_token_are_usage_errors() -> None:
    for url, token in (("grafana:3000", TOKEN), ("http://127.0.0.1:3000", " ")):
        code, out, err = _push(url, token)
        assert code == 2, (url, token, out, err)
        assert "Traceback" not in err + out


def test_token_from_the_environment(tmp_path: Path) -> None:
    with grafana_double(TOKEN) as grafana:
        result = runner.invoke(
            app,
            ["dashboards", "push", "--url", grafana.url],
            env={"TAILSIGHT_GRAFANA_TOKEN": TOKEN},
        )
        assert result.exit_code == 0, result.stderr
        assert len(grafana.dashboards) == len(BUILDERS)
