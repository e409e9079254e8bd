"""The broker's client: declarations, publish, and consumers (sync and async).

Theory of operation
-------------------
A :class:`BrokerClient` owns (or borrows) one cmq endpoint and talks to one
broker with the protocol of :mod:`cmq.routing._protocol`. Requests wait for
their reply on ``REPLY_MAILBOX`` and are resent with the same ``rid`` when the
reply does not come within ``timeout / (retries + 1)``; the broker answers a
resent request from its reply cache, so a resend never does anything twice.

Publishing without ``confirm`` is fire-and-forget: the message is batched by
the endpoint and the call returns at once. A broker that refuses such a
message (unknown exchange, a full queue with ``overflow="reject"``) sends back
an unsolicited error; the client collects those and hands them out with
:meth:`BrokerClient.errors`. ``confirm=True`` waits for the broker instead and
raises the refusal as :class:`~cmq.RemoteError`.

Consumers. :meth:`BrokerClient.consume` attaches a :class:`Consumer`, which
is an iterator and an async iterator of :class:`Delivery`. Deliveries of all
the client's consumers arrive on ``DELIVERY_MAILBOX`` and are sorted into
per-consumer buffers. While a consumer waits it sends one heartbeat per
interval for all the client's consumers, and its pending acknowledgements.
With ``auto_ack`` (the default) a delivery is acknowledged when the next one
is asked for, that is after the loop body that handled it finished; acks are
sent in batches of half the prefetch window, and always before waiting.

Guarantee: without ``no_ack``, at least once. A message whose ack is lost or
late, or whose consumer went silent longer than the broker's
``consumer_timeout``, is delivered again with ``redelivered=True``. A loop
body that runs longer than that timeout sends no heartbeat meanwhile: call
:meth:`BrokerClient.heartbeat` from it, or expect redeliveries.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import secrets
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any, Final, Protocol

from cmq._errors import ConfigError, ProtocolError, RemoteError, Timeout
from cmq.routing._protocol import (
    BROKER_MAILBOX,
    DELIVERY_MAILBOX,
    REPLY_MAILBOX,
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
    Delivery,
    ErrorReply,
    Event,
    GetStats,
    Heartbeat,
    OkReply,
    Publish,
    PurgeQueue,
    Unbind,
    decode,
    encode,
)

__all__ = [
    "DEFAULT_MAX_LENGTH",
    "DEFAULT_PREFETCH",
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
DEFAULT_TIMEOUT: Final = 2.0
DEFAULT_RETRIES: Final = 3
# Heartbeat interval until the broker tells us its own.
_DEFAULT_HEARTBEAT: Final = 1.0


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
    def get_message(self, timeout: float | None = None, mailbox: int = 0) -> Any: ...
    def flush(self) -> int: ...
    def close(self) -> None: ...


def _parse_address(broker: str | tuple[str, int]) -> tuple[str, int]:
    if isinstance(broker, tuple):
        return broker
    host, sep, port = broker.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"broker address must be 'host:port', got {broker!r}")
    return (host or "127.0.0.1", int(port))


def check_codec(endpoint: Endpoint) -> None:
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


class BrokerClient:
    """A connection-free client of one cmq broker.

    ``BrokerClient("127.0.0.1:5700")`` opens its own endpoint on an ephemeral
    port; pass ``endpoint=`` to share one (the client uses its mailboxes 1
    and 2). Use it as a context manager or call :meth:`close`.

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
    ) -> None:
        if not timeout > 0 or retries < 0:
            raise ConfigError("timeout must be > 0 and retries >= 0")
        self.broker = _parse_address(broker)
        self.timeout = timeout
        self.retries = retries
        if endpoint is None:
            from cmq.net import Queue  # the driver, imported only when used

            endpoint = Queue(port=0, host="0.0.0.0", codec="msgpack")
            self._owns_endpoint = True
        else:
            check_codec(endpoint)
            self._owns_endpoint = False
        self.endpoint: Endpoint = endpoint
        # Random start: a restarted client on a reused port must not hit the
        # broker's reply cache with an old (sender, rid).
        self._rid = secrets.randbits(30) + 1
        self._errors: list[RemoteError] = []
        self._consumers: dict[str, Consumer] = {}
        self._heartbeat_interval = _DEFAULT_HEARTBEAT
        self._last_heartbeat = time.monotonic()
        self._unconfirmed = 0

    # -- requests ----------------------------------------------------------

    def _request(self, make: Any, **fields: Any) -> Any:
        """Send a request, wait for its reply and return the ``ok`` result.

        Raises:
            RemoteError: the broker refused the request (``code`` says why).
            Timeout: no reply after ``retries`` resends.
        """
        self._rid = rid = self._rid % (1 << 31) + 1
        payload = encode(make(rid=rid, **fields))
        step = self.timeout / (self.retries + 1)
        for _ in range(self.retries + 1):
            self.endpoint.push(self.broker, payload, BROKER_MAILBOX)
            self.endpoint.flush()
            deadline = time.monotonic() + step
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                try:
                    msg = self.endpoint.get_message(timeout=remaining, mailbox=REPLY_MAILBOX)
                except Timeout:
                    break
                reply = self._reply(msg)
                if reply is not None and reply.rid == rid:
                    if isinstance(reply, ErrorReply):
                        raise _remote(reply)
                    return reply.result
        raise Timeout(f"no reply from broker {self.broker[0]}:{self.broker[1]} in {self.timeout} s")

    def _reply(self, msg: _Message) -> OkReply | ErrorReply | None:
        """Decode a reply; keep unsolicited errors; None for anything else."""
        try:
            event = decode(msg.payload)
        except ProtocolError:
            return None
        if isinstance(event, ErrorReply) and event.rid == 0:
            self._errors.append(_remote(event))
            return None
        if isinstance(event, OkReply | ErrorReply):
            return event
        return None

    def declare_exchange(self, name: str, type: str = "direct") -> bool:
        """Declare exchange ``name`` of ``type``; True if it was created now.

        Raises:
            RemoteError: ``bad-request`` (unknown type), ``precondition-failed``
                (exists with another type), ``access-refused`` (reserved name).
            Timeout: the broker did not answer.
        """
        return bool(self._request(DeclareExchange, name=name, type=type)["created"])

    def delete_exchange(self, name: str) -> bool:
        """Delete exchange ``name``; True if it existed.

        Raises:
            RemoteError: ``access-refused`` for the default exchange.
            Timeout: the broker did not answer.
        """
        return bool(self._request(DeleteExchange, name=name)["deleted"])

    def declare_queue(
        self, name: str, *, max_length: int = DEFAULT_MAX_LENGTH, overflow: str = "drop-old"
    ) -> dict[str, Any]:
        """Declare queue ``name``; return ``{"created", "messages", "consumers"}``.

        ``overflow`` is what a full queue does with one more message:
        ``"drop-old"`` (RabbitMQ's default), ``"drop-new"`` or ``"reject"``
        (the publisher gets a ``queue-full`` error). Every drop is counted in
        the broker's stats.

        Raises:
            RemoteError: ``precondition-failed`` (exists with other
                arguments), ``bad-request`` (bad overflow or max_length).
            Timeout: the broker did not answer.
        """
        result: dict[str, Any] = self._request(
            DeclareQueue, name=name, max_length=max_length, overflow=overflow
        )
        return result

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

    def bind(self, queue: str, exchange: str, routing_key: str = "") -> bool:
        """Bind ``queue`` to ``exchange`` with binding key ``routing_key``; True if new.

        Raises:
            RemoteError: ``not-found`` (no such exchange or queue).
            Timeout: the broker did not answer.
        """
        return bool(self._request(Bind, queue=queue, exchange=exchange, key=routing_key)["created"])

    def unbind(self, queue: str, exchange: str, routing_key: str = "") -> bool:
        """Remove a binding; True if it existed.

        Raises:
            RemoteError: ``not-found`` (no such exchange or queue).
            Timeout: the broker did not answer.
        """
        return bool(
            self._request(Unbind, queue=queue, exchange=exchange, key=routing_key)["deleted"]
        )

    def stats(self) -> dict[str, Any]:
        """The broker's counters (see :class:`cmq.routing.BrokerStats`).

        Raises:
            Timeout: the broker did not answer.
        """
        result: dict[str, Any] = self._request(GetStats)
        return result

    def publish(
        self, exchange: str, routing_key: str, body: Any, *, confirm: bool = False
    ) -> int | None:
        """Publish ``body`` (any MessagePack value) to ``exchange`` with ``routing_key``.

        Without ``confirm``, returns None at once (see :meth:`errors`). With
        it, waits and returns the number of queues the message went to.

        Raises:
            RemoteError: (confirm only) ``not-found`` (no such exchange) or
                ``queue-full`` (a queue with ``overflow="reject"`` refused it).
            Timeout: (confirm only) the broker did not answer.
            TypeError: ``body`` is not MessagePack-able.
        """
        if confirm:
            return int(
                self._request(Publish, exchange=exchange, routing_key=routing_key, body=body)[
                    "routed"
                ]
            )
        self.endpoint.push(self.broker, ["p", 0, exchange, routing_key, body], BROKER_MAILBOX)
        self._unconfirmed += 1
        if self._unconfirmed & 63 == 0:
            self._collect_errors()  # keep the reply mailbox from growing
        return None

    def _collect_errors(self) -> None:
        while (msg := self.endpoint.pop_message(REPLY_MAILBOX)) is not None:
            self._reply(msg)

    def errors(self) -> list[RemoteError]:
        """Return and forget the refusals of unconfirmed publishes received so far."""
        self._collect_errors()
        out, self._errors = self._errors, []
        return out

    def flush(self) -> None:
        """Send everything batched now."""
        self.endpoint.flush()

    # -- consumers ---------------------------------------------------------

    def consume(
        self,
        queue: str,
        *,
        prefetch: int = DEFAULT_PREFETCH,
        no_ack: bool = False,
        auto_ack: bool = True,
        tag: str | None = None,
    ) -> Consumer:
        """Attach a consumer to ``queue`` and return it (iterate it, sync or async).

        ``prefetch`` bounds unacknowledged deliveries (0: no bound; ignored
        with ``no_ack``, which is at most once and fastest). With
        ``auto_ack=False`` call :meth:`Consumer.ack` yourself.

        Raises:
            RemoteError: ``not-found`` (no such queue), ``in-use`` (tag taken).
            Timeout: the broker did not answer.
        """
        if prefetch < 0:
            raise ConfigError(f"prefetch must be >= 0, got {prefetch}")
        tag = tag or f"c-{secrets.token_hex(6)}"
        consumer = Consumer(
            self, ConsumerSpec(tag=tag, queue=queue, prefetch=prefetch, no_ack=no_ack), auto_ack
        )
        self._consumers[tag] = consumer
        try:
            result = self._request(Consume, tag=tag, queue=queue, prefetch=prefetch, no_ack=no_ack)
        except BaseException:
            del self._consumers[tag]
            raise
        self._heartbeat_interval = float(result["heartbeat"])
        return consumer

    def heartbeat(self) -> None:
        """Tell the broker this client's consumers are alive (waiting consumers do this)."""
        self._last_heartbeat = time.monotonic()
        if self._consumers:
            specs = tuple(c.spec for c in self._consumers.values() if not c.cancelled)
            self.endpoint.push(self.broker, encode(Heartbeat(consumers=specs)), BROKER_MAILBOX)
            self.endpoint.flush()

    def _heartbeat_due(self, now: float) -> float:
        """Send a heartbeat if one is due; return seconds until the next one."""
        left = self._last_heartbeat + self._heartbeat_interval - now
        if left <= 0:
            self.heartbeat()
            return self._heartbeat_interval
        return left

    def _dispatch(self, payload: Any) -> None:
        """Sort one delivery-mailbox message into its consumer's buffer."""
        try:
            event: Event = decode(payload)
        except ProtocolError:
            return
        if isinstance(event, Deliver):
            c = self._consumers.get(event.tag)
            if c is not None and not c.cancelled:
                c._buffer.extend(event.deliveries)
        elif isinstance(event, Cancelled):
            c = self._consumers.get(event.tag)
            if c is not None:
                c._cancelled_by = RemoteError(
                    f"broker cancelled the consumer ({event.code}): {event.message}",
                    code=event.code,
                )

    def _pump(self, timeout: float) -> None:
        """Wait up to ``timeout`` for deliveries, then take all that are waiting."""
        ep = self.endpoint
        try:
            msg = ep.get_message(timeout=timeout, mailbox=DELIVERY_MAILBOX)
        except Timeout:
            return
        self._dispatch(msg.payload)
        while (msg := ep.pop_message(DELIVERY_MAILBOX)) is not None:
            self._dispatch(msg.payload)

    def close(self) -> None:
        """Cancel the consumers (best effort) and close the endpoint if it is ours."""
        for c in list(self._consumers.values()):
            with contextlib.suppress(Timeout, RemoteError):  # else the broker expires it
                c.cancel()
        if self._owns_endpoint:
            self.endpoint.close()

    def __enter__(self) -> BrokerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Consumer:
    """Deliveries from one queue: ``for d in consumer`` or ``async for d in consumer``.

    Iteration ends only by ``break`` (or :meth:`cancel`); :meth:`get` takes
    one delivery with a timeout.
    """

    def __init__(self, client: BrokerClient, spec: ConsumerSpec, auto_ack: bool) -> None:
        self.client = client
        self.spec = spec
        self.auto_ack = auto_ack and not spec.no_ack
        self._buffer: collections.deque[Delivery] = collections.deque()
        self._acks: list[int] = []
        self._last: Delivery | None = None
        self._cancelled_by: RemoteError | None = None
        self.cancelled = False
        # Half the window: the broker refills while we work through the rest.
        self._ack_batch = max(1, spec.prefetch // 2) if spec.prefetch else 64

    @property
    def tag(self) -> str:
        """The consumer tag."""
        return self.spec.tag

    def ack(self, delivery: Delivery) -> None:
        """Acknowledge ``delivery`` (sent with the next batch of acks)."""
        if self.spec.no_ack:
            return
        self._acks.append(delivery.delivery_tag)
        if len(self._acks) >= self._ack_batch:
            self._send_acks()

    def _send_acks(self) -> None:
        if self._acks:
            acks, self._acks = self._acks, []
            payload = encode(Ack(tag=self.spec.tag, delivery_tags=tuple(acks)))
            self.client.endpoint.push(self.client.broker, payload, BROKER_MAILBOX)
            self.client.endpoint.flush()

    def get_nowait(self) -> Delivery | None:
        """The next delivery if one is here, else None. Never blocks.

        Raises:
            RemoteError: the broker cancelled this consumer (queue deleted).
        """
        if self._cancelled_by is not None:
            raise self._cancelled_by
        if self.auto_ack and self._last is not None:
            self.ack(self._last)
            self._last = None
        if not self._buffer:
            ep = self.client.endpoint
            while (msg := ep.pop_message(DELIVERY_MAILBOX)) is not None:
                self.client._dispatch(msg.payload)
            if self._cancelled_by is not None:
                raise self._cancelled_by
        if self._buffer:
            d = self._buffer.popleft()
            self._last = d
            return d
        return None

    def get(self, timeout: float | None = None) -> Delivery:
        """The next delivery, waiting up to ``timeout`` seconds (None: forever).

        Raises:
            Timeout: nothing arrived in time.
            RemoteError: the broker cancelled this consumer (queue deleted).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            d = self.get_nowait()
            if d is not None:
                return d
            self._send_acks()  # before waiting, so the broker can refill
            now = time.monotonic()
            wait = self.client._heartbeat_due(now)
            if deadline is not None:
                if now >= deadline:
                    raise Timeout(f"no delivery from queue {self.spec.queue!r} in {timeout} s")
                wait = min(wait, deadline - now)
            self.client._pump(wait)

    def __iter__(self) -> Iterator[Delivery]:
        return self

    def __next__(self) -> Delivery:
        return self.get()

    def __aiter__(self) -> AsyncIterator[Delivery]:
        return self

    async def __anext__(self) -> Delivery:
        # The non-blocking path first; a wait goes to a worker thread in
        # short slices so cancelling the task is noticed within one slice.
        while True:
            d = self.get_nowait()
            if d is not None:
                return d
            try:
                return await asyncio.to_thread(self.get, 0.05)
            except Timeout:
                continue

    def cancel(self) -> None:
        """Detach from the queue; unacknowledged deliveries go back to it.

        Raises:
            Timeout: the broker did not answer.
        """
        if self.cancelled:
            return
        if self.auto_ack and self._last is not None:
            self.ack(self._last)
            self._last = None
        self._send_acks()
        self.cancelled = True
        self._buffer.clear()  # the broker requeues these: they were never acked
        try:
            self.client._request(Cancel, tag=self.spec.tag)
        finally:
            self.client._consumers.pop(self.spec.tag, None)

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cancel()
