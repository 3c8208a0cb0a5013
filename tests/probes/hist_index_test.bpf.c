/* Test harness for probes/include/hist.bpf.h, run with BPF_PROG_TEST_RUN (never attached):
 * args[0] = value_ns, args[1] = cgroup id; records the sample and returns the bucket index. */
#include "hist.bpf.h"

BPF_HASH(test_hist, struct hist_key, u64, 8192);
BPF_HASH(test_sums, u64, u64, 64);

int hist_index_of(struct bpf_raw_tracepoint_args *ctx)
{
    u64 value_ns = ctx->args[0];
    u64 cgroup_id = ctx->args[1];
    struct hist_key key = hist_key_for(cgroup_id, value_ns);
    u64 zero = 0;
    u64 *bucket_count = test_hist.lookup_or_try_init(&key, &zero);
    u64 *sum_ns = test_sums.lookup_or_try_init(&cgroup_id, &zero);

    hist_add_sample(bucket_count, sum_ns, value_ns);
    return key.bucket;
}
