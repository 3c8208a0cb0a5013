"""Codec throughput, each next to its same-run baseline: vectorized ITCH framing vs the scalar
loop, batch decode vs per-message decode, file reading, OUCH / SoupBinTCP / MoldUDP64.

Usage: bench_codecs.py [--quick] [--messages N] [--seed X]
  --quick: 100k messages (CI, a few seconds); default: 2M messages.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from tailsight.trading_core import itch, ouch
from tailsight.trading_core import soupbintcp as soup
from tailsight.trading_core.itch_batch import decode_batch, frame_starts, frame_starts_scalar
from tailsight.trading_core.itch_file import iter_itch, iter_itch_chunks, write_itch
from tailsight.trading_core.moldudp64 import MoldReceiver, pack_messages


def best_of(repeats: int, fn: Callable[[], object]) -> float:
    """Fastest of ``repeats`` runs in seconds (the least disturbed on a shared machine)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def order_flow(count: int, seed: int) -> list[itch.Message]:
    """A message mix like a real day's: mostly adds, deletes, executions, cancels, replaces."""
    rng = random.Random(seed)
    out: list[itch.Message] = []
    for i in range(count):
        ts = 34_200_000_000_000 + i * 1_000
        kind = rng.random()
        ref = rng.randrange(1, 10**9)
        if kind < 0.42:
            side = rng.choice("BS")
            out.append(itch.AddOrder(1, 0, ts, ref, side, 100, "AAPL", 1_500_000))
        elif kind < 0.80:
            out.append(itch.OrderDelete(1, 0, ts, ref))
        elif kind < 0.88:
            out.append(itch.OrderExecuted(1, 0, ts, ref, 100, i))
        elif kind < 0.93:
            out.append(itch.OrderCancel(1, 0, ts, ref, 50))
        elif kind < 0.98:
            out.append(itch.OrderReplace(1, 0, ts, ref, ref + 1, 100, 1_500_100))
        else:
            out.append(itch.AddOrderMPID(1, 0, ts, ref, "S", 100, "AAPL", 1_500_100, "GSCO"))
    return out


def line(name: str, seconds: float, units: float, unit: str, baseline: float | None) -> None:
    rate = units / seconds
    versus = f"  {baseline / seconds:6.1f}x baseline" if baseline else ""
    print(f"  {name:<46} {rate / 1e6:7.2f} M{unit}/s{versus}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--messages", type=int, default=None)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    count = args.messages or (100_000 if args.quick else 2_000_000)
    repeats = 2 if args.quick else 3

    records = order_flow(count, args.seed)
    wires = [itch.encode(r) for r in records]
    framed = b"".join(len(w).to_bytes(2, "big") + w for w in wires)
    megabytes = len(framed) / 1e6
    print(f"ITCH 5.0: {count} messages, {megabytes:.1f} MB framed")

    scalar_framing = best_of(repeats, lambda: frame_starts_scalar(framed))
    line("framing, scalar loop (baseline)", scalar_framing, count, "msg", None)
    vector_framing = best_of(repeats, lambda: frame_starts(framed))
    line("framing, vectorized", vector_framing, count, "msg", scalar_framing)
    assert frame_starts(framed)[1] == len(framed)

    offsets = frame_starts(framed)[0] + 2
    decode = itch.decode
    per_message = best_of(repeats, lambda: [decode(framed, o) for o in offsets.tolist()])
    line("decode, per message (baseline)", per_message, count, "msg", None)
    batch = best_of(repeats, lambda: decode_batch(framed))
    line("decode, batch (framing included)", batch, count, "msg", per_message)
    encode = itch.encode
    line("encode, per message", best_of(repeats, lambda: [encode(r) for r in records]), count,
         "msg", None)  # fmt: skip

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "day.itch"
        write_itch(path, wires)
        iterate = best_of(repeats, lambda: sum(1 for _ in iter_itch(path)))
        line("file framing, iter_itch (baseline)", iterate, count, "msg", None)
        chunks = best_of(repeats, lambda: sum(1 for _ in iter_itch_chunks(path)))
        line("file framing, iter_itch_chunks", chunks, count, "msg", iterate)
        scalar = best_of(repeats, lambda: [decode(m) for _, m in iter_itch(path)])
        line("file decode, iter_itch + decode (baseline)", scalar, count, "msg", None)
        both = best_of(repeats, lambda: [decode_batch(c) for c in iter_itch_chunks(path)])
        line("file decode, iter_itch_chunks + decode_batch", both, count, "msg", scalar)

    small = max(count // 10, 1000)
    orders = [
        ouch.EnterOrder(i, "B", 100, "AAPL", 1_500_000, "0", "Y", "A", "N", "N", f"C{i}",
                        (ouch.TagValue(ouch.OptionTag.FIRM, "GSCO"),))
        for i in range(small)
    ]  # fmt: skip
    print(f"OUCH 5.0 / SoupBinTCP 4.1 / MoldUDP64: {small} messages")
    ouch_wires = [ouch.encode(o) for o in orders]
    line("OUCH encode Enter Order + appendage", best_of(repeats, lambda: [ouch.encode(o) for o in
         orders]), small, "msg", None)  # fmt: skip
    line("OUCH decode Enter Order + appendage", best_of(repeats, lambda: [ouch.decode_inbound(w)
         for w in ouch_wires]), small, "msg", None)  # fmt: skip
    stream = b"".join(soup.encode(soup.UnsequencedData(w)) for w in ouch_wires)
    pieces = [stream[i : i + 1460] for i in range(0, len(stream), 1460)]  # TCP-segment sized

    def reassemble() -> int:
        framer = soup.SoupFramer()
        return sum(len(framer.feed(p)) for p in pieces)

    assert reassemble() == small
    line("SoupFramer, 1460-byte reads", best_of(repeats, reassemble), small, "packet", None)
    packets = pack_messages("SESSION001", 1, wires[:small])

    def receive() -> int:
        receiver = MoldReceiver()
        return sum(len(receiver.on_packet(p).messages) for p in packets)

    assert receive() == small
    line("MoldReceiver, in order", best_of(repeats, receive), small, "msg", None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
