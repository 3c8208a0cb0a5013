"""``tailsight serve``: the collector as a Prometheus endpoint (127.0.0.1:9435 by default),
optionally recording full-resolution intervals too; SIGTERM detaches and flushes."""

from __future__ import annotations

import contextlib
import ipaddress
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from tailsight.collector.agent import Agent
    from tailsight.collector.config import CollectorConfig
    from tailsight.collector.endpoint import MetricsServer
    from tailsight.collector.pods import PodLabeler


def parse_listen(text: str) -> tuple[str, int]:
    """``host:port``, ``[v6]:port`` or ``:port`` (loopback) -> (address, port)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise typer.BadParameter(f"expected HOST:PORT, got {text!r}", param_hint="--listen")
    host = host.strip("[]") or "127.0.0.1"
    return host, int(port)


def log_to_stderr(message: str) -> None:
    """One line per event (attach failures, resets) on stderr."""
    print(f"tailsight: {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def stop_on_signals(stop: threading.Event) -> Iterator[None]:
    """SIGTERM / SIGINT set ``stop`` (the loop then detaches and flushes) instead of killing us."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

    def handler(signum: int, frame: Any) -> None:
        stop.set()

    for sig in previous:
        signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def build_agent(config: CollectorConfig, log: Callable[[str], None], export: bool) -> Agent:
    """An agent with an exporter (if ``export``) and a recording writer (if configured)."""
    from tailsight.collector.agent import Agent
    from tailsight.collector.cgroups import CgroupResolver, find_cgroup2_mount
    from tailsight.collector.exporter import PrometheusExporter
    from tailsight.collector.store import RecordingWriter

    root = config.cgroup_root or find_cgroup2_mount()
    writer = None
    failed: OSError | None = None
    if config.record_dir is not None:
        try:
            writer = RecordingWriter(
                config.record_dir,
                max_age_s=config.retention_max_age_s,
                max_bytes=config.retention_max_bytes,
                group=config.record_group,
            )
        except OSError as error:
            if not export:  # `record`: the recording is the point, its caller says why not
                raise
            failed = error
    exporter = PrometheusExporter(config, pods=pod_labeler(config, log)) if export else None
    agent = Agent(config, CgroupResolver(root), exporter=exporter, writer=writer, log=log)
    if failed is not None:
        agent.stop_recording(failed)  # serving without the recording beats not serving
    return agent


def pod_labeler(config: CollectorConfig, log: Callable[[str], None]) -> PodLabeler | None:
    """The exporter's pod labels for ``--pod-labels`` (names from ``--kubelet-url``)."""
    from tailsight.collector.pods import PodDirectory, PodLabeler

    if not config.pod_labels:
        return None
    directory = None
    if config.kubelet_url is not None:
        directory = PodDirectory(
            config.kubelet_url,
            token_file=config.kubelet_token_file,
            ca_file=config.kubelet_ca_file,
            insecure_tls=config.kubelet_insecure_tls,
            log=log,
        )
    return PodLabeler(directory)


def is_loopback(address: str) -> bool:
    """Whether only this host can reach ``address`` ("localhost" or a loopback IP)."""
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def run_serve(
    config: CollectorConfig,
    stop: threading.Event,
    duration_s: float | None = None,
    log: Callable[[str], None] = log_to_stderr,
    on_ready: Callable[[Agent, MetricsServer], None] | None = None,
) -> Agent:
    """Attach, serve ``/metrics`` and tick until ``stop`` or the duration; always cleans up."""
    from tailsight.collector.endpoint import MetricsServer, read_hash_file, tls_context
    from tailsight.probes.features import enable_bpf_stats

    # Bad files are bad input (exit 2), found before anything is attached.
    password_hash = None
    if config.basic_auth_hash_file is not None:
        try:
            password_hash = read_hash_file(config.basic_auth_hash_file)
        except (OSError, ValueError) as error:
            raise typer.BadParameter(
                f"{error}; make the hash with `tailsight serve --hash-password`",
                param_hint="--basic-auth-hash-file",
            ) from error
    tls = None
    if config.tls_certfile is not None and config.tls_keyfile is not None:
        try:
            tls = tls_context(config.tls_certfile, config.tls_keyfile)
        except OSError as error:  # ssl.SSLError is one
            raise typer.BadParameter(
                f"cannot load {config.tls_certfile} / {config.tls_keyfile}: {error}",
                param_hint="--tls-cert/--tls-key",
            ) from error
    if not is_loopback(config.address) and tls is None and password_hash is None:
        log(
            f"warning: /metrics on {config.address} is reachable from the network with neither "
            "TLS nor auth: anyone who connects reads cgroup paths and latencies "
            "(add --tls-cert/--tls-key and --basic-auth-user, or listen on 127.0.0.1)"
        )
    agent = build_agent(config, log, export=True)
    assert agent.exporter is not None
    with contextlib.ExitStack() as stack:
        stack.callback(agent.close)
        try:
            mechanism = stack.enter_context(enable_bpf_stats(config.proc_root))
            agent.exporter.bpf_stats_enabled = True
            log(f"BPF run-time stats on ({mechanism})")
        except OSError as error:
            log(f"BPF run-time stats unavailable: {error}")
        agent.start()
        if not agent.attached:
            log("nothing attached: run `tailsight doctor` to see why")
            return agent
        try:
            server = MetricsServer(
                agent.exporter.exposition,
                config.address,
                config.port,
                tls=tls,
                user=config.basic_auth_user,
                password_hash=password_hash,
            )
        except OSError as error:
            log(f"cannot serve on {config.address}:{config.port}: {error.strerror or error}")
            raise typer.Exit(1) from error
        stack.callback(server.close)
        attached = sorted(agent.attached)
        log(f"serving {server.url}; probes attached: {', '.join(attached) or 'none'}")
        if on_ready is not None:
            on_ready(agent, server)
        agent.run(stop, duration_s)
    return agent


def serve(
    probe: Annotated[
        list[str] | None,
        typer.Option("--probe", help="Probe to load (repeatable; default: every probe)."),
    ] = None,
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
        int, typer.Option("--top-k", min=0, help="Busiest cgroups labelled; the rest = other.")
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
    retention_age: Annotated[
        float | None, typer.Option("--retention-age", min=1, help="Drop recordings older (s).")
    ] = None,
    retention_bytes: Annotated[
        int | None, typer.Option("--retention-bytes", min=4096, help="Cap on recording bytes.")
    ] = None,
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
) -> None:
    """Serve per-cgroup latency histograms to Prometheus until SIGTERM / Ctrl-C."""
    from tailsight.collector.config import DEFAULT_WINDOW_S, CollectorConfig

    if hash_password:
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
        )
    except ValueError as error:
        raise typer.BadParameter(str(error)) from error
    _check_probes(config)
    _check_subtree(config)
    stop = threading.Event()
    with stop_on_signals(stop):
        agent = run_serve(config, stop, duration)
    if not agent.started:
        raise typer.Exit(1)


def _check_subtree(config: CollectorConfig) -> None:
    """``--cgroup-root`` must name a cgroup that exists (exit 2 before anything is attached)."""
    from tailsight.collector.cgroups import find_cgroup2_mount, normalize

    if config.cgroup_subtree == "/":
        return
    try:
        mount = config.cgroup_root or find_cgroup2_mount()
    except FileNotFoundError as error:
        raise typer.BadParameter(str(error), param_hint="--cgroup-root") from None
    if not (mount / normalize(config.cgroup_subtree).lstrip("/")).is_dir():
        raise typer.BadParameter(
            f"no cgroup {config.cgroup_subtree} under {mount}", param_hint="--cgroup-root"
        )


def _check_probes(config: CollectorConfig) -> None:
    """Known probe names, and the privileges to load them: one message up front (exit 2), not
    a compile failure per probe."""
    from tailsight.probes.catalog import PROBE_CLASSES
    from tailsight.probes.loader import PrivilegeError, require_bpf_privileges

    unknown = [p for p in config.probes if p not in PROBE_CLASSES]
    if unknown:
        raise typer.BadParameter(
            f"unknown probe(s) {unknown}; known: {sorted(PROBE_CLASSES)}", param_hint="--probe"
        )
    try:
        require_bpf_privileges()
    except PrivilegeError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2) from None
