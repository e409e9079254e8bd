"""Raw UDP sockets, one message per datagram: the unbatched baseline.

As lean as Python allows, so that it is a fair floor for cmq: connected
sockets (``send``, not ``sendto``), ``recv_into`` one reused buffer, and
kernel receive timeouts (SO_RCVTIMEO) so a receive is one syscall.
"""

from __future__ import annotations

import socket
import time
from typing import Any

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

NAME = "udp"
DATAGRAM = True
MAX_SIZE = 65507  # 65535 - 8 (UDP header) - 20 (IPv4 header)

# Ask for a 4 MiB receive buffer; the kernel caps it at net.core.rmem_max. A
# bigger buffer only absorbs bursts, it does not raise the steady drain rate.
_RCVBUF = 4 << 20
_BUF = 1 << 16


def available() -> str | None:
    """Raw sockets are always there."""
    return None


def command() -> list[str]:
    """The argv that runs one role of this adapter in its own process."""
    return _common.default_command(NAME)


def _listen(bind: str) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _RCVBUF)
    sock.bind((bind, 0))
    return sock


def _connect(peer: dict[str, Any]) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _RCVBUF)
    sock.connect((peer["host"], peer["port"]))
    return sock


def throughput_receiver(
    *,
    ready: Ready,
    size: int,
    bind: str = "127.0.0.1",
    startup: float = 10.0,
    idle: float = 1.0,
    deadline: float = 120.0,
) -> dict[str, Any]:
    """Count datagrams until the end marker, an idle gap, or the deadline."""
    clock = time.monotonic_ns
    with _listen(bind) as sock:
        host, port = sock.getsockname()
        buf = bytearray(_BUF)
        recv_into = sock.recv_into
        _common.set_rcvtimeo(sock, startup)
        ready({"host": host, "port": port})
        delivered = first = last = 0
        stop_at = clock() + int(deadline * 1e9)
        stopped = "startup"
        try:
            n = recv_into(buf)
        except BlockingIOError:
            return _common.receiver_result(
                delivered=0, size=size, first_ns=0, last_ns=0, stopped=stopped
            )
        first = last = clock()
        _common.set_rcvtimeo(sock, idle)
        stopped = "idle"
        try:
            while n:
                delivered += 1
                last = clock()  # a clock read is ~2% of a recv syscall
                if last > stop_at:
                    stopped = "deadline"
                    break
                n = recv_into(buf)
            else:
                stopped = "end"
        except BlockingIOError:
            pass
        return _common.receiver_result(
            delivered=delivered, size=size, first_ns=first, last_ns=last, stopped=stopped
        )


def throughput_sender(
    *, peer: dict[str, Any], size: int, count: int | None = None, duration: float | None = None
) -> dict[str, Any]:
    """Send datagrams of ``size`` bytes as fast as the socket takes them."""
    with _connect(peer) as sock:
        # ECONNREFUSED (the receiver went away) and ENOBUFS are failed sends.
        result = _common.send_loop(sock.send, _common.payload(size), count=count, duration=duration)
        for _ in range(END_REPEAT):
            try:
                sock.send(END)
            except OSError:
                break
        return result


def _echo(bind: str, ready: Ready, startup: float, idle: float, deadline: float) -> dict[str, Any]:
    clock = time.monotonic_ns
    with _listen(bind) as sock:
        host, port = sock.getsockname()
        buf = bytearray(_BUF)
        view = memoryview(buf)
        recvfrom_into = sock.recvfrom_into
        sendto = sock.sendto
        _common.set_rcvtimeo(sock, startup)
        ready({"host": host, "port": port})
        echoed = 0
        stop_at = clock() + int(deadline * 1e9)
        stopped = "idle"
        try:
            while True:
                n, addr = recvfrom_into(buf)
                if not n:
                    stopped = "end"
                    break
                try:
                    sendto(view[:n], addr)
                except OSError:
                    pass  # the client is gone; its lost round trip is counted there
                if echoed == 0:
                    _common.set_rcvtimeo(sock, idle)
                echoed += 1
                if clock() > stop_at:
                    stopped = "deadline"
                    break
        except BlockingIOError:
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
    """Echo each datagram to its sender until the end marker or an idle gap."""
    return _echo(bind, ready, startup, idle, deadline)


pingping_server = pingpong_server


def _client(peer: dict[str, Any], timeout: float) -> tuple[socket.socket, _common.Recv]:
    sock = _connect(peer)
    _common.set_rcvtimeo(sock, timeout)
    buf = bytearray(_BUF)
    recv_into = sock.recv_into
    current = [timeout]

    def recv(left: float) -> bytes | None:
        # The kernel timeout stays as it is while it is within 1 ms of what
        # is asked: on a lossless run that is every call, so a receive is
        # one syscall; after a loss it is reset to the time left.
        if abs(left - current[0]) > 0.001:
            _common.set_rcvtimeo(sock, left)
            current[0] = left
        try:
            n = recv_into(buf)
        except (BlockingIOError, ConnectionRefusedError):
            return None
        return bytes(buf[:n])

    return sock, recv


def _finish(sock: socket.socket) -> None:
    for _ in range(END_REPEAT):
        try:
            sock.send(END)
        except OSError:
            break
    sock.close()


def pingpong_client(
    *, peer: dict[str, Any], size: int, count: int, timeout: float = 0.2
) -> dict[str, Any]:
    """Ping-pong ``count`` datagrams; a reply later than ``timeout`` s is lost."""
    sock, recv = _client(peer, timeout)
    try:
        return _common.pingpong_loop(sock.send, recv, size=size, count=count, timeout=timeout)
    finally:
        _finish(sock)


def pingping_client(
    *, peer: dict[str, Any], size: int, count: int, timeout: float = 0.2, window: int = 16
) -> dict[str, Any]:
    """Ping-ping ``count`` datagrams, up to ``window`` in flight."""
    sock, recv = _client(peer, timeout)
    try:
        return _common.pingping_loop(
            sock.send, recv, size=size, count=count, timeout=timeout, window=window
        )
    finally:
        _finish(sock)
