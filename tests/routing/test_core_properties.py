"""Properties of the sans-IO broker under random schedules (virtual time).

Invariant: every message a queue took is, at any moment, in exactly one place:
ready, out with a consumer unacknowledged, acknowledged, or dropped (drop-old
or purge). Nothing vanishes, whatever consumers come, go silent, or ack late.
And a consumer that acks everything eventually gets every message at least once.
"""

from __future__ import annotations

from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from cmq.routing._core import Address, BrokerConfig, BrokerCore
from cmq.routing._protocol import (
    DELIVERY_MAILBOX,
    Ack,
    Cancel,
    Consume,
    ConsumerSpec,
    DeclareQueue,
    Heartbeat,
    Publish,
    PublishBatch,
    PurgeQueue,
    encode,
)

CLIENTS: list[Address] = [("127.0.0.1", 3000 + i) for i in range(3)]


class BrokerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.core = BrokerCore(BrokerConfig(consumer_timeout=1.0, ack_timeout=3.0))
        self.now = 0.0
        self.next_body = 0
        self.published: set[int] = set()
        self.seen: set[int] = set()
        # (client, tag) -> delivery tags received and not yet acked
        self.held: dict[tuple[Address, str], list[int]] = {}
        self.attached: dict[tuple[Address, str], ConsumerSpec] = {}
        self.core.receive(
            encode(DeclareQueue(rid=1, name="q", max_length=5, overflow="drop-old")),
            CLIENTS[0],
            0.0,
        )
        self.collect()

    def collect(self) -> None:
        for o in self.core.messages_to_send():
            if o.mailbox == DELIVERY_MAILBOX and o.payload[0] == "d":
                key = (o.dest, o.payload[1])
                for first, _, _, _, bodies in o.payload[2]:
                    for i, body in enumerate(bodies):
                        self.held.setdefault(key, []).append(first + i)
                        self.seen.add(body)

    @rule(n=st.integers(min_value=1, max_value=8))
    def publish_batch(self, n: int) -> None:
        bodies = tuple(range(self.next_body, self.next_body + n))
        self.next_body += n
        self.published.update(bodies)
        self.core.receive(
            encode(PublishBatch(rid=0, exchange="", routing_key="q", bodies=bodies)),
            CLIENTS[0],
            self.now,
        )
        self.collect()

    @rule(n=st.integers(min_value=1, max_value=4))
    def publish(self, n: int) -> None:
        for _ in range(n):
            body = self.next_body
            self.next_body += 1
            self.published.add(body)
            self.core.receive(
                encode(Publish(rid=0, exchange="", routing_key="q", body=body)),
                CLIENTS[0],
                self.now,
            )
        self.collect()

    @rule(
        client=st.sampled_from(CLIENTS), tag=st.sampled_from(["a", "b"]), prefetch=st.integers(0, 3)
    )
    def consume(self, client: Address, tag: str, prefetch: int) -> None:
        key = (client, tag)
        spec = self.attached.get(key) or ConsumerSpec(
            tag=tag, queue="q", prefetch=prefetch, no_ack=False
        )
        self.core.receive(
            encode(Consume(rid=0, tag=tag, queue="q", prefetch=spec.prefetch, no_ack=False)),
            client,
            self.now,
        )
        self.attached[key] = spec
        self.collect()

    @precondition(lambda self: any(self.held.values()))
    @rule(data=st.data())
    def ack_some(self, data: Any) -> None:
        key = data.draw(st.sampled_from(sorted(k for k, v in self.held.items() if v)))
        tags = self.held[key]
        k = data.draw(st.integers(1, len(tags)))
        acked, self.held[key] = tags[:k], tags[k:]
        self.core.receive(encode(Ack(tag=key[1], delivery_tags=tuple(acked))), key[0], self.now)
        self.collect()

    @precondition(lambda self: bool(self.attached))
    @rule(data=st.data())
    def heartbeat(self, data: Any) -> None:
        key = data.draw(st.sampled_from(sorted(self.attached)))
        self.core.receive(encode(Heartbeat(consumers=(self.attached[key],))), key[0], self.now)
        self.collect()

    @precondition(lambda self: bool(self.attached))
    @rule(data=st.data())
    def cancel(self, data: Any) -> None:
        key = data.draw(st.sampled_from(sorted(self.attached)))
        del self.attached[key]
        self.held.pop(key, None)
        self.core.receive(encode(Cancel(rid=0, tag=key[1])), key[0], self.now)
        self.collect()

    @rule(dt=st.sampled_from([0.1, 0.5, 1.5, 4.0]))
    def advance(self, dt: float) -> None:
        self.now += dt
        deadline = self.core.next_deadline()
        if deadline is not None and deadline <= self.now:
            self.core.handle_timer(self.now)
        self.collect()

    @rule()
    def purge(self) -> None:
        self.core.receive(encode(PurgeQueue(rid=0, name="q")), CLIENTS[0], self.now)
        self.collect()

    @invariant()
    def every_message_is_somewhere(self) -> None:
        (q,) = self.core.stats().per_queue
        assert q.enqueued == q.ready + q.unacked + q.acked + q.dropped_old + q.purged
        assert q.rejected == 0

    @invariant()
    def nothing_unknown_is_delivered(self) -> None:
        assert self.seen <= self.published

    def teardown(self) -> None:
        # Drain: one live consumer that acks everything gets every message
        # still in the queue (at least once).
        self.now += 10.0
        self.core.handle_timer(self.now)  # everyone else is silent by now
        self.collect()
        me: Address = ("127.0.0.1", 9999)
        self.core.receive(
            encode(Consume(rid=0, tag="drain", queue="q", prefetch=0, no_ack=False)), me, self.now
        )
        self.collect()
        s = self.core.stats().per_queue[0]
        assert s.ready == 0
        # Each message was seen by a consumer or its drop was counted.
        assert len(self.published) <= len(self.seen) + s.dropped_old + s.purged


TestBrokerMachine = BrokerMachine.TestCase
TestBrokerMachine.settings = settings(max_examples=100, stateful_step_count=30, deadline=None)
