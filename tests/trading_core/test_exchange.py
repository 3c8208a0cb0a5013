"""Exchange simulator in network namespaces: the feed (complete, gaps recovered by re-request,
heartbeats, end of session, pacing) and how a replayed market and client orders combine."""

from __future__ import annotations

import queue
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from trading_netns import FeedListener, drop_every_nth, dropped_packets, topo_fixture  # noqa: F401

from tailsight.trading_core import itch, ouch
from tailsight.trading_core.book import Book
from tailsight.trading_core.exchange import CLIENT_REF_BASE, Exchange, directory_messages
from tailsight.trading_core.gateway import DAY, IOC, Gateway
from tailsight.trading_core.itch_file import iter_itch
from tailsight.trading_core.market import generate_day, write_day
from tailsight.trading_core.netns import Topology

ACCOUNTS = {"ALICE": "alicepw", "BOB": "bobpw"}


@pytest.mark.kernel
def test_generated_day_arrives_complete_and_in_order(topo: Topology) -> None:
    day = [itch.encode(m) for m in generate_day(11, 6, 30_000)]
    with FeedListener(topo) as feed, Exchange(topo, day) as exchange:
        assert feed.wait_complete(30)
    assert feed.messages == day  # byte for byte what the generator made, nothing more
    assert feed.receiver.end_sequence == len(day) + 1
    assert exchange.stats.published_messages == len(day)
    assert exchange.stats.packets < len(day) / 10  # messages are packed, not one per datagram


@pytest.mark.kernel
def test_gaps_from_real_packet_loss_are_recovered_by_rerequest(topo: Topology) -> None:
    drop_every_nth(topo.trading_ns, topo.feed_port, 7)
    day = [itch.encode(m) for m in generate_day(12, 4, 15_000)]
    with FeedListener(topo) as feed, Exchange(topo, day) as exchange:
        assert feed.wait_complete(30)
    lost = dropped_packets(topo.trading_ns)
    assert lost >= exchange.stats.packets // 7 - 1 > 10  # nftables' own count of what it dropped
    assert feed.requests > 0 and exchange.stats.retransmit_requests > 0
    assert exchange.stats.retransmitted_messages > 0
    assert feed.messages == day


@pytest.mark.kernel
def test_heartbeats_announce_the_next_sequence_then_end_of_session(topo: Topology) -> None:
    start = directory_messages(["AAPL", "MSFT"])
    exchange = Exchange(topo, start, heartbeat_interval_s=0.05, end_session_when_done=False)
    with FeedListener(topo) as feed:
        exchange.start()
        try:
            time.sleep(0.5)
        finally:
            exchange.stop()
        assert feed.wait_complete(5)
    assert len(feed.heartbeats) >= 4
    assert set(feed.heartbeats) == {len(start) + 1}
    assert [itch.decode(m) for m in feed.messages] == start


@pytest.mark.kernel
def test_replay_is_paced_by_file_timestamps(topo: Topology) -> None:
    base = directory_messages(["PACE"])
    ticks = [
        itch.AddOrder(1, 0, 10**9 + i * 20_000_000, 100 + i, "B", 100, "PACE", 1_000_000 - i)
        for i in range(11)
    ]  # 200 ms of file time
    arrivals: list[float] = []
    with FeedListener(topo, on_message=lambda m: arrivals.append(time.monotonic())) as feed:
        with Exchange(topo, base + ticks, speed=1.0):
            assert feed.wait_complete(10)
        paced = arrivals[-1] - arrivals[len(base)]
        assert 0.18 < paced < 1.0
    arrivals.clear()
    with FeedListener(topo, on_message=lambda m: arrivals.append(time.monotonic())) as feed:
        with Exchange(topo, base + ticks, speed=20.0):
            assert feed.wait_complete(10)
        assert arrivals[-1] - arrivals[len(base)] < paced / 2  # 10 ms of pacing, loaded CPUs


@pytest.mark.kernel
def test_replays_an_itch_file(topo: Topology, tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "day.itch.gz"
    write_day(path, seed=5, symbols=3, messages=5_000)
    with FeedListener(topo) as feed, Exchange(topo, path):
        assert feed.wait_complete(20)
    assert feed.messages == [raw for _, raw in iter_itch(path)]


@pytest.mark.kernel
def test_client_orders_trade_with_the_replayed_market(topo: Topology) -> None:
    """Hand-built scenario; expected ITCH and OUCH worked out by hand from the rules."""
    source: queue.Queue[itch.Message | bytes | None] = queue.Queue()
    for message in directory_messages(["ACME"]):
        source.put(message)
    ts = 10**9
    source.put(itch.AddOrder(1, 0, ts, 1, "S", 100, "ACME", 100_000))  # 100 @ 10.00
    source.put(itch.AddOrder(1, 0, ts, 2, "S", 100, "ACME", 100_100))  # 100 @ 10.01
    source.put(itch.AddOrder(1, 0, ts, 3, "B", 100, "ACME", 99_900))  # 100 @ 9.99
    book = Book()
    with (
        FeedListener(topo, on_message=lambda m: book.apply(itch.decode(m))) as feed,
        Exchange(topo, source) as exchange,
        Gateway(topo, "TS0001", "tailsight") as gateway,
    ):
        wait_for(lambda: len(feed.messages) == 8)
        # Take 150: all of ref 1 at 10.00, then 50 of ref 2 at 10.01.
        taker = gateway.enter_order("ACME", "B", 100_100, 150, IOC)
        # Rest a bid at 9.995, inside the market's 9.99 bid.
        maker = gateway.enter_order("ACME", "B", 99_950, 60)
        assert gateway.wait_for(lambda: len(gateway.messages) == 4)
        wait_for(lambda: len(feed.messages) == 11)
        # The replay then executes 80 of ref 2 (only 50 left: clamped), deletes ref 1 (gone:
        # dropped) and adds a sell at 9.995 that crosses our bid first (filled 60 passively).
        source.put(itch.OrderExecuted(1, 0, ts + 1, 2, 80, 900))
        source.put(itch.OrderDelete(1, 0, ts + 1, 1))
        source.put(itch.AddOrder(1, 0, ts + 2, 4, "S", 100, "ACME", 99_950))
        source.put(None)
        assert feed.wait_complete(10)
        assert gateway.wait_for(lambda: len(gateway.messages) == 5)
        published = [itch.decode(m) for m in feed.messages[8:]]
        ours = exchange.account_view("TS0001")
    client_ref = CLIENT_REF_BASE + 1  # the maker's exchange reference
    assert [type(m).__name__ for m in published] == [
        "OrderExecuted",
        "OrderExecuted",
        "AddOrder",  # taker fills, maker rests
        "OrderExecuted",  # clamped market execution of ref 2
        "OrderExecuted",
        "AddOrder",  # market sell fills our bid, the rest adds
    ]
    assert [(m.order_reference_number, m.executed_shares) for m in published[:2]] == [
        (1, 100),
        (2, 50),
    ]
    assert published[2].order_reference_number == client_ref and published[2].shares == 60
    assert published[3].executed_shares == 50
    assert (published[4].order_reference_number, published[4].executed_shares) == (client_ref, 60)
    assert (published[5].order_reference_number, published[5].shares) == (4, 40)
    fills = sorted((f.user_ref_num, f.price, f.shares, f.liquidity_flag) for f in ours.fills)
    assert fills == [
        (taker, 100_000, 100, "R"),
        (taker, 100_100, 50, "R"),
        (maker, 99_950, 60, "A"),
    ]
    assert ours.orders[taker].state == "done" and ours.orders[maker].state == "done"
    # A book built from the published feed by the independent L3 book agrees with the engine.
    bids, asks = exchange.engine.depth(1)
    assert [(lv.price, lv.shares, lv.orders) for lv in book.depth(1, 10).bids] == bids
    assert [(lv.price, lv.shares, lv.orders) for lv in book.depth(1, 10).asks] == asks
    assert (bids, asks) == ([(99_900, 100, 1)], [(99_950, 40, 1)])


def wait_for(predicate, timeout_s: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


_client_action = st.one_of(
    st.tuples(
        st.just("enter"),
        st.sampled_from(["ALICE", "BOB"]),
        st.integers(1, 2),  # stock locate
        st.sampled_from(["B", "S", "T"]),
        st.integers(-3, 3),  # ticks from the opposite touch (> 0 crosses)
        st.integers(1, 400),
        st.sampled_from([DAY, IOC]),
    ),
    st.tuples(
        st.just("cancel"),
        st.sampled_from(["ALICE", "BOB"]),
        st.integers(0, 50),
        st.integers(0, 300),
    ),
)


@settings(max_examples=30, deadline=None)
@given(
    st.integers(0, 10_000),
    st.lists(st.tuples(st.integers(0, 1_999), _client_action), max_size=60),
)
def test_published_stream_stays_consistent_with_client_orders(seed: int, actions) -> None:  # type: ignore[no-untyped-def]
    """Offline (no sockets): a generated day with client orders mixed in at random points.

    Ground truth is independent of the exchange: the L3 ``Book`` replaying what was published
    must see no faults and end equal to the engine, and every client fill must be printed on
    the feed as an execution with the same match number and shares."""
    day = list(generate_day(seed, 2, 2_000))
    exchange = Exchange(Topology(), [], accounts=ACCOUNTS)
    at: dict[int, list] = {}
    for position, action in actions:
        at.setdefault(position, []).append(action)
    refs = {"ALICE": 0, "BOB": 0}
    done = 0
    for position in sorted(at):
        exchange.step_market(day[done : position + 1])
        done = position + 1
        for action in at[position]:
            if action[0] == "enter":
                _, who, locate, side, ticks, quantity, tif = action
                bids, asks = exchange.engine.depth(locate)
                touch = (
                    (asks[0][0] if asks else 100_000)
                    if side == "B"
                    else (bids[0][0] if bids else 100_000)
                )
                price = max(100, touch + (ticks if side == "B" else -ticks) * 100)
                refs[who] += 1
                symbol = exchange.symbols.get(locate, "NOSUCH")
                exchange.handle(
                    who,
                    ouch.EnterOrder(
                        refs[who], side, quantity, symbol, price, tif, "Y", "P", "N", "N", ""
                    ),
                )
            else:
                _, who, which, quantity = action
                if refs[who]:
                    exchange.handle(who, ouch.CancelOrder(which % refs[who] + 1, quantity))
    exchange.step_market(day[done:])
    published = exchange.published()
    book = Book()
    executions: dict[int, int] = {}
    for raw in published:
        message = itch.decode(raw)
        book.apply(message)
        if isinstance(message, itch.OrderExecuted):
            executions[message.match_number] = message.executed_shares
    assert book.errors == {}
    for locate in (1, 2):
        depth = book.depth(locate, 10_000)
        bids, asks = exchange.engine.depth(locate)
        assert [(lv.price, lv.shares, lv.orders) for lv in depth.bids] == bids
        assert [(lv.price, lv.shares, lv.orders) for lv in depth.asks] == asks
    for who in ("ALICE", "BOB"):
        view = exchange.account_view(who)
        for fill in view.fills:
            assert executions[fill.match_number] == fill.shares
        for order in view.orders.values():
            if order.state == "rejected":
                continue
            live = exchange.engine.orders.get(order.order_reference_number)
            left = live.shares if live is not None else 0
            assert order.executed + order.canceled + left == order.quantity
            assert (order.state == "live") == (left > 0)
            assert sum(f.shares for f in view.fills if f.user_ref_num == order.user_ref_num) == (
                order.executed
            )
    if not actions:
        assert published == [itch.encode(m) for m in day]
