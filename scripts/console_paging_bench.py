"""How long the console's queue table takes to answer with many queues.

    .venv/bin/python scripts/console_paging_bench.py [--queues 10000] [--store sqlite|memory|broker] [--repeat 20]

Builds a queue service app (or, with ``--store broker``, a broker and its
console) (no HTTP server: the ASGI app is called in
memory, so only the console's own work and the store's are timed) over a
fresh store holding --queues queues, every tenth with a few messages, then
times the table's API: a page sorted by name (the default view), a page
sorted by depth the first time (every queue counted) and again within 5 s
(the counts reused), a filtered page, and the overview. Prints JSON:
median and worst milliseconds of --repeat calls each.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.console.asgi import call

from cmq.service.app import SqsApp
from cmq.service.model import NewMessage, QueueRecord
from cmq.service.store.memory import MemoryStore
from cmq.service.store.sqlite import SqliteStore


async def run_broker(args: argparse.Namespace) -> dict[str, Any]:
    import base64

    from cmq.console import Access, BrokerBackend, ConsoleApp
    from cmq.routing import Broker
    from cmq.routing._protocol import DeclareQueue, Publish
    from cmq.service.edge import EdgePolicy

    with Broker(port=0) as b:
        for i in range(args.queues):
            name = f"queue-{i:05d}"
            b.call(DeclareQueue(rid=0, name=name, max_length=1000, overflow="drop-head"), ("bench", 0))
            for _ in range(i % 7 + 1 if i % 10 == 0 else 0):
                b.call(Publish(rid=0, exchange="", routing_key=name, body=b"x"), ("bench", 0))
        backend = BrokerBackend(b, "memory")
        app = ConsoleApp(backend, policy=EdgePolicy(), access=Access.users(lambda u, p, c: None))
        login = {"Authorization": "Basic " + base64.b64encode(b"u:p").decode()}
        return await _measure(app, args, login, lambda: setattr(backend, "_all", None))


async def _measure(app: Any, args: argparse.Namespace, headers: dict[str, str], uncache: Any) -> dict[str, Any]:
    async def timed(path: str, repeat: int) -> dict[str, float]:
        times = []
        for _ in range(repeat):
            t = time.perf_counter()
            r = await call(app, "GET", path, headers=headers)
            times.append((time.perf_counter() - t) * 1000)
            assert r.status == 200, r.text
        return {"median_ms": round(statistics.median(times), 2), "worst_ms": round(max(times), 2),
                "calls": repeat}  # fmt: skip

    out: dict[str, Any] = {"queues": args.queues, "store": args.store}
    out["page_by_name"] = await timed("/console/api/queues?page=37&per_page=50", args.repeat)
    out["page_by_depth_cold"] = await timed("/console/api/queues?sort=depth&order=desc", 1)
    out["page_by_depth_cached"] = await timed("/console/api/queues?sort=depth&order=desc", args.repeat)
    uncache()
    out["page_by_depth_cold_again"] = await timed("/console/api/queues?sort=depth&order=desc", 1)
    out["filtered"] = await timed("/console/api/queues?filter=queue-0999", args.repeat)
    out["overview"] = await timed("/console/api/overview", args.repeat)
    return out


async def run(args: argparse.Namespace, folder: str) -> dict[str, Any]:
    if args.store == "broker":
        return await run_broker(args)
    store = MemoryStore() if args.store == "memory" else SqliteStore(f"{folder}/bench.sqlite3")
    await store.open()
    try:
        for i in range(args.queues):
            name = f"queue-{i:05d}"
            await store.create_queue(QueueRecord(name=name))
            if i % 10 == 0:
                await store.send(name, [NewMessage(message_id=f"{i}-{k}", payload='{"b":"x","i":"m","t":0}',
                                                   visible_at=0) for k in range(i % 7 + 1)], 0)  # fmt: skip
        app = SqsApp(store)
        backend = app.console.backend  # type: ignore[union-attr]
        return await _measure(app, args, {}, lambda: setattr(backend, "_all", None))
    finally:
        await store.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queues", type=int, default=10_000)
    ap.add_argument("--store", choices=["sqlite", "memory", "broker"], default="sqlite")
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        print(json.dumps(asyncio.run(run(args, folder)), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
