"""Collector: interval deltas, cgroup names, symbols, recording store, Prometheus export."""
