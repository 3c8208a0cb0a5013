"""The /metrics endpoint over real sockets: plain HTTP, basic auth against a PBKDF2 hash file
(same work for unknown users), TLS with a certificate made here, and hostile clients: silent TLS
clients, slowloris heads and hundreds of concurrent scrapes, against a real exporter."""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import gzip
import hashlib
import shutil
import socket
import ssl
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest

from tailsight.collector.config import CollectorConfig
from tailsight.collector.endpoint import (
    MetricsServer,
    hash_password,
    read_hash_file,
    tls_context,
    verify_password,
)
from tailsight.collector.exporter import PrometheusExporter
from tailsight.hist import Histogram
from tailsight.intervals import HistDocument, Series

T0_NS = 1_700_000_000 * 10**9


def marker_render() -> Any:
    registry = CollectorRegistry()
    Counter("probe_marker", "A marker.", registry=registry).inc(3)
    return lambda: generate_latest(registry)


def get(
    url: str,
    auth: tuple[str, str] | None = None,
    context: ssl.SSLContext | None = None,
    timeout: float = 10,
) -> int:
    request = urllib.request.Request(url)
    if auth is not None:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
            body = response.read().decode()
            assert "probe_marker_total 3.0" in body
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    directory = tmp_path_factory.mktemp("tls")
    cert, key = directory / "cert.pem", directory / "key.pem"
    command = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
    command += ["-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1"]
    subprocess.run(
        [*command, "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True
    )
    return cert, key


@contextlib.contextmanager
def serving(render: Any, **options: Any) -> Iterator[MetricsServer]:
    server = MetricsServer(render, "127.0.0.1", 0, **options)
    try:
        yield server
    finally:
        server.close()


def test_password_hash_is_pbkdf2_sha256() -> None:
    salt = bytes(range(16))
    encoded = hash_password("s3cret", iterations=1000, salt=salt)
    # Recompute from the spec of the format, not through verify_password.
    scheme, iterations, salt_b64, digest_b64 = encoded.split("$")
    assert (scheme, iterations, base64.b64decode(salt_b64)) == ("pbkdf2_sha256", "1000", salt)
    assert base64.b64decode(digest_b64) == hashlib.pbkdf2_hmac("sha256", b"s3cret", salt, 1000)
    assert verify_password("s3cret", encoded)
    assert not verify_password("s3cret ", encoded)
    assert not verify_password("s3cret", "md5$1$AA==$AA==")
    assert not verify_password("s3cret", "garbage")


def test_plain_http_on_loopback() -> None:
    with serving(marker_render()) as server:
        assert server.url.startswith("http://127.0.0.1:")
        assert get(server.url) == 200
        request = urllib.request.Request(server.url, headers={"Accept-Encoding": "gzip"})
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.headers["Content-Encoding"] == "gzip"
            assert b"probe_marker_total 3.0" in gzip.decompress(response.read())


def test_basic_auth(tmp_path: Path) -> None:
    hash_file = tmp_path / "hash"
    hash_file.write_text("# tailsight serve --hash-password\n" + hash_password("pw", 1000) + "\n")
    with serving(marker_render(), user="prom", password_hash=read_hash_file(hash_file)) as server:
        assert get(server.url) == 401
        assert get(server.url, ("prom", "wrong")) == 401
        assert get(server.url, ("other", "pw")) == 401
        assert get(server.url, ("prom", "pw")) == 200
        assert get(server.url, ("prom", "pw")) == 200  # second time from the verified cache


def test_unknown_user_costs_the_same_pbkdf2_as_a_wrong_password(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The user name must not be learnable by timing. Both failures run the same
    derivation (same iterations, same salt: the real hash's), observed on the real hashlib."""
    calls: list[tuple[bytes, int]] = []
    real = hashlib.pbkdf2_hmac

    def recording(name: str, password: bytes, salt: bytes, iterations: int) -> bytes:
        calls.append((salt, iterations))
        return real(name, password, salt, iterations)

    encoded = hash_password("pw", 5000)
    with serving(marker_render(), user="prom", password_hash=encoded) as server:
        monkeypatch.setattr(hashlib, "pbkdf2_hmac", recording)
        assert get(server.url, ("nobody", "guess")) == 401
        unknown_user, calls[:] = list(calls), []
        assert get(server.url, ("prom", "guess")) == 401
        wrong_password, calls[:] = list(calls), []
        assert get(server.url, ("nobody", "pw")) == 401  # the right password, wrong user
        right_password_wrong_user = list(calls)
    salt = base64.b64decode(encoded.split("$")[2])
    assert unknown_user == wrong_password == right_password_wrong_user == [(salt, 5000)]


def test_tls(certificate: tuple[Path, Path]) -> None:
    cert, key = certificate
    with serving(marker_render(), tls=tls_context(cert, key)) as server:
        assert server.url.startswith("https://")
        context = ssl.create_default_context(cafile=str(cert))
        assert get(server.url, context=context) == 200
        with pytest.raises(urllib.error.URLError):  # unknown CA: the handshake is real TLS
            get(server.url, context=ssl.create_default_context())


def test_silent_tls_clients_block_nobody_and_close_promptly(
    certificate: tuple[Path, Path],
) -> None:
    """TCP clients that never send a ClientHello neither delay other scrapes (a handshake in
    the accepting thread would hold them 15 s+) nor ``close``; the server drops them at the
    request deadline."""
    cert, key = certificate
    context = ssl.create_default_context(cafile=str(cert))
    server = MetricsServer(
        marker_render(), "127.0.0.1", 0, tls=tls_context(cert, key), request_timeout_s=1.0
    )
    silent = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(20)]
    try:
        for _ in range(5):  # far below the 1 s deadline the silent ones would hold
            assert get(server.url, context=context, timeout=0.9) == 200
        for sock in silent[:3]:
            sock.settimeout(5)
            assert sock.recv(1) == b""  # closed by the server at its deadline
        assert get(server.url, context=context, timeout=0.9) == 200
    finally:
        closed = threading.Event()
        closer = threading.Thread(target=lambda: (server.close(), closed.set()))
        closer.start()
        assert closed.wait(3), "close blocked by silent clients"
        for sock in silent:
            sock.close()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", server.port), timeout=1)


def test_slowloris_holds_no_threads_and_no_renders() -> None:
    """300 connections dribbling a request head hold no thread each (a thread per connection
    would be 300) and cause no render when they give up; a real scrape still goes through
    meanwhile."""
    renders = 0

    def render() -> bytes:
        nonlocal renders
        renders += 1
        return b"probe_marker_total 3.0\n"

    threads_before = threading.active_count()
    with serving(render, request_timeout_s=3.0) as server:
        slow = []
        for _ in range(300):
            sock = socket.create_connection(("127.0.0.1", server.port))
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # never the blank line
            slow.append(sock)
        assert get(server.url, timeout=2) == 200
        assert threading.active_count() <= threads_before + 1 + 4  # loop + worker pool
        for sock in slow:
            sock.close()
        assert get(server.url, timeout=2) == 200
    assert renders == 2


def test_concurrent_scrapes_all_complete_rendered_once_per_interval() -> None:
    """2,000 scrapes from 200 threads while intervals arrive every 50 ms: every one
    answered with a complete exposition, and renders <= intervals + 1 (the one before any)."""
    exporter = PrometheusExporter(CollectorConfig(interval_s=0.05))
    rng = np.random.default_rng(7)
    cgroups = [f"/svc/{i}" for i in range(40)]
    stop = threading.Event()

    def feed() -> None:
        t = 0
        while not stop.wait(0.05):
            series = [
                Series({"probe": "runqueue", "cgroup": c}, Histogram.from_samples(samples))
                for c in cgroups
                for samples in [rng.integers(0, 10**6, 20)]
            ]
            start = T0_NS + t * 50_000_000
            exporter.update(HistDocument(start, start + 50_000_000, series))
            t += 1

    feeder = threading.Thread(target=feed)
    feeder.start()
    try:
        with serving(exporter.exposition) as server:

            def scrape(_: int) -> bool:
                with urllib.request.urlopen(server.url, timeout=30) as response:
                    return response.read().rstrip().endswith(b"tailsight_interval_errors_total 0.0")

            with concurrent.futures.ThreadPoolExecutor(200) as pool:
                results = list(pool.map(scrape, range(2000)))
            backlog = listen_backlog(server.port)
    finally:
        stop.set()
        feeder.join()
    assert all(results) and len(results) == 2000
    assert exporter.intervals > 0
    assert exporter.renders <= exporter.intervals + 1
    assert backlog is None or backlog >= 128


def listen_backlog(port: int) -> int | None:
    """The listen queue length the kernel holds for a port (``ss``'s Send-Q of a listener)."""
    if shutil.which("ss") is None:
        return None
    out = subprocess.run(
        ["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True, check=True
    ).stdout
    return int(out.split()[2])
