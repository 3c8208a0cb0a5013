"""TCP time-in-state, connect latency, lifetime and retransmits per socket cgroup: user side of
``tcpstate.bpf.c`` (what it measures and how it attributes is documented there).

Series labels (``Snapshot.histograms`` keys; cgroup values are ids until ``to_document``):
``{cgroup, kind="time_in_state", from_state, to_state}``, ``{cgroup, kind="connect"}``,
``{cgroup, kind="lifetime"}``, each with ``port`` (an allow-listed port or "other") when the
probe was built with a port allow-list.  Counters: ``tcp_retransmits{cgroup}``,
``tcp_retransmit_failures{cgroup}``, ``tcp_retransmits_to_peer{cgroup, victim}`` (retransmits of
connections whose other end, held by ``victim``, is a socket of this host established while the
probe ran), ``tcpstate_dropped_events{reason}``.
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
import numpy.typing as npt

from tailsight.cgroups import NoCgroupV2Error, own_cgroup_id
from tailsight.probes.base import (
    HIST_ROW,
    CounterInfo,
    Labels,
    LabelValue,
    ProbeInfo,
    SeriesInfo,
    Snapshot,
    labels,
)
from tailsight.probes.bccprobe import (
    BccProbe,
    delete_where,
    drops_help,
    hash_map_fill,
    release_slots,
    set_config,
    slot_histograms,
    table_items,
)
from tailsight.probes.btf import Btf
from tailsight.probes.offsets import (
    SOCK_FIELDS,
    OffsetCheckError,
    check_observed,
    offset_cflags,
    resolve_offsets,
)

PROBE_NAME: Final = "tcpstate"
MAX_PORT_LABELS: Final = 64  # TCPSTATE_MAX_PORTS in tcpstate.bpf.c
MAX_SERIES: Final = 512
"""Series (cgroup, kind, states, port) the probe tells apart (-DTCPSTATE_MAX_SERIES): 8.4 MiB of
histogram rows shared by all CPUs; a loopback client and server make ~10 series per cgroup."""
SOCK_SET_BITS: Final = 15
SOCK_WAYS: Final = 4
"""The socket table: 2^15 sets of 4 (131,072 sockets, 5 MiB), a set picked by a hash of the
socket's address (-DTCPSTATE_SOCK_SET_BITS, -DTCPSTATE_SOCK_WAYS)."""
SOCK_ENTRY: Final = np.dtype(
    [
        ("sk", "<u8"),
        ("entered_ns", "<u8"),
        ("born_ns", "<u8"),
        ("syn_sent_ns", "<u8"),
        ("state", "<u4"),
        ("pad", "<u4"),
    ]
)
"""struct tcpstate_sock."""
OTHER_PORT: Final = "other"
RETRANSMITS: Final = "tcp_retransmits"
RETRANSMIT_FAILURES: Final = "tcp_retransmit_failures"
PEER_RETRANSMITS: Final = "tcp_retransmits_to_peer"
"""Retransmits by (cgroup of the retransmitting socket, ``victim``: cgroup of the other end)."""
DROPPED: Final = "tcpstate_dropped_events"
# Index i of tcpstate_dropped_events (DROP_* in tcpstate.bpf.c).
DROP_REASONS: Final = (
    "sock_table_full",
    "hist_full",
    "counter_full",
    "peer_counter_full",
    "stale_socket",
)
# KIND_* in tcpstate.bpf.c.
KINDS: Final = ("time_in_state", "connect", "lifetime")
INFO: Final = ProbeInfo(
    name=PROBE_NAME,
    title="TCP state time",
    tracepoints=("inet_sock_set_state", "tcp_retransmit_skb"),
    series=(
        SeriesInfo(
            "time_in_state",
            "TCP time in state",
            "Time a socket spent in one TCP state before the next, by cgroup and state pair.",
            ("from_state", "to_state"),
        ),
        SeriesInfo("connect", "TCP connect time", "SYN_SENT to ESTABLISHED, by cgroup."),
        SeriesInfo(
            "lifetime",
            "TCP connection lifetime",
            "From the socket's birth (it left CLOSE, or a passive child of a LISTEN) to CLOSE.",
        ),
    ),
    counters=(
        CounterInfo(RETRANSMITS, "TCP retransmissions (skbs) by the cgroup's sockets."),
        CounterInfo(RETRANSMIT_FAILURES, "Retransmission attempts the kernel reported failed."),
        CounterInfo(
            PEER_RETRANSMITS,
            "Retransmits by the cgroup's sockets towards a local socket of the victim cgroup.",
        ),
        CounterInfo(DROPPED, drops_help("Events", DROP_REASONS)),
    ),
)
# include/net/tcp_states.h
TCP_STATES: Final = {
    1: "ESTABLISHED",
    2: "SYN_SENT",
    3: "SYN_RECV",
    4: "FIN_WAIT1",
    5: "FIN_WAIT2",
    6: "TIME_WAIT",
    7: "CLOSE",
    8: "CLOSE_WAIT",
    9: "LAST_ACK",
    10: "LISTEN",
    11: "CLOSING",
    12: "NEW_SYN_RECV",
    13: "BOUND_INACTIVE",
}
_CONFIG_SELFCHECK_PORT: Final = 1  # tcpstate_config slot (0 is the cgroup filter's)
_IPPROTO_TCP: Final = 6


def state_name(state: int) -> str:
    """Kernel TCP state number as its tcp_states.h name (unknown numbers as "STATE_<n>")."""
    return TCP_STATES.get(state, f"STATE_{state}")


def series_labels(
    cgroup_id: int, kind: int, from_state: int, to_state: int, port: int | None
) -> Labels:
    """Labels of one kernel series key; ``port`` None: the probe has no port labels."""
    values: dict[str, LabelValue] = {"cgroup": cgroup_id, "kind": KINDS[kind]}
    if KINDS[kind] == "time_in_state":
        values["from_state"] = state_name(from_state)
        values["to_state"] = state_name(to_state)
    if port is not None:
        values["port"] = str(port) if port else OTHER_PORT
    return labels(**values)


class TcpStateProbe(BccProbe):
    """Loads, attaches, self-checks and reads the TCP state probe.

    ``port_allow_list``: ports that get their own ``port`` label (at most 64; every other
    connection is "other"); empty: no port label at all.  ``cgroup_ids``: record only sockets of
    these cgroups (None: all).  ``self_check``: prove the socket offsets on a loopback
    connection at attach (only tests that provoke a failure turn it off).
    """

    name = PROBE_NAME
    tracepoints = INFO.tracepoints
    drop_reasons = DROP_REASONS

    def __init__(
        self,
        port_allow_list: Iterable[int] = (),
        cgroup_ids: Iterable[int] | None = None,
        *,
        self_check: bool = True,
        offsets_override: Mapping[str, int] | None = None,
    ) -> None:
        super().__init__(cgroup_ids)
        ports = sorted(set(port_allow_list))
        if len(ports) > MAX_PORT_LABELS:
            raise ValueError(f"at most {MAX_PORT_LABELS} port labels, got {len(ports)}")
        if any(not 0 < port < 65536 for port in ports):
            raise ValueError(f"ports must be 1..65535: {ports}")
        self.port_allow_list = tuple(ports)
        self._self_check = self_check
        self._offsets_override = dict(offsets_override or {})
        self._offsets: dict[str, int] = {}
        self._labels_of_key: dict[bytes, Labels] = {}

    def extra_cflags(self) -> list[str]:
        """The sock offsets from BTF, the table sizes, and what this kernel's tracepoints take."""
        btf = Btf.load()
        self._offsets = {**resolve_offsets(btf, SOCK_FIELDS), **self._offsets_override}
        cflags = [
            *offset_cflags(self._offsets),
            f"-DTCPSTATE_MAX_SERIES={MAX_SERIES}",
            f"-DTCPSTATE_SOCK_SET_BITS={SOCK_SET_BITS}",
            f"-DTCPSTATE_SOCK_WAYS={SOCK_WAYS}",
        ]
        if len(btf.tracepoint_args("tcp_retransmit_skb")) >= 3:
            cflags.append("-DTCPSTATE_RETRANSMIT_HAS_ERR")
        if self.port_allow_list:
            cflags.append("-DTCPSTATE_PORT_LABELS")
        return cflags

    def prepare(self, bpf: Any) -> None:
        ports = bpf[b"tcpstate_port_allow"]
        for port in self.port_allow_list:
            ports[ports.Key(port)] = ctypes.c_uint8(1)

    def self_check(self, bpf: Any) -> None:
        """The sock offsets, proven on a loopback connection (OffsetCheckError if wrong)."""
        if self._self_check:
            check_sock_offsets(bpf, self._offsets)

    def read(self) -> Snapshot:
        """Cumulative histograms per series, retransmit counters and drops, as of now."""
        bpf = self._require_bpf()
        taken_ns = time.time_ns()
        with_port = bool(self.port_allow_list)

        def key_of(series: Any) -> Labels:
            port = int(series.port) if with_port else None
            return series_labels(
                int(series.cgroup_id),
                int(series.kind),
                int(series.from_state),
                int(series.to_state),
                port,
            )

        # A series' labels by its key's bytes: naming the same 512 keys afresh each read was a
        # third of the read's profile on a busy host.
        named = self._labels_of_key
        if len(named) > 4 * MAX_SERIES:  # keys of series long gone
            named.clear()
        series_of = {}
        for key, slot in table_items(bpf[b"tcpstate_slots"]):
            raw = bytes(key)
            series = named.get(raw)
            if series is None:
                series = named[raw] = key_of(key)
            series_of[int(slot.value)] = series
        slots = sorted(series_of)
        # Sums first: a sample lands in its bucket before its sum (see record()).  Fancy indexing
        # copies: one read each.
        sums = self.mapped_array("tcpstate_sum_ns", np.uint64, (MAX_SERIES,))[slots]
        rows = self.mapped_array("tcpstate_hist", np.uint64, (MAX_SERIES, HIST_ROW))[slots]
        histograms = slot_histograms([series_of[slot] for slot in slots], rows, sums.tolist())
        counters: dict[tuple[str, Labels], int] = {}
        for name, table in (
            (RETRANSMITS, b"tcpstate_retransmits"),
            (RETRANSMIT_FAILURES, b"tcpstate_retransmit_failures"),
        ):
            for cgroup_id, value in table_items(bpf[table]):
                counters[(name, labels(cgroup=int(cgroup_id.value)))] = int(value.value)
        for pair, value in table_items(bpf[b"tcpstate_peer_retransmits"]):
            key = labels(cgroup=int(pair.cgroup_id), victim=int(pair.peer_cgroup_id))
            counters[(PEER_RETRANSMITS, key)] = int(value.value)
        counters.update(self.drop_counters())
        return Snapshot(PROBE_NAME, taken_ns, histograms, counters)

    def forget(self, cgroup_ids: set[int]) -> None:
        """Clear removed cgroups' series rows, give their slots back, drop their counters."""
        bpf = self._require_bpf()
        gone = [
            (key, int(slot.value))
            for key, slot in table_items(bpf[b"tcpstate_slots"])
            if int(key.cgroup_id) in cgroup_ids
        ]
        if gone:
            rows = sorted(slot for _, slot in gone)
            self.mapped("tcpstate_sum_ns", np.uint64, (MAX_SERIES,)).zero(rows)
            self.mapped("tcpstate_hist", np.uint64, (MAX_SERIES, HIST_ROW)).zero(rows)
            release_slots(bpf, PROBE_NAME, [key for key, _ in gone])
        for table in (b"tcpstate_retransmits", b"tcpstate_retransmit_failures"):
            delete_where(bpf[table], lambda key: int(key.value) in cgroup_ids)
        delete_where(
            bpf[b"tcpstate_peer_retransmits"],
            lambda pair: {int(pair.cgroup_id), int(pair.peer_cgroup_id)} & cgroup_ids != set(),
        )

    def map_fill(self) -> dict[str, float]:
        """Fill ratio per hash map and of the socket table (a full map drops events: see the
        drop counters)."""
        socks = self.tracked_sockets()["sk"]
        return {
            **hash_map_fill(self._require_bpf()),
            "tcpstate_socks": int(np.count_nonzero(socks)) / socks.size,
        }

    def tracked_sockets(self) -> npt.NDArray[Any]:
        """The socket table as it is now (read-only view, SOCK_ENTRY by set and way; ``sk`` 0
        is a free way)."""
        return self.mapped("tcpstate_socks", SOCK_ENTRY, (1 << SOCK_SET_BITS, SOCK_WAYS)).array


def check_sock_offsets(bpf: Any, offsets: Mapping[str, int], timeout_s: float = 2.0) -> None:
    """Connect on loopback from this process and compare what the probe read with the truth.

    The active open's CLOSE -> SYN_SENT runs in our own thread, so the socket's cgroup must equal
    both ``bpf_get_current_cgroup_id()`` and our cgroup directory's inode, and the ports must be
    the ones bound.  Raises OffsetCheckError naming the offsets on any disagreement.
    """
    with contextlib.ExitStack() as stack:
        listener = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        listen_port = int(listener.getsockname()[1])
        set_config(bpf, PROBE_NAME, _CONFIG_SELFCHECK_PORT, listen_port)
        stack.callback(set_config, bpf, PROBE_NAME, _CONFIG_SELFCHECK_PORT, 0)
        client = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
        # Reset on close: the socket reaches CLOSE at once, while its events are still ours.
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.bind(("127.0.0.1", 0))  # so the port is set before SYN_SENT
        client_port = int(client.getsockname()[1])
        client.settimeout(timeout_s)
        client.connect(("127.0.0.1", listen_port))
        accepted, _ = listener.accept()
        accepted.close()
        record = bpf[b"tcpstate_selfcheck_record"][ctypes.c_int(0)]
        try:
            expected_cgroup = own_cgroup_id()
        except NoCgroupV2Error as error:
            raise OffsetCheckError(str(error)) from None
        where = ", ".join(f"{macro}={offsets.get(macro)}" for macro in SOCK_FIELDS)
        if record.hits == 0:
            raise OffsetCheckError(
                "tcpstate self-check saw no SYN_SENT for its loopback connect to port "
                f"{listen_port}: sock remote port or protocol offsets are wrong ({where})"
            )
        observed = {
            "socket cgroup (SOCK_CGROUP_OFF)": (int(record.sock_cgroup_id), expected_cgroup),
            "current cgroup (bpf helper)": (int(record.current_cgroup_id), expected_cgroup),
            "local port (SOCK_NUM_OFF)": (int(record.local_port), client_port),
            "remote port (SOCK_DPORT_OFF)": (int(record.remote_port), listen_port),
            "protocol (SOCK_PROTOCOL_OFF)": (int(record.protocol), _IPPROTO_TCP),
        }
        check_observed(
            observed,
            "socket offsets disagree with a loopback connection of known cgroup, refusing "
            f"to use them ({where})",
        )


def expected_tracepoint_args() -> Mapping[str, Sequence[str]]:
    """Leading raw tracepoint arguments tcpstate.bpf.c reads (``ctx->args[i]``), for BTF checks."""
    return {
        "inet_sock_set_state": ["const struct sock *", "const int", "const int"],
        "tcp_retransmit_skb": ["const struct sock *", "const struct sk_buff *"],
    }
