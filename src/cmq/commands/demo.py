"""Two endpoints exchange messages on loopback and print what they measured.

A quick look at cmq on this machine: a one-way stream of small messages
(batched), then request/response round trips (each sent at once, because the
destination is idle). For the full comparison with other systems run
``cmq bench`` or ``cmq lab``.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

from cmq._errors import Timeout
from cmq.net.queue import Queue


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--count", type=int, default=200_000, help="messages in the one-way stream")
    parser.add_argument("--size", type=int, default=16, help="message size in bytes")
    parser.add_argument("--round-trips", type=int, default=2_000, help="request/response round trips")


def run(args: argparse.Namespace) -> int:
    payload = b"x" * args.size
    with Queue(0, "127.0.0.1") as a, Queue(0, "127.0.0.1") as b:
        dest = ("127.0.0.1", b.port)
        got = 0

        def consume() -> None:
            nonlocal got
            while got < args.count:
                try:
                    b.get(timeout=1.0)
                except Timeout:
                    return
                got += 1 + len(b.pop_many())

        t = threading.Thread(target=consume)
        t.start()
        start = time.perf_counter()
        for _ in range(args.count):
            a.push(dest, payload)
        a.flush()
        t.join()
        elapsed = time.perf_counter() - start
        st = a.stats()
        print(f"one-way: {got:,} of {args.count:,} messages of {args.size} B in {elapsed:.3f} s "
              f"= {got / elapsed:,.0f} msgs/s, {st.datagrams_sent:,} datagrams "
              f"({args.count / max(st.datagrams_sent, 1):.1f} messages per datagram)")

        stop = threading.Event()

        def serve() -> None:
            while not stop.is_set():
                try:
                    m = b.get_message(timeout=0.2)
                except Timeout:
                    continue
                b.reply(m, m.payload)

        server = threading.Thread(target=serve)
        server.start()
        rtts = []
        lost = 0
        for _ in range(args.round_trips):
            t0 = time.perf_counter_ns()
            try:
                a.request(dest, payload, timeout=1.0)
            except Timeout:
                lost += 1
                continue
            rtts.append((time.perf_counter_ns() - t0) / 1000)
        stop.set()
        server.join()
        if rtts:
            rtts.sort()
            print(f"request/response: {len(rtts):,} round trips, mean {statistics.fmean(rtts):.1f} us, "
                  f"p50 {rtts[len(rtts) // 2]:.1f} us, p99 {rtts[int(len(rtts) * 0.99)]:.1f} us, lost {lost} "
                  "(both endpoints in one process: threads share the interpreter)")
    return 0
