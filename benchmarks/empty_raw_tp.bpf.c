/* Baseline for bench_probe_overhead.py: an empty program on the same raw tracepoint, so the
 * figure that remains is what our program's own work costs. */
int on_sched_switch(struct bpf_raw_tracepoint_args *ctx)
{
    return 0;
}
