"""Workloads and fault injections with known ground truth: what the demo, the tests and the
benchmarks run against tailsight, kept apart from the product code they check."""
