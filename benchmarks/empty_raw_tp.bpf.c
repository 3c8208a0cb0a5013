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

/* The rest of the probes' tracepoints, for bench_workload_slowdown.py's floor. */
int on_tcp_retransmit_skb(struct bpf_raw_tracepoint_args *ctx)
{
    return 0;
}

int on_sched_move_numa(struct bpf_raw_tracepoint_args *ctx)
{
    return 0;
}

int on_sched_swap_numa(struct bpf_raw_tracepoint_args *ctx)
{
    return 0;
}

int on_sched_stick_numa(struct bpf_raw_tracepoint_args *ctx)
{
    return 0;
}

int on_kfree_skb(struct bpf_raw_tracepoint_args *ctx)
{
    return 0;
}

/* Baselines for the irq part of bench_probe_overhead.py. */
int on_softirq_entry(struct bpf_raw_tracepoint_args *ctx)
{
    return 0;
}

int on_softirq_exit(struct bpf_raw_tracepoint_args *ctx)
{
    return 0;
}

int on_irq_handler_entry(struct bpf_raw_tracepoint_args *ctx)
{
    return 0;
}

int on_irq_handler_exit(struct bpf_raw_tracepoint_args *ctx)
{
    return 0;
}

/* The reclaim probe's tracepoints, for bench_workload_slowdown.py's floor. */
int on_mm_vmscan_direct_reclaim_begin(struct bpf_raw_tracepoint_args *ctx)
{
    return 0;
}

int on_mm_vmscan_direct_reclaim_end(struct bpf_raw_tracepoint_args *ctx)
{
    return 0;
}

int on_mm_vmscan_memcg_reclaim_begin(struct bpf_raw_tracepoint_args *ctx)
{
    return 0;
}

int on_mm_vmscan_memcg_reclaim_end(struct bpf_raw_tracepoint_args *ctx)
{
    return 0;
}

int on_mm_compaction_begin(struct bpf_raw_tracepoint_args *ctx)
{
    return 0;
}

int on_mm_compaction_end(struct bpf_raw_tracepoint_args *ctx)
{
    return 0;
}
