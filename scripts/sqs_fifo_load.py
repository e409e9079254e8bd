"""SendMessage latency on an unrelated queue while a FIFO queue holds a blocked group.

One `cmq serve` node on a fresh SQLite file. A FIFO queue gets --messages
messages in one group and its head is received (so the whole group is
blocked); --pollers clients long-poll that queue throughout. Meanwhile one
client sends --sends messages, one at a time, to an unrelated standard queue
and the p50/p99 of those sends is printed, beside the same sends with no FIFO
load (idle). Run: python scripts/sqs_fifo_load.py [--messages 20000 --pollers 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time

from cmq.lab.bench.sqs import _call, _Conn, start_cmq


async def _sends(conn: _Conn, url: str, n: int) -> list[float]:
    out = []
    for i in range(n):
        t = time.perf_counter()
        await _call(conn, "SendMessage", {"QueueUrl": url, "MessageBody": str(i)})
        out.append(time.perf_counter() - t)
    return out


def _summary(xs: list[float]) -> str:
    xs = sorted(xs)
    return f"p50 {statistics.median(xs) * 1000:.2f} ms, p99 {xs[int(len(xs) * 0.99)] * 1000:.2f} ms"


async def main(messages: int, pollers: int, sends: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        servers = start_cmq(f"sqlite:{tmp}/db.sqlite3")
        try:
            base = servers.urls[0]
            conn = _Conn(base)
            other = (await _call(conn, "CreateQueue", {"QueueName": "other"}))["QueueUrl"]
            idle = await _sends(conn, other, sends)
            fifo = (
                await _call(
                    conn,
                    "CreateQueue",
                    {"QueueName": "load.fifo", "Attributes": {"FifoQueue": "true"}},
                )
            )["QueueUrl"]
            for start in range(0, messages, 10):
                entries = [
                    {
                        "Id": str(i),
                        "MessageBody": f"m{start + i}",
                        "MessageGroupId": "one",
                        "MessageDeduplicationId": f"d{start + i}",
                    }
                    for i in range(min(10, messages - start))
                ]
                await _call(conn, "SendMessageBatch", {"QueueUrl": fifo, "Entries": entries})
            head = await _call(conn, "ReceiveMessage", {"QueueUrl": fifo, "VisibilityTimeout": 600})
            assert head.get("Messages"), "the FIFO head was not received"
            stop = asyncio.Event()

            async def poll() -> None:
                c = _Conn(base)
                while not stop.is_set():
                    await _call(c, "ReceiveMessage", {"QueueUrl": fifo, "WaitTimeSeconds": 1})
                c.close()

            tasks = [asyncio.create_task(poll()) for _ in range(pollers)]
            await asyncio.sleep(0.5)  # let the pollers settle into their loop
            loaded = await _sends(conn, other, sends)
            stop.set()
            await asyncio.gather(*tasks)
            conn.close()
        finally:
            servers.stop()
    print(f"idle:   {_summary(idle)}")
    print(
        f"loaded: {_summary(loaded)}  ({messages} messages in one blocked group, {pollers} pollers)"
    )
    ratio = statistics.median(loaded) / statistics.median(idle)
    print(f"loaded p50 / idle p50 = {ratio:.2f}")
    return {
        "idle_p50_ms": statistics.median(idle) * 1000,
        "loaded_p50_ms": statistics.median(loaded) * 1000,
        "ratio": ratio,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--pollers", type=int, default=8)
    parser.add_argument("--sends", type=int, default=500)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = asyncio.run(main(args.messages, args.pollers, args.sends))
    if args.json:
        print(json.dumps(result))
