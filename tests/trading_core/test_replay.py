"""Tick replay end to end in namespaces, through the real strategy and gateway.

Ground truth the replay does not produce: the exchange's own account view (orders, fills) for
reconciliation, a book built from the messages the exchange published, the kernel's nftables
verdicts for loss, and the process table for "set up once"."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from feed_helpers import book_state
from typer.testing import CliRunner

from tailsight.cli.main import app
from tailsight.intervals import HistDocument
from tailsight.trading_core import itch
from tailsight.trading_core.book import Book
from tailsight.trading_core.exchange import Exchange, directory_messages
from tailsight.trading_core.market import write_day
from tailsight.trading_core.netns import Topology, topology, unique_topology
from tailsight.trading_core.replay import (
    Placement,
    ReplayConfig,
    ReplayResult,
    ReplayRunError,
    ReplaySystem,
    TickFile,
    feed_loss_dropped,
    inject_feed_loss,
    intended_offsets_ns,
    iter_runs,
    load_ticks,
    remove_feed_loss,
    speed_for_duration,
)
from tailsight.trading_core.timing import (
    IN_SYSTEM,
    PUBLISH_LAG,
    SERIES,
    TICK_TO_TRADE,
    WIRE,
)

MESSAGES = 4001
RUN_SECONDS = 1.5


def test_intended_offsets_follow_the_file_pace_and_never_go_back() -> None:
    stamps = np.array([1_000, 3_000, 2_000, 9_000], dtype=np.int64)
    assert intended_offsets_ns(stamps, 1.0).tolist() == [0, 2_000, 2_000, 8_000]
    assert intended_offsets_ns(stamps, 4.0).tolist() == [0, 500, 500, 2_000]
    assert speed_for_duration(stamps, 8e-6) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="positive"):
        intended_offsets_ns(stamps, 0.0)


def test_placement_parses_validates_and_labels() -> None:
    cpus = sorted(os.sched_getaffinity(0))
    placement = Placement.parse(f"exchange={cpus[0]},trading={cpus[-1]}")
    assert placement.label() == f"exchange={cpus[0]},trading={cpus[-1]}"
    assert Placement.parse("").label() == "exchange=*,trading=*"
    assert Placement.parse("none").label() == "exchange=*,trading=*"
    auto = Placement.parse("auto")
    if len(cpus) >= 2:
        assert auto.label() == f"exchange={cpus[0]},trading={cpus[-1]}"
    else:
        assert auto.label() == "exchange=*,trading=*"
    with pytest.raises(ValueError, match="COMPONENT"):
        Placement.parse("feed=0")
    with pytest.raises(ValueError, match="not available"):
        Placement.parse("exchange=4096")


@pytest.fixture(scope="module")
def day(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("replay") / "day.itch"
    write_day(path, seed=5, symbols=6, messages=MESSAGES)
    return path


@pytest.fixture(scope="module")
def ticks(day: Path) -> TickFile:
    return load_ticks(day)


@pytest.fixture(scope="module")
def topo(kernel_ready: None) -> Iterator[Topology]:
    # Not the "replay" tag: the in-process CLI test builds (and tears down) that topology.
    with topology(unique_topology("replay-test")) as up:
        yield up


@pytest.fixture(scope="module")
def system(topo: Topology, ticks: TickFile) -> Iterator[ReplaySystem]:
    with ReplaySystem(ticks, topo, ["afxdp", "udp"]) as replay:
        yield replay.start()


def _config(ticks: TickFile, **changes: object) -> ReplayConfig:
    speed = speed_for_duration(ticks.timestamps_ns, RUN_SECONDS)
    settings: dict[str, object] = {"speed": speed, "act_share": 0.25, **changes}
    return ReplayConfig(**settings)  # type: ignore[arg-type]


def _published_book(result: ReplayResult) -> Book:
    """The book of what the exchange says it published: our trading included."""
    book = Book()
    for raw in result.published:
        book.apply(itch.decode(raw))
    return book


def _pids(system: ReplaySystem) -> dict[str, int]:
    return {name: pid for name, (pid, _) in system._children.items()}


@pytest.mark.kernel
def test_replay_through_strategy_and_gateway_reconciles_with_the_exchange(
    system: ReplaySystem, ticks: TickFile
) -> None:
    pids_before = _pids(system)
    for path in ("afxdp", "udp"):
        result = system.run(_config(ticks, path=path))
        counters = result.counters
        assert result.complete, counters
        # Every order the strategy sent reached the exchange and was answered.
        assert counters["orders"] == counters["exchange_orders"] > 0
        assert counters["acks"] + counters["order_rejects"] == counters["orders"]
        # The exchange's account view (its matching engine's fills) and ours agree exactly.
        assert result.reconcile_problems == [] and counters["reconcile_differences"] == 0
        assert counters["fills"] == counters["exchange_fills"] > 0
        # The strategy's quotes traded and rested, so the stream is the file plus what they caused.
        assert counters["exchange_market_messages"] == MESSAGES
        assert counters["messages"] == counters["exchange_published_messages"] > MESSAGES
        assert book_state(result.book) == book_state(_published_book(result))
        assert counters["rx_unstamped"] == 0  # every frame carried its kernel receive stamp

        document = HistDocument.loads(result.document.dumps())
        by_stage = {s.labels["stage"]: s for s in document.series}
        assert set(by_stage) == set(SERIES)
        for series in document.series:
            assert series.labels["probe"] == "replay"
            assert series.labels["path"] == path
            assert series.labels["xdp_mode"] == ("copy/skb" if path == "afxdp" else "none")
            assert series.labels["placement"] == "exchange=*,trading=*"
        anomalies = {
            c.labels["stage"]: c.value for c in document.counters if c.name == "clock_anomalies"
        }
        # One in-system span per tick that led to an order (each tick's first order).
        ticks_with_orders = by_stage[IN_SYSTEM].hist.count + anomalies.get(IN_SYSTEM, 0)
        assert 0 < ticks_with_orders <= counters["orders"]
        # Every published message that came from the file was sent once, on its schedule; the
        # file's messages our trades consumed (a clamped or dropped execution) are not sent.
        published_lag = by_stage[PUBLISH_LAG].hist.count + anomalies.get(PUBLISH_LAG, 0)
        assert published_lag == counters["published_from_file"]
        assert 0.9 * MESSAGES < published_lag <= MESSAGES
        assert by_stage[WIRE].hist.count + anomalies.get(WIRE, 0) == counters["messages"]
        # Open loop starts before the frame arrived: never shorter than in-system in sum.
        assert by_stage[TICK_TO_TRADE].hist.sum_ns >= by_stage[IN_SYSTEM].hist.sum_ns * 0.5
    # Set up once: the same two processes served both runs.
    assert _pids(system) == pids_before


@pytest.mark.kernel
def test_share_of_book_updates_sets_the_order_count(system: ReplaySystem, ticks: TickFile) -> None:
    low = system.run(_config(ticks, path="udp", act_share=0.1))
    high = system.run(_config(ticks, path="udp", act_share=0.5))
    assert low.complete and high.complete
    updates = sum(
        1 for raw in ticks.messages if raw[:1] in (b"A", b"F", b"E", b"C", b"X", b"D", b"U")
    )
    # At least the acting share of the file's updates (minus risk rejects), plus quotes.
    for result, share in ((low, 0.1), (high, 0.5)):
        rejects = sum(v for k, v in result.counters.items() if k.startswith("risk_reject_"))
        # Not every update is acted on (pre-open, one-sided or crossed books): measured 0.90.
        assert result.counters["orders"] + rejects >= share * updates * 0.85
        assert result.counters["reconcile_differences"] == 0
    assert high.counters["orders"] > 2 * low.counters["orders"]
    assert high.counters["exchange_order_capacity_per_s"] > 0


@pytest.mark.kernel
def test_inject_delay_shows_up_in_the_decision_stage(system: ReplaySystem, ticks: TickFile) -> None:
    delayed = system.run(_config(ticks, path="udp", inject_delay_us=200))
    assert delayed.complete
    (decision,) = delayed.document.find(stage="decision")
    assert decision.hist.quantile(0.5) >= 200_000  # the busy-wait sits before every send
    assert delayed.counters["inject_delay_ns"] == 200_000


@pytest.mark.kernel
def test_a_run_whose_process_dies_fails_alone_and_the_next_runs_go_on(
    system: ReplaySystem, ticks: TickFile
) -> None:
    trading_pid = _pids(system)["trading"]

    def kill_soon() -> None:
        time.sleep(0.5)
        os.kill(trading_pid, signal.SIGKILL)

    killer = threading.Thread(target=kill_soon)
    killer.start()
    outcomes = list(iter_runs(system, 2, ["udp"], _config(ticks)))
    killer.join()
    (first_run, _, first), (second_run, _, second) = outcomes
    assert (first_run, second_run) == (0, 1)
    assert isinstance(first, ReplayRunError)
    assert isinstance(second, ReplayResult) and second.complete
    assert second.counters["reconcile_differences"] == 0
    assert _pids(system)["trading"] != trading_pid  # restarted for the next run


@pytest.mark.kernel
@pytest.mark.parametrize("path", ["udp", "afxdp"])
def test_lossy_replay_recovers_every_message(
    system: ReplaySystem, topo: Topology, ticks: TickFile, path: str
) -> None:
    inject_feed_loss(topo, 5)
    try:
        result = system.run(_config(ticks, path=path, max_payload=300))
        nft_dropped = feed_loss_dropped(topo)
    finally:
        remove_feed_loss(topo)
    counters = result.counters
    assert result.complete
    # Ground truth: the packets nftables dropped, which the publisher saw as EPERM.
    assert counters["exchange_dropped_packets"] == nft_dropped > 0
    assert counters["missing_detected"] == counters["recovered_messages"]
    assert counters["recovered_messages"] == counters["exchange_dropped_messages"]
    assert counters["messages"] == counters["exchange_published_messages"]
    assert book_state(result.book) == book_state(_published_book(result))
    assert counters["reconcile_differences"] == 0


def _cpu_hog() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


@pytest.mark.kernel
def test_replay_under_two_cpu_hogs_in_a_sibling_cgroup_completes(
    system: ReplaySystem, ticks: TickFile
) -> None:
    hogs_cgroup = system.cgroup_root / "hogs"
    hogs_cgroup.mkdir(exist_ok=True)
    hogs = [_cpu_hog() for _ in range(2)]
    try:
        for hog in hogs:
            (hogs_cgroup / "cgroup.procs").write_text(f"{hog.pid}\n")
        result = system.run(_config(ticks, path="afxdp"))
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert result.complete
    assert result.counters["reconcile_differences"] == 0
    # Whatever the hogs did to the clocks' users, every span is either in its histogram or
    # counted as an anomaly: none is lost, none raised.
    document = result.document
    anomalies = {
        c.labels["stage"]: c.value for c in document.counters if c.name == "clock_anomalies"
    }
    (publish_lag,) = document.find(stage=PUBLISH_LAG)
    assert (
        publish_lag.hist.count + anomalies.get(PUBLISH_LAG, 0)
        == result.counters["published_from_file"]
    )
    for stage, count in anomalies.items():
        (counter,) = [
            c
            for c in document.counters
            if c.name == "clock_anomalies" and c.labels["stage"] == stage
        ]
        assert count > 0 and counter.labels["example"].startswith("tick ")


@pytest.mark.kernel
def test_replay_command_writes_one_result_per_run(day: Path, tmp_path: Path) -> None:
    out = tmp_path / "runs"
    result = CliRunner().invoke(
        app,
        ["replay", str(day), "--duration", str(RUN_SECONDS), "--runs", "2", "--path", "udp",
         "--out", str(out), "--json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert summary["failed"] == 0
    assert [(r["path"], r["run"]) for r in summary["runs"]] == [("udp", 0), ("udp", 1)]
    files = sorted(out.iterdir())
    assert [f.name for f in files] == ["replay-udp-000.json", "replay-udp-001.json"]
    for file, run in zip(files, summary["runs"], strict=True):
        document = HistDocument.read(file)
        (in_system,) = document.find(stage=IN_SYSTEM, path="udp")
        assert in_system.hist.count == run[IN_SYSTEM]["count"] > 0
        assert run["counters"]["reconcile_differences"] == 0


@pytest.mark.kernel
def test_exchange_publishes_no_tick_before_the_schedule_replay_measures_from(
    topo: Topology,
) -> None:
    """The exchange's pacing from ``start_market(t0)`` against ``intended_offsets_ns``, with a
    timestamp that steps back (due with its predecessor) and a start that lies ahead."""
    base_ns = 10**9
    steps_ms = [0, 0, 0, 0, 0, 4, 2, 10, 10, 30]  # after the directory: adds, one stepping back
    messages = [itch.encode(m) for m in directory_messages(["PACE"], base_ns)]
    messages += [
        itch.encode(
            itch.AddOrder(1, 0, base_ns + ms * 1_000_000, 1 + i, "B", 100, "PACE", 10_000 + i)
        )
        for i, ms in enumerate(steps_ms)
    ]
    stamps = np.array([int.from_bytes(m[5:11], "big") for m in messages], dtype=np.int64)
    speed = 2.0
    sent: dict[int, int] = {}

    def on_sent(first: int, count: int, stamp_ns: int) -> None:
        sent.update(dict.fromkeys(range(first, first + count), stamp_ns))

    exchange = Exchange(topo, messages, speed=speed, autostart_market=False, on_sent=on_sent)
    with exchange:
        t0_ns = time.perf_counter_ns() + 20_000_000
        exchange.start_market(t0_ns)
        assert exchange.wait_market_done(5)
    intended = t0_ns + intended_offsets_ns(stamps, speed)
    assert sorted(sent) == list(range(1, len(messages) + 1))
    actual = np.array([sent[sequence] for sequence in sorted(sent)], dtype=np.int64)
    assert (actual >= intended).all(), (actual - intended).tolist()
    # Paced, not sent at once: the last tick is due 15 ms after t0 (30 ms of file time / 2).
    assert actual[-1] - t0_ns >= 15_000_000
    assert exchange.sources == list(range(len(messages)))  # no client: all from the file


def _replay_command(*args: str) -> subprocess.CompletedProcess[str]:
    """``tailsight replay`` in a child process: a hang fails the test instead of stalling it."""
    script = "from tailsight.cli.main import app; app()"
    return subprocess.run(
        [sys.executable, "-c", script, "replay", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "directory"])
def test_replay_of_a_file_that_is_not_regular_exits_2_at_once(tmp_path: Path, kind: str) -> None:
    """``replay`` on a FIFO, /dev/zero or a directory exits 2 at once instead of reading it."""
    if kind == "fifo":
        target = tmp_path / "feed.fifo"
        os.mkfifo(target)
    elif kind == "dev-zero":
        target = Path("/dev/zero")
    else:
        target = tmp_path
    out = tmp_path / "runs"
    result = _replay_command(str(target), "--out", str(out))
    assert result.returncode == 2, result.stderr
    assert "not a regular file" in result.stderr
    assert "Traceback" not in result.stderr
    assert not out.exists()  # nothing half-written


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--act-share", "1.5", "--act-share"),
        ("--inject-delay-us", "-1", "--inject-delay-us"),
        ("--placement", "feed=0", "COMPONENT"),
        ("--path", "tcp", "--path"),
        ("--duration", "0", "--duration"),
    ],
)
def test_replay_bad_options_exit_2_with_a_clear_message(
    day: Path, tmp_path: Path, option: str, value: str, message: str
) -> None:
    out = tmp_path / "runs"
    result = _replay_command(str(day), option, value, "--out", str(out))
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr
    assert not out.exists()
