"""The sans-IO broker: declarations, errors, overflow, consumers, all in virtual time."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from cmq import ConfigError
from cmq.routing._core import (
    SYSTEM_EXCHANGES,
    Address,
    BrokerConfig,
    BrokerCore,
    ChannelPrefetch,
    ExchangeBind,
    ExchangeUnbind,
    Outgoing,
    PriorityConsume,
    _bytes_of,
)
from cmq.routing._protocol import (
    DELIVERY_MAILBOX,
    REPLY_MAILBOX,
    Ack,
    Bind,
    Cancel,
    Consume,
    ConsumerSpec,
    DeclareExchange,
    DeclareQueue,
    DeleteExchange,
    DeleteQueue,
    ErrorCode,
    Get,
    GetStats,
    Heartbeat,
    Nack,
    Publish,
    PublishBatch,
    PurgeQueue,
    Unbind,
    decode,
    encode,
)

PUB: Address = ("127.0.0.1", 1000)
C1: Address = ("127.0.0.1", 2001)
C2: Address = ("127.0.0.1", 2002)


def bodies_of(payload: list[Any]) -> list[Any]:
    """The bodies a delivery message carries, over its runs."""
    return [b for run in payload[2] for b in run[4]]


class Harness:
    """A broker core, a virtual clock and helpers that speak its protocol."""

    def __init__(self, **config: Any) -> None:
        self.core = BrokerCore(BrokerConfig(**config))
        self.now = 0.0
        self._rid = itertools.count(1)
        self.deliveries: dict[tuple[Address, str], list[list[Any]]] = {}
        self.cancelled: list[tuple[Address, list[Any]]] = []
        self.unsolicited: list[list[Any]] = []

    def advance(self, dt: float) -> None:
        self.now += dt
        deadline = self.core.next_deadline()
        if deadline is not None and deadline <= self.now:
            self.core.handle_timer(self.now)
        self.collect()

    def collect(self) -> list[Outgoing]:
        out = self.core.messages_to_send()
        for o in out:
            if o.mailbox == DELIVERY_MAILBOX:
                if o.payload[0] == "d":
                    # Runs back to one [tag, exchange, key, body, redelivered, properties] per delivery.
                    got = self.deliveries.setdefault((o.dest, o.payload[1]), [])
                    for run in o.payload[2]:
                        first, ex, key, again, bodies = run[:5]
                        props = run[5] if len(run) > 5 else [None] * len(bodies)
                        got.extend(
                            [first + i, ex, key, b, again, p] for i, (b, p) in enumerate(zip(bodies, props, strict=True))
                        )
                else:
                    self.cancelled.append((o.dest, o.payload))
            elif o.payload[1] == 0:
                self.unsolicited.append(o.payload)
        return out

    def send(self, event: Any, sender: Address = PUB) -> list[Any] | None:
        """Feed ``event`` through the wire encoding; return its reply, if any."""
        self.core.receive(encode(event), sender, self.now)
        replies = [o.payload for o in self.collect() if o.mailbox == REPLY_MAILBOX and o.payload[1]]
        assert len(replies) <= 1
        return replies[0] if replies else None

    def ok(self, make: Any, sender: Address = PUB, **fields: Any) -> Any:
        reply = self.send(make(rid=next(self._rid), **fields), sender)
        assert reply is not None and reply[0] == "ok", reply
        return reply[2]

    def err(self, make: Any, sender: Address = PUB, **fields: Any) -> tuple[str, str]:
        reply = self.send(make(rid=next(self._rid), **fields), sender)
        assert reply is not None and reply[0] == "err", reply
        return reply[2], reply[3]

    def queue(self, name: str, max_length: int = 1000, overflow: str = "drop-head") -> Any:
        return self.ok(DeclareQueue, name=name, max_length=max_length, overflow=overflow)

    def publish(
        self, exchange: str, key: str, body: Any, confirm: bool = False
    ) -> list[Any] | None:
        rid = next(self._rid) if confirm else 0
        return self.send(Publish(rid=rid, exchange=exchange, routing_key=key, body=body))

    def consume(
        self,
        queue: str,
        tag: str = "t",
        sender: Address = C1,
        prefetch: int = 0,
        no_ack: bool = False,
    ) -> Any:
        return self.ok(Consume, sender, tag=tag, queue=queue, prefetch=prefetch, no_ack=no_ack)

    def got(self, sender: Address = C1, tag: str = "t") -> list[Any]:
        return [d[3] for d in self.deliveries.get((sender, tag), [])]

    def queue_stats(self, name: str) -> Any:
        (q,) = [q for q in self.core.stats().per_queue if q.name == name]
        return q


# -- declarations ---------------------------------------------------------------


def test_declarations_are_idempotent() -> None:
    h = Harness()
    assert h.ok(DeclareExchange, name="x", type="topic") == {"created": True}
    assert h.ok(DeclareExchange, name="x", type="topic") == {"created": False}
    assert h.queue("q")["created"] is True
    assert h.queue("q")["created"] is False
    assert h.ok(Bind, queue="q", exchange="x", key="a.*") == {"created": True}
    assert h.ok(Bind, queue="q", exchange="x", key="a.*") == {"created": False}
    assert h.ok(Unbind, queue="q", exchange="x", key="a.*") == {"deleted": True}
    assert h.ok(Unbind, queue="q", exchange="x", key="a.*") == {"deleted": False}
    assert h.core.stats().exchanges == 2 + len(SYSTEM_EXCHANGES)  # x, the default and the amq.* ones


# (request, fields, expected error code, text in the message)
ERROR_TABLE = [
    (
        DeclareExchange,
        {"name": "x", "type": "x-consistent-hash"},
        ErrorCode.BAD_REQUEST,
        "unknown exchange type 'x-consistent-hash'",
    ),
    (
        DeclareExchange,
        {"name": "x", "type": "fanout"},
        ErrorCode.PRECONDITION_FAILED,
        "exists with type 'direct'",
    ),
    (DeclareExchange, {"name": "", "type": "direct"}, ErrorCode.ACCESS_REFUSED, "reserved"),
    (DeclareExchange, {"name": "amq.mine", "type": "topic"}, ErrorCode.ACCESS_REFUSED, "reserved"),
    (DeclareExchange, {"name": "amq.topic", "type": "direct", "durable": True}, ErrorCode.PRECONDITION_FAILED,
     "exists with type 'topic'"),
    (DeclareExchange, {"name": "amq.topic", "type": "topic"}, ErrorCode.PRECONDITION_FAILED, "durable=True"),
    (DeleteExchange, {"name": "amq.direct"}, ErrorCode.ACCESS_REFUSED, "cannot be deleted"),
    (
        DeclareExchange,
        {"name": "y" * 256, "type": "topic"},
        ErrorCode.BAD_REQUEST,
        "longer than 255",
    ),
    (
        DeclareQueue,
        {"name": "q", "max_length": 5, "overflow": "drop-head"},
        ErrorCode.PRECONDITION_FAILED,
        "max_length=10",
    ),
    (
        DeclareQueue,
        {"name": "q", "max_length": 10, "overflow": "reject"},
        ErrorCode.PRECONDITION_FAILED,
        "overflow='drop-head'",
    ),
    (
        DeclareQueue,
        {"name": "r", "max_length": 10, "overflow": "drop-everything"},
        ErrorCode.BAD_REQUEST,
        "unknown overflow policy",
    ),
    (
        DeclareQueue,
        {"name": "r", "max_length": 0, "overflow": "drop-head"},
        ErrorCode.BAD_REQUEST,
        "max_length must be >= 1",
    ),
    *[
        (
            DeclareQueue,
            {"name": "e", "max_length": 10, "overflow": "drop-head", "arguments": {"x-expires": bad}},
            ErrorCode.BAD_REQUEST,
            "x-expires must be a positive integer",
        )
        for bad in (0, -1, "1000", 1.5)
    ],
    (
        DeclareQueue,
        {"name": "amq.gen-mine", "max_length": 10, "overflow": "drop-head"},
        ErrorCode.ACCESS_REFUSED,
        "reserved",
    ),
    (
        Bind,
        {"queue": "q", "exchange": "nope", "key": ""},
        ErrorCode.NOT_FOUND,
        "no exchange 'nope'",
    ),
    (Bind, {"queue": "nope", "exchange": "x", "key": ""}, ErrorCode.NOT_FOUND, "no queue 'nope'"),
    (
        Bind,
        {"queue": "q", "exchange": "", "key": "q"},
        ErrorCode.ACCESS_REFUSED,
        "default exchange",
    ),
    (Unbind, {"queue": "q", "exchange": "nope", "key": ""}, ErrorCode.NOT_FOUND, "no exchange"),
    (DeleteExchange, {"name": ""}, ErrorCode.ACCESS_REFUSED, "default exchange"),
    (PurgeQueue, {"name": "nope"}, ErrorCode.NOT_FOUND, "no queue"),
    (
        Consume,
        {"tag": "t", "queue": "nope", "prefetch": 0, "no_ack": False},
        ErrorCode.NOT_FOUND,
        "no queue",
    ),
]


@pytest.mark.parametrize(("make", "fields", "code", "text"), ERROR_TABLE)
def test_bad_requests_get_clear_errors_and_change_nothing(
    make: Any, fields: dict[str, Any], code: str, text: str
) -> None:
    h = Harness()
    h.ok(DeclareExchange, name="x", type="direct")
    h.queue("q", max_length=10)
    before = h.core.stats()
    got_code, message = h.err(make, **fields)
    assert got_code == code
    assert text in message
    assert h.core.stats() == before


def test_malformed_payloads_are_counted_and_answered_when_possible() -> None:
    h = Harness()
    junk = (
        None,
        5,
        [],
        ["nope"],
        ["p", 0, "x"],
        ["p", False, "", "q", 1],
        ["bind", 7, 1, 2, 3],
        b"\x00",
    )
    for payload in junk:
        h.core.receive(payload, PUB, 0.0)
    out = h.core.messages_to_send()
    assert h.core.stats().malformed == len(junk)
    # Only the one that carried a request id got an answer.
    assert [decode(o.payload).code for o in out] == [ErrorCode.BAD_REQUEST]  # type: ignore[union-attr]


def test_resent_request_is_answered_from_cache_not_redone() -> None:
    h = Harness()
    h.queue("q")
    req = Publish(rid=99, exchange="", routing_key="q", body=b"once")
    first = h.send(req)
    again = h.send(req)
    assert first == again == ["ok", 99, {"routed": 1}]
    assert h.queue_stats("q").ready == 1
    assert h.core.stats().resent_requests == 1


# -- routing through the broker -------------------------------------------------


def test_default_exchange_routes_by_queue_name() -> None:
    h = Harness()
    h.queue("orders")
    assert h.publish("", "orders", b"1", confirm=True) == ["ok", 1 + 1, {"routed": 1}]
    assert h.publish("", "nobody", b"2", confirm=True)[2] == {"routed": 0}  # type: ignore[index]
    s = h.core.stats()
    assert (s.published, s.unroutable, s.enqueued) == (2, 1, 1)


def test_topic_message_reaches_each_queue_once() -> None:
    h = Harness()
    h.ok(DeclareExchange, name="t", type="topic")
    for q in ("a", "b"):
        h.queue(q)
    for q, key in [("a", "stock.#"), ("a", "stock.ibm.*"), ("b", "*.ibm.nyse"), ("b", "bond.#")]:
        h.ok(Bind, queue=q, exchange="t", key=key)
    assert h.publish("t", "stock.ibm.nyse", b"m", confirm=True)[2] == {"routed": 2}  # type: ignore[index]
    assert (h.queue_stats("a").ready, h.queue_stats("b").ready) == (1, 1)


def test_the_system_exchanges_are_there_from_the_start_and_route_by_their_types() -> None:
    h = Harness()
    info = {e["name"]: (e["type"], e["durable"]) for e in h.core.exchanges_info()}
    assert {n: info[n] for n, _ in SYSTEM_EXCHANGES} == {n: (t.value, True) for n, t in SYSTEM_EXCHANGES}
    assert h.ok(DeclareExchange, name="amq.topic", type="topic", durable=True) == {"created": False}
    h.queue("q")
    h.ok(Bind, queue="q", exchange="amq.topic", key="stock.#")
    h.ok(Bind, queue="q", exchange="amq.direct", key="k")
    assert h.publish("amq.topic", "stock.ibm", b"t", confirm=True)[2] == {"routed": 1}  # type: ignore[index]
    assert h.publish("amq.direct", "k", b"d", confirm=True)[2] == {"routed": 1}  # type: ignore[index]
    assert h.publish("amq.direct", "other", b"x", confirm=True)[2] == {"routed": 0}  # type: ignore[index]
    assert h.queue_stats("q").ready == 2


def test_publish_to_unknown_exchange_is_an_error_even_unconfirmed() -> None:
    h = Harness()
    code, _ = h.err(Publish, exchange="nope", routing_key="k", body=1)
    assert code == ErrorCode.NOT_FOUND
    h.publish("nope", "k", 2)
    assert h.unsolicited[-1][2] == ErrorCode.NOT_FOUND
    assert h.core.stats().unroutable == 2


def test_delete_exchange_and_queue() -> None:
    h = Harness()
    h.ok(DeclareExchange, name="f", type="fanout")
    h.queue("q")
    h.ok(Bind, queue="q", exchange="f", key="")
    for i in range(3):
        h.publish("f", "", i)
    h.consume("q", prefetch=1)
    assert h.ok(DeleteQueue, name="q") == {"deleted": True, "messages": 3}
    assert h.cancelled and h.cancelled[0][1][0] == "x"
    assert h.core.stats().purged == 3
    assert h.publish("f", "", 9, confirm=True)[2] == {"routed": 0}  # type: ignore[index]
    assert h.ok(DeleteExchange, name="f") == {"deleted": True}
    assert h.ok(DeleteExchange, name="f") == {"deleted": False}
    assert h.ok(DeleteQueue, name="q") == {"deleted": False, "messages": 0}


def test_an_exclusive_consumer_keeps_the_cmq_protocols_consumers_off_its_queue() -> None:
    from cmq.routing._core import ExclusiveConsume, Refused

    h = Harness()
    h.queue("q")
    h.core.hold("amqp#1")
    channel = ("amqp#1", 1)
    h.core.call(ExclusiveConsume(rid=0, tag="x", queue="q", prefetch=0, no_ack=False), channel, h.now)
    code, text = h.err(Consume, C1, tag="t", queue="q", prefetch=0, no_ack=False)
    assert code == ErrorCode.ACCESS_REFUSED and "exclusive use" in text
    h.publish("", "q", b"m")
    assert h.ok(Get, queue="q", no_ack=True) is None  # a get is answered; the consumer had it
    h.core.release("amqp#1", h.now)  # its connection ends: the queue is free
    h.consume("q")
    with pytest.raises(Refused, match="exclusive use"):
        h.core.call(ExclusiveConsume(rid=0, tag="y", queue="q", prefetch=0, no_ack=False), channel, h.now)


def test_a_single_active_consumer_queue_hands_its_unacked_to_the_next_consumer() -> None:
    h = Harness()
    h.ok(DeclareQueue, name="s", max_length=10, overflow="drop-head", arguments={"x-single-active-consumer": True})
    h.consume("s", sender=C1)
    h.consume("s", sender=C2)
    for i in range(3):
        h.publish("", "s", b"%d" % i)
    assert (h.got(C1), h.got(C2)) == ([b"0", b"1", b"2"], [])
    h.ok(Cancel, C1, tag="t")  # unacknowledged: back to the queue, to the next one (redelivered)
    assert h.got(C2) == [b"0", b"1", b"2"]
    assert h.core.queue_options("s") == (10, "drop-head", {"x-single-active-consumer": True})
    code, _ = h.err(DeclareQueue, name="s", max_length=10, overflow="drop-head")
    assert code == ErrorCode.PRECONDITION_FAILED


# -- queues that go once unused (x-expires) --------------------------------------


def _expiring_queue(h: Harness, name: str = "e", ms: int = 1000) -> Any:
    return h.ok(DeclareQueue, name=name, max_length=10, overflow="drop-head", arguments={"x-expires": ms})


def test_a_queue_unused_for_its_x_expires_is_deleted_with_its_messages() -> None:
    h = Harness()
    _expiring_queue(h)
    h.publish("", "e", b"m")
    assert h.core.next_deadline() == 1.0
    h.advance(0.999)
    assert h.queue_stats("e").ready == 1
    h.advance(0.001)
    assert "e" not in {q.name for q in h.core.stats().per_queue}
    s = h.core.stats()
    assert (s.queues_expired, s.purged) == (1, 1)
    assert h.publish("", "e", b"late", confirm=True)[2] == {"routed": 0}  # type: ignore[index]


@pytest.mark.parametrize("keep_unacked", [False, True])  # True: AMQP's basic.cancel
def test_a_consumer_a_get_or_a_declare_is_a_use_and_publishing_is_not(keep_unacked: bool) -> None:
    h = Harness(consumer_timeout=1000.0)
    _expiring_queue(h)
    h.advance(0.5)
    h.publish("", "e", b"m")  # not a use
    assert h.core.next_deadline() == 1.0
    h.consume("e")
    h.advance(10.0)  # a consumer keeps it, however long
    assert h.queue_stats("e").consumers == 1
    h.ok(Cancel, C1, tag="t", keep_unacked=keep_unacked)  # unused from now: 10.5
    h.advance(0.9)
    assert h.queue_stats("e").consumers == 0
    h.ok(Get, queue="e", no_ack=True)  # 11.4
    h.advance(0.9)  # 12.3: past 11.5, kept by the get
    assert h.queue_stats("e").ready == 0
    assert _expiring_queue(h)["created"] is False  # declared again at 12.3
    h.advance(0.9)  # 13.2: past 12.4, kept by the declare
    assert h.core.next_deadline() == pytest.approx(13.3)
    h.advance(0.1)
    assert "e" not in {q.name for q in h.core.stats().per_queue}


def test_a_redeclaration_with_another_x_expires_is_refused() -> None:
    h = Harness()
    _expiring_queue(h, ms=1000)
    code, text = h.err(DeclareQueue, name="e", max_length=10, overflow="drop-head", arguments={"x-expires": 2000})
    assert code == ErrorCode.PRECONDITION_FAILED and "x-expires=1000" in text
    code, _ = h.err(DeclareQueue, name="e", max_length=10, overflow="drop-head")
    assert code == ErrorCode.PRECONDITION_FAILED


# -- bounded queues ------------------------------------------------------------


def test_drop_new_is_now_reject_publish_so_a_confirm_means_the_message_was_kept() -> None:
    """Reported: max_length=3, overflow="drop-new", five confirmed publishes
    all returned routed=1 and two were silently dropped."""
    h = Harness()
    h.queue("q", max_length=3, overflow="drop-new")
    replies = [h.publish("", "q", i, confirm=True) for i in range(5)]
    assert [r[0] for r in replies] == ["ok", "ok", "ok", "err", "err"]  # type: ignore[index]
    assert all(r[2] == ErrorCode.QUEUE_FULL for r in replies[3:])  # type: ignore[index]
    h.consume("q")
    assert h.got() == [0, 1, 2]
    assert h.queue_stats("q").rejected == 2
    assert h.queue_stats("q").overflow == "reject-publish"


@pytest.mark.parametrize("name", ["drop-head", "drop-old"])
def test_overflow_drop_head(name: str) -> None:
    h = Harness()
    h.queue("q", max_length=2, overflow=name)
    for i in range(5):
        h.publish("", "q", i)
    h.consume("q")
    assert h.got() == [3, 4]
    assert h.core.stats().dropped_old == 3


def test_overflow_reject_tells_the_publisher() -> None:
    h = Harness()
    h.ok(DeclareExchange, name="f", type="fanout")
    h.queue("small", max_length=1, overflow="reject")
    h.queue("big", max_length=100)
    for q in ("small", "big"):
        h.ok(Bind, queue=q, exchange="f", key="")
    assert h.publish("f", "", 0, confirm=True)[0] == "ok"  # type: ignore[index]
    reply = h.publish("f", "", 1, confirm=True)
    assert reply is not None and reply[:3] == ["err", reply[1], ErrorCode.QUEUE_FULL]
    assert "small" in reply[3]
    h.publish("f", "", 2)  # unconfirmed: told anyway, with rid 0
    assert h.unsolicited[-1][:3] == ["err", 0, ErrorCode.QUEUE_FULL]
    assert h.queue_stats("small").rejected == 2
    assert h.queue_stats("big").ready == 3  # other queues still take it


def test_every_message_is_accounted_for() -> None:
    h = Harness()
    h.ok(DeclareExchange, name="f", type="fanout")
    for name, policy in (("n", "drop-new"), ("o", "drop-head"), ("r", "reject-publish")):
        h.queue(name, max_length=3, overflow=policy)
        h.ok(Bind, queue=name, exchange="f", key="")
    for i in range(10):
        h.publish("f", "", i)
    for name in "nor":
        q = h.queue_stats(name)
        assert q.enqueued - q.dropped_old == q.ready == 3
        assert q.enqueued + q.rejected == 10


def _bytes_queue(h: Harness, name: str, max_bytes: int, overflow: str = "drop-head", max_length: int = 1000) -> None:
    h.ok(DeclareQueue, name=name, max_length=max_length, overflow=overflow,
         arguments={"x-max-length-bytes": max_bytes})  # fmt: skip


def _ready_bytes(h: Harness, name: str) -> int:
    """The byte sum the queue keeps, checked against its ready messages counted afresh."""
    ready = h.core._queues[name].ready
    assert ready.nbytes == _bytes_of(ready)  # type: ignore[attr-defined]
    return int(ready.nbytes)  # type: ignore[attr-defined]


def test_max_length_bytes_drops_the_oldest_until_the_ready_bodies_fit() -> None:
    """x-max-length-bytes with drop-head: the newcomer is taken and the
    oldest ready messages go, as many as it takes (more than one when the
    newcomer is bigger than each)."""
    h = Harness()
    _bytes_queue(h, "q", 10)
    for body in (b"aaaa", b"bbbb", b"cccc", b"dddd"):
        h.publish("", "q", body)
    assert _ready_bytes(h, "q") == 8
    h.publish("", "q", b"EEEEEEEEE")  # 9 bytes: only it fits
    assert _ready_bytes(h, "q") == 9
    assert h.queue_stats("q").dropped_old == 2 + 2
    h.consume("q")
    assert h.got() == [b"EEEEEEEEE"]


def test_a_message_bigger_than_the_byte_bound_alone_is_dropped_too() -> None:
    h = Harness()
    _bytes_queue(h, "q", 10)
    h.publish("", "q", b"aaaa")
    h.publish("", "q", b"x" * 11)
    assert h.queue_stats("q").ready == 0 and h.queue_stats("q").dropped_old == 2
    assert _ready_bytes(h, "q") == 0


def test_max_length_bytes_with_reject_publish_refuses_what_would_not_fit() -> None:
    h = Harness()
    _bytes_queue(h, "q", 10, overflow="reject-publish")
    replies = [h.publish("", "q", body, confirm=True) for body in (b"aaaa", b"bbbb", b"cccc", b"dd", b"e")]
    assert [r[0] for r in replies] == ["ok", "ok", "err", "ok", "err"]  # type: ignore[index]
    assert replies[2][2] == ErrorCode.QUEUE_FULL  # type: ignore[index]
    assert _ready_bytes(h, "q") == 10
    assert h.queue_stats("q").rejected == 2
    h.consume("q")
    assert h.got() == [b"aaaa", b"bbbb", b"dd"]


def test_max_length_and_max_length_bytes_whichever_comes_first() -> None:
    h = Harness()
    _bytes_queue(h, "q", 100, max_length=2)
    for body in (b"a", b"b", b"c"):
        h.publish("", "q", body)
    assert h.queue_stats("q").ready == 2  # the count bound came first
    h.publish("", "q", b"x" * 100)
    assert _ready_bytes(h, "q") == 100  # then the byte bound: "c" went too, not only "b"
    assert h.queue_stats("q").dropped_old == 3


def test_the_byte_bound_counts_ready_messages_only_and_follows_every_way_they_move() -> None:
    """Out with a consumer, a message no longer counts; requeued (a nack, a
    cancelled consumer) it counts again, and over the bound it is still
    taken back (as max_length's rule). Gets, purges and expiry take it off."""
    h = Harness()
    _bytes_queue(h, "q", 12)
    for body in (b"aaaa", b"bbbb", b"cccc"):
        h.publish("", "q", body)
    h.consume("q", prefetch=2)
    assert _ready_bytes(h, "q") == 4  # two out with the consumer
    for body in (b"dddd", b"eeee"):
        h.publish("", "q", body)
    assert _ready_bytes(h, "q") == 12
    tags = tuple(d[0] for d in h.deliveries[(C1, "t")])
    h.send(Nack(tag="t", delivery_tags=tags, requeue=True), C1)  # back at the head: 20 bytes ready
    got = len(h.got())
    h.ok(Cancel, C1, tag="t")
    assert h.queue_stats("q").dropped_old == 0
    assert _ready_bytes(h, "q") == 4 * h.queue_stats("q").ready
    assert h.ok(Get, queue="q", no_ack=True)[5] in (b"aaaa", b"bbbb", b"cccc")
    assert _ready_bytes(h, "q") == 4 * h.queue_stats("q").ready
    h.publish("", "q", b"ffff")  # over the bound now: the oldest go until it fits
    assert _ready_bytes(h, "q") <= 12
    assert h.ok(PurgeQueue, name="q")["messages"] >= 1
    assert _ready_bytes(h, "q") == 0
    assert got >= 2


def test_the_byte_bound_sees_messages_expire() -> None:
    h = Harness()
    h.ok(DeclareQueue, name="q", max_length=1000, overflow="drop-head",
         arguments={"x-max-length-bytes": 100, "x-message-ttl": 1000})  # fmt: skip
    h.publish("", "q", b"a" * 40)
    h.advance(0.6)
    h.publish("", "q", b"b" * 40)
    h.advance(0.6)  # the first expired
    assert h.queue_stats("q").expired == 1
    assert _ready_bytes(h, "q") == 40
    h.publish("", "q", b"c" * 60)
    assert h.queue_stats("q").dropped_old == 0  # 100 bytes: at the bound, not over it


def test_a_message_handed_straight_to_the_consumer_keeps_its_queues_ttl_when_requeued() -> None:
    h = Harness()
    h.ok(DeclareQueue, name="q", max_length=1000, overflow="drop-head", arguments={"x-message-ttl": 1000})
    h.consume("q", tag="a", prefetch=1)
    h.publish("", "q", b"m")  # one queue, one consumer with room: the latency path's case
    (first,) = h.deliveries[(C1, "a")]
    h.ok(Cancel, C1, tag="a")  # back to the queue, with its expiry
    h.advance(1.5)
    assert h.queue_stats("q").expired == 1
    assert first[3] == b"m"
    assert h.core.hand_over("", "q", b"n", h.now) is False  # nor may the AMQP front end's path take it


def test_the_front_ends_latency_path_hands_over_as_a_publish_would() -> None:
    h = Harness()
    h.queue("q")
    h.consume("q", tag="a")
    assert h.core.hand_over("", "q", b"x", h.now) is True
    h.collect()
    assert h.got(tag="a") == [b"x"]
    assert h.core.hand_over("", "missing", b"x", h.now) is False  # the usual path answers for it
    h.consume("q", tag="b")
    assert h.core.hand_over("", "q", b"y", h.now) is False  # two consumers: round robin decides
    stats = h.queue_stats("q")
    assert (stats.enqueued, stats.delivered, stats.unacked) == (1, 1, 1)


@pytest.mark.parametrize("bad", [-1, "10", 1.5, True])
def test_a_bad_max_length_bytes_is_refused(bad: Any) -> None:
    h = Harness()
    code, text = h.err(DeclareQueue, name="q", max_length=10, overflow="drop-head",
                       arguments={"x-max-length-bytes": bad})  # fmt: skip
    assert code == ErrorCode.BAD_REQUEST and "x-max-length-bytes" in text


def test_max_length_bytes_is_part_of_what_a_queue_was_declared_with() -> None:
    h = Harness()
    _bytes_queue(h, "q", 10)
    _bytes_queue(h, "q", 10)  # the same: idempotent
    assert h.core.queue_options("q") == (1000, "drop-head", {"x-max-length-bytes": 10})
    code, text = h.err(DeclareQueue, name="q", max_length=1000, overflow="drop-head")
    assert code == ErrorCode.PRECONDITION_FAILED and "x-max-length-bytes=10" in text
    code, _ = h.err(DeclareQueue, name="q", max_length=1000, overflow="drop-head",
                    arguments={"x-max-length-bytes": 11})  # fmt: skip
    assert code == ErrorCode.PRECONDITION_FAILED


def test_a_byte_bounded_queues_messages_change_only_through_the_counted_methods() -> None:
    h = Harness()
    _bytes_queue(h, "q", 10)
    ready = h.core._queues["q"].ready
    with pytest.raises(TypeError):
        ready.rotate(1)
    with pytest.raises(TypeError):
        ready.remove(None)  # type: ignore[arg-type]


def _priority_queue(h: Harness, name: str, top: int = 10, **more: Any) -> None:
    h.ok(DeclareQueue, name=name, max_length=more.pop("max_length", 1000), overflow=more.pop("overflow", "drop-head"),
         arguments={"x-max-priority": top, **more})  # fmt: skip


def _publish_p(h: Harness, q: str, body: Any, priority: int | None, confirm: bool = False) -> Any:
    props = None if priority is None else {"priority": priority}
    rid = next(h._rid) if confirm else 0
    return h.send(Publish(rid=rid, exchange="", routing_key=q, body=body, properties=props))


def test_a_priority_queue_hands_out_the_highest_priority_first_in_order_within_one() -> None:
    """x-max-priority: no priority is 0, above the queue's highest is its
    highest; the same priority keeps publish order."""
    h = Harness()
    _priority_queue(h, "q", top=5)
    for body, p in (("a", None), ("b", 3), ("c", 0), ("d", 9), ("e", 3), ("f", 5)):
        _publish_p(h, "q", body, p)
    got = [h.ok(Get, queue="q", no_ack=True)[5] for _ in range(6)]
    assert got == ["d", "f", "b", "e", "a", "c"]  # 9 counts as 5 and came first
    assert h.ok(Get, queue="q", no_ack=True) is None


def test_a_priority_queue_delivers_by_priority_to_a_consumer_as_its_credit_allows() -> None:
    h = Harness()
    _priority_queue(h, "q")
    h.consume("q", prefetch=1)
    for body, p in (("first", 1), ("low", 1), ("high", 8), ("mid", 4)):
        _publish_p(h, "q", body, p)
    assert h.got() == ["first"]  # taken at once: nothing was waiting
    for _ in range(3):
        tag = h.deliveries[(C1, "t")][-1][0]
        h.send(Ack(tag="t", delivery_tags=(tag,)), C1)
    assert h.got() == ["first", "high", "mid", "low"]


def test_a_requeued_message_goes_back_to_the_head_of_its_priority() -> None:
    h = Harness()
    _priority_queue(h, "q")
    for body, p in (("h1", 7), ("h2", 7), ("l1", 2)):
        _publish_p(h, "q", body, p)
    first = h.ok(Get, queue="q", no_ack=False)
    assert first[5] == "h1"
    h.send(Nack(tag=first[0], delivery_tags=(first[1],), requeue=True))
    assert [h.ok(Get, queue="q", no_ack=True)[5] for _ in range(3)] == ["h1", "h2", "l1"]


def test_a_full_priority_queue_drops_from_its_head_or_refuses_the_newcomer() -> None:
    """drop-head drops the head, the highest priority's oldest (RabbitMQ's
    priority queues do the same); reject-publish refuses the newcomer."""
    h = Harness()
    _priority_queue(h, "d", max_length=2)
    for body, p in (("low", 1), ("high", 9), ("new", 1)):
        _publish_p(h, "d", body, p)
    assert [h.ok(Get, queue="d", no_ack=True)[5] for _ in range(2)] == ["low", "new"]
    _priority_queue(h, "r", max_length=2, overflow="reject-publish")
    replies = [_publish_p(h, "r", body, p, confirm=True) for body, p in (("low", 1), ("high", 9), ("new", 5))]
    assert [r[0] for r in replies] == ["ok", "ok", "err"]
    assert [h.ok(Get, queue="r", no_ack=True)[5] for _ in range(2)] == ["high", "low"]


def test_a_priority_queue_with_a_byte_bound_counts_every_level() -> None:
    h = Harness()
    _priority_queue(h, "q", **{"x-max-length-bytes": 8})
    for body, p in ((b"aaaa", 1), (b"bbbb", 5), (b"cccc", 1)):
        _publish_p(h, "q", body, p)
    assert _ready_bytes(h, "q") == 8
    assert [h.ok(Get, queue="q", no_ack=True)[5] for _ in range(2)] == [b"aaaa", b"cccc"]  # bbbb, the head, went


def test_a_priority_queues_messages_expire_at_the_head() -> None:
    h = Harness()
    _priority_queue(h, "q", **{"x-message-ttl": 1000})
    _publish_p(h, "q", "old-high", 5)
    h.advance(0.5)
    _publish_p(h, "q", "low", 1)
    h.advance(0.6)
    assert h.queue_stats("q").expired == 1
    assert h.ok(Get, queue="q", no_ack=True)[5] == "low"


def test_a_refusal_in_a_priority_queue_looks_only_at_the_batchs_priority() -> None:
    """What a full reject-publish queue may refuse is the batch just
    enqueued, at the tail of its priority: never older messages of other
    priorities, however many of those wait."""
    from cmq.routing._core import _Meta, _newest, _PriorityReady

    ready = _PriorityReady(9)
    low = ("", "q", b"old", False, _Meta(None, (), {"priority": 1}))
    ready.extend([low] * 3)
    high = ("", "q", b"new", False, _Meta(None, (), {"priority": 9}))
    ready.append(high)
    assert _newest(ready, 1) == 1 and ready.pop() is high
    assert _newest(ready, 1) == 0  # the batch is gone (taken): nothing of it to refuse
    assert len(ready) == 3 and ready.nbytes == 9


@pytest.mark.parametrize("bad", [-1, 256, "5", 2.0])
def test_a_bad_x_max_priority_is_refused(bad: Any) -> None:
    h = Harness()
    code, text = h.err(DeclareQueue, name="q", max_length=10, overflow="drop-head",
                       arguments={"x-max-priority": bad})  # fmt: skip
    assert code == ErrorCode.BAD_REQUEST and "x-max-priority" in text


def test_x_max_priority_is_part_of_what_a_queue_was_declared_with() -> None:
    h = Harness()
    _priority_queue(h, "q", top=3)
    _priority_queue(h, "q", top=3)
    assert h.core.queue_options("q") == (1000, "drop-head", {"x-max-priority": 3})
    code, text = h.err(DeclareQueue, name="q", max_length=1000, overflow="drop-head")
    assert code == ErrorCode.PRECONDITION_FAILED and "x-max-priority=3" in text


def _e2e(h: Harness, dest: str, source: str, key: str = "", unbind: bool = False) -> Any:
    return h.core.call((ExchangeUnbind if unbind else ExchangeBind)(rid=0, destination=dest, source=source, key=key),
                       PUB, h.now)  # fmt: skip


def test_exchange_to_exchange_bindings_route_dead_letters_preview_and_show() -> None:
    h = Harness()
    h.ok(DeclareExchange, name="src", type="topic")
    h.ok(DeclareExchange, name="dest", type="fanout")
    h.ok(DeclareExchange, name="dlx", type="direct")
    assert _e2e(h, "dest", "src", "a.#") == {"created": True}
    assert _e2e(h, "dest", "src", "a.#") == {"created": False}
    h.queue("q")
    h.ok(Bind, queue="q", exchange="dest", key="")
    assert h.core.route_preview("src", "a.b") == ["q"]
    assert h.core.route_preview("src", "b") == []
    (info,) = [e for e in h.core.exchanges_info() if e["name"] == "src"]
    assert info["bindings"] == [("exchange:dest", "a.#")]
    # A dead letter goes through them too.
    _e2e(h, "src", "dlx", "dead")
    h.ok(DeclareQueue, name="short", max_length=1, overflow="drop-head",
         arguments={"x-dead-letter-exchange": "dlx", "x-dead-letter-routing-key": "dead"})  # fmt: skip
    h.publish("", "short", "first")
    h.publish("", "short", "second")  # pushes "first" out: dlx -> src (key "dead": no match)
    assert h.queue_stats("q").ready == 0
    _e2e(h, "dest", "dlx", "dead")
    h.publish("", "short", "third")
    assert h.queue_stats("q").ready == 1
    assert _e2e(h, "dest", "src", "a.#", unbind=True) == {"deleted": True}
    assert h.core.route_preview("src", "a.b") == []


def test_deleting_either_end_of_an_exchange_binding_forgets_it() -> None:
    h = Harness()
    for name, kind in (("a", "fanout"), ("b", "fanout"), ("c", "fanout")):
        h.ok(DeclareExchange, name=name, type=kind)
    _e2e(h, "b", "a")
    _e2e(h, "c", "b")
    h.ok(DeleteExchange, name="b")
    assert h.core._into == {}
    assert h.core.exchange_in_use("a") is False
    h.ok(DeclareExchange, name="b", type="fanout")
    h.queue("q")
    h.ok(Bind, queue="q", exchange="b", key="")
    assert h.core.route_preview("a", "") == []


@pytest.mark.parametrize(
    ("fields", "code"),
    [
        ({"destination": "nope", "source": "x"}, ErrorCode.NOT_FOUND),
        ({"destination": "x", "source": "nope"}, ErrorCode.NOT_FOUND),
        ({"destination": "x", "source": ""}, ErrorCode.ACCESS_REFUSED),
        ({"destination": "", "source": "x"}, ErrorCode.ACCESS_REFUSED),
    ],
)
def test_a_bad_exchange_binding_is_refused(fields: dict[str, str], code: str) -> None:
    from cmq.routing._core import Refused

    h = Harness()
    h.ok(DeclareExchange, name="x", type="direct")
    with pytest.raises(Refused) as info:
        h.core.call(ExchangeBind(rid=0, key="k", **fields), PUB, h.now)
    assert info.value.code == code


def test_no_queue_may_take_the_name_an_exchange_binding_uses() -> None:
    h = Harness()
    code, _ = h.err(DeclareQueue, name="\x00exchange:x", max_length=10, overflow="drop-head")
    assert code == ErrorCode.ACCESS_REFUSED


def test_consumer_priorities_round_robin_within_the_highest_with_credit() -> None:
    h = Harness()
    h.queue("q")
    C2: Address = ("127.0.0.1", 2002)
    h.consume("q", tag="low", prefetch=10)
    for tag, sender in (("a", C1), ("b", C2)):
        h.core.call(PriorityConsume(rid=0, tag=tag, queue="q", prefetch=2, no_ack=False, priority=5), sender, h.now)
    h.collect()
    for i in range(7):
        h.publish("", "q", i)
    assert sorted(h.got(C1, "a") + h.got(C2, "b")) == [0, 1, 2, 3]  # both of priority 5, two each
    assert len(h.got(C1, "a")) == len(h.got(C2, "b")) == 2
    assert h.got(C1, "low") == [4, 5, 6]  # only once both were full
    h.ok(Cancel, C1, tag="a")  # its two go back; b is full: the low one takes them
    assert sorted(h.got(C1, "low")) == sorted([4, 5, 6, *h.got(C1, "a")])


def _share(h: Harness, prefetch: int, sender: Address = C1) -> None:
    """AMQP's basic.qos with global, from ``sender`` (a channel)."""
    h.core.call(ChannelPrefetch(rid=0, prefetch=prefetch), sender, h.now)
    h.collect()


def _ack_first(h: Harness, tag: str, sender: Address = C1) -> None:
    first = h.deliveries[(sender, tag)][0][0]
    h.send(Ack(tag=tag, delivery_tags=(first,)), sender)


def test_a_shared_prefetch_bounds_a_senders_consumers_together_beside_their_own() -> None:
    h = Harness()
    for q in ("qa", "qb"):
        h.queue(q)
        for i in range(5):
            h.publish("", q, f"{q}{i}")
    _share(h, 3)
    h.consume("qa", tag="a", prefetch=2)
    h.consume("qb", tag="b", prefetch=2)
    h.consume("qb", tag="other", sender=C2)  # another channel: not bound by it
    assert h.got(tag="a") == ["qa0", "qa1"]  # its own two
    assert h.got(tag="b") == ["qb0"]  # what is left of the three
    assert h.got(C2, "other") == ["qb1", "qb2", "qb3", "qb4"]
    _ack_first(h, "a")  # room for one: a's queue goes first
    assert h.got(tag="a") == ["qa0", "qa1", "qa2"] and h.got(tag="b") == ["qb0"]
    _ack_first(h, "b")  # room for one, but a is full (two) and qb is empty
    assert h.got(tag="a") == ["qa0", "qa1", "qa2"]


def test_room_made_by_one_consumer_goes_to_another_queue_of_the_group() -> None:
    h = Harness()
    for q in ("qa", "qb"):
        h.queue(q)
    _share(h, 1)
    h.consume("qa", tag="a")
    h.consume("qb", tag="b")
    h.publish("", "qa", "a0")
    h.publish("", "qb", "b0")
    assert h.got(tag="a") == ["a0"] and h.got(tag="b") == []
    _ack_first(h, "a")  # a's queue is empty: b's takes the room
    assert h.got(tag="b") == ["b0"]
    h.send(Nack(tag="b", delivery_tags=(h.deliveries[(C1, "b")][0][0],), requeue=False), C1)
    h.publish("", "qa", "a1")
    assert h.got(tag="a") == ["a0", "a1"]


def test_a_shared_prefetch_is_raised_lifted_and_ends_with_its_sender() -> None:
    h = Harness()
    h.queue("q")
    h.consume("q", tag="a")
    h.consume("q", tag="b")
    _share(h, 2)  # consumers it has
    for i in range(6):
        h.publish("", "q", i)
    assert len(h.got(tag="a") + h.got(tag="b")) == 2
    _share(h, 3)  # raised: one more at once
    assert len(h.got(tag="a") + h.got(tag="b")) == 3
    _share(h, 0)  # lifted: the rest
    assert sorted(h.got(tag="a") + h.got(tag="b")) == [0, 1, 2, 3, 4, 5]
    _share(h, 1)
    h.core.release(C1[0], h.now)  # its connection ended
    assert h.core._groups == {}


def test_a_no_ack_consumer_and_a_cancelled_one_count_as_rabbitmq_counts_them() -> None:
    h = Harness()
    h.queue("q")
    h.queue("free")
    _share(h, 1)
    h.consume("free", tag="n", no_ack=True)
    for i in range(3):
        h.publish("", "free", i)
    assert h.got(tag="n") == [0, 1, 2]  # no_ack: no limit applies
    h.consume("q", tag="a")
    h.publish("", "q", "x")
    h.publish("", "q", "y")
    assert h.got(tag="a") == ["x"]
    h.ok(Cancel, C1, tag="a")  # detached: its message goes back, the room with it
    h.consume("q", tag="b")
    assert h.got(tag="b") == ["x"]


def test_deliveries_in_doubt_go_back_to_their_queue_at_once_marked_redelivered() -> None:
    h = Harness(ack_timeout=3600.0)
    h.queue("q")
    h.consume("q", tag="a", prefetch=2)
    for i in range(3):
        h.publish("", "q", i)
    first = h.deliveries.pop((C1, "a"))
    assert [d[3] for d in first] == [0, 1]  # the window is full
    # The delivery message as the broker sent it: the endpoint gave up on it
    # (the consumer's endpoint restarted).
    sent = [["d", "a", [[d[0], d[1], d[2], d[4], [d[3]]] for d in first]]]
    assert h.core.deliveries_in_doubt(C1, sent, h.now) == 2
    h.collect()
    assert h.got(tag="a") == [0, 1]  # sent again, the window free again
    assert all(d[4] for d in h.deliveries[(C1, "a")])  # marked redelivered
    assert h.core.deliveries_in_doubt(C1, sent, h.now) == 0  # what was settled since is not taken twice
    assert h.core.deliveries_in_doubt(C2, sent, h.now) == 0  # nor another address's
    assert h.core.deliveries_in_doubt(C1, [["x", "a"], "junk", ["d", "nobody", []]], h.now) == 0
    assert h.core.stats().requeued_in_doubt == 2


# -- consumers -------------------------------------------------------------------


def test_round_robin_and_prefetch_window() -> None:
    h = Harness()
    h.queue("q")
    h.consume("q", tag="a", prefetch=2)
    h.consume("q", tag="b", prefetch=2)
    for i in range(6):
        h.publish("", "q", i)
    assert h.got(tag="a") == [0, 2]
    assert h.got(tag="b") == [1, 3]
    assert h.queue_stats("q").ready == 2
    first = h.deliveries[(C1, "a")][0][0]
    h.send(Ack(tag="a", delivery_tags=(first,)), C1)
    assert h.got(tag="a") == [0, 2, 4]


def test_deliveries_are_batched_per_consumer() -> None:
    h = Harness(batch_count=4)
    h.queue("q")
    h.consume("q", no_ack=True)
    for i in range(10):
        h.core.receive(encode(Publish(rid=0, exchange="", routing_key="q", body=i)), PUB, 0.0)
    out = h.core.messages_to_send()
    assert [len(bodies_of(o.payload)) for o in out] == [4, 4, 2]
    assert [b for o in out for b in bodies_of(o.payload)] == list(range(10))
    # One run per message: the ten share exchange and key, their tags follow on.
    assert [len(o.payload[2]) for o in out] == [1, 1, 1]
    assert [o.payload[2][0][0] for o in out] == [1, 5, 9]


def test_a_batch_publish_is_routed_and_delivered_as_runs() -> None:
    h = Harness()
    h.ok(DeclareExchange, name="x", type="direct")
    h.queue("q", max_length=3, overflow="reject")
    h.ok(Bind, queue="q", exchange="x", key="k")
    reply = h.send(PublishBatch(rid=0, exchange="x", routing_key="k", bodies=(1, 2)))
    assert reply is None and h.queue_stats("q").ready == 2
    # Two more for a queue with room for one: one refused, and the publisher told.
    h.send(PublishBatch(rid=0, exchange="x", routing_key="k", bodies=(3, 4)))
    assert [u[2] for u in h.unsolicited] == ["queue-full"]
    assert "1 of 2" in h.unsolicited[0][3]
    q = h.queue_stats("q")
    assert (q.ready, q.enqueued, q.rejected) == (3, 3, 1)
    h.consume("q", prefetch=2)
    assert h.got() == [1, 2]
    assert h.core.stats().published == 4


def test_a_batch_to_an_idle_consumer_is_bounded_by_its_credit() -> None:
    # An empty queue with one consumer: what its credit covers is handed over
    # at once, the rest waits in the queue, and the counters add up either way.
    h = Harness()
    h.queue("q", max_length=2, overflow="reject")
    h.consume("q", prefetch=3)
    h.send(PublishBatch(rid=0, exchange="", routing_key="q", bodies=(1, 2)))
    assert h.got() == [1, 2]
    h.send(PublishBatch(rid=0, exchange="", routing_key="q", bodies=(3, 4, 5, 6)))
    assert h.got() == [1, 2, 3]
    q = h.queue_stats("q")
    assert (q.ready, q.unacked, q.delivered, q.enqueued, q.rejected) == (2, 3, 3, 5, 1)
    assert [u[2] for u in h.unsolicited] == ["queue-full"]


def test_delivery_batches_are_bounded_in_bytes() -> None:
    h = Harness(batch_count=100, batch_bytes=1000)
    h.queue("q")
    h.consume("q", no_ack=True)
    for size in (400, 400, 400, 5000, 10):
        h.core.receive(
            encode(Publish(rid=0, exchange="", routing_key="q", body=b"x" * size)), PUB, 0.0
        )
    out = h.core.messages_to_send()
    assert [[len(b) for b in bodies_of(o.payload)] for o in out] == [[400, 400], [400], [5000], [10]]


def test_vanished_consumer_stops_receiving_and_messages_wait() -> None:
    h = Harness(consumer_timeout=5.0)
    h.queue("q")
    h.consume("q", tag="t", sender=C1, prefetch=10)
    h.publish("", "q", "in-flight")
    assert h.got() == ["in-flight"]
    h.advance(4.9)
    assert h.core.stats().consumers == 1
    h.advance(0.2)  # 5.1 s of silence
    s = h.core.stats()
    assert (s.consumers, s.consumers_expired) == (0, 1)
    h.publish("", "q", "later")
    assert h.got() == ["in-flight"]  # nothing more to the vanished consumer
    assert h.queue_stats("q").ready == 2  # kept, including the unacked one
    # It comes back: its heartbeat re-attaches it and it gets everything.
    h.send(Heartbeat(consumers=(ConsumerSpec(tag="t", queue="q", prefetch=10, no_ack=False),)), C1)
    got = h.deliveries[(C1, "t")]
    assert [d[3] for d in got] == ["in-flight", "in-flight", "later"]
    assert [d[4] for d in got] == [False, True, False]  # the redelivered flag
    assert h.core.stats().consumers_reattached == 1


def test_acks_from_before_a_detach_never_ack_new_deliveries() -> None:
    h = Harness(consumer_timeout=1.0)
    h.queue("q")
    h.consume("q", prefetch=10)
    for i in range(2):
        h.publish("", "q", i)
    old_tags = [d[0] for d in h.deliveries[(C1, "t")]]
    h.advance(1.5)  # detached; both messages back in the queue
    h.send(Heartbeat(consumers=(ConsumerSpec(tag="t", queue="q", prefetch=10, no_ack=False),)), C1)
    h.send(Ack(tag="t", delivery_tags=tuple(old_tags)), C1)  # late acks of the old deliveries
    q = h.queue_stats("q")
    assert (q.acked, q.unacked) == (0, 2)  # the redeliveries are still owed an ack
    assert h.core.stats().stale_acks == 2


def test_heartbeats_keep_a_consumer() -> None:
    h = Harness(consumer_timeout=1.0)
    h.queue("q")
    h.consume("q")
    spec = ConsumerSpec(tag="t", queue="q", prefetch=0, no_ack=False)
    for _ in range(100):
        h.advance(0.5)
        h.send(Heartbeat(consumers=(spec,)), C1)
    assert h.core.stats().consumers_expired == 0


def test_lost_consumer_messages_go_to_the_others() -> None:
    h = Harness(consumer_timeout=1.0)
    h.queue("q")
    h.consume("q", tag="a", sender=C1, prefetch=1)
    h.consume("q", tag="b", sender=C2, prefetch=1)
    for i in range(2):
        h.publish("", "q", i)
    spec_b = ConsumerSpec(tag="b", queue="q", prefetch=1, no_ack=False)
    h.advance(0.6)
    h.send(Heartbeat(consumers=(spec_b,)), C2)
    h.send(Ack(tag="b", delivery_tags=(h.deliveries[(C2, "b")][0][0],)), C2)
    h.advance(0.6)  # a is silent for 1.2 s: its message 0 moves to b
    assert h.got(sender=C2, tag="b") == [1, 0]


def test_unacked_delivery_is_redelivered_after_ack_timeout() -> None:
    h = Harness(consumer_timeout=100.0, ack_timeout=2.0)
    h.queue("q")
    h.consume("q", prefetch=5)
    h.publish("", "q", "lost on the wire")
    h.advance(1.0)
    assert h.got() == ["lost on the wire"]
    h.advance(1.5)
    assert h.got() == ["lost on the wire"] * 2
    s = h.queue_stats("q")
    assert (s.redelivered, s.unacked) == (1, 1)
    h.send(Ack(tag="t", delivery_tags=(1, 2)), C1)  # the first tag is stale now
    assert h.core.stats().stale_acks == 1
    assert h.queue_stats("q").unacked == 0


def test_cancel_requeues_and_is_idempotent() -> None:
    h = Harness()
    h.queue("q")
    h.consume("q", prefetch=3)
    for i in range(3):
        h.publish("", "q", i)
    assert h.ok(Cancel, C1, tag="t") == {"cancelled": True}
    assert h.ok(Cancel, C1, tag="t") == {"cancelled": False}
    assert h.queue_stats("q").ready == 3


def test_consumer_tag_in_use_on_another_queue() -> None:
    h = Harness()
    h.queue("q")
    h.queue("r")
    h.consume("q")
    h.consume("q")  # the same again is fine
    code, _ = h.err(Consume, C1, tag="t", queue="r", prefetch=0, no_ack=False)
    assert code == ErrorCode.IN_USE


def test_heartbeat_for_deleted_queue_cancels_consumer() -> None:
    h = Harness()
    h.send(
        Heartbeat(consumers=(ConsumerSpec(tag="t", queue="gone", prefetch=0, no_ack=False),)), C1
    )
    assert h.cancelled == [(C1, ["x", "t", ErrorCode.NOT_FOUND, "no queue 'gone'"])]


def test_stats_reply_is_plain_values() -> None:
    h = Harness()
    h.queue("q")
    result = h.ok(GetStats)
    assert result["queues"] == 1 and result["per_queue"][0]["name"] == "q"


@pytest.mark.parametrize(
    "config",
    [
        {"consumer_timeout": 0},
        {"ack_timeout": -1},
        {"batch_count": 0},
        {"batch_bytes": 0},
        {"reply_cache": -1},
        {"spin": -1e-6},
        {"spin": 1.0},
    ],
)
def test_config_is_validated(config: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        BrokerConfig(**config)


def test_the_latency_path_counts_and_tracks_what_the_general_path_does() -> None:
    """A publish handed straight to an idle queue's one consumer (the
    latency path) and publishes that take the general way (more than one
    in a turn, or a busy queue) leave the same counters, tags and unacked
    entries behind."""
    h = Harness()
    h.queue("q")
    h.consume("q", prefetch=2)
    h.publish("", "q", "one")  # handed over: idle queue, one consumer with credit
    for body in ("two", "three"):  # in one turn: the second waits for credit
        h.core.receive(encode(Publish(rid=0, exchange="", routing_key="q", body=body)), PUB, h.now)
    h.collect()
    assert h.got() == ["one", "two"]
    s = h.core.stats()
    q = h.queue_stats("q")
    assert (s.published, s.enqueued, s.delivered) == (3, 3, 2)
    assert (q.enqueued, q.delivered, q.ready, q.unacked) == (3, 2, 1, 2)
    tags = [d[0] for d in h.deliveries[(C1, "t")]]
    assert tags == [tags[0], tags[0] + 1]
    # Acking the handed-over one frees credit for the third, as any ack does.
    h.send(Ack(tag="t", delivery_tags=(tags[0],)), C1)
    assert h.got() == ["one", "two", "three"]
    assert h.core.stats().acked == 1


def test_headers_exchange_on_the_cmq_protocol() -> None:
    h = Harness()
    h.ok(DeclareExchange, name="hx", type="headers")
    for q, args in (("all", {"x-match": "all", "a": 1, "b": "x"}), ("any", {"x-match": "any", "a": 1, "b": "x"})):
        h.ok(DeclareQueue, name=q, max_length=10, overflow="drop-head")
        assert h.ok(Bind, queue=q, exchange="hx", key="", arguments=args) == {"created": True}
    assert h.ok(Bind, queue="all", exchange="hx", key="", arguments={"x-match": "all", "a": 1, "b": "x"}) == {
        "created": False}  # fmt: skip
    code, text = h.err(Bind, queue="all", exchange="hx", key="", arguments={"x-match": "some"})
    assert code == ErrorCode.PRECONDITION_FAILED and "x-match" in text
    for i, headers in enumerate(({"a": 1, "b": "x"}, {"a": 1}, {"c": 1})):
        h.send(Publish(rid=0, exchange="hx", routing_key="", body=i, properties={"headers": headers}))
    h.consume("all", tag="all")
    h.consume("any", tag="any")
    assert (h.got(C1, "all"), h.got(C1, "any")) == ([0], [0, 1])
    assert h.ok(Unbind, queue="any", exchange="hx", key="", arguments={"x-match": "any", "a": 1, "b": "x"}) == {
        "deleted": True}  # fmt: skip
