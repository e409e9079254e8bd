"""The client's sans-IO session and consumer state, paired with a broker core in memory."""

from __future__ import annotations

from typing import Any

import pytest

import cmq.routing
from cmq import ConfigError, RemoteError
from cmq.lab.bench.broker import MATCHING_KEY, non_matching
from cmq.routing._client import _ConsumerState, _new_consumer, _parse_address, _Session
from cmq.routing._core import BrokerConfig, BrokerCore
from cmq.routing._protocol import (
    DELIVERY_MAILBOX,
    REPLY_MAILBOX,
    Consume,
    ConsumerSpec,
    DeclareQueue,
    Delivery,
    decode,
)
from cmq.routing.exchanges import TopicExchange

ME = ("127.0.0.1", 4000)


class Pair:
    """A session and a broker core wired back to back, with a virtual clock."""

    def __init__(self) -> None:
        self.core = BrokerCore(BrokerConfig(consumer_timeout=2.0))
        self.session = _Session(("127.0.0.1", 5700))
        self.now = 0.0

    def send(self, payload: list[Any] | None) -> Any:
        if payload is not None:
            self.core.receive(payload, ME, self.now)
        result = None
        for o in self.core.messages_to_send():
            if o.mailbox == REPLY_MAILBOX:
                reply = self.session.reply(o.payload)
                if reply is not None:
                    result = reply
            elif o.mailbox == DELIVERY_MAILBOX:
                self.session.deliver(o.payload)
        return result

    def request(self, make: Any, **fields: Any) -> Any:
        _, payload = self.session.request(make, **fields)
        return self.send(payload)


def test_consume_ack_and_heartbeat_round_trip() -> None:
    p = Pair()
    p.request(DeclareQueue, name="q", max_length=100, overflow="drop-old")
    state = _new_consumer(p.session, "q", prefetch=4, no_ack=False, auto_ack=True, tag="t")
    reply = p.request(Consume, tag="t", queue="q", prefetch=4, no_ack=False)
    assert reply.result == {"heartbeat": 0.5, "timeout": 2.0}
    p.session.attached(reply.result, p.now)
    for i in range(10):
        p.send(["p", 0, "", "q", i])
    got = []
    while len(got) < 10:
        d = state.take()
        if d is None:
            p.send(state.ack_payload())  # what a consumer does before it waits
            continue
        got.append(d.body)
    assert got == list(range(10))
    # Heartbeats: due every interval; a silent session loses its consumer,
    # and its next heartbeat brings it back.
    assert p.session.heartbeat_due(p.now) == (None, 0.5)
    p.now += 0.5
    beat, wait = p.session.heartbeat_due(p.now)
    assert beat is not None and wait == 0.5
    p.send(beat)
    assert p.session.heartbeat_due(p.now + 0.1)[0] is None
    assert p.core.stats().consumers_expired == 0
    p.now += 3.0
    p.core.handle_timer(p.now)
    assert p.core.stats().consumers == 0
    p.send(p.session.heartbeat_due(p.now)[0])
    assert p.core.stats().consumers == 1


def test_auto_ack_acks_the_previous_delivery_on_take() -> None:
    c = _ConsumerState(ConsumerSpec(tag="t", queue="q", prefetch=8, no_ack=False), auto_ack=True)
    c.add([[1, "", "q", False, [1, 2]]])
    assert c.take() == Delivery(
        delivery_tag=1, exchange="", routing_key="q", body=1, redelivered=False
    )
    assert c.acks == []
    assert c.take() is not None and c.acks == [1]
    assert c.take() is None and c.acks == [1, 2]
    assert decode(c.ack_payload()).delivery_tags == (1, 2)  # type: ignore[union-attr]
    assert c.ack_payload() is None


def test_take_bodies_spans_runs_respects_limit_and_auto_acks_on_the_next_take() -> None:
    c = _ConsumerState(ConsumerSpec(tag="t", queue="q", prefetch=8, no_ack=False), auto_ack=True)
    c.add([[10, "x", "a", False, [b"1", b"2", b"3"]], [13, "x", "b", True, [b"4"]]])
    assert c.take_bodies(2) == [b"1", b"2"] and c.acks == []
    assert c.take_bodies(10) == [b"3", b"4"] and c.acks == [10, 11]
    d = c.take()
    assert d is None and c.acks == [10, 11, 12, 13]
    c.add([[14, "x", "a", False, [b"5", b"6"]]])
    assert c.take() == Delivery(
        delivery_tag=14, exchange="x", routing_key="a", body=b"5", redelivered=False
    )
    assert c.take_bodies(10) == [b"6"] and c.acks[-1] == 14
    c.cancel()
    assert c.acks[-1] == 15


def test_no_ack_consumer_never_acks() -> None:
    c = _ConsumerState(ConsumerSpec(tag="t", queue="q", prefetch=0, no_ack=True), auto_ack=True)
    c.add([[1, "", "q", False, [0]]])
    d = c.take()
    assert d is not None
    c.take()
    c.ack(d)
    assert c.ack_payload() is None


def test_unsolicited_errors_are_kept_and_cancel_is_raised() -> None:
    s = _Session(("h", 1))
    assert s.reply(["err", 0, "queue-full", "full"]) is None
    assert [e.code for e in s.errors] == ["queue-full"]
    state = _new_consumer(s, "q", 0, False, True, "t")
    s.deliver(["x", "t", "not-found", "queue 'q' deleted"])
    with pytest.raises(RemoteError, match="deleted"):
        state.take()
    s.deliver(["junk"])  # ignored, never raises
    s.deliver(["d", "unknown-tag", []])


def test_client_argument_checks() -> None:
    s = _Session(("h", 1))
    _new_consumer(s, "q", 0, False, True, "t")
    with pytest.raises(ConfigError, match="in use"):
        _new_consumer(s, "q", 0, False, True, "t")
    with pytest.raises(ConfigError, match="prefetch"):
        _new_consumer(s, "q", -1, False, True, None)
    assert _parse_address("10.0.0.1:5700") == ("10.0.0.1", 5700)
    assert _parse_address(":5700") == ("127.0.0.1", 5700)
    with pytest.raises(ConfigError):
        _parse_address("nohost")


def test_bench_bindings_never_match() -> None:
    ex = TopicExchange()
    for key in non_matching(1024):
        ex.bind("miss", key)
    ex.bind("hit", "stock.ibm.*")
    assert set(ex.route(MATCHING_KEY)) == {"hit"}


def test_public_names_are_exported() -> None:
    for name in cmq.routing.__all__:
        assert getattr(cmq.routing, name) is not None
    public = {n for n in vars(cmq.routing) if not n.startswith("_")}
    modules = {"exchanges"}
    assert public - modules - {"annotations"} == set(cmq.routing.__all__)


def test_publish_window_survives_loss_and_routes_each_once() -> None:
    """Lose every other request and every third reply; resends fix it, no duplicates."""
    from cmq.routing._client import _Window

    p = Pair()
    p.request(DeclareQueue, name="q", max_length=3, overflow="reject")
    msgs = [("", "q", i) for i in range(5)]
    results: list[Any] = [None] * len(msgs)
    w = _Window(p.session, msgs, 0, 5, results)
    sent = 0
    for _attempt in range(4):
        for payload in w.payloads():
            sent += 1
            if sent % 2:
                continue  # the request is lost
            p.core.receive(payload, ME, p.now)
        for k, o in enumerate(p.core.messages_to_send()):
            reply = p.session.reply(o.payload)
            if reply is not None and k % 3 != 2:  # some replies are lost too
                w.on_reply(reply)
        if not w.pending:
            break
    assert not w.pending
    assert p.core.stats().per_queue[0].ready == 3  # each routed once: no duplicates
    routed = [r for r in results if r == 1]
    refused = [r for r in results if isinstance(r, RemoteError)]
    assert len(routed) == 3 and len(refused) == 2
    assert all(r.code == "queue-full" for r in refused)
