"""The /metrics endpoint: plain HTTP, basic auth against a PBKDF2 hash file, and TLS."""

from __future__ import annotations

import base64
import hashlib
import shutil
import ssl
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter

from tailsight.collector.endpoint import (
    MetricsServer,
    hash_password,
    read_hash_file,
    verify_password,
)


def registry_with_counter() -> CollectorRegistry:
    registry = CollectorRegistry()
    Counter("probe_marker", "A marker.", registry=registry).inc(3)
    return registry


def get(
    url: str, auth: tuple[str, str] | None = None, context: ssl.SSLContext | None = None
) -> int:
    request = urllib.request.Request(url)
    if auth is not None:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            body = response.read().decode()
            assert "probe_marker_total 3.0" in body
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


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
    server = MetricsServer(registry_with_counter(), "127.0.0.1", 0)
    try:
        assert server.url.startswith("http://127.0.0.1:")
        assert get(server.url) == 200
    finally:
        server.close()


def test_basic_auth(tmp_path: Path) -> None:
    hash_file = tmp_path / "hash"
    hash_file.write_text("# tailsight serve --hash-password\n" + hash_password("pw", 1000) + "\n")
    server = MetricsServer(
        registry_with_counter(),
        "127.0.0.1",
        0,
        user="prom",
        password_hash=read_hash_file(hash_file),
    )
    try:
        assert get(server.url) == 401
        assert get(server.url, ("prom", "wrong")) == 401
        assert get(server.url, ("other", "pw")) == 401
        assert get(server.url, ("prom", "pw")) == 200
        assert get(server.url, ("prom", "pw")) == 200  # second time from the verified cache
    finally:
        server.close()


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_tls(tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    command = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
    command += ["-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1"]
    subprocess.run(
        [*command, "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True
    )
    server = MetricsServer(registry_with_counter(), "127.0.0.1", 0, certfile=cert, keyfile=key)
    try:
        assert server.url.startswith("https://")
        context = ssl.create_default_context(cafile=str(cert))
        assert get(server.url, context=context) == 200
        with pytest.raises(urllib.error.URLError):  # unknown CA: the handshake is real TLS
            get(server.url, context=ssl.create_default_context())
    finally:
        server.close()
