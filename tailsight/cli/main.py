"""The ``tailsight`` command: assembles the command groups, nothing else."""

import typer

from tailsight.cli import (
    dashboards,
    doctor,
    explain,
    gate,
    itch,
    record,
    replay,
    serve,
    trace,
    trading,
)

app = typer.Typer(
    name="tailsight",
    help="Kernel-level latency forensics: exact 5 µs histograms per cgroup.",
    no_args_is_help=True,
    add_completion=False,
)
app.command("doctor")(doctor.doctor)
app.command("explain")(explain.explain)
app.command("gate")(gate.gate)
app.command("record")(record.record)
app.command("replay")(replay.replay)
app.command("serve")(serve.serve)
app.command("show")(record.show)
app.command("trace")(trace.trace)
app.add_typer(dashboards.app, name="dashboards")
app.add_typer(itch.app, name="itch")
app.add_typer(trading.app, name="trading")
