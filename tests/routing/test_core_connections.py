"""The core's parts for connection front ends (AMQP): properties carried, basic.get,
held connections, exclusive and auto-delete queues, server-named queues. Virtual time."""

from __future__ import annotations

from typing import Any

import pytest

from cmq.routing._core import GET_TAG, BrokerConfig, BrokerCore, Refused
from cmq.routing._protocol import (
    Ack,
    Consume,
    DeclareQueue,
    DeleteQueue,
    ErrorCode,
    Get,
    Nack,
    Publish,
    decode,
    encode,
)

CONN = "amqp#1"
CH1 = (CONN, 1)
OTHER = ("amqp#2", 1)
UDP = ("127.0.0.1", 4000)


def core() -> BrokerCore:
    c = BrokerCore(BrokerConfig(consumer_timeout=1.0, ack_timeout=2.0))
    c.hold(CONN)
    c.hold("amqp#2")
    return c


def declare(c: BrokerCore, name: str, sender: Any = CH1, **kw: Any) -> Any:
    return c.call(DeclareQueue(rid=0, name=name, max_length=100, overflow="drop-head", **kw), sender, 0.0)


def runs_for(c: BrokerCore, dest: Any) -> list[list[Any]]:
    return [r for o in c.messages_to_send() if o.dest == dest and o.payload[0] == "d" for r in o.payload[2]]


def test_properties_reach_a_consumer_beside_bodies_without_any() -> None:
    c = core()
    declare(c, "q")
    props = {"content_type": "text/plain", "headers": {"a": 1}, "correlation_id": "c1"}
    c.call(Publish(rid=0, exchange="", routing_key="q", body=b"plain"), UDP, 0.0)
    c.call(Publish(rid=0, exchange="", routing_key="q", body=b"with", properties=props), UDP, 0.0)
    c.call(Consume(rid=0, tag="t", queue="q", prefetch=0, no_ack=False), ("127.0.0.1", 5000), 0.0)
    runs = runs_for(c, ("127.0.0.1", 5000))
    # Through the wire encoding, as a cmq client decodes it.
    (ev,) = [decode(encode(decode(["d", "t", runs])))]
    got = [(d.body, d.properties) for r in ev.runs for d in r.deliveries()]  # type: ignore[union-attr]
    assert got == [(b"plain", None), (b"with", props)]


def test_get_takes_the_head_and_waits_for_its_ack() -> None:
    c = core()
    declare(c, "q")
    assert c.call(Get(rid=0, queue="q", no_ack=False), CH1, 0.0) is None
    for b in (b"1", b"2"):
        c.call(Publish(rid=0, exchange="", routing_key="q", body=b, properties={"message_id": b.decode()}), UDP, 0.0)
    tag, dtag, ex, key, redelivered, body, left, props = c.call(Get(rid=0, queue="q", no_ack=False), CH1, 0.0)
    assert (tag, ex, key, redelivered, body, left, props) == (GET_TAG + "q", "", "q", False, b"1", 1, {"message_id": "1"})
    assert c.stats().consumers == 0  # the holder is not a consumer
    # Given back: at the head again, redelivered.
    c.call(Nack(tag=tag, delivery_tags=(dtag,), requeue=True), CH1, 0.0)
    again = c.call(Get(rid=0, queue="q", no_ack=False), CH1, 0.0)
    assert again[5] == b"1" and again[4] is True
    c.call(Ack(tag=tag, delivery_tags=(again[1],)), CH1, 0.0)
    assert c.stats().acked == 1
    # A held connection's get is never timed out; its end puts it back.
    held = c.call(Get(rid=0, queue="q", no_ack=False), CH1, 0.0)
    assert held[5] == b"2"
    c.handle_timer(100.0)
    assert c.queue_info("q", CH1) == (0, 0)
    c.release(CONN, 100.0)
    assert c.queue_info("q", UDP) == (1, 0)


def test_held_consumers_are_not_timed_out_and_go_with_their_connection() -> None:
    c = core()
    declare(c, "q")
    c.call(Consume(rid=0, tag="t", queue="q", prefetch=0, no_ack=False), CH1, 0.0)
    c.call(Publish(rid=0, exchange="", routing_key="q", body=b"x"), UDP, 0.0)
    assert len(runs_for(c, CH1)) == 1
    assert c.next_deadline() is None
    c.handle_timer(1000.0)  # past both timeouts: nothing happens to it
    assert c.stats().consumers == 1 and c.stats().redelivered == 0
    c.release(CONN, 1000.0)
    assert c.stats().consumers == 0
    assert c.queue_info("q", UDP) == (1, 0) and c.stats().redelivered == 1


def test_exclusive_queue_is_locked_to_its_connection_and_goes_with_it() -> None:
    c = core()
    declare(c, "ex", exclusive=True)
    for call in (
        lambda: c.call(Consume(rid=0, tag="t", queue="ex", prefetch=0, no_ack=False), OTHER, 0.0),
        lambda: c.queue_info("ex", OTHER),
        lambda: c.call(DeleteQueue(rid=0, name="ex"), OTHER, 0.0),
        lambda: declare(c, "ex", OTHER),
    ):
        with pytest.raises(Refused) as info:
            call()
        assert info.value.code == ErrorCode.RESOURCE_LOCKED
    assert c.queue_info("ex", (CONN, 7)) == (0, 0)  # another channel of the same connection
    with pytest.raises(Refused) as info:
        declare(c, "u", UDP, exclusive=True)
    assert info.value.code == ErrorCode.BAD_REQUEST
    c.release(CONN, 0.0)
    with pytest.raises(Refused) as info:
        c.queue_info("ex", CH1)
    assert info.value.code == ErrorCode.NOT_FOUND


def test_auto_delete_queue_goes_with_its_last_consumer() -> None:
    c = core()
    declare(c, "ad", auto_delete=True)
    for tag in ("a", "b"):
        c.call(Consume(rid=0, tag=tag, queue="ad", prefetch=0, no_ack=False), CH1, 0.0)
    from cmq.routing._protocol import Cancel

    c.call(Cancel(rid=0, tag="a"), CH1, 0.0)
    assert c.queue_info("ad", CH1) == (0, 1)
    c.call(Cancel(rid=0, tag="b"), CH1, 0.0)
    assert c.exchange_type("") == "direct"
    with pytest.raises(Refused):
        c.queue_info("ad", CH1)


def test_server_named_queues_are_distinct_and_usable() -> None:
    c = core()
    a = declare(c, "")["queue"]
    b = declare(c, "")["queue"]
    assert a != b and a.startswith("amq.gen-") and b.startswith("amq.gen-")
    c.call(Publish(rid=0, exchange="", routing_key=a, body=b"x"), UDP, 0.0)
    assert c.queue_info(a, UDP) == (1, 0) and c.queue_info(b, UDP) == (0, 0)
