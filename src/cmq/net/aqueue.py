"""The asyncio driver: :class:`AsyncQueue`, the same endpoint on an event loop.

Theory of operation
-------------------
The sans-IO core is the same as :class:`cmq.Queue`'s; only the moving of
bytes differs. Everything runs in the event loop's thread, so no locks:

- the socket is non-blocking and registered with ``loop.add_reader``; each
  readiness callback drains the kernel and wakes the coroutines waiting on a
  mailbox;
- ``push`` sends at once from the caller (UDP ``sendto`` on a non-blocking
  socket either takes the datagram or says EAGAIN, in which case datagrams
  wait in an outbox drained by ``loop.add_writer``, in order);
- one ``TimerHandle`` is re-armed to the earliest deadline (batch timeouts,
  request timeouts, reassembly expiry), using the loop's clock.
"""

from __future__ import annotations

import asyncio
import functools
from collections import deque
from collections.abc import AsyncIterator, Callable, Generator
from typing import Any, ClassVar, Final

from cmq._config import QueueConfig
from cmq._errors import Closed, Timeout, TransportError, WouldBlock
from cmq._types import Address, Message
from cmq.net._base import Endpoint, send_error
from cmq.wire.batcher import Stream
from cmq.wire.receiver import EMPTY, Meta

__all__ = ["AsyncQueue"]

_DRAIN_BATCH: Final = 256
#: How long reading ahead pauses while the mailboxes are half full.
_RESUME_AFTER: Final = 0.002


class _Closed:
    """What :meth:`AsyncQueue.close` returns: awaitable, done at once."""

    __slots__ = ()

    def __await__(self) -> Generator[None, None, None]:
        yield from ()


_CLOSED: Final = _Closed()


class AsyncQueue(Endpoint):
    """A cmq endpoint on asyncio. Open it with ``await AsyncQueue.open(...)``.

    Same options and non-waiting methods as :class:`cmq.Queue` (``push``,
    ``pop``, ``pop_message``, ``pop_many``, ``reply``, ``join``, ``leave``,
    ``flush``, ``stats``); the waiting ones are coroutines (``get``,
    ``get_message``, ``receive``, ``request``), and ``async for`` iterates
    over mailbox 0. Use it from the loop it was opened on only.

    Raises:
        ConfigError: a bad option, host or port.
        TransportError: the port is in use or the OS refuses the socket.
    """

    _kind: ClassVar[str] = "AsyncQueue"

    def __init__(
        self,
        port: int = 0,
        host: str = "0.0.0.0",
        *,
        config: QueueConfig | None = None,
        multicast_interface: str | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
        **options: Any,
    ) -> None:
        self._loop = loop or asyncio.get_running_loop()
        super().__init__(port, host, config, multicast_interface, options)
        self._sock.setblocking(False)
        self._outbox: deque[tuple[bytes, Address]] = deque()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = float("inf")
        self._waiters: dict[int, list[asyncio.Future[None]]] = {}
        # Coroutines waiting for room in a send buffer, or for acknowledgements.
        self._room_waiters: list[asyncio.Future[None]] = []
        self._backlog = max(self.config.max_queued // 2, 1)
        self._loop.add_reader(self._sock.fileno(), self._on_readable)

    @classmethod
    async def open(
        cls,
        port: int = 0,
        host: str = "0.0.0.0",
        *,
        config: QueueConfig | None = None,
        multicast_interface: str | None = None,
        **options: Any,
    ) -> AsyncQueue:
        """Open an endpoint on the running loop (the paper's ``newRq``).

        Raises:
            ConfigError, TransportError: as the constructor.
        """
        return cls(port, host, config=config, multicast_interface=multicast_interface, **options)

    # -- the driver's part ---------------------------------------------------

    def _now(self) -> float:
        return self._loop.time()

    def _new_future(self) -> asyncio.Future[Any]:
        return self._loop.create_future()

    def _transmit(self, s: Stream, datagrams: list[bytes], *, raise_errors: bool = True) -> None:
        self._send_datagrams(s, datagrams, raise_errors=raise_errors)

    def _send_datagrams(self, s: Stream, datagrams: list[bytes], *, raise_errors: bool = True) -> None:
        addr = s.addr
        error: OSError | None = None
        for d in datagrams:
            if self._outbox:
                self._outbox.append((d, addr))
                continue
            try:
                self._sock.sendto(d, addr)
            except BlockingIOError:
                self._outbox.append((d, addr))
                self._loop.add_writer(self._sock.fileno(), self._on_writable)
            except OSError as exc:
                self._count_send_failure(exc)
                error = exc
        self._batcher.sent(s, self._loop.time())
        if error is not None and raise_errors:
            raise send_error(error, addr) from error

    def _send_to(self, data: bytes, addr: Address) -> None:
        if self._outbox:
            self._outbox.append((data, addr))
            return
        try:
            self._sock.sendto(data, addr)
        except BlockingIOError:
            self._outbox.append((data, addr))
            self._loop.add_writer(self._sock.fileno(), self._on_writable)
        except OSError as exc:
            self._count_send_failure(exc)

    def _can_block(self) -> bool:
        return False  # push never blocks the loop: it raises WouldBlock; await send() waits

    def _wait_room(self, s: Stream, deadline: float) -> bool:  # pragma: no cover - _can_block is False
        return False

    def _room_made(self) -> None:
        waiters, self._room_waiters = self._room_waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    async def _wait_progress(self, done: Callable[[], bool], deadline: float | None) -> bool:
        while not done():
            if self._closed:
                raise Closed("queue is closed")
            remaining = None if deadline is None else deadline - self._loop.time()
            if remaining is not None and remaining <= 0:
                return False
            fut: asyncio.Future[None] = self._loop.create_future()
            self._room_waiters.append(fut)
            try:
                await asyncio.wait_for(fut, remaining)
            except TimeoutError:
                return done()
        return True

    async def send(self, dest: Any, msg: Any, mailbox: int = 0, timeout: float | None = None) -> None:
        """``push``, waiting (without blocking the loop) while the destination's send buffer is full.

        Raises:
            WouldBlock: still no room after ``timeout`` seconds (None: wait for ever);
                the message was not queued.
            ConfigError, TypeError, MessageTooLarge, TransportError, Closed: as ``push``.
        """
        deadline = None if timeout is None else self._loop.time() + timeout
        while True:
            try:
                self.push(dest, msg, mailbox)
                return
            except WouldBlock:
                s = self._cache.get(mailbox, {}).get(dest) if isinstance(dest, tuple | str) else None
                st = s.rel if s is not None else None

                if not await self._wait_progress(functools.partial(self._room, st), deadline):
                    raise

    async def drain(self, timeout: float | None = None) -> bool:
        """Send everything batched and wait until every reliable message is
        acknowledged (or reported failed); False if ``timeout`` passed first.

        Raises:
            Closed: the queue was closed.
        """
        self.flush()
        deadline = None if timeout is None else self._loop.time() + timeout
        return await self._wait_progress(lambda: not self._rel.unacked, deadline)

    def _on_writable(self) -> None:
        while self._outbox:
            d, addr = self._outbox[0]
            try:
                self._sock.sendto(d, addr)
            except BlockingIOError:
                return
            except OSError as exc:
                self._count_send_failure(exc)
            self._outbox.popleft()
        self._loop.remove_writer(self._sock.fileno())

    def _deadline_armed(self, deadline: float) -> None:
        if deadline < self._timer_at:
            self._rearm(deadline)

    def _rearm(self, deadline: float | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = float("inf")
        if deadline is not None and not self._closed:
            self._timer_at = deadline
            self._timer = self._loop.call_at(deadline, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = float("inf")
        now = self._loop.time()
        with self._timer_lock:
            due = self._batcher.due(now)
        for s in due:
            self._send_stream(s, now, raise_errors=False, force=False)
        if self._receiver.partials:
            self._receiver.expire(now)
        self._expire_requests(now)
        self._fire_reliable(now)
        self._rearm(self._next_deadline())

    def _poll(self) -> None:
        if not self._closed:
            self._drain(_DRAIN_BATCH, backlog=self._backlog)

    def _on_readable(self) -> None:
        if self._receiver.queued() >= self._backlog:
            # The application is behind: stop reading ahead for a moment and
            # leave datagrams in the kernel's buffer (see Queue's I/O thread).
            self._loop.remove_reader(self._sock.fileno())
            self._loop.call_later(_RESUME_AFTER, self._resume_reading)
            return
        self._drain(_DRAIN_BATCH, backlog=self._backlog)

    def _resume_reading(self) -> None:
        if not self._closed:
            self._loop.add_reader(self._sock.fileno(), self._on_readable)

    def _drain(self, limit: int, backlog: int | None = None) -> int:
        recv = self._sock.recvfrom_into
        buf, view = self._buf, self._view
        received = self._receiver.datagram_received
        now = self._loop.time()
        count = 0
        while count < limit:
            try:
                n, addr = recv(buf)
            except BlockingIOError:
                break
            except OSError:
                if self._closed:
                    break
                continue
            received(view[:n].tobytes(), addr, now)
            count += 1
            if backlog is not None and self._receiver.queued() >= backlog:
                break
        self._note_read(count)
        if count:
            if self._waiters or self._receiver.replies:
                # Input someone waited for: what they push next is not batched.
                self._batcher.waited_at = now
            self._after_read(now)
            self._wake_waiters()
            if self._receiver.partials:
                expiry = self._receiver.next_expiry()
                if expiry is not None:
                    self._deadline_armed(expiry)
        return count

    def _wake_waiters(self) -> None:
        if not self._waiters:
            return
        for mailbox in [m for m, mb in self._mailboxes.items() if m in self._waiters and mb.chunks]:
            for fut in self._waiters.pop(mailbox):
                if not fut.done():
                    fut.set_result(None)

    # -- waiting -------------------------------------------------------------

    async def _wait_item(
        self, mailbox: int, timeout: float | None, predicate: Callable[[Any], bool] | None
    ) -> tuple[Any, Meta]:
        deadline = None if timeout is None else self._loop.time() + timeout
        if self._heap:
            self.flush()
        while True:
            item = self._take_item(mailbox, predicate)
            if item is not None:
                return item
            if self._closed:
                raise Closed("queue is closed")
            fut: asyncio.Future[None] = self._loop.create_future()
            self._waiters.setdefault(mailbox, []).append(fut)
            remaining = None if deadline is None else deadline - self._loop.time()
            if remaining is not None and remaining <= 0:
                raise Timeout(f"no message in mailbox {mailbox} within {timeout} s")
            try:
                await asyncio.wait_for(fut, remaining)
            except TimeoutError:
                raise Timeout(f"no message in mailbox {mailbox} within {timeout} s") from None
            finally:
                waiting = self._waiters.get(mailbox)
                if waiting and fut in waiting:
                    waiting.remove(fut)

    async def get(self, timeout: float | None = None, mailbox: int = 0) -> Any:
        """The next message of ``mailbox``, waiting up to ``timeout`` seconds (None: forever).

        Raises:
            Timeout: nothing arrived in time.
            Closed: the queue was closed.
        """
        mb = self._mailboxes.get(mailbox)
        if mb is not None:
            payload = mb.pop()
            if payload is not EMPTY:
                return payload
        return (await self._wait_item(mailbox, timeout, None))[0]

    async def get_message(self, timeout: float | None = None, mailbox: int = 0) -> Message:
        """Like :meth:`get`, but the :class:`Message` with its sender.

        Raises:
            Timeout: nothing arrived in time.
            Closed: the queue was closed.
        """
        return self._message_of(await self._wait_item(mailbox, timeout, None))

    async def receive(
        self, predicate: Callable[[Any], bool], timeout: float | None = None, mailbox: int = 0
    ) -> Any:
        """Selective receive: the first message of ``mailbox`` that matches ``predicate``.

        The others stay in order. Raises :class:`Timeout` or :class:`Closed`.
        """
        return (await self._wait_item(mailbox, timeout, predicate))[0]

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Any]:
        while True:
            try:
                yield await self.get()
            except Closed:
                return

    async def request(self, dest: Any, msg: Any, timeout: float = 1.0, mailbox: int = 0) -> Any:
        """Send ``msg`` as a request and await the reply.

        Raises:
            Timeout: no reply within ``timeout`` seconds.
            Closed: the queue was closed.
            ConfigError, TypeError, MessageTooLarge, TransportError: as ``push``.
        """
        fut = self.request_future(dest, msg, timeout=timeout, mailbox=mailbox)
        return await fut

    # -- lifecycle -----------------------------------------------------------

    def close(self) -> _Closed:
        """Send everything batched (and queued for the socket) and close, at once.

        Pending requests and waiters fail with :class:`Closed`. It does not
        wait for reliable messages to be acknowledged: ``await q.aclose()``
        (or ``async with``) does. ``await q.close()`` works too, and returns
        at once (the queue is closed already).
        """
        if not self._closed:
            self._close_now()
        return _CLOSED

    def _close_now(self) -> None:
        try:
            self.flush()
        except TransportError:
            pass
        self._settle_owed()
        self._closed = True
        self._cache.clear()
        self._icache.clear()
        self._forget_memo()
        self._batcher.close()  # every push, bound senders' too, now reaches the closed check
        self._rearm(None)
        fd = self._sock.fileno()
        self._loop.remove_reader(fd)
        self._loop.remove_writer(fd)
        # What the kernel would not take yet gets one blocking chance.
        if self._outbox:
            self._sock.setblocking(True)
            while self._outbox:
                d, addr = self._outbox.popleft()
                try:
                    self._sock.sendto(d, addr)
                except OSError:
                    self._send_drops["send_failed"] += 1
        self._sock.close()
        with self._req_lock:
            attempts = self._pending.drain()
        for attempt in attempts:
            if not attempt.future.done():
                attempt.future.set_exception(Closed("queue closed before the reply came"))
        for waiters in self._waiters.values():
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)
        self._waiters.clear()
        self._rel.close()
        self._report_failures()
        self._room_made()

    async def aclose(self) -> None:
        """Wait up to ``linger`` for reliable messages to be acknowledged, then
        close (see :meth:`close`, which does not wait); for ``async with``."""
        if not self._closed and self._rel.unacked and self.config.linger > 0:
            try:
                await self.drain(self.config.linger)
            except Exception:  # noqa: BLE001 - closing goes on; the rest is reported in doubt
                pass
        self.close()

    async def __aenter__(self) -> AsyncQueue:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
