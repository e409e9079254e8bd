"""What pushing to 100,000 destinations adds, step by step: a diagnostic, no verdict.

``cmq bench destinations`` times the batcher's whole push path with its
messages spread round-robin over D destinations. This takes that loop
apart: for D = 1 and D = ``--destinations`` it times (thread CPU time, best
of ``--repeat``, ``--messages`` messages of 4 B) the loop over the address
list alone, ``hash`` of the address, a plain ``dict.get`` of it in a dict
of D addresses, ``Batcher.stream`` (the stream lookup), and the whole path
as the bench runs it (``stream``, ``push``, ``arm`` on a new batch, ``filled``
and ``take`` on a full one; batches of ten messages). Prints each step's
cost a message at both counts and what the larger count adds:

    .venv/bin/python scripts/destinations_parts.py
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from collections.abc import Callable

from cmq._config import QueueConfig
from cmq.wire import batcher as _batcher
from cmq.wire.frames import frame_size

_PER_BATCH = 10
_STEPS = ("loop", "hash", "dict.get", "Batcher.stream", "whole push")


def _addresses(d: int) -> list[tuple[str, int]]:
    return [(f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}", 9000) for i in range(d)]


def _timed(run: Callable[[], None], messages: int) -> float:
    gc.collect()
    t0 = time.thread_time_ns()
    run()
    return (time.thread_time_ns() - t0) / messages


def _step(step: str, d: int, messages: int) -> float:
    addrs = _addresses(d)
    order = [addrs[i % d] for i in range(messages)]
    b = _batcher.Batcher(QueueConfig(qthresh=_PER_BATCH * frame_size(4)), sender=1)
    stream, push, arm, filled, take = b.stream, b.push, b.arm, b.filled, b.take
    table = dict.fromkeys(addrs, 1)
    for a in addrs:
        stream(a, 0)  # made before the timing: the lookup alone is timed
    payload = b"x" * 4

    def loop() -> None:
        for _ in order:
            pass

    def hashes() -> None:
        for a in order:
            hash(a)

    def gets() -> None:
        get = table.get
        for a in order:
            get(a)

    def streams() -> None:
        for a in order:
            stream(a, 0)

    def whole() -> None:
        now = 0.0
        for a in order:
            s = stream(a, 0)
            r = push(s, payload)
            if r == _batcher.OPENED:
                arm(s, now)
            elif r == _batcher.FULL:
                now += 1.0  # more than a timeout a batch: batches never grow (as the bench)
                filled(s, now)
                take(s, now)

    runs = dict(zip(_STEPS, (loop, hashes, gets, streams, whole), strict=True))
    return _timed(runs[step], messages)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--destinations", type=int, default=100_000, help="the larger count (default %(default)s)"
    )
    p.add_argument(
        "--messages", type=int, default=1_000_000, help="messages a run (default %(default)s)"
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="runs a step and count, the best counts (default %(default)s)",
    )
    args = p.parse_args()
    if args.destinations < 2 or args.messages < args.destinations or args.repeat < 1:
        p.error("--destinations must be at least 2, --messages at least that, --repeat at least 1")
    print(f"{'step':16s} {'1':>9s} {args.destinations:>9,d}   added (ns a message)")
    for step in _STEPS:
        one, many = (
            min(_step(step, d, args.messages) for _ in range(args.repeat))
            for d in (1, args.destinations)
        )
        print(f"{step:16s} {one:9.1f} {many:9.1f}   {many - one:+8.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
