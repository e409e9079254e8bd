"""What the threaded and the asyncio drivers share: one endpoint's state and rules.

:class:`Endpoint` owns the socket, the sans-IO batcher and receiver, the
request table and the codec, and implements everything that does not wait:
``push``, ``pop``, ``reply``, multicast membership and ``stats``. A driver
subclass supplies how a stream's datagrams are sent (``_transmit``) and how a
lone datagram is (``_send_to``), how a new deadline reaches its timer
(``_deadline_armed``), how the socket is drained without blocking
(``_poll``), how a push waits for room in a full send buffer
(``_wait_room``), and the kind of future requests resolve.

Reliable streams (:mod:`cmq.wire.reliable`): every datagram a stream's batch
becomes goes through :meth:`Endpoint._emit`, which buffers it and sends what
the receiver's credit allows. What the receiver reports (STATUS records,
read by whichever thread reads the socket) is applied under the batch lock
by :meth:`Endpoint._after_read`, which also sends the STATUS this endpoint
owes its own senders.
"""

from __future__ import annotations

import ipaddress
import secrets
import socket
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from typing import Any, ClassVar, Final, Protocol

import msgpack

from cmq import _impl
from cmq._config import QueueConfig
from cmq._errors import Closed, ConfigError, MessageTooLarge, Timeout, TransportError, WouldBlock
from cmq._types import Address, Message, Stats
from cmq.net._sock import kernel_drops, membership, open_socket, parse_address, queue_delay, resolve
from cmq.wire.batcher import LARGE, Batcher, Stream
from cmq.wire.pending import PendingTable
from cmq.wire.receiver import (
    EMPTY,
    ENVELOPE_BIT,
    KIND_REPLY,
    KIND_REQUEST,
    Mailbox,
    Meta,
    Receiver,
    envelope,
)
from cmq.wire.reliable import DeliveryFailure, ReliableSender

__all__ = ["Endpoint", "OnTimeout", "message_of", "send_error"]

_MAX_MAILBOX: Final = ENVELOPE_BIT - 1
#: Unacknowledged bytes past which a pushing thread reads acknowledgements itself.
_ACK_POLL_BYTES: Final = 64 * 1024
#: Delivery failures kept for :meth:`Endpoint.failures`.
_KEEP_FAILURES: Final = 1024
#: Datagrams in one read from which the last one's wait in the kernel is
#: measured (Receiver.queue_delay): fewer found the queue about empty.
_QUEUE_SAMPLE: Final = 4


def _is_multicast(addr: Address) -> bool:
    try:
        return ipaddress.ip_address(addr[0]).is_multicast
    except ValueError:
        return False

OnTimeout = Callable[[int], Any]


class _FutureLike(Protocol):
    def done(self) -> bool: ...
    def set_result(self, result: Any, /) -> None: ...
    def set_exception(self, exception: BaseException, /) -> None: ...
    def cancel(self) -> bool: ...


class _Attempt:
    """One try of a request: resolves ``future``; on timeout asks ``on_timeout``."""

    __slots__ = ("attempt", "dest", "future", "mailbox", "on_timeout", "timeout")

    def __init__(
        self,
        future: _FutureLike,
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


class _NoLock:
    """Stands in for a lock where one thread does everything (asyncio)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


class Endpoint(ABC):
    """Shared state and non-waiting operations of a cmq endpoint (see module doc).

    On the compiled core, the fields that a push and a blocking read touch
    (``_closed``, ``_app_read_at``, ``_rel_at`` and the read's settings) are
    C members (``_speedups.EndpointState``: see :func:`cmq._impl.new_object`).
    """

    _kind: ClassVar[str] = "Endpoint"

    def __new__(cls, *args: Any, **kwargs: Any) -> Endpoint:
        return _impl.new_object(cls, "EndpointState")

    def __init__(
        self,
        port: int,
        host: str,
        config: QueueConfig | None,
        multicast_interface: str | None,
        options: dict[str, Any],
        *,
        lock: Callable[[], Any] = _NoLock,
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
        # Empty while no batch is open: tested on every flush and blocking read.
        self._heap = self._batcher.heap
        self._receiver = Receiver(cfg, self.sender_id)
        try:
            # The kernel reports twice what it was asked for (its bookkeeping).
            self._receiver.set_kernel_budget(self._sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) // 2)
        except OSError:
            pass
        self._reliable = cfg.delivery != "best-effort"
        self._ordered = cfg.delivery == "reliable"
        self._rel = ReliableSender(
            self.sender_id,
            codec_msgpack=cfg.codec == "msgpack",
            key=cfg.key,
            max_probes=cfg.max_probes,
        )
        self._send_buffer = cfg.send_buffer
        self._send_total = cfg.max_send_buffered
        # The earliest reliability timer (probe timeout or STATUS due), as
        # far as the threads that set them know: a thread reading the socket
        # bounds its wait by it and fires what is due itself.
        self._rel_at = float("inf")
        # Past this much unacknowledged, a pushing thread reads the
        # acknowledgements itself (one non-blocking read a batch): waiting for
        # the I/O thread to get the interpreter delays repairs, and a
        # receiver holds everything after a gap until its repair arrives.
        self._ack_poll_at = min(cfg.send_buffer // 4, _ACK_POLL_BYTES)
        self._failures: deque[DeliveryFailure] = deque(maxlen=_KEEP_FAILURES)
        self._mailboxes = self._receiver.mailboxes
        self._raw = cfg.codec == "raw"
        self._packb = msgpack.Packer(use_bin_type=True).pack
        # The Message of a delivered item: message_of, or its compiled twin.
        sp = _impl.speedups
        self._message_of: Callable[[tuple[Any, Meta]], Message] = (
            message_of if sp is None else sp.MessageOf(Message)
        )
        self._max_message = cfg.max_message
        # mailbox -> dest as the caller spelled it -> stream. Cleared on
        # close, so the hot path needs no closed check. Nested rather than
        # keyed by a (dest, mailbox) tuple: a lookup makes no tuple and
        # usually finds the caller's own dest object as the key.
        self._cache: dict[int, dict[Any, Stream]] = {}
        # The same for request/response streams, which user pushes cannot reach.
        self._icache: dict[int, dict[Any, Stream]] = {}
        self._req_lock = lock()
        # Held by the thread reading the socket, one datagram (or a drain) at a time.
        self._rx_lock = lock()
        # Guards the batch state: the batcher's check, its deadline heap, and
        # each take with the sends of its datagrams (taken once per batch,
        # never per message).
        self._timer_lock = lock()
        # Held while the receiver's state changes under a datagram, and while
        # a STATUS is written from it: a report written by the timer thread
        # while a reader delivers could see a datagram's successor and not the
        # datagram, and name it missing (the sender would resend it). Held
        # for the processing only, never across a wait on the socket.
        self._state_lock = lock()
        self._pending: PendingTable[_Attempt] = PendingTable()
        self._buf = bytearray(65536)
        self._view = memoryview(self._buf)
        self._send_drops: dict[str, int] = {"send_failed": 0, "late_reply": 0, "closed": 0, "callback_failed": 0}
        self._last_send_error: OSError | None = None
        self._closed = False
        self._forget_memo: Callable[[], None] = lambda: None
        #: The slow half of a push: _after_append, or a driver's compiled
        #: twin of its commonest case (which calls _after_append for the rest).
        self._after: Callable[[Stream, Any, int], None] = self._after_append
        self.push = self._make_push()  # type: ignore[method-assign]

    # -- what a driver supplies ---------------------------------------------

    @abstractmethod
    def _now(self) -> float:
        """The driver's monotonic clock, in seconds."""

    @abstractmethod
    def _transmit(self, s: Stream, datagrams: list[bytes], *, raise_errors: bool = True) -> None:
        """Send ``s``'s ``datagrams``, in order (the batch lock is held) and set ``s.last_send``.

        Raises:
            TransportError: the OS refused one (only with ``raise_errors``).
        """

    @abstractmethod
    def _send_to(self, data: bytes, addr: Address) -> None:
        """Send one datagram (a control datagram or a retransmission); a refusal is counted, not raised."""

    @abstractmethod
    def _wait_room(self, s: Stream, deadline: float) -> bool:
        """Wait until reliable stream ``s``'s send buffer has room or ``deadline`` passes; whether it has."""

    @abstractmethod
    def _deadline_armed(self, deadline: float) -> None:
        """A batch or request deadline was added; make sure the timer fires by then."""

    @abstractmethod
    def _poll(self) -> None:
        """Drain what the kernel holds, without blocking."""

    @abstractmethod
    def _new_future(self) -> Any:
        """A future of the driver's kind, for a request's reply."""

    def _count_send_failure(self, exc: OSError) -> None:
        """A datagram the OS refused: counted, and kept for ``stats``."""
        self._send_drops["send_failed"] += 1
        self._last_send_error = exc

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
        return f"<cmq.{self._kind} {state} codec={self.config.codec}>"

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
        # Each instance's push is the closure made by _make_push in
        # __init__ (same behaviour, fewer lookups); this method documents it
        # and forwards to it when called through the class.
        self.__dict__["push"](dest, msg, mailbox)

    def _make_push(self) -> Callable[..., None]:
        """The hot path of push, with everything it needs in closure cells.

        The last (destination, mailbox) is remembered by identity, so a loop
        pushing to one destination object skips hashing it; then a push is
        the batcher's fast half inlined: a size check, an append and a
        comparison (see :mod:`cmq.wire.batcher`).
        """
        cache = self._cache
        stream_for = self._stream_for
        after = self._after
        append = self._batcher.append
        encode = self._encode
        raw = self._raw
        packb = self._packb
        sp = _impl.speedups
        if sp is not None:
            # The compiled twin of the closure below.
            compiled: Callable[..., None]
            compiled, self._forget_memo = sp.make_push(cache, stream_for, after, encode, raw, packb, self._batcher.large)
            return compiled
        last_dest: Any = object()
        last_mailbox = -1
        s = Stream(("0.0.0.0", 0), 0, 1)  # a placeholder: last_dest matches no destination

        def push(dest: Any, msg: Any, mailbox: int = 0) -> None:
            nonlocal last_dest, last_mailbox, s
            if dest is not last_dest or mailbox != last_mailbox:
                try:
                    s = cache[mailbox][dest]
                except (KeyError, TypeError):
                    s = stream_for(dest, mailbox)
                if type(dest) is tuple or type(dest) is str:
                    # Only immutable spellings: a list could change under us.
                    last_dest, last_mailbox = dest, mailbox
                else:
                    last_dest = object()
            if raw:
                payload = msg if type(msg) is bytes else encode(msg)
            else:
                try:
                    payload = packb(msg)
                except (TypeError, ValueError, OverflowError):
                    payload = encode(msg)  # raises the documented TypeError
            r = append(s, payload)
            if r:
                after(s, payload, r)

        def forget() -> None:
            nonlocal last_dest, last_mailbox
            last_dest, last_mailbox = object(), -1

        self._forget_memo = forget
        return push

    def sender(self, dest: Any, mailbox: int = 0) -> Callable[[Any], None]:
        """A push bound to one destination: ``send = q.sender(dest); send(msg)``.

        The same as ``push(dest, msg, mailbox)``, with the destination
        resolved once: the cheapest way to push many messages to one peer
        (as a connected socket is). It raises what :meth:`push` raises.

        Raises:
            ConfigError: a bad address, unresolvable host or bad mailbox.
            Closed: the queue was closed.
        """
        try:
            s = self._cache[mailbox][dest]
        except (KeyError, TypeError):
            s = self._stream_for(dest, mailbox)
        after = self._after
        append = self._batcher.append
        encode = self._encode
        raw = self._raw
        sp = _impl.speedups
        if sp is not None:
            bound: Callable[[Any], None] = sp.make_sender(s, after, encode, raw, self._batcher.large)
            return bound

        def send(msg: Any) -> None:
            payload = msg if raw and type(msg) is bytes else encode(msg)
            r = append(s, payload)
            if r:
                after(s, payload, r)

        return send

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

    def _stream_for(self, dest: Any, mailbox: int, cache: dict[int, dict[Any, Stream]] | None = None) -> Stream:
        if self._closed:
            raise Closed("queue is closed")
        if cache is None:
            cache = self._cache
            _check_mailbox(mailbox)
        host, port = parse_address(dest)
        addr = resolve(host, port, self._family)
        reliable = self._reliable and not _is_multicast(addr)
        s = self._batcher.stream(addr, mailbox, reliable=reliable)
        if reliable and s.rel is None:
            with self._timer_lock:
                if s.rel is None:
                    self._rel.attach(s, ordered=self._ordered)
        try:
            cache.setdefault(mailbox, {})[dest] = s
        except TypeError:
            pass  # an unhashable spelling (a list): resolved every time
        return s

    def flush(self) -> int:
        """Send every batched message now; returns how many batches were sent.

        Raises:
            TransportError: the OS refused a datagram (the others were still sent).
        """
        if not self._heap:
            return 0  # every open batch has a deadline: none is open
        now = self._now()
        with self._timer_lock:
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

    def _push_envelope(self, dest: Any, kind: int, corr: int, body: bytes, mailbox: int) -> Stream:
        """Push a request or reply: the envelope is outside the user's payload and mailbox range."""
        mailbox |= ENVELOPE_BIT
        try:
            s = self._icache[mailbox][dest]
        except (KeyError, TypeError):
            s = self._stream_for(dest, mailbox, self._icache)
        payload = envelope(kind, corr, body)
        r = self._batcher.append(s, payload)
        if r:
            self._after(s, payload, r)
        return s

    def _after_append(self, s: Stream, payload: bytes, r: int) -> None:
        """The slow half of push: the batcher's fast half answered ``r``, CHECK
        (the batch reached ``check_at``) or LARGE (see :mod:`cmq.wire.batcher`).

        Raises:
            Closed: the queue was closed (what was appended is dropped).
            WouldBlock: ``payload``'s reliable stream has a full send buffer
                and stayed full (``on_full``); ``payload`` was taken back.
            TransportError: as :meth:`push`.
        """
        if r == LARGE:
            self._large_payload(s, payload)
            return
        if self._closed:
            s.frames.clear()
            raise Closed("queue is closed")
        st = s.rel
        if st is not None and (st.nbytes >= self._ack_poll_at or self._rel.total >= self._send_total):
            # Much is unacknowledged: read the acknowledgements here rather
            # than wait for another thread to get the interpreter.
            self._poll_acks()
            if self._full(st):
                self._backpressure(s, payload)
        with self._timer_lock:
            out = self._batcher.advance(s, self._now)
            if out is None:
                return
            if type(out) is float:
                self._deadline_armed(out)
            elif out:
                self._emit(s, out, s.last_send)  # type: ignore[arg-type]

    def _send_stream(self, s: Stream, now: float, *, raise_errors: bool = True, force: bool = True) -> None:
        """Take ``s``'s batch and send its datagrams.

        Unless ``force``, a reliable stream's batch stays open while earlier
        datagrams wait for credit: it grows until it fills, or until the
        credit comes (:meth:`_on_controls` takes it then).
        """
        with self._timer_lock:
            if not force and s.rel is not None and s.rel.waiting:
                return
            datagrams = self._batcher.take(s, now)
            if datagrams:
                self._emit(s, datagrams, now, raise_errors=raise_errors)

    def _emit(
        self, s: Stream, datagrams: list[bytes], now: float, *, raise_errors: bool = True, whole: bytes | None = None
    ) -> None:
        """Send a stream's new datagrams (batch lock held): all of a best-effort
        stream's, and what the credit allows of a reliable one's (the rest wait
        in its buffer)."""
        st = s.rel
        if st is not None:
            rel = self._rel
            armed = st.pto_at
            # Stamped now, under the batch lock that orders every send of
            # the endpoint (not at the caller's earlier `now`): a datagram
            # sent after another then never carries an earlier stamp, which
            # the loss evidence relies on.
            stamp = self._now()
            if whole is None and rel.clear(st, len(datagrams)):
                # All within credit, nothing waiting (the common case): send
                # first and buffer after, so that the bookkeeping overlaps the
                # peer's work rather than delaying the datagram. A STATUS
                # cannot come between: it is applied under this same lock.
                try:
                    self._transmit(s, datagrams, raise_errors=raise_errors)
                finally:
                    rel.sent(st, datagrams, stamp)
                    if self._full(st):
                        self._batcher.hold(s)
                    if armed is None and st.pto_at is not None:
                        self._rel_timer(st.pto_at)
                return
            datagrams = rel.outgoing(st, datagrams, stamp, whole)
            if self._full(st):
                self._batcher.hold(s)  # the next push reaches _after_append's backpressure
            if armed is None and st.pto_at is not None:
                self._rel_timer(st.pto_at)
            if not datagrams:
                # Held for want of credit: the destination is busy, not idle,
                # so the next messages batch rather than leave one by one.
                self._batcher.sent(s, now)
                return
        self._transmit(s, datagrams, raise_errors=raise_errors)

    def _backpressure(self, s: Stream, payload: Any) -> None:
        """``s``'s send buffer is full: wait for room (``on_full="block"``) or raise.

        Raises:
            WouldBlock: no room (at once, or after ``push_timeout``); the
                message is taken back out of the batch, not sent.
        """
        cfg = self.config
        if cfg.on_full == "block" and self._can_block():
            if self._wait_room(s, self._now() + cfg.push_timeout):
                return
            why = f"no room within push_timeout={cfg.push_timeout} s"
        else:
            why = "on_full='raise'" if cfg.on_full == "raise" else "an event loop must not block"
        frames = s.frames
        for i in range(len(frames) - 1, -1, -1):
            if frames[i] is payload:
                del frames[i]
                break
        else:
            if payload is not None:
                # Taken already: the acknowledgements read while it waited
                # gave credit, and its batch left with it. It is queued.
                return
        st = s.rel
        where = f"{s.addr[0]}:{s.addr[1]} mailbox {s.mailbox & ~ENVELOPE_BIT}"
        if st is not None and st.nbytes < self._send_buffer:
            what = (
                f"the endpoint's send buffers are full ({self._rel.total} of max_send_buffered="
                f"{self._send_total} bytes unacknowledged, all destinations)"
            )
        else:
            what = (
                f"send buffer to {where} is full ({st.nbytes if st else 0} of send_buffer="
                f"{self._send_buffer} bytes unacknowledged)"
            )
        raise WouldBlock(f"{what}; {why}: the message to {where} was not queued")

    def _full(self, st: Any) -> bool:
        """Whether reliable stream ``st``'s push must wait: its own buffer or all streams' are full."""
        return bool(st.nbytes >= self._send_buffer or self._rel.total >= self._send_total)

    def _room(self, st: Any) -> bool:
        """Whether a push to reliable stream ``st`` (None: best-effort) has room."""
        return st is None or not self._full(st)

    def _poll_acks(self) -> None:  # noqa: B027 - a hook: only the threaded driver reads here
        """Read what the socket holds now, if no other thread is reading (the threaded driver)."""

    def _can_block(self) -> bool:
        """Whether push may wait (the threaded driver: yes; asyncio: never)."""
        return True

    def _large_payload(self, s: Stream, payload: bytes) -> None:
        """A payload too large for one datagram: refused, or sent as fragments after the batch."""
        if self._closed:
            raise Closed("queue is closed")
        if len(payload) > self._max_message:
            raise MessageTooLarge(f"message of {len(payload)} bytes is over max_message={self._max_message}")
        if s.rel is not None and self._full(s.rel):
            self._backpressure(s, None)
        # Under the batch lock like any take: the stream's sequence numbers
        # and the order of its datagrams must not interleave with a flush.
        with self._timer_lock:
            now = self._now()
            self._emit(s, self._batcher.fragments(s, payload, now), now, whole=payload)

    def resolve(self, dest: Any) -> Address:
        """The socket address ``dest`` resolves to, checking it as ``push`` would.

        Raises:
            ConfigError: a bad address or an unresolvable host.
        """
        host, port = parse_address(dest)
        return resolve(host, port, self._family)

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
        mb = self._mailboxes.get(mailbox)
        if mb is not None:
            payload = mb.pop()
            if payload is not EMPTY:
                return payload
        self._poll()
        mb = self._mailboxes.get(mailbox)
        if mb is not None:
            payload = mb.pop()
            if payload is not EMPTY:
                return payload
        if self._closed:
            raise Closed("queue is closed")
        return None

    def pop_message(self, mailbox: int = 0) -> Message | None:
        """Like :meth:`pop`, but the :class:`Message` with its sender, or None."""
        item = self._take_item(mailbox, None)
        if item is None:
            self._poll()
            item = self._take_item(mailbox, None)
            if item is None:
                if self._closed:
                    raise Closed("queue is closed")
                return None
        return self._message_of(item)

    def pop_many(self, limit: int = 1 << 30, mailbox: int = 0) -> list[Any]:
        """Up to ``limit`` waiting messages of ``mailbox`` (possibly none). Never blocks.

        Raises:
            Closed: the queue was closed and nothing is left.
        """
        mb = self._filled_mailbox(mailbox)
        return [] if mb is None else mb.take(limit)

    def pop_many_messages(self, limit: int = 1 << 30, mailbox: int = 0) -> list[Message]:
        """Like :meth:`pop_many`, but :class:`Message` objects with their senders."""
        mb = self._filled_mailbox(mailbox)
        if mb is None:
            return []
        make = self._message_of
        return [make(item) for item in mb.take_items(limit)]

    def _filled_mailbox(self, mailbox: int) -> Mailbox | None:
        """``mailbox`` after reading what the kernel holds if it was empty; None if still empty.

        Raises:
            Closed: the queue was closed and the mailbox is empty.
        """
        mb = self._mailboxes.get(mailbox)
        if mb is None or not mb.available():
            self._poll()
            mb = self._mailboxes.get(mailbox)
            if mb is None or not mb.available():
                if self._closed:
                    raise Closed("queue is closed")
                return None
        return mb

    def _take_item(self, mailbox: int, predicate: Callable[[Any], bool] | None) -> tuple[Any, Meta] | None:
        mb = self._mailboxes.get(mailbox)
        if mb is None:
            return None
        if predicate is None:
            return mb.pop_item()
        return mb.take_matching(predicate)

    def _take_ready(self, mailbox: int, predicate: Callable[[Any], bool] | None) -> bool:
        mb = self._mailboxes.get(mailbox)
        if mb is None:
            return False
        return mb.available() if predicate is None else mb.any_matching(predicate)

    # -- requests ----------------------------------------------------------

    def request_future(
        self,
        dest: Any,
        msg: Any,
        timeout: float = 1.0,
        mailbox: int = 0,
        on_timeout: OnTimeout | None = None,
    ) -> Any:
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
        fut = self._new_future()
        self._send_attempt(_Attempt(fut, dest, _check_mailbox(mailbox), timeout, on_timeout, 1), msg)
        return fut

    def _send_attempt(self, attempt: _Attempt, msg: Any) -> None:
        body = self._encode(msg)
        with self._req_lock:
            corr = self._pending.new_id()
            deadline = self._now() + attempt.timeout
            self._pending.add(corr, attempt, deadline)
        try:
            self._push_envelope(attempt.dest, KIND_REQUEST, corr, body, attempt.mailbox)
        except BaseException:
            with self._req_lock:
                self._pending.resolve(corr)
            raise
        self._deadline_armed(deadline)

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
            self._send_stream(s, self._now())

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

    # -- reliable delivery ---------------------------------------------------

    def _note_read(self, n: int) -> None:
        """After a read of ``n`` datagrams: how long the last one waited in
        the kernel, which the receiver's windows answer to
        (Receiver.queue_delay). Several at once were queued, so the kernel
        is asked (one ioctl); one to three found the queue about empty;
        none says nothing."""
        if n >= _QUEUE_SAMPLE:
            self._receiver.queue_delay = queue_delay(self._sock.fileno())
        elif n:
            self._receiver.queue_delay = 0.0

    def _after_read(self, now: float, fire: bool = True) -> None:
        """After reading datagrams (receive lock held): resolve replies, apply
        STATUS records to our reliable streams, send the STATUS we owe, fire
        the reliability timers that are due (unless not ``fire``: the caller
        fires them before its next wait). Cheap when there is nothing to do.

        The compiled reader (``cmq._speedups.DirectReader.read``) skips the
        call with ``fire=False`` when none of the four flags below is set:
        a new reason to act here needs its flag there too."""
        r = self._receiver
        if r.replies:
            self._resolve_replies()
        if r.controls:
            self._on_controls(now)
        if r.status_urgent:
            self._send_owed(now)
        if r.new_due:
            r.new_due = False
            due = r.next_status_due()
            if due is not None:
                self._rel_timer(due)
        if fire and now >= self._rel_at:
            self._fire_reliable(now)

    def _on_controls(self, now: float) -> None:
        controls = self._receiver.controls
        rel = self._rel
        room = False
        with self._timer_lock:
            now = self._now()  # repairs are stamped under the lock (see _emit)
            while controls:
                rec, _addr = controls.popleft()
                st, datagrams = rel.on_status(rec, now)
                if st is None:
                    continue
                s = st.stream
                if datagrams:
                    # Repairs, a PROBE and what the new credit released, in
                    # as few system calls as the driver can (under loss,
                    # most of a stream's datagrams go here): refusals counted.
                    self._transmit(s, datagrams, raise_errors=False)
                if s.frames and not st.waiting and s.armed == s.gen:
                    # A batch held open while credit was closed: it may go now.
                    batch = self._batcher.take(s, now)
                    if batch:
                        self._emit(s, batch, now, raise_errors=False)
                if not self._full(st):
                    room = True
                if st.pto_at is not None:
                    self._rel_timer(st.pto_at)
                if st.loss_at is not None:
                    self._rel_timer(st.loss_at)
        if rel.failures:
            self._report_failures()
        if room:
            self._room_made()

    def _rel_timer(self, deadline: float) -> None:
        """A reliability timer (a probe timeout, a STATUS due) was set for ``deadline``."""
        if deadline < self._rel_at:
            self._rel_at = deadline
        self._deadline_armed(deadline)

    def _room_made(self) -> None:  # noqa: B027 - a hook: drivers with waiters override it
        """A reliable stream's send buffer drained below its limit (wake blocked pushes)."""

    def _fire_reliable(self, now: float) -> None:
        """Probe timeouts, and the STATUS owed by now (called by the driver's
        timer, or by a thread reading the socket once ``_rel_at`` passed)."""
        rel = self._rel
        with self._timer_lock:
            now = self._now()  # retransmissions are stamped under the lock (see _emit)
            probes = rel.on_timer(now) if rel.streams else []
            for data, addr in probes:
                self._send_to(data, addr)
            pto = rel.next_deadline()
        if rel.failures:
            self._report_failures()
            self._room_made()
        r = self._receiver
        if r.owed or r.status_urgent:
            self._send_owed(now)
            r.new_due = False
        due = [d for d in (pto, r.next_status_due()) if d is not None]
        self._rel_at = min(due) if due else float("inf")

    def _send_owed(self, now: float, *, all_owed: bool = False) -> None:
        """Send the STATUS due at ``now`` (every one owed with ``all_owed``),
        written under the state lock (see ``_state_lock``)."""
        with self._state_lock:
            owed = self._receiver.take_status(now, all_owed=all_owed)
        for data, addr in owed:
            self._send_to(data, addr)

    def _settle_owed(self) -> None:
        """Closing: send every STATUS this endpoint owes its senders, so that
        what it received is acknowledged rather than sent again to nobody."""
        self._send_owed(self._now(), all_owed=True)

    def _report_failures(self) -> None:
        failures = self._rel.failures
        callback = self.config.on_failure
        while failures:
            f = failures.popleft()
            self._failures.append(f)
            if callback is not None:
                try:
                    callback(f)
                except Exception:  # noqa: BLE001 - a user's callback must not stop the I/O
                    self._send_drops["callback_failed"] += 1

    def failures(self) -> list[DeliveryFailure]:
        """The latest delivery failures (up to 1024), oldest first: reliable
        messages whose delivery is in doubt, with the reason (see
        :class:`cmq.DeliveryFailure`)."""
        return list(self._failures)

    def unacknowledged(self) -> int:
        """Reliable datagrams sent (or waiting for credit) and not yet acknowledged."""
        return self._rel.unacked

    def _next_deadline(self, *, reliable: bool = True) -> float | None:
        """The earliest deadline of any timer; without ``reliable``, leaving out
        probe timeouts and STATUS dues (which a reading thread fires)."""
        with self._timer_lock:
            candidates = [self._batcher.next_deadline(), self._receiver.next_expiry()]
            if reliable:
                candidates += [self._receiver.next_status_due(), self._rel.next_deadline()]
        with self._req_lock:
            candidates.append(self._pending.next_deadline())
        due = [d for d in candidates if d is not None]
        return min(due) if due else None

    # -- lifecycle and statistics ------------------------------------------

    def stats(self) -> Stats:
        """A frozen snapshot of this endpoint's counters."""
        b, r, rel = self._batcher, self._receiver, self._rel
        dropped = dict(r.dropped)
        dropped.update(self._send_drops)
        return Stats(
            delivery=self.config.delivery,
            unacked=rel.unacked,
            send_buffered=rel.buffered_bytes,
            retransmits=rel.retransmits,
            probes=rel.probes,
            in_doubt=rel.in_doubt,
            dead_streams=rel.dead_streams,
            epoch_resets=rel.epoch_resets + r.epoch_resets,
            status_sent=r.status_sent,
            status_received=rel.status_received,
            duplicates=r.duplicates,
            overruns=r.overruns,
            srtt=rel.srtt,
            pto=rel.pto(),
            held_bytes=r.held_bytes(),
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


def send_error(exc: OSError, addr: Address) -> TransportError:
    """The error a caller gets when the OS refused a datagram to ``addr``."""
    return TransportError(f"sending to {addr[0]}:{addr[1]} failed: {exc.strerror or exc}")


# Message is a frozen dataclass with slots, whose __init__ sets each field
# through object.__setattr__; message_of, on every delivery, fills the slots
# through their descriptors instead (half the cost, the same object).
_new_message = object.__new__
_set_payload, _set_sender, _set_sender_id, _set_mailbox, _set_seq, _set_correlation = (
    Message.__dict__[name].__set__ for name in ("payload", "sender", "sender_id", "mailbox", "seq", "correlation")
)


def message_of(item: tuple[Any, Meta]) -> Message:
    """The :class:`Message` of a delivered ``(payload, meta)`` item."""
    payload, (addr, sender, mailbox, seq, corr) = item
    m = _new_message(Message)
    _set_payload(m, payload)
    _set_sender(m, addr)
    _set_sender_id(m, sender)
    _set_mailbox(m, mailbox)
    _set_seq(m, seq)
    _set_correlation(m, corr)
    return m
