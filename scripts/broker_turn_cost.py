"""CPU of the broker core's part of one ping-pong hop, warm, without I/O.

One queue with one consumer (prefetch 256) on a direct exchange; each step
routes one unconfirmed publish to it and takes the delivery to send, either
as ``cmq broker``'s loop does it (``receive_at_once``, the latency path) or
through ``receive`` and ``messages_to_send`` (the usual path, which the
loop takes while messages are held back). The ack that frees the consumer's credit is
outside the timed part. Prints the median over ``--rounds`` of the mean ns a
step, for each path, in turn, so that a change to either can be judged in
the same run:

    .venv/bin/python scripts/broker_turn_cost.py [--count 100000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from cmq.routing._core import BrokerConfig, BrokerCore
from cmq.routing._protocol import Bind, Consume, DeclareExchange, DeclareQueue, encode

PUB = ("127.0.0.1", 1000)
CONSUMER = ("127.0.0.1", 2000)


def _core() -> BrokerCore:
    core = BrokerCore(BrokerConfig())
    for event in (
        DeclareExchange(rid=1, name="pp", type="direct"),
        DeclareQueue(rid=2, name="q", max_length=1000, overflow="drop-head"),
        Bind(rid=3, queue="q", exchange="pp", key="q"),
    ):
        core.receive(encode(event), PUB, 0.0)
    core.receive(encode(Consume(rid=9, tag="t", queue="q", prefetch=256, no_ack=False)), CONSUMER, 0.0)
    core.messages_to_send()
    return core


def _round(latency: bool, count: int) -> float:
    core = _core()
    payload = ["p", 0, "pp", "q", b"x" * 16]
    clock = time.perf_counter_ns
    spent = 0
    for _ in range(count):
        t = clock()
        if latency:
            o = core.receive_at_once(payload, PUB, 0.0)
            core.turn_memory()
        else:
            core.receive(payload, PUB, 0.0)
            core.turn_memory()
            o = core.messages_to_send()[0]
        spent += clock() - t
        if o is None:
            raise SystemExit("the latency path did not take the publish")
        core.receive(["a", "t", [o.payload[2][0][0]]], CONSUMER, 0.0)
        core.messages_to_send()
    return spent / count


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--count", type=int, default=100_000, help="steps a round (default %(default)s)")
    p.add_argument("--rounds", type=int, default=5, help="rounds of each path, in turn (default %(default)s)")
    args = p.parse_args()
    if args.count < 1 or args.rounds < 1:
        p.error("--count and --rounds must be at least 1")
    usual, latency = [], []
    for _ in range(args.rounds):
        usual.append(_round(False, args.count))
        latency.append(_round(True, args.count))
    u, f = statistics.median(usual), statistics.median(latency)
    print(f"receive + messages_to_send: {u:,.0f} ns a step; receive_at_once: {f:,.0f} ns ({f / u:.2f}x); "
          f"medians of {args.rounds} rounds of {args.count:,}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
