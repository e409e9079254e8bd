"""The threaded driver: :class:`Queue`, a cmq endpoint on a UDP socket.

Theory of operation
-------------------
All protocol logic lives in the sans-IO core (:mod:`cmq.wire`); this module
only moves bytes between it, a socket and a clock.

*Sending* happens in the thread that calls :meth:`Queue.push`: the batcher
says whether the message joined an open batch (nothing else happens, no lock
is taken), opened one, filled one, or is too large for one datagram. A full
batch is sent from the caller's thread at once; an opened batch is sent at
once when the destination is idle, else its deadline is armed for the I/O
thread. A lock is taken per *datagram*, never per message, so that two
threads flushing one stream keep its datagrams in sequence order.

*Receiving* happens in whichever thread needs it. A blocking call
(:meth:`get`, :meth:`request`) reads the socket itself, so a reply goes from
the kernel to the caller with no thread hand-off; :meth:`pop` drains what the
kernel holds without blocking; and the I/O thread drains the socket when no
caller does, so the kernel buffer does not overflow while the application is
busy. One lock per datagram (the receive lock) keeps datagrams delivered in
the order they were read. When the I/O thread finds that lock taken, or a
read by the application (blocking or not, or a ``get`` of a message the I/O
thread had queued) less than 10 ms old, the application is reading the
socket itself: the I/O thread leaves it alone for
a couple of milliseconds, doubling up to 50 ms while it keeps finding the
application there (so a reply to a request that nobody reads for may wait
that long after a reading spell). Each of its wakes on a datagram that the
application reads anyway would cost the application a GIL hand-off, about a
third of a round trip's system calls before this rule.

The *I/O thread* also fires deadlines: batch timeouts, request timeouts and
reassembly expiry. It sleeps in ``select`` until the earliest deadline; a push
that arms an earlier one wakes it through a pipe (once per batch, not per
message).
"""

from __future__ import annotations

import os
import select
import signal
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any, ClassVar, Final

from cmq import _impl
from cmq._config import QueueConfig
from cmq._errors import Closed, Timeout, TransportError
from cmq._types import Address, Message
from cmq.net._base import Endpoint, message_of, send_error
from cmq.net._reader import BIG_DATAGRAM as _BIG_DATAGRAM
from cmq.net._reader import SHORT_WAIT as _SHORT_WAIT
from cmq.net._reader import DirectReader
from cmq.net._sock import spin_readable, yield_cpu
from cmq.wire.batcher import Stream
from cmq.wire.receiver import _V2_SLOW, EMPTY, Meta

__all__ = ["Queue"]

#: How long the I/O thread leaves the socket to a caller that is reading it.
_YIELD_TO_READER: Final = 0.002
#: An application read younger than this means the application is reading.
_APP_READING: Final = 0.01
#: The longest it stays off the socket while callers keep reading it themselves.
_YIELD_MAX: Final = 0.05
#: Datagrams read in one go before the reader lets others run.
_DRAIN_BATCH: Final = 256
#: Least time between two reads of acknowledgements by a pushing thread
#: (_poll_acks). A stream at full rate sends a datagram every 15-30 us and
#: gets a STATUS every twenty or so; reading for one at every batch was an
#: eighth of a 512 B sender's time. A STATUS read this much later delays a
#: repair far less than a probe timeout (at least 1 ms).
_ACK_POLL_GAP: Final = 100e-6
_RECV_SIZE: Final = 65536
#: glibc's malloc settings the compiled core leaves alone when the environment sets them.
_MALLOC_ENV: Final = frozenset({"MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_"})
#: Freed memory kept in the process (a send buffer's worth), and the heap's growth step.
_KEEP_FREED: Final = 64 << 20
_TOP_PAD: Final = 16 << 20
#: Datagrams per recvmmsg/sendmmsg call (the compiled core's buffers: this many times _RECV_SIZE).
_MMSG_SLOTS: Final = 16
_FOREVER: Final = float("inf")
#: Longest single wait of a push blocked for room, or of drain (between checks).
_ROOM_POLL: Final = 0.005
_monotonic = time.monotonic
#: Polls in a row that read nothing, no message received since, before each
#: further one pauses (Queue._poll): more than the few empty pops of code
#: that drains its mailboxes each turn (a broker client: two or three),
#: where a pause would only hand the interpreter to another thread.
_EMPTY_POLLS: Final = 8


class Queue(Endpoint):
    """A cmq endpoint: a UDP socket with batching, mailboxes and requests.

    ``Queue(port=0, host="0.0.0.0", **options)`` opens the endpoint (the CMQ
    paper's ``newRq``); ``options`` are :class:`cmq.QueueConfig` fields, or
    pass ``config=``. Use it as a context manager, or call :meth:`close`,
    which sends everything still batched.

    Raises:
        ConfigError: a bad option, host or port.
        TransportError: the port is in use or the OS refuses the socket.
    """

    _kind: ClassVar[str] = "Queue"

    def __init__(
        self,
        port: int = 0,
        host: str = "0.0.0.0",
        *,
        config: QueueConfig | None = None,
        multicast_interface: str | None = None,
        **options: Any,
    ) -> None:
        # The compiled core's locks are taken in C by its compiled paths
        # (threading.Lock's interface, the same lock underneath).
        lock = threading.Lock if _impl.speedups is None else _impl.speedups.Lock
        super().__init__(port, host, config, multicast_interface, options, lock=lock)
        # Notified when a reliable stream's send buffer gets room (blocked pushes, drain).
        self._room_cv = threading.Condition(threading.Lock())
        # Threads waiting on it (written under its lock): a STATUS that makes
        # room notifies only when there is one, not on every STATUS.
        self._room_waiters = 0
        self._rcvtimeo = 0.0  # what SO_RCVTIMEO is set to (0: forever, the default)
        # The finite waits that setting serves (see _set_rcvtimeo).
        self._rcv_lo, self._rcv_hi = float("inf"), float("-inf")
        # When the application last read the socket (blocking or not).
        self._app_read_at = float("-inf")
        # Whether the I/O thread queued messages since a get took one.
        self._io_delivered = False
        self._big_reads = False
        # The compiled core reads and sends many datagrams per system call
        # (IPv4; the addresses it reports are the socket module's).
        sp = _impl.speedups
        self._mmsg: Any = None
        self._sendto: Callable[[bytes, Address], object] = self._sock.sendto
        # One datagram as (bytes, addr), copied out of a reused buffer (the read
        # while datagrams are under _BIG_DATAGRAM); the argument: wait for it.
        self._recv_small: Callable[[bool], tuple[bytes, Any]] = self._recv_into_buffer
        # The compiled paths below keep this queue's hot fields in C: not for
        # an object of a subclass with __slots__ of its own, which cannot
        # have them (cmq._impl.new_object); it takes the pure reader.
        own_state = sp is not None and isinstance(self, sp.EndpointState)
        if sp is not None and self._sock.family == socket.AF_INET:
            # GSO on sends; GRO off: a blocking read of one datagram through
            # recvmmsg made the ping-pong's p50 11 us slower (72 against 61 us
            # unpinned), so single reads stay recvfrom_into, which a socket
            # with GRO could hand a coalesced run.
            self._mmsg = sp.DatagramIO(os.dup(self._sock.fileno()), _MMSG_SLOTS, _RECV_SIZE, True, False)
            # One datagram: without blocking and the GIL hand-off first (see DatagramIO.send1).
            self._sendto = self._mmsg.send1
            self._recv_small = self._mmsg.recv1
        if own_state and self._mmsg is not None:
            # A push that opens a batch to an idle destination sends its
            # datagram in one compiled call (_after_append's commonest case).
            self._after = sp.make_idle_after(
                self, self._after_append, self._batcher, self._sendto, self._rel.sent,
                self._timer_lock, self._rel_timer, send_error, self._rel,
                self._ack_poll_at, self._send_buffer, self._send_total, _ACK_POLL_GAP,
            )  # fmt: skip
            self.push = self._make_push()  # type: ignore[method-assign]
        # Polling before a blocking read (QueueConfig.spin): pointless with
        # one CPU, where the thread it waits for needs that CPU.
        spin_max = self.config.spin if (os.cpu_count() or 1) > 1 else 0.0
        self._pause_after = _EMPTY_POLLS  # see _poll (the broker's loop, which yields itself, turns it off)
        self._empty_polls = 0  # polls in a row that read nothing, no message received since (see _poll)
        self._got_at_poll = 0  # the receiver's message count at the last poll
        # The latency path of a blocking read and its polling policy: the
        # compiled core's reader runs its loop in C.
        self._reader: DirectReader = (
            sp.DirectReader(self, spin_max, sp.spin_readable)
            if own_state
            else DirectReader(self, spin_max, spin_readable)
        )
        self._read_direct = self._reader.read
        if own_state:
            # get and get_message without their Python frames (the same steps).
            self.get = self._reader.get  # type: ignore[method-assign]
            self.get_message = self._reader.get_message  # type: ignore[method-assign]
        if sp is not None and not _MALLOC_ENV.intersection(os.environ):
            # Freed datagrams stay in the process for the next ones rather
            # than go back to the kernel and fault in again (_speedups).
            sp.keep_freed_memory(_KEEP_FREED, _TOP_PAD)
        self._arms = 0  # deadlines armed, ever (see _io_loop)
        self._wake_r, self._wake_w = os.pipe()
        self._pipe_open = True
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        # When the I/O thread sleeps, until when; -inf while it is awake.
        self._io_sleep_until = float("-inf")
        # The I/O thread reads ahead of the application only up to half the
        # mailbox bound, so a burst never overflows a mailbox that the
        # application is draining.
        self._backlog = max(self.config.max_queued // 2, 1)
        if own_state and self._mmsg is not None:
            # The non-blocking poll (and pop_many) without their Python
            # frames: the same steps as _poll and _drain_many, in C.
            self._poll = self._reader.poll_once  # type: ignore[method-assign]
            self.pop_many = self._reader.pop_many  # type: ignore[method-assign]
        self._io_thread = threading.Thread(target=self._io_loop, name=f"cmq-io-{self.port}", daemon=True)
        self._io_thread.start()

    # The clock itself, not a method calling it: read on every push.
    _now = staticmethod(_monotonic)

    def _new_future(self) -> Future[Any]:
        return Future()

    def _deadline_armed(self, deadline: float) -> None:
        self._arms += 1
        if deadline < self._io_sleep_until:
            self._wake_io()

    def _rel_timer(self, deadline: float) -> None:
        # While the application reads the socket, its reads fire the
        # reliability timers (bounded by _rel_at); waking the I/O thread
        # for each would cost the application a GIL hand-off a round trip.
        if deadline < self._rel_at:
            self._rel_at = deadline
        if deadline < self._io_sleep_until and _monotonic() - self._app_read_at >= _APP_READING:
            self._wake_io()

    def _transmit(self, s: Stream, datagrams: list[bytes], *, raise_errors: bool = True) -> None:
        try:
            if len(datagrams) == 1:
                self._sendto(datagrams[0], s.addr)
            else:
                self._send_all(datagrams, s.addr, raise_errors=raise_errors)
        except TransportError:
            raise  # counted by _send_all
        except OSError as exc:
            self._count_send_failure(exc)
            if raise_errors:
                raise send_error(exc, s.addr) from exc
        finally:
            # The idle gap counts from when the link took the last
            # datagram, not from when we started sending it.
            self._batcher.sent(s, _monotonic())

    def _send_to(self, data: bytes, addr: Address) -> None:
        try:
            self._sendto(data, addr)
        except OSError as exc:
            self._count_send_failure(exc)

    def _poll_acks(self) -> None:
        # The pushing thread reads the socket (at most every _ACK_POLL_GAP) while it streams:
        # the I/O thread stays off it meanwhile, as for any reading
        # application, rather than take the interpreter and the batch lock
        # from the pusher for each STATUS. Not within _ACK_POLL_GAP of the
        # application's last read, this one's or its own (a request loop's
        # gets read the acknowledgements that come with the answers).
        now = _monotonic()
        if now - self._app_read_at < _ACK_POLL_GAP or self._closed or not self._rx_lock.acquire(False):
            return
        try:
            self._app_read_at = now
            if self._mmsg is not None and not self._mmsg.ready():
                # Nothing to read (the common case, once a batch): what a
                # drain that reads nothing does, without its system calls.
                self._after_read(now)
            else:
                self._drain(_DRAIN_BATCH)
        finally:
            self._rx_lock.release()

    def _room_made(self) -> None:
        # Read without the lock: a waiter counts itself before it checks
        # for room under the lock, so one that this read missed sees the room.
        if self._room_waiters:
            with self._room_cv:
                self._room_cv.notify_all()

    def _wait_room(self, s: Stream, deadline: float) -> bool:
        st = s.rel
        return self._wait_until(lambda: self._room(st), deadline)

    def _wait_until(self, done: Callable[[], bool], deadline: float | None) -> bool:
        """Wait until ``done()`` or ``deadline`` (None: forever); whether ``done()``.

        The STATUS records that make progress come through the socket: this
        thread reads it when nobody else does, else waits to be told.
        """
        while not done():
            if self._closed:
                raise Closed("queue is closed")
            remaining = _ROOM_POLL if deadline is None else min(deadline - _monotonic(), _ROOM_POLL)
            if remaining <= 0:
                return done()
            if self._rx_lock.acquire(False):
                try:
                    got = self._recv_or_fire(remaining)
                    if got is not None:
                        now = _monotonic()
                        with self._state_lock:
                            self._receiver.datagram_received(got[0], got[1], now)
                        self._after_read(now)
                finally:
                    self._rx_lock.release()
            else:
                with self._room_cv:
                    self._room_waiters += 1
                    try:
                        if not done():
                            self._room_cv.wait(remaining)
                    finally:
                        self._room_waiters -= 1
        return True

    def drain(self, timeout: float | None = None) -> bool:
        """Send everything batched and wait until every reliable message is
        acknowledged (or reported failed); returns False if ``timeout``
        seconds passed first.

        Raises:
            Closed: the queue was closed.
        """
        self.flush()
        deadline = None if timeout is None else _monotonic() + timeout
        return self._wait_until(lambda: not self._rel.unacked, deadline)

    def _send_all(self, datagrams: list[bytes], addr: Address, *, raise_errors: bool) -> None:
        if self._mmsg is not None:
            try:
                done = self._mmsg.send(datagrams, addr)
            except (OSError, ValueError):
                done = 0  # the loop below sends them one by one, and counts the error
            if done == len(datagrams):
                return
            datagrams = datagrams[done:]
        sendto = self._sock.sendto
        error: OSError | None = None
        for d in datagrams:
            try:
                sendto(d, addr)
            except OSError as exc:
                self._count_send_failure(exc)
                error = exc
        if error is not None and raise_errors:
            raise send_error(error, addr) from error

    def _wake_io(self) -> None:
        if not self._pipe_open:
            return
        try:
            os.write(self._wake_w, b"\0")
        except (BlockingIOError, OSError):
            pass  # the pipe is full (a wake is pending anyway) or closed

    # -- receiving ---------------------------------------------------------

    def get(self, timeout: float | None = None, mailbox: int = 0) -> Any:
        """The next message of ``mailbox``, waiting up to ``timeout`` seconds (None: forever).

        Anything batched is sent before waiting, so a request pushed just
        before never waits for its batch timeout.

        Raises:
            Timeout: nothing arrived in time.
            Closed: the queue was closed.
        """
        mb = self._mailboxes.get(mailbox)
        if mb is not None and mb.chunks:
            payload = mb.pop()
            if payload is not EMPTY:
                if self._io_delivered:
                    # The I/O thread read this: say the application reads,
                    # so that it leaves the socket to it (see _io_loop) and
                    # the next read takes the latency path.
                    self._io_delivered = False
                    self._app_read_at = _monotonic()
                return payload
        item, left = self._read_direct(timeout, mailbox)
        if item is not None:
            return item[0]
        return self._wait_item(mailbox, left, None, asked=timeout)[0]

    def get_message(self, timeout: float | None = None, mailbox: int = 0) -> Message:
        """Like :meth:`get`, but the :class:`Message` with its sender.

        Raises:
            Timeout: nothing arrived in time.
            Closed: the queue was closed.
        """
        mb = self._mailboxes.get(mailbox)
        if mb is not None and mb.chunks:
            item = mb.pop_item()
            if item is not None:
                if self._io_delivered:  # as in get
                    self._io_delivered = False
                    self._app_read_at = _monotonic()
                return message_of(item)
        item, left = self._read_direct(timeout, mailbox)
        if item is None:
            item = self._wait_item(mailbox, left, None, asked=timeout)
        return message_of(item)

    def receive(
        self, predicate: Callable[[Any], bool], timeout: float | None = None, mailbox: int = 0
    ) -> Any:
        """Selective receive: the first message of ``mailbox`` for which ``predicate`` is true.

        The messages before it stay in the mailbox, in order (as Erlang's
        ``receive``). Waits up to ``timeout`` seconds (None: forever). Do not
        run it concurrently with other consumers of the same mailbox.

        Raises:
            Timeout: no matching message arrived in time.
            Closed: the queue was closed.
        """
        return self._wait_item(mailbox, timeout, predicate)[0]

    def __iter__(self) -> Iterator[Any]:
        """Messages of mailbox 0 as they arrive, until the queue is closed."""
        while True:
            try:
                yield self.get()
            except Closed:
                return

    def _wait_item(
        self,
        mailbox: int,
        timeout: float | None,
        predicate: Callable[[Any], bool] | None,
        asked: float | None = None,
    ) -> tuple[Any, Meta]:
        """Wait up to ``timeout`` for an item; ``asked`` is the caller's own
        timeout, for the message (``timeout`` may be what is left of it)."""
        deadline = None if timeout is None else _monotonic() + timeout
        if asked is None:
            asked = timeout
        if self._heap:
            self.flush()
        while True:
            if self._closed:
                item = self._take_item(mailbox, predicate)
                if item is not None:
                    return item
                raise Closed("queue is closed")
            remaining = None if deadline is None else deadline - _monotonic()
            if remaining is not None and remaining <= 0:
                item = self._take_item(mailbox, predicate)
                if item is not None:
                    return item
                self._reader.ahead = 0  # what was unanswered is lost or late (see DirectReader.awaits_one_answer)
                raise Timeout(f"no message in mailbox {mailbox} within {asked} s")
            # Reads one datagram unless what we wait for is already queued;
            # a datagram of one message for us comes straight back.
            item = self._read_blocking(remaining, mailbox, predicate)
            if item is None:
                item = self._take_item(mailbox, predicate)
            if item is not None:
                return item

    # -- the receive path ---------------------------------------------------

    def _poll(self) -> None:
        """Drain what the kernel holds, without blocking, unless another thread is reading.

        A poll that finds nothing after ``_pause_after`` (``_EMPTY_POLLS``)
        that found nothing either, with no message received in between (a
        loop of ``pop`` waiting for one), yields to the other threads of the
        process: the read that cannot block keeps the interpreter, so
        without it a thread pushing beside such a loop got the interpreter
        back only at Python's switch interval (5 ms) after each of its own
        system calls, and a message it pushed took 5.6-5.9 ms to be popped
        instead of 0.2-0.4 ms. A loop that finds messages never pauses.
        """
        self._app_read_at = _monotonic()
        got = 0
        if not self._closed and self._rx_lock.acquire(blocking=False):
            try:
                got = self._drain(_DRAIN_BATCH, backlog=self._backlog)
            finally:
                self._rx_lock.release()
        if got:
            self._empty_polls = 0
            return
        # Messages another thread read since the last poll (the I/O thread,
        # a blocking get) start the count again too: this poll is its first.
        seen, self._got_at_poll = self._got_at_poll, self._receiver.messages_received
        self._empty_polls = 1 if seen != self._got_at_poll else self._empty_polls + 1
        if self._empty_polls > self._pause_after:
            yield_cpu()  # the interpreter released: the process's other threads run

    def _drain(self, limit: int, backlog: int | None = None) -> int:
        """Read up to ``limit`` datagrams without blocking (receive lock held).

        With ``backlog``, stop once that many messages wait in the mailboxes.
        """
        if self._mmsg is not None:
            return self._drain_many(limit, backlog)
        received = self._receiver.datagram_received
        count = 0
        while count < limit:
            try:
                data, addr = self._recv(False)
            except BlockingIOError:
                break
            except OSError:
                if self._closed:
                    break
                continue  # e.g. an ICMP error reported on the socket: nothing to read
            if addr is None:
                break  # shut down by close()
            with self._state_lock:
                received(data, addr, _monotonic())
            count += 1
            if backlog is not None and self._receiver.queued() >= backlog:
                break
        self._note_read(count)
        self._after_read(_monotonic())
        return count

    def _drain_many(self, limit: int, backlog: int | None) -> int:
        """:meth:`_drain` with many datagrams per system call (the compiled core's ``recvmmsg``).

        Near ``backlog`` it reads one datagram per call, so that what the
        application has not taken yet waits in the kernel, not in the
        mailboxes; below it, never more datagrams than the backlog has room for.
        """
        receiver = self._receiver
        received = receiver.datagram_received
        general = receiver._general
        # Datagrams of reliable streams go to the receiver's compiled fast
        # path where recvmmsg put them (no bytes object for a datagram).
        fast = receiver._fast_v2 if receiver._key is None else None
        read = self._mmsg.read
        deliver = self._mmsg.deliver
        count = 0
        while count < limit:
            want = min(limit - count, _MMSG_SLOTS)
            if backlog is not None:
                queued = receiver.queued()
                want = 1 if queued >= backlog // 2 else min(want, backlog - queued)
            try:
                got = read(want)
            except OSError:
                if self._closed:
                    break
                continue  # e.g. an ICMP error reported on the socket: nothing to read
            self._note_read(got)
            if not got:
                break
            with self._state_lock:
                shut = deliver(receiver, fast, received, general, _V2_SLOW)
            if shut:
                break  # shut down by close()
            count += got
            if backlog is not None and receiver.queued() >= backlog:
                break
            if got < want:
                # Fewer than asked: the socket was empty (a coalesced read
                # gives more items than reads, never fewer), so another
                # call would find nothing. Messages that come one at a
                # time (a request, a ping-pong through the broker) then
                # cost one system call each, not two.
                break
            if receiver.status_urgent:
                # A STATUS is owed now: it leaves with this call's datagrams,
                # not after the whole drain (up to a window of datagrams, which
                # the sender would otherwise wait for before it may send more).
                self._after_read(_monotonic())
        self._after_read(_monotonic())
        return count

    def _read_blocking(
        self,
        remaining: float | None,
        mailbox: int = 0,
        predicate: Callable[[Any], bool] | None = None,
        fut: Future[Any] | None = None,
    ) -> tuple[Any, Meta] | None:
        """Wait in this thread for one datagram, up to ``remaining`` seconds, and deliver it.

        Returns early if, once the receive lock is held, what the caller
        waits for (a message of ``mailbox`` matching ``predicate``, or
        ``fut`` done) is already there. Only one datagram is read: more
        would cost a failing non-blocking read per call, and the caller's
        next read takes them anyway, in order. A datagram of exactly one
        message for ``mailbox`` (no predicate) is returned to the caller
        instead of queued; otherwise None is returned.
        """
        if not self._rx_lock.acquire(timeout=-1 if remaining is None else max(remaining, 0)):
            return None
        try:
            # The application reads: the I/O thread may leave the socket to
            # it, even when what it waits for is here already.
            self._app_read_at = _monotonic()
            if self._closed:
                return None
            if fut is not None:
                if fut.done():
                    return None
            elif self._take_ready(mailbox, predicate):
                return None
            got = self._recv_or_fire(remaining)
            if got is None:
                return None  # the caller decides
            data, addr = got
            item = None
            now = self._app_read_at = self._batcher.waited_at = _monotonic()
            with self._state_lock:
                if fut is None and predicate is None:
                    item = self._receiver.receive_one(data, addr, now, mailbox)
                else:
                    self._receiver.datagram_received(data, addr, now)
            self._after_read(now)
            return item
        finally:
            self._rx_lock.release()

    def _recv_or_fire(self, remaining: float | None) -> tuple[bytes, Any] | None:
        """One datagram within ``remaining`` seconds (None: forever; receive
        lock held), the wait cut short when the next reliability timer is
        due: a thread that holds the socket fires those timers itself (the
        I/O thread stays off it), so a probe timeout never waits for a
        datagram. None: nothing came (timed out, an ICMP error), or closed.
        """
        try:
            data, addr = self._recv_within(self._rel_bound(remaining, _monotonic(), 0.0))
        except OSError:
            now = _monotonic()
            if now >= self._rel_at and not self._closed:
                self._fire_reliable(now)
            return None
        return None if addr is None else (data, addr)

    def _rel_bound(self, wait: float | None, now: float, least: float) -> float | None:
        """``wait`` (None: forever), shortened to when the next reliability
        timer is due (but not below ``least``): the reading thread fires it."""
        left = self._rel_at - now
        if left < _FOREVER and (wait is None or left < wait):
            return left if left > least else least  # max(), without the call (every read)
        return wait

    def _recv(self, wait: bool) -> tuple[bytes, Any]:
        """One datagram as bytes, with one copy whatever its size; without
        ``wait``, at once or BlockingIOError.

        Small datagrams are read into a reused buffer and copied out (cheap);
        after a large one, the next reads let the kernel fill a fresh bytes
        object, which saves copying tens of kilobytes twice.
        """
        if self._big_reads:
            data, addr = self._sock.recvfrom(_RECV_SIZE, 0 if wait else socket.MSG_DONTWAIT)
            if len(data) < _BIG_DATAGRAM:
                self._big_reads = False
            return data, addr
        data, addr = self._recv_small(wait)
        if len(data) >= _BIG_DATAGRAM:
            self._big_reads = True
        return data, addr

    def _recv_into_buffer(self, wait: bool) -> tuple[bytes, Any]:
        """The pure core's read of one datagram into the reused buffer, copied out
        (the compiled core reads with DatagramIO.recv1: no argument parsing, and
        the same address tuple for the same source)."""
        n, addr = self._sock.recvfrom_into(self._buf, 0, 0 if wait else socket.MSG_DONTWAIT)
        return self._view[:n].tobytes(), addr

    def _recv_within(self, remaining: float | None) -> tuple[bytes, Any]:
        """One datagram, waiting up to ``remaining`` seconds (None: forever; receive lock held).

        Raises:
            OSError: nothing came in time (``BlockingIOError``), or the socket failed.
        """
        if remaining is not None and remaining < _SHORT_WAIT:
            # The kernel rounds SO_RCVTIMEO up to a whole timer tick (several
            # ms): a short wait uses select, and no wait none at all.
            if remaining > 0 and not select.select([self._sock], [], [], remaining)[0]:
                raise BlockingIOError("no datagram within the wait")
            return self._recv(False)
        self._set_rcvtimeo(remaining)
        return self._recv(True)

    def _set_rcvtimeo(self, remaining: float | None) -> None:
        # SO_RCVTIMEO makes the blocking read one system call. It is kept
        # while it is no more than 1 ms (or 1 %) longer than the wait and no
        # less than half of it; when it must change, it is set to half the
        # wait. So a loop of get(timeout=t) sets it once, and a wait that
        # shrinks towards a deadline (a heartbeat's) sets it once per halving.
        # A read may so end early (every caller reads again until its own
        # deadline) or up to 1 ms (1 %) late. Whole microseconds, 0 meaning
        # "wait forever".
        want = 0.0 if remaining is None else max(remaining, 1e-6)
        have = self._rcvtimeo
        if have == want or (have and want and want * 0.5 <= have <= want + max(0.001, want * 0.01)):
            return
        if want > 2 * _SHORT_WAIT:
            want *= 0.5
        sec = int(want)
        usec = int((want - sec) * 1e6)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("@ll", sec, usec))
        self._rcvtimeo = want
        # The waits this setting serves, for the read path's inline test
        # (the rule above, with the 1 % taken of the setting).
        if want:
            self._rcv_lo, self._rcv_hi = min(want / 1.01, want - 0.001), 2 * want
        else:
            self._rcv_lo, self._rcv_hi = float("inf"), float("-inf")

    # -- requests ----------------------------------------------------------

    def request(self, dest: Any, msg: Any, timeout: float = 1.0, mailbox: int = 0) -> Any:
        """Send ``msg`` as a request and wait for the reply (see :meth:`reply`).

        Raises:
            Timeout: no reply within ``timeout`` seconds.
            Closed: the queue was closed.
            ConfigError, TypeError, MessageTooLarge, TransportError: as :meth:`push`.
        """
        fut = self.request_future(dest, msg, timeout=timeout, mailbox=mailbox)
        self._wait_future(fut, _monotonic() + timeout)
        return fut.result(timeout=0)

    def _wait_future(self, fut: Future[Any], deadline: float) -> None:
        if self._heap:
            self.flush()
        while not fut.done():
            if self._closed:
                raise Closed("queue is closed")
            remaining = deadline - _monotonic()
            if remaining <= 0:
                fut.cancel()
                raise Timeout("no reply in time")
            self._read_blocking(remaining, fut=fut)

    # -- the I/O thread ----------------------------------------------------

    def _io_loop(self) -> None:
        # SIGINT and SIGTERM go to the application's threads, not this one:
        # Python runs signal handlers in the main thread only, and a signal
        # the kernel gave this thread would not interrupt a main thread
        # blocked in a system call, so Ctrl-C or a TERM could wait for it.
        signal.pthread_sigmask(signal.SIG_BLOCK, (signal.SIGINT, signal.SIGTERM))
        sock: Any = self._sock
        wake: Any = self._wake_r
        yield_until = float("-inf")
        yield_for = _YIELD_TO_READER
        heartbeat = self.config.timeout
        seen_arms = self._arms
        while not self._closed:
            # Announce "about to sleep" before reading the deadlines, so a
            # push that arms one meanwhile sees it must wake us.
            self._io_sleep_until = float("inf")
            now = _monotonic()
            # Off the socket while the application reads it itself: a wake
            # for a timer must not turn into a wake on the application's next
            # datagram (a GIL hand-off for it); the reliability timers are
            # then the reading application's to fire.
            back_at = max(yield_until, self._app_read_at + _APP_READING)
            reading = now >= back_at
            deadline = self._next_deadline(reliable=reading)
            if deadline is None and self._arms != seen_arms:
                # Batches are being opened: wake again within one timeout
                # rather than sleep for good, so that the next batch's
                # deadline needs no wake-up through the pipe (one system
                # call and a thread switch per batch). Once a timeout passes
                # without a new batch, sleep until woken.
                seen_arms = self._arms
                deadline = now + heartbeat
            if not reading:
                deadline = back_at if deadline is None else min(deadline, back_at)
            timeout = None if deadline is None else max(deadline - now, 0.0)
            self._io_sleep_until = float("inf") if deadline is None else deadline
            fds = [sock, wake] if reading else [wake]
            try:
                readable, _, _ = select.select(fds, [], [], timeout)
            except (OSError, ValueError):
                break  # closed under us
            self._io_sleep_until = float("-inf")
            if self._stopping():
                break
            if wake in readable:
                try:
                    os.read(wake, 4096)
                except OSError:
                    pass
            if sock in readable:
                now = _monotonic()
                if self._receiver.queued() >= self._backlog:
                    # The application is behind: datagrams wait in the
                    # kernel's buffer rather than overfill the mailboxes,
                    # which would drop what the kernel would have kept.
                    yield_until = now + _YIELD_TO_READER
                elif now - self._app_read_at >= _APP_READING and self._rx_lock.acquire(blocking=False):
                    yield_for = _YIELD_TO_READER
                    try:
                        if self._drain(_DRAIN_BATCH, backlog=self._backlog):
                            self._io_delivered = True
                    finally:
                        self._rx_lock.release()
                else:
                    # The application reads the socket itself (a caller is
                    # blocked reading, or read moments ago): stay off it
                    # (each wake on its datagrams costs it a GIL hand-off),
                    # longer each time it is found there again.
                    yield_until = now + yield_for
                    yield_for = min(yield_for * 2, _YIELD_MAX)
            self._fire_deadlines(_monotonic())

    def _stopping(self) -> bool:
        # A method, not the attribute, because close() flips it from
        # another thread while this loop runs.
        return self._closed

    def _fire_deadlines(self, now: float) -> None:
        with self._timer_lock:
            due = self._batcher.due(now)
        for s in due:
            try:
                self._send_stream(s, now, raise_errors=False, force=False)
            except Closed:
                return
        if self._receiver.partials:
            with self._rx_lock:
                self._receiver.expire(now)
        self._expire_requests(now)
        self._fire_reliable(now)

    # -- lifecycle and statistics ------------------------------------------

    def close(self) -> None:
        """Send everything batched, stop the I/O thread and close the socket.

        Pending requests fail with :class:`Closed`. Calling it again does nothing.
        """
        if self._closed:
            return
        try:
            self.flush()
        except TransportError:
            pass  # counted in stats(); closing goes on
        if self._rel.unacked and self.config.linger > 0:
            try:
                self.drain(self.config.linger)
            except Exception:  # noqa: BLE001 - closing goes on; what is left is reported below
                pass
        # Not under the receive lock: a reader may hold it, blocked in recv
        # until close wakes it (the STATUS is taken under the state lock).
        self._settle_owed()
        self._closed = True
        self._cache.clear()
        self._icache.clear()
        self._forget_memo()
        self._batcher.close()  # every push, bound senders' too, now reaches the closed check
        # A push that raced close() may have appended after the flush: send
        # it if the socket still allows, count it otherwise.
        try:
            self.flush()
        except TransportError:
            pass
        self._wake_io()
        self._wake_reader()
        self._io_thread.join(timeout=2.0)
        with self._rx_lock:
            self._sock.close()
        if self._mmsg is not None:
            with self._timer_lock:  # no send in flight on its descriptor
                self._mmsg.close()
        # A push racing close() in another thread must not write to a pipe
        # whose descriptor number the OS may already have handed out again.
        self._pipe_open = False
        os.close(self._wake_r)
        os.close(self._wake_w)
        with self._req_lock:
            attempts = self._pending.drain()
        for attempt in attempts:
            if not attempt.future.done():
                attempt.future.set_exception(Closed("queue closed before the reply came"))
        self._send_drops["closed"] += sum(len(s.frames) for s in self._batcher.pending_streams())
        self._rel.close()
        self._report_failures()
        self._room_made()

    def _wake_reader(self) -> None:
        # A thread blocked in recvfrom is not woken by close(); shutdown() is
        # (on an unconnected UDP socket Linux says ENOTCONN but still wakes
        # the reader, whose recvfrom returns no address).
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def __enter__(self) -> Queue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # Best effort only: an endpoint that is never closed still has a
        # daemon thread holding a reference, so this rarely runs.
        if not getattr(self, "_closed", True):
            try:
                self.close()
            except Exception:  # noqa: BLE001
                pass
