"""What the console reads and changes on a server: one backend per kind.

A :class:`Backend` has one coroutine per thing the pages show or do, and
knows nothing of HTTP. :class:`ServiceBackend` works over a queue service
node (its :class:`~cmq.service.operations.QueueService`, store and
metrics), in the node's own event loop; :class:`BrokerBackend` over a
:class:`~cmq.routing.Broker` in this process, through its lock (it runs in
the console's thread, the broker in its own).

Every refusal is a :class:`Refused` with an HTTP status: the service's
:class:`~cmq.service.errors.SqsError` and the broker's refusals are
translated here, at the edge.
"""

from __future__ import annotations

import abc
import contextlib
import json
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from cmq import __version__
from cmq._errors import CmqError
from cmq.console._model import QueueRates, QueueRow

if TYPE_CHECKING:
    from cmq.routing import Broker
    from cmq.service.app import SqsApp

__all__ = ["PEEK_MAX", "Backend", "BrokerBackend", "Refused", "ServiceBackend"]

#: Messages one peek shows at most.
PEEK_MAX = 100
#: Bytes of a body a peek shows; the rest is cut (and said so).
PEEK_BODY_BYTES = 4096
#: A table sorted by a figure needs every queue's figures (the service reads
#: them from its store, the broker snapshots them under its lock); those
#: rows are reused this long (seconds), so 10,000 queues polled once a
#: second cost one such read every 5 s, not every second.
ALL_ROWS_TTL = 5.0
#: The address the broker sees the console's requests come from.
CONSOLE_SENDER = ("console", 0)


class Refused(CmqError):
    """A console request that cannot be done; ``status`` is its HTTP status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _cut(text: str) -> tuple[str, bool]:
    raw = text.encode("utf-8", "surrogatepass")
    if len(raw) <= PEEK_BODY_BYTES:
        return text, False
    return raw[:PEEK_BODY_BYTES].decode("utf-8", "ignore"), True


class Backend(abc.ABC):
    """The console's view of one server."""

    #: "service" or "broker": which pages and columns apply.
    kind: str = ""

    def __init__(self) -> None:
        self.started = time.time()
        self.rates = QueueRates()

    @abc.abstractmethod
    def totals(self) -> dict[str, int]:
        """Cumulative counters ``in``, ``out``, ``ack`` (messages), cheap to read."""

    @abc.abstractmethod
    async def overview(self) -> dict[str, Any]:
        """Totals, clients, store and its health, version, uptime."""

    @abc.abstractmethod
    async def queue_names(self) -> list[str]:
        """Every queue's name."""

    @abc.abstractmethod
    async def queue_rows(self, names: Sequence[str], *, all_rows: bool) -> list[QueueRow]:
        """The table rows of ``names`` (queues gone meanwhile left out);
        ``all_rows``: these are every queue (a figure sort), may be cached."""

    @abc.abstractmethod
    async def queue(self, name: str, host: str) -> dict[str, Any]:
        """One queue's figures, attributes and what it is bound to. Raises Refused."""

    @abc.abstractmethod
    async def peek(self, name: str, limit: int) -> list[dict[str, Any]]:
        """The queue's first messages, left as they are. Raises Refused."""

    @abc.abstractmethod
    async def send(self, name: str, body: str, host: str) -> dict[str, Any]:
        """Put one test message in the queue. Raises Refused."""

    @abc.abstractmethod
    async def purge(self, name: str, host: str) -> dict[str, Any]:
        """Drop the queue's messages. Raises Refused."""

    async def redrive(self, name: str, host: str) -> dict[str, Any]:
        """Move a dead-letter queue's messages back to their sources. Raises Refused."""
        raise Refused(400, "This server has no redrive.")

    async def exchanges(self) -> list[dict[str, Any]]:
        """Exchanges and their bindings. Raises Refused where there are none."""
        raise Refused(404, "This server has no exchanges.")

    async def route(self, exchange: str, key: str) -> list[str]:
        """The queues a message with ``key`` would reach. Raises Refused."""
        raise Refused(404, "This server has no exchanges.")

    def _common(self) -> dict[str, Any]:
        return {"kind": self.kind, "version": __version__,
                "uptime": round(time.time() - self.started, 1)}  # fmt: skip


# -- the queue service -----------------------------------------------------------


class ServiceBackend(Backend):
    """The console over one ``cmq serve`` node."""

    kind = "service"

    def __init__(self, app: SqsApp, store_name: str) -> None:
        super().__init__()
        self.app = app
        self.store_name = store_name
        self._all: tuple[float, list[QueueRow]] | None = None

    def totals(self) -> dict[str, int]:
        m = self.app.metrics.messages
        return {"in": m["sent"], "out": m["received"], "ack": m["deleted"]}

    async def _call(self, action: str, params: Mapping[str, Any], host: str) -> dict[str, Any]:
        from cmq.service.errors import SqsError

        try:
            return await self.app.service.handle(action, params, host)
        except SqsError as exc:
            raise Refused(404 if exc.type_name.endswith("NonExistentQueue") or
                          "DoesNotExist" in exc.type_name else exc.status, exc.message) from exc  # fmt: skip

    def _url(self, name: str, host: str) -> str:
        from cmq.service.operations import queue_url

        return queue_url(host, self.app.service.account_id, name)

    async def overview(self) -> dict[str, Any]:
        from cmq.service.errors import StoreUnavailable

        out = self._common()
        out["store"] = self.store_name
        try:
            names = await self.app.store.list_queues("")
        except StoreUnavailable as exc:
            out.update(health=f"store unavailable: {exc}", queues=None)
        else:
            out.update(health="ok", queues=len(names))
        m = self.app.metrics
        out["totals"] = {"sent": m.messages["sent"], "received": m.messages["received"],
                         "deleted": m.messages["deleted"],
                         "requests": m.requests_total()}  # fmt: skip
        out["clients"] = None
        return out

    async def queue_names(self) -> list[str]:
        from cmq.service.errors import StoreUnavailable

        try:
            return await self.app.store.list_queues("")
        except StoreUnavailable as exc:
            raise Refused(503, str(exc)) from exc

    async def queue_rows(self, names: Sequence[str], *, all_rows: bool) -> list[QueueRow]:
        from cmq.service.errors import QueueDoesNotExist, StoreUnavailable

        now_s = time.monotonic()
        if all_rows and self._all is not None and now_s - self._all[0] < ALL_ROWS_TTL:
            wanted = set(names)
            return [r for r in self._all[1] if r.name in wanted]
        now = time.time_ns() // 1_000_000
        per = self.app.metrics.queue_messages
        try:
            if len(names) > 1:
                counts = await self.app.store.counts_many(names, now)
            else:
                counts = {}
                for name in names:
                    with contextlib.suppress(QueueDoesNotExist):
                        counts[name] = await self.app.store.counts(name, now)
        except StoreUnavailable as exc:
            raise Refused(503, str(exc)) from exc
        out = []
        for name in names:
            c = counts.get(name)
            if c is None:
                continue
            got = per.get(name)
            r_in, r_out = self.rates.rates(
                name, now_s, got["sent"] if got else 0, got["received"] if got else 0
            )
            out.append(QueueRow(name=name, depth=c.visible, in_flight=c.in_flight,
                                delayed=c.delayed, rate_in=r_in, rate_out=r_out))  # fmt: skip
        if all_rows:
            self._all = (now_s, out)
            self.rates.forget_except(names)
        return out

    async def queue(self, name: str, host: str) -> dict[str, Any]:
        url = self._url(name, host)
        attrs = (await self._call("GetQueueAttributes", {"QueueUrl": url, "AttributeNames": ["All"]},
                                  host)).get("Attributes", {})  # fmt: skip
        sources = await self.app.service.dead_letter_sources(name)
        tasks: list[Any] = []
        if sources:
            got = await self._call("ListMessageMoveTasks", {"SourceArn": attrs.get("QueueArn", "")}, host)
            tasks = got.get("Results", [])
        rows = await self.queue_rows([name], all_rows=False)
        return {
            "name": name,
            "url": url,
            "row": rows[0].as_dict() if rows else None,
            "attributes": attrs,
            "fifo": name.endswith(".fifo"),
            "dead_letter_sources": sources,
            "move_tasks": tasks,
            "can_redrive": bool(sources),
        }

    async def peek(self, name: str, limit: int) -> list[dict[str, Any]]:
        from cmq.service.errors import QueueDoesNotExist, SqsError

        try:
            got = await self.app.store.browse(name, min(limit, PEEK_MAX))
        except QueueDoesNotExist as exc:
            raise Refused(404, f"There is no queue {name!r}.") from exc
        except SqsError as exc:
            raise Refused(exc.status, exc.message) from exc
        now = time.time_ns() // 1_000_000
        out = []
        for b in got:
            data = json.loads(b.payload)
            body, cut = _cut(data.get("b", ""))
            state = "visible" if b.visible_at <= now else "in flight" if b.receive_count else "delayed"
            out.append({
                "id": data.get("i"), "body": body, "truncated": cut, "sent": data.get("t"),
                "state": state, "receive_count": b.receive_count,
                "attributes": sorted(data.get("a") or {}), "group": data.get("g"),
                "dead_letter_source": data.get("o"),
            })  # fmt: skip
        return out

    async def send(self, name: str, body: str, host: str) -> dict[str, Any]:
        params: dict[str, Any] = {"QueueUrl": self._url(name, host), "MessageBody": body}
        if name.endswith(".fifo"):
            params.update(MessageGroupId="console", MessageDeduplicationId=uuid.uuid4().hex)
        got = await self._call("SendMessage", params, host)
        self.app.metrics.count_messages("SendMessage", name, got)
        return {"message_id": got.get("MessageId")}

    async def purge(self, name: str, host: str) -> dict[str, Any]:
        await self._call("PurgeQueue", {"QueueUrl": self._url(name, host)}, host)
        return {"purged": True}

    async def redrive(self, name: str, host: str) -> dict[str, Any]:
        arn = self.app.service._arn(name)
        if not await self.app.service.dead_letter_sources(name):
            raise Refused(400, f"No queue sends its dead letters to {name!r}: nothing to redrive to.")
        got = await self._call("StartMessageMoveTask", {"SourceArn": arn}, host)
        return {"task": got.get("TaskHandle")}


# -- the broker --------------------------------------------------------------------


def _show_body(body: Any) -> str:
    if isinstance(body, bytes):
        return body.decode("utf-8", "backslashreplace")
    if isinstance(body, str):
        return body
    return json.dumps(body, default=repr)


class BrokerBackend(Backend):
    """The console over a :class:`~cmq.routing.Broker` in this process."""

    kind = "broker"

    def __init__(self, broker: Broker, store_name: str) -> None:
        super().__init__()
        self.broker = broker
        self.store_name = store_name
        self._all: tuple[float, list[QueueRow]] | None = None

    def _summary(self) -> Any:
        # Never every queue's snapshot: with 10,000 queues that holds the
        # broker's lock for a tenth of a second.
        return self.broker.inspect(lambda core: core.stats(per_queue=False))

    def totals(self) -> dict[str, int]:
        s = self._summary()
        return {"in": s.published, "out": s.delivered, "ack": s.acked}

    def _refused(self, exc: Exception) -> Refused:
        from cmq.routing._protocol import ErrorCode

        code = getattr(exc, "code", "")
        return Refused(404 if code == ErrorCode.NOT_FOUND else 400, str(exc))

    async def overview(self) -> dict[str, Any]:
        s = self._summary()
        out = self._common()
        amqp = self.broker.amqp_address
        host, port = self.broker.address
        out.update(
            store=self.store_name,
            health="ok",
            queues=s.queues,
            exchanges=s.exchanges,
            clients=s.consumers,
            listen=f"udp {host}:{port}" + (f", amqp {amqp[0]}:{amqp[1]}" if amqp else ""),
            totals={"published": s.published, "delivered": s.delivered, "acked": s.acked,
                    "unroutable": s.unroutable, "dead_lettered": s.dead_lettered,
                    "dropped": s.dropped_old + s.rejected + s.expired},
        )
        return out

    async def queue_names(self) -> list[str]:
        return self.broker.inspect(lambda core: core.queue_names())

    async def queue_rows(self, names: Sequence[str], *, all_rows: bool) -> list[QueueRow]:
        now = time.monotonic()
        if all_rows and self._all is not None and now - self._all[0] < ALL_ROWS_TTL:
            wanted = set(names)
            return [r for r in self._all[1] if r.name in wanted]
        out = []
        for q in self.broker.inspect(lambda core: core.queue_stats(names)):
            r_in, r_out = self.rates.rates(q.name, now, q.enqueued, q.delivered)
            out.append(QueueRow(name=q.name, depth=q.ready, in_flight=q.unacked,
                                consumers=q.consumers, rate_in=r_in, rate_out=r_out))  # fmt: skip
        if all_rows:
            self._all = (now, out)
            self.rates.forget_except(names)
        return out

    async def queue(self, name: str, host: str) -> dict[str, Any]:
        details = self.broker.inspect(lambda core: core.queue_details(name))
        stats = next(iter(self.broker.inspect(lambda core: core.queue_stats([name]))), None)
        if details is None or stats is None:
            raise Refused(404, f"There is no queue {name!r}.")
        rows = await self.queue_rows([name], all_rows=False)
        figures = {k: getattr(stats, k) for k in stats.__dataclass_fields__}
        attributes = {
            "durable": details["durable"],
            "exclusive": details["exclusive"],
            "auto_delete": details["auto_delete"],
            "max_length": details["max_length"],
            "overflow": details["overflow"],
            "message_ttl": stats.message_ttl,
            "dead_letter_exchange": stats.dead_letter_exchange,
            "dead_letter_routing_key": stats.dead_letter_routing_key,
        }
        return {
            "name": name,
            "row": rows[0].as_dict() if rows else None,
            "attributes": attributes,
            "figures": figures,
            "bindings": [{"exchange": e, "key": k} for e, k in details["bindings"]],
            "can_redrive": False,
        }

    async def peek(self, name: str, limit: int) -> list[dict[str, Any]]:
        got = self.broker.inspect(lambda core: core.peek(name, min(limit, PEEK_MAX)))
        if got is None:
            raise Refused(404, f"There is no queue {name!r}.")
        out = []
        for m in got:
            body, cut = _cut(_show_body(m["body"]))
            out.append({
                "exchange": m["exchange"], "routing_key": m["routing_key"], "body": body,
                "truncated": cut, "redelivered": m["redelivered"],
                "dead_lettered_from": [q for q, _ in m["deaths"]],
            })  # fmt: skip
        return out

    async def send(self, name: str, body: str, host: str) -> dict[str, Any]:
        from cmq.routing._core import Refused as CoreRefused
        from cmq.routing._protocol import Publish

        if self.broker.inspect(lambda core: core.queue_details(name)) is None:
            raise Refused(404, f"There is no queue {name!r}.")
        try:
            got = self.broker.call(Publish(rid=0, exchange="", routing_key=name, body=body),
                                   CONSOLE_SENDER)  # fmt: skip
        except CoreRefused as exc:
            raise self._refused(exc) from exc
        return {"routed": got.get("routed", 0)}

    async def purge(self, name: str, host: str) -> dict[str, Any]:
        from cmq.routing._core import Refused as CoreRefused
        from cmq.routing._protocol import PurgeQueue

        try:
            got = self.broker.call(PurgeQueue(rid=0, name=name), CONSOLE_SENDER)
        except CoreRefused as exc:
            raise self._refused(exc) from exc
        return {"purged": True, "messages": got.get("messages", 0)}

    async def exchanges(self) -> list[dict[str, Any]]:
        got = self.broker.inspect(lambda core: core.exchanges_info())
        return [
            {**e, "bindings": [{"queue": q, "key": k} for q, k in e["bindings"]]} for e in got
        ]

    async def route(self, exchange: str, key: str) -> list[str]:
        got = self.broker.inspect(lambda core: core.route_preview(exchange, key))
        if got is None:
            raise Refused(404, f"There is no exchange {exchange!r}.")
        return got
