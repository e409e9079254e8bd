"""The AMQP 0-9-1 listener: :class:`AmqpConnection` objects on real TCP sockets.

Theory of operation
-------------------
One thread, one ``selectors`` loop: it accepts connections, reads what each
socket has, feeds it to that connection's sans-IO object, fires their timers
(heartbeats, handshake and close timeouts) and writes what they produce. A
socket that cannot take everything keeps the rest in its own buffer and is
watched for writability until it is drained.

The broker's core is shared with the cmq-protocol loop (``Broker``), so
every turn that touches it holds the broker's lock, and what the core then
wants sent is split by destination: messages for an AMQP channel (addresses
``("amqp#N", channel)``) go to that connection here, the others to the UDP
endpoint through ``send_udp``. The UDP loop hands this thread the core's
messages for AMQP channels through :meth:`AmqpListener.post`, which wakes the
selector through a socket pair.

TLS (``tls_port`` with an ``ssl.SSLContext``): a second listening socket in
the same loop, whose connections are wrapped on accept and shake hands
without blocking the loop (a client that never finishes its handshake holds
only its own socket, and is dropped after ``_HANDSHAKE_TIMEOUT``). After the
handshake a TLS connection is served as a plain one, a turn reading record
after record while its socket has more.

After a turn that read frames, the next turn polls its sockets for up to
``BrokerConfig.spin`` (yielding the CPU between polls) before it blocks in
``select``, as the UDP loop does (see ``cmq.routing._server``): in a
request/response the next frame most often comes within that time, and a
listener asleep pays a process wake-up for it. With one CPU it never polls.

Flow control (RabbitMQ's memory alarm). After each turn that read something,
the bytes the broker holds (``BrokerCore.held_bytes``) are compared with
``BrokerConfig.memory_budget``. Over it, every connection that has published
is *paused*: its socket is no longer read, so TCP pushes back on the
publisher (its send buffer fills and its writes block), nothing is buffered
here beyond the one read that crossed the budget, and a client that asked for
it is sent connection.blocked. Consumers' connections are still read, so
their acks can bring the broker back under the budget; under 90% of it, the
paused connections are read again (connection.unblocked).
"""

from __future__ import annotations

import collections
import itertools
import logging
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Callable
from typing import Any, Final

from cmq._errors import ConfigError, TransportError
from cmq.net._sock import yield_cpu
from cmq.routing._amqp import AmqpConnection
from cmq.routing._core import AMQP_PREFIX, MEMORY_RESUME_FRACTION, BrokerCore, Outgoing
from cmq.routing._users import Users

__all__ = ["AMQP_PREFIX", "AmqpListener", "is_amqp"]

#: Bytes read per socket per turn.
_READ: Final = 256 * 1024
#: Seconds between two log lines about the memory alarm (it may flap while consumers drain).
_ALARM_LOG_EVERY: Final = 10.0
#: Longest select wait, so that close() is noticed promptly.
_MAX_WAIT: Final = 0.1
#: Seconds a TLS client has to finish its handshake.
_HANDSHAKE_TIMEOUT: Final = 10.0

_log = logging.getLogger("cmq.broker")


def is_amqp(dest: Any) -> bool:
    """Whether a core destination is an AMQP channel."""
    return type(dest[0]) is str and dest[0].startswith(AMQP_PREFIX)


class _Client:
    __slots__ = ("conn", "events", "handshake_by", "out", "sock", "want_write")

    def __init__(self, sock: socket.socket, conn: AmqpConnection, handshake_by: float | None = None) -> None:
        self.sock = sock
        self.conn = conn
        self.out = bytearray()
        self.events = 0  # what the selector watches the socket for
        # A TLS client before its handshake is done: the time it must be done by.
        self.handshake_by = handshake_by
        self.want_write = False  # the TLS handshake waits for the socket to take bytes


def _listen(host: str, port: int, what: str) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise TransportError(f"cannot listen for {what} on {host}:{port}: {exc.strerror or exc}") from exc
    sock.setblocking(False)
    return sock


class AmqpListener:
    """Serves AMQP 0-9-1 on ``host:port`` in front of ``core`` (guarded by ``lock``).

    Raises:
        TransportError: (constructor) the port cannot be bound.
    """

    def __init__(
        self,
        core: BrokerCore,
        lock: threading.Lock,
        *,
        host: str,
        port: int,
        users: Users,
        send_udp: Callable[[list[Outgoing]], None],
        commit: Callable[[], bool] | None = None,
        tls: ssl.SSLContext | None = None,
        tls_port: int | None = None,
        spin: float = 0.0,
    ) -> None:
        self.core = core
        # After a turn that read frames, the next one polls this long before
        # it blocks (BrokerConfig.spin; 0 with one CPU: see Broker).
        self._spin = spin
        self._spin_until = float("-inf")
        # Writes the core's journal to the store (under the lock): called
        # before a turn's frames leave, so a confirm follows its fsync.
        self._commit = commit
        # Set while the store cannot be written: no frame leaves (a confirm
        # must follow its fsync), they wait in the connections' buffers.
        self._held = False
        self.lock = lock
        self.users = users
        self._send_udp = send_udp
        if (tls is None) != (tls_port is None):
            raise ConfigError("TLS needs both a port and an SSL context (tls= and tls_port=)")
        self._sock = _listen(host, port, "AMQP")
        self._tls = tls
        self._tls_sock: socket.socket | None = None
        if tls_port is not None:
            try:
                self._tls_sock = _listen(host, tls_port, "AMQP over TLS")
            except TransportError:
                self._sock.close()
                raise
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._sock, selectors.EVENT_READ, "listen")
        if self._tls_sock is not None:
            self._sel.register(self._tls_sock, selectors.EVENT_READ, "listen-tls")
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._posted: collections.deque[Outgoing] = collections.deque()
        self._clients: dict[str, _Client] = {}
        self._ids = itertools.count(1)
        self._stopping = False
        self._thread: threading.Thread | None = None
        # Over the memory budget: publishers' sockets are not read (see the module's notes).
        self.alarm = False
        self.alarms = 0  # times the budget was crossed
        self._alarm_logged = float("-inf")

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._sock.getsockname()[:2]
        return ("127.0.0.1" if host in ("0.0.0.0", "::") else host, port)

    @property
    def tls_address(self) -> tuple[str, int] | None:
        """Where AMQP over TLS is served, or None."""
        if self._tls_sock is None:
            return None
        host, port = self._tls_sock.getsockname()[:2]
        return ("127.0.0.1" if host in ("0.0.0.0", "::") else host, port)

    @property
    def connections(self) -> int:
        return len(self._clients)

    def post(self, out: list[Outgoing]) -> None:
        """Hand over the core's messages for AMQP channels (from another thread)."""
        self._posted.extend(out)
        try:
            self._wake_w.send(b"\0")
        except OSError:
            pass  # the pipe is full: a wake-up is pending already

    def start(self) -> AmqpListener:
        self._thread = threading.Thread(target=self._run, name="cmq-amqp", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._stopping = True
        try:
            self._wake_w.send(b"\0")
        except OSError:
            pass
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2)
        for c in list(self._clients.values()):
            self._drop(c, time.monotonic())
        for s in (self._sock, self._tls_sock, self._wake_r, self._wake_w):
            if s is not None:
                s.close()
        self._sel.close()

    # -- the loop ------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stopping:
            try:
                self._turn()
            except Exception as exc:  # noqa: BLE001 - a bug must not stop the listener: counted, logged
                with self.lock:
                    self.core.note_internal_error(exc, None, "in the AMQP listener's loop")

    def _turn(self) -> None:
        wait = _MAX_WAIT
        now = time.monotonic()
        for c in self._clients.values():
            dl = c.conn.next_deadline() if c.handshake_by is None else c.handshake_by
            if dl is not None and dl - now < wait:
                wait = max(dl - now, 0.0)
        events = self._poll() if self._spin_until > now else []
        if not events:
            events = self._sel.select(wait)
        now = time.monotonic()
        reads: list[tuple[_Client, bytes]] = []
        for key, mask in events:
            what = key.data
            if what == "listen":
                self._accept(self._sock, now)
            elif what == "listen-tls":
                self._accept(self._tls_sock, now)
            elif what == "wake":
                try:
                    while self._wake_r.recv(4096):
                        pass
                except OSError:
                    pass
            else:
                cl: _Client = what
                if cl.handshake_by is not None:
                    if not self._handshake(cl, now):
                        continue
                    mask |= selectors.EVENT_READ  # what came with the handshake's end may wait decrypted
                if mask & selectors.EVENT_WRITE and not self._held:
                    self._write(cl, now)
                if mask & selectors.EVENT_READ and not cl.conn.finished:
                    data = self._read(cl)
                    if data is not None:
                        reads.append((cl, data))
        if reads and self._spin:
            self._spin_until = now + self._spin
        paused: list[_Client] = []
        with self.lock:
            for c, data in reads:
                c.conn.receive_data(data, now)
            if reads or self.alarm:
                paused = self._flow(now)
            late = []
            for c in self._clients.values():
                if c.handshake_by is not None:
                    if c.handshake_by <= now:
                        late.append(c)
                    continue
                dl = c.conn.next_deadline()
                if dl is not None and dl <= now:
                    c.conn.handle_timer(now)
            out = list(self._posted)
            self._posted.clear()
            out += self.core.messages_to_send()
            udp = self._route(out, now)
            if self._commit is not None and self.core.journal:
                self._held = not self._commit()
            else:
                self._held = False
        for c in late:
            _log.info("AMQP over TLS: no handshake from %s within %.0f s: dropped", c.conn.peer_host, _HANDSHAKE_TIMEOUT)
            self._drop(c, now)
        for c in paused:
            self._interest(c)
        if udp:
            self._send_udp(udp)
        if self._held:
            return
        for c in list(self._clients.values()):
            self._flush(c, now)

    def _poll(self) -> list[tuple[selectors.SelectorKey, int]]:
        """The events that come before ``_spin_until``, polled without
        blocking, the CPU yielded between polls (so a client ready to run on
        this CPU runs first); none when nothing came by then.

        In a request/response through the broker the next frame most often
        comes within the budget, and a listener asleep in ``select`` pays a
        process wake-up for it, as the UDP loop's poll (see ``Broker``)."""
        select, monotonic = self._sel.select, time.monotonic
        while True:
            events = select(0)
            if events or monotonic() >= self._spin_until or self._stopping:
                return events
            yield_cpu()

    def _flow(self, now: float) -> list[_Client]:
        """Raise or clear the memory alarm, pause or resume the publishing
        connections accordingly (under the lock); return those that changed."""
        core = self.core
        was = self.alarm
        self.alarm = core.turn_memory()  # shared with the cmq-protocol side
        if self.alarm and not was:
            held, budget = core.held_bytes(), core.config.memory_budget
            self.alarms += 1
            if now >= self._alarm_logged + _ALARM_LOG_EVERY:
                self._alarm_logged = now
                _log.warning("broker holds %d bytes of messages, over its budget of %d: AMQP publishers "
                             "are blocked until it holds under %d (alarm %d; logged at most every %.0f s)",
                             held, budget, int(budget * MEMORY_RESUME_FRACTION), self.alarms,
                             _ALARM_LOG_EVERY)  # fmt: skip
        changed = []
        for c in self._clients.values():
            conn = c.conn
            if (self.alarm and conn.published) != conn.paused:
                if conn.paused:
                    conn.resume(now)
                else:
                    conn.pause("low on memory", now)  # RabbitMQ's words
                changed.append(c)
        return changed

    def _read(self, c: _Client) -> bytes | None:
        """What ``c``'s socket has (b"": closed or broken), or None for nothing yet."""
        try:
            data = c.sock.recv(_READ)
        except (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
            return None
        except OSError:  # ssl.SSLError among them: a TLS connection that broke
            return b""
        if data and isinstance(c.sock, ssl.SSLSocket):
            # A TLS read returns one record (16 KiB at most): read on while
            # the socket has more, so that a large message takes one turn,
            # not one a record (the level-triggered selector would only
            # bring the rest on the next turns).
            parts, total = [data], len(data)
            while total < _READ:
                try:
                    more = c.sock.recv(_READ - total)
                except (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                    break
                except OSError:
                    break  # the next turn's read says so
                if not more:
                    break
                parts.append(more)
                total += len(more)
            data = b"".join(parts)
        return data

    def _handshake(self, c: _Client, now: float) -> bool:
        """Go on with ``c``'s TLS handshake; whether it is done."""
        sock = c.sock
        assert isinstance(sock, ssl.SSLSocket)
        try:
            sock.do_handshake()
        except ssl.SSLWantReadError:
            c.want_write = False
        except ssl.SSLWantWriteError:
            c.want_write = True
        except (ssl.SSLError, OSError) as exc:
            # Not TLS (a plain AMQP client on the TLS port), a certificate
            # the client refused, or a connection that went.
            _log.info("AMQP over TLS: handshake with %s failed: %s", c.conn.peer_host, exc)
            self._drop(c, now)
            return False
        else:
            c.handshake_by, c.want_write = None, False
            self._interest(c)
            return True
        self._interest(c)
        return False

    def _interest(self, c: _Client) -> None:
        """Watch ``c``'s socket for reading unless paused, for writing while output waits."""
        if c.handshake_by is not None:
            want = selectors.EVENT_WRITE if c.want_write else selectors.EVENT_READ
        else:
            want = (0 if c.conn.paused else selectors.EVENT_READ) | (selectors.EVENT_WRITE if c.out else 0)
        if want == c.events:
            return
        try:
            if not c.events:
                self._sel.register(c.sock, want, c)
            elif not want:
                self._sel.unregister(c.sock)
            else:
                self._sel.modify(c.sock, want, c)
        except (KeyError, ValueError, OSError):
            return
        c.events = want

    def _route(self, out: list[Outgoing], now: float) -> list[Outgoing]:
        """Give AMQP channels their messages (under the lock); return the others."""
        udp: list[Outgoing] = []
        clients = self._clients
        for o in out:
            dest = o.dest
            if is_amqp(dest):
                c = clients.get(dest[0])
                if c is not None:
                    c.conn.deliver(dest[1], o.payload, now)
            else:
                udp.append(o)
        return udp

    def _accept(self, listening: socket.socket | None, now: float) -> None:
        assert listening is not None
        tls = self._tls if listening is self._tls_sock else None
        for _ in range(64):
            try:
                sock, peer = listening.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                _log.warning("AMQP accept failed: %s", exc)
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if tls is not None:
                try:
                    sock = tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
                except (ssl.SSLError, OSError) as exc:
                    _log.info("AMQP over TLS: cannot start TLS with %s: %s", peer[0], exc)
                    sock.close()
                    continue
            key = f"{AMQP_PREFIX}{next(self._ids)}"
            with self.lock:
                conn = AmqpConnection(self.core, key, peer[0], self.users, now)
            by = now + _HANDSHAKE_TIMEOUT if tls is not None else None
            c = self._clients[key] = _Client(sock, conn, by)
            self._interest(c)

    def _flush(self, c: _Client, now: float) -> None:
        data = c.conn.data_to_send(now)
        if data:
            if c.out or c.events & selectors.EVENT_WRITE:
                c.out += data  # behind what waits
            else:
                self._write(c, now, data)  # straight from the connection's bytes
        elif c.out and not c.events & selectors.EVENT_WRITE:
            self._write(c, now)
        if c.conn.finished and not c.out:
            self._drop(c, now)

    def _write(self, c: _Client, now: float, data: bytes | None = None) -> None:
        """Send what ``c`` has waiting, or ``data`` when nothing waits; keep what the socket does not take."""
        if c.handshake_by is not None:
            if data:
                c.out += data
            return  # nothing is written before the TLS handshake is done
        try:
            n = c.sock.send(c.out if data is None else data)
        except (BlockingIOError, InterruptedError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
            n = 0
        except OSError:
            c.out.clear()
            with self.lock:
                c.conn.connection_lost(now)
            self._drop(c, now)
            return
        if data is None:
            del c.out[:n]
        elif n < len(data):
            c.out += memoryview(data)[n:]
        self._interest(c)

    def _drop(self, c: _Client, now: float) -> None:
        if self._clients.pop(c.conn.key, None) is None:
            return
        if not c.conn.finished:
            with self.lock:
                c.conn.connection_lost(now)
        if c.events:
            try:
                self._sel.unregister(c.sock)
            except (KeyError, ValueError):
                pass
            c.events = 0
        c.sock.close()
