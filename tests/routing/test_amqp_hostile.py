"""Malformed AMQP input never hurts the broker: the sans-IO connection never raises nor
counts an internal error for any bytes, and a live listener fed random and mutated frames
still serves a normal pika round trip."""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("pamqp", reason="pamqp is not installed: pip install 'pycmq[broker]'")
pika = pytest.importorskip("pika", reason="pika is not installed: pip install 'pycmq[test]'")

from pamqp import commands as spec  # noqa: E402
from pamqp import frame as pframe  # noqa: E402
from pamqp.body import ContentBody  # noqa: E402
from pamqp.header import ContentHeader  # noqa: E402

from cmq.routing import Broker, BrokerConfig, BrokerCore  # noqa: E402
from cmq.routing._amqp import PROTOCOL_HEADER, AmqpConnection, Users  # noqa: E402

pytestmark = pytest.mark.timeout(120)

HANDSHAKE = (
    PROTOCOL_HEADER
    + pframe.marshal(spec.Connection.StartOk(mechanism="PLAIN", response="\0guest\0guest"), 0)
    + pframe.marshal(spec.Connection.TuneOk(channel_max=10, frame_max=131072, heartbeat=0), 0)
    + pframe.marshal(spec.Connection.Open(), 0)
    + pframe.marshal(spec.Channel.Open(), 1)
)

#: Well-formed frames to mutate and to mix with garbage.
VALID = [
    pframe.marshal(spec.Queue.Declare(queue="q"), 1),
    pframe.marshal(spec.Queue.Declare(queue="", exclusive=True, arguments={"x-max-length": 3}), 1),
    pframe.marshal(spec.Exchange.Declare(exchange="e", exchange_type="topic"), 1),
    pframe.marshal(spec.Queue.Bind(queue="q", exchange="e", routing_key="a.#"), 1),
    pframe.marshal(spec.Basic.Publish(exchange="e", routing_key="a.b", mandatory=True), 1),
    pframe.marshal(ContentHeader(0, 5, spec.Basic.Properties(headers={"k": [1, {"x": "y"}]}, expiration="10")), 1),
    pframe.marshal(ContentBody(b"hello"), 1),
    pframe.marshal(spec.Basic.Consume(queue="q", consumer_tag="c"), 1),
    pframe.marshal(spec.Basic.Get(queue="q"), 1),
    pframe.marshal(spec.Basic.Ack(delivery_tag=1, multiple=True), 1),
    pframe.marshal(spec.Basic.Nack(delivery_tag=0, multiple=True, requeue=False), 1),
    pframe.marshal(spec.Basic.Recover(requeue=True), 1),
    pframe.marshal(spec.Confirm.Select(), 1),
    pframe.marshal(spec.Channel.Close(reply_code=200, reply_text="", class_id=0, method_id=0), 1),
    pframe.marshal(spec.Channel.Open(), 2),
    pframe.marshal(spec.Connection.Close(reply_code=200, reply_text="", class_id=0, method_id=0), 0),
    b"\x08\x00\x00\x00\x00\x00\x00\xce",
]


def mutate(frame: bytes, at: int, value: int) -> bytes:
    if not frame:
        return frame
    i = at % len(frame)
    return frame[:i] + bytes([value]) + frame[i + 1 :]


frames = st.one_of(
    st.sampled_from(VALID),
    st.builds(mutate, st.sampled_from(VALID), st.integers(0, 10_000), st.integers(0, 255)),
    st.binary(max_size=64),
    # A frame header announcing any size, any type, any channel.
    st.builds(lambda t, c, n, body: struct.pack(">BHI", t, c, n) + body,
              st.integers(0, 255), st.integers(0, 65535), st.integers(0, 2**32 - 1), st.binary(max_size=32)),
)
inputs = st.lists(frames, max_size=12)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prefix=st.booleans(), chunks=inputs, split=st.integers(1, 64))
def test_connection_never_raises_and_counts_no_internal_error(prefix: bool, chunks: list[bytes], split: int) -> None:
    core = BrokerCore()
    conn = AmqpConnection(core, "amqp#1", "127.0.0.1", Users.default(), 0.0)
    data = (HANDSHAKE if prefix else b"") + b"".join(chunks)
    now = 0.0
    # Fed in pieces, as TCP may cut it anywhere.
    for i in range(0, len(data), split):
        now += 0.001
        conn.receive_data(data[i : i + split], now)
        conn.data_to_send(now)
        for o in core.messages_to_send():
            if o.dest[0] == "amqp#1":
                conn.deliver(o.dest[1], o.payload, now)
        conn.handle_timer(now)
    conn.connection_lost(now + 100)
    assert core.stats().internal_errors == 0, list(core.notes)
    assert core.stats().consumers == 0  # everything it held was given back


@pytest.fixture(scope="module")
def live() -> Iterator[Broker]:
    with Broker(config=BrokerConfig(consumer_timeout=60.0), amqp_port=0).start() as b:
        yield b


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(prefix=st.booleans(), chunks=inputs)
def test_live_listener_survives_garbage(live: Broker, prefix: bool, chunks: list[bytes]) -> None:
    assert live.amqp_address is not None
    with socket.create_connection(live.amqp_address, timeout=5) as s:
        try:
            s.sendall((HANDSHAKE if prefix else b"") + b"".join(chunks))
            s.shutdown(socket.SHUT_WR)
            while s.recv(65536):  # until the broker closes it (it closes what it cannot use)
                pass
        except (ConnectionResetError, BrokenPipeError, TimeoutError):
            pass


def test_after_the_garbage_a_normal_round_trip(live: Broker) -> None:
    # Runs after the fuzz above (same module broker).
    assert live.amqp_address is not None
    host, port = live.amqp_address
    conn = pika.BlockingConnection(pika.ConnectionParameters(host, port))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("after-fuzz")
        ch.basic_publish("", "after-fuzz", b"still here")
        assert ch.basic_get("after-fuzz", auto_ack=True)[2] == b"still here"
    finally:
        conn.close()
    assert live.stats().internal_errors == 0


@given(
    exchange=st.text(max_size=40), key=st.text(max_size=80), mandatory=st.booleans(), immediate=st.booleans(),
    cut=st.integers(0, 200), channel=st.integers(0, 2047),
)  # fmt: skip
@settings(max_examples=200, deadline=None)
def test_the_hand_read_publish_and_written_deliver_agree_with_pamqp(
    exchange: str, key: str, mandatory: bool, immediate: bool, cut: int, channel: int
) -> None:
    from pamqp import commands as spec
    from pamqp import frame as pframe

    from cmq.routing._amqp import _deliver_frame, _lenient, _quick_publish

    # Any UTF-8 names (AMQP allows them; pamqp's own check would refuse some).
    m = _lenient(spec.Basic.Publish)(exchange=exchange, routing_key=key, mandatory=mandatory, immediate=immediate)
    raw = pframe.marshal(m, 1) if len(exchange.encode()) < 256 and len(key.encode()) < 256 else b""
    if raw:
        got = _quick_publish(raw)
        assert (got.exchange, got.routing_key, got.mandatory, got.immediate) == (exchange, key, mandatory, immediate)
        # A cut or padded frame is not read by hand: pamqp reports it as before.
        assert _quick_publish(raw[:cut]) is None or cut >= len(raw)
        assert _quick_publish(raw[:-1] + b"\x00\xce") is None
        d = _lenient(spec.Basic.Deliver)(consumer_tag="t", delivery_tag=cut + 1, redelivered=mandatory,
                                         exchange=exchange, routing_key=key)  # fmt: skip
        assert _deliver_frame(channel, "t", cut + 1, mandatory, exchange, key) == pframe.marshal(d, channel)
