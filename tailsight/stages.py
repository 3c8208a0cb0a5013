"""Stage names of the trading pipeline's latency document (``probe="replay"``, one series per
``stage`` label): what ``trading_core/timing.py`` writes, the gate's default series and the
dashboards' queries read. ``trading_core/timing.py`` says what each one spans."""

from __future__ import annotations

from typing import Final

PROBE: Final = "replay"
"""The ``probe`` label of a run document."""
STAGES: Final = ("kernel_rx", "receive", "decode", "book", "decision", "send", "ack")
"""Stamp columns in pipeline order: kernel receive, user space starts on the message, ITCH
decoded, book applied, strategy (risk checks included) decided, just before the order's send(),
acked. The ``receive`` series runs from the tick's ready time (``StageTimer.ready_ns``)."""
WIRE: Final = "wire"
"""Exchange send() to the kernel receive stamp: the network path (veth, XDP or UDP stack)."""
QUEUE: Final = "queue"
IN_SYSTEM: Final = "in_system_tick_to_trade"
IN_SYSTEM_WITH_QUEUE: Final = "in_system_with_queue"
TICK_TO_TRADE: Final = "tick_to_trade"
PUBLISH_LAG: Final = "publish_lag"
SERIES: Final = (
    WIRE, QUEUE, *STAGES[1:], IN_SYSTEM, IN_SYSTEM_WITH_QUEUE, TICK_TO_TRADE, PUBLISH_LAG
)  # fmt: skip
"""Every series of a run document, as its ``stage`` label."""
