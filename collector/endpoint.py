"""The ``/metrics`` endpoint: one asyncio loop thread accepts, runs each TLS handshake and reads
each request under a deadline, and answers with the exposition bytes the exporter renders once
per interval; PBKDF2 checks and renders run on a small bounded thread pool. Optional TLS and HTTP
basic auth (a user and a file holding a salted PBKDF2 password hash)."""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import gzip
import hashlib
import hmac
import os
import ssl
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Final

HASH_SCHEME: Final = "pbkdf2_sha256"
HASH_ITERATIONS: Final = 200_000
# A client has this long to finish its TLS handshake and send its request head, and again to
# take the response: a slow or silent client costs one idle coroutine, never a thread.
REQUEST_TIMEOUT_S: Final = 5.0
MAX_REQUEST_HEAD: Final = 16 * 1024
MAX_CONNECTIONS: Final = 512  # open at once; more are closed on accept
BACKLOG: Final = 512
WORKERS: Final = 4  # threads for PBKDF2 checks and renders
CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"


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
                raise ValueError(
                    f"{path}: not a password hash (expected a {HASH_SCHEME}$... line, "
                    "not the password itself)"
                )
            return line
    raise ValueError(f"{path}: no password hash")


class BasicAuth:
    """Checks ``Authorization`` headers against one user and PBKDF2 hash.

    Every header that is not already known good costs one full PBKDF2 run against the real hash,
    whatever the user name: a wrong user takes as long as a wrong password (no user enumeration
    by timing). Headers that passed are remembered by digest, so scrapes after the first are fast.
    """

    def __init__(self, user: str, password_hash: str, realm: str = "tailsight") -> None:
        self.user = user
        self.password_hash = password_hash
        self.realm = realm
        self._verified: set[bytes] = set()
        self._lock = threading.Lock()

    def allowed(self, header: str) -> bool:
        token = hashlib.sha256(header.encode("utf-8", "surrogateescape")).digest()
        with self._lock:
            if token in self._verified:
                return True
        scheme, _, encoded = header.partition(" ")
        try:
            decoded = base64.b64decode(encoded, validate=True).decode()
        except (ValueError, UnicodeDecodeError):
            decoded = ""
        given_user, _, password = decoded.partition(":")
        password_ok = verify_password(password, self.password_hash)  # always, see above
        user_ok = hmac.compare_digest(given_user.encode(), self.user.encode())
        ok = scheme.lower() == "basic" and user_ok and password_ok
        if ok:
            with self._lock:
                self._verified.add(token)
        return ok


def tls_context(certfile: Path, keyfile: Path) -> ssl.SSLContext:
    """A TLS 1.2+ server context; raises ``ssl.SSLError`` / ``OSError`` for bad files."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(str(certfile), str(keyfile))
    return context


class MetricsServer:
    """Serves ``render()`` (on any path) from a daemon thread until ``close``.

    ``render`` should return the same bytes object while nothing changed (as
    ``PrometheusExporter.exposition`` does): its gzip form is then made once too.
    """

    def __init__(
        self,
        render: Callable[[], bytes],
        address: str = "127.0.0.1",
        port: int = 0,
        tls: ssl.SSLContext | None = None,
        user: str | None = None,
        password_hash: str | None = None,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self.render = render
        self.address = address
        self.tls = tls
        self.auth = BasicAuth(user, password_hash) if user and password_hash else None
        self.request_timeout_s = request_timeout_s
        self.max_connections = max_connections
        self._gzipped: tuple[bytes, bytes] | None = None
        self._gzip_lock = threading.Lock()
        self._pool = concurrent.futures.ThreadPoolExecutor(WORKERS, "tailsight-metrics")
        self._connections: set[asyncio.Task[None]] = set()
        self._loop = asyncio.new_event_loop()
        try:
            self._server = self._loop.run_until_complete(
                asyncio.start_server(
                    self._connection, address, port, backlog=BACKLOG, limit=MAX_REQUEST_HEAD
                )
            )
        except BaseException:
            self._loop.close()
            self._pool.shutdown(wait=False)
            raise
        self.port = int(self._server.sockets[0].getsockname()[1])
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="tailsight-metrics-loop", daemon=True
        )
        self._thread.start()

    @property
    def url(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}/metrics"

    @property
    def open_connections(self) -> int:
        """Connections being handled now (handshake, request, response)."""
        return len(self._connections)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            if len(self._connections) > self.max_connections:
                return
            async with asyncio.timeout(self.request_timeout_s):
                if self.tls is not None:
                    await writer.start_tls(self.tls)
                head = await reader.readuntil(b"\r\n\r\n")
            response = await self._respond(head)
            writer.write(response)
            async with asyncio.timeout(self.request_timeout_s):
                await writer.drain()
                writer.close()  # flushes what drain left buffered, then closes
                await writer.wait_closed()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            pass  # a client that left, stalled or spoke no TLS: nothing to answer
        finally:
            self._connections.discard(task)
            writer.transport.abort()  # no-op after a clean close

    async def _respond(self, head: bytes) -> bytes:
        request_line, *header_lines = head.decode("latin-1").split("\r\n")
        method = request_line.split(" ", 1)[0]
        if method not in ("GET", "HEAD"):
            return _response("405 Method Not Allowed", b"GET only\n", [("Allow", "GET, HEAD")])
        headers: dict[str, str] = {}
        for line in header_lines:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        loop = asyncio.get_running_loop()
        if self.auth is not None:
            header = headers.get("authorization", "")
            if not await loop.run_in_executor(self._pool, self.auth.allowed, header):
                realm = [("WWW-Authenticate", f'Basic realm="{self.auth.realm}"')]
                return _response("401 Unauthorized", b"unauthorized\n", realm)
        want_gzip = "gzip" in headers.get("accept-encoding", "")
        body = await loop.run_in_executor(self._pool, self._body, want_gzip)
        extra = [("Content-Encoding", "gzip")] if want_gzip else []
        response = _response("200 OK", body, [("Content-Type", CONTENT_TYPE), *extra])
        return response[: response.index(b"\r\n\r\n") + 4] if method == "HEAD" else response

    def _body(self, want_gzip: bool) -> bytes:
        plain = self.render()
        if not want_gzip:
            return plain
        with self._gzip_lock:
            if self._gzipped is None or self._gzipped[0] is not plain:
                self._gzipped = (plain, gzip.compress(plain, compresslevel=1))
            return self._gzipped[1]

    async def _shutdown(self) -> None:
        self._server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)

    def close(self) -> None:
        """Stop serving, drop every open connection whatever it is doing, release the port."""
        if self._loop.is_closed():
            return
        future = asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop)
        with contextlib.suppress(concurrent.futures.TimeoutError):
            future.result(timeout=2)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=2)
        if not self._thread.is_alive():
            self._loop.close()
        self._pool.shutdown(wait=False, cancel_futures=True)


def _response(status: str, body: bytes, headers: list[tuple[str, str]]) -> bytes:
    lines = [f"HTTP/1.1 {status}", *(f"{k}: {v}" for k, v in headers)]
    lines += [f"Content-Length: {len(body)}", "Connection: close"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
