"""Properties of a queue's ready messages with a byte bound or priorities.

The broker keeps a byte-bounded queue's ready messages in a deque that sums
their bodies, and a priority queue's in one FIFO per priority behind the
same deque operations. Under any sequence of those operations they hold
what a plain model holds, in the order it gives, with the right byte sum;
and a bounded queue fed random publishes never holds more than its bounds
allow, each publish either kept or refused, none lost unseen.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from cmq.routing._core import BrokerCore, Refused, _bytes_of, _Meta, _PriorityReady, _SizedReady
from cmq.routing._protocol import DeclareQueue, Get, Publish

ME = ("127.0.0.1", 4000)
TOP = 4

messages = st.tuples(st.binary(max_size=12), st.none() | st.integers(min_value=-1, max_value=TOP + 3))
ops = st.lists(
    st.one_of(
        st.tuples(st.sampled_from(["append", "appendleft"]), messages),
        st.tuples(st.sampled_from(["extend", "extendleft"]), st.lists(messages, max_size=4)),
        st.tuples(st.sampled_from(["pop", "popleft", "clear"]), st.none()),
    ),
    max_size=40,
)


def _msg(spec: tuple[bytes, int | None]) -> Any:
    body, priority = spec
    props = None if priority is None else {"priority": priority}
    return ("", "q", body, False, _Meta(None, (), props))


def _level(m: Any) -> int:
    p = (m[4].props or {}).get("priority")
    return 0 if p is None or p <= 0 else min(p, TOP)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_a_priority_queues_ready_messages_behave_as_one_fifo_per_priority(steps: list[Any]) -> None:
    ready = _PriorityReady(TOP)
    model: list[deque[Any]] = [deque() for _ in range(TOP + 1)]
    last = 0
    for op, arg in steps:
        if op in ("append", "appendleft"):
            m = _msg(arg)
            getattr(ready, op)(m)
            getattr(model[_level(m)], op)(m)
            if op == "append":
                last = _level(m)
        elif op in ("extend", "extendleft"):
            ms = [_msg(a) for a in arg]
            getattr(ready, op)(ms)
            for m in ms:
                (model[_level(m)].append if op == "extend" else model[_level(m)].appendleft)(m)
                if op == "extend":
                    last = _level(m)
        elif op == "clear":
            ready.clear()
            for level in model:
                level.clear()
        elif op == "pop":
            if model[last]:
                assert ready.pop() is model[last].pop()
        elif any(model):
            head = next(level for level in reversed(model) if level)
            assert ready.popleft() is head.popleft()
        flat = [m for level in reversed(model) for m in level]
        assert list(ready) == flat and len(ready) == len(flat) and bool(ready) == bool(flat)
        assert ready.nbytes == _bytes_of(flat)
        if flat:
            assert ready[0] is flat[0]


@settings(max_examples=300, deadline=None)
@given(ops)
def test_a_byte_bounded_queues_ready_messages_keep_their_byte_sum(steps: list[Any]) -> None:
    ready, model = _SizedReady(), deque()  # type: ignore[var-annotated]
    for op, arg in steps:
        if op in ("append", "appendleft"):
            m = _msg(arg)
            getattr(ready, op)(m)
            getattr(model, op)(m)
        elif op in ("extend", "extendleft"):
            ms = [_msg(a) for a in arg]
            getattr(ready, op)(ms)
            getattr(model, op)(ms)
        elif op == "clear":
            ready.clear()
            model.clear()
        elif model:
            assert getattr(ready, op)() is getattr(model, op)()
        assert list(ready) == list(model)
        assert ready.nbytes == _bytes_of(model)


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from(["drop-head", "reject-publish"]),
    st.integers(min_value=0, max_value=40),
    st.integers(min_value=1, max_value=6),
    st.none() | st.integers(min_value=0, max_value=TOP),
    st.lists(st.tuples(st.binary(max_size=16), st.integers(min_value=0, max_value=TOP + 2)), max_size=30),
)
def test_a_bounded_queue_fed_publishes_stays_within_its_bounds_and_accounts_for_each(
    overflow: str, max_bytes: int, max_length: int, top: int | None, publishes: list[tuple[bytes, int]]
) -> None:
    core = BrokerCore()
    arguments: dict[str, Any] = {"x-max-length-bytes": max_bytes}
    if top is not None:
        arguments["x-max-priority"] = top
    core.call(DeclareQueue(rid=0, name="q", max_length=max_length, overflow=overflow, arguments=arguments), ME, 0.0)
    kept = refused = 0
    for body, priority in publishes:
        try:
            core.call(Publish(rid=1, exchange="", routing_key="q", body=body, properties={"priority": priority}),
                      ME, 0.0)  # fmt: skip
            kept += 1
        except Refused as exc:
            assert exc.code == "queue-full"
            refused += 1
        ready = core._queues["q"].ready
        assert len(ready) <= max_length
        assert ready.nbytes == _bytes_of(ready) <= max_bytes  # type: ignore[union-attr]
    stats = next(s for s in core.stats().per_queue if s.name == "q")
    assert kept + refused == len(publishes)
    assert stats.rejected == refused and (overflow == "reject-publish" or refused == 0)
    assert stats.enqueued - stats.dropped_old == stats.ready == len(core._queues["q"].ready)
    drained = 0
    while core.call(Get(rid=0, queue="q", no_ack=True), ME, 0.0) is not None:
        drained += 1
    assert drained == stats.ready
