"""The ``tailsight`` command: assembles the command groups, nothing else."""

import typer

app = typer.Typer(
    name="tailsight",
    help="Kernel-level latency forensics: exact 5 µs histograms per cgroup.",
    no_args_is_help=True,
    add_completion=False,
)
