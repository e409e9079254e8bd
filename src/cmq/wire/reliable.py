"""Reliable and unordered delivery (wire format v2), without sockets or clocks.

Theory of operation
-------------------
A reliable stream is a batcher stream (destination, mailbox) whose datagrams
carry the v2 data extension: a random ``epoch`` per incarnation of the
stream, and ``R_SYN`` until the first STATUS of the receiver arrives. Its
sequence numbers start at 0 in each epoch. The unit of everything below is
the datagram: a retransmission resends the identical bytes with the same seq.

The sender (:class:`ReliableSender`, one per endpoint) keeps every datagram
of a stream in a buffer until the receiver's cumulative acknowledgement
passes it:

- it sends a datagram only below the stream's *credit limit*, which the
  receiver raises as its application consumes (flow control: a sender never
  overruns the receiver's mailboxes or its kernel buffer); above it,
  datagrams wait in the buffer, and the driver applies backpressure to
  ``push`` once the buffer holds ``send_buffer`` bytes;
- a STATUS (receiver to sender) acknowledges everything before
  ``next_expected``, lists up to 32 missing ranges after it, and raises the
  credit. A missing datagram is lost only on evidence that the report was
  written after it would have arrived (RFC 8985's RACK, RFC 9002 §6.1):
  it went before the datagram ``largest_seen`` (if that one went only
  once: a retransmission keeps its seq, so the copy that arrived is
  unknown) or before the last PROBE the receiver names by serial. One
  that went at least a reordering window (a quarter of the least RTT)
  before the evidence is retransmitted at once (many gaps per report, not
  one per round trip); one that went within the window may still be on
  its way, and is retransmitted once the evidence's round trip and the
  window have passed since it went (a *loss timer*), unless a later
  report says it arrived. A report without evidence (one written before
  repairs on their way arrived looks the same) retransmits nothing:
  resending on it would feed itself, as each duplicate draws a report.
  Retransmissions go with a PROBE right behind them when none is on its
  way, so that with nothing new to send their loss shows within a round
  trip; a PROBE no report names two RTTs after it went, while reports keep
  coming, is sent again. The driver stamps a datagram's send time under
  the lock that orders the endpoint's sends, so stamps follow the wire's
  order, which the evidence needs;
- RTT is estimated as RFC 9002 §5.3 does (the receiver's ack delay
  subtracted, samples only from datagrams sent once: Karn's rule), and
  from the first report naming the latest PROBE (serials are never
  reused), which is the only sample while no new data goes;
- a probe timeout (RFC 9002's PTO, ``srtt + max(4 rttvar, 1 ms) +
  max_ack_delay``, doubling per expiry) sends a PROBE record carrying the
  next seq, so the receiver learns of a lost tail and answers at once. It
  runs while anything is unacknowledged or waits for credit;
- after as long without an answer as ``max_probes`` doubling probe timeouts
  take (``PTO * (2 + 4 + ... + 2**max_probes)``, each at most ``MAX_PTO``)
  the peer is *dead*: every message still in the buffer is reported in doubt
  (:class:`DeliveryFailure`) and the stream starts a new epoch. Probes go
  more often than that schedule, at most ``2**PROBE_BACKOFF`` PTOs apart, so
  that a receiver restarted meanwhile is found within a few PTOs. A STATUS with ``reset`` (the receiver
  restarted and does not know the stream) does the same at once.

The receiver side (:class:`RecvStream`, kept by :class:`cmq.wire.receiver.Receiver`)
accepts seqs in ``[next_expected, credit_limit)``; ordered streams deliver
the contiguous prefix and hold what comes after a gap, unordered streams
deliver at once and remember what they saw. Duplicates are dropped and
counted. A STATUS goes out at the end of a receive batch when a new gap
appeared, a PROBE came, or a quarter of the window arrived since the last
one; otherwise ``max_ack_delay`` after the first unreported datagram; and
every ``renak_interval`` while a gap stays open.

Every method here must be called with the driver's batch lock held (the
same lock that serialises a stream's takes), since a new epoch resets the
stream's sequence numbers.
"""

from __future__ import annotations

import heapq
import secrets
import threading
from collections import deque
from collections.abc import Iterator
from types import ModuleType
from typing import Any, Final, TypeVar

import msgpack

from cmq import _impl
from cmq._errors import ProtocolError
from cmq.wire.frames import (
    FLAG_MSGPACK,
    R_ORDERED,
    R_SYN,
    Fragment,
    Probe,
    Status,
    decode,
    encode_control,
    extension,
)

__all__ = [
    "INITIAL_CREDIT",
    "START_WINDOW",
    "STATUS_BYTES",
    "DeliveryFailure",
    "RecvStream",
    "ReliableSender",
    "SendStream",
    "recv_stream_type",
    "release_acked",
    "send_stream_type",
    "seq_diff",
]

MASK: Final = 0xFFFFFFFF
_S = TypeVar("_S")
_HALF: Final = 0x8000_0000

#: RTT assumed before the first sample. RFC 9002 says 333 ms for the
#: Internet; cmq runs on LANs and loopback (round trips of 10-100 us), and a
#: large first guess only slows the first repairs: a loss before the first
#: report (a lone first message, the tail of the first flight) waits the
#: first PTO, 5 ms from this guess (32 ms from 10 ms). A farther peer only
#: gets its first probes sooner (each draws a small STATUS); what declares
#: it dead is ``max_probes`` doubling PTOs, seconds from this guess too.
INITIAL_RTT: Final = 0.001
#: Timer granularity (RFC 9002's kGranularity): the least rttvar term of a PTO.
GRANULARITY: Final = 0.001
#: How long a receiver may hold an acknowledgement (RFC 9002's max_ack_delay
#: is 25 ms; ours is short because our PTO, and so tail-loss repair, adds it).
MAX_ACK_DELAY: Final = 0.002
#: Longest probe timeout, however many expired in a row.
MAX_PTO: Final = 1.0
#: While the peer is silent, probes go at most 2**this base PTOs apart
#: (RFC 9002 doubles without bound): a receiver restarted on the same
#: address hears one, and says it lost the stream, within a few PTOs of its
#: restart, however long it was gone. How long silence lasts before the peer
#: is declared dead is the doubling schedule's, not the probes' count.
PROBE_BACKOFF: Final = 1
#: Datagrams a sender may send in a new epoch before the first STATUS
#: gives it real credit (one round trip's worth on a LAN).
INITIAL_CREDIT: Final = 16
#: The window a receiver's grants start a stream at (datagrams); it doubles
#: at each grant that finds a quarter of it arrived since the last, up to the
#: endpoint's ``window``. A stream that sends a datagram at a time (requests,
#: a ping-pong) never holds more than this, so the credit a bulk sender
#: needs, and a new stream's share, is not reserved for streams that never
#: use it (before, the first streams took the whole budget and kept it, and
#: a stream that came later got 4 datagrams at a time, each raise waiting
#: for a 2 ms re-check).
START_WINDOW: Final = 64
#: PROBEs a stream remembers the send time of, for the reports naming them
#: (a report naming an older one is taken as no evidence).
_PROBES_REMEMBERED: Final = 8
#: How often a receiver repeats a STATUS while a gap stays open.
RENAK_INTERVAL: Final = 0.003
#: A receiver reports at least once per this many bytes received (Aeron's
#: "a quarter of the window", for the window a sender's 8 MiB buffer allows
#: in flight): fewer reports and the sender waits for acknowledgements.
STATUS_BYTES: Final = 1 << 20
#: Kernel bookkeeping per queued datagram (its sk_buff): a window of small
#: datagrams is bounded by this, not by their bytes.
DATAGRAM_OVERHEAD: Final = 512


def seq_diff(a: int, b: int) -> int:
    """``a - b`` in 32-bit serial-number arithmetic (RFC 1982): negative when ``a`` is before ``b``."""
    return ((a - b + _HALF) & MASK) - _HALF


def release_acked(buf: dict[int, list[Any]], seq: int, count: int) -> int:
    """Remove the entries of a stream's buffer ``buf`` for the ``count``
    seqs from ``seq`` on (those present: a cumulative acknowledgement);
    returns the bytes of their datagrams."""
    freed = 0
    for _ in range(count):
        e = buf.pop(seq, None)
        if e is not None:
            freed += len(e[0])
        seq = (seq + 1) & MASK
    return freed


def _in_ranges(seq: int, ranges: tuple[tuple[int, int], ...]) -> bool:
    """Whether ``seq`` falls in one of the ``(start, length)`` ranges."""
    return any(0 <= seq_diff(seq, start) < length for start, length in ranges)


class DeliveryFailure:
    """Messages that were pushed reliably but whose delivery is in doubt.

    ``reason`` is ``"peer_dead"`` (no answer for as long as ``max_probes``
    doubling probe timeouts take),
    ``"peer_reset"`` (the receiver restarted: what it had not acknowledged
    is in doubt) or ``"closed"`` (the endpoint closed before they were
    acknowledged). Each message may or may not have been delivered; none
    will be sent again. Delivery is to the receiving *endpoint*: a message
    it acknowledged is not in doubt, even if its process then died before
    its application took it (at most ``max_buffered_bytes`` of them).

    ``messages`` are the payloads as the application pushed them, in push
    order. A failure the endpoint reports keeps the datagrams it gave up on
    and decodes them the first time ``messages`` is read, so that giving up
    on a large window never holds the endpoint's I/O up. Failures are
    immutable, compare equal by their four fields, and are safe to read
    from any thread.
    """

    __slots__ = ("_datagrams", "_messages", "dest", "mailbox", "reason")

    dest: Any
    mailbox: int
    reason: str
    _messages: tuple[Any, ...] | None
    _datagrams: tuple[dict[int, list[Any]], dict[int, bytes]] | None

    def __init__(self, *, dest: Any, mailbox: int, reason: str, messages: tuple[Any, ...] = ()) -> None:
        init = object.__setattr__
        init(self, "dest", dest)
        init(self, "mailbox", mailbox)
        init(self, "reason", reason)
        init(self, "_messages", tuple(messages))
        init(self, "_datagrams", None)

    @classmethod
    def _of(cls, dest: Any, mailbox: int, reason: str, buf: dict[int, list[Any]], wholes: dict[int, bytes]) -> DeliveryFailure:
        """A failure naming what the datagrams of a stream's buffer ``buf``
        (in seq order: as :meth:`ReliableSender.outgoing` inserted them)
        carry, decoded when first read; ``wholes`` by message id, the
        payloads of fragmented messages."""
        f = cls(dest=dest, mailbox=mailbox, reason=reason)
        object.__setattr__(f, "_messages", None)
        object.__setattr__(f, "_datagrams", (buf, wholes))
        return f

    @property
    def messages(self) -> tuple[Any, ...]:
        """The messages in doubt, in push order."""
        source = self._datagrams  # read first: once it is None, _messages is set
        messages = self._messages
        if messages is None:
            assert source is not None
            messages = tuple(_payloads(*source))
            object.__setattr__(self, "_messages", messages)
            object.__setattr__(self, "_datagrams", None)
        return messages

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"DeliveryFailure is immutable: cannot set {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"DeliveryFailure is immutable: cannot delete {name!r}")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DeliveryFailure):
            return NotImplemented
        return (self.dest, self.mailbox, self.reason, self.messages) == (
            other.dest,
            other.mailbox,
            other.reason,
            other.messages,
        )

    __hash__ = None  # type: ignore[assignment]  # messages may be unhashable

    def __repr__(self) -> str:
        return (
            f"DeliveryFailure(dest={self.dest!r}, mailbox={self.mailbox!r}, "
            f"reason={self.reason!r}, messages={self.messages!r})"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_failure, (self.dest, self.mailbox, self.reason, self.messages))


def _rebuild_failure(dest: Any, mailbox: int, reason: str, messages: tuple[Any, ...]) -> DeliveryFailure:
    return DeliveryFailure(dest=dest, mailbox=mailbox, reason=reason, messages=messages)


def _payloads(buf: dict[int, list[Any]], wholes: dict[int, bytes]) -> list[Any]:
    """The messages the datagrams of ``buf`` carry, in order, as the application pushed them."""
    out: list[Any] = []
    seen_ids: set[int] = set()
    for e in buf.values():
        try:
            header, body = decode(e[0])
        except ProtocolError:  # pragma: no cover - we encoded it
            continue
        if isinstance(body, Fragment):
            if body.message_id in seen_ids:
                continue
            seen_ids.add(body.message_id)
            whole = wholes.get(body.message_id)
            if whole is None:
                continue
            payloads: list[Any] = [whole]
        else:
            payloads = list(body)
        if header.flags & FLAG_MSGPACK:
            payloads = [msgpack.unpackb(p, raw=False, strict_map_key=False) for p in payloads]
        out.extend(payloads)
    return out


class SendStream:
    """The reliability state of one outgoing stream (see the module doc)."""

    __slots__ = (
        "addr",
        "awaiting",
        "behind_since",
        "buf",
        "credit",
        "dead_at",
        "epoch",
        "loss_at",
        "mailbox",
        "nbytes",
        "ordered",
        "probed",
        "pto_at",
        "pto_count",
        "sampled",
        "sent_upto",
        "serial",
        "stream",
        "suspects",
        "syn",
        "una",
        "unanswered",
        "wholes",
    )

    def __init__(self, stream: Any, epoch: int, ordered: bool) -> None:
        self.stream = stream  # the batcher's Stream: its seq and ext are ours to reset
        self.addr = stream.addr
        self.mailbox = stream.mailbox
        self.epoch = epoch
        self.ordered = ordered
        self.syn = True
        self.una = 0  # lowest seq not yet acknowledged
        self.sent_upto = 0  # seqs before this were sent at least once
        self.credit = INITIAL_CREDIT  # may send seqs before this
        # seq -> [datagram, last sent at (None: waits for credit), times sent]
        self.buf: dict[int, list[Any]] = {}
        self.nbytes = 0
        self.pto_count = 0  # probe timeouts since data was last acknowledged (the backoff)
        self.unanswered = 0  # probe timeouts since the last STATUS
        self.dead_at: float | None = None  # silent until then: the peer is dead (see max_probes)
        self.pto_at: float | None = None
        self.serial = 0  # the last PROBE's serial (1 to 65,535, then round again)
        self.awaiting = 0  # the serial of the last PROBE while no report names it (0: none)
        self.probed: dict[int, float] = {}  # serial -> when that PROBE went (the last few)
        # (seq, sent at, lost at) reported missing while too fresh to call
        # lost, and when the first of them will be (the loss timer; None:
        # not armed).
        self.suspects: list[tuple[int, float, float]] = []
        self.loss_at: float | None = None
        # Since when every STATUS asks for what was acknowledged before (None: the last did not).
        self.behind_since: float | None = None
        self.sampled = MASK  # the largest seq an RTT sample was taken from ("before 0")
        # message id -> the whole payload of a fragmented message in the buffer
        self.wholes: dict[int, bytes] = {}

    def ext(self) -> bytes:
        return extension(self.epoch, (R_SYN if self.syn else 0) | (R_ORDERED if self.ordered else 0))

    @property
    def unacked(self) -> int:
        """Datagrams in the buffer (sent or waiting for credit)."""
        return len(self.buf)

    @property
    def waiting(self) -> int:
        """Datagrams waiting for credit: encoded (up to the stream's seq), not yet sent."""
        return seq_diff(self.stream.seq, self.sent_upto)


class ReliableSender:
    """The sending half of reliable delivery for one endpoint (see the module doc).

    On the compiled core, ``total`` is a C member
    (``_speedups.SenderState``: see :func:`cmq._impl.new_object`).
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> ReliableSender:
        return _impl.new_object(cls, "SenderState")

    def __init__(
        self,
        sender_id: int,
        *,
        codec_msgpack: bool,
        key: bytes | None,
        max_probes: int,
    ) -> None:
        self.sender_id = sender_id
        self._msgpack = codec_msgpack
        self._key = key
        self._max_probes = max_probes
        self.streams: dict[int, SendStream] = {}  # by epoch
        #: Bytes held in all streams' buffers (the sum of their nbytes).
        self.total = 0
        self._timers: list[tuple[float, int, int]] = []  # (pto_at, tiebreak, epoch)
        self._loss_timers: list[tuple[float, int, int]] = []  # (loss_at, tiebreak, epoch)
        self._tick = 0
        self.srtt = INITIAL_RTT
        self.rttvar = INITIAL_RTT / 2
        self.min_rtt = float("inf")
        self.latest_rtt = 0.0
        self._sampled = False
        #: What was given up on, for the driver to report.
        self.failures: deque[DeliveryFailure] = deque()
        # Counters.
        self.retransmits = 0
        self.probes = 0
        self.status_received = 0
        self._in_doubt = 0
        self._uncounted: deque[DeliveryFailure] = deque()  # reported, messages not yet counted
        self._count_lock = threading.Lock()
        self.dead_streams = 0
        self.epoch_resets = 0
        # The core (cmq._impl): the compiled twins of the per-datagram
        # bookkeeping, clear and sent (called for every datagram a reliable
        # stream sends) and the release of what a STATUS acknowledged.
        self._release_acked = release_acked
        sp = _impl.speedups
        self._st_type = send_stream_type(sp)
        if sp is not None:
            self.clear = sp.reliable_clear  # type: ignore[method-assign]
            self.sent = sp.make_reliable_sent(self)  # type: ignore[method-assign]
            # A plain report in C (its other cases: this class's method).
            self.on_status = sp.OnStatus(self, type(self).on_status.__get__(self))  # type: ignore[method-assign]
            self._release_acked = sp.release_acked

    # -- streams -----------------------------------------------------------

    def _new_epoch(self) -> int:
        while True:
            epoch = secrets.randbits(32)
            if epoch and epoch not in self.streams:
                return epoch

    def attach(self, stream: Any, *, ordered: bool) -> SendStream:
        """Make batcher stream ``stream`` reliable: a new epoch, seqs from 0."""
        st = self._st_type(stream, self._new_epoch(), ordered)
        self.streams[st.epoch] = st
        stream.rel = st
        stream.seq = 0
        stream.ext = st.ext()
        return st

    def _restart(self, st: SendStream, reason: str, now: float) -> None:
        """Give up on ``st``'s buffer (reported in doubt) and start a new epoch."""
        self._report(st, reason)
        del self.streams[st.epoch]
        st.epoch = self._new_epoch()
        self.streams[st.epoch] = st
        st.syn = True
        st.una = st.sent_upto = 0
        st.credit = INITIAL_CREDIT
        self.total -= st.nbytes
        st.nbytes = 0
        st.pto_count = st.unanswered = 0
        st.dead_at = None
        st.pto_at = st.behind_since = st.loss_at = None
        st.probed = {}
        st.awaiting = 0
        st.suspects = []
        st.sampled = MASK
        st.stream.seq = 0
        st.stream.ext = st.ext()
        self.epoch_resets += 1

    def _report(self, st: SendStream, reason: str) -> None:
        """Give up on ``st``'s buffer: a failure that owns it (decoded when
        read), and an empty buffer for the stream."""
        if st.buf:
            failure = DeliveryFailure._of(st.addr, st.mailbox, reason, st.buf, st.wholes)
            self._uncounted.append(failure)
            self.failures.append(failure)
        st.buf = {}
        st.wholes = {}

    @property
    def in_doubt(self) -> int:
        """Messages reported in doubt so far (counting decodes the failures not yet counted)."""
        with self._count_lock:
            while self._uncounted:
                self._in_doubt += len(self._uncounted.popleft().messages)
            return self._in_doubt

    # -- sending -----------------------------------------------------------

    def outgoing(self, st: SendStream, datagrams: list[bytes], now: float, whole: bytes | None = None) -> list[bytes]:
        """Buffer the stream's new ``datagrams`` (just encoded, consecutive seqs
        ending before ``stream.seq``); returns those the credit lets go now.

        ``whole`` is the payload of a fragmented message whose fragments these are.
        """
        n = len(datagrams)
        first = (st.stream.seq - n) & MASK
        buf = st.buf
        if whole is not None:
            # Kept until acknowledged, to name the message if it is in doubt
            # (the last datagram is one of its fragments).
            body = decode(datagrams[-1])[1]
            if isinstance(body, Fragment):
                st.wholes[body.message_id] = whole
        if self.clear(st, n):
            self.sent(st, datagrams, now)
            return datagrams
        seq = first
        added = 0
        for d in datagrams:
            buf[seq] = [d, None, 0]
            added += len(d)
            seq = (seq + 1) & MASK
        st.nbytes += added
        self.total += added
        return self._release(st, now)

    def clear(self, st: SendStream, n: int) -> bool:
        """Whether the stream's ``n`` new datagrams may all go at once: within
        credit, none waiting before them (the common case)."""
        first = (st.stream.seq - n) & MASK
        return first == st.sent_upto and seq_diff(st.credit, (first + n) & MASK) >= 0

    def sent(self, st: SendStream, datagrams: list[bytes], now: float) -> None:
        """Buffer the stream's new ``datagrams``, which :meth:`clear` let go, as sent at ``now``."""
        seq = (st.stream.seq - len(datagrams)) & MASK
        buf = st.buf
        added = 0
        for d in datagrams:
            buf[seq] = [d, now, 1]
            added += len(d)
            seq = (seq + 1) & MASK
        st.nbytes += added
        self.total += added
        st.sent_upto = seq
        self._arm(st, now)

    def _release(self, st: SendStream, now: float, *, arm: bool = True) -> list[bytes]:
        """Datagrams waiting for credit that the credit now lets go; arms the
        probe timeout unless not ``arm`` (the caller arms it itself)."""
        out: list[bytes] = []
        seq = st.sent_upto
        buf = st.buf
        while seq_diff(st.credit, seq) > 0:
            e = buf.get(seq)
            if e is None:
                break
            e[1] = now
            e[2] = 1
            out.append(e[0])
            seq = (seq + 1) & MASK
        st.sent_upto = seq
        if arm and (out or st.buf):
            self._arm(st, now)
        return out

    def pto(self) -> float:
        """The base probe timeout (RFC 9002 §6.2.1)."""
        var = 4 * self.rttvar
        return self.srtt + (var if var > GRANULARITY else GRANULARITY) + MAX_ACK_DELAY

    def silence(self) -> float:
        """How long a peer may leave probes unanswered before it is dead: the
        time ``max_probes`` doubling probe timeouts would take."""
        pto = self.pto()
        return sum(min(pto * (1 << k), MAX_PTO) for k in range(1, self._max_probes + 1))

    def _arm(self, st: SendStream, now: float) -> None:
        if st.pto_at is None:
            # now + min(pto << min(pto_count, PROBE_BACKOFF), MAX_PTO), without the builtins' calls (every send).
            count = st.pto_count
            timeout = self.pto() * (1 << (count if count < PROBE_BACKOFF else PROBE_BACKOFF))
            st.pto_at = now + (timeout if timeout < MAX_PTO else MAX_PTO)
            self._tick += 1
            heapq.heappush(self._timers, (st.pto_at, self._tick, st.epoch))

    def _arm_loss(self, st: SendStream, at: float) -> None:
        if st.loss_at is None or at < st.loss_at:
            st.loss_at = at
            self._tick += 1
            heapq.heappush(self._loss_timers, (at, self._tick, st.epoch))

    # -- receiving STATUS --------------------------------------------------

    def on_status(self, rec: Status, now: float) -> tuple[SendStream | None, list[bytes]]:
        """Apply a STATUS; returns its stream (None if stale) and the datagrams to send now."""
        self.status_received += 1
        st = self.streams.get(rec.epoch)
        if st is None or rec.stream_sender != self.sender_id or rec.mailbox != st.mailbox:
            return None, []
        if rec.reset:
            self._restart(st, "peer_reset", now)
            return st, []
        if seq_diff(rec.next_expected, st.una) < 0 and st.buf:
            # The receiver asks for what it acknowledged before. Either this
            # STATUS was overtaken by a later one (reordered or duplicated on
            # the way: ignore it), or the receiver lost the stream (a restart
            # that saw only our SYN datagrams), which it then keeps saying at
            # every repeat and probe. A STATUS carries no serial to tell them
            # apart: a restart once it has said so for longer than any
            # reordering lasts (MAX_PTO; the case is rare, its cost a stall).
            if st.behind_since is None:
                st.behind_since = now
            elif now - st.behind_since >= max(self.pto(), MAX_PTO):
                self._restart(st, "peer_reset", now)
            return st, []
        st.behind_since = None
        # An answer, even one that acknowledges nothing new: a receiver whose
        # application is slow (no credit, or a full mailbox) is alive.
        st.unanswered = 0
        # When the last PROBE the receiver had when it wrote this went (None:
        # it names none, or one forgotten).
        probed = st.probed.get(rec.probe) if rec.probe else None
        reprobe = False
        if st.awaiting:
            if rec.probe == st.awaiting:
                # The first report after our last PROBE came: a round trip
                # as fresh as the receiver's state (a PROBE's serial is
                # never reused, so the sample is unambiguous). When no new
                # data goes (no credit, or the tail), it is the only one.
                st.awaiting = 0
                if probed is not None:
                    self._sample(now - probed, 0.0)
            else:
                # Reports keep coming that were written without it: after
                # two round trips it is taken as lost, and another goes.
                sent = st.probed.get(st.awaiting)
                rtt = self.latest_rtt if self._sampled else self.srtt
                reprobe = sent is None or now - sent > 2 * rtt + self._reorder_window()
        st.dead_at = None
        if st.syn:
            st.syn = False
            st.stream.ext = st.ext()
            # The first credit replaces the initial one, which the receiver
            # never gave (it may be less: a receiver short of memory).
            st.credit = rec.credit_limit
        buf = st.buf
        # RTT sample from the largest seq seen, if it was sent once (Karn)
        # and is newly reported (RFC 9002 5.1): a repeated STATUS, or the
        # answer to a probe, reports it again long after it arrived, with
        # an ack delay that saturates at 65 ms.
        # Not when the largest is itself missing: a PROBE's answer reports
        # the tail the probe announced, which never arrived.
        e = buf.get(rec.largest_seen)
        if (
            e is not None
            and e[2] == 1
            and e[1] is not None
            and seq_diff(rec.largest_seen, st.sampled) > 0
            and not _in_ranges(rec.largest_seen, rec.missing)
        ):
            st.sampled = rec.largest_seen
            self._sample(now - e[1], rec.ack_delay * 1e-6)
        # Cumulative acknowledgement.
        acked = seq_diff(rec.next_expected, st.una)
        if acked > 0:
            if seq_diff(rec.next_expected, st.sent_upto) > 0:
                acked = seq_diff(st.sent_upto, st.una)  # never past what was sent
            acked = max(acked, 0)
            freed = self._release_acked(buf, st.una, acked)
            st.nbytes -= freed
            self.total -= freed
            st.una = (st.una + acked) & MASK
            if st.wholes and not buf:
                st.wholes.clear()
            st.pto_count = 0
        if seq_diff(rec.credit_limit, st.credit) > 0:
            st.credit = rec.credit_limit
        out: list[bytes] = []
        # Repairs. Only what the report has evidence of is lost (RFC 9002
        # §6.1, RFC 8985's RACK: a datagram sent after it arrived): a
        # missing datagram last sent before `seen`, the time a datagram
        # went whose arrival (or loss) the report reflects. Evidence is the
        # datagram largest_seen, if it arrived and went only once (a copy
        # sent again could have arrived as its first copy), and the last
        # PROBE the receiver had when it wrote the report, named by serial
        # (everything sent before that PROBE had arrived or was lost).
        # Without either, a report proves nothing: one written before
        # repairs on their way arrived looks the same, and resending on it
        # feeds itself (each duplicate draws a report).
        if rec.missing:
            seen = float("-inf") if probed is None else probed
            top = buf.get(rec.largest_seen)
            if top is not None and top[2] == 1 and top[1] is not None and not _in_ranges(rec.largest_seen, rec.missing):
                seen = max(seen, top[1])
            if seen > float("-inf") and self._repair(st, rec.missing, seen, now, out) and not st.awaiting:
                # Repairs, and no PROBE on its way: one after them, whose
                # answer tells within a round trip whether they arrived
                # (otherwise, with nothing new to send, only the probe
                # timeout would).
                reprobe = True
        if reprobe and st.buf:
            out.append(self._probe(st, now))
        # Armed below, once: what the report changed decides how.
        out.extend(self._release(st, now, arm=False))
        if acked > 0 or out:
            # Progress, or datagrams sent: the probe timeout starts over. A
            # report that only repeats what is missing (a gap whose repair
            # was lost too) does not put it off: the probe's answer is then
            # what calls the repair lost.
            st.pto_at = None
            if st.buf:
                self._arm(st, now)
        elif st.pto_at is None and st.buf:
            self._arm(st, now)
        return st, out

    def _reorder_window(self) -> float:
        """How much earlier than the evidence a missing datagram must have
        gone to be lost at once (RACK's reordering window: a quarter of the
        least RTT; an eighth of the smoothed RTT before the first sample)."""
        return self.min_rtt / 4 if self._sampled else self.srtt / 8

    def _repair(self, st: SendStream, missing: tuple[tuple[int, int], ...], seen: float, now: float, out: list[bytes]) -> int:
        """Resend into ``out`` each ``missing`` datagram last sent at least a
        reordering window before ``seen`` (the evidence); one sent within
        the window before it becomes a suspect, lost once the evidence's
        round trip and the window have passed since it went (the loss
        timer); the latest report's suspects replace the last one's.
        Returns how many were resent."""
        reo = self._reorder_window()
        wait = now - seen + reo
        limit = seen - reo
        buf = st.buf
        suspects: list[tuple[int, float, float]] = []
        first = float("inf")
        resent = 0
        for start, length in missing:
            seq = start
            for _ in range(length):
                e = buf.get(seq)
                if e is not None and e[1] is not None and e[1] <= seen and seq_diff(seq, st.sent_upto) < 0:
                    if e[1] <= limit:
                        out.append(self._resend(e, now))
                        resent += 1
                    else:
                        due = e[1] + wait
                        suspects.append((seq, e[1], due))
                        first = min(first, due)
                seq = (seq + 1) & MASK
        st.suspects = suspects
        if suspects:
            self._arm_loss(st, first)
        return resent

    def _sample(self, rtt: float, ack_delay: float) -> None:
        if rtt <= 0:
            return
        self.latest_rtt = rtt
        self.min_rtt = min(self.min_rtt, rtt)
        # The receiver's ack delay is what it measured, not a bound (RFC
        # 9002's max_ack_delay): subtracted whole, the sample floored at a
        # quarter of the least RTT seen (against clocks read apart). RFC
        # 9002 keeps the whole sample when subtracting would go below the
        # least RTT: with a 100 us path and reports held 2-5 ms, a sample
        # then swings srtt and rttvar by milliseconds, and the probe timeout
        # (4 rttvar) with them.
        adjusted = max(rtt - ack_delay, self.min_rtt / 4)
        if not self._sampled:
            self._sampled = True
            self.srtt = adjusted
            self.rttvar = adjusted / 2
            return
        self.rttvar = 0.75 * self.rttvar + 0.25 * abs(self.srtt - adjusted)
        self.srtt = 0.875 * self.srtt + 0.125 * adjusted

    # -- timers ------------------------------------------------------------

    def _earliest(self, heap: list[tuple[float, int, int]], field: str) -> float | None:
        """The earliest timer of ``heap`` still armed (``field`` of its stream
        equal to it); stale entries are dropped on the way."""
        while heap:
            at, _, epoch = heap[0]
            st = self.streams.get(epoch)
            if st is not None and getattr(st, field) == at:
                return at
            heapq.heappop(heap)
        return None

    def _expired(self, heap: list[tuple[float, int, int]], field: str, now: float) -> Iterator[SendStream]:
        """The streams whose timer in ``heap`` (``field``) expired by ``now``, disarmed."""
        while heap and heap[0][0] <= now:
            at, _, epoch = heapq.heappop(heap)
            st = self.streams.get(epoch)
            if st is not None and getattr(st, field) == at:
                setattr(st, field, None)
                yield st

    def next_deadline(self) -> float | None:
        """When the earliest probe timeout or loss timer expires, or None."""
        due = [d for d in (self._earliest(self._timers, "pto_at"), self._earliest(self._loss_timers, "loss_at")) if d is not None]
        return min(due) if due else None

    def on_timer(self, now: float) -> list[tuple[bytes, Any]]:
        """Fire expired loss timers and probe timeouts; returns the datagrams
        to send (retransmissions, PROBEs), with their addresses."""
        out: list[tuple[bytes, Any]] = []
        for st in self._expired(self._loss_timers, "loss_at", now):
            self._lost(st, now, out)
        for st in self._expired(self._timers, "pto_at", now):
            if not st.buf:
                continue
            st.pto_count += 1
            st.unanswered += 1
            if st.dead_at is None:
                st.dead_at = now + self.silence()
            elif now >= st.dead_at:
                self.dead_streams += 1
                self._restart(st, "peer_dead", now)
                continue
            out.append((self._probe(st, now), st.addr))
            self._arm(st, now)
        return out

    def _probe(self, st: SendStream, now: float) -> bytes:
        """A PROBE of ``st`` going now, remembered by its serial: the datagram."""
        self.probes += 1
        st.serial = st.serial % 0xFFFF + 1
        st.awaiting = st.serial
        st.probed[st.serial] = now
        if len(st.probed) > _PROBES_REMEMBERED:
            del st.probed[next(iter(st.probed))]
        rflags = (R_SYN if st.syn else 0) | (R_ORDERED if st.ordered else 0)
        probe = Probe(mailbox=st.mailbox, epoch=st.epoch, next_seq=st.sent_upto, rflags=rflags, serial=st.serial)
        return encode_control([probe], self.sender_id, self._key)

    def _resend(self, e: list[Any], now: float) -> bytes:
        """Buffer entry ``e`` (datagram, last sent, times sent) goes again now: its datagram."""
        e[1] = now
        e[2] += 1
        self.retransmits += 1
        return e[0]  # type: ignore[no-any-return]

    def _lost(self, st: SendStream, now: float, out: list[tuple[bytes, Any]]) -> None:
        """``st``'s loss timer expired: retransmit each suspect now due,
        unless acknowledged or sent again since it was reported missing
        (then the next report decides); wait for the others."""
        buf = st.buf
        waiting: list[tuple[int, float, float]] = []
        first = float("inf")
        for seq, sent, due in st.suspects:
            e = buf.get(seq)
            if e is None or e[1] != sent:
                continue
            if due <= now:
                out.append((self._resend(e, now), st.addr))
            else:
                waiting.append((seq, sent, due))
                first = min(first, due)
        st.suspects = waiting
        if waiting:
            self._arm_loss(st, first)

    def close(self) -> None:
        """Report everything still unacknowledged as in doubt (the endpoint closes)."""
        for st in list(self.streams.values()):
            self._report(st, "closed")
            st.nbytes = 0
        self.total = 0

    # -- introspection -----------------------------------------------------

    @property
    def unacked(self) -> int:
        """Datagrams not yet acknowledged, in all streams."""
        return sum(len(st.buf) for st in self.streams.values())

    @property
    def buffered_bytes(self) -> int:
        """Bytes held for retransmission or waiting for credit, in all streams."""
        return self.total


class RecvStream:
    """The receiving state of one reliable stream (addr, sender id, mailbox)."""

    __slots__ = (
        "addr",
        "answer",
        "avg_size",
        "bytes_since",
        "credit",
        "due",
        "epoch",
        "gone",
        "grant_at",
        "grant_seen",
        "granted",
        "held",
        "held_bytes",
        "largest",
        "largest_at",
        "last_active",
        "last_size",
        "mailbox",
        "next",
        "ordered",
        "seen",
        "sender",
        "since_status",
        "urgent",
        "win",
    )

    def __init__(self, addr: Any, sender: int, mailbox: int, epoch: int, ordered: bool, now: float) -> None:
        self.addr = addr
        self.sender = sender
        self.mailbox = mailbox
        self.epoch = epoch
        self.ordered = ordered
        self.next = 0
        self.largest = MASK  # "before 0": nothing seen
        self.largest_at = now
        # ordered: datagrams after a gap, decoded: (their size, header, body)
        self.held: dict[int, tuple[int, Any, Any]] = {}
        self.held_bytes = 0
        self.seen: set[int] = set()  # unordered: seqs delivered after a gap
        self.credit = INITIAL_CREDIT
        self.avg_size = 1024.0  # of its datagrams, with last_size: the unit of its credit
        self.last_size = 0
        # Whether a STATUS gave it credit yet: before, it sends on the
        # sender's initial credit, which the receiver's budget must still bound.
        self.granted = False
        # The most credit a grant may give it (datagrams), grown as it uses
        # what it is given (see Receiver._grant); and ``largest`` at the last
        # grant (arrivals, not ``next``: under loss, what waits behind a gap
        # counts too, or the window would stay small exactly when it is needed).
        self.win = START_WINDOW
        self.grant_seen = MASK
        self.grant_at = now  # when the last grant was made (see Receiver._grant)
        self.since_status = 0  # datagrams since the last STATUS
        self.bytes_since = 0  # and their bytes
        self.urgent = False
        self.due: float | None = None  # when a delayed STATUS is due
        self.last_active = now
        self.answer = 0  # the serial of the last PROBE that came (0: none), named by every STATUS
        # Set when the receiver drops it (Receiver._new_stream): whoever
        # kept it, the compiled receive_one's memo, knows it is no longer current.
        self.gone = False

    def gaps(self) -> tuple[tuple[int, int], ...]:
        """Missing ranges between ``next`` and ``largest`` (at most 32)."""
        if seq_diff(self.largest, self.next) < 0:
            return ()
        nxt = self.next
        # Held and seen datagrams are all after next: their offsets from it
        # are plain differences modulo 2**32 (seq_diff's, without the calls).
        got = sorted([(q - nxt) & MASK for q in (self.held if self.ordered else self.seen)])
        out: list[tuple[int, int]] = []
        pos = 0  # offset from next
        for off in got:
            if off > pos:
                out.append(((self.next + pos) & MASK, min(off - pos, 0xFFFF)))
                if len(out) == 32:
                    break
            pos = off + 1
        last = seq_diff(self.largest, self.next)
        if len(out) < 32 and pos <= last:
            out.append(((self.next + pos) & MASK, min(last - pos + 1, 0xFFFF)))
        return tuple(out)

    def status(self, now: float, *, reset: bool = False) -> Status:
        """The report on this stream now, naming the last PROBE that came."""
        return Status(
            stream_sender=self.sender,
            mailbox=self.mailbox,
            epoch=self.epoch,
            next_expected=self.next,
            credit_limit=self.credit,
            largest_seen=self.largest,
            missing=() if reset else self.gaps(),
            ack_delay=int((now - self.largest_at) * 1e6),
            reset=reset,
            probe=self.answer,
        )


#: The compiled twins made so far, by (pure class, compiled base).
_TWINS: dict[tuple[type, int], type] = {}


def _twin(pure: type[_S], base: type) -> type[_S]:
    """``pure``'s compiled twin: ``base`` (a class of the compiled core with
    ``pure``'s fields as C members) with ``pure``'s methods."""
    key = (pure, id(base))
    twin = _TWINS.get(key)
    if twin is None:
        fields: tuple[str, ...] = getattr(pure, "__slots__")  # noqa: B009 - not every class has one
        methods = {k: v for k, v in vars(pure).items() if k not in fields and k != "__slots__"}
        twin = _TWINS[key] = type(pure.__name__, (base,), {**methods, "__slots__": ()})
    return twin


def recv_stream_type(speedups: ModuleType | None) -> type[RecvStream]:
    """The class of a receiver's reliable streams: :class:`RecvStream` on
    the pure-Python core; with the compiled core (``speedups``, the
    ``cmq._speedups`` module), its twin whose fields are C members
    (``_speedups.RecvState``, which the compiled receive paths read and
    write directly) and whose methods are RecvStream's."""
    return RecvStream if speedups is None else _twin(RecvStream, speedups.RecvState)


def send_stream_type(speedups: ModuleType | None) -> type[SendStream]:
    """The class of a sender's reliable streams: :class:`SendStream`, or with
    the compiled core its twin on ``_speedups.SendState`` (as
    :func:`recv_stream_type`)."""
    return SendStream if speedups is None else _twin(SendStream, speedups.SendState)
