"""Which raw tracepoints each probe attaches to: read by the probes, `doctor` and the docs."""

PROBE_TRACEPOINTS: dict[str, tuple[str, ...]] = {
    "runqueue": ("sched_wakeup", "sched_wakeup_new", "sched_switch"),
}
