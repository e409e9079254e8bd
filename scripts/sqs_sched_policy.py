"""CPU per cycle of 1 and 4 `cmq serve` nodes (SQLite) by their threads' scheduling policy.

A diagnostic beside the lab's bdqs-throughput (no verdict). Four nodes over
one SQLite file start once; each round sets the Linux scheduling policy of
every thread of every node (``normal``: SCHED_OTHER everywhere; ``batch``:
SCHED_BATCH everywhere, what ``cmq serve`` does by default; ``loop``: only
each node's event-loop thread batch; ``threads``: only its other threads,
SQLite's) and runs 1 node with 16 send+receive+delete cycles in flight and
4 nodes with 16 each, --seconds each, the policies and node counts in an
order that alternates by round. Each run prints one JSON line (the nodes'
CPU per cycle as the lab counts it, ``node_ms``); the last lines are the
medians per policy and 4 nodes' cycles per CPU-second over 1 node's.

Run (Linux): python scripts/sqs_sched_policy.py [--rounds 6 --seconds 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

from cmq.lab.bench.sqs import Servers, measure, sqlite_store, start_cmq

POLICIES = ("normal", "batch", "threads", "loop")


def _apply(servers: Servers, policy: str) -> None:
    for proc in servers.procs:
        for tid in os.listdir(f"/proc/{proc.pid}/task"):
            loop = tid == str(proc.pid)  # the main thread runs the event loop
            batch = {"normal": False, "batch": True, "loop": loop, "threads": not loop}[policy]
            chosen = os.SCHED_BATCH if batch else os.SCHED_OTHER
            try:
                os.sched_setscheduler(int(tid), chosen, os.sched_param(0))
            except OSError:  # a thread that has ended
                continue


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=1.0)
    args = parser.parse_args()
    runs: dict[tuple[str, int], list[float]] = {}
    with sqlite_store() as url:
        servers = start_cmq(url, 4)
        try:
            for r in range(args.rounds):
                for policy in POLICIES if r % 2 == 0 else POLICIES[::-1]:
                    _apply(servers, policy)
                    for nodes in (1, 4) if r % 2 == 0 else (4, 1):
                        row = measure(servers, nodes=nodes, seconds=args.seconds,
                                      concurrency=16 * nodes)  # fmt: skip
                        ms = row["server_cpu_ms_per_cycle"]
                        runs.setdefault((policy, nodes), []).append(ms)
                        print(json.dumps({"round": r, "policy": policy, "nodes": nodes,
                                          "cycles_per_s": row["cycles_per_s"], "node_ms": ms,
                                          "load_average": round(os.getloadavg()[0], 2)}),
                              flush=True)  # fmt: skip
        finally:
            servers.stop()
    for policy in POLICIES:
        one, four = runs[(policy, 1)], runs[(policy, 4)]
        print(json.dumps({"policy": policy, "node_ms_1": statistics.median(one),
                          "node_ms_4": statistics.median(four),
                          "kept_per_cpu_s": round(statistics.median(
                              a / b for a, b in zip(one, four, strict=True)), 3)}))  # fmt: skip


if __name__ == "__main__":
    main()
