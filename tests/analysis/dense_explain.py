"""Test oracle: ``explain`` without streaming, on dense ``[intervals, buckets]`` arrays of
every series and aggregate (12 GB for 1 h x 100 cgroups). The streaming path must
give the same report; the scale benchmark times it as the baseline."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from tailsight.analysis.attribution import Windows, decompose_tail, displaced_by, stack_shifts
from tailsight.analysis.causes import CounterTable
from tailsight.analysis.explain.model import ExplainConfig, JumpExplanation, Report
from tailsight.analysis.explain.pipeline import _sum, find_incidents, interval_quantiles, views
from tailsight.analysis.jumps import OfflineResult, detect_many
from tailsight.analysis.quantiles import dense_counts_by_series
from tailsight.hist import bucket_index
from tailsight.intervals import HistDocument, LabelKey


def dense_explain(
    documents: Sequence[HistDocument],
    selector: Mapping[str, str] | None = None,
    config: ExplainConfig | None = None,
) -> Report:
    """``explain_documents`` on dense arrays."""
    config = config or ExplainConfig()
    selector = dict(selector or {})
    starts, leaves = dense_counts_by_series(documents, selector)
    tested = views(leaves, config.aggregates)
    arrays = {key: _sum(leaves, children) for key, children in tested.items()}
    results = detect_many(arrays, config.quantiles, config.jump, config.fdr)
    best: dict[LabelKey, OfflineResult] = {}
    for result in results:
        if not (result.discovered and result.confirmed and result.change_index is not None):
            continue
        held = best.get(result.series)
        if held is None or result.p_value < held.p_value:
            best[result.series] = result
    falls = [key for key, result in best.items() if result.direction == "down"]
    if not config.falls:
        for key in falls:
            del best[key]
    jumps = [
        _explain_one(documents, starts, leaves, tested[key], arrays[key], result, config)
        for key, result in best.items()
    ]
    incidents = find_incidents(jumps, CounterTable.of(documents), len(documents), config)
    shown = [j for incident in incidents for j in incident.jumps]
    return Report(
        start_ns=documents[0].start_ns if documents else None,
        end_ns=documents[-1].end_ns if documents else None,
        intervals=len(documents),
        selector=selector,
        tested=len(results),
        jumps=shown,
        config=config,
        incidents=incidents,
        falls_hidden=0 if config.falls else len(falls),
    )


def _explain_one(
    documents: Sequence[HistDocument],
    starts: npt.NDArray[np.int64],
    leaves: Mapping[LabelKey, npt.NDArray[np.int64]],
    children: list[LabelKey],
    counts: npt.NDArray[np.int64],
    result: OfflineResult,
    config: ExplainConfig,
) -> JumpExplanation:
    assert result.change_index is not None
    windows = Windows.around(result.change_index, len(documents), config.window_intervals)
    decomposition = decompose_tail(
        {child: leaves[child] for child in children},
        bucket_index(int(result.threshold_ns)),
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
    if probe == "runqueue" and focus is not None:
        displacement = displaced_by(
            documents, focus, windows, config.n_boot, config.seed, config.level
        )
    stacks = stack_shifts(
        documents,
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
        change_start_ns=int(starts[result.change_index]),
        before_ns=result.before_ns,
        after_ns=result.after_ns,
        p_value=result.p_value,
        threshold_ns=result.threshold_ns,
        decomposition=decomposition,
        displacement=displacement,
        stacks=stacks,
        starts_ns=[int(s) for s in starts],
        interval_quantiles_ns=interval_quantiles(counts),
    )
