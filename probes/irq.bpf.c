/* irq: time the CPUs spend in softirqs and hardirq handlers, as 5 µs histograms of each run per
 * CPU and vector, and the time charged to the cgroup of the task each run interrupted.
 *
 * Histograms (irq.py: kind=softirq|hardirq, cpu, vector): one sample per run, entry to exit,
 * less the hardirq handlers that ran inside a softirq (counted as theirs, not twice).
 * Counters, per CPU: irq_charged_ns{cgroup, cpu, kind, vector} and irq_charged_runs{...}: the
 * cgroup of `current` at the exit, the task the CPU was taken from (a softirq run by ksoftirqd
 * is ksoftirqd's own, in the root cgroup); the idle task (pid 0) is cgroup 0, "idle".  Without
 * CONFIG_IRQ_TIME_ACCOUNTING the kernel adds this time to the interrupted task's runtime.
 *
 * Attach points (tp_btf where the kernel takes it, else raw tracepoints; all arguments scalars):
 *   softirq_entry(unsigned int vec_nr), softirq_exit(unsigned int vec_nr)
 *   irq_handler_entry(int irq, struct irqaction *action),
 *   irq_handler_exit(int irq, struct irqaction *action, int ret)
 * Softirqs do not nest on a CPU and handlers run with interrupts off, so one start stamp per
 * kind per CPU suffices.  Entry: a per-CPU lookup and a clock read.  Exit: a clock read, the
 * current task's pid and cgroup (two helpers), a per-CPU series cache, array increments.
 *
 * Vectors: a softirq's number (irq.py names it from the kernel's enum: HI, TIMER, NET_TX,
 * NET_RX...), a hardirq's irq number with IRQ_VECTOR_FLAG.  Hardirq histogram rows are claimed
 * per irq number (IRQ_HARDIRQ_ROWS of them; an irq number above IRQ_MAX_IRQ or beyond the rows
 * loses its histogram sample, counted, but is still charged).
 *
 * Storage: histogram rows in an array by (cpu, row) with the exact sum after the overflow bucket
 * (plain increments: a CPU writes only its own rows, and a program does not nest in itself);
 * (cgroup, vector) -> series slot (a per-CPU cache in front of a hash, include/slots.bpf.h),
 * then (ns, runs) per CPU and slot in an array.  Both arrays are mmap-ed by user space.
 *
 * Lost events are counted in irq_dropped_events (DROP_* below).
 *
 * Overhead (benchmarks/bench_probe_overhead.py --quick --probe irq: NET_RX of UDP datagrams on
 * loopback, kernel BPF stats against an empty program on the same tracepoint, both attach
 * orders, this loaded 2-vCPU VM): tp_btf softirq_entry 85.6 vs 42.4 ns (2.02x, +43 ns),
 * softirq_exit 116.3 vs 40.2 ns (2.90x, +76 ns): ~200 ns per softirq run in all.  Idle, this VM
 * runs ~180 softirqs a second; a CPU receiving a UDP flood one datagram per NET_RX run, 230,000
 * (4.6 % of it): the catalog leaves the probe off unless named (--probe irq).
 *
 * Example (tests/probes/test_irq.py: a spinner in /trading on CPU 1, bursts of datagrams whose
 * receive processing RPS steers to CPU 1, 3 s):
 *   irq_charged_ns{cgroup=/trading, cpu=1, kind=softirq, vector=NET_RX} = 740.6 ms
 *   against 750.6 ms the spinner lost on its CPU (its own clock's gaps, less time off the CPU)
 *
 * Tunables (-D, set by irq.py): IRQ_NR_CPUS, IRQ_MAX_SERIES, IRQ_SOFTIRQ_ROWS, IRQ_HARDIRQ_ROWS.
 */
#include "hist.bpf.h"
#include "slots.bpf.h"

#if !defined(IRQ_NR_CPUS) || !defined(IRQ_MAX_SERIES) || !defined(IRQ_SOFTIRQ_ROWS) || \
    !defined(IRQ_HARDIRQ_ROWS)
#error "compile through tailsight.probes.irq (table sizes)"
#endif
#define IRQ_MAX_IRQ 4096 /* irq numbers with a histogram row cache entry */
#define IRQ_VECTOR_FLAG 0x10000U
#define IRQ_ROWS (IRQ_SOFTIRQ_ROWS + IRQ_HARDIRQ_ROWS)
#define ROW_STRIDE (HIST_NUM_BUCKETS + 2) /* finite buckets, overflow, exact sum */
#define SERIES_CACHE 8                    /* per-CPU series -> slot entries, a power of two */

/* Drop reasons (index into irq_dropped_events). */
#define DROP_SERIES_FULL 0  /* a (cgroup, vector) beyond IRQ_MAX_SERIES: not charged */
#define DROP_NO_ROW 1       /* a hardirq without a histogram row, or an unknown softirq */
#define DROP_UNSEEN_ENTRY 2 /* an exit without its entry (attached mid-run) */
#define DROP_REASONS 3

#define CONFIG_FILTER_ON 0
#define CONFIG_SLOTS 2

struct irq_series_key {
    u64 cgroup_id;
    u32 vector;
    u32 pad;
};

/* slot_plus_one: 0 is a miss (user space empties the caches with zeros, bccprobe.set_config). */
struct irq_series_cached {
    struct irq_series_key key;
    u32 slot_plus_one;
    u32 pad;
};

struct irq_cpu {
    u32 config[CONFIG_SLOTS];
    u64 softirq_start_ns;
    u64 softirq_nested_ns; /* hardirq time inside the running softirq */
    u64 hardirq_start_ns;
    struct irq_series_cached cache[SERIES_CACHE];
};

BPF_HASH(irq_slots, struct irq_series_key, u32, IRQ_MAX_SERIES);
BPF_HASH(irq_slot_owner, u32, struct irq_series_key, IRQ_MAX_SERIES);
BPF_ARRAY(irq_slot_hint, u32, 1);
/* irq number -> hardirq row, claimed once per irq like a series slot. */
BPF_HASH(irq_row_slots, u32, u32, IRQ_HARDIRQ_ROWS);
BPF_HASH(irq_row_owner, u32, u32, IRQ_HARDIRQ_ROWS);
BPF_ARRAY(irq_row_hint, u32, 1);
BPF_ARRAY(irq_row_of, u32, IRQ_MAX_IRQ); /* row + 1, 0: none yet (an inlined lookup) */
BPF_PERCPU_ARRAY(irq_config, struct irq_cpu, 1);
BPF_F_TABLE("array", u32, u64, irq_time_hist, IRQ_NR_CPUS * IRQ_ROWS * ROW_STRIDE, BPF_F_MMAPABLE);
/* (cpu * IRQ_MAX_SERIES + slot) * 2 -> charged ns, then runs. */
BPF_F_TABLE("array", u32, u64, irq_charged, IRQ_NR_CPUS * IRQ_MAX_SERIES * 2, BPF_F_MMAPABLE);
BPF_HASH(irq_cgroup_allow, u64, u8, 4096);
BPF_PERCPU_ARRAY(irq_dropped_events, u64, DROP_REASONS);

static __always_inline void count_drop(u32 reason)
{
    u64 *dropped = irq_dropped_events.lookup(&reason);

    if (dropped)
        (*dropped)++;
}

static __always_inline int slot_own(u32 *slot, const void *key)
{
    return irq_slot_owner.insert(slot, (struct irq_series_key *)key);
}

static __always_inline int slot_bind(const void *key, u32 *slot)
{
    return irq_slots.insert((struct irq_series_key *)key, slot);
}

static __always_inline u32 *slot_find(const void *key)
{
    return irq_slots.lookup((struct irq_series_key *)key);
}

static __always_inline int row_own(u32 *row, const void *irq)
{
    return irq_row_owner.insert(row, (u32 *)irq);
}

static __always_inline int row_bind(const void *irq, u32 *row)
{
    return irq_row_slots.insert((u32 *)irq, row);
}

static __always_inline u32 *row_find(const void *irq)
{
    return irq_row_slots.lookup((u32 *)irq);
}

/* The series' slot: this CPU's small cache, then the hash, then a new claim (-1: none left). */
static __always_inline s32 series_slot(struct irq_cpu *cpu, struct irq_series_key *key)
{
    u32 zero = 0;
    struct irq_series_cached *cached;
    u32 *hint;
    u32 *known;
    s32 slot;

    cached = &cpu->cache[(key->cgroup_id ^ key->vector) & (SERIES_CACHE - 1)];
    if (cached->key.cgroup_id == key->cgroup_id && cached->key.vector == key->vector &&
        cached->slot_plus_one)
        return (s32)(cached->slot_plus_one - 1);
    known = irq_slots.lookup(key);
    if (known) {
        slot = (s32)*known;
    } else {
        hint = irq_slot_hint.lookup(&zero);
        if (!hint)
            return -1;
        slot = slot_claim(hint, 0, IRQ_MAX_SERIES, key, slot_own, slot_bind, slot_find);
        if (slot < 0)
            return -1;
    }
    cached->key = *key;
    cached->slot_plus_one = (u32)slot + 1;
    return slot;
}

/* The hardirq histogram row of an irq number (-1: none). */
static __always_inline s32 hardirq_row(u32 irq)
{
    u32 zero = 0;
    u32 *cached = irq_row_of.lookup(&irq);
    u32 *known;
    u32 *hint;
    s32 row;

    if (!cached)
        return -1; /* irq >= IRQ_MAX_IRQ */
    if (*cached)
        return (s32)(*cached - 1);
    known = irq_row_slots.lookup(&irq);
    if (known) {
        row = (s32)*known;
    } else {
        hint = irq_row_hint.lookup(&zero);
        if (!hint)
            return -1;
        row = slot_claim(hint, 0, IRQ_HARDIRQ_ROWS, &irq, row_own, row_bind, row_find);
        if (row < 0)
            return -1;
    }
    *cached = (u32)row + 1;
    return row;
}

/* One run of `duration_ns` on this CPU: its histogram row (row < 0: none), then its charge. */
static __always_inline void record_run(struct irq_cpu *cpu, s32 row, u32 vector, u64 duration_ns)
{
    u32 cpu_id = bpf_get_smp_processor_id();
    struct irq_series_key key = {};
    u32 cell;
    u64 *bucket;
    u64 *sum;
    u64 *charged;
    s32 slot;

    if (row >= 0) {
        cell = (cpu_id * IRQ_ROWS + (u32)row) * ROW_STRIDE;
        cell += hist_bucket_index(duration_ns);
        bucket = irq_time_hist.lookup(&cell);
        cell = (cpu_id * IRQ_ROWS + (u32)row) * ROW_STRIDE + ROW_STRIDE - 1;
        sum = irq_time_hist.lookup(&cell);
        if (bucket && sum) {
            (*bucket)++;
            *sum += duration_ns;
        }
    } else {
        count_drop(DROP_NO_ROW);
    }
    /* The interrupted task: pid 0 is the idle task (cgroup 0, "idle"). */
    if ((u32)bpf_get_current_pid_tgid() != 0)
        key.cgroup_id = bpf_get_current_cgroup_id();
    if (key.cgroup_id && cpu->config[CONFIG_FILTER_ON] &&
        !irq_cgroup_allow.lookup(&key.cgroup_id))
        return;
    key.vector = vector;
    slot = series_slot(cpu, &key);
    if (slot < 0) {
        count_drop(DROP_SERIES_FULL);
        return;
    }
    cell = (cpu_id * IRQ_MAX_SERIES + (u32)slot) * 2;
    charged = irq_charged.lookup(&cell);
    if (!charged)
        return;
    *charged += duration_ns;
    cell++;
    charged = irq_charged.lookup(&cell);
    if (charged)
        (*charged)++;
}

int on_softirq_entry(struct bpf_raw_tracepoint_args *ctx)
{
    u32 zero = 0;
    struct irq_cpu *cpu = irq_config.lookup(&zero);

    if (cpu) {
        cpu->softirq_start_ns = bpf_ktime_get_ns();
        cpu->softirq_nested_ns = 0;
    }
    return 0;
}

int on_softirq_exit(struct bpf_raw_tracepoint_args *ctx)
{
    u64 now_ns = bpf_ktime_get_ns();
    u32 vector = (u32)ctx->args[0];
    u32 zero = 0;
    struct irq_cpu *cpu = irq_config.lookup(&zero);
    u64 duration_ns;

    if (!cpu)
        return 0;
    if (!cpu->softirq_start_ns) {
        count_drop(DROP_UNSEEN_ENTRY);
        return 0;
    }
    duration_ns = now_ns - cpu->softirq_start_ns;
    duration_ns = duration_ns > cpu->softirq_nested_ns ? duration_ns - cpu->softirq_nested_ns : 0;
    cpu->softirq_start_ns = 0;
    record_run(cpu, vector < IRQ_SOFTIRQ_ROWS ? (s32)vector : -1, vector, duration_ns);
    return 0;
}

int on_irq_handler_entry(struct bpf_raw_tracepoint_args *ctx)
{
    u32 zero = 0;
    struct irq_cpu *cpu = irq_config.lookup(&zero);

    if (cpu)
        cpu->hardirq_start_ns = bpf_ktime_get_ns();
    return 0;
}

int on_irq_handler_exit(struct bpf_raw_tracepoint_args *ctx)
{
    u64 now_ns = bpf_ktime_get_ns();
    u32 irq = (u32)ctx->args[0];
    u32 zero = 0;
    struct irq_cpu *cpu = irq_config.lookup(&zero);
    u64 duration_ns;
    s32 row;

    if (!cpu)
        return 0;
    if (!cpu->hardirq_start_ns) {
        count_drop(DROP_UNSEEN_ENTRY);
        return 0;
    }
    duration_ns = now_ns - cpu->hardirq_start_ns;
    cpu->hardirq_start_ns = 0;
    if (cpu->softirq_start_ns)
        cpu->softirq_nested_ns += duration_ns;
    row = hardirq_row(irq);
    record_run(cpu, row < 0 ? -1 : IRQ_SOFTIRQ_ROWS + row, IRQ_VECTOR_FLAG | irq, duration_ns);
    return 0;
}
