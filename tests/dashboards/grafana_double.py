"""A Grafana HTTP API **double** (no Grafana server can run here): a real HTTP server on a
loopback port that records every request and answers the three endpoints ``dashboards push``
uses as Grafana's documented HTTP API does, refusing requests that break the documented contract:

- every request: ``Authorization: Bearer <token>``, else 401 ``{"message": "Unauthorized"}``
  (https://grafana.com/docs/grafana/latest/developers/http_api/auth/);
- ``GET /api/folders/:uid``: the folder, or 404 ``{"message": "folder not found"}``;
- ``POST /api/folders`` ``{"uid", "title"}``: 200 with the folder; 409 if the uid exists
  (https://grafana.com/docs/grafana/latest/developers/http_api/folder/);
- ``POST /api/dashboards/db`` ``{"dashboard": {...}, "folderUid" | "folderId", "overwrite",
  "message"}``: 200 ``{"id", "uid", "url", "status": "success", "version", "slug"}``; 400 if
  the dashboard has no title, 400 if the folder does not exist, 412 if a dashboard with that uid
  exists and ``overwrite`` is false
  (https://grafana.com/docs/grafana/latest/developers/http_api/dashboard/);
- ``POST /api/annotations`` ``{"time", "timeEnd"?, "tags", "text", "dashboardUID"?}``: 200
  ``{"message": "Annotation added", "id"}`` (…/http_api/annotations/).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class GrafanaDouble:
    token: str
    url: str = ""
    requests: list[Request] = field(default_factory=list)
    folders: dict[str, dict[str, Any]] = field(default_factory=dict)
    dashboards: dict[str, dict[str, Any]] = field(default_factory=dict)
    annotations: list[dict[str, Any]] = field(default_factory=list)

    def answer(self, request: Request) -> tuple[int, Any]:
        self.requests.append(request)
        if request.headers.get("authorization") != f"Bearer {self.token}":
            return 401, {"message": "Unauthorized"}
        if request.method != "GET" and request.headers.get("content-type") != "application/json":
            return 415, {"message": "Unsupported Media Type"}
        folder = re.fullmatch(r"/api/folders/([^/]+)", request.path)
        if request.method == "GET" and folder:
            found = self.folders.get(folder.group(1))
            return (200, found) if found else (404, {"message": "folder not found"})
        if request.method == "POST" and request.path == "/api/folders":
            return self._create_folder(request.body)
        if request.method == "POST" and request.path == "/api/dashboards/db":
            return self._save_dashboard(request.body)
        if request.method == "POST" and request.path == "/api/annotations":
            return self._add_annotation(request.body)
        return 404, {"message": "Not found"}

    def _create_folder(self, body: Any) -> tuple[int, Any]:
        if not isinstance(body, dict) or not isinstance(body.get("title"), str):
            return 400, {"message": "bad request data"}
        uid = body.get("uid") or f"folder{len(self.folders) + 1}"
        if uid in self.folders:
            return 409, {"message": "a folder with the same uid already exists"}
        folder = {"id": len(self.folders) + 1, "uid": uid, "title": body["title"], "version": 1}
        self.folders[uid] = folder
        return 200, folder

    def _save_dashboard(self, body: Any) -> tuple[int, Any]:
        if not isinstance(body, dict) or not isinstance(body.get("dashboard"), dict):
            return 400, {"message": "bad request data"}
        dashboard = body["dashboard"]
        if not dashboard.get("title"):
            return 400, {"message": "Dashboard title cannot be empty", "status": "empty-name"}
        folder_uid = body.get("folderUid")
        folder_ids = {f["id"] for f in self.folders.values()}
        if folder_uid is not None and folder_uid not in self.folders:
            return 400, {"message": "folder not found", "status": "folder-not-found"}
        if folder_uid is None and body.get("folderId") not in (None, 0, *folder_ids):
            return 400, {"message": "folder not found", "status": "folder-not-found"}
        uid = dashboard.get("uid") or f"dash{len(self.dashboards) + 1}"
        existing = self.dashboards.get(uid)
        if existing is not None and body.get("overwrite") is not True:
            return 412, {"message": "A dashboard with the same uid already exists"}
        version = 1 if existing is None else existing["version"] + 1
        slug = re.sub(r"[^a-z0-9]+", "-", dashboard["title"].lower()).strip("-")
        stored = {"dashboard": dashboard, "folderUid": folder_uid, "version": version}
        self.dashboards[uid] = stored
        return 200, {
            "id": list(self.dashboards).index(uid) + 1,
            "uid": uid,
            "url": f"/d/{uid}/{slug}",
            "status": "success",
            "version": version,
            "slug": slug,
        }

    def _add_annotation(self, body: Any) -> tuple[int, Any]:
        if not isinstance(body, dict) or not isinstance(body.get("text"), str):
            return 400, {"message": "bad request data"}
        self.annotations.append(body)
        return 200, {"message": "Annotation added", "id": len(self.annotations)}


@contextmanager
def grafana_double(token: str) -> Iterator[GrafanaDouble]:
    """The double listening on a free loopback port until the block ends."""
    double = GrafanaDouble(token)

    class Handler(BaseHTTPRequestHandler):
        def _handle(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = raw
            headers = {k.lower(): v for k, v in self.headers.items()}
            headers["content-type"] = headers.get("content-type", "").split(";")[0].strip()
            status, answer = double.answer(Request(self.command, self.path, headers, body))
            payload = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_POST = do_PUT = do_DELETE = _handle

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    double.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield double
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
