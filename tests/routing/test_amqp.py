"""The broker's AMQP 0-9-1 listener with pika (unmodified), raw frames, and cmq clients beside it."""

from __future__ import annotations

import datetime
import socket
import string
import struct
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pika = pytest.importorskip("pika", reason="pika is not installed: pip install 'pycmq[test]'")
pytest.importorskip("pamqp", reason="pamqp is not installed: pip install 'pycmq[broker]'")

from pamqp import commands as spec  # noqa: E402
from pamqp import frame as pframe  # noqa: E402
from pamqp.header import ContentHeader  # noqa: E402

from cmq.routing import Broker, BrokerClient, BrokerConfig  # noqa: E402
from cmq.routing._amqp import PROTOCOL_HEADER, AmqpConnection, Users  # noqa: E402
from cmq.routing._core import BrokerCore  # noqa: E402
from cmq.routing._server import _cpus  # noqa: E402

pytestmark = pytest.mark.timeout(60)

# Generous: these bound waits on loopback, they are not asserted.
WAIT = 10.0


@pytest.fixture
def broker() -> Iterator[Broker]:
    with Broker(config=BrokerConfig(consumer_timeout=60.0), amqp_port=0).start() as b:
        yield b


def connect(broker: Broker, user: str = "guest", password: str = "guest", **kw: Any) -> Any:
    assert broker.amqp_address is not None
    host, port = broker.amqp_address
    params = pika.ConnectionParameters(host, port, credentials=pika.PlainCredentials(user, password), **kw)
    return pika.BlockingConnection(params)


@pytest.fixture
def conn(broker: Broker) -> Iterator[Any]:
    c = connect(broker)
    yield c
    if c.is_open:
        c.close()


def consume_n(ch: Any, queue: str, n: int, *, ack: bool = True, **kw: Any) -> list[tuple[Any, Any, bytes]]:
    """Consume until ``n`` messages came (deadline WAIT); ack each unless told not to."""
    got: list[tuple[Any, Any, bytes]] = []

    def on(chan: Any, method: Any, props: Any, body: bytes) -> None:
        got.append((method, props, body))
        if ack:
            chan.basic_ack(method.delivery_tag)

    tag = ch.basic_consume(queue, on, **kw)
    deadline = time.monotonic() + WAIT
    while len(got) < n and time.monotonic() < deadline:
        ch.connection.process_data_events(time_limit=0.05)
    ch.basic_cancel(tag)
    assert len(got) == n, got
    return got


def test_publish_get_ack_and_properties_round_trip(conn: Any) -> None:
    ch = conn.channel()
    ch.queue_declare("q")
    stamp = int(datetime.datetime(2024, 5, 6, 7, 8, 9, tzinfo=datetime.UTC).timestamp())
    props = pika.BasicProperties(
        content_type="application/json", content_encoding="utf-8", headers={"a": 1, "b": "two", "c": [1, "x"]},
        delivery_mode=2, priority=3, correlation_id="corr", reply_to="replies", expiration="60000",
        message_id="m-1", timestamp=stamp, type="kind", user_id="guest", app_id="app",
    )  # fmt: skip
    ch.basic_publish("", "q", b'{"x": 1}', props)
    method, got, body = ch.basic_get("q")
    assert body == b'{"x": 1}' and method.delivery_tag == 1 and method.routing_key == "q"
    for name in ("content_type", "content_encoding", "headers", "delivery_mode", "priority", "correlation_id",
                 "reply_to", "expiration", "message_id", "type", "user_id", "app_id"):  # fmt: skip
        assert getattr(got, name) == getattr(props, name), name
    assert got.timestamp == stamp  # pika: integer seconds
    ch.basic_ack(method.delivery_tag)
    assert ch.basic_get("q") == (None, None, None)
    assert ch.queue_declare("q", passive=True).method.message_count == 0


def test_consume_with_prefetch_holds_back_the_rest(conn: Any, broker: Broker) -> None:
    ch = conn.channel()
    ch.queue_declare("q")
    for i in range(5):
        ch.basic_publish("", "q", b"m%d" % i)
    ch.basic_qos(prefetch_count=2)
    got = consume_n(ch, "q", 2, ack=False)
    assert [b for _, _, b in got] == [b"m0", b"m1"]
    (q,) = [q for q in broker.stats().per_queue if q.name == "q"]
    # Only two were sent; cancelled, the consumer's two stay unacked on the channel (as in RabbitMQ).
    assert q.ready == 3 and q.redelivered == 0
    ch.basic_nack(got[0][0].delivery_tag, requeue=True)  # m0 back, redelivered
    ch.basic_ack(got[1][0].delivery_tag)
    ch.basic_qos(prefetch_count=0)
    rest = consume_n(ch, "q", 4)
    assert [(b, m.redelivered) for m, _, b in rest] == [
        (b"m0", True), (b"m2", False), (b"m3", False), (b"m4", False)]  # fmt: skip


def test_ack_multiple_nack_requeue_and_reject_to_dead_letters(conn: Any) -> None:
    ch = conn.channel()
    ch.exchange_declare("dlx", "fanout")
    ch.queue_declare("dead")
    ch.queue_bind("dead", "dlx")
    ch.queue_declare("work", arguments={"x-dead-letter-exchange": "dlx"})
    for i in range(4):
        ch.basic_publish("", "work", b"w%d" % i)
    tags = [ch.basic_get("work")[0].delivery_tag for _ in range(4)]
    assert tags == [1, 2, 3, 4]
    ch.basic_ack(2, multiple=True)  # 1 and 2
    ch.basic_nack(3, requeue=True)
    ch.basic_reject(4, requeue=False)  # to the dead-letter exchange
    method, _, body = ch.basic_get("work")
    assert (body, method.redelivered) == (b"w2", True)
    ch.basic_ack(method.delivery_tag)
    assert ch.basic_get("dead")[2] == b"w3"


def test_confirms_ack_and_nack_from_a_reject_publish_queue(conn: Any) -> None:
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("small", arguments={"x-max-length": 2, "x-overflow": "reject-publish"})
    ch.basic_publish("", "small", b"1")
    ch.basic_publish("", "small", b"2")
    with pytest.raises(pika.exceptions.NackError):
        ch.basic_publish("", "small", b"3")
    assert ch.queue_declare("small", passive=True).method.message_count == 2


def test_mandatory_unroutable_is_returned(conn: Any) -> None:
    ch = conn.channel()
    ch.confirm_delivery()
    with pytest.raises(pika.exceptions.UnroutableError):
        ch.basic_publish("", "nobody", b"x", mandatory=True)
    ch.basic_publish("", "nobody", b"x")  # not mandatory: confirmed, dropped


def test_large_bodies_split_at_frame_max(conn: Any) -> None:
    ch = conn.channel()
    ch.queue_declare("big")
    body = bytes(range(256)) * 2000  # 512,000 bytes: several frames each way
    ch.basic_publish("", "big", body)
    assert ch.basic_get("big", auto_ack=True)[2] == body


@given(size=st.integers(0, 3 * 4096 + 9), frame_max=st.sampled_from([4096, 5000, 131072]))
@settings(max_examples=60, deadline=None)
def test_content_frames_are_pamqps_byte_for_byte(size: int, frame_max: int) -> None:
    from pamqp.body import ContentBody

    conn = AmqpConnection(BrokerCore(BrokerConfig()), "amqp#1", "127.0.0.1", Users.default(), 0.0)
    conn.frame_max = frame_max
    body = bytes(i % 251 for i in range(size))
    method = spec.Basic.Deliver(consumer_tag="t", delivery_tag=1, exchange="", routing_key="q")
    conn._send_content(1, method, None, body)
    want = [pframe.marshal(method, 1), pframe.marshal(ContentHeader(0, size, spec.Basic.Properties()), 1)]
    want += [pframe.marshal(ContentBody(body[i : i + frame_max - 8]), 1) for i in range(0, size, frame_max - 8)]
    assert conn.data_to_send(0.0) == b"".join(want)


_EXCHANGE_CHARS = string.ascii_letters + string.digits + "-_.:"  # what pamqp lets an exchange name hold


@given(tag=st.integers(0, 2**63 - 1), multiple=st.booleans(), publish=st.booleans(),
       exchange=st.text(_EXCHANGE_CHARS, max_size=20), key=st.text(max_size=40), bits=st.integers(0, 3))  # fmt: skip
@settings(max_examples=200, deadline=None)
def test_the_quick_reads_of_publish_and_ack_are_pamqps(
    tag: int, multiple: bool, publish: bool, exchange: str, key: str, bits: int
) -> None:
    from cmq.routing import _amqp

    seen: list[Any] = []
    conn = AmqpConnection(BrokerCore(BrokerConfig()), "amqp#1", "127.0.0.1", Users.default(), 0.0)
    conn._method = lambda channel, m, now: seen.append(m)  # type: ignore[method-assign]
    if publish:
        m = spec.Basic.Publish(exchange=exchange, routing_key=key, mandatory=bool(bits & 1), immediate=bool(bits & 2))
    else:
        m = spec.Basic.Ack(delivery_tag=tag, multiple=multiple)
    raw = pframe.marshal(m, 1)
    conn._frame(_amqp._METHOD, 1, raw, 0.0)
    (got,) = seen
    want = pframe.unmarshal(raw)[2]
    assert type(got) is type(want)
    assert {k: getattr(got, k) for k in want.__slots__} == {k: getattr(want, k) for k in want.__slots__}
    # And a publisher confirm, written by hand the same way.
    assert _amqp._ack_frame(7, tag) == pframe.marshal(spec.Basic.Ack(delivery_tag=tag), 7)


def test_topic_fanout_server_named_exclusive_queue(conn: Any, broker: Broker) -> None:
    ch = conn.channel()
    ch.exchange_declare("prices", "topic")
    q = ch.queue_declare("", exclusive=True).method.queue
    assert q.startswith("amq.gen-")
    ch.queue_bind(q, "prices", "stock.*.nyse")
    ch.basic_publish("prices", "stock.ibm.nyse", b"ibm")
    ch.basic_publish("prices", "stock.ibm.lse", b"no")
    assert [b for _, _, b in consume_n(ch, q, 1)] == [b"ibm"]
    other = connect(broker)
    try:
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            other.channel().queue_declare(q, passive=True)
        assert info.value.reply_code == 405
    finally:
        other.close()
    conn.close()  # the exclusive queue goes with its connection
    assert q not in [s.name for s in broker.stats().per_queue]


@pytest.mark.parametrize(
    ("action", "code"),
    [
        (lambda ch: ch.queue_declare("absent", passive=True), 404),
        (lambda ch: ch.exchange_declare("absent", "direct", passive=True), 404),
        (lambda ch: ch.basic_publish("absent", "k", b"x"), 404),
        (lambda ch: ch.queue_bind("absent", "amq.nothing"), 404),
        (lambda ch: (ch.exchange_declare("e", "direct"), ch.exchange_declare("e", "fanout")), 406),
        (lambda ch: (ch.queue_declare("q", arguments={"x-max-length": 5}),
                     ch.queue_declare("q", arguments={"x-max-length": 6})), 406),
        (lambda ch: ch.queue_declare("q", arguments={"x-overflow": "sideways"}), 406),
        (lambda ch: ch.queue_declare("amq.mine"), 403),
        (lambda ch: ch.basic_ack(99), 406),
        # RabbitMQ makes a stream; cmq has none, and says so rather than make a plain queue.
        (lambda ch: ch.queue_declare("s", durable=True, arguments={"x-queue-type": "stream"}), 406),
    ],
)
def test_channel_exceptions_close_the_channel_only(conn: Any, action: Any, code: int) -> None:
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        action(ch)
        ch.basic_qos(prefetch_count=1)  # a round trip, so an asynchronous close (publish, ack) arrives
    assert info.value.reply_code == code
    # The connection lives on.
    again = conn.channel()
    again.queue_declare("after")


def test_unknown_exchange_type_is_a_connection_exception(conn: Any) -> None:
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        conn.channel().exchange_declare("h", "x-consistent-hash")
    assert info.value.reply_code == 503


def test_wrong_credentials_are_refused(broker: Broker) -> None:
    with pytest.raises(pika.exceptions.ProbableAuthenticationError, match="403"):
        connect(broker, "guest", "wrong")
    with pytest.raises(pika.exceptions.ProbableAuthenticationError, match="403"):
        connect(broker, "nobody", "guest")


def test_users_file_and_guest_only_from_loopback(tmp_path: Any) -> None:
    path = tmp_path / "users"
    path.write_text("# who may log in\nalice:s3cret:with:colons\n\nbob:pw\n")
    users = Users.load(path)
    assert users.check("alice", "s3cret:with:colons", "10.0.0.5") is None
    assert users.check("alice", "s3cret", "127.0.0.1") is not None
    assert users.check("guest", "guest", "127.0.0.1") is not None  # not in the file
    default = Users.default()
    assert default.check("guest", "guest", "127.0.0.1") is None
    assert default.check("guest", "guest", "::1") is None
    assert "localhost" in (default.check("guest", "guest", "10.0.0.5") or "")
    with Broker(amqp_port=0, users=users).start() as b:
        c = connect(b, "bob", "pw")
        c.channel().queue_declare("x")
        c.close()
        with pytest.raises(pika.exceptions.ProbableAuthenticationError, match="403"):
            connect(b)


def test_pika_publisher_to_cmq_consumer_and_back(conn: Any, broker: Broker) -> None:
    ch = conn.channel()
    ch.queue_declare("to-cmq")
    ch.basic_publish("", "to-cmq", b"from pika", pika.BasicProperties(correlation_id="c7", headers={"h": 1}))
    with BrokerClient(broker.address, timeout=WAIT) as client:
        with client.consume("to-cmq") as c:
            d = c.get(timeout=WAIT)
        assert d.body == b"from pika"
        assert d.properties == {"correlation_id": "c7", "headers": {"h": 1}}
        client.declare_queue("to-pika", max_length=100)
        assert client.publish("", "to-pika", b"from cmq", confirm=True) == 1
        assert client.publish("", "to-pika", "text", confirm=True) == 1
        assert client.publish("", "to-pika", {"k": [1, 2]}, confirm=True) == 1
    # The queue was declared by cmq with a max length: declaring it without one matches it.
    ch.queue_declare("to-pika")
    got = [b for _, _, b in consume_n(ch, "to-pika", 3)]
    import msgpack

    assert got[:2] == [b"from cmq", b"text"] and msgpack.unpackb(got[2]) == {"k": [1, 2]}


# -- raw frames ---------------------------------------------------------------------------


def raw_connect(broker: Broker, heartbeat: int = 0) -> socket.socket:
    """A socket past the handshake (channel 1 open), speaking frames made by pamqp."""
    assert broker.amqp_address is not None
    s = socket.create_connection(broker.amqp_address, timeout=WAIT)
    s.sendall(PROTOCOL_HEADER)
    assert isinstance(read_frame(s), spec.Connection.Start)
    s.sendall(pframe.marshal(spec.Connection.StartOk(mechanism="PLAIN", response="\0guest\0guest"), 0))
    assert isinstance(read_frame(s), spec.Connection.Tune)
    s.sendall(pframe.marshal(spec.Connection.TuneOk(channel_max=10, frame_max=131072, heartbeat=heartbeat), 0))
    s.sendall(pframe.marshal(spec.Connection.Open(), 0))
    assert isinstance(read_frame(s), spec.Connection.OpenOk)
    s.sendall(pframe.marshal(spec.Channel.Open(), 1))
    assert isinstance(read_frame(s), spec.Channel.OpenOk)
    return s


def read_exact(s: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            raise EOFError(f"closed after {len(out)} of {n} bytes")
        out += chunk
    return out


def read_frame(s: socket.socket) -> Any:
    head = read_exact(s, 7)
    _, _, size = struct.unpack(">BHI", head)
    rest = read_exact(s, size + 1)
    return pframe.unmarshal(head + rest)[2]


def closed_with(s: socket.socket) -> int:
    """The reply code of the Connection.Close the broker sends (skipping other frames)."""
    while True:
        f = read_frame(s)
        if isinstance(f, spec.Connection.Close):
            s.sendall(pframe.marshal(spec.Connection.CloseOk(), 0))
            return int(f.reply_code)


def test_bad_protocol_header_gets_ours_then_close(broker: Broker) -> None:
    assert broker.amqp_address is not None
    with socket.create_connection(broker.amqp_address, timeout=WAIT) as s:
        s.sendall(b"AMQP\x01\x01\x00\x0a")
        assert read_exact(s, 8) == PROTOCOL_HEADER
        assert s.recv(10) == b""


@pytest.mark.parametrize(
    ("frames", "code"),
    [
        (lambda: b"\x09\x00\x01\x00\x00\x00\x00\xce", 501),  # unknown frame type
        (lambda: b"\x01\x00\x01\x00\x00\x00\x04\x00\x3c\x00\x28\x00", 501),  # no frame end
        (lambda: pframe.marshal(ContentHeader(0, 3, spec.Basic.Properties()), 1), 505),  # no publish
        (lambda: pframe.marshal(spec.Basic.Publish(routing_key="q"), 1)
         + pframe.marshal(spec.Basic.Qos(), 1), 505),
        (lambda: pframe.marshal(spec.Basic.Deliver(consumer_tag="t", delivery_tag=1, routing_key="k"), 1), 503),
        (lambda: pframe.marshal(spec.Channel.Open(), 1), 504),  # opened twice
        (lambda: pframe.marshal(spec.Queue.Declare(queue="q"), 3), 504),  # never opened
        (lambda: pframe.marshal(spec.Channel.Flow(active=False), 1), 540),  # as RabbitMQ
        (lambda: pframe.marshal(spec.Channel.FlowOk(active=True), 1), 540),  # the broker never asks for one
        (lambda: pframe.marshal(spec.Basic.Publish(routing_key="q", immediate=True), 1), 540),  # as RabbitMQ
    ],
)
def test_connection_exceptions(broker: Broker, frames: Any, code: int) -> None:
    s = raw_connect(broker)
    try:
        s.sendall(frames())
        assert closed_with(s) == code
    finally:
        s.close()
    # The broker serves the next client.
    c = connect(broker)
    c.channel().queue_declare("fine")
    c.close()


def test_a_silent_peer_is_dropped_after_two_heartbeats(broker: Broker) -> None:
    s = raw_connect(broker, heartbeat=1)
    try:
        got_heartbeat = False
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            try:
                head = s.recv(7)
            except (ConnectionResetError, TimeoutError):
                break
            if not head:
                break
            if head[0] == 8:
                got_heartbeat = True
                s.recv(1)
        else:
            pytest.fail("the broker kept a silent connection")
        assert got_heartbeat
    finally:
        s.close()


def test_live_consumers_on_either_side_get_the_other_sides_publishes(conn: Any, broker: Broker) -> None:
    ch = conn.channel()
    ch.exchange_declare("mix", "fanout")
    ch.queue_declare("amqp-side")
    ch.queue_bind("amqp-side", "mix")
    got: list[bytes] = []
    ch.basic_consume("amqp-side", lambda c, m, p, b: (got.append(b), c.basic_ack(m.delivery_tag)))
    with BrokerClient(broker.address, timeout=WAIT) as client:
        client.declare_queue("cmq-side", max_length=100)
        client.bind("cmq-side", "mix")
        with client.consume("cmq-side") as c:
            # Both consumers attached: a cmq publish reaches the pika consumer (through the UDP
            # loop to the AMQP thread) and a pika publish the cmq consumer (the other way).
            client.publish("mix", "", b"from cmq", confirm=True)
            ch.basic_publish("mix", "", b"from pika")
            deadline = time.monotonic() + WAIT
            while len(got) < 2 and time.monotonic() < deadline:
                conn.process_data_events(time_limit=0.05)
            bodies = sorted(c.get(timeout=WAIT).body for _ in range(2))
    assert sorted(got) == [b"from cmq", b"from pika"]
    assert bodies == [b"from cmq", b"from pika"]


def test_any_utf8_names_up_to_255_bytes(conn: Any) -> None:
    # pamqp's own checks would refuse these names; AMQP and RabbitMQ accept them.
    ch = conn.channel()
    exchange = "ex!é" * 40  # 200 bytes
    queue = "qü!" * 60  # 240 bytes
    ch.exchange_declare(exchange, "fanout")
    assert ch.queue_declare(queue).method.queue == queue
    ch.queue_bind(queue, exchange)
    ch.basic_publish(exchange, "k", b"x")
    method, _, body = ch.basic_get(queue, auto_ack=True)
    assert (method.exchange, body) == (exchange, b"x")
    tag = "tag ✓"
    ch.basic_publish(exchange, "k", b"y")
    got = consume_n(ch, queue, 1, consumer_tag=tag)
    assert got[0][0].consumer_tag == tag


def test_amqplain_login(broker: Broker) -> None:
    from pamqp import encode

    assert broker.amqp_address is not None
    for password, expect in (("guest", spec.Connection.Tune), ("nope", spec.Connection.Close)):
        with socket.create_connection(broker.amqp_address, timeout=WAIT) as s:
            s.sendall(PROTOCOL_HEADER)
            start = read_frame(s)
            assert "AMQPLAIN" in start.mechanisms.split() and "PLAIN" in start.mechanisms.split()
            table = encode.field_table({"LOGIN": "guest", "PASSWORD": password})[4:]  # no length prefix
            s.sendall(pframe.marshal(spec.Connection.StartOk(mechanism="AMQPLAIN", response=table.decode()), 0))
            reply = read_frame(s)
            assert isinstance(reply, expect)
            if isinstance(reply, spec.Connection.Close):
                assert reply.reply_code == 403


def test_recover_redelivers_what_the_channel_holds(conn: Any) -> None:
    ch = conn.channel()
    ch.queue_declare("r")
    for b in (b"1", b"2"):
        ch.basic_publish("", "r", b)
    assert [ch.basic_get("r")[2] for _ in range(2)] == [b"1", b"2"]
    ch.basic_recover(requeue=True)
    again = [ch.basic_get("r", auto_ack=True) for _ in range(2)]
    assert [(m.redelivered, b) for m, _, b in again] == [(True, b"1"), (True, b"2")]


def test_cmq_broker_command_serves_amqp_and_stops_on_sigterm(tmp_path: Any) -> None:
    import re
    import signal
    import subprocess
    import sys
    from pathlib import Path

    cmq = str(Path(sys.executable).with_name("cmq"))
    users = tmp_path / "users"
    users.write_text("app:pw\n")
    p = subprocess.Popen([cmq, "broker", "--port", "0", "--amqp-port", "0", "--users", str(users), "--in-memory"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert p.stdout is not None
        line = p.stdout.readline()
        m = re.search(r"AMQP 0-9-1 on ([\d.]+):(\d+)", line)
        assert m is not None, line
        params = pika.ConnectionParameters(m.group(1), int(m.group(2)), credentials=pika.PlainCredentials("app", "pw"))
        c = pika.BlockingConnection(params)
        c.channel().queue_declare("cli")
        c.close()
    finally:
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=WAIT)
    assert p.returncode == 0, err
    bad = subprocess.run([cmq, "broker", "--users", str(users)], capture_output=True, text=True, timeout=WAIT)
    assert bad.returncode == 1 and "--amqp-port" in bad.stderr and "Traceback" not in bad.stderr


# -- polling before the listener's blocking select --------------------------------


@pytest.mark.parametrize("spin", [0.0, 100e-6, 0.01])
def test_ping_pong_through_the_amqp_port_whatever_the_listener_polls(spin: float) -> None:
    """Request/response over AMQP, one message in flight, with the listener
    blocking at once (spin 0), polling 100 us (the default) or 10 ms after
    each read: every reply comes back, in order."""
    config = BrokerConfig(consumer_timeout=60.0, spin=spin)
    with Broker(config=config, amqp_port=0).start() as b:
        ping, pong = connect(b), connect(b)
        try:
            pc, oc = ping.channel(), pong.channel()
            for q in ("to-pong", "to-ping"):
                pc.queue_declare(q)
            for i in range(50):
                pc.basic_publish("", "to-pong", b"%d" % i)
                ((_, _, body),) = consume_n(oc, "to-pong", 1)
                oc.basic_publish("", "to-ping", body + b"!")
                assert consume_n(pc, "to-ping", 1)[0][2] == b"%d!" % i
        finally:
            ping.close()
            pong.close()


def _polls_after_a_publish(spin: float) -> int:
    """How many times the listener polled (its turns that did not block at
    once) around one publish and its delivery."""
    with Broker(config=BrokerConfig(consumer_timeout=60.0, spin=spin), amqp_port=0).start() as b:
        assert b.amqp is not None
        polls: list[int] = []
        real = b.amqp._poll

        def counted() -> Any:
            polls.append(1)
            return real()

        b.amqp._poll = counted  # type: ignore[method-assign]
        c = connect(b)
        try:
            ch = c.channel()
            ch.queue_declare("q")
            ch.basic_publish("", "q", b"x")
            consume_n(ch, "q", 1)
        finally:
            c.close()
        return len(polls)


def test_the_listener_polls_after_a_read_only_when_it_may_spin() -> None:
    # With one CPU to run on the listener never polls: its client needs that CPU.
    assert (_polls_after_a_publish(0.01) > 0) == (_cpus() > 1)
    assert _polls_after_a_publish(0.0) == 0
