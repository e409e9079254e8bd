"""The broker over loopback with real cmq endpoints: client, driver and CLI."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from typing import Any

import pytest

from cmq import Closed, ConfigError, RemoteError, Timeout
from cmq.routing import AsyncBrokerClient, Broker, BrokerClient, BrokerConfig, ErrorCode

pytestmark = pytest.mark.timeout(30)

# Generous: these bound a wait on a loopback reply, they are not asserted.
WAIT = 5.0


@pytest.fixture
def broker() -> Iterator[Broker]:
    with Broker(config=BrokerConfig(consumer_timeout=60.0)).start() as b:
        yield b


@pytest.fixture
def client(broker: Broker) -> Iterator[BrokerClient]:
    with BrokerClient(broker.address, timeout=WAIT) as c:
        yield c


def drain(consumer: Any, n: int) -> list[Any]:
    return [consumer.get(timeout=WAIT) for _ in range(n)]


def test_declare_bind_publish_consume(client: BrokerClient) -> None:
    assert client.declare_exchange("prices", "topic") is True
    assert client.declare_exchange("prices", "topic") is False
    assert client.declare_queue("ibm", max_length=100)["created"] is True
    client.declare_queue("all", max_length=100)
    client.bind("ibm", "prices", "stock.ibm.*")
    client.bind("all", "prices", "#")
    client.bind("all", "prices", "stock.#")  # two matches, one copy
    assert client.publish("prices", "stock.ibm.nyse", b"101.5", confirm=True) == 2
    assert client.publish("prices", "bond.x", {"px": 99}, confirm=True) == 1
    with client.consume("all") as c:
        got = drain(c, 2)
    assert [(d.routing_key, d.body) for d in got] == [
        ("stock.ibm.nyse", b"101.5"),
        ("bond.x", {"px": 99}),
    ]
    with client.consume("ibm") as c:
        (d,) = drain(c, 1)
    assert (d.exchange, d.body, d.redelivered) == ("prices", b"101.5", False)


def test_headers_exchange_and_x_death_through_the_cmq_client(client: BrokerClient) -> None:
    client.declare_exchange("hx", "headers")
    client.declare_exchange("dlx", "fanout")
    client.declare_queue("eu", max_length=100, dead_letter_exchange="dlx")
    client.declare_queue("dead", max_length=100)
    client.bind("dead", "dlx")
    client.bind("eu", "hx", arguments={"x-match": "any", "region": "eu", "eu": None})
    assert client.publish("hx", "", b"a", headers={"region": "eu"}, confirm=True) == 1
    assert client.publish("hx", "", b"b", headers={"region": "us"}, confirm=True) == 0
    assert client.publish("hx", "", b"c", headers={"eu": 1}, confirm=True) == 1  # present: enough
    with client.consume("eu") as c:
        got = drain(c, 2)
        assert [d.body for d in got] == [b"a", b"c"]
        c.reject(got[0], requeue=False)
        c.ack(got[1])
    with client.consume("dead") as c:
        (d,) = drain(c, 1)
    assert d.body == b"a" and d.properties is not None
    (death,) = d.properties["headers"]["x-death"]
    assert (death["queue"], death["reason"], death["count"], death["exchange"]) == ("eu", "rejected", 1, "hx")
    assert d.properties["headers"]["region"] == "eu"


@pytest.mark.parametrize(
    ("call", "code"),
    [
        (lambda c: c.declare_exchange("x", "x-consistent-hash"), ErrorCode.BAD_REQUEST),
        (lambda c: c.declare_exchange("d", "fanout"), ErrorCode.PRECONDITION_FAILED),
        (lambda c: c.declare_queue("q", max_length=7), ErrorCode.PRECONDITION_FAILED),
        (lambda c: c.bind("q", "nope"), ErrorCode.NOT_FOUND),
        (lambda c: c.consume("nope"), ErrorCode.NOT_FOUND),
        (lambda c: c.publish("nope", "k", 1, confirm=True), ErrorCode.NOT_FOUND),
    ],
)
def test_errors_come_back_as_remote_errors(client: BrokerClient, call: Any, code: str) -> None:
    client.declare_exchange("d", "direct")
    client.declare_queue("q", max_length=5)
    with pytest.raises(RemoteError) as info:
        call(client)
    assert info.value.code == code
    assert code in str(info.value)


def test_many_messages_in_order_with_acks(broker: Broker, client: BrokerClient) -> None:
    client.declare_queue("q", max_length=100_000)
    n = 3000
    for i in range(n):
        client.publish("", "q", i)
    client.flush()
    with client.consume("q", prefetch=64) as c:
        bodies = [d.body for d in drain(c, n)]
    assert bodies == list(range(n))
    s = broker.stats()
    assert s.delivered == n and s.acked == n and s.redelivered == 0
    assert client.errors() == []


def test_batch_publishes_and_bodies_in_order_with_acks(broker: Broker, client: BrokerClient) -> None:
    client.declare_exchange("x", "direct")
    client.declare_queue("q", max_length=100_000)
    client.bind("q", "x", "k")
    n = 20_000  # more than one batch message (about 48 KB each)
    client.publish_batch("x", "k", [b"%d" % i for i in range(n)])
    assert client.publish_batch("x", "k", iter([b"last"]), confirm=True) == 1
    got: list[Any] = []
    with client.consume("q", prefetch=256) as c:
        while len(got) < n + 1:
            got += c.get_bodies(timeout=WAIT)
        assert c.get_bodies_nowait() == []
    assert got == [b"%d" % i for i in range(n)] + [b"last"]
    s = broker.stats()
    assert s.published == s.delivered == s.acked == n + 1 and s.redelivered == 0
    with pytest.raises(RemoteError) as info:
        client.publish_batch("nope", "k", [1], confirm=True)
    assert info.value.code == ErrorCode.NOT_FOUND


def test_async_batch_publish_and_bodies(broker: Broker) -> None:
    async def main() -> list[Any]:
        async with await AsyncBrokerClient.open(broker.address, timeout=WAIT) as client:
            await client.declare_queue("q", max_length=100)
            await client.publish_batch("", "q", list(range(10)))
            assert await client.publish_batch("", "q", [10], confirm=True) == 1
            out: list[Any] = []
            async with await client.consume("q", prefetch=4) as consumer:
                while len(out) < 11:
                    out += await consumer.get_bodies(timeout=WAIT)
                assert consumer.get_bodies_nowait() == []
            return out

    assert asyncio.run(asyncio.wait_for(main(), 4 * WAIT)) == list(range(11))


def test_a_priority_queue_and_a_byte_bound_through_the_cmq_clients(broker: Broker, client: BrokerClient) -> None:
    client.declare_queue("prio", max_priority=5)
    for body, p in (("low", 1), ("none", None), ("high", 5), ("mid", 3)):
        assert client.publish("", "prio", body, confirm=True, priority=p) == 1
    client.publish("", "prio", "higher than the highest", priority=200)
    client.publish_many([("", "prio", "many")], priority=4)
    with client.consume("prio") as c:
        got = drain(c, 6)
    assert [d.body for d in got] == ["high", "higher than the highest", "many", "mid", "low", "none"]
    assert got[0].properties["priority"] == 5
    client.declare_queue("small", max_length_bytes=4, overflow="reject-publish")
    assert client.publish("", "small", b"abcd", confirm=True) == 1
    with pytest.raises(RemoteError, match="queue-full"):
        client.publish("", "small", b"e", confirm=True)
    with pytest.raises(ConfigError, match="priority"):
        client.publish("", "prio", "x", priority=256)
    with pytest.raises(ConfigError, match="max_priority"):
        client.declare_queue("p2", max_priority=-1)

    async def main() -> list[Any]:
        async with await AsyncBrokerClient.open(broker.address, timeout=WAIT) as aclient:
            await aclient.declare_queue("aprio", max_priority=2)
            await aclient.publish("", "aprio", "low", priority=1)
            assert await aclient.publish("", "aprio", "high", confirm=True, priority=2) == 1
            async with await aclient.consume("aprio") as consumer:
                out: list[Any] = []
                while len(out) < 2:
                    out += await consumer.get_bodies(timeout=WAIT)
            return out

    assert asyncio.run(asyncio.wait_for(main(), 4 * WAIT)) == ["high", "low"]


def test_large_messages_are_fragmented_and_delivered(client: BrokerClient) -> None:
    client.declare_queue("big", max_length=10)
    bodies = [bytes([i]) * (1 << 20) for i in range(3)]  # 1 MiB each
    for b in bodies:
        assert client.publish("", "big", b, confirm=True) == 1
    with client.consume("big", prefetch=2) as c:
        assert [d.body for d in drain(c, 3)] == bodies


def test_overflow_reject_reaches_publisher(broker: Broker, client: BrokerClient) -> None:
    client.declare_queue("tiny", max_length=2, overflow="reject")
    client.publish("", "tiny", 1, confirm=True)
    client.publish("", "tiny", 2, confirm=True)
    with pytest.raises(RemoteError) as info:
        client.publish("", "tiny", 3, confirm=True)
    assert info.value.code == ErrorCode.QUEUE_FULL
    client.publish("", "tiny", 4)
    client.flush()
    client.stats()  # a round trip: the unsolicited error came before its reply
    (err,) = client.errors()
    assert err.code == ErrorCode.QUEUE_FULL
    assert broker.stats().rejected == 2


def test_publish_many_confirms_each(broker: Broker, client: BrokerClient) -> None:
    client.declare_queue("q", max_length=1000, overflow="reject")
    client.declare_queue("tiny", max_length=1, overflow="reject")
    msgs = [("", "q", i) for i in range(600)] + [
        ("", "tiny", "a"),
        ("", "tiny", "b"),
        ("nope", "k", 0),
    ]
    results = client.publish_many(msgs, window=128)
    assert results[:601] == [1] * 601
    assert isinstance(results[601], RemoteError) and results[601].code == ErrorCode.QUEUE_FULL
    assert isinstance(results[602], RemoteError) and results[602].code == ErrorCode.NOT_FOUND
    assert broker.stats().per_queue[0].ready == 600


def test_lost_consumer_is_reattached_and_gets_its_messages(
    broker: Broker, client: BrokerClient
) -> None:
    client.declare_queue("q", max_length=100)
    c = client.consume("q", prefetch=10, auto_ack=False)
    for i in range(3):
        client.publish("", "q", i)
    client.flush()
    first = drain(c, 3)
    assert not any(d.redelivered for d in first)
    # The consumer falls silent past the broker's timeout: jump the broker's
    # clock instead of sleeping.
    with broker._lock:
        broker.core.handle_timer(time.monotonic() + 120.0)
    assert broker.stats().consumers == 0
    assert broker.stats().per_queue[0].ready == 3  # not lost
    client.heartbeat()  # it comes back: re-attached, and the messages follow
    again = drain(c, 3)
    assert [d.body for d in again] == [0, 1, 2]
    assert all(d.redelivered for d in again)
    for d in again:
        c.ack(d)
    c.cancel()
    client.stats()  # the acks were sent before the cancel; wait for it to land
    s = broker.stats()
    assert (s.consumers_expired, s.consumers_reattached, s.acked) == (1, 1, 3)


def test_cancel_returns_unacked_messages_to_the_queue(broker: Broker, client: BrokerClient) -> None:
    client.declare_queue("q", max_length=100)
    for i in range(5):
        client.publish("", "q", i)
    client.flush()
    with client.consume("q", prefetch=5, auto_ack=False) as c:
        drain(c, 5)
    with client.consume("q") as c2:
        assert [d.body for d in drain(c2, 5)] == [0, 1, 2, 3, 4]
    assert list(c2) == []  # a cancelled consumer's iteration just ends
    with pytest.raises(Closed):
        c2.get(timeout=WAIT)


def test_delete_queue_cancels_its_consumer(broker: Broker, client: BrokerClient) -> None:
    client.declare_queue("q", max_length=100)
    c = client.consume("q")
    with BrokerClient(broker.address, timeout=WAIT) as admin:
        admin.delete_queue("q")
    with pytest.raises(RemoteError) as info:
        c.get(timeout=WAIT)
    assert info.value.code == ErrorCode.NOT_FOUND


def test_async_client_and_iterator(broker: Broker) -> None:
    async def main() -> list[Any]:
        async with await AsyncBrokerClient.open(broker.address, timeout=WAIT) as client:
            assert await client.declare_exchange("f", "fanout")
            await client.declare_queue("q", max_length=100)
            await client.bind("q", "f")
            with pytest.raises(RemoteError) as info:
                await client.declare_exchange("f", "topic")
            assert info.value.code == ErrorCode.PRECONDITION_FAILED
            assert await client.publish("f", "", -1, confirm=True) == 1
            for i in range(10):
                client.publish_nowait("f", "", i)
            client.flush()
            out = []
            async with await client.consume("q", prefetch=4) as consumer:
                async for d in consumer:
                    out.append(d.body)
                    if len(out) == 11:
                        break
            stats = await client.stats()
            assert stats["delivered"] == 11
            return out

    assert asyncio.run(asyncio.wait_for(main(), 4 * WAIT)) == list(range(-1, 10))


def test_two_consumers_share_a_queue(broker: Broker) -> None:
    with (
        BrokerClient(broker.address, timeout=WAIT) as a,
        BrokerClient(broker.address, timeout=WAIT) as b,
    ):
        a.declare_queue("work", max_length=1000)
        ca, cb = a.consume("work", prefetch=4), b.consume("work", prefetch=4)
        for i in range(8):
            a.publish("", "work", i)
        a.flush()
        got = drain(ca, 4) + drain(cb, 4)
        assert sorted(d.body for d in got) == list(range(8))


def test_timeout_when_no_broker() -> None:
    from cmq.net import Queue

    with (
        Queue(port=0, host="127.0.0.1", codec="msgpack") as silent,
        BrokerClient(silent.address, timeout=0.2, retries=1) as c,
        pytest.raises(Timeout),
    ):
        c.declare_queue("q")


def test_client_refuses_a_raw_endpoint() -> None:
    from cmq.net import Queue

    with (
        Queue(port=0, host="127.0.0.1", codec="raw") as raw,
        pytest.raises(ConfigError, match="msgpack"),
    ):
        BrokerClient("127.0.0.1:1", endpoint=raw)


# -- the command ---------------------------------------------------------------


def cmq(*argv: str) -> int:
    from cmq.cli import main

    return main(list(argv))


def test_cli_verbs(broker: Broker, capsys: pytest.CaptureFixture[str]) -> None:
    addr = f"{broker.address[0]}:{broker.address[1]}"
    assert cmq("broker", "declare-exchange", "px", "--type", "topic", "--broker", addr) == 0
    assert cmq("broker", "declare-queue", "ibm", "--max-length", "10", "--broker", addr) == 0
    assert cmq("broker", "bind", "ibm", "px", "stock.ibm.#", "--broker", addr) == 0
    assert (
        cmq("broker", "publish", "px", "stock.ibm.nyse", "101.5", "--confirm", "--broker", addr)
        == 0
    )
    assert (
        cmq("broker", "publish", "px", "stock.ibm.x", '{"a": 1}', "--json", "--broker", addr) == 0
    )
    assert cmq("broker", "consume", "ibm", "--count", "2", "--broker", addr) == 0
    out = capsys.readouterr().out
    assert "stock.ibm.nyse\t101.5\n" in out
    assert 'stock.ibm.x\t{"a": 1}\n' in out
    assert cmq("broker", "stats", "--broker", addr) == 0
    out = capsys.readouterr().out
    assert '"acked": 2' in out and '"kernel_drops"' in out  # the endpoint's counters too
    assert (
        cmq(
            "broker",
            "declare-queue",
            "one",
            "--max-length",
            "1",
            "--overflow",
            "reject",
            "--broker",
            addr,
        )
        == 0
    )
    assert cmq("broker", "publish", "", "one", "a", "b", "--confirm", "--broker", addr) == 1
    assert cmq("broker", "publish", "", "one", "c", "--broker", addr) == 1
    err = capsys.readouterr().err
    assert err.count("queue-full") == 2
    opts = ("--max-length-bytes", "4", "--overflow", "reject-publish", "--broker", addr)
    assert cmq("broker", "declare-queue", "four", *opts) == 0
    assert cmq("broker", "publish", "", "four", "ab", "cd", "--confirm", "--broker", addr) == 0
    assert cmq("broker", "publish", "", "four", "e", "--confirm", "--broker", addr) == 1  # a fifth byte
    assert "queue-full" in capsys.readouterr().err
    assert cmq("broker", "declare-queue", "prio", "--max-priority", "3", "--broker", addr) == 0
    assert cmq("broker", "publish", "", "prio", "low", "--priority", "1", "--broker", addr) == 0
    assert cmq("broker", "publish", "", "prio", "high", "--priority", "3", "--confirm", "--broker", addr) == 0
    capsys.readouterr()
    assert cmq("broker", "consume", "prio", "--count", "2", "--broker", addr) == 0
    out = capsys.readouterr().out
    assert out.index("high") < out.index("low")


def test_cli_reports_broker_errors(broker: Broker, capsys: pytest.CaptureFixture[str]) -> None:
    addr = f"{broker.address[0]}:{broker.address[1]}"
    assert cmq("broker", "declare-exchange", "e", "--type", "fanout", "--broker", addr) == 0
    assert cmq("broker", "declare-exchange", "e", "--type", "topic", "--broker", addr) == 1
    assert cmq("broker", "declare-exchange", "e2", "--type", "nonsense", "--broker", addr) == 1
    err = capsys.readouterr().err
    assert "precondition-failed" in err and "exists with type 'fanout'" in err
    assert "bad-request" in err and "unknown exchange type 'nonsense'" in err


def test_cli_serve_stops_on_close(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    import cmq.commands.broker as command
    from cmq.routing import _server

    started: list[Broker] = []
    real_serve = _server.Broker.serve_forever

    def serve_once(self: Broker) -> None:
        started.append(self)
        self.stop()  # as SIGTERM does
        real_serve(self)

    monkeypatch.setattr(_server.Broker, "serve_forever", serve_once)
    monkeypatch.setattr(command.signal, "signal", lambda *a: None)
    with contextlib.redirect_stdout(None):
        assert cmq("broker", "--port", "0", "--data-dir", str(tmp_path / "data")) == 0
    assert started
    assert (tmp_path / "data" / "broker.sqlite3").exists()


@pytest.mark.parametrize("spin", [0.0, 100e-6, 0.01])
def test_ping_pong_through_the_broker_whatever_it_spins(spin: float) -> None:
    """Request/response through the broker, one message in flight, with the
    broker sleeping at once (spin 0), polling 100 us (the default) or 10 ms
    after each message: every reply comes back, in order."""
    with Broker(config=BrokerConfig(consumer_timeout=60.0, spin=spin)).start() as b, \
            BrokerClient(b.address, timeout=WAIT) as ping, BrokerClient(b.address, timeout=WAIT) as pong:  # fmt: skip
        ping.declare_exchange("pp", "direct")
        for q in ("to-pong", "to-ping"):
            ping.declare_queue(q)
            ping.bind(q, "pp", q)
        with pong.consume("to-pong") as requests, ping.consume("to-ping") as replies:
            for i in range(50):
                ping.publish("pp", "to-pong", i)
                ping.flush()
                (body,) = requests.get_bodies(timeout=WAIT)
                pong.publish("pp", "to-ping", body * 2)
                pong.flush()
                assert replies.get_bodies(timeout=WAIT) == [i * 2]
        assert b.stats().delivered == 100


def test_spin_returns_a_waiting_message_or_none_at_its_deadline() -> None:
    """The poll a broker makes between messages (not serving here, so that
    nothing else reads its endpoint)."""
    from cmq.net import Queue
    from cmq.routing._protocol import BROKER_MAILBOX

    with Broker() as b, Queue(host="127.0.0.1", codec="msgpack") as sender:
        assert b._spin(time.monotonic() + 0.002) is None  # nothing came: gave up at its deadline
        sender.push(b.address, ["probe"], BROKER_MAILBOX)
        sender.flush()
        got = None
        deadline = time.monotonic() + WAIT
        while got is None and time.monotonic() < deadline:
            got = b._spin(time.monotonic() + 0.05)
        assert got is not None and got.payload == ["probe"]


def test_the_brokers_own_endpoint_leaves_polling_to_the_broker() -> None:
    """A broker polls once after a message (its own loop, BrokerConfig.spin):
    the endpoint it makes does not poll again before its blocking reads; an
    endpoint given to it keeps its own setting."""
    from cmq.net import Queue

    with Broker() as b:
        assert b.endpoint.config.spin == 0.0
        assert b.endpoint._pause_after > 1 << 32  # nor pause after empty pops: its loop yields itself
    with Queue(host="127.0.0.1", codec="msgpack") as ep, Broker(endpoint=ep) as b:
        assert b.endpoint.config.spin == ep.config.spin > 0.0


# -- a client on a port another client had --------------------------------------------


def _free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_a_client_on_a_port_another_had_gets_its_replies_and_deliveries_at_once() -> None:
    """The broker's streams to that port still count the old client's
    datagrams: the new one answers with a reset, and what the broker's
    endpoint then gives up on (a reply, deliveries filling the prefetch
    window) is sent again or requeued at once, not at the ack timeout."""
    from cmq.net import Queue

    port = _free_port()
    config = BrokerConfig(ack_timeout=3600.0, consumer_timeout=3600.0)  # only the fix can bring them back
    with Broker(config=config).start() as broker, BrokerClient(broker.address) as admin:
        addr = f"{broker.address[0]}:{broker.address[1]}"
        admin.declare_queue("first")
        admin.declare_queue("second")
        for name in ("first", "second"):
            for i in range(300):
                admin.publish("", name, b"%d" % i)
        for name in ("first", "second"):
            ep = Queue(port=port, host="127.0.0.1", codec="msgpack")
            try:
                with BrokerClient(addr, endpoint=ep, timeout=20.0) as client, client.consume(name, prefetch=256) as c:
                    got: list[Any] = []
                    while len(got) < 300:
                        got += c.get_bodies(timeout=20.0)
                    assert sorted(got) == sorted(b"%d" % i for i in range(300))
            finally:
                ep.close()
        stats = broker.stats()
        assert stats.requeued_in_doubt > 0  # the second client's first window came back
        assert [(q.ready, q.unacked) for q in stats.per_queue if q.name == "second"] == [(0, 0)]


def test_a_waiting_get_bodies_keeps_what_it_cannot_hand_out_now(broker: Broker, client: BrokerClient) -> None:
    """What reaches a consumer waiting in get_bodies and is not one run of at
    most ``limit`` bodies for it is buffered, never lost: another consumer's
    delivery, and the bodies past ``limit``."""
    client.declare_exchange("x", "direct")
    for q in ("a", "b"):
        client.declare_queue(q, max_length=100)
        client.bind(q, "x", q)
    with client.consume("a", prefetch=10) as a, client.consume("b", prefetch=10) as b:
        # Another consumer's delivery while "a" waits: "a" times out, "b" has it.
        client.publish("x", "b", b"for b")
        with pytest.raises(Timeout):
            a.get_bodies(timeout=0.3)
        assert b.get_bodies(timeout=WAIT) == [b"for b"]
        # A run of three while "a" waits with limit 1: one now, two later, in order.
        client.publish_batch("x", "a", [b"1", b"2", b"3"])
        got = a.get_bodies(timeout=WAIT, limit=1)
        while len(got) < 3:
            got += a.get_bodies(timeout=WAIT, limit=1)
        assert got == [b"1", b"2", b"3"]
        # One handed out at once (a ping-pong's path), auto-acked with the rest.
        client.publish("x", "a", b"4")
        assert a.get_bodies(timeout=WAIT) == [b"4"]
    s = broker.stats()  # leaving the block sent the acks short of a batch
    assert (s.delivered, s.acked, s.redelivered) == (5, 5, 0)
