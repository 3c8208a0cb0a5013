"""tailsight: exact kernel-level latency histograms per cgroup, and who moved your P99."""

__version__ = "0.1.0"
