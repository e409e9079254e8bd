"""AMQP over TLS (``amqps_port``): pika through it, and what the listener does with clients that do not finish a handshake."""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pika = pytest.importorskip("pika", reason="pika is not installed: pip install 'pycmq[test]'")
pytest.importorskip("pamqp", reason="pamqp is not installed: pip install 'pycmq[broker]'")

from cmq import ConfigError  # noqa: E402
from cmq.routing import (  # noqa: E402
    Broker,
    BrokerConfig,
    _amqp_server,
    tls_context,
)
from tests.waiting import wait_until  # noqa: E402

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and localhost, and its key."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a test certificate")
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key


@pytest.fixture
def broker(certs: tuple[Path, Path]) -> Iterator[Broker]:
    cert, key = certs
    with Broker(config=BrokerConfig(consumer_timeout=60.0), amqp_port=0, amqps_port=0,
                tls=tls_context(cert, key)).start() as b:  # fmt: skip
        yield b


def _connect(address: Any, cafile: Path | None) -> Any:
    """pika as guest; over TLS, trusting ``cafile``, unless it is None."""
    ssl_options = None
    if cafile is not None:
        ssl_options = pika.SSLOptions(ssl.create_default_context(cafile=str(cafile)), "localhost")
    params = pika.ConnectionParameters(*address, credentials=pika.PlainCredentials("guest", "guest"),
                                       ssl_options=ssl_options, connection_attempts=1)  # fmt: skip
    return pika.BlockingConnection(params)


def _round_trip(broker: Broker, cafile: Path) -> None:
    conn = _connect(broker.amqps_address, cafile)
    try:
        ch = conn.channel()
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.basic_publish("", q, b"ping")
        method, _props, body = next(ch.consume(q, auto_ack=True, inactivity_timeout=10))
        assert method is not None and body == b"ping"
    finally:
        conn.close()


def test_pika_over_tls_and_a_plain_client_see_the_same_queues(broker: Broker, certs: tuple[Path, Path]) -> None:
    cert, _ = certs
    assert broker.amqps_address is not None and broker.amqps_address != broker.amqp_address
    secure, plain = _connect(broker.amqps_address, cert), _connect(broker.amqp_address, None)
    try:
        tch, pch = secure.channel(), plain.channel()
        q = pch.queue_declare("tls-shared", auto_delete=True).method.queue
        tch.confirm_delivery()
        # Up to several TLS records a message, and more than one frame (frame_max 128 KiB).
        bodies = [bytes([i]) * size for i, size in enumerate((0, 1, 16 * 1024, 100_000, 300_000))]
        for body in bodies:
            tch.basic_publish("", q, body)
        got = []
        for method, _props, body in pch.consume(q, auto_ack=True, inactivity_timeout=10):
            assert method is not None
            got.append(body)
            if len(got) == len(bodies):
                break
        assert got == bodies
        # And back the other way, to the TLS side.
        back = tch.queue_declare("", exclusive=True).method.queue
        pch.basic_publish("", back, b"x" * 70_000)
        method, _props, body = next(tch.consume(back, auto_ack=True, inactivity_timeout=10))
        assert method is not None and body == b"x" * 70_000
    finally:
        secure.close()
        plain.close()


def test_a_plain_client_on_the_tls_port_is_dropped_and_the_broker_serves_on(
    broker: Broker, certs: tuple[Path, Path]
) -> None:
    with socket.create_connection(broker.amqps_address, timeout=10) as s:
        s.sendall(b"AMQP\x00\x00\x09\x01")  # AMQP's protocol header, not a TLS hello
        try:
            assert s.recv(64) == b""  # closed, and no AMQP answer in the clear
        except ConnectionResetError:
            pass
    _round_trip(broker, certs[0])


def test_a_client_that_does_not_trust_the_certificate_gets_no_connection(
    broker: Broker, certs: tuple[Path, Path]
) -> None:
    other = ssl.create_default_context()  # the system's authorities: not this self-signed one
    params = pika.ConnectionParameters(*broker.amqps_address, credentials=pika.PlainCredentials("guest", "guest"),
                                       ssl_options=pika.SSLOptions(other, "localhost"), connection_attempts=1)  # fmt: skip
    with pytest.raises(ssl.SSLCertVerificationError):  # pika re-raises the handshake's error
        pika.BlockingConnection(params)
    assert wait_until(lambda: broker.amqp is not None and broker.amqp.connections == 0)
    _round_trip(broker, certs[0])


def test_a_client_that_never_finishes_its_handshake_holds_up_nobody_and_is_dropped(
    broker: Broker, certs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_amqp_server, "_HANDSHAKE_TIMEOUT", 0.5)
    assert broker.amqp is not None
    with socket.create_connection(broker.amqps_address, timeout=10) as silent:
        assert wait_until(lambda: broker.amqp is not None and broker.amqp.connections == 1)
        _round_trip(broker, certs[0])  # served while the silent one waits
        assert wait_until(lambda: broker.amqp is not None and broker.amqp.connections == 0)
        assert silent.recv(64) == b""  # the broker closed it


def test_tls_is_refused_without_its_parts(certs: tuple[Path, Path], tmp_path: Path) -> None:
    cert, key = certs
    with pytest.raises(ConfigError, match="amqps_port= and tls="):
        Broker(amqp_port=0, amqps_port=0)
    with pytest.raises(ConfigError, match="give amqp_port= too"):
        Broker(amqps_port=0, tls=tls_context(cert, key))
    with pytest.raises(ConfigError, match="no such file"):
        tls_context(tmp_path / "missing.pem")
    with pytest.raises(ConfigError, match="cannot use certificate"):
        tls_context(key, key)  # a key where the certificate should be


def test_the_cli_says_what_tls_needs(certs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    from cmq.cli import main

    assert main(["broker", "--port", "0", "--in-memory", "--amqp-port", "0", "--amqps-port", "0"]) == 1
    assert "needs --amqps-port and --tls-cert" in capsys.readouterr().err
    cert, key = certs
    assert main(["broker", "--port", "0", "--in-memory", "--amqps-port", "0", "--tls-cert", str(cert),
                 "--tls-key", str(key)]) == 1  # fmt: skip
    assert "give --amqp-port too" in capsys.readouterr().err
