"""The memory budget towards cmq-protocol publishers.

Over its budget the broker refuses cmq-protocol publishes with
``resource-error`` (a confirming publisher's nack; a fire-and-forget one
hears of it through ``errors()``), counts them in ``refused_memory``, and
keeps nothing of them, so what it holds stops growing; consumers still take
and acknowledge, and under 90% of the budget publishes are taken again. AMQP
channels are not refused (their driver stops reading them instead).
"""

from __future__ import annotations

import pytest

from cmq import RemoteError
from cmq.routing import Broker, BrokerClient, BrokerConfig
from cmq.routing._core import BrokerCore, Refused
from cmq.routing._protocol import DeclareQueue, ErrorCode, Publish, PublishBatch, PurgeQueue
from tests.waiting import wait_until

BUDGET = 16 * 1024
BODY = b"x" * 1024
ME = ("127.0.0.1", 4000)
AMQP_CHANNEL = ("amqp#1", 1)
WAIT = 10.0


def _publish(core: BrokerCore, sender: tuple[str, int] = ME) -> int:
    routed: int = core.call(Publish(rid=0, exchange="", routing_key="q", body=BODY), sender, 0.0)["routed"]
    return routed


def test_core_refuses_cmq_publishes_over_the_budget_and_takes_them_again_under_90_percent() -> None:
    core = BrokerCore(BrokerConfig(memory_budget=BUDGET))
    core.call(DeclareQueue(rid=0, name="q", max_length=1_000_000, overflow="drop-head"), ME, 0.0)
    kept = 0
    while not core.check_memory():
        assert _publish(core) == 1
        kept += 1
    assert core.held_bytes() == kept * len(BODY) >= BUDGET
    for _ in range(100):  # however many come, none is kept
        with pytest.raises(Refused) as info:
            _publish(core)
        assert info.value.code == ErrorCode.RESOURCE_ERROR
        assert core.check_memory()
    with pytest.raises(Refused):
        core.call(PublishBatch(rid=0, exchange="", routing_key="q", bodies=[BODY] * 10), ME, 0.0)
    stats = core.stats()
    assert core.held_bytes() == kept * len(BODY)
    assert (stats.refused_memory, stats.memory_alarms) == (110, 1)
    assert any(n.reason == "memory_alarms" for n in core.notes)
    # An AMQP channel is held back by its driver, not refused.
    assert _publish(core, AMQP_CHANNEL) == 1
    # Still over 90% of the budget: still raised. Emptied: cleared.
    assert core.check_memory()
    core.call(PurgeQueue(rid=0, name="q"), ME, 0.0)
    assert core.held_bytes() == 0
    assert not core.check_memory()
    assert _publish(core) == 1


@pytest.mark.parametrize("consumer", [False, True])
def test_the_message_that_reaches_the_budget_raises_the_alarm_without_a_driver_check(consumer: bool) -> None:
    """A driver may read thousands of publishes in one turn before it checks:
    the core checks as they come in, so what it holds passes the budget by
    one message at most, on the queue path and on the hand-over fast path."""
    from cmq.routing._protocol import Consume

    core = BrokerCore(BrokerConfig(memory_budget=BUDGET))
    core.call(DeclareQueue(rid=0, name="q", max_length=1_000_000, overflow="drop-head"), ME, 0.0)
    if consumer:  # messages go straight to a consumer that never acks: still held
        core.call(Consume(rid=0, tag="c", queue="q", prefetch=0, no_ack=False), ("127.0.0.1", 4001), 0.0)
    for _ in range(200):  # one turn's worth, never a check_memory() between
        core.receive(["p", 0, "", "q", BODY], ME, 0.0)
        core.messages_to_send()
    assert BUDGET <= core.held_bytes() < BUDGET + len(BODY)
    assert core.stats().refused_memory == 200 - BUDGET // len(BODY)
    assert core.memory_alarm


def test_the_turns_look_walks_the_queues_only_while_the_alarm_is_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """A driver's look at the budget each turn: nothing to walk while the
    alarm is down (the message that reaches the budget raises it), the
    exact look that clears it while it is up."""
    core = BrokerCore(BrokerConfig(memory_budget=BUDGET))
    for i in range(100):
        core.call(DeclareQueue(rid=0, name="q" if i == 0 else f"other{i}", max_length=1_000_000,
                               overflow="drop-head"), ME, 0.0)  # fmt: skip
    walked = []
    held_bytes = core.held_bytes
    monkeypatch.setattr(core, "held_bytes", lambda: walked.append(1) or held_bytes())
    for _ in range(BUDGET // len(BODY) - 1):
        _publish(core)
        assert core.turn_memory() is False
    assert walked == []  # under the budget: never walked
    _publish(core)  # reaches it: raised as it comes in
    assert core.memory_alarm and walked
    assert core.turn_memory() is True
    core.call(PurgeQueue(rid=0, name="q"), ME, 0.0)
    assert core.turn_memory() is False  # the exact look cleared it
    walked.clear()
    assert core.turn_memory() is False and walked == []


def test_live_broker_refuses_confirms_and_stays_bounded_then_takes_publishes_again() -> None:
    with Broker(config=BrokerConfig(memory_budget=BUDGET)).start() as b, BrokerClient(b.address, timeout=WAIT) as c:
        c.declare_queue("q", max_length=1_000_000)
        confirmed = 0
        with pytest.raises(RemoteError) as info:
            for _ in range(10 * BUDGET // len(BODY)):
                c.publish("", "q", BODY, confirm=True)
                confirmed += 1
        assert info.value.code == ErrorCode.RESOURCE_ERROR
        assert BUDGET <= confirmed * len(BODY) < BUDGET + 2 * len(BODY)
        # Fire and forget: refused too (reported through errors()), none kept.
        for _ in range(200):
            c.publish("", "q", BODY)
        assert wait_until(lambda: c.stats()["refused_memory"] >= 201, WAIT)
        assert wait_until(lambda: any(e.code == ErrorCode.RESOURCE_ERROR for e in c.errors()), WAIT)
        stats = c.stats()
        (q,) = stats["per_queue"]
        assert q["ready"] == confirmed, "nothing published over the budget was kept"
        assert stats["memory_alarms"] == 1
        # A consumer still takes and acknowledges; under 90% publishes are taken again.
        with c.consume("q", prefetch=64) as consumer:
            taken = 0
            while taken < confirmed:
                consumer.ack(consumer.get(timeout=WAIT))
                taken += 1
        assert wait_until(lambda: c.stats()["per_queue"][0]["ready"] == 0, WAIT)
        c.stats()  # a turn that received something: the alarm is looked at again
        assert c.publish("", "q", BODY, confirm=True) == 1
