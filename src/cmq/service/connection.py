"""The HTTP connection of a node: uvicorn's httptools protocol with bounds.

uvicorn bounds neither the size nor the number of request headers under
httptools, and times out only idle keep-alive connections: one client
sending a 128 MB header, or opening connections and never finishing a
request, holds the event loop or its memory. This protocol adds three rules
(:class:`HttpLimits`):

- the request head (request line and headers) may take at most
  ``max_header_bytes``: counted on the bytes fed to the parser while the head
  is incomplete, so nothing near a huge header is ever buffered; over it, 431;
- at most ``max_headers`` header fields; over it, 431;
- a request must be complete (head and body) within ``request_timeout``
  seconds of its first byte, and a new connection must start one within that
  time; otherwise 408 (or, mid-body, the connection is closed).

The limits are read from the app (``app.limits``), so worker processes that
rebuild the app from the config get the same ones.

It also writes each response in one ``write``: uvicorn writes the status line
and headers as soon as the app starts the response, and the body in a second
write, so every reply cost two send system calls and two TCP segments (and
the client two reads). :class:`_OneWrite` holds the head until the body comes.

And it answers SQS requests directly, without ASGI. An app with an
``answer_directly(scope, body)`` coroutine and a ``takes_directly(scope)``
test (:class:`~cmq.service.app.SqsApp`) gets each request those fit, once
its whole body is in: an HTTP/1.1 request with a Content-Length of at most
:data:`DIRECT_BODY_BYTES`, no ``Expect: 100-continue``, no upgrade, none
still being answered before it on the connection. The coroutine returns the
status, headers and body, which leave in one write with the headers uvicorn
adds (``date``, ``server``, ``connection: close`` when the connection ends).
The ASGI cycle of every request (a scope's receive and send closures, three
message dicts, an Event, uvicorn's checks of the app's headers) was about a
third of the event loop's Python per SQS request. Everything else (the
console, /metrics, large or chunked bodies, pipelined requests behind one
under way) still goes through ASGI, and the answers are byte for byte the
same either way.
"""

from __future__ import annotations

import asyncio
import urllib.parse
from dataclasses import dataclass
from typing import Any

from cmq._errors import ConfigError
from cmq._extras import optional_imports

with optional_imports("the queue service"):
    import httptools
    from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

__all__ = [
    "DEFAULT_MAX_HEADERS",
    "DEFAULT_MAX_HEADER_BYTES",
    "DEFAULT_REQUEST_TIMEOUT",
    "DIRECT_BODY_BYTES",
    "EdgeHttpProtocol",
    "HttpLimits",
]

#: AWS SDK requests carry about 1 KiB of headers (a SigV4 signature included);
#: 64 KiB leaves room for proxies' additions and refuses the absurd at once.
DEFAULT_MAX_HEADER_BYTES = 64 * 1024
#: SDKs send about ten header fields.
DEFAULT_MAX_HEADERS = 100
#: A 1 MiB batch over a slow link still arrives in well under 30 s; a client
#: that has not finished by then is stuck or hostile.
DEFAULT_REQUEST_TIMEOUT = 30.0
#: Bodies up to this size are answered directly (module doc): an SQS call is
#: usually well under it; a larger one goes through ASGI, whose flow control
#: pauses reading past uvicorn's own 64 KiB high-water mark.
DIRECT_BODY_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class HttpLimits:
    """Bounds on one HTTP request (see module doc)."""

    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES
    """Bytes of request line plus headers."""
    max_headers: int = DEFAULT_MAX_HEADERS
    """Header fields per request."""
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT
    """Seconds from a request's first byte (or a connection's opening) to its end."""

    def __post_init__(self) -> None:
        if self.max_header_bytes < 1024:
            raise ConfigError("max_header_bytes must be at least 1024")
        if self.max_headers < 8:
            raise ConfigError("max_headers must be at least 8")
        if not self.request_timeout > 0:
            raise ConfigError("request_timeout must be > 0 seconds")


class _HeadTooLarge(Exception):
    pass


def _response(status: int, reason: str, text: str) -> bytes:
    body = text.encode()
    return (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: text/plain; charset=utf-8\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    ).encode() + body


class _OneWrite:
    """The transport as one response's cycle sees it: the head, written when
    the response starts, is held and written with the first body write (or
    when the transport closes). Writes before the response starts (a
    ``100 Continue``) pass at once, as does everything else."""

    __slots__ = ("_cycle", "_head", "_state", "_transport")

    def __init__(self, transport: asyncio.Transport, cycle: Any) -> None:
        self._transport = transport
        self._cycle = cycle
        self._head = b""
        self._state = 0  # 0: before the head, 1: head held, 2: head written

    def write(self, data: bytes) -> None:
        if self._state == 0 and self._cycle.response_started:
            self._head, self._state = data, 1
            return
        if self._state == 1:
            data, self._head, self._state = self._head + data, b"", 2
        self._transport.write(data)

    def close(self) -> None:
        if self._state == 1:
            self._transport.write(self._head)
            self._head, self._state = b"", 2
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class _NoEvent:
    """What uvicorn sets on a lost connection's cycle: nothing waits on it."""

    __slots__ = ()

    def set(self) -> None:
        pass


class _DirectCycle:
    """A directly answered request, as uvicorn's connection code sees it
    (``self.cycle``): while it is under way, a request pipelined behind it
    is queued, a lost connection marks it ``disconnected`` and a server
    shutting down turns its ``keep_alive`` off."""

    __slots__ = ("disconnected", "keep_alive", "response_complete")
    message_event = _NoEvent()

    def __init__(self, keep_alive: bool) -> None:
        self.keep_alive = keep_alive
        self.disconnected = False
        self.response_complete = False


_INTERNAL_ERROR = (
    500,
    [
        (b"content-type", b"text/plain; charset=utf-8"),
        (b"content-length", b"21"),
        (b"connection", b"close"),
    ],
    b"Internal Server Error",
)


class EdgeHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with :class:`HttpLimits` enforced."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        limits = getattr(self.app, "limits", None)
        self.limits = limits if isinstance(limits, HttpLimits) else HttpLimits()
        self._in_head = True
        self._head_bytes = 0
        self._heads_done = 0
        self._too_large = ""
        # When the request under way began (None between requests), and the
        # one timer that checks it. A finished request leaves the timer to
        # fire harmlessly rather than cancel it: one timer per request
        # timeout, not two heap operations per request.
        self._started: float | None = None
        self._deadline: asyncio.TimerHandle | None = None
        # Direct answers (module doc): the app's two entry points, and the
        # body chunks of the request being read (None: not a direct one).
        answer = getattr(self.app, "answer_directly", None)
        takes = getattr(self.app, "takes_directly", None)
        self._direct = (answer, takes) if answer is not None and takes is not None else None
        self._body: list[bytes] | None = None

    def _arm(self) -> None:
        if self._started is None:
            self._started = self.loop.time()
        if self._deadline is None:
            self._deadline = self.loop.call_at(
                self._started + self.limits.request_timeout, self._expired
            )

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _refuse(self, status: int, reason: str, text: str) -> None:
        self._disarm()
        if not self.transport.is_closing():
            self.transport.write(_response(status, reason, text))
            self.transport.close()

    def _expired(self) -> None:
        self._deadline = None
        if self._started is None:
            return  # between requests: the keep-alive timeout's business
        if self._started + self.limits.request_timeout > self.loop.time():
            self._arm()  # a later request than the one this timer was set for
            return
        if self._in_head:
            self._refuse(408, "Request Timeout", "The request was not completed in time.\n")
        elif not self.transport.is_closing():
            # Mid-body: the app is waiting for the rest; closing ends it.
            self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self._unset_keepalive_if_required()
        if self._started is None or self._deadline is None:
            self._arm()
        heads_before, was_in_head = self._heads_done, self._in_head
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._refuse(400, "Bad Request", "Protocol upgrades are not supported.\n")
            return
        except httptools.HttpParserError:
            if self._too_large:
                self._refuse(431, "Request Header Fields Too Large", self._too_large)
            else:
                self._refuse(400, "Bad Request", "Invalid HTTP request received.\n")
            return
        if self._heads_done != heads_before or not was_in_head:
            # A head ended, or one began after a body in this chunk: count
            # from the next chunk (at most one chunk uncounted).
            self._head_bytes = 0
        elif self._in_head:
            self._head_bytes += len(data)
            if self._head_bytes > self.limits.max_header_bytes:
                self._refuse(
                    431,
                    "Request Header Fields Too Large",
                    f"The request head is over {self.limits.max_header_bytes} bytes.\n",
                )

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._heads_done += 1
        # Counted here, not per header: the byte bound already caps memory.
        if len(self.headers) > self.limits.max_headers:
            self._too_large = f"The request has over {self.limits.max_headers} header fields.\n"
            raise _HeadTooLarge
        if self._direct is not None and self._takes_directly():
            return
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and cycle.transport is self.transport:  # a new cycle
            cycle.transport = _OneWrite(self.transport, cycle)  # type: ignore[assignment]

    def _takes_directly(self) -> bool:
        """Whether the request whose head just ended is answered directly;
        if so, its scope is filled in as uvicorn fills it."""
        assert self._direct is not None
        parser = self.parser
        cycle = self.cycle
        if (
            (cycle is not None and not cycle.response_complete)
            or self.expect_100_continue
            or self.limit_concurrency is not None
            or parser.get_http_version() != "1.1"
            or parser.should_upgrade()
        ):
            return False
        length = None
        for name, value in self.headers:
            if name == b"content-length":
                length = value
            elif name == b"transfer-encoding":
                return False
        if (
            length is None
            or not length.isdigit()
            or len(length) > 9  # int() of thousands of digits raises
            or int(length) > DIRECT_BODY_BYTES
        ):
            return False
        scope = self.scope
        scope["method"] = parser.get_method().decode("ascii")
        parsed = httptools.parse_url(self.url)
        raw_path = parsed.path
        path = raw_path.decode("ascii")
        if "%" in path:
            path = urllib.parse.unquote(path)
        scope["path"] = self.root_path + path
        scope["raw_path"] = self.root_path.encode("ascii") + raw_path
        scope["query_string"] = parsed.query or b""
        if not self._direct[1](scope):
            return False
        self.cycle = _DirectCycle(parser.should_keep_alive())  # type: ignore[assignment]
        self._body = []
        return True

    def on_body(self, body: bytes) -> None:
        if self._body is not None:
            self._body.append(body)
        else:
            super().on_body(body)

    def on_message_complete(self) -> None:
        self._in_head = True
        self._started = None
        if self._body is None:
            super().on_message_complete()
            return
        body, self._body = b"".join(self._body), None
        task = self.loop.create_task(self._answer(self.cycle, self.scope, body))  # type: ignore[arg-type]
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)

    async def _answer(self, cycle: _DirectCycle, scope: dict[str, Any], body: bytes) -> None:
        assert self._direct is not None
        failed = False
        try:
            status, headers, payload = await self._direct[0](scope, body)
        except Exception as exc:  # as uvicorn answers an app that raised
            self.logger.error("Exception in ASGI application\n", exc_info=exc)
            status, headers, payload = _INTERNAL_ERROR  # with its own "connection: close"
            failed = True
        # Read after the answer: a server shutting down meanwhile turns it off.
        keep_alive = cycle.keep_alive and not failed
        cycle.response_complete = True
        if cycle.disconnected:
            return
        out = [STATUS_LINE[status]]
        for name, value in (*self.server_state.default_headers, *headers):
            out += (name, b": ", value, b"\r\n")
        if not keep_alive and not failed:
            out.append(b"connection: close\r\n")
        out += (b"\r\n", payload)
        self.transport.write(b"".join(out))
        if not keep_alive:
            self.transport.close()
        self.on_response_complete()
