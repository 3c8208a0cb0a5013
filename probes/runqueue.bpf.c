/* runqueue: time each task waits on a CPU run queue, as exact 5 µs histograms per cgroup, and
 * who made it wait.
 *
 * Measures: the kernel's own run-queue wait, the one schedstat `run_delay` sums
 * (/proc/<pid>/schedstat field 2, the kernel tests' ground truth).  At sched_switch, right
 * before sched_info_arrive(next) runs under the same rq lock and clock, the wait that ends is
 * rq->clock - next->sched_info.last_queued (0: next was not queued, e.g. the idle task).  No
 * clock read, no per-task map and no wakeup program: the kernel keeps the enqueue stamp
 * (CONFIG_SCHED_INFO) and the rq (next->se.cfs_rq->rq, CONFIG_FAIR_GROUP_SCHED); offsets from
 * BTF.  Like the kernel, a wakeup onto an idle CPU counts from the rq clock of the enqueue, so
 * the idle exit is not part of the wait.  A queued task moved to another CPU (load balancing,
 * an affinity change) has its wait so far added to run_delay at the dequeue and a new
 * last_queued on the new CPU: that part is the rise of run_delay since the task's last
 * switch-in this probe saw, with no arrival in between (pcount unchanged), kept per task in a
 * tid-indexed array tagged with the tid (RUNQUEUE_MAX_THREADS; a colliding or unseen tid, or
 * an arrival the tracepoint missed, leaves that part out: the wait counts from the new CPU's
 * enqueue only).  The whole wait is then
 * one sample, charged to the task that held the CPU it finally got.
 *
 * Attach point (tp_btf where the kernel takes it, else a raw tracepoint; same source, reads via
 * kread.bpf.h): sched_switch(bool preempt, struct task_struct *prev, struct task_struct *next,
 *                            unsigned int prev_state)
 *
 * Attribution: the wait is charged to the cgroup of the task that waited (`next`), never to
 * `current`, and to the pair (victim = next's cgroup, aggressor = prev's cgroup): prev held the
 * CPU until next got it.  prev's slot is remembered from its own switch-in on this CPU, so it is
 * usually not read again.  If prev is the idle task (pid 0) the aggressor is 0 ("idle").
 *
 * Storage: cgroup id -> slot (a 4-entry per-CPU cache in front of a hash); histogram rows and the
 * victim x aggressor matrix are arrays indexed by slot (atomic adds, mmap-ed by user space), so
 * a sample costs no hash lookup.  The histogram's exact sum is its victim's row of the matrix.
 *
 * Overhead (benchmarks/bench_probe_overhead.py: kernel BPF stats, pipe ping-pong on one CPU,
 * ~110-145k switches/s, the loaded 2-vCPU dev VM, against an empty program on the same
 * tracepoint in the same mode and run): tp_btf 110-125 vs 72-74 ns (1.54-1.69x, +39-52 ns);
 * raw_tp ~645 vs 75 ns (eight probe reads).  The moved-wait part (run_delay, pcount and the tid
 * array) adds ~8 ns: 141.1 vs 132.7 ns on one machine, one run each (empty 53.3 and 52.1 ns).  Before (clock stamps in an LRU hash, hash-map
 * histograms, wakeup programs): 731 vs 75 ns (9.8x) plus 268 ns per sched_wakeup.
 *
 * Example (`python -m tailsight.cli.demo`: 2 busy loops in victim, 1 in noisy, one CPU that the
 * rest of a loaded machine, cgroup "/", also wants):
 *   cgroup                  count  P50 µs  P99 µs  P99.9 µs
 *   /tailsight-test/victim    337  25,914  40,747    68,116
 *   /tailsight-test/noisy     164  26,848  40,678    40,932
 *   victim <- aggressor: /tailsight-test/victim <- /  6,872.5 ms in 335 switches,
 *                        /tailsight-test/victim <- /tailsight-test/noisy  24.0 ms in 1
 *
 * Outliers (include/outlier.bpf.h): a wait above max(OUTLIER_FLOOR_NS, the victim cgroup's
 * threshold) is sent with the *victim's* kernel and user stacks.  At the switch that ends the
 * wait the victim is not `current` (prev is), so the wait is parked in this CPU's state and sent
 * at the next switch on this CPU, when the victim leaves it, from its own context.  Its stacks
 * then say what the delayed code was doing after the wait and how it left the CPU: for a
 * preempted busy loop, kernel asm_sysvec_apic_timer_interrupt;irqentry_exit_to_user_mode;
 * schedule;__schedule and a user stack in the interpreter loop (tests/probes/test_outliers.py).
 *
 * Lost samples are counted (runqueue_dropped_events): no cgroup slot left, and "untraced
 * switch": on the dev VM some switches (out of the sandbox agent's threads) never reach the
 * tracepoint; the wait such a switch ended is not seen.
 *
 * Tunables (-D): RUNQUEUE_MAX_SLOTS (set by runqueue.py), RUNQUEUE_SLOT_CACHE.  Cgroup filter
 * (at run time): with runqueue_config[CONFIG_FILTER_ON] set, only victims whose cgroup id is in
 * runqueue_cgroup_allow are recorded.
 */
#include "hist.bpf.h"
#include "outlier.bpf.h"
#include "slots.bpf.h"
#include "task.bpf.h"

#if !defined(SCHED_INFO_LAST_QUEUED_OFF) || !defined(SCHED_INFO_RUN_DELAY_OFF) ||              \
    !defined(SCHED_INFO_PCOUNT_OFF) || !defined(TASK_SE_CFS_RQ_OFF) || !defined(CFS_RQ_RQ_OFF) || \
    !defined(RQ_CLOCK_OFF) || !defined(RUNQUEUE_MAX_SLOTS)
#error "compile through tailsight.probes.runqueue (sched_info/rq offsets and slot count)"
#endif
#ifndef RUNQUEUE_MAX_THREADS
#define RUNQUEUE_MAX_THREADS 65536 /* tasks whose moved waits are kept apart, a power of two */
#endif
#ifndef RUNQUEUE_SLOT_CACHE
#define RUNQUEUE_SLOT_CACHE 4 /* per-CPU cgroup id -> slot entries, a power of two */
#endif
#define SLOT_UNKNOWN 0xffffffffU
#define HIST_ROW (HIST_NUM_BUCKETS + 1) /* finite buckets, then overflow */

/* Drop reasons (index into runqueue_dropped_events). */
#define DROP_SLOTS_FULL 0      /* a cgroup beyond RUNQUEUE_MAX_SLOTS: its waits are lost */
#define DROP_UNTRACED_SWITCH 1 /* a wait ended in a switch the tracepoint never reported */
#define DROP_REASONS 2

struct runqueue_pair_wait {
    u64 wait_ns;
    u64 count;
};

struct runqueue_slot_cached {
    u64 cgroup_id;
    u32 slot;
    u32 pad;
};

/* What one CPU remembers between its switches (a per-CPU slot: no atomics). */
struct runqueue_cpu {
    u64 next_task;       /* the task this CPU last switched to */
    u32 next_slot;       /* its cgroup's slot, if known (SLOT_UNKNOWN): the next aggressor */
    u32 pad;
    u64 outlier_task;    /* switched in after an outlier wait: its event is sent when it leaves */
    u64 outlier_wait_ns;
    struct runqueue_slot_cached cache[RUNQUEUE_SLOT_CACHE];
};

/* The kernel's run_delay of a task right after its last switch-in that this probe saw, and the
 * pcount it then reached: by tid % RUNQUEUE_MAX_THREADS, tagged with the tid. */
struct runqueue_task_seen {
    u64 run_delay_ns;
    u32 tid;
    u32 pcount;
};

#define CONFIG_FILTER_ON 0 /* runqueue_config slots */
#define CONFIG_SLOTS 1

/* cgroup id -> slot (the row of the arrays below), and the claim of each slot.  Slot 0 is cgroup
 * id 0, the idle "aggressor".  Slots are never given back: a cgroup keeps its slot for the life
 * of the probe, so the per-CPU caches can never go stale. */
BPF_HASH(runqueue_slots, u64, u32, RUNQUEUE_MAX_SLOTS);
BPF_HASH(runqueue_slot_owner, u32, u64, RUNQUEUE_MAX_SLOTS);
BPF_ARRAY(runqueue_slot_hint, u32, 1);
/* Row per victim slot: bucket counts (shared, atomic adds; user space maps it read-only). */
BPF_F_TABLE("array", u32, u64, runqueue_wait_hist, RUNQUEUE_MAX_SLOTS * HIST_ROW, BPF_F_MMAPABLE);
/* victim slot * RUNQUEUE_MAX_SLOTS + aggressor slot -> displaced wait.  Every wait is charged
 * to one pair, so a victim's row also gives its histogram's exact sum: no separate totals. */
BPF_F_TABLE("array", u32, struct runqueue_pair_wait, runqueue_displaced_wait,
            RUNQUEUE_MAX_SLOTS * RUNQUEUE_MAX_SLOTS, BPF_F_MMAPABLE);
BPF_PERCPU_ARRAY(runqueue_cpu_state, struct runqueue_cpu, 1);
BPF_ARRAY(runqueue_task_seen, struct runqueue_task_seen, RUNQUEUE_MAX_THREADS);
BPF_PERCPU_ARRAY(runqueue_dropped_events, u64, DROP_REASONS);
BPF_RINGBUF_OUTPUT(runqueue_outlier_events, OUTLIER_RINGBUF_PAGES);
BPF_STACK_TRACE(runqueue_outlier_stacks, OUTLIER_MAX_STACKS);
BPF_HASH(runqueue_outlier_threshold, u64, u64, RUNQUEUE_MAX_SLOTS);
BPF_PERCPU_ARRAY(runqueue_outlier_rate, struct outlier_bucket, 1);
BPF_PERCPU_ARRAY(runqueue_outlier_dropped, u64, OUTLIER_DROP_REASONS);
/* The cgroup filter, set by user space at any time (probes/bccprobe.py): slot CONFIG_FILTER_ON
 * of runqueue_config says whether it is on, runqueue_cgroup_allow holds the ids it lets through. */
BPF_ARRAY(runqueue_config, u32, CONFIG_SLOTS);
BPF_HASH(runqueue_cgroup_allow, u64, u8, RUNQUEUE_MAX_SLOTS);

/* False if the cgroup filter is on and this cgroup is not in it. */
static __always_inline bool cgroup_wanted(u64 cgroup_id)
{
    u32 slot = CONFIG_FILTER_ON;
    u32 *on = runqueue_config.lookup(&slot);

    return !on || !*on || runqueue_cgroup_allow.lookup(&cgroup_id);
}

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

/* runqueue_slots' three operations for slot_claim (include/slots.bpf.h). */
static __always_inline int slot_own(u32 *slot, const void *cgroup_id)
{
    return runqueue_slot_owner.insert(slot, (u64 *)cgroup_id);
}

static __always_inline int slot_bind(const void *cgroup_id, u32 *slot)
{
    return runqueue_slots.insert((u64 *)cgroup_id, slot);
}

static __always_inline u32 *slot_find(const void *cgroup_id)
{
    return runqueue_slots.lookup((u64 *)cgroup_id);
}

/* A free slot (from 1: slot 0 is the idle aggressor) for a cgroup seen for the first time. */
static __always_inline s32 claim_slot(u64 cgroup_id)
{
    u32 zero = 0;
    u32 *hint = runqueue_slot_hint.lookup(&zero);

    if (!hint)
        return -1;
    return slot_claim(hint, 1, RUNQUEUE_MAX_SLOTS, &cgroup_id, slot_own, slot_bind, slot_find);
}

/* The slot of a cgroup: this CPU's small cache, then the hash, then a new claim. */
static __always_inline s32 slot_of(struct runqueue_cpu *cpu, u64 cgroup_id)
{
    struct runqueue_slot_cached *cached;
    u32 *known;
    s32 slot;

    if (cgroup_id == 0)
        return 0;
    cached = &cpu->cache[cgroup_id & (RUNQUEUE_SLOT_CACHE - 1)];
    if (cached->cgroup_id == cgroup_id)
        return cached->slot;
    known = runqueue_slots.lookup(&cgroup_id);
    slot = known ? (s32)*known : claim_slot(cgroup_id);
    if (slot < 0)
        return -1;
    cached->cgroup_id = cgroup_id;
    cached->slot = (u32)slot;
    return slot;
}

/* The part of next's wait spent queued on other CPUs before it was moved here (0 if unknown),
 * and next's run_delay and pcount as sched_info_arrive is about to leave them (`arrival_ns` is
 * the delta it adds). */
static __always_inline u64 moved_wait(const void *next, u64 arrival_ns)
{
    u64 run_delay_ns = kread_u64(next, SCHED_INFO_RUN_DELAY_OFF);
    u32 pcount = (u32)kread_u64(next, SCHED_INFO_PCOUNT_OFF);
    u32 tid = task_pid(next);
    u32 index = tid & (RUNQUEUE_MAX_THREADS - 1);
    struct runqueue_task_seen *seen = runqueue_task_seen.lookup(&index);
    u64 moved_ns = 0;

    if (!seen)
        return 0; /* index < RUNQUEUE_MAX_THREADS: never */
    if (seen->tid == tid && seen->pcount == pcount && run_delay_ns > seen->run_delay_ns)
        moved_ns = run_delay_ns - seen->run_delay_ns;
    seen->run_delay_ns = run_delay_ns + arrival_ns;
    seen->tid = tid;
    seen->pcount = pcount + 1;
    return moved_ns;
}

static __always_inline void record_wait(u32 victim, u32 aggressor, u64 wait_ns)
{
    u32 cell = victim * HIST_ROW + hist_bucket_index(wait_ns);
    u32 pair_index = victim * RUNQUEUE_MAX_SLOTS + aggressor;
    u64 *bucket_count = runqueue_wait_hist.lookup(&cell);
    struct runqueue_pair_wait *pair = runqueue_displaced_wait.lookup(&pair_index);

    if (!bucket_count || !pair)
        return; /* slots are < RUNQUEUE_MAX_SLOTS: never */
    __sync_fetch_and_add(bucket_count, 1);
    __sync_fetch_and_add(&pair->wait_ns, wait_ns);
    __sync_fetch_and_add(&pair->count, 1);
}

int on_sched_switch(struct bpf_raw_tracepoint_args *ctx)
{
    /* prev (args[1]) is still `current` here: the tracepoint fires before context_switch(). */
    const void *prev = (const void *)ctx->args[1];
    const void *next = (const void *)ctx->args[2];
    u32 zero = 0;
    struct runqueue_cpu *cpu = runqueue_cpu_state.lookup(&zero);
    u64 queued_ns;
    u64 clock_ns;
    u64 wait_ns;
    u64 victim_cgroup_id;
    u64 aggressor_cgroup_id = 0;
    s32 victim;
    s32 aggressor = -1;

    if (!cpu)
        return 0;
    /* prev got this CPU in a switch this program never saw (some do not reach the tracepoint,
     * seen on the dev VM): whatever wait that switch ended is lost; count it. */
    if (cpu->next_task == (u64)prev) {
        if (cpu->next_slot != SLOT_UNKNOWN)
            aggressor = (s32)cpu->next_slot; /* prev's slot, found when it was switched in */
    } else if (cpu->next_task) {
        count_drop(DROP_UNTRACED_SWITCH);
    }
    cpu->next_task = (u64)next;
    cpu->next_slot = SLOT_UNKNOWN;
    if (cpu->outlier_task) {
        /* The victim of the last outlier wait on this CPU, leaving it: `current`, stacks now. */
        if (cpu->outlier_task == (u64)prev)
            send_outlier(ctx, cpu->outlier_wait_ns);
        cpu->outlier_task = 0;
    }

    /* The kernel's own wait: sched_info_arrive(next), which runs right after this tracepoint
     * under the same rq lock and clock, adds rq->clock - last_queued to run_delay.  0: not
     * queued (the idle task) -- nothing to record. */
    queued_ns = kread_u64(next, SCHED_INFO_LAST_QUEUED_OFF);
    if (queued_ns == 0)
        return 0;
    clock_ns = kread_u64(kread_ptr(kread_ptr(next, TASK_SE_CFS_RQ_OFF), CFS_RQ_RQ_OFF),
                         RQ_CLOCK_OFF);
    if (clock_ns == 0)
        return 0; /* a read failed: no clock, no sample */
    wait_ns = clock_ns > queued_ns ? clock_ns - queued_ns : 0;
    wait_ns += moved_wait(next, wait_ns);

    victim_cgroup_id = task_cgroup_id(next);
    if (!cgroup_wanted(victim_cgroup_id))
        return 0;
    victim = slot_of(cpu, victim_cgroup_id);
    if (victim < 0) {
        count_drop(DROP_SLOTS_FULL);
        return 0;
    }
    cpu->next_slot = (u32)victim;
    if (aggressor < 0) {
        /* prev is the idle task (pid 0): the CPU was idle, nobody displaced next (slot 0). */
#ifdef TAILSIGHT_TP_BTF
        if (task_pid(prev) != 0)
            aggressor_cgroup_id = task_cgroup_id(prev);
#else
        if ((u32)bpf_get_current_pid_tgid() != 0)
            aggressor_cgroup_id = bpf_get_current_cgroup_id();
#endif
        aggressor = slot_of(cpu, aggressor_cgroup_id);
        if (aggressor < 0) {
            count_drop(DROP_SLOTS_FULL);
            return 0;
        }
    }
    record_wait((u32)victim, (u32)aggressor, wait_ns);
    if (outlier_above_floor(wait_ns) &&
        outlier_above_threshold(runqueue_outlier_threshold.lookup(&victim_cgroup_id), wait_ns)) {
        cpu->outlier_task = (u64)next; /* sent when next leaves the CPU, from its context */
        cpu->outlier_wait_ns = wait_ns;
    }
    return 0;
}
