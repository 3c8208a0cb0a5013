"""Settings of one collector (``tailsight trace`` / ``serve`` / ``record``), frozen so that every
component sees the same values for the whole run."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from tailsight.cgroups import normalize
from tailsight.collector.store.writer import group_id

DEFAULT_ADDRESS: Final = "127.0.0.1"
DEFAULT_PORT: Final = 9435
DEFAULT_TOP_K: Final = 20
DEFAULT_WINDOW_S: Final = 60.0


@dataclass(frozen=True)
class CollectorConfig:
    """What to load, how often to read it, how to export it and where to record it.

    ``probes`` empty means every probe in the catalog. ``cgroup_allow`` holds regexes (full match
    on the cgroup path); only matching cgroups may get their own ``cgroup`` label, and of those
    the ``top_k`` busiest (events over the longest window) do; all the rest are summed into
    ``cgroup="other"``.
    """

    probes: tuple[str, ...] = ()
    interval_s: float = 1.0
    address: str = DEFAULT_ADDRESS
    port: int = DEFAULT_PORT
    tls_certfile: Path | None = None
    tls_keyfile: Path | None = None
    basic_auth_user: str | None = None
    basic_auth_hash_file: Path | None = None
    quantile_windows_s: tuple[float, ...] = (DEFAULT_WINDOW_S,)
    cgroup_allow: tuple[str, ...] = ()
    top_k: int = DEFAULT_TOP_K
    record_dir: Path | None = None
    retention_max_age_s: float | None = None
    retention_max_bytes: int | None = None
    record_group: str | None = None  # group that may read the recording (0640/0750)
    cgroup_root: Path | None = None
    # serve --cgroup-root: only this cgroup subtree is exported (one agent per "host" subtree).
    cgroup_subtree: str = "/"
    # trace --cgroup: only these cgroups and their descendants are recorded, filtered in the
    # kernel (normalized paths; empty: all).
    cgroup_filter: tuple[str, ...] = ()
    # Kubernetes: namespace/pod/container labels beside cgroup (collector/pods.py); pod names
    # from a PodList URL (the kubelet's /pods or the API server's), else pod UIDs.
    pod_labels: bool = False
    kubelet_url: str | None = None
    kubelet_token_file: Path | None = None
    kubelet_ca_file: Path | None = None
    kubelet_insecure_tls: bool = False
    # serve --bpf-stats: hold the kernel's BPF run-time stats on (every BPF program on the host
    # then pays two clock reads per run), to export each program's runs and time.
    bpf_stats: bool = False
    proc_root: Path = field(default=Path("/proc"))

    def __post_init__(self) -> None:
        if self.interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {self.interval_s}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port {self.port} outside [0, 65535]")
        if (self.tls_certfile is None) != (self.tls_keyfile is None):
            raise ValueError("TLS needs both a certificate and a key file")
        if (self.basic_auth_user is None) != (self.basic_auth_hash_file is None):
            raise ValueError("basic auth needs both a user and a password hash file")
        group_id(self.record_group)  # ValueError for a group that does not exist
        if any(w <= 0 for w in self.quantile_windows_s):
            raise ValueError(f"quantile windows must be > 0 s, got {self.quantile_windows_s}")
        normalize(self.cgroup_subtree)  # ValueError for "." or ".." in the path
        object.__setattr__(self, "cgroup_filter", tuple(map(normalize, self.cgroup_filter)))
        for pattern in self.cgroup_allow:
            try:
                re.compile(pattern)
            except re.error as error:
                raise ValueError(f"bad cgroup regex {pattern!r}: {error}") from error
        if self.kubelet_url is not None:
            if not self.pod_labels:
                raise ValueError("--kubelet-url names pods for --pod-labels: add --pod-labels")
            if not self.kubelet_url.startswith(("http://", "https://")):
                raise ValueError(f"kubelet URL {self.kubelet_url!r} is not http(s)://")
        if self.retention_max_age_s is not None and self.retention_max_age_s <= 0:
            raise ValueError("retention_max_age_s must be > 0")
        if self.retention_max_bytes is not None and self.retention_max_bytes <= 0:
            raise ValueError("retention_max_bytes must be > 0")

    @property
    def ranking_window_s(self) -> float:
        """Top-K ranks cgroups by events over this span (the longest quantile window)."""
        return max((self.interval_s, *self.quantile_windows_s))
