"""``cmq broker bench-durable``: confirmed persistent publishes per second.

Theory of operation
-------------------
One publisher (this process), a broker in its own process: ``cmq broker``
started here on a fresh data directory, and RabbitMQ already running (when
it is there) through pika, in the same run. Each run publishes ``--size``
byte bodies for ``--seconds`` to a durable queue, as persistent messages
(delivery_mode 2), and waits for each confirm:

- ``confirm-each``: one publish, wait for its confirm, the next (cmq's
  ``publish(..., confirm=True, persistent=True)``; pika's ``basic_publish`` on
  a channel in confirm mode, which waits the same way);
- ``window``: cmq's ``publish_many(..., window=N, persistent=True)``: N
  confirmed publishes in flight at once (pika's blocking channel has no
  such mode, so RabbitMQ has no row here).

Beside them, the same runs on a transient queue with transient messages
(nothing written), which shows what the disk costs. In every run one
consumer (its own connection, a thread of this process, prefetch 256: the
``amqp-durable`` lab experiment's) takes and acks the messages as they come;
the rows say how many it took. A confirm for a persistent message leaves the
broker only after its record is flushed (fsync); confirms that arrive in the
same loop turn share one flush.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any, Final, TypeVar

from cmq._errors import CmqError
from cmq._extras import unavailable
from cmq.lab._child import stop_child

__all__ = ["cmq_consumer", "main", "pika_consumer", "with_consumer"]

_R = TypeVar("_R")

#: Prefetch of the consumer beside each rate run's publisher.
_PREFETCH: Final = 256


def cmq_consumer(address: str, queue: str, stop: threading.Event) -> int:
    """Take and ack from ``queue`` through cmq's client until ``stop``; how many."""
    from cmq.routing import BrokerClient

    n = 0
    with BrokerClient(address, timeout=10.0) as c, c.consume(queue, prefetch=_PREFETCH) as consumer:
        while not stop.is_set():
            with contextlib.suppress(CmqError):  # a timeout: nothing came in the last 0.2 s
                consumer.ack(consumer.get(timeout=0.2))
                n += 1
    return n


def pika_consumer(url: str, queue: str, stop: threading.Event) -> int:
    """Take and ack from ``queue`` through pika until ``stop``; how many."""
    import pika

    n = 0
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=_PREFETCH)
        for method, _props, _body in ch.consume(queue, inactivity_timeout=0.2):
            if method is not None:
                ch.basic_ack(method.delivery_tag)
                n += 1
            if stop.is_set():
                break
        ch.cancel()
    finally:
        with contextlib.suppress(Exception):
            conn.close()
    return n


def with_consumer(consume: Callable[[str, str, threading.Event], int], where: str, queue: str,
                  publish: Callable[[], _R]) -> tuple[_R, int]:  # fmt: skip
    """``publish()`` while ``consume(where, queue, stop)`` runs in a thread beside
    it; what ``publish`` returned, and how many messages the consumer took."""
    stop = threading.Event()
    taken: list[int] = []
    t = threading.Thread(target=lambda: taken.append(consume(where, queue, stop)), daemon=True)
    t.start()
    try:
        done = publish()
    finally:
        stop.set()
        t.join(timeout=10)
    return done, taken[0] if taken else 0


def _start(data_dir: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "cmq", "broker", "--port", "0", "--data-dir", data_dir],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # "cmq broker serving on HOST:PORT"
    return proc, line.strip().rpartition(" ")[2]


def _cmq_run(addr: str, durable: bool, window: int, size: int, seconds: float) -> tuple[float, int, int]:
    from cmq.routing import BrokerClient

    body = b"x" * size
    queue = f"bench-{'d' if durable else 't'}-{window}"
    with BrokerClient(addr, timeout=10.0) as c:
        c.declare_queue(queue, durable=durable, max_length=10_000_000)

        def publish() -> tuple[float, int]:
            n = 0
            start = time.perf_counter()
            end = start + seconds
            if window <= 1:
                while time.perf_counter() < end:
                    c.publish("", queue, body, confirm=True, persistent=durable)
                    n += 1
            else:
                batch = [("", queue, body)] * window
                while time.perf_counter() < end:
                    c.publish_many(batch, window=window, persistent=durable)
                    n += window
            return n / (time.perf_counter() - start), n

        (rate, published), consumed = with_consumer(cmq_consumer, addr, queue, publish)
        c.delete_queue(queue)
    return rate, published, consumed


def _rabbit_run(url: str, durable: bool, size: int, seconds: float) -> tuple[float, int, int]:
    import pika

    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        queue = f"cmq-bench-{'d' if durable else 't'}"
        ch.queue_declare(queue, durable=durable)
        props = pika.BasicProperties(delivery_mode=2 if durable else 1)
        ch.queue_purge(queue)
        body = b"x" * size

        def publish() -> tuple[float, int]:
            n = 0
            start = time.perf_counter()
            end = start + seconds
            while time.perf_counter() < end:
                ch.basic_publish("", queue, body, props)  # returns once confirmed
                n += 1
            return n / (time.perf_counter() - start), n

        (rate, published), consumed = with_consumer(pika_consumer, url, queue, publish)
        ch.queue_delete(queue)
    finally:
        conn.close()
    return rate, published, consumed


def _rabbit_available(url: str) -> str | None:
    missing = unavailable("the RabbitMQ comparison", "pika")
    if missing is not None:
        return missing
    import pika

    try:
        pika.BlockingConnection(pika.URLParameters(url)).close()
    except Exception as exc:  # noqa: BLE001 - any failure means: no RabbitMQ here
        return f"RabbitMQ is not reachable at {url} ({type(exc).__name__}): apt-get install rabbitmq-server"
    return None


def main(args: argparse.Namespace) -> int:
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="cmq-bench-durable-") as data_dir:
        proc, addr = _start(data_dir)
        try:
            for durable in (True, False):
                for window in (1, args.window):
                    rate, published, consumed = _cmq_run(addr, durable, window, args.size, args.seconds)
                    rows.append({"system": "cmq", "persistent": durable, "window": window, "msgs_per_s": rate,
                                 "published": published, "consumed": consumed})  # fmt: skip
        finally:
            stop_child(proc)
    skipped = _rabbit_available(args.amqp_url)
    if skipped is None:
        for durable in (True, False):
            rate, published, consumed = _rabbit_run(args.amqp_url, durable, args.size, args.seconds)
            rows.append({"system": "rabbitmq", "persistent": durable, "window": 1, "msgs_per_s": rate,
                         "published": published, "consumed": consumed})  # fmt: skip
    if args.json:
        print(json.dumps({"size": args.size, "seconds": args.seconds, "runs": rows, "rabbitmq_skipped": skipped}))
        return 0
    print(f"confirmed publishes of {args.size} B, one publisher and one consumer, {args.seconds:g} s each")
    for r in rows:
        kind = "persistent, durable queue" if r["persistent"] else "transient"
        how = "confirm each" if r["window"] == 1 else f"window {r['window']}"
        print(f"  {r['system']:<8} {kind:<26} {how:<13} {r['msgs_per_s']:>10,.0f} msgs/s"
              f"  ({r['consumed']:,} consumed)")  # fmt: skip
    if skipped is not None:
        print(f"  rabbitmq skipped: {skipped}")
    return 0
