"""Test support: a real Prometheus (Debian's ``prometheus``) on a free loopback port, scraping
the given targets or serving a backfilled TSDB, and a small client for its HTTP API (instant and
range queries, label values: what Grafana's data source and ``explain --prometheus`` ask)."""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tailsight.testing.workload import stop_process

PROMETHEUS = "/usr/bin/prometheus"
PROMTOOL = "/usr/bin/promtool"


def free_port() -> int:
    with contextlib.closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Prometheus:
    url: str

    def _get(self, path: str, params: Mapping[str, str]) -> Any:
        query = urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=30) as response:
                return json.load(response)
        except urllib.error.HTTPError as error:  # 400 / 422: the body says why
            return json.load(error)

    def range_query(self, expr: str, start: float, end: float, step_s: float) -> Any:
        """The raw answer (``status``, ``data`` or ``error``) of /api/v1/query_range."""
        params = {"query": expr, "start": str(start), "end": str(end), "step": str(step_s)}
        return self._get("/api/v1/query_range", params)

    def query(self, expr: str) -> list[dict[str, Any]]:
        body = self._get("/api/v1/query", {"query": expr})
        assert body["status"] == "success", (expr, body)
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def scalar(self, expr: str) -> float:
        result = self.query(expr)
        assert len(result) == 1, (expr, result)
        return float(result[0]["value"][1])

    def label_values(self, label: str, metric: str) -> list[str]:
        """What Grafana's ``label_values(metric, label)`` variable query lists."""
        body = self._get(f"/api/v1/label/{label}/values", {"match[]": metric})
        assert body["status"] == "success", body
        values: list[str] = body["data"]
        return values


def _duration(seconds: float) -> str:
    return f"{round(seconds * 1000)}ms"


@contextlib.contextmanager
def prometheus_scraping(
    targets: Mapping[str, Sequence[str]],
    tmp_path: Path,
    interval_s: float = 1.0,
    tsdb: Path | None = None,
    web_config: str | None = None,
) -> Iterator[Prometheus]:
    """Prometheus scraping ``{job: ["host:port", ...]}`` every ``interval_s`` (no targets: it
    only serves ``tsdb``, e.g. blocks backfilled by ``promtool``; nothing is dropped by age).
    ``web_config``: its ``--web.config.file`` (TLS, basic auth); https if it sets TLS."""
    jobs = (
        "".join(
            f"  - job_name: {job}\n    static_configs:\n"
            f"      - targets: {json.dumps(list(where))}\n"
            for job, where in targets.items()
        )
        or "  []\n"
    )
    config = tmp_path / "prometheus.yml"
    config.write_text(
        f"global:\n  scrape_interval: {_duration(interval_s)}\n"
        f"  scrape_timeout: {_duration(interval_s * 0.9)}\n"
        f"scrape_configs:\n{jobs}"
    )
    port = free_port()
    extra = []
    scheme = "http"
    if web_config is not None:
        (tmp_path / "web.yml").write_text(web_config)
        extra.append(f"--web.config.file={tmp_path / 'web.yml'}")
        scheme = "https" if "tls_server_config" in web_config else "http"
    proc = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={config}",
            f"--storage.tsdb.path={tsdb or tmp_path / 'tsdb'}",
            "--storage.tsdb.retention.time=100y",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
            *extra,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        prometheus = Prometheus(f"{scheme}://127.0.0.1:{port}")
        deadline = time.monotonic() + 60
        unverified = ssl._create_unverified_context()  # readiness only: any answer will do
        while True:
            assert proc.poll() is None, "prometheus exited"
            try:
                with urllib.request.urlopen(
                    f"{prometheus.url}/-/ready", timeout=2, context=unverified
                ):
                    break
            except urllib.error.HTTPError as error:
                if error.code == 401:
                    break  # up, and asking for the credentials (503: still starting)
            except OSError:
                pass
            assert time.monotonic() < deadline, "prometheus not ready after 60 s"
            time.sleep(0.2)
        yield prometheus
    finally:
        stop_process(proc, 15)
