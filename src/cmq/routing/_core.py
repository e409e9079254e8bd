"""The broker as a sans-IO object: declarations, routing, queues, consumers.

Theory of operation
-------------------
:class:`BrokerCore` is the whole broker with no socket and no clock. A driver
feeds it every received payload with ``receive(payload, sender, now)``, sends
what ``messages_to_send()`` returns, and calls ``handle_timer(now)`` when the
time from ``next_deadline()`` has come. Tests drive it with a virtual clock.

Entities. *Exchanges* (:mod:`cmq.routing.exchanges`) route a published
message to a set of *queues*; the default exchange ``""`` is a direct
exchange to which every queue is bound under its own name (AMQP 0-9-1). A
queue holds *ready* messages (FIFO) and hands them round-robin to its
*consumers*. A consumer is ``(client address, tag)``.

Requests. Each request is one row of ``_HANDLERS``. A request that cannot be
done is answered with an ``err`` reply carrying an :class:`ErrorCode`, never
half-done. Declarations are idempotent: redeclaring with the same arguments
answers ``ok`` with ``created: False``; with different arguments it answers
``precondition-failed`` and changes nothing. Replies are remembered by
``(sender, rid)`` (``BrokerConfig.reply_cache``) so a resent request is
answered again without being done twice.

Bounded queues. Every queue is bounded: ``max_length`` (at least 1) bounds the ready messages (as RabbitMQ's
``x-max-length``: messages out with a consumer are not counted, and messages
requeued after a consumer is lost are always taken back). When a message
arrives at a full queue, the queue's overflow policy decides (table
``_OVERFLOW``, RabbitMQ's ``x-overflow``), and every message not taken is
counted. A publish confirm means every queue it was routed to kept it: a
queue that refuses a message (``reject-publish``, ``reject-publish-dlx``)
makes the confirm a ``queue-full`` refusal (AMQP's basic.nack), though the
other queues keep their copies, as in RabbitMQ.

Dead letters and TTL (RabbitMQ's semantics). A message leaves its queue
unconsumed when a consumer rejects it without requeue (``rejected``), when
it expires (``expired``: the queue's ``x-message-ttl`` or the message's
``expiration``, whichever is shorter, counted from when it entered the
queue; only a message at the head of the queue expires, and a message out
with a consumer does not), or when the queue overflows (``maxlen``:
``drop-head``'s dropped oldest, ``reject-publish-dlx``'s refused newest).
Such a message is republished to the queue's ``x-dead-letter-exchange`` with
its ``x-dead-letter-routing-key`` (else its own key), without its
expiration; a queue with no dead-letter exchange, or one that does not
exist, drops it (counted). A message that would come back to a queue it was
already dead-lettered from, with no rejection on the way, is dropped
(counted), as RabbitMQ does, so a cycle cannot loop. The message says why it
died in its headers, as RabbitMQ writes them (``x-death``, see ``_died``).
A queue declared with ``x-expires`` is deleted, with its messages (not
dead-lettered), once it has gone that long with no consumer and no declare
(a passive one included) or get of it; a publish is not a use.

Who receives. Deliveries go round-robin over a queue's consumers with
credit; a queue with ``x-single-active-consumer`` delivers only to the first
consumer attached, the next taking over when it goes. An exclusive consumer
(AMQP's, ``ExclusiveConsume``) is its queue's only one while it consumes.

Memory. Each queue keeps the body bytes of the messages it holds (ready, or
out with a consumer until acknowledged) in ``nbytes``, changed where
messages enter and leave it for good; ``held_bytes()`` sums them (one step
per queue) for ``check_memory``: it raises the memory alarm at
``BrokerConfig.memory_budget`` and clears it under ``MEMORY_RESUME_FRACTION``
of it. A driver calls it once per turn, and the core itself as messages come
in: it keeps what the last check found plus the bytes that came in since (an
upper bound of what it holds, one addition a message) and checks at once when
that reaches the budget, so the message that reaches it raises the alarm and
the next cmq-protocol publish is refused, whatever the driver reads in a turn. While it is raised, a publish from a
cmq-protocol client (``p``, ``P``) is refused whole with ``resource-error``
(the confirming publisher's nack; a fire-and-forget one hears of it through
its errors) and its messages counted in ``refused_memory``: nothing of it is
kept, so what the broker holds stops growing however fast such clients
publish, and consumers still take messages and acknowledge them. AMQP
publishes are not refused: their driver stops reading their sockets instead
(TCP pushes back, RabbitMQ's connection.blocked), so what it still reads
is taken. What the broker holds passes the budget by at most one publish
(one message, or one batch publish) from a cmq-protocol client.

Consumers and delivery guarantees. A consumer with ``no_ack`` gets messages as
fast as they come, at most once (a lost datagram is a lost message). Other
consumers get at most ``prefetch`` unacknowledged messages (0 = no limit);
a message stays with the broker until acknowledged, and is requeued at the
front, marked ``redelivered``, when its consumer is lost or when it has waited
``ack_timeout`` for its acknowledgement (which covers a delivery datagram lost
on the way): at least once. A consumer not heard from (heartbeat, ack or
request) for ``consumer_timeout`` is detached: its queue stops sending to it
and keeps its messages. Heartbeats carry the consumer's spec, so a consumer
that comes back after being detached is re-attached by its next heartbeat.

Durability. A queue or exchange declared ``durable`` and a message
published with ``delivery_mode`` 2 (in its properties) into a durable queue
are what a store keeps. The core does no I/O for it: when ``persisting`` is
set (the driver has a store), it appends records to ``journal`` ("msg" when
a persistent message enters a durable queue, "msg-" when it leaves it for
good: acked, rejected, dead-lettered, expired, dropped, purged, or delivered
to a ``no_ack`` consumer; declarations, bindings and deletions likewise),
and the driver commits them before it sends the replies of the same turn
(:mod:`cmq.routing._store`). ``restore`` takes a store's state back.

Batches. A batch publish (``P``) is routed once for all its bodies and
enters each queue with one ``deque.extend``; the queue's consumers then take
what their credit allows and only then is the bound applied, which gives the
same outcome as taking the bodies one by one. Deliveries are collected per
consumer while a batch of received messages is processed and leave as one
``d`` message per consumer of up to ``batch_count`` deliveries and about
``batch_bytes`` when the driver asks for ``messages_to_send()``: the busier
the broker, the bigger the batches. A ``d`` message carries *runs*:
consecutive delivery tags that share exchange, routing key and redelivered
flag, with their bodies in one list, so nothing is repeated per message.
"""

from __future__ import annotations

import enum
import os
import secrets
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, Final

from msgpack import ExtType, packb

from cmq._errors import ConfigError, ProtocolError
from cmq.routing._protocol import (
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
    ErrorCode,
    ErrorReply,
    Get,
    GetStats,
    Heartbeat,
    Nack,
    OkReply,
    Publish,
    PublishBatch,
    PurgeQueue,
    Unbind,
    brief,
    decode,
    encode,
    wrap_body,
)
from cmq.routing._store import StoredState, pack
from cmq.routing.exchanges import Exchange, ExchangeType, headers_binding_key, make_exchange

__all__ = [
    "DEFAULT_ACK_TIMEOUT",
    "DEFAULT_BATCH_BYTES",
    "DEFAULT_BATCH_COUNT",
    "DEFAULT_CONSUMER_TIMEOUT",
    "SYSTEM_EXCHANGES",
    "Address",
    "BrokerConfig",
    "BrokerCore",
    "BrokerStats",
    "ChannelPrefetch",
    "ExclusiveConsume",
    "Note",
    "Outgoing",
    "Overflow",
    "QueueStats",
    "Refused",
    "server_queue_name",
]

Address = tuple[str, int]

# A consumer process that is busy (a GC pause, a slow handler) must not be
# dropped at once; 5 s is long against a 90 us round trip and short enough
# that a dead consumer's messages soon go to the others.
DEFAULT_CONSUMER_TIMEOUT: Final = 5.0
# Long, because a redelivery to a live but slow consumer is a duplicate; it
# only has to catch delivery datagrams that were lost, which is rare.
DEFAULT_ACK_TIMEOUT: Final = 30.0
# Deliveries per message to a consumer: enough to amortise per-message cost,
# small enough (with small bodies) to fit a few datagrams.
DEFAULT_BATCH_COUNT: Final = 256
# Bytes per delivery message (estimated): a batch over one datagram (the
# endpoint's max_datagram, 65000) is fragmented, and one lost fragment loses
# the whole batch, so a batch fills one datagram with room for the framing;
# a larger single message still goes, alone. Measured: 60 KB against 32 KB
# carries 4 KB messages a fifth faster for a fifth less broker CPU.
DEFAULT_BATCH_BYTES: Final = 60 * 1024
DEFAULT_REPLY_CACHE: Final = 4096
# After each message the broker polls for the next one this long before it
# sleeps (yielding the CPU between polls), as RabbitMQ's Erlang schedulers
# busy-wait by default: a broker that sleeps pays a process wake-up on every
# hop of a request/response, which on these 2-core machines is most of a
# ping-pong through it (DE-PP 227-236 us without, 139-158 us with 100 us).
# It costs at most this much CPU per message, and nothing when idle.
DEFAULT_SPIN: Final = 100e-6
# AMQP 0-9-1 short strings: names and keys are at most 255 bytes.
MAX_NAME: Final = 255
#: Most bytes a message's properties (headers included) may take, MessagePack
#: encoded: AMQP carries them in one content header frame, which is at most
#: frame_max (131,072 here and in RabbitMQ) less the frame's own fields.
MAX_PROPERTIES: Final = 128 * 1024


def _default_memory_budget() -> int:
    # RabbitMQ's default high watermark: 40% of the machine's memory. Only
    # message bodies are counted here (the Python objects around them cost
    # more), so at this budget the process is well under the machine's RAM.
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * 0.4)
    except (ValueError, OSError, AttributeError):
        return 1 << 30


DEFAULT_MEMORY_BUDGET: Final = _default_memory_budget()
#: Publishers are let go again once the held bytes are under this share of the
#: budget: a margin, so that one consumed message does not flip it back.
MEMORY_RESUME_FRACTION: Final = 0.9
#: The first part of every AMQP channel's address in the core (its driver's
#: connections are ``("amqp#N", channel)``).
AMQP_PREFIX: Final = "amqp#"


class Overflow(enum.StrEnum):
    """What a full queue does with one more message (RabbitMQ's ``x-overflow``)."""

    DROP_HEAD = "drop-head"  # drop (or dead-letter) the oldest ready message, take the newcomer
    REJECT_PUBLISH = "reject-publish"  # refuse the newcomer: the publisher's confirm is a refusal
    REJECT_PUBLISH_DLX = "reject-publish-dlx"  # as reject-publish, and dead-letter the newcomer
    # Older names, kept as aliases. drop-new silently dropped the newcomer
    # while confirming it; a confirm must mean the message was kept, so it
    # is now reject-publish (the publisher hears of the refusal).
    DROP_OLD = "drop-head"
    REJECT = "reject-publish"
    DROP_NEW = "reject-publish"


#: The older spellings accepted on the wire, and what they mean now.
_OVERFLOW_ALIASES: Final = {"drop-old": "drop-head", "reject": "reject-publish", "drop-new": "reject-publish"}


@dataclass(frozen=True, slots=True)
class _OverflowRule:
    evict_oldest: bool  # the oldest ready message goes to make room (else the newest is refused)
    tell_publisher: bool  # the publisher gets a queue-full error (a nack)
    dead_letter: bool  # what was not kept goes to the dead-letter exchange
    counter: str  # what is counted, per queue and in total


_OVERFLOW: Final[dict[Overflow, _OverflowRule]] = {
    Overflow.DROP_HEAD: _OverflowRule(True, False, True, "dropped_old"),
    Overflow.REJECT_PUBLISH: _OverflowRule(False, True, False, "rejected"),
    Overflow.REJECT_PUBLISH_DLX: _OverflowRule(False, True, True, "rejected"),
}

#: Queue arguments the broker knows (RabbitMQ's names) and their checks.
DLX_ARG: Final = "x-dead-letter-exchange"
DLRK_ARG: Final = "x-dead-letter-routing-key"
TTL_ARG: Final = "x-message-ttl"
#: A queue unused this many milliseconds is deleted (RabbitMQ's queue TTL):
#: no consumer, and no declare or basic.get of it meanwhile.
EXPIRES_ARG: Final = "x-expires"
#: Deliveries go to one consumer at a time, the first attached (RabbitMQ's single active consumer).
SINGLE_ARG: Final = "x-single-active-consumer"
#: The body bytes a queue's ready messages may hold (RabbitMQ's
#: x-max-length-bytes): past it the overflow policy applies, as past max_length.
MAX_BYTES_ARG: Final = "x-max-length-bytes"
#: The highest message priority a queue tells apart (RabbitMQ's priority
#: queues): ready messages go highest priority first, in order within one.
PRIORITY_ARG: Final = "x-max-priority"
#: The most priorities a queue may have (AMQP's priority is an octet).
MAX_PRIORITY: Final = 255
#: Most dead-letter hops a message keeps a record of (a cycle is cut well before).
_MAX_DEATHS: Final = 32


@dataclass(frozen=True, slots=True)
class _Meta:
    """What a queued message carries besides its routing: when it expires
    (None: never), where it was dead-lettered from, as (queue, reason), and
    its AMQP properties (a map of plain values, None: none)."""

    expires: float | None
    deaths: tuple[tuple[str, str], ...] = ()
    props: dict[str, Any] | None = None
    pid: int | None = None  # its record in the store (a persistent message in a durable queue)


@dataclass(frozen=True, slots=True, kw_only=True)
class BrokerConfig:
    """Options of one broker; validated on construction.

    Raises:
        ConfigError: an option is out of range.
    """

    consumer_timeout: float = DEFAULT_CONSUMER_TIMEOUT
    """Seconds without a word from a consumer before it is detached."""

    ack_timeout: float = DEFAULT_ACK_TIMEOUT
    """Seconds an unacknowledged delivery waits before it is requeued."""

    batch_count: int = DEFAULT_BATCH_COUNT
    """Most deliveries carried by one message to a consumer."""

    batch_bytes: int = DEFAULT_BATCH_BYTES
    """Most (estimated) body bytes per message to a consumer; a bigger delivery goes alone."""

    reply_cache: int = DEFAULT_REPLY_CACHE
    """Replies remembered by (sender, rid) to answer resent requests."""

    spin: float = DEFAULT_SPIN
    """Seconds the broker keeps polling for the next message after one, before
    it sleeps (0: sleep at once): its cmq port after each message, its AMQP
    port after each read of its sockets. Trades up to this much CPU per
    message for a wake-up saved on each hop of a request/response. Not used
    by a broker that may run on one CPU only."""

    memory_budget: int = DEFAULT_MEMORY_BUDGET
    """Body bytes the broker may hold (ready or unacknowledged, over all
    queues) before it raises its memory alarm (RabbitMQ's): it stops reading
    from AMQP publishers' sockets and tells them connection.blocked, and it
    refuses cmq-protocol publishes (``resource-error``, counted in
    ``refused_memory``). The alarm clears once it holds under 90% of it:
    AMQP publishers are read again (connection.unblocked), cmq ones accepted."""

    def __post_init__(self) -> None:
        if self.memory_budget < 1:
            raise ConfigError(f"memory_budget must be >= 1 byte, got {self.memory_budget!r}")
        if not self.consumer_timeout > 0:
            raise ConfigError(f"consumer_timeout must be > 0, got {self.consumer_timeout!r}")
        if not self.ack_timeout > 0:
            raise ConfigError(f"ack_timeout must be > 0, got {self.ack_timeout!r}")
        if self.batch_count < 1:
            raise ConfigError(f"batch_count must be >= 1, got {self.batch_count!r}")
        if self.batch_bytes < 1:
            raise ConfigError(f"batch_bytes must be >= 1, got {self.batch_bytes!r}")
        if self.reply_cache < 0:
            raise ConfigError(f"reply_cache must be >= 0, got {self.reply_cache!r}")
        if not 0 <= self.spin <= 0.1:
            raise ConfigError(f"spin must be between 0 and 0.1 s, got {self.spin!r}")

    @property
    def heartbeat_interval(self) -> float:
        """How often consumers are asked to send a heartbeat."""
        # Four chances per timeout: one or two lost heartbeats do not detach.
        return self.consumer_timeout / 4


@dataclass(frozen=True, slots=True, kw_only=True)
class Outgoing:
    """A message the driver must push: ``payload`` to ``dest``'s ``mailbox``."""

    dest: Address
    mailbox: int
    payload: Any


@dataclass(frozen=True, slots=True, kw_only=True)
class Note:
    """Something the broker refused or failed at, for the driver to log.

    ``reason`` is the counter it was added to (``malformed``, ``bad_body``,
    ``internal_error``, ...); ``detail`` a one-line description that never
    holds more than a short excerpt of what was received.
    """

    reason: str
    sender: Address | None
    detail: str


# Outgoing's frozen __init__ sets each field through object.__setattr__;
# the latency path fills the slots through their descriptors (the same object).
_new_outgoing = object.__new__
_set_dest, _set_mailbox, _set_payload = (Outgoing.__dict__[f].__set__ for f in ("dest", "mailbox", "payload"))


def _outgoing(dest: Address, mailbox: int, payload: Any) -> Outgoing:
    o = _new_outgoing(Outgoing)
    _set_dest(o, dest)
    _set_mailbox(o, mailbox)
    _set_payload(o, payload)
    return o


#: The counters a message handed over on the latency path adds one to.
_HANDED: Final = frozenset(("enqueued", "delivered"))

_COUNTERS: Final = (
    "enqueued",
    "delivered",
    "acked",
    "redelivered",
    "dropped_old",
    "rejected",
    "purged",
    "expired",
    "nacked",
    "dead_lettered",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueStats:
    """A snapshot of one queue."""

    name: str
    max_length: int
    overflow: str
    ready: int
    unacked: int
    consumers: int
    enqueued: int
    delivered: int
    acked: int
    redelivered: int
    dropped_old: int
    rejected: int
    purged: int
    expired: int
    nacked: int
    dead_lettered: int
    dead_letter_exchange: str | None = None
    dead_letter_routing_key: str | None = None
    message_ttl: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class BrokerStats:
    """A snapshot of the broker's counters (totals include deleted queues)."""

    exchanges: int
    queues: int
    consumers: int
    published: int
    unroutable: int
    enqueued: int
    delivered: int
    acked: int
    redelivered: int
    dropped_old: int
    rejected: int
    purged: int
    expired: int
    nacked: int
    dead_lettered: int
    dead_letters_dropped: int
    consumers_expired: int
    consumers_reattached: int
    malformed: int
    resent_requests: int
    stale_acks: int
    send_failed: int
    bad_bodies: int
    internal_errors: int
    refused_memory: int = 0  # cmq-protocol publishes refused while over the memory budget (messages)
    memory_alarms: int = 0  # times the held bytes reached the memory budget
    queues_expired: int = 0  # queues deleted for going unused their x-expires
    requeued_in_doubt: int = 0  # deliveries given back at once: the consumer's endpoint restarted or went silent
    per_queue: tuple[QueueStats, ...] = field(default=())

    def as_dict(self) -> dict[str, Any]:
        """Plain values, for the wire and for JSON."""
        out: dict[str, Any] = {
            name: getattr(self, name) for name in self.__dataclass_fields__ if name != "per_queue"
        }
        out["per_queue"] = [
            {name: getattr(q, name) for name in q.__dataclass_fields__} for q in self.per_queue
        ]
        return out


# A queued message: (exchange, routing_key, body, redelivered, meta); meta
# is None for a message that neither expires nor was dead-lettered.
_Msg = tuple[str, str, Any, bool, _Meta | None]


class Refused(Exception):
    """A request that cannot be done (``code`` an :class:`ErrorCode`); becomes
    an ``err`` reply, or is raised by :meth:`BrokerCore.call`."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


_Refused = Refused

#: The consumer tag under which a basic.get's unacknowledged message waits
#: (followed by the queue's name); such a holder is not one of the queue's consumers.
GET_TAG: Final = "\x00get:"


class _Queue:
    __slots__ = ("auto_delete", "bindings", "consumers", "counts", "dlrk", "dlx", "durable", "exclusive",
                 "expires", "expiring", "handed", "max_bytes", "max_length", "name", "nbytes", "overflow", "owner",
                 "ready", "rr", "single", "ttl", "used_at")  # fmt: skip

    def __init__(
        self,
        name: str,
        max_length: int,
        overflow: Overflow,
        dlx: str | None = None,
        dlrk: str | None = None,
        ttl: float | None = None,
    ) -> None:
        self.name = name
        self.max_length = max_length
        self.overflow = overflow
        self.dlx = dlx  # dead-letter exchange
        self.dlrk = dlrk  # dead-letter routing key (None: the message's own)
        self.ttl = ttl  # seconds a message may wait here (None: no limit)
        # Seconds this queue may go unused before it is deleted (x-expires;
        # None: never), and when it was last used (see BrokerCore.handle_timer).
        self.expires: float | None = None
        self.used_at = 0.0
        # The consumer that has this queue to itself (AMQP's exclusive
        # basic.consume), while it consumes; None: any may.
        self.exclusive: _Consumer | None = None
        # Deliveries only to the first of ``consumers`` (x-single-active-consumer).
        self.single = False
        self.owner: str | None = None  # the connection of an exclusive queue
        self.auto_delete = False  # deleted when its last consumer goes
        self.durable = False  # kept in the store (with its persistent messages)
        # Whether messages that expire may be in ``ready`` (a TTL, or one
        # published with an expiration): only such queues are looked at by the timer.
        self.expiring = ttl is not None
        self.ready: deque[_Msg] | _PriorityReady = deque()
        # The bound on the ready messages' body bytes (x-max-length-bytes;
        # None: none). A queue with one keeps them in a _SizedReady, which
        # sums them (see limit_bytes).
        self.max_bytes: int | None = None
        self.consumers: list[_Consumer] = []
        self.rr = 0  # round-robin position in consumers
        self.bindings: set[tuple[str, str]] = set()  # (exchange, key)
        self.counts: Counter[str] = Counter()
        # Messages handed over on the latency path (BrokerCore._hand_over):
        # each one is also enqueued and delivered (added in at stats time).
        self.handed = 0
        # Body bytes of the messages this queue holds: ready, and out with
        # consumers until acknowledged (see BrokerCore.held_bytes).
        self.nbytes = 0

    def limit_bytes(self, max_bytes: int | None) -> None:
        """Bound the ready messages' body bytes (before any message enters)."""
        self.max_bytes = max_bytes
        if max_bytes is not None and type(self.ready) is deque:
            self.ready = _SizedReady(self.ready)

    def prioritise(self, max_priority: int | None) -> None:
        """Take the ready messages highest priority first (before any message enters)."""
        if max_priority is not None:
            self.ready = _PriorityReady(max_priority)

    @property
    def max_priority(self) -> int | None:
        ready = self.ready
        return ready.top if type(ready) is _PriorityReady else None


class _SizedReady(deque[_Msg]):
    """A queue's ready messages with the sum of their body bytes
    (``nbytes``, as :func:`_bytes_of` counts them), for a queue with a byte
    bound: every change the core makes to ``ready`` is one of the methods
    below, so the sum is kept without walking the queue. Only such queues
    pay for it."""

    __slots__ = ("nbytes",)

    def __init__(self, msgs: Iterable[_Msg] = ()) -> None:
        msgs = list(msgs)
        super().__init__(msgs)
        self.nbytes = _bytes_of(msgs)

    def append(self, m: _Msg) -> None:
        super().append(m)
        self.nbytes += _size(m)

    def appendleft(self, m: _Msg) -> None:
        super().appendleft(m)
        self.nbytes += _size(m)

    def extend(self, msgs: Iterable[_Msg]) -> None:
        msgs = list(msgs)
        super().extend(msgs)
        self.nbytes += _bytes_of(msgs)

    def extendleft(self, msgs: Iterable[_Msg]) -> None:
        msgs = list(msgs)
        super().extendleft(msgs)
        self.nbytes += _bytes_of(msgs)

    def pop(self) -> _Msg:  # type: ignore[override]
        m: _Msg = super().pop()
        self.nbytes -= _size(m)
        return m

    def popleft(self) -> _Msg:
        m: _Msg = super().popleft()
        self.nbytes -= _size(m)
        return m

    def clear(self) -> None:
        super().clear()
        self.nbytes = 0

    def _unsupported(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("a queue's ready messages change only through append, extend, pop and clear")

    remove = rotate = insert = __delitem__ = __setitem__ = __iadd__ = _unsupported


def _priority(m: _Msg, top: int) -> int:
    """Message ``m``'s priority in a queue whose highest is ``top``: its
    ``priority`` property, 0 without one, ``top`` above it (RabbitMQ's rules)."""
    meta = m[4]
    props = meta.props if meta is not None else None
    p = props.get("priority") if props else None
    if type(p) is not int or p <= 0:
        return 0
    return p if p < top else top


class _PriorityReady:
    """A priority queue's ready messages (x-max-priority): one FIFO per
    priority, the highest taken first, behind the deque operations the core
    uses on ``ready`` (so everything else works as for a plain queue). The
    head (``[0]``, ``popleft``) is the oldest message of the highest
    priority that has one; the tail (``[-i]``, ``pop``) is the priority the
    last message went to (a batch shares one), so that refusing the newest
    refuses what was just published. ``nbytes`` sums the body bytes, as in
    :class:`_SizedReady`."""

    __slots__ = ("_last", "_n", "levels", "nbytes", "top")

    def __init__(self, top: int) -> None:
        self.top = top
        self.levels: list[deque[_Msg]] = [deque() for _ in range(top + 1)]
        self._n = 0
        self._last = 0
        self.nbytes = 0

    def __len__(self) -> int:
        return self._n

    def __bool__(self) -> bool:
        return self._n > 0

    def __iter__(self) -> Iterator[_Msg]:
        for level in reversed(self.levels):
            yield from list(level)

    def _head(self) -> deque[_Msg]:
        for level in reversed(self.levels):
            if level:
                return level
        raise IndexError("no ready message")

    def __getitem__(self, i: int) -> _Msg:
        if i == 0:
            return self._head()[0]
        if i < 0:
            return self.levels[self._last][i]
        raise IndexError("a priority queue's ready messages are read at the head or the newest")

    def append(self, m: _Msg) -> None:
        p = self._last = _priority(m, self.top)
        self.levels[p].append(m)
        self._n += 1
        self.nbytes += _size(m)

    def appendleft(self, m: _Msg) -> None:
        self.levels[_priority(m, self.top)].appendleft(m)
        self._n += 1
        self.nbytes += _size(m)

    def extend(self, msgs: Iterable[_Msg]) -> None:
        for m in msgs:
            self.append(m)

    def extendleft(self, msgs: Iterable[_Msg]) -> None:
        for m in msgs:
            self.appendleft(m)

    def pop(self) -> _Msg:
        level = self.levels[self._last]
        if not level:
            raise IndexError("no ready message")
        m = level.pop()
        self._n -= 1
        self.nbytes -= _size(m)
        return m

    def popleft(self) -> _Msg:
        m = self._head().popleft()
        self._n -= 1
        self.nbytes -= _size(m)
        return m

    def clear(self) -> None:
        for level in self.levels:
            level.clear()
        self._n = self.nbytes = 0


class _Group:
    """The consumers of one sender that share a limit of unacknowledged
    deliveries between them (AMQP's basic.qos with ``global``: a channel's
    consumers, as RabbitMQ reads it), beside each one's own ``prefetch``."""

    __slots__ = ("limit", "members")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.members: list[_Consumer] = []

    def room(self) -> int:
        """Deliveries the members may still be sent (counted afresh: the
        members' unacked entries are the one record of what they hold)."""
        return self.limit - sum([len(c.unacked) for c in self.members if not c.no_ack])


class _Consumer:
    __slots__ = (
        "addr",
        "group",
        "held",
        "last_seen",
        "no_ack",
        "pending",
        "prefetch",
        "priority",
        "queue",
        "tag",
        "unacked",
    )

    def __init__(self, addr: Address, spec: ConsumerSpec, queue: _Queue, now: float) -> None:
        self.addr = addr
        self.tag = spec.tag
        self.priority = 0  # RabbitMQ's consumer priority (PriorityConsume)
        self.queue = queue
        self.prefetch = spec.prefetch  # 0: no limit
        self.group: _Group | None = None  # a limit shared with the sender's other consumers
        self.no_ack = spec.no_ack
        self.last_seen = now
        # On a connection (see BrokerCore.hold): never timed out, nor its deliveries.
        self.held = False
        # delivery tag -> (message, sent at); insertion order is send order,
        # so the first entry is always the oldest unacknowledged.
        self.unacked: dict[int, tuple[_Msg, float]] = {}
        # Deliveries not yet handed to the driver, as runs
        # [first_tag, exchange, routing_key, redelivered, bodies] (the wire's form).
        self.pending: list[list[Any]] = []

    def room(self) -> int | None:
        """Deliveries it may still be sent: within its own prefetch and its
        group's shared one; None for no limit (no prefetch, or no_ack)."""
        if self.no_ack:
            return None
        own = self.prefetch - len(self.unacked) if self.prefetch else None
        if self.group is None:
            return own
        shared = self.group.room()
        return shared if own is None or shared < own else own

    def has_credit(self) -> bool:
        """Whether it may be sent one more delivery (see :meth:`room`)."""
        room = self.room()
        return room is None or room > 0


def _binding_key(ex: Exchange, key: str, arguments: dict[str, Any]) -> str:
    """A binding's key in ``ex``: ``key``, or for a headers exchange its
    arguments (see :func:`~cmq.routing.exchanges.headers_binding_key`).

    Raises:
        _Refused: bad headers arguments (precondition-failed).
    """
    if ex.type is not ExchangeType.HEADERS:
        return key
    try:
        return headers_binding_key(key, arguments)
    except ConfigError as exc:
        raise _Refused(ErrorCode.PRECONDITION_FAILED, str(exc)) from None


def _round_robin(q: _Queue, consumers: list[_Consumer]) -> Callable[[], _Consumer | None]:
    """Who takes ``q``'s next message: its consumers in turn from ``q.rr``,
    skipping those without credit; None when none has any."""
    n = len(consumers)

    def pick() -> _Consumer | None:
        for k in range(n):
            c = consumers[(q.rr + k) % n]
            if c.has_credit():
                q.rr = (q.rr + k + 1) % n
                return c
        return None

    return pick


def _by_priority(q: _Queue, consumers: list[_Consumer]) -> Callable[[], _Consumer | None]:
    """:func:`_round_robin` when some consumer has a priority (RabbitMQ's
    consumer priorities): among the highest priority that has a consumer
    with credit."""
    groups: dict[int, list[_Consumer]] = {}
    for c in consumers:
        groups.setdefault(c.priority, []).append(c)
    order = [_round_robin(q, groups[p]) for p in sorted(groups, reverse=True)]

    def pick() -> _Consumer | None:
        for group in order:
            c = group()
            if c is not None:
                return c
        return None

    return pick


def _bytes_of(msgs: Iterable[_Msg]) -> int:
    """The body bytes of queued messages (as :func:`_approx_size` counts them)."""
    return sum([len(m[2]) if type(m[2]) is bytes else _approx_size(m[2]) for m in msgs])


def _size(m: _Msg) -> int:
    """One queued message's body bytes (:func:`_bytes_of` of one, without the list)."""
    body = m[2]
    return len(body) if type(body) is bytes else _approx_size(body)


def _newest(ready: deque[_Msg] | _PriorityReady, n: int) -> int:
    """How many of a batch of ``n`` just enqueued can still be ready, at the
    tail (``pop``, ``[-i]``): in a priority queue, those of the batch's
    priority (a consumer may have taken the batch and left older messages
    of lower priorities)."""
    if type(ready) is _PriorityReady:
        return min(n, len(ready.levels[ready._last]))
    return min(n, len(ready))


def _over_bytes(ready: _SizedReady | _PriorityReady, max_bytes: int, oldest: bool, n: int) -> int:
    """How many of ``ready`` must go, the oldest (``oldest``) or the newest,
    for its body bytes to be at most ``max_bytes``. The newest are only the
    ``n`` just enqueued (those still ready): older ones were already kept.
    The oldest may be more than ``n``, and the newcomers themselves when
    they alone are over the bound (RabbitMQ's drop-head does the same)."""
    excess = ready.nbytes - max_bytes
    k = 0
    if oldest:
        for m in ready:
            if excess <= 0:
                break
            excess -= _size(m)
            k += 1
        return k
    limit = _newest(ready, n)
    for i in range(1, limit + 1):
        if excess <= 0:
            break
        excess -= _size(ready[-i])
        k += 1
    return k


def _approx_size(body: Any) -> int:
    """A cheap guess at a body's encoded size (exact for bytes and ASCII str)."""
    if isinstance(body, bytes | str | bytearray):
        return len(body)
    if type(body) is ExtType:
        return len(body.data) + 6
    if isinstance(body, list | tuple | dict):
        return 16 * len(body) + 16  # a guess; containers of big blobs are rare here
    return 9


# A str of at most this many characters is at most MAX_NAME bytes of UTF-8
# (4 bytes a character at most): only longer ones are encoded to be measured.
_SURELY_SHORT: Final = MAX_NAME // 4


def _check_name(what: str, name: str) -> None:
    """Refuse a name or key over 255 bytes of UTF-8 (AMQP's short string).

    Raises:
        _Refused: ``bad-request`` (AMQP answers a long name with a syntax error).
    """
    if len(name) > _SURELY_SHORT and len(name.encode("utf-8", "surrogatepass")) > MAX_NAME:
        raise _Refused(ErrorCode.BAD_REQUEST, f"{what} is longer than {MAX_NAME} bytes of UTF-8")


#: Bodies the broker keeps as they came (see ``_protocol.wrap_body``).
_OPAQUE: Final = frozenset((bytes, str, int, float, bool, type(None), ExtType))
#: Notes kept for the driver between two of its turns; past this, only counted.
_MAX_NOTES: Final = 256


def _check_properties(props: dict[str, Any]) -> None:
    """Refuse properties over :data:`MAX_PROPERTIES` bytes encoded, or that
    cannot be encoded at all (nested too deep), with ``bad-request``.

    Raises:
        _Refused: as said.
    """
    try:
        size = len(packb(props, use_bin_type=True))
    except (ValueError, TypeError, OverflowError) as exc:
        raise _Refused(ErrorCode.BAD_REQUEST, f"message properties cannot be kept: {exc}") from None
    if size > MAX_PROPERTIES:
        raise _Refused(ErrorCode.BAD_REQUEST,
                       f"message properties take {size} bytes, more than {MAX_PROPERTIES}")  # fmt: skip


def _opaque(body: Any) -> Any:
    """``body`` in the form the broker keeps: a scalar or extension value as
    it came; a container sent as such (a publisher that does not wrap its
    bodies) packed once, here, so that every delivery carries the same bytes.

    Raises:
        _Refused: the body cannot be packed.
    """
    if type(body) in _OPAQUE:
        return body
    try:
        return wrap_body(body)
    except (TypeError, RecursionError) as exc:
        raise _Refused(ErrorCode.BAD_REQUEST, f"message body refused: {exc}") from None


def _opaque_all(bodies: list[Any]) -> list[Any]:
    if _OPAQUE.issuperset(map(type, bodies)):
        return bodies
    return [_opaque(b) for b in bodies]


def _ttl(expiration: int | None) -> float | None:
    return None if expiration is None else expiration / 1000


def _queue_arguments(
    args: dict[str, Any],
) -> tuple[str | None, str | None, float | None, float | None, bool, int | None, int | None]:
    """(dead-letter exchange, dead-letter routing key, message TTL in seconds,
    queue TTL in seconds, single active consumer, ready body bytes bound,
    highest priority) from queue arguments.

    Raises:
        _Refused: an unknown argument or a value of the wrong kind.
    """
    unknown = set(args) - {DLX_ARG, DLRK_ARG, TTL_ARG, EXPIRES_ARG, SINGLE_ARG, MAX_BYTES_ARG, PRIORITY_ARG}
    if unknown:
        raise _Refused(ErrorCode.BAD_REQUEST, f"unknown queue argument {brief(sorted(unknown)[0])}"
                       f" (known: {DLX_ARG}, {DLRK_ARG}, {TTL_ARG}, {EXPIRES_ARG}, {SINGLE_ARG},"
                       f" {MAX_BYTES_ARG}, {PRIORITY_ARG})")  # fmt: skip
    dlx, dlrk, ttl = args.get(DLX_ARG), args.get(DLRK_ARG), args.get(TTL_ARG)
    expires = args.get(EXPIRES_ARG)
    for what, v in ((DLX_ARG, dlx), (DLRK_ARG, dlrk)):
        if v is not None:
            if type(v) is not str:
                raise _Refused(ErrorCode.BAD_REQUEST, f"{what} must be a string, got {brief(v)}")
            _check_name(what, v)
    if dlrk is not None and dlx is None:
        raise _Refused(ErrorCode.BAD_REQUEST, f"{DLRK_ARG} needs {DLX_ARG}")
    if ttl is not None and (type(ttl) is not int or ttl < 0):
        raise _Refused(ErrorCode.BAD_REQUEST, f"{TTL_ARG} must be a non-negative integer (ms), got {brief(ttl)}")
    if expires is not None and (type(expires) is not int or expires < 1):
        raise _Refused(ErrorCode.BAD_REQUEST, f"{EXPIRES_ARG} must be a positive integer (ms), got {brief(expires)}")
    single = args.get(SINGLE_ARG, False)
    if type(single) is not bool:
        raise _Refused(ErrorCode.BAD_REQUEST, f"{SINGLE_ARG} must be true or false, got {brief(single)}")
    max_bytes = args.get(MAX_BYTES_ARG)
    if max_bytes is not None and (type(max_bytes) is not int or max_bytes < 0):
        raise _Refused(ErrorCode.BAD_REQUEST,
                       f"{MAX_BYTES_ARG} must be a non-negative integer (bytes), got {brief(max_bytes)}")  # fmt: skip
    top = args.get(PRIORITY_ARG)
    if top is not None and (type(top) is not int or not 0 <= top <= MAX_PRIORITY):
        raise _Refused(ErrorCode.BAD_REQUEST,
                       f"{PRIORITY_ARG} must be an integer from 0 to {MAX_PRIORITY}, got {brief(top)}")  # fmt: skip
    return dlx, dlrk, _ttl(ttl), _ttl(expires), single, max_bytes, top


def _describe(
    max_length: int,
    overflow: Overflow,
    dlx: str | None,
    dlrk: str | None,
    ttl: float | None,
    expires: float | None = None,
    single: bool = False,
    max_bytes: int | None = None,
    top: int | None = None,
) -> str:
    text = f"max_length={max_length} overflow={overflow.value!r}"
    if max_bytes is not None:
        text += f" {MAX_BYTES_ARG}={max_bytes}"
    if top is not None:
        text += f" {PRIORITY_ARG}={top}"
    if dlx is not None:
        text += f" {DLX_ARG}={dlx!r}"
    if dlrk is not None:
        text += f" {DLRK_ARG}={dlrk!r}"
    if ttl is not None:
        text += f" {TTL_ARG}={round(ttl * 1000)}"
    if expires is not None:
        text += f" {EXPIRES_ARG}={round(expires * 1000)}"
    if single:
        text += f" {SINGLE_ARG}=true"
    return text


def _arguments_of(q: _Queue) -> dict[str, Any]:
    """The RabbitMQ queue arguments ``q`` was declared with."""
    args: dict[str, Any] = {}
    if q.dlx is not None:
        args[DLX_ARG] = q.dlx
    if q.dlrk is not None:
        args[DLRK_ARG] = q.dlrk
    if q.ttl is not None:
        args[TTL_ARG] = round(q.ttl * 1000)
    if q.expires is not None:
        args[EXPIRES_ARG] = round(q.expires * 1000)
    if q.single:
        args[SINGLE_ARG] = True
    if q.max_bytes is not None:
        args[MAX_BYTES_ARG] = q.max_bytes
    if q.max_priority is not None:
        args[PRIORITY_ARG] = q.max_priority
    return args


def _died(props: dict[str, Any] | None, queue: str, reason: str, exchange: str, key: str, when: int) -> dict[str, Any]:
    """A dead-lettered message's properties, as RabbitMQ writes them.

    Its ``expiration`` goes (kept as ``original-expiration`` in the death's
    record). The ``x-death`` header is a list of records, latest first, one
    per (queue, reason): a message that dies again the same way has that
    record's ``count`` raised and moved to the front; otherwise a new record
    ``{count: 1, reason, queue, time, exchange, routing-keys}`` is put first.
    The first death also sets ``x-first-death-queue``, ``-reason`` and
    ``-exchange``. ``when`` is the wall-clock time in seconds.
    """
    out = dict(props) if props else {}
    expiration = out.pop("expiration", None)
    headers = out.get("headers")
    headers = dict(headers) if type(headers) is dict else {}
    had = headers.get("x-death")
    records = [r for r in had if type(r) is dict] if type(had) is list else []
    for i, r in enumerate(records):
        if r.get("queue") == queue and r.get("reason") == reason:
            count = r.get("count")
            r = dict(r, count=(count if type(count) is int else 0) + 1)
            del records[i]
            records.insert(0, dict(sorted(r.items())))  # RabbitMQ sorts an updated record's fields
            break
    else:
        record: dict[str, Any] = {"count": 1, "reason": reason, "queue": queue, "time": when,
                                  "exchange": exchange, "routing-keys": [key]}  # fmt: skip
        if expiration is not None:
            record["original-expiration"] = expiration
        records.insert(0, record)
        if had is None:
            headers["x-first-death-exchange"] = exchange
            headers["x-first-death-queue"] = queue
            headers["x-first-death-reason"] = reason
    headers["x-death"] = records[:_MAX_DEATHS]
    out["headers"] = headers
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class ExclusiveConsume(Consume):
    """AMQP's basic.consume with ``exclusive``: the consumer is the queue's
    only one while it consumes (a front end's request, not on cmq's wire)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PriorityConsume(Consume):
    """AMQP's basic.consume with RabbitMQ's ``x-priority`` argument: while a
    consumer of a higher priority has credit, the queue's messages go to it
    (round robin among those of the same priority); the others get messages
    only when all of those are full (a front end's request, not on cmq's wire)."""

    priority: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class ChannelPrefetch:
    """AMQP's basic.qos with ``global``: the sender's consumers, those it
    has and those it starts later, may hold at most ``prefetch``
    unacknowledged deliveries between them (0: no shared limit), beside
    each one's own prefetch (a front end's request, not on cmq's wire)."""

    rid: int
    prefetch: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ExchangeBind:
    """Bind exchange ``destination`` to exchange ``source`` (AMQP's
    exchange.bind, RabbitMQ's extension): what ``source`` routes with
    ``key`` (and ``arguments``, for a headers exchange) goes on through
    ``destination`` with its routing key unchanged (a front end's request,
    not on cmq's wire)."""

    rid: int
    destination: str
    source: str
    key: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class ExchangeUnbind(ExchangeBind):
    """Undo an :class:`ExchangeBind`."""


#: What an exchange-to-exchange binding binds in its source exchange's
#: table: this prefix and the destination's name (no queue name starts so:
#: see _reserved).
_TO_EXCHANGE: Final = "\x00exchange:"


def _target_name(target: str) -> str:
    """A binding's target as people read it: a queue's name, or an exchange's as ``exchange:NAME``."""
    return "exchange:" + target[len(_TO_EXCHANGE) :] if target.startswith(_TO_EXCHANGE) else target


def server_queue_name() -> str:
    """A name for a server-named queue, made as RabbitMQ makes them."""
    return "amq.gen-" + secrets.token_urlsafe(16)


def _reserved(name: str) -> bool:
    return name == "" or name.startswith(("amq.", _TO_EXCHANGE))


#: The exchanges every broker has from its start, besides the default one,
#: as AMQP 0-9-1 asks (``amq.direct`` and ``amq.fanout``
#: always, ``amq.topic`` and ``amq.match`` with their types) and RabbitMQ
#: has (``amq.headers`` too). Durable, so that a durable queue's bindings to
#: them are kept; never stored (each start makes them again); never deleted;
#: declaring one again with its type and ``durable=True`` is a no-op.
SYSTEM_EXCHANGES: Final[tuple[tuple[str, ExchangeType], ...]] = (
    ("amq.direct", ExchangeType.DIRECT),
    ("amq.fanout", ExchangeType.FANOUT),
    ("amq.topic", ExchangeType.TOPIC),
    ("amq.headers", ExchangeType.HEADERS),
    ("amq.match", ExchangeType.HEADERS),
)
_SYSTEM_NAMES: Final = frozenset(name for name, _ in SYSTEM_EXCHANGES)


def _unlist(q: _Queue, c: _Consumer, now: float) -> None:
    """Take ``c`` off ``q``'s consumers (and its exclusive hold): the queue
    is unused from ``now`` on when it was the last (x-expires)."""
    q.consumers.remove(c)
    if q.exclusive is c:
        q.exclusive = None
    if not q.consumers:
        q.used_at = now


class BrokerCore:
    """The broker's state and rules, driven by received payloads and ``now``.

    Raises:
        ConfigError: (constructor) ``config`` is not a :class:`BrokerConfig`.
    """

    def __init__(
        self,
        config: BrokerConfig | None = None,
        *,
        endpoint_stats: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        if config is None:
            config = BrokerConfig()
        if not isinstance(config, BrokerConfig):
            raise ConfigError("config must be a BrokerConfig")
        self.config = config
        # The driver's endpoint counters (datagrams dropped, kernel drops),
        # added to the stats reply so one request shows every drop.
        self._endpoint_stats = endpoint_stats
        self._exchanges: dict[str, Exchange] = {"": make_exchange(ExchangeType.DIRECT)}
        self._queues: dict[str, _Queue] = {}
        self._consumers: dict[tuple[Address, str], _Consumer] = {}
        self._with_pending: dict[tuple[Address, str], _Consumer] = {}
        # Senders whose consumers share a limit (ChannelPrefetch): one group each.
        self._groups: dict[Address, _Group] = {}
        self._out: list[Outgoing] = []
        self._replies: dict[tuple[Address, int], Any] = {}
        self._totals: Counter[str] = Counter()
        # Delivery tags are unique across the broker, not per consumer: acks
        # sent by a consumer's earlier incarnation (before it was detached
        # and re-attached) must never match a new delivery.
        self._next_dtag = 1
        self._handed = 0  # messages handed over on the latency path (see stats)
        # What was refused or failed, for the driver to log (rate-limited
        # there): bounded, the counters hold the rest.
        self.notes: deque[Note] = deque(maxlen=_MAX_NOTES)
        # Names of the queues whose ready messages may expire (see _Queue.expiring).
        self._expiring: set[str] = set()
        # Exchange-to-exchange bindings (ExchangeBind), by destination:
        # {(source, key)}. Routing looks through them only while there is one.
        self._into: dict[str, set[tuple[str, str]]] = {}
        # Names of the queues that go once unused for a while (x-expires).
        self._with_expires: set[str] = set()
        # Connections (the first part of their addresses) whose consumers
        # are not timed out: a front end over TCP says when one ends.
        self._held: set[str] = set()
        # The store (see cmq.routing._store): when ``persisting`` (the driver
        # has a store), what must be kept or forgotten on disk is appended to
        # ``journal`` as records, for the driver to write and commit before
        # the replies of the same turn leave.
        self.persisting = False
        self.journal: list[tuple[Any, ...]] = []
        # Raised by check_memory() over the memory budget (see "Memory" above);
        # what it last found held, and the bytes that came in since (so that
        # their sum is never below what is held).
        self.memory_alarm = False
        self._held_seen = 0
        self._grown_since = 0
        self._next_pid = 1
        self._durable_exchanges: set[str] = set()
        for name, kind in SYSTEM_EXCHANGES:
            self._exchanges[name] = make_exchange(kind)
            self._durable_exchanges.add(name)
        # Wall-clock seconds at ``now == 0``, set by a driver with a real
        # clock: the time written into a dead letter's ``x-death`` record.
        self.epoch = 0.0

    # -- in-process front ends (AMQP) -------------------------------------------

    def call(self, event: Any, sender: Address, now: float) -> Any:
        """Do one request for a front end in this process; return its ``ok`` result.

        The same handlers as :meth:`handle`, without the reply: the caller
        gets the result or the refusal directly. Deliveries and other
        messages it causes come out of :meth:`messages_to_send` as usual.

        Raises:
            Refused: the request cannot be done (``code`` says why).
            KeyError: ``event`` is not a request.
        """
        return _HANDLERS[type(event)](self, event, sender, now)

    def declare_server_named(self, event: DeclareQueue, name: str, sender: Address, now: float) -> Any:
        """:meth:`call` with a :class:`DeclareQueue` of a server-named queue
        (``event.name`` empty) that is to be called ``name``, a name
        :func:`server_queue_name` made: for a front end that checks a user's
        permissions on the name before the queue exists, as RabbitMQ does.

        Raises:
            Refused: as :meth:`call`.
        """
        return self._declare_queue(event, sender, now, generated=name)

    def hold(self, conn: str) -> None:
        """Mark connection ``conn`` (the first part of its senders' addresses)
        as one that says when it ends: its consumers and their deliveries are
        never timed out (the transport delivers, or the connection ends)."""
        self._held.add(conn)

    def release(self, conn: str, now: float) -> None:
        """Connection ``conn`` ended: its consumers go (their unacknowledged
        messages back to their queues, marked redelivered) and so do its
        exclusive queues."""
        self._held.discard(conn)
        for key, c in list(self._consumers.items()):
            if key[0][0] == conn:
                self._detach(key, c, now)
        for addr in [a for a in self._groups if a[0] == conn]:
            del self._groups[addr]
        for q in [q for q in self._queues.values() if q.owner == conn]:
            self._drop_queue(q, now)

    def queue_info(self, name: str, sender: Address, now: float | None = None) -> tuple[int, int]:
        """(ready messages, consumers) of queue ``name`` (AMQP's passive
        declare: with ``now``, a use of the queue for its x-expires, as
        RabbitMQ counts one).

        Raises:
            Refused: no such queue, or it is another connection's exclusive queue.
        """
        q = self._queue_for(name, sender)
        if now is not None:
            q.used_at = now
        return len(q.ready), len(q.consumers)

    def queue_options(self, name: str) -> tuple[int, str, dict[str, Any]] | None:
        """(max_length, overflow, arguments) queue ``name`` was declared with, or None."""
        q = self._queues.get(name)
        if q is None:
            return None
        return q.max_length, q.overflow.value, _arguments_of(q)

    def exchange_in_use(self, name: str) -> bool:
        """Whether exchange ``name`` has bindings."""
        ex = self._exchanges.get(name)
        return ex is not None and any(True for _ in ex.bindings())

    def held_bytes(self) -> int:
        """Body bytes of every message the broker holds (ready, or delivered and
        not yet acknowledged): what a memory budget is checked against. Kept
        per queue as messages come and go, so this costs one step per queue."""
        return sum([q.nbytes for q in self._queues.values()])

    def check_memory(self) -> bool:
        """Raise the memory alarm at ``memory_budget`` held bytes, clear it
        under ``MEMORY_RESUME_FRACTION`` of it; whether it is raised. Drivers
        call it once per turn (it costs one step per queue)."""
        held, budget = self.held_bytes(), self.config.memory_budget
        self._held_seen, self._grown_since = held, 0
        if not self.memory_alarm:
            if held >= budget:
                self.memory_alarm = True
                self._note("memory_alarms", None,
                           f"holds {held} bytes of messages, over its memory budget of {budget}: "
                           "cmq-protocol publishes are refused (resource-error) until it holds under "
                           f"{int(budget * MEMORY_RESUME_FRACTION)}")  # fmt: skip
        elif held < budget * MEMORY_RESUME_FRACTION:
            self.memory_alarm = False
        return self.memory_alarm

    def turn_memory(self) -> bool:
        """What drivers call once per turn instead of :meth:`check_memory`:
        while the alarm is down this costs nothing, because a message that
        brings what is held to the budget raises it as it comes in
        (``_grown``, from an upper bound of what is held); while it is up,
        the exact look that clears it (one step per queue). Whether the
        alarm is raised. (Looking every turn cost 0.2 ms a message with
        10,000 queues.)"""
        return self.check_memory() if self.memory_alarm else False

    def _grown(self, size: int) -> None:
        """``size`` more bytes are held: look at the budget at once when what
        was last found held plus what came in since reaches it, so that the
        message that reaches the budget raises the alarm (see "Memory")."""
        self._grown_since += size
        if not self.memory_alarm and self._held_seen + self._grown_since >= self.config.memory_budget:
            self.check_memory()

    def _refuse_over_budget(self, n: int, sender: Address) -> None:
        """Refuse a cmq-protocol publish of ``n`` messages while the memory
        alarm is raised (AMQP channels are held back by their driver instead)."""
        host = sender[0]
        if type(host) is str and host.startswith(AMQP_PREFIX):
            return
        self._totals["published"] += n
        self._totals["refused_memory"] += n
        raise _Refused(ErrorCode.RESOURCE_ERROR,
                       f"the broker holds more than its memory budget of {self.config.memory_budget} bytes; "
                       "publish again once consumers have taken messages")  # fmt: skip

    def exchange_type(self, name: str) -> str | None:
        """The type of exchange ``name``, or None when there is none."""
        ex = self._exchanges.get(name)
        return None if ex is None else ex.type.value

    # -- inspection (the management console; read-only) ---------------------------

    def exchanges_info(self) -> list[dict[str, Any]]:
        """Every exchange: name, type, durable and its bindings (queue, key), by name."""
        return [
            {
                "name": name,
                "type": ex.type.value,
                "durable": name in self._durable_exchanges,
                "bindings": sorted((_target_name(b.queue), b.key) for b in ex.bindings()),
            }
            for name, ex in sorted(self._exchanges.items())
        ]

    def queue_names(self) -> list[str]:
        """Every queue's name, in declaration order."""
        return list(self._queues)

    def queue_stats(self, names: Iterable[str]) -> list[QueueStats]:
        """Snapshots of the queues of ``names`` that exist (cheaper than
        :meth:`stats` when there are many queues and few are wanted)."""
        queues = self._queues
        return [self._queue_stats(queues[n]) for n in names if n in queues]

    def queue_details(self, name: str) -> dict[str, Any] | None:
        """What queue ``name`` was declared with and its bindings (exchange,
        key), or None when there is none."""
        q = self._queues.get(name)
        if q is None:
            return None
        return {
            "durable": q.durable,
            "exclusive": q.owner is not None,
            "auto_delete": q.auto_delete,
            "max_length": q.max_length,
            "overflow": q.overflow.value,
            "arguments": _arguments_of(q),
            "bindings": sorted(q.bindings),
        }

    def peek(self, name: str, limit: int) -> list[dict[str, Any]] | None:
        """The first ``limit`` ready messages of queue ``name``, left where they
        are: exchange, routing key, body (as kept), redelivered, where it was
        dead-lettered from. None when there is no such queue."""
        q = self._queues.get(name)
        if q is None:
            return None
        out = []
        for i, (exchange, key, body, redelivered, meta) in enumerate(q.ready):
            if i >= limit:
                break
            out.append({
                "exchange": exchange,
                "routing_key": key,
                "body": body,
                "redelivered": redelivered,
                "deaths": list(meta.deaths) if meta is not None else [],
            })  # fmt: skip
        return out

    def route_preview(self, exchange: str, routing_key: str) -> list[str] | None:
        """The queues a message published to ``exchange`` with ``routing_key``
        would reach (sorted), changing nothing; None when there is no such exchange."""
        ex = self._exchanges.get(exchange)
        if ex is None:
            return None
        return sorted(self._targets(ex, exchange, routing_key))

    def restore(self, state: StoredState, now: float) -> None:
        """Take back what a store kept (see :mod:`cmq.routing._store`), before serving.

        Durable exchanges, queues and bindings are declared again; each
        stored message goes back to its queue, in the order it was stored,
        marked ``redelivered`` (it may have been delivered before the
        restart). A message's TTL (its own or its queue's, the shorter)
        counts again from ``now``. Nothing is
        written to the journal: it is on disk already.

        Raises:
            Refused: the stored state is not one this broker can take
                (a bad queue argument or exchange type).
        """
        for name, kind in state.exchanges:
            if name not in self._exchanges:
                self._exchanges[name] = make_exchange(ExchangeType(kind))
            self._durable_exchanges.add(name)
        for sq in state.queues:
            dlx, dlrk, ttl, expires, single, max_bytes, top = _queue_arguments(sq.arguments)
            overflow = Overflow(_OVERFLOW_ALIASES.get(sq.overflow, sq.overflow))
            q = self._queues[sq.name] = _Queue(sq.name, sq.max_length, overflow, dlx, dlrk, ttl)
            q.single = single
            q.prioritise(top)
            q.limit_bytes(max_bytes)
            self._set_expires(q, expires, now)  # a restart counts as a use, as in RabbitMQ
            q.auto_delete = sq.auto_delete
            q.durable = True
            if ttl is not None:
                self._expiring.add(sq.name)
            self._exchanges[""].bind(sq.name, sq.name)
            q.bindings.add(("", sq.name))
        for dest, source, key in state.exchange_bindings:
            src = self._exchanges.get(source)
            if src is not None and dest in self._exchanges:
                src.bind(_TO_EXCHANGE + dest, key)
                self._into.setdefault(dest, set()).add((source, key))
        for qname, exname, key in state.bindings:
            q_ = self._queues.get(qname)
            ex = self._exchanges.get(exname)
            if q_ is not None and ex is not None:
                ex.bind(qname, key)
                q_.bindings.add((exname, key))
        for m in state.messages:
            q_ = self._queues.get(m.queue)
            if q_ is None:
                continue
            ttl = m.ttl if q_.ttl is None or (m.ttl is not None and m.ttl < q_.ttl) else q_.ttl
            expires = None if ttl is None else now + ttl
            if expires is not None:
                q_.expiring = True
                self._expiring.add(q_.name)
            meta = _Meta(expires, (), m.props, m.id)
            q_.ready.append((m.exchange, m.routing_key, m.body, True, meta))
            size = _size(q_.ready[-1])
            q_.nbytes += size
            self._grown(size)
            self._count(q_, "enqueued")
            self._next_pid = max(self._next_pid, m.id + 1)

    @property
    def next_message_id(self) -> int:
        """The store id the next persistent message gets."""
        return self._next_pid

    # -- driver interface ----------------------------------------------------

    def receive(self, payload: Any, sender: Address, now: float) -> None:
        """Take one received payload from ``sender``; never raises.

        A payload that is not a broker message is counted as ``malformed``
        (and answered with ``bad-request`` when it carries a request id); a
        body that cannot be kept as ``bad_body``. An exception from handling
        it (a bug: nothing a client sends should cause one) is counted as
        ``internal_error`` and noted with what raised it, and the broker
        goes on with the next payload.
        """
        try:
            self._receive(payload, sender, now, False)
        except Exception as exc:  # noqa: BLE001 - the broker must outlive any one payload
            self.note_internal_error(exc, sender, "handling a message")

    def receive_at_once(self, payload: Any, sender: Address, now: float) -> Outgoing | None:
        """:meth:`receive`, for a driver's latency path: when ``payload`` is an
        unconfirmed publish ``["p", 0, exchange, key, body]`` handed straight
        to its consumer (see :meth:`hand_over`) and nothing else waits to be
        sent, the delivery comes back, ready to push, instead of waiting for
        :meth:`messages_to_send` (a ping-pong's every message, in fewer
        steps); None otherwise, the payload received as usual. Never raises."""
        try:
            return self._receive(payload, sender, now, not (self._out or self._with_pending))
        except Exception as exc:  # noqa: BLE001 - as receive
            self.note_internal_error(exc, sender, "handling a message")
            return None

    def note_internal_error(self, exc: BaseException, sender: Address | None, doing: str) -> None:
        """Count and note an unexpected exception (a bug) the driver caught."""
        self._totals["internal_error"] += 1
        tb = exc.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        where = f" at {tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}" if tb is not None else ""
        text = str(exc)
        if len(text) > 200:
            text = text[:200] + "..."
        detail = f"{type(exc).__name__} {doing}{where}: {text}"
        self.notes.append(Note(reason="internal_error", sender=sender, detail=detail))

    def _note(self, reason: str, sender: Address | None, detail: str) -> None:
        self._totals[reason] += 1
        self.notes.append(Note(reason=reason, sender=sender, detail=detail))

    def _receive(self, payload: Any, sender: Address, now: float, at_once: bool) -> Outgoing | None:
        # Hot path: an unconfirmed publish ["p", 0, exchange, key, body] or
        # batch ["P", 0, exchange, key, [bodies]] is checked inline and routed
        # without building an event object, which was a third of the cost
        # per message. With ``at_once`` (see receive_at_once) a publish
        # handed over comes back as its delivery.
        if type(payload) is list and len(payload) == 5:
            op, rid, exchange, key, body = payload
            if type(rid) is int and rid == 0 and type(exchange) is str and type(key) is str:
                if op == "p":
                    if not at_once:
                        if self.hand_over(exchange, key, body, now):
                            return None
                    elif type(body) in _OPAQUE and not self.memory_alarm:
                        c = self._handed_to(exchange, key, body, now)
                        if c is not None:
                            run = [self._next_dtag - 1, exchange, key, False, [body]]
                            return _outgoing(c.addr, DELIVERY_MAILBOX, ["d", c.tag, [run]])
                    bodies = [body]
                elif op == "P" and type(body) is list:
                    bodies = body
                else:
                    bodies = None
            else:
                bodies = None
            if bodies is not None:
                try:
                    if self.memory_alarm:
                        self._refuse_over_budget(len(bodies), sender)
                    self._route(exchange, key, self._bodies(bodies, sender), now)
                except _Refused as exc:
                    self._reply(sender, ErrorReply(rid=0, code=exc.code, message=str(exc)))
                return None
        try:
            event = decode(payload)
        except ProtocolError as exc:
            self._note("malformed", sender, str(exc))
            rid = payload[1] if isinstance(payload, list | tuple) and len(payload) > 1 else 0
            if type(rid) is int and rid > 0:
                self._reply(
                    sender, ErrorReply(rid=rid, code=ErrorCode.BAD_REQUEST, message=str(exc))
                )
            return None
        self.handle(event, sender, now)
        return None

    def hand_over(self, exchange: str, key: str, body: Any, now: float) -> bool:
        """An unconfirmed publish of ``body`` without properties or
        expiration (a cmq client's ``["p", 0, ...]``, or one the AMQP front
        end read), handed straight to the consumer when it routes to one
        queue that holds nothing and has one consumer with room (see
        ``_hand_over``). False, having done nothing, in any other case:
        publish it as usual."""
        return type(body) in _OPAQUE and not self.memory_alarm and self._hand_over(exchange, key, body, now)

    def _hand_over(self, exchange: str, key: str, body: Any, now: float) -> bool:
        """The latency path of one unconfirmed publish ``["p", 0, exchange, key, body]``.

        When it routes to exactly one queue that holds nothing and has one
        consumer with credit and nothing pending, the delivery is handed
        over here: the same outcome as ``_route`` (tag, unacked entry,
        pending run, counters) in fewer steps. Returns False, having changed
        nothing, in any other case.
        """
        c = self._handed_to(exchange, key, body, now)
        if c is None:
            return False
        c.pending = [[self._next_dtag - 1, exchange, key, False, [body]]]
        self._with_pending[(c.addr, c.tag)] = c
        return True

    def _handed_to(self, exchange: str, key: str, body: Any, now: float) -> _Consumer | None:
        """What the latency paths share: when the publish routes to exactly
        one queue that holds nothing and has one consumer with credit and
        nothing pending, take the next delivery tag (``_next_dtag - 1``
        afterwards), keep the message unacked with that consumer, count it,
        and return the consumer; the caller sends the delivery. None, having
        changed nothing, in any other case."""
        ex = self._exchanges.get(exchange)
        if ex is None or len(key) > _SURELY_SHORT:
            return None  # _route answers (or measures the key)
        names = ex.route(key) if not self._into else self._targets(ex, exchange, key)
        if len(names) != 1:
            return None
        q = self._queues[next(iter(names))]
        consumers = q.consumers
        if q.ready or len(consumers) != 1 or q.ttl is not None:
            return None  # (a message TTL: _enqueue keeps it with the message, should it be requeued)
        c = consumers[0]
        if c.pending or not c.has_credit():
            return None
        dtag = self._next_dtag
        self._next_dtag = dtag + 1
        if not c.no_ack:
            c.unacked[dtag] = ((exchange, key, body, False, None), now)
            size = len(body) if type(body) is bytes else _approx_size(body)
            q.nbytes += size
            self._grown(size)
        q.handed += 1  # published, enqueued and delivered (see stats)
        self._handed += 1
        return c

    def handle(self, event: object, sender: Address, now: float) -> None:
        """Act on one decoded request from ``sender`` (see ``_HANDLERS``)."""
        handler = _HANDLERS.get(type(event))
        if handler is None:
            self._note("malformed", sender, f"not a request: {type(event).__name__}")
            return
        rid: int = getattr(event, "rid", 0)
        if rid:
            cached = self._replies.get((sender, rid))
            if cached is not None:
                self._totals["resent_requests"] += 1
                self._out.append(Outgoing(dest=sender, mailbox=REPLY_MAILBOX, payload=cached))
                return
        try:
            result = handler(self, event, sender, now)
        except _Refused as exc:
            if rid:
                self._reply(sender, ErrorReply(rid=rid, code=exc.code, message=str(exc)))
            elif isinstance(event, Publish | PublishBatch):
                # Nobody waits for this answer, but the publisher can act on
                # it (stop, slow down, declare), so it is told anyway.
                self._reply(sender, ErrorReply(rid=0, code=exc.code, message=str(exc)))
            return
        except Exception as exc:  # noqa: BLE001 - a bug: counted, noted, and the requester told
            self.note_internal_error(exc, sender, f"handling {type(event).__name__}")
            if rid:
                message = f"the broker failed at this request ({type(exc).__name__}); see its log"
                self._reply(sender, ErrorReply(rid=rid, code=ErrorCode.INTERNAL_ERROR, message=message))
            return
        if rid:
            self._reply(sender, OkReply(rid=rid, result=result))

    def messages_to_send(self) -> list[Outgoing]:
        """Return (and forget) everything to push, delivery batches included."""
        out, self._out = self._out, []
        if not self._with_pending:
            return out
        count = limit = 0
        for c in self._with_pending.values():
            runs, c.pending = c.pending, []
            if len(runs) == 1 and len(runs[0][4]) == 1:
                # One delivery (a ping-pong's): the run is the batch.
                out.append(_outgoing(c.addr, DELIVERY_MAILBOX, ["d", c.tag, runs]))
                continue
            if not count:
                count, limit = self.config.batch_count, self.config.batch_bytes
            batch: list[list[Any]] = []
            n = size = 0
            for r in runs:
                first, ex, key, redelivered, bodies = r[:5]
                props = r[5] if len(r) > 5 else None
                head = len(ex) + len(key) + 16
                start = 0
                for i, body in enumerate(bodies):
                    b = len(body) if type(body) is bytes else _approx_size(body)
                    if n and (n >= count or size + b + head > limit):
                        # This message is full: close it with the run's part so far.
                        if i > start:
                            part = [first + start, ex, key, redelivered, bodies[start:i]]
                            if props is not None:
                                part.append(props[start:i])
                            batch.append(part)
                        out.append(
                            Outgoing(dest=c.addr, mailbox=DELIVERY_MAILBOX, payload=["d", c.tag, batch])
                        )
                        batch, n, size, start = [], 0, 0, i
                    n += 1
                    size += b + 2
                if start == 0:
                    batch.append(r)
                else:
                    part = [first + start, ex, key, redelivered, bodies[start:]]
                    if props is not None:
                        part.append(props[start:])
                    batch.append(part)
                size += head
            if batch:
                out.append(
                    Outgoing(dest=c.addr, mailbox=DELIVERY_MAILBOX, payload=["d", c.tag, batch])
                )
        self._with_pending.clear()
        return out

    def next_deadline(self) -> float | None:
        """The earliest time ``handle_timer`` has work to do, or None."""
        best: float | None = None
        for name in self._expiring:
            ready = self._queues[name].ready
            if ready:
                meta = ready[0][4]
                if meta is not None and meta.expires is not None and (best is None or meta.expires < best):
                    best = meta.expires
        for name in self._with_expires:
            q = self._queues[name]
            if not q.consumers and q.expires is not None:
                t = q.used_at + q.expires
                if best is None or t < best:
                    best = t
        timeout, ack_timeout = self.config.consumer_timeout, self.config.ack_timeout
        for c in self._consumers.values():
            if c.held:
                continue
            t = c.last_seen + timeout
            if c.unacked:
                t = min(t, next(iter(c.unacked.values()))[1] + ack_timeout)
            if best is None or t < best:
                best = t
        return best

    def handle_timer(self, now: float) -> None:
        """Detach consumers gone silent, requeue overdue deliveries, expire
        messages, delete queues unused for their ``x-expires``."""
        for name in list(self._expiring):
            self._expire(self._queues[name], now)
        for name in list(self._with_expires):
            q = self._queues[name]
            if not q.consumers and q.expires is not None and q.used_at + q.expires <= now:
                # Deleted as queue.delete would (its messages go, not to a
                # dead-letter exchange, as in RabbitMQ).
                self._drop_queue(q, now)
                self._totals["queues_expired"] += 1
        timeout, ack_timeout = self.config.consumer_timeout, self.config.ack_timeout
        for key, c in list(self._consumers.items()):
            if c.held:
                continue
            if c.last_seen + timeout <= now:
                self._detach(key, c, now)
                self._totals["consumers_expired"] += 1
                continue
            overdue: list[int] = []
            for dtag, (_, sent) in c.unacked.items():
                if sent + ack_timeout > now:
                    break
                overdue.append(dtag)
            if overdue:
                self._requeue(c.queue, [c.unacked.pop(d)[0] for d in overdue])
                self._settled(c, now)

    def note_send_failed(self, n: int = 1) -> None:
        """Count messages the driver could not hand to the OS (shown in stats)."""
        self._totals["send_failed"] += n

    def stats(self, *, per_queue: bool = True) -> BrokerStats:
        """A frozen snapshot of the counters and (``per_queue``) of every queue."""
        queues = tuple(self._queue_stats(q) for q in self._queues.values()) if per_queue else ()
        t = self._totals.copy()
        for name in ("published", "enqueued", "delivered"):
            t[name] += self._handed
        return BrokerStats(
            exchanges=len(self._exchanges),
            queues=len(self._queues),
            consumers=sum(len(q.consumers) for q in self._queues.values()),
            per_queue=queues,
            **{
                name: t[name]
                for name in (
                    "published",
                    "unroutable",
                    *_COUNTERS,
                    "consumers_expired",
                    "consumers_reattached",
                    "malformed",
                    "resent_requests",
                    "stale_acks",
                    "send_failed",
                    "dead_letters_dropped",
                    "refused_memory",
                    "memory_alarms",
                    "queues_expired",
                    "requeued_in_doubt",
                )
            },
            bad_bodies=t["bad_body"],
            internal_errors=t["internal_error"],
        )

    # -- helpers ---------------------------------------------------------------

    def _reply(self, dest: Address, reply: OkReply | ErrorReply) -> None:
        payload = encode(reply)
        if reply.rid and self.config.reply_cache:
            cache = self._replies
            cache[(dest, reply.rid)] = payload
            if len(cache) > self.config.reply_cache:
                del cache[next(iter(cache))]  # oldest first: dicts keep order
        self._out.append(Outgoing(dest=dest, mailbox=REPLY_MAILBOX, payload=payload))

    def _count(self, q: _Queue, name: str, n: int = 1) -> None:
        q.counts[name] += n
        self._totals[name] += n

    def _queue_stats(self, q: _Queue) -> QueueStats:
        return QueueStats(
            name=q.name,
            max_length=q.max_length,
            overflow=q.overflow.value,
            ready=len(q.ready),
            unacked=sum(len(c.unacked) for c in q.consumers),
            consumers=len(q.consumers),
            dead_letter_exchange=q.dlx,
            dead_letter_routing_key=q.dlrk,
            message_ttl=q.ttl,
            **{name: q.counts[name] + (q.handed if name in _HANDED else 0) for name in _COUNTERS},
        )

    def _queue(self, name: str) -> _Queue:
        q = self._queues.get(name)
        if q is None:
            raise _Refused(ErrorCode.NOT_FOUND, f"no queue {brief(name)}")
        return q

    def _queue_for(self, name: str, sender: Address) -> _Queue:
        """Queue ``name``, which ``sender`` may use (an exclusive queue only its connection)."""
        q = self._queue(name)
        if q.owner is not None and q.owner != sender[0]:
            raise _Refused(
                ErrorCode.RESOURCE_LOCKED,
                f"cannot obtain exclusive access to locked queue {brief(name)}: "
                "it was declared exclusive by another connection",
            )
        return q

    def _targets(
        self, ex: Exchange, name: str, key: str, headers: Mapping[str, Any] | None = None
    ) -> AbstractSet[str]:
        """The queues exchange ``ex`` (``name``) routes ``key`` to, through
        exchange-to-exchange bindings too: each queue once, whatever the
        paths to it, and each exchange looked at once (a cycle ends where it
        began), as RabbitMQ routes."""
        names = ex.route(key, headers)
        if not self._into:
            return names
        out: set[str] = set()
        seen = {name}
        todo = [names]
        while todo:
            for n in todo.pop():
                if not n.startswith(_TO_EXCHANGE):
                    out.add(n)
                    continue
                dest = n[len(_TO_EXCHANGE) :]
                if dest not in seen:
                    seen.add(dest)
                    dx = self._exchanges.get(dest)
                    if dx is not None:
                        todo.append(dx.route(key, headers))
        return out

    def _exchange(self, name: str) -> Exchange:
        ex = self._exchanges.get(name)
        if ex is None:
            raise _Refused(ErrorCode.NOT_FOUND, f"no exchange {brief(name)}")
        return ex

    def _enqueue(
        self,
        q: _Queue,
        exchange: str,
        key: str,
        bodies: Sequence[Any],
        now: float,
        ttl: float | None = None,
        deaths: tuple[tuple[str, str], ...] = (),
        props: dict[str, Any] | None = None,
    ) -> int:
        """Put ``bodies`` in ``q`` under its overflow policy; return how many it refused.

        The batch goes in whole, the queue's consumers take what their credit
        allows, and only then is the bound applied: the same outcome as
        taking the messages one at a time, at C speed. ``ttl`` is the
        messages' own (seconds); ``deaths`` where they were dead-lettered from.
        """
        ready = q.ready
        n = len(bodies)
        consumers = q.consumers
        size = sum([len(b) if type(b) is bytes else _approx_size(b) for b in bodies])
        q.nbytes += size
        self._grown(size)
        if q.ttl is not None and (ttl is None or q.ttl < ttl):
            ttl = q.ttl
        if ttl is not None or deaths or props is not None:
            meta: _Meta | None = _Meta(None if ttl is None else now + ttl, deaths, props)
            if ttl is not None:
                q.expiring = True
                self._expiring.add(q.name)
        else:
            meta = None
        kept: list[_Msg] | None = None
        if q.durable and self.persisting and props is not None and props.get("delivery_mode") == 2:
            kept = self._persist(q, exchange, key, bodies, meta, ttl)
        if not ready and len(consumers) == 1:
            # Nothing waits and one consumer: when its credit covers the
            # batch, hand it over without passing through ``ready`` (the
            # same outcome, fewer steps: the latency path of a ping-pong).
            c = consumers[0]
            room = c.room()
            if room is None or room >= n:
                self._hand(c, kept if kept is not None else [(exchange, key, body, False, meta) for body in bodies],
                           now)  # fmt: skip
                counts, totals = q.counts, self._totals
                counts["delivered"] += n
                counts["enqueued"] += n
                totals["delivered"] += n
                totals["enqueued"] += n
                return 0
        if kept is not None:
            ready.extend(kept)
        else:
            ready.extend(zip(repeat(exchange), repeat(key), bodies, repeat(False), repeat(meta)))
        if q.consumers:
            self._dispatch(q, now)
        if ttl is not None and ttl <= 0:
            # TTL 0: kept only if a consumer took it at once (RabbitMQ's rule).
            self._expire(q, now)
        over = min(len(ready) - q.max_length, n)
        rule = _OVERFLOW[q.overflow]
        if q.max_bytes is not None and isinstance(ready, _SizedReady | _PriorityReady) and ready.nbytes > q.max_bytes:
            over = max(over, _over_bytes(ready, q.max_bytes, rule.evict_oldest, n))
        if not rule.evict_oldest:
            over = min(over, _newest(ready, n))  # what is refused is the batch's own
        if over <= 0:
            self._count(q, "enqueued", n)
            return 0
        self._count(q, rule.counter, over)
        if rule.evict_oldest:
            popleft = ready.popleft
            gone = [popleft() for _ in range(over)]
            self._count(q, "enqueued", n)
        else:
            pop = ready.pop
            gone = [pop() for _ in range(over)]  # the newest are the batch's last
            gone.reverse()
            self._count(q, "enqueued", n - over)
        q.nbytes -= _bytes_of(gone)
        if self.persisting:
            self._forget(gone)
        if rule.dead_letter:
            self._dead_letter(q, gone, "maxlen", now)
        return over if rule.tell_publisher else 0

    def _persist(
        self, q: _Queue, exchange: str, key: str, bodies: Sequence[Any], meta: _Meta | None, ttl: float | None
    ) -> list[_Msg]:
        """Persistent messages entering durable queue ``q``: each gets a store
        record (``ttl``: the seconds they may wait there, None: no limit)."""
        m = meta if meta is not None else _Meta(None)
        pid = self._next_pid
        self._next_pid = pid + len(bodies)
        props = pack(m.props)
        msgs: list[_Msg] = []
        journal, name = self.journal, q.name
        for body in bodies:
            journal.append(("msg", pid, name, exchange, key, pack(body), props, ttl))
            msgs.append((exchange, key, body, False, _Meta(m.expires, m.deaths, m.props, pid)))
            pid += 1
        return msgs

    def _forget(self, msgs: Iterable[_Msg]) -> None:
        """``msgs`` left their queue for good: their store records go."""
        journal = self.journal
        for m in msgs:
            meta = m[4]
            if meta is not None and meta.pid is not None:
                journal.append(("msg-", meta.pid))

    def deliveries_in_doubt(self, dest: Address, payloads: Iterable[Any], now: float) -> int:
        """The endpoint gave up on these delivery messages to ``dest``: its
        reliable stream there failed (the consumer's endpoint restarted, or
        stopped answering), so each may or may not have arrived. What they
        carried goes back to its queue now, marked redelivered, as the ack
        timeout would do much later (meanwhile it held the consumer's
        prefetch window, so nothing else reached it). Returns how many."""
        n = 0
        for p in payloads:
            if type(p) is not list or len(p) < 3 or p[0] != "d" or type(p[2]) is not list:
                continue
            c = self._consumers.get((dest, p[1]))
            if c is None:
                continue  # detached: what it held went back then
            tags = [first + i for first, _, _, _, bodies, *_ in p[2] for i in range(len(bodies))]
            back = [c.unacked.pop(d)[0] for d in tags if d in c.unacked]
            if not back:
                continue
            q = c.queue
            if self._queues.get(q.name) is q:
                self._requeue(q, back)
            n += len(back)
            self._settled(c, now)
        self._totals["requeued_in_doubt"] += n
        return n

    def _requeue(self, q: _Queue, msgs: list[_Msg]) -> None:
        # Back to the front in their original order, marked redelivered, and
        # never dropped: the queue had already taken them. They keep their
        # expiry (RabbitMQ's rule).
        for ex, key, body, _, meta in reversed(msgs):
            q.ready.appendleft((ex, key, body, True, meta))
        self._count(q, "redelivered", len(msgs))

    def _expire(self, q: _Queue, now: float) -> None:
        """Drop (dead-letter) the expired messages at the head of ``q``."""
        ready = q.ready
        gone: list[_Msg] = []
        while ready:
            meta = ready[0][4]
            if meta is None or meta.expires is None or meta.expires > now:
                break
            gone.append(ready.popleft())
        if gone:
            q.nbytes -= _bytes_of(gone)
            if self.persisting:
                self._forget(gone)
            self._count(q, "expired", len(gone))
            self._dead_letter(q, gone, "expired", now)

    def _dead_letter(self, q: _Queue, msgs: list[_Msg], reason: str, now: float) -> None:
        """Republish ``msgs``, which left ``q`` for ``reason``, to its dead-letter exchange."""
        dlx = q.dlx
        ex = self._exchanges.get(dlx) if dlx is not None else None
        if ex is None or dlx is None:
            self._totals["dead_letters_dropped"] += len(msgs)
            return
        for exchange, key, body, _, meta in msgs:
            deaths = (meta.deaths if meta is not None else ()) + ((q.name, reason),)
            if len(deaths) > _MAX_DEATHS:
                deaths = deaths[-_MAX_DEATHS:]
            new_key = q.dlrk if q.dlrk is not None else key
            props = _died(meta.props if meta is not None else None, q.name, reason, exchange, key,
                          int(self.epoch + now))  # fmt: skip
            rejected_on_the_way = any(r == "rejected" for _, r in deaths)
            kept = 0
            for name in self._targets(ex, dlx, new_key, props["headers"]):
                target = self._queues.get(name)
                if target is None:
                    continue
                if not rejected_on_the_way and any(n == name for n, _ in deaths):
                    continue  # a cycle with no rejection in it: dropped, as RabbitMQ does
                self._enqueue(target, dlx, new_key, [body], now, None, deaths, props)
                kept += 1
            if kept:
                self._count(q, "dead_lettered")
            else:
                self._totals["dead_letters_dropped"] += 1

    def _hand(self, c: _Consumer, msgs: list[_Msg], now: float) -> None:
        """Give ``msgs`` to ``c``: delivery tags, unacked entries, pending runs."""
        n = len(msgs)
        dtag = self._next_dtag
        self._next_dtag = dtag + n
        if not c.no_ack:
            c.unacked.update(zip(range(dtag, dtag + n), zip(msgs, repeat(now)), strict=True))
        else:
            c.queue.nbytes -= _bytes_of(msgs)  # delivered without acknowledgement: gone
            if self.persisting:
                self._forget(msgs)
        pending = c.pending
        run: list[Any] | None = None
        if pending:
            last = pending[-1]
            if last[0] + len(last[4]) == dtag:
                run = last
        for ex, key, body, redelivered, meta in msgs:
            props = meta.props if meta is not None else None
            if run is not None and key == run[2] and ex == run[1] and redelivered is run[3]:
                run[4].append(body)
                if props is not None or len(run) > 5:
                    # The run's properties, one per body, from its first with any.
                    if len(run) == 5:
                        run.append([None] * (len(run[4]) - 1))
                    run[5].append(props)
            else:
                run = [dtag, ex, key, redelivered, [body]]
                if props is not None:
                    run.append([props])
                pending.append(run)
            dtag += 1
        self._with_pending[(c.addr, c.tag)] = c

    def _dispatch(self, q: _Queue, now: float) -> None:
        expiring = q.expiring
        if expiring:
            self._expire(q, now)
        consumers, ready = q.consumers, q.ready
        if q.single and consumers:
            consumers = consumers[:1]  # the active one: the first attached
        n = len(consumers)
        if n == 1 and ready and not expiring:
            self._dispatch_one(q, consumers[0], now)
            return
        if not n:
            return
        pick = _by_priority(q, consumers) if any(c.priority for c in consumers) else _round_robin(q, consumers)
        handed = 0
        while ready and (c := pick()) is not None:
            self._hand(c, [ready.popleft()], now)
            handed += 1
            if expiring:
                # Each message is looked at when it reaches the head (RabbitMQ's rule).
                self._expire(q, now)
        if handed:
            self._count(q, "delivered", handed)

    def _dispatch_one(self, q: _Queue, c: _Consumer, now: float) -> None:
        """``_dispatch`` for the common single consumer: no round robin."""
        ready = q.ready
        room = c.room()
        take = len(ready) if room is None else min(len(ready), room)
        if take <= 0:
            return
        if take == len(ready):
            msgs = list(ready)
            ready.clear()
        else:
            popleft = ready.popleft
            msgs = [popleft() for _ in range(take)]
        self._hand(c, msgs, now)
        self._count(q, "delivered", take)

    def _settled(self, c: _Consumer, now: float) -> None:
        """Deliveries of ``c`` were settled (acked, rejected, requeued): its
        queue may go on, and so may its group's (the room was shared)."""
        self._dispatch(c.queue, now)
        if c.group is not None:
            self._dispatch_members(c.group, c.queue, now)

    def _dispatch_members(self, g: _Group, done: _Queue | None, now: float) -> None:
        """Dispatch the queues of ``g``'s members, but ``done``, once each."""
        seen = set() if done is None else {id(done)}
        for m in list(g.members):
            q = m.queue
            if id(q) not in seen and self._queues.get(q.name) is q:
                seen.add(id(q))
                self._dispatch(q, now)

    def _attach(
        self, sender: Address, spec: ConsumerSpec, now: float, *, exclusive: bool = False, priority: int = 0
    ) -> _Consumer:
        q = self._queue_for(spec.queue, sender)
        key = (sender, spec.tag)
        c = self._consumers.get(key)
        held = q.exclusive
        if (held is not None and held is not c) or (exclusive and any(x is not c for x in q.consumers)):
            # As RabbitMQ: no consumer beside an exclusive one, and no
            # exclusive one beside others (a basic.get is still answered).
            raise _Refused(ErrorCode.ACCESS_REFUSED, f"queue '{q.name}' in vhost '/' in exclusive use")
        if c is not None:
            if c.queue is not q:
                raise _Refused(
                    ErrorCode.IN_USE, f"consumer tag {spec.tag!r} is consuming {c.queue.name!r}"
                )
            c.last_seen = now
            c.prefetch, c.no_ack = spec.prefetch, spec.no_ack
            if c not in q.consumers and not c.tag.startswith(GET_TAG):
                q.consumers.append(c)  # cancelled keeping its unacked: consuming again
        else:
            c = self._consumers[key] = _Consumer(sender, spec, q, now)
            c.held = sender[0] in self._held
            q.consumers.append(c)
            g = self._groups.get(sender)
            if g is not None:
                c.group = g
                g.members.append(c)
        c.priority = priority
        if exclusive:
            q.exclusive = c
        self._dispatch(q, now)
        return c

    def _detach(self, key: tuple[Address, str], c: _Consumer, now: float) -> None:
        del self._consumers[key]
        self._with_pending.pop(key, None)
        g = c.group
        if g is not None:
            g.members.remove(c)
            c.group = None
        q = c.queue
        if c in q.consumers:  # a basic.get's holder is not one
            _unlist(q, c, now)
        # Deliveries computed but not yet handed to the driver never left:
        # they go back too, as do the unacknowledged ones (no_ack consumers'
        # in-flight messages are gone: that is what no_ack means).
        back = [msg for msg, _ in c.unacked.values()]
        if c.no_ack:
            unsent: list[_Msg] = []
            for r in c.pending:
                props = r[5] if len(r) > 5 else None
                for i, body in enumerate(r[4]):
                    p = props[i] if props is not None else None
                    unsent.append((r[1], r[2], body, r[3], None if p is None else _Meta(None, (), p)))
            back += unsent
            self._count(q, "delivered", -len(unsent))
            size = _bytes_of(unsent)
            q.nbytes += size  # counted as gone when handed; they never left
            self._grown(size)
        c.unacked.clear()
        c.pending.clear()
        if back and self._queues.get(q.name) is q:
            self._requeue(q, back)
            self._dispatch(q, now)
        if back and g is not None:
            self._dispatch_members(g, q, now)  # the room it held is the others' now
        if q.auto_delete and not q.consumers and self._queues.get(q.name) is q and not c.tag.startswith(GET_TAG):
            self._drop_queue(q, now)  # its last consumer went (AMQP's auto-delete)

    # -- request handlers (one per row of _HANDLERS) ---------------------------

    def _declare_exchange(self, ev: DeclareExchange, sender: Address, now: float) -> Any:
        _check_name("exchange name", ev.name)
        have = self._exchanges.get(ev.name)
        if _reserved(ev.name) and (have is None or ev.name == ""):
            # A system exchange (SYSTEM_EXCHANGES) may be declared again, as
            # AMQP clients do before they use one; no new name may be taken.
            raise _Refused(ErrorCode.ACCESS_REFUSED, f"exchange name {ev.name!r} is reserved")
        try:
            kind = ExchangeType(ev.type)
        except ValueError:
            known = ", ".join(t.value for t in ExchangeType)
            raise _Refused(
                ErrorCode.BAD_REQUEST, f"unknown exchange type {ev.type!r} (known: {known})"
            ) from None
        if have is not None:
            if have.type != kind:
                raise _Refused(
                    ErrorCode.PRECONDITION_FAILED,
                    f"exchange {ev.name!r} exists with type {have.type.value!r}, not {kind.value!r}",
                )
            if (ev.name in self._durable_exchanges) != ev.durable:
                raise _Refused(ErrorCode.PRECONDITION_FAILED,
                               f"exchange {ev.name!r} exists with durable={not ev.durable}")  # fmt: skip
            return {"created": False}
        self._exchanges[ev.name] = make_exchange(kind)
        if ev.durable:
            self._durable_exchanges.add(ev.name)
            if self.persisting:
                self.journal.append(("exchange", ev.name, kind.value))
        return {"created": True}

    def _delete_exchange(self, ev: DeleteExchange, sender: Address, now: float) -> Any:
        if ev.name == "":
            raise _Refused(ErrorCode.ACCESS_REFUSED, "the default exchange cannot be deleted")
        if ev.name in _SYSTEM_NAMES:
            raise _Refused(ErrorCode.ACCESS_REFUSED, f"the system exchange {ev.name!r} cannot be deleted")
        ex = self._exchanges.pop(ev.name, None)
        if ex is None:
            return {"deleted": False}
        if ev.name in self._durable_exchanges:
            self._durable_exchanges.discard(ev.name)
            if self.persisting:
                self.journal.append(("exchange-", ev.name))
        for b in ex.bindings():
            if b.queue.startswith(_TO_EXCHANGE):
                into = self._into.get(b.queue[len(_TO_EXCHANGE) :])
                if into is not None:
                    into.discard((ev.name, b.key))
            q = self._queues.get(b.queue)
            if q is not None:
                q.bindings.discard((ev.name, b.key))
        for source, key in self._into.pop(ev.name, ()):
            src = self._exchanges.get(source)
            if src is not None:
                src.unbind(_TO_EXCHANGE + ev.name, key)
        for dest in [d for d, into in self._into.items() if not into]:
            del self._into[dest]
        return {"deleted": True}

    def _declare_queue(self, ev: DeclareQueue, sender: Address, now: float, generated: str | None = None) -> Any:
        name = ev.name
        if name == "":
            # A server-named queue (AMQP 0-9-1), named as RabbitMQ names them.
            name = generated or server_queue_name()
        else:
            _check_name("queue name", name)
            if _reserved(name):
                raise _Refused(ErrorCode.ACCESS_REFUSED, f"queue name {name!r} is reserved")
        if ev.exclusive and sender[0] not in self._held:
            raise _Refused(ErrorCode.BAD_REQUEST, "an exclusive queue needs a connection (declare it over AMQP)")
        try:
            overflow = Overflow(_OVERFLOW_ALIASES.get(ev.overflow, ev.overflow))
        except ValueError:
            known = ", ".join(o.value for o in Overflow)
            raise _Refused(
                ErrorCode.BAD_REQUEST, f"unknown overflow policy {brief(ev.overflow)} (known: {known})"
            ) from None
        if ev.max_length < 1:
            raise _Refused(ErrorCode.BAD_REQUEST, f"max_length must be >= 1, got {ev.max_length}")
        dlx, dlrk, ttl, expires, single, max_bytes, top = _queue_arguments(ev.arguments)
        q = self._queues.get(name)
        if q is not None:
            self._queue_for(name, sender)
            have = (q.max_length, q.overflow, q.dlx, q.dlrk, q.ttl, q.expires, q.single, q.max_bytes, q.max_priority)
            want = (ev.max_length, overflow, dlx, dlrk, ttl, expires, single, max_bytes, top)
            if have != want:
                raise _Refused(
                    ErrorCode.PRECONDITION_FAILED,
                    f"queue {name!r} exists with {_describe(*have)}, not {_describe(*want)}",
                )
            if q.durable != (ev.durable and not ev.exclusive):
                raise _Refused(ErrorCode.PRECONDITION_FAILED, f"queue {name!r} exists with durable={q.durable}")
            q.used_at = now  # declared again: a use (x-expires)
            return {"created": False, "messages": len(q.ready), "consumers": len(q.consumers), "queue": name}
        q = self._queues[name] = _Queue(name, ev.max_length, overflow, dlx, dlrk, ttl)
        q.single = single
        q.prioritise(top)
        q.limit_bytes(max_bytes)
        self._set_expires(q, expires, now)
        if ev.exclusive:
            q.owner = sender[0]
        q.auto_delete = ev.auto_delete
        # An exclusive queue goes with its connection: never kept (as RabbitMQ).
        q.durable = ev.durable and not ev.exclusive
        if q.durable and self.persisting:
            self.journal.append(("queue", name, q.max_length, q.overflow.value,
                                 pack(_arguments_of(q)), int(q.auto_delete)))  # fmt: skip
        if ttl is not None:
            self._expiring.add(name)
        self._exchanges[""].bind(name, name)
        q.bindings.add(("", name))
        return {"created": True, "messages": 0, "consumers": 0, "queue": name}

    def _set_expires(self, q: _Queue, expires: float | None, now: float) -> None:
        q.expires, q.used_at = expires, now
        if expires is not None:
            self._with_expires.add(q.name)

    def _delete_queue(self, ev: DeleteQueue, sender: Address, now: float) -> Any:
        q = self._queues.get(ev.name)
        if q is None:
            return {"deleted": False, "messages": 0}
        self._queue_for(ev.name, sender)
        return {"deleted": True, "messages": self._drop_queue(q, now)}

    def _drop_queue(self, q: _Queue, now: float) -> int:
        """Delete ``q``: its bindings, consumers (told) and messages; return how many messages."""
        name = q.name
        del self._queues[name]
        self._expiring.discard(name)
        self._with_expires.discard(name)
        if q.durable and self.persisting:
            self.journal.append(("queue-", name))
        for ex_name, key in q.bindings:
            ex = self._exchanges.get(ex_name)
            if ex is not None:
                ex.unbind(name, key)
        lost = len(q.ready)
        for c in list(q.consumers):
            lost += len(c.unacked) + (sum(len(r[4]) for r in c.pending) if c.no_ack else 0)
            c.unacked.clear()
            self._detach((c.addr, c.tag), c, now)
            self._out.append(
                Outgoing(
                    dest=c.addr,
                    mailbox=DELIVERY_MAILBOX,
                    payload=encode(
                        Cancelled(
                            tag=c.tag,
                            code=ErrorCode.NOT_FOUND,
                            message=f"queue {name!r} deleted",
                        )
                    ),
                )
            )
        q.ready.clear()
        self._count(q, "purged", lost)
        return lost

    def _purge_queue(self, ev: PurgeQueue, sender: Address, now: float) -> Any:
        q = self._queue_for(ev.name, sender)
        n = len(q.ready)
        q.nbytes -= _bytes_of(q.ready)
        if self.persisting:
            self._forget(q.ready)
        q.ready.clear()
        self._count(q, "purged", n)
        return {"messages": n}

    def _binding(self, ev: Bind | Unbind, sender: Address) -> tuple[Exchange, _Queue, str]:
        """The exchange, the queue and the binding's key (a headers binding's
        key holds its arguments: see :func:`~cmq.routing.exchanges.headers_binding_key`)."""
        _check_name("binding key", ev.key)
        if ev.exchange == "":
            raise _Refused(ErrorCode.ACCESS_REFUSED, "the default exchange's bindings are fixed")
        ex, q = self._exchange(ev.exchange), self._queue_for(ev.queue, sender)
        return ex, q, _binding_key(ex, ev.key, ev.arguments)

    def _bind(self, ev: Bind, sender: Address, now: float) -> Any:
        ex, q, key = self._binding(ev, sender)
        q.bindings.add((ev.exchange, key))
        if self.persisting and self._durable_binding(q, ev.exchange):
            self.journal.append(("bind", ev.queue, ev.exchange, key))
        return {"created": ex.bind(ev.queue, key)}

    def _exchange_binding(self, ev: ExchangeBind) -> tuple[Exchange, str]:
        """The source exchange and the binding's key (checked as a queue binding's)."""
        _check_name("binding key", ev.key)
        for end in (ev.source, ev.destination):
            if end == "":
                raise _Refused(ErrorCode.ACCESS_REFUSED, "the default exchange's bindings are fixed")
        src = self._exchange(ev.source)
        self._exchange(ev.destination)
        return src, _binding_key(src, ev.key, ev.arguments)

    def _bind_exchange(self, ev: ExchangeBind, sender: Address, now: float) -> Any:
        src, key = self._exchange_binding(ev)
        self._into.setdefault(ev.destination, set()).add((ev.source, key))
        if self.persisting and self._durable_exchange_binding(ev):
            self.journal.append(("xbind", ev.destination, ev.source, key))
        return {"created": src.bind(_TO_EXCHANGE + ev.destination, key)}

    def _unbind_exchange(self, ev: ExchangeUnbind, sender: Address, now: float) -> Any:
        src, key = self._exchange_binding(ev)
        into = self._into.get(ev.destination)
        if into is not None:
            into.discard((ev.source, key))
            if not into:
                del self._into[ev.destination]
        if self.persisting and self._durable_exchange_binding(ev):
            self.journal.append(("xunbind", ev.destination, ev.source, key))
        return {"deleted": src.unbind(_TO_EXCHANGE + ev.destination, key)}

    def _durable_exchange_binding(self, ev: ExchangeBind) -> bool:
        durable = self._durable_exchanges
        return ev.source in durable and ev.destination in durable

    def _durable_binding(self, q: _Queue, exchange: str) -> bool:
        # A binding is kept when both its ends are (AMQP 0-9-1).
        return q.durable and exchange in self._durable_exchanges

    def _unbind(self, ev: Unbind, sender: Address, now: float) -> Any:
        ex, q, key = self._binding(ev, sender)
        q.bindings.discard((ev.exchange, key))
        if self.persisting and self._durable_binding(q, ev.exchange):
            self.journal.append(("unbind", ev.queue, ev.exchange, key))
        return {"deleted": ex.unbind(ev.queue, key)}

    def _publish(self, ev: Publish, sender: Address, now: float) -> Any:
        if self.memory_alarm:
            self._refuse_over_budget(1, sender)
        if ev.properties:
            _check_properties(ev.properties)
        bodies = self._bodies([ev.body], sender)
        routed = self._route(ev.exchange, ev.routing_key, bodies, now, _ttl(ev.expiration), ev.properties)
        return {"routed": routed}

    def _publish_batch(self, ev: PublishBatch, sender: Address, now: float) -> Any:
        if self.memory_alarm:
            self._refuse_over_budget(len(ev.bodies), sender)
        if ev.properties:
            _check_properties(ev.properties)
        bodies = self._bodies(list(ev.bodies), sender)
        return {"routed": self._route(ev.exchange, ev.routing_key, bodies, now, _ttl(ev.expiration), ev.properties)}

    def _bodies(self, bodies: list[Any], sender: Address) -> list[Any]:
        """``bodies`` as the broker keeps them (:func:`_opaque`), or refused whole (noted)."""
        try:
            return _opaque_all(bodies)
        except _Refused as exc:
            self._totals["published"] += len(bodies)
            self._note("bad_body", sender, str(exc))
            raise

    def _route(
        self,
        exchange: str,
        routing_key: str,
        bodies: Sequence[Any],
        now: float,
        ttl: float | None = None,
        props: dict[str, Any] | None = None,
    ) -> int:
        """Put published messages in every queue they route to; return how many queues.

        One routing decision for the batch: the bodies share exchange and key.
        """
        n = len(bodies)
        totals = self._totals
        totals["published"] += n
        if len(routing_key) > _SURELY_SHORT:
            _check_name("routing key", routing_key)
        ex = self._exchanges.get(exchange)
        if ex is None:
            totals["unroutable"] += n
            raise _Refused(ErrorCode.NOT_FOUND, f"no exchange {brief(exchange)}")
        headers = props.get("headers") if props is not None else None
        names = ex.route(routing_key, headers) if not self._into else self._targets(ex, exchange, routing_key, headers)
        if not names:
            totals["unroutable"] += n
            return 0
        queues = self._queues
        refused = {}
        for name in names:
            r = self._enqueue(queues[name], exchange, routing_key, bodies, now, ttl, (), props)
            if r:
                refused[name] = r
        if refused:
            what = ", ".join(f"{name!r}: {k} of {n}" for name, k in sorted(refused.items()))
            raise _Refused(ErrorCode.QUEUE_FULL, f"queue full, messages refused by {what}")
        return len(names)

    def _consume(self, ev: Consume, sender: Address, now: float) -> Any:
        _check_name("consumer tag", ev.tag)
        spec = ConsumerSpec(tag=ev.tag, queue=ev.queue, prefetch=ev.prefetch, no_ack=ev.no_ack)
        priority = ev.priority if type(ev) is PriorityConsume else 0
        self._attach(sender, spec, now, exclusive=type(ev) is ExclusiveConsume, priority=priority)
        cfg = self.config
        return {"heartbeat": cfg.heartbeat_interval, "timeout": cfg.consumer_timeout}

    def _channel_prefetch(self, ev: ChannelPrefetch, sender: Address, now: float) -> Any:
        if type(ev.prefetch) is not int or ev.prefetch < 0:
            raise _Refused(ErrorCode.BAD_REQUEST, f"prefetch must be an integer >= 0, not {ev.prefetch!r}")
        g = self._groups.get(sender)
        if not ev.prefetch:
            if g is not None:
                del self._groups[sender]
                for c in g.members:
                    c.group = None
                self._dispatch_members(g, None, now)
            return None
        if g is None:
            g = self._groups[sender] = _Group(ev.prefetch)
            for (addr, tag), c in self._consumers.items():
                if addr == sender and not tag.startswith(GET_TAG):
                    c.group = g
                    g.members.append(c)
        g.limit = ev.prefetch
        self._dispatch_members(g, None, now)  # a higher limit makes room
        return None

    def _heartbeat(self, ev: Heartbeat, sender: Address, now: float) -> Any:
        for spec in ev.consumers:
            c = self._consumers.get((sender, spec.tag))
            if c is not None:
                c.last_seen = now
                continue
            try:
                self._attach(sender, spec, now)
            except _Refused as exc:
                self._out.append(
                    Outgoing(
                        dest=sender,
                        mailbox=DELIVERY_MAILBOX,
                        payload=encode(Cancelled(tag=spec.tag, code=exc.code, message=str(exc))),
                    )
                )
            else:
                self._totals["consumers_reattached"] += 1
        return None

    def _ack(self, ev: Ack, sender: Address, now: float) -> Any:
        c = self._consumers.get((sender, ev.tag))
        if c is None:
            # Its consumer was detached and these messages requeued already.
            self._totals["stale_acks"] += len(ev.delivery_tags)
            return None
        c.last_seen = now
        acked = 0
        persisting = self.persisting
        gone = 0
        for dtag in ev.delivery_tags:
            entry = c.unacked.pop(dtag, None)
            if entry is not None:
                acked += 1
                body = entry[0][2]
                gone += len(body) if type(body) is bytes else _approx_size(body)
                if persisting:
                    self._forget((entry[0],))
        c.queue.nbytes -= gone
        stale = len(ev.delivery_tags) - acked
        if stale:
            self._totals["stale_acks"] += stale
        self._count(c.queue, "acked", acked)
        self._settled(c, now)
        return None

    def _nack(self, ev: Nack, sender: Address, now: float) -> Any:
        c = self._consumers.get((sender, ev.tag))
        if c is None:
            self._totals["stale_acks"] += len(ev.delivery_tags)
            return None
        c.last_seen = now
        msgs = [m for m, _ in (c.unacked.pop(d, (None, 0.0)) for d in ev.delivery_tags) if m is not None]
        stale = len(ev.delivery_tags) - len(msgs)
        if stale:
            self._totals["stale_acks"] += stale
        q = c.queue
        if msgs and self._queues.get(q.name) is q:
            if ev.requeue:
                self._requeue(q, msgs)
            else:
                self._count(q, "nacked", len(msgs))
                q.nbytes -= _bytes_of(msgs)
                if self.persisting:
                    self._forget(msgs)
                self._dead_letter(q, msgs, "rejected", now)
        self._settled(c, now)
        return None

    def _cancel(self, ev: Cancel, sender: Address, now: float) -> Any:
        key = (sender, ev.tag)
        c = self._consumers.get(key)
        if c is None:
            return {"cancelled": False}
        if ev.keep_unacked and not c.no_ack and c in c.queue.consumers:
            self._park(key, c, now)
        else:
            self._detach(key, c, now)
        return {"cancelled": True}

    def _park(self, key: tuple[Address, str], c: _Consumer, now: float) -> None:
        """Stop deliveries to ``c``; what it was sent stays unacknowledged with it
        (AMQP's basic.cancel). What was computed for it but not yet handed to
        the driver never left: it goes back to the head of the queue as it was."""
        self._with_pending.pop(key, None)
        q = c.queue
        _unlist(q, c, now)
        unsent = [d for r in c.pending for d in range(r[0], r[0] + len(r[4]))]
        c.pending.clear()
        back = [c.unacked.pop(d)[0] for d in unsent if d in c.unacked]
        if back:
            q.ready.extendleft(reversed(back))
            self._count(q, "delivered", -len(back))
        self._settled(c, now)
        if q.auto_delete and not q.consumers and self._queues.get(q.name) is q:
            self._drop_queue(q, now)

    def _get(self, ev: Get, sender: Address, now: float) -> Any:
        q = self._queue_for(ev.queue, sender)
        q.used_at = now  # a basic.get is a use (x-expires), found or not
        if q.expiring:
            self._expire(q, now)
        if not q.ready:
            return None
        msg = q.ready.popleft()
        self._count(q, "delivered")
        dtag = self._next_dtag
        self._next_dtag = dtag + 1
        tag = GET_TAG + q.name
        if not ev.no_ack:
            # The message waits for its ack with a holder that is not one of
            # the queue's consumers (no deliveries go to it).
            key = (sender, tag)
            c = self._consumers.get(key)
            if c is None or c.queue is not q:
                spec = ConsumerSpec(tag=tag, queue=q.name, prefetch=0, no_ack=False)
                c = self._consumers[key] = _Consumer(sender, spec, q, now)
                c.held = sender[0] in self._held
            c.last_seen = now
            c.unacked[dtag] = (msg, now)
        else:
            q.nbytes -= _size(msg)
            if self.persisting:
                self._forget((msg,))
        ex, key_, body, redelivered, meta = msg
        props = meta.props if meta is not None else None
        return [tag, dtag, ex, key_, redelivered, body, len(q.ready), props]

    def _get_stats(self, ev: GetStats, sender: Address, now: float) -> Any:
        out = self.stats().as_dict()
        if self._endpoint_stats is not None:
            out["endpoint"] = self._endpoint_stats()
        return out


_Handler = Callable[[BrokerCore, Any, Address, float], Any]

# Request type -> handler. A handler returns the ``ok`` result or raises
# _Refused; handle() turns either into the reply when the request has a rid.
_HANDLERS: Final[dict[type[Any], _Handler]] = {
    DeclareExchange: BrokerCore._declare_exchange,
    DeleteExchange: BrokerCore._delete_exchange,
    DeclareQueue: BrokerCore._declare_queue,
    DeleteQueue: BrokerCore._delete_queue,
    PurgeQueue: BrokerCore._purge_queue,
    Bind: BrokerCore._bind,
    Unbind: BrokerCore._unbind,
    Publish: BrokerCore._publish,
    PublishBatch: BrokerCore._publish_batch,
    Consume: BrokerCore._consume,
    ExclusiveConsume: BrokerCore._consume,
    PriorityConsume: BrokerCore._consume,
    ChannelPrefetch: BrokerCore._channel_prefetch,
    ExchangeBind: BrokerCore._bind_exchange,
    ExchangeUnbind: BrokerCore._unbind_exchange,
    Heartbeat: BrokerCore._heartbeat,
    Ack: BrokerCore._ack,
    Nack: BrokerCore._nack,
    Cancel: BrokerCore._cancel,
    Get: BrokerCore._get,
    GetStats: BrokerCore._get_stats,
}
