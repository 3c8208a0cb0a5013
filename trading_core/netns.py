"""The trading system's network: an exchange and a trading namespace joined by one veth pair.

Private /30 addresses that exist only inside the two namespaces (nothing is routed to the host).
Links and addresses are set with pyroute2 (netlink); the namespaces are made by iproute2.
Code joins a namespace either for a whole child process (``run_in_netns``)
or for the calling thread only (``in_netns``): a network namespace is per thread, and a socket
stays in the namespace it was created in, so a thread may create its sockets inside and return.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import pickle
import signal
import subprocess
import sys
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final, ParamSpec, TypeVar

__all__ = [
    "NETNS_DIR",
    "PREFIX",
    "Topology",
    "cleanup",
    "down",
    "exists",
    "in_netns",
    "list_namespaces",
    "run_in_netns",
    "topology",
    "unique_topology",
    "up",
]

NETNS_DIR: Final = Path("/run/netns")  # where iproute2 and pyroute2 bind-mount named namespaces
PREFIX: Final = (
    "ts-"  # every namespace/interface created here starts with it (``cleanup`` relies on it)
)
_CLONE_NEWNET: Final = 0x40000000

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True)
class Topology:
    """Names, addresses and ports of the two-namespace network (defaults = the live system)."""

    exchange_ns: str = "ts-exchange"
    trading_ns: str = "ts-trading"
    exchange_ip: str = "10.201.0.1"
    trading_ip: str = "10.201.0.2"
    prefix: int = 30
    exchange_if: str = "ts-ex0"
    trading_if: str = "ts-tr0"
    feed_port: int = 26400
    order_port: int = 26401
    rerequest_port: int = 26402

    def __post_init__(self) -> None:
        for name in (self.exchange_ns, self.trading_ns, self.exchange_if, self.trading_if):
            if not name.startswith(PREFIX):
                raise ValueError(f"{name!r} must start with {PREFIX!r} so cleanup can find it")
        for name in (self.exchange_if, self.trading_if):
            if len(name) > 15:  # IFNAMSIZ - 1
                raise ValueError(f"interface name {name!r} is longer than 15 bytes")


def unique_topology(tag: str = "", base: Topology | None = None) -> Topology:
    """``base`` with namespaces suffixed by our pid (and ``tag``), for concurrent tests.

    The veth ends are created directly inside the namespaces, so their names need not be unique.
    """
    base = Topology() if base is None else base
    suffix = f"-{os.getpid()}{'-' + tag if tag else ''}"
    return replace(base, exchange_ns=base.exchange_ns + suffix, trading_ns=base.trading_ns + suffix)


def exists(name: str) -> bool:
    """Whether the named network namespace exists."""
    return (NETNS_DIR / name).exists()


def list_namespaces(prefix: str = PREFIX) -> list[str]:
    """Named network namespaces starting with ``prefix``."""
    if not NETNS_DIR.is_dir():
        return []
    return sorted(p.name for p in NETNS_DIR.iterdir() if p.name.startswith(prefix))


def _ip(*args: str) -> None:
    # Creating a named namespace means unshare + bind mount under a shared /run/netns: iproute2
    # does exactly that; pyroute2's netns.create forks a helper that leaks sockets (warnings).
    result = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip()}")


@contextlib.contextmanager
def _netlink(name: str) -> Iterator[Any]:
    """A pyroute2 IPRoute whose netlink socket lives in namespace ``name`` (no helper process)."""
    from pyroute2 import IPRoute

    with in_netns(name):
        route = IPRoute()
    try:
        yield route
    finally:
        route.close()


def _link_index(ns: Any, ifname: str) -> int | None:
    found = ns.link_lookup(ifname=ifname)
    return int(found[0]) if found else None


def _ensure_address(ns: Any, index: int, address: str, prefix: int) -> None:
    try:
        ns.addr("add", index=index, address=address, prefixlen=prefix)
    except Exception as error:  # pyroute2 NetlinkError: EEXIST when already configured
        if getattr(error, "code", None) != errno.EEXIST:
            raise


def up(topo: Topology = Topology()) -> Topology:
    """Create both namespaces and the veth pair between them; idempotent."""
    try:
        for name in (topo.exchange_ns, topo.trading_ns):
            if not exists(name):
                _ip("netns", "add", name)
        with _netlink(topo.exchange_ns) as ex_ns, _netlink(topo.trading_ns) as tr_ns:
            if _link_index(ex_ns, topo.exchange_if) is None:
                if (stale := _link_index(tr_ns, topo.trading_if)) is not None:
                    tr_ns.link("del", index=stale)  # half a pair left by a crash
                ex_ns.link(
                    "add",
                    ifname=topo.exchange_if,
                    kind="veth",
                    peer={"ifname": topo.trading_if, "net_ns_fd": topo.trading_ns},
                )
            for ns, ifname, address in (
                (ex_ns, topo.exchange_if, topo.exchange_ip),
                (tr_ns, topo.trading_if, topo.trading_ip),
            ):
                index = _link_index(ns, ifname)
                if index is None:
                    raise RuntimeError(f"veth end {ifname} missing in its namespace")
                _ensure_address(ns, index, address, topo.prefix)
                ns.link("set", index=index, state="up")
                lo = _link_index(ns, "lo")
                if lo is not None:
                    ns.link("set", index=lo, state="up")
    except BaseException:
        down(topo)
        raise
    return topo


def _remove_namespace(name: str) -> None:
    if exists(name):
        # Deleting a namespace destroys its veth ends (and so their peers) with it.
        _ip("netns", "delete", name)


def down(topo: Topology = Topology()) -> None:
    """Remove both namespaces (and with them the veth pair); idempotent."""
    for name in (topo.exchange_ns, topo.trading_ns):
        _remove_namespace(name)


def cleanup(prefix: str = PREFIX) -> list[str]:
    """Remove every namespace and host interface whose name starts with ``prefix``; returns them."""
    from pyroute2 import IPRoute

    removed = []
    for name in list_namespaces(prefix):
        _remove_namespace(name)
        removed.append(f"netns {name}")
    with IPRoute() as host:
        for link in host.get_links():
            ifname = link.get_attr("IFLA_IFNAME")
            if ifname and ifname.startswith(prefix):
                with contextlib.suppress(Exception):  # gone with its peer already
                    host.link("del", index=link["index"])
                    removed.append(f"link {ifname}")
    return removed


@contextlib.contextmanager
def topology(topo: Topology = Topology()) -> Iterator[Topology]:
    """``up`` on entry, ``down`` on exit, whatever happens in between."""
    try:
        yield up(topo)
    finally:
        down(topo)


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, _CLONE_NEWNET) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"setns: {os.strerror(error)}")


@contextlib.contextmanager
def in_netns(name: str) -> Iterator[None]:
    """Move the calling *thread* into namespace ``name`` and back on exit.

    Sockets created inside stay in ``name`` for good. Running threads are unaffected (setns with
    CLONE_NEWNET is per thread); threads started inside inherit ``name``.
    """
    original = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        target = os.open(NETNS_DIR / name, os.O_RDONLY)
        try:
            _setns(target)
        finally:
            os.close(target)
        try:
            yield
        finally:
            _setns(original)
    finally:
        os.close(original)


def run_in_netns(name: str, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    """Run ``fn(*args, **kwargs)`` in a forked child inside namespace ``name``; return its result.

    The result (or the exception) travels back pickled, so it must be picklable; ``fn`` need not
    be (fork). The child never returns into the caller's code: it exits after ``fn``.
    """
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(read_fd)
        status = 0
        try:
            try:
                with open(NETNS_DIR / name, "rb") as target:
                    _setns(target.fileno())
                payload = pickle.dumps((True, fn(*args, **kwargs)))
            except BaseException as error:
                status = 1
                try:
                    payload = pickle.dumps((False, error))
                except Exception:
                    payload = pickle.dumps((False, RuntimeError(traceback.format_exc())))
            with os.fdopen(write_fd, "wb") as out:
                out.write(payload)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(status)
    os.close(write_fd)
    try:
        with os.fdopen(read_fd, "rb") as source:
            payload = source.read()
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        raise
    finally:
        os.waitpid(pid, 0)
    if not payload:
        raise RuntimeError(f"child in namespace {name} died without a result")
    ok, value = pickle.loads(payload)
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]
