"""Receiver memory after 1M and after 10M messages (issue 2's memory target).

A sender process pushes small messages to a receiver process as fast as the
receiver keeps up (it waits for the receiver's progress every 100k, so the
run measures steady state, not a backlog); the receiver reads its own RSS
from /proc after 1M and after 10M messages and prints both and their ratio.

    .venv/bin/python scripts/receiver_memory.py [--total 10000000] [--size 16]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import time

import cmq


def rss_kb() -> int:
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def receiver(port_q: mp.Queue, progress: mp.Value, total: int, out_q: mp.Queue) -> None:  # type: ignore[type-arg]
    q = cmq.Queue(0, "127.0.0.1")
    port_q.put(q.port)
    n = 0
    marks: dict[int, int] = {}
    while n < total:
        try:
            q.get(timeout=5)
        except cmq.Timeout:
            break
        n += 1 + len(q.pop_many())
        progress.value = n
        for mark in (1_000_000, total):
            if n >= mark and mark not in marks:
                marks[mark] = rss_kb()
    out_q.put((n, marks, q.stats().as_dict()))
    q.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--total", type=int, default=10_000_000)
    parser.add_argument("--size", type=int, default=16)
    args = parser.parse_args()
    port_q: mp.Queue = mp.Queue()  # type: ignore[type-arg]
    out_q: mp.Queue = mp.Queue()  # type: ignore[type-arg]
    progress = mp.Value("q", 0)
    p = mp.Process(target=receiver, args=(port_q, progress, args.total, out_q))
    p.start()
    dest = ("127.0.0.1", port_q.get())
    msg = b"m" * args.size
    with cmq.Queue(0, "127.0.0.1") as q:
        sent = 0
        while sent < args.total:
            for _ in range(min(100_000, args.total - sent)):
                q.push(dest, msg)
            sent += min(100_000, args.total - sent)
            q.flush()
            # Stay within 200k of the receiver: steady state, not a backlog.
            while sent - progress.value > 200_000 and p.is_alive():
                time.sleep(0.001)
        for _ in range(50):
            if progress.value >= args.total or not p.is_alive():
                break
            q.push(dest, msg)
            q.flush()
            time.sleep(0.05)
    n, marks, stats = out_q.get(timeout=60)
    p.join()
    first, last = marks.get(1_000_000), marks.get(args.total)
    print(f"received {n:,} of {args.total:,}; RSS after 1M: {first} KiB, after {args.total:,}: {last} KiB", end="")
    if first and last:
        print(f"; ratio {last / first:.3f}")
    else:
        print()
    print("receiver drops:", {k: v for k, v in stats["dropped"].items() if v}, "kernel:", stats["kernel_drops"])


if __name__ == "__main__":
    main()
