"""``tailsight explain``: find the tail jumps of a recording and what caused them (worded by
:mod:`tailsight.analysis.explain.text`, drawn by :mod:`tailsight.analysis.explain.html`).

Jumps are found by the offline detector of :mod:`tailsight.analysis.jumps` over every recorded
series *and* over aggregates (per probe and cgroup, summing the other labels, and per probe over
all cgroups), with Benjamini-Hochberg over all of them; a mix shift (more traffic from an
always-slow cgroup) only shows in an aggregate. Each discovered, confirmed jump is then attributed
with :mod:`tailsight.analysis.attribution`: its excess tail events over the series it sums (volume
vs rate), for run-queue wait the aggressors that displaced the victim cgroup, and the outlier
stacks that became more frequent.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Final

import numpy as np
import numpy.typing as npt

from tailsight.analysis.attribution import (
    Windows,
    decompose_rows,
    displaced_by_rows,
    stack_shifts_rows,
)
from tailsight.analysis.causes import (
    CALLS,
    COUNTER_CAUSES,
    IDLE_CPU,
    LATE_INTERVALS,
    OTHER_END,
    PRESSURE_CAUSES,
    Cause,
    CounterTable,
    find_causes,
    throttled_intervals,
)
from tailsight.analysis.explain.model import (
    PLOT_QUANTILES,
    ExplainConfig,
    Incident,
    JumpExplanation,
    Report,
)
from tailsight.analysis.jumps import (
    JumpConfig,
    OfflineResult,
    TailThreshold,
    benjamini_hochberg,
    confirm_change,
    locate_change,
    no_change,
)
from tailsight.analysis.quantiles import dense_counts_by_series
from tailsight.analysis.stream import CACHE_BYTES, RangeStats, Source, view_threshold
from tailsight.cgroups import is_within
from tailsight.collector.store.codec import IntervalArrays
from tailsight.collector.store.reader import Recording
from tailsight.hist import NUM_BUCKETS, Histogram, bucket_index
from tailsight.intervals import HistDocument, LabelKey
from tailsight.probes.base import IDLE_CGROUP_NAME
from tailsight.probes.netsyscall import ERRORS
from tailsight.probes.netsyscall import PROBE_NAME as NETSYSCALL
from tailsight.probes.runqueue import PROBE_NAME as RUNQUEUE

LINKED: Final = frozenset({"retransmits", "retransmit_failures", COUNTER_CAUSES[CALLS]})
"""Causes acting across cgroups (either end of a connection; a neighbour's calls on a shared
socket path, never a cause of the neighbour's own symptoms): they concern every symptom of the
incident."""
MAJORITY: Final = 0.5
"""An aggregate is explained by one cgroup that holds at least this share of its rise."""
NEWCOMER_GROWTH: Final = 10.0
"""An aggressor displacing a victim this many times more than before arrived with the change."""


# -- series views --------------------------------------------------------------------------------


def views(leaves: Iterable[LabelKey], aggregates: bool = True) -> dict[LabelKey, list[LabelKey]]:
    """Every series to test, with the leaf series it sums: each leaf itself and, if
    ``aggregates``, ``{probe, cgroup}`` and ``{probe}`` (with ``instance`` where the leaves
    have one) over the leaves below them."""
    found: dict[LabelKey, list[LabelKey]] = {key: [key] for key in leaves}
    if not aggregates:
        return found
    grouped: dict[LabelKey, list[LabelKey]] = {}
    for key in leaves:
        labels = dict(key)
        if "probe" not in labels:
            continue
        # Per probe, and per host where the series come from several (--prometheus: instance).
        probe: LabelKey = tuple((k, labels[k]) for k in ("instance", "probe") if k in labels)
        grouped.setdefault(probe, []).append(key)
        if "cgroup" in labels and len(labels) > len(probe) + 1:
            grouped.setdefault(
                tuple(sorted({**dict(probe), "cgroup": labels["cgroup"]}.items())), []
            ).append(key)
    for key, children in grouped.items():
        if key not in found and len(children) > 1:
            found[key] = sorted(children)
    return found


def _sum(
    leaves: Mapping[LabelKey, npt.NDArray[np.int64]], children: Sequence[LabelKey]
) -> npt.NDArray[np.int64]:
    if len(children) == 1:
        return leaves[children[0]]  # a leaf: no copy (dense arrays are big)
    total = leaves[children[0]].copy()
    for child in children[1:]:
        total += leaves[child]
    return total


def interval_quantiles(
    counts: npt.NDArray[np.int64], qs: Sequence[float] = PLOT_QUANTILES
) -> list[list[float]]:
    """Quantiles (ns, nan where empty) of every interval row of dense counts."""
    out = []
    for row in counts:
        if row.sum():
            hist = Histogram(row[:NUM_BUCKETS].copy(), overflow=int(row[NUM_BUCKETS]))
            out.append(hist.quantiles(list(qs)))
        else:
            out.append([math.nan] * len(qs))
    return out


def view_counts(
    documents: Sequence[HistDocument], key: LabelKey, selector: Mapping[str, str] | None = None
) -> npt.NDArray[np.int64]:
    """Dense ``[intervals, NUM_BUCKETS + 1]`` counts of a series or an aggregate (labels >= key)."""
    _, leaves = dense_counts_by_series(documents, {**dict(selector or {}), **dict(key)})
    if not leaves:
        return np.zeros((len(documents), NUM_BUCKETS + 1), dtype=np.int64)
    return _sum(leaves, list(leaves))


# -- explain -------------------------------------------------------------------------------------


def explain_documents(
    documents: Sequence[HistDocument],
    selector: Mapping[str, str] | None = None,
    config: ExplainConfig | None = None,
) -> Report:
    """Detect tail jumps across the (selected) series of a recording range and attribute each."""
    return explain_source(Source.of_documents(documents), selector, config)


def explain_recording(
    recording: Recording,
    selector: Mapping[str, str] | None = None,
    config: ExplainConfig | None = None,
    since_ns: int | None = None,
    until_ns: int | None = None,
    cache_bytes: int = CACHE_BYTES,
) -> Report:
    """:func:`explain_documents` of the intervals that end after ``since_ns`` and start before
    ``until_ns``, streamed from the recording (memory: rows per interval, not histograms;
    ``cache_bytes``: see :data:`tailsight.analysis.stream.CACHE_BYTES`)."""

    def read() -> Iterator[IntervalArrays]:
        return recording.iter_intervals(since_ns, until_ns)

    return explain_source(Source(read, ordered=False), selector, config, cache_bytes)


def explain_source(
    source: Source,
    selector: Mapping[str, str] | None = None,
    config: ExplainConfig | None = None,
    cache_bytes: int = CACHE_BYTES,
) -> Report:
    """The analysis of :func:`explain_documents` in three streaming passes over ``source``
    (:mod:`tailsight.analysis.stream`): the same tests, thresholds and numbers as on dense
    arrays of every series and aggregate."""
    config = config or ExplainConfig()
    selector = dict(selector or {})
    stats = RangeStats.read(source, selector, cache_bytes)
    intervals = stats.intervals
    index = {key: n for n, key in enumerate(stats.leaves)}
    tested = views(sorted(stats.leaves), config.aggregates)
    plans: list[tuple[LabelKey, JumpConfig, list[int], TailThreshold | None]] = []
    for key, children in tested.items():
        ids = [index[child] for child in children]
        for q in config.quantiles:
            threshold = view_threshold(stats, ids, q) if intervals >= 3 else None
            plans.append((key, replace(config.jump, quantile=q), ids, threshold))
    edges: dict[int, list[int]] = {}
    for _, _, ids, threshold in plans:
        if threshold is not None:
            for leaf in ids:
                wanted = edges.setdefault(leaf, [])
                if threshold.edge_index not in wanted:
                    wanted.append(threshold.edge_index)
    tails = stats.tail_events(edges)
    located = []
    for key, jump_config, ids, threshold in plans:
        if threshold is None:
            located.append(no_change(key, jump_config.quantile))
            continue
        exceed = np.sum([tails[(leaf, threshold.edge_index)] for leaf in ids], axis=0)
        total = stats.volume[:, ids].sum(axis=1)
        located.append(locate_change(exceed, total, threshold, jump_config, key))
    found = benjamini_hochberg([r.p_value for r in located], config.fdr)
    results = [replace(r, discovered=bool(f)) for r, f in zip(located, found, strict=True)]
    # Only the discoveries need the histograms on each side of their change (pass 3).
    changes: dict[LabelKey, list[int]] = {}
    for result in results:
        if result.discovered and result.change_index is not None:
            changes.setdefault(result.series, []).append(result.change_index)
    shown_views = list(changes)
    sides = stats.sides(
        [([index[c] for c in tested[key]], changes[key]) for key in shown_views], PLOT_QUANTILES
    )
    side_of = dict(zip(shown_views, sides, strict=True))
    for n, (result, (key, jump_config, ids, _)) in enumerate(zip(results, plans, strict=True)):
        if result.series in side_of and result.discovered and result.change_index is not None:
            befores = side_of[key][0]
            before = befores[changes[key].index(result.change_index)]
            pooled = stats.pooled[ids].sum(axis=0)
            results[n] = confirm_change(result, before, pooled - before, jump_config)
    best: dict[LabelKey, tuple[OfflineResult, list[int]]] = {}
    for result, (_, _, ids, _) in zip(results, plans, strict=True):
        if not (result.discovered and result.confirmed and result.change_index is not None):
            continue
        held = best.get(result.series)
        if held is None or result.p_value < held[0].p_value:
            best[result.series] = (result, ids)
    falls = [key for key, (result, _) in best.items() if result.direction == "down"]
    if not config.falls:
        for key in falls:
            del best[key]
    jumps = [
        _explain_one(stats, tested[key], ids, tails, result, side_of[key][1], config)
        for key, (result, ids) in best.items()
    ]
    incidents = find_incidents(jumps, CounterTable.of_rows(stats.counters), intervals, config)
    shown = [j for incident in incidents for j in incident.jumps]
    return Report(
        start_ns=int(stats.starts_ns[0]) if intervals else None,
        end_ns=int(stats.ends_ns[-1]) if intervals else None,
        intervals=intervals,
        selector=selector,
        tested=len(results),
        jumps=shown,
        config=config,
        incidents=incidents,
        falls_hidden=0 if config.falls else len(falls),
    )


# -- incidents -----------------------------------------------------------------------------------


def jump_cgroups(jump: JumpExplanation) -> set[str]:
    """The cgroup of a series; of an all-cgroups aggregate, the one cgroup holding the largest
    share of its rise (one only: an aggregate must not bridge two cgroups' incidents)."""
    own = jump.labels.get("cgroup")
    if own is not None:
        return {own}
    for source in jump.decomposition.sources:  # largest effect first
        cgroup = dict(source.source).get("cgroup")
        if cgroup is not None and source.effect > 0:
            return {cgroup}
    return set()


def _explained_by(aggregate: JumpExplanation, cgroups: set[str]) -> bool:
    """One source of ``aggregate`` in one of ``cgroups`` holds the majority of its rise."""
    return any(
        s.share.value >= MAJORITY and dict(s.source).get("cgroup") in cgroups
        for s in aggregate.decomposition.sources
    )


def find_incidents(
    jumps: Sequence[JumpExplanation],
    table: CounterTable,
    intervals: int,
    config: ExplainConfig,
) -> list[Incident]:
    """Group jumps that start within ``config.incident_window`` intervals and share a cgroup
    (directly, or through a cause found in the other's cgroup, e.g. retransmits at the other end
    of a connection); one incident per group, causes tested across probes for its cgroups."""
    rises = [j for j in jumps if j.direction == "up"]
    groups = _group(rises, [jump_cgroups(j) for j in rises], config.incident_window)
    # A discovered cause in another cgroup (a TCP peer) links that cgroup's jumps in.
    reach = []
    for members in groups:
        cgroups = set().union(*(jump_cgroups(rises[m]) for m in members))
        causes, _ = _causes(rises, members, cgroups, table, intervals, config)
        reach.append(cgroups.union(*(_linked(c) for c in causes)))
    merged = _group([rises[g[0]] for g in groups], reach, config.incident_window)
    incidents = []
    for parts in merged:
        members = sorted(m for p in parts for m in groups[p])
        incidents.append(_incident(rises, members, table, intervals, config))
    falls = [j for j in jumps if j.direction != "up"]
    for fall in falls:  # reported on request only, never with causes
        incidents.append(Incident([fall], [], [], 0, sorted(jump_cgroups(fall))))
    incidents.sort(key=lambda i: (i.start_ns, i.headline.direction != "up", i.headline.series))
    return incidents


def _linked(cause: Cause) -> set[str]:
    """The cgroups a cause involves: where it shows and, for a displacement, the aggressor."""
    aggressor = cause.labels.get("aggressor") if cause.kind == "displacement" else None
    return {cause.cgroup} | ({aggressor} if aggressor and aggressor != IDLE_CGROUP_NAME else set())


def _group(
    jumps: Sequence[JumpExplanation], cgroups: Sequence[set[str]], window: int
) -> list[list[int]]:
    """Connected components of 'close in time and sharing a cgroup' (union-find)."""
    parent = list(range(len(jumps)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i in range(len(jumps)):
        for k in range(i):
            close = abs(jumps[i].change_index - jumps[k].change_index) <= window
            if close and cgroups[i] & cgroups[k]:
                parent[root(i)] = root(k)
    found: dict[int, list[int]] = {}
    for i in range(len(jumps)):
        found.setdefault(root(i), []).append(i)
    return sorted(found.values(), key=lambda g: min(jumps[i].change_index for i in g))


def _causes(
    jumps: Sequence[JumpExplanation],
    members: Sequence[int],
    cgroups: set[str],
    table: CounterTable,
    intervals: int,
    config: ExplainConfig,
) -> tuple[list[Cause], int]:
    change = min(jumps[m].change_index for m in members)
    windows = Windows.around(change, intervals, config.window_intervals)
    # Only a socket syscall time's own calls are the volume term of its decomposition; a
    # flooding neighbour whose run-queue wait rose as well still hammers.
    symptoms = {
        c
        for m in members
        if not jumps[m].aggregate and jumps[m].labels.get("probe") == NETSYSCALL
        for c in jump_cgroups(jumps[m])
    }
    candidates = find_causes(table, windows, cgroups, config.fdr, symptoms)
    return [c for c in candidates if c.discovered], len(candidates)


def _incident(
    jumps: Sequence[JumpExplanation],
    members: Sequence[int],
    table: CounterTable,
    intervals: int,
    config: ExplainConfig,
) -> Incident:
    chosen = [jumps[m] for m in members]
    cgroups = set().union(*(jump_cgroups(j) for j in chosen))
    causes, tested = _causes(jumps, members, cgroups, table, intervals, config)
    leaves = [j for j in chosen if not j.aggregate]
    leaf_cgroups = set().union(set(), *(jump_cgroups(j) for j in leaves))
    # A cgroup a leaf's cause names (the hog that displaced it) explains an aggregate too.
    explaining = leaf_cgroups.union(*(_linked(c) for c in causes if c.cgroup in leaf_cgroups))
    folded = [j for j in chosen if j.aggregate and _explained_by(j, explaining)]
    shown = [j for j in chosen if j not in folded]
    # Headline: a leaf before an aggregate; a run-queue wait mostly displaced by a newcomer (the
    # hog's victim, not the tasks that then crowded onto the other CPUs, which may have moved
    # more); then the series that moved most.
    shown.sort(
        key=lambda j: (
            j.aggregate,
            not _displaced_by_newcomer(j),
            -abs(math.log(j.ratio)),
            j.p_value,
            j.series,
        )
    )
    # The headline's own causes first: a cause of another cgroup of the incident (the run-queue
    # of / displaced by the same hog) is context, not the answer to "why did this rise?".
    # A run-queue wait is time spent waiting for CPUs: the failing calls of a cgroup whose wait
    # rose in this incident (EAGAIN from a queue it could not drain in time) are a consequence,
    # however new, whichever series heads the incident; they rank after the rest (a neighbour's
    # calls can still be the root cause).
    mine = jump_cgroups(shown[0])
    waiting = shown[0].labels.get("probe") == RUNQUEUE
    # An all-cgroups wait counts its largest source as starved: e.g. a victim whose own wait
    # had too few events before the change to be tested; its sends failing with EAGAIN would
    # otherwise rank before the displacement that starved it.
    starved = set().union(
        set(), *(jump_cgroups(j) for j in chosen if j.labels.get("probe") == RUNQUEUE)
    )
    # Retransmits with a known other end: those towards the headline's cgroup (the data it
    # waits for) before those it sent itself (requests whose acknowledgement was lost with them).
    # A cgroup moved between CPUs at a forced rate waits on the CPUs it is moved to: its
    # displacement there is the consequence, the moves the cause (however large the wait).
    # Retransmits towards the headline's cgroup over its own connection are direct evidence for
    # a call's or a connection's time: before circumstantial candidates (a neighbour's call
    # burst) of whatever effect size. Not for a run-queue wait: there they are a consequence
    # (a starved receiver acknowledges late; e.g. 88 in the demo, beside the hog behind both).
    # A run-queue wait mostly displaced by a cgroup that is not busy answering calls (a plain
    # CPU hog) is explained by it: a neighbour's call burst at the same time is then a side
    # effect (e.g. the demo's exchange polls 10x more while the hog slows trading), and so are
    # retransmits towards it (the starved receiver acknowledges late: 31 -> 159 of them beside a
    # 147 -> 384 ms displacement, however much more they rose). When the displacer's own calls
    # rose too, the calls may be the root cause.
    forced = {c.cgroup for c in causes if c.forced_migrations}
    top = _top_aggressor(causes, mine) if waiting else None
    busy = {c.cgroup for c in causes if c.kind == COUNTER_CAUSES[CALLS]}
    hogged = top is not None and top not in busy | {IDLE_CGROUP_NAME}
    # Steal time answers a wait mostly "displaced by idle" (the kernel saw the vCPU idle while
    # the hypervisor ran another guest: 26-40 % of CPU 0 in quiet runs here); otherwise it is
    # background, after the rest.
    stolen = top == IDLE_CGROUP_NAME
    # A cgroup parked by its own CPU limit (or a parent's) waited for that, whoever ran
    # meanwhile: the limit comes first (find_causes names neighbours only from the intervals in
    # which it was not throttled).
    causes, dated_ns = _timed(causes, chosen, shown[0], intervals, config)
    parked = {
        id(c)
        for c in causes
        if c.kind == "throttling" and any(is_within(m, c.cgroup) for m in mine)
    }
    # Pages read back after reclaim count as io stalls too: where memory stalled as well, the
    # io stall is its consequence.
    reclaiming = {c.cgroup for c in causes if c.kind == PRESSURE_CAUSES["memory"]}
    # The kernel's own threads (kswapd, the writeback and I/O workers: cgroup /) run when a
    # cgroup stalls on memory or io: their displacement of a stalled cgroup is the stall's
    # consequence, not a neighbour's doing.
    stalled = {c.cgroup for c in causes if c.kind in PRESSURE_CAUSES.values()}
    causes.sort(
        key=lambda c: (
            bool(c.late_s),
            id(c) not in parked,
            c.kind == PRESSURE_CAUSES["io"] and c.cgroup in reclaiming,
            c.kind == "displacement" and c.labels.get("aggressor") == "/" and c.cgroup in stalled,
            c.kind == COUNTER_CAUSES[ERRORS] and c.cgroup in starved,
            (c.kind == "steal") != stolen,
            not (not waiting and c.kind in LINKED and c.labels.get(OTHER_END) in mine),
            c.kind == "displacement" and c.cgroup in forced,
            hogged and c.kind in LINKED,
            not (c.cgroup in mine or c.cgroup not in cgroups or c.kind in LINKED),
            c.labels.get(OTHER_END, next(iter(mine), "")) not in mine,
        )
    )
    return Incident(shown, folded, causes, tested, sorted(cgroups), dated_ns)


def _timed(
    causes: list[Cause],
    chosen: Sequence[JumpExplanation],
    head: JumpExplanation,
    intervals: int,
    config: ExplainConfig,
) -> tuple[list[Cause], int | None]:
    """The causes, each that began more than LATE_INTERVALS after the symptom marked late
    (``late_s``): a cause cannot start after its symptom. Where none began in time but the
    headline rose mostly when the first late one began (its change point found a smaller,
    earlier step), the incident is dated by that cause (returned, else None), and the causes are
    timed against that date."""
    change = min(j.change_index for j in chosen)
    windows = Windows.around(change, intervals, config.window_intervals)
    starts = head.starts_ns
    onsets: list[int | None] = []  # where each began, if after the change (None: in time)
    for cause in causes:
        row = np.asarray(cause.values, dtype=np.float64)
        onset = step_onset(row, windows) if len(row) == intervals else change
        onsets.append(onset if _quiet_until(row, windows, onset) else None)
    late = [onset for onset in onsets if onset is not None]
    dated_ns = None
    if late and len(late) == len(causes):
        column = PLOT_QUANTILES.index(head.quantile) if head.quantile in PLOT_QUANTILES else 1
        level = np.array([row[column] for row in head.interval_quantiles_ns], dtype=np.float64)
        first = min(late)
        if len(level) == intervals and _rose_mostly_at(level, windows, first):
            dated_ns, change = starts[first], first
    return [
        cause
        if onset is None or onset - change <= LATE_INTERVALS
        else replace(cause, late_s=(starts[onset] - starts[change]) / 1e9)
        for cause, onset in zip(causes, onsets, strict=True)
    ], dated_ns


def step_onset(row: npt.NDArray[np.float64], windows: Windows) -> int:
    """Where a per-interval signal within ``windows`` steps up most clearly: the split that
    maximises the standardised difference of the means after and before it (CUSUM)."""
    x = row[windows.before_start : windows.after_stop]
    n = len(x)
    if n < 2:
        return windows.change
    k = np.arange(1, n)
    total = np.cumsum(x)
    left = total[:-1] / k
    right = (total[-1] - total[:-1]) / (n - k)
    score = (right - left) * np.sqrt(k * (n - k) / n)
    return windows.before_start + 1 + int(np.argmax(score))


def _quiet_until(row: npt.NDArray[np.float64], windows: Windows, onset: int) -> bool:
    """Whether a signal stayed at its level before the change until ``onset``, more than
    LATE_INTERVALS after it: at most a quarter of its rise between, over a stretch where its rate
    after would have shown at least 3 (a run of quiet intervals by chance: under 5 %)."""
    between = row[windows.change : onset]
    if len(between) <= LATE_INTERVALS:
        return False
    before = float(row[windows.before].mean())
    after = float(row[onset : windows.after_stop].mean())
    enough = (after - before) * len(between) >= 3.0
    return bool(enough and float(between.mean()) <= before + 0.25 * (after - before))


def _rose_mostly_at(level: npt.NDArray[np.float64], windows: Windows, onset: int) -> bool:
    """Whether the symptom's quantile rose mostly at ``onset`` rather than at the change."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-nan slices: no events
        before = np.nanmedian(level[windows.before])
        between = np.nanmedian(level[windows.change : onset])
        after = np.nanmedian(level[onset : windows.after_stop])
    if not (np.isfinite(before) and np.isfinite(between) and np.isfinite(after)):
        return False
    return bool(after > before and between - before < 0.5 * (after - before))


def _top_aggressor(causes: Sequence[Cause], mine: set[str]) -> str | None:
    """Who holds the largest rise of displaced wait of ``mine`` (idle for a wait on idle CPUs;
    None: no displacement rose)."""
    displaced = [c for c in causes if c.kind in ("displacement", IDLE_CPU) and c.cgroup in mine]
    if not displaced:
        return None
    top = max(displaced, key=lambda c: c.after - c.before)
    return IDLE_CGROUP_NAME if top.kind == IDLE_CPU else top.labels.get("aggressor")


def _displaced_by_newcomer(jump: JumpExplanation) -> bool:
    """Most of this run-queue wait's rise was displaced by an aggressor that arrived with the
    change: new, or displacing it NEWCOMER_GROWTH times more than before (the change is dated at
    an interval's start, so a hog that started inside the interval before shows a little)."""
    return jump.displacement is not None and any(
        a.share.value >= MAJORITY and a.wait_after_ns >= NEWCOMER_GROWTH * a.wait_before_ns
        for a in jump.displacement.aggressors
    )


def _explain_one(
    stats: RangeStats,
    children: list[LabelKey],
    ids: list[int],
    tails: Mapping[tuple[int, int], npt.NDArray[np.float64]],
    result: OfflineResult,
    plot: list[list[float]],
    config: ExplainConfig,
) -> JumpExplanation:
    assert result.change_index is not None
    intervals = stats.intervals
    windows = Windows.around(result.change_index, intervals, config.window_intervals)
    edge = bucket_index(int(result.threshold_ns))
    decomposition = decompose_rows(
        children,
        np.stack([tails[(leaf, edge)] for leaf in ids], axis=1),
        stats.volume[:, ids],
        windows,
        result.threshold_ns,
        config.n_boot,
        config.seed,
        config.level,
    )
    labels = dict(result.series)
    probe = labels.get("probe")
    focus = labels.get("cgroup")
    if focus is None:
        top = next((s for s in decomposition.sources if s.effect > 0), None)
        focus = None if top is None else dict(top.source).get("cgroup")
    displacement = None
    # Who ran while a CPU limit parked the victim displaced nothing: not named where the limit
    # parked it in most intervals after the change (the incident names the limit).
    parked = None if focus is None else throttled_intervals(stats.counters, [focus]).get(focus)
    if (
        probe == RUNQUEUE
        and focus is not None
        and not (parked is not None and parked[windows.after].mean() > 0.5)
    ):
        displacement = displaced_by_rows(
            stats.counters, intervals, focus, windows, config.n_boot, config.seed, config.level
        )
    stacks = stack_shifts_rows(
        stats.counters,
        intervals,
        windows,
        probe,
        None if focus is None else [focus],
        config.fdr,
        config.n_boot,
        config.seed,
        config.level,
    )
    return JumpExplanation(
        series=result.series,
        aggregate=children != [result.series],
        quantile=result.quantile,
        direction=result.direction or "up",
        change_index=result.change_index,
        change_start_ns=int(stats.starts_ns[result.change_index]),
        before_ns=result.before_ns,
        after_ns=result.after_ns,
        p_value=result.p_value,
        threshold_ns=result.threshold_ns,
        decomposition=decomposition,
        displacement=displacement,
        stacks=stacks,
        starts_ns=[int(s) for s in stats.starts_ns],
        interval_quantiles_ns=plot,
    )
