"""Push the dashboards to a Grafana through its HTTP API (grafana-client): make sure the folder
exists (``GET /api/folders/<uid>``, else ``POST /api/folders``), then ``POST /api/dashboards/db``
each dashboard with ``folderUid`` and ``overwrite``, authenticated by a bearer token."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlparse

import niquests
from grafana_client.api import GrafanaApi
from grafana_client.client import GrafanaClientError, GrafanaException

from tailsight.dashboards.generate import BUILDERS, render

FOLDER_UID: Final = "tailsight"
FOLDER_TITLE: Final = "tailsight"


class PushError(Exception):
    """The push could not complete; the message says what Grafana (or the network) answered."""


@dataclass(frozen=True)
class Pushed:
    """One dashboard as Grafana stored it."""

    name: str
    uid: str
    url: str
    version: int


def connect(url: str, token: str, timeout_s: float = 10.0) -> GrafanaApi:
    """A client for ``url`` (http/https, Grafana's root URL) with a service-account token."""
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ValueError(f"expected an http(s)://HOST[:PORT][/PATH] Grafana URL, got {url!r}")
    if not token.strip():
        raise ValueError("empty token")
    api: GrafanaApi = GrafanaApi.from_url(url, credential=token.strip(), timeout=timeout_s)
    return api


def push_all(
    api: GrafanaApi, folder_uid: str = FOLDER_UID, folder_title: str = FOLDER_TITLE
) -> list[Pushed]:
    """Create the folder if missing, then create or overwrite every dashboard in it."""
    try:
        _ensure_folder(api, folder_uid, folder_title)
        pushed = []
        for name in BUILDERS:
            document = render(name)
            answer: dict[str, Any] = api.dashboard.update_dashboard(  # type: ignore[no-untyped-call]
                {
                    "dashboard": document,
                    "folderUid": folder_uid,
                    "overwrite": True,
                    "message": "tailsight dashboards push",
                }
            )
            pushed.append(
                Pushed(
                    name,
                    str(answer.get("uid", document["uid"])),
                    str(answer.get("url", "")),
                    int(answer.get("version", 0)),
                )
            )
        return pushed
    except GrafanaException as error:
        raise PushError(_describe(error)) from None
    except niquests.exceptions.RequestException as error:  # refused, DNS, TLS: no answer at all
        raise PushError(f"cannot reach Grafana: {error}") from None


def _ensure_folder(api: GrafanaApi, uid: str, title: str) -> None:
    try:
        api.folder.get_folder(uid)  # type: ignore[no-untyped-call]
    except GrafanaClientError as error:
        if error.status_code != 404:
            raise
        api.folder.create_folder(title, uid=uid)  # type: ignore[no-untyped-call]


def _describe(error: GrafanaException) -> str:
    if error.status_code == 0:
        return f"cannot reach Grafana: {error.message}"
    return f"Grafana answered {error.status_code}: {error.message}"
