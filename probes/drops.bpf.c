/* drops: packets the kernel dropped, with the kernel's own reason (enum skb_drop_reason), per
 * cgroup of the socket the packet was for.
 *
 * Counters (names as drops.py exports them):
 *   packets_dropped{cgroup, protocol, reason}       drops of packets that had a socket
 *   host_packets_dropped{scope=host, protocol, reason}  drops of packets with no socket
 *   host_unspecified_frees{scope=host}              kfree_skb() calls that gave no reason
 * `reason` is the enum's name less SKB_DROP_REASON_ (SOCKET_RCVBUFF, NETFILTER_DROP...), named by
 * drops.py from the running kernel's BTF; the program only carries the number.
 *
 * Attach point (tp_btf where the kernel takes it, else a raw tracepoint; reads via kread.bpf.h):
 *   kfree_skb(struct sk_buff *skb, void *location, enum skb_drop_reason reason
 *             [, struct sock *rx_sk])   (rx_sk since 6.11: DROPS_HAS_RX_SK)
 * Since 6.0 a consumed skb fires consume_skb, not kfree_skb; SKB_CONSUMED and
 * SKB_NOT_DROPPED_YET are still skipped in case a path passes them.  SKB_DROP_REASON_NOT_SPECIFIED
 * is what plain kfree_skb() passes, drops or not (many callers free that way on paths that are
 * no loss): it is only counted, per CPU and host-wide, and the program returns at once.
 *
 * Attribution: the socket is rx_sk (the receiving socket the kernel names: a UDP receive-buffer
 * overflow passes it, while the skb itself has no owner yet), else skb->sk (an early-demuxed
 * TCP segment on receive, the sending socket on transmit).  A request or time-wait socket has no
 * cgroup (it is not a full socket) and counts as none.  The cgroup is the socket's,
 * sk->sk_cgrp_data.cgroup->kn->id (sock.bpf.h): the cgroup v2 of the task that made it.  A drop
 * without a socket goes to cgroup 0, exported host-wide.
 * Protocol: with a socket, its IP protocol (sk_protocol) for AF_INET/AF_INET6, else its family
 * (unix, netlink...); without one, the protocol field of the IPv4/IPv6 header at
 * skb->head + skb->network_header (one probe read of 10 bytes, only for these drops), else the
 * skb's ethertype (arp...).
 *
 * Overhead (benchmarks/bench_probe_overhead.py --quick --probe drops: UDP datagrams to a full
 * receive buffer, kernel BPF stats against an empty program on kfree_skb, both attach orders,
 * this loaded 2-vCPU VM): tp_btf 91.7 vs 45.8 ns per drop (2.00x, +46 ns); raw_tp 178 vs 47 ns
 * (3.79x: every field a probe read).  Only drops run the program past the reason check;
 * NOT_SPECIFIED frees cost one per-CPU increment.
 *
 * Example (tests/probes/test_drops.py: 10,007 datagrams to a receiver with a small SO_RCVBUF
 * that reads one per millisecond):
 *   packets_dropped{cgroup=/rx, protocol=udp, reason=SOCKET_RCVBUFF} = the socket's drops column
 *   in /proc/net/udp, exactly
 *
 * Lost events are counted in drops_dropped_events (DROP_* below).
 *
 * Storage: (cgroup, protocol, reason) -> series slot (a per-CPU cache in front of a hash,
 * include/slots.bpf.h; the cache shares its per-CPU value with the config words), then one
 * counter per CPU and slot in an array (mmap-ed by user space, which sums the CPUs).
 *
 * Tunables (-D, set by drops.py): DROPS_MAX_SERIES, DROPS_NR_CPUS, the reason values
 * REASON_NOT_SPECIFIED, REASON_CONSUMED, REASON_NOT_DROPPED_YET from BTF, and the offsets.
 */
#include "slots.bpf.h"
#include "sock.bpf.h"

#if !defined(SKB_SK_OFF) || !defined(SKB_PROTOCOL_OFF) || !defined(SKB_HEAD_OFF) ||              \
    !defined(SKB_NETWORK_HEADER_OFF) || !defined(SOCK_FAMILY_OFF) || !defined(SOCK_STATE_OFF) || \
    !defined(REASON_NOT_SPECIFIED) || !defined(REASON_CONSUMED) ||                              \
    !defined(REASON_NOT_DROPPED_YET) || !defined(DROPS_MAX_SERIES) || !defined(DROPS_NR_CPUS)
#error "compile through tailsight.probes.drops (offsets and reason values from BTF)"
#endif

#define SERIES_CACHE 8 /* per-CPU series -> slot entries, a power of two */

/* Drop reasons of this probe's own (index into drops_dropped_events). */
#define DROP_SERIES_FULL 0 /* a series beyond DROPS_MAX_SERIES: its drops are lost */
#define DROP_REASONS 1

/* drops_config words, written by user space into every CPU's copy. */
#define CONFIG_FILTER_ON 0
#define CONFIG_SELFCHECK_PORT 1 /* drops of the UDP socket bound to this port: self-check only */
#define CONFIG_SLOTS 2

/* The protocol code: an IP protocol number, or a socket family / ethertype with a tag. */
#define PROTO_FAMILY (1u << 16)
#define PROTO_ETHERTYPE (2u << 16)
#define AF_INET_ 2
#define AF_INET6_ 10
#define ETH_P_IP_ 0x0800
#define ETH_P_IPV6_ 0x86DD
#define IPPROTO_UDP_ 17
#define TCP_TIME_WAIT_ 6
#define TCP_NEW_SYN_RECV_ 12

struct drops_series_key {
    u64 cgroup_id;
    u32 protocol;
    u32 reason;
};

/* slot_plus_one is the slot + 1: user space empties the caches with zeros while programs may
 * read them (bccprobe.set_config); a half-emptied entry is a miss, never another's slot. */
struct drops_series_cached {
    struct drops_series_key key;
    u32 slot_plus_one;
    u32 pad;
};

struct drops_cpu {
    u32 config[CONFIG_SLOTS];
    struct drops_series_cached cache[SERIES_CACHE];
};

struct drops_selfcheck {
    u64 hits;
    u64 cgroup_id;
    u32 protocol;
    u32 reason;
};

BPF_HASH(drops_slots, struct drops_series_key, u32, DROPS_MAX_SERIES);
BPF_HASH(drops_slot_owner, u32, struct drops_series_key, DROPS_MAX_SERIES);
BPF_ARRAY(drops_slot_hint, u32, 1);
BPF_PERCPU_ARRAY(drops_config, struct drops_cpu, 1);
/* cpu * DROPS_MAX_SERIES + slot -> count, summed over CPUs by user space (it maps the array). */
BPF_F_TABLE("array", u32, u64, drops_counts, DROPS_NR_CPUS * DROPS_MAX_SERIES, BPF_F_MMAPABLE);
BPF_PERCPU_ARRAY(drops_unspecified, u64, 1);
BPF_HASH(drops_cgroup_allow, u64, u8, 4096);
BPF_ARRAY(drops_selfcheck_record, struct drops_selfcheck, 1);
BPF_PERCPU_ARRAY(drops_dropped_events, u64, DROP_REASONS);

static __always_inline void count_drop(u32 reason)
{
    u64 *dropped = drops_dropped_events.lookup(&reason);

    if (dropped)
        (*dropped)++;
}

/* drops_slots' three operations for slot_claim (include/slots.bpf.h). */
static __always_inline int slot_own(u32 *slot, const void *key)
{
    return drops_slot_owner.insert(slot, (struct drops_series_key *)key);
}

static __always_inline int slot_bind(const void *key, u32 *slot)
{
    return drops_slots.insert((struct drops_series_key *)key, slot);
}

static __always_inline u32 *slot_find(const void *key)
{
    return drops_slots.lookup((struct drops_series_key *)key);
}

/* The series' slot: this CPU's small cache, then the hash, then a new claim (-1: none left). */
static __always_inline s32 series_slot(struct drops_cpu *cpu, struct drops_series_key *key)
{
    u32 zero = 0;
    struct drops_series_cached *cached;
    u32 *hint;
    u32 *known;
    s32 slot;

    cached = &cpu->cache[(key->cgroup_id ^ key->reason ^ key->protocol) & (SERIES_CACHE - 1)];
    if (cached->key.cgroup_id == key->cgroup_id && cached->key.protocol == key->protocol &&
        cached->key.reason == key->reason && cached->slot_plus_one)
        return (s32)(cached->slot_plus_one - 1);
    known = drops_slots.lookup(key);
    if (known) {
        slot = (s32)*known;
    } else {
        hint = drops_slot_hint.lookup(&zero);
        if (!hint)
            return -1;
        slot = slot_claim(hint, 0, DROPS_MAX_SERIES, key, slot_own, slot_bind, slot_find);
        if (slot < 0)
            return -1;
    }
    cached->key = *key;
    cached->slot_plus_one = (u32)slot + 1;
    return slot;
}

/* The protocol of a packet without a socket: the IP header's protocol, else the ethertype. */
static __always_inline u32 packet_protocol(const void *skb)
{
    u16 ethertype = __builtin_bswap16(kread_u16(skb, SKB_PROTOCOL_OFF));
    const char *head;
    u16 network;
    u8 header[10] = {};

    if (ethertype != ETH_P_IP_ && ethertype != ETH_P_IPV6_)
        return PROTO_ETHERTYPE | ethertype;
    head = (const char *)kread_u64(skb, SKB_HEAD_OFF);
    network = kread_u16(skb, SKB_NETWORK_HEADER_OFF);
    if (!head || bpf_probe_read_kernel(header, sizeof(header), head + network))
        return PROTO_ETHERTYPE | ethertype;
    /* The version nibble guards against a network header not set yet (early receive drops). */
    if (ethertype == ETH_P_IP_ && (header[0] >> 4) == 4)
        return header[9];
    if (ethertype == ETH_P_IPV6_ && (header[0] >> 4) == 6)
        return header[6]; /* next header: extension headers are not followed */
    return PROTO_ETHERTYPE | ethertype;
}

int on_kfree_skb(struct bpf_raw_tracepoint_args *ctx)
{
    u32 reason = (u32)ctx->args[2];
    const void *skb = (const void *)ctx->args[0];
    const void *sk;
    struct drops_series_key key = {};
    struct drops_cpu *cpu;
    u32 zero = 0;
    u32 family;
    u32 cell;
    u64 *value;
    s32 slot;

    if (reason == REASON_NOT_SPECIFIED) {
        value = drops_unspecified.lookup(&zero);
        if (value)
            (*value)++;
        return 0;
    }
    if (reason == REASON_CONSUMED || reason == REASON_NOT_DROPPED_YET)
        return 0;
    cpu = drops_config.lookup(&zero);
    if (!cpu)
        return 0;
#ifdef DROPS_HAS_RX_SK
    sk = (const void *)ctx->args[3];
    if (!sk)
        sk = kread_ptr(skb, SKB_SK_OFF);
#else
    sk = kread_ptr(skb, SKB_SK_OFF);
#endif
    if (sk) {
        u8 state = kread_u8(sk, SOCK_STATE_OFF);

        if (state == TCP_TIME_WAIT_ || state == TCP_NEW_SYN_RECV_)
            sk = 0; /* no sk_cgrp_data, no sk_protocol: not a full socket */
    }
    key.reason = reason;
    if (sk) {
        family = kread_u16(sk, SOCK_FAMILY_OFF);
        key.protocol = (family == AF_INET_ || family == AF_INET6_) ? (u32)sock_protocol(sk)
                                                                  : PROTO_FAMILY | family;
        key.cgroup_id = sock_cgroup_id(sk);
        if (cpu->config[CONFIG_SELFCHECK_PORT] && key.protocol == IPPROTO_UDP_ &&
            sock_local_port(sk) == cpu->config[CONFIG_SELFCHECK_PORT]) {
            struct drops_selfcheck *seen = drops_selfcheck_record.lookup(&zero);

            if (seen) {
                seen->cgroup_id = key.cgroup_id;
                seen->protocol = key.protocol;
                seen->reason = reason;
                __sync_fetch_and_add(&seen->hits, 1);
            }
            return 0; /* the self-check's own drops are not the agent's cgroup's */
        }
        if (cpu->config[CONFIG_FILTER_ON] && !drops_cgroup_allow.lookup(&key.cgroup_id))
            return 0;
    } else {
        key.protocol = packet_protocol(skb); /* cgroup 0: host-wide, never filtered out */
    }
    slot = series_slot(cpu, &key);
    if (slot < 0) {
        count_drop(DROP_SERIES_FULL);
        return 0;
    }
    cell = bpf_get_smp_processor_id() * DROPS_MAX_SERIES + (u32)slot;
    value = drops_counts.lookup(&cell);
    if (value) /* atomic still: a program preempted on this CPU may be run again meanwhile */
        __sync_fetch_and_add(value, 1);
    return 0;
}
