"""Limits in bytes, and the ``cmq broker`` command's reported faults."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cmq import ConfigError, Queue, RemoteError, Timeout
from cmq.routing import Broker, BrokerClient, BrokerConfig, ErrorCode, _server
from cmq.routing._core import BrokerCore, Refused
from cmq.routing._protocol import DeclareExchange, DeclareQueue, PublishBatch
from tests.routing.test_core import Harness
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def broker() -> Iterator[Broker]:
    with Broker(config=BrokerConfig(consumer_timeout=60.0)).start() as b:
        yield b


def cmq(*argv: str) -> int:
    from cmq.cli import main

    return main(list(argv))


# -- limits in bytes -------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("a" * 255, True),
        ("a" * 256, False),
        ("é" * 127, True),  # 254 bytes
        ("é" * 128, False),  # 128 characters, 256 bytes: was accepted (counted in characters)
        ("€" * 85, True),  # 255 bytes
        ("€" * 86, False),
        ("😀" * 64, False),  # 64 characters, 256 bytes
    ],
)
def test_names_are_measured_in_utf8_bytes(name: str, ok: bool) -> None:
    h = Harness()
    for make, fields in ((DeclareQueue, {"max_length": 1, "overflow": "drop-head"}), (DeclareExchange, {"type": "topic"})):
        if ok:
            h.ok(make, name=name, **fields)
        else:
            code, message = h.err(make, name=name, **fields)
            assert code == ErrorCode.BAD_REQUEST and "longer than 255 bytes" in message


def test_a_40000_byte_routing_key_is_refused(broker: Broker) -> None:
    with BrokerClient(broker.address) as c:
        c.declare_exchange("t", "topic")
        c.declare_queue("q")
        c.bind("q", "t", "#")
        with pytest.raises(RemoteError) as info:
            c.publish("t", "k" * 40_000, b"x", confirm=True)
        assert info.value.code == ErrorCode.BAD_REQUEST and "routing key" in str(info.value)
        assert len(str(info.value)) < 200  # the key is not echoed back
        c.publish("", "é" * 128, b"x")  # unconfirmed, on the latency path: refused too
        c.stats()
        (err,) = c.errors()
        assert "routing key is longer than 255 bytes" in str(err)
        assert c.publish("t", "k" * 255, b"x", confirm=True) == 1


# -- the command ------------------------------------------------------------------


def test_publish_to_a_missing_exchange_does_not_claim_it_published(
    broker: Broker, capsys: pytest.CaptureFixture[str]
) -> None:
    addr = f"{broker.address[0]}:{broker.address[1]}"
    assert cmq("broker", "publish", "nope", "k", "v", "--broker", addr) == 1
    err = capsys.readouterr().err
    assert "published" not in err
    assert "not-found" in err and "1 of 1 message(s) refused" in err
    assert cmq("broker", "publish", "", "nowhere", "v", "--confirm", "--broker", addr) == 0
    assert "published 1 message(s), routed to 0 queue(s)" in capsys.readouterr().err


def test_broker_option_before_or_after_the_verb(broker: Broker, capsys: pytest.CaptureFixture[str]) -> None:
    addr = f"{broker.address[0]}:{broker.address[1]}"
    assert cmq("broker", "--broker", addr, "declare-queue", "before") == 0
    assert cmq("broker", "declare-queue", "after", "--broker", addr) == 0
    assert cmq("broker", "--broker", "127.0.0.1:1", "--timeout", "5", "declare-queue", "both", "--broker", addr) == 0
    out = capsys.readouterr().out
    assert "'before' created" in out and "'after' created" in out and "'both' created" in out


def test_declare_queue_with_dead_letters_from_the_command(broker: Broker, capsys: pytest.CaptureFixture[str]) -> None:
    addr = f"{broker.address[0]}:{broker.address[1]}"
    assert cmq("broker", "--broker", addr, "declare-exchange", "dlx", "--type", "fanout") == 0
    assert cmq("broker", "--broker", addr, "declare-queue", "q", "--max-length", "1",
               "--dead-letter-exchange", "dlx", "--message-ttl", "30") == 0  # fmt: skip
    (q,) = [q for q in broker.stats().per_queue if q.name == "q"]
    assert (q.overflow, q.dead_letter_exchange, q.message_ttl) == ("drop-head", "dlx", 30.0)


def test_properties_over_the_bound_are_refused_with_bad_request() -> None:
    """Headers are bounded as AMQP bounds them (one content header frame)."""
    from cmq.routing._core import MAX_PROPERTIES

    with Broker().start() as b, BrokerClient(b.address, timeout=5.0) as c:
        c.declare_queue("q")
        assert c.publish("", "q", b"ok", confirm=True, headers={"h": "x" * 1000}) == 1
        with pytest.raises(RemoteError) as info:
            c.publish("", "q", b"big", confirm=True, headers={"h": "x" * MAX_PROPERTIES})
        assert info.value.code == ErrorCode.BAD_REQUEST
        (q,) = c.stats()["per_queue"]
        assert q["ready"] == 1
    core = BrokerCore()
    core.call(DeclareQueue(rid=0, name="q", max_length=10, overflow="drop-head"), ("127.0.0.1", 1), 0.0)
    with pytest.raises(Refused) as refused:
        core.call(PublishBatch(rid=0, exchange="", routing_key="q", bodies=(b"a", b"b"),
                               properties={"h": b"x" * MAX_PROPERTIES}), ("127.0.0.1", 1), 0.0)  # fmt: skip
    assert refused.value.code == ErrorCode.BAD_REQUEST
    deep: Any = 1
    for _ in range(2000):
        deep = [deep]
    with pytest.raises(Refused):
        core.call(PublishBatch(rid=0, exchange="", routing_key="q", bodies=(b"a",), properties={"h": deep}),
                  ("127.0.0.1", 1), 0.0)  # fmt: skip
    assert core.held_bytes() == 0


def test_the_broker_lingers_briefly_on_close() -> None:
    """Closing waits for clients' acknowledgements at most _CLOSE_LINGER, not
    the endpoint's 2 s default (a dead consumer never acknowledges)."""
    with Broker() as b:
        assert b.endpoint.config.linger == _server._CLOSE_LINGER <= 0.2  # type: ignore[attr-defined]


def test_sigterm_flushes_confirms_and_exits_0_with_a_dead_consumer_behind() -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "cmq", "broker", "--port", "0", "--in-memory"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip
    try:
        assert proc.stdout is not None
        addr = proc.stdout.readline().split()[-1]
        consumer = subprocess.Popen([sys.executable, "-m", "cmq", "broker", "consume", "q", "--broker", addr],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        with BrokerClient(addr) as c:
            c.declare_queue("q")
            c.publish("", "q", b"first", confirm=True)  # waits in q until the consumer attaches
            attached = wait_until(
                lambda: not c.stats()["queues"] or c.stats()["per_queue"][0]["delivered"] > 0, 30
            )
            assert attached, "the consumer never attached"
            consumer.kill()  # gone without a word: what the broker sends it is never acknowledged
            consumer.wait()
            for _ in range(50):
                c.publish("", "q", b"x" * 100)
            assert c.publish("", "q", b"last", confirm=True) == 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert proc.stderr is not None
        assert "Traceback" not in proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()


def test_a_broker_with_a_key_serves_clients_with_it_and_drops_the_others(tmp_path: Path) -> None:
    key = b"sixteen byte key"
    with Broker(key=key).start() as b:
        with BrokerClient(b.address, key=key, timeout=5.0) as c:
            c.declare_queue("q")
            assert c.publish("", "q", b"signed", confirm=True) == 1
        for other in (None, b"another key....."):
            # Refused: its endpoint does not wait at close for acknowledgements
            # that cannot come (linger, 2 s by default).
            with (
                Queue(port=0, host="127.0.0.1", codec="msgpack", key=other, linger=0) as ep,
                BrokerClient(b.address, timeout=0.5, retries=0, endpoint=ep) as c,
                pytest.raises(Timeout),
            ):
                c.publish("", "q", b"unsigned", confirm=True)
        assert wait_until(lambda: sum(b._endpoint_stats()["dropped"].values()) >= 2, 5.0)
        (q,) = b.stats().per_queue
        assert q.ready == 1, "nothing unsigned was taken"
        # The command line: --key (hex) or --key-file, before or after the verb.
        addr = f"{b.address[0]}:{b.address[1]}"
        (tmp_path / "key").write_bytes(key + b"\n")
        assert cmq("broker", "--broker", addr, "--key", key.hex(), "publish", "", "q", "cli") == 0
        assert cmq("broker", "publish", "", "q", "cli2", "--broker", addr, "--key-file", str(tmp_path / "key")) == 0
        assert wait_until(lambda: b.stats().per_queue[0].ready == 3, 5.0)
    with pytest.raises(ConfigError):
        BrokerClient("127.0.0.1:1", key=b"k", endpoint=b.endpoint)
