"""The Grafana root-cause dashboard as one static, offline HTML page for a recording, for where no
Grafana runs: the same rows (symptom with the jump marked, who displaced the victim, its syscall,
TCP and migration series on the same time axis, the verdict), drawn with the ``explain`` report's
own plots (``analysis/explain/html.py``) plus two time-aligned line plots of the victim's series."""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Final

from tailsight.analysis.explain.html import STYLE, SVG_NS, heatmap, quantile_plot, share_bars
from tailsight.analysis.explain.model import ExplainConfig, JumpExplanation, Report
from tailsight.analysis.explain.pipeline import explain_documents, view_counts
from tailsight.analysis.explain.text import (
    incident_sentences,
    jump_sentences,
    jump_title,
    report_headline,
)
from tailsight.hist import Histogram
from tailsight.intervals import HistDocument
from tailsight.probes import migration
from tailsight.probes.runqueue import DISPLACED_WAIT
from tailsight.probes.runqueue import PROBE_NAME as RUNQUEUE

WIDTH: Final = 720
HEIGHT: Final = 200
LEFT: Final = 70
BOTTOM: Final = 30
TOP: Final = 24
COLOURS: Final = ("#4c78a8", "#e45756", "#54a24b", "#b279a2", "#f58518", "#72b7b2", "#9d755d")
MIGRATION_COUNTERS: Final = (
    migration.TASK_MIGRATIONS,
    migration.CROSS_NODE_MIGRATIONS,
    migration.NUMA_MOVES,
)


def render_root_cause(
    documents: Sequence[HistDocument], victim: str, config: ExplainConfig | None = None
) -> str:
    """The page for ``victim`` (a cgroup path) over ``documents`` (a recording's range)."""
    report = explain_documents(documents, {"cgroup": victim}, config)
    jump = _victim_jump(report, victim)
    starts = [d.start_ns for d in documents]
    body = [f"<h1>Root cause: {_e(victim)}</h1>", f"<p>{_e(report_headline(report))}</p>"]
    if jump is None:
        body.append("<p>No tail jump of this cgroup in the range: nothing to explain.</p>")
    else:
        body.append(f"<h2>Symptom: {_e(jump_title(jump))}</h2>")
        body.append(quantile_plot(jump))
        body.append("<p>That series' histogram per interval (colour: log of the count).</p>")
        body.append(heatmap(view_counts(documents, jump.series, report.selector), jump))
    body.append("<h2>Who displaced it</h2>")
    body.append("<p>Wait caused per aggressor cgroup, seconds per second (stacked).</p>")
    body.append(line_plot(starts, displaced_rates(documents, victim), "s/s", stacked=True))
    if jump is not None:
        body.append("<p>Shares of the jump's excess with bootstrap intervals.</p>")
        body.append(share_bars(jump))
    body.append("<h2>Its syscalls, TCP and migrations</h2>")
    body.append("<p>P99 per interval of each of its other series (log scale).</p>")
    body.append(line_plot(starts, other_p99s(documents, victim), "µs", log=True))
    body.append("<p>Its task migrations per interval.</p>")
    body.append(line_plot(starts, migrations(documents, victim), "per interval"))
    body.append("<h2>Verdict</h2>")
    if jump is None:
        body.append("<p>No jump.</p>")
    else:
        incident = next((i for i in report.incidents if jump in i.jumps), None)
        lines = [
            *(incident_sentences(incident) if incident else []),
            *jump_sentences(jump, report.config.top),
        ]
        body.append("<ul>")
        body.extend(f"<li>{_e(line)}</li>" for line in dict.fromkeys(lines))
        body.append("</ul>")
    title = f"tailsight root cause: {victim}"
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8" />'
        f"<title>{_e(title)}</title><style>{STYLE}</style></head>\n<body>\n"
        + "\n".join(body)
        + "\n</body></html>\n"
    )


def _victim_jump(report: Report, victim: str) -> JumpExplanation | None:
    """The victim's run-queue jump if there is one, else its first jump of any probe."""
    mine = [j for j in report.jumps if j.labels.get("cgroup") == victim]
    runqueue = [j for j in mine if j.labels.get("probe") == RUNQUEUE]
    chosen = runqueue or mine
    return chosen[0] if chosen else None


def displaced_rates(documents: Sequence[HistDocument], victim: str) -> dict[str, list[float]]:
    """Seconds of the victim's wait per second of interval, per aggressor."""
    rates: dict[str, list[float]] = {}
    for t, document in enumerate(documents):
        seconds = max(document.end_ns - document.start_ns, 1) / 1e9
        for counter in document.counters:
            if counter.name == DISPLACED_WAIT and counter.labels.get("victim") == victim:
                row = rates.setdefault(counter.labels["aggressor"], [0.0] * len(documents))
                row[t] += counter.value / 1e9 / seconds
    return dict(sorted(rates.items(), key=lambda item: -sum(item[1])))


def other_p99s(documents: Sequence[HistDocument], victim: str) -> dict[str, list[float]]:
    """P99 (µs, nan where empty) per interval of the victim's non-run-queue series."""
    out: dict[str, list[float]] = {}
    for t, document in enumerate(documents):
        merged: dict[str, Histogram] = {}
        for series in document.series:
            labels = series.labels
            if labels.get("cgroup") != victim or labels.get("probe") == RUNQUEUE:
                continue
            # As the Grafana panels: per syscall, per TCP measure (states merged).
            detail = labels.get("syscall") or labels.get("kind") or labels.get("what") or ""
            name = f"{labels.get('probe', '')} {detail}".strip()
            held = merged.get(name)
            merged[name] = series.hist if held is None else held.merge(series.hist)
        for name, hist in merged.items():
            row = out.setdefault(name, [math.nan] * len(documents))
            row[t] = hist.quantiles([0.99])[0] / 1e3 if hist.count else math.nan
    return dict(sorted(out.items()))


def migrations(documents: Sequence[HistDocument], victim: str) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for t, document in enumerate(documents):
        for counter in document.counters:
            if counter.name in MIGRATION_COUNTERS and counter.labels.get("cgroup") == victim:
                out.setdefault(counter.name, [0.0] * len(documents))[t] += counter.value
    return out


def line_plot(
    starts_ns: Sequence[int],
    series: Mapping[str, Sequence[float]],
    unit: str,
    stacked: bool = False,
    log: bool = False,
) -> str:
    """One line per series on the intervals' time axis (stacked: cumulative areas)."""
    count = len(starts_ns)
    parts = [
        f'<svg xmlns="{SVG_NS}" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{_e(unit)} over time">'
    ]
    if not series or count == 0:
        parts.append(f'<text x="{LEFT}" y="{HEIGHT / 2}">no data in this range</text></svg>')
        return "\n".join(parts)
    rows = [list(values) for values in series.values()]
    if stacked:
        for k in range(1, len(rows)):
            rows[k] = [a + b for a, b in zip(rows[k - 1], rows[k], strict=True)]
    finite = [v for row in rows for v in row if math.isfinite(v) and (v > 0 or not log)]
    high = max(finite, default=1.0) * 1.1 or 1.0
    low = min(finite, default=1.0) / 1.3 if log else 0.0

    def x(t: float) -> float:
        return LEFT + (t + 0.5) / count * (WIDTH - LEFT - 10)

    def y(value: float) -> float:
        if log:
            span = math.log10(high) - math.log10(low) or 1.0
            level = (math.log10(value) - math.log10(low)) / span
        else:
            level = value / high
        return TOP + (1.0 - level) * (HEIGHT - BOTTOM - TOP)

    base = HEIGHT - BOTTOM
    parts.append(f'<line x1="{LEFT}" y1="{base}" x2="{WIDTH - 10}" y2="{base}" stroke="#888" />')
    for value in (low, high / 1.1) if log else (0.0, high / 2.2, high / 1.1):
        if value > 0 or not log:
            parts.append(
                f'<text x="{LEFT - 6}" y="{y(value) + 4:.1f}" text-anchor="end">{value:.3g}</text>'
            )
    parts.append(f'<text x="{LEFT - 6}" y="12" text-anchor="end">{_e(unit)}</text>')
    for t in range(0, count, max(1, count // 6)):
        moment = datetime.fromtimestamp(starts_ns[t] / 1e9, UTC)
        parts.append(
            f'<text x="{x(t):.1f}" y="{base + 16}" text-anchor="middle">{moment:%H:%M:%S}</text>'
        )
    for k, (name, row) in enumerate(zip(series, rows, strict=True)):
        colour = COLOURS[k % len(COLOURS)]
        points = " ".join(
            f"{x(t):.1f},{y(v):.1f}" for t, v in enumerate(row) if math.isfinite(v) and v > 0
        )
        parts.append(
            f'<polyline data-series="{_e(name)}" points="{points}" fill="none" '
            f'stroke="{colour}" stroke-width="1.5" />'
        )
        parts.append(
            f'<text x="{LEFT + 8}" y="{TOP + 12 * k}" style="fill:{colour}">{_e(name)}</text>'
        )
    parts.append("</svg>")
    return "\n".join(parts)


def _e(text: str) -> str:
    return html.escape(text, quote=True)
