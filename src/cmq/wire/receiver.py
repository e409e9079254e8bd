"""Receiving datagrams into mailboxes, without sockets or clocks.

Theory of operation
-------------------
:meth:`Receiver.datagram_received` takes one datagram, the address it came
from and the current time. It never raises: a datagram that is not valid
wire format v1, fails its tag, or carries an undecodable MessagePack payload
is dropped and counted in :attr:`Receiver.dropped` by reason, and the next
datagram is handled as if nothing happened (the original CMQ's receiver
thread died on the first bad datagram).

Delivered messages are appended to the :class:`Mailbox` as one
:class:`Chunk` per datagram: the list of payloads and one ``meta`` tuple
``(addr, sender, mailbox, seq, correlation)`` for all of them, so delivery
costs nothing per message. All messages of a datagram are appended in one
step, so messages of different datagrams are never interleaved.

Mailboxes with :data:`ENVELOPE_BIT` set carry request/response traffic: each
message starts with a kind byte and an 8-byte correlation id (the envelope;
the user's payload is never touched). Requests are delivered to the mailbox
without the bit, with the correlation id in ``meta``; replies are not
delivered to any mailbox but appended to :attr:`Receiver.replies` for the
driver to resolve its pending requests.

Fragments are reassembled per (address, sender, mailbox, message id), in
bounded memory (``max_reassembly`` bytes) and for at most
``reassembly_timeout`` seconds (:meth:`Receiver.expire`).

Per best-effort stream (address, sender, mailbox) the receiver remembers
the next expected sequence number, to count datagrams that never arrived
(``datagrams_missing``) and those that arrived late (``datagrams_late``).
The table is bounded; the oldest streams are forgotten first.

Version 2 data datagrams belong to reliable or unordered streams, whose
state (:class:`cmq.wire.reliable.RecvStream`) decides what is delivered,
held, or dropped as a duplicate or an overrun, and what the receiver owes
the sender: STATUS records, which :meth:`Receiver.take_status` encodes as
control datagrams (``status_urgent`` tells the driver to call it at the end
of its receive batch; otherwise :meth:`Receiver.next_deadline` says when).
STATUS records from *our* receivers, for the endpoint's sending side, are
appended to :attr:`Receiver.controls`.

The endpoint holds at most ``max_buffered_bytes`` of received, unconsumed
data: best-effort data over it is dropped (``buffer_full``), reliable data
is not acknowledged (an ``overrun``, repaired later), and reliable senders
get credit only for what fits.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Callable
from itertools import islice, repeat
from operator import length_hint
from typing import Any, Final

import msgpack

from cmq import _impl
from cmq._config import QueueConfig
from cmq._errors import ProtocolError
from cmq.wire.frames import (
    FLAG_ACK,
    FLAG_CONTROL,
    FLAG_FRAGMENT,
    FLAG_MSGPACK,
    FLAG_TAG,
    HEADER_SIZE,
    MAGIC,
    MAX_RANGES,
    R_ORDERED,
    R_SYN,
    VERSION,
    VERSION_2,
    BadTag,
    Fragment,
    Header,
    Probe,
    Status,
    decode,
    decode_control,
    encode_control,
    split_frames,
)
from cmq.wire.reliable import (
    DATAGRAM_OVERHEAD,
    MAX_ACK_DELAY,
    RENAK_INTERVAL,
    START_WINDOW,
    STATUS_BYTES,
    RecvStream,
    recv_stream_type,
    seq_diff,
)

__all__ = [
    "EMPTY",
    "ENVELOPE_BIT",
    "ENVELOPE_SIZE",
    "KIND_REPLY",
    "KIND_REQUEST",
    "Chunk",
    "Mailbox",
    "Meta",
    "Receiver",
    "envelope",
]

#: Mailbox bit marking request/response traffic (user mailboxes are below it).
ENVELOPE_BIT: Final = 0x8000_0000
KIND_REQUEST: Final = 1
KIND_REPLY: Final = 2
_ENVELOPE = struct.Struct(">BQ")
ENVELOPE_SIZE: Final = _ENVELOPE.size


def envelope(kind: int, correlation: int, body: bytes) -> bytes:
    """A request's or a reply's payload: its envelope (kind, correlation id), then ``body``.

    Encoded here, beside :meth:`Receiver._deliver_enveloped` that decodes it.
    """
    return _ENVELOPE.pack(kind, correlation) + body

#: Streams remembered for sequence accounting.
MAX_STREAMS: Final = 65_536
#: Mailboxes that may exist at once; empty ones are reclaimed past this.
MAX_MAILBOXES: Final = 65_536

_HEAD = struct.Struct(">2sBBIII")
_LONG_LEN = struct.Struct(">Q")
# A datagram of one short frame, as receive_one reads it: magic, version and
# flags as one number, sender, mailbox, seq, and the frame's length prefix.
_ONE = struct.Struct(">IIIIB")
_ONE_SIZE: Final = _ONE.size
_MVF_RAW: Final = int.from_bytes(MAGIC + bytes((VERSION, 0)), "big")
_MVF_MSGPACK: Final = int.from_bytes(MAGIC + bytes((VERSION, FLAG_MSGPACK)), "big")
_MVF_PLAIN: Final = frozenset((_MVF_RAW, _MVF_MSGPACK))
# The same for a v2 datagram: header, extension (epoch, rflags), prefix.
_ONE2 = struct.Struct(">IIIIIB3xB")
_ONE2_SIZE: Final = _ONE2.size
_MVF2_RAW: Final = int.from_bytes(MAGIC + bytes((VERSION_2, 0)), "big")
_MVF2_MSGPACK: Final = int.from_bytes(MAGIC + bytes((VERSION_2, FLAG_MSGPACK)), "big")
_MVF_V2_PLAIN: Final = frozenset((_MVF2_RAW, _MVF2_MSGPACK))
_SLOW_FLAGS: Final = FLAG_FRAGMENT | FLAG_TAG | FLAG_CONTROL
# A v2 data datagram's header and extension: magic, flags, sender, mailbox,
# seq, epoch, rflags (the version byte skipped: tested before).
_V2 = struct.Struct(">2sxBIIIIB3x")
_V2_SIZE: Final = _V2.size
_V2_SLOW: Final = FLAG_FRAGMENT | FLAG_TAG | FLAG_CONTROL | FLAG_ACK

# (addr, sender id, mailbox, datagram seq, correlation id or None)
Meta = tuple[Any, int, int, int, int | None]

DROP_REASONS: Final = (
    "malformed",  # not wire format v1: bad magic, version, flags, truncated frame
    "bad_tag",  # tag missing or not verifying while a key is set
    "undecodable",  # MessagePack payload that does not decode
    "queue_full",  # mailbox held max_queued messages
    "too_many_mailboxes",
    "fragment_expired",  # incomplete message older than reassembly_timeout
    "reassembly_full",  # no room in max_reassembly
    "control",  # control datagrams of an unknown kind (v1 defined none)
    "bad_envelope",  # request/response message without a valid envelope
    "buffer_full",  # best-effort data over max_buffered_bytes
)
#: Reliable streams remembered at once; the least recently active go first.
MAX_RELIABLE_STREAMS: Final = 65_536
#: Credit a stream always gets while the application has nothing to take.
_LIVE_WINDOW: Final = 4
#: A reliable stream's window stops growing, and halves (at most once per
#: the queue's own delay), while the datagrams the driver reads have waited
#: longer than this in the socket's kernel queue (Receiver.queue_delay). A
#: repair waits behind that queue. Measured at 1 % and 3 % loss, 512 B, on
#: these machines: with 1 ms or 3 ms, no run of 40-60 lost its rate to a
#: queue (without, 1 in 15-20 did, by 25-35 %); with 1 ms a bulk stream
#: without loss, whose reader is the slower end, lost a few percent to the
#: cuts, with 3 ms about none.
QUEUE_TARGET: Final = 3e-3
#: Least time between two RESETs for one unknown stream.
_RESET_GAP: Final = 0.01
#: A stream is active (shares the receive budget) this long after its last datagram.
_ACTIVE_FOR: Final = 1.0
_STATUS_SIZE: Final = 29 + 6 * MAX_RANGES + 2  # the answered PROBE's serial included


def _lone_frame(data: bytes, start: int, n: int) -> int:
    """Where the payload starts when ``data`` is one frame filling it after a
    ``start``-byte head whose last byte is the frame's length prefix ``n``; 0 if not."""
    size = len(data) - start
    if n == size and n < 255:
        return start
    if n == 255 and size >= 8 and _LONG_LEN.unpack_from(data, start)[0] == size - 8:
        return start + 8
    return 0


def _unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


class Chunk:
    """The messages of one datagram as delivered: a list, an iterator over it, and their meta."""

    __slots__ = ("it", "items", "meta")

    def __init__(self, items: list[Any], meta: Meta) -> None:
        self.items = items
        self.it = iter(items)
        self.meta = meta


#: Returned by :meth:`Mailbox.pop` when the mailbox is empty (None is a valid message).
EMPTY: Final = object()


class Mailbox:
    """The messages waiting for one mailbox, a deque of per-datagram chunks.

    Delivery appends one chunk per datagram (no per-message work); taking a
    message advances the head chunk's iterator, and a batch is taken with
    one C-level ``islice``. Each step is a single operation on a deque or a
    list iterator, so consumers in several threads never take a message
    twice, without a lock. ``delivered`` is written by the delivering thread
    only; ``consumed`` by consumers (a lost update between two consumer
    threads only skews the estimate :meth:`queued`, which :meth:`exact`
    corrects when it matters).
    """

    __slots__ = ("chunks", "consumed", "delivered", "nbytes")

    def __init__(self) -> None:
        self.chunks: deque[Chunk] = deque()
        self.delivered = 0
        self.consumed = 0
        self.nbytes = 0  # bytes of datagrams delivered here, ever (for the budget's estimate)

    def queued_bytes(self) -> int:
        """Bytes waiting (an estimate: messages waiting times their average size)."""
        if not self.delivered:
            return 0
        return (self.delivered - self.consumed) * self.nbytes // self.delivered

    def __bool__(self) -> bool:
        return self.available()

    def queued(self) -> int:
        """Messages waiting (an estimate, see the class doc)."""
        return self.delivered - self.consumed

    def exact(self) -> int:
        """Messages waiting, counted; resets the estimate."""
        n = sum(length_hint(c.it) for c in list(self.chunks))
        self.consumed = self.delivered - n
        return n

    def available(self) -> bool:
        """Whether a message is waiting."""
        chunks = self.chunks
        if not chunks:
            return False
        try:
            if length_hint(chunks[0].it):
                return True
        except IndexError:
            return False
        return any(length_hint(c.it) for c in list(chunks))

    def _drop_head(self, head: Chunk) -> None:
        try:
            self.chunks.remove(head)  # the head: found at once
        except ValueError:
            pass  # another consumer removed it first

    def pop(self) -> Any:
        """The next message, or :data:`EMPTY`."""
        item = self.pop_item()
        return EMPTY if item is None else item[0]

    def pop_item(self) -> tuple[Any, Meta] | None:
        """The next message with its meta, or None."""
        chunks = self.chunks
        while chunks:
            try:
                head = chunks[0]
            except IndexError:
                break
            for payload in head.it:
                self.consumed += 1
                return payload, head.meta
            self._drop_head(head)
        return None

    def take(self, limit: int) -> list[Any]:
        """Up to ``limit`` messages, in order."""
        out: list[Any] = []
        chunks = self.chunks
        while len(out) < limit:
            try:
                head = chunks[0]
            except IndexError:
                break
            want = limit - len(out)
            before = len(out)
            out.extend(islice(head.it, want))
            if len(out) - before < want:
                self._drop_head(head)
        self.consumed += len(out)
        return out

    def take_items(self, limit: int) -> list[tuple[Any, Meta]]:
        """Up to ``limit`` messages with their meta, in order."""
        out: list[tuple[Any, Meta]] = []
        chunks = self.chunks
        while len(out) < limit:
            try:
                head = chunks[0]
            except IndexError:
                break
            want = limit - len(out)
            got = list(islice(head.it, want))
            out.extend(zip(got, repeat(head.meta)))
            if len(got) < want:
                self._drop_head(head)
        self.consumed += len(out)
        return out

    def take_matching(self, predicate: Callable[[Any], bool]) -> tuple[Any, Meta] | None:
        """The first message for which ``predicate`` is true, the others left in order.

        Not safe against other consumers of this mailbox running at the same time.
        """
        for chunk in list(self.chunks):
            left = length_hint(chunk.it)
            if not left:
                continue
            rest = chunk.items[len(chunk.items) - left :]
            for i, payload in enumerate(rest):
                if predicate(payload):
                    chunk.items = rest[:i] + rest[i + 1 :]
                    chunk.it = iter(chunk.items)
                    self.consumed += 1
                    return payload, chunk.meta
        return None

    def any_matching(self, predicate: Callable[[Any], bool]) -> bool:
        """Whether a waiting message matches ``predicate`` (nothing is taken)."""
        for chunk in list(self.chunks):
            left = length_hint(chunk.it)
            if left and any(predicate(p) for p in chunk.items[len(chunk.items) - left :]):
                return True
        return False


class _Partial:
    __slots__ = ("count", "deadline", "got", "meta", "pieces", "size")

    def __init__(self, count: int, deadline: float, meta: Meta) -> None:
        self.count = count
        self.deadline = deadline
        self.meta = meta
        self.pieces: dict[int, bytes] = {}
        self.got = 0
        self.size = 0


class Receiver:
    """Decodes datagrams and delivers their messages to mailboxes.

    On the compiled core, the fields every datagram touches (the mailboxes,
    the counters, the memory budget's, the reliable streams' tables) are C
    members (``_speedups.ReceiverState``: see :func:`cmq._impl.new_object`).
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Receiver:
        return _impl.new_object(cls, "ReceiverState")

    def __init__(self, config: QueueConfig, sender_id: int = 0) -> None:
        self.config = config
        self.sender_id = sender_id
        self._key = config.key
        self._max_queued = config.max_queued
        # The fast paths' frame splitter: the compiled core's, or frames.split_frames.
        sp = _impl.speedups
        self._split: Callable[[bytes, int, int], list[bytes]] = split_frames if sp is None else sp.split_frames
        # The control records' codec: the compiled core's twins, or frames' own.
        self._decode_control: Callable[[bytes, int, int], list[Status | Probe]] = (
            decode_control if sp is None else sp.decode_control
        )
        self._encode_control: Callable[..., bytes] = encode_control if sp is None else sp.encode_control
        # A stream's STATUS (RecvStream.status, or its compiled twin).
        self._status_of: Callable[[RecvStream, float], Status] = RecvStream.status if sp is None else sp.status_of
        # The reliable streams' fast path in C (the twin of the one in
        # datagram_received: tests/unit/test_cores.py), or None.
        self._fast_v2: Callable[[Receiver, bytes, Any, float], int] | None = (
            None if sp is None else sp.make_receive_v2(Chunk, STATUS_BYTES, MAX_ACK_DELAY)
        )
        # receive_one's cases in C (the twin of its v1 case and of _receive_one_v2), or None.
        self._fast_one: Callable[[Receiver, bytes, Any, float, int], tuple[Any, Meta] | None] | None = (
            None if sp is None else sp.make_receive_one(_unpack, STATUS_BYTES, MAX_ACK_DELAY, FLAG_MSGPACK)
        )
        # The class of reliable streams: with the compiled core, fields the
        # C paths above reach without attribute lookups.
        self._rs_type = recv_stream_type(sp)
        # Reliable streams, and those owing their sender a STATUS.
        self._rstreams: dict[tuple[Any, int, int], RecvStream] = {}
        # Keyed by the stream itself (an identity hash, cheap for every
        # datagram), valued None; a dict for its insertion order.
        self._owed: dict[RecvStream, None] = {}
        self._resets: dict[tuple[Any, int, int, int], float] = {}  # (addr, sender, mailbox, epoch) -> last RESET
        self._pending_resets: list[tuple[Any, Status]] = []
        #: A STATUS should leave at the end of this receive batch.
        self.status_urgent = False
        #: A STATUS became due later (the driver's timer must know).
        self.new_due = False
        #: STATUS records for this endpoint's sending side: (record, addr).
        self.controls: deque[tuple[Status, Any]] = deque()
        # The memory budget: min(max_buffered_bytes, what the kernel buffer
        # holds); the driver sets kernel_budget once the socket is open.
        self.budget = config.max_buffered_bytes
        self._free = self.budget  # free bytes when last computed
        self._unchecked = 0  # bytes delivered since
        self._held_rel = 0  # bytes held in ordered streams' reorder buffers
        self._wmax = config.window
        #: How long the last datagram the driver read waited in the socket's
        #: kernel queue (seconds; 0.0 after a read that emptied the queue):
        #: set by the driver after each read, read by the grants (see _grant).
        self.queue_delay = 0.0
        self._cut_at = float("-inf")  # when a grant last halved a window (see _grant)
        self._active_at = float("-inf")
        self._active_n = 1
        # Bytes of credit given to active streams and not yet used (their
        # datagrams still to come): reserved out of the budget.
        self._ahead = 0
        self.duplicates = 0
        self.overruns = 0
        self.status_sent = 0
        self.epoch_resets = 0
        self.mailboxes: dict[int, Mailbox] = {}
        #: Replies to requests: (correlation id, payload, addr).
        self.replies: deque[tuple[int, Any, Any]] = deque()
        self.dropped: dict[str, int] = dict.fromkeys(DROP_REASONS, 0)
        self.messages_received = 0
        self.datagrams_received = 0
        self.bytes_received = 0
        self.datagrams_missing = 0
        self.datagrams_late = 0
        self._expected: dict[tuple[Any, int, int], int] = {}
        self._partials: dict[tuple[Any, int, int, int], _Partial] = {}
        self._reassembly_bytes = 0

    # -- mailboxes ---------------------------------------------------------

    def mailbox(self, mailbox: int) -> Mailbox:
        """``mailbox``'s messages, created on first use."""
        mb = self.mailboxes.get(mailbox)
        if mb is None:
            if len(self.mailboxes) >= MAX_MAILBOXES:
                for k in [k for k, v in self.mailboxes.items() if not v.chunks]:
                    del self.mailboxes[k]
            mb = self.mailboxes.setdefault(mailbox, Mailbox())
        return mb

    def queued(self) -> int:
        """Messages waiting in all mailboxes (an estimate, see :class:`Mailbox`)."""
        # Mailbox.queued inline, in a loop: a blocking read's drain asks
        # this two or three times per datagram, and the generator and the
        # call per mailbox cost more than 0.6 us each time.
        n = 0
        for v in list(self.mailboxes.values()):
            n += v.delivered - v.consumed
        return n

    def set_kernel_budget(self, nbytes: int) -> None:
        """What the socket's kernel buffer holds: the budget is at most that."""
        self.budget = max(min(self.config.max_buffered_bytes, nbytes), 1)
        self._free = self.budget

    def held_bytes(self) -> int:
        """Bytes of received, unconsumed data: mailboxes (an estimate), reorder and reassembly buffers."""
        return (
            sum(v.queued_bytes() for v in list(self.mailboxes.values()))
            + self._held_rel
            + self._reassembly_bytes
        )

    def _consumable(self) -> bool:
        """Whether any mailbox holds a message the application could take."""
        return any(v.queued() > 0 for v in list(self.mailboxes.values()))

    def _full(self, nbytes: int) -> bool:
        """Whether ``nbytes`` more would exceed the budget (exact only near it)."""
        self._unchecked += nbytes
        if self._unchecked <= self._free:
            return False
        self._free = self.budget - self.held_bytes()
        self._unchecked = nbytes
        if nbytes <= self._free:
            return False
        self._unchecked = 0
        return True

    def _fits(self, mb: Mailbox, n: int) -> bool:
        """Whether a reliable datagram of ``n`` messages may enter ``mb``: it
        must fit, or find the mailbox empty (a datagram is taken whole or not
        at all, so one larger than ``max_queued`` must still get in)."""
        waiting = mb.exact()
        return waiting == 0 or waiting + n <= self._max_queued

    def _room(self, mb: Mailbox, n: int) -> int:
        """How many of ``n`` messages fit in ``mb``; counts the rest as dropped."""
        if mb.delivered - mb.consumed + n <= self._max_queued:
            return n
        room = max(self._max_queued - mb.exact(), 0)
        if room < n:
            self.dropped["queue_full"] += n - room
            return room
        return n

    # -- datagrams ---------------------------------------------------------

    def datagram_received(self, data: bytes, addr: Any, now: float) -> int:
        """Handle one datagram; returns the number of messages delivered. Never raises."""
        self.datagrams_received += 1
        self.bytes_received += len(data)
        # Fast path: a plain, untagged v1 datagram of raw messages for an
        # application mailbox, the bulk of best-effort traffic, handled
        # inline. Everything else goes through the one parser, frames.decode
        # (this path accepts exactly what it accepts, no more, no less).
        if self._key is None and len(data) >= HEADER_SIZE and not data[3] & _SLOW_FLAGS:
            magic, version, flags, sender, mailbox, seq = _HEAD.unpack_from(data)
            if magic == MAGIC and version == VERSION and not flags & ~FLAG_MSGPACK:
                try:
                    payloads: list[Any] = self._split(data, HEADER_SIZE, len(data))
                except ProtocolError:
                    self.dropped["malformed"] += 1
                    return 0
                key = (addr, sender, mailbox)
                table = self._expected
                if table.get(key) == seq:
                    table[key] = (seq + 1) & 0xFFFFFFFF
                else:
                    self._sequence(addr, sender, mailbox, seq)
                if self._unchecked + len(data) <= self._free:
                    self._unchecked += len(data)
                elif self._full(len(data)):
                    self.dropped["buffer_full"] += len(payloads)
                    return 0
                if flags or mailbox & ENVELOPE_BIT:
                    return self._deliver(payloads, flags, addr, sender, mailbox, seq, len(data))
                mb = self.mailboxes.get(mailbox)
                if mb is None:
                    mb = self.mailbox(mailbox)
                n = len(payloads)
                if mb.delivered - mb.consumed + n > self._max_queued:
                    return self._deliver(payloads, flags, addr, sender, mailbox, seq, len(data))
                mb.chunks.append(Chunk(payloads, (addr, sender, mailbox, seq, None)))
                mb.delivered += n
                mb.nbytes += len(data)
                self.messages_received += n
                return n
        if self._key is None and len(data) >= _V2_SIZE and data[2] == VERSION_2 and not data[3] & _V2_SLOW:
            # Fast path of reliable streams: the next datagram of a known
            # stream with nothing held, delivered inline (else the general path).
            if self._fast_v2 is not None:
                got = self._fast_v2(self, data, addr, now)
                if got >= 0:
                    return got
                return self._general(data, addr, now)
            magic, flags, sender, mailbox, seq, epoch, rflags = _V2.unpack_from(data)
            key = (addr, sender, mailbox)
            rs = self._rstreams.get(key)
            if magic == MAGIC and not mailbox & ENVELOPE_BIT and self._next_plain(rs, epoch, seq, rflags, len(data)):
                assert rs is not None
                try:
                    payloads = self._split(data, _V2_SIZE, len(data))
                except ProtocolError:
                    self.dropped["malformed"] += 1
                    return 0
                mb = self.mailboxes.get(mailbox)
                if mb is None:
                    mb = self.mailbox(mailbox)
                n = len(payloads)
                if mb.delivered - mb.consumed + n > self._max_queued and not self._fits(mb, n):
                    return self._overrun(rs, now)
                if flags:
                    payloads = self._decode_all(payloads)
                    n = len(payloads)
                mb.chunks.append(Chunk(payloads, (addr, sender, mailbox, seq, None)))
                mb.delivered += n
                mb.nbytes += len(data)
                self.messages_received += n
                self._next_arrived(rs, seq, len(data), now)
                return n
        if (
            self._key is None
            and len(data) >= HEADER_SIZE
            and data[3] == FLAG_CONTROL
            and data[2] == VERSION_2
            and data[:2] == MAGIC
        ):
            # An untagged v2 control datagram (STATUS, PROBE), as the general
            # path takes it, without its Header: its records straight from
            # the one parser of control records (or its compiled twin).
            try:
                records = self._decode_control(data, HEADER_SIZE, len(data))
            except ProtocolError:
                self.dropped["malformed"] += 1
                return 0
            self._control(records, addr, int.from_bytes(data[4:8], "big"), now)
            return 0
        return self._general(data, addr, now)

    def _general(self, data: bytes, addr: Any, now: float) -> int:
        """:meth:`datagram_received` past its fast paths: the one parser, every kind of datagram."""
        try:
            header, body = decode(data, self._key, self._split)
        except BadTag:
            self.dropped["bad_tag"] += 1
            return 0
        except ProtocolError:
            self.dropped["malformed"] += 1
            return 0
        if header.flags & FLAG_CONTROL:
            if header.version != VERSION_2:
                self.dropped["control"] += 1
                return 0
            self._control(body, addr, header.sender, now)  # type: ignore[arg-type]
            return 0
        if header.version == VERSION_2:
            return self._reliable(data, header, body, addr, now)  # type: ignore[arg-type]
        flags, sender, mailbox, seq = header.flags, header.sender, header.mailbox, header.seq
        self._sequence(addr, sender, mailbox, seq)
        if self._full(len(data)):
            self.dropped["buffer_full"] += len(body) if isinstance(body, list) else 1
            return 0
        if isinstance(body, list):
            return self._deliver(body, flags, addr, sender, mailbox, seq, len(data))
        assert isinstance(body, Fragment)
        whole = self._reassemble(addr, sender, mailbox, seq, body.message_id, body.index, body.count, body.data, now)
        if whole is None:
            return 0
        return self._deliver([whole], flags, addr, sender, mailbox, seq, len(whole))

    # -- reliable streams (wire format v2) ---------------------------------

    def _reliable(self, data: bytes, header: Header, body: list[bytes] | Fragment, addr: Any, now: float) -> int:
        """A v2 data datagram: deliver, hold or drop it, and note the STATUS owed."""
        sender, mailbox, seq, epoch = header.sender, header.mailbox, header.seq, header.epoch
        key = (addr, sender, mailbox)
        rs = self._rstreams.get(key)
        if rs is None or rs.epoch != epoch:
            if not header.rflags & R_SYN:
                # Not the start of a stream, and not one we know: we lost its
                # state (a restart). The sender must hear so and start anew.
                self._reset(key, epoch, now)
                return 0
            rs = self._new_stream(key, epoch, bool(header.rflags & R_ORDERED), now)
            rs.avg_size = float(len(data))
        rs.last_active = now
        off = seq_diff(seq, rs.next)
        if off < 0 or seq in rs.held or seq in rs.seen:
            # Our STATUS may have been lost: answer soon.
            self.duplicates += 1
            self._owe(rs, now, urgent=True)
            return 0
        if seq_diff(rs.credit, seq) <= 0 or off >= 2 * self._wmax:
            return self._overrun(rs, now)
        new_gap = False
        if seq_diff(seq, rs.largest) > 0:
            new_gap = seq_diff(seq, rs.largest) > 1 and seq_diff(rs.largest, rs.next) >= -1 and off > 0
            rs.largest = seq
            rs.largest_at = now
        rs.avg_size += (len(data) - rs.avg_size) * 0.125
        rs.last_size = len(data)
        rs.bytes_since += len(data)
        if off and rs.ordered:
            if self._full(len(data)) and self._consumable():
                # Held data counts against the budget too: refused, sent again.
                return self._overrun(rs, now)
            # Kept decoded (the frames, not the datagram: no second copy):
            # it is delivered from here once the gap fills.
            rs.held[seq] = (len(data), header, body)
            rs.held_bytes += len(data)
            self._held_rel += len(data)
            self._owe(rs, now, urgent=new_gap)
            return 0
        n = self._accept(rs, len(data), header, body, addr, now)
        if n < 0:
            return self._overrun(rs, now)
        if off:
            rs.seen.add(seq)
        else:
            nxt = (seq + 1) & 0xFFFFFFFF
            if rs.ordered:
                held = rs.held
                while held:
                    entry = held.get(nxt)
                    if entry is None:
                        break
                    size, h, b = entry
                    got = self._accept(rs, size, h, b, addr, now)
                    del held[nxt]
                    rs.held_bytes -= size
                    self._held_rel -= size
                    if got < 0:
                        # No room: dropped unacknowledged, an overrun the
                        # sender repairs (kept held at rs.next, nothing
                        # would ever deliver it, and its copies are duplicates).
                        self.overruns += 1
                        break
                    n += got
                    nxt = (nxt + 1) & 0xFFFFFFFF
            else:
                seen = rs.seen
                while nxt in seen:
                    seen.discard(nxt)
                    nxt = (nxt + 1) & 0xFFFFFFFF
            rs.next = nxt
        self._owe(rs, now, urgent=new_gap)
        return n

    def _accept(
        self, rs: RecvStream, size: int, header: Header, body: list[bytes] | Fragment, addr: Any, now: float
    ) -> int:
        """Deliver a reliable datagram (``size`` bytes) whole, or nothing (-1:
        no room, it is not acknowledged)."""
        if self._full(size) and not rs.held and self._consumable():
            # Over the budget: refused, not acknowledged (the sender sends it
            # again). Credit keeps most senders under it, but credit given
            # to many streams at once, or a new stream's initial credit, can
            # add up to more. Never refused: the datagram a reorder buffer
            # waits for, or one that only data still to come can make
            # consumable (the next fragment of a message being reassembled).
            return -1
        sender, mailbox, seq, flags = header.sender, header.mailbox, header.seq, header.flags
        if isinstance(body, Fragment):
            if self._reassembly_bytes + len(body.data) > self.config.max_reassembly:
                return -1
            whole = self._reassemble(
                addr, sender, mailbox, seq, body.message_id, body.index, body.count, body.data, now, reliable=True
            )
            if whole is None:
                return 0
            return self._deliver([whole], flags, addr, sender, mailbox, seq, len(whole), whole=True)
        target = mailbox & ~ENVELOPE_BIT
        mb = self.mailboxes.get(target)
        n = len(body)
        if mb is not None and mb.delivered - mb.consumed + n > self._max_queued and not self._fits(mb, n):
            return -1
        return self._deliver(body, flags, addr, sender, mailbox, seq, size, whole=True)

    def _overrun(self, rs: RecvStream, now: float) -> int:
        """A datagram of ``rs`` refused unacknowledged (no credit, room or
        budget for it): counted, and a STATUS owed at once; delivers 0."""
        self.overruns += 1
        self._owe(rs, now, urgent=True)
        return 0

    def _new_stream(self, key: tuple[Any, int, int], epoch: int, ordered: bool, now: float) -> RecvStream:
        old = self._rstreams.pop(key, None)
        if old is not None:
            old.gone = True
            self.epoch_resets += 1
            self._held_rel -= old.held_bytes
            self._owed.pop(old, None)
        elif len(self._rstreams) >= MAX_RELIABLE_STREAMS:
            oldest = min(self._rstreams.values(), key=lambda r: r.last_active)
            k = (oldest.addr, oldest.sender, oldest.mailbox)
            del self._rstreams[k]
            oldest.gone = True
            self._owed.pop(oldest, None)
            self._held_rel -= oldest.held_bytes
        rs = self._rs_type(key[0], key[1], key[2], epoch, ordered, now)
        self._rstreams[key] = rs
        return rs

    def _owe(self, rs: RecvStream, now: float, *, urgent: bool) -> None:
        """``rs`` owes its sender a STATUS: now (urgent), or within max_ack_delay."""
        rs.since_status += 1
        if urgent or rs.since_status >= max(seq_diff(rs.credit, rs.next) // 4, 1) or rs.bytes_since >= STATUS_BYTES:
            rs.urgent = True
            self.status_urgent = True
        elif rs.due is None:
            rs.due = now + MAX_ACK_DELAY
            self.new_due = True
        self._owed[rs] = None

    def _reset(self, key: tuple[Any, int, int], epoch: int, now: float) -> None:
        rkey = (*key, epoch)
        last = self._resets.get(rkey)
        if last is not None and now - last < _RESET_GAP:
            return
        if len(self._resets) >= MAX_RELIABLE_STREAMS:
            self._resets.clear()
        self._resets[rkey] = now
        addr, sender, mailbox = key
        self._pending_resets.append(
            (
                addr,
                Status(
                    stream_sender=sender,
                    mailbox=mailbox,
                    epoch=epoch,
                    next_expected=0,
                    credit_limit=0,
                    largest_seen=0,
                    reset=True,
                ),
            )
        )
        self.status_urgent = True

    def _control(self, records: list[Status | Probe], addr: Any, sender: int, now: float) -> None:
        for rec in records:
            if isinstance(rec, Status):
                self.controls.append((rec, addr))
                continue
            key = (addr, sender, rec.mailbox)
            rs = self._rstreams.get(key)
            if rs is None or rs.epoch != rec.epoch:
                if not rec.rflags & R_SYN:
                    self._reset(key, rec.epoch, now)
                    continue
                rs = self._new_stream(key, rec.epoch, bool(rec.rflags & R_ORDERED), now)
            rs.last_active = now
            last = (rec.next_seq - 1) & 0xFFFFFFFF
            if seq_diff(last, rs.largest) > 0 and seq_diff(last, rs.next) >= 0:
                rs.largest = last  # a lost tail shows as missing
                rs.largest_at = now
            # Everything sent before the PROBE has arrived or is lost: the
            # report that names it is the sender's evidence.
            rs.answer = rec.serial
            self._owe(rs, now, urgent=True)

    def _grant(self, rs: RecvStream, now: float) -> None:
        """Raise ``rs``'s credit to what the budget allows (never lower it once given).

        The budget's free part is what neither the application's mailboxes,
        the reorder and reassembly buffers, nor the credit already given to
        the other active streams (their datagrams still to come) take; a
        stream gets its share of it among the active streams.
        """
        if now - self._active_at > 0.01:
            # Every 10 ms, counted afresh (a stream is active for a second
            # after its last datagram; an idle one's credit is not reserved).
            since = now - _ACTIVE_FOR
            n = ahead = 0
            for r in list(self._rstreams.values()):
                if r.last_active >= since:
                    n += 1
                    d = seq_diff(r.credit, r.next)
                    if d > 0:
                        ahead += d * int(max(r.avg_size, r.last_size) + DATAGRAM_OVERHEAD)
            self._active_n = max(n, 1)
            self._ahead = ahead
            self._active_at = now
        consumable = sum(v.queued_bytes() for v in list(self.mailboxes.values()))
        unit = int(max(rs.avg_size, rs.last_size) + DATAGRAM_OVERHEAD)
        mine = max(seq_diff(rs.credit, rs.next), 0) * unit if rs.granted else 0
        held = consumable + self._held_rel + self._reassembly_bytes
        self._free = self.budget - held
        self._unchecked = 0
        free = self._free - max(self._ahead - mine, 0)
        # Windows grow with use (reliable.START_WINDOW): a quarter of the
        # window arrived since the last grant is a sender that may need more.
        # So is a fifth within max_ack_delay: what a stream sending one
        # datagram at a time uses up before the delayed STATUS would come
        # (_owe asks for a STATUS at once when a quarter of the credit left
        # is used, that is after about a fifth of the window; the 1 covers
        # that rule's rounding down), so that it would
        # otherwise draw a STATUS every fifth of START_WINDOW datagrams for
        # ever (a ping-pong: one every 13 round trips). It grows until its
        # STATUS go by the timer: as far as a delay's worth of its datagrams.
        #
        # And windows shrink when datagrams wait in the socket: a sender as
        # fast as this reader keeps whatever queue once formed (a pause of
        # the reader, a burst), and every repair then waits behind it (seen:
        # 2,048 datagrams queued, round trips of 4 to 43 ms instead of 0.1,
        # probe timeouts of 26-83 ms, 1 run in 15 at 1 % loss 25-30 % slower).
        # Over QUEUE_TARGET the window halves (never below START_WINDOW), so
        # that the sender's credit stops until the queue drains; not again
        # before the queue's own delay has passed (the cut shows in the
        # queue only then: halving at each grant meanwhile went down to
        # START_WINDOW and cost a bulk stream without loss 5-10 % of its
        # rate). It grows again only once the queue is under half of that.
        arrived = seq_diff(rs.largest, rs.grant_seen)
        delay = self.queue_delay
        if delay > QUEUE_TARGET:
            if rs.win > START_WINDOW and now - self._cut_at >= delay:
                rs.win = max(rs.win // 2, START_WINDOW)
                self._cut_at = now
        elif rs.win < self._wmax and delay * 2 <= QUEUE_TARGET and (
            arrived * 4 >= rs.win or ((arrived + 1) * 5 >= rs.win and now - rs.grant_at < MAX_ACK_DELAY)
        ):
            rs.win = min(rs.win * 2, self._wmax)
        rs.grant_seen = rs.largest
        rs.grant_at = now
        w = min(int(max(free, 0) // self._active_n // unit), self._wmax)
        if w < _LIVE_WINDOW and not consumable and not rs.held:
            # Nothing the application could take is here: what fills the
            # budget is a message being reassembled, which only more data
            # completes (it is bounded by max_reassembly, not by the budget).
            w = _LIVE_WINDOW
        # The budget counts from next (what is held behind a gap takes
        # memory); the window, what may be on its way, from the last
        # datagram seen: a window cut by a queue must not stop the sender
        # behind every gap until its repair comes (at 3 % loss it did).
        seen = seq_diff(rs.largest, rs.next) + 1
        if seen < 0:
            seen = 0
        if w > seen + rs.win:
            w = seen + rs.win
        limit = (rs.next + w) & 0xFFFFFFFF
        if seq_diff(limit, rs.credit) > 0 or not rs.granted:
            # Never lowered once given; but the sender's initial credit was
            # never given, and the first STATUS may take it back.
            self._ahead += (w * unit) - mine
            rs.credit = limit

    def take_status(self, now: float, *, all_owed: bool = False) -> list[tuple[bytes, Any]]:
        """The STATUS datagrams due at ``now`` (every one owed with ``all_owed``), with their addresses.

        The driver's timer may call it while another thread delivers
        datagrams: it works on copies, and a race only delays a STATUS
        (to the next datagram, or the sender's probe).
        """
        self.status_urgent = False
        by_addr: dict[Any, list[Status]] = {}
        resets, self._pending_resets = self._pending_resets, []
        for addr, rec in resets:
            by_addr.setdefault(addr, []).append(rec)
        for rs in list(self._owed):
            if not (rs.urgent or all_owed or (rs.due is not None and rs.due <= now)):
                continue
            before = rs.credit
            self._grant(rs, now)
            # Low credit that consuming can raise: something is held (an
            # empty endpoint already granted all its budget allows; polling
            # it again would wake the driver every 2 ms for ever).
            starved = seq_diff(rs.credit, rs.next) < max(min(rs.win, self._wmax) // 4, 1) and self._free < self.budget
            gap = bool(rs.held or rs.seen or seq_diff(rs.largest, rs.next) >= 0)
            # With a gap open, every due STATUS goes, new or not: the repeat
            # is what repairs a lost retransmission before the sender's PTO.
            if rs.urgent or rs.since_status or rs.credit != before or all_owed or gap:
                by_addr.setdefault(rs.addr, []).append(self._status_of(rs, now))
                rs.granted = True
                rs.urgent = False
                rs.since_status = rs.bytes_since = 0
            if gap:
                rs.due = now + RENAK_INTERVAL  # a gap is open: repeat until repaired
            elif starved:
                rs.due = now + MAX_ACK_DELAY  # re-check the credit as the application consumes
            else:
                rs.due = None
                if not rs.urgent:
                    self._owed.pop(rs, None)
                continue
            self.new_due = True
        out: list[tuple[bytes, Any]] = []
        per = max((self.config.max_datagram - HEADER_SIZE - 16) // _STATUS_SIZE, 1)
        for addr, recs in by_addr.items():
            for i in range(0, len(recs), per):
                out.append((self._encode_control(recs[i : i + per], self.sender_id, self._key), addr))
                self.status_sent += len(recs[i : i + per])
        return out

    @property
    def owed(self) -> int:
        """Reliable streams owing their sender a STATUS (now or later)."""
        return len(self._owed)

    def receive_one(self, data: bytes, addr: Any, now: float, mailbox: int) -> tuple[Any, Meta] | None:
        """:meth:`datagram_received` for a reader waiting on ``mailbox``, which holds nothing.

        A plain datagram carrying exactly one message for ``mailbox``, next
        in its stream's sequence, is returned as ``(payload, meta)`` instead
        of being queued (the latency path of a blocking read: no chunk, no
        mailbox). Anything else is handled by :meth:`datagram_received` and
        None is returned. Never raises.
        """
        one = self._fast_one
        if one is not None and self._key is None:
            # Straight to the compiled twin of the cases below.
            got = one(self, data, addr, now, mailbox)
            if got is None:
                self.datagram_received(data, addr, now)
            return got
        if len(data) >= _ONE_SIZE and self._key is None:
            mvf, sender, mb, seq, n = _ONE.unpack_from(data)
            start = _lone_frame(data, _ONE_SIZE, n)
            key = (addr, sender, mb)
            table = self._expected
            if start and mb == mailbox and mvf in _MVF_PLAIN and table.get(key) == seq:
                payload: Any = data[start:]
                if mvf == _MVF_MSGPACK:
                    try:
                        payload = _unpack(payload)
                    except Exception:  # noqa: BLE001 - counted by the general path
                        self.datagram_received(data, addr, now)
                        return None
                table[key] = (seq + 1) & 0xFFFFFFFF
                self.datagrams_received += 1
                self.bytes_received += len(data)
                self.messages_received += 1
                return payload, (addr, sender, mb, seq, None)
            if mvf in _MVF_V2_PLAIN and len(data) > _ONE2_SIZE:
                return self._receive_one_v2(data, addr, now, mailbox)
        self.datagram_received(data, addr, now)
        return None

    def _receive_one_v2(self, data: bytes, addr: Any, now: float, mailbox: int) -> tuple[Any, Meta] | None:
        """:meth:`receive_one` of a plain v2 datagram: the next of its reliable
        stream, one message for ``mailbox``, nothing held: straight back."""
        mvf, sender, mb, seq, epoch, rflags, n = _ONE2.unpack_from(data)
        key = (addr, sender, mb)
        rs = self._rstreams.get(key)
        start = _lone_frame(data, _ONE2_SIZE, n)
        if not start or mb != mailbox or not self._next_plain(rs, epoch, seq, rflags, len(data)):
            self.datagram_received(data, addr, now)
            return None
        assert rs is not None
        payload: Any = data[start:]
        if mvf == _MVF2_MSGPACK:
            try:
                payload = _unpack(payload)
            except Exception:  # noqa: BLE001 - counted by the general path
                self.datagram_received(data, addr, now)
                return None
        self.datagrams_received += 1
        self.bytes_received += len(data)
        self.messages_received += 1
        self._next_arrived(rs, seq, len(data), now)
        return payload, (addr, sender, mb, seq, None)

    def _next_plain(self, rs: RecvStream | None, epoch: int, seq: int, rflags: int, nbytes: int) -> bool:
        """Whether a plain v2 datagram may take the fast paths: the next of a
        known, credited stream of this epoch with nothing held, within credit
        and within the budget (else the general path decides)."""
        return (
            rs is not None
            and rs.epoch == epoch
            and rs.next == seq
            and rs.granted
            and not rs.held
            and not rs.seen
            and self._unchecked + nbytes <= self._free
            and not rflags & ~(R_SYN | R_ORDERED)
            and seq_diff(rs.credit, seq) > 0
        )

    def _next_arrived(self, rs: RecvStream, seq: int, nbytes: int, now: float) -> None:
        """The fast paths' bookkeeping: ``rs``'s next datagram (``seq``, nothing
        held) was delivered; note the STATUS owed (:meth:`_owe`, for this case)."""
        self._unchecked += nbytes
        rs.next = (seq + 1) & 0xFFFFFFFF
        rs.largest = seq
        rs.largest_at = rs.last_active = now
        rs.avg_size += (nbytes - rs.avg_size) * 0.125
        rs.last_size = nbytes
        rs.since_status += 1
        rs.bytes_since += nbytes
        if rs.bytes_since >= STATUS_BYTES or rs.since_status >= max(seq_diff(rs.credit, rs.next) // 4, 1):
            rs.urgent = True
            self.status_urgent = True
        elif rs.due is None:
            rs.due = now + MAX_ACK_DELAY
            self.new_due = True
        self._owed[rs] = None

    def _sequence(self, addr: Any, sender: int, mailbox: int, seq: int) -> None:
        key = (addr, sender, mailbox)
        table = self._expected
        expected = table.get(key)
        if expected is None:
            if len(table) >= MAX_STREAMS:
                # Forget the oldest stream (insertion order): cheaper than
                # keeping an LRU order on every datagram.
                del table[next(iter(table))]
        else:
            gap = (seq - expected) & 0xFFFFFFFF
            if gap:
                if gap < 0x8000_0000:
                    self.datagrams_missing += gap
                else:
                    self.datagrams_late += 1
                    return
        table[key] = (seq + 1) & 0xFFFFFFFF

    def _deliver(
        self,
        payloads: list[Any],
        flags: int,
        addr: Any,
        sender: int,
        mailbox: int,
        seq: int,
        nbytes: int = 0,
        whole: bool = False,
    ) -> int:
        """Append a datagram's messages to their mailbox, cut to its room
        (counted) unless ``whole`` (a reliable datagram, checked by :meth:`_fits`)."""
        if mailbox & ENVELOPE_BIT:
            return self._deliver_enveloped(payloads, flags, addr, sender, mailbox, seq)
        if flags & FLAG_MSGPACK:
            payloads = self._decode_all(payloads)
        mb = self.mailbox(mailbox)
        n = len(payloads) if whole else self._room(mb, len(payloads))
        if n <= 0:
            return 0
        if n < len(payloads):
            payloads = payloads[:n]
        mb.chunks.append(Chunk(payloads, (addr, sender, mailbox, seq, None)))
        mb.delivered += n
        mb.nbytes += nbytes
        self.messages_received += n
        return n

    def _decode_all(self, payloads: list[Any]) -> list[Any]:
        try:
            return [_unpack(p) for p in payloads]
        except Exception:  # noqa: BLE001 - msgpack raises many kinds; each is a bad payload
            out = []
            for p in payloads:
                try:
                    out.append(_unpack(p))
                except Exception:  # noqa: BLE001
                    self.dropped["undecodable"] += 1
            return out

    def _deliver_enveloped(
        self, payloads: list[Any], flags: int, addr: Any, sender: int, mailbox: int, seq: int
    ) -> int:
        user_mailbox = mailbox & ~ENVELOPE_BIT
        delivered = 0
        for p in payloads:
            if len(p) < ENVELOPE_SIZE:
                self.dropped["bad_envelope"] += 1
                continue
            kind, corr = _ENVELOPE.unpack_from(p)
            body: Any = p[ENVELOPE_SIZE:]
            if flags & FLAG_MSGPACK:
                try:
                    body = _unpack(body)
                except Exception:  # noqa: BLE001
                    self.dropped["undecodable"] += 1
                    continue
            if kind == KIND_REPLY:
                self.replies.append((corr, body, addr))
                self.messages_received += 1
            elif kind == KIND_REQUEST:
                mb = self.mailbox(user_mailbox)
                if not self._room(mb, 1):
                    continue
                mb.chunks.append(Chunk([body], (addr, sender, user_mailbox, seq, corr)))
                mb.delivered += 1
                self.messages_received += 1
                delivered += 1
            else:
                self.dropped["bad_envelope"] += 1
        return delivered

    # -- fragments ---------------------------------------------------------

    def _reassemble(
        self,
        addr: Any,
        sender: int,
        mailbox: int,
        seq: int,
        message_id: int,
        index: int,
        count: int,
        data: bytes,
        now: float,
        reliable: bool = False,
    ) -> bytes | None:
        key = (addr, sender, mailbox, message_id)
        partial = self._partials.get(key)
        if partial is None:
            self.expire(now)
            # A reliable stream's pieces all come, however late: no expiry.
            deadline = float("inf") if reliable else now + self.config.reassembly_timeout
            partial = _Partial(count, deadline, (addr, sender, mailbox, seq, None))
            self._partials[key] = partial
        elif partial.count != count:
            self._drop_partial(key, "malformed")
            return None
        if index in partial.pieces:
            return None  # a duplicate piece
        if self._reassembly_bytes + len(data) > self.config.max_reassembly:
            self._drop_partial(key, "reassembly_full")
            return None
        partial.pieces[index] = data
        partial.got += 1
        partial.size += len(data)
        self._reassembly_bytes += len(data)
        if partial.got < count:
            return None
        del self._partials[key]
        self._reassembly_bytes -= partial.size
        return b"".join(partial.pieces[i] for i in range(count))

    def _drop_partial(self, key: tuple[Any, int, int, int], reason: str) -> None:
        partial = self._partials.pop(key, None)
        if partial is not None:
            self._reassembly_bytes -= partial.size
        self.dropped[reason] += 1

    def expire(self, now: float) -> int:
        """Drop partly reassembled messages older than ``reassembly_timeout``; returns how many."""
        old = [k for k, p in self._partials.items() if p.deadline <= now]
        for k in old:
            self._drop_partial(k, "fragment_expired")
        return len(old)

    def next_deadline(self) -> float | None:
        """When a partial message expires or a STATUS is due, whichever is first; or None."""
        due = [d for d in (self.next_expiry(), self.next_status_due()) if d is not None]
        return min(due) if due else None

    def next_expiry(self) -> float | None:
        """When the oldest best-effort partial message expires, or None."""
        if not self._partials:
            return None
        expiry = min(p.deadline for p in self._partials.values())
        return None if expiry == float("inf") else expiry

    def next_status_due(self) -> float | None:
        """When the earliest STATUS owed later is due, or None."""
        due = [rs.due for rs in list(self._owed) if rs.due is not None]
        return min(due) if due else None

    @property
    def reassembly_bytes(self) -> int:
        """Bytes held for partly received messages."""
        return self._reassembly_bytes

    @property
    def partials(self) -> int:
        """Messages being reassembled."""
        return len(self._partials)

