/* netsyscall: latency of socket syscalls (sendto, recvfrom, sendmsg, recvmsg, recvmmsg,
 * sendmmsg) per cgroup and syscall, as exact 5 µs histograms, with errors counted per errno.
 *
 * Measures: sys_enter to sys_exit of the same thread, blocking time included (a recvfrom that
 * waits 20 ms for a datagram is a 20 ms sample: that is the latency the application sees).
 *
 * Attach points (tp_btf where the kernel takes it, else raw tracepoints; same source):
 *   sys_enter(struct pt_regs *regs, long id)
 *   sys_exit(struct pt_regs *regs, long ret)
 * sys_exit has no syscall id argument: it is read from regs (pt_regs.orig_ax on x86_64,
 * .syscallno on aarch64; offset from BTF as PT_REGS_SYSCALL_NR_OFF) through kread.bpf.h -- a
 * direct load on tp_btf, a probe read on raw tracepoints -- so a non-socket exit leaves before
 * any map access.
 *
 * Attribution: both tracepoints run in the calling thread's process context, so `current` is
 * the caller; its cgroup is read at sys_enter (where the filter needs it; kept with the start
 * time, so sys_exit calls no helper but the clock), by direct loads from
 * bpf_get_current_task_btf() on tp_btf, bpf_get_current_cgroup_id() on raw tracepoints.
 * Syscall numbers are -D values from tailsight/probes/syscalls.py (per `uname -m`).  Known gap:
 * 32-bit compat (ia32) syscalls have their own numbering and are not told apart, so a 32-bit
 * process's syscall whose number collides (ia32 45 = brk) would be counted.
 *
 * Hot path: every syscall on the machine runs these programs.  A non-socket syscall costs a
 * compare chain on its id (enter) or one load plus the compare chain (exit), no map access.  A
 * call in flight waits in a way of an array set, picked and tagged by the caller's syscall
 * frame (start_set: no tid, no hash map); a sample goes to a series slot ((cgroup, syscall) ->
 * slot, a per-CPU cache in front of a hash) whose histogram row and exact sum are arrays (the
 * count is the row's sum).
 *
 * Overhead (benchmarks/bench_netsyscall_overhead.py: kernel BPF stats, each against an empty
 * program on the same tracepoint in the same mode and run, tp_btf, measured on this loaded
 * 2-vCPU VM, interleaved with a design keyed by thread id):
 *   getpid loop (not traced): sys_enter and sys_exit 1.02x (+1 ns)
 *   UDP sendto (traced):      sys_enter +86..87 ns (2.65-2.71x), sys_exit +60..65 ns
 *                             (2.12-2.22x); both together +145..152 ns per call, against
 *                             +152..167 ns (2.47-2.59x, 2.52-2.73x) keyed by thread id.
 * The floor here: one clock read per program (~60-65 ns) and one read of the caller's cgroup
 * (helper + four dependent loads, ~20 ns) in one of them; with empty programs at ~51 ns, both
 * cannot be under 2.5x.  (Reading the cgroup at sys_exit instead: 2.2-2.3x at enter,
 * 2.7-3.0x at exit.)  Raw tracepoints with LRU + hash maps cost more: getpid sys_exit 1.94x,
 * sendto sys_enter 3.9x, sys_exit 6.1x.
 *
 * Outliers: a call slower than max(OUTLIER_FLOOR_NS, its cgroup's threshold) is sent through
 * netsyscall_outlier_events with the caller's kernel and user stacks, taken at sys_exit where
 * the caller is current.  What that shows (checked in tests/probes/test_outliers.py): the
 * kernel stack is the syscall exit path (entry_SYSCALL_64_after_hwframe;do_syscall_64;
 * syscall_exit_work) since the recv frames have returned, so the event also carries the
 * syscall number (label `syscall`); the user stack starts in libc's wrapper (`recvfrom`) and
 * reaches the caller only through code built with frame pointers.  See include/outlier.bpf.h.
 *
 * Example (`tailsight trace --probe netsyscall --cgroup /tailsight-test/echo`: a UDP pair on
 * loopback whose sender sleeps 20 ms before every 10th datagram, on the loaded dev VM):
 *   cgroup                  count  P50 µs  P99 µs  P99.9 µs
 *   /tailsight-test/echo       78     622  49,971    78,725
 *   recvfrom
 *   /tailsight-test/echo       78      12      51        55
 *   sendto
 *   top outlier stacks: netsyscall /tailsight-test/echo recvfrom, 17 events,
 *     entry_SYSCALL_64_after_hwframe;do_syscall_64;syscall_exit_work | recvfrom
 *
 * Lost samples are counted (netsyscall_dropped_events): a call not timed because every way of
 * its start set held a call in flight (thread_collision), no series slot left, error map full.
 *
 * Tunables (-D): NETSYSCALL_START_SET_BITS (2^bits sets of calls in flight),
 * NETSYSCALL_MAX_SERIES (set by netsyscall.py), NETSYSCALL_MAX_ERRORS.  Cgroup filter (at run
 * time, checked at sys_enter): with netsyscall_config[CONFIG_FILTER_ON] set, only calls of cgroup
 * ids in netsyscall_cgroup_allow are recorded.
 */
#include "hist.bpf.h"
#include "outlier.bpf.h"
#include "slots.bpf.h"
#include "task.bpf.h"

#if !defined(PT_REGS_SYSCALL_NR_OFF) || !defined(NR_SENDTO) || !defined(NR_RECVFROM) ||       \
    !defined(NR_SENDMSG) || !defined(NR_RECVMSG) || !defined(NR_RECVMMSG) ||                   \
    !defined(NR_SENDMMSG) || !defined(NETSYSCALL_MAX_SERIES)
#error "compile through tailsight.probes.netsyscall (syscall numbers, pt_regs offset, series)"
#endif

#ifndef NETSYSCALL_START_SET_BITS
#define NETSYSCALL_START_SET_BITS 14 /* 2^14 sets of NETSYSCALL_START_WAYS calls in flight */
#endif
#define NETSYSCALL_START_WAYS 4
#ifndef NETSYSCALL_MAX_ERRORS
#define NETSYSCALL_MAX_ERRORS 4096
#endif
#define SERIES_CACHE 4 /* per-CPU (cgroup, syscall) -> slot entries, a power of two */
#define HIST_ROW (HIST_NUM_BUCKETS + 1) /* finite buckets, then overflow */

/* Drop reasons (index into netsyscall_dropped_events). */
#define DROP_THREAD_COLLISION 0
#define DROP_SERIES_FULL 1
#define DROP_ERROR_FULL 2
#define DROP_REASONS 3

#define IS_NET_SYSCALL(nr)                                                                      \
    ((nr) == NR_SENDTO || (nr) == NR_RECVFROM || (nr) == NR_SENDMSG || (nr) == NR_RECVMSG ||    \
     (nr) == NR_RECVMMSG || (nr) == NR_SENDMMSG)

/* A call in flight, in the set its caller's syscall frame hashes to (start_set). */
struct netsyscall_start {
    u64 frame;     /* the caller's pt_regs address: whose call this is; 0: a free way */
    u64 start_ns;
    u64 cgroup_id; /* the caller's, read at entry: the exit then calls no helper but the clock */
    u32 nr;
    u32 pad;
};

struct netsyscall_start_set {
    struct netsyscall_start way[NETSYSCALL_START_WAYS];
};

struct netsyscall_series_key {
    u64 cgroup_id;
    u32 nr;
    u32 pad; /* keys are hashed bytewise: keep the padding explicit and zero */
};

struct netsyscall_series_cached {
    struct netsyscall_series_key key;
    u32 slot;
    u32 pad;
};

struct netsyscall_cpu {
    struct netsyscall_series_cached cache[SERIES_CACHE];
    u64 scratch; /* frame_number */
};

struct netsyscall_error_key {
    u64 cgroup_id;
    u32 nr;
    u32 errno_value;
};

#define CONFIG_FILTER_ON 0 /* netsyscall_config slots */
#define CONFIG_SLOTS 1

BPF_ARRAY(netsyscall_start_ns, struct netsyscall_start_set, 1 << NETSYSCALL_START_SET_BITS);
/* (cgroup, syscall) -> series slot, and the claim of each slot (never given back). */
BPF_HASH(netsyscall_slots, struct netsyscall_series_key, u32, NETSYSCALL_MAX_SERIES);
BPF_HASH(netsyscall_slot_owner, u32, struct netsyscall_series_key, NETSYSCALL_MAX_SERIES);
BPF_ARRAY(netsyscall_slot_hint, u32, 1);
BPF_PERCPU_ARRAY(netsyscall_cpu_state, struct netsyscall_cpu, 1);
/* Row per series slot: bucket counts, and the exact sum beside it (atomic adds; user space
 * maps both; the count is the row's sum). */
BPF_F_TABLE("array", u32, u64, netsyscall_latency_hist, NETSYSCALL_MAX_SERIES * HIST_ROW,
            BPF_F_MMAPABLE);
BPF_F_TABLE("array", u32, u64, netsyscall_sum_ns, NETSYSCALL_MAX_SERIES, BPF_F_MMAPABLE);
BPF_HASH(netsyscall_errors, struct netsyscall_error_key, u64, NETSYSCALL_MAX_ERRORS);
BPF_PERCPU_ARRAY(netsyscall_dropped_events, u64, DROP_REASONS);
BPF_RINGBUF_OUTPUT(netsyscall_outlier_events, OUTLIER_RINGBUF_PAGES);
BPF_STACK_TRACE(netsyscall_outlier_stacks, OUTLIER_MAX_STACKS);
BPF_HASH(netsyscall_outlier_threshold, u64, u64, NETSYSCALL_MAX_SERIES);
BPF_PERCPU_ARRAY(netsyscall_outlier_rate, struct outlier_bucket, 1);
BPF_PERCPU_ARRAY(netsyscall_outlier_dropped, u64, OUTLIER_DROP_REASONS);
/* The cgroup filter, set by user space at any time (probes/bccprobe.py): slot CONFIG_FILTER_ON
 * of netsyscall_config says whether it is on, netsyscall_cgroup_allow holds the ids it lets
 * through. */
BPF_ARRAY(netsyscall_config, u32, CONFIG_SLOTS);
BPF_HASH(netsyscall_cgroup_allow, u64, u8, NETSYSCALL_MAX_SERIES);

/* False if the cgroup filter is on and this cgroup is not in it. */
static __always_inline bool cgroup_wanted(u64 cgroup_id)
{
    u32 slot = CONFIG_FILTER_ON;
    u32 *on = netsyscall_config.lookup(&slot);

    return !on || !*on || netsyscall_cgroup_allow.lookup(&cgroup_id);
}

static __always_inline void count_drop(u32 reason)
{
    u64 *dropped = netsyscall_dropped_events.lookup(&reason);

    if (dropped)
        (*dropped)++;
}

static __always_inline void count_outlier_drop(u32 reason)
{
    u64 *dropped = netsyscall_outlier_dropped.lookup(&reason);

    if (dropped)
        (*dropped)++;
}

/* The caller's (current's) cgroup: on tp_btf direct loads from the BTF task (~2 ns after the
 * task helper's ~14), on raw tracepoints the cgroup helper (~37 ns). */
#ifdef TAILSIGHT_TP_BTF
#define CALLER_CGROUP_ID() task_cgroup_id((const void *)bpf_get_current_task_btf())
#else
#define CALLER_CGROUP_ID() bpf_get_current_cgroup_id()
#endif

/* Where a call waits for its exit.  Both tracepoints get the caller's pt_regs (its syscall frame,
 * at the top of its kernel stack): one address per thread, the same at enter and exit, and an
 * argument, so no helper is called for it (the tid would need the task).  The address tags a
 * way of a set of NETSYSCALL_START_WAYS, the set picked by a Fibonacci hash of the address /
 * 16 KiB (stacks lie at least that far apart).  A way is claimed by a compare-and-swap of its
 * tag at enter and freed at exit, so a way holds one call and a call one way: no wrong pairing.
 * (The user stack pointer saved in the frame, hashed instead, put forked processes, which share
 * it, all in one set.) */
static __always_inline u64 frame_number(u64 frame_arg)
{
    u32 zero = 0;
    struct netsyscall_cpu *cpu = netsyscall_cpu_state.lookup(&zero);

    return cpu ? pointer_number(frame_arg, &cpu->scratch) : 0;
}

static __always_inline struct netsyscall_start_set *start_set(u64 frame)
{
    u32 index =
        (u32)(((frame >> 14) * 11400714819323198485ull) >> (64 - NETSYSCALL_START_SET_BITS));

    return netsyscall_start_ns.lookup(&index);
}

/* A free way for this call (its tag claimed), or NULL: every way holds a call in flight. */
static __always_inline struct netsyscall_start *start_claim(struct netsyscall_start_set *set,
                                                            u64 frame)
{
#pragma unroll
    for (int i = 0; i < NETSYSCALL_START_WAYS; i++) {
        if (set->way[i].frame == 0 &&
            __sync_val_compare_and_swap(&set->way[i].frame, 0, frame) == 0)
            return &set->way[i];
    }
    return NULL;
}

/* This call's way (NULL: entered before the probe attached, filtered out, or not timed). */
static __always_inline struct netsyscall_start *start_find(struct netsyscall_start_set *set,
                                                           u64 frame)
{
#pragma unroll
    for (int i = 0; i < NETSYSCALL_START_WAYS; i++) {
        if (set->way[i].frame == frame)
            return &set->way[i];
    }
    return NULL;
}

/* Sends an outlier with the stacks of current, the caller still in its syscall. */
static __always_inline void send_outlier(void *ctx, u64 cgroup_id, u64 duration_ns, u32 nr)
{
    u32 zero = 0;
    struct outlier_bucket *bucket = netsyscall_outlier_rate.lookup(&zero);
    struct outlier_event event = {};
    u64 pid_tgid;

    if (!outlier_take_token(bucket, bpf_ktime_get_ns())) {
        count_outlier_drop(OUTLIER_DROP_RATE_LIMITED);
        return;
    }
    pid_tgid = bpf_get_current_pid_tgid();
    event.cgroup_id = cgroup_id;
    event.value_ns = duration_ns;
    event.tgid = pid_tgid >> 32;
    event.pid = (u32)pid_tgid;
    event.detail = nr;
    event.kernel_stack_id = netsyscall_outlier_stacks.get_stackid(ctx, 0);
    event.user_stack_id = netsyscall_outlier_stacks.get_stackid(ctx, BPF_F_USER_STACK);
    if (outlier_stack_lost(event.kernel_stack_id) || outlier_stack_lost(event.user_stack_id))
        count_outlier_drop(OUTLIER_DROP_STACK_LOST);
    if (netsyscall_outlier_events.ringbuf_output(&event, sizeof(event), 0))
        count_outlier_drop(OUTLIER_DROP_RINGBUF_FULL);
}

/* netsyscall_slots' three operations for slot_claim (include/slots.bpf.h). */
static __always_inline int slot_own(u32 *slot, const void *key)
{
    return netsyscall_slot_owner.insert(slot, (struct netsyscall_series_key *)key);
}

static __always_inline int slot_bind(const void *key, u32 *slot)
{
    return netsyscall_slots.insert((struct netsyscall_series_key *)key, slot);
}

static __always_inline u32 *slot_find(const void *key)
{
    return netsyscall_slots.lookup((struct netsyscall_series_key *)key);
}

/* A free series slot for a (cgroup, syscall) seen for the first time (-1: none left). */
static __always_inline s32 claim_slot(struct netsyscall_series_key *key)
{
    u32 zero = 0;
    u32 *hint = netsyscall_slot_hint.lookup(&zero);

    if (!hint)
        return -1;
    return slot_claim(hint, 0, NETSYSCALL_MAX_SERIES, key, slot_own, slot_bind, slot_find);
}

static __always_inline s32 series_slot(u64 cgroup_id, u32 nr)
{
    u32 zero = 0;
    struct netsyscall_cpu *cpu = netsyscall_cpu_state.lookup(&zero);
    struct netsyscall_series_cached *cached;
    struct netsyscall_series_key key = {};
    u32 *known;
    s32 slot;

    if (!cpu)
        return -1;
    cached = &cpu->cache[(cgroup_id ^ nr) & (SERIES_CACHE - 1)];
    if (cached->key.cgroup_id == cgroup_id && cached->key.nr == nr && cgroup_id)
        return cached->slot;
    key.cgroup_id = cgroup_id;
    key.nr = nr;
    known = netsyscall_slots.lookup(&key);
    slot = known ? (s32)*known : claim_slot(&key);
    if (slot < 0)
        return -1;
    cached->key = key;
    cached->slot = (u32)slot;
    return slot;
}

int on_sys_enter(struct bpf_raw_tracepoint_args *ctx)
{
    long nr = (long)ctx->args[1];
    u64 cgroup_id;
    u64 frame;
    struct netsyscall_start_set *set;
    struct netsyscall_start *in_flight;

    if (!IS_NET_SYSCALL(nr))
        return 0;
    cgroup_id = CALLER_CGROUP_ID();
    if (!cgroup_wanted(cgroup_id))
        return 0;
    frame = frame_number(ctx->args[0]);
    set = start_set(frame);
    if (!set || !frame)
        return 0;
    in_flight = start_claim(set, frame);
    if (!in_flight) {
        count_drop(DROP_THREAD_COLLISION); /* this call is not timed */
        return 0;
    }
    in_flight->cgroup_id = cgroup_id;
    in_flight->nr = (u32)nr;
    in_flight->start_ns = bpf_ktime_get_ns();
    return 0;
}

int on_sys_exit(struct bpf_raw_tracepoint_args *ctx)
{
    /* The low 32 bits of orig_ax (-1 outside a syscall: never a socket syscall number). */
    u32 nr = kread_u32((const void *)ctx->args[0], PT_REGS_SYSCALL_NR_OFF);
    long ret = (long)ctx->args[1];
    u64 frame;
    u64 start_ns;
    u64 duration_ns;
    u64 cgroup_id;
    u64 zero = 0;
    u64 *bucket_count;
    u64 *errors;
    u32 cell;
    u32 row;
    s32 slot;
    struct netsyscall_start_set *set;
    struct netsyscall_start *in_flight;
    struct netsyscall_error_key error = {};
    u64 *sum_ns;

    if (!IS_NET_SYSCALL(nr))
        return 0;
    frame = frame_number(ctx->args[0]);
    set = start_set(frame);
    if (!set || !frame)
        return 0;
    in_flight = start_find(set, frame);
    if (!in_flight)
        return 0; /* entered before the probe attached, filtered out or not timed at sys_enter */
    start_ns = in_flight->start_ns;
    nr = in_flight->nr; /* as seen at entry, where the id is an argument */
    cgroup_id = in_flight->cgroup_id;
    asm volatile("" ::: "memory"); /* read before the way is given back */
    in_flight->frame = 0;
    duration_ns = bpf_ktime_get_ns() - start_ns;
    slot = series_slot(cgroup_id, nr);
    if (slot < 0) {
        count_drop(DROP_SERIES_FULL);
        return 0;
    }
    row = (u32)slot;
    cell = row * HIST_ROW + hist_bucket_index(duration_ns);
    bucket_count = netsyscall_latency_hist.lookup(&cell);
    sum_ns = netsyscall_sum_ns.lookup(&row);
    hist_add_sample(bucket_count, sum_ns, duration_ns); /* both exist: slot is in range */
    if (ret < 0) {
        error.cgroup_id = cgroup_id;
        error.nr = nr;
        error.errno_value = (u32)-ret;
        errors = netsyscall_errors.lookup_or_try_init(&error, &zero);
        if (errors)
            __sync_fetch_and_add(errors, 1);
        else
            count_drop(DROP_ERROR_FULL);
    }
    if (outlier_above_floor(duration_ns) &&
        outlier_above_threshold(netsyscall_outlier_threshold.lookup(&cgroup_id), duration_ns))
        send_outlier(ctx, cgroup_id, duration_ns, nr);
    return 0;
}
