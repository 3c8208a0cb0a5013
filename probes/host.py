"""What the feature checks look at and say, and the first of them: may this process load BPF?

``loader`` asks ``check_capabilities`` before compiling anything and ``features`` runs it first
among the doctor's checks; both import it from here, so neither imports the other for it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

# Capability bit numbers from include/uapi/linux/capability.h.
REQUIRED_CAPABILITIES: dict[str, int] = {"CAP_SYS_ADMIN": 21, "CAP_PERFMON": 38, "CAP_BPF": 39}
FIX_ROOT = "run as root, or grant CAP_BPF, CAP_PERFMON and CAP_SYS_ADMIN"


@dataclass(frozen=True)
class Check:
    """Outcome of one feature check; ``fix`` is a one-line remedy when ``ok`` is false."""

    name: str
    ok: bool
    detail: str
    fix: str | None
    required: bool


@dataclass(frozen=True)
class Host:
    """Where the checks look: real roots by default, a fake tree in tests."""

    proc: Path = Path("/proc")
    sys: Path = Path("/sys")
    modules: Path = Path("/lib/modules")
    kernel_release: str = field(default_factory=lambda: os.uname().release)
    search_path: str | None = None  # PATH for finding bpftool; None = the environment's

    @property
    def btf_path(self) -> Path:
        """The kernel's own BTF blob."""
        return self.sys / "kernel" / "btf" / "vmlinux"

    @property
    def mounts_path(self) -> Path:
        """Our mount table."""
        return self.proc / "self" / "mounts"


def check_capabilities(host: Host) -> Check:
    """Effective capabilities of this process include those BPF tracing needs."""
    name = "privileges"
    status_path = host.proc / "self" / "status"
    try:
        cap_eff = next(
            int(line.split()[1], 16)
            for line in status_path.read_text(encoding="utf-8").splitlines()
            if line.startswith("CapEff:")
        )
    except OSError as error:
        return Check(name, False, f"{status_path}: {error.strerror}", FIX_ROOT, True)
    except (StopIteration, ValueError, IndexError):
        return Check(name, False, f"no CapEff line in {status_path}", FIX_ROOT, True)
    missing = [cap for cap, bit in REQUIRED_CAPABILITIES.items() if not cap_eff >> bit & 1]
    if missing:
        return Check(name, False, "missing " + ", ".join(missing), FIX_ROOT, True)
    return Check(name, True, "CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN", None, True)
