"""The broker protocol: what clients and the broker say to each other over cmq.

Theory of operation
-------------------
Every broker message is one cmq message with the ``msgpack`` codec: a list
whose first item names the operation. Mailboxes keep the three flows apart so
that a client waiting for a reply never has to step over deliveries:

=================  ======================  ====================================
mailbox            on                      carries
=================  ======================  ====================================
``BROKER_MAILBOX`` the broker              requests, publishes, acks, heartbeats
``REPLY_MAILBOX``  a client                ``ok`` / ``err`` replies to requests
``DELIVERY_MAILBOX`` a client              deliveries, broker-side cancels
=================  ======================  ====================================

A request carries ``rid``, a number the client picks; the reply carries the
same ``rid``. ``rid == 0`` means "no reply wanted" (an unconfirmed publish, an
ack, a heartbeat), and an ``err`` with ``rid == 0`` is unsolicited (a publish
rejected by a full queue whose publisher did not ask for a confirm). The
broker remembers recent replies by ``(sender, rid)``, so a client may resend a
request whose reply was lost and get the same answer without the operation
happening twice.

Many messages travel as one: a publisher with many bodies for one routing
key sends a ``P`` (:class:`PublishBatch`), and the broker's ``d``
(:class:`Deliver`) carries :class:`Run` s of bodies with consecutive delivery
tags; the per-message fields are said once per run.

The wire layout of each message is the table ``_LAYOUT`` below: the op name,
then the fields of its event class in order. Decoding is table-driven and
either returns an event or raises :class:`~cmq.ProtocolError`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Final

import msgpack

from cmq._errors import ProtocolError

__all__ = [
    "BROKER_MAILBOX",
    "DELIVERY_MAILBOX",
    "REPLY_MAILBOX",
    "Ack",
    "Bind",
    "Cancel",
    "Cancelled",
    "Consume",
    "ConsumerSpec",
    "DeclareExchange",
    "DeclareQueue",
    "DeleteExchange",
    "DeleteQueue",
    "Deliver",
    "Delivery",
    "ErrorCode",
    "ErrorReply",
    "Event",
    "Get",
    "GetStats",
    "Heartbeat",
    "Nack",
    "OkReply",
    "Publish",
    "PublishBatch",
    "PurgeQueue",
    "Request",
    "Run",
    "Unbind",
    "brief",
    "decode",
    "encode",
    "unwrap_body",
    "wrap_body",
]

BROKER_MAILBOX: Final = 0
REPLY_MAILBOX: Final = 1
DELIVERY_MAILBOX: Final = 2


class ErrorCode:
    """Error codes carried by ``err`` replies (``RemoteError.code``)."""

    NOT_FOUND: Final = "not-found"  # exchange, queue or consumer does not exist
    PRECONDITION_FAILED: Final = "precondition-failed"  # redeclared with other arguments
    ACCESS_REFUSED: Final = "access-refused"  # reserved name ("" or "amq.*")
    BAD_REQUEST: Final = "bad-request"  # unknown type, bad argument, malformed message
    QUEUE_FULL: Final = "queue-full"  # publish rejected by a queue with overflow=reject
    IN_USE: Final = "in-use"  # consumer tag already used for another queue
    RESOURCE_LOCKED: Final = "resource-locked"  # an exclusive queue of another connection
    RESOURCE_ERROR: Final = "resource-error"  # a publish while the broker is over its memory budget
    INTERNAL_ERROR: Final = "internal-error"  # the broker failed at the request (a bug; counted, logged)


# -- client -> broker ---------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class DeclareExchange:
    """Create exchange ``name`` of ``type``, or check that it exists as such."""

    rid: int
    name: str
    type: str
    durable: bool = False
    """The exchange survives a restart of a broker that has a data directory."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DeleteExchange:
    """Delete exchange ``name`` and its bindings (no error if absent)."""

    rid: int
    name: str


@dataclass(frozen=True, slots=True, kw_only=True)
class DeclareQueue:
    """Create queue ``name`` holding at most ``max_length`` ready messages, or check it.

    ``arguments`` are RabbitMQ's optional queue arguments that the broker
    knows: ``x-dead-letter-exchange``, ``x-dead-letter-routing-key`` (str)
    and ``x-message-ttl`` (milliseconds).
    """

    rid: int
    name: str
    max_length: int
    overflow: str
    arguments: dict[str, Any] = field(default_factory=dict)
    exclusive: bool = False
    """Only the declaring connection may use the queue; it goes when that
    connection closes (AMQP connections only: a cmq client has no connection)."""
    auto_delete: bool = False
    """The queue goes when its last consumer is cancelled (having had one)."""
    durable: bool = False
    """The queue, its bindings to durable exchanges and its persistent messages
    survive a restart of a broker that has a data directory."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DeleteQueue:
    """Delete queue ``name``, its bindings and messages (counted as purged)."""

    rid: int
    name: str


@dataclass(frozen=True, slots=True, kw_only=True)
class PurgeQueue:
    """Drop the ready messages of queue ``name`` (counted as purged)."""

    rid: int
    name: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Bind:
    """Bind ``queue`` to ``exchange`` with binding key ``key``."""

    rid: int
    queue: str
    exchange: str
    key: str
    arguments: dict[str, Any] = field(default_factory=dict)
    """A headers exchange's binding arguments (``x-match`` and the headers to match)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Unbind:
    """Remove a binding (no error if it did not exist)."""

    rid: int
    queue: str
    exchange: str
    key: str
    arguments: dict[str, Any] = field(default_factory=dict)
    """The arguments the binding was made with (a headers exchange's)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Publish:
    """Route ``body`` through ``exchange`` with ``routing_key``; rid 0: no confirm.

    ``expiration``: milliseconds the message may wait in a queue before it
    expires (AMQP's per-message TTL), None for no limit. ``properties``: the
    message's AMQP basic properties as a map of plain values (``content_type``,
    ``headers``, ``correlation_id``, ...), carried to every consumer as they came.
    """

    rid: int
    exchange: str
    routing_key: str
    body: Any
    expiration: int | None = None
    properties: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class PublishBatch:
    """Route each of ``bodies``, in order, as :class:`Publish` would; rid 0: no confirm.

    One routing decision serves the whole batch: what makes the broker's cost
    per message small when a publisher has many for one routing key.
    """

    rid: int
    exchange: str
    routing_key: str
    bodies: tuple[Any, ...]
    expiration: int | None = None
    properties: dict[str, Any] | None = None
    """The AMQP basic properties of every message of the batch (as :class:`Publish`'s)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Consume:
    """Attach consumer ``tag`` of the sender to ``queue``."""

    rid: int
    tag: str
    queue: str
    prefetch: int
    no_ack: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerSpec:
    """What a heartbeat says about one consumer: enough to re-attach it."""

    tag: str
    queue: str
    prefetch: int
    no_ack: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class Heartbeat:
    """The sender's consumers are alive (and are re-attached if the broker forgot them)."""

    consumers: tuple[ConsumerSpec, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Ack:
    """Consumer ``tag`` is done with ``delivery_tags``."""

    tag: str
    delivery_tags: tuple[int, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Nack:
    """Consumer ``tag`` gives ``delivery_tags`` back: to the queue (``requeue``,
    marked redelivered) or, without, to the queue's dead-letter exchange
    (dropped, counted, when it has none). AMQP's basic.nack and basic.reject."""

    tag: str
    delivery_tags: tuple[int, ...]
    requeue: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class Cancel:
    """Detach consumer ``tag``; its unacknowledged messages go back to the queue.

    With ``keep_unacked`` (AMQP's basic.cancel), only deliveries stop: what
    it was sent stays unacknowledged, to be acked or nacked under its tag.
    """

    rid: int
    tag: str
    keep_unacked: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Get:
    """Take the message at the head of ``queue`` (AMQP's basic.get).

    The ``ok`` result is None when the queue is empty, else ``[tag,
    delivery_tag, exchange, routing_key, redelivered, body, messages left,
    properties]``; unless ``no_ack``, the message waits for an ack (or nack)
    naming ``tag`` and ``delivery_tag``, as a consumer's would.
    """

    rid: int
    queue: str
    no_ack: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class GetStats:
    """Ask for the broker's counters."""

    rid: int


Request = (
    DeclareExchange
    | DeleteExchange
    | DeclareQueue
    | DeleteQueue
    | PurgeQueue
    | Bind
    | Unbind
    | Publish
    | PublishBatch
    | Consume
    | Heartbeat
    | Ack
    | Nack
    | Cancel
    | Get
    | GetStats
)

# -- broker -> client ---------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class OkReply:
    """Request ``rid`` succeeded with ``result`` (a msgpack value)."""

    rid: int
    result: Any


@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorReply:
    """Request ``rid`` failed (``rid`` 0: unsolicited, e.g. a rejected publish)."""

    rid: int
    code: str
    message: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Delivery:
    """One message handed to a consumer.

    ``delivery_tag`` identifies it for ``ack`` (unique per consumer);
    ``redelivered`` is True when an earlier delivery of it was not acknowledged.
    ``properties``: the AMQP basic properties its publisher gave (a map of
    plain values), or None.
    """

    delivery_tag: int
    exchange: str
    routing_key: str
    body: Any
    redelivered: bool
    properties: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Run:
    """Deliveries with consecutive tags from ``first_tag`` that share exchange,
    routing key and ``redelivered``: the unit a delivery message carries, so
    that per-message fields are not repeated on the wire or decoded one by one.
    """

    first_tag: int
    exchange: str
    routing_key: str
    redelivered: bool
    bodies: tuple[Any, ...]
    properties: tuple[dict[str, Any] | None, ...] | None = None
    """One entry per body (None: that message has none); None when no message of the run has any."""

    def deliveries(self) -> tuple[Delivery, ...]:
        """The run as one :class:`Delivery` per body."""
        props = self.properties
        return tuple(
            Delivery(
                delivery_tag=self.first_tag + i,
                exchange=self.exchange,
                routing_key=self.routing_key,
                body=body,
                redelivered=self.redelivered,
                properties=props[i] if props is not None and i < len(props) else None,
            )
            for i, body in enumerate(self.bodies)
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Deliver:
    """A batch of deliveries for consumer ``tag``, as runs."""

    tag: str
    runs: tuple[Run, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Cancelled:
    """The broker detached consumer ``tag`` (its queue was deleted)."""

    tag: str
    code: str
    message: str


Event = Request | OkReply | ErrorReply | Deliver | Cancelled

# -- bodies -------------------------------------------------------------------

#: The MessagePack extension type that carries a body which is not a scalar
#: (a list, a map, an extension value), packed by its publisher. The broker
#: passes it on as the bytes it came as: it never decodes nor re-encodes a
#: body, so a body's shape (a map nested 1,000 deep) cannot hurt it.
BODY_EXT: Final = 67
#: Bodies that travel as themselves: flat values, nothing nested to unpack.
SCALARS: Final[frozenset[type[Any]]] = frozenset((bytes, str, int, float, bool, type(None)))
_pack = msgpack.Packer(use_bin_type=True).pack


def wrap_body(body: Any) -> Any:
    """The wire form of a published body: a scalar as itself, anything else
    packed into one ``BODY_EXT`` extension value.

    Raises:
        TypeError: ``body`` is not MessagePack-able (too deep, an unknown type).
    """
    if type(body) in SCALARS:
        return body
    try:
        return msgpack.ExtType(BODY_EXT, _pack(body))
    except (TypeError, ValueError, OverflowError) as exc:
        raise TypeError(f"cannot encode {type(body).__name__} as MessagePack: {exc}") from exc


def unwrap_body(body: Any) -> Any:
    """The body a publisher gave for its wire form (``wrap_body`` undone).

    An extension value that does not unpack (only a hand-made publisher can
    send one) is handed out as the :class:`msgpack.ExtType` it is.
    """
    if type(body) is msgpack.ExtType and body.code == BODY_EXT:
        try:
            return msgpack.unpackb(body.data, raw=False, strict_map_key=False)
        except Exception:  # noqa: BLE001 - msgpack raises many kinds; keep what came
            return body
    return body


def brief(v: Any) -> str:
    """A short, safe description of a received value for an error message.

    Never the ``repr`` of a container: a value nested 1,000 deep makes
    ``repr`` raise ``RecursionError``, and a long one floods the log.
    """
    if type(v) is str or type(v) is bytes:
        text = repr(v[:40])
        return text + ("..." if len(v) > 40 else "")
    if type(v) is int or type(v) is bool or type(v) is float or v is None:
        return repr(v)
    return f"a {type(v).__name__}"


# -- wire layout --------------------------------------------------------------


def _int(v: Any) -> int:
    if type(v) is not int or v < 0:
        raise ProtocolError(f"expected a non-negative int, got {brief(v)}")
    return v


def _str(v: Any) -> str:
    if type(v) is not str:
        raise ProtocolError(f"expected a str, got {type(v).__name__}")
    return v


def _bool(v: Any) -> bool:
    if type(v) is not bool:
        raise ProtocolError(f"expected a bool, got {type(v).__name__}")
    return v


def _any(v: Any) -> Any:
    return v


def _opt_int(v: Any) -> int | None:
    return None if v is None else _int(v)


def _opt_map(v: Any) -> dict[str, Any] | None:
    return None if v is None else _args(v)


def _props(v: Any) -> tuple[dict[str, Any] | None, ...]:
    if not isinstance(v, list | tuple):
        raise ProtocolError("expected a list of properties")
    return tuple(_opt_map(x) for x in v)


def _args(v: Any) -> dict[str, Any]:
    if type(v) is not dict or not all(type(k) is str for k in v):
        raise ProtocolError("expected a map with string keys")
    return v


def _ints(v: Any) -> tuple[int, ...]:
    if not isinstance(v, list | tuple):
        raise ProtocolError("expected a list of ints")
    return tuple(_int(x) for x in v)


def _specs(v: Any) -> tuple[ConsumerSpec, ...]:
    if not isinstance(v, list | tuple):
        raise ProtocolError("expected a list of consumers")
    out = []
    for item in v:
        if not isinstance(item, list | tuple) or len(item) != 4:
            raise ProtocolError("a consumer is [tag, queue, prefetch, no_ack]")
        out.append(
            ConsumerSpec(
                tag=_str(item[0]),
                queue=_str(item[1]),
                prefetch=_int(item[2]),
                no_ack=_bool(item[3]),
            )
        )
    return tuple(out)


def _list(v: Any) -> tuple[Any, ...]:
    if type(v) is not list and type(v) is not tuple:
        raise ProtocolError("expected a list")
    return tuple(v)


def _runs(v: Any) -> tuple[Run, ...]:
    if not isinstance(v, list | tuple):
        raise ProtocolError("expected a list of runs")
    out = []
    for item in v:
        if not isinstance(item, list | tuple) or len(item) not in (5, 6):
            raise ProtocolError("a run is [first_tag, exchange, key, redelivered, bodies, properties?]")
        out.append(
            Run(
                first_tag=_int(item[0]),
                exchange=_str(item[1]),
                routing_key=_str(item[2]),
                redelivered=_bool(item[3]),
                bodies=_list(item[4]),
                properties=_props(item[5]) if len(item) == 6 else None,
            )
        )
    return tuple(out)


def _spec_out(specs: tuple[ConsumerSpec, ...]) -> list[list[Any]]:
    return [[s.tag, s.queue, s.prefetch, s.no_ack] for s in specs]


def _runs_out(runs: tuple[Run, ...]) -> list[list[Any]]:
    return [
        [r.first_tag, r.exchange, r.routing_key, r.redelivered, list(r.bodies)]
        + ([list(r.properties)] if r.properties is not None else [])
        for r in runs
    ]


_Check = Callable[[Any], Any]

# op name on the wire -> (event class, a checker per field in field order).
# The hot ops (publish, publish batch, ack, heartbeat, deliver) get one-letter names: the
# paper's stock-exchange messages are about 9 bytes, so the op name matters.
_LAYOUT: dict[str, tuple[type[Any], tuple[_Check, ...]]] = {
    "exchange.declare": (DeclareExchange, (_int, _str, _str, _bool)),
    "exchange.delete": (DeleteExchange, (_int, _str)),
    "queue.declare": (DeclareQueue, (_int, _str, _int, _str, _args, _bool, _bool, _bool)),
    "queue.delete": (DeleteQueue, (_int, _str)),
    "queue.purge": (PurgeQueue, (_int, _str)),
    "bind": (Bind, (_int, _str, _str, _str, _args)),
    "unbind": (Unbind, (_int, _str, _str, _str, _args)),
    "p": (Publish, (_int, _str, _str, _any, _opt_int, _opt_map)),
    "P": (PublishBatch, (_int, _str, _str, _list, _opt_int, _opt_map)),
    "consume": (Consume, (_int, _str, _str, _int, _bool)),
    "h": (Heartbeat, (_specs,)),
    "a": (Ack, (_str, _ints)),
    "n": (Nack, (_str, _ints, _bool)),
    "cancel": (Cancel, (_int, _str, _bool)),
    "get": (Get, (_int, _str, _bool)),
    "stats": (GetStats, (_int,)),
    "ok": (OkReply, (_int, _any)),
    "err": (ErrorReply, (_int, _str, _str)),
    "d": (Deliver, (_str, _runs)),
    "x": (Cancelled, (_str, _str, _str)),
}
_OP_OF: dict[type[Any], str] = {cls: op for op, (cls, _) in _LAYOUT.items()}
_NAMES: dict[type[Any], tuple[str, ...]] = {
    cls: tuple(f.name for f in fields(cls)) for cls, _ in _LAYOUT.values()
}
# Fields with a default may be left off the end of a message (and are, when
# they hold it): what lets a field be added without breaking older peers.
_REQUIRED: dict[type[Any], int] = {
    cls: sum(1 for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING)
    for cls, _ in _LAYOUT.values()
}
_DEFAULTS: dict[type[Any], tuple[Any, ...]] = {
    cls: tuple(f.default if f.default is not MISSING else None for f in fields(cls))
    for cls, _ in _LAYOUT.values()
}
# Fields whose wire form is not the attribute itself.
_OUT: dict[str, Callable[[Any], Any]] = {
    "consumers": _spec_out,
    "runs": _runs_out,
    "bodies": list,
    "delivery_tags": list,
}


def encode(event: Event) -> list[Any]:
    """Return the msgpack-ready list for ``event``."""
    cls = type(event)
    out: list[Any] = [_OP_OF[cls]]
    for name in _NAMES[cls]:
        value = getattr(event, name)
        conv = _OUT.get(name)
        out.append(conv(value) if conv is not None else value)
    # Trailing optional fields that hold their default are left off.
    required, defaults = _REQUIRED[cls] + 1, _DEFAULTS[cls]
    while len(out) > required and out[-1] in (defaults[len(out) - 2], {}):
        out.pop()
    return out


def decode(payload: Any) -> Event:
    """Return the event a received payload carries.

    Raises:
        ProtocolError: the payload is not a well-formed broker message.
    """
    if not isinstance(payload, list | tuple) or not payload:
        raise ProtocolError("a broker message is a non-empty list")
    op = payload[0]
    entry = _LAYOUT.get(op) if type(op) is str else None
    if entry is None:
        raise ProtocolError(f"unknown broker operation {brief(op)}")
    cls, checks = entry
    if not _REQUIRED[cls] <= len(payload) - 1 <= len(checks):
        raise ProtocolError(f"{op!r} takes {len(checks)} fields, got {len(payload) - 1}")
    values = {
        name: check(v) for name, check, v in zip(_NAMES[cls], checks, payload[1:], strict=False)
    }
    event: Event = cls(**values)
    return event
