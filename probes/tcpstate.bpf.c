/* tcpstate: time TCP sockets spend in each state, connect latency, connection lifetime (5 µs
 * histograms) and retransmits, per cgroup of the SOCKET.
 *
 * Series (label names as tcpstate.py exports them; `port` only with a port allow-list):
 *   {cgroup, kind="time_in_state", from_state, to_state[, port]}  time spent in from_state,
 *       ending in a move to to_state (e.g. SYN_SENT -> ESTABLISHED = the active handshake)
 *   {cgroup, kind="connect"[, port]}   SYN_SENT entered -> ESTABLISHED (active opens only)
 *   {cgroup, kind="lifetime"[, port]}  socket born (left CLOSE, or a passive child created from
 *       LISTEN) -> CLOSE; listening sockets have no lifetime sample
 *   counters tcp_retransmits{cgroup}: retransmitted skbs (one tracepoint hit each; an skb may
 *       carry several segments, so this is <= the netns's RetransSegs / tcpi_total_retrans),
 *       tcp_retransmit_failures{cgroup}: attempts the kernel reported with err != 0 (only on
 *       kernels whose tracepoint passes err),
 *       tcp_retransmits_to_peer{cgroup, victim}: the retransmits of connections whose other end
 *       is a socket of this host, by the cgroup holding that end (`victim`: the receiver that
 *       waits for the data); connections established before attach have no known other end
 * Only transitions both ends of which were seen count: sockets already open at attach give
 * time-in-state samples from their first seen transition on, and no lifetime.
 *
 * Attach points (tp_btf where the kernel takes it, else raw tracepoints; reads via kread.bpf.h):
 *   inet_sock_set_state(const struct sock *sk, const int oldstate, const int newstate)
 *   tcp_retransmit_skb(const struct sock *sk, const struct sk_buff *skb[, int err])
 *
 * Attribution: to sk->sk_cgrp_data.cgroup (include/sock.bpf.h), the cgroup of the task that
 * created the socket; accepted sockets inherit the listener's.  The other end: every socket that
 * enters ESTABLISHED leaves {its (local port, remote port), its cgroup} in a direct-mapped array
 * (slot = a hash of the port pair: two stores, no hash-map update on this hot path); a retransmit
 * looks up the mirrored pair (its remote port, its local port), which is the other end when both
 * ends live on this host (loopback, veth between namespaces).  A later connection hashing to the
 * same slot overwrites an entry (its other end is then unknown, never wrong: the pair is
 * compared); ports only, so another host's connection can be taken for ours only if this host
 * holds the exact mirrored pair at the same time.  Most of these events run in
 * softirq (an incoming SYN-ACK, a retransmit timer) with an unrelated `current`, which is never
 * used.  Only IPPROTO_TCP sockets count (the tracepoint also serves other protocols).
 *
 * State: per-socket {sk, state, entered_ns, born_ns, syn_sent_ns} in a set-associative array:
 * the socket's address hashes to a set of TCPSTATE_SOCK_WAYS entries tagged with the address
 * (array lookups the verifier inlines, no hash-map update or delete on this hot path), freed at
 * CLOSE.  A socket seen first takes a free way (compare-and-swap), else the way whose state is
 * oldest, most likely a socket freed without a CLOSE seen here (counted as sock_table_full); a
 * socket born at the address of a leftover entry replaces it (counted as stale_socket).
 *
 * Overhead (benchmarks/bench_probe_overhead.py: a loopback connect/accept/close loop, kernel BPF
 * stats against an empty tp_btf program on the same tracepoint, measured on this 2-vCPU VM):
 * inet_sock_set_state 179 vs 53-54 ns per event (3.34-3.36x), mostly the clock read (~65 ns
 * here).  A loopback connection makes ~10 transitions (both ends), so under 2 µs of probe time
 * per connection, a small part of a connect/accept/close cycle on loopback and far less for
 * connections that live longer than microseconds.  tcp_retransmit_skb costs one socket-cgroup
 * read and one hash add per retransmit.
 * Designs measured against each other, same benchmark, each pair interleaved in one run:
 * - a per-socket LRU hash (lookup, then update or delete) instead of the set-associative table:
 *   280-292 vs 54-55 ns (5.15-5.28x);
 * - BPF socket local storage instead of the LRU hash (tp_btf only; created at a birth, left at
 *   CLOSE, freed with the socket): 316-320 vs 252-258 ns/event, loopback connections/s -9.8 to
 *   -11.2 % vs -8.4 to -9.4 % with the probe on; its per-socket allocation costs more than an
 *   LRU update;
 * - two hash lookup-or-inits per sample instead of series slots: 620-720 vs 509-543 ns;
 * - remembering established ends for the other-end lookup (two port reads and two stores into
 *   an array on each move to ESTABLISHED, ~2 of a loopback connection's ~10 transitions):
 *   5.45-6.05x against 5.30-5.39x without; an LRU hash update instead of the array costs
 *   505-529 ns (8.9-9.1x) under this connection churn.
 *
 * Example (31 loopback connects, client and server both in "/", same VM):
 *   /  time_in_state  SYN_SENT->ESTABLISHED  31  P50   7.6 µs  P99 23.5 µs
 *   /  time_in_state  SYN_RECV->ESTABLISHED  31  P50   2.5 µs  P99  5.0 µs
 *   /  time_in_state  ESTABLISHED->FIN_WAIT1 31  P50  12.7 µs  P99 33.5 µs
 *   /  connect                               31  P50   7.6 µs  P99 23.5 µs
 *   /  lifetime                              62  P50  30.3 µs  P99 66.9 µs  (both ends)
 *
 * Lost samples are counted in tcpstate_dropped_events (DROP_* below).
 * Transitions the program never sees are counted by the kernel and reported as drops with
 * reason missed_run (probes/bccprobe.py): a softirq that interrupts this program runs its own
 * transitions while the program is active on that CPU, and the kernel's recursion guard skips
 * them -- on a loopback burst of 2 x 1,009 closes, hundreds in about one burst of five.
 *
 * Storage: series -> slot (a 16-entry per-CPU cache in front of a hash, include/slots.bpf.h),
 * then a histogram row and an exact sum per slot in arrays (atomic adds, mmap-ed by user space).
 *
 * Tunables (-D): TCPSTATE_SOCK_SET_BITS, TCPSTATE_SOCK_WAYS, TCPSTATE_MAX_SERIES (set by
 * tcpstate.py), TCPSTATE_MAX_CGROUPS, TCPSTATE_PORT_LABELS (label series with allow-listed ports),
 * TCPSTATE_RETRANSMIT_HAS_ERR (the tracepoint's third argument is err).
 */
#include "hist.bpf.h"
#include "slots.bpf.h"
#include "sock.bpf.h"

#ifndef TCPSTATE_SOCK_SET_BITS
#define TCPSTATE_SOCK_SET_BITS 15 /* 2^15 sets of TCPSTATE_SOCK_WAYS tracked sockets */
#endif
#ifndef TCPSTATE_SOCK_WAYS
#define TCPSTATE_SOCK_WAYS 4
#endif
#ifndef TCPSTATE_MAX_SERIES
#define TCPSTATE_MAX_SERIES 512
#endif
#define SERIES_CACHE 16 /* per-CPU series -> slot entries, a power of two */
#define HIST_ROW (HIST_NUM_BUCKETS + 1) /* finite buckets, then overflow */
#ifndef TCPSTATE_MAX_CGROUPS
#define TCPSTATE_MAX_CGROUPS 4096
#endif
#define TCPSTATE_MAX_PORTS 64
#define TCPSTATE_ENDS_BITS 16 /* 65,536 established ends remembered for peer lookups */

#define IPPROTO_TCP_NUM 6
/* include/net/tcp_states.h */
#define TCP_ESTABLISHED_STATE 1
#define TCP_SYN_SENT_STATE 2
#define TCP_SYN_RECV_STATE 3
#define TCP_CLOSE_STATE 7
#define TCP_LISTEN_STATE 10

#define KIND_TIME_IN_STATE 0
#define KIND_CONNECT 1
#define KIND_LIFETIME 2

/* Drop reasons (index into tcpstate_dropped_events). */
#define DROP_SOCK_TABLE 0 /* a socket's set was full: the oldest entry there gave way */
#define DROP_HIST_FULL 1 /* no series slot left */
#define DROP_COUNTER_FULL 2
#define DROP_PEER_FULL 3 /* no room for a (cgroup, other end) retransmit counter */
#define DROP_STALE_SOCKET 4 /* a socket born where an entry was left: the earlier socket at that
                             * address closed unseen, its lifetime is lost */
#define DROP_REASONS 5

/* tcpstate_config slots, written by user space. */
#define CONFIG_FILTER_ON 0
#define CONFIG_SELFCHECK_PORT 1
#define CONFIG_SLOTS 2

struct tcpstate_sock {
    u64 sk;          /* the socket's address; 0: a free way */
    u64 entered_ns;  /* when the socket entered `state` */
    u64 born_ns;     /* 0: birth not seen (or a listener) -> no lifetime sample */
    u64 syn_sent_ns; /* 0: no active open seen */
    u32 state;
    u32 pad;
};

/* The sockets whose address hashes to one index (sock_set_index). */
struct tcpstate_sock_set {
    struct tcpstate_sock way[TCPSTATE_SOCK_WAYS];
};

/* One histogram: keys are hashed bytewise, so every padding byte is explicit and zeroed. */
struct tcpstate_series {
    u64 cgroup_id;
    u16 port; /* allow-listed port, 0 = other (always 0 without TCPSTATE_PORT_LABELS) */
    u8 kind;
    u8 from_state;
    u8 to_state;
    u8 pad[3];
};

struct tcpstate_series_cached {
    struct tcpstate_series series;
    u32 slot;
    u32 pad;
};

struct tcpstate_cpu {
    struct tcpstate_series_cached cache[SERIES_CACHE];
    u64 scratch; /* pointer_number */
};

/* One established socket: its (local port << 16 | remote port) and its cgroup. */
struct tcpstate_end {
    u64 cgroup_id;
    u32 ports;
    u32 pad;
};

/* Retransmits counted by (retransmitting socket's cgroup, cgroup of the connection's other end). */
struct tcpstate_peer_pair {
    u64 cgroup_id;
    u64 peer_cgroup_id;
};

/* What the attach-time self-check connection looked like through our offsets. */
struct tcpstate_selfcheck {
    u64 hits;
    u64 sock_cgroup_id;
    u64 current_cgroup_id;
    u16 local_port;
    u16 remote_port;
    u16 protocol;
    u16 pad;
};

BPF_F_TABLE("array", u32, struct tcpstate_sock_set, tcpstate_socks, 1 << TCPSTATE_SOCK_SET_BITS,
            BPF_F_MMAPABLE);
/* series -> slot and the claim of each slot (include/slots.bpf.h). */
BPF_HASH(tcpstate_slots, struct tcpstate_series, u32, TCPSTATE_MAX_SERIES);
BPF_HASH(tcpstate_slot_owner, u32, struct tcpstate_series, TCPSTATE_MAX_SERIES);
BPF_ARRAY(tcpstate_slot_hint, u32, 1);
BPF_PERCPU_ARRAY(tcpstate_cpu_state, struct tcpstate_cpu, 1);
/* Row per series slot: bucket counts, and the exact sum beside it (atomic adds; user space
 * maps both; the count is the row's sum). */
BPF_F_TABLE("array", u32, u64, tcpstate_hist, TCPSTATE_MAX_SERIES * HIST_ROW, BPF_F_MMAPABLE);
BPF_F_TABLE("array", u32, u64, tcpstate_sum_ns, TCPSTATE_MAX_SERIES, BPF_F_MMAPABLE);
BPF_HASH(tcpstate_retransmits, u64, u64, TCPSTATE_MAX_CGROUPS);
BPF_HASH(tcpstate_retransmit_failures, u64, u64, TCPSTATE_MAX_CGROUPS);
BPF_ARRAY(tcpstate_ends, struct tcpstate_end, 1 << TCPSTATE_ENDS_BITS);
BPF_HASH(tcpstate_peer_retransmits, struct tcpstate_peer_pair, u64, TCPSTATE_MAX_CGROUPS);
BPF_HASH(tcpstate_cgroup_allow, u64, u8, TCPSTATE_MAX_CGROUPS);
BPF_HASH(tcpstate_port_allow, u16, u8, TCPSTATE_MAX_PORTS);
BPF_ARRAY(tcpstate_config, u32, CONFIG_SLOTS);
BPF_ARRAY(tcpstate_selfcheck_record, struct tcpstate_selfcheck, 1);
BPF_PERCPU_ARRAY(tcpstate_dropped_events, u64, DROP_REASONS);

static __always_inline void count_drop(u32 reason)
{
    u64 *dropped = tcpstate_dropped_events.lookup(&reason);

    if (dropped)
        (*dropped)++;
}

/* The tcpstate_ends slot of a port pair (Fibonacci hashing: the top bits of a multiply). */
static __always_inline u32 end_slot(u32 ports)
{
    return (ports * 2654435769u) >> (32 - TCPSTATE_ENDS_BITS);
}

static __always_inline u32 config(u32 slot)
{
    u32 *value = tcpstate_config.lookup(&slot);

    return value ? *value : 0;
}

/* False if a cgroup filter is on and this cgroup is not in it. */
static __always_inline bool cgroup_wanted(u64 cgroup_id)
{
    if (!config(CONFIG_FILTER_ON))
        return true;
    return tcpstate_cgroup_allow.lookup(&cgroup_id) != 0;
}

/* The allow-listed port of this socket (local first: a server's port, then remote: the service
 * a client talks to), else 0 ("other").  Bounded by the allow-list size. */
static __always_inline u16 port_label(const void *sk)
{
#ifdef TCPSTATE_PORT_LABELS
    u16 local = sock_local_port(sk);
    u16 remote = sock_remote_port(sk);

    if (local && tcpstate_port_allow.lookup(&local))
        return local;
    if (remote && tcpstate_port_allow.lookup(&remote))
        return remote;
#endif
    return 0;
}

/* tcpstate_slots' three operations for slot_claim (include/slots.bpf.h). */
static __always_inline int slot_own(u32 *slot, const void *series)
{
    return tcpstate_slot_owner.insert(slot, (struct tcpstate_series *)series);
}

static __always_inline int slot_bind(const void *series, u32 *slot)
{
    return tcpstate_slots.insert((struct tcpstate_series *)series, slot);
}

static __always_inline u32 *slot_find(const void *series)
{
    return tcpstate_slots.lookup((struct tcpstate_series *)series);
}

/* The slot of a series: this CPU's small cache, then the hash, then a new claim (-1: full). */
static __always_inline s32 series_slot(struct tcpstate_series *series)
{
    u32 zero = 0;
    struct tcpstate_cpu *cpu = tcpstate_cpu_state.lookup(&zero);
    struct tcpstate_series_cached *cached;
    u64 tag = series->cgroup_id ^ ((u64)series->kind << 16 | (u64)series->from_state << 8 |
                                   series->to_state | (u64)series->port << 20);
    u32 *known;
    u32 *hint;
    s32 slot;

    if (!cpu)
        return -1;
    cached = &cpu->cache[(tag ^ (tag >> 8)) & (SERIES_CACHE - 1)];
    if (cached->series.cgroup_id == series->cgroup_id && cached->series.port == series->port &&
        cached->series.kind == series->kind && cached->series.from_state == series->from_state &&
        cached->series.to_state == series->to_state && cached->series.cgroup_id)
        return cached->slot;
    known = tcpstate_slots.lookup(series);
    if (known) {
        slot = (s32)*known;
    } else {
        hint = tcpstate_slot_hint.lookup(&zero);
        if (!hint)
            return -1;
        slot = slot_claim(hint, 0, TCPSTATE_MAX_SERIES, series, slot_own, slot_bind, slot_find);
        if (slot < 0)
            return -1;
    }
    cached->series = *series;
    cached->slot = (u32)slot;
    return slot;
}

static __always_inline void record(u64 cgroup_id, u16 port, u8 kind, u8 from_state, u8 to_state,
                                   u64 value_ns)
{
    struct tcpstate_series series = {};
    u64 *bucket_count;
    u64 *sum_ns;
    u32 cell;
    u32 row;
    s32 slot;

    series.cgroup_id = cgroup_id;
    series.port = port;
    series.kind = kind;
    series.from_state = from_state;
    series.to_state = to_state;
    slot = series_slot(&series);
    if (slot < 0) {
        count_drop(DROP_HIST_FULL);
        return;
    }
    row = (u32)slot;
    cell = row * HIST_ROW + hist_bucket_index(value_ns);
    bucket_count = tcpstate_hist.lookup(&cell);
    sum_ns = tcpstate_sum_ns.lookup(&row);
    if (!bucket_count || !sum_ns)
        return; /* slots are < TCPSTATE_MAX_SERIES: never */
    /* Bucket before sum: a racing read never has a sum larger than its buckets explain. */
    __sync_fetch_and_add(bucket_count, 1);
    __sync_fetch_and_add(sum_ns, value_ns);
}

/* The set of a socket address (Fibonacci hashing: the top bits of a multiply). */
static __always_inline u32 sock_set_index(u64 address)
{
    return (u32)((address * 11400714819323198485ull) >> (64 - TCPSTATE_SOCK_SET_BITS));
}

static __always_inline struct tcpstate_sock *sock_find(struct tcpstate_sock_set *set, u64 address)
{
#pragma unroll
    for (int i = 0; i < TCPSTATE_SOCK_WAYS; i++) {
        if (set->way[i].sk == address)
            return &set->way[i];
    }
    return NULL;
}

/* A way for a socket seen for the first time: a free one, else the one whose state is oldest (a
 * socket freed without a CLOSE seen here, most likely; counted as DROP_SOCK_TABLE).  The claim is a
 * compare-and-swap: NULL if another CPU took that way meanwhile. */
static __always_inline struct tcpstate_sock *sock_claim(struct tcpstate_sock_set *set,
                                                        u64 address)
{
    struct tcpstate_sock *oldest = &set->way[0];
    u64 owner;

#pragma unroll
    for (int i = 0; i < TCPSTATE_SOCK_WAYS; i++) {
        if (set->way[i].sk == 0 && __sync_val_compare_and_swap(&set->way[i].sk, 0, address) == 0)
            return &set->way[i];
        if (set->way[i].entered_ns < oldest->entered_ns)
            oldest = &set->way[i];
    }
    count_drop(DROP_SOCK_TABLE);
    owner = oldest->sk;
    if (owner && __sync_val_compare_and_swap(&oldest->sk, owner, address) == owner)
        return oldest;
    return NULL;
}

/* The attach-time self-check: user space connects to CONFIG_SELFCHECK_PORT on loopback from a
 * cgroup it knows; its sockets are recorded here and nowhere else. */
static __always_inline bool selfcheck_socket(const void *sk, u64 cgroup_id, int newstate)
{
    u32 check_port = config(CONFIG_SELFCHECK_PORT);
    u16 local;
    u16 remote;
    u32 zero = 0;
    struct tcpstate_selfcheck *seen;

    if (!check_port)
        return false;
    local = sock_local_port(sk);
    remote = sock_remote_port(sk);
    if (local != check_port && remote != check_port)
        return false;
    seen = tcpstate_selfcheck_record.lookup(&zero);
    /* The active open's CLOSE -> SYN_SENT runs in the connecting thread: current is ground
     * truth there.  A SYN_SENT socket has its local port only if bound first (user space does). */
    if (seen && newstate == TCP_SYN_SENT_STATE && remote == check_port) {
        seen->sock_cgroup_id = cgroup_id;
        seen->current_cgroup_id = bpf_get_current_cgroup_id();
        seen->local_port = local;
        seen->remote_port = remote;
        seen->protocol = sock_protocol(sk);
        __sync_fetch_and_add(&seen->hits, 1);
    }
    return true;
}

int on_inet_sock_set_state(struct bpf_raw_tracepoint_args *ctx)
{
    const void *sk = (const void *)ctx->args[0];
    int oldstate = (int)ctx->args[1];
    int newstate = (int)ctx->args[2];
    u32 zero = 0;
    u32 index;
    u64 address;
    u64 now_ns;
    u64 cgroup_id;
    u16 port;
    struct tcpstate_cpu *cpu;
    struct tcpstate_sock_set *set;
    struct tcpstate_sock *tracked;
    struct tcpstate_sock *stale = NULL;
    bool born;

    if (sock_protocol(sk) != IPPROTO_TCP_NUM)
        return 0;
    cgroup_id = sock_cgroup_id(sk);
    if (selfcheck_socket(sk, cgroup_id, newstate))
        return 0;
    if (!cgroup_wanted(cgroup_id))
        return 0;
    cpu = tcpstate_cpu_state.lookup(&zero);
    if (!cpu)
        return 0;
    address = pointer_number(ctx->args[0], &cpu->scratch);
    index = sock_set_index(address);
    set = tcpstate_socks.lookup(&index);
    if (!set)
        return 0;
    now_ns = bpf_ktime_get_ns();
    port = port_label(sk);
    tracked = sock_find(set, address);
    /* Born: an active/listening socket leaving CLOSE, or a passive child (cloned from its
     * listener, so its first transition reads LISTEN -> SYN_RECV). */
    born = (oldstate == TCP_CLOSE_STATE && newstate != TCP_LISTEN_STATE) ||
           (oldstate == TCP_LISTEN_STATE && newstate == TCP_SYN_RECV_STATE);
    /* Entries go at CLOSE, so one found at a birth is a dead socket's (same address, its CLOSE
     * unseen): without this, its state (e.g. a listener's born_ns = 0) would pass to the new
     * one. */
    if (tracked && (oldstate == TCP_CLOSE_STATE || born)) {
        count_drop(DROP_STALE_SOCKET);
        stale = tracked;
        tracked = NULL;
    }

    /* A stale entry (a missed transition) has the wrong state: its time is unknown, skip it. */
    if (tracked && tracked->state == (u32)oldstate) {
        record(cgroup_id, port, KIND_TIME_IN_STATE, (u8)oldstate, (u8)newstate,
               now_ns - tracked->entered_ns);
        if (oldstate == TCP_SYN_SENT_STATE && newstate == TCP_ESTABLISHED_STATE &&
            tracked->syn_sent_ns)
            record(cgroup_id, port, KIND_CONNECT, 0, 0, now_ns - tracked->syn_sent_ns);
    }
    if (newstate == TCP_CLOSE_STATE) {
        if (tracked && tracked->born_ns)
            record(cgroup_id, port, KIND_LIFETIME, 0, 0, now_ns - tracked->born_ns);
        if (tracked)
            tracked->sk = 0;
        if (stale)
            stale->sk = 0;
        return 0;
    }
    if (newstate == TCP_ESTABLISHED_STATE) {
        /* Remembered for the other end's retransmits (one update per connection end). */
        u32 ports = (u32)sock_local_port(sk) << 16 | sock_remote_port(sk);
        u32 slot = end_slot(ports);
        struct tcpstate_end *end = tcpstate_ends.lookup(&slot);

        if (end) {
            end->cgroup_id = cgroup_id;
            end->ports = ports;
        }
    }
    if (tracked) {
        tracked->state = (u32)newstate;
        tracked->entered_ns = now_ns;
        if (newstate == TCP_SYN_SENT_STATE)
            tracked->syn_sent_ns = now_ns;
        if (newstate == TCP_LISTEN_STATE)
            tracked->born_ns = 0;
        return 0;
    }
    tracked = stale ? stale : sock_claim(set, address);
    if (!tracked)
        return 0;
    tracked->state = (u32)newstate;
    tracked->entered_ns = now_ns;
    tracked->born_ns = born ? now_ns : 0;
    tracked->syn_sent_ns = newstate == TCP_SYN_SENT_STATE ? now_ns : 0;
    return 0;
}

static __always_inline void count_for_cgroup(u64 cgroup_id, bool failed)
{
    u64 zero = 0;
    u64 *count;

    if (failed)
        count = tcpstate_retransmit_failures.lookup_or_try_init(&cgroup_id, &zero);
    else
        count = tcpstate_retransmits.lookup_or_try_init(&cgroup_id, &zero);
    if (!count) {
        count_drop(DROP_COUNTER_FULL);
        return;
    }
    __sync_fetch_and_add(count, 1);
}

/* The retransmit by the cgroup holding the connection's other end, when that end is ours. */
static __always_inline void count_for_peer(const void *sk, u64 cgroup_id)
{
    u32 other_ports = (u32)sock_remote_port(sk) << 16 | sock_local_port(sk);
    u32 slot = end_slot(other_ports);
    struct tcpstate_peer_pair pair = {};
    struct tcpstate_end *end;
    u64 zero = 0;
    u64 *count;

    end = tcpstate_ends.lookup(&slot);
    if (!end || end->ports != other_ports || !other_ports)
        return;
    pair.cgroup_id = cgroup_id;
    pair.peer_cgroup_id = end->cgroup_id;
    count = tcpstate_peer_retransmits.lookup_or_try_init(&pair, &zero);
    if (!count) {
        count_drop(DROP_PEER_FULL);
        return;
    }
    __sync_fetch_and_add(count, 1);
}

int on_tcp_retransmit_skb(struct bpf_raw_tracepoint_args *ctx)
{
    const void *sk = (const void *)ctx->args[0];
    u64 cgroup_id;
    bool failed = false;

    if (sock_protocol(sk) != IPPROTO_TCP_NUM)
        return 0;
    cgroup_id = sock_cgroup_id(sk);
    if (!cgroup_wanted(cgroup_id))
        return 0;
#ifdef TCPSTATE_RETRANSMIT_HAS_ERR
    failed = (int)ctx->args[2] != 0;
#endif
    count_for_cgroup(cgroup_id, failed);
    if (!failed)
        count_for_peer(sk, cgroup_id);
    return 0;
}
