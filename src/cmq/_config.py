"""Frozen, validated configuration of a cmq endpoint.

Every default is a named constant with the reason beside it. A bad value
raises :class:`~cmq.ConfigError` when the config is built, never later.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, Final, Literal

from cmq._errors import ConfigError
from cmq.wire.frames import EXT_SIZE, FRAGMENT_HEADER_SIZE, HEADER_SIZE, MAX_FRAGMENTS, TAG_SIZE

__all__ = ["Codec", "Delivery", "OnFull", "QueueConfig"]

Codec = Literal["raw", "msgpack"]
Delivery = Literal["reliable", "unordered", "best-effort"]
OnFull = Literal["block", "raise"]

#: The CMQ paper's best batch threshold (its Figure 3): a batch is flushed once
#: it holds this many bytes.
DEFAULT_QTHRESH: Final = 512
#: The most a message may wait in a batch when pushes come faster than the
#: link drains. The paper used 200 ms; with the idle rule (a message to an idle
#: destination leaves at once) the timeout only bounds the wait of messages
#: pushed right behind others, as in a pipeline of requests, so it is short:
#: about two loopback round trips across cores.
DEFAULT_TIMEOUT: Final = 0.00025
#: A destination whose last datagram left at least this long ago is idle: the
#: next message to it is sent at once instead of opening a batch. It must stay
#: below the shortest round trip (about 10 us between two processes on one
#: core here) so that request/response traffic never waits for a batch.
DEFAULT_IDLE_GAP: Final = 5e-6
#: Largest UDP payload cmq sends. Under IPv4's 65,507 so that one 16 KiB
#: message and a full batch fit one datagram; on a lossy Ethernet path set it
#: to 1472 so that a batch never becomes several IP fragments, any one of
#: which loses the whole datagram.
DEFAULT_MAX_DATAGRAM: Final = 65000
#: Largest message ``push`` accepts (larger raises MessageTooLarge).
DEFAULT_MAX_MESSAGE: Final = 16 * 1024 * 1024
#: Bound of each mailbox's receive queue, in messages. The original CMQ's
#: channel was unbounded; past this bound messages are dropped and counted.
DEFAULT_MAX_QUEUED: Final = 262_144
#: Memory for messages being reassembled from fragments, in bytes.
DEFAULT_MAX_REASSEMBLY: Final = 64 * 1024 * 1024
#: How long a partly received fragmented message is kept before it is
#: dropped (and counted as expired).
DEFAULT_REASSEMBLY_TIMEOUT: Final = 5.0
#: Kernel socket buffers. The receive buffer is where datagrams wait while
#: the application is busy (Linux's default 208 KiB overflows in well under
#: a millisecond at full rate). It also bounds a reliable receiver's budget,
#: and so the credit its senders get: 64 MiB, as much as ``max_buffered_bytes``,
#: lets a 512-byte stream run at 4.7M rather than 3.1M messages a second on
#: loopback, where 16 MiB of acknowledgements in flight held it. A ceiling,
#: not an allocation. Without root the kernel caps it at net.core.rmem_max.
DEFAULT_RECEIVE_BUFFER: Final = 64 * 1024 * 1024
#: The send buffer: 16 MiB absorbs a scheduling hiccup of tens of milliseconds.
DEFAULT_SOCKET_BUFFER: Final = 16 * 1024 * 1024

#: Reliable delivery by default: a message queue that silently loses what a
#: busy receiver could not take is not one to build on. Multicast stays
#: best-effort whatever this says.
DEFAULT_DELIVERY: Final = "reliable"
#: Bytes of received, unconsumed messages an endpoint holds (all mailboxes,
#: reorder and reassembly buffers together). In reliable modes the limit
#: shows as less credit for senders, in best-effort mode as counted drops.
#: Large enough for a few hundred full datagrams in flight at once.
DEFAULT_MAX_BUFFERED: Final = 64 * 1024 * 1024
#: Bytes a reliable stream keeps for retransmission and for want of credit
#: before ``push`` applies backpressure: a second or so of a fast sender's
#: output, the notes' 8 MiB ring.
DEFAULT_SEND_BUFFER: Final = 16 * 1024 * 1024
#: All reliable streams of an endpoint together (a sender to many slow
#: receivers must not hold 16 MiB for each of them).
DEFAULT_MAX_SEND_BUFFERED: Final = 64 * 1024 * 1024
#: Most datagrams a receiver lets one stream have in flight (its window);
#: within it, the receiver's memory budget decides (a window of small
#: datagrams must still cover a round trip at full rate).
DEFAULT_WINDOW: Final = 8192
#: How long a silent peer has before it is declared dead, in doubling probe
#: timeouts (from a few ms, each capped at 1 s: about 3-5 s). Probes go
#: more often than that, at most two probe timeouts apart.
DEFAULT_MAX_PROBES: Final = 10
#: How long a push waits for room in a full send buffer before it raises.
DEFAULT_PUSH_TIMEOUT: Final = 30.0
#: How long close() waits for outstanding reliable messages to be
#: acknowledged; what is still unacknowledged then is reported in doubt.
DEFAULT_LINGER: Final = 2.0
#: How long a blocking read polls the socket before it sleeps. On these
#: machines (virtual CPUs) waking a sleeping thread from another CPU costs
#: 40-55 us, most of a loopback round trip; an answer that comes within
#: this budget is taken without that wake-up.
DEFAULT_SPIN: Final = 100e-6

_MIN_DATAGRAM: Final = HEADER_SIZE + EXT_SIZE + TAG_SIZE + FRAGMENT_HEADER_SIZE + 64
_MAX_UDP_PAYLOAD: Final = 65507
#: The most a count or byte budget may be (the compiled core keeps them in 64-bit fields).
_MAX_COUNT: Final = 1 << 62


def _doc(text: str) -> dict[str, Any]:
    return {"doc": text}


@dataclass(frozen=True, kw_only=True)
class QueueConfig:
    """Configuration of one :class:`cmq.Queue` or :class:`cmq.AsyncQueue`.

    Raises:
        ConfigError: on construction, when a value is out of range.
    """

    qthresh: int = field(default=DEFAULT_QTHRESH, metadata=_doc("batch size in bytes that triggers a flush"))
    """Flush a destination's batch once it holds this many bytes."""

    timeout: float = field(default=DEFAULT_TIMEOUT, metadata=_doc("most seconds a message waits in a batch"))
    """The most, in seconds, that a message waits in a batch before it is sent."""

    idle_gap: float = field(default=DEFAULT_IDLE_GAP, metadata=_doc("seconds after which a destination is idle"))
    """A destination is idle when its last datagram left at least this many
    seconds ago; a message to an idle destination is sent at once. 0 sends
    every first message of a batch at once; ``inf`` always batches (CMQ's
    original behaviour)."""

    max_datagram: int = field(default=DEFAULT_MAX_DATAGRAM, metadata=_doc("largest datagram in bytes"))
    """Largest datagram sent, header and tag included."""

    max_message: int = field(default=DEFAULT_MAX_MESSAGE, metadata=_doc("largest message in bytes"))
    """Largest message accepted by ``push`` (after encoding)."""

    codec: Codec = field(default="raw", metadata=_doc("'raw' bytes or 'msgpack' values"))
    """``"raw"``: messages are bytes-like. ``"msgpack"``: any MessagePack-able value."""

    key: bytes | None = field(default=None, metadata=_doc("shared key for BLAKE2b tags"))
    """Shared key (1 to 64 bytes). With a key every datagram carries a tag and
    datagrams without a valid tag are dropped and counted."""

    max_queued: int = field(default=DEFAULT_MAX_QUEUED, metadata=_doc("messages kept per mailbox"))
    """Bound of each mailbox's receive queue, in messages."""

    max_reassembly: int = field(default=DEFAULT_MAX_REASSEMBLY, metadata=_doc("bytes for reassembly"))
    """Memory for partly received fragmented messages, in bytes."""

    reassembly_timeout: float = field(default=DEFAULT_REASSEMBLY_TIMEOUT, metadata=_doc("seconds"))
    """Seconds a partly received fragmented message is kept."""

    rcvbuf: int = field(default=DEFAULT_RECEIVE_BUFFER, metadata=_doc("kernel receive buffer bytes"))
    """Kernel receive buffer size in bytes (as root, set even past rmem_max)."""

    sndbuf: int = field(default=DEFAULT_SOCKET_BUFFER, metadata=_doc("kernel send buffer bytes"))
    """Kernel send buffer size in bytes."""

    reuse_addr: bool = field(default=False, metadata=_doc("let several endpoints bind one port"))
    """Set SO_REUSEADDR, so several endpoints on one host can bind the same
    port and all receive a multicast group's datagrams."""

    multicast_ttl: int = field(default=1, metadata=_doc("multicast hops"))
    """Time to live of multicast datagrams (1: this subnet only)."""

    multicast_loop: bool = field(default=True, metadata=_doc("deliver own multicast locally"))
    """Deliver multicast datagrams to endpoints on this host too."""

    delivery: Delivery = field(default=DEFAULT_DELIVERY, metadata=_doc("'reliable', 'unordered' or 'best-effort'"))
    """How messages this endpoint pushes are delivered. ``"reliable"``: each
    exactly once, in push order per (sender, destination, mailbox), or
    reported failed (``on_failure``, ``stats().in_doubt``); flow-controlled
    by what the receiver consumes. ``"unordered"``: the same, but a message
    is handed over as soon as it arrives, not behind a repair.
    ``"best-effort"``: the CMQ paper's datagrams, wire format v1, at most
    once. Multicast is always best-effort. Every endpoint receives all three."""

    on_full: OnFull = field(default="block", metadata=_doc("'block' or 'raise' when the send buffer is full"))
    """What ``push`` does when a reliable stream's send buffer is full:
    ``"block"`` waits up to ``push_timeout`` for the receiver to make room,
    ``"raise"`` raises :class:`cmq.WouldBlock` at once. Either way the
    message that could not be queued is not sent. ``AsyncQueue.push`` always
    raises; ``await AsyncQueue.send`` waits."""

    push_timeout: float = field(default=DEFAULT_PUSH_TIMEOUT, metadata=_doc("seconds a blocked push waits"))
    """Seconds a blocking push waits for room before raising :class:`cmq.WouldBlock`."""

    send_buffer: int = field(default=DEFAULT_SEND_BUFFER, metadata=_doc("bytes kept per reliable stream"))
    """Bytes a reliable stream keeps (unacknowledged, or waiting for credit)
    before ``push`` applies backpressure."""

    max_send_buffered: int = field(
        default=DEFAULT_MAX_SEND_BUFFERED, metadata=_doc("bytes kept by all reliable streams together")
    )
    """Bytes all of this endpoint's reliable streams keep together before
    ``push`` to any of them applies backpressure (as ``send_buffer`` does
    for one): the sender's memory bound, however many destinations."""

    max_buffered_bytes: int = field(default=DEFAULT_MAX_BUFFERED, metadata=_doc("bytes of unconsumed input"))
    """Most bytes of received, unconsumed data this endpoint holds."""

    window: int = field(default=DEFAULT_WINDOW, metadata=_doc("datagrams in flight per stream"))
    """Most datagrams one sender may have in flight to this endpoint, per stream."""

    max_probes: int = field(default=DEFAULT_MAX_PROBES, metadata=_doc("doubling probe timeouts before a silent peer is dead"))
    """How long a peer may stay silent before it is declared dead and its
    unacknowledged messages reported in doubt: as long as this many probe
    timeouts take, doubling from the first (each at most 1 s). Probes are
    sent more often (at most two probe timeouts apart), so that a receiver
    restarted on the same address is found within a few of them."""

    linger: float = field(default=DEFAULT_LINGER, metadata=_doc("seconds close() waits for acknowledgements"))
    """Seconds ``close()`` waits for reliable messages to be acknowledged."""

    on_failure: Callable[[Any], None] | None = field(
        default=None, metadata=_doc("called with each cmq.DeliveryFailure"), compare=False
    )
    """Called with a :class:`cmq.DeliveryFailure` when reliable messages are
    in doubt (peer dead or restarted, or closed before acknowledgement), in
    whichever thread noticed; keep it short. Without it they are counted in
    ``stats().in_doubt`` and kept in :meth:`cmq.Queue.failures`."""

    spin: float = field(default=DEFAULT_SPIN, metadata=_doc("seconds a blocking read polls before it sleeps"))
    """Seconds a blocking ``get`` polls the socket, yielding the CPU between
    polls, before it sleeps (Aeron's back-off idle strategy, in short): an
    answer that comes within it is taken without a thread wake-up. The
    budget adapts: it halves after each poll that found nothing and is off
    after a few, so a reader whose messages come seldom spends almost
    nothing on it. Only a read that awaits the answer to the one message
    of the queue's own that is unanswered polls (request and reply): a
    consumer that only receives, or a reader with several requests out,
    waits on a busy peer, whose CPU time a poll could take. 0 never polls;
    on a one-CPU machine it is never used."""

    def __post_init__(self) -> None:
        def bad(name: str, why: str) -> ConfigError:
            return ConfigError(f"{name}={getattr(self, name)!r}: {why}")

        for name in ("qthresh", "max_datagram", "max_message", "max_queued", "max_reassembly",
                     "rcvbuf", "sndbuf", "multicast_ttl", "send_buffer", "max_send_buffered", "max_buffered_bytes", "window",
                     "max_probes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise bad(name, "must be an integer")
        if self.qthresh < 1:
            raise bad("qthresh", "must be at least 1 byte")
        if not _MIN_DATAGRAM <= self.max_datagram <= _MAX_UDP_PAYLOAD:
            raise bad("max_datagram", f"must be between {_MIN_DATAGRAM} and {_MAX_UDP_PAYLOAD}")
        for name in ("timeout", "idle_gap", "reassembly_timeout", "push_timeout", "linger", "spin"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or value != value:
                raise bad(name, "must be a number of seconds")
            if value < 0:
                raise bad(name, "must not be negative")
        if self.spin > 0.1:
            raise bad("spin", "must be at most 0.1 s (it burns a CPU while it lasts)")
        if self.timeout == float("inf"):
            raise bad("timeout", "must be finite (a batch must leave eventually)")
        if self.codec not in ("raw", "msgpack"):
            raise bad("codec", "unknown codec; use 'raw' or 'msgpack'")
        if self.key is not None:
            if not isinstance(self.key, bytes):
                raise ConfigError("key must be bytes")
            if not 1 <= len(self.key) <= 64:
                raise ConfigError(f"key must be 1 to 64 bytes, not {len(self.key)}")
        if self.max_message < 1:
            raise bad("max_message", "must be at least 1 byte")
        most = self.max_fragment_payload * MAX_FRAGMENTS
        if self.max_message > most:
            raise bad("max_message", f"cannot exceed {most} bytes with max_datagram={self.max_datagram}")
        if not 1 <= self.max_queued <= _MAX_COUNT:
            raise bad("max_queued", f"must be 1 to {_MAX_COUNT}")
        if self.max_reassembly < 0:
            raise bad("max_reassembly", "must not be negative")
        if self.rcvbuf < 0 or self.sndbuf < 0:
            raise ConfigError("socket buffer sizes must not be negative")
        if not 0 <= self.multicast_ttl <= 255:
            raise bad("multicast_ttl", "must be 0 to 255")
        if self.delivery not in ("reliable", "unordered", "best-effort"):
            raise bad("delivery", "unknown delivery mode; use 'reliable', 'unordered' or 'best-effort'")
        if self.on_full not in ("block", "raise"):
            raise bad("on_full", "use 'block' or 'raise'")
        if self.send_buffer < self.max_datagram:
            raise bad("send_buffer", f"must hold at least one datagram ({self.max_datagram} bytes)")
        if self.max_send_buffered < self.max_datagram:
            raise bad("max_send_buffered", f"must hold at least one datagram ({self.max_datagram} bytes)")
        if self.max_buffered_bytes < self.max_datagram:
            raise bad("max_buffered_bytes", f"must hold at least one datagram ({self.max_datagram} bytes)")
        if self.max_buffered_bytes > _MAX_COUNT:
            raise bad("max_buffered_bytes", f"must be at most {_MAX_COUNT} bytes")
        if not 4 <= self.window <= 1 << 20:
            raise bad("window", "must be 4 to 1048576 datagrams")
        if self.max_probes < 1:
            raise bad("max_probes", "must be at least 1")
        if self.on_failure is not None and not callable(self.on_failure):
            raise bad("on_failure", "must be callable or None")

    @property
    def max_body(self) -> int:
        """Bytes available for frames in one datagram (after a v2 extension in reliable modes)."""
        ext = EXT_SIZE if self.delivery != "best-effort" else 0
        return self.max_datagram - HEADER_SIZE - ext - (TAG_SIZE if self.key is not None else 0)

    @property
    def max_fragment_payload(self) -> int:
        """Bytes of a message carried by one fragment datagram."""
        return self.max_body - FRAGMENT_HEADER_SIZE

    @classmethod
    def from_options(cls, config: QueueConfig | None, options: dict[str, Any]) -> QueueConfig:
        """Build a config from an optional base and keyword overrides.

        Raises:
            ConfigError: an unknown option name or a bad value.
        """
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - names)
        if unknown:
            raise ConfigError(f"unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(names))}")
        base = config or cls()
        if not options:
            return base
        values = {f.name: getattr(base, f.name) for f in fields(cls)}
        values.update(options)
        return cls(**values)
