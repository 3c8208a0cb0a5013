"""``tailsight serve``: the collector as a Prometheus endpoint (127.0.0.1:9435 by default),
optionally recording full-resolution intervals too; SIGTERM detaches and flushes."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Annotated

import typer

from tailsight.cli.shared import (
    ProbeOption,
    RetentionAgeOption,
    RetentionBytesOption,
    check_probes_or_exit,
    log_to_stderr,
)


def parse_listen(text: str) -> tuple[str, int]:
    """``host:port``, ``[v6]:port`` or ``:port`` (loopback) -> (address, port)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise typer.BadParameter(f"expected HOST:PORT, got {text!r}", param_hint="--listen")
    host = host.strip("[]") or "127.0.0.1"
    return host, int(port)


def serve(
    probe: ProbeOption = None,
    interval: Annotated[
        float, typer.Option("--interval", min=0.05, help="Seconds between probe reads.")
    ] = 1.0,
    listen: Annotated[
        str, typer.Option("--listen", help="HOST:PORT of /metrics (loopback by default).")
    ] = "127.0.0.1:9435",
    tls_cert: Annotated[
        Path | None, typer.Option("--tls-cert", exists=True, help="PEM certificate: serve HTTPS.")
    ] = None,
    tls_key: Annotated[
        Path | None, typer.Option("--tls-key", exists=True, help="PEM private key for --tls-cert.")
    ] = None,
    basic_auth_user: Annotated[
        str | None, typer.Option("--basic-auth-user", help="Require HTTP basic auth as USER.")
    ] = None,
    basic_auth_hash_file: Annotated[
        Path | None,
        typer.Option(
            "--basic-auth-hash-file",
            exists=True,
            help="File with the user's pbkdf2_sha256 hash (see --hash-password).",
        ),
    ] = None,
    hash_password: Annotated[
        bool,
        typer.Option(
            "--hash-password", help="Print the hash of a password read from stdin, and exit."
        ),
    ] = False,
    cgroup_allow: Annotated[
        list[str] | None,
        typer.Option(
            "--cgroup-allow",
            help="Regex (full match on the cgroup path) of cgroups that may get their own "
            "label (repeatable; default all).",
        ),
    ] = None,
    top_k: Annotated[
        int,
        typer.Option(
            "--top-k",
            min=0,
            help="Busiest cgroups labelled (a place changes hands at 1.25x); the rest = other.",
        ),
    ] = 20,
    cgroup_root: Annotated[
        str,
        typer.Option(
            "--cgroup-root",
            help="Export only this cgroup and its descendants (path under the cgroup2 mount).",
        ),
    ] = "/",
    window: Annotated[
        list[float] | None,
        typer.Option("--window", min=0.1, help="Quantile window in seconds (repeatable)."),
    ] = None,
    record: Annotated[
        Path | None, typer.Option("--record", help="Also record every interval in DIR.")
    ] = None,
    retention_age: RetentionAgeOption = None,
    retention_bytes: RetentionBytesOption = None,
    record_group: Annotated[
        str | None,
        typer.Option(
            "--record-group", help="Group that may read the recording (0640/0750; default 0600)."
        ),
    ] = None,
    duration: Annotated[
        float | None, typer.Option("--duration", min=0.0, help="Stop after S seconds.")
    ] = None,
    pod_labels: Annotated[
        bool,
        typer.Option("--pod-labels", help="Kubernetes: namespace/pod/container labels too."),
    ] = False,
    kubelet_url: Annotated[
        str | None,
        typer.Option(
            "--kubelet-url",
            help="PodList URL naming pods for --pod-labels (https://NODE:10250/pods, or the "
            "API server's /api/v1/pods?fieldSelector=spec.nodeName=NODE); default: pod UIDs.",
        ),
    ] = None,
    kubelet_token_file: Annotated[
        Path | None,
        typer.Option(
            "--kubelet-token-file", exists=True, help="Bearer token file (re-read each fetch)."
        ),
    ] = None,
    kubelet_ca: Annotated[
        Path | None, typer.Option("--kubelet-ca", exists=True, help="CA bundle for its TLS.")
    ] = None,
    kubelet_insecure_tls: Annotated[
        bool,
        typer.Option("--kubelet-insecure-tls", help="Skip TLS verification (self-signed)."),
    ] = False,
    bpf_stats: Annotated[
        bool,
        typer.Option(
            "--bpf-stats",
            help="Hold the kernel's BPF run-time stats on while serving, to export each "
            "program's runs and time. Costs every BPF program on the host two clock reads per "
            "run (measured: a one-CPU pipe ping-pong 10 % slower on top of the probes).",
        ),
    ] = False,
) -> None:
    """Serve per-cgroup latency histograms to Prometheus until SIGTERM / Ctrl-C."""
    # Loads numpy: kept out of `tailsight --help`.
    from tailsight.cli.wiring import (
        BadInput,
        CannotServe,
        check_cgroup_root,
        stop_on_signals,
    )
    from tailsight.cli.wiring import serve as run_serve
    from tailsight.collector.config import DEFAULT_WINDOW_S, CollectorConfig

    if hash_password:
        # Loads ssl and http.server (~25 ms): kept out of `tailsight --help`.
        from tailsight.collector.endpoint import hash_password as make_hash

        password = sys.stdin.readline().rstrip("\n")
        if not password:
            raise typer.BadParameter("empty password on stdin", param_hint="--hash-password")
        print(make_hash(password))
        return
    address, port = parse_listen(listen)
    try:
        config = CollectorConfig(
            probes=tuple(probe or ()),
            interval_s=interval,
            address=address,
            port=port,
            tls_certfile=tls_cert,
            tls_keyfile=tls_key,
            basic_auth_user=basic_auth_user,
            basic_auth_hash_file=basic_auth_hash_file,
            quantile_windows_s=tuple(window or (DEFAULT_WINDOW_S,)),
            cgroup_allow=tuple(cgroup_allow or ()),
            top_k=top_k,
            cgroup_subtree=cgroup_root,
            record_dir=record,
            retention_max_age_s=retention_age,
            retention_max_bytes=retention_bytes,
            record_group=record_group,
            pod_labels=pod_labels,
            kubelet_url=kubelet_url,
            kubelet_token_file=kubelet_token_file,
            kubelet_ca_file=kubelet_ca,
            kubelet_insecure_tls=kubelet_insecure_tls,
            bpf_stats=bpf_stats,
        )
    except ValueError as error:
        raise typer.BadParameter(str(error)) from error
    check_probes_or_exit(config.probes)
    try:
        check_cgroup_root(config)
        stop = threading.Event()
        with stop_on_signals(stop):
            agent = run_serve(config, stop, log_to_stderr, duration)
    except BadInput as error:
        raise typer.BadParameter(str(error), param_hint=error.option) from error
    except CannotServe as error:
        raise typer.Exit(1) from error
    if not agent.started:
        raise typer.Exit(1)
