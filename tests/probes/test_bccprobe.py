"""The user-side helpers every bcc probe shares, against naive references."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from tailsight.hist import NUM_BUCKETS, Histogram
from tailsight.probes.base import HIST_ROW
from tailsight.probes.bccprobe import slot_histograms

# Small counts, counts a few of which sum past int64, counts past it on their own.
_COUNT = st.integers(0, 9) | st.integers(2**59, 2**62) | st.integers(2**62, 2**64 - 1)
# The first, last finite and overflow buckets, or any.
_BUCKET = st.sampled_from([0, NUM_BUCKETS - 1, NUM_BUCKETS]) | st.integers(0, HIST_ROW - 1)


@settings(max_examples=300)
@example([{0: 3 * 2**60, 1: 3 * 2**60, 2: 3 * 2**60}])  # past int64, each below 2^62
@given(
    st.lists(
        st.dictionaries(_BUCKET, _COUNT, max_size=8),  # bucket -> count
        max_size=6,
    )
)
def test_slot_histograms_equal_one_checked_histogram_per_row(cells: list[dict[int, int]]) -> None:
    """Rows with an observation (overflow only included) become the Histogram the model's own
    checks accept, the others are left out; a count or a row total past int64 is refused."""
    rows = np.zeros((len(cells), HIST_ROW), dtype=np.uint64)
    for row, buckets in enumerate(cells):
        for bucket, count in buckets.items():
            rows[row, bucket] = count
    totals = [sum(buckets.values()) for buckets in cells]
    assume(all(abs(total - 2**63) > 2**56 for total in totals))  # clear of float rounding
    slots = [100 + 3 * row for row in range(len(cells))]
    sums = [7 * row for row in range(len(cells))]
    if any(total >= 2**63 for total in totals):
        with pytest.raises(ValueError, match="does not fit in int64"):
            slot_histograms(slots, rows, sums)
        return
    expected = {
        slots[row]: Histogram(rows[row, :NUM_BUCKETS], int(rows[row, NUM_BUCKETS]), sums[row])
        for row, total in enumerate(totals)
        if total
    }
    assert slot_histograms(slots, rows, sums) == expected
