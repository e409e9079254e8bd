"""The broker's latency path (``BrokerCore.receive_at_once``) against the usual one.

The driver hands what it reads to ``receive_at_once``, which gives back the
delivery of a publish handed straight to its consumer and receives anything
else as ``receive`` does. Whatever the schedule, a core driven that way must
send exactly what a core driven through ``receive`` alone sends and keep
the same books.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from cmq.routing._core import Address, BrokerConfig, BrokerCore, Outgoing
from cmq.routing._protocol import (
    DELIVERY_MAILBOX,
    Ack,
    Bind,
    Cancel,
    Consume,
    DeclareExchange,
    DeclareQueue,
    encode,
)

PUB: Address = ("127.0.0.1", 1000)
CLIENTS: list[Address] = [("127.0.0.1", 2000 + i) for i in range(2)]
QUEUES = ("q1", "q2", "qttl")
KEYS = ("a", "b", "both", "t", "none")
_BODIES = st.one_of(
    st.binary(max_size=40),
    st.text(max_size=5),
    st.integers(-5, 5),
    st.none(),
    st.lists(st.integers(0, 3), max_size=2),  # not opaque: never the latency path's
)
_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("publish"), st.sampled_from(("x", "", "missing")), st.sampled_from(KEYS), _BODIES),
        st.tuples(
            st.just("consume"), st.integers(0, 3), st.sampled_from(QUEUES), st.sampled_from((0, 1, 2, 256)), st.booleans()
        ),
        st.tuples(st.just("cancel"), st.integers(0, 3)),
        st.tuples(st.just("ack"), st.integers(0, 3), st.integers(1, 3)),
        st.tuples(st.just("advance"), st.sampled_from((0.001, 0.5, 2.0))),
    ),
    max_size=40,
)


def _setup(core: BrokerCore) -> None:
    rid = iter(range(1, 100))
    core.receive(encode(DeclareExchange(rid=next(rid), name="x", type="direct")), PUB, 0.0)
    core.receive(encode(DeclareQueue(rid=next(rid), name="q1", max_length=4, overflow="drop-head")), PUB, 0.0)
    core.receive(encode(DeclareQueue(rid=next(rid), name="q2", max_length=100, overflow="drop-head")), PUB, 0.0)
    core.receive(encode(DeclareQueue(rid=next(rid), name="qttl", max_length=100, overflow="drop-head",
                                     arguments={"x-message-ttl": 1000})), PUB, 0.0)  # fmt: skip
    for queue, key in (("q1", "a"), ("q1", "both"), ("q2", "b"), ("q2", "both"), ("qttl", "t")):
        core.receive(encode(Bind(rid=next(rid), queue=queue, exchange="x", key=key)), PUB, 0.0)
    core.messages_to_send()


class _Side:
    """One core and what its consumers were sent and have not acknowledged."""

    def __init__(self, latency: bool) -> None:
        # A small memory budget, so that a hand-over can raise the alarm.
        self.core = BrokerCore(BrokerConfig(consumer_timeout=1.0, ack_timeout=1.5, memory_budget=300))
        self.latency = latency
        self.taken = 0
        _setup(self.core)

    def publish(self, payload: list[Any], now: float) -> list[Outgoing]:
        core = self.core
        if self.latency:
            o = core.receive_at_once(payload, PUB, now)
            core.turn_memory()
            if o is not None:
                self.taken += 1
                # The driver sends it alone: nothing else may be waiting.
                assert not core._out and not core._with_pending
                return [o]
        else:
            core.receive(payload, PUB, now)
            core.turn_memory()
        return core.messages_to_send()


def _tags(out: list[Outgoing], held: dict[tuple[Address, str], list[int]]) -> None:
    for o in out:
        if o.mailbox == DELIVERY_MAILBOX and o.payload[0] == "d":
            for run in o.payload[2]:
                held.setdefault((o.dest, o.payload[1]), []).extend(range(run[0], run[0] + len(run[4])))


@settings(max_examples=300, deadline=None)
@given(ops=_OPS)
def test_the_latency_path_sends_and_keeps_what_the_usual_one_does(ops: list[tuple[Any, ...]]) -> None:
    fast, usual = _Side(latency=True), _Side(latency=False)
    held: dict[tuple[Address, str], list[int]] = {}
    now = 0.0
    rid = 1000
    for op in ops:
        if op[0] == "publish":
            _, exchange, key, body = op
            payload = ["p", 0, exchange, key, body]
            out = fast.publish(list(payload), now)
            assert out == usual.publish(list(payload), now)
        else:
            if op[0] == "advance":
                now += op[1]
                events: list[tuple[Any, Address]] = []
            elif op[0] == "consume":
                _, n, queue, prefetch, no_ack = op
                rid += 1
                events = [(Consume(rid=rid, tag=f"t{n}", queue=queue, prefetch=prefetch, no_ack=no_ack), CLIENTS[n % 2])]
            elif op[0] == "cancel":
                rid += 1
                events = [(Cancel(rid=rid, tag=f"t{op[1]}"), CLIENTS[op[1] % 2])]
            else:
                _, n, k = op
                who = (CLIENTS[n % 2], f"t{n}")
                tags, held[who] = held.get(who, [])[:k], held.get(who, [])[k:]
                events = [(Ack(tag=who[1], delivery_tags=tuple(tags)), who[0])] if tags else []
            both: list[list[Outgoing]] = []
            for side in (fast, usual):
                for event, sender in events:
                    side.core.receive(encode(event), sender, now)
                deadline = side.core.next_deadline()
                if deadline is not None and deadline <= now:
                    side.core.handle_timer(now)
                side.core.turn_memory()
                both.append(side.core.messages_to_send())
            assert both[0] == both[1]
            out = both[0]
        _tags(out, held)
        assert fast.core.stats() == usual.core.stats()
        assert fast.core.next_deadline() == usual.core.next_deadline()


def test_a_publish_to_a_waiting_consumer_takes_the_latency_path() -> None:
    side = _Side(latency=True)
    side.core.receive(encode(Consume(rid=50, tag="t", queue="q2", prefetch=1, no_ack=False)), CLIENTS[0], 0.0)
    side.core.messages_to_send()
    (o,) = side.publish(["p", 0, "x", "b", b"ping"], 0.0)
    assert side.taken == 1
    assert (o.dest, o.mailbox, o.payload[0], o.payload[1]) == (CLIENTS[0], DELIVERY_MAILBOX, "d", "t")
    assert o.payload[2][0][1:] == ["x", "b", False, [b"ping"]]
    # Its one unacked delivery fills the prefetch window: the next is queued.
    assert side.core.receive_at_once(["p", 0, "x", "b", b"two"], PUB, 0.0) is None
    (q2,) = [q for q in side.core.stats().per_queue if q.name == "q2"]
    assert (q2.enqueued, q2.delivered, q2.unacked, q2.ready) == (2, 1, 1, 1)


def test_the_latency_path_leaves_anything_else_to_receive() -> None:
    side, usual = _Side(latency=True), _Side(latency=False)
    for s in (side, usual):
        s.core.receive(encode(Consume(rid=50, tag="t", queue="q2", prefetch=0, no_ack=False)), CLIENTS[0], 0.0)
        s.core.messages_to_send()
    for payload in (
        ["p", 7, "x", "b", b"confirm me"],  # a confirm: it needs an answer
        ["P", 0, "x", "b", [b"batch"]],
        ["p", 0, "x", "both", b"two queues"],
        ["p", 0, "x", "t", b"a queue with a message TTL"],
        ["p", 0, "missing", "b", b"no exchange"],
        ["p", 0, "x", "b", [1, 2]],  # not an opaque body
        ["p", 0, "x", "b"],
        "not a list",
    ):
        assert side.core.receive_at_once(payload, PUB, 0.0) is None, payload
        usual.core.receive(payload, PUB, 0.0)
        assert side.core.messages_to_send() == usual.core.messages_to_send()
    assert side.taken == 0
    assert side.core.stats() == usual.core.stats()
