"""``explain/show --prometheus`` against a real Prometheus: the exporter's exposition of known
synthetic intervals (two hosts, one with an incident, one whose agent restarts) is backfilled
with ``promtool`` and served by Debian's ``prometheus``; what ``analysis.promsource`` reads back
is checked against the synthetic intervals themselves (ground truth the exporter and Prometheus
did not produce), then ``explain`` must name the right host, cgroup and aggressor."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from tailsight.analysis.promsource import PrometheusError, PrometheusSource, read_documents
from tailsight.cli.main import app
from tailsight.collector.config import CollectorConfig
from tailsight.collector.exporter import COARSE_BOUNDS_NS, Family, PrometheusExporter
from tailsight.intervals import HistDocument
from tests.analysis.synthetic import INTERVAL_NS, incident_documents
from tests.prometheus_server import PROMETHEUS, PROMTOOL, prometheus_scraping

pytestmark = pytest.mark.slow

INTERVALS = 60
CHANGE_AT = 30
RESTART_AT = 30  # host-c's agent restarts here: its counters start again from zero
# A recent, whole-second start: inside the default retention and on the 1 s step grid.
START_NS = (int(time.time()) - 3 * 3600) * INTERVAL_NS
HOSTS = {"host-a:9435": "incident", "host-b:9435": "quiet", "host-c:9435": "restart"}


def _documents(kind: str) -> list[HistDocument]:
    change_at = CHANGE_AT if kind == "incident" else INTERVALS  # quiet: no change at all
    seed = {"incident": 5, "quiet": 6, "restart": 7}[kind]
    return incident_documents(seed, INTERVALS, change_at, START_NS)


def _openmetrics_lines(
    families: Sequence[Family], instance: str, at_s: float, out: dict[str, tuple[str, list[str]]]
) -> None:
    for family in families:
        _, lines = out.setdefault(family.name, (family.kind, []))
        for name, labels, extra, value in family.samples:
            pairs = [*labels, ("instance", instance), ("job", "tailsight")]
            if extra is not None:
                pairs.append(extra)
            text = ",".join(f'{k}="{v}"' for k, v in pairs)
            number = repr(value) if value - value == 0 else ("NaN" if value != value else "+Inf")
            lines.append(f"{name}{{{text}}} {number} {at_s:.3f}")


@dataclass
class Backfilled:
    url: str
    truth: dict[str, list[HistDocument]]
    blocks: Path


@pytest.fixture(scope="module")
def backfilled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backfilled]:
    """A Prometheus holding what three agents exported, one scrape per interval end."""
    if not (Path(PROMETHEUS).exists() and Path(PROMTOOL).exists()):
        pytest.skip("/usr/bin/prometheus or promtool missing (run `make setup`)")
    tmp = tmp_path_factory.mktemp("prom")
    families: dict[str, tuple[str, list[str]]] = {}
    truth = {}
    for instance, kind in HOSTS.items():
        documents = truth[instance] = _documents(kind)
        exporter = PrometheusExporter(CollectorConfig(interval_s=1.0))
        for n, document in enumerate(documents):
            if kind == "restart" and n == RESTART_AT:
                exporter = PrometheusExporter(CollectorConfig(interval_s=1.0))
            exporter.update(document)
            _openmetrics_lines(exporter.families(), instance, document.end_ns / 1e9, families)
    text = []
    for name, (kind, lines) in families.items():
        text.append(f"# TYPE {name} {kind}")
        text += lines
    source = tmp / "scrapes.om"
    source.write_text("\n".join([*text, "# EOF", ""]))
    blocks = tmp / "tsdb"
    subprocess.run(
        [PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", str(source), str(blocks)],
        check=True,
        capture_output=True,
    )
    with prometheus_scraping({}, tmp, tsdb=blocks) as prometheus:
        yield Backfilled(prometheus.url, truth, blocks)


def _window() -> tuple[float, float]:
    return START_NS / 1e9 + 1, START_NS / 1e9 + INTERVALS  # the scrapes at every interval end


def _coarse(document: HistDocument, **labels: str) -> np.ndarray:
    (series,) = document.find(**labels)
    return series.hist.rebucket(COARSE_BOUNDS_NS)


def _read_coarse(document: HistDocument, **labels: str) -> np.ndarray:
    found = [s for s in document.series if all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(found) == 1, (labels, [s.labels for s in document.series])
    return found[0].hist.rebucket(COARSE_BOUNDS_NS)


def test_counts_counters_and_resets_match_the_intervals(backfilled: Backfilled) -> None:
    start_s, end_s = _window()
    documents, step_s = read_documents(PrometheusSource(backfilled.url), start_s, end_s, 1.0)
    assert step_s == 1.0
    assert len(documents) == INTERVALS - 1
    for instance in HOSTS:
        truth = backfilled.truth[instance][1:]  # the step ending at each later interval's end
        for read, want in zip(documents, truth, strict=True):
            assert (read.start_ns, read.end_ns) == (want.start_ns, want.end_ns)
            for cgroup in ("/trading", "/batch", "/"):
                labels = {"probe": "runqueue", "cgroup": cgroup}
                got = _read_coarse(read, instance=instance, **labels)
                assert np.array_equal(got, _coarse(want, **labels)), (instance, cgroup)
            for want_counter in want.counters:
                if "kernel_stack" in want_counter.labels:
                    continue  # stacks are summed away by the exporter
                got = [
                    c.value
                    for c in read.counters
                    if c.name == want_counter.name
                    and c.labels == {**want_counter.labels, "instance": instance}
                ]
                assert got and abs(got[0] - want_counter.value) <= 1_000, (instance, want_counter)


def test_exact_quantile_gauges_pin_the_p99_inside_its_coarse_bucket(
    backfilled: Backfilled,
) -> None:
    start_s, end_s = _window()
    documents, _ = read_documents(PrometheusSource(backfilled.url), start_s, end_s, 1.0)
    truth = backfilled.truth["host-a:9435"][1:]
    labels = {"probe": "runqueue", "cgroup": "/trading", "instance": "host-a:9435"}
    errors = []
    coarse_errors = []
    for read, want in zip(documents, truth, strict=True):
        (mine,) = [s for s in read.series if all(s.labels.get(k) == v for k, v in labels.items())]
        exact = want.find(probe="runqueue", cgroup="/trading")[0].hist.quantile(0.99)
        errors.append(abs(mine.hist.quantile(0.99) - exact))
        upper = COARSE_BOUNDS_NS[int(np.searchsorted(COARSE_BOUNDS_NS, exact))]
        coarse_errors.append(upper - exact)
    # Within the 5 µs bucket of the exact P99, where the coarse bucket alone says ~its bound.
    assert max(errors) <= 5_000, errors
    assert np.median(coarse_errors) > 20_000, coarse_errors


def test_explain_names_the_host_cgroup_and_aggressor(backfilled: Backfilled) -> None:
    start_s, end_s = _window()
    window = ["--since", f"{start_s:.0f}", "--until", f"{end_s:.0f}"]
    runner = CliRunner()
    result = runner.invoke(
        app, ["explain", "--prometheus", backfilled.url, *window, "--step", "1", "--json"]
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    leaves = [j for j in report["jumps"] if j["series"].get("cgroup") == "/trading"]
    assert leaves, [j["series"] for j in report["jumps"]]
    assert {j["series"]["instance"] for j in leaves} == {"host-a:9435"}
    first = min(leaves, key=lambda j: j["change_start_ns"])
    assert abs(first["change_start_ns"] - (START_NS + CHANGE_AT * INTERVAL_NS)) <= 2 * INTERVAL_NS
    assert first["displacement"]["aggressors"][0]["aggressor"] == "/batch"
    assert all("instance" in j["series"] for j in report["jumps"])
    named = {j["series"].get("instance") for j in report["jumps"]}
    assert not named & {"host-b:9435", "host-c:9435"}, named
    # The text names the host too; the default step (the scrape spacing) reads the same jump.
    text = runner.invoke(app, ["explain", "--prometheus", backfilled.url, *window])
    assert text.exit_code == 0, text.output
    words = " ".join(text.stdout.split())
    assert "of /trading (host-a:9435) rose" in words, text.stdout
    assert "displaced by /batch" in words, text.stdout
    # Aggregates (all cgroups of a probe) are per host too: none sums two instances.
    assert "of all cgroups (host-a:9435)" in words, text.stdout


def test_show_summarizes_what_prometheus_holds(backfilled: Backfilled) -> None:
    start_s, end_s = _window()
    result = CliRunner().invoke(
        app,
        [
            "show",
            "--prometheus",
            backfilled.url,
            "--since",
            f"{start_s:.0f}",
            "--until",
            f"{end_s:.0f}",
            "--selector",
            "instance=host-b:9435,cgroup=/batch",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    (entry,) = summary["series"]
    truth = backfilled.truth["host-b:9435"][1:]
    assert entry["count"] == sum(d.find(cgroup="/batch")[0].hist.count for d in truth)
    assert summary["intervals"] == INTERVALS - 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--prometheus", "not-a-url"], "bad Prometheus URL"),
        (["--prometheus", "http://127.0.0.1:1"], "cannot reach"),
        (["--prometheus", "{url}/nowhere"], "HTTP 404"),
        (["--prometheus", "{url}", "--since", "soon"], "bad time"),
        (["--prometheus", "{url}", "--basic-auth", "nocolon"], "USER:PASSWORD"),
        (["--prometheus", "{url}", "--bearer-token-file", "/nonexistent"], "cannot read"),
        (["--prometheus", "{url}", "--since", "2000", "--until", "1000"], "empty window"),
        (["--prometheus", "{url}", "--until", "1000"], "no tailsight_intervals_total"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    backfilled: Backfilled, args: list[str], message: str
) -> None:
    args = [a.format(url=backfilled.url) for a in args]
    for command in ("explain", "show"):
        result = CliRunner().invoke(app, [command, *args])
        assert result.exit_code == 2, (command, result.output)
        assert message in result.stderr, (command, result.stderr)
        assert "Traceback" not in result.output
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_bad_promql_is_the_apis_reason(backfilled: Backfilled) -> None:
    with pytest.raises(PrometheusError, match=r"HTTP 400: .*parse error"):
        PrometheusSource(backfilled.url).get("/api/v1/query", {"query": "sum("})
    with contextlib.suppress(PrometheusError):
        PrometheusSource(backfilled.url).get("/api/v1/query", {"query": "up"})


def _bcrypt(password: str) -> str:
    with warnings.catch_warnings():  # crypt is deprecated, and the only bcrypt at hand here
        warnings.simplefilter("ignore", DeprecationWarning)
        import crypt

        return crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH))


def test_basic_auth_and_tls_against_a_real_endpoint(backfilled: Backfilled, tmp_path: Path) -> None:
    """Prometheus' own --web.config.file: https with a self-signed certificate, basic auth."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    web = (
        f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n"
        f"basic_auth_users:\n  reader: '{_bcrypt('s3cret')}'\n"
    )
    shutil.copytree(backfilled.blocks, tmp_path / "tsdb")
    start_s, end_s = _window()
    window = ["--since", f"{start_s:.0f}", "--until", f"{end_s:.0f}", "--json"]
    runner = CliRunner()
    with prometheus_scraping({}, tmp_path, tsdb=tmp_path / "tsdb", web_config=web) as secured:
        assert secured.url.startswith("https://")
        show = ["show", "--prometheus", secured.url, *window]
        good = runner.invoke(app, [*show, "--ca-file", str(cert), "--basic-auth", "reader:s3cret"])
        assert good.exit_code == 0, good.output
        assert len(json.loads(good.stdout)["series"]) == 9  # 3 cgroups x 3 hosts
        # The password from the environment, the certificate not checked.
        env = {"TAILSIGHT_PROMETHEUS_BASIC_AUTH": "reader:s3cret"}
        insecure = runner.invoke(app, [*show, "--insecure-skip-verify"], env=env)
        assert insecure.exit_code == 0, insecure.output
        for args, message in (
            (["--ca-file", str(cert), "--basic-auth", "reader:wrong"], "HTTP 401"),
            (["--basic-auth", "reader:s3cret"], "CERTIFICATE_VERIFY_FAILED"),
        ):
            bad = runner.invoke(app, [*show, *args])
            assert bad.exit_code == 2, bad.output
            assert message in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
