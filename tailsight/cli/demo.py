"""``python -m tailsight.cli.demo`` (what ``make demo`` runs): the whole story in under two minutes.

The reference trading system comes up in its network namespaces and cgroups, the agent starts
(``tailsight serve --record``), a generated trading day is replayed through it, and half way a
noisy neighbour (a CPU hog in a sibling cgroup) lands on the CPU the feed runs on. The live view
shows the trading process's run-queue wait jump and the agent's own live verdict; then ``explain``
reads the recording and names the aggressor and when it started. Everything the demo made
(processes, cgroups, namespaces, temporary files) is removed at the end, on Ctrl-C too; what it
keeps is ``--out`` (default ``demo-out/``): the HTML report and the recording it was made from.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np

from tailsight import dashboards
from tailsight.analysis.explain.html import render_html, write_report
from tailsight.analysis.explain.pipeline import explain_documents
from tailsight.analysis.explain.text import describe_report
from tailsight.analysis.verdicts import (
    TAIL_JUMP_AGGRESSOR_SHARE,
    TAIL_JUMP_P99_AFTER,
    TAIL_JUMP_P99_BEFORE,
)
from tailsight.cli.trace_view import (
    VIEW_WIDTH,
    HeatInterval,
    Selection,
    interval_p99s_ns,
    render,
    series_key,
)
from tailsight.collector.store.reader import Recording
from tailsight.intervals import Counter, HistDocument, Series
from tailsight.probes.runqueue import PROBE_NAME as RUNQUEUE
from tailsight.testing.inject import Injection, score
from tailsight.testing.workload import Workload, python_task, stop_process
from tailsight.trading_core.market import END_OF_MARKET_HOURS_NS, START_OF_MARKET_HOURS_NS
from tailsight.trading_core.netns import topology, unique_topology
from tailsight.trading_core.replay import (
    Placement,
    ReplayConfig,
    ReplaySystem,
    TickFile,
    load_ticks,
    speed_for_duration,
)
from tailsight.trading_core.timing import IN_SYSTEM

REPLAY_S: Final = 40.0
INTERVAL_S: Final = 0.5  # the agent's; the live view refreshes every other interval
# The pre-market and after-hours (10 of the day's 16 hours, a tenth of its messages) are played
# this much faster: the replay is the regular session, at one pace, so that the only change the
# trading process sees half way is the neighbour (the market's open would be a jump of its own).
OFF_HOURS_SPEEDUP: Final = 20
INJECT_AT: Final = 0.5
MIN_QUIET_S: Final = 16.0  # the jump detectors' reference: 30 intervals of 0.5 s, and a margin
MIN_NOISY_S: Final = 10.0
MESSAGES: Final = 40_000  # ~1,000 ITCH messages/s at the default length: the trading CPU ~15 % busy
LISTEN_PORT: Final = 19435  # not serve's 9435: an agent already running there is left alone
PROVISIONING: Final = Path(dashboards.__file__).parent / "provisioning"
# Nice -10 (weight 9548 vs the trading process's 1024): the neighbour takes ~90 % of the CPU, a
# batch job someone reniced. Measured on 2 loaded cores: a nice-0 hog moves the trading P99 about
# as much as the other load on the machine already does, -5 only while the feed is quiet.
HOG_NICE: Final = -10
HOG_CODE: Final = (
    # Ctrl-C reaches the whole process group: the hog dies with the demo, without a traceback.
    f"import os, signal\nos.setpriority(os.PRIO_PROCESS, 0, {HOG_NICE})\n"
    "signal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: pass\n"
)
_PR_SET_PDEATHSIG: Final = 1


@dataclass
class Scene:
    """Who is where: the demo's cgroups (relative to the cgroup2 root) and CPUs."""

    base: str
    trading_cpu: int
    other_cpus: frozenset[int]
    inject_ns: int | None = None
    verdicts: list[str] = field(default_factory=list)

    @property
    def victim(self) -> str:
        return f"/{self.base}/trading"

    @property
    def aggressor(self) -> str:
        return f"/{self.base}/noisy"

    def ours(self, cgroup: str) -> bool:
        return cgroup.startswith(f"/{self.base}/")


def choose_scene() -> Scene:
    """The trading process gets the highest CPU to itself; the exchange, the agent and the demo
    share the others (on one CPU, everything shares it)."""
    cpus = sorted(os.sched_getaffinity(0))
    others = frozenset(cpus[:-1] or cpus)
    return Scene(base=f"tailsight-demo-{os.getpid()}", trading_cpu=cpus[-1], other_cpus=others)


def fast_forward_off_hours(ticks: TickFile, speedup: float = OFF_HOURS_SPEEDUP) -> TickFile:
    """``ticks`` with the time before the open and after the close divided by ``speedup``, in the
    messages' own timestamps too (the exchange paces the feed by them)."""
    start, end = START_OF_MARKET_HOURS_NS, END_OF_MARKET_HOURS_NS
    stamps = ticks.timestamps_ns
    moved = np.where(
        stamps < start,
        start - (start - stamps) / speedup,
        np.where(stamps > end, end + (stamps - end) / speedup, stamps),
    ).astype(np.int64)
    messages = [
        raw[:5] + int(ts).to_bytes(6, "big") + raw[11:]
        for raw, ts in zip(ticks.messages, moved, strict=True)
    ]
    return TickFile(messages, moved)


def _clock(ns: int) -> str:
    """UTC, as ``explain`` prints times."""
    return time.strftime("%H:%M:%S", time.gmtime(ns / 1e9)) + f".{ns // 100_000_000 % 10}"


# ------------------------------------------------------------------ the agent


def _die_with_parent() -> None:
    """In the agent's child before exec: SIGTERM (detach, flush) if the demo itself dies."""
    ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


@contextlib.contextmanager
def running_agent(record_dir: Path, scene: Scene, log_path: Path) -> Iterator[str]:
    """``tailsight serve --record`` for the demo's cgroups; yields its /metrics URL once it has
    recorded an interval; SIGTERM and wait on exit (it detaches and flushes the recording)."""
    command = [
        str(Path(sys.executable).with_name("tailsight")), "serve",
        "--record", str(record_dir),
        "--interval", str(INTERVAL_S),
        "--listen", f"127.0.0.1:{LISTEN_PORT}",
        "--cgroup-allow", f"/{scene.base}/.*",
    ]  # fmt: skip
    with open(log_path, "wb") as log:
        # Its own session: a Ctrl-C reaches the demo, which then stops the agent in order.
        agent = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
    try:
        os.sched_setaffinity(agent.pid, scene.other_cpus)
        deadline = time.monotonic() + 120.0
        while True:
            with contextlib.suppress(FileNotFoundError):
                if Recording(record_dir).documents():
                    break
            if agent.poll() is not None:
                said = log_path.read_text(errors="replace").strip()
                raise DemoError(f"the agent exited ({agent.returncode}): {said}")
            if time.monotonic() > deadline:
                raise DemoError("the agent recorded no interval in 120 s")
            time.sleep(0.1)
        yield f"http://127.0.0.1:{LISTEN_PORT}/metrics"
    finally:
        if agent.poll() is None:
            stop_process(agent, 20)


class DemoError(RuntimeError):
    """The demo cannot go on; the message says why."""


# ------------------------------------------------------------------ the live view


def window_document(documents: Sequence[HistDocument], keep: Callable[[str], bool]) -> HistDocument:
    """The run-queue series and displacement counters of ``documents`` summed per label set,
    for the cgroups ``keep`` accepts (victims for counters)."""
    series: dict[tuple[tuple[str, str], ...], Series] = {}
    counters: dict[tuple[str, tuple[tuple[str, str], ...]], Counter] = {}
    for document in documents:
        for s in document.series:
            if s.labels.get("probe") != RUNQUEUE or not keep(s.labels.get("cgroup", "")):
                continue
            key = tuple(sorted(s.labels.items()))
            held = series.get(key)
            series[key] = Series(dict(s.labels), s.hist if held is None else held.hist + s.hist)
        for c in document.counters:
            if not keep(c.labels.get("victim", c.labels.get("cgroup", ""))):
                continue
            ckey = (c.name, tuple(sorted(c.labels.items())))
            had = counters.get(ckey)
            counters[ckey] = Counter(c.name, dict(c.labels), c.value + (had.value if had else 0))
    return HistDocument(
        start_ns=documents[0].start_ns if documents else 0,
        end_ns=documents[-1].end_ns if documents else 0,
        series=list(series.values()),
        counters=list(counters.values()),
    )


def live_verdicts(metrics_url: str, scene: Scene) -> list[str]:
    """The agent's active ``tailsight_tail_jump`` verdicts on the demo's cgroups, one line each."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(metrics_url, timeout=2) as response:
        text = response.read().decode()
    before: dict[str, float] = {}
    after: dict[str, float] = {}
    shares: dict[str, list[tuple[float, str]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            cgroup = sample.labels.get("cgroup", "")
            if not scene.ours(cgroup):
                continue
            if sample.name == TAIL_JUMP_P99_BEFORE:
                before[cgroup] = sample.value
            elif sample.name == TAIL_JUMP_P99_AFTER:
                after[cgroup] = sample.value
            elif sample.name == TAIL_JUMP_AGGRESSOR_SHARE:
                shares.setdefault(cgroup, []).append((sample.value, sample.labels["aggressor"]))
    lines = []
    for cgroup in sorted(after):
        line = (
            f"{cgroup} run-queue P99 {before.get(cgroup, 0) * 1e6:,.0f} µs -> "
            f"{after[cgroup] * 1e6:,.0f} µs"
        )
        if shares.get(cgroup):
            share, aggressor = max(shares[cgroup])
            line += f", displaced by {aggressor} ({share:.0%})"
        lines.append(line)
    return lines


class LiveView:
    """Every refresh: the last intervals the agent recorded, the victim's heatmap and P99 per
    interval, the agent's live verdict. A terminal gets the rich view, anything else plain lines."""

    def __init__(self, console: Any, record_dir: Path, metrics_url: str, scene: Scene) -> None:
        self.console = console
        self.record_dir = record_dir
        self.metrics_url = metrics_url
        self.scene = scene
        self.victim = Selection(RUNQUEUE, series_key({"probe": RUNQUEUE, "cgroup": scene.victim}))
        self.intervals: list[HistDocument] = []
        self.started_ns = time.time_ns()
        self._seen_end_ns = 0

    def poll(self) -> None:
        """Read what the agent recorded since the last poll, and its live verdict."""
        fresh = [
            d
            for d in Recording(self.record_dir).documents(since_ns=self._seen_end_ns or None)
            if d.start_ns >= self._seen_end_ns
        ]
        if fresh:
            self._seen_end_ns = fresh[-1].end_ns
            self.intervals += [window_document([d], self.scene.ours) for d in fresh]
            del self.intervals[:-64]
        with contextlib.suppress(OSError, ValueError):
            for line in live_verdicts(self.metrics_url, self.scene):
                if line not in self.scene.verdicts:
                    self.scene.verdicts.append(line)

    def victim_p99_us(self, last: int) -> float:
        heat = [HeatInterval.of(d) for d in self.intervals[-last:]]
        p99s = [p for p in interval_p99s_ns(heat, self.victim) if p == p]
        return max(p99s, default=float("nan")) / 1e3

    def phase(self) -> str:
        if self.scene.inject_ns is None:
            return "quiet: the trading process has its CPU to itself"
        since_s = (time.time_ns() - self.scene.inject_ns) / 1e9
        return (
            f"NOISY NEIGHBOUR since {_clock(self.scene.inject_ns)} ({since_s:.0f} s): "
            f"{self.scene.aggressor} spinning on CPU {self.scene.trading_cpu}"
        )

    def line(self) -> str:
        """The plain view: one line per refresh."""
        elapsed_s = (time.time_ns() - self.started_ns) / 1e9
        if self.scene.inject_ns is None:
            phase = "quiet"
        else:
            phase = f"noisy neighbour for {(time.time_ns() - self.scene.inject_ns) / 1e9:.0f} s"
        return (
            f"+{elapsed_s:3.0f} s  {self.scene.victim.rsplit('/', 1)[-1]} run-queue wait P99 "
            f"{self.victim_p99_us(2):9,.0f} µs  {phase}"
        )

    def renderable(self) -> Any:
        from rich.console import Group
        from rich.text import Text

        window = window_document(self.intervals[-10:], self.scene.ours)
        verdict = self.scene.verdicts[-1] if self.scene.verdicts else "none yet"
        return Group(
            Text(self.phase(), style="bold red" if self.scene.inject_ns else "bold green"),
            Text(f"agent's live verdict: {verdict}", style="bold" if self.scene.verdicts else ""),
            render(
                window,
                "run-queue wait of the demo's cgroups, last 5 s",
                selection=self.victim,
                intervals=[HeatInterval.of(d) for d in self.intervals],
                height=max(12, int(getattr(self.console, "height", 40)) - 4),
            ),
        )


def show_live(
    view: LiveView, stop: threading.Event, inject: Callable[[], None], inject_at_s: float
) -> None:
    """Refresh the view until ``stop``; call ``inject`` once ``inject_at_s`` have passed."""
    from rich.live import Live

    started = time.monotonic()
    terminal = view.console.is_terminal
    printed_verdicts = 0
    with contextlib.ExitStack() as stack:
        live = None
        if terminal:
            live = stack.enter_context(
                Live(view.renderable(), console=view.console, auto_refresh=False)
            )
        while not stop.wait(2 * INTERVAL_S):
            if view.scene.inject_ns is None and time.monotonic() - started >= inject_at_s:
                inject()
                if live is None:
                    view.console.print(
                        f"  >>> {_clock(view.scene.inject_ns or 0)}: a CPU hog starts in "
                        f"{view.scene.aggressor}, pinned on CPU {view.scene.trading_cpu} "
                        "(the feed's)",
                        markup=False,
                    )
            view.poll()
            if live is not None:
                live.update(view.renderable(), refresh=True)
                continue
            view.console.print(view.line(), markup=False, highlight=False)
            for verdict in view.scene.verdicts[printed_verdicts:]:
                view.console.print(f"  >>> agent's live verdict: {verdict}", markup=False)
            printed_verdicts = len(view.scene.verdicts)


# ------------------------------------------------------------------ the demo


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tailsight.cli.demo", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--replay-s", type=float, default=REPLAY_S, help="seconds of replay")
    parser.add_argument(
        "--inject-at-s", type=float, default=None, help="when the hog starts (default: half way)"
    )
    parser.add_argument("--out", type=Path, default=Path("demo-out"), help="report + recording")
    args = parser.parse_args(argv)
    if args.inject_at_s is None:
        args.inject_at_s = INJECT_AT * args.replay_s
    if not MIN_QUIET_S <= args.inject_at_s <= args.replay_s - MIN_NOISY_S:
        parser.error(
            f"--inject-at-s must be at least {MIN_QUIET_S:.0f} s (the detector's reference) and "
            f"{MIN_NOISY_S:.0f} s before the replay ends (--replay-s)"
        )
    if args.out.exists() and not args.out.is_dir():
        parser.error(f"--out {args.out}: exists and is not a directory")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if os.geteuid() != 0:
        print("error: the demo needs root (eBPF, network namespaces, cgroups)", file=sys.stderr)
        return 2
    # SIGTERM unwinds like Ctrl-C: every context below cleans up what it made.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        return run_demo(args)
    except KeyboardInterrupt:
        print("\ninterrupted: everything the demo started is stopped and removed", file=sys.stderr)
        return 130
    except DemoError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1


def run_demo(args: argparse.Namespace) -> int:
    from rich.console import Console

    started = time.monotonic()
    console = Console(width=min(Console().width, VIEW_WIDTH), highlight=False)

    def say(text: str) -> None:
        console.print(f"[{time.monotonic() - started:5.1f} s] {text}", markup=False)

    scene = choose_scene()
    os.sched_setaffinity(0, scene.other_cpus)  # the demo itself stays off the trading CPU
    with tempfile.TemporaryDirectory(prefix="tailsight-demo-") as temporary:
        work = Path(temporary)
        record_dir = work / "recording"
        with contextlib.ExitStack() as stack:
            say(f"agent: tailsight serve --record --interval {INTERVAL_S} (all probes; compiling)")
            agent = stack.enter_context(running_agent(record_dir, scene, work / "agent.log"))
            day = work / "day.itch"
            say(f"a trading day: tailsight itch generate --messages {MESSAGES:,}")
            subprocess.run(
                [str(Path(sys.executable).with_name("tailsight")), "itch", "generate", str(day),
                 "--messages", str(MESSAGES)],
                check=True, stdout=subprocess.DEVNULL,
            )  # fmt: skip
            ticks = fast_forward_off_hours(load_ticks(day))
            say(
                f"trading system: exchange and trading namespaces, cgroups /{scene.base}/"
                f"{{exchange,trading}}; trading (feed, book, strategy, gateway) on CPU "
                f"{scene.trading_cpu}"
            )
            topo = stack.enter_context(topology(unique_topology("demo")))
            placement = Placement(
                {"exchange": scene.other_cpus, "trading": frozenset({scene.trading_cpu})}
            )
            system = stack.enter_context(
                ReplaySystem(ticks, topo, ["afxdp"], placement, cgroup_base=scene.base)
            )
            system.start()
            hog = Workload([python_task("noisy", HOG_CODE, cpu=scene.trading_cpu)], base=scene.base)
            stack.callback(hog.close)

            def inject() -> None:
                hog.start()
                scene.inject_ns = time.time_ns()

            say(
                f"replay: {len(ticks.messages):,} messages in {args.replay_s:.0f} s; a CPU hog "
                f"joins CPU {scene.trading_cpu} after {args.inject_at_s:.0f} s"
            )
            view = LiveView(console, record_dir, agent, scene)
            stop = threading.Event()
            shown = threading.Thread(target=show_live, args=(view, stop, inject, args.inject_at_s))
            speed = speed_for_duration(ticks.timestamps_ns, args.replay_s)
            shown.start()
            try:
                result = system.run(ReplayConfig(speed=speed, act_share=0.25))
            finally:
                stop.set()
                shown.join()
                hog.close()
            counters = result.counters
            (in_system,) = result.document.find(stage=IN_SYSTEM)
            p50_us, p99_us = (q / 1e3 for q in in_system.hist.quantiles([0.5, 0.99]))
            say(
                f"replay done: {counters['messages']:,} messages, {counters['orders']:,} orders; "
                f"in-system tick-to-trade P50 {p50_us:,.0f} µs, P99 {p99_us:,.0f} µs"
            )
            say("stopping the agent (it flushes the recording) and the trading system")
        # The agent has flushed and stopped; the system, its namespaces and cgroups are gone.
        if scene.inject_ns is None:
            raise DemoError("the replay ended before the noisy neighbour was injected")
        return tell(console, say, scene, record_dir, args.out)


def _shown(path: Path) -> str:
    """``path`` relative to the working directory when it is below it."""
    with contextlib.suppress(ValueError):
        return str(path.resolve().relative_to(Path.cwd()))
    return str(path)


def tell(
    console: Any, say: Callable[[str], None], scene: Scene, record_dir: Path, out: Path
) -> int:
    """``explain`` over the recording: its narrative, whether it named the injected aggressor
    and when; the report and the recording go to ``out``."""
    assert scene.inject_ns is not None
    # The recording is kept first: whatever explain does, the user can run it again.
    out.mkdir(parents=True, exist_ok=True)
    kept = out / "recording"
    shutil.rmtree(kept, ignore_errors=True)
    shutil.move(record_dir, kept)
    documents = Recording(kept).documents()
    say(f"tailsight explain: {len(documents)} intervals of {INTERVAL_S} s")
    report = explain_documents(documents)
    console.print(describe_report(report), markup=False, end="")
    html = out / "report.html"
    write_report(html, render_html(report, documents, title="tailsight demo: explain"))
    truth = Injection(
        "cpu_hog", documents, scene.inject_ns, scene.victim, scene.aggressor, ("displacement",)
    )
    # The trading process's own causes: under background load the incident may also hold the
    # exchange's jump (the load the hog pushed onto the exchange's CPU) with its own causes.
    found = score(report, truth, own_causes=True)
    console.print()
    console.print(
        f"injected: a CPU hog in {scene.aggressor} on CPU {scene.trading_cpu} at "
        f"{_clock(scene.inject_ns)}",
        markup=False,
    )
    if found.top1:
        console.print(
            f"explain:  {scene.victim}'s run-queue P99 jumped at "
            f"{_clock(scene.inject_ns + round(found.time_error_s * 1e9))} "
            f"({found.time_error_s:+.1f} s), most likely cause: displacement by {scene.aggressor}",
            markup=False,
        )
    else:
        console.print(f"explain did not name the aggressor first: {found.named}", markup=False)
    console.print(f"HTML report: {html}", markup=False)
    console.print(f"recording:   {kept} (tailsight explain {kept})", markup=False)
    console.print(
        f"Grafana:     provisioning folder {_shown(PROVISIONING)}/, dashboards in "
        f"{_shown(PROVISIONING.parent / 'generated')}/ (docs/dashboards.md); its Prometheus "
        "scrapes `tailsight serve`",
        markup=False,
    )
    return 0 if found.top1 else 1


if __name__ == "__main__":
    sys.exit(main())
