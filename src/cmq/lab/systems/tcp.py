"""Raw TCP: length-prefixed messages (4-byte big-endian length), TCP_NODELAY.

One ``sendall`` per message, like the UDP baseline's one datagram per
message; the receiver reads large chunks into one reused buffer and cuts
them into messages, which is what any reasonable TCP framing does. With
TCP_NODELAY the kernel sends each message at once (no Nagle delay), but may
still coalesce segments when the sender outruns the link.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import time
from typing import Any

from cmq.lab.systems import _common
from cmq.lab.systems._common import Ready

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

NAME = "tcp"
DATAGRAM = False
MAX_SIZE = 16 << 20  # the same bound as cmq's default largest message

_LEN = struct.Struct(">I")
_END_FRAME = _LEN.pack(0)  # the empty message: the end marker
_CHUNK = 1 << 20


def available() -> str | None:
    """Raw sockets are always there."""
    return None


def command() -> list[str]:
    """The argv that runs one role of this adapter in its own process."""
    return _common.default_command(NAME)


def _frame(msg: bytes) -> bytes:
    return _LEN.pack(len(msg)) + msg


class _Framer:
    """Cuts a byte stream into length-prefixed messages, in one reused buffer."""

    def __init__(self, conn: socket.socket, largest: int) -> None:
        self.conn = conn
        self.buf = bytearray(max(_CHUNK, 2 * (largest + _LEN.size)))
        self.view = memoryview(self.buf)
        self.start = 0  # first unparsed byte
        self.end = 0  # one past the last received byte

    def fill(self) -> int:
        """Receive more bytes; 0 at end of stream. Raises BlockingIOError on timeout."""
        if self.start:
            # Move the partial message to the front so the buffer never grows.
            pending = self.end - self.start
            self.buf[:pending] = self.buf[self.start : self.end]
            self.start, self.end = 0, pending
        n = self.conn.recv_into(self.view[self.end :])
        self.end += n
        return n

    def next(self) -> bytes | None:
        """The next complete message in the buffer, or ``None``."""
        if self.end - self.start < _LEN.size:
            return None
        (length,) = _LEN.unpack_from(self.buf, self.start)
        stop = self.start + _LEN.size + length
        if stop > self.end:
            return None
        msg = bytes(self.view[self.start + _LEN.size : stop])
        self.start = stop
        return msg

    def count(self) -> tuple[int, bool]:
        """Skip every complete message in the buffer: (how many, end marker seen)."""
        buf, unpack, n, pos, end = self.buf, _LEN.unpack_from, 0, self.start, self.end
        while end - pos >= 4:
            (length,) = unpack(buf, pos)
            if pos + 4 + length > end:
                break
            pos += 4 + length
            if not length:
                self.start = pos
                return n, True
            n += 1
        self.start = pos
        return n, False


def _accept(bind: str, ready: Ready, startup: float) -> socket.socket:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((bind, 0))
        listener.listen(1)
        listener.settimeout(startup)
        host, port = listener.getsockname()
        ready({"host": host, "port": port})
        conn, _ = listener.accept()
    conn.settimeout(None)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return conn


def _connect(peer: dict[str, Any]) -> socket.socket:
    sock = socket.create_connection((peer["host"], peer["port"]), timeout=10)
    sock.settimeout(None)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
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
    """Count messages until the end marker, end of stream, an idle gap, or the deadline."""
    clock = time.monotonic_ns
    stop_at = clock() + int(deadline * 1e9)
    try:
        conn = _accept(bind, ready, startup)
    except TimeoutError:
        return _common.receiver_result(
            delivered=0, size=size, first_ns=0, last_ns=0, stopped="startup"
        )
    with conn:
        _common.set_rcvtimeo(conn, idle)
        framer = _Framer(conn, size)
        delivered = first = last = 0
        stopped = "idle"
        try:
            while True:
                if not framer.fill():
                    stopped = "eof"
                    break
                n, ended = framer.count()
                if n:
                    # One clock read per recv call, not per message.
                    last = clock()
                    if not delivered:
                        first = last
                    delivered += n
                if ended:
                    stopped = "end"
                    break
                if last > stop_at:
                    stopped = "deadline"
                    break
        except BlockingIOError:
            pass
        return _common.receiver_result(
            delivered=delivered, size=size, first_ns=first, last_ns=last, stopped=stopped
        )


def throughput_sender(
    *, peer: dict[str, Any], size: int, count: int | None = None, duration: float | None = None
) -> dict[str, Any]:
    """Send length-prefixed messages, one ``sendall`` each, as fast as TCP takes them."""
    with _connect(peer) as sock:
        result = _common.send_loop(
            sock.sendall, _frame(_common.payload(size)), count=count, duration=duration
        )
        sock.sendall(_END_FRAME)
        return result


def _echo(
    bind: str, ready: Ready, size: int, startup: float, idle: float, deadline: float
) -> dict[str, Any]:
    clock = time.monotonic_ns
    stop_at = clock() + int(deadline * 1e9)
    try:
        conn = _accept(bind, ready, startup)
    except TimeoutError:
        return {"echoed": 0, "stopped": "startup"}
    echoed = 0
    stopped = "idle"
    with conn:
        _common.set_rcvtimeo(conn, idle)
        framer = _Framer(conn, size)
        sendall = conn.sendall
        try:
            while True:
                if not framer.fill():
                    stopped = "eof"
                    break
                msg = framer.next()
                while msg is not None:
                    if not msg:
                        return {"echoed": echoed, "stopped": "end"}
                    sendall(_frame(msg))  # one send per message, as the client does
                    echoed += 1
                    msg = framer.next()
                if clock() > stop_at:
                    stopped = "deadline"
                    break
        except (BlockingIOError, ConnectionError):
            pass
    return {"echoed": echoed, "stopped": stopped}


def pingpong_server(
    *,
    ready: Ready,
    size: int,
    bind: str = "127.0.0.1",
    startup: float = 10.0,
    idle: float = 5.0,
    deadline: float = 120.0,
) -> dict[str, Any]:
    """Echo each message back on the connection until the end marker or an idle gap."""
    return _echo(bind, ready, size, startup, idle, deadline)


pingping_server = pingpong_server


def _client(peer: dict[str, Any], timeout: float, size: int) -> tuple[socket.socket, _common.Recv]:
    sock = _connect(peer)
    _common.set_rcvtimeo(sock, timeout)
    framer = _Framer(sock, size)
    current = [timeout]

    def recv(left: float) -> bytes | None:
        msg = framer.next()
        while msg is None:
            # As in the UDP adapter: touch the kernel timeout only after a loss.
            if abs(left - current[0]) > 0.001:
                _common.set_rcvtimeo(sock, left)
                current[0] = left
            try:
                if not framer.fill():
                    return None
            except BlockingIOError:
                return None
            msg = framer.next()
        return msg

    return sock, recv


def _finish(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # the server may be gone already
        sock.sendall(_END_FRAME)
    sock.close()


def pingpong_client(
    *, peer: dict[str, Any], size: int, count: int, timeout: float = 0.2
) -> dict[str, Any]:
    """Ping-pong ``count`` messages over one connection."""
    sock, recv = _client(peer, timeout, size)
    send = sock.sendall
    try:
        return _common.pingpong_loop(
            lambda m: send(_frame(m)), recv, size=size, count=count, timeout=timeout
        )
    finally:
        _finish(sock)


def pingping_client(
    *, peer: dict[str, Any], size: int, count: int, timeout: float = 0.2, window: int = 16
) -> dict[str, Any]:
    """Ping-ping ``count`` messages, up to ``window`` in flight."""
    sock, recv = _client(peer, timeout, size)
    send = sock.sendall
    try:
        return _common.pingping_loop(
            lambda m: send(_frame(m)), recv, size=size, count=count, timeout=timeout, window=window
        )
    finally:
        _finish(sock)
