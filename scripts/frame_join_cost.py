"""What joining a datagram from its messages costs, by how much of them is in flight: a diagnostic.

The compiled core's ``frame`` copies a batch's messages into one datagram
(a ``bytes`` object), which the reliable send buffer keeps until it is
acknowledged. This times ``frame`` on ``--per`` messages of ``--size``
bytes, keeping the last N datagrams alive as a send buffer would (N from
a few, whose memory stays in the CPU's caches, to ``--in-flight`` bytes'
worth), and prints the CPU time a message (thread time, best of
``--repeat``): the most a send that gathered the messages instead of
joining them could save.

    .venv/bin/python scripts/frame_join_cost.py [--size 16384] [--per 3]
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from collections.abc import Callable

from cmq._impl import speedups as _speedups  # None on the pure core

_HEAD = bytes(20)
_EXT = bytes(4)


def _cost(
    frame: Callable[..., bytes], payloads: list[bytes], keep: int, datagrams: int, repeat: int
) -> float:
    best = float("inf")
    for _ in range(repeat):
        kept: collections.deque[bytes] = collections.deque(maxlen=keep)
        t0 = time.thread_time_ns()
        for i in range(datagrams):
            kept.append(frame(payloads, _HEAD, i, _EXT))
        best = min(best, (time.thread_time_ns() - t0) / (datagrams * len(payloads)))
    return best


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=int, default=16384, help="message bytes (default %(default)s)")
    p.add_argument("--per", type=int, default=3, help="messages a datagram (default %(default)s)")
    p.add_argument(
        "--in-flight",
        type=int,
        default=16 << 20,
        help="the largest buffer kept, bytes (default 16 MiB)",
    )
    p.add_argument(
        "--datagrams", type=int, default=20_000, help="datagrams a run (default %(default)s)"
    )
    p.add_argument(
        "--repeat", type=int, default=5, help="runs, the best counts (default %(default)s)"
    )
    args = p.parse_args()
    if _speedups is None:
        p.error(
            "the compiled core is not in use here (./bootstrap.sh builds it; CMQ_PURE_PYTHON turns it off)"
        )
    if min(args.size, args.per, args.in_flight, args.datagrams, args.repeat) < 1:
        p.error("every number must be at least 1")
    payloads = [bytes(args.size)] * args.per
    size = args.size * args.per
    for keep in sorted({4, max(1, (1 << 20) // size), max(1, args.in_flight // size)}):
        ns = _cost(_speedups.frame, payloads, keep, args.datagrams, args.repeat)
        print(
            f"{keep:6,d} datagrams kept ({keep * size / 2**20:6.1f} MiB): {ns:8,.0f} ns a message",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
