"""``tailsight trading``: bring the reference trading system up and down for demos."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path
from typing import Annotated, Any

import typer

app = typer.Typer(
    help="The reference trading system in network namespaces: exchange, feed, strategy, gateway.",
    no_args_is_help=True,
    add_completion=False,
)

DEFAULT_STATE = Path("/run/tailsight-trading.json")


class _Stop(Exception):
    """SIGTERM/SIGINT while running: tear down."""


def _raise_stop(signum: int, frame: object) -> None:
    raise _Stop


# Capability bits (linux/capability.h) that namespaces, links and cgroups need.
_NEEDED_CAPABILITIES = {"CAP_NET_ADMIN": 12, "CAP_SYS_ADMIN": 21}


def _missing_capabilities() -> list[str]:
    """Needed capabilities this process lacks in its effective set (/proc/self/status CapEff)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            effective = int(line.split()[1], 16)
            return [n for n, bit in _NEEDED_CAPABILITIES.items() if not effective >> bit & 1]
    return [] if os.geteuid() == 0 else list(_NEEDED_CAPABILITIES)


def _topology(tag: str) -> Any:
    # Loads ctypes and socket (~7 ms): kept out of `tailsight --help`.
    from tailsight.trading_core.netns import Topology, unique_topology

    return unique_topology(tag) if tag else Topology()


def _run(config: Any, tag: str, duration_s: float, state: Path, as_json: bool) -> None:
    """Up, wait, down; the supervisor of a detached run too."""
    # Loads ctypes and socket (~7 ms): kept out of `tailsight --help`.
    from tailsight.trading_core import netns
    from tailsight.trading_core.components import LiveSystem

    topo = _topology(tag)
    previous = {s: signal.signal(s, _raise_stop) for s in (signal.SIGTERM, signal.SIGINT)}
    system = LiveSystem(topo, config)
    summary: dict[str, Any] = {}
    try:
        netns.up(topo)
        system.start()
        summary = {
            "supervisor_pid": os.getpid(),
            "exchange_ns": topo.exchange_ns,
            "trading_ns": topo.trading_ns,
            "exchange": f"{topo.exchange_ip}:{topo.order_port} (OUCH), "
            f":{topo.rerequest_port} (re-request)",
            "feed": f"{topo.trading_ip}:{topo.feed_port} ({config.feed_path})",
            "components": {
                c.name: {"pid": c.pid, "cgroup": str(c.cgroup)} for c in system.children
            },
        }
        partial = state.with_name(state.name + ".tmp")  # `up --detach` polls for the file
        partial.write_text(
            json.dumps({"pid": os.getpid(), "cgroup_base": config.cgroup_base, **summary})
        )
        partial.replace(state)
        if not as_json:
            typer.echo(f"trading system up: {topo.exchange_ns} <-> {topo.trading_ns}")
            for name, info in summary["components"].items():
                typer.echo(f"  {name:<9} pid {info['pid']:<8} {info['cgroup']}")
        deadline = time.monotonic() + duration_s if duration_s > 0 else None
        while deadline is None or time.monotonic() < deadline:
            time.sleep(0.1)
            dead = [name for name, alive in system.alive().items() if not alive]
            if dead:
                summary["died"] = dead
                break
    except _Stop:
        pass
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        alive = system.alive()
        system.stop()
        netns.down(topo)
        with contextlib.suppress(FileNotFoundError):
            state.unlink()
    summary["alive_at_stop"] = alive
    summary["exchange_stats"] = system.exchange_stats
    if as_json:
        typer.echo(json.dumps(summary))
    else:
        stats = system.exchange_stats
        typer.echo(
            f"trading system down: published {stats.get('published_messages', 0)} messages, "
            f"{stats.get('orders', 0)} orders, {stats.get('fills', 0)} fills"
        )
        if summary.get("died"):
            typer.echo(f"components that died: {', '.join(summary['died'])}", err=True)


@app.command()
def up(
    duration: Annotated[float, typer.Option(help="seconds to run; 0 = until Ctrl-C / down")] = 0,
    detach: Annotated[bool, typer.Option(help="run in the background; stop with `down`")] = False,
    itch_file: Annotated[
        Path | None, typer.Option("--itch", help="replay this ITCH file as the market")
    ] = None,
    messages: Annotated[int, typer.Option(help="size of the generated day")] = 200_000,
    symbols: Annotated[int, typer.Option(help="symbols in the generated day")] = 4,
    seed: Annotated[int, typer.Option(help="seed of the generated day")] = 1,
    speed: Annotated[
        float | None, typer.Option(help="replay at file time / speed (default: rate-limited)")
    ] = None,
    rate: Annotated[float, typer.Option(help="max feed packets per second")] = 2_000.0,
    path: Annotated[str, typer.Option(help="feed receive path: udp or afxdp")] = "udp",
    tag: Annotated[str, typer.Option(hidden=True, help="suffix for namespace names")] = "",
    cgroup_base: Annotated[str, typer.Option(hidden=True)] = "tailsight",
    state: Annotated[Path, typer.Option(hidden=True)] = DEFAULT_STATE,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """Start exchange, feed, strategy and gateway, each in its own cgroup."""
    # Loads numpy: kept out of `tailsight --help`.
    from tailsight.trading_core.components import LiveConfig

    missing = _missing_capabilities()
    if missing:
        typer.echo(
            "error: needs root: `trading up` creates network namespaces, veth links and cgroups "
            f"(missing {' and '.join(missing)})",
            err=True,
        )
        raise typer.Exit(2)
    if state.exists():
        typer.echo(f"already running (state in {state}); use `tailsight trading down`", err=True)
        raise typer.Exit(1)
    config = LiveConfig(
        itch_file=str(itch_file) if itch_file else None,
        seed=seed,
        symbols=symbols,
        messages=messages,
        speed=speed,
        max_packets_per_s=rate,
        feed_path=path,
        cgroup_base=cgroup_base,
    )
    if not detach:
        _run(config, tag, duration, state, as_json)
        return
    # Double fork: the supervisor is orphaned (init reaps it), so no zombie outlives it.
    first = os.fork()
    if first == 0:
        os.setsid()
        if os.fork() != 0:
            os._exit(0)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        status = 0
        try:
            _run(config, tag, duration, state, as_json=True)
        except BaseException:
            status = 1
        finally:
            os._exit(status)
    os.waitpid(first, 0)
    deadline = time.monotonic() + 10
    while not state.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    if not state.exists():
        typer.echo("the trading system did not come up", err=True)
        raise typer.Exit(1)
    pid = json.loads(state.read_text())["pid"]
    typer.echo(state.read_text() if as_json else f"trading system up in the background: pid {pid}")


@app.command()
def down(
    state: Annotated[Path, typer.Option(hidden=True)] = DEFAULT_STATE,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """Stop a detached trading system and remove its namespaces and cgroups."""
    # Loads ctypes and socket (~7 ms): kept out of `tailsight --help`.
    from tailsight.trading_core import netns
    from tailsight.trading_core.components import remove_cgroups

    info: dict[str, Any] = {}
    with contextlib.suppress(FileNotFoundError, json.JSONDecodeError):
        info = json.loads(state.read_text())
    stopped = False
    pid = info.get("pid")
    if isinstance(pid, int):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                os.kill(pid, 0)  # raises ProcessLookupError once it is gone
                time.sleep(0.05)
        stopped = True
    # Loads ctypes and socket (~7 ms): kept out of `tailsight --help`.
    from tailsight.trading_core.netns import Topology

    default = Topology()
    topo = Topology(  # a supervisor that died leaves these behind
        exchange_ns=str(info.get("exchange_ns", default.exchange_ns)),
        trading_ns=str(info.get("trading_ns", default.trading_ns)),
    )
    netns.down(topo)
    removed = remove_cgroups(str(info.get("cgroup_base", "tailsight")))
    with contextlib.suppress(FileNotFoundError):
        state.unlink()
    result = {"stopped_pid": pid if stopped else None, "removed_cgroups": removed}
    typer.echo(json.dumps(result) if as_json else f"trading system down (pid {pid})")


@app.command()
def cleanup(
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """Remove every namespace and interface named ts-* and the component cgroups."""
    # Loads ctypes and socket (~7 ms): kept out of `tailsight --help`.
    from tailsight.trading_core import netns
    from tailsight.trading_core.components import remove_cgroups

    removed = netns.cleanup() + remove_cgroups()
    if as_json:
        typer.echo(json.dumps({"removed": removed}))
    else:
        typer.echo("\n".join(removed) if removed else "nothing to remove")
