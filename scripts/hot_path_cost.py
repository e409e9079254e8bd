"""CPU per message of cmq's send and receive paths, in one thread, without scheduling.

``cmq bench throughput`` measures two processes that wake each other: its
CPU per message moves by a third from run to run on a shared machine, as
the processes' wake-ups, sleeps and batch sizes change with the load, which
hides a change of a tenth in the paths themselves. Here one thread does
both ends' work in turn over loopback: a sender queue pushes ``--burst``
messages of ``--size`` bytes (reliable, through ``Queue.sender``) and
flushes; a receiver queue takes them with ``pop_many`` (which reads the
socket, splits the datagrams and answers the STATUS); the sender's next
pushes read the acknowledgements. Only this thread runs meanwhile (both
queues' I/O threads stay off the sockets while the application reads
them), so the thread's CPU time per message is the paths' cost, both ends
and the kernel's part, to within a few per cent run to run. Prints the
median over ``--rounds`` of the CPU ns per message, and each side's part:

    .venv/bin/python scripts/hot_path_cost.py --size 16384
    CMQ_PURE_PYTHON=1 .venv/bin/python scripts/hot_path_cost.py --size 16384
    .venv/bin/python scripts/hot_path_cost.py --size 16384 --floor
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import time

import cmq
from cmq import _impl


def _round(size: int, burst: int, count: int) -> tuple[float, float]:
    """One round of ``count`` messages: (send ns, receive ns) per message, thread CPU."""
    payload = b"x" * size
    clock = time.thread_time_ns
    send_ns = recv_ns = 0
    with cmq.Queue(0, "127.0.0.1") as rx, cmq.Queue(0, "127.0.0.1") as tx:
        push = tx.sender(rx.address)
        pop_many = rx.pop_many
        got = 0
        warm = burst * 4
        sent = 0
        while got < count + warm:
            if got == warm:
                send_ns = recv_ns = 0  # the first bursts open the window and warm the caches
            t0 = clock()
            for _ in range(burst):
                push(payload)
            tx.flush()
            sent += burst
            t1 = clock()
            deadline = time.monotonic() + 5.0
            while got < sent:
                got += len(pop_many(4096))
                if time.monotonic() > deadline:
                    raise SystemExit(f"lost messages: {sent - got} of {sent} not received within 5 s")
            t2 = clock()
            send_ns += t1 - t0
            recv_ns += t2 - t1
    return send_ns / count, recv_ns / count


def _floor_round(size: int, burst: int, count: int) -> tuple[float, float]:
    """The same loop with bare sockets: prebuilt datagrams of cmq's packing
    (as many ``size``-byte messages as fit 65,000 bytes), sent with
    ``sendto`` and read with ``recv_into`` into one buffer: the kernel's part
    and a bare loop, no framing and no object per message."""
    per = max(1, 65_000 // (size + 9))
    datagram = b"x" * (per * (size + 9) + 24)
    clock = time.thread_time_ns
    a = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    b = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with a, b:
        b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        b.bind(("127.0.0.1", 0))
        addr = b.getsockname()
        buf = bytearray(65536)
        grams = max(1, burst // per)
        rounds = max(1, count // (grams * per))
        send_ns = recv_ns = 0
        for _ in range(rounds):
            t0 = clock()
            for _ in range(grams):
                a.sendto(datagram, addr)
            t1 = clock()
            for _ in range(grams):
                b.recv_into(buf)
            send_ns += t1 - t0
            recv_ns += clock() - t1
        n = rounds * grams * per
    return send_ns / n, recv_ns / n


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=int, default=16384, help="message bytes (default %(default)s)")
    p.add_argument("--burst", type=int, default=0, help="messages pushed before the receiver reads (default: 96 KB of them)")
    p.add_argument("--count", type=int, default=0, help="messages a round (default: 1 GB or 2,000,000 of them)")
    p.add_argument("--rounds", type=int, default=5, help="rounds; the median counts (default %(default)s)")
    p.add_argument("--floor", action="store_true", help="measure bare sockets instead (the floor, see _floor_round)")
    args = p.parse_args()
    if args.size < 1 or args.rounds < 1 or args.burst < 0 or args.count < 0:
        p.error("--size and --rounds must be at least 1, --burst and --count not negative")
    burst = args.burst or max(1, (96 << 10) // args.size)
    count = args.count or min(2_000_000, (1 << 30) // args.size)
    count = max(burst, count // burst * burst)
    core = "bare sockets (the floor)" if args.floor else "pure Python core" if _impl.speedups is None else "compiled core"
    measure = _floor_round if args.floor else _round
    rounds = [measure(args.size, burst, count) for _ in range(args.rounds)]
    send = statistics.median(r[0] for r in rounds)
    recv = statistics.median(r[1] for r in rounds)
    total = statistics.median(r[0] + r[1] for r in rounds)
    spread = ", ".join(f"{r[0] + r[1]:,.0f}" for r in rounds)
    print(
        f"{core}, {args.size:,} B, bursts of {burst}, {count:,} messages a round: "
        f"{total:,.0f} CPU ns a message (send {send:,.0f}, receive {recv:,.0f}; rounds {spread})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
