"""Two throw-away network namespaces joined by a veth pair, for probe tests that need a lossy link.

Made with iproute2 (`ip netns`, `ip link`) and nftables; the private addresses exist only inside
the two namespaces, nothing is routed to or from the host.  Names start with "tsprobe" (not the
trading core's "ts-", whose cleanup would otherwise remove ours).  Always torn down on exit.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Final

PREFIX: Final = "tsprobe"
_SUBNET: Final = "192.168.231.{}/30"


def _run(argv: Sequence[str], stdin: str | None = None) -> None:
    result = subprocess.run(argv, input=stdin, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr}")


@dataclass(frozen=True)
class VethPair:
    """Namespace ``sender`` (address ``sender_ip``) linked to ``receiver`` (``receiver_ip``)."""

    sender: str
    receiver: str
    sender_ip: str
    receiver_ip: str

    def exec_prefix(self, namespace: str) -> tuple[str, ...]:
        """argv prefix running a command inside ``namespace`` (same pid: ip execs it)."""
        return ("ip", "netns", "exec", namespace)

    def drop_incoming_tcp(self, namespace: str, port: int, percent: int) -> None:
        """Randomly drop ``percent``% of TCP segments to ``port`` arriving in ``namespace``."""
        rules = (
            "table inet tsprobe_loss {\n"
            "  chain input {\n"
            "    type filter hook input priority 0; policy accept;\n"
            f"    tcp dport {port} numgen random mod 100 < {percent} drop\n"
            "  }\n"
            "}\n"
        )
        _run([*self.exec_prefix(namespace), "nft", "-f", "-"], stdin=rules)

    def snmp_tcp(self, namespace: str) -> dict[str, int]:
        """The ``Tcp:`` counters of /proc/net/snmp as seen inside ``namespace`` (per netns)."""
        code = "import sys; sys.stdout.write(open('/proc/net/snmp').read())"
        result = subprocess.run(
            [*self.exec_prefix(namespace), sys.executable, "-S", "-c", code],
            capture_output=True,
            text=True,
            check=True,
        )
        header, values = [line for line in result.stdout.splitlines() if line.startswith("Tcp:")]
        return dict(zip(header.split()[1:], map(int, values.split()[1:]), strict=True))


@contextmanager
def veth_pair(tag: str) -> Iterator[VethPair]:
    """Create the two namespaces and the veth between them; delete everything on exit."""
    sender = f"{PREFIX}-{os.getpid()}-{tag}-s"
    receiver = f"{PREFIX}-{os.getpid()}-{tag}-r"
    # Interface names are limited to 15 bytes and are per namespace once moved.
    sender_if, receiver_if = f"tp{os.getpid() % 100000}s", f"tp{os.getpid() % 100000}r"
    pair = VethPair(sender, receiver, _SUBNET.format(1)[:-3], _SUBNET.format(2)[:-3])
    created: list[str] = []
    try:
        for namespace in (sender, receiver):
            _run(["ip", "netns", "add", namespace])
            created.append(namespace)
        veth = ["ip", "link", "add", sender_if, "netns", sender, "type", "veth"]
        _run([*veth, "peer", "name", receiver_if, "netns", receiver])
        for namespace, interface, host in ((sender, sender_if, 1), (receiver, receiver_if, 2)):
            ns = ["ip", "-n", namespace]
            _run([*ns, "addr", "add", _SUBNET.format(host), "dev", interface])
            _run([*ns, "link", "set", interface, "up"])
            _run([*ns, "link", "set", "lo", "up"])
        yield pair
    finally:
        for namespace in reversed(created):  # deleting a namespace destroys its veth end too
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True, check=False)
