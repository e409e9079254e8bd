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

Per stream (address, sender, mailbox) the receiver remembers the next
expected sequence number, to count datagrams that never arrived
(``datagrams_missing``) and those that arrived late (``datagrams_late``).
The table is bounded; the oldest streams are forgotten first.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Callable
from itertools import islice, repeat
from operator import length_hint
from typing import Any, Final

import msgpack

from cmq._config import QueueConfig
from cmq._errors import ProtocolError
from cmq.wire.frames import (
    FLAG_CONTROL,
    FLAG_FRAGMENT,
    FLAG_MSGPACK,
    FLAG_TAG,
    HEADER_SIZE,
    MAGIC,
    VERSION,
    BadTag,
    decode,
    split_frames,
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
]

#: Mailbox bit marking request/response traffic (user mailboxes are below it).
ENVELOPE_BIT: Final = 0x8000_0000
KIND_REQUEST: Final = 1
KIND_REPLY: Final = 2
_ENVELOPE = struct.Struct(">BQ")
ENVELOPE_SIZE: Final = _ENVELOPE.size

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
_SLOW_FLAGS: Final = FLAG_FRAGMENT | FLAG_TAG | FLAG_CONTROL

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
    "control",  # control datagrams (none defined yet) are not delivered
    "bad_envelope",  # request/response message without a valid envelope
)


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

    __slots__ = ("chunks", "consumed", "delivered")

    def __init__(self) -> None:
        self.chunks: deque[Chunk] = deque()
        self.delivered = 0
        self.consumed = 0

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
    """Decodes datagrams and delivers their messages to mailboxes."""

    def __init__(self, config: QueueConfig) -> None:
        self.config = config
        self._key = config.key
        self._max_queued = config.max_queued
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
        return sum(v.queued() for v in list(self.mailboxes.values()))

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
        # Fast path: a plain, untagged datagram of raw messages for an
        # application mailbox, the bulk of traffic, handled inline.
        # Everything else goes through the general decoder.
        if self._key is None and len(data) >= HEADER_SIZE and not data[3] & _SLOW_FLAGS:
            magic, version, flags, sender, mailbox, seq = _HEAD.unpack_from(data)
            if magic != MAGIC or version != VERSION or flags & ~FLAG_MSGPACK:
                self.dropped["malformed"] += 1
                return 0
            try:
                payloads: list[Any] = split_frames(data, HEADER_SIZE, len(data))
            except ProtocolError:
                self.dropped["malformed"] += 1
                return 0
            key = (addr, sender, mailbox)
            table = self._expected
            if table.get(key) == seq:
                table[key] = (seq + 1) & 0xFFFFFFFF
            else:
                self._sequence(addr, sender, mailbox, seq)
            if flags or mailbox & ENVELOPE_BIT:
                return self._deliver(payloads, flags, addr, sender, mailbox, seq)
            mb = self.mailboxes.get(mailbox)
            if mb is None:
                mb = self.mailbox(mailbox)
            n = len(payloads)
            if mb.delivered - mb.consumed + n > self._max_queued:
                return self._deliver(payloads, flags, addr, sender, mailbox, seq)
            mb.chunks.append(Chunk(payloads, (addr, sender, mailbox, seq, None)))
            mb.delivered += n
            self.messages_received += n
            return n
        try:
            header, body = decode(data, self._key)
        except BadTag:
            self.dropped["bad_tag"] += 1
            return 0
        except ProtocolError:
            self.dropped["malformed"] += 1
            return 0
        flags, sender, mailbox, seq = header.flags, header.sender, header.mailbox, header.seq
        self._sequence(addr, sender, mailbox, seq)
        if flags & FLAG_CONTROL:
            self.dropped["control"] += 1
            return 0
        if isinstance(body, list):
            return self._deliver(body, flags, addr, sender, mailbox, seq)
        whole = self._reassemble(addr, sender, mailbox, seq, body.message_id, body.index, body.count, body.data, now)
        if whole is None:
            return 0
        return self._deliver([whole], flags, addr, sender, mailbox, seq)

    def receive_one(self, data: bytes, addr: Any, now: float, mailbox: int) -> tuple[Any, Meta] | None:
        """:meth:`datagram_received` for a reader waiting on ``mailbox``, which holds nothing.

        A plain datagram carrying exactly one message for ``mailbox``, next
        in its stream's sequence, is returned as ``(payload, meta)`` instead
        of being queued (the latency path of a blocking read: no chunk, no
        mailbox). Anything else is handled by :meth:`datagram_received` and
        None is returned. Never raises.
        """
        size = len(data) - _ONE_SIZE  # the bytes after a short frame's prefix
        if size >= 0 and self._key is None:
            mvf, sender, mb, seq, n = _ONE.unpack_from(data)
            if n == size and n < 255:
                start = _ONE_SIZE
            elif n == 255 and size >= 8 and _LONG_LEN.unpack_from(data, _ONE_SIZE)[0] == size - 8:
                start = _ONE_SIZE + 8
            else:
                start = 0  # not one frame filling the datagram
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
        self.datagram_received(data, addr, now)
        return None

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

    def _deliver(self, payloads: list[Any], flags: int, addr: Any, sender: int, mailbox: int, seq: int) -> int:
        if mailbox & ENVELOPE_BIT:
            return self._deliver_enveloped(payloads, flags, addr, sender, mailbox, seq)
        if flags & FLAG_MSGPACK:
            payloads = self._decode_all(payloads)
        mb = self.mailbox(mailbox)
        n = self._room(mb, len(payloads))
        if n <= 0:
            return 0
        if n < len(payloads):
            payloads = payloads[:n]
        mb.chunks.append(Chunk(payloads, (addr, sender, mailbox, seq, None)))
        mb.delivered += n
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
    ) -> bytes | None:
        key = (addr, sender, mailbox, message_id)
        partial = self._partials.get(key)
        if partial is None:
            self.expire(now)
            partial = _Partial(count, now + self.config.reassembly_timeout, (addr, sender, mailbox, seq, None))
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
        """When the oldest partial message expires, or None."""
        if not self._partials:
            return None
        return min(p.deadline for p in self._partials.values())

    @property
    def reassembly_bytes(self) -> int:
        """Bytes held for partly received messages."""
        return self._reassembly_bytes

    @property
    def partials(self) -> int:
        """Messages being reassembled."""
        return len(self._partials)

