"""ZeroMQ through pyzmq: PUSH/PULL for throughput, REQ/REP for ping-pong,
DEALER/ROUTER for ping-ping, over TCP on loopback.

libzmq batches on its own I/O thread (the ØMQ v0.1 design cmq borrows), so
this is the peer cmq's throughput targets are stated against.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

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

NAME = "zmq"
DATAGRAM = False
MAX_SIZE = 16 << 20

_LINGER_MS = 10_000  # how long close() may wait for queued messages to leave
_CHUNK = 4096  # messages received between two looks at the deadline


def available() -> str | None:
    """``None`` when pyzmq imports, else how to get it."""
    return unavailable("the ZeroMQ peer", "zmq")


def command() -> list[str]:
    """The argv that runs one role of this adapter in its own process."""
    return _common.default_command(NAME)


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def _bind(kind: int, bind: str) -> tuple[Any, dict[str, Any]]:
    import zmq

    sock: Any = zmq.Context.instance().socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(f"tcp://{bind}:*")
    endpoint = sock.getsockopt(zmq.LAST_ENDPOINT).decode()
    host, port = endpoint.rsplit("/", 1)[1].rsplit(":", 1)
    return sock, {"host": host, "port": int(port)}


def _connect(kind: int, peer: dict[str, Any]) -> Any:
    import zmq

    sock: Any = zmq.Context.instance().socket(kind)
    sock.setsockopt(zmq.LINGER, _LINGER_MS)
    sock.connect(f"tcp://{peer['host']}:{peer['port']}")
    return sock


def throughput_receiver(
    *,
    ready: Ready,
    size: int,
    bind: str = "127.0.0.1",
    startup: float = 10.0,
    idle: float = 10.0,
    deadline: float = 120.0,
) -> dict[str, Any]:
    """PULL messages until the end marker, an idle gap, or the deadline."""
    import zmq

    clock = time.monotonic_ns
    sock, info = _bind(zmq.PULL, bind)
    try:
        ready(info)
        stop_at = clock() + int(deadline * 1e9)
        if not sock.poll(_ms(startup)):
            return _common.receiver_result(
                delivered=0, size=size, first_ns=0, last_ns=0, stopped="startup"
            )
        first = last = clock()
        recv = sock.recv
        noblock = zmq.NOBLOCK
        again = zmq.Again
        delivered = 0
        stopped = "idle"
        while True:
            try:
                for _ in range(_CHUNK):
                    if not recv(noblock):
                        last = clock()
                        stopped = "end"
                        break
                    delivered += 1
                else:
                    if clock() > stop_at:
                        stopped = "deadline"
                        break
                    continue
                break
            except again:
                # Stamp when the queue runs dry, not per message: the last
                # stamp before the end is the last delivery, at no cost per
                # message.
                last = clock()
                if last > stop_at:
                    stopped = "deadline"
                    break
                if not sock.poll(_ms(idle)):
                    break
        return _common.receiver_result(
            delivered=delivered, size=size, first_ns=first, last_ns=last, stopped=stopped
        )
    finally:
        sock.close()


def throughput_sender(
    *, peer: dict[str, Any], size: int, count: int | None = None, duration: float | None = None
) -> dict[str, Any]:
    """PUSH messages as fast as pyzmq takes them (blocking at the high-water mark)."""
    import zmq

    sock = _connect(zmq.PUSH, peer)
    try:
        result = _common.send_loop(
            sock.send, _common.payload(size), count=count, duration=duration, errors=(zmq.ZMQError,)
        )
        sock.send(END)
        return result
    finally:
        sock.close()  # lingers until the queued messages have left


def _serve(
    kind: int, bind: str, ready: Ready, startup: float, idle: float, deadline: float
) -> dict[str, Any]:
    import zmq

    clock = time.monotonic_ns
    sock, info = _bind(kind, bind)
    router = kind == zmq.ROUTER
    echoed = 0
    stopped = "idle"
    try:
        sock.setsockopt(zmq.RCVTIMEO, _ms(startup))
        ready(info)
        stop_at = clock() + int(deadline * 1e9)
        while True:
            try:
                if router:
                    frames = sock.recv_multipart()
                    if not frames[-1]:
                        stopped = "end"
                        break
                    sock.send_multipart(frames)
                else:
                    msg = sock.recv()
                    if not msg:
                        stopped = "end"
                        break
                    sock.send(msg)
            except zmq.Again:
                break
            if not echoed:
                sock.setsockopt(zmq.RCVTIMEO, _ms(idle))
            echoed += 1
            if clock() > stop_at:
                stopped = "deadline"
                break
        return {"echoed": echoed, "stopped": stopped}
    finally:
        sock.close()


def pingpong_server(
    *,
    ready: Ready,
    size: int,
    bind: str = "127.0.0.1",
    startup: float = 10.0,
    idle: float = 5.0,
    deadline: float = 120.0,
) -> dict[str, Any]:
    """A REP socket echoing each request."""
    import zmq

    return _serve(zmq.REP, bind, ready, startup, idle, deadline)


def pingping_server(
    *,
    ready: Ready,
    size: int,
    bind: str = "127.0.0.1",
    startup: float = 10.0,
    idle: float = 5.0,
    deadline: float = 120.0,
) -> dict[str, Any]:
    """A ROUTER socket echoing each message to the DEALER it came from."""
    import zmq

    return _serve(zmq.ROUTER, bind, ready, startup, idle, deadline)


def _client(kind: int, peer: dict[str, Any], timeout: float) -> tuple[Any, _common.Recv]:
    import zmq

    sock = _connect(kind, peer)
    if kind == zmq.REQ:
        # A REQ socket whose reply timed out may send again (RELAXED), and
        # drops a late reply to an earlier request (CORRELATE).
        sock.setsockopt(zmq.REQ_RELAXED, 1)
        sock.setsockopt(zmq.REQ_CORRELATE, 1)
    sock.setsockopt(zmq.RCVTIMEO, _ms(timeout))
    recv_raw = sock.recv
    current = [timeout]

    def recv(left: float) -> bytes | None:
        # RCVTIMEO makes a receive one call; reset it only after a loss.
        if abs(left - current[0]) > 0.001:
            sock.setsockopt(zmq.RCVTIMEO, _ms(left))
            current[0] = left
        try:
            msg: bytes = recv_raw()
        except zmq.Again:
            return None
        return msg

    return sock, recv


def _finish(sock: Any) -> None:
    import zmq

    # REQ after a lost reply, or a full queue: the server idles out instead.
    with contextlib.suppress(zmq.ZMQError):
        sock.send(END, zmq.NOBLOCK)
    sock.setsockopt(zmq.LINGER, 1000)
    sock.close()


def pingpong_client(
    *, peer: dict[str, Any], size: int, count: int, timeout: float = 0.2
) -> dict[str, Any]:
    """Ping-pong ``count`` messages through REQ/REP."""
    import zmq

    sock, recv = _client(zmq.REQ, peer, timeout)
    try:
        return _common.pingpong_loop(sock.send, recv, size=size, count=count, timeout=timeout)
    finally:
        _finish(sock)


def pingping_client(
    *, peer: dict[str, Any], size: int, count: int, timeout: float = 0.2, window: int = 16
) -> dict[str, Any]:
    """Ping-ping ``count`` messages through DEALER/ROUTER, up to ``window`` in flight."""
    import zmq

    sock, recv = _client(zmq.DEALER, peer, timeout)
    try:
        return _common.pingping_loop(
            sock.send, recv, size=size, count=count, timeout=timeout, window=window
        )
    finally:
        _finish(sock)
