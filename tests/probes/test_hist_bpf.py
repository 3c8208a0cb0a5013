"""The kernel-side bucket index (probes/include/hist.bpf.h, the real header) against hist.py.

A harness program including the header runs under BPF_PROG_TEST_RUN on chosen values; its
return value is the kernel's bucket index and its maps hold what hist_add_sample recorded.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tailsight.hist import NUM_BUCKETS, bucket_index, bucket_upper_bounds_ns
from tailsight.probes.loader import (
    PROBES_DIR,
    AttachError,
    attach_raw_tracepoints,
    compile_source,
    prog_test_run_raw_tp,
)

HEADER = Path(__file__).parents[2] / "probes" / "include" / "hist.bpf.h"
HARNESS = Path(__file__).with_name("hist_index_test.bpf.c")
EDGE_CGROUP, RANDOM_CGROUP, HUGE_CGROUP = 11, 22, 33


@pytest.fixture(scope="module")
def harness(kernel_ready: None) -> Any:
    from bcc import BPF

    bpf = compile_source(HARNESS, [f"-I{PROBES_DIR / 'include'}"])
    fn = bpf.load_func(b"hist_index_of", BPF.RAW_TRACEPOINT)
    yield bpf, fn.fd
    bpf.cleanup()


def _edge_values() -> list[int]:
    values = {0, 1, 4_999}
    for upper in bucket_upper_bounds_ns().tolist():
        values.update((upper - 1, upper, upper + 1))
    return sorted(values)


def _kernel_index(prog_fd: int, value_ns: int, cgroup_id: int) -> int:
    return prog_test_run_raw_tp(prog_fd, [value_ns, cgroup_id])


def test_multiply_shift_is_the_division_over_the_whole_linear_range() -> None:
    """hist.bpf.h divides by 5000 as a multiply and shift: exact for every linear value."""
    text = HEADER.read_text()

    def constant(name: str) -> int:
        found = re.search(rf"#define {name} (\d+)", text)
        assert found, name
        return int(found.group(1))

    multiplier, shift = constant("HIST_DIV_MULTIPLIER"), constant("HIST_DIV_SHIFT")
    x = np.arange(0, 5_000 * 2_048, dtype=np.uint64)  # v - 1 below HIST_LINEAR_LIMIT_NS
    assert np.array_equal((x * np.uint64(multiplier)) >> np.uint64(shift), x // np.uint64(5_000))


@pytest.mark.kernel
def test_kernel_index_matches_hist_py(harness: Any) -> None:
    bpf, prog_fd = harness
    rng = np.random.default_rng(20261129)
    edges = _edge_values()
    # log-uniform over 1 ns .. 100 s, so every tail bucket and the overflow get samples
    random_values = np.unique(np.exp(rng.uniform(0, np.log(1e11), 3000)).astype(np.int64)).tolist()
    huge = [2**40, 2**63 - 1, 2**63, 2**64 - 1]

    for cgroup_id, values in ((EDGE_CGROUP, edges), (RANDOM_CGROUP, random_values)):
        mismatches = [
            (v, got, bucket_index(v))
            for v in values
            if (got := _kernel_index(prog_fd, v, cgroup_id)) != bucket_index(v)
        ]
        assert not mismatches[:10], "value_ns, kernel, hist.py"
    for value in huge:
        assert _kernel_index(prog_fd, value, HUGE_CGROUP) == NUM_BUCKETS  # overflow

    # What hist_add_sample stored: bucket cells and sums equal a naive count of the inputs.
    cells = {(k.cgroup_id, k.bucket): v.value for k, v in bpf[b"test_hist"].items()}
    sums = {k.value: v.value for k, v in bpf[b"test_sums"].items()}
    for cgroup_id, values in ((EDGE_CGROUP, edges), (RANDOM_CGROUP, random_values)):
        expected = Counter(bucket_index(v) for v in values)
        got = {b: n for (cg, b), n in cells.items() if cg == cgroup_id}
        assert got == dict(expected)
        assert sums[cgroup_id] == sum(values)
    assert cells[(HUGE_CGROUP, NUM_BUCKETS)] == len(huge)
    assert sums[HUGE_CGROUP] == sum(huge) % 2**64  # a u64 sum wraps


@pytest.mark.kernel
def test_attach_failure_names_the_tracepoint_and_reason(harness: Any) -> None:
    bpf, _ = harness
    # The harness program exists, but there is no raw tracepoint called "hist_index_of".
    with pytest.raises(AttachError) as caught:
        attach_raw_tracepoints(bpf, "harness", ["hist_index_of"], fn_prefix="")
    assert caught.value.failures == {
        "hist_index_of": "no such raw tracepoint in this kernel (ENOENT)"
    }
    assert "harness" in str(caught.value)
