"""Flow control towards AMQP publishers (RabbitMQ's memory alarm), with pika.

Over its memory budget the broker stops reading publishing connections
(TCP pushes back on the publisher) and tells them connection.blocked; once
consumers bring it under 90% of the budget, it reads them again and tells
them connection.unblocked. Nothing published is lost on the way.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

pika = pytest.importorskip("pika", reason="pika is not installed: pip install 'pycmq[test]'")
pytest.importorskip("pamqp", reason="pamqp is not installed: pip install 'pycmq[broker]'")

from cmq import ConfigError  # noqa: E402
from cmq.routing import Broker, BrokerConfig  # noqa: E402
from cmq.routing._amqp_server import _READ  # noqa: E402
from tests.waiting import wait_until  # noqa: E402

pytestmark = pytest.mark.timeout(120)

BUDGET = 256 * 1024
SIZE = 8 * 1024
# 20 MB: far more than the budget plus what loopback socket buffers hold, so
# a broker that kept reading would be seen holding it.
COUNT = 2500
WAIT = 30.0


@pytest.fixture
def broker() -> Iterator[Broker]:
    with Broker(config=BrokerConfig(consumer_timeout=60.0, memory_budget=BUDGET), amqp_port=0).start() as b:
        yield b


def connect(broker: Broker) -> Any:
    assert broker.amqp_address is not None
    params = pika.ConnectionParameters(*broker.amqp_address, credentials=pika.PlainCredentials("guest", "guest"))
    return pika.BlockingConnection(params)


def test_publishers_are_blocked_over_the_budget_and_let_go_under_it(broker: Broker) -> None:
    listener = broker.amqp
    assert listener is not None
    setup = connect(broker)
    setup.channel().queue_declare("flow")
    setup.close()

    events: list[str] = []
    publisher = connect(broker)
    publisher.add_on_connection_blocked_callback(lambda *_: events.append("blocked"))
    publisher.add_on_connection_unblocked_callback(lambda *_: events.append("unblocked"))
    done = threading.Event()

    def publish() -> None:
        ch = publisher.channel()
        for i in range(COUNT):
            ch.basic_publish("", "flow", i.to_bytes(4, "big") + b"x" * (SIZE - 4))
        publisher.process_data_events(time_limit=0)  # the unblocked callback is run here
        done.set()

    thread = threading.Thread(target=publish, daemon=True)
    thread.start()
    assert wait_until(lambda: listener.alarm, WAIT)
    # The publisher is stuck (its socket is not read): what the broker holds
    # is the budget plus at most the one read that crossed it.
    assert not done.wait(0.5)
    assert broker.core.held_bytes() <= BUDGET + _READ + SIZE
    assert broker.stats().per_queue[0].ready < COUNT

    # A consumer on its own connection is still read: its acks drain the
    # queue, the publisher is let go, and every message arrives once, in order.
    got: list[int] = []
    consumer = connect(broker)
    ch = consumer.channel()
    ch.basic_qos(prefetch_count=50)

    def on(chan: Any, method: Any, props: Any, body: bytes) -> None:
        got.append(int.from_bytes(body[:4], "big"))
        chan.basic_ack(method.delivery_tag)

    ch.basic_consume("flow", on)
    assert wait_until(lambda: consumer.process_data_events(time_limit=0.05) or len(got) >= COUNT, WAIT)
    assert done.wait(WAIT)
    thread.join(WAIT)
    assert got == list(range(COUNT))
    assert events[:2] == ["blocked", "unblocked"]
    assert listener.alarms >= 1
    assert wait_until(lambda: not listener.alarm, WAIT)
    consumer.close()
    publisher.close()


def test_a_memory_budget_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="memory_budget"):
        BrokerConfig(memory_budget=0)
