/* Baseline for bench_probe_overhead.py: an empty program on the same raw tracepoint, so the
 * figure that remains is what our program's own work costs. */
int on_sched_switch(struct bpf_raw_tracepoint_args *ctx)
{
    return 0;
}

/* Baselines for bench_netsyscall_overhead.py (sys_enter / sys_exit). */
int on_sys_enter(struct bpf_raw_tracepoint_args *ctx)
{
    return 0;
}

int on_sys_exit(struct bpf_raw_tracepoint_args *ctx)
{
    return 0;
}

/* Baselines for the tcpstate and migration part of bench_probe_overhead.py. */
int on_inet_sock_set_state(struct bpf_raw_tracepoint_args *ctx)
{
    return 0;
}

int on_sched_migrate_task(struct bpf_raw_tracepoint_args *ctx)
{
    return 0;
}
