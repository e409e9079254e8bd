"""The broker protocol: round trips, and "decode or ProtocolError, nothing else"."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cmq import ProtocolError
from cmq.routing._core import BrokerConfig, BrokerCore
from cmq.routing._protocol import (
    Ack,
    Bind,
    Cancel,
    Cancelled,
    Consume,
    ConsumerSpec,
    DeclareExchange,
    DeclareQueue,
    DeleteExchange,
    DeleteQueue,
    Deliver,
    ErrorReply,
    GetStats,
    Heartbeat,
    OkReply,
    Publish,
    PublishBatch,
    PurgeQueue,
    Run,
    Unbind,
    decode,
    encode,
)

names = st.text(max_size=8)
uints = st.integers(min_value=0, max_value=2**32)
bodies = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.binary(max_size=16)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3),
    max_leaves=6,
)
specs = st.builds(ConsumerSpec, tag=names, queue=names, prefetch=uints, no_ack=st.booleans())
runs = st.builds(
    Run,
    first_tag=uints,
    exchange=names,
    routing_key=names,
    redelivered=st.booleans(),
    bodies=st.lists(bodies, max_size=3).map(tuple),
)

events = st.one_of(
    st.builds(DeclareExchange, rid=uints, name=names, type=names),
    st.builds(DeleteExchange, rid=uints, name=names),
    st.builds(DeclareQueue, rid=uints, name=names, max_length=uints, overflow=names),
    st.builds(DeleteQueue, rid=uints, name=names),
    st.builds(PurgeQueue, rid=uints, name=names),
    st.builds(Bind, rid=uints, queue=names, exchange=names, key=names),
    st.builds(Unbind, rid=uints, queue=names, exchange=names, key=names),
    st.builds(Publish, rid=uints, exchange=names, routing_key=names, body=bodies),
    st.builds(
        PublishBatch,
        rid=uints,
        exchange=names,
        routing_key=names,
        bodies=st.lists(bodies, max_size=4).map(tuple),
    ),
    st.builds(Consume, rid=uints, tag=names, queue=names, prefetch=uints, no_ack=st.booleans()),
    st.builds(Heartbeat, consumers=st.lists(specs, max_size=3).map(tuple)),
    st.builds(Ack, tag=names, delivery_tags=st.lists(uints, max_size=4).map(tuple)),
    st.builds(Cancel, rid=uints, tag=names),
    st.builds(GetStats, rid=uints),
    st.builds(OkReply, rid=uints, result=bodies),
    st.builds(ErrorReply, rid=uints, code=names, message=names),
    st.builds(Deliver, tag=names, runs=st.lists(runs, max_size=3).map(tuple)),
    st.builds(Cancelled, tag=names, code=names, message=names),
)


@settings(max_examples=300, deadline=None)
@given(event=events)
def test_round_trip_through_msgpack(event: Any) -> None:
    wire = msgpack.unpackb(msgpack.packb(encode(event), use_bin_type=True), raw=False)
    assert decode(wire) == event


junk = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.binary(max_size=8)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=12,
)
ops = st.sampled_from(["p", "P", "a", "h", "d", "ok", "err", "bind", "consume", "queue.declare", "x"])


@settings(max_examples=200, deadline=None)
@given(payload=junk | st.tuples(ops, st.lists(junk, max_size=6)).map(lambda t: [t[0], *t[1]]))
def test_decode_or_protocol_error_nothing_else(payload: Any) -> None:
    try:
        decode(payload)
    except ProtocolError:
        pass


@settings(max_examples=200, deadline=None)
@given(payloads=st.lists(junk | events.map(encode), max_size=12))
def test_broker_core_survives_anything(payloads: list[Any]) -> None:
    """A bad message never stops the broker: it is counted and the next one served."""
    core = BrokerCore(BrokerConfig())
    for i, p in enumerate(payloads):
        core.receive(p, ("127.0.0.1", 1), float(i))
        core.handle_timer(float(i))
        core.messages_to_send()
    core.receive(["stats", 2**40], ("127.0.0.1", 1), 99.0)  # a rid no event used
    (out,) = core.messages_to_send()
    assert out.payload[0] == "ok"


@pytest.mark.parametrize(
    "payload",
    [
        ["p", -1, "x", "k", 1],
        ["a", "t", [1, "2"]],
        ["h", [["t", "q", 1]]],
        ["d", "t", [[1, "x", "k", 1]]],
        ["d", "t", [[1, "x", "k", False, "not a list"]]],
        ["P", 0, "x", "k", b"not a list"],
        [1],
    ],
)
def test_malformed_examples(payload: Any) -> None:
    with pytest.raises(ProtocolError):
        decode(payload)


def test_a_run_is_one_delivery_per_body_with_consecutive_tags() -> None:
    run = Run(first_tag=7, exchange="x", routing_key="k", redelivered=True, bodies=(b"a", 2))
    assert [(d.delivery_tag, d.body, d.redelivered) for d in run.deliveries()] == [
        (7, b"a", True),
        (8, 2, True),
    ]
