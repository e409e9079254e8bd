"""NATS through nats-py (asyncio) against a nats-server.

Throughput: plain publish to a subject with one subscriber (NATS core is
at-most-once: a slow consumer's overflow is dropped, and not delivered).
Round trips: the client publishes with its own inbox as the reply subject and
the server publishes each message back to it. The server is
``$CMQ_NATS_URL``, by default ``nats://127.0.0.1:4222``.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any
from urllib.parse import urlsplit

from cmq._extras import unavailable
from cmq.lab.systems import _common
from cmq.lab.systems._common import END, Ready

__all__ = [
    "DATAGRAM",
    "MAX_SIZE",
    "NAME",
    "available",
    "command",
    "pingping_client",
    "pingping_server",
    "pingpong_client",
    "pingpong_server",
    "throughput_receiver",
    "throughput_sender",
]

NAME = "nats"
DATAGRAM = False
MAX_SIZE = 1 << 20  # nats-server's default max_payload

_DEFAULT_URL = "nats://127.0.0.1:4222"
_CHUNK = 256  # publishes between two looks at the clock
_TICK = 0.05  # how often a waiting receiver looks at its idle and deadline clocks


def _url() -> str:
    return _common.server_url("CMQ_NATS_URL", _DEFAULT_URL)


def available() -> str | None:
    """``None`` when nats-py imports and the server answers, else how to get them."""
    missing = unavailable("the NATS peer", "nats")
    if missing is not None:
        return missing
    url = _url()
    parts = urlsplit(url)
    if not _common.reachable(parts.hostname or "127.0.0.1", parts.port or 4222):
        return f"no nats-server at {url}: apt-get install nats-server (or set CMQ_NATS_URL)"
    return None


def command() -> list[str]:
    """The argv that runs one role of this adapter in its own process."""
    return _common.default_command(NAME)


async def _connect(url: str) -> Any:
    import nats

    # No reconnects: a broken connection must end the run, not stall it.
    return await nats.connect(url, allow_reconnect=False, connect_timeout=5)


def _subject() -> str:
    return f"cmq.bench.{uuid.uuid4().hex}"


class _Watch:
    """Counts deliveries; tells when the receiver should stop."""

    def __init__(self, startup: float, idle: float, deadline: float) -> None:
        self.clock = time.monotonic_ns
        self.begin = self.clock()
        self.startup_ns = int(startup * 1e9)
        self.idle_ns = int(idle * 1e9)
        self.stop_at = self.begin + int(deadline * 1e9)
        self.n = 0
        self.first = self.last = 0
        self.ended = False

    def stopped(self) -> str | None:
        """Why to stop now, or ``None`` to go on."""
        now = self.clock()
        if self.ended:
            return "end"
        if now > self.stop_at:
            return "deadline"
        if not self.n and now - self.begin > self.startup_ns:
            return "startup"
        if self.n and now - self.last > self.idle_ns:
            return "idle"
        return None


async def _wait(watch: _Watch) -> str:
    while True:
        why = watch.stopped()
        if why is not None:
            return why
        await asyncio.sleep(_TICK)


def throughput_receiver(
    *,
    ready: Ready,
    size: int,
    bind: str = "127.0.0.1",
    startup: float = 10.0,
    idle: float = 10.0,
    deadline: float = 120.0,
) -> dict[str, Any]:
    """Count messages on a fresh subject until the end marker, an idle gap, or the deadline."""

    async def main() -> dict[str, Any]:
        url = _url()
        nc = await _connect(url)
        subject = _subject()
        watch = _Watch(startup, idle, deadline)
        clock = watch.clock

        async def on_msg(msg: Any) -> None:
            # The callback costs microseconds; a clock read per message is noise.
            if not msg.data:
                watch.ended = True
                return
            watch.last = clock()
            if not watch.n:
                watch.first = watch.last
            watch.n += 1

        await nc.subscribe(subject, cb=on_msg)
        await nc.flush()
        ready({"url": url, "subject": subject})
        stopped = await _wait(watch)
        await nc.close()
        return _common.receiver_result(
            delivered=watch.n, size=size, first_ns=watch.first, last_ns=watch.last, stopped=stopped
        )

    return asyncio.run(main())


def throughput_sender(
    *, peer: dict[str, Any], size: int, count: int | None = None, duration: float | None = None
) -> dict[str, Any]:
    """Publish messages as fast as nats-py takes them."""

    async def main() -> dict[str, Any]:
        import sys

        nc = await _connect(peer["url"])
        subject = peer["subject"]
        publish = nc.publish
        msg = _common.payload(size)
        clock = time.monotonic_ns
        limit = sys.maxsize if count is None else count
        start = clock()
        end_at = sys.maxsize if duration is None else start + int(duration * 1e9)
        sent = 0
        while sent < limit:
            n = min(_CHUNK, limit - sent)
            for _ in range(n):
                await publish(subject, msg)
            sent += n
            if clock() >= end_at:
                break
        end = clock()
        await publish(subject, END)
        await nc.flush()
        await nc.close()
        return _common.sender_result(sent=sent, start_ns=start, end_ns=end, failed=0)

    return asyncio.run(main())


def _serve(ready: Ready, startup: float, idle: float, deadline: float) -> dict[str, Any]:
    async def main() -> dict[str, Any]:
        url = _url()
        nc = await _connect(url)
        subject = _subject()
        watch = _Watch(startup, idle, deadline)
        publish = nc.publish
        clock = watch.clock

        async def on_msg(msg: Any) -> None:
            if not msg.data:
                watch.ended = True
                return
            await publish(msg.reply, msg.data)
            watch.last = clock()
            watch.n += 1

        await nc.subscribe(subject, cb=on_msg)
        await nc.flush()
        ready({"url": url, "subject": subject})
        stopped = await _wait(watch)
        await nc.close()
        return {"echoed": watch.n, "stopped": stopped}

    return asyncio.run(main())


def pingpong_server(
    *,
    ready: Ready,
    size: int,
    bind: str = "127.0.0.1",
    startup: float = 10.0,
    idle: float = 5.0,
    deadline: float = 120.0,
) -> dict[str, Any]:
    """Publish each message back to its reply subject."""
    return _serve(ready, startup, idle, deadline)


pingping_server = pingpong_server


def _client(
    peer: dict[str, Any], size: int, count: int, timeout: float, window: int | None
) -> dict[str, Any]:
    # window None: ping-pong; a number: ping-ping with that many in flight.
    async def main() -> dict[str, Any]:
        import nats.errors

        nc = await _connect(peer["url"])
        subject = peer["subject"]
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)
        await nc.flush()
        publish = nc.publish
        next_msg = sub.next_msg

        async def send(msg: bytes) -> None:
            # No flush(): that is a PING/PONG round trip to the server. The
            # client's flusher task writes the message on the next loop turn.
            await publish(subject, msg, reply=inbox)

        async def recv(left: float) -> bytes | None:
            try:
                msg = await next_msg(timeout=left)
            except nats.errors.TimeoutError:
                return None
            data: bytes = msg.data
            return data

        try:
            if window is None:
                return await _common.pingpong_loop_async(
                    send, recv, size=size, count=count, timeout=timeout
                )
            return await _common.pingping_loop_async(
                send, recv, size=size, count=count, timeout=timeout, window=window
            )
        finally:
            await publish(subject, END)
            await nc.flush()
            await nc.close()

    return asyncio.run(main())


def pingpong_client(
    *, peer: dict[str, Any], size: int, count: int, timeout: float = 0.2
) -> dict[str, Any]:
    """Ping-pong ``count`` messages through the server."""
    return _client(peer, size, count, timeout, None)


def pingping_client(
    *, peer: dict[str, Any], size: int, count: int, timeout: float = 0.2, window: int = 16
) -> dict[str, Any]:
    """Ping-ping ``count`` messages, up to ``window`` in flight."""
    return _client(peer, size, count, timeout, window)
