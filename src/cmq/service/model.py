"""The records that pass between the queue operations and a store.

All are small frozen, keyword-only dataclasses. Times are integer
milliseconds since the Unix epoch, always passed in by the caller (a store
never reads the clock, so tests drive time by hand).

A store keeps a message as an opaque ``payload`` string (the operations layer
packs body, message attributes, ids and send time into it) plus the few
fields a store must reason about: its sequence number in the queue, its FIFO
group, when it becomes visible, how often it was received and the token of
its current receipt.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = [
    "Browsed",
    "ChangeResult",
    "NewMessage",
    "QueueCounts",
    "QueueRecord",
    "ReceiveSpec",
    "Received",
    "SendResult",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueRecord:
    """A queue as stored: its name and attributes (as SQS strings)."""

    name: str
    attributes: Mapping[str, str] = field(default_factory=dict)
    created_at: int = 0
    """Creation time, ms."""
    modified_at: int = 0
    """Last SetQueueAttributes, ms."""


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueCounts:
    """Approximate message counts of a queue at one instant."""

    visible: int = 0
    in_flight: int = 0
    delayed: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class NewMessage:
    """A message to add to a queue."""

    message_id: str
    payload: str
    visible_at: int
    """Send time plus delay, ms."""
    group_id: str | None = None
    """FIFO message group; None on standard queues."""
    dedup_id: str | None = None
    """FIFO deduplication id; None on standard queues."""
    dedup_until: int = 0
    """End of the deduplication window of ``dedup_id``, ms."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SendResult:
    """What a store did with one :class:`NewMessage`.

    On a duplicate (a FIFO dedup id seen inside its window) nothing was added
    and ``message_id`` / ``seq`` are those of the first message, as SQS does.
    """

    message_id: str
    seq: int
    duplicate: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class ReceiveSpec:
    """One ReceiveMessage as a store sees it."""

    now: int
    max_messages: int
    visibility_ms: int
    k: int
    """Consistency hint: pick at random among the first ``k`` visible messages."""
    fifo: bool
    token: str
    """Receipt token stamped on every message of this receive."""
    rand: tuple[float, ...]
    """``max_messages`` numbers in [0, 1) that drive the random picks."""
    lock_free: bool = False
    """The queue's ``ReceiveMode`` is ``lock-free`` (standard queues only):
    read the index, then mark the picks in flight in a separate step with no
    compare-and-set, so concurrent receives may take the same message (see
    :meth:`cmq.service.store.base.Store.receive`)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Received:
    """A message handed out by a receive, now in flight until its deadline."""

    seq: int
    payload: str
    receive_count: int
    first_receive_at: int
    token: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Browsed:
    """A message looked at without being received (the console's peek)."""

    seq: int
    payload: str
    visible_at: int
    receive_count: int


class ChangeResult(enum.Enum):
    """Outcome of a visibility change."""

    OK = "ok"
    NOT_FOUND = "not-found"
    NOT_IN_FLIGHT = "not-in-flight"
