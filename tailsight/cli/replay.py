"""``tailsight replay FILE``: open-loop tick replay through the real trading system.

exchange -> feed -> book -> strategy (risk checks) -> gateway (OUCH) -> acks and fills, set up
once and run ``--runs`` times per path. Each run is one ``tailsight.hist/1`` file in ``--out``
(``replay-<path>-<run>.json``); a failed run leaves ``replay-<path>-<run>.failed`` with its
reason instead, the next runs go on, and the exit code is 1 when any failed. Gate two builds
on ``probe=replay,stage=in_system_tick_to_trade`` (kernel receive -> order send()).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Annotated, Any

import typer

_QUANTILES = (0.5, 0.99, 0.999)


def _quantiles(document: Any, stage: str) -> dict[str, Any]:
    (series,) = document.find(stage=stage)
    hist = series.hist
    values = hist.quantiles(_QUANTILES) if hist.count else [None] * len(_QUANTILES)
    return {
        "count": hist.count,
        **{f"p{q * 100:g}_ns": v for q, v in zip(_QUANTILES, values, strict=True)},
    }


def _summary(path: str, run: int, result: Any) -> dict[str, Any]:
    # Loads numpy: kept out of `tailsight --help`.
    from tailsight.trading_core.timing import IN_SYSTEM, SERIES, TICK_TO_TRADE

    document = result.document
    anomalies = {
        c.labels["stage"]: {"count": c.value, "example": c.labels["example"]}
        for c in document.counters
        if c.name == "clock_anomalies"
    }
    return {
        "path": path,
        "run": run,
        "failed": False,
        "xdp_mode": document.series[0].labels["xdp_mode"],
        "placement": document.series[0].labels["placement"],
        "complete": result.complete,
        IN_SYSTEM: _quantiles(document, IN_SYSTEM),
        TICK_TO_TRADE: _quantiles(document, TICK_TO_TRADE),
        "stages": {stage: _quantiles(document, stage) for stage in SERIES},
        "clock_anomalies": anomalies,
        "reconcile_problems": result.reconcile_problems[:5],
        "counters": result.counters,
    }


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value / 1e3:.1f}µs"


def _line(summary: dict[str, Any]) -> str:
    # Loads numpy: kept out of `tailsight --help`.
    from tailsight.trading_core.timing import IN_SYSTEM, TICK_TO_TRADE

    if summary["failed"]:
        return f"run {summary['run']} {summary['path']}: FAILED: {summary['reason']}"
    in_system, open_loop = summary[IN_SYSTEM], summary[TICK_TO_TRADE]
    counters = summary["counters"]
    anomalies = sum(a["count"] for a in summary["clock_anomalies"].values())
    return (
        f"run {summary['run']} {summary['path']}: {counters['orders']} orders, "
        f"{counters['fills']} fills; in-system p50={_us(in_system['p50_ns'])} "
        f"p99={_us(in_system['p99_ns'])}; open-loop p50={_us(open_loop['p50_ns'])} "
        f"p99={_us(open_loop['p99_ns'])}; clock anomalies {anomalies}"
    )


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


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
    act_share: Annotated[
        float,
        typer.Option(help="the strategy also sends an order on this share of book updates"),
    ] = 0.25,
    placement: Annotated[
        str,
        typer.Option(
            help="CPUs per component, e.g. exchange=0,trading=1; auto: exchange on the first "
            "CPU, trading alone on the last; none (default): unpinned"
        ),
    ] = "none",
    busy_poll: Annotated[
        bool, typer.Option(help="the trading loop spins on the feed instead of sleeping")
    ] = False,
    inject_delay_us: Annotated[
        float,
        typer.Option(help="calibration only: busy-wait this long before each order is sent"),
    ] = 0.0,
    loss: Annotated[int, typer.Option(help="drop this % of feed packets (nftables)")] = 0,
    inference: Annotated[
        bool,
        typer.Option(
            "--inference", help="a Llama-architecture signal for the strategy (docs/inference.md)"
        ),
    ] = False,
    model: Annotated[
        str,
        typer.Option(help="--inference model: smollm2, a GGUF file, an HF directory, a URL"),
    ] = "smollm2",
    as_json: Annotated[bool, typer.Option("--json", help="one JSON document")] = False,
) -> None:
    """Replay FILE through exchange, feed, book, strategy and gateway; time every tick."""
    # Loads numpy: kept out of `tailsight --help`.
    from tailsight.trading_core.feed import PATHS
    from tailsight.trading_core.netns import topology, unique_topology
    from tailsight.trading_core.replay import (
        Placement,
        ReplayConfig,
        ReplayResult,
        ReplayRunError,
        ReplaySystem,
        inject_feed_loss,
        iter_runs,
        load_ticks,
        speed_for_duration,
    )

    paths = list(PATHS) if path == "both" else [path]
    if any(p not in PATHS for p in paths):
        _fail(f"--path must be afxdp, udp or both, not {path!r}")
    if not 0.0 <= act_share <= 1.0:
        _fail(f"--act-share must be between 0 and 1, not {act_share}")
    if not 0.0 <= inject_delay_us < 1e6:
        _fail(f"--inject-delay-us must be between 0 and 1e6, not {inject_delay_us}")
    if duration is not None and not 0 < duration < 86_400:
        _fail(f"--duration must be a positive number of seconds, not {duration}")
    if not 0 < speed < float("inf"):
        _fail(f"--speed must be positive, not {speed}")
    if not 0 <= loss < 100:
        _fail(f"--loss must be a percentage in 0..99, not {loss}")
    remote = model.startswith(("http://", "https://"))
    if inference and model != "smollm2" and not remote and not Path(model).exists():
        _fail(f"--model {model}: no such file or directory")
    try:
        cpus = Placement.parse(placement)
    except ValueError as error:
        _fail(str(error))
    if not file.is_file():
        _fail(f"{file}: not a regular file (a FIFO, device or directory cannot be replayed)")
    if out.exists() and not out.is_dir():
        _fail(f"--out {out}: exists and is not a directory")
    if os.geteuid() != 0:
        _fail("replay needs root (network namespaces, cgroups, XDP, AF_XDP)")
    try:
        ticks = load_ticks(file)
    except (OSError, ValueError) as error:
        _fail(str(error))
    if duration is not None:
        speed = speed_for_duration(ticks.timestamps_ns, duration)
    config = ReplayConfig(
        speed=speed,
        act_share=act_share,
        inject_delay_us=inject_delay_us,
        path=paths[0],
        inference_model=model if inference else None,
        busy_poll=busy_poll,
    )
    out.mkdir(parents=True, exist_ok=True)
    summaries = []
    started = time.monotonic()
    with (
        topology(unique_topology("replay")) as topo,
        ReplaySystem(ticks, topo, paths, cpus) as system,
    ):
        if loss:
            inject_feed_loss(topo, loss)
        for run, receive_path, outcome in iter_runs(system, runs, paths, config):
            stem = f"replay-{receive_path}-{run:03d}"
            if isinstance(outcome, ReplayResult) and not outcome.complete:
                reason = (
                    f"session incomplete after the drain timeout "
                    f"({outcome.counters['messages']} messages, {outcome.counters['orders']} "
                    f"orders, {outcome.counters['acks'] + outcome.counters['order_rejects']} "
                    "answered)"
                )
                outcome = ReplayRunError(reason)
            if isinstance(outcome, ReplayResult):
                (out / f"{stem}.failed").unlink(missing_ok=True)
                outcome.document.write(out / f"{stem}.json")
                summary = _summary(receive_path, run, outcome)
            else:
                (out / f"{stem}.json").unlink(missing_ok=True)
                (out / f"{stem}.failed").write_text(f"{outcome}\n")
                summary = {"path": receive_path, "run": run, "failed": True, "reason": str(outcome)}
            summaries.append(summary)
            if not as_json:
                typer.echo(_line(summary))
    failed = sum(1 for s in summaries if s["failed"])
    wall_s = time.monotonic() - started
    if as_json:
        document = {
            "speed": speed,
            "out": str(out),
            "runs": summaries,
            "failed": failed,
            "wall_s": round(wall_s, 1),
        }
        typer.echo(json.dumps(document, indent=2))
    else:
        typer.echo(
            f"{len(summaries) - failed} of {len(summaries)} runs written to {out}, "
            f"{failed} failed; {wall_s:.0f} s"
        )
    if failed:
        typer.echo(f"error: {failed} of {len(summaries)} runs failed", err=True)
        raise typer.Exit(1)
