"""Packet drops with the kernel's reason per cgroup of the socket they were for: user side of
``drops.bpf.c`` (what it counts and how it attributes is documented there).

Counters (``Snapshot.counters``; cgroup values are ids until ``to_document``):
``packets_dropped{cgroup, protocol, reason}``, ``host_packets_dropped{scope="host", protocol,
reason}`` (no socket), ``host_unspecified_frees{scope="host"}`` and
``drops_dropped_events{reason}``.  ``reason`` is the ``enum skb_drop_reason`` name of the running
kernel (from BTF) less ``SKB_DROP_REASON_``: ``SOCKET_RCVBUFF``, ``NETFILTER_DROP``...
"""

from __future__ import annotations

import contextlib
import ctypes
import socket
import struct
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

import numpy as np

from tailsight.cgroups import NoCgroupV2Error, own_cgroup_id
from tailsight.probes.base import CounterInfo, Labels, ProbeInfo, Snapshot, labels
from tailsight.probes.bccprobe import (
    BccProbe,
    MappedArray,
    cgroup_slots,
    drops_help,
    release_slots,
    set_config,
    steer_slot_hint,
    table_items,
)
from tailsight.probes.btf import Btf, BtfError
from tailsight.probes.loader import ProbeError
from tailsight.probes.offsets import (
    SOCK_FIELDS,
    OffsetCheckError,
    check_observed,
    offset_cflags,
    resolve_offsets,
)
from tailsight.probes.topology import possible_cpu_ids

PROBE_NAME: Final = "drops"
TRACEPOINT: Final = "kfree_skb"
DROPPED_PACKETS: Final = "packets_dropped"
HOST_DROPPED_PACKETS: Final = "host_packets_dropped"
UNSPECIFIED_FREES: Final = "host_unspecified_frees"
DROPPED: Final = "drops_dropped_events"
DROP_REASONS: Final = ("series_full",)
"""Index i of the kernel's drops_dropped_events (DROP_* in drops.bpf.c)."""
HOST_LABELS: Final = labels(scope="host")
INFO: Final = ProbeInfo(
    name=PROBE_NAME,
    title="packet drops",
    tracepoints=(TRACEPOINT,),
    counters=(
        CounterInfo(
            DROPPED_PACKETS,
            "Packets the kernel dropped, by the cgroup of their socket, protocol and the "
            "kernel's drop reason (enum skb_drop_reason).",
        ),
        CounterInfo(
            HOST_DROPPED_PACKETS,
            "Packets the kernel dropped that had no socket, by protocol and drop reason.",
        ),
        CounterInfo(
            UNSPECIFIED_FREES,
            "kfree_skb() calls that gave no reason (NOT_SPECIFIED): drops or not, host-wide.",
        ),
        CounterInfo(DROPPED, drops_help("Drops", DROP_REASONS)),
    ),
)
MAX_SERIES: Final = 1024
"""(cgroup, protocol, reason) series the probe tells apart (-DDROPS_MAX_SERIES): one u64 per
CPU each (8 KiB per CPU)."""
REASON_ENUM: Final = "skb_drop_reason"
REASON_PREFIX: Final = "SKB_DROP_REASON_"
SUBSYS_ENUM: Final = "skb_drop_reason_subsys"
SUBSYS_SHIFT: Final = 16
"""Reasons of subsystems (mac80211, openvswitch...) carry the subsystem in their high 16 bits."""
# -D macro -> (struct, member path), beyond SOCK_FIELDS (all from BTF at load time).
SKB_FIELDS: Final = {
    "SKB_SK_OFF": ("sk_buff", "sk"),
    "SKB_PROTOCOL_OFF": ("sk_buff", "protocol"),
    "SKB_HEAD_OFF": ("sk_buff", "head"),
    "SKB_NETWORK_HEADER_OFF": ("sk_buff", "network_header"),
    "SOCK_FAMILY_OFF": ("sock", "__sk_common.skc_family"),
    "SOCK_STATE_OFF": ("sock", "__sk_common.skc_state"),
}
# The protocol code's tags (PROTO_* in drops.bpf.c).
_PROTO_FAMILY: Final = 1 << 16
_PROTO_ETHERTYPE: Final = 2 << 16
IP_PROTOCOLS: Final = {
    0: "ip",
    1: "icmp",
    2: "igmp",
    6: "tcp",
    17: "udp",
    41: "ipv6",
    47: "gre",
    50: "esp",
    58: "icmpv6",
    132: "sctp",
    136: "udplite",
    255: "raw",
}
FAMILIES: Final = {1: "unix", 16: "netlink", 17: "packet", 40: "vsock", 44: "xdp"}
ETHERTYPES: Final = {0x0800: "ipv4", 0x0806: "arp", 0x86DD: "ipv6", 0x8100: "vlan", 0x88CC: "lldp"}
_CONFIG_SELFCHECK_PORT: Final = 1  # drops_config word (0 is the cgroup filter's)
_SO_RXQ_OVFL: Final = 40  # <asm-generic/socket.h>: a datagram's cmsg carries sk_drops
_IPPROTO_UDP: Final = 17


def protocol_name(code: int) -> str:
    """The kernel's protocol code as a name: ``udp``, ``unix``, ``arp``, or tagged numbers."""
    if code < _PROTO_FAMILY:
        return IP_PROTOCOLS.get(code, f"ip_proto_{code}")
    value = code & 0xFFFF
    if code & ~0xFFFF == _PROTO_FAMILY:
        return FAMILIES.get(value, f"af_{value}")
    return ETHERTYPES.get(value, f"ethertype_0x{value:04x}")


def reason_names(btf: Any) -> dict[int, str]:
    """Value -> name of each ``enum skb_drop_reason`` member of this kernel, less its prefix
    (``SKB_CONSUMED`` -> ``CONSUMED``); BtfError if the kernel has no such enum."""
    return {
        value: name.removeprefix(REASON_PREFIX).removeprefix("SKB_")
        for name, value in btf.enum_values(REASON_ENUM).items()
        if name != REASON_PREFIX + "MAX" and not name.startswith(REASON_PREFIX + "SUBSYS_")
    }


def subsystem_names(btf: Any) -> dict[int, str]:
    """Subsystem id -> name (``SKB_DROP_REASON_SUBSYS_OPENVSWITCH`` -> ``OPENVSWITCH``); empty
    where the kernel has no subsystem reasons."""
    try:
        values = btf.enum_values(SUBSYS_ENUM)
    except BtfError:
        return {}
    prefix = REASON_PREFIX + "SUBSYS_"
    return {
        value: name.removeprefix(prefix)
        for name, value in values.items()
        if name.startswith(prefix) and name != prefix + "NUM"
    }


class ReasonNamer:
    """Drop reason value -> label: the enum's name, ``<SUBSYSTEM>_<code>`` for a subsystem's
    reason, else the number (a reason newer than this kernel's BTF cannot occur)."""

    def __init__(self, reasons: Mapping[int, str], subsystems: Mapping[int, str]) -> None:
        self.reasons = dict(reasons)
        self.subsystems = dict(subsystems)

    @classmethod
    def from_btf(cls, btf: Any) -> ReasonNamer:
        return cls(reason_names(btf), subsystem_names(btf))

    def __call__(self, value: int) -> str:
        name = self.reasons.get(value)
        if name is not None:
            return name
        subsystem = value >> SUBSYS_SHIFT
        if subsystem:
            prefix = self.subsystems.get(subsystem, f"SUBSYS_{subsystem}")
            return f"{prefix}_{value & 0xFFFF}"
        return str(value)


def drop_labels(cgroup_id: int, protocol: int, reason: str) -> tuple[str, Labels]:
    """The counter name and labels of one kernel series: cgroup 0 (no socket) is host-wide."""
    if cgroup_id == 0:
        return HOST_DROPPED_PACKETS, labels(
            scope="host", protocol=protocol_name(protocol), reason=reason
        )
    return DROPPED_PACKETS, labels(
        cgroup=cgroup_id, protocol=protocol_name(protocol), reason=reason
    )


class DropsProbe(BccProbe):
    """Loads, attaches, self-checks and reads the packet drop probe.

    ``cgroup_ids``: count only drops of sockets of these cgroups (None: all); drops without a
    socket are host-wide and always counted.  ``self_check``: prove the socket offsets and the
    reason's name on a UDP receive-buffer overflow of our own at attach.
    """

    name = PROBE_NAME
    tracepoints = INFO.tracepoints
    drop_reasons = DROP_REASONS

    def __init__(self, cgroup_ids: Iterable[int] | None = None, *, self_check: bool = True) -> None:
        super().__init__(cgroup_ids)
        self._self_check = self_check
        self._cpu_ids = 0
        self._offsets: dict[str, int] = {}
        self.namer: ReasonNamer | None = None
        self.has_rx_sk = False
        """The tracepoint names the receiving socket (rx_sk, Linux 6.11+)."""
        self.socket_check_verified = False

    def extra_cflags(self) -> list[str]:
        """Offsets of sock and sk_buff from BTF, the reason values, table sizes."""
        btf = Btf.load()
        args = btf.tracepoint_args(TRACEPOINT)
        if len(args) < 3:
            raise ProbeError(
                f"probe {PROBE_NAME!r}: kfree_skb has no drop reason on this kernel (before "
                "5.17): nothing to count by"
            )
        self.has_rx_sk = len(args) >= 4
        try:
            self.namer = ReasonNamer.from_btf(btf)
        except BtfError as error:
            raise ProbeError(f"probe {PROBE_NAME!r}: {error}") from error
        self._offsets = resolve_offsets(btf, {**SOCK_FIELDS, **SKB_FIELDS})
        self._cpu_ids = possible_cpu_ids()
        # SKB_CONSUMED and SKB_NOT_DROPPED_YET are missing before 6.0 (NOT_SPECIFIED is 0
        # there): a value no reason has stands in for them.
        by_name = {name: value for value, name in self.namer.reasons.items()}
        values = {
            name: by_name.get(name, 0xFFFFFFFF)
            for name in ("NOT_SPECIFIED", "CONSUMED", "NOT_DROPPED_YET")
        }
        cflags = [
            *offset_cflags(self._offsets),
            *(f"-DREASON_{name}={value}u" for name, value in values.items()),
            f"-DDROPS_MAX_SERIES={MAX_SERIES}",
            f"-DDROPS_NR_CPUS={self._cpu_ids}",
        ]
        if self.has_rx_sk:
            cflags.append("-DDROPS_HAS_RX_SK")
        return cflags

    def self_check(self, bpf: Any) -> None:
        """Overflow a UDP socket of ours: the probe must see as many drops as the kernel
        counted on it, named SOCKET_RCVBUFF, charged to our cgroup (OffsetCheckError if not).
        Without rx_sk (before 6.11) such a drop has no socket to read: nothing to prove."""
        if self._self_check and self.has_rx_sk:
            assert self.namer is not None
            check_drop_attribution(bpf, self.namer, self._offsets)
            self.socket_check_verified = True

    def read(self) -> Snapshot:
        """Cumulative drops per (cgroup, protocol, reason), host-wide ones, self-metrics."""
        bpf = self._require_bpf()
        assert self.namer is not None
        taken_ns = time.time_ns()
        series_of = {
            int(slot.value): (int(key.cgroup_id), int(key.protocol), int(key.reason))
            for key, slot in table_items(bpf[b"drops_slots"])
        }
        slots = sorted(series_of)
        steer_slot_hint(bpf, PROBE_NAME, slots, 0, MAX_SERIES)
        totals = self._mapped_counts().array[:, slots].sum(axis=0)
        counters: dict[tuple[str, Labels], int] = {}
        for slot, total in zip(slots, totals.tolist(), strict=True):
            cgroup_id, protocol, reason = series_of[slot]
            if total:
                counters[drop_labels(cgroup_id, protocol, self.namer(reason))] = int(total)
        unspecified = bpf[b"drops_unspecified"].sum(0).value
        counters[(UNSPECIFIED_FREES, HOST_LABELS)] = int(unspecified)
        counters.update(self.drop_counters())
        return Snapshot(PROBE_NAME, taken_ns, {}, counters)

    def forget(self, cgroup_ids: set[int]) -> None:
        """Clear removed cgroups' counters and give their series slots back."""
        bpf = self._require_bpf()
        gone = cgroup_slots(bpf, PROBE_NAME, cgroup_ids)
        if gone:
            self._mapped_counts().zero(np.s_[:, sorted(slot for _, slot in gone)])
            release_slots(bpf, PROBE_NAME, [key for key, _ in gone])

    def _mapped_counts(self) -> MappedArray:
        return self.mapped("drops_counts", np.uint64, (self._cpu_ids, MAX_SERIES))


SELFCHECK_DATAGRAMS: Final = 29
"""Sent to the self-check's socket unread: its smallest receive buffer holds a few, the rest are
dropped (a prime, so that a count off by a factor shows)."""


def check_drop_attribution(
    bpf: Any, namer: ReasonNamer, offsets: Mapping[str, int], timeout_s: float = 2.0
) -> None:
    """Send SELFCHECK_DATAGRAMS to a UDP socket of ours with the smallest receive buffer and
    compare the probe's record with the kernel's drop count of that socket (SO_RXQ_OVFL)."""
    where = ", ".join(f"{macro}={offsets.get(macro)}" for macro in ("SOCK_CGROUP_OFF",))
    with contextlib.ExitStack() as stack:
        receiver = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
        receiver.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)  # the kernel's minimum
        receiver.setsockopt(socket.SOL_SOCKET, _SO_RXQ_OVFL, 1)
        receiver.bind(("127.0.0.1", 0))
        receiver.settimeout(timeout_s)
        port = int(receiver.getsockname()[1])
        sender = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
        record_table = bpf[b"drops_selfcheck_record"]
        record_table.clear()
        set_config(bpf, PROBE_NAME, _CONFIG_SELFCHECK_PORT, port)
        stack.callback(set_config, bpf, PROBE_NAME, _CONFIG_SELFCHECK_PORT, 0)
        payload = b"x" * 1024
        for _ in range(SELFCHECK_DATAGRAMS):
            sender.sendto(payload, ("127.0.0.1", port))
        receiver.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            while True:
                receiver.recv(2048)
        # A datagram queued now carries the socket's drop count (sk_drops) as it is at this point.
        receiver.settimeout(timeout_s)
        sender.sendto(b"last", ("127.0.0.1", port))
        _, ancillary, _, _ = receiver.recvmsg(16, socket.CMSG_SPACE(4))
        kernel_drops = next(
            (
                struct.unpack("I", data[:4])[0]
                for level, kind, data in ancillary
                if level == socket.SOL_SOCKET and kind == _SO_RXQ_OVFL
            ),
            0,
        )
        record = record_table[ctypes.c_int(0)]
    try:
        expected_cgroup = own_cgroup_id()
    except NoCgroupV2Error as error:
        raise OffsetCheckError(str(error)) from None
    if kernel_drops == 0:
        raise OffsetCheckError(
            f"drops self-check: {SELFCHECK_DATAGRAMS} datagrams to a minimal receive buffer "
            "dropped none: cannot check the probe against the kernel"
        )
    observed = {
        "drops seen": (int(record.hits), kernel_drops),
        "socket cgroup (SOCK_CGROUP_OFF)": (int(record.cgroup_id), expected_cgroup),
        "protocol (SOCK_PROTOCOL_OFF)": (protocol_name(int(record.protocol)), "udp"),
        "reason": (namer(int(record.reason)), "SOCKET_RCVBUFF"),
    }
    check_observed(
        observed,
        "drops self-check: a UDP receive-buffer overflow of known cgroup read wrong, "
        f"refusing to use the probe ({where})",
    )


def expected_tracepoint_args() -> Mapping[str, Sequence[str]]:
    """The raw tracepoint signature drops.bpf.c reads (``ctx->args[i]``), for BTF checks: the
    leading three; a fourth, ``struct sock *rx_sk``, where the kernel has it."""
    return {TRACEPOINT: ["struct sk_buff *", "void *", "enum skb_drop_reason"]}
