"""The words of an explanation: the report for a terminal, every line at most :data:`TEXT_WIDTH`
columns, and the ``--json`` document, which carries the same sentences as each jump's and
incident's ``summary``. The HTML presenter (:mod:`tailsight.analysis.explain.html`) shows these
sentences beside its plots."""

from __future__ import annotations

import math
import textwrap
from datetime import UTC, datetime
from typing import Any, Final

from tailsight.analysis.attribution import Displacement, Estimate
from tailsight.analysis.explain.model import Incident, JumpExplanation, Report
from tailsight.analysis.explain.pipeline import MAJORITY
from tailsight.analysis.quantiles import describe, quantile_name
from tailsight.intervals import LabelKey
from tailsight.probes.base import IDLE_CGROUP_NAME
from tailsight.probes.catalog import series_title
from tailsight.probes.outliers import short_stack

TEXT_WIDTH: Final = 80
MIN_SPLIT_EVENTS: Final = 20
"""Fewest tail events (both windows) on which a split of the rise is printed."""


# -- the report ----------------------------------------------------------------------------------


def describe_report(report: Report, width: int = TEXT_WIDTH) -> str:
    """The report for a terminal: every line at most ``width`` columns."""
    lines = textwrap.wrap(report_headline(report), width)

    def add(sentence: str, lead: str, indent: str) -> None:
        lines.extend(
            textwrap.wrap(
                sentence,
                width,
                initial_indent=lead,
                subsequent_indent=indent,
                break_on_hyphens=False,
                break_long_words=True,
            )
        )

    for n, incident in enumerate(report.incidents, 1):
        lines.append("")
        for k, sentence in enumerate(incident_sentences(incident)):
            add(sentence, f"{n}. " if k == 0 else "   ", "   ")
        for m, jump in enumerate(incident.jumps):
            said = jump_sentences(jump, report.config.top)
            if m == 0:  # its first line is the incident's headline
                for sentence in said[1:]:
                    add(sentence, "   ", "   ")
                continue
            lines.append("")
            for k, sentence in enumerate(said):
                add(sentence, "   * " if k == 0 else "     ", "     ")
        if incident.folded:
            add(
                "Aggregates that rose with it (explained by the cgroups above): "
                + "; ".join(jump_title(j) for j in incident.folded)
                + ".",
                "   ",
                "   ",
            )
    return "\n".join(lines) + "\n"


def report_headline(report: Report) -> str:
    """One line: range, series tested, jumps found."""
    if report.start_ns is None or report.end_ns is None:
        return "empty recording range: nothing to explain"
    start = datetime.fromtimestamp(report.start_ns / 1e9, UTC)
    span_s = (report.end_ns - report.start_ns) / 1e9
    found = len(report.jumps)
    incidents = len(report.incidents)
    line = (
        f"{report.intervals} intervals, {span_s:,.1f} s from {start:%Y-%m-%d %H:%M:%S} UTC: "
        f"{report.tested} tests, {incidents} incident{'s' * (incidents != 1)} "
        f"({found} jump{'s' * (found != 1)}, FDR {report.config.fdr:.0%})."
    )
    if report.falls_hidden:
        line += f" {report.falls_hidden} tail{'s' * (report.falls_hidden != 1)} got faster"
        line += " (not shown; --falls)."
    return line


# -- a jump --------------------------------------------------------------------------------------


def jump_title(jump: JumpExplanation) -> str:
    """``run-queue wait of /trading`` (aggregates: ``... of all cgroups``)."""
    labels = jump.labels
    what = series_title(labels)  # names the kind too
    rest = [v for k, v in sorted(labels.items()) if k not in ("probe", "cgroup", "kind")]
    whom = labels.get("cgroup", "all cgroups")
    return f"{what} of {whom}" + (f" ({' '.join(rest)})" if rest else "")


def _symptom(jump: JumpExplanation) -> str:
    """The symptom in a few words: ``recvfrom`` of a socket syscall series, else the title."""
    return jump.labels.get("syscall") or jump_title(jump)


def change_line(jump: JumpExplanation) -> str:
    """``run-queue wait of /a rose 40 µs -> 1.2 ms (P99, x30) at 12:00:15 (p=1e-9).``"""
    name = quantile_name(jump.quantile).upper()
    verb = "rose" if jump.direction == "up" else "fell"
    ratio = jump.ratio
    factor = f", x{ratio:,.0f}" if ratio >= 10 else f", x{ratio:.2f}" if ratio != 1 else ""
    return (
        f"{jump_title(jump)} {verb} {_duration(jump.before_ns)} -> {_duration(jump.after_ns)} "
        f"({name}{factor}) at {_clock(jump.change_start_ns)} (p={jump.p_value:.1g})."
    )


def jump_sentences(jump: JumpExplanation, top: int = 3) -> list[str]:
    """The jump and its causes in plain words, most important first. Shares are of the gross
    rise (parts that rose), in [0, 1], with the remainder named; parts that fell are given
    in their own units; a split resting on too few events is not given at all."""
    out = [change_line(jump)]
    if jump.direction != "up":
        return out  # a faster tail has no excess to attribute
    d = jump.decomposition
    if d.excess > 0 and d.tail_events < MIN_SPLIT_EVENTS:
        out.append(
            f"Only {d.tail_events} events above {_duration(d.threshold_ns)} in the compared "
            "windows: too few to split the rise by source or into traffic and slowness."
        )
    elif d.excess > 0:
        volume = "more traffic" if d.volume_effect >= 0 else "less traffic"
        rate = "sources getting slower" if d.rate_effect >= 0 else "sources getting faster"
        out.append(
            f"Events above {_duration(d.threshold_ns)}: {d.tail_before:.1f} -> "
            f"{d.tail_after:.1f} per interval ({d.excess:+.1f}): {d.rate_effect:+.1f} from "
            f"{rate}, {d.volume_effect:+.1f} from {volume}."
        )
        rising = [x for x in d.sources if x.effect > 0]
        if len(d.sources) > 1 and rising:
            parts: list[str] = []
            shown = 0.0
            for source in rising[:top]:
                if parts and not source.share.low > 0:
                    break
                kind = "slower" if source.rate_effect >= source.volume_effect else "traffic"
                name = _source_name(jump, source.source)
                parts.append(f"{name} {_pct(source.share)} ({kind})")
                shown += source.share.value
            rest = len(rising) - len(parts)
            if rest and _percent(1.0 - shown) != "0%":
                parts.append(f"{rest} other{'s' * (rest != 1)} {_percent(1.0 - shown)}")
            out.append("Share of the rise by source: " + "; ".join(parts) + ".")
    shown_d = jump.displacement
    if shown_d is not None and shown_d.excess_ns > 0:
        out.append(_displacement_line(shown_d, top))
    discovered = [s for s in jump.stacks if s.discovered and s.excess > 0][:top]
    for rank, stack in enumerate(discovered):
        times = stack.rate_after / stack.rate_before if stack.rate_before else math.inf
        label = "Top stack" if rank == 0 else "Next stack"
        factor = "new" if math.isinf(times) else f"x{times:.1f}"
        out.append(
            f"{label} ({factor}, {_pct(stack.share)} of extra outliers, "
            f"p={stack.p_value:.1g}): kernel {short_stack(stack.kernel_stack)}"
            f" | user {short_stack(stack.user_stack)}"
        )
    return out


def _source_name(jump: JumpExplanation, source: LabelKey) -> str:
    """A source of ``jump`` by the labels it does not share with the jump's series."""
    mine = dict(jump.series)
    parts = [v for k, v in source if k not in mine or mine[k] != v]
    return " ".join(parts) or describe(source)


# -- an incident ---------------------------------------------------------------------------------


def incident_sentences(incident: Incident) -> list[str]:
    """Headline, most likely cause, other candidates."""
    head = incident.headline
    out = [change_line(head)]
    if incident.dated_ns is not None and incident.causes:
        out.append(
            f"Most of the rise came at {_clock(incident.dated_ns)}, when its cause began: the "
            "incident is dated there (the change point before it was a smaller step)."
        )
    if head.direction != "up":
        return out  # shown on request (--falls); a faster tail has nothing to attribute
    d = head.decomposition
    mix = [x for x in d.sources if x.volume_effect > 0 and x.volume_share.value >= MAJORITY]
    if head.aggregate and mix:  # no cgroup got slower: one sends more (or is new)
        source = mix[0]
        name = _source_name(head, source.source)
        if source.volume_before == 0:
            line = f"Likely cause: a new source, {name} ({source.volume_after:,.1f} events "
            line += "per interval, none before)."
        else:
            line = (
                f"Likely cause: a traffic mix shift: more calls from {name} "
                f"({source.volume_before:,.1f} -> {source.volume_after:,.1f} per interval), "
                "which was as slow before."
            )
        out.append(line)
        if incident.causes:
            out.append(
                "Also changed: " + "; ".join(c.sentence() for c in incident.causes[:2]) + "."
            )
        return out
    if incident.causes:
        first, *others = incident.causes
        also = "; ".join(c.timed_sentence() for c in others[:2])
        if first.late_s:  # every signal that changed began after the rise
            out.append(
                "No cause found that began with the rise; later: "
                + "; ".join(c.timed_sentence() for c in incident.causes[:3])
                + "."
            )
            return out
        out.append(f"Likely cause: {first.sentence(_symptom(head), head.after_ns)}.")
        if others:
            out.append(f"Also changed: {also}.")
        return out
    if incident.tested_causes:
        out.append(
            f"No cause found: none of {incident.tested_causes} candidate signals (retransmits, "
            "packet drops, migrations, syscall errors, run-queue displacement, CPU limits, "
            "pressure stalls, interrupt time) of the cgroups involved "
            "rose significantly at the same time."
        )
    else:
        out.append(
            "No cause found: no other signal of these cgroups rose (retransmits, packet drops, "
            "migrations, syscall errors and run-queue displacement need their probes)."
        )
    return out


# -- the --json document -------------------------------------------------------------------------


def report_json(report: Report) -> dict[str, Any]:
    """Plain JSON-able dict (nan and inf -> None, so strict JSON parsers accept it)."""
    cleaned: dict[str, Any] = _clean(
        {
            "start_ns": report.start_ns,
            "end_ns": report.end_ns,
            "intervals": report.intervals,
            "selector": dict(report.selector),
            "tested": report.tested,
            "fdr": report.config.fdr,
            "incidents": [incident_json(i) for i in report.incidents],
            "jumps": [jump_json(j) for j in report.jumps],
            "falls_hidden": report.falls_hidden,
        }
    )
    return cleaned


def incident_json(incident: Incident) -> dict[str, Any]:
    """Plain JSON-able dict."""
    return {
        "start_ns": incident.start_ns,
        "headline": dict(incident.headline.series),
        "cgroups": incident.cgroups,
        "summary": incident_sentences(incident),
        "causes": [c.to_json() for c in incident.causes],
        "tested_causes": incident.tested_causes,
        "dated_ns": incident.dated_ns,
        "jumps": [dict(j.series) for j in incident.jumps],
        "folded": [dict(j.series) for j in incident.folded],
    }


def jump_json(jump: JumpExplanation) -> dict[str, Any]:
    """Plain JSON-able dict."""
    return {
        "series": dict(jump.series),
        "aggregate": jump.aggregate,
        "quantile": jump.quantile,
        "name": quantile_name(jump.quantile),
        "direction": jump.direction,
        "change_index": jump.change_index,
        "change_start_ns": jump.change_start_ns,
        "before_ns": _finite(jump.before_ns),
        "after_ns": _finite(jump.after_ns),
        "p_value": jump.p_value,
        "threshold_ns": jump.threshold_ns,
        "decomposition": jump.decomposition.to_json(),
        "displacement": None if jump.displacement is None else jump.displacement.to_json(),
        "stacks": [s.to_json() for s in jump.stacks],
        "summary": jump_sentences(jump),
    }


# -- words ---------------------------------------------------------------------------------------


def _duration(value_ns: float) -> str:
    """``4.2 µs``, ``165 µs``, ``1.2 ms``, ``324 ms``, ``2.5 s``."""
    if not math.isfinite(value_ns):
        return "-"
    for scale, unit in ((1e9, "s"), (1e6, "ms"), (1e3, "µs")):
        if abs(value_ns) >= scale or unit == "µs":
            value = value_ns / scale
            return f"{value:,.0f} {unit}" if abs(value) >= 10 else f"{value:.1f} {unit}"
    raise AssertionError("unreachable")


def _displacement_line(shown: Displacement, top: int) -> str:
    """Who added the victim's extra displaced wait: shares of the rise, the remainder, the falls."""
    rising = [a for a in shown.aggressors if a.excess_ns > 0]
    gross = sum(a.excess_ns for a in rising)
    line = (
        f"Run-queue wait of {shown.victim} displaced by other tasks: "
        f"{_duration(shown.wait_before_ns)} -> {_duration(shown.wait_after_ns)} per interval; "
        "of the rise,"
    )
    parts: list[str] = []
    total = 0.0
    for rank, a in enumerate(rising[:top]):
        if rank and a.share.value < 0.05:
            break
        # The probe charges a wait to the task that ran just before the victim; under background
        # load a brief third task often runs last, so the newcomer that caused the wait can rank
        # second: say that it is new.
        who = (
            "passed with the CPU idle (the idle task is no aggressor: a CPU limit, steal or a "
            "wake-up from idle)"
            if a.aggressor == IDLE_CGROUP_NAME
            else f"was displaced by {_aggressor(a.aggressor, shown.victim)}"
        )
        parts.append(
            f"{_pct(a.share)} {who}"
            f"{' (new)' if a.new else ''} ({_duration(a.wait_before_ns)} -> "
            f"{_duration(a.wait_after_ns)})"
        )
        total += a.share.value
    rest = len(rising) - len(parts)
    if rest and _percent(1.0 - total) != "0%":
        parts.append(f"{_percent(1.0 - total)} by {rest} other{'s' * (rest != 1)}")
    line += " " + "; ".join(parts)
    fell = [a for a in shown.aggressors if a.excess_ns < -0.05 * gross]
    if fell:
        line += "; less time went to " + ", ".join(
            f"{_aggressor(a.aggressor, shown.victim)} ({_duration(a.excess_ns)})"
            for a in fell[:top]
        )
    return line + "."


def _pct(estimate: Estimate) -> str:
    if math.isnan(estimate.value):
        return "-"
    if math.isnan(estimate.low):
        return _percent(estimate.value)
    return f"{_percent(estimate.value)} [{_percent(estimate.low)}, {_percent(estimate.high)}]"


def _percent(value: float) -> str:
    text = f"{value:.0%}"
    return "0%" if text == "-0%" else text


def _clock(time_ns: int) -> str:
    return f"{datetime.fromtimestamp(time_ns / 1e9, UTC):%H:%M:%S}"


def _aggressor(name: str, victim: str = "") -> str:
    if name == IDLE_CGROUP_NAME:
        return "an idle CPU (nobody)"
    return f"{name} (its own cgroup)" if name == victim else name


def _clean(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def _finite(value: float) -> float | None:
    return None if math.isnan(value) else value
