"""The interactive parts of the trace view on hand-built documents whose counts are known: heatmap
cells against a naive count per band, the exact per-interval P99, selection and keys, 80 columns."""

from __future__ import annotations

import io
import itertools
import math
import random
import time
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from tailsight.cli.trace import run_live
from tailsight.cli.trace_view import (
    HEAT_BOUNDS_NS,
    HEAT_SHADES,
    KEY_DOWN,
    KEY_HELP,
    KEY_NEXT_PROBE,
    KEY_PREVIOUS_PROBE,
    KEY_QUIT,
    KEY_UP,
    VIEW_WIDTH,
    HeatInterval,
    Selection,
    apply_key,
    decode_keys,
    heat_bands,
    heatmap,
    interval_p99s_ns,
    render,
    resolve_selection,
    series_key,
    shade,
)
from tailsight.hist import Histogram
from tailsight.intervals import Counter, HistDocument, Series

INTERVAL_NS = 250_000_000
VICTIM = {"probe": "runqueue", "cgroup": "/victim"}
VICTIM_SELECTION = Selection("runqueue", series_key(VICTIM))


def interval_docs(samples: Sequence[Sequence[int]], labels: dict[str, str]) -> list[HeatInterval]:
    """One interval per entry holding one series made from raw samples (ns), as the live view
    keeps it."""
    return [
        HeatInterval.of(
            HistDocument(
                i * INTERVAL_NS,
                (i + 1) * INTERVAL_NS,
                [Series(labels, Histogram.from_samples(list(values)))] if values else [],
            )
        )
        for i, values in enumerate(samples)
    ]


def test_heat_interval_keeps_each_series_exactly_in_its_nonzero_buckets() -> None:
    rng = random.Random(7)
    hists = {
        name: Histogram.from_samples([rng.randrange(0, 3 * 10**9) for _ in range(n)])
        for name, n in (("/victim", 1009), ("/noisy", 13))
    }
    document = HistDocument(
        0, INTERVAL_NS, [Series({"probe": "runqueue", "cgroup": c}, h) for c, h in hists.items()]
    )
    kept = HeatInterval.of(document)
    for cgroup, hist in hists.items():
        key = series_key({"probe": "runqueue", "cgroup": cgroup})
        assert kept.histogram(key) == hist
        part = kept.parts[key]
        assert len(part.index) == len(part.count) == sum(1 for n in hist.counts if n)
    assert kept.histogram(series_key({"probe": "runqueue", "cgroup": "/gone"})) is None


def naive_band_count(values: Sequence[int], lower_ns: int, upper_ns: int | None) -> int:
    """Samples in (lower, upper] (0 counts in the first band, as in the model)."""
    return sum(
        1
        for v in values
        if (v > lower_ns or (lower_ns == 0 and v == 0)) and (upper_ns is None or v <= upper_ns)
    )


def render_text(renderable: object, width: int = VIEW_WIDTH) -> str:
    console = Console(width=width, record=True, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


def random_intervals(seed: int, n: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        size = int(rng.integers(0, 60))
        # log-uniform from 1 µs to ~20 s: every band, the tail and overflow get some
        out.append([int(v) for v in np.exp(rng.uniform(math.log(1e3), math.log(2e10), size))])
    return out


# -- heatmap --------------------------------------------------------------------------------


@pytest.mark.parametrize("max_rows", [len(HEAT_BOUNDS_NS) + 1, 10, 3, 1])
def test_heatmap_cells_are_exact_band_counts(max_rows: int) -> None:
    samples = random_intervals(7, 12)
    # band edges and zero: the ceiling rule puts a bound's value in the band below it
    samples[3] += [0, 5_000, 5_001, 10_240_000, 10_240_001, 10_485_760_000, 10_485_760_001]
    bands = heat_bands(interval_docs(samples, VICTIM), VICTIM_SELECTION, max_rows)
    assert 1 <= len(bands) <= max_rows
    assert bands[0].lower_ns == 0  # the 0 sample
    assert bands[-1].upper_ns is None  # the overflow sample
    for below, above in itertools.pairwise(bands):
        assert below.upper_ns == above.lower_ns  # contiguous, no gap, no overlap
    for band in bands:
        assert band.upper_ns is None or band.upper_ns in HEAT_BOUNDS_NS
        expected = tuple(naive_band_count(v, band.lower_ns, band.upper_ns) for v in samples)
        assert band.counts == expected
    total = sum(sum(b.counts) for b in bands)
    assert total == sum(len(v) for v in samples)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.lists(st.integers(min_value=0, max_value=12_000_000_000), max_size=20),
        min_size=1,
        max_size=8,
    ),
    st.integers(min_value=1, max_value=len(HEAT_BOUNDS_NS) + 1),
)
def test_heatmap_bands_property(samples: list[list[int]], max_rows: int) -> None:
    bands = heat_bands(interval_docs(samples, VICTIM), VICTIM_SELECTION, max_rows)
    if not any(samples):
        assert bands == []
        return
    assert len(bands) <= max_rows
    flat = [v for values in samples for v in values]
    # the lowest band holds the smallest sample, the highest band the largest
    assert naive_band_count([min(flat)], bands[0].lower_ns, bands[0].upper_ns) == 1
    assert naive_band_count([max(flat)], bands[-1].lower_ns, bands[-1].upper_ns) == 1
    for band in bands:
        assert band.counts == tuple(
            naive_band_count(v, band.lower_ns, band.upper_ns) for v in samples
        )


def test_heatmap_text_shades_each_cell_by_count() -> None:
    # One band holding everything: 12 µs and 14 µs are both in (10, 20] µs.
    counts = [0, 1, 2, 3, 4, 5, 8]
    samples = [[12_000] * (n - n // 2) + [14_000] * (n // 2) for n in counts]
    text = render_text(heatmap(interval_docs(samples, VICTIM), VICTIM_SELECTION))
    (row,) = [line for line in text.splitlines() if line.strip().startswith("≤20µs")]
    cells = row.split("│ ", 1)[1]
    cell_width = len(cells.rstrip()) // len(counts)
    assert cell_width == 3  # few intervals: wide cells
    glyphs = cells[::cell_width][: len(counts)]
    # quarters of the peak (8): 1..2 -> ░, 3..4 -> ▒, 5..6 -> ▓, 7..8 -> █; 0 blank
    assert glyphs == " ░░▒▒▓█"
    assert "of 8 events" in text
    assert "P99 per interval" in text and "run-queue wait (runqueue): /victim" in text


def test_shade_levels() -> None:
    assert [shade(n, 100) for n in (0, 1, 25, 26, 50, 51, 75, 76, 100)] == list(" ░░▒▒▓▓██")
    assert shade(0, 0) == HEAT_SHADES[0]


def test_interval_p99_is_exact_from_full_resolution() -> None:
    samples = random_intervals(11, 9)
    p99s = interval_p99s_ns(interval_docs(samples, VICTIM), VICTIM_SELECTION)
    for values, p99 in zip(samples, p99s, strict=True):
        if not values:
            assert math.isnan(p99)
            continue
        # numpy's order statistic at rank ceil(0.99 n) lies in the same 5 µs bucket as our P99
        ranked = np.sort(np.array(values))
        truth = int(ranked[math.ceil(0.99 * len(values)) - 1])
        if truth > 10_240_000:
            continue  # a power-of-two tail bucket: not 5 µs wide
        upper = max(5_000, math.ceil(truth / 5_000) * 5_000)
        assert upper - 5_000 <= p99 <= upper


def test_heatmap_without_events_says_so() -> None:
    text = render_text(heatmap(interval_docs([[], []], VICTIM), VICTIM_SELECTION))
    assert "no events" in text


# -- selection and keys ---------------------------------------------------------------------


def selection_doc() -> HistDocument:
    def series(labels: dict[str, str], n: int) -> Series:
        return Series(labels, Histogram.from_samples([7_000] * n))

    return HistDocument(
        0,
        10**9,
        [
            series({"probe": "runqueue", "cgroup": "/b"}, 3),
            series({"probe": "runqueue", "cgroup": "/a"}, 5),
            series({"probe": "runqueue", "cgroup": "/c"}, 1),
            series({"probe": "netsyscall", "cgroup": "/n", "syscall": "sendto"}, 2),
            series({"probe": "netsyscall", "cgroup": "/n", "syscall": "recvfrom"}, 9),
        ],
    )


def cgroups_after(keys: Sequence[str], start: Selection | None) -> list[str]:
    doc = selection_doc()
    seen = []
    selection = start
    for key in keys:
        selection = apply_key(doc, selection, key)
        assert selection is not None
        seen.append(" ".join(v for k, v in selection.key if k != "probe"))
    return seen


def test_selection_moves_in_table_order_and_wraps() -> None:
    doc = selection_doc()
    first = resolve_selection(doc, None)
    # probes by name, rows by count: netsyscall's recvfrom (9) first
    assert first == Selection(
        "netsyscall",
        series_key({"probe": "netsyscall", "cgroup": "/n", "syscall": "recvfrom"}),
    )
    runqueue_a = Selection("runqueue", series_key({"probe": "runqueue", "cgroup": "/a"}))
    assert cgroups_after([KEY_DOWN] * 4, runqueue_a) == ["/b", "/c", "/a", "/b"]
    assert cgroups_after([KEY_UP] * 2, runqueue_a) == ["/c", "/b"]
    assert cgroups_after([KEY_NEXT_PROBE] * 3, runqueue_a) == [
        "/n recvfrom",
        "/a",
        "/n recvfrom",
    ]
    assert cgroups_after([KEY_PREVIOUS_PROBE, KEY_DOWN], runqueue_a) == ["/n recvfrom", "/n sendto"]
    assert cgroups_after(["x", "?"], runqueue_a) == ["/a", "/a"]
    gone = Selection("runqueue", series_key({"probe": "runqueue", "cgroup": "/gone"}))
    assert resolve_selection(doc, gone) == first
    assert resolve_selection(HistDocument(0, 1), None) is None


def test_decode_keys() -> None:
    raw = "\x1b[A\x1b[Bjk\tq\x1b[Z\x1bOA\x1bOB\x1b[1;5Cx\x1b"
    assert decode_keys(raw) == [
        KEY_UP,
        KEY_DOWN,
        KEY_DOWN,
        KEY_UP,
        KEY_NEXT_PROBE,
        KEY_QUIT,
        KEY_PREVIOUS_PROBE,
        KEY_UP,
        KEY_DOWN,
        "x",
    ]


# -- the whole view -------------------------------------------------------------------------


def busy_document() -> tuple[HistDocument, list[HistDocument]]:
    long = "/system.slice/a-rather-long-unit-name-for-a-service.service/with/some/depth"
    series = [
        Series({"probe": "runqueue", "cgroup": f"{long}/{i}"}, Histogram.from_samples([i * 9_000]))
        for i in range(1, 9)
    ]
    series.append(Series(VICTIM, Histogram.from_samples([20_000, 3_000_000])))
    series.append(
        Series(
            {"probe": "netsyscall", "cgroup": long, "syscall": "recvmmsg"},
            Histogram.from_samples([4_000]),
        )
    )
    counters = [
        Counter("runqueue_displaced_wait_ns", {"victim": long, "aggressor": long + "/x"}, 7_000),
        Counter("runqueue_displaced_switches", {"victim": long, "aggressor": long + "/x"}, 1),
        Counter("runqueue_dropped_events", {"reason": "ringbuf"}, 3),
        Counter(
            "runqueue_outlier_events",
            {
                "probe": "runqueue",
                "cgroup": long,
                "kernel_stack": ";".join(f"kernel_function_{i}" for i in range(30)),
                "user_stack": "main;loop",
            },
            4,
        ),
        Counter("throttle_periods", {"cgroup": "/victim", "cpu_max": "20000 100000"}, 10),
        Counter("throttle_throttled_periods", {"cgroup": "/victim", "cpu_max": "20000 100000"}, 7),
        Counter("throttle_throttled_ns", {"cgroup": "/victim", "cpu_max": "20000 100000"}, 61e6),
        Counter("pressure_some_ns", {"cgroup": long, "resource": "memory"}, 2_500_000),
    ]
    intervals = interval_docs(random_intervals(3, 100), VICTIM)
    return HistDocument(0, 25 * 10**9, series, counters), intervals


@pytest.mark.parametrize("console_width", [80, 200])
def test_whole_view_fits_80_columns(console_width: int) -> None:
    document, intervals = busy_document()
    selection = VICTIM_SELECTION
    text = render_text(
        render(document, "live", selection=selection, intervals=intervals, keys_help=True),
        console_width,
    )
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= VIEW_WIDTH
    assert lines[-1].strip() == KEY_HELP
    assert "▶/victim" in text  # the selected row is marked without relying on colour
    assert "run-queue wait (runqueue): /victim" in text
    assert "P99 per interval" in text and "victim <- aggressor" in text


def test_limits_and_stalls_per_cgroup() -> None:
    """The throttled cgroup with its limit, throttled time and periods; a stalled one with its
    memory stall; the most throttled or stalled first."""
    document, _ = busy_document()
    text = render_text(render(document, "interval"), 200)
    table = text[text.index("CPU limits and stalls") :]
    victim = next(line for line in table.splitlines() if "/victim" in line)
    cells = [cell.strip() for cell in victim.strip("│ ").split("│")]
    assert cells == ["/victim", "20/100 ms", "61.0 (7/10)", "0.0", "0.0", "0.0"]
    assert table.index("/victim") < table.index("/system.slice")
    assert "none" in table and "2.5" in table


def test_live_view_fits_height_and_keeps_the_selection_visible() -> None:
    document, intervals = busy_document()
    # the victim has the fewest events but one: its row is beyond the first five
    text = render_text(
        render(
            document,
            "live",
            selection=VICTIM_SELECTION,
            intervals=intervals,
            height=45,
            keys_help=True,
        )
    )
    lines = text.splitlines()
    assert len(lines) <= 45
    assert max(len(line) for line in lines) <= VIEW_WIDTH
    assert "▶/victim" in text and "more" in text
    assert "P99 per interval" in text  # the heatmap outranks the stacks
    assert "top outlier stacks" not in text
    assert lines[-1].strip() == KEY_HELP


# -- the live loop with a fake session and scripted keys ------------------------------------


class FakeSession:
    """Each advance adds one interval: 3 waits of 12 µs in /a and 1 of 40 ms in /b."""

    def __init__(self) -> None:
        self.advances = 0
        self.total = {"/a": Histogram.empty(), "/b": Histogram.empty()}
        self.filters = 0

    def refresh_filter(self) -> None:
        self.filters += 1

    def advance(self) -> tuple[HistDocument, HistDocument]:
        self.advances += 1
        step = {
            "/a": Histogram.from_samples([12_000] * 3),
            "/b": Histogram.from_samples([40_000_000]),
        }
        self.total = {path: self.total[path] + step[path] for path in step}
        now = self.advances * INTERVAL_NS

        def doc(hists: dict[str, Histogram], start_ns: int) -> HistDocument:
            return HistDocument(
                start_ns,
                now,
                [Series({"probe": "runqueue", "cgroup": p}, h) for p, h in hists.items()],
            )

        return doc(self.total, 0), doc(step, now - INTERVAL_NS)


class ScriptedKeys:
    """Keys from a list; None waits out the timeout like a quiet terminal."""

    def __init__(self, script: Sequence[str | None]) -> None:
        self.script = list(script)

    def read(self, timeout_s: float) -> str | None:
        key = self.script.pop(0) if self.script else None
        if key is None:
            time.sleep(timeout_s)
        return key


def test_live_loop_moves_selection_and_quits_on_q() -> None:
    session = FakeSession()
    console = Console(width=80, file=io.StringIO())
    keys = ScriptedKeys([KEY_DOWN, None, None, KEY_DOWN, KEY_DOWN, None, KEY_QUIT])
    started = time.monotonic()
    result = run_live(session, 30.0, 0.02, console, keys=keys)
    assert time.monotonic() - started < 5  # q, not the 30 s duration, ended it
    # /a (3 per interval) is first; down, down, down wraps back to /b
    assert result.selection == Selection(
        "runqueue", series_key({"probe": "runqueue", "cgroup": "/b"})
    )
    # one advance to start (not an interval), then one per refresh and one after q
    assert session.advances >= 4
    assert len(result.intervals) == session.advances - 1
    (a,) = result.summary.find(cgroup="/a")
    assert a.hist.count == 3 * session.advances
    a_key = series_key({"probe": "runqueue", "cgroup": "/a"})
    in_intervals = [i.histogram(a_key) for i in result.intervals]
    assert sum(h.count for h in in_intervals if h is not None) == 3 * len(result.intervals)


def test_live_loop_without_keys_runs_for_the_duration() -> None:
    session = FakeSession()
    console = Console(width=80, file=io.StringIO())
    result = run_live(session, 0.2, 0.05, console)
    assert 3 <= len(result.intervals) <= 5
    assert session.filters == len(result.intervals)
    for interval in result.intervals:
        counts = [interval.histogram(key).count for key in interval.parts]  # type: ignore[union-attr]
        assert counts == [3, 1]
