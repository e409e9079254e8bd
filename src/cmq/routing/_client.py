"""The broker's client: declarations, publish, and consumers (sync and async).

Theory of operation
-------------------
A :class:`BrokerClient` (threads; on :class:`cmq.Queue`) or an
:class:`AsyncBrokerClient` (asyncio; on :class:`cmq.AsyncQueue`) owns, or
borrows, one cmq endpoint and talks to one broker with the protocol of
:mod:`cmq.routing._protocol`. Both are thin drivers of one sans-IO
:class:`_Session` (request ids, unsolicited errors, consumer buffers, acks,
heartbeats), which never waits.

Requests wait for their reply on ``REPLY_MAILBOX`` and are resent with the
same ``rid`` when the reply does not come within ``timeout / (retries + 1)``;
the broker answers a resent request from its reply cache, so a resend never
does anything twice.

Publishing, three ways:

==========================  =========================================================
``publish(...)``            fire-and-forget, batched by the endpoint: at most once.
                            Refusals (unknown exchange, a full ``reject`` queue) come
                            back unsolicited and are handed out by ``errors()``.
``publish(..., confirm=)``  one round trip; a refusal raises ``RemoteError``; resent
                            until answered, and routed once as long as the broker
                            still remembers the answer (its last ``reply_cache``).
``publish_many(messages)``  the same guarantee, a window of publishes in flight:
                            the fast reliable way.
``publish_batch(...)``      many bodies with one routing key as one message (or a
                            few): routed once by the broker, the fastest way.
==========================  =========================================================

Consuming fast: :meth:`Consumer.get_bodies` returns the bodies of what one
read brought, with no :class:`Delivery` made per message.

Consumers. :meth:`BrokerClient.consume` attaches a :class:`Consumer`, an
iterator of :class:`Delivery`; :meth:`AsyncBrokerClient.consume` an
:class:`AsyncConsumer`, an async iterator. Deliveries of all the client's
consumers arrive on ``DELIVERY_MAILBOX`` and are sorted into per-consumer
buffers. While a consumer waits it sends one heartbeat per interval for all
the client's consumers, and its pending acknowledgements. With ``auto_ack``
(the default) a delivery is acknowledged when the next one is asked for, that
is after the loop body that handled it finished; acks are sent in batches of
half the prefetch window, and those short of a batch with the next heartbeat.

Guarantee: without ``no_ack``, at least once. A message whose ack is lost or
late, or whose consumer went silent longer than the broker's
``consumer_timeout``, is delivered again with ``redelivered=True``. A loop
body that runs longer than that timeout sends no heartbeat meanwhile: call
:meth:`BrokerClient.heartbeat` from it, or expect redeliveries. With
``no_ack``: at most once, and nothing limits what is in flight.
"""

from __future__ import annotations

import collections
import contextlib
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Iterable, Iterator, Mapping
from typing import Any, Final, Protocol

from msgpack import ExtType

from cmq._errors import Closed, ConfigError, ProtocolError, RemoteError, Timeout
from cmq.routing._protocol import (
    BROKER_MAILBOX,
    DELIVERY_MAILBOX,
    REPLY_MAILBOX,
    SCALARS,
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
    Delivery,
    ErrorReply,
    Event,
    GetStats,
    Heartbeat,
    OkReply,
    Publish,
    PublishBatch,
    PurgeQueue,
    Unbind,
    decode,
    encode,
    unwrap_body,
    wrap_body,
)

__all__ = [
    "DEFAULT_MAX_LENGTH",
    "DEFAULT_PREFETCH",
    "AsyncBrokerClient",
    "AsyncConsumer",
    "AsyncEndpoint",
    "BrokerClient",
    "Consumer",
    "Endpoint",
]

# A bound is required (the issue: queues are bounded); 100k small messages
# is a few tens of MB at most and rides out a consumer restart.
DEFAULT_MAX_LENGTH: Final = 100_000
# Enough in flight to hide a 90 us round trip at 100k msgs/s (~10 needed)
# many times over, few enough not to overrun a UDP receive buffer.
DEFAULT_PREFETCH: Final = 256
#: The properties of a persistent message (AMQP's delivery_mode 2); never mutated.
PERSISTENT: Final[dict[str, Any]] = {"delivery_mode": 2}


def _props(persistent: bool, priority: int | None) -> dict[str, Any] | None:
    """A publish's AMQP properties for ``persistent`` and ``priority`` (None: none).

    Raises:
        ConfigError: ``priority`` is not an integer from 0 to 255.
    """
    props = dict(PERSISTENT) if persistent else None
    if priority is not None:
        if type(priority) is not int or not 0 <= priority <= 255:
            raise ConfigError(f"priority must be an integer from 0 to 255, got {priority!r}")
        props = {**(props or {}), "priority": priority}
    return props
DEFAULT_TIMEOUT: Final = 2.0
DEFAULT_RETRIES: Final = 3
# Heartbeat interval until the broker tells us its own.
_DEFAULT_HEARTBEAT: Final = 1.0
# Body bytes per batch publish message: a batch fits one datagram (65000), so
# a lost datagram loses one batch, never a fragment of a larger one; a
# bigger body still goes, alone.
_BATCH_BYTES: Final = 60 * 1024


class _Message(Protocol):
    @property
    def payload(self) -> Any: ...
    @property
    def sender(self) -> tuple[str, int]: ...


class Endpoint(Protocol):
    """What the client and the broker driver need of a cmq endpoint (``cmq.Queue``)."""

    @property
    def address(self) -> tuple[str, int]: ...
    def push(self, dest: Any, msg: Any, mailbox: int = 0) -> None: ...
    def pop_message(self, mailbox: int = 0) -> Any: ...
    def get(self, timeout: float | None = None, mailbox: int = 0) -> Any: ...
    def get_message(self, timeout: float | None = None, mailbox: int = 0) -> Any: ...
    def flush(self) -> int: ...
    def close(self) -> None: ...


class AsyncEndpoint(Protocol):
    """What :class:`AsyncBrokerClient` needs of an endpoint (``cmq.AsyncQueue``)."""

    @property
    def address(self) -> tuple[str, int]: ...
    def push(self, dest: Any, msg: Any, mailbox: int = 0) -> None: ...
    def pop_message(self, mailbox: int = 0) -> Any: ...
    def get(self, timeout: float | None = None, mailbox: int = 0) -> Awaitable[Any]: ...
    def get_message(self, timeout: float | None = None, mailbox: int = 0) -> Awaitable[Any]: ...
    def flush(self) -> int: ...
    def close(self) -> object: ...


def _parse_address(broker: str | tuple[str, int]) -> tuple[str, int]:
    if isinstance(broker, tuple):
        return broker
    host, sep, port = broker.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"broker address must be 'host:port', got {broker!r}")
    return (host or "127.0.0.1", int(port))


def check_codec(endpoint: object) -> None:
    """Refuse an endpoint whose codec cannot carry broker messages (lists).

    Raises:
        ConfigError: the endpoint's codec is not ``msgpack``.
    """
    codec = getattr(getattr(endpoint, "config", None), "codec", "msgpack")
    if codec != "msgpack":
        raise ConfigError(
            f"the broker protocol needs an endpoint with codec='msgpack', not {codec!r}"
        )


def _remote(reply: ErrorReply) -> RemoteError:
    return RemoteError(f"broker refused ({reply.code}): {reply.message}", code=reply.code)


def _wire_bodies(bodies: list[Any]) -> list[Any]:
    """``bodies`` in their wire form (:func:`~cmq.routing._protocol.wrap_body`).

    Raises:
        TypeError: a body is not MessagePack-able.
    """
    if SCALARS.issuperset(map(type, bodies)):
        return bodies
    return [wrap_body(b) for b in bodies]


def _plain_bodies(bodies: list[Any]) -> list[Any]:
    """Delivered bodies as their publishers gave them (wire form undone)."""
    if ExtType in map(type, bodies):
        return [unwrap_body(b) for b in bodies]
    return bodies


def _ms(seconds: float | None, what: str) -> int | None:
    """Seconds as AMQP's milliseconds (None stays None).

    Raises:
        ConfigError: negative.
    """
    if seconds is None:
        return None
    if not seconds >= 0:
        raise ConfigError(f"{what} must be >= 0 seconds, got {seconds!r}")
    return round(seconds * 1000)


def _queue_fields(
    name: str,
    max_length: int,
    overflow: str,
    dlx: str | None,
    dlrk: str | None,
    ttl: float | None,
    expires: float | None = None,
    max_length_bytes: int | None = None,
    max_priority: int | None = None,
) -> dict[str, Any]:
    arguments: dict[str, Any] = {}
    if dlx is not None:
        arguments["x-dead-letter-exchange"] = dlx
    if dlrk is not None:
        arguments["x-dead-letter-routing-key"] = dlrk
    if ttl is not None:
        arguments["x-message-ttl"] = _ms(ttl, "message_ttl")
    if expires is not None:
        ms = _ms(expires, "expires")
        if not ms:
            raise ConfigError(f"expires must be at least 0.001 seconds, got {expires!r}")
        arguments["x-expires"] = ms
    if max_length_bytes is not None:
        if type(max_length_bytes) is not int or max_length_bytes < 0:
            raise ConfigError(f"max_length_bytes must be a non-negative integer, got {max_length_bytes!r}")
        arguments["x-max-length-bytes"] = max_length_bytes
    if max_priority is not None:
        if type(max_priority) is not int or not 0 <= max_priority <= 255:
            raise ConfigError(f"max_priority must be an integer from 0 to 255, got {max_priority!r}")
        arguments["x-max-priority"] = max_priority
    return {"name": name, "max_length": max_length, "overflow": overflow, "arguments": arguments}


def _run_ok(run: Any) -> bool:
    """Whether ``run`` is a well-formed run in wire form (as ``decode`` checks it)."""
    return (
        type(run) is list
        and (len(run) == 5 or (len(run) == 6 and type(run[5]) is list))
        and type(run[0]) is int
        and run[0] >= 0
        and type(run[1]) is str
        and type(run[2]) is str
        and type(run[3]) is bool
        and type(run[4]) is list
    )


class _Run:
    """Buffered deliveries of one run (see :class:`~cmq.routing._protocol.Run`), read from ``pos``."""

    __slots__ = ("bodies", "exchange", "first", "key", "pos", "props", "redelivered")

    def __init__(
        self, first: int, exchange: str, key: str, redelivered: bool, bodies: list[Any], props: list[Any] | None
    ) -> None:
        self.first = first
        self.exchange = exchange
        self.key = key
        self.redelivered = redelivered
        self.bodies = bodies
        self.props = props  # AMQP properties, one per body (None: no message has any)
        self.pos = 0


class _ConsumerState:
    """One consumer's buffer, pending acks and auto-ack bookkeeping (no I/O).

    The buffer holds runs as they arrived; a :class:`Delivery` is made only
    when one is asked for, and :meth:`take_bodies` hands out a run's bodies
    without making any.
    """

    def __init__(self, spec: ConsumerSpec, auto_ack: bool) -> None:
        self.spec = spec
        self.auto_ack = auto_ack and not spec.no_ack
        self.buffer: collections.deque[_Run] = collections.deque()
        self.acks: list[int] = []
        # Handed out and to be auto-acked at the next take: (first tag, count) pairs.
        self.last: list[tuple[int, int]] = []
        self.cancelled_by: RemoteError | None = None
        self.cancelled = False
        # Tags nacked while handed out: not auto-acked.
        self.settled: set[int] = set()
        # Half the window: the broker refills while we work through the rest.
        self.ack_batch = max(1, spec.prefetch // 2) if spec.prefetch else 64

    def add(self, runs: list[Any]) -> None:
        """Buffer the runs of one delivery message (wire form, checked by the caller)."""
        buffer = self.buffer
        for run in runs:
            first, ex, key, redelivered, bodies = run[:5]
            if bodies:
                props = run[5] if len(run) > 5 else None
                buffer.append(_Run(first, ex, key, redelivered, _plain_bodies(bodies), props))

    def settle(self) -> None:
        """Auto-ack what was handed out before; raise if this consumer was cancelled.

        Raises:
            RemoteError: the broker cancelled this consumer.
            Closed: this consumer was cancelled here.
        """
        if self.last:
            if self.auto_ack:
                acks = self.acks
                for first, n in self.last:
                    acks.extend(range(first, first + n))
                if self.settled:
                    settled = self.settled
                    self.acks = [t for t in acks if t not in settled]
            self.last = []
            self.settled.clear()
        if self.cancelled_by is not None:
            raise self.cancelled_by
        if self.cancelled:
            raise Closed(f"consumer {self.spec.tag!r} was cancelled")

    def take(self) -> Delivery | None:
        """The next buffered delivery (auto-acking the ones handed out before), or None.

        Raises:
            RemoteError: the broker cancelled this consumer.
            Closed: this consumer was cancelled here.
        """
        self.settle()
        if not self.buffer:
            return None
        run = self.buffer[0]
        i = run.pos
        run.pos = i + 1
        if run.pos == len(run.bodies):
            self.buffer.popleft()
        tag = run.first + i
        self.last.append((tag, 1))
        props = run.props[i] if run.props is not None and i < len(run.props) else None
        return Delivery(delivery_tag=tag, exchange=run.exchange, routing_key=run.key,
                        body=run.bodies[i], redelivered=run.redelivered,
                        properties=props if type(props) is dict else None)  # fmt: skip

    def take_bodies(self, limit: int) -> list[Any]:
        """Up to ``limit`` buffered bodies, in order (auto-acking those handed out before).

        Raises:
            RemoteError: the broker cancelled this consumer.
            Closed: this consumer was cancelled here.
        """
        self.settle()
        out: list[Any] = []
        buffer, last = self.buffer, self.last
        while buffer and len(out) < limit:
            run = buffer[0]
            i = run.pos
            j = min(len(run.bodies), i + limit - len(out))
            out.extend(run.bodies[i:j] if i or j < len(run.bodies) else run.bodies)
            last.append((run.first + i, j - i))
            run.pos = j
            if j == len(run.bodies):
                buffer.popleft()
        return out

    def ack(self, delivery: Delivery) -> bool:
        """Note an ack; True when a batch is full and should be sent."""
        if not self.spec.no_ack:
            self.acks.append(delivery.delivery_tag)
        return self.acks_due

    @property
    def acks_due(self) -> bool:
        """Whether a batch of acks is held back and should be sent."""
        return len(self.acks) >= self.ack_batch

    def ack_payload(self) -> list[Any] | None:
        """The pending acks as one message (and forget them), or None."""
        if not self.acks:
            return None
        acks, self.acks = self.acks, []
        return ["a", self.spec.tag, acks]  # encode(Ack(...)), without the copy

    def cancel(self) -> None:
        """Mark cancelled; the broker requeues what was delivered but not acked."""
        if self.auto_ack:
            for first, n in self.last:
                self.acks.extend(range(first, first + n))
        self.last = []
        self.cancelled = True
        self.buffer.clear()


class _Session:
    """The client's protocol state, shared by the sync and async drivers; never waits."""

    def __init__(self, broker: tuple[str, int]) -> None:
        self.broker = broker
        # Random start: a restarted client on a reused port must not hit the
        # broker's reply cache with an old (sender, rid).
        self.rid = secrets.randbits(30) + 1
        self.errors: list[RemoteError] = []
        self.consumers: dict[str, _ConsumerState] = {}
        self.heartbeat_interval = _DEFAULT_HEARTBEAT
        self.last_heartbeat = float("-inf")
        self.unconfirmed = 0

    def request(self, make: Any, **fields: Any) -> tuple[int, list[Any]]:
        """A new request id and the request's payload."""
        self.rid = rid = self.rid % (1 << 31) + 1
        return rid, encode(make(rid=rid, **fields))

    def reply(self, payload: Any) -> OkReply | ErrorReply | None:
        """Decode a reply; keep unsolicited errors; None for anything else."""
        try:
            event = decode(payload)
        except ProtocolError:
            return None
        if isinstance(event, ErrorReply) and event.rid == 0:
            self.errors.append(_remote(event))
            return None
        if isinstance(event, OkReply | ErrorReply):
            return event
        return None

    def deliver(self, payload: Any) -> None:
        """Sort one delivery-mailbox message into its consumer's buffer."""
        # Hot path: ["d", tag, runs] with well-formed runs is buffered as it
        # came, without the Deliver and Run objects decode() would build
        # (and the copy of every run's bodies).
        if type(payload) is list and len(payload) == 3 and payload[0] == "d":
            tag, runs = payload[1], payload[2]
            if type(tag) is str and type(runs) is list and all(map(_run_ok, runs)):
                c = self.consumers.get(tag)
                if c is not None and not c.cancelled:
                    c.add(runs)
                return
        try:
            event: Event = decode(payload)
        except ProtocolError:
            return
        if isinstance(event, Deliver):
            c = self.consumers.get(event.tag)
            if c is not None and not c.cancelled:
                # The decoded runs' fields are checked; buffer them as they came.
                c.add(payload[2])
        elif isinstance(event, Cancelled):
            c = self.consumers.get(event.tag)
            if c is not None:
                c.cancelled_by = RemoteError(
                    f"broker cancelled the consumer ({event.code}): {event.message}",
                    code=event.code,
                )

    def attached(self, result: Any, now: float) -> None:
        """Take the heartbeat interval from the broker's ``consume`` reply."""
        self.heartbeat_interval = float(result["heartbeat"])
        self.last_heartbeat = now

    def heartbeat(self, now: float) -> list[Any] | None:
        """A heartbeat for all live consumers (None if there are none)."""
        self.last_heartbeat = now
        specs = tuple(c.spec for c in self.consumers.values() if not c.cancelled)
        return encode(Heartbeat(consumers=specs)) if specs else None

    def heartbeat_due(self, now: float) -> tuple[list[Any] | None, float]:
        """A heartbeat if one is due, and the seconds until the next one."""
        left = self.last_heartbeat + self.heartbeat_interval - now
        if left <= 0:
            return self.heartbeat(now), self.heartbeat_interval
        return None, left


PublishResult = int | RemoteError


class _Window:
    """Confirmed publishes in flight, by request id (no I/O).

    Each message of ``messages[start:start + size]`` is one ``Publish``
    request with its own rid; a resend reuses the rid, so the broker's reply
    cache makes it idempotent: a message is routed once however often it is
    sent.
    """

    def __init__(
        self,
        session: _Session,
        messages: list[tuple[str, str, Any]],
        start: int,
        size: int,
        results: list[PublishResult | None],
        properties: dict[str, Any] | None = None,
    ) -> None:
        self.results = results
        self.pending: dict[int, tuple[int, list[Any]]] = {}
        for i in range(start, min(start + size, len(messages))):
            exchange, key, body = messages[i]
            rid, payload = session.request(
                Publish, exchange=exchange, routing_key=key, body=wrap_body(body), properties=properties
            )
            self.pending[rid] = (i, payload)

    def payloads(self) -> list[list[Any]]:
        """What to send (again): every request not answered yet."""
        return [payload for _, payload in self.pending.values()]

    def on_reply(self, reply: OkReply | ErrorReply) -> None:
        entry = self.pending.pop(reply.rid, None)
        if entry is None:
            return  # a late answer to a resend: already counted
        if isinstance(reply, OkReply):
            self.results[entry[0]] = int(reply.result["routed"])
        else:
            self.results[entry[0]] = _remote(reply)


def _publish_many_args(messages: Any, window: int) -> list[tuple[str, str, Any]]:
    if window < 1:
        raise ConfigError(f"window must be >= 1, got {window}")
    return [(str(e), str(k), b) for e, k, b in messages]


def _result(reply: OkReply | ErrorReply) -> Any:
    if isinstance(reply, ErrorReply):
        raise _remote(reply)
    return reply.result


def _check_client_options(timeout: float, retries: int) -> None:
    if not timeout > 0 or retries < 0:
        raise ConfigError("timeout must be > 0 and retries >= 0")


def _new_consumer(
    session: _Session, queue: str, prefetch: int, no_ack: bool, auto_ack: bool, tag: str | None
) -> _ConsumerState:
    if prefetch < 0:
        raise ConfigError(f"prefetch must be >= 0, got {prefetch}")
    tag = tag or f"c-{secrets.token_hex(6)}"
    if tag in session.consumers:
        raise ConfigError(f"consumer tag {tag!r} is in use by this client")
    state = _ConsumerState(
        ConsumerSpec(tag=tag, queue=queue, prefetch=prefetch, no_ack=no_ack), auto_ack
    )
    session.consumers[tag] = state
    return state


class _ClientBase:
    """What the threaded and the asyncio clients share: everything that does not wait."""

    _s: _Session
    endpoint: Endpoint | AsyncEndpoint

    @property
    def broker(self) -> tuple[str, int]:
        """The broker's address."""
        return self._s.broker

    def _send(self, payload: list[Any] | None) -> None:
        if payload is not None:
            self.endpoint.push(self._s.broker, payload, BROKER_MAILBOX)
            self.endpoint.flush()

    def _collect_errors(self) -> None:
        while (msg := self.endpoint.pop_message(REPLY_MAILBOX)) is not None:
            self._s.reply(msg.payload)

    def errors(self) -> list[RemoteError]:
        """Return and forget the refusals of unconfirmed publishes received so far."""
        self._collect_errors()
        out, self._s.errors = self._s.errors, []
        return out

    def flush(self) -> None:
        """Send everything batched now."""
        self.endpoint.flush()

    def heartbeat(self) -> None:
        """Tell the broker this client's consumers are alive (waiting consumers do this)."""
        self._send(self._s.heartbeat(time.monotonic()))

    def _idle_turn(self, now: float) -> float:
        """Before a consumer waits: a heartbeat if one is due, with every
        consumer's pending acks; return the longest wait until the next.

        Acks short of a batch ride with the heartbeat rather than cost a
        datagram each time a consumer waits (a ping-pong waits after every
        message): a consumer holds fewer than half its prefetch window
        unacknowledged, so the broker still has credit to send it more.
        """
        beat, wait = self._s.heartbeat_due(now)
        if beat is not None:
            push, broker = self.endpoint.push, self._s.broker
            for c in self._s.consumers.values():
                acks = c.ack_payload()
                if acks is not None:
                    push(broker, acks, BROKER_MAILBOX)
            self._send(beat)
        return wait

    def _wait_for(self, c: _ConsumerState, deadline: float | None) -> float | None:
        """Before consumer ``c`` waits (its buffer is empty): send its acks
        if a batch is due and the heartbeat if one is due; return how long to
        wait, or None when ``deadline`` has passed (the caller then takes
        what is waiting without blocking, or times out).
        """
        if len(c.acks) >= c.ack_batch:  # c.acks_due, inline: once per wait
            self._send(c.ack_payload())
        now = time.monotonic()
        s = self._s
        wait = s.last_heartbeat + s.heartbeat_interval - now
        if wait <= 0:
            wait = self._idle_turn(now)
        if deadline is None:
            return wait
        if now >= deadline:
            return None
        return min(wait, deadline - now)

    def _take_waiting(self) -> None:
        while (msg := self.endpoint.pop_message(DELIVERY_MAILBOX)) is not None:
            self._s.deliver(msg.payload)

    def _push_batches(self, exchange: str, routing_key: str, bodies: list[Any], rid: int) -> None:
        """Push ``bodies`` as unconfirmed batch publishes of at most ``_BATCH_BYTES`` each."""
        push, broker = self.endpoint.push, self._s.broker
        bodies = _wire_bodies(bodies)
        start, size = 0, 0
        for i, body in enumerate(bodies):
            n = len(body) if type(body) is bytes else 16
            if size + n > _BATCH_BYTES and i > start:
                push(broker, ["P", rid, exchange, routing_key, bodies[start:i]], BROKER_MAILBOX)
                start, size = i, 0
            size += n
        if start < len(bodies):
            part = bodies if start == 0 else bodies[start:]
            push(broker, ["P", rid, exchange, routing_key, part], BROKER_MAILBOX)
        self._s.unconfirmed += 1
        if self._s.unconfirmed & 63 == 0:
            self._collect_errors()  # keep the reply mailbox from growing


class BrokerClient(_ClientBase):
    """A client of one cmq broker, on a :class:`cmq.Queue` (threads).

    ``BrokerClient("127.0.0.1:5700")`` opens its own endpoint on an ephemeral
    port; pass ``endpoint=`` to share one (the client uses its mailboxes 1
    and 2). Use it as a context manager or call :meth:`close`. ``key``: the
    shared key of a broker started with one (its endpoint signs and checks
    every datagram with it; a broker with a key drops what is not signed
    with it).

    A client belongs to one thread at a time: replies are matched by waiting
    on one mailbox, so two threads would take each other's. Clients are
    cheap (one UDP socket): open one per thread.

    Raises:
        ConfigError: a bad broker address or option.
    """

    def __init__(
        self,
        broker: str | tuple[str, int],
        *,
        endpoint: Endpoint | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        retries: int = DEFAULT_RETRIES,
        key: bytes | None = None,
    ) -> None:
        _check_client_options(timeout, retries)
        self._s = _Session(_parse_address(broker))
        self.timeout = timeout
        self.retries = retries
        if endpoint is None:
            from cmq.net import Queue  # the driver, imported only when used

            endpoint = Queue(port=0, host="0.0.0.0", codec="msgpack", key=key)
            self._owns_endpoint = True
        elif key is not None:
            raise ConfigError("key= is for the client's own endpoint: give the key to the endpoint you pass")
        else:
            check_codec(endpoint)
            self._owns_endpoint = False
        self.endpoint: Endpoint = endpoint

    def _request(self, make: Any, **fields: Any) -> Any:
        """Send a request, wait for its reply and return the ``ok`` result.

        Raises:
            RemoteError: the broker refused the request (``code`` says why).
            Timeout: no reply after ``retries`` resends.
        """
        rid, payload = self._s.request(make, **fields)
        step = self.timeout / (self.retries + 1)
        for _ in range(self.retries + 1):
            self._send(payload)
            deadline = time.monotonic() + step
            while (remaining := deadline - time.monotonic()) > 0:
                try:
                    msg = self.endpoint.get_message(timeout=remaining, mailbox=REPLY_MAILBOX)
                except Timeout:
                    break
                reply = self._s.reply(msg.payload)
                if reply is not None and reply.rid == rid:
                    return _result(reply)
        host, port = self._s.broker
        raise Timeout(f"no reply from broker {host}:{port} in {self.timeout} s")

    def declare_exchange(self, name: str, type: str = "direct", *, durable: bool = False) -> bool:
        """Declare exchange ``name`` of ``type``; True if it was created now.

        ``durable``: the exchange survives a restart of a broker that keeps
        its state on disk (``cmq broker --data-dir``).

        Raises:
            RemoteError: ``bad-request`` (unknown type), ``precondition-failed``
                (exists with another type or durability), ``access-refused`` (reserved name).
            Timeout: the broker did not answer.
        """
        return bool(self._request(DeclareExchange, name=name, type=type, durable=durable)["created"])

    def delete_exchange(self, name: str) -> bool:
        """Delete exchange ``name``; True if it existed.

        Raises:
            RemoteError: ``access-refused`` for the default exchange.
            Timeout: the broker did not answer.
        """
        return bool(self._request(DeleteExchange, name=name)["deleted"])

    def declare_queue(
        self,
        name: str,
        *,
        max_length: int = DEFAULT_MAX_LENGTH,
        overflow: str = "drop-head",
        dead_letter_exchange: str | None = None,
        dead_letter_routing_key: str | None = None,
        message_ttl: float | None = None,
        expires: float | None = None,
        max_length_bytes: int | None = None,
        max_priority: int | None = None,
        durable: bool = False,
    ) -> dict[str, Any]:
        """Declare queue ``name``; return ``{"created", "messages", "consumers"}``.

        ``durable``: the queue, its bindings to durable exchanges and the
        persistent messages in it (``publish(..., persistent=True)``)
        survive a restart of a broker that keeps its state on disk
        (``cmq broker --data-dir``), as AMQP's durable queues.

        ``overflow`` is what a full queue does with one more message, as
        RabbitMQ's ``x-overflow``: ``"drop-head"`` (the default: the oldest
        ready message is dropped or dead-lettered), ``"reject-publish"`` (the
        newcomer is refused: a confirmed publish raises ``queue-full``, an
        unconfirmed one is reported by :meth:`errors`) or
        ``"reject-publish-dlx"`` (the same, and the newcomer is
        dead-lettered). The older names are aliases: ``"drop-old"`` is
        drop-head, ``"reject"`` and ``"drop-new"`` are reject-publish.

        ``dead_letter_exchange`` (and ``dead_letter_routing_key``) receive
        the messages this queue drops: rejected by a consumer without
        requeue, expired, or over ``max_length`` (``x-dead-letter-exchange``,
        ``x-dead-letter-routing-key``). ``message_ttl``: seconds a message
        may wait in this queue (``x-message-ttl``). Every drop is counted in
        the broker's stats. ``expires``: seconds the queue may go unused (no
        consumer, no declare or get of it) before the broker deletes it with
        its messages (``x-expires``, as RabbitMQ's queue TTL).
        ``max_length_bytes``: the body bytes the queue's ready messages may
        hold (``x-max-length-bytes``); past it ``overflow`` applies, as past
        ``max_length``, whichever comes first. ``max_priority`` (1 to 255;
        0 is a plain queue): its ready messages go highest ``priority``
        first (see :meth:`publish`), as RabbitMQ's priority queues
        (``x-max-priority``); when full, ``drop-head`` drops the head, the
        oldest message of the highest priority.

        Raises:
            RemoteError: ``precondition-failed`` (exists with other
                arguments), ``bad-request`` (bad overflow, max_length or argument).
            Timeout: the broker did not answer.
            ConfigError: a negative ``message_ttl``, ``expires`` or
                ``max_length_bytes``, an ``expires`` under a millisecond, or
                a ``max_priority`` outside 0-255.
        """
        return dict(self._request(DeclareQueue, durable=durable, **_queue_fields(
            name, max_length, overflow, dead_letter_exchange, dead_letter_routing_key, message_ttl, expires,
            max_length_bytes, max_priority,
        )))  # fmt: skip

    def delete_queue(self, name: str) -> int:
        """Delete queue ``name``; return how many messages went with it.

        Raises:
            Timeout: the broker did not answer.
        """
        return int(self._request(DeleteQueue, name=name)["messages"])

    def purge_queue(self, name: str) -> int:
        """Drop the ready messages of queue ``name``; return how many.

        Raises:
            RemoteError: ``not-found``.
            Timeout: the broker did not answer.
        """
        return int(self._request(PurgeQueue, name=name)["messages"])

    def bind(
        self, queue: str, exchange: str, routing_key: str = "", *, arguments: Mapping[str, Any] | None = None
    ) -> bool:
        """Bind ``queue`` to ``exchange`` with binding key ``routing_key``; True if new.

        ``arguments`` are a headers exchange's: ``{"x-match": "all" or "any",
        header: value, ...}`` (a value of None: the header need only be present).

        Raises:
            RemoteError: ``not-found`` (no such exchange or queue),
                ``precondition-failed`` (a bad ``x-match``).
            Timeout: the broker did not answer.
        """
        return bool(self._request(Bind, queue=queue, exchange=exchange, key=routing_key,
                                  arguments=dict(arguments or {}))["created"])  # fmt: skip

    def unbind(
        self, queue: str, exchange: str, routing_key: str = "", *, arguments: Mapping[str, Any] | None = None
    ) -> bool:
        """Remove a binding (made with ``arguments``, for a headers exchange); True if it existed.

        Raises:
            RemoteError: ``not-found`` (no such exchange or queue).
            Timeout: the broker did not answer.
        """
        return bool(self._request(Unbind, queue=queue, exchange=exchange, key=routing_key,
                                  arguments=dict(arguments or {}))["deleted"])  # fmt: skip

    def stats(self) -> dict[str, Any]:
        """The broker's counters (see :class:`cmq.routing.BrokerStats`).

        Raises:
            Timeout: the broker did not answer.
        """
        return dict(self._request(GetStats))

    def publish(
        self,
        exchange: str,
        routing_key: str,
        body: Any,
        *,
        confirm: bool = False,
        ttl: float | None = None,
        persistent: bool = False,
        headers: Mapping[str, Any] | None = None,
        priority: int | None = None,
    ) -> int | None:
        """Publish ``body`` (any MessagePack value) to ``exchange`` with ``routing_key``.

        Without ``confirm``, returns None at once (see :meth:`errors`). With
        it, waits and returns the number of queues that kept the message.
        ``ttl``: seconds the message may wait in a queue before it expires
        (AMQP's per-message ``expiration``). ``persistent``: AMQP's
        ``delivery_mode`` 2: in a durable queue of a broker that keeps its
        state on disk, the message survives a restart until acknowledged,
        and the confirm comes only once it is on disk. ``headers``: AMQP's
        headers property (what a headers exchange routes on; AMQP consumers
        get it as such). ``priority`` (0-255, AMQP's property): where a
        priority queue (``max_priority``) puts it; other queues ignore it.

        Raises:
            RemoteError: (confirm only) ``not-found`` (no such exchange) or
                ``queue-full`` (a queue with ``overflow="reject"`` refused it).
            Timeout: (confirm only) the broker did not answer.
            TypeError: ``body`` is not MessagePack-able.
            ConfigError: a ``priority`` outside 0-255.
        """
        if confirm or ttl is not None or persistent or headers or priority is not None:
            props = _props(persistent, priority)
            if headers:
                props = {**(props or {}), "headers": dict(headers)}
            event = dict(exchange=exchange, routing_key=routing_key, body=wrap_body(body),
                         expiration=_ms(ttl, "ttl"), properties=props)  # fmt: skip
            if not confirm:
                self._send(encode(Publish(rid=0, **event)))
                return None
            return int(self._request(Publish, **event)["routed"])
        # The wire form of Publish(rid=0, ...), built inline: this is the hot path.
        if type(body) not in SCALARS:
            body = wrap_body(body)
        self.endpoint.push(self._s.broker, ["p", 0, exchange, routing_key, body], BROKER_MAILBOX)
        self._s.unconfirmed += 1
        if self._s.unconfirmed & 63 == 0:
            self._collect_errors()  # keep the reply mailbox from growing
        return None

    def publish_batch(
        self,
        exchange: str,
        routing_key: str,
        bodies: Iterable[Any],
        *,
        confirm: bool = False,
        persistent: bool = False,
    ) -> int | None:
        """Publish each of ``bodies``, in order, to ``exchange`` with ``routing_key``.

        The fast way to publish many messages with one key: they travel and
        are routed as batches, not one by one. Without ``confirm``, returns
        None at once (at most once; refusals come back through
        :meth:`errors`). With it, sends the batch as one request, waits, and
        returns the number of queues the messages went to. ``persistent``:
        each message is persistent, as :meth:`publish`'s (the batch then
        travels as one message, however large).

        Raises:
            RemoteError: (confirm only) ``not-found`` (no such exchange) or
                ``queue-full`` (a queue with ``overflow="reject"`` refused
                some; the others were routed).
            Timeout: (confirm only) the broker did not answer.
            TypeError: a body is not MessagePack-able.
        """
        items = bodies if type(bodies) is list else list(bodies)
        props = PERSISTENT if persistent else None
        if confirm:
            result = self._request(
                PublishBatch,
                exchange=exchange,
                routing_key=routing_key,
                bodies=tuple(_wire_bodies(items)),
                properties=props,
            )
            return int(result["routed"])
        if persistent and items:
            self._send(encode(PublishBatch(rid=0, exchange=exchange, routing_key=routing_key,
                                           bodies=tuple(_wire_bodies(items)), properties=props)))  # fmt: skip
            return None
        if items:
            self._push_batches(exchange, routing_key, items, 0)
        return None

    def publish_many(
        self,
        messages: Iterable[tuple[str, str, Any]],
        *,
        window: int = DEFAULT_PREFETCH,
        persistent: bool = False,
        priority: int | None = None,
    ) -> list[int | RemoteError]:
        """Publish ``(exchange, routing_key, body)`` messages, each confirmed, ``window`` at a time.

        ``persistent``, ``priority``: each message's, as :meth:`publish`'s.

        The reliable way to publish fast: up to ``window`` confirmed
        publishes are in flight at once, unanswered ones are resent (the
        broker routes each once, whatever the resends), and the result is,
        per message in order, the number of queues it went to or the
        :class:`~cmq.RemoteError` that refused it (``not-found``,
        ``queue-full``).

        Raises:
            ConfigError: ``window`` < 1, or a ``priority`` outside 0-255.
            Timeout: some message was not answered after ``retries`` resends
                (those before it were delivered to the broker).
            TypeError: a body is not MessagePack-able.
        """
        props = _props(persistent, priority)
        msgs = _publish_many_args(messages, window)
        results: list[PublishResult | None] = [None] * len(msgs)
        step = self.timeout / (self.retries + 1)
        for start in range(0, len(msgs), window):
            w = _Window(self._s, msgs, start, window, results, props)
            for _ in range(self.retries + 1):
                for payload in w.payloads():
                    self.endpoint.push(self._s.broker, payload, BROKER_MAILBOX)
                self.endpoint.flush()
                deadline = time.monotonic() + step
                while w.pending and (remaining := deadline - time.monotonic()) > 0:
                    try:
                        msg = self.endpoint.get_message(timeout=remaining, mailbox=REPLY_MAILBOX)
                    except Timeout:
                        break
                    reply = self._s.reply(msg.payload)
                    if reply is not None:
                        w.on_reply(reply)
                if not w.pending:
                    break
            else:
                host, port = self._s.broker
                raise Timeout(f"{len(w.pending)} publishes unanswered by broker {host}:{port}")
        return [r for r in results if r is not None]

    def consume(
        self,
        queue: str,
        *,
        prefetch: int = DEFAULT_PREFETCH,
        no_ack: bool = False,
        auto_ack: bool = True,
        tag: str | None = None,
    ) -> Consumer:
        """Attach a consumer to ``queue`` and return it (an iterator of deliveries).

        ``prefetch`` bounds unacknowledged deliveries (0: no bound; ignored
        with ``no_ack``, which is at most once and fastest). With
        ``auto_ack=False`` call :meth:`Consumer.ack` yourself.

        Raises:
            ConfigError: a bad prefetch, or ``tag`` already used by this client.
            RemoteError: ``not-found`` (no such queue), ``in-use`` (tag taken).
            Timeout: the broker did not answer.
        """
        state = _new_consumer(self._s, queue, prefetch, no_ack, auto_ack, tag)
        try:
            result = self._request(
                Consume, tag=state.spec.tag, queue=queue, prefetch=prefetch, no_ack=no_ack
            )
        except BaseException:
            del self._s.consumers[state.spec.tag]
            raise
        self._s.attached(result, time.monotonic())
        return Consumer(self, state)

    def _pump(self, timeout: float) -> None:
        """Wait up to ``timeout`` for one delivery message and buffer it.

        One blocking read and nothing more: it takes what is already
        queued first, and a message that comes while we wait is handed
        straight to us. A non-blocking read for more would cost a system
        call per message that finds nothing when messages come one at a
        time (a ping-pong); when they come faster, the next call's read
        returns at once.
        """
        try:
            # get, not get_message: a delivery's sender is the broker.
            payload = self.endpoint.get(timeout=timeout, mailbox=DELIVERY_MAILBOX)
        except Timeout:
            return
        self._s.deliver(payload)

    def close(self) -> None:
        """Cancel the consumers (best effort) and close the endpoint if it is ours."""
        for tag in list(self._s.consumers):
            with contextlib.suppress(Timeout, RemoteError):  # else the broker expires it
                Consumer(self, self._s.consumers[tag]).cancel()
        if self._owns_endpoint:
            self.endpoint.close()

    def __enter__(self) -> BrokerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _ConsumerBase:
    """What the sync and async consumers share: everything that does not wait."""

    def __init__(self, client: _ClientBase, state: _ConsumerState) -> None:
        self.client = client
        self._c = state

    @property
    def tag(self) -> str:
        """The consumer tag."""
        return self._c.spec.tag

    def ack(self, delivery: Delivery) -> None:
        """Acknowledge ``delivery`` (sent with the next batch of acks)."""
        if self._c.ack(delivery):
            self.client._send(self._c.ack_payload())

    def nack(self, delivery: Delivery, *, requeue: bool = True) -> None:
        """Give ``delivery`` back (AMQP's basic.nack; basic.reject is the same for one).

        With ``requeue``, it goes back to the front of its queue, marked
        redelivered; without, to the queue's dead-letter exchange (dropped,
        and counted, when the queue has none). Sent at once; with
        ``auto_ack`` it is then not acknowledged.
        """
        if self._c.spec.no_ack:
            raise ConfigError("a no_ack consumer cannot nack: its deliveries are settled on sending")
        self._c.settled.add(delivery.delivery_tag)
        self.client._send(["n", self._c.spec.tag, [delivery.delivery_tag], requeue])

    def reject(self, delivery: Delivery, *, requeue: bool = True) -> None:
        """Give ``delivery`` back: :meth:`nack` (AMQP's basic.reject)."""
        self.nack(delivery, requeue=requeue)

    def _send_due_acks(self) -> None:
        """Send the acknowledgements held back once a batch of them is due."""
        if self._c.acks_due:
            self.client._send(self._c.ack_payload())

    def get_nowait(self) -> Delivery | None:
        """The next delivery if one is here, else None. Never blocks.

        Raises:
            RemoteError: the broker cancelled this consumer (queue deleted).
            Closed: the consumer was cancelled.
        """
        d = self._c.take()
        if d is None:
            self.client._take_waiting()
            d = self._c.take()
        self._send_due_acks()
        return d

    def get_bodies_nowait(self, limit: int = 1 << 30) -> list[Any]:
        """The bodies of up to ``limit`` deliveries that are here (possibly none). Never blocks.

        Raises:
            RemoteError: the broker cancelled this consumer (queue deleted).
            Closed: the consumer was cancelled.
        """
        c = self._c
        out = c.take_bodies(limit)
        if not out:
            self.client._take_waiting()
            out = c.take_bodies(limit)
        self._send_due_acks()
        return out

    def _delivery_at_deadline(self, timeout: float | None) -> Delivery:
        """A waiting get's last look once its deadline passed: a delivery here, else Timeout."""
        d = self.get_nowait()
        if d is None:
            raise self._timeout(timeout)
        return d

    def _bodies_at_deadline(self, limit: int, timeout: float | None) -> list[Any]:
        """As :meth:`_delivery_at_deadline`, for ``get_bodies``."""
        out = self.get_bodies_nowait(limit)
        if not out:
            raise self._timeout(timeout)
        return out

    def _timeout(self, timeout: float | None) -> Timeout:
        return Timeout(f"no delivery from queue {self._c.spec.queue!r} in {timeout} s")


class Consumer(_ConsumerBase):
    """Deliveries from one queue: ``for delivery in consumer: ...``.

    Iteration ends only by ``break`` or an error; :meth:`get` takes one
    delivery with a timeout; leaving a ``with`` block cancels.
    """

    client: BrokerClient

    def __init__(self, client: BrokerClient, state: _ConsumerState) -> None:
        super().__init__(client, state)

    @property
    def auto_ack(self) -> bool:
        """Whether a delivery is acknowledged when the next one is asked for."""
        return self._c.auto_ack

    def get(self, timeout: float | None = None) -> Delivery:
        """The next delivery, waiting up to ``timeout`` seconds (None: forever).

        Raises:
            Timeout: nothing arrived in time.
            RemoteError: the broker cancelled this consumer (queue deleted).
            Closed: the consumer was cancelled.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        c, client = self._c, self.client
        while (d := c.take()) is None:
            wait = client._wait_for(c, deadline)
            if wait is None:
                return self._delivery_at_deadline(timeout)
            client._pump(wait)
        self._send_due_acks()
        return d

    def get_bodies(self, timeout: float | None = None, limit: int = 1 << 30) -> list[Any]:
        """The bodies of up to ``limit`` deliveries that are here, waiting up to
        ``timeout`` seconds (None: forever) for at least one.

        The fast way to consume: no :class:`Delivery` is made per message.
        With ``auto_ack`` they are acknowledged at the next ``get*`` call.

        Raises:
            Timeout: nothing arrived in time.
            RemoteError: the broker cancelled this consumer (queue deleted).
            Closed: the consumer was cancelled.
        """
        c, client = self._c, self.client
        if c.buffer or c.cancelled or c.cancelled_by is not None:
            out = c.take_bodies(limit)
        else:
            # Nothing buffered (a ping-pong's every call): take_bodies'
            # bookkeeping only, the auto-acks of what was handed out before.
            if c.last:
                c.settle()
            out = []
        if not out:
            deadline = None if timeout is None else time.monotonic() + timeout
            get, tag = client.endpoint.get, c.spec.tag
            while True:
                wait = client._wait_for(c, deadline)
                if wait is None:
                    return self._bodies_at_deadline(limit, timeout)
                # One blocking read and nothing more: a message that comes
                # while we wait is handed straight to us (get, not
                # get_message: a delivery's sender is the broker).
                try:
                    payload = get(timeout=wait, mailbox=DELIVERY_MAILBOX)
                except Timeout:
                    pass  # the buffer may have been filled meanwhile
                else:
                    # One run of at most ``limit`` bodies for this consumer
                    # (a ping-pong's every message): its bodies go out at
                    # once, as take_bodies would hand them, unbuffered.
                    if type(payload) is list and len(payload) == 3 and payload[0] == "d" and payload[1] == tag:
                        runs = payload[2]
                        if type(runs) is list and len(runs) == 1 and not c.buffer and not c.cancelled:
                            run = runs[0]
                            if _run_ok(run) and 0 < len(bodies := run[4]) <= limit:
                                c.last.append((run[0], len(bodies)))
                                out = _plain_bodies(bodies)
                                break
                    client._s.deliver(payload)
                out = c.take_bodies(limit)
                if out:
                    break
        if len(c.acks) >= c.ack_batch:  # _send_due_acks, inline
            client._send(c.ack_payload())
        return out

    def __iter__(self) -> Iterator[Delivery]:
        return self

    def __next__(self) -> Delivery:
        # Iteration ends quietly when the consumer was cancelled here (say by
        # another thread); a broker-side cancel still raises RemoteError.
        try:
            return self.get()
        except Closed:
            raise StopIteration from None

    def cancel(self) -> None:
        """Detach from the queue; unacknowledged deliveries go back to it.

        Raises:
            Timeout: the broker did not answer.
        """
        if self._c.cancelled:
            return
        self._c.cancel()
        self.client._send(self._c.ack_payload())
        try:
            self.client._request(Cancel, tag=self._c.spec.tag)
        finally:
            self.client._s.consumers.pop(self._c.spec.tag, None)

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cancel()


class AsyncBrokerClient(_ClientBase):
    """A client of one cmq broker, on a :class:`cmq.AsyncQueue` (asyncio).

    Open it with ``await AsyncBrokerClient.open("127.0.0.1:5700")`` (or pass
    an open ``endpoint=``); the methods are :class:`BrokerClient`'s, as
    coroutines where they wait. Use it from the loop it was opened on.

    Raises:
        ConfigError: a bad broker address or option.
    """

    def __init__(
        self,
        broker: str | tuple[str, int],
        *,
        endpoint: AsyncEndpoint,
        timeout: float = DEFAULT_TIMEOUT,
        retries: int = DEFAULT_RETRIES,
        owns_endpoint: bool = False,
    ) -> None:
        _check_client_options(timeout, retries)
        check_codec(endpoint)
        self._s = _Session(_parse_address(broker))
        self.timeout = timeout
        self.retries = retries
        self.endpoint = endpoint
        self._owns_endpoint = owns_endpoint

    @classmethod
    async def open(
        cls,
        broker: str | tuple[str, int],
        *,
        timeout: float = DEFAULT_TIMEOUT,
        retries: int = DEFAULT_RETRIES,
        key: bytes | None = None,
    ) -> AsyncBrokerClient:
        """Open an endpoint on the running loop and a client on it; ``key``:
        the broker's key (see :class:`BrokerClient`).

        Raises:
            ConfigError: a bad broker address or option.
            TransportError: the OS refused the socket.
        """
        from cmq.net.aqueue import AsyncQueue

        endpoint = await AsyncQueue.open(port=0, host="0.0.0.0", codec="msgpack", key=key)
        return cls(broker, endpoint=endpoint, timeout=timeout, retries=retries, owns_endpoint=True)

    async def _request(self, make: Any, **fields: Any) -> Any:
        """As :meth:`BrokerClient._request`."""
        rid, payload = self._s.request(make, **fields)
        step = self.timeout / (self.retries + 1)
        for _ in range(self.retries + 1):
            self._send(payload)
            deadline = time.monotonic() + step
            while (remaining := deadline - time.monotonic()) > 0:
                try:
                    msg = await self.endpoint.get_message(timeout=remaining, mailbox=REPLY_MAILBOX)
                except Timeout:
                    break
                reply = self._s.reply(msg.payload)
                if reply is not None and reply.rid == rid:
                    return _result(reply)
        host, port = self._s.broker
        raise Timeout(f"no reply from broker {host}:{port} in {self.timeout} s")

    async def declare_exchange(self, name: str, type: str = "direct", *, durable: bool = False) -> bool:
        """As :meth:`BrokerClient.declare_exchange` (raises RemoteError, Timeout)."""
        return bool((await self._request(DeclareExchange, name=name, type=type, durable=durable))["created"])

    async def delete_exchange(self, name: str) -> bool:
        """As :meth:`BrokerClient.delete_exchange` (raises RemoteError, Timeout)."""
        return bool((await self._request(DeleteExchange, name=name))["deleted"])

    async def declare_queue(
        self,
        name: str,
        *,
        max_length: int = DEFAULT_MAX_LENGTH,
        overflow: str = "drop-head",
        dead_letter_exchange: str | None = None,
        dead_letter_routing_key: str | None = None,
        message_ttl: float | None = None,
        expires: float | None = None,
        max_length_bytes: int | None = None,
        max_priority: int | None = None,
        durable: bool = False,
    ) -> dict[str, Any]:
        """As :meth:`BrokerClient.declare_queue` (raises RemoteError, Timeout)."""
        return dict(await self._request(DeclareQueue, durable=durable, **_queue_fields(
            name, max_length, overflow, dead_letter_exchange, dead_letter_routing_key, message_ttl, expires,
            max_length_bytes, max_priority,
        )))  # fmt: skip

    async def delete_queue(self, name: str) -> int:
        """As :meth:`BrokerClient.delete_queue` (raises Timeout)."""
        return int((await self._request(DeleteQueue, name=name))["messages"])

    async def purge_queue(self, name: str) -> int:
        """As :meth:`BrokerClient.purge_queue` (raises RemoteError, Timeout)."""
        return int((await self._request(PurgeQueue, name=name))["messages"])

    async def bind(
        self, queue: str, exchange: str, routing_key: str = "", *, arguments: Mapping[str, Any] | None = None
    ) -> bool:
        """As :meth:`BrokerClient.bind` (raises RemoteError, Timeout)."""
        return bool((await self._request(Bind, queue=queue, exchange=exchange, key=routing_key,
                                         arguments=dict(arguments or {})))["created"])  # fmt: skip

    async def unbind(
        self, queue: str, exchange: str, routing_key: str = "", *, arguments: Mapping[str, Any] | None = None
    ) -> bool:
        """As :meth:`BrokerClient.unbind` (raises RemoteError, Timeout)."""
        return bool((await self._request(Unbind, queue=queue, exchange=exchange, key=routing_key,
                                         arguments=dict(arguments or {})))["deleted"])  # fmt: skip

    async def stats(self) -> dict[str, Any]:
        """As :meth:`BrokerClient.stats` (raises Timeout)."""
        return dict(await self._request(GetStats))

    async def publish(
        self,
        exchange: str,
        routing_key: str,
        body: Any,
        *,
        confirm: bool = False,
        persistent: bool = False,
        priority: int | None = None,
    ) -> int | None:
        """As :meth:`BrokerClient.publish`; only ``confirm=True`` waits.

        Raises:
            RemoteError, Timeout: (confirm only) as :meth:`BrokerClient.publish`.
            TypeError: ``body`` is not MessagePack-able.
            ConfigError: a ``priority`` outside 0-255.
        """
        props = _props(persistent, priority)
        if confirm:
            result = await self._request(
                Publish, exchange=exchange, routing_key=routing_key, body=wrap_body(body), properties=props
            )
            return int(result["routed"])
        if props is not None:
            self.endpoint.push(self._s.broker, encode(Publish(rid=0, exchange=exchange, routing_key=routing_key,
                                                              body=wrap_body(body), properties=props)),
                               BROKER_MAILBOX)  # fmt: skip
            return None
        self.publish_nowait(exchange, routing_key, body)
        return None

    async def publish_many(
        self,
        messages: Iterable[tuple[str, str, Any]],
        *,
        window: int = DEFAULT_PREFETCH,
        persistent: bool = False,
        priority: int | None = None,
    ) -> list[int | RemoteError]:
        """As :meth:`BrokerClient.publish_many` (raises ConfigError, Timeout, TypeError)."""
        props = _props(persistent, priority)
        msgs = _publish_many_args(messages, window)
        results: list[PublishResult | None] = [None] * len(msgs)
        step = self.timeout / (self.retries + 1)
        for start in range(0, len(msgs), window):
            w = _Window(self._s, msgs, start, window, results, props)
            for _ in range(self.retries + 1):
                for payload in w.payloads():
                    self.endpoint.push(self._s.broker, payload, BROKER_MAILBOX)
                self.endpoint.flush()
                deadline = time.monotonic() + step
                while w.pending and (remaining := deadline - time.monotonic()) > 0:
                    try:
                        msg = await self.endpoint.get_message(
                            timeout=remaining, mailbox=REPLY_MAILBOX
                        )
                    except Timeout:
                        break
                    reply = self._s.reply(msg.payload)
                    if reply is not None:
                        w.on_reply(reply)
                if not w.pending:
                    break
            else:
                host, port = self._s.broker
                raise Timeout(f"{len(w.pending)} publishes unanswered by broker {host}:{port}")
        return [r for r in results if r is not None]

    async def publish_batch(
        self, exchange: str, routing_key: str, bodies: Iterable[Any], *, confirm: bool = False
    ) -> int | None:
        """As :meth:`BrokerClient.publish_batch`; only ``confirm=True`` waits.

        Raises:
            RemoteError, Timeout: (confirm only) as :meth:`BrokerClient.publish_batch`.
            TypeError: a body is not MessagePack-able.
        """
        items = bodies if type(bodies) is list else list(bodies)
        if confirm:
            result = await self._request(
                PublishBatch,
                exchange=exchange,
                routing_key=routing_key,
                bodies=tuple(_wire_bodies(items)),
            )
            return int(result["routed"])
        if items:
            self._push_batches(exchange, routing_key, items, 0)
        return None

    def publish_nowait(self, exchange: str, routing_key: str, body: Any) -> None:
        """Publish without confirm and without awaiting (a loop can call it a million times).

        Raises:
            TypeError: ``body`` is not MessagePack-able.
        """
        if type(body) not in SCALARS:
            body = wrap_body(body)
        self.endpoint.push(self._s.broker, ["p", 0, exchange, routing_key, body], BROKER_MAILBOX)
        self._s.unconfirmed += 1
        if self._s.unconfirmed & 63 == 0:
            self._collect_errors()

    async def consume(
        self,
        queue: str,
        *,
        prefetch: int = DEFAULT_PREFETCH,
        no_ack: bool = False,
        auto_ack: bool = True,
        tag: str | None = None,
    ) -> AsyncConsumer:
        """As :meth:`BrokerClient.consume`; returns an async iterator of deliveries.

        Raises:
            ConfigError, RemoteError, Timeout: as :meth:`BrokerClient.consume`.
        """
        state = _new_consumer(self._s, queue, prefetch, no_ack, auto_ack, tag)
        try:
            result = await self._request(
                Consume, tag=state.spec.tag, queue=queue, prefetch=prefetch, no_ack=no_ack
            )
        except BaseException:
            del self._s.consumers[state.spec.tag]
            raise
        self._s.attached(result, time.monotonic())
        return AsyncConsumer(self, state)

    async def _pump(self, timeout: float) -> None:
        # As BrokerClient._pump: one wait, no non-blocking read after it.
        try:
            payload = await self.endpoint.get(timeout=timeout, mailbox=DELIVERY_MAILBOX)
        except Timeout:
            return
        self._s.deliver(payload)

    async def aclose(self) -> None:
        """Cancel the consumers (best effort) and close the endpoint if it is ours."""
        for tag in list(self._s.consumers):
            with contextlib.suppress(Timeout, RemoteError):
                await AsyncConsumer(self, self._s.consumers[tag]).cancel()
        if self._owns_endpoint:
            self.endpoint.close()

    async def __aenter__(self) -> AsyncBrokerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class AsyncConsumer(_ConsumerBase):
    """Deliveries from one queue: ``async for delivery in consumer: ...``."""

    client: AsyncBrokerClient

    def __init__(self, client: AsyncBrokerClient, state: _ConsumerState) -> None:
        super().__init__(client, state)

    async def get(self, timeout: float | None = None) -> Delivery:
        """As :meth:`Consumer.get` (raises Timeout, RemoteError)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        c, client = self._c, self.client
        while (d := c.take()) is None:
            wait = client._wait_for(c, deadline)
            if wait is None:
                return self._delivery_at_deadline(timeout)
            await client._pump(wait)
        self._send_due_acks()
        return d

    async def get_bodies(self, timeout: float | None = None, limit: int = 1 << 30) -> list[Any]:
        """As :meth:`Consumer.get_bodies` (raises Timeout, RemoteError, Closed)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        c, client = self._c, self.client
        while not (out := c.take_bodies(limit)):
            wait = client._wait_for(c, deadline)
            if wait is None:
                return self._bodies_at_deadline(limit, timeout)
            await client._pump(wait)
        self._send_due_acks()
        return out

    def __aiter__(self) -> AsyncIterator[Delivery]:
        return self

    async def __anext__(self) -> Delivery:
        try:
            return await self.get()
        except Closed:
            raise StopAsyncIteration from None

    async def cancel(self) -> None:
        """As :meth:`Consumer.cancel` (raises Timeout)."""
        if self._c.cancelled:
            return
        self._c.cancel()
        self.client._send(self._c.ack_payload())
        try:
            await self.client._request(Cancel, tag=self._c.spec.tag)
        finally:
            self.client._s.consumers.pop(self._c.spec.tag, None)

    async def __aenter__(self) -> AsyncConsumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.cancel()
