/* reclaim: time tasks stall in direct memory reclaim and direct compaction, as exact 5 µs
 * histograms per cgroup of the stalled task and kind of stall.
 *
 * Series (names as reclaim.py exports them), one histogram each per cgroup:
 *   kind=direct      global direct reclaim: an allocation found its zones below the watermark
 *                    (mm_vmscan_direct_reclaim_begin/end, around try_to_free_pages)
 *   kind=memcg       memory cgroup limit reclaim: a charge over memory.limit_in_bytes (v1) or
 *                    memory.max, or memory.high on return to user space (v2)
 *                    (mm_vmscan_memcg_reclaim_begin/end, around try_to_free_mem_cgroup_pages)
 *   kind=compaction  direct compaction (mm_compaction_begin/end with cc->direct_compaction set;
 *                    kcompactd's and proactive compaction stall no task and are skipped).  Only
 *                    where the kernel has CONFIG_COMPACTION: reclaim.py attaches what BTF names.
 * Counter: reclaim_pages_reclaimed{cgroup, kind} (the end tracepoint's nr_reclaimed).
 *
 * All six fire in the stalled task's own context (kswapd never calls them), so the stall is
 * end - begin of that task (bpf_ktime_get_ns, time off-CPU inside included, as PSI counts it)
 * and the cgroup is current's v2 cgroup, read at the end (one helper, no struct read).
 *
 * Attach points (tp_btf where the kernel takes it, else raw tracepoints):
 *   mm_vmscan_direct_reclaim_begin(int order, gfp_t gfp_flags)
 *   mm_vmscan_direct_reclaim_end(unsigned long nr_reclaimed)
 *   mm_vmscan_memcg_reclaim_begin(int order, gfp_t gfp_flags)
 *   mm_vmscan_memcg_reclaim_end(unsigned long nr_reclaimed)
 *   mm_compaction_begin(struct compact_control *cc, unsigned long zone_start,
 *                       unsigned long zone_end, bool sync)
 *   mm_compaction_end(struct compact_control *cc, unsigned long zone_start,
 *                     unsigned long zone_end, bool sync, int status)
 *
 * Pairing: begin stores its timestamp in reclaim_started under (kind << 32 | tid); the end of
 * the same kind and task takes it.  An end without a begin (the probe attached mid-stall) and
 * a begin that finds the table full are counted as lost (reclaim_dropped_events).
 *
 * Overhead: only tasks that stall run the programs, nothing runs on a host without memory
 * pressure.  Kernel BPF stats against an empty program on the same tracepoints, both attach
 * orders, tp_btf, the test's reader (~2,250 stalls per order, 2-vCPU VM): begin 248 vs 55 ns,
 * end 337 vs 55 ns, so +0.5 µs per memcg stall of 11.5 µs mean; of it, the begin's hash update
 * and the end's first helper call fall inside the measured stall (~0.15 µs).
 *
 * Example (tests/probes/test_reclaim.py: a reader pinned to one CPU, limited to 16 MiB (v1),
 * reads a 64 MiB file once):
 *   reclaim memcg {cgroup=/reader}: 745 stalls, 6.945 ms; its v2 group's PSI memory some
 *   +7.346 ms (psi_memstall_enter/leave bracket the same call, each updating every level of
 *   the cgroup's hierarchy: 0.4-0.9 µs more per stall); failcnt +8,627 (every failed charge,
 *   a 64-page batch first: more than the reclaims)
 *
 * Storage: (cgroup, kind) -> series slot (a hash: stalls are rare, no per-CPU cache), then a
 * histogram row and a (sum, pages) pair per slot in arrays mmap-ed by user space.
 *
 * Tunables (-D, set by reclaim.py): RECLAIM_MAX_SERIES, RECLAIM_MAX_TASKS, CC_DIRECT_OFF (from
 * BTF, with RECLAIM_HAS_COMPACTION).  Cgroup filter (at run time): with
 * reclaim_config[CONFIG_FILTER_ON] set, only stalls of cgroups in reclaim_cgroup_allow count.
 */
#include "hist.bpf.h"
#include "kread.bpf.h"
#include "slots.bpf.h"

#if !defined(RECLAIM_MAX_SERIES) || !defined(RECLAIM_MAX_TASKS)
#error "compile through tailsight.probes.reclaim (table sizes, compaction offsets from BTF)"
#endif
#if defined(RECLAIM_HAS_COMPACTION) && !defined(CC_DIRECT_OFF)
#error "RECLAIM_HAS_COMPACTION needs CC_DIRECT_OFF (compact_control.direct_compaction, BTF)"
#endif
#define HIST_ROW (HIST_NUM_BUCKETS + 1) /* finite buckets, then overflow */

/* The kinds of stall (the series' kind label, KINDS in reclaim.py). */
#define KIND_DIRECT 0
#define KIND_MEMCG 1
#define KIND_COMPACTION 2

/* Drop reasons (index into reclaim_dropped_events). */
#define DROP_SERIES_FULL 0 /* a (cgroup, kind) beyond RECLAIM_MAX_SERIES: its stalls are lost */
#define DROP_TASKS_FULL 1  /* more tasks in a stall at once than RECLAIM_MAX_TASKS */
#define DROP_UNPAIRED_END 2 /* an end whose begin was not seen (attached mid-stall) */
#define DROP_REASONS 3

#define CONFIG_FILTER_ON 0 /* reclaim_config slots */
#define CONFIG_SLOTS 1

struct reclaim_series_key {
    u64 cgroup_id;
    u32 kind;
    u32 pad; /* keys are hashed bytewise: explicit and zero */
};

struct reclaim_total {
    u64 sum_ns;
    u64 pages;
};

BPF_HASH(reclaim_slots, struct reclaim_series_key, u32, RECLAIM_MAX_SERIES);
BPF_HASH(reclaim_slot_owner, u32, struct reclaim_series_key, RECLAIM_MAX_SERIES);
BPF_ARRAY(reclaim_slot_hint, u32, 1);
/* Row per series slot: bucket counts (atomic adds; user space maps it read-only). */
BPF_F_TABLE("array", u32, u64, reclaim_stall_hist, RECLAIM_MAX_SERIES * HIST_ROW, BPF_F_MMAPABLE);
/* Per series slot: the exact sum of its stalls and the pages they reclaimed. */
BPF_F_TABLE("array", u32, struct reclaim_total, reclaim_totals, RECLAIM_MAX_SERIES,
            BPF_F_MMAPABLE);
/* (kind << 32 | tid) -> begin timestamp of a stall in progress. */
BPF_HASH(reclaim_started, u64, u64, RECLAIM_MAX_TASKS);
BPF_PERCPU_ARRAY(reclaim_dropped_events, u64, DROP_REASONS);
BPF_ARRAY(reclaim_config, u32, CONFIG_SLOTS);
BPF_HASH(reclaim_cgroup_allow, u64, u8, 4096);

static __always_inline void count_drop(u32 reason)
{
    u64 *dropped = reclaim_dropped_events.lookup(&reason);

    if (dropped)
        (*dropped)++;
}

/* False if the cgroup filter is on and this cgroup is not in it. */
static __always_inline bool cgroup_wanted(u64 cgroup_id)
{
    u32 slot = CONFIG_FILTER_ON;
    u32 *on = reclaim_config.lookup(&slot);

    return !on || !*on || reclaim_cgroup_allow.lookup(&cgroup_id);
}

/* reclaim_slots' three operations for slot_claim (include/slots.bpf.h). */
static __always_inline int slot_own(u32 *slot, const void *key)
{
    return reclaim_slot_owner.insert(slot, (struct reclaim_series_key *)key);
}

static __always_inline int slot_bind(const void *key, u32 *slot)
{
    return reclaim_slots.insert((struct reclaim_series_key *)key, slot);
}

static __always_inline u32 *slot_find(const void *key)
{
    return reclaim_slots.lookup((struct reclaim_series_key *)key);
}

/* The series' slot: the hash, else a new claim (-1: none left). */
static __always_inline s32 series_slot(struct reclaim_series_key *key)
{
    u32 zero = 0;
    u32 *known = reclaim_slots.lookup(key);
    u32 *hint;

    if (known)
        return (s32)*known;
    hint = reclaim_slot_hint.lookup(&zero);
    if (!hint)
        return -1;
    return slot_claim(hint, 0, RECLAIM_MAX_SERIES, key, slot_own, slot_bind, slot_find);
}

static __always_inline void stall_begin(u32 kind)
{
    u64 task = ((u64)kind << 32) | (u32)bpf_get_current_pid_tgid();
    u64 now_ns = bpf_ktime_get_ns();

    /* A begin left by an end never seen is overwritten: the stall that starts now counts. */
    if (reclaim_started.update(&task, &now_ns))
        count_drop(DROP_TASKS_FULL);
}

static __always_inline void stall_end(u32 kind, u64 pages)
{
    u64 now_ns = bpf_ktime_get_ns(); /* first: the lookups below are no part of the stall */
    u64 task = ((u64)kind << 32) | (u32)bpf_get_current_pid_tgid();
    u64 *started = reclaim_started.lookup(&task);
    struct reclaim_series_key key = {};
    struct reclaim_total *total;
    u64 *bucket_count;
    u64 stall_ns;
    u32 cell;
    s32 slot;

    if (!started) {
        count_drop(DROP_UNPAIRED_END);
        return;
    }
    stall_ns = now_ns - *started;
    reclaim_started.delete(&task);
    key.cgroup_id = bpf_get_current_cgroup_id();
    key.kind = kind;
    if (!cgroup_wanted(key.cgroup_id))
        return;
    slot = series_slot(&key);
    if (slot < 0) {
        count_drop(DROP_SERIES_FULL);
        return;
    }
    cell = (u32)slot * HIST_ROW + hist_bucket_index(stall_ns);
    bucket_count = reclaim_stall_hist.lookup(&cell);
    total = reclaim_totals.lookup((u32 *)&slot);
    if (!bucket_count || !total)
        return; /* slots are < RECLAIM_MAX_SERIES: never */
    /* Bucket before sum: a racing read never has a sum larger than its buckets explain. */
    __sync_fetch_and_add(bucket_count, 1);
    __sync_fetch_and_add(&total->sum_ns, stall_ns);
    __sync_fetch_and_add(&total->pages, pages);
}

int on_mm_vmscan_direct_reclaim_begin(struct bpf_raw_tracepoint_args *ctx)
{
    stall_begin(KIND_DIRECT);
    return 0;
}

int on_mm_vmscan_direct_reclaim_end(struct bpf_raw_tracepoint_args *ctx)
{
    stall_end(KIND_DIRECT, ctx->args[0]);
    return 0;
}

int on_mm_vmscan_memcg_reclaim_begin(struct bpf_raw_tracepoint_args *ctx)
{
    stall_begin(KIND_MEMCG);
    return 0;
}

int on_mm_vmscan_memcg_reclaim_end(struct bpf_raw_tracepoint_args *ctx)
{
    stall_end(KIND_MEMCG, ctx->args[0]);
    return 0;
}

#ifdef RECLAIM_HAS_COMPACTION
int on_mm_compaction_begin(struct bpf_raw_tracepoint_args *ctx)
{
    if (kread_u8((const void *)ctx->args[0], CC_DIRECT_OFF))
        stall_begin(KIND_COMPACTION);
    return 0;
}

int on_mm_compaction_end(struct bpf_raw_tracepoint_args *ctx)
{
    if (kread_u8((const void *)ctx->args[0], CC_DIRECT_OFF))
        stall_end(KIND_COMPACTION, 0);
    return 0;
}
#endif
