"""Frozen, validated configuration of a cmq endpoint.

Every default is a named constant with the reason beside it. A bad value
raises :class:`~cmq.ConfigError` when the config is built, never later.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Final, Literal

from cmq._errors import ConfigError
from cmq.wire.frames import FRAGMENT_HEADER_SIZE, HEADER_SIZE, MAX_FRAGMENTS, TAG_SIZE

__all__ = ["Codec", "QueueConfig"]

Codec = Literal["raw", "msgpack"]

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
#: a millisecond at full rate); 16 MiB absorbs a scheduling hiccup of tens of
#: milliseconds. It is a ceiling, not an allocation. Without root the kernel
#: caps it at net.core.rmem_max.
DEFAULT_SOCKET_BUFFER: Final = 16 * 1024 * 1024

_MIN_DATAGRAM: Final = HEADER_SIZE + TAG_SIZE + FRAGMENT_HEADER_SIZE + 64
_MAX_UDP_PAYLOAD: Final = 65507


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

    rcvbuf: int = field(default=DEFAULT_SOCKET_BUFFER, metadata=_doc("kernel receive buffer bytes"))
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

    def __post_init__(self) -> None:
        def bad(name: str, why: str) -> ConfigError:
            return ConfigError(f"{name}={getattr(self, name)!r}: {why}")

        for name in ("qthresh", "max_datagram", "max_message", "max_queued", "max_reassembly",
                     "rcvbuf", "sndbuf", "multicast_ttl"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise bad(name, "must be an integer")
        if self.qthresh < 1:
            raise bad("qthresh", "must be at least 1 byte")
        if not _MIN_DATAGRAM <= self.max_datagram <= _MAX_UDP_PAYLOAD:
            raise bad("max_datagram", f"must be between {_MIN_DATAGRAM} and {_MAX_UDP_PAYLOAD}")
        for name in ("timeout", "idle_gap", "reassembly_timeout"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or value != value:
                raise bad(name, "must be a number of seconds")
            if value < 0:
                raise bad(name, "must not be negative")
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
        if self.max_queued < 1:
            raise bad("max_queued", "must be at least 1")
        if self.max_reassembly < 0:
            raise bad("max_reassembly", "must not be negative")
        if self.rcvbuf < 0 or self.sndbuf < 0:
            raise ConfigError("socket buffer sizes must not be negative")
        if not 0 <= self.multicast_ttl <= 255:
            raise bad("multicast_ttl", "must be 0 to 255")

    @property
    def max_body(self) -> int:
        """Bytes available for frames in one datagram."""
        return self.max_datagram - HEADER_SIZE - (TAG_SIZE if self.key is not None else 0)

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
