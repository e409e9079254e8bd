"""Per-destination batching, without sockets or clocks.

Theory of operation
-------------------
Every (destination address, mailbox) pair is a *stream* (the CMQ paper's key
tuple). A stream owns a list of pending payloads and the sequence number of
its next datagram. Pushing is split in two halves so that the common case
costs one append and one comparison:

- the *fast half* (:meth:`Batcher.append`, the one every push of every
  driver runs, with no lock): refuse a payload too large for one datagram
  (``LARGE``), append it, and compare the batch's length with the stream's
  ``check_at``. Below it, the message is ``QUEUED`` and nothing else
  happens; at it, the answer is ``CHECK``;
- the *slow half* (:meth:`Batcher.advance`, under the driver's batch lock),
  once ``check_at`` is reached: applies the idle rule, then
  :meth:`Batcher.check` counts the bytes of the messages appended since its
  last call (at C speed), and answers

============  =====================================================
``QUEUED``    the batch is open and has room; ``check_at`` is moved to
              where the batch will be full if messages keep their
              average size
``OPENED``    the batch has no deadline yet (it was empty): the caller
              reads the clock, and either sends at once (the destination
              is idle, see below) or arms the batch's deadline with
              :meth:`Batcher.opened`
``FULL``      the batch holds its limit (``qthresh`` bytes, or more
              under load, see below), or one more message of its
              average size would not fit a datagram: the caller calls
              :meth:`Batcher.filled` and takes it now
``LARGE``     (from the fast half) the payload does not fit one datagram:
              it was *not* appended; the caller sends it with
              :meth:`Batcher.fragments`
============  =====================================================

:meth:`Batcher.advance` turns those answers into what the driver does: send
datagrams now, arm a deadline, or nothing. :meth:`Batcher.push` is the two
halves in one call, for callers that hold no lock of their own (tests, the
lab's push-cost profile).

:meth:`take` sets ``check_at`` to 1 *before* it copies the batch, so the
first message appended after a take always reaches :meth:`check`, which
opens the next batch. ``check`` and ``take`` of a stream must be serialised
by the driver (one lock, taken per batch, never per message); appending
needs no lock.

The idle rule (ØMQ v0.1's latency mode): a destination whose last datagram
left at least ``idle_gap`` seconds ago is idle (for a reliable stream: and
none of its datagrams is unacknowledged), and a message pushed to an
idle destination is sent at once. So is one whose last datagram left before
the application last got a datagram it was waiting for (the driver records
when, in :attr:`Batcher.waited_at`): a reply, or the next request of a
ping-pong, follows a wait for the network, not another push, however short
the round trip. Batching therefore only starts when pushes
come faster than datagrams leave, and then a batch waits at most ``timeout``
for more messages. :meth:`Batcher.is_idle` answers the question.

:meth:`Batcher.take` turns a stream's pending payloads into datagrams, each at
most ``max_datagram`` bytes, cut by exact sizes (the byte counters that decide
*when* to flush are only hints). ``take`` removes exactly the prefix it
encoded (``del frames[:n]``), so a payload appended while a take runs in
another thread stays for the next datagram. Takes of one stream must not run
concurrently (the driver holds its lock per batch), which also keeps
datagrams in sequence order.

Under load the limit grows: a batch that fills within ``timeout`` of the
stream's previous datagram (pushes come faster than ``qthresh`` bytes per
``timeout``) doubles its
stream's limit, up to one datagram (``max_datagram``); a batch that leaves
by its deadline halves it again, and a message to a destination idle for a
whole ``timeout`` resets it to ``qthresh`` (a shorter pause, such as the
pushing thread waiting for the GIL, keeps it). So ``qthresh`` is the batch size at a moderate rate, and
at full rate batches grow until a datagram carries what arrives in about one
``timeout`` (ØMQ v0.1's "batch whatever accumulated while the link was
busy", without a hand-off thread).

Deadlines live in one heap (:class:`Deadlines`) of ``(deadline, tiebreak,
stream, generation)`` entries; ``take`` bumps the stream's generation, so an
entry of a batch that already left is skipped when it comes due. Push cost is
therefore independent of the number of destinations: a dict lookup and, once
per batch, a heap push. (The compiled core keeps the heap's entries in one C
array rather than a tuple each: 100,000 open batches are then not 100,000
more objects for the cycle collector to walk.)
"""

from __future__ import annotations

import heapq
import itertools
from bisect import bisect_right
from collections.abc import Callable
from itertools import accumulate
from typing import Any, Final

from cmq import _impl
from cmq._config import QueueConfig
from cmq.wire.frames import (
    FLAG_MSGPACK,
    PREFIX,
    SEQ,
    VERSION,
    VERSION_2,
    encode_fragment,
    encode_frame,
    encode_frames,
    frame,
    frame_size,
    stream_head,
)

__all__ = ["CHECK", "FULL", "LARGE", "OPENED", "QUEUED", "Batcher", "Deadlines", "Stream"]

#: The idle gap of a reliable stream with datagrams unacknowledged (see
#: Batcher._gap): longer than a streaming sender's pushes are apart, even
#: when acknowledgements interleave, shorter than a round trip across cores.
BUSY_GAP: Final = 50e-6

QUEUED: Final = 0
OPENED: Final = 1
FULL: Final = 2
LARGE: Final = 3
#: From the fast half: appended, and the batch reached ``check_at`` (call advance).
CHECK: Final = 4

Address = tuple[str, int] | tuple[str, int, int, int]
_pack_seq = SEQ.pack


class _FramedSizes(dict[int, int]):
    """Framed size by payload size, filled on first use (C-speed lookups with ``map``)."""

    def __missing__(self, n: int) -> int:
        size = frame_size(n)
        if n <= 0xFFFF:
            self[n] = size
        return size


_FRAMED: Final = _FramedSizes()


class Stream:
    """The batch and sequence state of one (address, mailbox) pair."""

    __slots__ = (
        "addr",
        "armed",
        "check_at",
        "counted",
        "ext",
        "frames",
        "gen",
        "head",
        "last_send",
        "limit",
        "mailbox",
        "rel",
        "seq",
        "size",
        "sizes",
    )

    def __init__(self, addr: Address, mailbox: int, qthresh: int, head: bytes = b"") -> None:
        self.addr = addr
        self.mailbox = mailbox
        # The header before the sequence number (frames.stream_head).
        self.head = head
        # The v2 data extension (epoch, rflags) of a reliable stream, written
        # after the seq; empty for best-effort (v1) streams.
        self.ext = b""
        # The reliable stream's state (cmq.wire.reliable.SendStream), or None.
        self.rel: Any = None
        self.frames: list[bytes] = []
        # The current batch size limit (bytes).
        self.limit = qthresh
        # The batch length at which a push must call Batcher.check; 1 while
        # the batch is empty, 0 forces every push there (a closed queue).
        self.check_at = 1
        # Of the open batch, the messages check has counted and their
        # framed bytes (a hint: one byte of prefix each).
        self.counted = 0
        self.size = 0
        self.sizes: list[int] = []  # of the counted messages, for take
        self.seq = 0
        # take() bumps gen; armed == gen once the open batch has a deadline.
        self.gen = 0
        self.armed = -1
        self.last_send = float("-inf")

    @property
    def pending(self) -> int:
        """Messages waiting in the batch."""
        return len(self.frames)


class Deadlines:
    """The open batches' deadlines: a heap of ``(deadline, tiebreak, stream, generation)``.

    An entry is *live* while its stream's generation is still the one it
    was pushed with and the stream has messages waiting; the others (their
    batch left, full or flushed) are dropped when they reach the top.
    Entries of equal deadlines come out in the order they were pushed.
    Callers serialise every call but ``len`` (the driver's batch lock).
    """

    __slots__ = ("_heap", "_tiebreak")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Stream, int]] = []
        self._tiebreak = itertools.count()

    def __len__(self) -> int:
        """Entries, live or not (an upper bound on open batches)."""
        return len(self._heap)

    def push(self, deadline: float, s: Stream) -> None:
        """Add an entry for ``s``'s open batch (its current generation), due at ``deadline``."""
        heapq.heappush(self._heap, (deadline, next(self._tiebreak), s, s.gen))

    def first(self) -> float | None:
        """The earliest deadline of a live entry, or None; drops the dead entries above it."""
        heap = self._heap
        while heap:
            _, _, s, gen = heap[0]
            if gen == s.gen and s.frames:
                return heap[0][0]
            heapq.heappop(heap)
        return None

    def pop_due(self, now: float) -> list[Stream]:
        """Pop every entry due at or before ``now``; returns the streams of the live ones, in order."""
        heap = self._heap
        out: list[Stream] = []
        while heap and heap[0][0] <= now:
            _, _, s, gen = heapq.heappop(heap)
            if gen == s.gen and s.frames:
                out.append(s)
        return out

    def waiting(self) -> list[Stream]:
        """The streams of entries whose stream has messages waiting, each once, by deadline."""
        seen: dict[int, Stream] = {}
        for _, _, s, _ in sorted(self._heap, key=lambda entry: (entry[0], entry[1])):
            if s.frames:
                seen[id(s)] = s
        return list(seen.values())


class Batcher:
    """Batches payloads per stream and cuts them into datagrams.

    ``sender`` is this endpoint's id, written in every header. On the
    compiled core, ``waited_at`` and the three counters are C members
    (``_speedups.BatcherState``: see :func:`cmq._impl.new_object`).
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Batcher:
        return _impl.new_object(cls, "BatcherState")

    def __init__(self, config: QueueConfig, sender: int) -> None:
        self.config = config
        self.sender = sender
        self._flags = FLAG_MSGPACK if config.codec == "msgpack" else 0
        self._key = config.key
        self._qthresh = config.qthresh
        self._max_body = config.max_body
        self._timeout = config.timeout
        self._idle_gap = config.idle_gap
        self._never_idle = config.idle_gap == float("inf")
        self._busy_gap = max(config.idle_gap, BUSY_GAP)
        #: When the application last got a datagram it had been waiting for
        #: (the driver sets it, on the driver's clock). A stream whose last
        #: datagram left before then is idle, however short the gap: what
        #: an application pushes after waiting for input (a reply, the next
        #: request of a ping-pong) starts a new exchange, which a batch
        #: would only delay.
        self.waited_at = float("-inf")
        # A payload of this size or more goes out as fragments (LARGE): it
        # cannot share a datagram with its 9-byte long-frame prefix, or it is
        # over max_message (which the driver then refuses).
        self.large = min(config.max_body - 9 + 1, config.max_message + 1)
        # The core (cmq._impl): the compiled twins of the stream, the fast
        # half and the framing, or the pure ones.
        sp = _impl.speedups
        #: The class of this batcher's streams.
        self.Stream: Any = Stream if sp is None else sp.Stream
        self._frame = frame if sp is None else sp.frame
        #: The fast half, as a closure (see the module's docstring).
        self.append = self._make_append(self.large) if sp is None else sp.make_append(self.large)
        self._cut: Any = None
        if sp is not None:
            # The slow half's counting and the cutting of a batch, in C
            # (the same answers and datagrams: tests/unit/test_cores.py).
            self.check = sp.make_check(self._max_body)  # type: ignore[method-assign]
            if self._key is None:
                self._cut = sp.cut
                self.take_idle = sp.make_take_idle(self, self.take_idle)  # type: ignore[method-assign]
        # mailbox -> address -> stream. Keyed by the address itself, not an
        # (address, mailbox) tuple: a lookup then makes no tuple, and the
        # key it finds is usually the very object it was given (no compare),
        # which matters with many destinations (one cache miss fewer each).
        self._streams: dict[int, dict[Address, Stream]] = {}
        # Header bytes before the sequence number, by mailbox (the same for
        # every destination): made once, not per stream.
        # (Best-effort, reliable): mailbox -> header.
        self._heads: tuple[dict[int, bytes], dict[int, bytes]] = ({}, {})
        if sp is not None:
            # The same lookup, and a new stream made, in C.
            self.stream = sp.make_stream(self._streams, *self._heads, self._head, self._qthresh)  # type: ignore[method-assign]
        #: The deadline heap. Drivers may test it for emptiness (no batch is
        #: open) without a call; only the batcher changes it.
        self.heap: Deadlines = Deadlines() if sp is None else sp.Deadlines()
        self._message_ids = itertools.count(1)
        # Counters (written under the driver's send lock).
        self.messages_sent = 0
        self.datagrams_sent = 0
        self.bytes_sent = 0
        self.fragments_sent = 0

    # -- streams -----------------------------------------------------------

    def stream(self, addr: Address, mailbox: int, *, reliable: bool = False) -> Stream:
        """The stream for ``(addr, mailbox)``, created on first use.

        A new ``reliable`` stream writes version 2 headers; the caller
        attaches its reliability state (``Stream.rel``, ``Stream.ext``).
        """
        by_addr = self._streams.get(mailbox)
        if by_addr is not None:
            s = by_addr.get(addr)
            if s is not None:
                return s
        else:
            by_addr = self._streams.setdefault(mailbox, {})
        head = self._head(mailbox, reliable)
        return by_addr.setdefault(addr, self.Stream(addr, mailbox, self._qthresh, head))

    def _head(self, mailbox: int, reliable: bool) -> bytes:
        """The header bytes before the sequence number of a new stream's datagrams."""
        heads = self._heads[reliable]
        head = heads.get(mailbox)
        if head is None:
            version = VERSION_2 if reliable else VERSION
            head = heads[mailbox] = stream_head(self._flags, self.sender, mailbox, version)
        return head

    def streams(self) -> list[Stream]:
        """All streams (a copy)."""
        return [s for by_addr in list(self._streams.values()) for s in list(by_addr.values())]

    @property
    def destinations(self) -> int:
        """Number of streams ever used."""
        return sum(len(by_addr) for by_addr in list(self._streams.values()))

    # -- the hot path ------------------------------------------------------

    @staticmethod
    def _make_append(large: int) -> Any:
        def append(s: Stream, payload: bytes) -> int:
            """The fast half of a push: QUEUED, CHECK or LARGE (see the module's docstring).

            Needs no lock: a take running meanwhile in another thread leaves
            this payload for the next datagram, and its ``check_at`` makes
            sure the payload reaches :meth:`advance`.
            """
            if len(payload) >= large:
                return LARGE
            frames = s.frames
            frames.append(payload)
            return QUEUED if len(frames) < s.check_at else CHECK

        return append

    def push(self, s: Stream, payload: bytes) -> int:
        """Both halves of a push without the driver's slow path: QUEUED, OPENED, FULL or LARGE.

        :meth:`append`, then :meth:`check` when it answers CHECK.
        """
        r: int = self.append(s, payload)
        return self.check(s) if r == CHECK else r

    def advance(self, s: Stream, clock: Callable[[], float]) -> list[bytes] | float | None:
        """The slow half of a push, after :meth:`append` answered CHECK.

        Applies the idle rule to a batch being opened, then :meth:`check`,
        and answers what the driver must do: a list of datagrams to send now
        (taken at ``s.last_send``, possibly empty), a float (the deadline it
        armed for the batch; the driver's timer must fire by then), or None
        (the batch stays open). ``clock`` is read at most once, and only
        when needed. Same serialisation rule as :meth:`take`.
        """
        now: float | None = None
        if s.armed != s.gen:
            # A batch is opening: to an idle destination, one message
            # leaves at once (the latency path, kept short).
            now = clock()
            datagram = self.take_idle(s, now)
            if datagram is not None:
                return [datagram]
        r = self.check(s)
        if r == QUEUED:
            return None
        if now is None:
            now = clock()
        if r == OPENED:
            deadline = self.opened(s, now)
            if deadline is not None:
                return deadline
        else:
            self.filled(s, now)
        return self.take(s, now)

    def hold(self, s: Stream) -> None:
        """Make the next push to ``s`` run the slow half, whatever its batch holds."""
        s.check_at = 0

    def sent(self, s: Stream, now: float) -> None:
        """``s``'s latest datagram left (or was held for credit) at ``now``: its idle gap counts from then."""
        s.last_send = now

    def close(self) -> None:
        """Every later push, bound senders' too, runs the slow half (where the driver refuses it)."""
        for s in self.streams():
            s.check_at = 0

    def check(self, s: Stream) -> int:
        """The slow half of push: QUEUED, OPENED or FULL, and where to check next.

        Must not run concurrently with :meth:`take` of the same stream.
        """
        frames = s.frames
        counted = s.counted
        if not counted and len(frames) == 1:
            # A batch opening with one message (the common case), counted
            # without the general bookkeeping below.
            n = len(frames[0])
            counted = s.counted = 1
            s.size = n + 1 if n < 255 else n + 9
            sizes = None
        else:
            # The sizes of the messages appended since the last check (one
            # C call: no other thread appends in between).
            sizes = list(map(len, frames[counted:] if counted else frames))
        if sizes:
            k = len(sizes)
            if k >= 64:
                # Kept for take (a prefix of the batch), where it saves
                # measuring a large batch again; small ones are not worth it.
                kept = s.sizes
                if len(kept) < counted:
                    kept += map(len, frames[len(kept) : counted])
                kept += sizes
            counted += k
            s.counted = counted
            nbytes = sum(sizes)
            # Framing: one byte a message, nine for long ones (judged by the average).
            s.size += nbytes + k * (1 if nbytes < 255 * k else 9)
        elif not frames:
            return QUEUED  # taken meanwhile: the next push opens a batch
        size = s.size
        avg = size // counted or 1
        limit = s.limit
        room = self._max_body - size
        if size >= limit or avg > room:
            return FULL
        # Check again when the batch reaches its limit or one more message
        # of the average size would not fit a datagram, whichever is first.
        s.check_at = counted + max(min(-(-(limit - size) // avg), room // avg), 1)
        if s.armed == s.gen:
            return QUEUED
        s.armed = s.gen
        return OPENED

    def is_idle(self, s: Stream, now: float) -> bool:
        """Whether ``s`` is idle at ``now``: its last datagram left at least
        ``idle_gap`` before, or before the application last got a datagram
        it had waited for (:attr:`waited_at`).

        A destination never sent to is idle, unless ``idle_gap`` is infinite
        (always batch). A reliable stream whose datagrams wait for credit is
        never idle (its next messages join a batch that grows until the
        credit comes); one with datagrams unacknowledged is idle after
        ``BUSY_GAP``: a reliable sender's pushes cost more and come less
        evenly than ``idle_gap`` apart, and sending each in a datagram of its
        own would only slow it down and run its window out, while a reply
        that follows a round trip is idle.
        """
        rel = s.rel
        if self._never_idle or (rel is not None and rel.waiting):
            return False
        if s.last_send <= self.waited_at:
            return True
        gap = self._busy_gap if rel is not None and rel.buf else self._idle_gap
        return now - s.last_send >= gap

    def arm(self, s: Stream, now: float) -> float:
        """Schedule ``s``'s open batch to leave by ``now + timeout``; returns that deadline."""
        deadline = now + self._timeout
        self.heap.push(deadline, s)
        return deadline

    def opened(self, s: Stream, now: float) -> float | None:
        """``s``'s batch was just opened at ``now``: the idle rule.

        Returns None when the destination is idle (the caller sends the
        batch at once; after a whole ``timeout`` of silence the limit goes
        back to ``qthresh``), else arms the batch's deadline and returns it.
        """
        if self.is_idle(s, now):
            if now - s.last_send >= self.config.timeout:
                s.limit = self._qthresh
            return None
        return self.arm(s, now)

    def take_idle(self, s: Stream, now: float) -> bytes | None:
        """The idle rule's short path: the datagram of a batch of one that may leave now.

        When ``s``'s batch is being opened (no deadline yet) with exactly
        one message and the destination is idle at ``now``, takes that
        message and returns its datagram; otherwise changes nothing and
        returns None (the caller goes on with :meth:`check`). Same
        serialisation rule as :meth:`take`.
        """
        frames = s.frames
        if len(frames) != 1 or s.armed == s.gen or not self.is_idle(s, now):
            return None
        if now - s.last_send >= self._timeout:
            s.limit = self._qthresh
        s.check_at = 1  # as take: before the message leaves the list
        payload = frames.pop()
        s.gen += 1
        if s.counted:
            if s.sizes:
                s.sizes = []
            s.counted = s.size = 0
        s.last_send = now
        seq = s.seq
        s.seq = (seq + 1) & 0xFFFFFFFF
        if self._key is None:
            # encode_frame, with the stream's constant header bytes.
            data = b"".join((s.head, _pack_seq(seq), s.ext, PREFIX[len(payload)], payload))
        else:
            data = encode_frame(payload, self._flags, self.sender, s.mailbox, seq, self._key, s.ext)
        self.messages_sent += 1
        self.datagrams_sent += 1
        self.bytes_sent += len(data)
        return data

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
        # check_at first: a push that appends after the copy below then
        # reaches check, which opens the next batch (see the module's docstring).
        s.check_at = 1
        frames = s.frames
        chunk = frames[:]
        if not chunk:
            return []
        del frames[: len(chunk)]
        s.gen += 1
        s.counted = s.size = 0
        s.last_send = now
        self.messages_sent += len(chunk)
        if self._cut is not None:
            # The compiled core measures, cuts and frames the batch in one
            # call (its check keeps no sizes: s.sizes stays empty).
            cut: list[bytes] = self._cut(chunk, s.head, s.seq, s.ext, self._max_body)
            s.seq = (s.seq + len(cut)) & 0xFFFFFFFF
            self.datagrams_sent += len(cut)
            self.bytes_sent += sum(map(len, cut))
            return cut
        sizes = s.sizes
        if sizes:
            s.sizes = []
        if len(sizes) < len(chunk):
            sizes = [*sizes, *map(len, chunk[len(sizes) :])]
        limit = self._max_body
        n = sizes[0]
        if sizes.count(n) == len(sizes):
            # All of one size (the common case under load): as many per
            # datagram as fit, cut by count.
            per = max(limit // frame_size(n), 1)
            if len(chunk) <= per:
                return [self._encode(s, chunk, sizes)]
            return [
                self._encode(s, chunk[i : i + per], sizes[i : i + per]) for i in range(0, len(chunk), per)
            ]
        framed = list(accumulate(map(_FRAMED.__getitem__, sizes)))
        if framed[-1] <= limit:
            return [self._encode(s, chunk, sizes)]
        # Cut where the running total of framed sizes crosses each datagram's limit.
        out: list[bytes] = []
        start = 0
        base = 0
        while start < len(chunk):
            end = max(bisect_right(framed, base + limit, start), start + 1)
            out.append(self._encode(s, chunk[start:end], sizes[start:end]))
            base = framed[end - 1]
            start = end
        return out

    def _encode(self, s: Stream, payloads: list[bytes], sizes: list[int]) -> bytes:
        if self._key is None:
            # From the stream's constant header bytes (frames.frame).
            data = self._frame(payloads, s.head, s.seq, s.ext)
        else:
            data = encode_frames(payloads, self._flags, self.sender, s.mailbox, s.seq, self._key, sizes, s.ext)
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
                ext=s.ext,
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
        return self.heap.first()

    def due(self, now: float) -> list[Stream]:
        """Pop every deadline at or before ``now``; returns the streams whose batch is still waiting."""
        out = self.heap.pop_due(now)
        qthresh = self._qthresh
        for s in out:
            # It left by its deadline: the rate is below the limit.
            s.limit = max(s.limit // 2, qthresh)
        return out

    def pending_streams(self) -> list[Stream]:
        """Streams with messages waiting (for ``flush``).

        Every open batch has an entry in the deadline heap, so this costs
        the number of open batches, not the number of destinations.
        """
        return self.heap.waiting()

    @property
    def armed(self) -> int:
        """Entries in the deadline heap (an upper bound on open batches)."""
        return len(self.heap)
