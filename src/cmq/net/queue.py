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
the order they were read. When the I/O thread finds that lock taken, a caller
is reading, and it leaves the socket alone for a couple of milliseconds.

The *I/O thread* also fires deadlines: batch timeouts, request timeouts and
reassembly expiry. It sleeps in ``select`` until the earliest deadline; a push
that arms an earlier one wakes it through a pipe (once per batch, not per
message).
"""

from __future__ import annotations

import os
import secrets
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any, Final

import msgpack

from cmq._config import QueueConfig
from cmq._errors import Closed, ConfigError, MessageTooLarge, Timeout, TransportError
from cmq._types import Address, Message, Stats
from cmq.net._sock import kernel_drops, membership, open_socket, parse_address, resolve
from cmq.patterns.pending import PendingTable
from cmq.wire.batcher import FULL, LARGE, OPENED, Batcher, Stream
from cmq.wire.receiver import ENVELOPE_BIT, KIND_REPLY, KIND_REQUEST, Meta, Receiver

__all__ = ["Queue"]

#: How long the I/O thread leaves the socket to a caller that is reading it.
_YIELD_TO_READER: Final = 0.002
#: Datagrams read in one go before the reader lets others run.
_DRAIN_BATCH: Final = 256
_ENVELOPE = struct.Struct(">BQ")
_MAX_MAILBOX: Final = ENVELOPE_BIT - 1
_monotonic = time.monotonic

OnTimeout = Callable[[int], Any]


class _Attempt:
    """One try of a request: resolves ``future``; on timeout asks ``on_timeout``."""

    __slots__ = ("attempt", "dest", "future", "mailbox", "on_timeout", "timeout")

    def __init__(
        self,
        future: Future[Any],
        dest: Any,
        mailbox: int,
        timeout: float,
        on_timeout: OnTimeout | None,
        attempt: int,
    ) -> None:
        self.future = future
        self.dest = dest
        self.mailbox = mailbox
        self.timeout = timeout
        self.on_timeout = on_timeout
        self.attempt = attempt


def _check_mailbox(mailbox: Any) -> int:
    if not isinstance(mailbox, int) or isinstance(mailbox, bool) or not 0 <= mailbox <= _MAX_MAILBOX:
        raise ConfigError(f"mailbox={mailbox!r}: must be an integer 0-{_MAX_MAILBOX}")
    return mailbox


class Queue:
    """A cmq endpoint: a UDP socket with batching, mailboxes and requests.

    ``Queue(port=0, host="0.0.0.0", **options)`` opens the endpoint (the CMQ
    paper's ``newRq``); ``options`` are :class:`cmq.QueueConfig` fields, or
    pass ``config=``. Use it as a context manager, or call :meth:`close`,
    which sends everything still batched.

    Raises:
        ConfigError: a bad option, host or port.
        TransportError: the port is in use or the OS refuses the socket.
    """

    def __init__(
        self,
        port: int = 0,
        host: str = "0.0.0.0",
        *,
        config: QueueConfig | None = None,
        multicast_interface: str | None = None,
        **options: Any,
    ) -> None:
        self.config = cfg = QueueConfig.from_options(config, options)
        self._sock = open_socket(host, port, cfg)
        self._family = self._sock.family
        self._multicast_interface = multicast_interface
        if multicast_interface is not None and self._family == socket.AF_INET:
            self._sock.setsockopt(
                socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(multicast_interface)
            )
        self.sender_id = secrets.randbits(32) or 1
        self._batcher = Batcher(cfg, self.sender_id)
        self._receiver = Receiver(cfg)
        self._mailboxes = self._receiver.mailboxes
        self._raw = cfg.codec == "raw"
        self._packb = msgpack.Packer(use_bin_type=True).pack
        self._max_message = cfg.max_message
        # (dest as the caller spelled it, mailbox) -> stream. Cleared on
        # close, so the hot path needs no closed check.
        self._cache: dict[tuple[Any, int], Stream] = {}
        # The same for request/response streams, which user pushes cannot reach.
        self._icache: dict[tuple[Any, int], Stream] = {}
        self._tx_lock = threading.Lock()
        self._rx_lock = threading.Lock()
        self._req_lock = threading.Lock()
        self._pending: PendingTable[_Attempt] = PendingTable()
        self._buf = bytearray(65536)
        self._view = memoryview(self._buf)
        self._send_drops: dict[str, int] = {"send_failed": 0, "late_reply": 0, "closed": 0}
        self._last_send_error: OSError | None = None
        self._rcvtimeo: float | None = None
        self._closed = False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        # When the I/O thread sleeps, until when; -inf while it is awake.
        self._io_sleep_until = float("-inf")
        self._forget_memo: Callable[[], None] = lambda: None
        self.push = self._make_push()  # type: ignore[method-assign]
        self._io_thread = threading.Thread(target=self._io_loop, name=f"cmq-io-{self.address[1]}", daemon=True)
        self._io_thread.start()

    # -- identity ----------------------------------------------------------

    @property
    def address(self) -> Address:
        """The bound socket address, e.g. ``("0.0.0.0", 4711)``."""
        return tuple(self._sock.getsockname())

    @property
    def port(self) -> int:
        """The bound UDP port."""
        return int(self._sock.getsockname()[1])

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{self.address[0]}:{self.address[1]}"
        return f"<cmq.Queue {state} codec={self.config.codec}>"

    # -- sending -----------------------------------------------------------

    def push(self, dest: Any, msg: Any, mailbox: int = 0) -> None:
        """Queue ``msg`` for ``dest`` (``(host, port)`` or ``"host:port"``), mailbox ``mailbox``.

        Never blocks on the network. The message leaves at once when the
        destination is idle, else with the batch it joins: when the batch
        holds ``qthresh`` bytes or its oldest message is ``timeout`` old.

        Raises:
            ConfigError: a bad address, unresolvable host or bad mailbox.
            TypeError: ``msg`` is not bytes-like (codec ``raw``) or not
                MessagePack-able (codec ``msgpack``).
            MessageTooLarge: ``msg`` is over ``max_message``; nothing was sent.
            TransportError: the OS refused to send a datagram this call flushed.
            Closed: the queue was closed.
        """
        # The instance's push is the closure made by _make_push (same
        # behaviour, fewer lookups); this method is what it runs as.
        self._make_push()(dest, msg, mailbox)

    def _make_push(self) -> Callable[..., None]:
        """The hot path of push, with everything it needs in closure cells.

        The last destination is remembered by identity, so a loop pushing to
        one destination object skips hashing it.
        """
        cache = self._cache
        stream_for = self._stream_for
        bpush = self._batcher.push
        after = self._after_push
        encode = self._encode
        raw = self._raw
        memo: list[Any] = [object(), -1, None]

        def push(dest: Any, msg: Any, mailbox: int = 0) -> None:
            if dest is memo[0] and mailbox == memo[1]:
                s = memo[2]
            else:
                try:
                    s = cache[dest, mailbox]
                except (KeyError, TypeError):
                    s = stream_for(dest, mailbox)
                memo[0], memo[1], memo[2] = dest, mailbox, s
            payload = msg if raw and type(msg) is bytes else encode(msg)
            r = bpush(s, payload)
            if r:
                after(s, r, payload)

        def forget() -> None:
            memo[0], memo[1], memo[2] = object(), -1, None

        self._forget_memo = forget
        return push

    def _encode(self, msg: Any) -> bytes:
        if self._raw:
            if isinstance(msg, bytes | bytearray | memoryview):
                return bytes(msg)
            raise TypeError(f"codec 'raw' sends bytes-like messages, not {type(msg).__name__}")
        try:
            data: bytes = self._packb(msg)
            return data
        except (TypeError, ValueError, OverflowError) as exc:
            raise TypeError(f"cannot encode {type(msg).__name__} as MessagePack: {exc}") from exc

    def _stream_for(self, dest: Any, mailbox: int, cache: dict[tuple[Any, int], Stream] | None = None) -> Stream:
        if self._closed:
            raise Closed("queue is closed")
        if cache is None:
            cache = self._cache
            _check_mailbox(mailbox)
        host, port = parse_address(dest)
        addr = resolve(host, port, self._family)
        s = self._batcher.stream(addr, mailbox)
        try:
            cache[(dest, mailbox)] = s
        except TypeError:
            pass  # an unhashable spelling (a list): resolved every time
        return s

    def _push_envelope(self, dest: Any, kind: int, corr: int, body: bytes, mailbox: int) -> Stream:
        """Push a request or reply: the envelope is outside the user's payload and mailbox range."""
        mailbox |= ENVELOPE_BIT
        try:
            s = self._icache[(dest, mailbox)]
        except (KeyError, TypeError):
            s = self._stream_for(dest, mailbox, self._icache)
        payload = _ENVELOPE.pack(kind, corr) + body
        r = self._batcher.push(s, payload)
        if r:
            self._after_push(s, r, payload)
        return s

    def _after_push(self, s: Stream, r: int, payload: bytes) -> None:
        now = _monotonic()
        if r == OPENED:
            if self._batcher.is_idle(s, now):
                self._send_stream(s, now)
            else:
                deadline = self._batcher.arm(s, now)
                if deadline < self._io_sleep_until:
                    self._wake_io()
        elif r == FULL:
            self._send_stream(s, now)
        elif r == LARGE:
            if len(payload) > self._max_message:
                raise MessageTooLarge(
                    f"message of {len(payload)} bytes is over max_message={self._max_message}"
                )
            with self._tx_lock:
                datagrams = self._batcher.fragments(s, payload, now)
                try:
                    self._send_all(datagrams, s.addr, raise_errors=True)
                finally:
                    s.last_send = _monotonic()

    def _send_stream(self, s: Stream, now: float, *, raise_errors: bool = True) -> None:
        with self._tx_lock:
            datagrams = self._batcher.take(s, now)
            if datagrams:
                try:
                    self._send_all(datagrams, s.addr, raise_errors=raise_errors)
                finally:
                    # The idle gap counts from when the link took the last
                    # datagram, not from when we started sending it.
                    s.last_send = _monotonic()

    def _send_all(self, datagrams: list[bytes], addr: Address, *, raise_errors: bool) -> None:
        sendto = self._sock.sendto
        error: OSError | None = None
        for d in datagrams:
            try:
                sendto(d, addr)
            except OSError as exc:
                self._send_drops["send_failed"] += 1
                self._last_send_error = error = exc
        if error is not None and raise_errors:
            raise TransportError(f"sending to {addr[0]}:{addr[1]} failed: {error.strerror or error}") from error

    def flush(self) -> int:
        """Send every batched message now; returns how many batches were sent.

        Raises:
            TransportError: the OS refused a datagram (the others were still sent).
        """
        now = _monotonic()
        streams = self._batcher.pending_streams()
        error: TransportError | None = None
        for s in streams:
            try:
                self._send_stream(s, now)
            except TransportError as exc:
                error = exc
        if error is not None:
            raise error
        return len(streams)

    def _wake_io(self) -> None:
        try:
            os.write(self._wake_w, b"\0")
        except (BlockingIOError, OSError):
            pass  # the pipe is full (a wake is pending anyway) or closed

    # -- multicast ---------------------------------------------------------

    def join(self, group: str, interface: str | None = None) -> None:
        """Receive datagrams sent to multicast ``group`` on this endpoint's port.

        ``interface`` is the local address (IPv4) or interface name (IPv6)
        to join on; None lets the kernel choose (use ``"127.0.0.1"`` on
        loopback). Push to ``(group, port)`` to send to every member.

        Raises:
            ConfigError: ``group`` is not a multicast address of this endpoint's family.
            TransportError: the OS refused the membership.
        """
        self._membership(group, interface or self._multicast_interface, join=True)

    def leave(self, group: str, interface: str | None = None) -> None:
        """Stop receiving multicast ``group`` (see :meth:`join`).

        Raises:
            ConfigError: not a multicast address.
            TransportError: the OS refused (for example, not a member).
        """
        self._membership(group, interface or self._multicast_interface, join=False)

    def _membership(self, group: str, interface: str | None, *, join: bool) -> None:
        family, level, mreq = membership(group, interface)
        if family != self._family:
            raise ConfigError(f"group {group} is not of this endpoint's address family")
        if family == socket.AF_INET:
            opt = socket.IP_ADD_MEMBERSHIP if join else socket.IP_DROP_MEMBERSHIP
        else:
            opt = socket.IPV6_JOIN_GROUP if join else socket.IPV6_LEAVE_GROUP
        try:
            self._sock.setsockopt(level, opt, mreq)
        except OSError as exc:
            verb = "join" if join else "leave"
            raise TransportError(f"cannot {verb} multicast group {group}: {exc.strerror}") from exc

    # -- receiving ---------------------------------------------------------

    def pop(self, mailbox: int = 0) -> Any:
        """The next message of ``mailbox``, or None when there is none. Never blocks.

        Raises:
            Closed: the queue was closed and nothing is left.
        """
        try:
            return self._mailboxes[mailbox].popleft()[0]
        except (KeyError, IndexError):
            pass
        self._poll()
        try:
            return self._mailboxes[mailbox].popleft()[0]
        except (KeyError, IndexError):
            if self._closed:
                raise Closed("queue is closed") from None
            return None

    def pop_message(self, mailbox: int = 0) -> Message | None:
        """Like :meth:`pop`, but the :class:`Message` with its sender, or None."""
        try:
            item = self._mailboxes[mailbox].popleft()
        except (KeyError, IndexError):
            self._poll()
            try:
                item = self._mailboxes[mailbox].popleft()
            except (KeyError, IndexError):
                if self._closed:
                    raise Closed("queue is closed") from None
                return None
        return _message(item)

    def pop_many(self, limit: int = 1 << 30, mailbox: int = 0) -> list[Any]:
        """Up to ``limit`` waiting messages of ``mailbox`` (possibly none). Never blocks."""
        dq = self._mailboxes.get(mailbox)
        if not dq:
            self._poll()
            dq = self._mailboxes.get(mailbox)
            if not dq:
                if self._closed:
                    raise Closed("queue is closed")
                return []
        out: list[Any] = []
        popleft = dq.popleft
        append = out.append
        try:
            for _ in range(min(limit, len(dq))):
                append(popleft()[0])
        except IndexError:
            pass  # another consumer took some
        return out

    def get(self, timeout: float | None = None, mailbox: int = 0) -> Any:
        """The next message of ``mailbox``, waiting up to ``timeout`` seconds (None: forever).

        Anything batched is sent before waiting, so a request pushed just
        before never waits for its batch timeout.

        Raises:
            Timeout: nothing arrived in time.
            Closed: the queue was closed.
        """
        try:
            return self._mailboxes[mailbox].popleft()[0]
        except (KeyError, IndexError):
            return self._wait_item(mailbox, timeout, None)[0]

    def get_message(self, timeout: float | None = None, mailbox: int = 0) -> Message:
        """Like :meth:`get`, but the :class:`Message` with its sender.

        Raises:
            Timeout: nothing arrived in time.
            Closed: the queue was closed.
        """
        return _message(self._wait_item(mailbox, timeout, None))

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

    def _take_item(self, mailbox: int, predicate: Callable[[Any], bool] | None) -> tuple[Any, Meta] | None:
        dq = self._mailboxes.get(mailbox)
        if not dq:
            return None
        if predicate is None:
            try:
                return dq.popleft()
            except IndexError:
                return None
        for i, item in enumerate(dq):
            if predicate(item[0]):
                del dq[i]
                return item
        return None

    def _wait_item(
        self, mailbox: int, timeout: float | None, predicate: Callable[[Any], bool] | None
    ) -> tuple[Any, Meta]:
        deadline = None if timeout is None else _monotonic() + timeout
        if self._batcher.armed:
            self.flush()
        while True:
            item = self._take_item(mailbox, predicate)
            if item is not None:
                return item
            if self._closed:
                raise Closed("queue is closed")
            remaining = None if deadline is None else deadline - _monotonic()
            if remaining is not None and remaining <= 0:
                raise Timeout(f"no message in mailbox {mailbox} within {timeout} s")
            self._read_blocking(remaining, lambda: self._take_ready(mailbox, predicate))

    def _take_ready(self, mailbox: int, predicate: Callable[[Any], bool] | None) -> bool:
        dq = self._mailboxes.get(mailbox)
        if not dq:
            return False
        return predicate is None or any(predicate(item[0]) for item in dq)

    # -- the receive path ---------------------------------------------------

    def _poll(self) -> None:
        """Drain what the kernel holds, without blocking, unless another thread is reading."""
        if self._closed or not self._rx_lock.acquire(blocking=False):
            return
        try:
            self._drain(_DRAIN_BATCH)
        finally:
            self._rx_lock.release()

    def _drain(self, limit: int) -> int:
        """Read up to ``limit`` datagrams without blocking (receive lock held)."""
        recv = self._sock.recvfrom_into
        buf, view = self._buf, self._view
        received = self._receiver.datagram_received
        flag = socket.MSG_DONTWAIT
        count = 0
        while count < limit:
            try:
                n, addr = recv(buf, 0, flag)
            except BlockingIOError:
                break
            except OSError:
                if self._closed:
                    break
                continue  # e.g. an ICMP error reported on the socket: nothing to read
            if addr is None:
                break  # shut down by close()
            received(view[:n].tobytes(), addr, _monotonic())
            count += 1
        if self._receiver.replies:
            self._resolve_replies()
        return count

    def _read_blocking(self, remaining: float | None, ready: Callable[[], bool]) -> None:
        """Wait for datagrams in this thread, up to ``remaining`` seconds, and deliver them."""
        if not self._rx_lock.acquire(timeout=-1 if remaining is None else max(remaining, 0)):
            return
        try:
            if ready() or self._closed:
                return
            self._set_rcvtimeo(remaining)
            try:
                n, addr = self._sock.recvfrom_into(self._buf)
            except (BlockingIOError, TimeoutError):
                return
            except OSError:
                return  # closed under us, or an ICMP error; the caller's loop decides
            if addr is None:
                return  # shut down by close()
            self._receiver.datagram_received(self._view[:n].tobytes(), addr, _monotonic())
            # Whatever arrived with it is taken in too, in order.
            self._drain(_DRAIN_BATCH)
        finally:
            self._rx_lock.release()

    def _set_rcvtimeo(self, remaining: float | None) -> None:
        # SO_RCVTIMEO makes the blocking read one system call; it is only
        # changed when the wait differs, which for a steady request loop is
        # once. Rounded to whole microseconds, 0 meaning "wait forever".
        want = 0.0 if remaining is None else max(remaining, 1e-6)
        if want != self._rcvtimeo:
            sec = int(want)
            usec = int((want - sec) * 1e6)
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("@ll", sec, usec))
            self._rcvtimeo = want

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

    def request_future(
        self,
        dest: Any,
        msg: Any,
        timeout: float = 1.0,
        mailbox: int = 0,
        on_timeout: OnTimeout | None = None,
    ) -> Future[Any]:
        """Send ``msg`` as a request; returns a future that resolves to the reply.

        The paper's future-type message passing: when no reply comes within
        ``timeout`` seconds, ``on_timeout(attempt)`` is called (attempt 1 is
        the first send). If it returns a message, that message *replaces*
        the request (a new attempt with a new correlation id, so a late reply
        to the old one is dropped and counted); if it returns None, the
        future fails with :class:`Timeout`. Without ``on_timeout`` the future
        fails at the first timeout. Callbacks run in the I/O thread or in
        the thread that read the reply; keep them short.

        Raises:
            ConfigError, TypeError, MessageTooLarge, TransportError, Closed: as :meth:`push`.
        """
        if not isinstance(timeout, int | float) or not timeout > 0:
            raise ConfigError(f"timeout={timeout!r}: must be a positive number of seconds")
        fut: Future[Any] = Future()
        self._send_attempt(_Attempt(fut, dest, _check_mailbox(mailbox), timeout, on_timeout, 1), msg)
        return fut

    def _send_attempt(self, attempt: _Attempt, msg: Any) -> None:
        body = self._encode(msg)
        with self._req_lock:
            corr = self._pending.new_id()
            deadline = _monotonic() + attempt.timeout
            self._pending.add(corr, attempt, deadline)
        try:
            self._push_envelope(attempt.dest, KIND_REQUEST, corr, body, attempt.mailbox)
        except BaseException:
            with self._req_lock:
                self._pending.resolve(corr)
            raise
        if deadline < self._io_sleep_until:
            self._wake_io()

    def reply(self, message: Message, response: Any) -> None:
        """Answer a request received as ``message`` (from :meth:`get_message`).

        Raises:
            ConfigError: ``message`` is not a request.
            TypeError, MessageTooLarge, TransportError, Closed: as :meth:`push`.
        """
        if message.correlation is None:
            raise ConfigError("this message is not a request; nothing waits for a reply")
        s = self._push_envelope(
            message.sender, KIND_REPLY, message.correlation, self._encode(response), message.mailbox
        )
        # A reply ends an exchange: send it now rather than wait for more
        # traffic to the same requester.
        if s.frames:
            self._send_stream(s, _monotonic())

    def _resolve_replies(self) -> None:
        replies = self._receiver.replies
        while replies:
            try:
                corr, body, _addr = replies.popleft()
            except IndexError:
                break
            with self._req_lock:
                attempt = self._pending.resolve(corr)
            if attempt is None:
                self._send_drops["late_reply"] += 1
                continue
            if not attempt.future.done():
                try:
                    attempt.future.set_result(body)
                except Exception:  # noqa: BLE001 - cancelled meanwhile
                    pass

    def _expire_requests(self, now: float) -> None:
        with self._req_lock:
            expired = self._pending.expired(now)
        for attempt in expired:
            fut = attempt.future
            if fut.done():
                continue
            replacement = None
            if attempt.on_timeout is not None:
                try:
                    replacement = attempt.on_timeout(attempt.attempt)
                except Exception as exc:  # noqa: BLE001 - the remedy failed: report it
                    fut.set_exception(exc)
                    continue
            if replacement is None:
                fut.set_exception(Timeout(f"no reply after {attempt.attempt} attempt(s)"))
                continue
            nxt = _Attempt(fut, attempt.dest, attempt.mailbox, attempt.timeout, attempt.on_timeout, attempt.attempt + 1)
            try:
                self._send_attempt(nxt, replacement)
            except Exception as exc:  # noqa: BLE001
                fut.set_exception(exc)

    def _wait_future(self, fut: Future[Any], deadline: float) -> None:
        if self._batcher.armed:
            self.flush()
        while not fut.done():
            if self._closed:
                raise Closed("queue is closed")
            remaining = deadline - _monotonic()
            if remaining <= 0:
                fut.cancel()
                raise Timeout("no reply in time")
            self._read_blocking(remaining, fut.done)

    # -- the I/O thread ----------------------------------------------------

    def _next_deadline(self) -> float | None:
        candidates = [self._batcher.next_deadline(), self._receiver.next_deadline()]
        with self._req_lock:
            candidates.append(self._pending.next_deadline())
        due = [d for d in candidates if d is not None]
        return min(due) if due else None

    def _io_loop(self) -> None:
        sock: Any = self._sock
        wake: Any = self._wake_r
        yield_until = float("-inf")
        while not self._closed:
            # Announce "about to sleep" before reading the deadlines, so a
            # push that arms one meanwhile sees it must wake us.
            self._io_sleep_until = float("inf")
            now = _monotonic()
            deadline = self._next_deadline()
            reading = now >= yield_until
            if not reading:
                deadline = yield_until if deadline is None else min(deadline, yield_until)
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
                if self._rx_lock.acquire(blocking=False):
                    try:
                        self._drain(_DRAIN_BATCH)
                    finally:
                        self._rx_lock.release()
                else:
                    yield_until = _monotonic() + _YIELD_TO_READER
            self._fire_deadlines(_monotonic())

    def _stopping(self) -> bool:
        # A method, not the attribute, because close() flips it from
        # another thread while this loop runs.
        return self._closed

    def _fire_deadlines(self, now: float) -> None:
        for s in self._batcher.due(now):
            try:
                self._send_stream(s, now, raise_errors=False)
            except Closed:
                return
        if self._receiver.partials:
            with self._rx_lock:
                self._receiver.expire(now)
        self._expire_requests(now)

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
        self._closed = True
        self._cache.clear()
        self._icache.clear()
        self._forget_memo()
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
        os.close(self._wake_r)
        os.close(self._wake_w)
        with self._req_lock:
            attempts = self._pending.drain()
        for attempt in attempts:
            if not attempt.future.done():
                attempt.future.set_exception(Closed("queue closed before the reply came"))
        self._send_drops["closed"] += sum(len(s.frames) for s in self._batcher.pending_streams())

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

    def stats(self) -> Stats:
        """A frozen snapshot of this endpoint's counters."""
        b, r = self._batcher, self._receiver
        dropped = dict(r.dropped)
        dropped.update(self._send_drops)
        return Stats(
            messages_sent=b.messages_sent,
            messages_received=r.messages_received,
            datagrams_sent=b.datagrams_sent,
            datagrams_received=r.datagrams_received,
            bytes_sent=b.bytes_sent,
            bytes_received=r.bytes_received,
            fragments_sent=b.fragments_sent,
            datagrams_missing=r.datagrams_missing,
            datagrams_late=r.datagrams_late,
            queued=r.queued(),
            pending=sum(s.pending for s in b.pending_streams()),
            destinations=b.destinations,
            requests_pending=len(self._pending),
            dropped=dropped,
            kernel_drops=None if self._closed else kernel_drops(self._sock),
        )


def _message(item: tuple[Any, Meta]) -> Message:
    payload, (addr, sender, mailbox, seq, corr) = item
    return Message(payload=payload, sender=addr, sender_id=sender, mailbox=mailbox, seq=seq, correlation=corr)

