"""Throughput through pika's BlockingConnection: cmq's broker (AMQP listener) beside RabbitMQ.

The same client code against both brokers: declare a fresh queue, publish
``--count`` messages of ``--size`` bytes (no confirms), then consume them all
(prefetch ``--prefetch``, an ack with ``multiple`` every 100 messages). The
cmq broker runs as a process of its own (``cmq broker --amqp-port``), as
RabbitMQ does. Runs are interleaved (cmq, rabbitmq, cmq, ...) ``--repeat``
times; the median of each figure is printed, with the broker's CPU per
message (cmq only: RabbitMQ's process is not ours to read).

    .venv/bin/python scripts/amqp_pika_bench.py [--count 10000] [--size 1024] [--repeat 3]
        [--rabbitmq amqp://guest:guest@127.0.0.1:5672/%2F]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
import uuid
from typing import Any

import pika


def _proc_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_once(params: pika.ConnectionParameters, count: int, size: int, prefetch: int) -> dict[str, float]:
    conn = pika.BlockingConnection(params)
    ch = conn.channel()
    queue = f"bench-{uuid.uuid4().hex[:12]}"
    ch.queue_declare(queue, auto_delete=False)
    body = os.urandom(size)
    t0 = time.perf_counter()
    for _ in range(count):
        ch.basic_publish("", queue, body)
    t1 = time.perf_counter()
    ch.basic_qos(prefetch_count=prefetch)
    got = 0

    def on(chan: Any, method: Any, props: Any, b: bytes) -> None:
        nonlocal got
        got += 1
        if got % 100 == 0 or got == count:
            chan.basic_ack(method.delivery_tag, multiple=True)
        if got == count:
            chan.stop_consuming()

    ch.basic_consume(queue, on)
    ch.start_consuming()
    t2 = time.perf_counter()
    ch.queue_delete(queue)
    conn.close()
    return {
        "publish_msgs_s": count / (t1 - t0),
        "consume_msgs_s": count / (t2 - t1),
        "total_msgs_s": count / (t2 - t0),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=10_000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--prefetch", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rabbitmq", default="amqp://guest:guest@127.0.0.1:5672/%2F")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    cmq_bin = os.path.join(os.path.dirname(sys.executable), "cmq")
    broker = subprocess.Popen([cmq_bin, "broker", "--port", "0", "--amqp-port", "0", "--in-memory"],
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert broker.stdout is not None
        line = broker.stdout.readline()
        m = re.search(r"AMQP 0-9-1 on ([\d.]+):(\d+)", line)
        if m is None:
            print(f"amqp_pika_bench: cmq broker did not start: {line.strip()}", file=sys.stderr)
            return 1
        cmq_params = pika.ConnectionParameters(m.group(1), int(m.group(2)))
        try:
            rabbit: pika.ConnectionParameters | None = pika.URLParameters(args.rabbitmq)
            pika.BlockingConnection(rabbit).close()
        except Exception as exc:  # noqa: BLE001 - any failure to reach it: skipped, said once
            print(f"amqp_pika_bench: RabbitMQ not reachable at {args.rabbitmq} ({type(exc).__name__}); "
                  "cmq only (apt-get install rabbitmq-server)", file=sys.stderr)  # fmt: skip
            rabbit = None
        runs: dict[str, list[dict[str, float]]] = {"cmq": [], "rabbitmq": []}
        for _ in range(args.repeat):
            cpu0 = _proc_cpu(broker.pid)
            r = run_once(cmq_params, args.count, args.size, args.prefetch)
            r["broker_cpu_us_per_msg"] = (_proc_cpu(broker.pid) - cpu0) / args.count * 1e6
            runs["cmq"].append(r)
            if rabbit is not None:
                runs["rabbitmq"].append(run_once(rabbit, args.count, args.size, args.prefetch))
    finally:
        broker.terminate()
        broker.wait(timeout=10)
    out = {
        name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items() if rs
    }
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"pika BlockingConnection, {args.count} x {args.size} B, median of {args.repeat} interleaved runs")
    for name, figs in out.items():
        text = ", ".join(f"{k} {v:,.0f}" for k, v in figs.items())
        print(f"  {name:9s} {text}")
    if "rabbitmq" in out:
        for k in ("publish_msgs_s", "consume_msgs_s", "total_msgs_s"):
            print(f"  cmq / rabbitmq {k}: {out['cmq'][k] / out['rabbitmq'][k]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
