"""The in-memory store: the reference semantics and the test fake.

Single process only (``cmq serve --store memory:`` with one worker). Every
method runs without awaiting, so each is atomic under asyncio.

A lock-free receive here is :meth:`peek` then :meth:`mark`, as on the other
stores, but nothing runs between the two unless
``Store.between_read_and_write`` pauses there (tests do): in one process with
no hook it behaves like an atomic receive and delivers no duplicates.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cmq.service.errors import QueueDoesNotExist
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
from cmq.service.ordering import fifo_picks, standard_picks, window_picks
from cmq.service.store.base import Store

__all__ = ["MemoryStore"]

#: Forget ended dedup windows once this many ids are remembered (amortised).
_DEDUP_PRUNE_AT = 1024


@dataclass(slots=True)
class _Message:
    payload: str
    group_id: str | None
    visible_at: int
    receive_count: int = 0
    first_receive_at: int = 0
    token: str = ""


@dataclass(slots=True)
class _Queue:
    record: QueueRecord
    next_seq: int = 1
    # Insertion order is sequence order (dicts keep it), which is the
    # queue's sequence index.
    messages: dict[int, _Message] = dataclasses.field(default_factory=dict)
    dedup: dict[str, tuple[str, int, int]] = dataclasses.field(default_factory=dict)


class MemoryStore(Store):
    """Queues in a dict; lost when the process ends."""

    def __init__(self) -> None:
        self._queues: dict[str, _Queue] = {}

    def _queue(self, name: str) -> _Queue:
        try:
            return self._queues[name]
        except KeyError:
            raise QueueDoesNotExist(f"The specified queue {name} does not exist.") from None

    async def create_queue(self, record: QueueRecord) -> tuple[QueueRecord, bool]:
        existing = self._queues.get(record.name)
        if existing is not None:
            return existing.record, False
        self._queues[record.name] = _Queue(record)
        return record, True

    async def get_queue(self, name: str) -> QueueRecord:
        return self._queue(name).record

    async def list_queues(self, prefix: str) -> list[str]:
        return sorted(n for n in self._queues if n.startswith(prefix))

    async def delete_queue(self, name: str) -> None:
        self._queue(name)
        del self._queues[name]

    async def set_attributes(self, name: str, attributes: Mapping[str, str], now: int) -> None:
        q = self._queue(name)
        q.record = dataclasses.replace(
            q.record, attributes={**q.record.attributes, **attributes}, modified_at=now
        )

    async def counts(self, name: str, now: int) -> QueueCounts:
        visible = in_flight = delayed = 0
        for m in self._queue(name).messages.values():
            if m.visible_at <= now:
                visible += 1
            elif m.receive_count:
                in_flight += 1
            else:
                delayed += 1
        return QueueCounts(visible=visible, in_flight=in_flight, delayed=delayed)

    async def send(self, name: str, messages: Sequence[NewMessage], now: int) -> list[SendResult]:
        q = self._queue(name)
        if len(q.dedup) > _DEDUP_PRUNE_AT:
            q.dedup = {k: v for k, v in q.dedup.items() if v[2] > now}
        results = []
        for new in messages:
            if new.dedup_id is not None:
                seen = q.dedup.get(new.dedup_id)
                if seen is not None and seen[2] > now:
                    results.append(SendResult(message_id=seen[0], seq=seen[1], duplicate=True))
                    continue
            seq = q.next_seq
            q.next_seq += 1
            q.messages[seq] = _Message(new.payload, new.group_id, new.visible_at)
            if new.dedup_id is not None:
                q.dedup[new.dedup_id] = (new.message_id, seq, new.dedup_until)
            results.append(SendResult(message_id=new.message_id, seq=seq))
        return results

    def _window(self, q: _Queue, spec: ReceiveSpec) -> list[int]:
        want = spec.k + spec.max_messages - 1
        visible: list[int] = []
        for s, m in q.messages.items():
            if m.visible_at <= spec.now:
                visible.append(s)
                if len(visible) >= want:
                    break
        return standard_picks(visible, spec.k, spec.max_messages, spec.rand)

    def _atomic_window(self, q: _Queue, spec: ReceiveSpec) -> list[int]:
        """:func:`~cmq.service.ordering.window_picks`: in-flight messages count."""
        want = spec.k + spec.max_messages - 1
        rows: list[tuple[int, bool]] = []
        visible_rows = 0
        for s, m in q.messages.items():
            visible = m.visible_at <= spec.now
            # The window: visible or in flight (a delayed message is neither);
            # after it, the visible ones a pick may fall back on.
            if visible or (m.receive_count and len(rows) < want):
                rows.append((s, visible))
                visible_rows += visible
                if len(rows) >= want and visible_rows >= spec.max_messages:
                    break
        return window_picks(rows, spec.k, spec.max_messages, spec.rand)

    def _mark(self, q: _Queue, spec: ReceiveSpec, picks: Sequence[int]) -> list[Received]:
        out = []
        for seq in picks:
            m = q.messages.get(seq)
            if m is None:  # deleted since a lock-free read
                continue
            m.receive_count += 1
            if m.receive_count == 1:
                m.first_receive_at = spec.now
            m.visible_at = spec.now + spec.visibility_ms
            m.token = spec.token
            out.append(
                Received(
                    seq=seq,
                    payload=m.payload,
                    receive_count=m.receive_count,
                    first_receive_at=m.first_receive_at,
                    token=spec.token,
                )
            )
        return out

    async def receive_atomic(self, name: str, spec: ReceiveSpec) -> list[Received]:
        q = self._queue(name)
        if spec.fifo:
            picks = fifo_picks(
                ((s, m.group_id, m.visible_at <= spec.now) for s, m in q.messages.items()),
                spec.max_messages,
            )
        else:
            picks = self._atomic_window(q, spec)
        return self._mark(q, spec, picks)

    async def peek(self, name: str, spec: ReceiveSpec) -> list[int]:
        return self._window(self._queue(name), spec)

    async def mark(self, name: str, spec: ReceiveSpec, picks: Sequence[int]) -> list[Received]:
        return self._mark(self._queue(name), spec, picks)

    async def delete(self, name: str, receipts: Sequence[tuple[int, str]]) -> None:
        q = self._queue(name)
        for seq, token in receipts:
            m = q.messages.get(seq)
            if m is not None and m.token == token:
                del q.messages[seq]

    async def change_visibility(
        self, name: str, seq: int, token: str, visible_at: int, now: int
    ) -> ChangeResult:
        m = self._queue(name).messages.get(seq)
        if m is None:
            return ChangeResult.NOT_FOUND
        if m.token != token or m.visible_at <= now:
            return ChangeResult.NOT_IN_FLIGHT
        m.visible_at = visible_at
        return ChangeResult.OK

    async def purge(self, name: str) -> None:
        self._queue(name).messages.clear()

    async def browse(self, name: str, limit: int) -> list[Browsed]:
        out: list[Browsed] = []
        for seq, m in self._queue(name).messages.items():
            if len(out) >= limit:
                break
            out.append(Browsed(seq=seq, payload=m.payload, visible_at=m.visible_at,
                               receive_count=m.receive_count))  # fmt: skip
        return out

    async def usage(self) -> int:
        """Bytes of the payloads held (a walk of every message)."""
        return sum(len(m.payload) for q in self._queues.values() for m in q.messages.values())
