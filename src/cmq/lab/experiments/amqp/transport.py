"""One small interface over the two brokers the AMQP suite compares.

A :class:`Transport` is a client of one broker: declare an exchange with its
queues and bindings, publish, consume. :class:`CmqTransport` drives the cmq
broker (:class:`cmq.routing.BrokerClient`); :class:`RabbitTransport` drives
RabbitMQ with pika. Both consume with acknowledgements (at least once:
the same guarantee on both sides), prefetch-bounded, and both publish
without waiting per message, with a flow-control point every so often.
Both hold published messages until that point (or a flush): pika in its
connection's output buffer, the cmq transport in a list it then sends as
batch publishes; and both hand the consumer what one read brought.

What the RabbitMQ side uses, and why: pika's ``BlockingChannel.basic_publish``
spends about 60-70 µs of client CPU per publish here (it polls the socket
after every frame), which would make RabbitMQ's figures pika's. The
publisher therefore frames messages with the blocking channel's underlying
``pika.channel.Channel.basic_publish`` (the same frames, no poll) and lets the
connection write and read once per ``sync`` (every few hundred messages):
about 20 µs per publish. Consumers use ``BlockingChannel.consume`` and
acknowledge with ``multiple`` every half prefetch window.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Generator, Mapping, Sequence
from typing import Any, Final, Protocol

from cmq._errors import ConfigError, Timeout
from cmq._extras import require, unavailable

__all__ = [
    "AMQP_URL",
    "Bodies",
    "CmqTransport",
    "RabbitTransport",
    "Transport",
    "open_transport",
    "rabbit_available",
]

#: RabbitMQ on this machine (Debian's rabbitmq-server, guest account on loopback).
AMQP_URL: Final = "amqp://guest:guest@127.0.0.1:5672/%2F"
Bodies = Generator[bytes | None, None, None]
"""What ``consume`` returns: bodies, ``None`` on an idle timeout; ``close()``
detaches the consumer."""

#: Bound of every benchmark queue: far above what a run puts in flight, so
#: nothing is dropped unless a consumer stops.
MAX_LENGTH: Final = 1_000_000


class Transport(Protocol):
    """A client of one broker (see the module docstring)."""

    system: str

    def declare(self, exchange: str, kind: str, queues: Mapping[str, Sequence[str]]) -> None:
        """Declare ``exchange`` of ``kind`` and each queue with its binding keys."""
        ...

    def delete(self, exchange: str, queues: Sequence[str]) -> None:
        """Delete the exchange and the queues (best effort)."""
        ...

    def publish(self, exchange: str, key: str, body: bytes, *, sync: bool = False) -> None:
        """Publish one message; with ``sync``, also wait until the broker has
        taken everything published so far (the flow-control point)."""
        ...

    def flush(self) -> None:
        """Send what is published but still batched, without waiting for the broker."""
        ...

    def consume(self, queue: str, *, prefetch: int, idle: float) -> Bodies:
        """Bodies from ``queue`` as they come; ``None`` after ``idle`` seconds without one."""
        ...

    def close(self) -> None:
        """Close the connection."""
        ...


class CmqTransport:
    """The cmq broker at ``host:port``.

    Raises:
        ConfigError: a bad address.
    """

    system = "cmq"

    def __init__(self, address: str) -> None:
        from cmq.routing import BrokerClient

        self.client = BrokerClient(address, timeout=10.0)
        # Publishes framed but not sent yet, as pika's are until its next
        # I/O turn: they leave as batch publishes at the next sync or flush.
        self._pending: list[bytes] = []
        self._to: tuple[str, str] = ("", "")

    def declare(self, exchange: str, kind: str, queues: Mapping[str, Sequence[str]]) -> None:
        self.client.declare_exchange(exchange, kind)
        for queue, keys in queues.items():
            self.client.declare_queue(queue, max_length=MAX_LENGTH)
            for key in keys:
                self.client.bind(queue, exchange, key)

    def delete(self, exchange: str, queues: Sequence[str]) -> None:
        from cmq._errors import CmqError

        with contextlib.suppress(CmqError):
            for queue in queues:
                self.client.delete_queue(queue)
            self.client.delete_exchange(exchange)

    def publish(self, exchange: str, key: str, body: bytes, *, sync: bool = False) -> None:
        if (exchange, key) != self._to:
            self._send_pending()
            self._to = (exchange, key)
        if not sync:
            self._pending.append(body)
            return
        self._send_pending()
        # A confirmed publish is answered after everything this client sent
        # before it was routed: UDP has no flow control, this is ours.
        self.client.publish(exchange, key, body, confirm=True)

    def _send_pending(self) -> None:
        pending = self._pending
        if len(pending) == 1:
            # One message (a ping-pong's): a plain publish, no batch around it.
            self.client.publish(*self._to, pending.pop())
        elif pending:
            self._pending = []
            self.client.publish_batch(*self._to, pending)

    def flush(self) -> None:
        self._send_pending()
        self.client.flush()

    def consume(self, queue: str, *, prefetch: int, idle: float) -> Bodies:
        # Attached here, before the first next(): a caller that says READY
        # after this call is consuming.
        consumer = self.client.consume(queue, prefetch=prefetch)
        return self._bodies(consumer, idle)

    @staticmethod
    def _bodies(consumer: Any, idle: float) -> Bodies:
        with consumer:
            while True:
                try:
                    bodies = consumer.get_bodies(timeout=idle)
                except Timeout:
                    yield None
                    continue
                yield from bodies

    def close(self) -> None:
        self.client.close()


class RabbitTransport:
    """RabbitMQ at ``url`` through pika (see the module docstring).

    Raises:
        MissingExtra: pika (the ``lab`` extra) is not installed.
        Exception: whatever pika raises when the server is not reachable.
    """

    system = "rabbitmq"

    def __init__(self, url: str = AMQP_URL) -> None:
        require("the RabbitMQ transport", "pika")
        import pika

        self.connection = pika.BlockingConnection(pika.URLParameters(url))
        self.channel = self.connection.channel()
        # The underlying channel: frames a publish without polling the socket.
        self._impl: Any = self.channel._impl

    def declare(self, exchange: str, kind: str, queues: Mapping[str, Sequence[str]]) -> None:
        ch = self.channel
        ch.exchange_declare(exchange, exchange_type=kind, auto_delete=False)
        for queue, keys in queues.items():
            ch.queue_declare(queue, arguments={"x-max-length": MAX_LENGTH})
            for key in keys:
                ch.queue_bind(queue, exchange, routing_key=key)

    def delete(self, exchange: str, queues: Sequence[str]) -> None:
        with contextlib.suppress(Exception):  # best effort: the run is over
            for queue in queues:
                self.channel.queue_delete(queue)
            self.channel.exchange_delete(exchange)

    def publish(self, exchange: str, key: str, body: bytes, *, sync: bool = False) -> None:
        self._impl.basic_publish(exchange, key, body)
        if sync:
            # One turn of the I/O loop: writes what is framed (TCP's flow
            # control then paces us) and reads anything the server sent.
            self.connection.process_data_events(0)

    def flush(self) -> None:
        self.connection.process_data_events(0)

    def consume(self, queue: str, *, prefetch: int, idle: float) -> Bodies:
        ch = self.channel
        ch.basic_qos(prefetch_count=prefetch)
        buffer: deque[tuple[int, bytes]] = deque()
        # Attached here, before the first next() (BlockingChannel.consume
        # would attach only then); deliveries land in ``buffer``.
        tag = ch.basic_consume(
            queue, lambda _ch, m, _p, b: buffer.append((m.delivery_tag, b)), auto_ack=False
        )
        return self._bodies(tag, buffer, max(1, prefetch // 2), idle)

    def _bodies(
        self, tag: str, buffer: deque[tuple[int, bytes]], batch: int, idle: float
    ) -> Bodies:
        ch, n, last = self.channel, 0, 0
        try:
            while True:
                if not buffer:
                    if last:  # acknowledge before waiting: the server refills
                        ch.basic_ack(last, multiple=True)
                        last = 0
                    # Returns as soon as a delivery is dispatched, else after idle.
                    self.connection.process_data_events(time_limit=idle)
                    if not buffer:
                        yield None
                        continue
                last, data = buffer.popleft()
                n += 1
                if n % batch == 0:
                    ch.basic_ack(last, multiple=True)
                    last = 0
                yield data
        finally:
            with contextlib.suppress(Exception):
                ch.basic_cancel(tag)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.connection.close()


def open_transport(system: str, address: str) -> Transport:
    """A transport of ``system`` to ``address``: ``"cmq"`` (the cmq broker
    through cmq's client), ``"rabbitmq"`` (RabbitMQ through pika) or
    ``"cmq-pika"`` (the cmq broker's AMQP listener through the same pika
    code as RabbitMQ: the two brokers behind one client).

    Raises:
        ConfigError: an unknown system.
    """
    if system == "cmq":
        return CmqTransport(address)
    if system in ("rabbitmq", "cmq-pika"):
        t = RabbitTransport(address)
        t.system = system
        return t
    raise ConfigError(f"unknown AMQP suite system {system!r}: cmq, cmq-pika or rabbitmq")


def rabbit_available(url: str = AMQP_URL, timeout: float = 3.0) -> str | None:
    """``None`` when RabbitMQ answers at ``url``, else one line saying why and how to get it."""
    missing = unavailable("the RabbitMQ comparison", "pika")
    if missing is not None:
        return missing
    import pika

    params = pika.URLParameters(url)
    params.socket_timeout = timeout
    params.blocked_connection_timeout = timeout
    started = time.monotonic()
    try:
        pika.BlockingConnection(params).close()
    except Exception as exc:  # noqa: BLE001 - any failure to connect means "skip", with the reason
        return (
            f"RabbitMQ not reachable at {url} ({type(exc).__name__} after "
            f"{time.monotonic() - started:.1f} s); apt-get install rabbitmq-server"
        )
    return None
