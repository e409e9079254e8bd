"""The store interface: one coroutine per queue operation.

A store holds queues and messages and makes each operation atomic; it knows
nothing of HTTP, SQS attribute syntax or message bodies (a message is an
opaque payload). Any number of service nodes may share one store, so no
correctness may depend on a node's memory: every state change goes through
the store.

Receive modes
-------------
``atomic`` (the default): :meth:`Store.receive` reads the first K visible
messages of the queue's sequence index, picks among them and marks the picks
in flight in ONE atomic store operation, so a message is never handed to two
receives while it is in flight.

``lock-free`` (``ReceiveSpec.lock_free``, the BDQS paper's design): the read
(:meth:`Store.peek`) and the write (:meth:`Store.mark`) are separate store
operations, and the write checks nothing: it marks the picks in flight
whatever happened to them since the read. Two receives that read before
either writes may take the same message: a duplicate, never a loss (each
receive's write stamps its own receipt token; the last one wins, and only its
handle deletes the message). A message deleted between the read and the
write is skipped. FIFO queues always receive atomically.

Times are integer milliseconds passed in by the caller. Errors: a missing
queue raises :class:`~cmq.service.errors.QueueDoesNotExist`; a store that
cannot be reached or fails raises
:class:`~cmq.service.errors.StoreUnavailable` with the cause chained.
"""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable, Mapping, Sequence

from cmq.service.model import (
    Browsed,
    ChangeResult,
    NewMessage,
    QueueCounts,
    QueueRecord,
    Received,
    ReceiveSpec,
    SendResult,
)

__all__ = ["Store"]


class Store(abc.ABC):
    """Base class of the stores (memory, SQLite, Redis Cluster)."""

    #: Long-polling receivers re-check the store this often (seconds) for
    #: messages sent through other nodes; a send through this node wakes
    #: them at once.
    poll_interval: float = 0.05

    #: Awaited by a lock-free receive between its read and its write, with
    #: the queue name and the picked sequence numbers. A test hook: it makes
    #: an interleaving of concurrent receives deterministic (None: no pause).
    between_read_and_write: Callable[[str, list[int]], Awaitable[None]] | None = None

    async def open(self) -> None:  # noqa: B027 - optional hook
        """Connect or create the schema; called once before any operation."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections and threads."""

    @abc.abstractmethod
    async def create_queue(self, record: QueueRecord) -> tuple[QueueRecord, bool]:
        """Create ``record`` unless its name exists.

        Returns the stored queue and whether this call created it.
        """

    @abc.abstractmethod
    async def get_queue(self, name: str) -> QueueRecord:
        """Return the queue. Raises QueueDoesNotExist."""

    @abc.abstractmethod
    async def list_queues(self, prefix: str) -> list[str]:
        """Return the names starting with ``prefix``, sorted."""

    @abc.abstractmethod
    async def delete_queue(self, name: str) -> None:
        """Delete the queue and its messages. Raises QueueDoesNotExist."""

    @abc.abstractmethod
    async def set_attributes(self, name: str, attributes: Mapping[str, str], now: int) -> None:
        """Merge ``attributes`` into the queue's. Raises QueueDoesNotExist."""

    @abc.abstractmethod
    async def counts(self, name: str, now: int) -> QueueCounts:
        """Visible, in-flight and delayed counts. Raises QueueDoesNotExist."""

    @abc.abstractmethod
    async def send(self, name: str, messages: Sequence[NewMessage], now: int) -> list[SendResult]:
        """Add ``messages`` atomically; returns only once they are durable.

        A message whose ``dedup_id`` was seen on this queue before its window
        ended is not added. Raises QueueDoesNotExist.
        """

    async def receive(self, name: str, spec: ReceiveSpec) -> list[Received]:
        """Hand out messages (see :mod:`cmq.service.ordering`), making each
        invisible until ``spec.now + spec.visibility_ms``, counting the
        receive and stamping ``spec.token``: atomically, or for
        ``spec.lock_free`` on a standard queue as :meth:`peek` then
        :meth:`mark` (see the module doc).

        Raises QueueDoesNotExist.
        """
        if not spec.lock_free or spec.fifo:
            return await self.receive_atomic(name, spec)
        picks = await self.peek(name, spec)
        if self.between_read_and_write is not None:
            await self.between_read_and_write(name, picks)
        return await self.mark(name, spec, picks)

    @abc.abstractmethod
    async def receive_atomic(self, name: str, spec: ReceiveSpec) -> list[Received]:
        """:meth:`receive` as one atomic store operation. Raises QueueDoesNotExist."""

    @abc.abstractmethod
    async def peek(self, name: str, spec: ReceiveSpec) -> list[int]:
        """The read of a lock-free receive: the sequence numbers it picks
        (:func:`~cmq.service.ordering.standard_picks` over the first
        ``spec.k + spec.max_messages - 1`` visible messages), changing nothing
        but housekeeping. Raises QueueDoesNotExist.
        """

    @abc.abstractmethod
    async def mark(self, name: str, spec: ReceiveSpec, picks: Sequence[int]) -> list[Received]:
        """The write of a lock-free receive: mark each of ``picks`` that still
        exists in flight under ``spec.token``, unconditionally (no check that
        it is still visible). Deleted ones are skipped, so a queue deleted
        since the read gives ``[]`` (or QueueDoesNotExist on the memory store).
        """

    @abc.abstractmethod
    async def delete(self, name: str, receipts: Sequence[tuple[int, str]]) -> None:
        """Delete messages given as ``(seq, receipt token)``.

        A message is deleted only when the token is that of its latest
        receive: as in SQS, deleting with a stale handle succeeds but leaves
        the message (it was received again since). Absent messages are
        ignored. Raises QueueDoesNotExist.
        """

    @abc.abstractmethod
    async def change_visibility(
        self, name: str, seq: int, token: str, visible_at: int, now: int
    ) -> ChangeResult:
        """Move the deadline of an in-flight message received with ``token``.

        Raises QueueDoesNotExist.
        """

    @abc.abstractmethod
    async def purge(self, name: str) -> None:
        """Delete every message of the queue. Raises QueueDoesNotExist."""

    async def counts_many(self, names: Sequence[str], now: int) -> dict[str, QueueCounts]:
        """:meth:`counts` of each of ``names`` that exists (a missing one is
        left out). Stores may answer it in one read; this one asks each."""
        from cmq.service.errors import QueueDoesNotExist

        out = {}
        for name in names:
            try:
                out[name] = await self.counts(name, now)
            except QueueDoesNotExist:
                continue
        return out

    async def browse(self, name: str, limit: int) -> list[Browsed]:
        """The first ``limit`` messages of the queue in sequence order, visible
        or not, changing nothing (no receive is counted, no visibility moves).
        Raises QueueDoesNotExist, or UnsupportedOperation on a store without it.
        """
        from cmq.service.errors import UnsupportedOperation

        raise UnsupportedOperation(f"{type(self).__name__} cannot show messages without receiving them.")

    async def usage(self) -> int:
        """Bytes the store holds, approximately (what the node's byte bound
        compares); 0 when a store cannot tell. Raises StoreUnavailable."""
        return 0
