"""The queue operations: SQS semantics over a :class:`~cmq.service.store.base.Store`.

Theory of operation
-------------------
:class:`QueueService` takes one decoded action (name and JSON parameters)
and returns the JSON result or raises an :class:`~cmq.service.errors.SqsError`.
It knows nothing of HTTP. It validates every parameter (types, ranges,
names, sizes) and turns SQS syntax into store records; the store makes each
state change atomic. Time comes from an injected clock (integer ms) and
randomness from an injected ``random.Random``, so tests can drive both.

Delivery is at least once: a received message stays in the store, invisible
until its visibility deadline, and comes back if not deleted by then. Order
is best effort, tuned by the queue attribute ``ConsistencyK`` (see
:mod:`cmq.service.ordering`). A message received more often than its queue's
``RedrivePolicy.maxReceiveCount`` is copied to the dead-letter queue and then
deleted from its queue (copy first: a crash in between gives a duplicate,
never a loss).

Queue attributes are cached per node for :data:`ATTRIBUTE_CACHE_MS`: SQS
itself documents that attribute changes take up to 60 s to propagate, and
reading them from the store on every send would double the store's load.
Existence is never taken from the cache: the store checks it on every call.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cmq.service import errors
from cmq.service.model import ChangeResult, NewMessage, QueueRecord, Received, ReceiveSpec
from cmq.service.params import (
    BAD_BODY_CHAR,
    MAX_BATCH,
    attr_wanted,
    attributes_size,
    entries,
    failure,
    fifo_seq,
    get_int,
    get_str,
    message_attributes,
    opt_int,
    opt_str,
    parse_int,
    parse_receipt_handle,
    receipt_handle,
    str_list,
    str_map,
)
from cmq.service.protocol import compact_json, md5_of_body, md5_of_message_attributes
from cmq.service.redrive import MessageMover
from cmq.service.store.base import Store

__all__ = ["ATTRIBUTE_CACHE_MS", "Bounds", "Notifier", "QueueService", "queue_url"]

#: How long a node trusts its copy of a queue's attributes (see module doc).
ATTRIBUTE_CACHE_MS = 1000
#: QueueUrls whose queue name a node remembers (see QueueService._name).
MAX_CACHED_URLS = 4096
#: SQS limits.
#: Message (and whole batch) size limit: AWS raised it from 256 KiB to 1 MiB in 2025.
MAX_MESSAGE_BYTES = 1_048_576
MAX_WAIT_SECONDS = 20
MAX_VISIBILITY_SECONDS = 43_200
MAX_DELAY_SECONDS = 900
DEDUP_WINDOW_MS = 5 * 60 * 1000

_QUEUE_NAME = re.compile(r"[A-Za-z0-9_-]{1,80}")
_FIFO_NAME = re.compile(r"[A-Za-z0-9_-]{1,75}\.fifo")
_DEDUP_ID = re.compile(r"[!-~]{1,128}")
#: A queue URL: optional scheme and host, then /ACCOUNT/NAME.
_QUEUE_URL = re.compile(r"(?:(?:https?://)?([^/\s]+))?/([0-9]{12})/([A-Za-z0-9_.-]{1,80})/?")
#: Attributes whose empty value removes them (as AWS clients remove a policy).
_REMOVABLE = ("RedrivePolicy", "Policy", "RedriveAllowPolicy")
#: Where tags live among a queue's stored attributes (never shown as one).
TAGS_KEY = "cmq:tags"
MAX_TAGS = 50
_TAG_KEY = re.compile(r"[\w.:/=+\-@ ]{1,128}")
_TAG_VALUE = re.compile(r"[\w.:/=+\-@ ]{0,256}")

_DEFAULTS = {
    "DelaySeconds": "0",
    "MaximumMessageSize": str(MAX_MESSAGE_BYTES),
    "MessageRetentionPeriod": "345600",
    "ReceiveMessageWaitTimeSeconds": "0",
    "VisibilityTimeout": "30",
    "ConsistencyK": "1",
    "ReceiveMode": "atomic",
}
_FIFO_DEFAULTS = {
    "FifoQueue": "true",
    "ContentBasedDeduplication": "false",
    "DeduplicationScope": "queue",
    "FifoThroughputLimit": "perQueue",
}
_INT_ATTRIBUTES = {
    "DelaySeconds": (0, MAX_DELAY_SECONDS),
    "MaximumMessageSize": (1024, MAX_MESSAGE_BYTES),
    "MessageRetentionPeriod": (60, 1_209_600),
    "ReceiveMessageWaitTimeSeconds": (0, MAX_WAIT_SECONDS),
    "VisibilityTimeout": (0, MAX_VISIBILITY_SECONDS),
    "KmsDataKeyReusePeriodSeconds": (60, 86_400),
    # The BDQS consistency hint; any value >= the queue's depth is no order.
    "ConsistencyK": (1, 2**31 - 1),
}
_BOOL_ATTRIBUTES = {"FifoQueue", "ContentBasedDeduplication", "SqsManagedSseEnabled"}
#: The BDQS receive mode (see :mod:`cmq.service.store.base`): ``atomic``
#: never hands an in-flight message out twice; ``lock-free`` reads and marks
#: in separate steps, as the paper's nodes do, and may.
_ENUM_ATTRIBUTES = {"ReceiveMode": ("atomic", "lock-free")}
_FREE_ATTRIBUTES = {
    "Policy",
    "KmsMasterKeyId",
    "RedriveAllowPolicy",
    "DeduplicationScope",
    "FifoThroughputLimit",
}
_COMPUTED_ATTRIBUTES = (
    "ApproximateNumberOfMessages",
    "ApproximateNumberOfMessagesNotVisible",
    "ApproximateNumberOfMessagesDelayed",
    "CreatedTimestamp",
    "LastModifiedTimestamp",
    "QueueArn",
)
_SETTABLE = (
    set(_INT_ATTRIBUTES)
    | _BOOL_ATTRIBUTES
    | set(_ENUM_ATTRIBUTES)
    | _FREE_ATTRIBUTES
    | {"RedrivePolicy"}
)


_FIFO_ONLY = ("DeduplicationScope", "FifoThroughputLimit")
_CHOICES = {
    "DeduplicationScope": ("messageGroup", "queue"),
    "FifoThroughputLimit": ("perQueue", "perMessageGroupId"),
}
_NO_QUEUE = "The specified queue does not exist."
_NO_DEDUP = (
    "The queue should either have ContentBasedDeduplication enabled or "
    "MessageDeduplicationId provided explicitly"
)
_LABEL = re.compile(r"[A-Za-z0-9_-]{1,80}")
#: Actions a permission may name (AddPermission).
_PERMISSION_ACTIONS = frozenset(
    {
        "SendMessage",
        "ReceiveMessage",
        "DeleteMessage",
        "ChangeMessageVisibility",
        "GetQueueAttributes",
        "GetQueueUrl",
        "ListDeadLetterSourceQueues",
        "PurgeQueue",
        "ListQueueTags",
    }
)


def _entry_size(entry: Mapping[str, Any]) -> int:
    """Bytes of one batch entry's body and attributes, as SQS counts a batch."""
    size = len(str(entry.get("MessageBody", "")).encode())
    attrs = entry.get("MessageAttributes")
    if isinstance(attrs, dict):
        for name, attr in attrs.items():
            size += len(str(name).encode())
            if isinstance(attr, dict):
                size += sum(len(str(v).encode()) for v in attr.values())
    return size


def _json_object(key: str, value: str) -> str:
    """A policy attribute: a JSON object, else InvalidAttributeValue."""
    try:
        parsed = json.loads(value)
    except (ValueError, RecursionError) as exc:
        raise errors.InvalidAttributeValue(f"Invalid value for the parameter {key}.") from exc
    if not isinstance(parsed, dict):
        raise errors.InvalidAttributeValue(f"Invalid value for the parameter {key}.")
    return value


def _stored_tags(record: QueueRecord) -> dict[str, str]:
    raw = record.attributes.get(TAGS_KEY)
    return dict(json.loads(raw)) if raw else {}


def _policy(record: QueueRecord, arn: str) -> dict[str, Any]:
    raw = record.attributes.get("Policy")
    policy = json.loads(raw) if raw else {}
    if not isinstance(policy, dict):
        policy = {}
    policy.setdefault("Version", "2012-10-17")
    policy.setdefault("Id", f"{arn}/SQSDefaultPolicy")
    if not isinstance(policy.get("Statement"), list):
        statement = policy.get("Statement")
        policy["Statement"] = [statement] if isinstance(statement, dict) else []
    return policy


#: How long a node trusts its estimate of a queue's depth or the store's bytes
#: when far (under half) from the bound, and when near it. The estimate adds
#: this node's own sends in between; other nodes' sends are what a bound can
#: be passed by, at most their rate times the near period.
BOUND_REFRESH_FAR_MS = 5000
BOUND_REFRESH_NEAR_MS = 250


@dataclass(frozen=True, slots=True, kw_only=True)
class Bounds:
    """How much a node lets its store hold; 0 is no bound.

    Reached, a request gets ``OverLimit`` (HTTP 403, so SDKs do not retry).
    Queue and message counts are checked against the store's counts; bytes
    against :meth:`Store.usage` (SQLite: the database file's pages in use;
    Redis: the masters' ``used_memory``; memory: the payloads).
    """

    max_queues: int = 10_000
    """Queues in the store (CreateQueue of a new name)."""
    max_queue_messages: int = 1_000_000
    """Messages in one queue, visible, in flight and delayed (sends)."""
    max_store_bytes: int = 0
    """Bytes the store holds (sends)."""

    def __post_init__(self) -> None:
        if min(self.max_queues, self.max_queue_messages, self.max_store_bytes) < 0:
            raise ValueError("bounds must be >= 0 (0: no bound)")


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def uuid4_text(bits: int) -> str:
    """``str(uuid.UUID(int=bits, version=4))``, in under half its time."""
    h = "%032x" % ((bits & _UUID4_KEEP) | _UUID4_SET)
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


# The version (4) and variant (RFC 4122) bits, as uuid.UUID sets them.
_UUID4_KEEP = ~((0xC000 << 48) | (0xF000 << 64)) & ((1 << 128) - 1)
_UUID4_SET = (0x8000 << 48) | (4 << 76)


def queue_url(host: str, account_id: str, name: str) -> str:
    """The URL of queue ``name`` as seen by a client that used ``host``."""
    return f"http://{host}/{account_id}/{name}"


class Notifier:
    """Wakes long-polling receivers of this node when a queue gets messages.

    Receivers on other nodes find new messages by re-checking the store every
    ``Store.poll_interval`` seconds.
    """

    def __init__(self) -> None:
        self._waiters: dict[str, set[asyncio.Future[None]]] = {}

    def notify(self, name: str) -> None:
        """Wake every receiver waiting on ``name``."""
        for fut in self._waiters.pop(name, ()):
            if not fut.done():
                fut.set_result(None)

    async def wait(self, name: str, timeout: float) -> None:
        """Return on a notify of ``name`` or after ``timeout`` seconds."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiters = self._waiters.setdefault(name, set())
        waiters.add(fut)
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout)
        except TimeoutError:
            pass
        finally:
            waiters.discard(fut)


@dataclass(frozen=True, slots=True)
class _Queue:
    """A queue's attributes, interpreted."""

    name: str
    attributes: Mapping[str, str]
    fifo: bool
    delay_ms: int
    max_size: int
    visibility_ms: int
    wait_seconds: int
    k: int
    lock_free: bool
    content_dedup: bool
    dead_letter: str | None
    max_receive_count: int
    retention_ms: int

    @classmethod
    def from_record(cls, record: QueueRecord) -> _Queue:
        a = record.attributes
        dead_letter, max_receives = None, 0
        if a.get("RedrivePolicy"):
            policy = json.loads(a["RedrivePolicy"])
            dead_letter = str(policy["deadLetterTargetArn"]).rsplit(":", 1)[-1]
            max_receives = int(policy["maxReceiveCount"])
        return cls(
            name=record.name,
            attributes=a,
            fifo=a.get("FifoQueue") == "true",
            delay_ms=int(a.get("DelaySeconds", "0")) * 1000,
            max_size=int(a.get("MaximumMessageSize", str(MAX_MESSAGE_BYTES))),
            visibility_ms=int(a.get("VisibilityTimeout", "30")) * 1000,
            wait_seconds=int(a.get("ReceiveMessageWaitTimeSeconds", "0")),
            k=int(a.get("ConsistencyK", "1")),
            lock_free=a.get("ReceiveMode") == "lock-free",
            content_dedup=a.get("ContentBasedDeduplication") == "true",
            dead_letter=dead_letter,
            max_receive_count=max_receives,
            retention_ms=int(a.get("MessageRetentionPeriod", "345600")) * 1000,
        )


Handler = Callable[[Mapping[str, Any], str], Awaitable[dict[str, Any]]]


class QueueService:
    """SQS actions over a store. One instance per node (process)."""

    def __init__(
        self,
        store: Store,
        *,
        region: str = "us-east-1",
        account_id: str = "000000000000",
        clock: Callable[[], int] = _now_ms,
        rng: random.Random | None = None,
        notifier: Notifier | None = None,
        host_ok: Callable[[str], bool] | None = None,
        bounds: Bounds | None = None,
    ) -> None:
        self.store = store
        self.bounds = bounds or Bounds()
        # name -> (when read, estimated depth); and (when read, estimated bytes)
        self._depths: dict[str, tuple[int, int]] = {}
        self._usage: tuple[int, int] | None = None
        #: Whether a QueueUrl's host is one this node answers to.
        self._host_ok = host_ok or (lambda host: True)
        self.region = region
        self.account_id = account_id
        self._clock = clock
        self._rng = rng or random.Random()
        self.notifier = notifier or Notifier()
        self._cache: dict[str, tuple[int, _Queue]] = {}
        self._names: dict[str, str] = {}  # QueueUrl -> queue name (see _name)
        self._handlers: dict[str, Handler] = {
            "CreateQueue": self.create_queue,
            "GetQueueUrl": self.get_queue_url,
            "ListQueues": self.list_queues,
            "DeleteQueue": self.delete_queue,
            "GetQueueAttributes": self.get_queue_attributes,
            "SetQueueAttributes": self.set_queue_attributes,
            "SendMessage": self.send_message,
            "SendMessageBatch": self.send_message_batch,
            "ReceiveMessage": self.receive_message,
            "DeleteMessage": self.delete_message,
            "DeleteMessageBatch": self.delete_message_batch,
            "ChangeMessageVisibility": self.change_message_visibility,
            "ChangeMessageVisibilityBatch": self.change_message_visibility_batch,
            "PurgeQueue": self.purge_queue,
            "TagQueue": self.tag_queue,
            "UntagQueue": self.untag_queue,
            "ListQueueTags": self.list_queue_tags,
            "AddPermission": self.add_permission,
            "RemovePermission": self.remove_permission,
            "ListDeadLetterSourceQueues": self.list_dead_letter_source_queues,
        }
        self.mover = MessageMover(self)
        self._handlers.update(self.mover.handlers())

    async def handle(self, action: str, params: Mapping[str, Any], host: str) -> dict[str, Any]:
        """Run one action; ``host`` is the request's Host header (for URLs).

        Raises SqsError (UnsupportedOperation for SQS actions not built here).
        """
        handler = self._handlers.get(action)
        if handler is None:
            raise errors.UnsupportedOperation(f"{action} is not supported by cmq serve.")
        try:
            return await handler(params, host)
        except errors.QueueDoesNotExist as exc:
            if exc.message == _NO_QUEUE:
                raise
            raise errors.QueueDoesNotExist(_NO_QUEUE) from exc

    # -- queues ------------------------------------------------------------

    async def create_queue(self, p: Mapping[str, Any], host: str) -> dict[str, Any]:
        """CreateQueue: idempotent for equal attributes, else QueueNameExists."""
        name = get_str(p, "QueueName")
        given = str_map(p, "Attributes")
        tags = self._tags(str_map(p, "tags"))
        flag = given.get("FifoQueue", "false")
        if flag.lower() not in ("true", "false"):
            raise errors.InvalidAttributeValue("Invalid value for the parameter FifoQueue.")
        fifo = flag.lower() == "true"
        if fifo and not _FIFO_NAME.fullmatch(name):
            raise errors.InvalidParameterValue(
                "The name of a FIFO queue can only include alphanumeric characters, hyphens, "
                "or underscores, must end with .fifo suffix and be 1 to 80 in length."
            )
        if not fifo and not _QUEUE_NAME.fullmatch(name):
            raise errors.InvalidParameterValue(
                "Can only include alphanumeric characters, hyphens, or underscores. 1 to 80 in "
                "length"
            )
        attrs = await self._validate_attributes(given, fifo=fifo, create=True)
        if not fifo:
            attrs.pop("FifoQueue", None)  # SQS shows FifoQueue on FIFO queues only
        now = self._clock()
        full = {**_DEFAULTS, **(_FIFO_DEFAULTS if fifo else {}), **attrs}
        if tags:
            full[TAGS_KEY] = json.dumps(tags)
        if self.bounds.max_queues:
            names = await self.store.list_queues("")
            if name not in names and len(names) >= self.bounds.max_queues:
                raise errors.OverLimit(
                    f"The maximum number of queues ({self.bounds.max_queues}) is reached."
                )
        record, created = await self.store.create_queue(
            QueueRecord(name=name, attributes=full, created_at=now, modified_at=now)
        )
        if not created:
            # The name existed before: SQS answers with its URL if the given
            # attributes agree, else QueueNameExists.
            for key, value in attrs.items():
                if record.attributes.get(key, _DEFAULTS.get(key, "")) != value:
                    raise errors.QueueNameExists(
                        f"A queue already exists with the same name and a different value "
                        f"for attribute {key}"
                    )
        return {"QueueUrl": queue_url(host, self.account_id, name)}

    async def get_queue_url(self, p: Mapping[str, Any], host: str) -> dict[str, Any]:
        """GetQueueUrl. Raises QueueDoesNotExist."""
        name = get_str(p, "QueueName")
        opt_str(p, "QueueOwnerAWSAccountId")
        await self.store.get_queue(name)
        return {"QueueUrl": queue_url(host, self.account_id, name)}

    async def list_queues(self, p: Mapping[str, Any], host: str) -> dict[str, Any]:
        """ListQueues with QueueNamePrefix, MaxResults (1-1000) and NextToken."""
        prefix = opt_str(p, "QueueNamePrefix") or ""
        max_results = opt_int(p, "MaxResults", 1, 1000)
        after = opt_str(p, "NextToken") or ""
        names = [n for n in await self.store.list_queues(prefix) if n > after]
        result: dict[str, Any] = {}
        if max_results is not None and len(names) > max_results:
            names = names[:max_results]
            result["NextToken"] = names[-1]
        if names:
            result["QueueUrls"] = [queue_url(host, self.account_id, n) for n in names]
        return result

    async def delete_queue(self, p: Mapping[str, Any], host: str) -> dict[str, Any]:
        """DeleteQueue. Raises QueueDoesNotExist."""
        name = self._name(p)
        await self.store.delete_queue(name)
        self._cache.pop(name, None)
        self._depths.pop(name, None)
        return {}

    async def get_queue_attributes(self, p: Mapping[str, Any], host: str) -> dict[str, Any]:
        """GetQueueAttributes: stored, computed (counts, ARN, times) or All."""
        name = self._name(p)
        wanted = set(str_list(p, "AttributeNames") or [])
        record = await self.store.get_queue(name)
        everything = "All" in wanted
        for attr in wanted - {"All"}:
            if attr not in _SETTABLE and attr not in _COMPUTED_ATTRIBUTES:
                raise errors.InvalidAttributeName(f"Unknown Attribute {attr}.")
            if attr in _FIFO_ONLY and record.attributes.get("FifoQueue") != "true":
                raise errors.InvalidAttributeName(f"Unknown Attribute {attr}.")
        out = {
            k: v
            for k, v in record.attributes.items()
            if (everything or k in wanted) and k in _SETTABLE and v != ""
        }
        if everything or wanted & set(_COMPUTED_ATTRIBUTES[:3]):
            counts = await self.store.counts(name, self._clock())
            computed = {
                "ApproximateNumberOfMessages": counts.visible,
                "ApproximateNumberOfMessagesNotVisible": counts.in_flight,
                "ApproximateNumberOfMessagesDelayed": counts.delayed,
            }
            out.update({k: str(v) for k, v in computed.items() if everything or k in wanted})
        extra = {
            "CreatedTimestamp": str(record.created_at // 1000),
            "LastModifiedTimestamp": str(record.modified_at // 1000),
            "QueueArn": self._arn(name),
        }
        out.update({k: v for k, v in extra.items() if everything or k in wanted})
        return {"Attributes": out} if out else {}

    async def set_queue_attributes(self, p: Mapping[str, Any], host: str) -> dict[str, Any]:
        """SetQueueAttributes. Raises InvalidAttributeName/Value, QueueDoesNotExist."""
        name = self._name(p)
        queue = await self._queue(name, fresh=True)
        attrs = await self._validate_attributes(
            str_map(p, "Attributes"), fifo=queue.fifo, create=False
        )
        await self.store.set_attributes(name, attrs, self._clock())
        self._cache.pop(name, None)
        return {}

    async def purge_queue(self, p: Mapping[str, Any], host: str) -> dict[str, Any]:
        """PurgeQueue. Raises QueueDoesNotExist."""
        name = self._name(p)
        await self.store.purge(name)
        self._depths.pop(name, None)
        return {}

    # -- messages ----------------------------------------------------------

    async def send_message(self, p: Mapping[str, Any], host: str) -> dict[str, Any]:
        """SendMessage; answers only once the store has the message durably."""
        queue = await self._queue(self._name(p))
        now = self._clock()
        new, reply = self._new_message(queue, p, now)
        await self._room(queue.name, 1, len(new.payload), now)
        [result] = await self.store.send(queue.name, [new], now)
        self.notifier.notify(queue.name)
        reply["MessageId"] = result.message_id
        if queue.fifo:
            reply["SequenceNumber"] = fifo_seq(result.seq)
        return reply

    async def send_message_batch(self, p: Mapping[str, Any], host: str) -> dict[str, Any]:
        """SendMessageBatch: valid entries go to the store in one atomic call."""
        queue = await self._queue(self._name(p))
        batch = entries(p, "SendMessageBatch")
        total = sum(_entry_size(e) for e in batch)
        if total > MAX_MESSAGE_BYTES:
            raise errors.BatchRequestTooLong(
                f"Batch requests cannot be longer than {MAX_MESSAGE_BYTES} bytes. You have sent "
                f"{total} bytes."
            )
        if queue.fifo:
            # A FIFO batch missing its ids fails as a whole, as in SQS.
            for e in batch:
                if e.get("MessageGroupId") is None:
                    raise errors.InvalidParameterValue(
                        "The request must contain the parameter MessageGroupId."
                    )
                if e.get("MessageDeduplicationId") is None and not queue.content_dedup:
                    raise errors.InvalidParameterValue(_NO_DEDUP)
        now = self._clock()
        failed: list[dict[str, Any]] = []
        accepted: list[tuple[str, NewMessage, dict[str, Any]]] = []
        for entry in batch:
            try:
                new, reply = self._new_message(queue, entry, now, batch=True)
            except errors.SqsError as exc:
                failed.append(failure(entry["Id"], exc))
            else:
                accepted.append((entry["Id"], new, reply))
        successful = []
        if accepted:
            size = sum(len(a[1].payload) for a in accepted)
            await self._room(queue.name, len(accepted), size, now)
            results = await self.store.send(queue.name, [a[1] for a in accepted], now)
            self.notifier.notify(queue.name)
            for (entry_id, _, reply), result in zip(accepted, results, strict=True):
                reply = {"Id": entry_id, **reply, "MessageId": result.message_id}
                if queue.fifo:
                    reply["SequenceNumber"] = fifo_seq(result.seq)
                successful.append(reply)
        return {"Successful": successful, "Failed": failed}

    async def receive_message(self, p: Mapping[str, Any], host: str) -> dict[str, Any]:
        """ReceiveMessage with long polling (WaitTimeSeconds <= 20)."""
        name = self._name(p)
        max_messages = opt_int(p, "MaxNumberOfMessages", 1, MAX_BATCH) or 1
        visibility = opt_int(p, "VisibilityTimeout", 0, MAX_VISIBILITY_SECONDS)
        wait = opt_int(
            p,
            "WaitTimeSeconds",
            0,
            MAX_WAIT_SECONDS,
            reason=f"Must be >= 0 and <= {MAX_WAIT_SECONDS}, if provided.",
        )
        system = set(str_list(p, "AttributeNames") or []) | set(
            str_list(p, "MessageSystemAttributeNames") or []
        )
        wanted_attrs = str_list(p, "MessageAttributeNames") or []
        opt_str(p, "ReceiveRequestAttemptId")
        queue = await self._queue(name)
        if wait is None:
            wait = queue.wait_seconds
        vis_ms = queue.visibility_ms if visibility is None else visibility * 1000
        deadline = self._clock() + wait * 1000
        while True:
            got = await self._receive_once(queue, max_messages, vis_ms)
            remaining = deadline - self._clock()
            if got or remaining <= 0:
                break
            await self.notifier.wait(name, min(self.store.poll_interval, remaining / 1000))
        messages = [self._render(queue, r, data, system, wanted_attrs) for r, data in got]
        return {"Messages": messages} if messages else {}

    async def _receive_once(
        self, queue: _Queue, n: int, vis_ms: int
    ) -> list[tuple[Received, dict[str, Any]]]:
        now = self._clock()
        spec = ReceiveSpec(
            now=now,
            max_messages=n,
            visibility_ms=vis_ms,
            k=queue.k,
            fifo=queue.fifo,
            token=f"{self._rng.getrandbits(64):016x}",
            rand=tuple(self._rng.random() for _ in range(n)),
            lock_free=queue.lock_free,
        )
        got = [(r, json.loads(r.payload)) for r in await self.store.receive(queue.name, spec)]
        keep: list[tuple[Received, dict[str, Any]]] = []
        dead: list[tuple[Received, dict[str, Any]]] = []
        expired: list[tuple[int, str]] = []
        for r, data in got:
            if data["t"] + queue.retention_ms <= now:
                # Past MessageRetentionPeriod: SQS deletes it. Done lazily,
                # when the message comes up for receive.
                expired.append((r.seq, r.token))
            elif queue.dead_letter and r.receive_count > queue.max_receive_count:
                dead.append((r, data))
            else:
                keep.append((r, data))
        if expired:
            await self.store.delete(queue.name, expired)
        if dead:
            keep += await self._redrive(queue, dead, now)
        return keep

    async def _redrive(
        self, queue: _Queue, dead: list[tuple[Received, dict[str, Any]]], now: int
    ) -> list[tuple[Received, dict[str, Any]]]:
        """Move ``dead`` to the queue's dead-letter queue; returns the messages
        to deliver instead, which is all of them when that queue is gone.

        SQS never destroys or hides a message over a redrive target that does
        not resolve: the message stays in its queue and is delivered as usual.
        Holding it back here instead (received, so in flight, but never
        returned) would hide it on every receive until retention removed it.
        """
        assert queue.dead_letter is not None
        # The source is recorded for DeadLetterQueueSourceArn and move tasks.
        moved = [
            NewMessage(
                message_id=data["i"],
                payload=compact_json({**data, "o": queue.name}),
                visible_at=now,
                group_id=data.get("g"),
            )
            for r, data in dead
        ]
        try:
            await self.store.send(queue.dead_letter, moved, now)
        except errors.QueueDoesNotExist:
            # No dead-letter queue (deleted since): deliver them.
            return dead
        self.notifier.notify(queue.dead_letter)
        await self.store.delete(queue.name, [(r.seq, r.token) for r, _ in dead])
        return []

    def _render(
        self,
        queue: _Queue,
        r: Received,
        data: Mapping[str, Any],
        system: set[str],
        wanted: Sequence[str],
    ) -> dict[str, Any]:
        body: str = data["b"]
        msg: dict[str, Any] = {
            "MessageId": data["i"],
            "ReceiptHandle": receipt_handle(queue.name, r.seq, r.token),
            "MD5OfBody": md5_of_body(body),
            "Body": body,
        }
        if system:
            self._render_system(msg, queue, r, data, system)
        attrs: dict[str, Any] = data.get("a") or {}
        if attrs and wanted:
            chosen = {k: v for k, v in attrs.items() if attr_wanted(k, wanted)}
            if chosen:
                msg["MessageAttributes"] = chosen
                msg["MD5OfMessageAttributes"] = md5_of_message_attributes(chosen)
        return msg

    def _render_system(
        self,
        msg: dict[str, Any],
        queue: _Queue,
        r: Received,
        data: Mapping[str, Any],
        system: set[str],
    ) -> None:
        """The system attributes asked for, into ``msg`` (none asked: none built)."""
        everything = "All" in system
        sysattrs = {
            "SenderId": self.account_id,
            "SentTimestamp": str(data["t"]),
            "ApproximateReceiveCount": str(r.receive_count),
            "ApproximateFirstReceiveTimestamp": str(r.first_receive_at),
        }
        if queue.fifo:
            sysattrs["SequenceNumber"] = fifo_seq(r.seq)
            sysattrs["MessageGroupId"] = data.get("g") or ""
            sysattrs["MessageDeduplicationId"] = data.get("d") or ""
        if "s" in data:
            sysattrs["AWSTraceHeader"] = data["s"]
        if "o" in data:
            sysattrs["DeadLetterQueueSourceArn"] = self._arn(data["o"])
        picked = {k: v for k, v in sysattrs.items() if everything or k in system}
        if picked:
            msg["Attributes"] = picked

    async def delete_message(self, p: Mapping[str, Any], host: str) -> dict[str, Any]:
        """DeleteMessage. Raises ReceiptHandleIsInvalid, QueueDoesNotExist.

        A stale handle (the message was received again since) succeeds
        without deleting, as in SQS.
        """
        name = self._name(p)
        receipt = parse_receipt_handle(name, get_str(p, "ReceiptHandle"))
        await self.store.delete(name, [receipt])
        return {}

    async def delete_message_batch(self, p: Mapping[str, Any], host: str) -> dict[str, Any]:
        """DeleteMessageBatch: valid handles are deleted in one store call."""
        name = self._name(p)
        failed, ok, receipts = [], [], []
        for entry in entries(p, "DeleteMessageBatch"):
            try:
                receipt = parse_receipt_handle(name, get_str(entry, "ReceiptHandle"))
            except errors.SqsError as exc:
                failed.append(failure(entry["Id"], exc))
            else:
                receipts.append(receipt)
                ok.append({"Id": entry["Id"]})
        if receipts:
            await self.store.delete(name, receipts)
        else:
            await self.store.get_queue(name)
        return {"Successful": ok, "Failed": failed}

    async def change_message_visibility(self, p: Mapping[str, Any], host: str) -> dict[str, Any]:
        """ChangeMessageVisibility. Raises MessageNotInflight, ReceiptHandleIsInvalid."""
        name = self._name(p)
        await self._change(name, p)
        return {}

    async def change_message_visibility_batch(
        self, p: Mapping[str, Any], host: str
    ) -> dict[str, Any]:
        """ChangeMessageVisibilityBatch; entries fail one by one."""
        name = self._name(p)
        batch = entries(p, "ChangeMessageVisibilityBatch")
        await self.store.get_queue(name)
        ok, failed = [], []
        for entry in batch:
            try:
                await self._change(name, entry)
            except errors.QueueDoesNotExist:
                raise
            except errors.SqsError as exc:
                failed.append(failure(entry["Id"], exc))
            else:
                ok.append({"Id": entry["Id"]})
        return {"Successful": ok, "Failed": failed}

    async def _change(self, name: str, p: Mapping[str, Any]) -> None:
        seq, token = parse_receipt_handle(name, get_str(p, "ReceiptHandle"))
        timeout = get_int(p, "VisibilityTimeout", 0, MAX_VISIBILITY_SECONDS)
        now = self._clock()
        result = await self.store.change_visibility(name, seq, token, now + timeout * 1000, now)
        if result is ChangeResult.NOT_FOUND:
            raise errors.InvalidParameterValue(
                f"Value {p.get('ReceiptHandle')} for parameter ReceiptHandle is invalid. Reason: "
                "Message does not exist or is not available for visibility timeout change."
            )
        if result is ChangeResult.NOT_IN_FLIGHT:
            raise errors.MessageNotInflight(
                "The message is not in flight under this receipt handle."
            )

    # -- helpers -----------------------------------------------------------

    async def _room(self, name: str, count: int, size: int, now: int) -> None:
        """Refuse a send that would pass a bound (see :class:`Bounds`). Raises OverLimit."""
        bounds = self.bounds
        if bounds.max_queue_messages:
            hit = self._depths.get(name)
            depth = hit[1] if hit else 0
            period = (
                BOUND_REFRESH_FAR_MS
                if depth < bounds.max_queue_messages // 2
                else BOUND_REFRESH_NEAR_MS
            )
            if hit is None or now - hit[0] >= period:
                c = await self.store.counts(name, now)
                depth = c.visible + c.in_flight + c.delayed
                self._depths[name] = (now, depth)
            if depth + count > bounds.max_queue_messages:
                raise errors.OverLimit(
                    f"The queue {name} holds its maximum of {bounds.max_queue_messages} messages."
                )
            self._depths[name] = (self._depths[name][0], depth + count)
        if bounds.max_store_bytes:
            used = self._usage[1] if self._usage else 0
            period = (
                BOUND_REFRESH_FAR_MS
                if used < bounds.max_store_bytes // 2
                else BOUND_REFRESH_NEAR_MS
            )
            if self._usage is None or now - self._usage[0] >= period:
                used = await self.store.usage()
                self._usage = (now, used)
            if used + size > bounds.max_store_bytes:
                raise errors.OverLimit(
                    f"The store holds its maximum of {bounds.max_store_bytes} bytes."
                )
            self._usage = (self._usage[0], used + size)

    def _name(self, p: Mapping[str, Any]) -> str:
        """The queue a QueueUrl names. Raises QueueDoesNotExist for a URL of
        another account, of a host this node does not serve, or of no shape
        SQS gives its URLs."""
        url = get_str(p, "QueueUrl")
        # Clients repeat the same few URLs: each is parsed once (bounded, as a
        # client sending ever new URLs must not grow the node).
        name = self._names.get(url)
        if name is not None:
            return name
        name = self._parse_url(url)
        if len(self._names) >= MAX_CACHED_URLS:
            self._names.clear()
        self._names[url] = name
        return name

    def _parse_url(self, url: str) -> str:
        m = _QUEUE_URL.fullmatch(url.strip())
        if (
            m is None
            or m.group(2) != self.account_id
            or (m.group(1) is not None and not self._host_ok(m.group(1)))
            or not (_QUEUE_NAME.fullmatch(m.group(3)) or _FIFO_NAME.fullmatch(m.group(3)))
        ):
            raise errors.QueueDoesNotExist(_NO_QUEUE)
        return m.group(3)

    def _arn(self, name: str) -> str:
        return f"arn:aws:sqs:{self.region}:{self.account_id}:{name}"

    async def _queue(self, name: str, *, fresh: bool = False) -> _Queue:
        now = self._clock()
        hit = self._cache.get(name)
        if hit is not None and not fresh and now - hit[0] < ATTRIBUTE_CACHE_MS:
            return hit[1]
        queue = _Queue.from_record(await self.store.get_queue(name))
        self._cache[name] = (now, queue)
        return queue

    async def _validate_attributes(
        self, given: Mapping[str, str], *, fifo: bool, create: bool
    ) -> dict[str, str]:
        """Attributes as stored; the errors and texts are SQS's."""
        out: dict[str, str] = {}
        for key, value in given.items():
            if key not in _SETTABLE:
                raise errors.InvalidAttributeName(f"Unknown Attribute {key}.")
            if key == "FifoQueue":
                if not create:
                    if not fifo:
                        raise errors.InvalidAttributeName("Unknown Attribute FifoQueue.")
                    raise errors.InvalidAttributeValue(
                        "Invalid value for the parameter FifoQueue. Reason: Modifying queue "
                        "type is not supported."
                    )
            elif not fifo and key == "ContentBasedDeduplication":
                raise errors.InvalidAttributeName(f"Unknown Attribute {key}.")
            elif not fifo and key in _FIFO_ONLY:
                raise errors.InvalidAttributeName(
                    f"You can specify the {key} only when FifoQueue is set to true."
                )
            if key in _INT_ATTRIBUTES:
                lo, hi = _INT_ATTRIBUTES[key]
                number = parse_int(value)
                if number is None or not lo <= number <= hi:
                    raise errors.InvalidAttributeValue(f"Invalid value for the parameter {key}.")
                out[key] = str(number)
            elif key in _BOOL_ATTRIBUTES:
                if value.lower() not in ("true", "false"):
                    raise errors.InvalidAttributeValue(f"Invalid value for the parameter {key}.")
                out[key] = value.lower()
            elif key in _REMOVABLE and value == "":
                out[key] = ""  # removes it (stored empty, never shown)
            elif key in _ENUM_ATTRIBUTES:
                if value not in _ENUM_ATTRIBUTES[key]:
                    raise errors.InvalidAttributeValue(
                        f"Invalid value for the parameter {key}: must be one of "
                        f"{', '.join(_ENUM_ATTRIBUTES[key])}."
                    )
                out[key] = value
            elif key == "RedrivePolicy":
                out[key] = await self._validate_redrive(value, fifo)
            elif key in ("Policy", "RedriveAllowPolicy"):
                out[key] = _json_object(key, value)
            elif value not in _CHOICES.get(key, (value,)) or BAD_BODY_CHAR.search(value):
                raise errors.InvalidAttributeValue(f"Invalid value for the parameter {key}.")
            else:
                out[key] = value
        if fifo and out.get("ReceiveMode") == "lock-free":
            raise errors.InvalidAttributeValue(
                "Invalid value for the parameter ReceiveMode: a FIFO queue receives atomically "
                "(lock-free is for standard queues)."
            )
        return out

    async def _validate_redrive(self, value: str, fifo: bool) -> str:
        def invalid(reason: str) -> errors.SqsError:
            return errors.InvalidParameterValue(
                f"Value {value[:1000]} for parameter RedrivePolicy is invalid. Reason: {reason}"
            )

        try:
            policy = json.loads(value)
        except (ValueError, RecursionError) as exc:
            raise invalid("Redrive policy is not a valid JSON map.") from exc
        if not isinstance(policy, dict):
            raise invalid("Redrive policy is not a valid JSON map.")
        arn, count = policy.get("deadLetterTargetArn"), policy.get("maxReceiveCount")
        if not isinstance(arn, str) or not arn:
            raise invalid(
                "Redrive policy does not contain mandatory attribute: deadLetterTargetArn."
            )
        if count is None:
            raise invalid("Redrive policy does not contain mandatory attribute: maxReceiveCount.")
        max_receives = parse_int(count) if isinstance(count, str) else count
        if (
            isinstance(max_receives, bool)
            or not isinstance(max_receives, int)
            or not (1 <= max_receives <= 1000)
        ):
            raise invalid(
                f"Invalid value for maxReceiveCount: {str(count)[:40]}, valid values are from 1 "
                "to 1000 both inclusive."
            )
        target = self._arn_name(arn)
        try:
            if target is None:
                raise errors.QueueDoesNotExist(arn)
            dlq = _Queue.from_record(await self.store.get_queue(target))
        except errors.QueueDoesNotExist as exc:
            raise invalid("Dead letter target does not exist.") from exc
        if dlq.fifo != fifo:
            raise invalid("Dead-letter queue must be same type of queue as the source.")
        return json.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": max_receives})

    def _arn_name(self, arn: str) -> str | None:
        """The queue name of an SQS ARN of this region and account, else None."""
        parts = arn.split(":")
        if (
            len(parts) != 6
            or parts[:3] != ["arn", "aws", "sqs"]
            or parts[3] != self.region
            or parts[4] != self.account_id
            or not (_QUEUE_NAME.fullmatch(parts[5]) or _FIFO_NAME.fullmatch(parts[5]))
        ):
            return None
        return parts[5]

    def _tags(self, tags: Mapping[str, str]) -> dict[str, str]:
        for key, value in tags.items():
            if not _TAG_KEY.fullmatch(key) or key.lower().startswith("aws:"):
                raise errors.InvalidParameterValue(f"Tag key {key[:130]!r} is invalid.")
            if not _TAG_VALUE.fullmatch(value):
                raise errors.InvalidParameterValue(f"Tag value for key {key[:130]!r} is invalid.")
        if len(tags) > MAX_TAGS:
            raise errors.InvalidParameterValue(
                f"Too many tags: a queue may have at most {MAX_TAGS}."
            )
        return dict(tags)

    # -- tags and permissions -------------------------------------------------

    async def tag_queue(self, p: Mapping[str, Any], host: str) -> dict[str, Any]:
        """TagQueue: add or overwrite tags (at most 50 a queue)."""
        name = self._name(p)
        given = str_map(p, "Tags")
        if "Tags" not in p:
            raise errors.MissingParameter("The request must contain the parameter Tags.")
        record = await self.store.get_queue(name)
        tags = {**_stored_tags(record), **given}
        await self.store.set_attributes(
            name, {TAGS_KEY: json.dumps(self._tags(tags))}, record.modified_at
        )
        return {}

    async def untag_queue(self, p: Mapping[str, Any], host: str) -> dict[str, Any]:
        """UntagQueue: remove the given tag keys (absent ones are ignored)."""
        name = self._name(p)
        keys = str_list(p, "TagKeys")
        if keys is None:
            raise errors.MissingParameter("The request must contain the parameter TagKeys.")
        record = await self.store.get_queue(name)
        tags = {k: v for k, v in _stored_tags(record).items() if k not in keys}
        await self.store.set_attributes(name, {TAGS_KEY: json.dumps(tags)}, record.modified_at)
        return {}

    async def list_queue_tags(self, p: Mapping[str, Any], host: str) -> dict[str, Any]:
        """ListQueueTags."""
        tags = _stored_tags(await self.store.get_queue(self._name(p)))
        return {"Tags": tags} if tags else {}

    async def add_permission(self, p: Mapping[str, Any], host: str) -> dict[str, Any]:
        """AddPermission: a statement in the queue's Policy (stored, not enforced)."""
        name = self._name(p)
        label = get_str(p, "Label")
        accounts = str_list(p, "AWSAccountIds")
        actions = str_list(p, "Actions")
        if accounts is None:
            raise errors.MissingParameter("The request must contain the parameter AWSAccountIds.")
        if actions is None:
            raise errors.MissingParameter("The request must contain the parameter Actions.")
        if not _LABEL.fullmatch(label):
            raise errors.InvalidParameterValue(
                f"Value {label[:100]} for parameter Label is invalid. Reason: Can only include "
                "alphanumeric characters, hyphens, or underscores. 1 to 80 in length."
            )
        if not accounts:
            raise errors.InvalidParameterValue(
                "The request must contain the parameter AWSAccountIds."
            )
        if len(actions) > 7:
            raise errors.OverLimit(f"{len(actions)} Actions were found, maximum allowed is 7.")
        for action in actions:
            if action != "*" and action not in _PERMISSION_ACTIONS:
                raise errors.InvalidParameterValue(
                    f"Value SQS:{action[:64]} for parameter ActionName is invalid. Reason: "
                    "Please refer to the appropriate WSDL for a list of valid actions."
                )
        record = await self.store.get_queue(name)
        policy = _policy(record, self._arn(name))
        if any(st.get("Sid") == label for st in policy["Statement"]):
            raise errors.InvalidParameterValue(
                f"Value {label} for parameter Label is invalid. Reason: Already exists."
            )
        policy["Statement"].append(
            {
                "Sid": label,
                "Effect": "Allow",
                "Principal": {"AWS": [f"arn:aws:iam::{a}:root" for a in accounts]},
                "Action": [f"SQS:{a}" for a in actions],
                "Resource": self._arn(name),
            }
        )
        await self.store.set_attributes(name, {"Policy": json.dumps(policy)}, self._clock())
        self._cache.pop(name, None)
        return {}

    async def remove_permission(self, p: Mapping[str, Any], host: str) -> dict[str, Any]:
        """RemovePermission: drop the statement AddPermission made under Label."""
        name = self._name(p)
        label = get_str(p, "Label")
        record = await self.store.get_queue(name)
        policy = _policy(record, self._arn(name))
        kept = [st for st in policy["Statement"] if st.get("Sid") != label]
        if len(kept) == len(policy["Statement"]):
            raise errors.InvalidParameterValue(
                f"Value {label[:100]} for parameter Label is invalid. Reason: can't find label."
            )
        policy["Statement"] = kept
        await self.store.set_attributes(
            name, {"Policy": json.dumps(policy) if kept else ""}, self._clock()
        )
        self._cache.pop(name, None)
        return {}

    async def list_dead_letter_source_queues(
        self, p: Mapping[str, Any], host: str
    ) -> dict[str, Any]:
        """ListDeadLetterSourceQueues: queues whose RedrivePolicy targets this one."""
        name = self._name(p)
        max_results = opt_int(p, "MaxResults", 1, 1000)
        after = opt_str(p, "NextToken") or ""
        await self.store.get_queue(name)
        sources = [n for n in await self.dead_letter_sources(name) if n > after]
        result: dict[str, Any] = {}
        if max_results is not None and len(sources) > max_results:
            sources = sources[:max_results]
            result["NextToken"] = sources[-1]
        result["queueUrls"] = [queue_url(host, self.account_id, n) for n in sources]
        return result

    async def dead_letter_sources(self, name: str) -> list[str]:
        """Names of the queues that redrive to ``name``, sorted (a scan of all queues)."""
        arn = self._arn(name)
        out = []
        for other in await self.store.list_queues(""):
            try:
                record = await self.store.get_queue(other)
            except errors.QueueDoesNotExist:
                continue
            policy = record.attributes.get("RedrivePolicy")
            if policy and json.loads(policy).get("deadLetterTargetArn") == arn:
                out.append(other)
        return out

    def _new_message(
        self, queue: _Queue, p: Mapping[str, Any], now: int, *, batch: bool = False
    ) -> tuple[NewMessage, dict[str, Any]]:
        body = get_str(p, "MessageBody")
        if not body:
            raise errors.MissingParameter("The request must contain the parameter MessageBody.")
        bad = BAD_BODY_CHAR.search(body)
        if bad:
            raise errors.InvalidMessageContents(
                f"Invalid binary character '#x{ord(bad.group()):x}' was found in the message "
                "body; the set of allowed characters is #x9 | #xA | #xD | #x20 to #xD7FF | "
                "#xE000 to #xFFFD | #x10000 to #x10FFFF."
            )
        attrs = message_attributes(p, "MessageAttributes")
        system = message_attributes(p, "MessageSystemAttributes")
        if set(system) - {"AWSTraceHeader"}:
            raise errors.InvalidParameterValue(
                "Only AWSTraceHeader may be given as a message system attribute."
            )
        size = len(body.encode()) + attributes_size(attrs)
        if size > queue.max_size:
            raise errors.InvalidParameterValue(
                f"One or more parameters {'cannot be validated' if batch else 'are invalid'}. "
                f"Reason: Message must be shorter than {queue.max_size} bytes."
            )
        delay = opt_int(p, "DelaySeconds", 0, MAX_DELAY_SECONDS)
        group = opt_str(p, "MessageGroupId")
        dedup = opt_str(p, "MessageDeduplicationId")
        if queue.fifo:
            if delay is not None:
                raise errors.InvalidParameterValue(
                    f"Value {delay} for parameter DelaySeconds is invalid. Reason: The request "
                    "include parameter that is not valid for this queue type."
                )
            if group is None:
                raise errors.MissingParameter(
                    "The request must contain the parameter MessageGroupId."
                )
            if dedup is None:
                if not queue.content_dedup:
                    raise errors.InvalidParameterValue(_NO_DEDUP)
                dedup = hashlib.sha256(body.encode()).hexdigest()
            for label, value in (("MessageGroupId", group), ("MessageDeduplicationId", dedup)):
                if not _DEDUP_ID.fullmatch(value):
                    raise errors.InvalidParameterValue(
                        f"Value {value[:200]} for parameter {label} is invalid. Reason: {label} "
                        "can only include alphanumeric and punctuation characters. 1 to 128 in "
                        "length."
                    )
        elif dedup is not None:
            raise errors.InvalidParameterValue(
                f"Value {dedup[:200]} for parameter MessageDeduplicationId is invalid. Reason: "
                "The request include parameter that is not valid for this queue type."
            )
        else:
            # A standard queue ignores MessageGroupId (SQS fair queues use it
            # only for scheduling).
            group = None
        visible_at = now + (queue.delay_ms if delay is None else delay * 1000)
        message_id = uuid4_text(self._rng.getrandbits(128))
        data: dict[str, Any] = {"i": message_id, "b": body, "t": now}
        if attrs:
            data["a"] = attrs
        if system:
            data["s"] = system["AWSTraceHeader"].get("StringValue", "")
        if group is not None:
            data["g"] = group
        if dedup is not None:
            data["d"] = dedup
        reply: dict[str, Any] = {"MD5OfMessageBody": md5_of_body(body)}
        if attrs:
            reply["MD5OfMessageAttributes"] = md5_of_message_attributes(attrs)
        if system:
            reply["MD5OfMessageSystemAttributes"] = md5_of_message_attributes(system)
        new = NewMessage(
            message_id=message_id,
            payload=compact_json(data),
            visible_at=visible_at,
            group_id=group,
            dedup_id=dedup,
            dedup_until=now + DEDUP_WINDOW_MS,
        )
        return new, reply
