"""What ``tailsight trace`` draws: per-probe latency tables, victim <- aggressor pairs, outlier
stacks and, for the selected series, a heatmap of its 5 µs histogram over the last intervals with
its exact per-interval P99; plus the keys that move the selection.

Render functions are pure (documents in, rich renderable out) and fit 80 columns; rich is imported
inside them so that ``tailsight --help`` stays instant.
"""

from __future__ import annotations

import io
import math
import os
import select
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    from rich.console import RenderableType
    from rich.table import Table

    from tailsight.hist import Histogram, SparseHistogram
    from tailsight.intervals import HistDocument, Series

VIEW_WIDTH: Final = 80
# Sparkline columns: exact coarse buckets (each an upper bound of the 5 µs model), then "more".
SPARK_BOUNDS_NS: Final = (
    5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000, 2_500_000,
    5_000_000, 10_240_000, 20_480_000, 40_960_000, 81_920_000, 163_840_000,
)  # fmt: skip
SPARK_LEGEND: Final = "5µs ... 160ms+"
_BLOCKS: Final = "▁▂▃▄▅▆▇█"

# Heatmap bands: a 1-2-5 ladder over the linear range, then every power-of-two tail bucket, so
# each band is an exact union of 5 µs buckets (Histogram.rebucket); the last band is "above".
HEAT_BOUNDS_NS: Final = (
    5_000, 10_000, 20_000, 50_000, 100_000, 200_000, 500_000, 1_000_000, 2_000_000, 5_000_000,
    10_240_000, 20_480_000, 40_960_000, 81_920_000, 163_840_000, 327_680_000, 655_360_000,
    1_310_720_000, 2_621_440_000, 5_242_880_000, 10_485_760_000,
)  # fmt: skip
HEAT_SHADES: Final = " ░▒▓█"
HEAT_MAX_ROWS: Final = 10
_LABEL_WIDTH: Final = len("≤1.31072s") + 1  # the longest band label
HISTORY_INTERVALS: Final = 64
"""Interval documents kept for the heatmap (more than fit: the width decides what is shown)."""

KEY_UP: Final = "up"
KEY_DOWN: Final = "down"
KEY_NEXT_PROBE: Final = "tab"
KEY_PREVIOUS_PROBE: Final = "shift-tab"
KEY_QUIT: Final = "q"
KEY_HELP: Final = "↑/↓ or j/k: select   tab: next probe   q: quit"
# Arrow keys arrive as CSI (ESC [ A) or, in application cursor mode, SS3 (ESC O A) sequences.
_SEQUENCES: Final = {
    "\x1b[A": KEY_UP,
    "\x1bOA": KEY_UP,
    "\x1b[B": KEY_DOWN,
    "\x1bOB": KEY_DOWN,
    "\x1b[Z": KEY_PREVIOUS_PROBE,
    "\t": KEY_NEXT_PROBE,
    "k": KEY_UP,
    "j": KEY_DOWN,
    "q": KEY_QUIT,
    "Q": KEY_QUIT,
}

SeriesKey = tuple[tuple[str, str], ...]
"""A series' identity: its labels, sorted (the probe label included)."""


def series_key(labels: Mapping[str, str]) -> SeriesKey:
    """The identity of the series with these labels."""
    return tuple(sorted(labels.items()))


@dataclass(frozen=True)
class Selection:
    """The series the heatmap shows; kept by identity, so it survives rows re-sorting."""

    probe: str
    key: SeriesKey


# -- tables ---------------------------------------------------------------------------------


def sparkline(hist: Histogram) -> str:
    """One character per coarse bucket, height relative to the fullest (blank = empty)."""
    counts = hist.rebucket(SPARK_BOUNDS_NS).tolist()
    peak = max(counts)
    if peak == 0:
        return " " * len(counts)
    return "".join(
        " " if n == 0 else _BLOCKS[min(len(_BLOCKS) - 1, int(len(_BLOCKS) * n / peak))]
        for n in counts
    )


def _us(value_ns: float) -> str:
    if math.isnan(value_ns):
        return "-"
    return f"{value_ns / 1_000:,.0f}" if value_ns >= 10_000 else f"{value_ns / 1_000:.1f}"


def series_name(labels: Mapping[str, str]) -> str:
    """A series' row heading: its cgroup, then any other labels (e.g. the syscall)."""
    extra = [v for k, v in sorted(labels.items()) if k not in ("probe", "cgroup")]
    return " ".join([labels.get("cgroup", "?"), *extra])


def by_probe(document: HistDocument) -> dict[str, list[Series]]:
    """Series per probe, probes by name, rows in table order (most events first)."""
    grouped: dict[str, list[Series]] = {}
    for s in document.series:
        grouped.setdefault(s.labels.get("probe", "?"), []).append(s)
    return {
        probe: sorted(grouped[probe], key=lambda s: (-s.hist.count, series_name(s.labels)))
        for probe in sorted(grouped)
    }


def _latency_table(
    title: str, rows: list[Series], selected: SeriesKey | None = None, max_rows: int | None = None
) -> Table:
    from rich.table import Table
    from rich.text import Text

    shown = _window(rows, selected, max_rows)
    hidden = len(rows) - len(shown)
    table = Table(
        title=title,
        width=VIEW_WIDTH,
        title_justify="left",
        pad_edge=False,
        caption=f"... {hidden} more" if hidden else None,
        caption_justify="left",
    )
    table.add_column("cgroup", overflow="fold", ratio=1)
    for heading in ("count", "P50 µs", "P99 µs", "P99.9 µs"):
        table.add_column(heading, justify="right", no_wrap=True)
    table.add_column(SPARK_LEGEND, no_wrap=True, width=len(SPARK_BOUNDS_NS) + 1)
    for s in shown:
        p50, p99, p999 = s.hist.quantiles([0.5, 0.99, 0.999])
        mine = selected is not None and series_key(s.labels) == selected
        # The marker, not only the style, shows the selection: readable without colours.
        name = Text(("▶" if mine else "") + series_name(s.labels))
        table.add_row(
            name,
            f"{s.hist.count:,}",
            _us(p50),
            _us(p99),
            _us(p999),
            sparkline(s.hist),
            style="reverse" if mine else None,
        )
    return table


def _window(rows: list[Series], selected: SeriesKey | None, max_rows: int | None) -> list[Series]:
    """At most ``max_rows`` rows from the top, shifted down just enough to show the selection."""
    if max_rows is None or len(rows) <= max_rows:
        return rows
    keys = [series_key(s.labels) for s in rows]
    at = keys.index(selected) if selected in keys else 0
    first = max(0, at - max_rows + 1)
    return rows[first : first + max_rows]


def _pairs_table(document: HistDocument, top: int) -> Table | None:
    from rich.table import Table
    from rich.text import Text

    # Loads numpy: kept out of `tailsight --help`.
    from tailsight.probes.runqueue import top_pairs

    pairs = top_pairs(document, top)
    if not pairs:
        return None
    table = Table(
        title="run-queue wait: victim <- aggressor",
        width=VIEW_WIDTH,
        title_justify="left",
        pad_edge=False,
    )
    table.add_column("victim", overflow="fold", ratio=1)
    table.add_column("aggressor", overflow="fold", ratio=1)
    table.add_column("wait ms", justify="right", no_wrap=True)
    table.add_column("switches", justify="right", no_wrap=True)
    for victim, aggressor, wait_ns, switches in pairs:
        table.add_row(Text(victim), Text(aggressor), f"{wait_ns / 1e6:,.1f}", f"{switches:,}")
    return table


def _limits_table(document: HistDocument, top: int) -> Table | None:
    """Per cgroup its CPU limit and how often it throttled it, and its stall time per resource
    (throttle and pressure probes): the most throttled or stalled first."""
    from rich.table import Table
    from rich.text import Text

    # Loads numpy: kept out of `tailsight --help`.
    from tailsight.probes.pressure import RESOURCES
    from tailsight.probes.pressure import SOME as STALLED
    from tailsight.probes.throttle import (
        LIMIT_LABEL,
        PERIODS,
        THROTTLED,
        THROTTLED_PERIODS,
    )

    rows: dict[str, dict[str, float]] = {}
    limits: dict[str, str] = {}
    for counter in document.counters:
        cgroup = counter.labels.get("cgroup")
        if cgroup is None:
            continue
        if counter.name in (PERIODS, THROTTLED_PERIODS, THROTTLED):
            limits[cgroup] = counter.labels.get(LIMIT_LABEL, "")
            column = counter.name
        elif counter.name == STALLED:
            column = counter.labels.get("resource", "")
        else:
            continue
        row = rows.setdefault(cgroup, {})
        row[column] = row.get(column, 0) + counter.value
    if not any(v for row in rows.values() for v in row.values()):
        return None
    table = Table(
        title="CPU limits and stalls: throttled ms (periods), stall ms",
        width=VIEW_WIDTH,
        title_justify="left",
        pad_edge=False,
    )
    table.add_column("cgroup", overflow="fold", ratio=1)
    table.add_column("limit", no_wrap=True)
    table.add_column("throttled", justify="right", no_wrap=True)
    for resource in RESOURCES:
        table.add_column(resource, justify="right", no_wrap=True)

    def weight(item: tuple[str, dict[str, float]]) -> float:
        return -sum(v for k, v in item[1].items() if k not in (PERIODS, THROTTLED_PERIODS))

    for cgroup, row in sorted(rows.items(), key=weight)[:top]:
        limit = limits.get(cgroup)
        throttled = (
            f"{row.get(THROTTLED, 0) / 1e6:,.1f} "
            f"({row.get(THROTTLED_PERIODS, 0):,.0f}/{row.get(PERIODS, 0):,.0f})"
            if limit
            else "-"
        )
        stalls = [f"{row.get(resource, 0) / 1e6:,.1f}" for resource in RESOURCES]
        table.add_row(Text(cgroup), _limit_text(limit) if limit else "none", throttled, *stalls)
    return table


def _limit_text(cpu_max: str) -> str:
    """ "20000 100000" -> "20/100 ms"."""
    quota, _, period = cpu_max.partition(" ")
    if not quota.isdigit() or not period.isdigit():
        return cpu_max
    return f"{int(quota) / 1000:g}/{int(period) / 1000:g} ms"


def _stacks_table(document: HistDocument, top: int) -> Table | None:
    from rich.table import Table
    from rich.text import Text

    # Loads numpy: kept out of `tailsight --help`.
    from tailsight.probes.outliers import short_stack, top_outlier_stacks

    stacks = top_outlier_stacks(document, top)
    if not stacks:
        return None
    table = Table(
        title="top outlier stacks (leaf last)",
        width=VIEW_WIDTH,
        title_justify="left",
        pad_edge=False,
    )
    table.add_column("probe cgroup", overflow="fold", ratio=2)
    table.add_column("events", justify="right", no_wrap=True)
    table.add_column("kernel | user", overflow="fold", ratio=3)
    for stack in stacks:
        frames = f"{short_stack(stack.kernel_stack)} | {short_stack(stack.user_stack)}"
        where = " ".join(filter(None, (stack.probe, stack.cgroup, stack.detail)))
        table.add_row(Text(where), f"{stack.events:,}", Text(frames))
    return table


def render(
    document: HistDocument,
    title: str,
    top: int = 5,
    selection: Selection | None = None,
    intervals: Sequence[HeatInterval] = (),
    height: int | None = None,
    keys_help: bool = False,
) -> RenderableType:
    """One latency table per probe (count, P50/P99/P99.9 µs, sparkline), the selected series'
    heatmap (when ``intervals`` are given), the top displaced pairs, CPU limits and stalls,
    outlier stacks and drops.

    With ``height`` (the live view) tables are cut to a few rows around the selection and the
    least important parts are left out until the view fits that many lines.
    """
    from rich.console import Group
    from rich.text import Text

    # Loads numpy: kept out of `tailsight --help`.
    from tailsight.probes.catalog import probe_title

    live = height is not None
    grouped = by_probe(document)
    selected = selection.key if selection is not None else None
    # (priority, part): parts are left out from the lowest priority up when the height is short.
    parts: list[tuple[int, RenderableType]] = [(9, Text(title, style="bold"))]
    for probe, rows in grouped.items():
        heading = probe_title(probe)
        table = _latency_table(f"{heading} ({probe})", rows, selected, 5 if live else None)
        parts.append((7 if selection is not None and probe == selection.probe else 5, table))
    if selection is not None and intervals:
        parts.append((8, heatmap(intervals, selection)))
    pairs = _pairs_table(document, 3 if live else top)
    if pairs is not None:
        parts.append((4, pairs))
    limits = _limits_table(document, 3 if live else top)
    if limits is not None:
        parts.append((4, limits))
    stacks = _stacks_table(document, 3 if live else top)
    if stacks is not None:
        parts.append((3, stacks))
    dropped = sum(c.value for c in document.counters if c.name.endswith("_dropped_events"))
    if dropped:
        parts.append((2, Text(f"dropped events: {dropped}")))
    if keys_help:
        parts.append((9, Text(KEY_HELP, style="dim")))
    if height is not None:
        parts = _fit(parts, height)
    return Group(*(part for _, part in parts))


def _fit(parts: list[tuple[int, RenderableType]], height: int) -> list[tuple[int, RenderableType]]:
    """Leave parts out, lowest priority first, until the rest fits ``height`` lines."""
    from rich.console import Console

    measure = Console(width=VIEW_WIDTH, file=io.StringIO(), color_system=None)
    lines = [len(measure.render_lines(part, pad=False)) for _, part in parts]
    kept = list(range(len(parts)))
    for priority in sorted({p for p, _ in parts}):
        if sum(lines[i] for i in kept) <= height:
            break
        # Drop the last part of this priority first (later tables matter less).
        for i in reversed(kept):
            if parts[i][0] == priority and sum(lines[j] for j in kept) > height:
                kept.remove(i)
    return [parts[i] for i in kept]


# -- selection ------------------------------------------------------------------------------


def resolve_selection(document: HistDocument, selection: Selection | None) -> Selection | None:
    """The selection if its series exists, else the first row of the first probe (or None)."""
    grouped = by_probe(document)
    if selection is not None and selection.key in {
        series_key(s.labels) for s in grouped.get(selection.probe, [])
    }:
        return selection
    for probe, rows in grouped.items():
        return Selection(probe, series_key(rows[0].labels))
    return selection


def move_selection(
    document: HistDocument, selection: Selection | None, step: int
) -> Selection | None:
    """``step`` rows down (negative: up) in the selected probe's table, wrapping around."""
    current = resolve_selection(document, selection)
    if current is None:
        return None
    keys = [series_key(s.labels) for s in by_probe(document)[current.probe]]
    return Selection(current.probe, keys[(keys.index(current.key) + step) % len(keys)])


def switch_probe(
    document: HistDocument, selection: Selection | None, step: int
) -> Selection | None:
    """The first row of the next (``step`` = 1) or previous probe's table, wrapping around."""
    current = resolve_selection(document, selection)
    if current is None:
        return None
    probes = list(by_probe(document))
    probe = probes[(probes.index(current.probe) + step) % len(probes)]
    return Selection(probe, series_key(by_probe(document)[probe][0].labels))


def apply_key(document: HistDocument, selection: Selection | None, key: str) -> Selection | None:
    """The selection after one key (unknown keys change nothing)."""
    if key == KEY_UP:
        return move_selection(document, selection, -1)
    if key == KEY_DOWN:
        return move_selection(document, selection, 1)
    if key == KEY_NEXT_PROBE:
        return switch_probe(document, selection, 1)
    if key == KEY_PREVIOUS_PROBE:
        return switch_probe(document, selection, -1)
    return selection


# -- keys -----------------------------------------------------------------------------------


class KeySource(Protocol):
    """Where the live view gets keys from: the terminal, or a script in tests."""

    def read(self, timeout_s: float) -> str | None:
        """The next key (``KEY_*`` or the character), None if none came within the timeout."""


def decode_keys(data: str) -> list[str]:
    """Key names from raw terminal input; a lone ESC or unknown sequence is dropped whole."""
    keys: list[str] = []
    i = 0
    while i < len(data):
        for sequence, name in _SEQUENCES.items():
            if data.startswith(sequence, i):
                keys.append(name)
                i += len(sequence)
                break
        else:
            if data[i] == "\x1b":
                # Skip an unknown escape sequence: ESC, optional [ or O, parameters, final byte.
                i += 1
                if i < len(data) and data[i] in "[O":
                    i += 1
                while i < len(data) and not ("@" <= data[i] <= "~"):
                    i += 1
                i += 1
            else:
                keys.append(data[i])
                i += 1
    return keys


class TerminalKeys:
    """Keys from a TTY in cbreak mode (no echo, no line buffering; Ctrl-C still interrupts)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.pending: list[str] = []

    def read(self, timeout_s: float) -> str | None:
        if not self.pending:
            ready, _, _ = select.select([self.fd], [], [], max(0.0, timeout_s))
            if not ready:
                return None
            data = os.read(self.fd, 64)
            if not data:
                return None
            self.pending.extend(decode_keys(data.decode("utf-8", "replace")))
        return self.pending.pop(0) if self.pending else None


@contextmanager
def terminal_keys() -> Iterator[KeySource | None]:
    """Keys from stdin while the block runs, if stdin and stdout are terminals; else None."""
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        yield None
        return
    import termios
    import tty

    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        yield TerminalKeys(fd)
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


# -- heatmap --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Band:
    """One heatmap row: counts per interval of values in ``(lower_ns, upper_ns]``."""

    lower_ns: int
    upper_ns: int | None  # None: above lower_ns, overflow included
    counts: tuple[int, ...]


@dataclass(frozen=True)
class HeatInterval:
    """One interval's series as their non-zero buckets, what the heatmap keeps of it.  The live
    view holds HISTORY_INTERVALS of them; whole documents (a dense 16 KiB row per series, and
    every counter) grew `trace` by ~6 MiB an interval at 30 busy cgroups, to ~390 MiB."""

    start_ns: int
    end_ns: int
    parts: Mapping[SeriesKey, SparseHistogram]

    @classmethod
    def of(cls, document: HistDocument) -> HeatInterval:
        parts: dict[SeriesKey, SparseHistogram] = {}
        for s in document.series:
            parts.setdefault(series_key(s.labels), s.sparse)
        return cls(document.start_ns, document.end_ns, parts)

    def histogram(self, key: SeriesKey) -> Histogram | None:
        """The series' interval histogram (None: no events in it)."""
        part = self.parts.get(key)
        return None if part is None else part.dense()


def band_counts(intervals: Sequence[HeatInterval], selection: Selection) -> npt.NDArray[np.int64]:
    """Counts per HEAT_BOUNDS_NS band (rows, lowest first) and interval (columns), exact."""
    import numpy as np

    matrix = np.zeros((len(HEAT_BOUNDS_NS) + 1, len(intervals)), dtype=np.int64)
    for column, interval in enumerate(intervals):
        hist = interval.histogram(selection.key)
        if hist is not None:
            matrix[:, column] = hist.rebucket(HEAT_BOUNDS_NS)
    return matrix


def heat_bands(
    intervals: Sequence[HeatInterval], selection: Selection, max_rows: int = HEAT_MAX_ROWS
) -> list[Band]:
    """The bands from the lowest to the highest non-empty one, adjacent bands merged (still exact
    unions of 5 µs buckets) when there are more than ``max_rows``; lowest band first."""
    import numpy as np

    matrix = band_counts(intervals, selection)
    used = np.flatnonzero(matrix.sum(axis=1))
    if used.size == 0:
        return []
    low, high = int(used[0]), int(used[-1])
    group = math.ceil((high - low + 1) / max_rows)
    lowers = (0, *HEAT_BOUNDS_NS)
    bands = []
    for first in range(low, high + 1, group):
        last = min(high, first + group - 1)
        upper = HEAT_BOUNDS_NS[last] if last < len(HEAT_BOUNDS_NS) else None
        counts = matrix[first : last + 1].sum(axis=0)
        bands.append(Band(lowers[first], upper, tuple(int(n) for n in counts)))
    return bands


def shade(count: int, peak: int) -> str:
    """Heatmap cell: blank for none, then quarters of the peak (any count shows at least ░)."""
    if count <= 0 or peak <= 0:
        return HEAT_SHADES[0]
    level = math.ceil((len(HEAT_SHADES) - 1) * count / peak)
    return HEAT_SHADES[min(len(HEAT_SHADES) - 1, max(1, level))]


def duration_label(value_ns: float) -> str:
    """Exact duration with the largest fitting unit: 5µs, 500µs, 10.24ms, 1.31072s."""
    for unit_ns, unit in ((1_000_000_000, "s"), (1_000_000, "ms")):
        if value_ns >= unit_ns:
            return f"{value_ns / unit_ns:.6f}".rstrip("0").rstrip(".") + unit
    return f"{value_ns / 1_000:.6f}".rstrip("0").rstrip(".") + "µs"


def _short_duration(value_ns: float) -> str:
    """Three significant digits (a measured quantile, not a bound)."""
    for unit_ns, unit in ((1_000_000_000, "s"), (1_000_000, "ms")):
        if value_ns >= unit_ns:
            return f"{value_ns / unit_ns:.3g}{unit}"
    return f"{value_ns / 1_000:.3g}µs"


def interval_p99s_ns(intervals: Sequence[HeatInterval], selection: Selection) -> list[float]:
    """The selected series' exact P99 per interval (from its full 5 µs histogram; nan: none)."""
    p99s = []
    for interval in intervals:
        hist = interval.histogram(selection.key)
        p99s.append(math.nan if hist is None else hist.quantile(0.99))
    return p99s


def _p99_line(p99s: list[float], cell: int) -> str:
    """Bar heights from 0 to the window's highest P99 (blank: no events in that interval)."""
    high = max((p for p in p99s if not math.isnan(p)), default=0.0)
    chars = []
    for p in p99s:
        if math.isnan(p) or high <= 0:
            chars.append(" " * cell)
            continue
        level = max(0, math.ceil(len(_BLOCKS) * p / high) - 1)
        chars.append(_BLOCKS[level] * cell)
    return "".join(chars)


def heatmap(
    intervals: Sequence[HeatInterval], selection: Selection, width: int = VIEW_WIDTH
) -> RenderableType:
    """The selected series' histogram over the last intervals (newest right), rows are latency
    bands (highest on top), shade = events in the interval; below, its exact per-interval P99."""
    from rich.text import Text

    # Loads numpy: kept out of `tailsight --help`.
    from tailsight.probes.catalog import probe_title

    heading = probe_title(selection.probe)
    name = series_name(dict(selection.key))
    lines = [Text(f"{heading} ({selection.probe}): {name}", style="bold", overflow="fold")]
    room = width - _LABEL_WIDTH - 3
    shown = list(intervals[-room:])
    bands = heat_bands(shown, selection)
    if not bands:
        lines.append(Text("no events in the last intervals"))
        return Text("\n").join(lines)
    cell = max(1, min(3, room // len(shown)))
    peak = max(max(b.counts) for b in bands)
    for band in reversed(bands):
        label = (
            f"≤{duration_label(band.upper_ns)}"
            if band.upper_ns is not None
            else f">{duration_label(band.lower_ns)}"
        )
        row = "".join(shade(n, peak) * cell for n in band.counts)
        lines.append(Text(f"{label:>{_LABEL_WIDTH}} │ {row}"))
    columns = cell * len(shown)
    lines.append(Text(f"{'':>{_LABEL_WIDTH}} └{'─' * (columns + 1)}"))
    p99s = interval_p99s_ns(shown, selection)
    lines.append(Text(f"{'P99':>{_LABEL_WIDTH}}   {_p99_line(p99s, cell)}"))
    span_s = (shown[-1].end_ns - shown[0].start_ns) / 1e9
    left, right = f"-{span_s:.1f} s", "now"
    axis = left + right.rjust(max(len(right) + 1, columns - len(left)))
    lines.append(Text(f"{'':>{_LABEL_WIDTH}}   {axis}"))
    lines.append(
        Text(
            f"{span_s / len(shown):.2g} s per column; shade ░ ▒ ▓ █ = up to ¼ ½ ¾ all of "
            f"{peak:,} events",
            overflow="fold",
        )
    )
    finite = [p for p in p99s if not math.isnan(p)]
    if finite:
        lines.append(
            Text(
                f"P99 per interval (exact, 5 µs buckets): last {_short_duration(finite[-1])}, "
                f"min {_short_duration(min(finite))}, max {_short_duration(max(finite))}",
                overflow="fold",
            )
        )
    return Text("\n").join(lines)
