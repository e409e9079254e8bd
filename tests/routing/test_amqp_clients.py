"""The broker's AMQP 0-9-1 listener with other unmodified clients: aio-pika, kombu, a Celery worker."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pamqp", reason="pamqp is not installed: pip install 'pycmq[broker]'")

from cmq.routing import Broker, BrokerConfig

pytestmark = pytest.mark.timeout(120)

WAIT = 20.0  # generous: bounds waits on loopback, never asserted


@pytest.fixture
def broker() -> Iterator[Broker]:
    with Broker(config=BrokerConfig(consumer_timeout=60.0), amqp_port=0).start() as b:
        yield b


def url(broker: Broker) -> str:
    assert broker.amqp_address is not None
    host, port = broker.amqp_address
    return f"amqp://guest:guest@{host}:{port}//"


def test_aio_pika_publish_consume_with_confirms(broker: Broker) -> None:
    aio_pika = pytest.importorskip("aio_pika", reason="aio-pika is not installed: pip install 'pycmq[test]'")

    async def main() -> list[tuple[bytes, Any]]:
        connection = await aio_pika.connect_robust(url(broker))
        async with connection:
            channel = await connection.channel(publisher_confirms=True)
            await channel.set_qos(prefetch_count=10)
            exchange = await channel.declare_exchange("events", aio_pika.ExchangeType.TOPIC)
            queue = await channel.declare_queue("", exclusive=True)
            await queue.bind(exchange, "order.*")
            for i in range(20):
                await exchange.publish(
                    aio_pika.Message(b"o%d" % i, correlation_id=str(i), headers={"n": i}), routing_key="order.new"
                )
            got: list[tuple[bytes, Any]] = []
            async with queue.iterator() as it:
                async for message in it:
                    async with message.process():
                        got.append((message.body, message.headers["n"]))
                    if len(got) == 20:
                        break
            return got

    got = asyncio.run(asyncio.wait_for(main(), WAIT))
    assert got == [(b"o%d" % i, i) for i in range(20)]


def test_kombu_producer_and_simple_queue(broker: Broker) -> None:
    kombu = pytest.importorskip("kombu", reason="kombu is not installed: pip install 'pycmq[test]'")
    with kombu.Connection(url(broker), connect_timeout=WAIT) as conn:
        exchange = kombu.Exchange("tasks", type="direct")
        queue = kombu.Queue("jobs", exchange, routing_key="job")
        with conn.Producer() as producer:
            for i in range(5):
                producer.publish({"i": i}, exchange=exchange, routing_key="job", declare=[queue],
                                 serializer="json", retry=False)  # fmt: skip
        got = []
        with conn.SimpleQueue(queue) as sq:
            for _ in range(5):
                m = sq.get(timeout=WAIT)
                got.append(m.payload)
                m.ack()
        assert got == [{"i": i} for i in range(5)]


def test_a_celery_task_runs_through_the_broker(broker: Broker, tmp_path: Path) -> None:
    pytest.importorskip("celery", reason="celery is not installed: pip install 'pycmq[test]'")
    (tmp_path / "cmq_celery_tasks.py").write_text(textwrap.dedent(f"""
        from celery import Celery

        app = Celery("cmq_celery_tasks", broker={url(broker)!r}, backend="rpc://")
        app.conf.update(worker_hijack_root_logger=False, broker_connection_retry_on_startup=True,
                        task_acks_late=True)

        @app.task
        def add(x, y):
            return x + y
    """))
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "cmq_celery_tasks", "worker", "--pool=solo", "--concurrency=1",
         "--without-gossip", "--without-mingle", "--without-heartbeat", "--loglevel=WARNING"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        sys.path.insert(0, str(tmp_path))
        try:
            import cmq_celery_tasks  # type: ignore[import-not-found]

            result = cmq_celery_tasks.add.delay(2, 3)
            assert result.get(timeout=WAIT) == 5
            results = [cmq_celery_tasks.add.delay(i, i) for i in range(5)]
            assert [r.get(timeout=WAIT) for r in results] == [0, 2, 4, 6, 8]
            # Remote control: a fanout to the workers' pidbox queues (declared
            # with x-expires) and the answers through a reply queue.
            pongs = cmq_celery_tasks.app.control.ping(timeout=WAIT, limit=1)
            assert [next(iter(p.values())) for p in pongs] == [{"ok": "pong"}], pongs
        finally:
            sys.path.remove(str(tmp_path))
            sys.modules.pop("cmq_celery_tasks", None)
    finally:
        worker.terminate()
        try:
            out, _ = worker.communicate(timeout=WAIT)
        except subprocess.TimeoutExpired:
            worker.kill()
            out, _ = worker.communicate()
    assert b"Traceback" not in out, out.decode(errors="replace")[-3000:]
