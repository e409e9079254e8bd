"""The HTTP edge: an ASGI application served by uvicorn.

``POST /`` speaks the SQS JSON protocol (:mod:`cmq.service.protocol`) and,
for a form body without ``X-Amz-Target``, the older query protocol
(:mod:`cmq.service.query_protocol`, XML replies);
``GET /metrics`` the Prometheus text format, ``GET /health`` answers ``ok``,
and ``/console`` is the management console (:mod:`cmq.console`).
This is the only place where errors become HTTP responses: an
:class:`~cmq.service.errors.SqsError` becomes its SQS error shape, anything
else a 500 ``InternalError`` (logged), and the node keeps serving.

The app is a bare ASGI callable rather than a Starlette router: one route
carries all the load and a router's per-request objects cost a measurable
share of a cycle on two cores. For the same reason the node's HTTP
connection (:mod:`cmq.service.connection`) hands most SQS requests to
:meth:`SqsApp.answer_directly` with their whole body, without ASGI's
per-request messages; the answer is the same either way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any

from cmq.service import errors
from cmq.service.config import MAX_REQUEST_BYTES
from cmq.service.connection import HttpLimits
from cmq.service.edge import EdgePolicy
from cmq.service.metrics import MESSAGE_OPS, Metrics
from cmq.service.model import QueueCounts
from cmq.service.operations import Bounds, QueueService
from cmq.service.protocol import decode_request, encode_error, encode_result
from cmq.service.query_protocol import (
    FORM_CONTENT_TYPE,
    decode_form,
    encode_xml_error,
    encode_xml_result,
)
from cmq.service.store.base import Store

if TYPE_CHECKING:
    from cmq.console import ConsoleApp

__all__ = ["CONSOLE_TOKEN_ENV", "SqsApp"]

#: The console's CSRF token shared by the worker processes of one node.
CONSOLE_TOKEN_ENV = "CMQ_CONSOLE_TOKEN"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_log = logging.getLogger("cmq.service")
#: Queues whose depths one /metrics scrape reports at most.
MAX_METRIC_QUEUES = 1000


def _header(scope: Scope, name: bytes) -> str | None:
    for k, v in scope["headers"]:
        if k == name:
            return str(v.decode("latin-1"))
    return None


def _is_form(scope: Scope) -> bool:
    """A query-protocol request, which may address its queue by the path."""
    return any(
        k == b"content-type" and v.startswith(FORM_CONTENT_TYPE.encode())
        for k, v in scope["headers"]
    )


class SqsApp:
    """ASGI app of one node over ``store``."""

    def __init__(
        self,
        store: Store,
        *,
        region: str = "us-east-1",
        account_id: str = "000000000000",
        max_request_bytes: int = MAX_REQUEST_BYTES,
        policy: EdgePolicy | None = None,
        limits: HttpLimits | None = None,
        bounds: Bounds | None = None,
        console: bool = True,
        store_name: str = "",
    ) -> None:
        self.store = store
        #: Host, Origin and authentication rules (:mod:`cmq.service.edge`).
        self.policy = policy or EdgePolicy()
        #: Read by :class:`~cmq.service.connection.EdgeHttpProtocol`.
        self.limits = limits or HttpLimits()
        self.service = QueueService(
            store,
            region=region,
            account_id=account_id,
            host_ok=self.policy.accepts_host,
            bounds=bounds,
        )
        #: Why the store did not open at startup, if it did not.
        self.startup_error: str | None = None
        self.metrics = Metrics()
        self.max_request_bytes = max_request_bytes
        #: The management console under /console (None: not served).
        self.console: ConsoleApp | None = None
        if console:
            from cmq.console import Access, ConsoleApp, ServiceBackend

            keys = self.policy.keys
            self.console = ConsoleApp(
                ServiceBackend(self, store_name or type(store).__name__),
                policy=self.policy,
                access=Access.keys(
                    dict(keys) if keys is not None else None,
                    allow_remote=self.policy.allow_remote_unsigned,
                ),
                # Set by `cmq serve --workers N` so that a page served by one
                # worker may post to another.
                csrf_token=os.environ.get(CONSOLE_TOKEN_ENV),
            )
        self._console_task: asyncio.Task[None] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            await self._http(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.store.open()
                except Exception as exc:  # noqa: BLE001 - reported to uvicorn, which exits
                    self.startup_error = str(exc) or type(exc).__name__
                    await send({"type": "lifespan.startup.failed", "message": ""})
                    return
                if self.console is not None:
                    self._console_task = asyncio.get_running_loop().create_task(
                        self.console.run_sampler()
                    )
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self._console_task is not None:
                    self._console_task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await self._console_task
                await self.store.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    def _is_console(self, path: str) -> bool:
        return self.console is not None and (path == "/console" or path.startswith("/console/"))

    def takes_directly(self, scope: Scope) -> bool:
        """Whether a request (its head) is an SQS request, which
        :meth:`answer_directly` may answer instead of the ASGI app."""
        path = scope["path"]
        return (
            scope["method"] == "POST"
            and (path == "/" or _is_form(scope))
            and not self._is_console(path)
        )

    async def answer_directly(self, scope: Scope, body: bytes) -> tuple[int, list[Any], bytes]:
        """Status, headers and body of the answer to an SQS request whose
        whole ``body`` has been read (:meth:`takes_directly`)."""
        return await self._sqs(scope, None, body)

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.console is not None and self._is_console(scope["path"]):
            await self.console(scope, receive, send)
            return
        if self.takes_directly(scope):
            status, headers, body = await self._sqs(scope, receive)
        else:
            method, path = scope["method"], scope["path"]
            host = _header(scope, b"host")
            try:
                self.policy.check_host(host)
            except errors.SqsError as exc:
                status, headers, body = encode_error(exc)
            else:
                if path == "/metrics" and method == "GET":
                    body = (await self._render_metrics()).encode()
                    status, headers = 200, [(b"content-type", b"text/plain; version=0.0.4")]
                elif path == "/health" and method == "GET":
                    status, headers, body = 200, [(b"content-type", b"text/plain")], b"ok\n"
                else:
                    status, headers, body = encode_error(
                        errors.InvalidAction(
                            f"No route {method} {path[:100]}; SQS requests are POST /."
                        )
                    )
                    status = 404
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def _sqs(
        self, scope: Scope, receive: Receive | None, body: bytes | None = None
    ) -> tuple[int, list[Any], bytes]:
        """Answer an SQS request; its body is read with ``receive`` unless given."""
        start = time.perf_counter()
        target = host = origin = fetch_site = None
        length = 0
        form = False
        for key, value in scope["headers"]:
            if key == b"x-amz-target":
                target = value.decode("latin-1")
            elif key == b"host":
                host = value.decode("latin-1")
            elif key == b"content-length":
                length = int(value) if value.isdigit() and len(value) < 20 else 0
            elif key == b"content-type":
                form = value.startswith(FORM_CONTENT_TYPE.encode())
            elif key == b"origin":
                origin = value.decode("latin-1")
            elif key == b"sec-fetch-site":
                fetch_site = value.decode("latin-1")
        # The query protocol (older SDKs): a form without X-Amz-Target.
        form = form and target is None
        encode_err = encode_xml_error if form else encode_error
        action = "unknown"
        try:
            # Who may ask comes first: nothing of a refused request is read.
            self.policy.check_host(host)
            self.policy.check_origin(origin, fetch_site, host)
            if length > self.max_request_bytes:
                raise errors.RequestTooLarge(
                    f"The request body has {length} bytes; the limit is {self.max_request_bytes}."
                )
            if body is None:
                assert receive is not None
                body = await self._read_body(receive)
            client = scope.get("client")
            self.policy.check_client(
                client=client[0] if client else None,
                method=scope["method"],
                raw_path=scope.get("raw_path") or scope["path"].encode(),
                query=scope.get("query_string", b""),
                headers=scope["headers"],
                body=body,
                now=time.time(),
            )
            request = decode_form(body, scope["path"]) if form else decode_request(target, body)
            action = request.action
            result = await self.service.handle(
                request.action, request.params, host or f"{scope['server'][0]}:{scope['server'][1]}"
            )
            reply = encode_xml_result(action, result) if form else encode_result(result)
            code = None
            if action in MESSAGE_OPS:
                url = request.params.get("QueueUrl")
                queue = url.rpartition("/")[2] if isinstance(url, str) else None
                self.metrics.count_messages(action, queue, result)
        except errors.SqsError as exc:
            reply = encode_err(exc)
            code = exc.type_name
        except Exception:  # noqa: BLE001 - the edge: a bug is a 500, never a dead node
            _log.exception("internal error in %s", action)
            reply = encode_err(errors.SqsError("The service met an internal error."))
            code = "InternalError"
        self.metrics.observe(action, time.perf_counter() - start, code)
        return reply

    async def _read_body(self, receive: Receive) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                raise errors.SerializationError("The client went away mid-request.")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_request_bytes:
                raise errors.RequestTooLarge(
                    f"The request body is over the limit of {self.max_request_bytes} bytes."
                )
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def _render_metrics(self) -> str:
        queues: dict[str, QueueCounts] = {}
        now = time.time_ns() // 1_000_000
        try:
            for name in (await self.store.list_queues(""))[:MAX_METRIC_QUEUES]:
                try:
                    queues[name] = await self.store.counts(name, now)
                except errors.QueueDoesNotExist:
                    continue  # deleted between list and count
        except errors.StoreUnavailable:
            _log.warning("store unavailable while scraping queue depths")
        return self.metrics.render(queues)
