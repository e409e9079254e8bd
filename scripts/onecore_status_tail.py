"""Where a one-CPU ping-pong's slow round trips come from: the STATUS records. A diagnostic, no verdict.

Two processes pinned to CPU 0, each a ``cmq.Queue`` (``--delivery``,
default reliable), play ``--count`` round trips of ``--size`` bytes. The
pinger times each one and notes, for each, whether its queue sent a STATUS
(``Receiver.status_sent`` moved) or received one
(``ReliableSender.status_received`` moved) during it. It prints the median,
mean and tail, how the slow round trips (over ``--slow`` µs) split between
those with a STATUS and those without, how far the others were from the
last STATUS, and the mean time of the pinger's STATUS steps (each wrapped
in a timer: ``take_status``, the control datagram's ``datagram_received``,
``on_status``, ``_on_controls``, ``_send_to``), so that the part of the
mean above the median that STATUS handling makes can be told from the rest.

    .venv/bin/python scripts/onecore_status_tail.py [--count 20000] [--size 512] [--delivery reliable] [--spin 0.0001]

What it (in a first form, the same measurement) showed on 2026-11-28 at 23:45 UTC, on a machine at half its usual
speed (raw UDP 31-33 µs a round trip on one CPU): reliable, median 44-46
µs, mean 65-70 µs; 2,118 round trips of 20,000 over 100 µs, which made 436
of the 496 ms by which the round trips exceeded the median; every round
trip during which a STATUS went or came was among them, and a third of the
rest were the one or two right after one. The pinger's STATUS steps took
49 µs (``take_status``), 50 µs (``datagram_received`` of a control
datagram), 53 µs (``on_status``) and 128-160 µs (``_send_to``, which on
one CPU includes the peer's handling of what it sends). Best-effort, which
sends no STATUS: median 37-40 µs, mean 41-44 µs. ``--spin 0`` (no polling)
changed none of it. At 00:05, once control records were read and written in
C: the control datagram's ``datagram_received`` 16-19 µs, against 37-43 µs
for the code before in turn with it; the mean within its spread (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import subprocess
import sys
import time

from _timing import time_calls  # scripts/_timing.py: this script's folder is on sys.path


def _echo(args: argparse.Namespace) -> None:
    os.sched_setaffinity(0, {0})
    import cmq

    q = cmq.Queue(0, "127.0.0.1", delivery=args.delivery, spin=args.spin)
    print(q.address[1], flush=True)
    for _ in range(args.count + args.warmup):
        m = q.get_message(timeout=10)
        q.push(m.sender, m.payload)
    time.sleep(0.5)  # what it still owes (a STATUS) goes before it closes
    q.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--count", type=int, default=20_000, help="timed round trips (default %(default)s)")
    p.add_argument("--warmup", type=int, default=500, help="round trips before timing (default %(default)s)")
    p.add_argument("--size", type=int, default=512, help="message bytes (default %(default)s)")
    p.add_argument("--delivery", choices=["reliable", "unordered", "best-effort"], default="reliable")
    p.add_argument("--spin", type=float, default=0.0001, help="QueueConfig.spin of both (default %(default)s)")
    p.add_argument("--slow", type=float, default=100.0, help="a slow round trip, µs (default %(default)s)")
    p.add_argument("--role", choices=["echo"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.count < 100 or args.warmup < 0 or args.size < 1 or args.spin < 0 or args.slow <= 0:
        p.error("--count at least 100, --warmup and --spin at least 0, --size and --slow positive")
    if args.role == "echo":
        _echo(args)
        return 0
    echo = subprocess.Popen(
        [sys.executable, __file__, "--role", "echo", "--count", str(args.count), "--warmup", str(args.warmup),
         "--delivery", args.delivery, "--spin", str(args.spin)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert echo.stdout is not None
    dest = ("127.0.0.1", int(echo.stdout.readline()))
    os.sched_setaffinity(0, {0})
    import cmq

    q = cmq.Queue(0, "127.0.0.1", delivery=args.delivery, spin=args.spin)
    body = b"x" * args.size
    try:
        for _ in range(args.warmup):
            q.push(dest, body)
            q.get(timeout=10)
        rx, rel = q._receiver, q._rel
        acc: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
        for obj, name in ((rx, "take_status"), (rx, "datagram_received"), (rel, "on_status"),
                          (q, "_on_controls"), (q, "_send_to")):  # fmt: skip
            time_calls(acc, name, obj, name)
        rts: list[float] = []
        marks: list[tuple[bool, bool]] = []
        clock = time.perf_counter_ns
        for _ in range(args.count):
            sent, got = rx.status_sent, rel.status_received
            t0 = clock()
            q.push(dest, body)
            q.get(timeout=10)
            rts.append((clock() - t0) / 1000)
            marks.append((rx.status_sent != sent, rel.status_received != got))
        echo.wait(timeout=60)
    finally:
        q.close()
        if echo.poll() is None:
            echo.kill()
    n = len(rts)
    ordered = sorted(rts)
    p50 = ordered[n // 2]
    print(f"{args.delivery}, {args.size} B, {n} round trips on one CPU: p50 {p50:.1f} µs, mean {statistics.mean(rts):.1f}, "
          f"p90 {ordered[int(n * 0.9)]:.1f}, p99 {ordered[int(n * 0.99)]:.1f}, max {ordered[-1]:.0f}")  # fmt: skip
    slow = [i for i in range(n) if rts[i] > args.slow]
    over = sum(r - p50 for r in rts if r > p50)
    print(f"over {args.slow:g} µs: {len(slow)} round trips, {sum(rts[i] - p50 for i in slow) / 1000:.0f} of the "
          f"{over / 1000:.0f} ms above the median")  # fmt: skip
    kinds = collections.Counter(("slow" if rts[i] > args.slow else "not slow", marks[i]) for i in range(n))
    for (kind, (went, came)), k in sorted(kinds.items()):
        print(f"  {kind:8}  STATUS went {'yes' if went else 'no ':3}  came {'yes' if came else 'no ':3}  {k:6}")
    since: collections.Counter[int] = collections.Counter()
    last = -(10**9)
    for i in range(n):
        if marks[i][0] or marks[i][1]:
            last = i
        elif rts[i] > args.slow:
            since[min(i - last, 10)] += 1
    print("slow ones without a STATUS, by round trips since the last (10: ten or more):", dict(sorted(since.items())))
    for name, (calls, ns) in acc.items():
        if calls:
            print(f"  {name:18} {calls:6} calls, {ns / calls / 1000:7.1f} µs each")
    return 0


if __name__ == "__main__":
    sys.exit(main())
