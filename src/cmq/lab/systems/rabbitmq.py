"""RabbitMQ through pika's BlockingConnection (AMQP 0-9-1).

Throughput: publish to the default exchange, routed to a server-named
exclusive queue the receiver consumes with automatic acknowledgement (no
publisher confirms: the same fire-and-forget as the other systems). Round
trips: the client publishes to the server's queue with RabbitMQ's direct
reply-to (``amq.rabbitmq.reply-to``), the cheapest request/reply it has.
The server is ``$CMQ_AMQP_URL``, by default the guest account on
``amqp://127.0.0.1:5672``.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections import deque
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

NAME = "rabbitmq"
DATAGRAM = False
MAX_SIZE = 16 << 20

_DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"
_REPLY_TO = "amq.rabbitmq.reply-to"
_TICK = 0.05  # longest wait for broker events before looking at the clocks


def _url() -> str:
    return _common.server_url("CMQ_AMQP_URL", _DEFAULT_URL)


def available() -> str | None:
    """``None`` when pika imports and the broker answers, else how to get them."""
    missing = unavailable("the RabbitMQ peer", "pika")
    if missing is not None:
        return missing
    url = _url()
    parts = urlsplit(url)
    if not _common.reachable(parts.hostname or "127.0.0.1", parts.port or 5672):
        shown = url.replace(parts.password or "\0", "***") if parts.password else url
        return f"no RabbitMQ at {shown}: apt-get install rabbitmq-server (or set CMQ_AMQP_URL)"
    return None


def command() -> list[str]:
    """The argv that runs one role of this adapter in its own process."""
    return _common.default_command(NAME)


def _connect(url: str) -> tuple[Any, Any]:
    import pika

    conn = pika.BlockingConnection(pika.URLParameters(url))
    return conn, conn.channel()


def _consume_until(
    conn: Any, startup: float, idle: float, deadline: float, state: dict[str, Any]
) -> str:
    """Dispatch broker events until ``state["ended"]``, an idle gap, or the deadline."""
    clock = time.monotonic_ns
    begin = clock()
    stop_at = begin + int(deadline * 1e9)
    while True:
        conn.process_data_events(time_limit=_TICK)
        now = clock()
        if state["ended"]:
            return "end"
        if now > stop_at:
            return "deadline"
        if not state["n"] and now - begin > startup * 1e9:
            return "startup"
        if state["n"] and now - state["last"] > idle * 1e9:
            return "idle"


def throughput_receiver(
    *,
    ready: Ready,
    size: int,
    bind: str = "127.0.0.1",
    startup: float = 10.0,
    idle: float = 10.0,
    deadline: float = 120.0,
) -> dict[str, Any]:
    """Consume from a fresh exclusive queue until the end marker, an idle gap, or the deadline."""
    url = _url()
    conn, ch = _connect(url)
    try:
        queue = ch.queue_declare(queue="", exclusive=True).method.queue
        clock = time.monotonic_ns
        state: dict[str, Any] = {"n": 0, "first": 0, "last": 0, "ended": False}

        def on_msg(_ch: Any, _method: Any, _props: Any, body: bytes) -> None:
            if not body:
                state["ended"] = True
                return
            state["last"] = clock()
            if not state["n"]:
                state["first"] = state["last"]
            state["n"] += 1

        ch.basic_consume(queue, on_msg, auto_ack=True)
        ready({"url": url, "queue": queue})
        stopped = _consume_until(conn, startup, idle, deadline, state)
        return _common.receiver_result(
            delivered=state["n"],
            size=size,
            first_ns=state["first"],
            last_ns=state["last"],
            stopped=stopped,
        )
    finally:
        with contextlib.suppress(Exception):
            conn.close()


def throughput_sender(
    *, peer: dict[str, Any], size: int, count: int | None = None, duration: float | None = None
) -> dict[str, Any]:
    """Publish messages as fast as pika and the broker's flow control allow."""
    import pika.exceptions

    conn, ch = _connect(peer["url"])
    try:
        send = functools.partial(ch.basic_publish, "", peer["queue"])
        result = _common.send_loop(
            send,
            _common.payload(size),
            count=count,
            duration=duration,
            errors=(pika.exceptions.AMQPError,),
        )
        send(END)
        return result
    finally:
        with contextlib.suppress(Exception):
            conn.close()


def _serve(ready: Ready, startup: float, idle: float, deadline: float) -> dict[str, Any]:
    import pika

    url = _url()
    conn, ch = _connect(url)
    try:
        queue = ch.queue_declare(queue="", exclusive=True).method.queue
        clock = time.monotonic_ns
        state: dict[str, Any] = {"n": 0, "last": 0, "ended": False}
        publish = ch.basic_publish

        def on_msg(_ch: Any, _method: Any, props: Any, body: bytes) -> None:
            if not body:
                state["ended"] = True
                return
            publish("", props.reply_to, body, pika.BasicProperties())
            state["last"] = clock()
            state["n"] += 1

        ch.basic_consume(queue, on_msg, auto_ack=True)
        ready({"url": url, "queue": queue})
        stopped = _consume_until(conn, startup, idle, deadline, state)
        return {"echoed": state["n"], "stopped": stopped}
    finally:
        with contextlib.suppress(Exception):
            conn.close()


def pingpong_server(
    *,
    ready: Ready,
    size: int,
    bind: str = "127.0.0.1",
    startup: float = 10.0,
    idle: float = 5.0,
    deadline: float = 120.0,
) -> dict[str, Any]:
    """Publish each message back to its ``reply_to``."""
    return _serve(ready, startup, idle, deadline)


pingping_server = pingpong_server


def _client(
    peer: dict[str, Any], size: int, count: int, timeout: float, window: int | None
) -> dict[str, Any]:
    # window None: ping-pong; a number: ping-ping with that many in flight.
    import pika

    conn, ch = _connect(peer["url"])
    try:
        replies: deque[bytes] = deque()

        def on_reply(_ch: Any, _method: Any, _props: Any, body: bytes) -> None:
            replies.append(body)

        # Direct reply-to: consume from the pseudo-queue (no-ack) before
        # publishing with it as reply_to, on the same channel.
        ch.basic_consume(_REPLY_TO, on_reply, auto_ack=True)
        props = pika.BasicProperties(reply_to=_REPLY_TO)
        publish = ch.basic_publish
        queue = peer["queue"]
        process = conn.process_data_events
        clock = time.monotonic

        def send(msg: bytes) -> None:
            publish("", queue, msg, props)

        def recv(left: float) -> bytes | None:
            end = clock() + left
            while not replies:
                remaining = end - clock()
                if remaining <= 0:
                    return None
                process(time_limit=remaining)
            return replies.popleft()

        try:
            if window is None:
                return _common.pingpong_loop(send, recv, size=size, count=count, timeout=timeout)
            return _common.pingping_loop(
                send, recv, size=size, count=count, timeout=timeout, window=window
            )
        finally:
            publish("", queue, END, props)
    finally:
        with contextlib.suppress(Exception):
            conn.close()


def pingpong_client(
    *, peer: dict[str, Any], size: int, count: int, timeout: float = 0.2
) -> dict[str, Any]:
    """Ping-pong ``count`` messages through the broker."""
    return _client(peer, size, count, timeout, None)


def pingping_client(
    *, peer: dict[str, Any], size: int, count: int, timeout: float = 0.2, window: int = 16
) -> dict[str, Any]:
    """Ping-ping ``count`` messages, up to ``window`` in flight."""
    return _client(peer, size, count, timeout, window)
