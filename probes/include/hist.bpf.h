/* The tailsight histogram model on the kernel side: the same bucket index as tailsight/hist.py.
 *
 * Buckets (ceiling semantics, so a bucket's `le` is a true upper bound):
 *   i < 2048          : (5 i, 5 (i + 1)] µs; 0 ns goes to bucket 0
 *   2048 + k - 1      : (10.24 ms * 2^(k-1), 10.24 ms * 2^k], k = 1..10
 *   2058 (overflow)   : above 10.48576 s
 *
 * bcc rewrites map operations (`map.lookup(...)`) only in the main source file, never in an
 * included header, so the map lookups stay in the probe and this header does the arithmetic
 * on the slots it is handed.
 */
#ifndef TAILSIGHT_HIST_BPF_H
#define TAILSIGHT_HIST_BPF_H

#define HIST_BUCKET_WIDTH_NS 5000ULL
#define HIST_LINEAR_SHIFT 11
#define HIST_LINEAR_BUCKETS (1U << HIST_LINEAR_SHIFT) /* 2048 */
#define HIST_TAIL_BUCKETS 10U
#define HIST_NUM_BUCKETS (HIST_LINEAR_BUCKETS + HIST_TAIL_BUCKETS)
#define HIST_OVERFLOW_BUCKET HIST_NUM_BUCKETS

/* One (cgroup, bucket) cell of a per-cgroup histogram held in a hash map of u64 counts. */
struct hist_key {
    u64 cgroup_id;
    u32 bucket;
    u32 pad; /* keys are hashed bytewise: keep the padding explicit and zero */
};

/* (v - 1) / 5000 for v - 1 < 10.24 ms as a multiply and shift: the JIT turns a division into
 * x86's div (tens of cycles on every sample).  Exact below 2^36 / (M * 5000 - 2^36) = 2.1e7,
 * checked for every value in tests/probes/test_hist_bpf.py. */
#define HIST_LINEAR_LIMIT_NS (HIST_BUCKET_WIDTH_NS * HIST_LINEAR_BUCKETS)
#define HIST_DIV_MULTIPLIER 13743896ULL /* ceil(2^36 / 5000) */
#define HIST_DIV_SHIFT 36

/* Bucket index of value_ns, identical to tailsight.hist.bucket_index. */
static __always_inline u32 hist_bucket_index(u64 value_ns)
{
    u64 linear;
    u64 octaves;

    if (value_ns == 0)
        return 0;
    if (value_ns - 1 < HIST_LINEAR_LIMIT_NS)
        return (u32)(((value_ns - 1) * HIST_DIV_MULTIPLIER) >> HIST_DIV_SHIFT);
    linear = (value_ns - 1) / HIST_BUCKET_WIDTH_NS;
    /* floor((v - 1) / 10.24 ms) >= 1; tail bucket k is the one whose bit length is k, i.e.
     * octaves in [2^(k-1), 2^k - 1] <=> v in (10.24 ms 2^(k-1), 10.24 ms 2^k]. */
    octaves = linear >> HIST_LINEAR_SHIFT;
#pragma unroll
    for (u32 k = 1; k <= HIST_TAIL_BUCKETS; k++) {
        if (octaves < (1ULL << k))
            return HIST_LINEAR_BUCKETS + k - 1;
    }
    return HIST_OVERFLOW_BUCKET;
}

/* The histogram cell a sample of value_ns in cgroup_id goes to. */
static __always_inline struct hist_key hist_key_for(u64 cgroup_id, u64 value_ns)
{
    struct hist_key key = {};

    key.cgroup_id = cgroup_id;
    key.bucket = hist_bucket_index(value_ns);
    return key;
}

/* Adds one sample to its bucket cell and to the exact sum kept beside the row (the count is
 * the row's sum, so no third atomic).  Bucket before sum: a racing read never has a sum larger
 * than its buckets explain.  Returns -1 without touching anything if a slot is missing (map
 * full): the caller counts that as a drop, so buckets and sum never disagree because of a
 * half-recorded sample. */
static __always_inline int hist_add_sample(u64 *bucket_count, u64 *sum_ns, u64 value_ns)
{
    if (!bucket_count || !sum_ns)
        return -1;
    __sync_fetch_and_add(bucket_count, 1);
    __sync_fetch_and_add(sum_ns, value_ns);
    return 0;
}

#endif /* TAILSIGHT_HIST_BPF_H */
