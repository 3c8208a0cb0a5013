/* Outlier events: samples slower than their cgroup's threshold go to user space through a BPF
 * ring buffer, with kernel and user stack ids, at most OUTLIER_RATE_PER_S per CPU.
 *
 * A probe declares its own maps, named <probe>_outlier_{events,stacks,threshold,rate,dropped}
 * (bcc rewrites map operations only in the main source file, so the lookups, get_stackid and
 * ringbuf_output calls stay there); this header holds the event layout shared with
 * tailsight/probes/outliers.py and the arithmetic on slots the probe hands it.
 *
 * Threshold of a sample in cgroup c: max(OUTLIER_FLOOR_NS, <probe>_outlier_threshold[c]); user
 * space writes the upper bound of c's current P99 bucket there at each read.  The floor is
 * compared first so the common, fast sample costs no map lookup.
 */
#ifndef TAILSIGHT_OUTLIER_BPF_H
#define TAILSIGHT_OUTLIER_BPF_H

#ifndef OUTLIER_FLOOR_NS
#define OUTLIER_FLOOR_NS 1000000ULL /* 1 ms */
#endif
#ifndef OUTLIER_RATE_PER_S
#define OUTLIER_RATE_PER_S 100ULL /* events per second per CPU, also the burst */
#endif
#ifndef OUTLIER_MAX_STACKS
#define OUTLIER_MAX_STACKS 2048 /* 1 KiB each (127 frames), preallocated: 2 MiB */
#endif
#ifndef OUTLIER_RINGBUF_PAGES
#define OUTLIER_RINGBUF_PAGES 64 /* 256 KiB: ~6500 events between two reads */
#endif

/* Index into <probe>_outlier_dropped (outliers.OUTLIER_DROP_REASONS). */
#define OUTLIER_DROP_RATE_LIMITED 0
#define OUTLIER_DROP_RINGBUF_FULL 1
#define OUTLIER_DROP_STACK_LOST 2 /* stack map bucket taken by another stack, or map full */
#define OUTLIER_DROP_REASONS 3

/* A token is worth 1e9 "nano-events", so refilling is one multiply per elapsed ns. */
#define OUTLIER_TOKEN 1000000000ULL
#define OUTLIER_ERRNO_ENOMEM 12 /* asm-generic/errno-base.h */
#define OUTLIER_ERRNO_EEXIST 17

/* Mirrored by outliers.OutlierEvent (ctypes): keep the two in step. */
struct outlier_event {
    u64 cgroup_id;
    u64 value_ns;
    u32 tgid;
    u32 pid;
    s32 kernel_stack_id; /* negative: -errno from bpf_get_stackid */
    s32 user_stack_id;   /* -EFAULT (-14) for kernel threads: they have no user stack */
    u32 detail;          /* probe specific: the syscall number for netsyscall, 0 otherwise */
    u32 pad;
};

/* Per-CPU token bucket (a per-CPU array slot: no other CPU touches it, no atomics needed). */
struct outlier_bucket {
    u64 tokens;
    u64 last_ns;
};

/* True if value_ns beats the floor; the caller then looks the per-cgroup threshold up. */
static __always_inline bool outlier_above_floor(u64 value_ns)
{
    return value_ns > OUTLIER_FLOOR_NS;
}

/* True if value_ns is above the cgroup's threshold slot (NULL: none set yet, floor only). */
static __always_inline bool outlier_above_threshold(const u64 *threshold_ns, u64 value_ns)
{
    return !threshold_ns || value_ns > *threshold_ns;
}

/* Takes one token if the bucket has one (refilled at OUTLIER_RATE_PER_S, capped at one second's
 * worth); false means rate-limited. */
static __always_inline bool outlier_take_token(struct outlier_bucket *bucket, u64 now_ns)
{
    u64 elapsed_ns;

    if (!bucket)
        return false;
    elapsed_ns = now_ns - bucket->last_ns;
    if (bucket->last_ns == 0 || elapsed_ns >= OUTLIER_TOKEN)
        bucket->tokens = OUTLIER_RATE_PER_S * OUTLIER_TOKEN;
    else {
        bucket->tokens += elapsed_ns * OUTLIER_RATE_PER_S;
        if (bucket->tokens > OUTLIER_RATE_PER_S * OUTLIER_TOKEN)
            bucket->tokens = OUTLIER_RATE_PER_S * OUTLIER_TOKEN;
    }
    bucket->last_ns = now_ns;
    if (bucket->tokens < OUTLIER_TOKEN)
        return false;
    bucket->tokens -= OUTLIER_TOKEN;
    return true;
}

/* A stack id that means the stack was lost, not merely absent (a kernel thread's user stack). */
static __always_inline bool outlier_stack_lost(long stack_id)
{
    return stack_id == -OUTLIER_ERRNO_EEXIST || stack_id == -OUTLIER_ERRNO_ENOMEM;
}

#endif /* TAILSIGHT_OUTLIER_BPF_H */
