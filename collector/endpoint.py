"""The ``/metrics`` endpoint: prometheus-client's WSGI app on a threaded server, with optional TLS
and HTTP basic auth (a user and a file holding a salted PBKDF2 password hash)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any, Final
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

if TYPE_CHECKING:
    from prometheus_client.registry import CollectorRegistry

HASH_SCHEME: Final = "pbkdf2_sha256"
HASH_ITERATIONS: Final = 200_000

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def hash_password(
    password: str, iterations: int = HASH_ITERATIONS, salt: bytes | None = None
) -> str:
    """``pbkdf2_sha256$<iterations>$<salt b64>$<hash b64>``: the line a password hash file holds."""
    salt = os.urandom(16) if salt is None else salt
    digest = hashlib.pbkdf2_hmac("sha256", password.encode("utf-8"), salt, iterations)
    encode = base64.b64encode
    return f"{HASH_SCHEME}${iterations}${encode(salt).decode()}${encode(digest).decode()}"


def verify_password(password: str, encoded: str) -> bool:
    """Whether ``password`` matches a :func:`hash_password` string (constant-time compare)."""
    try:
        scheme, iterations, salt, digest = encoded.strip().split("$")
        if scheme != HASH_SCHEME:
            return False
        expected = base64.b64decode(digest, validate=True)
        actual = hashlib.pbkdf2_hmac(
            "sha256",
            password.encode("utf-8"),
            base64.b64decode(salt, validate=True),
            int(iterations),
        )
    except ValueError:
        return False
    return hmac.compare_digest(actual, expected)


def read_hash_file(path: Path) -> str:
    """The hash in a password hash file (first non-blank, non-comment line)."""
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            if not line.startswith(f"{HASH_SCHEME}$"):
                raise ValueError(f"{path}: expected a {HASH_SCHEME}$... line")
            return line
    raise ValueError(f"{path}: no password hash")


def basic_auth(app: WsgiApp, user: str, password_hash: str, realm: str = "tailsight") -> WsgiApp:
    """Wrap a WSGI app so that it answers 401 unless the request carries ``user``'s password."""
    verified: set[bytes] = set()  # digests of headers already checked (PBKDF2 is slow on purpose)
    lock = threading.Lock()

    def allowed(header: str) -> bool:
        token = hashlib.sha256(header.encode("utf-8", "surrogateescape")).digest()
        with lock:
            if token in verified:
                return True
        scheme, _, encoded = header.partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            given_user, _, password = (
                base64.b64decode(encoded, validate=True).decode().partition(":")
            )
        except (ValueError, UnicodeDecodeError):
            return False
        ok = hmac.compare_digest(given_user.encode(), user.encode()) and verify_password(
            password, password_hash
        )
        if ok:
            with lock:
                verified.add(token)
        return ok

    def wrapped(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if allowed(environ.get("HTTP_AUTHORIZATION", "")):
            return app(environ, start_response)
        start_response(
            "401 Unauthorized",
            [("WWW-Authenticate", f'Basic realm="{realm}"'), ("Content-Type", "text/plain")],
        )
        return [b"unauthorized\n"]

    return wrapped


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes every second would flood stderr."""


class MetricsServer:
    """``/metrics`` (any path, as prometheus-client serves it) on a daemon thread."""

    def __init__(
        self,
        registry: CollectorRegistry,
        address: str = "127.0.0.1",
        port: int = 0,
        certfile: Path | None = None,
        keyfile: Path | None = None,
        user: str | None = None,
        password_hash: str | None = None,
    ) -> None:
        import socket
        import ssl

        from prometheus_client import make_wsgi_app

        app: WsgiApp = make_wsgi_app(registry)
        if user is not None and password_hash is not None:
            app = basic_auth(app, user, password_hash)

        class Server(_ThreadingServer):
            address_family = socket.AF_INET6 if ":" in address else socket.AF_INET

        self.httpd = make_server(address, port, app, Server, handler_class=_QuietHandler)
        self.tls = certfile is not None and keyfile is not None
        if self.tls:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            context.load_cert_chain(str(certfile), str(keyfile))
            self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.address = address
        self.port = int(self.httpd.server_address[1])
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving and release the port."""
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(timeout=5)
