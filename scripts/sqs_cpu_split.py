"""Where the CPU of 1 and 4 `cmq serve` nodes over one SQLite file goes, per cycle.

A diagnostic beside the lab's bdqs-throughput (no verdict): --rounds rounds,
each a run at 1 node and one at 4 nodes (alternating which goes first), 16
send+receive+delete cycles in flight per node, a fresh SQLite file per run.
Each run prints one JSON line: cycles/s, the nodes' CPU per cycle split into
their event-loop threads (``loop_ms``) and every other thread (``other_ms``:
SQLite's writer and fsync threads, the lock-free reader), and cycles per
CPU-second. Run: python scripts/sqs_cpu_split.py [--rounds 8 --seconds 1.5]
"""

from __future__ import annotations

import argparse
import json
import os

from cmq.lab.bench.sqs import sqlite_store, throughput


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=1.5)
    args = parser.parse_args()
    for r in range(args.rounds):
        for nodes in (1, 4) if r % 2 == 0 else (4, 1):
            with sqlite_store() as url:
                row = throughput(url, nodes=nodes, seconds=args.seconds, concurrency=16 * nodes)
            node, loop = row["server_cpu_ms_per_cycle"], row["loop_cpu_ms_per_cycle"]
            print(json.dumps({
                "round": r, "nodes": nodes, "cycles_per_s": round(row["cycles"] / row["seconds"]),
                "node_ms": node, "loop_ms": loop, "other_ms": round(node - loop, 3),
                "cycles_per_cpu_s": row["cycles_per_cpu_s"],
                "load_average": round(os.getloadavg()[0], 2),
            }), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
