"""A node's CPU per cycle against the cycles in flight on it, beside 4 nodes (SQLite).

A diagnostic beside the lab's bdqs-throughput (no verdict). Four `cmq serve`
nodes over one SQLite file start once; each round runs, in a shuffled order,
one node with 4, 8, 16, 32 and 64 send+receive+delete cycles in flight and
the 4 nodes with 16 each (bdqs-throughput's load), --seconds each. Each run
prints one JSON line: cycles/s, the nodes' CPU per cycle (``node_ms``, as
the lab counts it) and their threads' voluntary and involuntary context
switches per cycle (``/proc/<pid>/task/<tid>/status``); the last lines are
the medians over rounds. A node group-commits what is waiting when its
writer thread comes round, so what a cycle costs falls as more wait, and
the fixed costs of a commit, its fsync and the thread wake-ups around them
are shared by fewer cycles when fewer wait.

Run: python scripts/sqs_cpu_depth.py [--rounds 5 --seconds 1]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics

from cmq.lab.bench.sqs import measure, sqlite_store, start_cmq

CONFIGS = [(1, 4), (1, 8), (1, 16), (1, 32), (1, 64), (4, 64)]


def _switches(pids: list[int]) -> tuple[int, int]:
    """Voluntary and involuntary context switches of every thread of ``pids``."""
    vol = inv = 0
    for pid in pids:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/status", encoding="ascii") as f:
                    for line in f:
                        if line.startswith("voluntary_ctxt_switches:"):
                            vol += int(line.split()[1])
                        elif line.startswith("nonvoluntary_ctxt_switches:"):
                            inv += int(line.split()[1])
            except OSError:  # a thread that has ended
                continue
    return vol, inv


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=1.0)
    args = parser.parse_args()
    runs: dict[tuple[int, int], list[float]] = {}
    with sqlite_store() as url:
        servers = start_cmq(url, 4)
        try:
            for r in range(args.rounds):
                order = list(CONFIGS)
                random.Random(r).shuffle(order)
                for nodes, in_flight in order:
                    pids = [p.pid for p in servers.procs[:nodes]]
                    vol0, inv0 = _switches(pids)
                    row = measure(servers, nodes=nodes, seconds=args.seconds,
                                  concurrency=in_flight)  # fmt: skip
                    vol1, inv1 = _switches(pids)
                    cycles = max(1, int(row["cycles"]))
                    runs.setdefault((nodes, in_flight), []).append(row["server_cpu_ms_per_cycle"])
                    print(json.dumps({
                        "round": r, "nodes": nodes, "in_flight": in_flight,
                        "cycles_per_s": round(cycles / row["seconds"]),
                        "node_ms": row["server_cpu_ms_per_cycle"],
                        "voluntary_per_cycle": round((vol1 - vol0) / cycles, 2),
                        "involuntary_per_cycle": round((inv1 - inv0) / cycles, 2),
                        "load_average": round(os.getloadavg()[0], 2),
                    }), flush=True)  # fmt: skip
        finally:
            servers.stop()
    for (nodes, in_flight), values in sorted(runs.items()):
        print(json.dumps({"nodes": nodes, "in_flight": in_flight,
                          "median_node_ms": round(statistics.median(values), 3)}))  # fmt: skip


if __name__ == "__main__":
    main()
