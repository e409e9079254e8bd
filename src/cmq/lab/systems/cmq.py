"""cmq itself: :class:`cmq.Queue` endpoints over UDP on loopback.

Throughput: the sender pushes as fast as ``push`` returns, through
``Queue.sender(dest)`` (a push bound to the receiver, as the zmq sender's is a
socket connected to its peer); batching per destination and the idle rule
decide the datagrams. The receiver drains with ``pop_many``.
Round trips: the server answers each message with a plain ``push`` to the
sender's address (from ``get_message``), not with ``request``/``reply``, so
the figure is the queue's own, without the correlation envelope.

Every role takes ``options``: :class:`cmq.QueueConfig` fields for both
endpoints (the lab's tuning sweep passes ``qthresh`` and ``timeout``).
"""

from __future__ import annotations

import functools
import time
from typing import Any

import cmq
from cmq.lab.systems import _common
from cmq.lab.systems._common import END, END_REPEAT, Ready

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

NAME = "cmq"
DATAGRAM = True
MAX_SIZE = 16 << 20  # cmq's default max_message: larger messages go as fragments up to it

_POP_LIMIT = 4096  # messages taken per pop_many: bounds the list, not the rate


def available() -> str | None:
    """``None`` when the installed cmq has its queue."""
    if not hasattr(cmq, "Queue"):
        return "this cmq has no Queue yet (the core is not installed)"
    return None


def command() -> list[str]:
    """The argv that runs one role of this adapter in its own process."""
    return _common.default_command(NAME)


#: The delivery of runs that do not choose one: the papers' experiments
#: reproduce the CMQ paper's datagrams (at most once), not cmq's default.
PAPER_DELIVERY = "best-effort"


def _queue(bind: str, options: dict[str, Any] | None) -> Any:
    return cmq.Queue(port=0, host=bind, **{"delivery": PAPER_DELIVERY, **(options or {})})


def _local_for(host: str) -> str:
    # Loopback peers get a loopback socket; any other peer, every interface.
    return "127.0.0.1" if host == "127.0.0.1" else "0.0.0.0"


def _stats(q: Any) -> dict[str, Any]:
    stats: dict[str, Any] = q.stats().as_dict()
    return stats


def throughput_receiver(
    *,
    ready: Ready,
    size: int,
    bind: str = "127.0.0.1",
    startup: float = 10.0,
    idle: float = 1.0,
    deadline: float = 120.0,
    options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Drain messages until the end marker, an idle gap, or the deadline."""
    clock = time.monotonic_ns
    with _queue(bind, options) as q:
        host, port = q.address
        ready({"host": host, "port": port})
        stop_at = clock() + int(deadline * 1e9)
        try:
            msg = q.get(timeout=startup)
        except cmq.Timeout:
            return _common.receiver_result(
                delivered=0, size=size, first_ns=0, last_ns=0, stopped="startup", stats=_stats(q)
            )
        first = last = clock()
        delivered = 0
        stopped = "idle"
        pop_many = q.pop_many
        get = q.get
        got: list[bytes] = [msg]  # never empty at the top of the loop
        while True:
            if not got[-1]:
                # The end marker is the sender's last message (repeated, so
                # several may be here): everything else counts.
                delivered += len(got) - got.count(END)
                last = clock()
                stopped = "end"
                break
            delivered += len(got)
            got = pop_many(_POP_LIMIT)
            if got:
                continue
            # Stamp when the queue runs dry, not per message (as zmq).
            last = clock()
            if last > stop_at:
                stopped = "deadline"
                break
            try:
                got = [get(timeout=idle)]
            except cmq.Timeout:
                break
        return _common.receiver_result(
            delivered=delivered,
            size=size,
            first_ns=first,
            last_ns=last,
            stopped=stopped,
            stats=_stats(q),
        )


def throughput_sender(
    *,
    peer: dict[str, Any],
    size: int,
    count: int | None = None,
    duration: float | None = None,
    options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Push messages as fast as ``push`` returns, then flush and close."""
    dest = (peer["host"], peer["port"])
    with _queue(_local_for(peer["host"]), options) as q:
        result = _common.send_loop(
            q.sender(dest),
            _common.payload(size),
            count=count,
            duration=duration,
            errors=(cmq.CmqError,),
        )
        q.flush()
        push_end(q, dest)
        result["stats"] = _stats(q)
        return result


def push_end(q: Any, dest: Any) -> None:
    """Push the end marker ``END_REPEAT`` times, each in its own datagram:
    one may be dropped by a full receive buffer or a lossy link."""
    for _ in range(END_REPEAT):
        try:
            q.push(dest, END)
            q.flush()
        except cmq.CmqError:
            break


def _echo(
    bind: str,
    ready: Ready,
    startup: float,
    idle: float,
    deadline: float,
    options: dict[str, Any] | None,
) -> dict[str, Any]:
    clock = time.monotonic_ns
    with _queue(bind, options) as q:
        host, port = q.address
        ready({"host": host, "port": port})
        stop_at = clock() + int(deadline * 1e9)
        get_message = q.get_message
        push = q.push
        echoed = 0
        stopped = "idle"
        wait = startup
        while True:
            try:
                m = get_message(timeout=wait)
            except cmq.Timeout:
                break
            if not m.payload:
                stopped = "end"
                break
            try:
                push(m.sender, m.payload)
            except cmq.CmqError:
                pass  # counted in stats(); the client counts the lost round trip
            echoed += 1
            wait = idle
            if clock() > stop_at:
                stopped = "deadline"
                break
        return {"echoed": echoed, "stopped": stopped, "stats": _stats(q)}


def pingpong_server(
    *,
    ready: Ready,
    size: int,
    bind: str = "127.0.0.1",
    startup: float = 10.0,
    idle: float = 5.0,
    deadline: float = 120.0,
    options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Push each message back to its sender until the end marker or an idle gap."""
    return _echo(bind, ready, startup, idle, deadline, options)


pingping_server = pingpong_server


def _client(
    peer: dict[str, Any],
    size: int,
    count: int,
    timeout: float,
    window: int | None,
    options: dict[str, Any] | None,
) -> dict[str, Any]:
    # window None: ping-pong; a number: ping-ping with that many in flight.
    dest = (peer["host"], peer["port"])
    with _queue(_local_for(peer["host"]), options) as q:
        get = q.get
        send = functools.partial(q.push, dest)

        def recv(left: float) -> bytes | None:
            try:
                msg: bytes = get(timeout=left)
            except cmq.Timeout:
                return None
            return msg

        try:
            if window is None:
                result = _common.pingpong_loop(send, recv, size=size, count=count, timeout=timeout)
            else:
                result = _common.pingping_loop(
                    send, recv, size=size, count=count, timeout=timeout, window=window
                )
        finally:
            push_end(q, dest)
        result["stats"] = _stats(q)
        return result


def pingpong_client(
    *,
    peer: dict[str, Any],
    size: int,
    count: int,
    timeout: float = 0.2,
    options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Ping-pong ``count`` messages; a reply later than ``timeout`` s is lost."""
    return _client(peer, size, count, timeout, None, options)


def pingping_client(
    *,
    peer: dict[str, Any],
    size: int,
    count: int,
    timeout: float = 0.2,
    window: int = 16,
    options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Ping-ping ``count`` messages, up to ``window`` in flight."""
    return _client(peer, size, count, timeout, window, options)
