"""Unconfirmed publishing through a cmq broker: is anything lost on the way?

Starts ``cmq broker`` on an ephemeral port, declares a direct exchange and
one queue long enough for everything (so the queue's own bound drops
nothing), attaches one consumer in this process, and runs ``--publishers``
processes that each publish ``--count`` messages without confirms, as fast
as ``publish`` returns, then wait for their endpoint to have everything
acknowledged. Prints what the consumer got (lost, duplicated), each
publisher's endpoint counters, and the broker's. Every endpoint uses
``--delivery``; run from the repository root::

    .venv/bin/python scripts/broker_unconfirmed.py                        # reliable, 4 x 50,000
    .venv/bin/python scripts/broker_unconfirmed.py --delivery best-effort
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import re
import subprocess
import sys
import time

import cmq
from cmq.routing import BrokerClient

IDLE = 5.0  # the consumer stops after this long without a delivery


def _endpoint(delivery: str) -> cmq.Queue:
    return cmq.Queue(port=0, host="127.0.0.1", codec="msgpack", delivery=delivery)


def _publisher(addr: tuple[str, int], index: int, count: int, delivery: str) -> None:
    endpoint = _endpoint(delivery)
    client = BrokerClient(addr, endpoint=endpoint)
    for k in range(count):
        client.publish("x", "k", [index, k])
    drained = endpoint.drain(60)
    st = endpoint.stats()
    print(
        f"publisher {index}: all acknowledged {drained}, in doubt {st.in_doubt}, "
        f"retransmits {st.retransmits}, probes {st.probes}",
        flush=True,
    )
    client.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--delivery", choices=("reliable", "unordered", "best-effort"), default="reliable")
    p.add_argument("--publishers", type=int, default=4)
    p.add_argument("--count", type=int, default=50_000, help="messages per publisher")
    args = p.parse_args()
    broker = subprocess.Popen(
        [sys.executable, "-m", "cmq", "broker", "--port", "0", "--in-memory"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert broker.stdout is not None
        line = broker.stdout.readline()
        found = re.search(r":(\d+)\s*$", line.strip())
        if found is None:
            print(f"broker did not start: {line!r}", file=sys.stderr)
            return 1
        addr = ("127.0.0.1", int(found.group(1)))
        total = args.publishers * args.count
        client = BrokerClient(addr, endpoint=_endpoint(args.delivery))
        client.declare_exchange("x", "direct")
        client.declare_queue("q", max_length=2 * total)
        client.bind("q", "x", "k")
        consumer = client.consume("q", prefetch=4096)
        procs = [
            mp.Process(target=_publisher, args=(addr, i, args.count, args.delivery))
            for i in range(args.publishers)
        ]
        for proc in procs:
            proc.start()
        seen: set[tuple[int, int]] = set()
        duplicates = 0
        last = time.monotonic()
        while len(seen) < total and time.monotonic() - last < IDLE:
            bodies = consumer.get_bodies_nowait()
            if not bodies:
                try:
                    bodies = consumer.get_bodies(timeout=0.5)
                except cmq.Timeout:
                    continue
            for body in bodies:
                key = (body[0], body[1])
                duplicates += key in seen
                seen.add(key)
            last = time.monotonic()
        for proc in procs:
            proc.join(60)
        stats = client.stats()
        print(
            f"{args.delivery}: published {total:,}, received {len(seen):,}, "
            f"lost {total - len(seen):,}, duplicates {duplicates}; broker: published "
            f"{stats['published']:,}, dropped or refused by its queue {stats['dropped_old'] + stats['rejected']:,}, "
            f"kernel drops at the broker {stats['endpoint']['kernel_drops']}"
        )
        client.close()
        return 0
    finally:
        broker.terminate()
        broker.wait(10)


if __name__ == "__main__":
    sys.exit(main())
