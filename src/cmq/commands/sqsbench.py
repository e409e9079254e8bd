"""Benchmark the queue service: cycles/s vs moto, and the BDQS K/order experiment.

  cmq sqsbench throughput [--seconds 5] [--nodes 1,2,4] [--stores sqlite,redis-cluster]
                          [--client raw|aiohttp|wrk] [--concurrency 64]
  cmq sqsbench order [--n 500] [--modes atomic,lock-free] [--order-nodes 3]
                     [--stores sqlite,redis-cluster,moto] [--out records.parquet]

Servers (cmq serve nodes, moto_server, a local Redis Cluster) are started
and stopped here; results print as a table and, with --json, as JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from collections.abc import Iterator
from typing import Any

from cmq._extras import require


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``cmq sqsbench``."""
    parser.add_argument("what", choices=["throughput", "order"])
    parser.add_argument(
        "--stores",
        default="sqlite,redis-cluster,moto",
        help="comma-separated: sqlite, redis-cluster, moto",
    )
    parser.add_argument("--nodes", default="1,2,4", help="node counts (throughput)")
    parser.add_argument("--seconds", type=float, default=3.0, help="per run (throughput)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (throughput)")
    parser.add_argument("--concurrency", type=int, default=64, help="in-flight cycles")
    parser.add_argument(
        "--client",
        choices=["raw", "aiohttp", "wrk"],
        default="raw",
        help="load generator: raw asyncio (default), aiohttp (~5x raw's client CPU), "
        "or wrk (compiled, from Debian's wrk package; less client CPU than raw)",
    )
    parser.add_argument("--n", type=int, default=500, help="messages per run (order)")
    parser.add_argument(
        "--modes",
        default="atomic,lock-free",
        help="queue ReceiveMode values to run (order): atomic, lock-free",
    )
    parser.add_argument(
        "--order-nodes",
        type=int,
        default=3,
        help="cmq serve nodes the receivers are spread over (order)",
    )
    parser.add_argument("--out", help="write raw order records here (.parquet or .jsonl)")
    parser.add_argument("--json", action="store_true", help="print results as JSON")


@contextlib.contextmanager
def _store(kind: str) -> Iterator[str | None]:
    from cmq.lab.bench.redis_local import LocalRedisCluster
    from cmq.lab.bench.sqs import sqlite_store

    if kind == "moto":
        yield None
    elif kind == "sqlite":
        with sqlite_store() as url:
            yield url
    elif kind == "redis-cluster":
        cluster = LocalRedisCluster(masters=3, replicas=1).start()
        try:
            yield cluster.url()
        finally:
            cluster.stop()
    else:
        raise SystemExit(f"unknown store {kind!r}")


def run(args: argparse.Namespace) -> int:
    """Run the chosen benchmark and print its figures.

    Raises:
        MissingExtra: the service extra (its servers, the Redis store, the
            aiohttp client) or, for --out, the lab extra is not installed.
    """
    stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    # Checked here: the nodes run in child processes, which would only die.
    require("the queue service", "uvicorn", "httptools")
    if "redis-cluster" in stores:
        require("the Redis Cluster store", "redis")
    if args.client == "aiohttp":
        require("the aiohttp client", "aiohttp")
    if args.out and not args.out.endswith(".jsonl"):
        require("writing Parquet", "pyarrow")
    from cmq.lab.bench import sqs as bench

    rows: list[dict[str, Any]] = []
    if args.what == "throughput":
        with contextlib.ExitStack() as stack:
            urls = {kind: stack.enter_context(_store(kind)) for kind in stores}
            configs = [
                (kind, n)
                for kind in stores
                for n in ([1] if kind == "moto" else [int(x) for x in args.nodes.split(",")])
            ]
            rows = bench.throughput_matrix(
                configs,
                urls,
                rounds=args.rounds,
                seconds=args.seconds,
                concurrency=args.concurrency,
                client=args.client,
            )
        for r in rows:
            print(
                f"{r['system']:14} nodes={r['nodes']}  {r['cycles_per_s']:8.1f} cycles/s "
                f"(median of {r['all_cycles_per_s']})  "
                f"server CPU {r['server_cpu_ms_per_cycle']:.3f} ms/cycle  "
                f"(event loop {r['loop_cpu_ms_per_cycle']:.3f})  "
                f"client CPU {r['client_cpu_ms_per_cycle']:.3f} ms/cycle  "
                f"{r.get('x_moto', '-')}x moto (CPU: {r.get('x_moto_cpu', '-')}x)  "
                f"errors={r['errors']}"
            )
    else:
        modes = [m.strip() for m in args.modes.split(",") if m.strip()]
        if not modes or set(modes) - {"atomic", "lock-free"}:
            raise SystemExit("cmq sqsbench: --modes takes atomic and/or lock-free")
        if args.order_nodes < 1:
            raise SystemExit("cmq sqsbench: --order-nodes must be at least 1")
        records: list[dict[str, Any]] = []
        for kind in stores:
            with _store(kind) as url:
                records += bench.order_experiment(
                    url or "moto", n=args.n, modes=modes, nodes=args.order_nodes
                )
        rows = bench.summarise(records)
        for r in rows:
            print(
                f"{r['system']:14} {r['mode']:9} T={r['t_recv']}  K={r['k']!s:9} "
                f"dup={r['duplication_rate']:.4f}  out-of-order={r['out_of_order_rate']:.4f}  "
                f"(per receiver {r['out_of_order_per_receiver']:.4f})"
            )
        if args.out:
            bench.write_records(records, args.out)
            print(f"{len(records)} raw records -> {args.out}")
    if args.json:
        print(json.dumps(rows, indent=1))
    return 0
