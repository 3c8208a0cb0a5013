"""The ``tailsight explain --html`` report: one self-contained page, hand-written inline SVG.

No script, no stylesheet or font fetch, no external reference of any kind, so it renders the same
offline, from a mail attachment or a CI artifact. The markup is well-formed XML (SVG in its own
namespace), which is also how the tests check it.
"""

from __future__ import annotations

import html
import math
import os
import tempfile
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

import numpy as np
import numpy.typing as npt

from tailsight.analysis.attribution import Estimate
from tailsight.analysis.causes import Cause
from tailsight.analysis.explain.model import PLOT_QUANTILES, JumpExplanation, Report
from tailsight.analysis.explain.pipeline import view_counts
from tailsight.analysis.explain.text import (
    incident_sentences,
    jump_sentences,
    jump_title,
    report_headline,
)
from tailsight.analysis.quantiles import quantile_name
from tailsight.hist import BUCKET_WIDTH_NS, LINEAR_BUCKETS
from tailsight.intervals import HistDocument

SVG_NS: Final = "http://www.w3.org/2000/svg"
PLOT_W: Final = 720
PLOT_H: Final = 240
MARGIN_L: Final = 70
MARGIN_B: Final = 30
PLOT_TOP: Final = 24
HEAT_ROWS: Final = 60
QUANTILE_COLORS: Final = {0.5: "#4c78a8", 0.99: "#e45756", 0.999: "#b279a2"}
# A perceptually ordered ramp (viridis stops) for the heatmap, low to high.
RAMP: Final = ((68, 1, 84), (59, 82, 139), (33, 145, 140), (94, 201, 98), (253, 231, 37))
STYLE: Final = """
body { font-family: sans-serif; margin: 2em; color: #222; max-width: 60em; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 2em; }
svg { display: block; margin: 0.5em 0 1.5em 0; }
svg text { font-size: 11px; fill: #333; }
li { margin: 0.2em 0; }
code { font-size: 0.9em; word-break: break-all; }
"""


def render_html(
    report: Report, documents: Sequence[HistDocument], title: str = "tailsight explain"
) -> str:
    """The whole page for ``report`` (``documents``: the range it was computed from)."""
    body = [f"<h1>{_e(title)}</h1>", f"<p>{_e(report_headline(report))}</p>"]
    if report.selector:
        selected = ",".join(f"{k}={v}" for k, v in sorted(report.selector.items()))
        body.append(f"<p>Series filter: <code>{_e(selected)}</code></p>")
    level = f"{report.config.level:.0%}"
    for n, incident in enumerate(report.incidents, 1):
        head = incident.headline
        body.append(f'<section data-role="incident"><h2>{n}. {_e(jump_title(head))}</h2>')
        body.append("<ul>")  # the headline and its cause first
        body.extend(f"<li>{_e(line)}</li>" for line in incident_sentences(incident))
        body.append("</ul>")
        if incident.causes:
            cause = incident.causes[0]
            body.append("<p>The symptom (quantiles per interval) and the cause's signal.</p>")
            body.append('<div style="display:flex;flex-wrap:wrap;gap:1em">')
            body.append(quantile_plot(head, PLOT_W // 2))
            body.append(cause_plot(cause, head, PLOT_W // 2))
            body.append("</div>")
        for m, jump in enumerate(incident.jumps):
            body.append(f"<h3>{n}{chr(ord('a') + m % 26)}. {_e(jump_title(jump))}</h3>")
            body.append("<ul>")
            body.extend(f"<li>{_e(line)}</li>" for line in jump_sentences(jump, report.config.top))
            body.append("</ul>")
            body.append("<p>Quantiles per interval; shaded: the windows compared.</p>")
            body.append(quantile_plot(jump))
            body.append("<p>Histogram per interval (colour: log of the count).</p>")
            counts = view_counts(documents, jump.series, report.selector)
            body.append(heatmap(counts, jump))
            body.append(f"<p>Shares of the rise (bars) with {level} bootstrap intervals.</p>")
            body.append(share_bars(jump))
        if incident.folded:
            names = "; ".join(jump_title(j) for j in incident.folded)
            body.append(f"<p>Aggregates that rose with it (explained above): {_e(names)}.</p>")
        body.append("</section>")
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8" />'
        f"<title>{_e(title)}</title><style>{STYLE}</style></head>\n<body>\n"
        + "\n".join(body)
        + "\n</body></html>\n"
    )


# -- plots ---------------------------------------------------------------------------------------


def write_report(path: Path, page: str) -> None:
    """Write ``page`` atomically: a temporary file beside ``path``, renamed over it once complete,
    so a failed write (missing directory, no permission, full disk) leaves nothing behind."""
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(page)
        os.chmod(temp, 0o644)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def cause_plot(cause: Cause, jump: JumpExplanation, width: int = PLOT_W) -> str:
    """The cause's signal per interval (linear axis from 0), the symptom's change marked."""
    values = np.asarray(cause.values, dtype=np.float64)
    intervals = max(values.size, 1)
    top = float(values.max()) if values.size and values.max() > 0 else 1.0
    span = PLOT_H - MARGIN_B - PLOT_TOP

    def x(t: float) -> float:
        return MARGIN_L + (t + 0.5) / intervals * (width - MARGIN_L - 10)

    def y(value: float) -> float:
        return PLOT_TOP + (1.0 - value / (top * 1.1)) * span

    unit = " ns" if cause.kind in ("displacement", "steal") else ""
    where = cause.cgroup or f"CPU {cause.labels.get('cpu', '?')}"  # steal is per CPU
    parts = [_svg_open(width, PLOT_H, f"cause: {cause.kind} in {where}")]
    parts.append(f'<text x="{MARGIN_L}" y="14">{_e(cause.kind)} in {_e(where)}</text>')
    parts.append(
        f'<text x="{MARGIN_L - 4}" y="{y(top):.1f}" text-anchor="end">{top:,.0f}{unit}</text>'
    )
    parts.append(f'<text x="{MARGIN_L - 4}" y="{y(0):.1f}" text-anchor="end">0</text>')
    parts.extend(_time_axis(jump.starts_ns, x, PLOT_H - MARGIN_B, width))
    points = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in enumerate(values))
    parts.append(
        f'<polyline data-series="cause" points="{points}" fill="none" stroke="#f58518" '
        'stroke-width="1.5" />'
    )
    mark = x(jump.change_index - 0.5)
    parts.append(
        f'<line data-role="change" data-index="{jump.change_index}" x1="{mark:.1f}" '
        f'y1="{PLOT_TOP}" x2="{mark:.1f}" y2="{PLOT_TOP + span}" stroke="#000" '
        'stroke-dasharray="4 3" />'
    )
    parts.append("</svg>")
    return "\n".join(parts)


def quantile_plot(jump: JumpExplanation, width: int = PLOT_W) -> str:
    """Quantiles per interval on a log axis; before/after windows shaded, the change marked."""
    values = np.array(jump.interval_quantiles_ns, dtype=np.float64).reshape(-1, len(PLOT_QUANTILES))
    intervals = values.shape[0]
    finite = values[np.isfinite(values) & (values > 0)]
    low_us = max(1.0, float(finite.min()) / 1.3e3) if finite.size else 1.0
    high_us = max(low_us * 10, float(finite.max()) * 1.3 / 1e3) if finite.size else 10.0
    lo, hi = math.log10(low_us), math.log10(high_us)

    def x(t: float) -> float:
        return MARGIN_L + (t + 0.5) / max(intervals, 1) * (width - MARGIN_L - 10)

    def y(value_ns: float) -> float:
        level = (math.log10(value_ns / 1e3) - lo) / (hi - lo)
        return PLOT_TOP + (1.0 - level) * (PLOT_H - MARGIN_B - PLOT_TOP)

    parts = [_svg_open(width, PLOT_H, "quantiles over time")]
    w = jump.windows
    left = x(w.before_start - 0.5)
    mid = x(w.change - 0.5)
    right = x(w.after_stop - 0.5)
    span = PLOT_H - MARGIN_B - PLOT_TOP
    parts.append(_rect(left, PLOT_TOP, mid - left, span, "#eef3f8", "window-before"))
    parts.append(_rect(mid, PLOT_TOP, right - mid, span, "#fbeeee", "window-after"))
    parts.extend(_log_axis(lo, hi, y, width))
    parts.extend(_time_axis(jump.starts_ns, x, PLOT_H - MARGIN_B, width))
    for k, q in enumerate(PLOT_QUANTILES):
        points = " ".join(
            f"{x(t):.1f},{y(v):.1f}"
            for t, v in enumerate(values[:, k])
            if math.isfinite(v) and v > 0
        )
        color = QUANTILE_COLORS.get(q, "#555")
        parts.append(
            f'<polyline data-series="{quantile_name(q)}" points="{points}" fill="none" '
            f'stroke="{color}" stroke-width="1.5" />'
        )
        parts.append(
            f'<text x="{MARGIN_L + 60 * k}" y="14" style="fill:{color}">'
            f"{quantile_name(q).upper()}</text>"
        )
    cx = x(jump.change_index - 0.5)
    parts.append(
        f'<line data-role="change" data-index="{jump.change_index}" x1="{cx:.1f}" y1="{PLOT_TOP}" '
        f'x2="{cx:.1f}" y2="{PLOT_H - MARGIN_B}" stroke="#000" stroke-dasharray="4 3" />'
    )
    parts.append(f'<text x="{cx + 4:.1f}" y="{PLOT_TOP + 12}">change</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def heatmap(counts: npt.NDArray[np.int64], jump: JumpExplanation) -> str:
    """The 5 µs histogram per interval: rows of merged buckets, colour = log(count)."""
    intervals = counts.shape[0]
    top_ns = max(jump.after_ns, jump.before_ns, jump.threshold_ns)
    finite = [v for row in jump.interval_quantiles_ns for v in row if math.isfinite(v)]
    if finite:
        top_ns = max(top_ns, max(finite))
    top_bucket = min(LINEAR_BUCKETS, max(1, math.ceil(1.2 * top_ns / BUCKET_WIDTH_NS)))
    group = max(1, math.ceil(top_bucket / HEAT_ROWS))
    rows = math.ceil(top_bucket / group)
    # Merge buckets into rows; everything above the last row is folded into it.
    merged = np.zeros((intervals, rows), dtype=np.int64)
    for r in range(rows):
        merged[:, r] = counts[:, r * group : (r + 1) * group].sum(axis=1)
    merged[:, rows - 1] += counts[:, rows * group :].sum(axis=1)
    height = PLOT_H
    cell_w = (PLOT_W - MARGIN_L - 10) / max(intervals, 1)
    cell_h = (height - MARGIN_B - 10) / rows
    peak = math.log1p(float(merged.max())) if merged.size and merged.max() > 0 else 1.0
    parts = [_svg_open(PLOT_W, height, "histogram heatmap")]
    parts.append(_rect(MARGIN_L, 10, PLOT_W - MARGIN_L - 10, height - MARGIN_B - 10, "#f4f4f4"))
    for t in range(intervals):
        for r in range(rows):
            value = int(merged[t, r])
            if value == 0:
                continue
            colour = _ramp(math.log1p(value) / peak)
            parts.append(
                f'<rect data-role="cell" data-t="{t}" data-row="{r}" '
                f'x="{MARGIN_L + t * cell_w:.1f}" y="{height - MARGIN_B - (r + 1) * cell_h:.1f}" '
                f'width="{cell_w + 0.3:.1f}" height="{cell_h + 0.3:.1f}" fill="{colour}" />'
            )
    for r in range(0, rows + 1, max(1, rows // 6)):
        edge_us = r * group * BUCKET_WIDTH_NS / 1e3
        parts.append(
            f'<text x="{MARGIN_L - 6}" y="{height - MARGIN_B - r * cell_h + 4:.1f}" '
            f'text-anchor="end">{edge_us:,.0f} µs</text>'
        )
    parts.extend(
        _time_axis(jump.starts_ns, lambda t: MARGIN_L + (t + 0.5) * cell_w, height - MARGIN_B)
    )
    cx = MARGIN_L + jump.change_index * cell_w
    parts.append(
        f'<line data-role="change-heatmap" x1="{cx:.1f}" y1="10" x2="{cx:.1f}" '
        f'y2="{height - MARGIN_B}" stroke="#fff" stroke-dasharray="4 3" />'
    )
    parts.append(
        f'<text x="{MARGIN_L}" y="8">5 µs buckets merged by {group} '
        f"({group * BUCKET_WIDTH_NS / 1e3:g} µs rows; top row includes everything above)</text>"
    )
    parts.append("</svg>")
    return "\n".join(parts)


def share_bars(jump: JumpExplanation) -> str:
    """Cause shares with their bootstrap intervals: sources, aggressors, stacks."""
    entries: list[tuple[str, str, Estimate]] = []
    for source in jump.decomposition.sources[:5]:
        name = " ".join(v for k, v in source.source if k != "probe") or "all"
        entries.append(("source", f"{name} (volume)", source.volume_share))
        entries.append(("source", f"{name} (rate)", source.rate_share))
    if jump.displacement is not None:
        for aggressor in jump.displacement.aggressors[:5]:
            entries.append(("aggressor", f"displaced by {aggressor.aggressor}", aggressor.share))
    for stack in [s for s in jump.stacks if s.discovered][:3]:
        leaf = stack.kernel_stack.rsplit(";", 2)
        entries.append(("stack", "stack …" + ";".join(leaf[-2:]), stack.share))
    bar_h, gap = 16, 6
    label_w = 300
    scale_w = PLOT_W - label_w - 60
    height = 30 + len(entries) * (bar_h + gap)
    zero = label_w + scale_w / 3  # shares may be negative: the axis spans -0.5 .. 1

    def sx(value: float) -> float:
        return zero + max(-0.5, min(1.0, value)) * (scale_w * 2 / 3)

    parts = [_svg_open(PLOT_W, height, "cause shares")]
    parts.append(
        f'<line x1="{zero:.1f}" y1="14" x2="{zero:.1f}" y2="{height - 4}" stroke="#888" />'
    )
    parts.append(f'<text x="{sx(1.0):.1f}" y="11" text-anchor="end">100%</text>')
    parts.append(f'<text x="{zero:.1f}" y="11" text-anchor="middle">0</text>')
    colours = {"source": "#4c78a8", "aggressor": "#e45756", "stack": "#54a24b"}
    for n, (kind, label, estimate) in enumerate(entries):
        top = 20 + n * (bar_h + gap)
        value = 0.0 if math.isnan(estimate.value) else estimate.value
        left, right = sorted((sx(0.0), sx(value)))
        parts.append(f'<text x="{label_w - 6}" y="{top + 12}" text-anchor="end">{_e(label)}</text>')
        parts.append(
            f'<rect data-role="share" data-kind="{kind}" x="{left:.1f}" y="{top}" '
            f'width="{max(right - left, 0.5):.1f}" height="{bar_h}" fill="{colours[kind]}" />'
        )
        if math.isfinite(estimate.low) and math.isfinite(estimate.high):
            mid = top + bar_h / 2
            parts.append(
                f'<line data-role="ci" x1="{sx(estimate.low):.1f}" y1="{mid}" '
                f'x2="{sx(estimate.high):.1f}" y2="{mid}" stroke="#000" stroke-width="1.5" />'
            )
        text = "-" if math.isnan(estimate.value) else f"{estimate.value:.0%}".replace("-0%", "0%")
        parts.append(f'<text x="{PLOT_W - 4}" y="{top + 12}" text-anchor="end">{text}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


# -- helpers -------------------------------------------------------------------------------------


def _svg_open(width: float, height: float, label: str) -> str:
    return (
        f'<svg xmlns="{SVG_NS}" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{_e(label)}">'
    )


def _rect(x: float, y: float, w: float, h: float, fill: str, role: str = "") -> str:
    extra = f' data-role="{role}"' if role else ""
    return f'<rect{extra} x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" fill="{fill}" />'


def _log_axis(lo: float, hi: float, y: Callable[[float], float], width: int = PLOT_W) -> list[str]:
    parts = []
    for power in range(math.floor(lo), math.ceil(hi) + 1):
        for mantissa in (1, 2, 5):
            value_us = mantissa * 10.0**power
            if not lo <= math.log10(value_us) <= hi:
                continue
            py = y(value_us * 1e3)
            parts.append(
                f'<line x1="{MARGIN_L}" y1="{py:.1f}" x2="{width - 10}" y2="{py:.1f}" '
                f'stroke="#ddd" />'
            )
            parts.append(
                f'<text x="{MARGIN_L - 6}" y="{py + 4:.1f}" text-anchor="end">'
                f"{value_us:,.0f} µs</text>"
            )
    return parts


def _time_axis(
    starts_ns: Sequence[int], x: Callable[[float], float], base: float, width: int = PLOT_W
) -> list[str]:
    count = len(starts_ns)
    parts = [f'<line x1="{MARGIN_L}" y1="{base}" x2="{width - 10}" y2="{base}" stroke="#888" />']
    for t in range(0, count, max(1, count // 6)):
        moment = datetime.fromtimestamp(starts_ns[t] / 1e9, UTC)
        parts.append(
            f'<text x="{x(t):.1f}" y="{base + 16}" text-anchor="middle">{moment:%H:%M:%S}</text>'
        )
    return parts


def _ramp(level: float) -> str:
    level = min(1.0, max(0.0, level)) * (len(RAMP) - 1)
    k = min(int(level), len(RAMP) - 2)
    f = level - k
    rgb = [round(a + (b - a) * f) for a, b in zip(RAMP[k], RAMP[k + 1], strict=True)]
    return "#{:02x}{:02x}{:02x}".format(*rgb)


def _e(text: str) -> str:
    return html.escape(text, quote=True)
