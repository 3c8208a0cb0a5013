"""Tick replay end to end in namespaces: lossy feed on both receive paths must end in the file's
book, with every dropped message (the kernel's nftables verdicts) detected and recovered; the
project's ``Exchange`` publishes on the schedule the trading side measures from."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from feed_helpers import book_state, reference_book
from typer.testing import CliRunner

from tailsight.histfile import HistDocument
from tailsight.trading_core import itch
from tailsight.trading_core.book import Book
from tailsight.trading_core.exchange import Exchange, directory_messages
from tailsight.trading_core.market import write_day
from tailsight.trading_core.netns import Topology, topology, unique_topology
from tailsight.trading_core.replay import (
    ReplayConfig,
    feed_loss_dropped,
    inject_feed_loss,
    intended_offsets_ns,
    load_ticks,
    remove_feed_loss,
    replay_once,
    speed_for_duration,
)
from tailsight.trading_core.timing import PUBLISH_LAG, STAGES, TICK_TO_TRADE, WIRE

MESSAGES = 2003
RUN_SECONDS = 1.5


def test_intended_offsets_follow_the_file_pace_and_never_go_back() -> None:
    stamps = np.array([1_000, 3_000, 2_000, 9_000], dtype=np.int64)
    assert intended_offsets_ns(stamps, 1.0).tolist() == [0, 2_000, 2_000, 8_000]
    assert intended_offsets_ns(stamps, 4.0).tolist() == [0, 500, 500, 2_000]
    assert speed_for_duration(stamps, 8e-6) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="positive"):
        intended_offsets_ns(stamps, 0.0)


@pytest.fixture(scope="module")
def day(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("replay") / "day.itch"
    write_day(path, seed=5, symbols=6, messages=MESSAGES)
    return path


@pytest.fixture(scope="module")
def reference(day: Path) -> Book:
    return reference_book(day)


@pytest.fixture(scope="module")
def topo(kernel_ready: None) -> Iterator[Topology]:
    # Not the "replay" tag: the in-process CLI test builds (and tears down) that topology.
    with topology(unique_topology("replay-test")) as up:
        yield up


@pytest.mark.kernel
@pytest.mark.parametrize("path", ["udp", "afxdp"])
def test_lossy_replay_recovers_every_message_and_rebuilds_the_book(
    topo: Topology, day: Path, reference: Book, path: str
) -> None:
    ticks = load_ticks(day)
    speed = speed_for_duration(ticks.timestamps_ns, RUN_SECONDS)
    inject_feed_loss(topo, 5)
    try:
        result = replay_once(ticks, topo, ReplayConfig(path=path, speed=speed, max_payload=300))
        nft_dropped = feed_loss_dropped(topo)
    finally:
        remove_feed_loss(topo)
    counters = result.counters
    assert result.complete
    assert counters["messages"] == MESSAGES
    # Ground truth: the packets nftables dropped, which the publisher saw as EPERM.
    assert counters["exchange_dropped_packets"] == nft_dropped > 0
    dropped_messages = counters["exchange_dropped_messages"]
    assert counters["missing_detected"] == counters["recovered_messages"] == dropped_messages
    assert 0 < counters["gaps_detected"] <= nft_dropped
    assert book_state(result.book) == book_state(reference)
    assert counters["orders"] == counters["acks"] == counters["exchange_orders"] > 0
    # Our IOC orders never traded nor rested: the exchange published the file and nothing else.
    assert counters["exchange_published_messages"] == counters["exchange_market_messages"]
    assert counters["exchange_published_messages"] == MESSAGES
    assert counters["exchange_fills"] == counters["order_rejects"] == 0

    document = HistDocument.loads(result.document.dumps())
    by_stage = {s.labels["stage"]: s for s in document.series}
    assert set(by_stage) == {*STAGES, TICK_TO_TRADE, PUBLISH_LAG, WIRE}
    for series in document.series:
        assert series.labels["probe"] == "replay"
        assert series.labels["path"] == path
        assert series.labels["xdp_mode"] == ("copy/skb" if path == "afxdp" else "none")
    assert by_stage["receive"].hist.count == MESSAGES
    # Every tick was sent once by the publisher (dropped or not): receive = publish lag + wire.
    assert by_stage[PUBLISH_LAG].hist.count == by_stage[WIRE].hist.count == MESSAGES
    receive_sum = by_stage["receive"].hist.sum_ns
    assert by_stage[PUBLISH_LAG].hist.sum_ns + by_stage[WIRE].hist.sum_ns == receive_sum
    assert by_stage[TICK_TO_TRADE].hist.count == counters["orders"]
    assert by_stage["ack"].hist.count == counters["acks"]
    # Tick-to-trade spans receive..send, so it cannot be below their sum for the same ticks.
    assert by_stage[TICK_TO_TRADE].hist.sum_ns >= by_stage["send"].hist.sum_ns


@pytest.mark.kernel
def test_replay_command_writes_one_result_per_run(day: Path, tmp_path: Path) -> None:
    from tailsight.cli.main import app

    out = tmp_path / "runs"
    result = CliRunner().invoke(
        app,
        [
            "replay",
            str(day),
            "--duration",
            str(RUN_SECONDS),
            "--runs",
            "2",
            "--path",
            "udp",
            "--out",
            str(out),
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert [(r["path"], r["run"]) for r in summary["runs"]] == [("udp", 0), ("udp", 1)]
    files = sorted(out.iterdir())
    assert [f.name for f in files] == ["replay-udp-000.json", "replay-udp-001.json"]
    for file, run in zip(files, summary["runs"], strict=True):
        document = HistDocument.read(file)
        (t2t,) = document.find(stage=TICK_TO_TRADE, path="udp")
        assert t2t.hist.count == run["tick_to_trade"]["count"] == run["counters"]["orders"]
        assert run["counters"]["messages"] == MESSAGES


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
