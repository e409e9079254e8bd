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
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from cmq._errors import ConfigError
from cmq._extras import optional_imports

with optional_imports("the queue service"):
    import httptools
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = [
    "DEFAULT_MAX_HEADERS",
    "DEFAULT_MAX_HEADER_BYTES",
    "DEFAULT_REQUEST_TIMEOUT",
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
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and cycle.transport is self.transport:  # a new cycle
            cycle.transport = _OneWrite(self.transport, cycle)  # type: ignore[assignment]

    def on_message_complete(self) -> None:
        self._in_head = True
        self._started = None
        super().on_message_complete()
