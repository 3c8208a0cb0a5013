"""Pods from cgroup paths: fake cgroup trees (real directories) shaped like the
kubelet's systemd and cgroupfs layouts, pod names from a kubelet double serving a /pods PodList
over real HTTP, and the labels as the real exporter serves them."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from tailsight.cgroups import CgroupResolver
from tailsight.cli.main import app
from tailsight.collector.config import CollectorConfig
from tailsight.collector.exporter import PrometheusExporter
from tailsight.collector.pods import (
    PodCgroup,
    PodDirectory,
    PodLabeler,
    parse_cgroup_path,
    parse_pod_list,
)
from tailsight.hist import Histogram
from tailsight.intervals import Counter, HistDocument, Series

T0_NS = 1_700_000_000 * 10**9


def container_id(seed: int) -> str:
    return f"{seed:02x}" * 32


class FakeNode:
    """A node's pods laid out as cgroup directories in ``root``; ``truth`` maps each path made
    to the pod UID and container id it stands for (None: no pod)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.truth: dict[str, PodCgroup | None] = {}

    def mkdir(self, path: str, ref: PodCgroup | None) -> str:
        (self.root / path.lstrip("/")).mkdir(parents=True, exist_ok=True)
        self.truth[path] = ref
        return path


def systemd_node(root: Path) -> tuple[FakeNode, dict[str, str]]:
    """The systemd cgroup driver: a Guaranteed, a Burstable and a BestEffort pod, containers of
    containerd, CRI-O (with its conmon scope) and Docker, and cgroups that are no pod's."""
    node = FakeNode(root)
    uids = {q: str(uuid.UUID(int=i + 1)) for i, q in enumerate(("guaranteed", "burstable", "be"))}
    node.mkdir("/kubepods.slice", None)
    node.mkdir("/system.slice/containerd.service", None)
    node.mkdir("/user.slice/user-0.slice", None)
    for qos, uid in uids.items():
        escaped = uid.replace("-", "_")
        parent = {
            "guaranteed": f"/kubepods.slice/kubepods-pod{escaped}.slice",
            "burstable": "/kubepods.slice/kubepods-burstable.slice/"
            f"kubepods-burstable-pod{escaped}.slice",
            "be": "/kubepods.slice/kubepods-besteffort.slice/"
            f"kubepods-besteffort-pod{escaped}.slice",
        }[qos]
        node.mkdir(parent, PodCgroup(uid))
    g, b, e = (uids[q] for q in ("guaranteed", "burstable", "be"))
    pod_g = f"/kubepods.slice/kubepods-pod{g.replace('-', '_')}.slice"
    pod_b = (
        "/kubepods.slice/kubepods-burstable.slice/"
        f"kubepods-burstable-pod{b.replace('-', '_')}.slice"
    )
    pod_e = (
        "/kubepods.slice/kubepods-besteffort.slice/"
        f"kubepods-besteffort-pod{e.replace('-', '_')}.slice"
    )
    node.mkdir(f"{pod_g}/cri-containerd-{container_id(1)}.scope", PodCgroup(g, container_id(1)))
    node.mkdir(f"{pod_b}/crio-{container_id(2)}.scope", PodCgroup(b, container_id(2)))
    node.mkdir(f"{pod_b}/crio-conmon-{container_id(2)}.scope", PodCgroup(b))
    node.mkdir(f"{pod_e}/docker-{container_id(3)}.scope", PodCgroup(e, container_id(3)))
    # A process's own cgroup below a container's (e.g. systemd inside it): still that container.
    node.mkdir(
        f"{pod_g}/cri-containerd-{container_id(1)}.scope/init.scope", PodCgroup(g, container_id(1))
    )
    return node, uids


def cgroupfs_node(root: Path) -> tuple[FakeNode, dict[str, str]]:
    """The cgroupfs driver (kubepods/<qos>/pod<uid>/<container id>), plus a directory that looks
    like a pod outside the kubepods tree (not a pod)."""
    node = FakeNode(root)
    uids = {q: str(uuid.UUID(int=0xABC0 + i)) for i, q in enumerate(("guaranteed", "burstable"))}
    g, b = uids["guaranteed"], uids["burstable"]
    node.mkdir("/kubepods", None)
    node.mkdir("/kubepods/burstable", None)
    node.mkdir(f"/kubepods/pod{g}", PodCgroup(g))
    node.mkdir(f"/kubepods/pod{g}/{container_id(4)}", PodCgroup(g, container_id(4)))
    node.mkdir(f"/kubepods/burstable/pod{b}", PodCgroup(b))
    node.mkdir(f"/kubepods/burstable/pod{b}/{container_id(5)}", PodCgroup(b, container_id(5)))
    node.mkdir(f"/tailsight/pod{g}", None)
    return node, uids


@pytest.mark.parametrize("layout", [systemd_node, cgroupfs_node])
def test_every_cgroup_of_a_fake_tree_maps_to_its_pod(tmp_path: Path, layout: Any) -> None:
    node, _ = layout(tmp_path)
    walked = {path for _, path in CgroupResolver(tmp_path).walk()} - {"/"}
    # Every directory the walk finds (intermediate ones too) is checked against what it was
    # made for; the intermediate ones are no pod's.
    assert set(node.truth) <= walked
    for path in sorted(walked):
        assert parse_cgroup_path(path) == node.truth.get(path), path


def test_kubelet_tree_under_a_prefix() -> None:
    """A kind node (or a cgroup namespace) puts the kubelet's tree under a prefix."""
    uid = str(uuid.UUID(int=7))
    path = (
        "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/"
        f"kubelet-kubepods-burstable-pod{uid.replace('-', '_')}.slice/"
        f"cri-containerd-{container_id(7)}.scope"
    )
    assert parse_cgroup_path(path) == PodCgroup(uid, container_id(7))


class KubeletDouble:
    """A double of the kubelet's authenticated ``GET /pods`` (real HTTP on loopback): answers a
    PodList (the shape kubelet and API server return) to the right bearer token, else 401."""

    def __init__(self, pods: list[dict[str, Any]], token: str) -> None:
        self.pods = pods
        self.token = token
        self.requests = 0
        double = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                double.requests += 1
                if self.headers.get("Authorization") != f"Bearer {double.token}":
                    self.send_response(401)
                    self.end_headers()
                    return
                if self.path != "/pods":
                    self.send_response(404)
                    self.end_headers()
                    return
                body = json.dumps({"kind": "PodList", "apiVersion": "v1", "items": double.pods})
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/pods"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def pod_item(namespace: str, name: str, uid: str, containers: dict[str, str]) -> dict[str, Any]:
    """One item of a PodList as the kubelet writes it (containerID is runtime://id)."""
    return {
        "metadata": {"namespace": namespace, "name": name, "uid": uid},
        "spec": {"containers": [{"name": c} for c in containers.values()]},
        "status": {
            "phase": "Running",
            "containerStatuses": [
                {"name": name, "containerID": f"containerd://{cid}", "ready": True}
                for cid, name in containers.items()
            ],
        },
    }


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text("s3cret\n")
    return path


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[tuple[KubeletDouble, dict[str, str]]]:
    _, uids = systemd_node(tmp_path / "cg")
    pods = [
        pod_item("trading", "book-7d9f", uids["guaranteed"], {container_id(1): "book"}),
        pod_item("batch", "hog-x1", uids["be"], {container_id(3): "hog"}),
    ]
    double = KubeletDouble(pods, token="s3cret")
    yield double, uids
    double.close()


def test_pod_names_from_the_kubelet_double(
    kubelet: tuple[KubeletDouble, dict[str, str]], token_file: Path
) -> None:
    double, uids = kubelet
    labeler = PodLabeler(PodDirectory(double.url, token_file=token_file))
    g = uids["guaranteed"]
    path = f"/kubepods.slice/kubepods-pod{g.replace('-', '_')}.slice"
    container = f"{path}/cri-containerd-{container_id(1)}.scope"
    labeler.observe([container])
    assert double.requests == 1
    assert labeler.labels(container) == (
        ("namespace", "trading"),
        ("pod", "book-7d9f"),
        ("container", "book"),
    )
    # The pod's own cgroup: named, no container; as the victim of a displacement: prefixed.
    assert labeler.labels(path, "victim_") == (
        ("victim_namespace", "trading"),
        ("victim_pod", "book-7d9f"),
        ("victim_container", ""),
    )
    # A pod the kubelet does not list (yet): its UID, the short container id; the fetch it
    # triggers waits for min_refresh_s, so a burst of unknown pods costs one request.
    b = uids["burstable"]
    unknown = (
        "/kubepods.slice/kubepods-burstable.slice/"
        f"kubepods-burstable-pod{b.replace('-', '_')}.slice/crio-{container_id(2)}.scope"
    )
    labeler.observe([unknown, unknown])
    assert double.requests == 1
    assert labeler.labels(unknown) == (
        ("namespace", ""),
        ("pod", b),
        ("container", container_id(2)[:12]),
    )
    assert labeler.labels("/system.slice/containerd.service") == ()


def test_pod_lookup_failure_keeps_uids_and_rereads_the_token(
    kubelet: tuple[KubeletDouble, dict[str, str]], token_file: Path
) -> None:
    double, uids = kubelet
    logged: list[str] = []
    directory = PodDirectory(double.url, token_file=token_file, min_refresh_s=0, log=logged.append)
    labeler = PodLabeler(directory)
    path = f"/kubepods.slice/kubepods-pod{uids['guaranteed'].replace('-', '_')}.slice"
    double.token = "rotated"  # the projected token rotated; our file still holds the old one
    labeler.observe([path])
    assert directory.errors == 1 and "401" in logged[0]
    assert labeler.labels(path) == (
        ("namespace", ""),
        ("pod", uids["guaranteed"]),
        ("container", ""),
    )
    token_file.write_text("rotated")
    labeler.observe([path])
    assert directory.errors == 1 and directory.last_error == ""
    assert dict(labeler.labels(path))["pod"] == "book-7d9f"


def test_pod_list_shape_is_checked() -> None:
    with pytest.raises(ValueError, match="PodList"):
        parse_pod_list({"kind": "Status", "status": "Failure"})
    pods = parse_pod_list({"items": [pod_item("ns", "p", "U-1", {"ab": "c"}), {"metadata": {}}]})
    assert set(pods) == {"u-1"} and pods["u-1"].containers == {"ab": "c"}


def scrape(text: bytes) -> list[tuple[str, dict[str, str]]]:
    return [
        (sample.name, sample.labels)
        for family in text_string_to_metric_families(text.decode())
        for sample in family.samples
    ]


def test_exporter_serves_pod_labels_beside_cgroup(
    tmp_path: Path, kubelet: tuple[KubeletDouble, dict[str, str]], token_file: Path
) -> None:
    """Through the real exporter's exposition: each kept cgroup of a pod carries its namespace,
    pod and container; a displacement counter names victim and aggressor pods; a cgroup of no
    pod and "other" carry none; and promtool accepts the result."""
    double, uids = kubelet
    g, e = uids["guaranteed"], uids["be"]
    victim = f"/kubepods.slice/kubepods-pod{g.replace('-', '_')}.slice/" + (
        f"cri-containerd-{container_id(1)}.scope"
    )
    aggressor = (
        f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{e.replace('-', '_')}"
        f".slice/docker-{container_id(3)}.scope"
    )
    host = "/system.slice/containerd.service"
    folded = "/user.slice/user-0.slice"
    config = CollectorConfig(top_k=3, pod_labels=True, kubelet_url=double.url)
    exporter = PrometheusExporter(
        config, pods=PodLabeler(PodDirectory(double.url, token_file=token_file))
    )
    rng = np.random.default_rng(5)
    # Event counts rank the cgroups: the least busy one folds into "other".
    sizes = {victim: 400, aggressor: 300, host: 200, folded: 10}
    series = [
        Series(
            {"probe": "runqueue", "cgroup": c}, Histogram.from_samples(rng.integers(0, 10**6, n))
        )
        for c, n in sizes.items()
    ]
    labels = {"probe": "runqueue", "victim": victim, "aggressor": aggressor}
    counters = [Counter("runqueue_displaced_wait_ns", labels, 5_000)]
    exporter.update(HistDocument(T0_NS, T0_NS + 10**9, series, counters))
    text = exporter.exposition()
    samples = scrape(text)

    def pod_of(name: str, cgroup: str) -> tuple[str, str, str]:
        found = {
            (s["namespace"], s["pod"], s["container"])
            for n, s in samples
            if n == name and s.get("cgroup") == cgroup
        }
        assert len(found) == 1, (cgroup, found)
        return found.pop()

    for name in (
        "tailsight_runqueue_wait_seconds_count",
        "tailsight_runqueue_wait_quantile_seconds",
    ):
        assert pod_of(name, victim) == ("trading", "book-7d9f", "book")
        assert pod_of(name, aggressor) == ("batch", "hog-x1", "hog")
        assert pod_of(name, host) == ("", "", "")
        assert pod_of(name, "other") == ("", "", "")
    (displaced,) = [s for n, s in samples if n == "tailsight_runqueue_displaced_wait_seconds_total"]
    assert (displaced["victim_pod"], displaced["victim_container"]) == ("book-7d9f", "book")
    assert (displaced["aggressor_namespace"], displaced["aggressor_pod"]) == ("batch", "hog-x1")
    promtool = shutil.which("promtool")
    assert promtool is not None, "promtool (Debian's prometheus package) is not installed"
    result = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True)
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()
    # Off by default: the same document exports no pod label.
    plain = PrometheusExporter(CollectorConfig(top_k=3))
    plain.update(HistDocument(T0_NS, T0_NS + 10**9, series, counters))
    assert not any("pod" in s or "victim_pod" in s for _, s in scrape(plain.exposition()))


def test_serve_kubelet_url_needs_pod_labels() -> None:
    result = CliRunner().invoke(app, ["serve", "--kubelet-url", "https://127.0.0.1:10250/pods"])
    assert result.exit_code == 2 and "--pod-labels" in result.output
    assert "Traceback" not in result.output
    result = CliRunner().invoke(
        app, ["serve", "--pod-labels", "--kubelet-url", "kubelet.local:10250"]
    )
    assert result.exit_code == 2 and "http(s)://" in result.output
