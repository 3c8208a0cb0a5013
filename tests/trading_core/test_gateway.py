"""OUCH over SoupBinTCP between the gateway (trading namespace) and the exchange: login,
heartbeats both ways, heartbeat timeout, sequence numbers, reconnect replay, order responses."""

from __future__ import annotations

import socket
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from trading_netns import topo_fixture  # noqa: F401

from tailsight.trading_core import ouch
from tailsight.trading_core import soupbintcp as soup
from tailsight.trading_core.exchange import (
    REJECT_INVALID_QUANTITY,
    REJECT_UNKNOWN_SYMBOL,
    REJECT_USER_REF_NUM,
    Exchange,
    directory_messages,
)
from tailsight.trading_core.gateway import IOC, Gateway, LoginRejectedError
from tailsight.trading_core.netns import Topology, in_netns
from tailsight.trading_core.reconcile import diff

pytestmark = pytest.mark.kernel

ACCOUNTS = {"ALICE": "alicepw", "BOB": "bobpw"}


def exchange(topo: Topology, **options: float) -> Exchange:
    return Exchange(
        topo,
        directory_messages(["ACME", "WIDG"]),
        accounts=ACCOUNTS,
        end_session_when_done=False,
        **options,
    )  # type: ignore[arg-type]


def test_login_rejected_not_authorized_and_session_unavailable(topo: Topology) -> None:
    with exchange(topo) as ex:
        with pytest.raises(LoginRejectedError) as bad_password:
            Gateway(topo, "ALICE", "wrong").connect()
        assert bad_password.value.reason_code == "A"
        with pytest.raises(LoginRejectedError) as unknown_user:
            Gateway(topo, "MALLET", "alicepw").connect()
        assert unknown_user.value.reason_code == "A"
        with pytest.raises(LoginRejectedError) as wrong_session:
            Gateway(topo, "ALICE", "alicepw", session="OTHERSESS").connect()
        assert wrong_session.value.reason_code == "S"
        with Gateway(topo, "ALICE", "alicepw") as first:
            assert first.session == ex.session
            with pytest.raises(LoginRejectedError) as twice:
                Gateway(topo, "ALICE", "alicepw").connect()  # one session per account at a time
            assert twice.value.reason_code == "S"
        assert ex.stats.login_rejects == 4 and ex.stats.logins == 1


def test_heartbeats_flow_both_ways(topo: Topology) -> None:
    with exchange(topo, heartbeat_interval_s=0.05, heartbeat_timeout_s=1.0) as ex:
        gateway = Gateway(
            topo, "ALICE", "alicepw", heartbeat_interval_s=0.05, heartbeat_timeout_s=1
        )
        with gateway:
            time.sleep(0.6)
            assert gateway.connected  # nobody timed out although no application data flowed
        assert gateway.heartbeats_received >= 5 and gateway.heartbeats_sent >= 5
        assert ex.stats.heartbeat_timeouts == 0


def test_server_drops_a_silent_client_after_the_heartbeat_timeout(topo: Topology) -> None:
    with exchange(topo, heartbeat_interval_s=0.05, heartbeat_timeout_s=0.3) as ex:
        gateway = Gateway(topo, "ALICE", "alicepw", send_heartbeats=False)
        gateway.connect()
        started = time.monotonic()
        assert gateway.wait_for(lambda: gateway.disconnect_reason is not None, 3)
        assert 0.25 < time.monotonic() - started < 2
        assert gateway.disconnect_reason == "closed by peer"
        assert ex.stats.heartbeat_timeouts == 1
        gateway.close()


def test_client_detects_a_silent_server(topo: Topology) -> None:
    # A bare listener that accepts the login and then says nothing, ever.
    with in_netns(topo.exchange_ns):
        server = socket.socket()
    server.bind((topo.exchange_ip, topo.order_port))
    server.listen(1)
    gateway = Gateway(topo, "ALICE", "alicepw", heartbeat_timeout_s=0.3)
    try:

        def accept() -> None:
            conn, _ = server.accept()
            conn.recv(1024)
            conn.sendall(soup.encode(soup.LoginAccepted("SILENT", 1)))
            time.sleep(0.8)
            conn.close()

        thread = threading.Thread(target=accept)
        thread.start()
        gateway.connect()
        assert gateway.wait_for(lambda: gateway.disconnect_reason is not None, 2)
        assert gateway.disconnect_reason == "heartbeat timeout"
        gateway.close()
        thread.join()
    finally:
        server.close()


def test_responses_are_sequenced_accepted_executed_canceled_rejected(topo: Topology) -> None:
    with (
        exchange(topo) as ex,
        Gateway(topo, "ALICE", "alicepw") as alice,
        Gateway(topo, "BOB", "bobpw") as bob,
    ):
        resting = alice.enter_order("ACME", "S", 100_000, 300)
        alice.cancel(resting, 200)  # reduce to 200
        assert alice.wait_for(lambda: len(alice.messages) == 2)
        bob.enter_order("ACME", "B", 100_500, 50, IOC)  # takes 50 at 10.00, rests nothing
        bob.enter_order("ACME", "B", 100_000, 0)  # rejected: quantity
        bob.enter_order("NOPE", "B", 100_000, 10)  # rejected: symbol
        bob.enter_order("ACME", "B", 100_000, 10, user_ref_num=1)  # rejected: UserRefNum
        assert bob.wait_for(lambda: len(bob.messages) == 5)
        alice.cancel(resting)  # cancel the remaining 150
        alice.cancel(resting)  # nothing left: Cancel Reject
        assert alice.wait_for(lambda: len(alice.messages) == 5)
        bob_view, alice_view = bob.snapshot(), alice.snapshot()
    kinds = [type(m).__name__ for m in alice.messages]
    assert kinds == [
        "OrderAccepted",
        "OrderCanceled",
        "OrderExecuted",
        "OrderCanceled",
        "CancelReject",
    ]
    accepted, reduced, executed, canceled = alice.messages[:4]
    assert isinstance(accepted, ouch.OrderAccepted) and accepted.order_state == "L"
    assert isinstance(reduced, ouch.OrderCanceled) and (reduced.quantity, reduced.reason) == (
        100,
        "U",
    )
    assert isinstance(executed, ouch.OrderExecuted)
    assert (executed.quantity, executed.price, executed.liquidity_flag) == (50, 100_000, "A")
    assert isinstance(canceled, ouch.OrderCanceled) and canceled.quantity == 150
    kinds = [type(m).__name__ for m in bob.messages]
    assert kinds == [
        "OrderAccepted",
        "OrderExecuted",
        "OrderRejected",
        "OrderRejected",
        "OrderRejected",
    ]
    reasons = [m.reason for m in bob.messages[2:] if isinstance(m, ouch.OrderRejected)]
    assert reasons == [REJECT_INVALID_QUANTITY, REJECT_UNKNOWN_SYMBOL, REJECT_USER_REF_NUM]
    taker = bob.messages[1]
    assert isinstance(taker, ouch.OrderExecuted) and taker.liquidity_flag == "R"
    assert taker.match_number == executed.match_number
    # Sequence numbers: each account's stream is 1..n and the gateway consumed all of it.
    assert alice.next_sequence == 6 and bob.next_sequence == 6
    assert [ouch.encode(m) for m in alice.messages] == ex.sequenced_messages("ALICE")
    assert diff(alice_view, ex.account_view("ALICE")) == []
    assert diff(bob_view, ex.account_view("BOB")) == []


def test_reconnect_with_requested_sequence_replays_missed_messages(topo: Topology) -> None:
    with exchange(topo) as ex:
        alice = Gateway(topo, "ALICE", "alicepw")
        assert alice.connect() == 1
        ref = alice.enter_order("WIDG", "B", 50_000, 100)
        assert alice.wait_for(lambda: len(alice.messages) == 1)
        alice.close()  # a crash: no logout
        with Gateway(topo, "BOB", "bobpw") as bob:
            bob.enter_order("WIDG", "S", 50_000, 40)  # fills alice while she is away
            bob.enter_order("WIDG", "S", 50_000, 60)
            assert bob.wait_for(lambda: len(bob.messages) == 4)
        assert len(ex.sequenced_messages("ALICE")) == 3
        # Log in again asking for sequence 2: exactly the two missed executions come back.
        assert alice.next_sequence == 2
        assert alice.connect() == 2
        assert alice.wait_for(lambda: len(alice.messages) == 3)
        assert [m.quantity for m in alice.messages[1:] if isinstance(m, ouch.OrderExecuted)] == [
            40,
            60,
        ]
        assert alice.snapshot().orders[ref].state == "done"
        # Asking for sequence 1 from a fresh client replays the whole stream.
        alice.logout()
        fresh = Gateway(topo, "ALICE", "alicepw")
        assert fresh.connect(requested_sequence=1) == 1
        assert fresh.wait_for(lambda: len(fresh.messages) == 3)
        assert [ouch.encode(m) for m in fresh.messages] == ex.sequenced_messages("ALICE")
        fresh.logout()
        # Sequence 0 means "only new messages".
        latest = Gateway(topo, "ALICE", "alicepw")
        assert latest.connect(requested_sequence=0) == 4
        latest.logout()
        assert diff(alice.snapshot(), ex.account_view("ALICE")) == []


def test_logout_and_end_of_session(topo: Topology) -> None:
    ex = exchange(topo)
    ex.start()
    gateway = Gateway(topo, "ALICE", "alicepw")
    gateway.connect()
    gateway.logout()
    assert gateway.disconnect_reason == "logout"
    assert gateway.connect() == 1  # the session is free again after a logout
    ex.stop()
    assert gateway.wait_for(lambda: gateway.disconnect_reason is not None, 3)
    assert gateway.disconnect_reason == "end of session"
    gateway.close()


@pytest.mark.parametrize("reader_thread", [True, False])
def test_logout_returns_once_the_exchange_ended_the_session(
    topo: Topology, reader_thread: bool
) -> None:
    """The exchange is kept from ending the session for a while (its lock held): logout waits
    for it, so a login right after is never refused as a session still in use."""
    ex = exchange(topo)
    ex.start()
    try:
        gateway = Gateway(topo, "ALICE", "alicepw", reader_thread=reader_thread)
        gateway.connect()
        account = ex._accounts["ALICE"]
        held = threading.Event()

        def hold_the_exchange() -> None:
            with ex._lock:
                held.set()
                time.sleep(0.3)

        holder = threading.Thread(target=hold_the_exchange)
        holder.start()
        held.wait()
        gateway.logout()
        assert account.connection is None  # ended before logout returned
        assert gateway.disconnect_reason == "logout"
        holder.join()
        assert gateway.connect() == 1
        gateway.logout()
    finally:
        ex.stop()


_ALPHA = st.sampled_from("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 ")


@settings(max_examples=200, deadline=None)
@given(
    ref=st.integers(0, 2**32 - 1),
    side=st.sampled_from("BST"),
    quantity=st.integers(0, 2**32 - 1),
    symbol=st.text(_ALPHA, max_size=8),
    price=st.integers(0, 2**64 - 1),
    tif=st.sampled_from("03"),
    cl_ord_id=st.text(_ALPHA, max_size=14),
)
def test_fast_enter_order_encoding_is_the_generic_encoding(
    ref: int, side: str, quantity: int, symbol: str, price: int, tif: str, cl_ord_id: str
) -> None:
    """The order path's packer against the codec every other message uses."""
    fields = (ref, side, quantity, symbol, price, tif, "Y", "P", "N", "N", cl_ord_id)
    fast = soup.encode_unsequenced(ouch.encode_enter_order(*fields))
    generic = soup.encode(soup.UnsequencedData(ouch.encode(ouch.EnterOrder(*fields))))
    assert fast == generic


def test_fast_enter_order_encoding_refuses_what_does_not_fit() -> None:
    with pytest.raises(ValueError):
        ouch.encode_enter_order(1, "B", 100, "TOOLONGSYM", 1, "0", "Y", "P", "N", "N", "X")
    with pytest.raises(ValueError):
        ouch.encode_enter_order(1, "BS", 100, "AAPL", 1, "0", "Y", "P", "N", "N", "X")
    with pytest.raises(ValueError):
        ouch.encode_enter_order(2**32, "B", 100, "AAPL", 1, "0", "Y", "P", "N", "N", "X")


def test_a_response_budget_applies_a_slice_and_keeps_the_rest_in_order(topo: Topology) -> None:
    """``on_readable(budget)`` (the replay loop's, so a tick never waits behind a burst of
    responses) applies that many and keeps the rest, in sequence, for ``apply_pending``."""
    with exchange(topo) as ex:
        gateway = Gateway(topo, "ALICE", "alicepw", reader_thread=False)
        gateway.connect()
        try:
            for _ in range(5):
                gateway.enter_order("NOPE", "B", 100_000, 10)  # rejected: unknown symbol
            deadline = time.monotonic() + 5
            while len(ex.sequenced_messages("ALICE")) < 5 and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.05)  # the last one on its way through the veth
            gateway.on_readable(budget=2)
            assert (len(gateway.messages), gateway.pending) == (2, 3)
            gateway.apply_pending(2)
            assert (len(gateway.messages), gateway.pending) == (4, 1)
            gateway.apply_pending()
            assert gateway.pending == 0
            assert [ouch.encode(m) for m in gateway.messages] == ex.sequenced_messages("ALICE")
            assert gateway.next_sequence == 6
        finally:
            gateway.close()
