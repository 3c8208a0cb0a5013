"""Latency gate between two git revisions: build each in its own worktree, replay the same ITCH
file through both, interleaved A B A B ... with the same options (CPU placement included), then
``tailsight gate`` the runs. Exit status is the gate's: 0 pass, 1 regression, 3 inconclusive; 2
when the gate could not run (bad revision, a build or a replay that failed, bad options).

Used by ``make gate BASE=<rev> CAND=<rev>`` and the CI workflow (docs/ci-gate.md). Needs root
(replay builds network namespaces and loads XDP). Each revision runs its *own* replay code; the
verdict is computed by the gate of the checkout this script belongs to, so a candidate cannot
change the rule it is judged by.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

from tailsight.probes.noise import measure_noise
from tailsight.trading_core.replay import Placement

REPO = Path(__file__).resolve().parent.parent
CLI = "import sys; from tailsight.cli.main import app; sys.argv[0] = 'tailsight'; app()"
"""Run the tailsight CLI of whatever ``tailsight`` package comes first on sys.path."""


class GateRunError(RuntimeError):
    """The gate cannot be run as asked; the message says what failed."""


@dataclass(frozen=True)
class Side:
    """One revision: its name, commit, worktree and import site."""

    name: str
    rev: str
    commit: str
    worktree: Path
    site: Path
    runs: Path
    inject_delay_us: float


def git(*args: str, cwd: Path = REPO) -> str:
    result = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if result.returncode != 0:
        raise GateRunError(f"git {' '.join(args)}: {result.stderr.strip()}")
    return result.stdout.strip()


def build_site(worktree: Path, site: Path) -> None:
    """An import root whose ``tailsight.*`` packages are this worktree's folders (pyproject's
    package-dir), so the revision runs its own code with the shared venv's dependencies."""
    config = tomllib.loads((worktree / "pyproject.toml").read_text())
    package_dir: dict[str, str] = config["tool"]["setuptools"]["package-dir"]
    root = site / "tailsight"
    root.mkdir(parents=True)
    for entry in (worktree / package_dir["tailsight"]).iterdir():
        (root / entry.name).symlink_to(entry)
    for package, folder in package_dir.items():
        if package != "tailsight":
            (root / package.removeprefix("tailsight.")).symlink_to(worktree / folder)


def check_build(side: Side) -> None:
    """Byte-compile the revision and check that its CLI imports from its own worktree."""
    env = {**os.environ, "PYTHONPATH": str(side.site)}
    compiled = subprocess.run(
        [sys.executable, "-m", "compileall", "-q", str(side.site / "tailsight")],
        capture_output=True,
        text=True,
        env=env,
    )
    if compiled.returncode != 0:
        raise GateRunError(f"{side.name} {side.rev}: does not compile:\n{compiled.stdout[-2000:]}")
    probe = (
        "import tailsight.cli.main, tailsight.analysis, tailsight.trading_core, os; "
        "print(os.path.realpath(tailsight.trading_core.__path__[0]))"
    )
    found = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=side.site
    )
    if found.returncode != 0:
        raise GateRunError(f"{side.name} {side.rev}: does not import:\n{found.stderr[-2000:]}")
    if not Path(found.stdout.strip()).is_relative_to(side.worktree.resolve()):
        raise GateRunError(f"{side.name}: imports {found.stdout.strip()}, not its worktree")


def replay_block(side: Side, args: argparse.Namespace, itch: Path, block: int, runs: int) -> None:
    """``runs`` replay runs of one revision into its own block folder."""
    out = side.runs / f"block{block:03d}"
    command = [
        sys.executable, "-c", CLI, "replay", str(itch),
        "--runs", str(runs), "--duration", str(args.duration), "--path", args.path,
        "--out", str(out),
    ]  # fmt: skip
    if args.placement:
        command += ["--placement", args.placement]
    if args.busy_poll:
        command += ["--busy-poll"]
    if args.act_share is not None:
        command += ["--act-share", str(args.act_share)]
    if side.inject_delay_us:
        command += ["--inject-delay-us", str(side.inject_delay_us)]
    print(f"== {side.name} ({side.rev}) block {block}: {runs} runs", flush=True)
    env = {**os.environ, "PYTHONPATH": str(side.site)}
    result = subprocess.run(command, env=env, cwd=side.site, text=True, capture_output=True)
    sys.stdout.write(result.stdout)
    written = sorted(out.glob("*.json")) if out.is_dir() else []
    if result.returncode != 0 and not written:
        raise GateRunError(
            f"replay of {side.name} {side.rev} failed (exit {result.returncode}):\n"
            f"{result.stderr[-2000:]}"
        )
    if result.returncode != 0:
        print(f"   {side.name}: some runs failed:\n{result.stderr[-1000:]}", flush=True)


def noise_floor(placement: str, seconds: float = 0.5) -> str:
    """Each CPU the replays use: the share of ``seconds`` a pinned spin loop loses
    (``tailsight doctor --noise``); a P99 near that share moves with it (docs/ci-gate.md)."""
    pinned = list(Placement.parse(placement).cpus.values())
    cpus = sorted(frozenset().union(*pinned)) if pinned else sorted(os.sched_getaffinity(0))
    return "; ".join(f"cpu{cpu} {measure_noise(cpu, seconds).describe()}" for cpu in cpus)


def run(args: argparse.Namespace) -> int:
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="tailsight-gate-"))
    work.mkdir(parents=True, exist_ok=True)
    sides = []
    for name, rev, delay in (
        ("base", args.base, args.base_inject_delay_us),
        ("cand", args.cand, args.cand_inject_delay_us),
    ):
        try:
            commit = git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
        except GateRunError:
            raise GateRunError(f"--{name}: {rev!r} is not a commit in {REPO}") from None
        folder = work / name
        if folder.exists():
            raise GateRunError(f"{folder} exists: use an empty --work folder")
        sides.append(
            Side(name, rev, commit, folder / "tree", folder / "site", folder / "runs", delay)
        )
    try:
        for side in sides:
            git("worktree", "add", "--detach", "--quiet", str(side.worktree), side.commit)
            build_site(side.worktree, side.site)
            check_build(side)
            print(f"built {side.name}: {side.rev} = {side.commit[:12]}", flush=True)
        itch = Path(args.itch) if args.itch else work / "day.itch"
        if not args.itch:
            subprocess.run(
                [sys.executable, "-c", CLI, "itch", "generate", str(itch),
                 "--messages", str(args.messages or round(args.rate * args.duration))],
                check=True, stdout=subprocess.DEVNULL,
            )  # fmt: skip
        print(f"== noise floor before: {noise_floor(args.placement)}", flush=True)
        blocks = math.ceil(args.runs / args.block)
        for block in range(blocks):  # A B A B ...: slow drifts of the machine hit both alike
            runs = min(args.block, args.runs - block * args.block)
            for side in sides:
                replay_block(side, args, itch, block, runs)
        print(f"== noise floor after: {noise_floor(args.placement)}", flush=True)
        gate = [sys.executable, "-c", CLI, "gate"]
        for side in sides:
            for block_dir in sorted(p for p in side.runs.glob("block*") if any(p.glob("*.json"))):
                gate += ["-b" if side.name == "base" else "-c", str(block_dir)]
        print(f"== gate: {args.runs} runs per side, in {blocks} interleaved blocks", flush=True)
        return subprocess.run([*gate, *args.gate_args], cwd=REPO).returncode
    finally:
        if not args.keep:
            for side in sides:
                if side.worktree.exists():
                    git("worktree", "remove", "--force", str(side.worktree))
            if not args.work:
                shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="baseline revision (commit, tag, branch)")
    parser.add_argument("--cand", required=True, help="candidate revision")
    parser.add_argument("--itch", help="ITCH 5.0 file to replay (default: a generated day)")
    parser.add_argument("--messages", type=int, help="size of a generated day (or --rate)")
    parser.add_argument(
        "--rate", type=float, default=2_000.0, help="messages per second of a generated day"
    )
    parser.add_argument("--runs", type=int, default=30, help="runs per side (docs/ci-gate.md)")
    parser.add_argument(
        "--block", type=int, default=1, help="runs per replay invocation (docs/ci-gate.md)"
    )
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per run")
    parser.add_argument("--path", default="afxdp", choices=("afxdp", "udp"))
    # The configuration docs/ci-gate.md calibrates: the least run-to-run spread measured here.
    parser.add_argument("--placement", default="auto", help="CPUs per component, both sides")
    parser.add_argument(
        "--busy-poll",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="replay --busy-poll (spin on the feed)",
    )
    parser.add_argument("--act-share", type=float, default=None, help="passed to replay")
    parser.add_argument("--base-inject-delay-us", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument(
        "--cand-inject-delay-us", type=float, default=0.0, help="calibration: slow the candidate"
    )
    parser.add_argument("--work", help="folder for worktrees and runs (default: a temp folder)")
    parser.add_argument("--keep", action="store_true", help="keep worktrees and runs")
    parser.add_argument("gate_args", nargs=argparse.REMAINDER, help="after --: gate options")
    args = parser.parse_args()
    if args.gate_args[:1] == ["--"]:
        args.gate_args = args.gate_args[1:]
    if args.runs < 2 or args.block < 1 or not 0 < args.duration < 3600:
        parser.error("need --runs >= 2, --block >= 1 and 0 < --duration < 3600")
    try:
        code = run(args)
    except (GateRunError, subprocess.CalledProcessError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        code = 2
    sys.exit(code)


if __name__ == "__main__":
    main()
