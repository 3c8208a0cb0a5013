/* netsyscall: latency of socket syscalls (sendto, recvfrom, sendmsg, recvmsg, recvmmsg,
 * sendmmsg) per cgroup and syscall, as exact 5 µs histograms, with errors counted per errno.
 *
 * Measures: sys_enter to sys_exit of the same thread, blocking time included (a recvfrom that
 * waits 20 ms for a datagram is a 20 ms sample: that is the latency the application sees).
 *
 * Attach points (raw tracepoints; arguments per the btf_trace_<name> typedefs):
 *   sys_enter(struct pt_regs *regs, long id)
 *   sys_exit(struct pt_regs *regs, long ret)
 * sys_exit has no syscall id argument: it is read from regs (pt_regs.orig_ax on x86_64,
 * .syscallno on aarch64; offset from BTF as PT_REGS_SYSCALL_NR_OFF), which costs one probe
 * read but lets a non-socket exit leave before any map access.
 *
 * Attribution: both tracepoints run in the calling thread's process context, so `current` is
 * the caller and bpf_get_current_cgroup_id() is its cgroup (no task_struct reads needed).
 * Syscall numbers are -D values from tailsight/probes/syscalls.py (per `uname -m`).  Known
 * gap: 32-bit compat (ia32) syscalls have their own numbering and are not told apart, so a
 * 32-bit process's syscall whose number collides (ia32 45 = brk) would be counted.
 *
 * Hot path: every syscall on the machine runs these programs.  A non-socket syscall costs a
 * compare chain on its id (enter) or one probe read plus the compare chain (exit), no map access.
 *
 * Overhead (benchmarks/bench_netsyscall_overhead.py, 5 s per load: kernel BPF stats on the
 * loaded 2-vCPU dev VM, each against an empty program on the same tracepoint in the same run;
 * the loops caused 97% / 84% of the events):
 *   getpid loop (not traced): sys_enter 47.6 vs 46.8 ns/event (+1 ns: the compare chain),
 *                             sys_exit  83.9 vs 46.7 ns/event (+37 ns: the orig_ax probe read)
 *   UDP sendto (traced):      sys_enter 165.6 vs 54.4 ns/event (+111 ns: start map, clock)
 *                             sys_exit  261.9 vs 55.0 ns/event (+207 ns: 3 lookups, 3 atomics)
 * So every syscall on the host pays ~38 ns; a traced socket call ~320 ns more in all.
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
 * Lost samples are counted (netsyscall_dropped_events): start map update failed, histogram
 * or error map full.
 *
 * Tunables (-D): NETSYSCALL_MAX_THREADS, NETSYSCALL_MAX_CELLS, NETSYSCALL_MAX_SERIES,
 * NETSYSCALL_MAX_ERRORS; NETSYSCALL_CGROUP_FILTER: record only cgroup ids in
 * netsyscall_cgroup_allow (checked at sys_enter).
 */
#include "hist.bpf.h"
#include "outlier.bpf.h"

#if !defined(PT_REGS_SYSCALL_NR_OFF) || !defined(NR_SENDTO) || !defined(NR_RECVFROM) ||       \
    !defined(NR_SENDMSG) || !defined(NR_RECVMSG) || !defined(NR_RECVMMSG) ||                   \
    !defined(NR_SENDMMSG)
#error "compile through tailsight.probes.netsyscall (syscall numbers and pt_regs offset)"
#endif

#ifndef NETSYSCALL_MAX_THREADS
#define NETSYSCALL_MAX_THREADS 16384
#endif
#ifndef NETSYSCALL_MAX_CELLS
#define NETSYSCALL_MAX_CELLS 65536
#endif
#ifndef NETSYSCALL_MAX_SERIES
#define NETSYSCALL_MAX_SERIES 8192
#endif
#ifndef NETSYSCALL_MAX_ERRORS
#define NETSYSCALL_MAX_ERRORS 4096
#endif

/* Drop reasons (index into netsyscall_dropped_events). */
#define DROP_START_UPDATE 0
#define DROP_HIST_FULL 1
#define DROP_ERROR_FULL 2
#define DROP_REASONS 3

#define IS_NET_SYSCALL(nr)                                                                      \
    ((nr) == NR_SENDTO || (nr) == NR_RECVFROM || (nr) == NR_SENDMSG || (nr) == NR_RECVMSG ||    \
     (nr) == NR_RECVMMSG || (nr) == NR_SENDMMSG)

struct netsyscall_start {
    u64 start_ns; /* 0: no call in flight */
    u32 nr;
    u32 pad;
};

struct netsyscall_hist_key {
    u64 cgroup_id;
    u32 bucket;
    u32 nr;
};

struct netsyscall_series_key {
    u64 cgroup_id;
    u32 nr;
    u32 pad; /* keys are hashed bytewise: keep the padding explicit and zero */
};

struct netsyscall_error_key {
    u64 cgroup_id;
    u32 nr;
    u32 errno_value;
};

/* pid_tgid -> call in flight.  Cleared in place rather than deleted (a matching syscall costs
 * a lookup and a store, not an LRU allocate/free); LRU evicts the entries of dead threads. */
BPF_TABLE("lru_hash", u64, struct netsyscall_start, netsyscall_start_ns, NETSYSCALL_MAX_THREADS);
BPF_HASH(netsyscall_latency_hist, struct netsyscall_hist_key, u64, NETSYSCALL_MAX_CELLS);
BPF_HASH(netsyscall_latency_totals, struct netsyscall_series_key, struct hist_totals,
         NETSYSCALL_MAX_SERIES);
BPF_HASH(netsyscall_errors, struct netsyscall_error_key, u64, NETSYSCALL_MAX_ERRORS);
BPF_PERCPU_ARRAY(netsyscall_dropped_events, u64, DROP_REASONS);
BPF_RINGBUF_OUTPUT(netsyscall_outlier_events, OUTLIER_RINGBUF_PAGES);
BPF_STACK_TRACE(netsyscall_outlier_stacks, OUTLIER_MAX_STACKS);
BPF_HASH(netsyscall_outlier_threshold, u64, u64, NETSYSCALL_MAX_SERIES);
BPF_PERCPU_ARRAY(netsyscall_outlier_rate, struct outlier_bucket, 1);
BPF_PERCPU_ARRAY(netsyscall_outlier_dropped, u64, OUTLIER_DROP_REASONS);
#ifdef NETSYSCALL_CGROUP_FILTER
BPF_HASH(netsyscall_cgroup_allow, u64, u8, NETSYSCALL_MAX_SERIES);
#endif

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

int on_sys_enter(struct bpf_raw_tracepoint_args *ctx)
{
    long nr = (long)ctx->args[1];
    struct netsyscall_start fresh = {};
    struct netsyscall_start *in_flight;
    u64 pid_tgid;

    if (!IS_NET_SYSCALL(nr))
        return 0;
#ifdef NETSYSCALL_CGROUP_FILTER
    {
        u64 cgroup_id = bpf_get_current_cgroup_id();

        if (!netsyscall_cgroup_allow.lookup(&cgroup_id))
            return 0;
    }
#endif
    pid_tgid = bpf_get_current_pid_tgid();
    fresh.start_ns = bpf_ktime_get_ns();
    fresh.nr = (u32)nr;
    in_flight = netsyscall_start_ns.lookup(&pid_tgid);
    if (in_flight) {
        in_flight->start_ns = fresh.start_ns;
        in_flight->nr = fresh.nr;
    } else if (netsyscall_start_ns.update(&pid_tgid, &fresh)) {
        count_drop(DROP_START_UPDATE);
    }
    return 0;
}

int on_sys_exit(struct bpf_raw_tracepoint_args *ctx)
{
    u32 nr = 0;
    long ret = (long)ctx->args[1];
    u64 pid_tgid;
    u64 now_ns;
    u64 duration_ns;
    u64 cgroup_id;
    u64 zero = 0;
    u64 *bucket_count;
    u64 *errors;
    struct netsyscall_start *in_flight;
    struct netsyscall_hist_key cell = {};
    struct netsyscall_series_key series = {};
    struct netsyscall_error_key error = {};
    struct hist_totals no_totals = {};
    struct hist_totals *totals;

    /* The low 32 bits of orig_ax (-1 outside a syscall: never a socket syscall number). */
    bpf_probe_read_kernel(&nr, sizeof(nr), (const char *)ctx->args[0] + PT_REGS_SYSCALL_NR_OFF);
    if (!IS_NET_SYSCALL(nr))
        return 0;
    pid_tgid = bpf_get_current_pid_tgid();
    in_flight = netsyscall_start_ns.lookup(&pid_tgid);
    if (!in_flight || in_flight->start_ns == 0)
        return 0; /* entered before we attached, or filtered out at sys_enter */
    now_ns = bpf_ktime_get_ns();
    duration_ns = now_ns > in_flight->start_ns ? now_ns - in_flight->start_ns : 0;
    nr = in_flight->nr; /* as seen at entry, where the id is an argument */
    in_flight->start_ns = 0;

    cgroup_id = bpf_get_current_cgroup_id();
    cell.cgroup_id = cgroup_id;
    cell.bucket = hist_bucket_index(duration_ns);
    cell.nr = nr;
    series.cgroup_id = cgroup_id;
    series.nr = nr;
    bucket_count = netsyscall_latency_hist.lookup_or_try_init(&cell, &zero);
    totals = netsyscall_latency_totals.lookup_or_try_init(&series, &no_totals);
    if (hist_add_sample(bucket_count, totals, duration_ns))
        count_drop(DROP_HIST_FULL);
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
