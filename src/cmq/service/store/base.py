"""The store interface: one coroutine per queue operation.

A store holds queues and messages and makes each operation atomic; it knows
nothing of HTTP, SQS attribute syntax or message bodies (a message is an
opaque payload). Any number of service nodes may share one store, so no
correctness may depend on a node's memory: every state change goes through
the store.

Times are integer milliseconds passed in by the caller. Errors: a missing
queue raises :class:`~cmq.service.errors.QueueDoesNotExist`; a store that
cannot be reached or fails raises
:class:`~cmq.service.errors.StoreUnavailable` with the cause chained.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence

from cmq.service.model import (
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

    @abc.abstractmethod
    async def receive(self, name: str, spec: ReceiveSpec) -> list[Received]:
        """Hand out messages (see :mod:`cmq.service.ordering`), atomically
        making each invisible until ``spec.now + spec.visibility_ms``,
        counting the receive and stamping ``spec.token``.

        Raises QueueDoesNotExist.
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

    async def usage(self) -> int:
        """Bytes the store holds, approximately (what the node's byte bound
        compares); 0 when a store cannot tell. Raises StoreUnavailable."""
        return 0
