"""``tailsight replay FILE``: open-loop tick replay through exchange -> feed -> book -> order.

Each run is written as one ``tailsight.hist/1`` file, so runs of two builds can be interleaved
and compared with ``tailsight gate --series probe=replay,stage=tick_to_trade``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any

import typer

_QUANTILES = (0.5, 0.99, 0.999)


def _summary(path: str, run: int, result: Any) -> dict[str, Any]:
    from tailsight.trading_core.timing import TICK_TO_TRADE

    stages = {}
    for series in result.document.series:
        hist = series.hist
        values = hist.quantiles(_QUANTILES) if hist.count else [None] * len(_QUANTILES)
        stages[series.labels["stage"]] = {
            "count": hist.count,
            **{f"p{q * 100:g}_ns": v for q, v in zip(_QUANTILES, values, strict=True)},
        }
    return {
        "path": path,
        "run": run,
        "xdp_mode": result.document.series[0].labels["xdp_mode"],
        "complete": result.complete,
        "tick_to_trade": stages[TICK_TO_TRADE],
        "stages": stages,
        "counters": result.counters,
    }


def replay(
    file: Annotated[Path, typer.Argument(help="ITCH 5.0 file (plain or gzip)", exists=True)],
    speed: Annotated[float, typer.Option(help="replay pace: file time / speed")] = 1.0,
    duration: Annotated[
        float | None, typer.Option(help="seconds per run; sets the speed (overrides --speed)")
    ] = None,
    runs: Annotated[int, typer.Option(min=1, help="runs per path, interleaved")] = 1,
    path: Annotated[str, typer.Option(help="receive path: afxdp, udp or both")] = "afxdp",
    out: Annotated[Path, typer.Option(help="directory for one result file per run")] = Path(
        "replay-results"
    ),
    loss: Annotated[int, typer.Option(help="drop this % of feed packets (nftables)")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON document")] = False,
) -> None:
    """Replay FILE at its own pace (or --speed), timing every tick from its intended send time."""
    from tailsight.trading_core.feed import PATHS
    from tailsight.trading_core.netns import topology, unique_topology
    from tailsight.trading_core.replay import (
        ReplayConfig,
        inject_feed_loss,
        load_ticks,
        replay_once,
        speed_for_duration,
    )

    if os.geteuid() != 0:
        typer.echo("error: replay needs root (network namespaces, XDP, AF_XDP)", err=True)
        raise typer.Exit(2)
    paths = list(PATHS) if path == "both" else [path]
    if any(p not in PATHS for p in paths):
        typer.echo(f"error: --path must be afxdp, udp or both, not {path!r}", err=True)
        raise typer.Exit(2)
    try:
        ticks = load_ticks(file)
    except (OSError, ValueError) as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2) from error
    if duration is not None:
        speed = speed_for_duration(ticks.timestamps_ns, duration)
    summaries = []
    with topology(unique_topology("replay")) as topo:
        if loss:
            inject_feed_loss(topo, loss)
        for run in range(runs):
            for receive_path in paths:
                result = replay_once(ticks, topo, ReplayConfig(path=receive_path, speed=speed))
                out.mkdir(parents=True, exist_ok=True)
                result.document.write(out / f"replay-{receive_path}-{run:03d}.json")
                summary = _summary(receive_path, run, result)
                summaries.append(summary)
                if not as_json:
                    t2t = summary["tick_to_trade"]
                    cells = " ".join(
                        f"p{q * 100:g}={t2t[f'p{q * 100:g}_ns'] / 1e3:.1f}µs"
                        if t2t[f"p{q * 100:g}_ns"] is not None
                        else f"p{q * 100:g}=-"
                        for q in _QUANTILES
                    )
                    typer.echo(
                        f"run {run} {receive_path} ({summary['xdp_mode']}): tick-to-trade "
                        f"n={t2t['count']} {cells}; "
                        f"gaps {result.counters['gaps_detected']}, "
                        f"recovered {result.counters['recovered_messages']}"
                    )
    if as_json:
        typer.echo(json.dumps({"speed": speed, "out": str(out), "runs": summaries}, indent=2))
    if not all(s["complete"] for s in summaries):
        typer.echo("error: a run ended before its session was complete", err=True)
        raise typer.Exit(1)
