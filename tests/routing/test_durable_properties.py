"""The store holds exactly the persistent messages the broker holds, whatever
happens to them (a hypothesis state machine over the sans-IO core, its
journal written to a real SQLite store after every step).

Invariant: the message ids on disk are the ids of the persistent messages in
durable queues, ready or out with a consumer unacknowledged: an ack, a
rejection, a dead letter, an overflow, a purge, a no_ack delivery removes
the record; a requeue keeps it; a dead letter into a durable queue writes a
new one. And what a restart takes back is that, marked redelivered.
"""

from __future__ import annotations

import tempfile
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from cmq.routing._core import Address, BrokerCore
from cmq.routing._protocol import (
    Ack,
    Cancel,
    Consume,
    DeclareExchange,
    DeclareQueue,
    Get,
    Nack,
    Publish,
    PurgeQueue,
)
from cmq.routing._store import Store

ME: Address = ("127.0.0.1", 3000)
P = {"delivery_mode": 2}


class DurableMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.TemporaryDirectory(prefix="cmq-durable-prop-")
        self.store = Store(self.dir.name)
        self.core = BrokerCore()
        self.core.persisting = True
        call = self.core.call
        call(DeclareExchange(rid=0, name="dlx", type="fanout", durable=True), ME, 0.0)
        call(DeclareQueue(rid=0, name="dl", max_length=1000, overflow="drop-head", durable=True), ME, 0.0)
        from cmq.routing._protocol import Bind

        call(Bind(rid=0, queue="dl", exchange="dlx", key=""), ME, 0.0)
        call(DeclareQueue(rid=0, name="q", max_length=4, overflow="drop-head", durable=True,
                          arguments={"x-dead-letter-exchange": "dlx"}), ME, 0.0)  # fmt: skip
        call(DeclareQueue(rid=0, name="t", max_length=4, overflow="drop-head"), ME, 0.0)
        self.n = 0
        self.tags: dict[str, list[int]] = {}  # consumer tag -> delivery tags it holds
        self.sync()

    def sync(self) -> None:
        self.store.write(self.core.journal)
        self.core.journal.clear()
        for out in self.core.messages_to_send():
            p = out.payload
            if isinstance(p, list) and p and p[0] == "d":
                for run in p[2]:
                    first, n = run[0], len(run[4])
                    self.tags.setdefault(p[1], []).extend(range(first, first + n))

    def teardown(self) -> None:
        self.store.close()
        self.dir.cleanup()

    @rule(queue=st.sampled_from(["q", "t"]), persistent=st.booleans())
    def publish(self, queue: str, persistent: bool) -> None:
        self.n += 1
        self.core.call(Publish(rid=0, exchange="", routing_key=queue, body=b"m%d" % self.n,
                               properties=P if persistent else None), ME, 0.0)  # fmt: skip
        self.sync()

    @rule(queue=st.sampled_from(["q", "dl"]), no_ack=st.booleans(), prefetch=st.integers(0, 3))
    def consume(self, queue: str, no_ack: bool, prefetch: int) -> None:
        tag = f"{queue}-{no_ack}-{prefetch}"
        if any(k[1] == tag for k in self.core._consumers):
            return
        self.core.call(Consume(rid=0, tag=tag, queue=queue, prefetch=prefetch, no_ack=no_ack), ME, 0.0)
        self.sync()

    @rule(data=st.data(), how=st.sampled_from(["ack", "requeue", "reject"]))
    def settle(self, data: Any, how: str) -> None:
        held = [(t, d) for t, ds in self.tags.items() for d in ds]
        if not held:
            return
        tag, dtag = data.draw(st.sampled_from(held))
        self.tags[tag].remove(dtag)
        if how == "ack":
            self.core.call(Ack(tag=tag, delivery_tags=(dtag,)), ME, 0.0)
        else:
            self.core.call(Nack(tag=tag, delivery_tags=(dtag,), requeue=how == "requeue"), ME, 0.0)
        self.sync()

    @rule(data=st.data())
    def cancel(self, data: Any) -> None:
        tags = [k[1] for k in self.core._consumers if not k[1].startswith("\x00")]
        if not tags:
            return
        tag = data.draw(st.sampled_from(tags))
        self.core.call(Cancel(rid=0, tag=tag), ME, 0.0)
        self.tags.pop(tag, None)
        self.sync()

    @rule(no_ack=st.booleans())
    def get(self, no_ack: bool) -> None:
        got = self.core.call(Get(rid=0, queue="q", no_ack=no_ack), ME, 0.0)
        if got is not None and not no_ack:
            self.tags.setdefault(got[0], []).append(got[1])
        self.sync()

    @rule(queue=st.sampled_from(["q", "dl"]))
    def purge(self, queue: str) -> None:
        self.core.call(PurgeQueue(rid=0, name=queue), ME, 0.0)
        self.sync()

    def held_in_memory(self) -> dict[int, bytes]:
        msgs: list[Any] = []
        for q in self.core._queues.values():
            msgs += list(q.ready)
        for c in self.core._consumers.values():
            msgs += [m for m, _ in c.unacked.values()]
        return {m[4].pid: m[2] for m in msgs if m[4] is not None and m[4].pid is not None}

    @invariant()
    def disk_matches_memory(self) -> None:
        on_disk = {m.id: m.body for m in self.store.load().messages}
        assert on_disk == self.held_in_memory()

    @invariant()
    def transient_messages_have_no_record(self) -> None:
        for q in self.core._queues.values():
            for m in q.ready:
                if m[4] is not None and m[4].pid is not None:
                    assert q.durable and (m[4].props or {}).get("delivery_mode") == 2

    @invariant()
    def a_restart_takes_back_what_is_held(self) -> None:
        again = BrokerCore()
        again.restore(self.store.load(), 0.0)
        back = {m[4].pid: (m[2], m[3]) for q in again._queues.values() for m in q.ready if m[4] is not None}
        assert back == {pid: (body, True) for pid, body in self.held_in_memory().items()}
        assert set(again._queues) == {"q", "dl"}


DurableMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=30, deadline=None)
TestDurable = DurableMachine.TestCase
