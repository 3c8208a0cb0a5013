/* migration: how often tasks of each cgroup are moved between CPUs and between NUMA nodes, and
 * what NUMA balancing does to them.
 *
 * Counters (names as migration.py exports them), per cgroup of the MIGRATED task:
 *   task_migrations{cgroup}             CPU changes (source CPU != destination CPU): exactly the
 *                                       kernel's se.nr_migrations (/proc/<pid>/sched), the tests'
 *                                       ground truth
 *   task_migrations_cross_node{cgroup}  those whose two CPUs are on different NUMA nodes
 *                                       (CPU -> node map from sysfs, loaded into
 *                                       migration_cpu_node by migration.py)
 *   numa_task_moves{cgroup}             NUMA balancing moved the task to a better node
 *   numa_task_swaps{cgroup}             NUMA balancing swapped two tasks (each task's cgroup
 *                                       counts one)
 *   numa_task_sticks{cgroup}            NUMA balancing wanted to move/swap the task but could not
 * (plus host-wide page migration counters from /proc/vmstat, read in user space only).
 *
 * Attach points (tp_btf where the kernel takes it, else raw tracepoints; reads via kread.bpf.h):
 *   sched_migrate_task(struct task_struct *p, int dest_cpu)
 *   sched_move_numa(struct task_struct *tsk, int src_cpu, int dst_cpu)
 *   sched_swap_numa(struct task_struct *src_tsk, int src_cpu, struct task_struct *dst_tsk,
 *                   int dst_cpu)
 *   sched_stick_numa(same arguments as sched_swap_numa; dst_tsk may be NULL)
 *
 * Attribution: to task_cgroup_id(p) (include/task.bpf.h), the task being moved; `current` is
 * usually someone else (the waker, the load balancer, a stopper thread) and is never used.
 * The source CPU is the task's own CPU field (thread_info.cpu or task_struct.cpu, from BTF as
 * TASK_CPU_OFF): set_task_cpu() fires the tracepoint before it updates the field, and fires it
 * even when the CPU does not change, which the kernel does not count as a migration; nor does
 * this probe.
 *
 * Overhead (benchmarks/bench_probe_overhead.py: affinity flips, kernel BPF stats against an
 * empty tp_btf program on the same tracepoint, 10 rounds alternated, measured on this 2-vCPU
 * VM): 188 vs 94 ns per sched_migrate_task (2.06x).  Migrations are rare next to context
 * switches (hundreds to a few thousand per second per host), so the cost is negligible.  Where
 * the time goes (by removing parts): the task's fields and cgroup ~60 ns, the slot lookup
 * ~30 ns, the counter row ~45 ns.  Designs measured against this one, same benchmark: a hash
 * lookup-or-init per count 250-260 vs 69-75 ns (3.4-3.8x); one counter row shared by all CPUs
 * 233-288 vs 42-54 ns (5.0-6.2x) where a row per CPU gives 176-195 vs 48-53 ns (3.7x); a config
 * array of its own and the node map read at every event 227 vs 90 ns (2.45x).  The program's
 * instructions are all inlined (bpftool prog dump xlated): what is left is the cache lines it
 * touches (task, this CPU's config and cache, the counter row), ~30 ns each here.
 *
 * Example (tests/probes/test_migration.py: a task flipping its affinity between CPU 0 and 1
 * 23 times, one NUMA node):
 *   task_migrations{cgroup=/mover} 23 (= se.nr_migrations delta)
 *   task_migrations_cross_node{cgroup=/mover} 0 (23 with a synthetic map putting CPU 1 on node 1)
 *
 * Lost events are counted in migration_dropped_events (DROP_* below).
 *
 * Storage: cgroup id -> slot (an 8-entry per-CPU cache in front of a hash, include/slots.bpf.h;
 * the cache shares its per-CPU value with the config words), then one 64-byte row of counters
 * per CPU and slot in an array (mmap-ed by user space, which sums the CPUs' rows).
 *
 * Tunables (-D): MIGRATION_MAX_CPUS (size of the CPU -> node map), MIGRATION_MAX_SLOTS (cgroups
 * told apart) and MIGRATION_NR_CPUS (counter rows per slot), the last two set by migration.py.
 */
#include "slots.bpf.h"
#include "task.bpf.h"

#ifndef TASK_CPU_OFF
#error "TASK_CPU_OFF undefined: migration.py resolves it from BTF (offsets.TASK_CPU_CANDIDATES)"
#endif
#ifndef MIGRATION_MAX_CPUS
#define MIGRATION_MAX_CPUS 8192
#endif
#ifndef MIGRATION_MAX_SLOTS
#define MIGRATION_MAX_SLOTS 1024
#endif
#ifndef MIGRATION_NR_CPUS
#define MIGRATION_NR_CPUS 1 /* CPU ids the kernel may use (possible CPUs); set by migration.py */
#endif
#define SLOT_CACHE 8 /* per-CPU cgroup id -> slot entries, a power of two */
#define KINDS_ROW 8  /* counters per slot: five kinds, padded to one 64-byte cache line */

/* Counter kinds (index into migration.py's KINDS). */
#define KIND_MIGRATION 0
#define KIND_CROSS_NODE 1
#define KIND_NUMA_MOVE 2
#define KIND_NUMA_SWAP 3
#define KIND_NUMA_STICK 4

/* Drop reasons (index into migration_dropped_events). */
#define DROP_COUNTER_FULL 0     /* a cgroup beyond MIGRATION_MAX_SLOTS: its events are lost */
#define DROP_CPU_OUT_OF_RANGE 1 /* a CPU beyond the node map: node unknown, cross-node skipped
                                 * (the map is read only on hosts with more than one node) */
#define DROP_REASONS 2

/* migration_config words, written by user space into every CPU's copy. */
#define CONFIG_FILTER_ON 0
#define CONFIG_SELFCHECK_TID 1
#define CONFIG_CROSS_NODE 2 /* the CPU -> node map has more than one node */
#define CONFIG_SLOTS 4      /* three used, padded to 16 bytes */

/* The last migration of the self-check thread, as read through our offsets. */
struct migration_selfcheck {
    u64 hits;
    u64 cgroup_id;
    u32 src_cpu;
    u32 dest_cpu;
};

/* slot_plus_one is the slot + 1: user space empties the caches with zeros while programs on
 * other CPUs may read them (bccprobe.set_config), and an entry read half emptied then has a 0
 * in one field or the other, a miss either way, never another cgroup's slot. */
struct migration_slot_cached {
    u64 cgroup_id;
    u32 slot_plus_one;
    u32 pad;
};

/* Per CPU: the config words, then the slot cache.  Every event reads both, so they share a
 * value: one cache line fewer per event than a config array of its own (~30 ns of ~220,
 * measured on this 2-vCPU VM; skipping the node map on one-node hosts saves as much again).
 * User space writes the words into each CPU's copy and empties the caches when it does
 * (bccprobe.set_config). */
struct migration_cpu {
    u32 config[CONFIG_SLOTS];
    struct migration_slot_cached cache[SLOT_CACHE];
};

/* cgroup id -> slot and the claim of each slot (include/slots.bpf.h). */
BPF_HASH(migration_slots, u64, u32, MIGRATION_MAX_SLOTS);
BPF_HASH(migration_slot_owner, u32, u64, MIGRATION_MAX_SLOTS);
BPF_ARRAY(migration_slot_hint, u32, 1);
BPF_PERCPU_ARRAY(migration_config, struct migration_cpu, 1);
/* (cpu * MIGRATION_MAX_SLOTS + slot) * KINDS_ROW + kind -> count: one row per CPU and slot,
 * summed over CPUs by user space (it maps the array).  A task's migrations are counted on
 * alternating CPUs, and one shared row would move its cache line between them at every event
 * (~120 ns of ~200 ns added, measured on this 2-vCPU VM; a plain add instead of the atomic one
 * saves none). */
BPF_F_TABLE("array", u32, u64, migration_counts,
            MIGRATION_NR_CPUS * MIGRATION_MAX_SLOTS * KINDS_ROW, BPF_F_MMAPABLE);
BPF_ARRAY(migration_cpu_node, u32, MIGRATION_MAX_CPUS);
BPF_HASH(migration_cgroup_allow, u64, u8, 4096);
BPF_ARRAY(migration_selfcheck_record, struct migration_selfcheck, 1);
BPF_PERCPU_ARRAY(migration_dropped_events, u64, DROP_REASONS);

static __always_inline void count_drop(u32 reason)
{
    u64 *dropped = migration_dropped_events.lookup(&reason);

    if (dropped)
        (*dropped)++;
}

/* This CPU's config words and slot cache (NULL only if the verifier's bounds fail). */
static __always_inline struct migration_cpu *this_cpu(void)
{
    u32 zero = 0;

    return migration_config.lookup(&zero);
}

/* migration_slots' three operations for slot_claim (include/slots.bpf.h). */
static __always_inline int slot_own(u32 *slot, const void *cgroup_id)
{
    return migration_slot_owner.insert(slot, (u64 *)cgroup_id);
}

static __always_inline int slot_bind(const void *cgroup_id, u32 *slot)
{
    return migration_slots.insert((u64 *)cgroup_id, slot);
}

static __always_inline u32 *slot_find(const void *cgroup_id)
{
    return migration_slots.lookup((u64 *)cgroup_id);
}

/* The counter row of a cgroup: this CPU's small cache, then the hash, then a new claim. */
static __always_inline s32 slot_of(struct migration_cpu *cpu, u64 cgroup_id)
{
    u32 zero = 0;
    struct migration_slot_cached *cached;
    u32 *hint;
    u32 *known;
    s32 slot;

    cached = &cpu->cache[cgroup_id & (SLOT_CACHE - 1)];
    if (cached->cgroup_id == cgroup_id && cgroup_id && cached->slot_plus_one)
        return (s32)(cached->slot_plus_one - 1);
    known = migration_slots.lookup(&cgroup_id);
    if (known) {
        slot = (s32)*known;
    } else {
        hint = migration_slot_hint.lookup(&zero);
        if (!hint)
            return -1;
        slot = slot_claim(hint, 0, MIGRATION_MAX_SLOTS, &cgroup_id, slot_own, slot_bind,
                          slot_find);
        if (slot < 0)
            return -1;
    }
    cached->cgroup_id = cgroup_id;
    cached->slot_plus_one = (u32)slot + 1;
    return slot;
}

/* Adds one to (cgroup, kind) unless a cgroup filter is on and excludes the cgroup. */
static __always_inline void count(struct migration_cpu *cpu, u64 cgroup_id, u32 kind)
{
    s32 slot;
    u32 cell;
    u64 *value;

    if (cpu->config[CONFIG_FILTER_ON] && !migration_cgroup_allow.lookup(&cgroup_id))
        return;
    slot = slot_of(cpu, cgroup_id);
    if (slot < 0) {
        count_drop(DROP_COUNTER_FULL);
        return;
    }
    cell = (bpf_get_smp_processor_id() * MIGRATION_MAX_SLOTS + (u32)slot) * KINDS_ROW + kind;
    value = migration_counts.lookup(&cell);
    if (value) /* atomic still: a program preempted on this CPU may be run again meanwhile */
        __sync_fetch_and_add(value, 1);
}

/* The CPU the task is on (before set_task_cpu updates it). */
static __always_inline s64 task_cpu(const void *task)
{
    return kread_u32(task, TASK_CPU_OFF);
}

int on_sched_migrate_task(struct bpf_raw_tracepoint_args *ctx)
{
    const void *task = (const void *)ctx->args[0];
    u32 dest_cpu = (u32)ctx->args[1];
    s64 src_cpu = task_cpu(task);
    struct migration_cpu *cpu = this_cpu();
    u64 cgroup_id;
    u32 src_key;
    u32 *src_node;
    u32 *dest_node;
    u32 check_tid;
    u32 zero = 0;

    if (!cpu)
        return 0;
    if (src_cpu < 0 || (u32)src_cpu == dest_cpu)
        return 0; /* not a migration: the kernel leaves nr_migrations alone too */
    cgroup_id = task_cgroup_id(task);
    check_tid = cpu->config[CONFIG_SELFCHECK_TID];
    if (check_tid && task_pid(task) == check_tid) {
        struct migration_selfcheck *seen = migration_selfcheck_record.lookup(&zero);

        if (seen) {
            seen->cgroup_id = cgroup_id;
            seen->src_cpu = (u32)src_cpu;
            seen->dest_cpu = dest_cpu;
            __sync_fetch_and_add(&seen->hits, 1);
        }
    }
    count(cpu, cgroup_id, KIND_MIGRATION);
    if (!cpu->config[CONFIG_CROSS_NODE])
        return 0; /* one node: no move crosses nodes, and the map need not be read */
    src_key = (u32)src_cpu;
    src_node = migration_cpu_node.lookup(&src_key);
    dest_node = migration_cpu_node.lookup(&dest_cpu);
    if (!src_node || !dest_node) {
        count_drop(DROP_CPU_OUT_OF_RANGE);
        return 0;
    }
    if (*src_node != *dest_node)
        count(cpu, cgroup_id, KIND_CROSS_NODE);
    return 0;
}

int on_sched_move_numa(struct bpf_raw_tracepoint_args *ctx)
{
    struct migration_cpu *cpu = this_cpu();

    if (cpu)
        count(cpu, task_cgroup_id((const void *)ctx->args[0]), KIND_NUMA_MOVE);
    return 0;
}

int on_sched_swap_numa(struct bpf_raw_tracepoint_args *ctx)
{
    struct migration_cpu *cpu = this_cpu();

    if (!cpu)
        return 0;
    count(cpu, task_cgroup_id((const void *)ctx->args[0]), KIND_NUMA_SWAP);
    if (ctx->args[2])
        count(cpu, task_cgroup_id((const void *)ctx->args[2]), KIND_NUMA_SWAP);
    return 0;
}

int on_sched_stick_numa(struct bpf_raw_tracepoint_args *ctx)
{
    struct migration_cpu *cpu = this_cpu();

    if (cpu)
        count(cpu, task_cgroup_id((const void *)ctx->args[0]), KIND_NUMA_STICK);
    return 0;
}
