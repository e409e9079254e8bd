"""What every system adapter shares: payloads, the round-trip loops, the worker.

This module uses the standard library only and imports nothing from cmq, so
that an adapter running under another interpreter (msgpack-rpc's own virtual
environment, which cannot install cmq next to its old msgpack) can import it by
path.

Conventions every adapter follows (see :mod:`cmq.lab.systems`):

- Times are ``time.monotonic_ns()``: CLOCK_MONOTONIC on Linux, one clock for
  every process, so stamps taken in two processes can be compared.
- Sizes are at least 1 byte, so the empty message is free to be the end marker
  (:data:`END`) a sender or client sends when it is done.
- A round-trip payload starts with its sequence number (4 bytes, big-endian)
  when it is at least 4 bytes long, so a late reply to a lost round trip is
  never taken for the reply to the current one.
"""

from __future__ import annotations

import json
import os
import resource
import struct
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable
from types import ModuleType
from typing import Any

__all__ = [
    "END",
    "END_REPEAT",
    "ARecv",
    "ASend",
    "Ready",
    "Recv",
    "Send",
    "default_command",
    "numbered",
    "payload",
    "pingping_loop",
    "pingping_loop_async",
    "pingpong_loop",
    "pingpong_loop_async",
    "reachable",
    "receiver_result",
    "send_loop",
    "sender_result",
    "seq_of",
    "server_url",
    "set_rcvtimeo",
    "worker_main",
]

END = b""
"""The end marker: an empty message (payloads are never empty)."""

END_REPEAT = 3
"""How often a datagram-based sender repeats :data:`END`: one copy may be
dropped by a full receive buffer; if all are, the receiver's idle gap ends it."""

_SEQ = struct.Struct(">I")
_SEQ_MASK = 0xFFFFFFFF

Ready = Callable[[dict[str, Any]], None]
"""Called by a receiver or server once it listens, with what a peer needs to
reach it (for example ``{"host": ..., "port": ...}``)."""

Send = Callable[[bytes], object]
"""Sends one message to the peer."""

Recv = Callable[[float], "bytes | None"]
"""Waits at most the given seconds for one message; ``None`` when none came."""


def payload(size: int) -> bytes:
    """A throughput payload of ``size`` bytes (never the end marker)."""
    return b"x" * size


def numbered(seq: int, size: int) -> bytes:
    """A round-trip payload of ``size`` bytes carrying ``seq`` when it fits."""
    if size < _SEQ.size:
        return b"x" * size
    return _SEQ.pack(seq & _SEQ_MASK) + b"x" * (size - _SEQ.size)


def seq_of(msg: bytes) -> int | None:
    """The sequence number a round-trip payload carries, or ``None``."""
    if len(msg) < _SEQ.size:
        return None
    seq: int = _SEQ.unpack_from(msg)[0]
    return seq


def _maxrss_kb() -> int:
    # ru_maxrss is in KiB on Linux; the peak is what a memory claim is about.
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def receiver_result(
    *, delivered: int, size: int, first_ns: int, last_ns: int, stopped: str, **extra: Any
) -> dict[str, Any]:
    """What a throughput receiver reports: counts, first and last delivery."""
    return {
        "delivered": delivered,
        "bytes": delivered * size,
        "first_ns": first_ns,
        "last_ns": last_ns,
        "stopped": stopped,
        "maxrss_kb": _maxrss_kb(),
        **extra,
    }


def sender_result(*, sent: int, start_ns: int, end_ns: int, **extra: Any) -> dict[str, Any]:
    """What a throughput sender reports: messages handed to the system."""
    return {"sent": sent, "start_ns": start_ns, "end_ns": end_ns, **extra}


def pingpong_loop(
    send: Send, recv: Recv, *, size: int, count: int, timeout: float
) -> dict[str, Any]:
    """Intel MPI Benchmarks style ping-pong: the next message after the reply.

    A round trip whose reply does not come within ``timeout`` seconds is lost
    (``recv_ns`` is -1) and the next one starts: lost round trips are counted,
    never waited out. A reply that comes back from a receive that overran the
    timeout is lost too, and counted as ``late``: the rule is the same for
    every system, however exactly its receive honours a timeout. Replies that
    carry another sequence number (late replies to lost round trips) are
    counted as ``stale`` and skipped.
    """
    clock = time.monotonic_ns
    timeout_ns = int(timeout * 1e9)
    send_ns = [0] * count
    recv_ns = [-1] * count
    stale = late = 0
    for seq in range(count):
        msg = numbered(seq, size)
        want = seq & _SEQ_MASK
        t0 = clock()
        send(msg)
        send_ns[seq] = t0
        deadline = t0 + timeout_ns
        while True:
            left = deadline - clock()
            if left <= 0:
                break
            reply = recv(left / 1e9)
            if reply is None:
                break
            t1 = clock()
            got = seq_of(reply)
            if got is None or got == want:
                if t1 > deadline:
                    late += 1  # a receive that overran its timeout: lost all the same
                else:
                    recv_ns[seq] = t1
                break
            stale += 1
    return {"send_ns": send_ns, "recv_ns": recv_ns, "stale": stale, "late": late}


class _PingPingBook:
    """The bookkeeping of a ping-ping run, without I/O (shared by both loops).

    Up to ``window`` messages are in flight; each one's latency is its own
    send-to-reply time. A message whose reply has not come ``timeout`` seconds
    after it was sent is lost (``recv_ns`` -1) and frees its slot; a reply that
    comes later still is counted as ``late``, not as delivered.
    """

    def __init__(self, *, size: int, count: int, timeout: float, window: int) -> None:
        _check_pingping(size, count, window)
        self.size = size
        self.count = count
        self.window = window
        self.timeout_ns = int(timeout * 1e9)
        self.send_ns = [0] * count
        self.recv_ns = [-1] * count
        self.expired = [False] * count
        self.in_order: deque[int] = deque()  # sent, not yet answered or expired, oldest first
        self.inflight = 0
        self.next_seq = 0
        self.stale = 0
        self.late = 0

    def running(self) -> bool:
        return self.next_seq < self.count or self.inflight > 0

    def next_message(self, clock: Callable[[], int]) -> bytes | None:
        """The next message to send now, stamped with ``clock()``; None if the window is full."""
        if self.next_seq >= self.count or self.inflight >= self.window:
            return None
        seq = self.next_seq
        msg = numbered(seq, self.size)
        self.send_ns[seq] = clock()
        self.in_order.append(seq)
        self.inflight += 1
        self.next_seq += 1
        return msg

    def wait_for(self, now_ns: int) -> float | None:
        """Seconds to wait for the oldest reply, or None to go round again (after expiring it)."""
        in_order = self.in_order
        while in_order and self.recv_ns[in_order[0]] >= 0:
            in_order.popleft()
        if not in_order:
            return None
        oldest = in_order[0]
        left = self.send_ns[oldest] + self.timeout_ns - now_ns
        if left <= 0:
            in_order.popleft()
            self.expired[oldest] = True
            self.inflight -= 1
            return None
        return left / 1e9

    def reply(self, reply: bytes, t1: int) -> None:
        """Account for a reply received at ``t1``."""
        got = seq_of(reply)
        if got is None or not 0 <= got < self.next_seq or self.recv_ns[got] >= 0:
            self.stale += 1
        elif self.expired[got] or t1 - self.send_ns[got] > self.timeout_ns:
            self.late += 1
            if not self.expired[got]:
                self.expired[got] = True
                self.inflight -= 1
        else:
            self.recv_ns[got] = t1
            self.inflight -= 1

    def result(self) -> dict[str, Any]:
        return {"send_ns": self.send_ns, "recv_ns": self.recv_ns, "stale": self.stale, "late": self.late}


def pingping_loop(
    send: Send, recv: Recv, *, size: int, count: int, timeout: float, window: int
) -> dict[str, Any]:
    """Asynchronous ping-ping: the next message goes before the reply comes.

    The rules are :class:`_PingPingBook`'s.
    """
    clock = time.monotonic_ns
    book = _PingPingBook(size=size, count=count, timeout=timeout, window=window)
    while book.running():
        while (msg := book.next_message(clock)) is not None:
            send(msg)
        left = book.wait_for(clock())
        if left is None:
            continue
        reply = recv(left)
        if reply is not None:
            book.reply(reply, clock())
    return book.result()


ARecv = Callable[[float], Awaitable["bytes | None"]]
"""The asyncio form of :data:`Recv`."""

ASend = Callable[[bytes], Awaitable[object]]
"""The asyncio form of :data:`Send`."""


async def pingpong_loop_async(
    send: ASend, recv: ARecv, *, size: int, count: int, timeout: float
) -> dict[str, Any]:
    """:func:`pingpong_loop` for asyncio clients (the same rules, line for line)."""
    clock = time.monotonic_ns
    timeout_ns = int(timeout * 1e9)
    send_ns = [0] * count
    recv_ns = [-1] * count
    stale = late = 0
    for seq in range(count):
        msg = numbered(seq, size)
        want = seq & _SEQ_MASK
        t0 = clock()
        await send(msg)
        send_ns[seq] = t0
        deadline = t0 + timeout_ns
        while True:
            left = deadline - clock()
            if left <= 0:
                break
            reply = await recv(left / 1e9)
            if reply is None:
                break
            t1 = clock()
            got = seq_of(reply)
            if got is None or got == want:
                if t1 > deadline:
                    late += 1  # a receive that overran its timeout: lost all the same
                else:
                    recv_ns[seq] = t1
                break
            stale += 1
    return {"send_ns": send_ns, "recv_ns": recv_ns, "stale": stale, "late": late}


async def pingping_loop_async(
    send: ASend, recv: ARecv, *, size: int, count: int, timeout: float, window: int
) -> dict[str, Any]:
    """:func:`pingping_loop` for asyncio clients (the same :class:`_PingPingBook`)."""
    clock = time.monotonic_ns
    book = _PingPingBook(size=size, count=count, timeout=timeout, window=window)
    while book.running():
        while (msg := book.next_message(clock)) is not None:
            await send(msg)
        left = book.wait_for(clock())
        if left is None:
            continue
        reply = await recv(left)
        if reply is not None:
            book.reply(reply, clock())
    return book.result()


def _check_pingping(size: int, count: int, window: int) -> None:
    if size < _SEQ.size:
        raise ValueError(f"ping-ping needs messages of at least {_SEQ.size} bytes to number them")
    if window < 1:
        raise ValueError("window must be at least 1")
    if count > _SEQ_MASK:
        raise ValueError("ping-ping numbers messages with 32 bits: count must be below 2**32")


_CHUNK = 256  # messages between two looks at the clock: a clock read per message costs ~5%


def send_loop(
    send: Callable[[bytes], object],
    msg: bytes,
    *,
    count: int | None,
    duration: float | None,
    errors: tuple[type[BaseException], ...] = (OSError,),
) -> dict[str, Any]:
    """Call ``send(msg)`` as fast as possible, ``count`` times or for ``duration`` s.

    ``send`` is a bound method (``sock.send``), called directly in the loop so
    the loop adds nothing to the system's own cost. A call that raises one of
    ``errors`` is counted as ``failed``, not as sent. With both limits, the
    first one reached stops the loop.
    """
    if count is None and duration is None:
        raise ValueError("give count or duration")
    clock = time.monotonic_ns
    limit = sys.maxsize if count is None else count
    start = clock()
    end_at = sys.maxsize if duration is None else start + int(duration * 1e9)
    done = failed = 0
    while done < limit:
        n = min(_CHUNK, limit - done)
        for _ in range(n):
            try:
                send(msg)
            except errors:
                failed += 1
        done += n
        if clock() >= end_at:
            break
    return sender_result(sent=done - failed, start_ns=start, end_ns=clock(), failed=failed)


def server_url(env: str, default: str) -> str:
    """The URL in environment variable ``env``, else ``default``."""
    return os.environ.get(env) or default


def reachable(host: str, port: int, timeout: float = 0.5) -> bool:
    """Whether a TCP connection to ``host:port`` opens within ``timeout`` s."""
    import socket

    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def default_command(name: str) -> list[str]:
    """The argv that runs a role of adapter ``name`` with this interpreter."""
    return [sys.executable, "-m", "cmq.lab.systems", name]


def set_rcvtimeo(sock: Any, seconds: float) -> None:
    """Give a blocking socket a kernel receive timeout (SO_RCVTIMEO).

    One syscall per receive, where Python's own ``settimeout`` makes two
    (poll, then recv): the raw baselines must not pay for Python's layer.
    A receive that times out raises ``BlockingIOError``.
    """
    import socket

    sec = int(seconds)
    usec = max(1, int((seconds - sec) * 1e6)) if sec == 0 else int((seconds - sec) * 1e6)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", sec, usec))


def _pin(cpu: int | None) -> None:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})


def worker_main(module: ModuleType, argv: list[str]) -> int:
    """Run one role of an adapter in this process: ``ROLE JSON_PARAMS``.

    The protocol with :mod:`cmq.lab.runner` is three kinds of stdout lines:
    ``READY {json}`` once a receiver or server listens, ``RESULT {json}`` at
    the end; anything else on stdout is ignored. Errors go to stderr with a
    non-zero exit code. Parameters ``cpu`` (pin to that CPU first) and
    ``peer_on_stdin`` (read the ``peer`` parameter as one JSON line from
    stdin before starting) are handled here, the rest go to the role's
    function as keyword arguments.
    """
    if len(argv) != 2:
        print("usage: ROLE JSON_PARAMS", file=sys.stderr)
        return 2
    role, raw = argv
    params: dict[str, Any] = json.loads(raw)
    _pin(params.pop("cpu", None))
    if params.pop("peer_on_stdin", False):
        # Started before its peer listened (the runner overlaps the two
        # start-ups): the peer's READY comes as one JSON line on stdin.
        line = sys.stdin.readline()
        if not line:
            print("no peer on stdin", file=sys.stderr)
            return 2
        params["peer"] = json.loads(line)
    func = getattr(module, role, None)
    if role not in _ROLES or func is None:
        print(f"unknown role {role!r}", file=sys.stderr)
        return 2
    out = sys.stdout

    def ready(info: dict[str, Any]) -> None:
        out.write("READY " + json.dumps(info) + "\n")
        out.flush()

    if role in _SERVER_ROLES:
        params["ready"] = ready
    # The CPU this role used (every thread of the process), from its start
    # to its result: a receiver's wait for the first message costs none.
    cpu0 = time.process_time_ns()
    result = func(**params)
    if isinstance(result, dict):
        result.setdefault("cpu_ns", time.process_time_ns() - cpu0)
    out.write("RESULT " + json.dumps(result) + "\n")
    out.flush()
    return 0


_SERVER_ROLES = frozenset({"throughput_receiver", "pingpong_server", "pingping_server"})
_ROLES = _SERVER_ROLES | {"throughput_sender", "pingpong_client", "pingping_client"}
