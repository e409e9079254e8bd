"""Per-destination batching, without sockets or clocks.

Theory of operation
-------------------
Every (destination address, mailbox) pair is a *stream* (the CMQ paper's key
tuple). A stream owns a list of pending payloads and the sequence number of
its next datagram. :meth:`Batcher.push` appends a payload and tells the caller
what must happen next, as one small integer, so that the common case (append
to an open batch) costs one call and one comparison:

============  =====================================================
``QUEUED``    appended to an open batch; nothing to do
``OPENED``    the batch was empty: the caller reads the clock, and either
              sends at once (the destination is idle, see below) or arms
              the batch's deadline with :meth:`Batcher.arm`
``FULL``      the batch holds its limit (``qthresh`` bytes, or more
              under load, see below): the caller calls
              :meth:`Batcher.filled` and takes it now
``LARGE``     the payload does not fit one datagram: it was *not*
              appended; the caller sends it with :meth:`Batcher.fragments`
============  =====================================================

The idle rule (ØMQ v0.1's latency mode): a destination whose last datagram
left at least ``idle_gap`` seconds ago is idle, and a message pushed to an
idle destination is sent at once. Batching therefore only starts when pushes
come faster than datagrams leave, and then a batch waits at most ``timeout``
for more messages. :meth:`Batcher.is_idle` answers the question.

:meth:`Batcher.take` turns a stream's pending payloads into datagrams, each at
most ``max_datagram`` bytes, cut by exact sizes (the byte counters that decide
*when* to flush are only hints). Pushing never takes a lock: ``take`` removes
exactly the prefix it encoded (``del frames[:n]``), so a payload appended
while a take runs in another thread stays for the next datagram. Takes of one
stream must not run concurrently (the driver holds a lock per take, i.e. per
datagram, never per message), which also keeps datagrams in sequence order.

Under load the limit grows: a batch that fills within ``timeout`` of the
stream's previous datagram (pushes come faster than ``qthresh`` bytes per
``timeout``) doubles its
stream's limit, up to one datagram (``max_datagram``); a batch that leaves
by its deadline halves it again, and a message to an idle destination resets
it to ``qthresh``. So ``qthresh`` is the batch size at a moderate rate, and
at full rate batches grow until a datagram carries what arrives in about one
``timeout`` (ØMQ v0.1's "batch whatever accumulated while the link was
busy", without a hand-off thread).

Deadlines live in one heap of ``(deadline, tiebreak, stream, generation)``;
``take`` bumps the stream's generation, so an entry of a batch that already
left is skipped when it comes due. Push cost is therefore independent of the
number of destinations: a dict lookup and, once per batch, a heap push.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Final

from cmq._config import QueueConfig
from cmq.wire.frames import FLAG_MSGPACK, encode_fragment, encode_frames, frame_size

__all__ = ["FULL", "LARGE", "OPENED", "QUEUED", "Batcher", "Stream"]

QUEUED: Final = 0
OPENED: Final = 1
FULL: Final = 2
LARGE: Final = 3

Address = tuple[str, int] | tuple[str, int, int, int]


class Stream:
    """The batch and sequence state of one (address, mailbox) pair."""

    __slots__ = ("addr", "frames", "gen", "last_send", "limit", "mailbox", "room", "seq")

    def __init__(self, addr: Address, mailbox: int, qthresh: int) -> None:
        self.addr = addr
        self.mailbox = mailbox
        self.frames: list[bytes] = []
        # The current batch size limit, and the bytes the open batch may
        # still take before it reaches it (a hint: see push).
        self.limit = qthresh
        self.room = qthresh
        self.seq = 0
        self.gen = 0
        self.last_send = float("-inf")

    @property
    def pending(self) -> int:
        """Messages waiting in the batch."""
        return len(self.frames)


class Batcher:
    """Batches payloads per stream and cuts them into datagrams.

    ``sender`` is this endpoint's id, written in every header.
    """

    def __init__(self, config: QueueConfig, sender: int) -> None:
        self.config = config
        self.sender = sender
        self._flags = FLAG_MSGPACK if config.codec == "msgpack" else 0
        self._key = config.key
        self._qthresh = config.qthresh
        self._max_body = config.max_body
        # A payload of this size or more goes out as fragments: it cannot
        # share a datagram with its 9-byte long-frame prefix, or it is over
        # max_message (which the driver then refuses).
        self._large = min(config.max_body - 9 + 1, config.max_message + 1)
        self._small = min(255, self._large)
        self._streams: dict[tuple[Address, int], Stream] = {}
        self._heap: list[tuple[float, int, Stream, int]] = []
        self._tiebreak = itertools.count()
        self._message_ids = itertools.count(1)
        # Counters (written under the driver's send lock).
        self.messages_sent = 0
        self.datagrams_sent = 0
        self.bytes_sent = 0
        self.fragments_sent = 0

    # -- streams -----------------------------------------------------------

    def stream(self, addr: Address, mailbox: int) -> Stream:
        """The stream for ``(addr, mailbox)``, created on first use."""
        key = (addr, mailbox)
        s = self._streams.get(key)
        if s is None:
            s = self._streams.setdefault(key, Stream(addr, mailbox, self._qthresh))
        return s

    def streams(self) -> list[Stream]:
        """All streams (a copy)."""
        return list(self._streams.values())

    @property
    def destinations(self) -> int:
        """Number of streams ever used."""
        return len(self._streams)

    # -- the hot path ------------------------------------------------------

    def push(self, s: Stream, payload: bytes) -> int:
        """Append ``payload`` to ``s``'s batch; returns QUEUED, OPENED, FULL or LARGE."""
        n = len(payload)
        if n < self._small:
            n += 1
        elif n >= self._large:
            return LARGE
        else:
            n += 1 if n < 255 else 9
        frames = s.frames
        opened = not frames
        frames.append(payload)
        # ``room`` is also reset by take() in another thread; a lost update
        # only moves the moment of the next flush, never its content.
        room = s.room - n
        s.room = room
        if room <= 0:
            return FULL
        # Checked before and after the append: a take in another thread
        # between the two may have emptied the batch, which then needs a
        # deadline again.
        return OPENED if opened or len(frames) == 1 else QUEUED

    def is_idle(self, s: Stream, now: float) -> bool:
        """Whether ``s``'s last datagram left at least ``idle_gap`` before ``now``.

        A destination never sent to is idle, unless ``idle_gap`` is infinite
        (always batch).
        """
        gap = self.config.idle_gap
        return now - s.last_send >= gap and gap != float("inf")

    def arm(self, s: Stream, now: float) -> float:
        """Schedule ``s``'s open batch to leave by ``now + timeout``; returns that deadline."""
        deadline = now + self.config.timeout
        heapq.heappush(self._heap, (deadline, next(self._tiebreak), s, s.gen))
        return deadline

    def opened(self, s: Stream, now: float) -> float | None:
        """``s``'s batch was just opened at ``now``: the idle rule.

        Returns None when the destination is idle (the caller sends the
        batch at once; the limit goes back to ``qthresh``), else arms the
        batch's deadline and returns it.
        """
        if self.is_idle(s, now):
            s.limit = self._qthresh
            return None
        return self.arm(s, now)

    def filled(self, s: Stream, now: float) -> None:
        """``s``'s batch reached its limit at ``now``: grow the limit if that took less than ``timeout``.

        Measured from the previous datagram of the stream: a batch that
        fills within one timeout of it means the rate exceeds ``limit``
        bytes per ``timeout``.
        """
        if now - s.last_send < self.config.timeout:
            s.limit = min(s.limit * 2, self._max_body)


    # -- turning batches into datagrams -----------------------------------

    def take(self, s: Stream, now: float) -> list[bytes]:
        """Encode and remove everything pending on ``s``; returns the datagrams.

        Must not run concurrently with another ``take`` or ``fragments`` of
        the same stream.
        """
        frames = s.frames
        chunk = frames[:]
        if not chunk:
            return []
        del frames[: len(chunk)]
        s.gen += 1
        s.room = s.limit
        s.last_send = now
        self.messages_sent += len(chunk)
        # The common cases at C speed: all messages short (one-byte length
        # prefix) and together within one datagram.
        sizes = list(map(len, chunk))
        if max(sizes) < 255 and sum(sizes) + len(sizes) <= self._max_body:
            return [self._encode(s, chunk)]
        out: list[bytes] = []
        limit = self._max_body
        start = 0
        size = 0
        for i, p in enumerate(chunk):
            fs = frame_size(len(p))
            if size + fs > limit and i > start:
                out.append(self._encode(s, chunk[start:i]))
                start, size = i, 0
            size += fs
        out.append(self._encode(s, chunk[start:] if start else chunk))
        return out

    def _encode(self, s: Stream, payloads: list[bytes]) -> bytes:
        data = encode_frames(payloads, self._flags, self.sender, s.mailbox, s.seq, self._key)
        s.seq = (s.seq + 1) & 0xFFFFFFFF
        self.datagrams_sent += 1
        self.bytes_sent += len(data)
        return data

    def fragments(self, s: Stream, payload: bytes, now: float) -> list[bytes]:
        """Datagrams for a payload too large for one: the pending batch first, then its fragments.

        The caller checked ``len(payload) <= max_message``; the config
        guarantees that fits in ``MAX_FRAGMENTS`` pieces.
        """
        out = self.take(s, now)
        piece = self.config.max_fragment_payload
        count = -(-len(payload) // piece)
        message_id = next(self._message_ids) & 0xFFFFFFFF
        view = memoryview(payload)
        for index in range(count):
            data = encode_fragment(
                bytes(view[index * piece : (index + 1) * piece]),
                message_id=message_id,
                index=index,
                count=count,
                flags=self._flags,
                sender=self.sender,
                mailbox=s.mailbox,
                seq=s.seq,
                key=self._key,
            )
            s.seq = (s.seq + 1) & 0xFFFFFFFF
            out.append(data)
            self.bytes_sent += len(data)
        self.datagrams_sent += count
        self.fragments_sent += count
        self.messages_sent += 1
        s.last_send = now
        return out

    # -- deadlines ---------------------------------------------------------

    def next_deadline(self) -> float | None:
        """The earliest deadline of a batch still waiting, or None.

        Entries of batches that already left (full, or flushed) are dropped
        from the top of the heap here, so a driver never wakes for them. The
        driver must not run this concurrently with :meth:`arm`.
        """
        heap = self._heap
        while heap:
            _, _, s, gen = heap[0]
            if gen == s.gen and s.frames:
                return heap[0][0]
            heapq.heappop(heap)
        return None

    def due(self, now: float) -> list[Stream]:
        """Pop every deadline at or before ``now``; returns the streams whose batch is still waiting."""
        heap = self._heap
        out: list[Stream] = []
        while heap and heap[0][0] <= now:
            _, _, s, gen = heapq.heappop(heap)
            if gen == s.gen and s.frames:
                # It left by its deadline: the rate is below the limit.
                s.limit = max(s.limit // 2, self._qthresh)
                out.append(s)
        return out

    def pending_streams(self) -> list[Stream]:
        """Streams with messages waiting (for ``flush``).

        Every open batch has an entry in the deadline heap, so this costs
        the number of open batches, not the number of destinations.
        """
        seen: dict[int, Stream] = {}
        for _, _, s, _ in self._heap:
            if s.frames:
                seen[id(s)] = s
        return list(seen.values())

    @property
    def armed(self) -> int:
        """Entries in the deadline heap (an upper bound on open batches)."""
        return len(self._heap)
