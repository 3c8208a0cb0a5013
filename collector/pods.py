"""Kubernetes pods from cgroup paths: the kubelet's systemd and cgroupfs layouts with containerd,
CRI-O or Docker containers become ``namespace``, ``pod`` and ``container`` labels.

Pod UID -> name comes from a PodList (the kubelet's ``/pods``, or the API server's
``/api/v1/pods?fieldSelector=spec.nodeName=NODE``) when one is configured; otherwise the pod is
named by its UID, its container by the short container id, and there is no namespace.
"""

from __future__ import annotations

import json
import re
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

POD_LABELS: Final = ("namespace", "pod", "container")
SHORT_ID_CHARS: Final = 12  # as `docker ps` / `crictl ps` show a container id
# The pod's cgroup. systemd driver: kubepods[-<qos>]-pod<uid, '-' written '_'>.slice (the
# kubelet escapes '-' because systemd reads it as a slice separator), its parents' names first
# under a --cgroup-root (kind: kubelet-kubepods-...); cgroupfs driver: pod<uid>.
_POD_SYSTEMD = re.compile(
    r"(?:[\w-]+-)?kubepods(?:-burstable|-besteffort)?-pod([0-9a-fA-F_]{36})\.slice"
)
_POD_CGROUPFS = re.compile(r"pod([0-9a-fA-F-]{36})")
# A container's cgroup right below its pod's: a systemd scope of containerd, CRI-O or Docker,
# or (cgroupfs) the bare id. crio-conmon-<id>.scope is CRI-O's monitor process, no container.
_CONTAINER = re.compile(r"(?:cri-containerd-|crio-|docker-)?([0-9a-f]{64})(?:\.scope)?")


@dataclass(frozen=True)
class PodCgroup:
    """Where a cgroup path sits in the kubelet's tree: pod UID, container id ("" = the pod's own
    cgroup, or one the runtime made that is no container)."""

    uid: str
    container_id: str = ""


@dataclass(frozen=True)
class Pod:
    """One pod of a PodList: its names, and its containers' names by container id."""

    namespace: str
    name: str
    containers: Mapping[str, str]


def parse_cgroup_path(path: str) -> PodCgroup | None:
    """The pod (and container) a cgroup path belongs to, None for a cgroup outside any pod.

    The pod is looked for at any depth (the kubelet's tree may sit under a prefix: a kind node's
    ``/kubelet.slice/kubelet-kubepods.slice``, a cgroup namespace), inside a ``kubepods`` tree.
    """
    parts = [p for p in path.split("/") if p]
    for i, part in enumerate(parts):
        uid = None
        if match := _POD_SYSTEMD.fullmatch(part):
            uid = match.group(1).replace("_", "-")
        elif (match := _POD_CGROUPFS.fullmatch(part)) and "kubepods" in parts[:i]:
            uid = match.group(1)
        if uid is None:
            continue
        container = ""
        if i + 1 < len(parts) and (found := _CONTAINER.fullmatch(parts[i + 1])):
            container = found.group(1)
        return PodCgroup(uid.lower(), container)
    return None


def parse_pod_list(document: Any) -> dict[str, Pod]:
    """Pods by UID from a PodList (``items[].metadata`` and the container statuses, whose
    ``containerID`` is ``<runtime>://<id>``); ValueError if it is no PodList."""
    if not isinstance(document, dict) or not isinstance(document.get("items"), list):
        raise ValueError("not a PodList: no 'items' list")
    pods: dict[str, Pod] = {}
    for item in document["items"]:
        metadata = item.get("metadata") or {}
        uid, name = metadata.get("uid"), metadata.get("name")
        if not isinstance(uid, str) or not isinstance(name, str):
            continue
        status = item.get("status") or {}
        containers: dict[str, str] = {}
        for key in ("initContainerStatuses", "containerStatuses", "ephemeralContainerStatuses"):
            for container in status.get(key) or ():
                _, sep, container_id = str(container.get("containerID", "")).partition("://")
                if sep and container_id and isinstance(container.get("name"), str):
                    containers[container_id] = container["name"]
        pods[uid.lower()] = Pod(str(metadata.get("namespace", "")), name, containers)
    return pods


class PodDirectory:
    """Pods of this node by UID, fetched from a PodList URL with a bearer token.

    Fetched again when a pod UID or container id is not known (a new pod, a restarted container),
    at most once per ``min_refresh_s``; the token file is read at every fetch (projected service
    account tokens rotate). A failed fetch keeps the pods of the last good one.
    """

    def __init__(
        self,
        url: str,
        token_file: Path | None = None,
        ca_file: Path | None = None,
        insecure_tls: bool = False,
        min_refresh_s: float = 10.0,
        timeout_s: float = 2.0,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.url = url
        self.token_file = token_file
        self.min_refresh_s = min_refresh_s
        self.timeout_s = timeout_s
        self.log = log
        self.fetches = 0
        self.errors = 0
        self.last_error = ""
        self._pods: dict[str, Pod] = {}
        self._last_fetch = -float("inf")
        self._lock = threading.Lock()
        self._tls: ssl.SSLContext | None = None
        if url.startswith("https:"):
            self._tls = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
            if insecure_tls:  # the kubelet's self-signed serving certificate
                self._tls.check_hostname = False
                self._tls.verify_mode = ssl.CERT_NONE

    def lookup(self, ref: PodCgroup) -> tuple[Pod | None, bool]:
        """The pod of ``ref`` (None if unknown) and whether its container id is known; never
        fetches (it runs while a scrape is rendered)."""
        with self._lock:
            pod = self._pods.get(ref.uid)
            return pod, pod is not None and ref.container_id in pod.containers

    def ensure(self, ref: PodCgroup) -> None:
        """Fetch if ``ref``'s pod or container is not known and the last fetch is old enough."""
        with self._lock:
            pod = self._pods.get(ref.uid)
            known = pod is not None and (not ref.container_id or ref.container_id in pod.containers)
            if not known and time.monotonic() - self._last_fetch >= self.min_refresh_s:
                self._refresh()

    def refresh(self) -> None:
        """Fetch the PodList now."""
        with self._lock:
            self._refresh()

    def _refresh(self) -> None:
        self._last_fetch = time.monotonic()
        self.fetches += 1
        request = urllib.request.Request(self.url, headers={"Accept": "application/json"})
        try:
            if self.token_file is not None:
                token = self.token_file.read_text(encoding="utf-8").strip()
                request.add_header("Authorization", f"Bearer {token}")
            with urllib.request.urlopen(request, timeout=self.timeout_s, context=self._tls) as r:
                self._pods = parse_pod_list(json.loads(r.read()))
        except (OSError, ValueError) as error:  # URLError, HTTPError, timeouts are OSErrors
            self.errors += 1
            message = f"pod lookup at {self.url} failed: {error}; pods keep their UIDs"
            if message != self.last_error and self.log is not None:
                self.log(message)
            self.last_error = message
            return
        self.last_error = ""


class PodLabeler:
    """``namespace``/``pod``/``container`` of a cgroup path (prefixed for ``victim`` and
    ``aggressor`` labels), cached per path (bounded); names from a ``PodDirectory`` if given."""

    def __init__(self, directory: PodDirectory | None = None, max_entries: int = 4096) -> None:
        self.directory = directory
        self.max_entries = max_entries
        self._parsed: dict[str, PodCgroup | None] = {}

    def observe(self, cgroup_paths: Iterable[str]) -> None:
        """Look up the pods of these paths' cgroups now if they are new (the agent thread calls
        this with each interval, so that a scrape never waits on the kubelet)."""
        if self.directory is None:
            return
        for path in cgroup_paths:
            ref = self._parse(path)
            if ref is not None:
                self.directory.ensure(ref)

    def labels(self, cgroup_path: str, prefix: str = "") -> tuple[tuple[str, str], ...]:
        """Pod label pairs of one cgroup path; () outside any pod."""
        ref = self._parse(cgroup_path)
        if ref is None:
            return ()
        namespace, pod_name = "", ref.uid
        container = ref.container_id[:SHORT_ID_CHARS]
        if self.directory is not None:
            pod, container_known = self.directory.lookup(ref)
            if pod is not None:
                namespace, pod_name = pod.namespace, pod.name
                if container_known:
                    container = pod.containers[ref.container_id]
        values = (namespace, pod_name, container)
        return tuple(
            (f"{prefix}{name}", value) for name, value in zip(POD_LABELS, values, strict=True)
        )

    def _parse(self, cgroup_path: str) -> PodCgroup | None:
        try:
            return self._parsed[cgroup_path]
        except KeyError:  # (the agent thread and a render may both parse: same answer)
            pass
        ref = parse_cgroup_path(cgroup_path)
        if len(self._parsed) >= self.max_entries:
            self._parsed.clear()
        self._parsed[cgroup_path] = ref
        return ref
