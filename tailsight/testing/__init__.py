"""What the demo, the tests and the benchmarks run tailsight against, with known ground truth:
workloads in cgroups, fault injections and their scoring, synthetic latency models; kept apart
from the product code they check."""
