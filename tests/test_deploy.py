"""deploy/: every Kubernetes manifest against the Kubernetes 1.34 schema
(kubernetes-validate, strict: unknown fields fail), the ServiceMonitor against the
prometheus-operator CRD's own schema (vendored in tests/fixtures), the remote_write examples
with `promtool check config`, the DaemonSet's arguments through the real `serve` parser, the
image's entrypoint on fake node trees, and the Containerfile against what `pip install .` reads
(no podman/buildah here: the image is not built)."""

from __future__ import annotations

import copy
import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import typer
import yaml

from tailsight.cli.main import app

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"
KUBERNETES_VERSION = "1.34.0"
SERVICEMONITOR_SCHEMA = REPO / "tests/fixtures/prometheus-operator/servicemonitor-v1.schema.yaml"
ENTRYPOINT = DEPLOY / "container/entrypoint.sh"


def manifests() -> list[tuple[str, dict[str, Any]]]:
    """(file: kind/name, document) of every document under deploy/kubernetes."""
    out = []
    for path in sorted((DEPLOY / "kubernetes").glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if document is not None:
                name = f"{path.name}: {document['kind']}/{document['metadata']['name']}"
                out.append((name, document))
    return out


def strict(schema: Any) -> Any:
    """The schema with unknown fields rejected wherever it lists the known ones, as the API
    server's strict field validation (kubectl's default) does for a CRD."""
    if isinstance(schema, dict):
        out = {key: strict(value) for key, value in schema.items()}
        lists_fields = "properties" in out and "additionalProperties" not in out
        if lists_fields and not out.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    return schema


def validate_servicemonitor(document: dict[str, Any]) -> None:
    schema = strict(yaml.safe_load(SERVICEMONITOR_SCHEMA.read_text()))
    jsonschema.Draft7Validator(schema).validate(document)


def validate(document: dict[str, Any]) -> None:
    if document["apiVersion"] == "monitoring.coreos.com/v1":
        assert document["kind"] == "ServiceMonitor"
        validate_servicemonitor(document)
    else:
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


def daemonset() -> dict[str, Any]:
    (found,) = [d for _, d in manifests() if d["kind"] == "DaemonSet"]
    return found


def test_every_manifest_is_valid() -> None:
    found = manifests()
    kinds = sorted(d["kind"] for _, d in found)
    assert kinds == sorted(
        [
            "ClusterRole",
            "ClusterRoleBinding",
            "DaemonSet",
            "Namespace",
            "Service",
            "ServiceAccount",
            "ServiceMonitor",
        ]
    )
    for name, document in found:
        try:
            validate(document)
        except (kubernetes_validate.ValidationError, jsonschema.ValidationError) as error:
            pytest.fail(f"{name}: {error}")


@pytest.mark.parametrize(
    ("kind", "breakage"),
    [
        ("DaemonSet", lambda d: d["spec"]["template"]["spec"].update(hostPid=True)),  # typo
        ("DaemonSet", lambda d: d["spec"]["template"]["spec"]["containers"][0].update(ports=9435)),
        ("Service", lambda d: d["spec"]["ports"][0].update(port="metrics")),
        ("ServiceMonitor", lambda d: d["spec"]["endpoints"][0].update(interval="15 seconds")),
        (
            "ServiceMonitor",
            lambda d: d["spec"]["endpoints"][0]["relabelings"][1].update(action="rename"),
        ),
        ("ServiceMonitor", lambda d: d["spec"]["endpoints"][0].update(scrapeInterval="15s")),
        ("ServiceMonitor", lambda d: d["spec"].pop("selector")),
    ],
)
def test_a_broken_copy_fails(kind: str, breakage: Any) -> None:
    """The validation can fail: each deliberately broken copy of a manifest is rejected."""
    (document,) = [copy.deepcopy(d) for _, d in manifests() if d["kind"] == kind]
    breakage(document)
    with pytest.raises((kubernetes_validate.ValidationError, jsonschema.ValidationError)):
        validate(document)


def test_servicemonitor_schema_is_the_crds() -> None:
    """The vendored schema is the prometheus-operator release it names, and is not vacuous."""
    text = SERVICEMONITOR_SCHEMA.read_text()
    assert "v0.84.1" in text and "monitoring.coreos.com_servicemonitors.yaml" in text
    schema = yaml.safe_load(text)
    assert schema["properties"]["spec"]["required"] == ["endpoints", "selector"]
    jsonschema.Draft7Validator.check_schema(schema)


@pytest.mark.parametrize("name", ["remote-write-mimir.yaml", "remote-write-thanos.yaml"])
def test_remote_write_examples_pass_promtool(name: str, tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    assert promtool is not None, "promtool (Debian's prometheus package) is not installed"
    path = DEPLOY / "prometheus" / name
    result = subprocess.run([promtool, "check", "config", str(path)], capture_output=True)
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()
    config = yaml.safe_load(path.read_text())
    (remote,) = config["remote_write"]
    assert remote["url"].endswith(("/api/v1/push", "/api/v1/receive"))
    # And promtool does reject a broken copy of it.
    remote["queue_config"]["max_shards"] = "many"
    broken = tmp_path / name
    broken.write_text(yaml.safe_dump(config))
    result = subprocess.run([promtool, "check", "config", str(broken)], capture_output=True)
    assert result.returncode != 0


def test_daemonset_runs_on_every_node_with_what_the_probes_need() -> None:
    spec = daemonset()["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert spec["hostPID"] is True
    assert {"operator": "Exists"} in spec["tolerations"]
    context = container["securityContext"]
    assert context.get("privileged", False) is False
    assert context["capabilities"]["drop"] == ["ALL"]
    added = context["capabilities"]["add"]
    assert {"BPF", "PERFMON", "SYS_ADMIN"} <= set(added)
    # Each added capability is preceded by a comment saying what it is for.
    text = (DEPLOY / "kubernetes/daemonset.yaml").read_text()
    for capability in added:
        before = text[: text.index(f"- {capability}\n")].rstrip().splitlines()[-1].strip()
        assert before.startswith("#"), capability
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    for path in ("/sys/kernel/btf", "/sys/fs/cgroup", "/sys/fs/bpf"):
        assert volumes[mounts[path]["name"]]["hostPath"]["path"] == path
    for path in ("/lib/modules", "/usr/src"):
        volume = volumes[mounts[f"/host{path}"]["name"]]
        assert volume["hostPath"]["path"] == path
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/metrics", "port": "metrics"}
    (port,) = container["ports"]
    assert port["name"] == "metrics"
    listen = next(a for a in container["args"] if a.startswith("--listen="))
    assert listen.endswith(f":{port['containerPort']}")
    assert set(container["resources"]) == {"requests", "limits"}


def test_daemonset_args_parse_with_the_real_serve_command(tmp_path: Path) -> None:
    """The container's arguments are options `tailsight serve` has (typos and removed options
    fail here, not on a node), with the values Kubernetes substitutes for $(VAR), and the
    service account's files (which serve checks exist) where Kubernetes mounts them."""
    (container,) = daemonset()["spec"]["template"]["spec"]["containers"]
    names = {e["name"] for e in container["env"]}
    values = {"POD_IP": "10.0.0.7", "NODE_NAME": "node-a"}
    assert set(values) == names
    account = "/var/run/secrets/kubernetes.io/serviceaccount/"
    for name in ("token", "ca.crt"):
        (tmp_path / name).write_text("x")
    args = [
        re.sub(r"\$\((\w+)\)", lambda m: values[m.group(1)], a).replace(account, f"{tmp_path}/")
        for a in container["args"]
    ]
    assert sum(account in a for a in container["args"]) == 2
    assert args[0] == "serve"
    command = typer.main.get_command(app)
    serve = command.commands["serve"]  # type: ignore[attr-defined]
    context = serve.make_context("serve", args[1:])
    assert context.params["pod_labels"] is True
    assert context.params["listen"] == "10.0.0.7:9435"
    assert context.params["kubelet_url"].endswith("fieldSelector=spec.nodeName=node-a")
    assert context.params["kubelet_token_file"] == tmp_path / "token"


def test_service_and_servicemonitor_select_the_daemonsets_pods() -> None:
    found = {d["kind"]: d for _, d in manifests()}
    pod_labels = found["DaemonSet"]["spec"]["template"]["metadata"]["labels"]
    service = found["Service"]
    assert service["spec"]["clusterIP"] == "None"  # headless: one endpoint per node
    assert service["spec"]["selector"].items() <= pod_labels.items()
    monitor = found["ServiceMonitor"]["spec"]
    assert monitor["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["endpoints"]
    assert endpoint["port"] == service["spec"]["ports"][0]["name"]
    account = found["DaemonSet"]["spec"]["template"]["spec"]["serviceAccountName"]
    assert found["ServiceAccount"]["metadata"]["name"] == account
    # The pod list it is allowed: get/list pods, nothing else.
    assert found["ClusterRole"]["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}
    ]


def test_containerfile_copies_what_pip_install_reads() -> None:
    """`pip install .` in the image needs pyproject.toml, its readme and every package-dir
    folder: a folder added to pyproject.toml but not copied would fail the build."""
    text = (REPO / "Containerfile").read_text()
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    copied = {
        part.rstrip("/")
        for line in text.splitlines()
        if line.startswith("COPY ")
        for part in line.split()[1:-1]
    }
    needed = {"pyproject.toml", project["project"]["readme"]}
    needed |= set(project["tool"]["setuptools"]["package-dir"].values())
    assert needed <= copied, needed - copied
    assert all((REPO / path).exists() for path in copied)
    for package in ("python3-bpfcc", "bpftool", "linux-headers-"):
        assert package in text
    assert re.search(r"pip install .*/src", text)
    assert 'ENTRYPOINT ["/usr/local/bin/tailsight-entrypoint"]' in text
    assert "COPY deploy/container/entrypoint.sh /usr/local/bin/tailsight-entrypoint" in text
    assert os.access(ENTRYPOINT, os.X_OK)


def run_entrypoint(tmp_path: Path, host: Path) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": "/usr/bin:/bin",
        "TAILSIGHT_KERNEL_RELEASE": "6.1.0-57-amd64",
        "TAILSIGHT_HOST_ROOT": str(host),
        "TAILSIGHT_MODULES_DIR": str(tmp_path / "modules"),
        "TAILSIGHT_GENERIC_HEADERS": str(tmp_path / "image-src"),
        "TAILSIGHT_EXEC": "echo ran",
    }
    return subprocess.run(
        ["sh", str(ENTRYPOINT), "serve", "--pod-labels"], env=env, capture_output=True, text=True
    )


def test_entrypoint_links_the_nodes_headers_else_the_images(tmp_path: Path) -> None:
    release = "6.1.0-57-amd64"
    image = tmp_path / "image-src"
    for name in (f"linux-headers-{release}", "linux-headers-6.1.0-57-common"):
        (image / name / "include").mkdir(parents=True)
    host = tmp_path / "host"
    modules = tmp_path / "modules" / release
    # A node without headers: the image's generic ones.
    result = run_entrypoint(tmp_path, host)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "ran serve --pod-labels\n"
    assert os.readlink(modules / "build") == str(image / f"linux-headers-{release}")
    assert os.readlink(modules / "source") == str(image / "linux-headers-6.1.0-57-common")
    # A node with its own (absolute links into its /usr/src, as Debian and Ubuntu make them).
    node_src = host / "usr/src"
    (node_src / f"linux-headers-{release}/include").mkdir(parents=True)
    (node_src / "linux-headers-6.1.0-57-common/include").mkdir(parents=True)
    (host / f"lib/modules/{release}").mkdir(parents=True)
    os.symlink(f"/usr/src/linux-headers-{release}", host / f"lib/modules/{release}/build")
    os.symlink("/usr/src/linux-headers-6.1.0-57-common", host / f"lib/modules/{release}/source")
    result = run_entrypoint(tmp_path, host)
    assert result.returncode == 0, result.stderr
    assert "the node's" in result.stderr
    assert os.readlink(modules / "build") == str(node_src / f"linux-headers-{release}")
    assert os.readlink(modules / "source") == str(node_src / "linux-headers-6.1.0-57-common")
    # Neither: a clear message, not a bcc compile error later.
    shutil.rmtree(image)
    shutil.rmtree(host)
    result = run_entrypoint(tmp_path, host)
    assert result.returncode == 1 and "no kernel headers" in result.stderr
    assert result.stdout == ""
