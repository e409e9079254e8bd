"""Dead-letter queue redrive: StartMessageMoveTask, ListMessageMoveTasks, CancelMessageMoveTask.

Theory of operation
-------------------
A move task takes the messages of a dead-letter queue (the *source*, which
some queue's ``RedrivePolicy`` must name) back to the queue each came from,
or to ``DestinationArn`` when given. A message learns where it came from when
it is dead-lettered: the operations layer records its source queue in the
stored payload (and shows it as the ``DeadLetterQueueSourceArn`` system
attribute, as SQS does).

The task runs in the node that started it, as an asyncio task: it receives
up to ten messages at a time from the source (making them invisible), sends
them to their destination, then deletes them from the source; so a crash in
between gives a duplicate, never a loss. It moves at most the number of
messages the source held when it started (``ApproximateNumberOfMessagesToMove``)
and at most ``MaxNumberOfMessagesPerSecond`` a second when that is given.
A message whose source queue is unknown (dead-lettered before this was
recorded) and no ``DestinationArn``: the task fails and the message is made
visible again in the source.

Tasks live in the memory of the node that started them: ListMessageMoveTasks
and CancelMessageMoveTask see only that node's tasks, and a node's restart
ends its tasks (the messages not moved yet stay in the dead-letter queue).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cmq.service import errors
from cmq.service.model import NewMessage, ReceiveSpec
from cmq.service.params import get_str, opt_int, opt_str

if TYPE_CHECKING:
    from cmq.service.operations import QueueService

__all__ = ["MessageMover"]

#: How long a message being moved stays invisible in the source; a node that
#: dies mid-move lets it come back after this.
MOVE_VISIBILITY_MS = 30_000
MAX_RATE = 500

Handler = Callable[[Mapping[str, Any], str], Awaitable[dict[str, Any]]]


@dataclass(slots=True)
class _Task:
    task_id: str
    handle: str
    source: str
    source_arn: str
    destination: str | None
    destination_arn: str | None
    rate: int | None
    to_move: int
    started: int
    status: str = "RUNNING"
    moved: int = 0
    failure: str | None = None
    job: asyncio.Task[None] | None = None
    stop: asyncio.Event | None = None

    @property
    def cancel(self) -> bool:
        return self.stop is not None and self.stop.is_set()


def _source_missing() -> errors.SqsError:
    return errors.ResourceNotFoundException(
        "The resource that you specified for the SourceArn parameter doesn't exist."
    )


class MessageMover:
    """The message move tasks of one node (see module doc)."""

    def __init__(self, service: QueueService) -> None:
        self._service = service
        self._tasks: dict[str, _Task] = {}

    def handlers(self) -> dict[str, Handler]:
        return {
            "StartMessageMoveTask": self.start,
            "ListMessageMoveTasks": self.list_tasks,
            "CancelMessageMoveTask": self.cancel,
        }

    def _source(self, arn: str) -> str:
        if not arn.startswith("arn:") or arn.count(":") != 5:
            raise errors.InvalidParameterValue(
                "You must use this format to specify the SourceArn: "
                "arn:<partition>:<service>:<region>:<account-id>:<resource-id>"
            )
        name = self._service._arn_name(arn)
        if name is None:
            raise _source_missing()
        return name

    async def start(self, p: Mapping[str, Any], host: str) -> dict[str, Any]:
        """StartMessageMoveTask. Raises ResourceNotFoundException, InvalidParameterValue."""
        svc = self._service
        source_arn = get_str(p, "SourceArn")
        destination_arn = opt_str(p, "DestinationArn")
        rate = opt_int(p, "MaxNumberOfMessagesPerSecond", 1, MAX_RATE)
        source = self._source(source_arn)
        try:
            await svc.store.get_queue(source)
        except errors.QueueDoesNotExist as exc:
            raise _source_missing() from exc
        if not await svc.dead_letter_sources(source):
            raise errors.InvalidParameterValue(
                "Source queue must be configured as a Dead Letter Queue."
            )
        destination = None
        if destination_arn:
            destination = svc._arn_name(destination_arn)
            try:
                if destination is None:
                    raise errors.QueueDoesNotExist(destination_arn)
                await svc.store.get_queue(destination)
            except errors.QueueDoesNotExist as exc:
                raise errors.ResourceNotFoundException(
                    "The resource that you specified for the DestinationArn parameter doesn't "
                    "exist."
                ) from exc
        if any(
            t.source_arn == source_arn and t.status in ("RUNNING", "CANCELLING")
            for t in self._tasks.values()
        ):
            raise errors.InvalidParameterValue(
                "There is already a task running. Only one active task is allowed for a source "
                "queue arn at a given time."
            )
        now = svc._clock()
        counts = await svc.store.counts(source, now)
        task_id = str(uuid.uuid4())
        handle = base64.b64encode(
            json.dumps({"taskId": task_id, "sourceArn": source_arn}).encode()
        ).decode()
        task = _Task(
            task_id=task_id,
            handle=handle,
            source=source,
            source_arn=source_arn,
            destination=destination,
            destination_arn=destination_arn,
            rate=rate,
            to_move=counts.visible,
            started=now,
        )
        task.stop = asyncio.Event()
        self._tasks[task_id] = task
        task.job = asyncio.get_running_loop().create_task(self._run(task))
        return {"TaskHandle": handle}

    async def list_tasks(self, p: Mapping[str, Any], host: str) -> dict[str, Any]:
        """ListMessageMoveTasks: the most recent tasks of a source (default 1, at most 10)."""
        source_arn = get_str(p, "SourceArn")
        max_results = opt_int(p, "MaxResults", 1, 10) or 1
        source = self._source(source_arn)
        try:
            await self._service.store.get_queue(source)
        except errors.QueueDoesNotExist as exc:
            raise _source_missing() from exc
        tasks = sorted(
            (t for t in self._tasks.values() if t.source_arn == source_arn),
            key=lambda t: t.started,
            reverse=True,
        )
        return {"Results": [self._entry(t) for t in tasks[:max_results]]}

    @staticmethod
    def _entry(t: _Task) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "Status": t.status,
            "SourceArn": t.source_arn,
            "ApproximateNumberOfMessagesMoved": t.moved,
            "ApproximateNumberOfMessagesToMove": t.to_move,
            "StartedTimestamp": t.started,
        }
        if t.status == "RUNNING":
            entry["TaskHandle"] = t.handle
        if t.destination_arn:
            entry["DestinationArn"] = t.destination_arn
        if t.rate is not None:
            entry["MaxNumberOfMessagesPerSecond"] = t.rate
        if t.failure is not None:
            entry["FailureReason"] = t.failure
        return entry

    async def cancel(self, p: Mapping[str, Any], host: str) -> dict[str, Any]:
        """CancelMessageMoveTask: stop a running task; returns what it moved so far."""
        handle = get_str(p, "TaskHandle")
        try:
            decoded = json.loads(base64.b64decode(handle, validate=True))
            task_id, source_arn = str(decoded["taskId"]), str(decoded["sourceArn"])
        except (binascii.Error, ValueError, KeyError, TypeError) as exc:
            raise errors.InvalidParameterValue(
                "Value for parameter TaskHandle is invalid."
            ) from exc
        source = self._source(source_arn)
        try:
            await self._service.store.get_queue(source)
        except errors.QueueDoesNotExist as exc:
            raise _source_missing() from exc
        task = self._tasks.get(task_id)
        if task is None:
            raise errors.ResourceNotFoundException("Task does not exist.")
        if task.status != "RUNNING":
            raise errors.InvalidParameterValue(
                f"Only a RUNNING task can be cancelled; this one is {task.status}."
            )
        assert task.stop is not None
        task.stop.set()
        task.status = "CANCELLING"
        return {"ApproximateNumberOfMessagesMoved": task.moved}

    async def _run(self, task: _Task) -> None:
        try:
            await self._move(task)
        except errors.SqsError as exc:
            task.status, task.failure = "FAILED", exc.message
        except Exception as exc:  # noqa: BLE001 - a task's failure is reported, never raised
            task.status, task.failure = "FAILED", f"{type(exc).__name__}: {exc}"
        else:
            task.status = "CANCELLED" if task.cancel else "COMPLETED"

    async def _move(self, task: _Task) -> None:
        svc = self._service
        store = svc.store
        source = await store.get_queue(task.source)
        fifo = source.attributes.get("FifoQueue") == "true"
        while not task.cancel and task.moved < task.to_move:
            now = svc._clock()
            n = min(10, task.rate or 10, task.to_move - task.moved)
            spec = ReceiveSpec(
                now=now,
                max_messages=n,
                visibility_ms=MOVE_VISIBILITY_MS,
                k=1,
                fifo=fifo,
                token=f"{svc._rng.getrandbits(64):016x}",
                rand=tuple(svc._rng.random() for _ in range(n)),
            )
            got = await store.receive(task.source, spec)
            if not got:
                return
            by_destination: dict[str, list[NewMessage]] = {}
            orphans = []
            for r in got:
                data = json.loads(r.payload)
                destination = task.destination or data.get("o")
                if destination is None:
                    orphans.append(r)
                    continue
                data.pop("o", None)
                by_destination.setdefault(destination, []).append(
                    NewMessage(
                        message_id=data["i"],
                        payload=json.dumps(data, separators=(",", ":")),
                        visible_at=now,
                        group_id=data.get("g"),
                    )
                )
            try:
                for destination, messages in by_destination.items():
                    await store.send(destination, messages, now)
                    svc.notifier.notify(destination)
            except errors.QueueDoesNotExist as exc:
                await self._release(task.source, got, now)
                raise errors.ResourceNotFoundException(
                    "The destination queue of a message no longer exists."
                ) from exc
            moved = [r for r in got if r not in orphans]
            await store.delete(task.source, [(r.seq, r.token) for r in moved])
            task.moved += len(moved)
            if orphans:
                await self._release(task.source, orphans, now)
                raise errors.InvalidParameterValue(
                    "A message has no source queue recorded; give DestinationArn to move it."
                )
            if task.rate is not None and task.stop is not None:
                # Pace to the rate; a cancel ends the pause at once.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(task.stop.wait(), len(moved) / task.rate)

    async def _release(self, name: str, received: Sequence[Any], now: int) -> None:
        for r in received:
            await self._service.store.change_visibility(name, r.seq, r.token, now, now)
