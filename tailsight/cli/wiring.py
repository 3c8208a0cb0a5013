"""What ``tailsight trace``, ``serve`` and ``record`` run, without their options and output: which
probes (and whether this process may load them), the cgroup filter, the agent with its exporter,
recording or running total, the endpoint, the signals that end a run. The CLI modules parse
options into a CollectorConfig, call these and print; the exceptions say what to report."""

from __future__ import annotations

import contextlib
import ipaddress
import operator
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from tailsight.analysis.verdicts import JumpVerdicts
from tailsight.cgroups import CgroupResolver, find_cgroup2_mount, normalize
from tailsight.collector.agent import Agent, run_every
from tailsight.collector.config import CollectorConfig
from tailsight.collector.endpoint import MetricsServer, read_hash_file, tls_context
from tailsight.collector.exporter import PrometheusExporter
from tailsight.collector.pods import PodDirectory, PodLabeler
from tailsight.collector.store.writer import RecordingWriter
from tailsight.hist import Histogram
from tailsight.intervals import Counter, HistDocument, Series
from tailsight.probes.base import Probe
from tailsight.probes.catalog import PROBES
from tailsight.probes.features import enable_bpf_stats
from tailsight.probes.loader import require_bpf_privileges
from tailsight.probes.runqueue import PROBE_NAME as RUNQUEUE

Log = Callable[[str], None]

NOTHING_ATTACHED = "nothing attached: run `tailsight doctor` to see why"


class BadInput(ValueError):
    """Input found wrong before anything is attached (the CLI's exit 2); ``option`` names the
    option at fault."""

    def __init__(self, message: str, option: str | None = None) -> None:
        super().__init__(message)
        self.option = option


class CannotServe(RuntimeError):
    """``/metrics`` could not be served (the address is taken, ...); already logged."""


# -- before anything is attached -------------------------------------------------------------


def check_probes(names: Sequence[str]) -> None:
    """Known probe names (BadInput), and the privileges to load them (PrivilegeError): one
    message up front, not a compile failure per probe."""
    unknown = [name for name in names if name not in PROBES]
    if unknown:
        raise BadInput(f"unknown probe(s) {unknown}; known: {sorted(PROBES)}", "--probe")
    require_bpf_privileges()


def check_cgroup_root(config: CollectorConfig) -> None:
    """``--cgroup-root`` must name a cgroup that exists (BadInput)."""
    if config.cgroup_subtree == "/":
        return
    try:
        mount = config.cgroup_root or find_cgroup2_mount()
    except FileNotFoundError as error:
        raise BadInput(str(error), "--cgroup-root") from None
    if not (mount / normalize(config.cgroup_subtree).lstrip("/")).is_dir():
        raise BadInput(f"no cgroup {config.cgroup_subtree} under {mount}", "--cgroup-root")


def is_loopback(address: str) -> bool:
    """Whether only this host can reach ``address`` ("localhost" or a loopback IP)."""
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


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


# -- the agent of serve and record -----------------------------------------------------------


def open_recording(config: CollectorConfig) -> RecordingWriter | None:
    """The writer of ``config.record_dir`` (None without one); ValueError for a bad group,
    OSError for a directory that cannot be recorded to (or is another writer's)."""
    if config.record_dir is None:
        return None
    return RecordingWriter(
        config.record_dir,
        max_age_s=config.retention_max_age_s,
        max_bytes=config.retention_max_bytes,
        group=config.record_group,
    )


def live_verdicts(exporter: PrometheusExporter, log: Callable[[str], None]) -> JumpVerdicts:
    """The agent's verdicts: over the exporter's labelled cgroups, posting Grafana annotations
    when ``TAILSIGHT_GRAFANA_URL`` and ``TAILSIGHT_GRAFANA_TOKEN`` are set."""
    url = os.environ.get("TAILSIGHT_GRAFANA_URL", "")
    token = os.environ.get("TAILSIGHT_GRAFANA_TOKEN", "")
    annotate = None
    if url and token:
        try:
            # grafana-client and the dashboard builders load in ~0.4 s: only with a Grafana.
            from tailsight.dashboards.annotations import GrafanaAnnotator

            annotate = GrafanaAnnotator(url, token, log).post
        except ValueError as error:
            log(f"grafana annotations off: {error}")
    kept = lambda cgroup: cgroup in exporter.kept_cgroups(RUNQUEUE)  # noqa: E731
    return JumpVerdicts(keep=kept, annotate=annotate)


def build_agent(config: CollectorConfig, log: Log, export: bool) -> Agent:
    """An agent with an exporter (if ``export``) and a recording writer (if configured)."""
    root = config.cgroup_root or find_cgroup2_mount()
    writer = None
    failed: OSError | None = None
    try:
        writer = open_recording(config)
    except OSError as error:
        if not export:  # `record`: the recording is the point, its caller says why not
            raise
        failed = error
    exporter = PrometheusExporter(config, pods=pod_labeler(config, log)) if export else None
    agent = Agent(
        config,
        CgroupResolver(root),
        exporter=exporter,
        writer=writer,
        log=log,
        make_verdicts=live_verdicts,
    )
    if failed is not None:
        agent.stop_recording(failed)  # serving without the recording beats not serving
    return agent


def pod_labeler(config: CollectorConfig, log: Log) -> PodLabeler | None:
    """The exporter's pod labels for ``--pod-labels`` (names from ``--kubelet-url``)."""
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


def serve(
    config: CollectorConfig,
    stop: threading.Event,
    log: Log,
    duration_s: float | None = None,
    on_ready: Callable[[Agent, MetricsServer], None] | None = None,
) -> Agent:
    """Attach, serve ``/metrics`` and tick until ``stop`` or the duration; always cleans up.
    Bad auth or TLS files are BadInput, found before anything is attached."""
    password_hash = None
    if config.basic_auth_hash_file is not None:
        try:
            password_hash = read_hash_file(config.basic_auth_hash_file)
        except (OSError, ValueError) as error:
            raise BadInput(
                f"{error}; make the hash with `tailsight serve --hash-password`",
                "--basic-auth-hash-file",
            ) from error
    tls = None
    if config.tls_certfile is not None and config.tls_keyfile is not None:
        try:
            tls = tls_context(config.tls_certfile, config.tls_keyfile)
        except OSError as error:  # ssl.SSLError is one
            raise BadInput(
                f"cannot load {config.tls_certfile} / {config.tls_keyfile}: {error}",
                "--tls-cert/--tls-key",
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
        if config.bpf_stats:
            try:
                mechanism = stack.enter_context(enable_bpf_stats(config.proc_root))
                agent.exporter.bpf_stats_enabled = True
                log(f"BPF run-time stats on ({mechanism})")
            except OSError as error:
                log(f"BPF run-time stats unavailable: {error}")
        agent.start()
        if not agent.attached:
            log(NOTHING_ATTACHED)
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
            raise CannotServe(str(error)) from error
        stack.callback(server.close)
        attached = sorted(agent.attached)
        log(f"serving {server.url}; probes attached: {', '.join(attached) or 'none'}")
        if on_ready is not None:
            on_ready(agent, server)
        agent.run(stop, duration_s)
    return agent


def record(
    config: CollectorConfig,
    writer: RecordingWriter,
    stop: threading.Event,
    log: Log,
    duration_s: float | None = None,
) -> tuple[Agent, OSError | None]:
    """Attach and record every interval into ``writer`` until ``stop`` or the duration; always
    detaches. Returns the agent (nothing started: nothing attached) and the error that ended the
    recording, if one did (the intervals written before it stay readable)."""
    try:
        agent = build_agent(config, log, export=False)
    except BaseException:
        writer.close()  # its lock with it: a second try need not wait for this process
        raise
    agent.writer = writer
    failure: OSError | None = None
    try:
        agent.start()
        if not agent.attached:
            log(NOTHING_ATTACHED)
            return agent, None
        log(f"recording {', '.join(sorted(agent.attached))} to {writer.directory}")
        agent.run(stop, duration_s)
    except OSError as error:  # the recording failed (the agent stops on it)
        failure = error
    finally:
        with contextlib.suppress(OSError):
            agent.close()
    return agent, failure


# -- trace: the live session -----------------------------------------------------------------


class RunningTotal:
    """Everything since ``start_ns``: the sum of the interval documents it is given, series and
    counters added by their labels; each probe's come out sorted as ``Snapshot.to_document``
    sorts them, probes in ``order``."""

    def __init__(self, start_ns: int, order: Sequence[str] = ()) -> None:
        self.start_ns = self.end_ns = start_ns
        self.order = list(order)
        # probe -> labels key -> (labels, histogram summed here, owned by this total)
        self._series: dict[
            str, dict[tuple[tuple[str, str], ...], tuple[Mapping[str, str], Histogram]]
        ] = {}
        self._counters: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], Counter]] = {}

    def add(self, interval: HistDocument) -> None:
        for series in interval.series:
            key = tuple(sorted(series.labels.items()))
            held = self._series.setdefault(series.labels.get("probe", ""), {})
            total = held.get(key)
            if total is None:
                total = held[key] = (series.labels, Histogram.empty())
            series.sparse.add_to(total[1])
        for counter in interval.counters:
            counter_key = (counter.name, tuple(sorted(counter.labels.items())))
            counted = self._counters.setdefault(counter.labels.get("probe", ""), {})
            previous = counted.get(counter_key)
            value = counter.value + (0 if previous is None else previous.value)
            counted[counter_key] = Counter(counter.name, counter.labels, value)
        self.end_ns = max(self.end_ns, interval.end_ns)

    def document(self) -> HistDocument:
        def rank(probe: str) -> tuple[int, str]:
            return (self.order.index(probe) if probe in self.order else len(self.order), probe)

        probes = sorted({*self._series, *self._counters}, key=rank)
        by_labels = operator.itemgetter(0)
        return HistDocument(
            start_ns=self.start_ns,
            end_ns=self.end_ns,
            series=[
                Series(dict(labels), hist.copy())
                for probe in probes
                for _, (labels, hist) in sorted(self._series.get(probe, {}).items(), key=by_labels)
            ],
            counters=[
                Counter(c.name, dict(c.labels), c.value)
                for probe in probes
                for _, c in sorted(self._counters.get(probe, {}).items(), key=by_labels)
            ],
        )


class LiveSource(Protocol):
    """What a live loop needs from a session (a fake in tests)."""

    def refresh_filter(self) -> None: ...

    def advance(self) -> tuple[HistDocument, HistDocument]: ...


@dataclass
class LiveSession:
    """``trace``'s collection: an agent without exporter or recording, its cgroup filter, and
    the running total of its intervals."""

    agent: Agent
    total: RunningTotal

    @property
    def probes(self) -> dict[str, Probe]:
        """The attached probes by name."""
        return {name: entry.probe for name, entry in self.agent.attached.items()}

    def refresh_filter(self) -> None:
        """Re-walk the filtered subtrees so descendants created since are recorded too."""
        self.agent.refresh_filter()

    def advance(self) -> tuple[HistDocument, HistDocument]:
        """One read of every probe: (everything since the session opened, the interval since
        the previous ``advance``); both from the same reading, so they agree exactly."""
        interval = self.agent.tick()
        return self.total.document(), interval

    def document(self) -> HistDocument:
        """Everything since the session opened, as of a read now."""
        return self.advance()[0]

    def close(self) -> None:
        self.agent.close()


def open_session(
    probes: Sequence[str],
    cgroups: Sequence[str],
    warn: Log,
    interval_s: float = 1.0,
    resolver: CgroupResolver | None = None,
    create_probe: Callable[[str], Probe] | None = None,
) -> LiveSession:
    """Attach what can be attached (each failure reported through ``warn``), recording only
    ``cgroups`` and their descendants when any are given (BadInput for one that is not there)."""
    resolver = resolver or CgroupResolver(find_cgroup2_mount())
    try:
        config = CollectorConfig(
            probes=tuple(probes), interval_s=interval_s, cgroup_filter=tuple(cgroups)
        )
    except ValueError as error:
        raise BadInput(str(error), "--cgroup") from None
    for path in config.cgroup_filter:
        if not resolver.absolute(path).is_dir():
            raise BadInput(f"no cgroup {path} under {resolver.root}", "--cgroup")
    agent = Agent(config, resolver, log=warn, create_probe=create_probe)
    agent.start()
    total = RunningTotal(agent.started_ns, list(agent.attached))
    agent.listeners.append(total.add)
    return LiveSession(agent, total)


def wait_until(session: LiveSource, duration_s: float | None, interval_s: float) -> None:
    """Collect every interval for the duration (or until Ctrl-C), following new descendants
    of the filtered cgroups."""

    def tick() -> None:
        session.refresh_filter()
        session.advance()

    with contextlib.suppress(KeyboardInterrupt):
        run_every(interval_s, tick, _sleep, duration_s)


def _sleep(seconds: float) -> bool:
    time.sleep(seconds)
    return False
