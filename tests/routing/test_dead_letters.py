"""Overflow, dead-letter exchanges and TTL, with RabbitMQ's semantics.

The core is driven with a virtual clock (see tests/routing/test_core.py's
Harness); the last tests do the same through the real client and broker.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from cmq import RemoteError, Timeout
from cmq.routing import Broker, BrokerClient, BrokerConfig, ErrorCode
from cmq.routing._protocol import Bind, DeclareExchange, DeclareQueue, Nack, Publish, decode, encode
from tests.routing.test_core import C1, Harness

DLX = {"x-dead-letter-exchange": "dlx"}


def dl_harness(**queue_args: Any) -> Harness:
    """A queue "q" dead-lettering to fanout "dlx", which feeds queue "dead"."""
    h = Harness()
    h.ok(DeclareExchange, name="dlx", type="fanout")
    h.ok(DeclareQueue, name="dead", max_length=100, overflow="drop-head")
    h.ok(Bind, queue="dead", exchange="dlx", key="")
    h.ok(DeclareQueue, name="q", max_length=queue_args.pop("max_length", 100),
         overflow=queue_args.pop("overflow", "drop-head"), arguments={**DLX, **queue_args})  # fmt: skip
    return h


def dead(h: Harness) -> list[Any]:
    h.consume("dead", tag="d", sender=C1)
    return h.got(C1, "d")


def test_drop_head_dead_letters_the_oldest() -> None:
    h = dl_harness(max_length=2)
    for i in range(5):
        assert h.publish("", "q", i, confirm=True)[0] == "ok"  # type: ignore[index]  # kept: confirmed
    assert dead(h) == [0, 1, 2]
    h.consume("q")
    assert h.got() == [3, 4]
    q = h.queue_stats("q")
    assert (q.dropped_old, q.dead_lettered) == (3, 3)


def test_reject_publish_nacks_the_confirming_publisher_and_keeps_the_queue() -> None:
    h = dl_harness(max_length=2, overflow="reject-publish")
    replies = [h.publish("", "q", i, confirm=True) for i in range(4)]
    assert [r[0] for r in replies] == ["ok", "ok", "err", "err"]  # type: ignore[index]
    assert replies[2][2] == ErrorCode.QUEUE_FULL  # type: ignore[index]
    assert dead(h) == []  # reject-publish does not dead-letter
    h.consume("q")
    assert h.got() == [0, 1]


def test_reject_publish_dlx_nacks_and_dead_letters_the_newcomer() -> None:
    h = dl_harness(max_length=2, overflow="reject-publish-dlx")
    replies = [h.publish("", "q", i, confirm=True) for i in range(4)]
    assert [r[0] for r in replies] == ["ok", "ok", "err", "err"]  # type: ignore[index]
    assert dead(h) == [2, 3]
    assert h.queue_stats("q").rejected == 2


def test_a_nack_without_requeue_dead_letters_with_requeue_redelivers() -> None:
    h = dl_harness()
    for i in range(3):
        h.publish("", "q", i)
    h.consume("q", prefetch=10)
    tags = [d[0] for d in h.deliveries[(C1, "t")]]
    h.send(Nack(tag="t", delivery_tags=(tags[0],), requeue=False), C1)
    h.send(Nack(tag="t", delivery_tags=(tags[1],), requeue=True), C1)
    h.collect()
    got = h.deliveries[(C1, "t")]
    assert [(d[3], d[4]) for d in got[3:]] == [(1, True)]  # redelivered, marked so
    assert dead(h) == [0]
    d = h.deliveries[(C1, "d")][0]
    assert (d[1], d[2]) == ("dlx", "q")  # the dead-letter exchange, the message's own key
    assert h.queue_stats("q").nacked == 1


def test_dead_letter_routing_key_replaces_the_key() -> None:
    h = Harness()
    h.ok(DeclareExchange, name="dlx", type="direct")
    h.ok(DeclareQueue, name="parking", max_length=10, overflow="drop-head")
    h.ok(Bind, queue="parking", exchange="dlx", key="parked")
    h.ok(DeclareQueue, name="q", max_length=1, overflow="drop-head",
         arguments={**DLX, "x-dead-letter-routing-key": "parked"})  # fmt: skip
    h.publish("", "q", "a")
    h.publish("", "q", "b")
    h.consume("parking", tag="p")
    assert [(d[2], d[3]) for d in h.deliveries[(C1, "p")]] == [("parked", "a")]


def test_queue_ttl_expires_at_the_head_and_dead_letters() -> None:
    h = dl_harness(**{"x-message-ttl": 1000})
    h.publish("", "q", "old")
    h.advance(0.6)
    h.publish("", "q", "young")
    assert h.core.next_deadline() == pytest.approx(1.0)
    h.advance(0.5)  # t=1.1: "old" expired, "young" has 0.5 s left
    assert dead(h) == ["old"]
    h.consume("q")
    assert h.got() == ["young"]
    assert h.queue_stats("q").expired == 1


def test_per_message_ttl_the_shorter_wins_and_only_the_head_expires() -> None:
    h = dl_harness(**{"x-message-ttl": 10_000})
    h.send(Publish(rid=0, exchange="", routing_key="q", body="long", expiration=5000))
    h.send(Publish(rid=0, exchange="", routing_key="q", body="short", expiration=100))
    h.advance(1.0)
    # "short" is past its time but not at the head: RabbitMQ expires only the head.
    assert h.queue_stats("q").ready == 2
    h.advance(4.5)  # t=5.5: "long" expires at the head, then "short" behind it
    assert dead(h) == ["long", "short"]


def test_ttl_zero_keeps_only_what_a_consumer_takes_at_once() -> None:
    h = dl_harness(**{"x-message-ttl": 0})
    h.publish("", "q", "nobody")
    assert dead(h) == ["nobody"]
    h.consume("q")
    h.publish("", "q", "taken")
    assert h.got() == ["taken"]


def test_a_requeued_message_keeps_its_expiry() -> None:
    h = dl_harness(**{"x-message-ttl": 1000})
    h.publish("", "q", "m")
    h.consume("q", prefetch=1)
    h.advance(2.0)  # out with the consumer: does not expire
    (tag,) = [d[0] for d in h.deliveries[(C1, "t")]]
    h.send(Nack(tag="t", delivery_tags=(tag,), requeue=True), C1)
    # Back at the head past its original expiry: it expires there, not redelivered.
    assert len(h.deliveries[(C1, "t")]) == 1
    assert dead(h) == ["m"]


def test_a_dead_letter_cycle_without_rejection_is_cut() -> None:
    h = Harness()
    h.ok(DeclareExchange, name="dlx", type="fanout")
    h.ok(DeclareQueue, name="a", max_length=1, overflow="drop-head", arguments=DLX)
    h.ok(Bind, queue="a", exchange="dlx", key="")
    h.publish("", "a", 1)
    h.publish("", "a", 2)  # 1 is dropped from a's head and dead-lettered... to a, which is full
    s = h.core.stats()
    assert s.dead_letters_dropped >= 1  # the cycle ends; the broker did not loop


def test_no_dead_letter_exchange_drops_and_counts() -> None:
    h = Harness()
    h.ok(DeclareQueue, name="q", max_length=1, overflow="drop-head",
         arguments={"x-dead-letter-exchange": "missing"})  # fmt: skip
    h.publish("", "q", 1)
    h.publish("", "q", 2)
    assert h.core.stats().dead_letters_dropped == 1


@pytest.mark.parametrize(
    ("arguments", "text"),
    [
        ({"x-queue-mode": "lazy"}, "unknown queue argument"),
        ({"x-dead-letter-exchange": 5}, "must be a string"),
        ({"x-dead-letter-routing-key": "k"}, "needs x-dead-letter-exchange"),
        ({"x-message-ttl": -1}, "non-negative integer"),
        ({"x-message-ttl": 1.5}, "non-negative integer"),
    ],
)
def test_bad_queue_arguments_are_refused(arguments: dict[str, Any], text: str) -> None:
    h = Harness()
    code, message = h.err(DeclareQueue, name="q", max_length=1, overflow="drop-head", arguments=arguments)
    assert code == ErrorCode.BAD_REQUEST and text in message


def test_redeclaring_with_other_arguments_is_a_precondition_failure() -> None:
    h = dl_harness()
    code, message = h.err(DeclareQueue, name="q", max_length=100, overflow="drop-head", arguments={})
    assert code == ErrorCode.PRECONDITION_FAILED and "x-dead-letter-exchange='dlx'" in message
    assert h.ok(DeclareQueue, name="q", max_length=100, overflow="drop-old", arguments=DLX)["created"] is False


def test_optional_fields_are_left_off_the_wire() -> None:
    assert encode(Publish(rid=0, exchange="", routing_key="q", body=1)) == ["p", 0, "", "q", 1]
    assert decode(["p", 0, "", "q", 1, 250]) == Publish(rid=0, exchange="", routing_key="q", body=1, expiration=250)
    assert decode(["queue.declare", 1, "q", 5, "drop-head"]) == DeclareQueue(
        rid=1, name="q", max_length=5, overflow="drop-head"
    )


# -- through the real client and broker ---------------------------------------


@pytest.fixture
def client() -> Iterator[BrokerClient]:
    with Broker(config=BrokerConfig(consumer_timeout=60.0)).start() as b, BrokerClient(b.address) as c:
        yield c


def test_the_reported_drop_new_case_through_the_client(client: BrokerClient) -> None:
    client.declare_queue("q", max_length=3, overflow="drop-new")
    results = client.publish_many([("", "q", i) for i in range(5)])
    assert results[:3] == [1, 1, 1]
    assert all(isinstance(r, RemoteError) and r.code == ErrorCode.QUEUE_FULL for r in results[3:])
    with client.consume("q") as c:
        assert [c.get(timeout=5).body for _ in range(3)] == [0, 1, 2]
        with pytest.raises(Timeout):
            c.get(timeout=0.2)


def test_nack_ttl_and_dead_letters_through_the_client(client: BrokerClient) -> None:
    client.declare_exchange("dlx", "fanout")
    client.declare_queue("dead")
    client.bind("dead", "dlx")
    client.declare_queue("work", dead_letter_exchange="dlx")
    client.publish("", "work", {"job": 1}, confirm=True)
    client.publish("", "work", {"job": 2}, confirm=True, ttl=0.0)  # no consumer: expires at once
    with client.consume("work") as c:
        d = c.get(timeout=5)
        assert d.body == {"job": 1}
        c.reject(d, requeue=False)
        with pytest.raises(Timeout):
            c.get(timeout=0.2)
    with client.consume("dead") as c:
        got = sorted(c.get(timeout=5).body["job"] for _ in range(2))
    assert got == [1, 2]
    (work,) = [q for q in client.stats()["per_queue"] if q["name"] == "work"]
    assert (work["nacked"], work["expired"], work["dead_lettered"], work["acked"]) == (1, 1, 2, 0)


def test_dead_letters_carry_x_death_as_rabbitmq_writes_it() -> None:
    h = dl_harness()
    h.core.epoch = 1_700_000_000.0
    h.core.receive(encode(Publish(rid=0, exchange="", routing_key="q", body=b"m", expiration=60_000,
                                  properties={"headers": {"a": 1}, "expiration": "60000"})), C1, h.now)  # fmt: skip
    h.consume("q", prefetch=10)
    (tag,) = [d[0] for d in h.deliveries[(C1, "t")]]
    h.advance(2.5)
    h.send(Nack(tag="t", delivery_tags=(tag,), requeue=False), C1)
    assert dead(h) == [b"m"]
    props = h.deliveries[(C1, "d")][0][5]
    assert "expiration" not in props  # gone, kept as original-expiration
    assert props["headers"] == {
        "a": 1,
        "x-death": [{"count": 1, "reason": "rejected", "queue": "q", "time": 1_700_000_002, "exchange": "",
                     "routing-keys": ["q"], "original-expiration": "60000"}],
        "x-first-death-exchange": "", "x-first-death-queue": "q", "x-first-death-reason": "rejected",
    }  # fmt: skip


def test_a_second_death_the_same_way_counts_and_goes_first() -> None:
    h = dl_harness(**{"x-message-ttl": 1000})
    # A message that already died in "q" (expired, then rejected in "r"), republished by its consumer.
    records = [{"count": 1, "reason": "rejected", "queue": "r", "time": 7, "exchange": "", "routing-keys": ["r"]},
               {"count": 1, "reason": "expired", "queue": "q", "time": 5, "exchange": "", "routing-keys": ["q"]}]
    earlier = {"headers": {"x-death": records, "x-first-death-queue": "q"}}  # fmt: skip
    h.core.receive(encode(Publish(rid=0, exchange="", routing_key="q", body=b"m", properties=earlier)), C1, h.now)
    h.advance(1.5)  # it expires in "q" again
    dead(h)
    headers = h.deliveries[(C1, "d")][0][5]["headers"]
    assert [(r["queue"], r["reason"], r["count"], r["time"]) for r in headers["x-death"]] == [
        ("q", "expired", 2, 5), ("r", "rejected", 1, 7)]  # the record keeps its first time
    assert headers["x-first-death-queue"] == "q"  # set by the first death only
    assert "x-first-death-reason" not in headers
