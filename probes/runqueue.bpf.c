/* runqueue: time each task waits on a CPU run queue, as exact 5 µs histograms per cgroup, and
 * who made it wait.
 *
 * Measures: from the moment a task becomes runnable (woken, newly forked, or preempted while still
 * runnable) to the moment it is switched in -- the kernel's own schedstat `run_delay`
 * (/proc/<pid>/schedstat field 2), which the kernel tests use as ground truth.
 *
 * Attach points (raw tracepoints; arguments per the btf_trace_<name> typedefs):
 *   sched_wakeup(struct task_struct *p), sched_wakeup_new(struct task_struct *p)
 *   sched_switch(bool preempt, struct task_struct *prev, struct task_struct *next,
 *                unsigned int prev_state)
 *
 * Attribution: the wait is charged to the cgroup of the task that waited (`next`, read through
 * task.bpf.h), never to `current`.  Each wait is also charged to the pair (victim = next's cgroup,
 * aggressor = prev's cgroup): prev is who held the CPU until next got it (prev is still
 * `current` at this tracepoint, so the current-task helpers are exact for it).  If prev is the idle
 * task (pid 0) the aggressor is 0 ("idle"): the CPU was idle, nobody displaced the victim.
 *
 * Stamps: a wakeup stamps only a task without one, so a task already queued keeps its earlier
 * stamp (the kernel counts run_delay from enqueue).  At a switch, a prev still TASK_RUNNING
 * (prev_state 0) was preempted and is re-queued: re-stamp; any other prev is going to sleep:
 * clear its stamp, so a stale stamp can never turn a sleep into a bogus latency.  This is the
 * kernel's own rule (sched_info_depart re-queues a task only if task_is_running()).
 *
 * Overhead (benchmarks/bench_probe_overhead.py: kernel BPF stats, pipe ping-pong on one CPU,
 * 100-220k switches/s, this loaded 2-vCPU VM): sched_switch 460-590 ns/event against 53-61 ns
 * for an empty program on the same tracepoint in the same run (8.8-9.6x).  Of the ~410 ns of own
 * work, about 110 go to next's cgroup (four dependent probe reads), 150 to recording the sample
 * (three hash lookups, five atomic adds), the rest to the stamps, clock and helpers.  That is ~6%
 * of one CPU at 140k switches/s, ~0.5% at 10k/s.  sched_wakeup adds ~170-210 ns per wakeup.
 * With outlier support (the same bench, 10 s, 154k switches/s): 471 vs 52 ns (9.0x), wakeup
 * 166 ns: unchanged, since waits under the floor never touch the outlier maps.
 *
 * Known difference to schedstat: for a wakeup onto an idle CPU, run_delay comes out near 0 while
 * this probe measures ~10-20 µs of real time on the dev VM (the idle exit).  Most likely the
 * kernel's rq clock is not updated again before the switch (wakeup_preempt requests the clock
 * skip), so run_delay ends at the enqueue's clock; the tests allow for it on wakeups from idle.
 *
 * Example (`python -m tailsight.demo`: 2 busy loops in victim, 1 in noisy, one CPU that the
 * rest of a loaded machine, cgroup "/", also wants):
 *   cgroup                  count  P50 µs  P99 µs  P99.9 µs
 *   /tailsight-test/victim    337  25,914  40,747    68,116
 *   /tailsight-test/noisy     164  26,848  40,678    40,932
 *   victim <- aggressor: /tailsight-test/victim <- /  6,872.5 ms in 335 switches,
 *                        /tailsight-test/victim <- /tailsight-test/noisy  24.0 ms in 1
 *
 * Outliers (include/outlier.bpf.h): a wait above max(OUTLIER_FLOOR_NS, the victim cgroup's
 * threshold) is sent with the *victim's* kernel and user stacks.  At the switch that ends the
 * wait the victim is not `current` (prev is) and a raw tracepoint cannot take another task's
 * stack (bpf_get_task_stack needs a BTF task pointer: tp_btf, unavailable here), so the wait is
 * parked in the victim's runqueue_start_ns entry and sent when the victim next leaves the CPU,
 * from its own context.  Its stacks then say what the delayed code was doing after the wait
 * and how it left the CPU: for a preempted busy loop, kernel
 * asm_sysvec_apic_timer_interrupt;irqentry_exit_to_user_mode;schedule;__schedule and a user
 * stack in the interpreter loop (tests/probes/test_outliers.py).  The aggressor is named by
 * runqueue_displaced_wait, not by a stack.  Costs nothing extra on the common path: the pending
 * wait shares the map value already looked up for prev.
 *
 * Lost samples are counted (runqueue_dropped_events): map full, and "untraced switch": on the dev
 * VM some switches (out of the sandbox agent's threads) never reach the tracepoint; the task they
 * switched in is noticed at its next switch-out, but when its wait ended is unknown.
 *
 * Tunables (-D): RUNQUEUE_MAX_TASKS, RUNQUEUE_MAX_CELLS, RUNQUEUE_MAX_CGROUPS, RUNQUEUE_MAX_PAIRS;
 * RUNQUEUE_CGROUP_FILTER: record only victims whose cgroup id is in runqueue_cgroup_allow.
 */
#include "hist.bpf.h"
#include "outlier.bpf.h"
#include "task.bpf.h"

#ifndef RUNQUEUE_MAX_TASKS
#define RUNQUEUE_MAX_TASKS 16384
#endif
#ifndef RUNQUEUE_MAX_CELLS
#define RUNQUEUE_MAX_CELLS 65536
#endif
#ifndef RUNQUEUE_MAX_CGROUPS
#define RUNQUEUE_MAX_CGROUPS 4096
#endif
#ifndef RUNQUEUE_MAX_PAIRS
#define RUNQUEUE_MAX_PAIRS 16384
#endif

#define TASK_RUNNING_STATE 0
#define ERRNO_EEXIST 17 /* asm-generic/errno-base.h */

/* Drop reasons (index into runqueue_dropped_events). A missing stamp is not a drop. */
#define DROP_STAMP_UPDATE 0
#define DROP_HIST_FULL 1
#define DROP_PAIR_FULL 2
#define DROP_UNTRACED_SWITCH 3 /* a wait ended in a switch the tracepoint never reported */
#define DROP_REASONS 4

struct runqueue_pair_key {
    u64 victim_cgroup_id;
    u64 aggressor_cgroup_id;
};

struct runqueue_pair_wait {
    u64 wait_ns;
    u64 count;
};

/* Per task: ktime when it became runnable (0 = not queued), and the wait of an outlier whose
 * event is sent when the task next leaves the CPU (0 = none pending). */
struct runqueue_task {
    u64 start_ns;
    u64 outlier_wait_ns;
};

/* task_struct address -> struct runqueue_task.  Keyed by address (no
 * probe read needed: it is the tracepoint argument) and cleared in place rather than deleted, so
 * a switch costs two lookups and stores instead of an LRU allocate/free; LRU evicts the entries
 * of tasks that are gone.  A reused address finds 0: a task leaves the CPU for the last time as
 * TASK_DEAD, which clears its stamp. */
BPF_TABLE("lru_hash", u64, struct runqueue_task, runqueue_start_ns, RUNQUEUE_MAX_TASKS);
BPF_HASH(runqueue_wait_hist, struct hist_key, u64, RUNQUEUE_MAX_CELLS);
BPF_HASH(runqueue_wait_totals, u64, struct hist_totals, RUNQUEUE_MAX_CGROUPS);
BPF_HASH(runqueue_displaced_wait, struct runqueue_pair_key, struct runqueue_pair_wait,
         RUNQUEUE_MAX_PAIRS);
BPF_PERCPU_ARRAY(runqueue_dropped_events, u64, DROP_REASONS);
/* The task this CPU last switched to, to notice switches that never reached the tracepoint. */
BPF_PERCPU_ARRAY(runqueue_cpu_next, u64, 1);
BPF_RINGBUF_OUTPUT(runqueue_outlier_events, OUTLIER_RINGBUF_PAGES);
BPF_STACK_TRACE(runqueue_outlier_stacks, OUTLIER_MAX_STACKS);
BPF_HASH(runqueue_outlier_threshold, u64, u64, RUNQUEUE_MAX_CGROUPS);
BPF_PERCPU_ARRAY(runqueue_outlier_rate, struct outlier_bucket, 1);
BPF_PERCPU_ARRAY(runqueue_outlier_dropped, u64, OUTLIER_DROP_REASONS);
#ifdef RUNQUEUE_CGROUP_FILTER
BPF_HASH(runqueue_cgroup_allow, u64, u8, RUNQUEUE_MAX_CGROUPS);
#endif

static __always_inline void count_drop(u32 reason)
{
    u64 *dropped = runqueue_dropped_events.lookup(&reason);

    if (dropped)
        (*dropped)++;
}

static __always_inline void count_outlier_drop(u32 reason)
{
    u64 *dropped = runqueue_outlier_dropped.lookup(&reason);

    if (dropped)
        (*dropped)++;
}

/* Sends the pending outlier of `current` (the victim, now leaving the CPU) with its stacks. */
static __always_inline void send_outlier(void *ctx, u64 wait_ns)
{
    u32 zero = 0;
    struct outlier_bucket *bucket = runqueue_outlier_rate.lookup(&zero);
    struct outlier_event event = {};
    u64 pid_tgid;

    if (!outlier_take_token(bucket, bpf_ktime_get_ns())) {
        count_outlier_drop(OUTLIER_DROP_RATE_LIMITED);
        return;
    }
    pid_tgid = bpf_get_current_pid_tgid();
    event.cgroup_id = bpf_get_current_cgroup_id();
    event.value_ns = wait_ns;
    event.tgid = pid_tgid >> 32;
    event.pid = (u32)pid_tgid;
    event.kernel_stack_id = runqueue_outlier_stacks.get_stackid(ctx, 0);
    event.user_stack_id = runqueue_outlier_stacks.get_stackid(ctx, BPF_F_USER_STACK);
    if (outlier_stack_lost(event.kernel_stack_id) || outlier_stack_lost(event.user_stack_id))
        count_outlier_drop(OUTLIER_DROP_STACK_LOST);
    if (runqueue_outlier_events.ringbuf_output(&event, sizeof(event), 0))
        count_outlier_drop(OUTLIER_DROP_RINGBUF_FULL);
}

/* Stamps `task` as runnable since now unless it already is (the kernel counts from enqueue). */
static __always_inline void stamp_woken(u64 task)
{
    struct runqueue_task fresh = {};
    struct runqueue_task *state = runqueue_start_ns.lookup(&task);
    int err;

    fresh.start_ns = bpf_ktime_get_ns();
    if (state) {
        if (state->start_ns == 0)
            state->start_ns = fresh.start_ns;
        return;
    }
    err = runqueue_start_ns.insert(&task, &fresh);
    /* -EEXIST: stamped by a concurrent wakeup on another CPU, the intended outcome. */
    if (err && err != -ERRNO_EEXIST)
        count_drop(DROP_STAMP_UPDATE);
}

int on_sched_wakeup(struct bpf_raw_tracepoint_args *ctx)
{
    stamp_woken(ctx->args[0]);
    return 0;
}

int on_sched_wakeup_new(struct bpf_raw_tracepoint_args *ctx)
{
    stamp_woken(ctx->args[0]);
    return 0;
}

static __always_inline void record_wait(u64 victim_cgroup_id, u64 aggressor_cgroup_id, u64 wait_ns)
{
    struct hist_key key = hist_key_for(victim_cgroup_id, wait_ns);
    struct hist_totals no_totals = {};
    struct runqueue_pair_key pair = {};
    struct runqueue_pair_wait no_wait = {};
    struct runqueue_pair_wait *displaced;
    u64 zero = 0;
    u64 *bucket_count = runqueue_wait_hist.lookup_or_try_init(&key, &zero);
    struct hist_totals *totals = runqueue_wait_totals.lookup_or_try_init(&victim_cgroup_id,
                                                                         &no_totals);

    if (hist_add_sample(bucket_count, totals, wait_ns))
        count_drop(DROP_HIST_FULL);

    pair.victim_cgroup_id = victim_cgroup_id;
    pair.aggressor_cgroup_id = aggressor_cgroup_id;
    displaced = runqueue_displaced_wait.lookup_or_try_init(&pair, &no_wait);
    if (!displaced) {
        count_drop(DROP_PAIR_FULL);
        return;
    }
    __sync_fetch_and_add(&displaced->wait_ns, wait_ns);
    __sync_fetch_and_add(&displaced->count, 1);
}

int on_sched_switch(struct bpf_raw_tracepoint_args *ctx)
{
    /* prev (args[1]) is still `current` here: the tracepoint fires before context_switch(), so
     * the current-task helpers name prev without reading task_struct. */
    u64 prev = ctx->args[1];
    u64 next = ctx->args[2];
    u32 prev_state = (u32)ctx->args[3];
    u32 prev_pid = (u32)bpf_get_current_pid_tgid();
    u64 now_ns = bpf_ktime_get_ns();
    struct runqueue_task *state;
    struct runqueue_task fresh = {};
    u64 wait_ns;
    u64 victim_cgroup_id;
    u32 zero = 0;
    u64 *cpu_next = runqueue_cpu_next.lookup(&zero);

    if (prev_pid != 0) /* the idle task is never queued */
        state = runqueue_start_ns.lookup(&prev);
    else
        state = 0;
    if (cpu_next) {
        /* prev got this CPU in a switch we never saw (some do not reach the tracepoint, seen
         * on the dev VM): the end of its wait is unknown, so the sample is lost; count it. */
        if (*cpu_next && *cpu_next != prev && state && state->start_ns)
            count_drop(DROP_UNTRACED_SWITCH);
        *cpu_next = next;
    }
    if (state && state->outlier_wait_ns) {
        /* prev is the victim of an earlier outlier wait, and `current`: its stacks now. */
        send_outlier(ctx, state->outlier_wait_ns);
        state->outlier_wait_ns = 0;
    }
    if (prev_pid != 0) {
        if (prev_state == TASK_RUNNING_STATE) {
            fresh.start_ns = now_ns;
            if (state)
                state->start_ns = now_ns;
            else if (runqueue_start_ns.update(&prev, &fresh))
                count_drop(DROP_STAMP_UPDATE);
        } else if (state) {
            state->start_ns = 0;
        }
    }

    state = runqueue_start_ns.lookup(&next);
    if (!state || state->start_ns == 0)
        return 0; /* not stamped: the idle task, or queued before we attached */
    wait_ns = now_ns > state->start_ns ? now_ns - state->start_ns : 0;
    state->start_ns = 0;

    victim_cgroup_id = task_cgroup_id((const void *)next);
#ifdef RUNQUEUE_CGROUP_FILTER
    if (!runqueue_cgroup_allow.lookup(&victim_cgroup_id))
        return 0;
#endif
    record_wait(victim_cgroup_id, prev_pid == 0 ? 0 : bpf_get_current_cgroup_id(), wait_ns);
    if (outlier_above_floor(wait_ns) &&
        outlier_above_threshold(runqueue_outlier_threshold.lookup(&victim_cgroup_id), wait_ns))
        state->outlier_wait_ns = wait_ns; /* sent when next leaves the CPU, from its context */
    return 0;
}
