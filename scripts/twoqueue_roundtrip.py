"""Round trips of two cmq queues in one thread: the queue's own cost, without a process switch. A diagnostic, no verdict.

Two queues on loopback in the same thread, one message of ``--size`` bytes
each way per round trip (``push``, ``get_message``, ``push``, ``get``),
``spin=0``: each round trip is the two pushes, the two reads and their four
system calls, one after the other on one CPU, with no other process or
thread to wait for. Prints the mean round trip in microseconds and the
messages each queue received (every one must arrive). Run it from two
checkouts in turn (``PYTHONPATH=<checkout>/src``) to compare code:

    .venv/bin/python scripts/twoqueue_roundtrip.py [--count 30000] [--size 512] [--delivery reliable] [--time-status]

``--time-status`` also times each queue's STATUS steps (``take_status``,
``datagram_received``, which a STATUS reaches as the datagram that is not
a message, ``on_status``, ``_send_to``), each wrapped in a timer, and
prints their calls and mean time; the round trip then includes the
wrappers' own cost.

What it showed on 2026-11-28 (512 B, 30,000 round trips): reliable 19.0-19.2
us before the queue's, receiver's and batcher's hot fields were C members,
16.8-16.9 us after; best-effort 15.3-15.5 and 14.6-14.7 us, then 12.3-12.4
us once a best-effort datagram's read was compiled too. With
``--time-status``, 2026-11-28 23:55-00:28 UTC on a machine at half speed,
the control datagram's ``datagram_received`` / ``take_status`` /
``on_status``: 26.9-28.3 / 31.3-46.1 / 38.4-42.0 us on the code of
9d5fe88, 10.9-12.0 / 22.8-33.6 us once control records were read and
written in C, 31.0-31.1 us for ``on_status`` once a plain STATUS was
applied in C.
"""

from __future__ import annotations

import argparse
import collections
import sys
import time

from _timing import time_calls  # scripts/_timing.py: this script's folder is on sys.path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--count", type=int, default=30000, help="round trips (default %(default)s)")
    p.add_argument("--size", type=int, default=512, help="message bytes (default %(default)s)")
    p.add_argument("--delivery", choices=["reliable", "unordered", "best-effort"], default="reliable")
    p.add_argument("--time-status", action="store_true", help="also time each queue's STATUS steps")
    args = p.parse_args()
    if args.count < 1 or args.size < 0:
        p.error("--count must be at least 1 and --size at least 0")
    import cmq

    a = cmq.Queue(0, "127.0.0.1", spin=0, delivery=args.delivery)
    b = cmq.Queue(0, "127.0.0.1", spin=0, delivery=args.delivery)
    acc: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    if args.time_status:
        for q, tag in ((a, "a"), (b, "b")):
            for obj, name in ((q._receiver, "take_status"), (q._receiver, "datagram_received"),
                              (q._rel, "on_status"), (q, "_send_to")):  # fmt: skip
                time_calls(acc, f"{tag}.{name}", obj, name)
    try:
        to_b, to_a, body = b.address, a.address, b"x" * args.size
        t = time.perf_counter()
        for _ in range(args.count):
            a.push(to_b, body)
            b.get_message(timeout=5)
            b.push(to_a, body)
            a.get(timeout=5)
        dt = time.perf_counter() - t
        print(
            f"{args.delivery}, {args.size} B, {cmq.implementation()} core: {dt / args.count * 1e6:.1f} us a round trip "
            f"over {args.count:,} (received: {a.stats().messages_received:,} and {b.stats().messages_received:,})"
        )
        for tag, (calls, ns) in sorted(acc.items()):
            print(f"  {tag:22} {calls:6} calls, {ns / max(calls, 1) / 1000:7.1f} us each")
    finally:
        a.close()
        b.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
