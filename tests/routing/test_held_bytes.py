"""The broker's count of the bytes it holds (its memory budget's measure) under random schedules.

Invariant: ``BrokerCore.held_bytes()``, kept per queue as messages come and
go, always equals a recount of the bodies that are ready or out with a
consumer unacknowledged, whatever is published, consumed (with or without
acks), rejected, expired, dead-lettered, purged or deleted.
"""

from __future__ import annotations

from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from cmq.routing._core import Address, BrokerConfig, BrokerCore
from cmq.routing._protocol import (
    DELIVERY_MAILBOX,
    REPLY_MAILBOX,
    Ack,
    Bind,
    Cancel,
    Consume,
    DeclareExchange,
    DeclareQueue,
    DeleteQueue,
    Get,
    Nack,
    Publish,
    PublishBatch,
    PurgeQueue,
    encode,
)

CLIENTS: list[Address] = [("127.0.0.1", 3000 + i) for i in range(2)]
QUEUES = ["q", "dead"]


def recount(core: BrokerCore) -> int:
    total = 0
    for q in core._queues.values():
        total += sum(len(m[2]) for m in q.ready)
    for c in core._consumers.values():
        if core._queues.get(c.queue.name) is c.queue:
            total += sum(len(m[2]) for m, _ in c.unacked.values())
    return total


class HeldBytesMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.core = BrokerCore(BrokerConfig(consumer_timeout=1.0, ack_timeout=3.0))
        self.now = 0.0
        self.held: dict[tuple[Address, str], list[int]] = {}
        self.got: list[tuple[Address, str, int]] = []  # basic.get holders: (client, tag, delivery tag)
        self.declare()

    def send(self, event: Any, client: Address = CLIENTS[0]) -> Any:
        self.core.receive(encode(event), client, self.now)
        reply = None
        for o in self.core.messages_to_send():
            if o.mailbox == DELIVERY_MAILBOX and o.payload[0] == "d":
                for run in o.payload[2]:
                    self.held.setdefault((o.dest, o.payload[1]), []).extend(
                        run[0] + i for i in range(len(run[4])))  # fmt: skip
            elif o.mailbox == REPLY_MAILBOX and o.payload[1]:
                reply = o.payload
        return reply

    def declare(self) -> None:
        self.send(DeclareExchange(rid=1, name="dlx", type="fanout"))
        self.send(DeclareQueue(rid=2, name="dead", max_length=4, overflow="drop-head"))
        self.send(Bind(rid=3, queue="dead", exchange="dlx", key=""))
        self.send(DeclareQueue(rid=4, name="q", max_length=5, overflow="reject-publish-dlx",
                               arguments={"x-dead-letter-exchange": "dlx", "x-message-ttl": 2000}))  # fmt: skip

    @rule(sizes=st.lists(st.integers(0, 300), min_size=1, max_size=6), batch=st.booleans(),
          ttl=st.sampled_from([None, 0, 500]))  # fmt: skip
    def publish(self, sizes: list[int], batch: bool, ttl: int | None) -> None:
        bodies = tuple(b"x" * n for n in sizes)
        if batch:
            self.send(PublishBatch(rid=0, exchange="", routing_key="q", bodies=bodies, expiration=ttl))
        else:
            for b in bodies:
                self.send(Publish(rid=0, exchange="", routing_key="q", body=b, expiration=ttl))

    @rule(client=st.sampled_from(CLIENTS), queue=st.sampled_from(QUEUES), prefetch=st.integers(0, 3),
          no_ack=st.booleans())  # fmt: skip
    def consume(self, client: Address, queue: str, prefetch: int, no_ack: bool) -> None:
        self.send(Consume(rid=0, tag=queue, queue=queue, prefetch=prefetch, no_ack=no_ack), client)

    @rule(client=st.sampled_from(CLIENTS), queue=st.sampled_from(QUEUES), no_ack=st.booleans())
    def get(self, client: Address, queue: str, no_ack: bool) -> None:
        reply = self.send(Get(rid=9, queue=queue, no_ack=no_ack), client)
        if reply is not None and reply[0] == "ok" and reply[2] is not None and not no_ack:
            self.got.append((client, reply[2][0], reply[2][1]))

    @precondition(lambda self: any(self.held.values()) or self.got)
    @rule(data=st.data(), how=st.sampled_from(["ack", "requeue", "reject"]))
    def settle(self, data: Any, how: str) -> None:
        options = [(k[0], k[1], t) for k, v in self.held.items() for t in v] + self.got
        client, tag, dtag = data.draw(st.sampled_from(sorted(options)))
        if (client, tag, dtag) in self.got:
            self.got.remove((client, tag, dtag))
        else:
            self.held[(client, tag)].remove(dtag)
        if how == "ack":
            self.send(Ack(tag=tag, delivery_tags=(dtag,)), client)
        else:
            self.send(Nack(tag=tag, delivery_tags=(dtag,), requeue=how == "requeue"), client)

    @rule(client=st.sampled_from(CLIENTS), queue=st.sampled_from(QUEUES), keep=st.booleans())
    def cancel(self, client: Address, queue: str, keep: bool) -> None:
        self.send(Cancel(rid=0, tag=queue, keep_unacked=keep), client)

    @rule(dt=st.sampled_from([0.1, 0.6, 1.5, 4.0]))
    def advance(self, dt: float) -> None:
        self.now += dt
        deadline = self.core.next_deadline()
        if deadline is not None and deadline <= self.now:
            self.core.handle_timer(self.now)
        self.send(PurgeQueue(rid=0, name="none"))  # collects what the timer made

    @rule(queue=st.sampled_from(QUEUES))
    def purge(self, queue: str) -> None:
        self.send(PurgeQueue(rid=0, name=queue))

    @rule()
    def delete_and_declare_again(self) -> None:
        self.send(DeleteQueue(rid=5, name="q"))
        self.declare()

    @invariant()
    def held_bytes_is_the_recount(self) -> None:
        assert self.core.held_bytes() == recount(self.core)


TestHeldBytes = HeldBytesMachine.TestCase
TestHeldBytes.settings = settings(max_examples=100, stateful_step_count=30, deadline=None)
