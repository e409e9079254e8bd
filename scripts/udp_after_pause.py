"""How fast raw UDP's round trip comes back after both ends slept. A diagnostic, no verdict.

A ping-pong of 512-byte datagrams on loopback between two processes
(blocking reads, no polling), with the pinger pausing ``--pause`` seconds
every ``--every`` round trips (the echo, waiting, sleeps as long), as both
ends of a reliable cmq ping-pong do while a loss is repaired. Prints the
median round trip of the first after a pause, the 1st-3rd, 4th-10th and the
rest after it. ``--how`` says how the pinger pauses: ``sleep`` (one sleep),
``slices`` (sleeps of at most 150 µs), ``spin`` (a busy loop), or ``none``
(no pause: the baseline).

What it showed on 2026-11-28 (6 ms every 33 round trips; two runs a
mode, beside two idle-priority processes that slept 50 µs in a loop, one
on each CPU, left running by mistake; a first run without them, by the
same code, gave 170-209 µs for the first round trip after a pause and
45-52 µs for the next three): the first round trip after a pause 152-225 µs whatever the pinger
did while it paused (the echo had slept), the 1st-3rd after it 31-58 µs,
and from the 4th on the pace of the same mode's other round trips (21-51
µs; without pauses 32 and 45 µs): raw sockets come back within four round
trips, where cmq's reliable ping-pong took tens
(``scripts/lossy_pingpong.py``).

Run: python scripts/udp_after_pause.py [--how sleep] [--count 6000] [--every 33] [--pause 0.006]
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time

#: Groups of round trips after a pause: (last index in the group, label).
_GROUPS = ((0, "first after the pause"), (3, "1st-3rd"), (10, "4th-10th"), (None, "later"))


def _pause(how: str, seconds: float) -> None:
    if how == "sleep":
        time.sleep(seconds)
    elif how == "slices":
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            time.sleep(min(left, 150e-6))
    elif how == "spin":
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            pass


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--how",
        choices=["none", "sleep", "slices", "spin"],
        default="sleep",
        help="how the pinger pauses",
    )
    p.add_argument("--count", type=int, default=6000, help="round trips (default %(default)s)")
    p.add_argument(
        "--every", type=int, default=33, help="round trips between pauses (default %(default)s)"
    )
    p.add_argument(
        "--pause", type=float, default=0.006, help="seconds a pause lasts (default %(default)s)"
    )
    args = p.parse_args()
    if args.count < 200 or args.every < 12 or args.pause <= 0:
        p.error("--count must be at least 200, --every at least 12, --pause above 0")
    a = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    a.bind(("127.0.0.1", 0))
    b = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    b.bind(("127.0.0.1", 0))
    peer = b.getsockname()
    pid = os.fork()
    if pid == 0:  # the echo
        for _ in range(args.count):
            data, addr = b.recvfrom(2048)
            b.sendto(data, addr)
        os._exit(0)
    msg = b"x" * 512
    times: list[float] = []
    for i in range(args.count):
        if i and i % args.every == 0:
            _pause(args.how, args.pause)
        t = time.perf_counter()
        a.sendto(msg, peer)
        a.recvfrom(2048)
        times.append(time.perf_counter() - t)
    os.waitpid(pid, 0)
    groups: dict[str, list[float]] = {label: [] for _, label in _GROUPS}
    for i, t in enumerate(times[100:], 100):  # the first hundred warm up
        k = i % args.every
        label = next(lb for last, lb in _GROUPS if last is None or k <= last)
        groups[label].append(t)
    med = sorted(times[100:])[len(times[100:]) // 2]
    parts = [f"{label} {sorted(v)[len(v) // 2] * 1e6:.1f} µs" for label, v in groups.items() if v]
    print(f"{args.how}: median {med * 1e6:.1f} µs; " + ", ".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
