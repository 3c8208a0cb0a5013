"""The drops probe against the kernel's own counts: a slow UDP receiver with a small SO_RCVBUF
beside a fast sender (its SOCKET_RCVBUFF drops equal the socket's drops column in /proc/net/udp)
and TCP SYNs dropped by an nftables rule in a private network namespace (NETFILTER_DROP, the
rule's own counter); reason naming from BTF and the labels without a kernel."""

from __future__ import annotations

import re
import select
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tailsight.probes.base import Snapshot, labels
from tailsight.probes.btf import Btf
from tailsight.probes.catalog import PROBES, create_probe
from tailsight.probes.drops import (
    DROPPED_PACKETS,
    HOST_DROPPED_PACKETS,
    HOST_LABELS,
    INFO,
    UNSPECIFIED_FREES,
    DropsProbe,
    ReasonNamer,
    drop_labels,
    expected_tracepoint_args,
    protocol_name,
)
from tailsight.testing.workload import Workload, private_base, python_task

DATAGRAMS = 10_007  # prime: a count off by a factor or a stray datagram shows
SYNS = 13  # prime
CLOSED_PORT_DATAGRAMS = 17  # prime

# Binds a UDP socket with a small receive buffer, says its port, then reads one datagram per
# millisecond until told to stop (the socket stays open for /proc/net/udp meanwhile).
RECEIVER_CODE = """
import select, socket, time
rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
rx.bind(("127.0.0.1", 0))
print(rx.getsockname()[1], flush=True)
rx.setblocking(False)
while not select.select([sys.stdin], [], [], 0)[0]:
    try:
        rx.recv(2048)
    except BlockingIOError:
        pass
    time.sleep(0.001)
"""

# Told the port on stdin, sends DATAGRAMS in bursts of 50 every 5 ms (~10,000/s), says done.
SENDER_CODE = f"""
import socket, time
port = int(sys.stdin.readline())
tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
payload = b"x" * 512
for i in range({DATAGRAMS}):
    tx.sendto(payload, ("127.0.0.1", port))
    if i % 50 == 49:
        time.sleep(0.005)
print("done", flush=True)
sys.stdin.readline()
"""

# SYNS non-blocking connects to port 9 (their SYNs dropped on output), each closed before its
# SYN would be retransmitted (1 s): one dropped packet each.
CONNECTOR_CODE = f"""
import socket
sys.stdin.readline()
socks = []
for _ in range({SYNS}):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setblocking(False)
    s.connect_ex(("127.0.0.1", 9))
    socks.append(s)
for s in socks:
    s.close()
print("done", flush=True)
sys.stdin.readline()
"""

NFT_TABLE = "tsdrops"
NFT_RULES = f"""table inet {NFT_TABLE} {{
  chain output {{
    type filter hook output priority 0; policy accept;
    tcp dport 9 tcp flags & (syn | ack) == syn counter drop
  }}
}}
"""


def udp_socket_drops(port: int, proc_net: Path = Path("/proc/net")) -> int:
    """The ``drops`` column of the IPv4 UDP socket bound to ``port`` (/proc/net/udp)."""
    for line in (proc_net / "udp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].split(":")[1], 16) == port:
            return int(fields[-1])
    raise AssertionError(f"no UDP socket on port {port} in {proc_net / 'udp'}")


def _fake_btf() -> Btf:
    reason_values = [
        ("SKB_NOT_DROPPED_YET", 0),
        ("SKB_CONSUMED", 1),
        ("SKB_DROP_REASON_NOT_SPECIFIED", 2),
        ("SKB_DROP_REASON_SOCKET_RCVBUFF", 6),
        ("SKB_DROP_REASON_NETFILTER_DROP", 12),
        ("SKB_DROP_REASON_MAX", 130),
        ("SKB_DROP_REASON_SUBSYS_MASK", 0xFFFF0000),
    ]
    subsys_values = [
        ("SKB_DROP_REASON_SUBSYS_CORE", 0),
        ("SKB_DROP_REASON_SUBSYS_MAC80211_UNUSABLE", 1),
        ("SKB_DROP_REASON_SUBSYS_OPENVSWITCH", 3),
        ("SKB_DROP_REASON_SUBSYS_NUM", 4),
    ]

    def enum(type_id: int, name: str, values: list[tuple[str, int]]) -> dict[str, object]:
        return {
            "id": type_id,
            "kind": "ENUM",
            "name": name,
            "size": 4,
            "vlen": len(values),
            "values": [{"name": n, "val": v} for n, v in values],
        }

    return Btf.from_json(
        {
            "types": [
                enum(1, "skb_drop_reason", reason_values),
                enum(2, "skb_drop_reason_subsys", subsys_values),
            ]
        }
    )


# -- without a kernel -----------------------------------------------------------------------------


def test_reasons_are_named_from_the_btf_enum() -> None:
    namer = ReasonNamer.from_btf(_fake_btf())
    assert namer(6) == "SOCKET_RCVBUFF"
    assert namer(12) == "NETFILTER_DROP"
    assert namer(1) == "CONSUMED"
    assert namer(0) == "NOT_DROPPED_YET"
    assert 130 not in namer.reasons  # MAX and SUBSYS_MASK are no reasons
    assert namer((3 << 16) | 5) == "OPENVSWITCH_5"  # a subsystem's reason
    assert namer((9 << 16) | 2) == "SUBSYS_9_2"
    assert namer(200) == "200"


def test_enum_values_from_btf() -> None:
    btf = _fake_btf()
    assert btf.enum_values("enum skb_drop_reason")["SKB_DROP_REASON_NETFILTER_DROP"] == 12
    with pytest.raises(Exception, match="not in BTF"):
        btf.enum_values("no_such_enum")


def test_protocol_codes_are_named() -> None:
    assert protocol_name(17) == "udp"
    assert protocol_name(6) == "tcp"
    assert protocol_name(99) == "ip_proto_99"
    assert protocol_name((1 << 16) | 1) == "unix"
    assert protocol_name((1 << 16) | 33) == "af_33"
    assert protocol_name((2 << 16) | 0x0806) == "arp"
    assert protocol_name((2 << 16) | 0x88B5) == "ethertype_0x88b5"


def test_drops_without_a_socket_are_host_wide() -> None:
    assert drop_labels(7, 17, "SOCKET_RCVBUFF") == (
        DROPPED_PACKETS,
        labels(cgroup=7, protocol="udp", reason="SOCKET_RCVBUFF"),
    )
    name, key = drop_labels(0, 6, "NO_SOCKET")
    assert name == HOST_DROPPED_PACKETS
    assert dict(key) == {"scope": "host", "protocol": "tcp", "reason": "NO_SOCKET"}
    snapshot = Snapshot(
        "drops",
        2,
        {},
        {
            drop_labels(9, 17, "SOCKET_RCVBUFF"): 5,
            (name, key): 3,
            (UNSPECIFIED_FREES, HOST_LABELS): 8,
        },
    )
    document = snapshot.to_document(1, lambda ids: {i: "/rx" for i in ids})
    assert {(c.name, tuple(sorted(c.labels.items())), c.value) for c in document.counters} == {
        (
            DROPPED_PACKETS,
            (
                ("cgroup", "/rx"),
                ("probe", "drops"),
                ("protocol", "udp"),
                ("reason", "SOCKET_RCVBUFF"),
            ),
            5,
        ),
        (
            HOST_DROPPED_PACKETS,
            (("probe", "drops"), ("protocol", "tcp"), ("reason", "NO_SOCKET"), ("scope", "host")),
            3,
        ),
        (UNSPECIFIED_FREES, (("probe", "drops"), ("scope", "host")), 8),
    }


def test_the_catalog_describes_the_probe() -> None:
    assert PROBES["drops"] is INFO
    assert isinstance(create_probe("drops"), DropsProbe)
    assert {c.name for c in INFO.counters} >= {DROPPED_PACKETS, HOST_DROPPED_PACKETS}


def test_udp_drops_column_parsed(tmp_path: Path) -> None:
    (tmp_path / "udp").write_text(
        "   sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  "
        "timeout inode ref pointer drops\n"
        "  7: 0100007F:A1B2 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        "
        "0 12345 2 0000000000000000 4999\n"
    )
    assert udp_socket_drops(0xA1B2, tmp_path) == 4999


# -- on the running kernel ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def probe(kernel_ready: None) -> Iterator[DropsProbe]:
    with DropsProbe() as attached:
        yield attached


def _ask(process: subprocess.Popen[bytes], line: bytes, timeout_s: float = 30.0) -> bytes:
    """Write ``line`` (if any) to the process, then wait for its next line."""
    assert process.stdin is not None and process.stdout is not None
    if line:
        process.stdin.write(line)
        process.stdin.flush()
    assert select.select([process.stdout], [], [], timeout_s)[0], f"{process.args!r}: no answer"
    return process.stdout.readline()


@pytest.mark.kernel
def test_tracepoint_signature_matches_btf(kernel_ready: None) -> None:
    btf = Btf.load()
    for tracepoint, args in expected_tracepoint_args().items():
        assert btf.tracepoint_args(tracepoint)[: len(args)] == list(args)


@pytest.mark.kernel
def test_attach_checked_the_socket_attribution(probe: DropsProbe) -> None:
    assert set(probe.program_fds()) == {"kfree_skb"}
    assert probe.socket_check_verified == probe.has_rx_sk


@pytest.mark.kernel
def test_udp_rcvbuf_drops_equal_the_sockets_drops_column(probe: DropsProbe) -> None:
    if not probe.has_rx_sk:
        pytest.skip("kernel: kfree_skb has no rx_sk (before 6.11): UDP drops are host-wide")
    receiver = python_task("rx", RECEIVER_CODE, pipes=True)
    sender = python_task("tx", SENDER_CODE, pipes=True)
    with Workload([receiver, sender], base=private_base("drops-udp")) as workload:
        rx, tx = workload.process("rx"), workload.process("tx")
        port = int(_ask(rx, b""))
        before = probe.read()
        assert _ask(tx, f"{port}\n".encode()) == b"done\n"
        time.sleep(0.3)  # the last datagrams' softirq work done
        kernel_drops = udp_socket_drops(port)  # the socket still open
        interval = probe.read() - before
        rx_id = workload.cgroup_id("rx")
    assert kernel_drops > DATAGRAMS // 10  # the buffer did overflow
    key = (DROPPED_PACKETS, labels(cgroup=rx_id, protocol="udp", reason="SOCKET_RCVBUFF"))
    assert interval.counters.get(key, 0) == kernel_drops
    charged = {k: v for k, v in interval.counters.items() if ("cgroup", rx_id) in k[1]}
    assert charged == {key: kernel_drops}
    probe.forget({rx_id})  # its series cleared and its slot given back
    assert not [k for k in probe.read().counters if ("cgroup", rx_id) in k[1]]


@pytest.mark.kernel
def test_netfilter_drops_of_tcp_syns_in_a_private_namespace(probe: DropsProbe) -> None:
    namespace = f"tsdrops-{time.monotonic_ns() % 10**9}"
    subprocess.run(["ip", "netns", "add", namespace], check=True, capture_output=True)
    try:
        in_ns = ("ip", "netns", "exec", namespace)
        subprocess.run([*in_ns, "ip", "link", "set", "lo", "up"], check=True, capture_output=True)
        subprocess.run(
            [*in_ns, "nft", "-f", "-"], input=NFT_RULES, text=True, check=True, capture_output=True
        )
        task = python_task("syn", CONNECTOR_CODE, pipes=True)
        task = type(task)("syn", (*in_ns, *task.argv), None, True)
        with Workload([task], base=private_base("drops-tcp")) as workload:
            process = workload.process("syn")
            before = probe.read()
            assert _ask(process, b"go\n") == b"done\n"
            interval = probe.read() - before
            syn_id = workload.cgroup_id("syn")
        listing = subprocess.run(
            [*in_ns, "nft", "list", "table", "inet", NFT_TABLE],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        subprocess.run([*in_ns, "nft", "delete", "table", "inet", NFT_TABLE], check=True)
    finally:
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True, check=False)
    match = re.search(r"counter packets (\d+)", listing)
    assert match, listing
    assert int(match.group(1)) == SYNS  # the rule dropped exactly one SYN per connect
    key = (DROPPED_PACKETS, labels(cgroup=syn_id, protocol="tcp", reason="NETFILTER_DROP"))
    assert interval.counters.get(key, 0) == SYNS


@pytest.mark.kernel
def test_cgroup_filter_leaves_other_cgroups_out(probe: DropsProbe) -> None:
    receiver = python_task("rx", RECEIVER_CODE, pipes=True)
    sender = python_task("tx", SENDER_CODE, pipes=True)
    with Workload([receiver, sender], base=private_base("drops-filter")) as workload:
        rx, tx = workload.process("rx"), workload.process("tx")
        rx_id = workload.cgroup_id("rx")
        port = int(_ask(rx, b""))
        probe.set_cgroup_filter({workload.cgroup_id("tx")})  # not the receiver's
        try:
            before = probe.read()
            assert _ask(tx, f"{port}\n".encode()) == b"done\n"
            time.sleep(0.3)
            interval = probe.read() - before
        finally:
            probe.set_cgroup_filter(None)
        assert udp_socket_drops(port) > 0
    assert not [k for k in interval.counters if ("cgroup", rx_id) in k[1]]


@pytest.mark.kernel
def test_datagrams_to_a_closed_port_are_host_wide_no_socket_drops(probe: DropsProbe) -> None:
    """No socket: host-wide, the protocol read from the IP header."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    key = (HOST_DROPPED_PACKETS, labels(protocol="udp", reason="NO_SOCKET", scope="host"))
    before = probe.read()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
        for _ in range(CLOSED_PORT_DATAGRAMS):
            sender.sendto(b"x", ("127.0.0.1", port))
    interval = probe.read() - before
    # Host-wide: other drops of the host may add to it, never take away.
    assert interval.counters.get(key, 0) >= CLOSED_PORT_DATAGRAMS
