"""Small frozen values handed to the user: received messages and statistics."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

__all__ = ["Address", "Message", "Stats"]

#: A socket address as Python's socket module gives it: (host, port) for
#: IPv4, (host, port, flowinfo, scope_id) for IPv6.
Address = tuple[Any, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Message:
    """A received message with where it came from.

    ``correlation`` is set on requests (see :meth:`cmq.Queue.reply`).
    """

    payload: Any
    sender: Address
    sender_id: int
    mailbox: int
    seq: int
    correlation: int | None = None

    @property
    def is_request(self) -> bool:
        """Whether the sender waits for a :meth:`~cmq.Queue.reply`."""
        return self.correlation is not None


def _frozen(d: Mapping[str, int] | None = None) -> Mapping[str, int]:
    return MappingProxyType(dict(d or {}))


@dataclass(frozen=True, slots=True, kw_only=True)
class Stats:
    """A snapshot of an endpoint's counters (see :meth:`cmq.Queue.stats`).

    ``dropped`` counts every message or datagram this endpoint dropped, by
    reason; ``kernel_drops`` is what the kernel dropped on this socket before
    cmq saw it (full receive buffer), where the OS tells (Linux), else None.
    """

    messages_sent: int = 0
    messages_received: int = 0
    datagrams_sent: int = 0
    datagrams_received: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    fragments_sent: int = 0
    datagrams_missing: int = 0
    datagrams_late: int = 0
    queued: int = 0
    pending: int = 0
    destinations: int = 0
    requests_pending: int = 0
    dropped: Mapping[str, int] = field(default_factory=_frozen)
    kernel_drops: int | None = None
    #: The delivery mode of what this endpoint pushes.
    delivery: str = "best-effort"
    #: Reliable datagrams sent or waiting for credit, not yet acknowledged.
    unacked: int = 0
    #: Bytes those datagrams take.
    send_buffered: int = 0
    #: Datagrams sent again because a receiver reported them missing.
    retransmits: int = 0
    #: PROBEs sent after a probe timeout (tail loss, or waiting for credit).
    probes: int = 0
    #: Reliable messages given up on (peer dead, restarted, or closed first).
    in_doubt: int = 0
    #: Streams whose peer stopped answering probes.
    dead_streams: int = 0
    #: Streams restarted: a new epoch of ours after a failure, or a sender's new epoch seen.
    epoch_resets: int = 0
    #: STATUS records sent (as a receiver) and received (as a sender).
    status_sent: int = 0
    status_received: int = 0
    #: Reliable datagrams received twice (dropped; the first was kept).
    duplicates: int = 0
    #: Reliable datagrams received beyond the credit or the budget (dropped
    #: without acknowledgement: they are sent again).
    overruns: int = 0
    #: Smoothed round-trip time of reliable streams, in seconds.
    srtt: float = 0.0
    #: The base probe timeout of reliable streams, in seconds (RFC 9002's PTO:
    #: ``srtt + max(4 rttvar, 1 ms) + max_ack_delay``); each expiry in a row
    #: without an acknowledgement doubles a stream's, up to 1 s.
    pto: float = 0.0
    #: Bytes of received, unconsumed data held (mailboxes, reorder and reassembly buffers).
    held_bytes: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.dropped, MappingProxyType):
            object.__setattr__(self, "dropped", _frozen(self.dropped))

    @property
    def total_dropped(self) -> int:
        """Sum of all ``dropped`` counters."""
        return sum(self.dropped.values())

    def as_dict(self) -> dict[str, Any]:
        """A plain dict (for JSON)."""
        out = {name: getattr(self, name) for name in self.__dataclass_fields__}
        out["dropped"] = {k: v for k, v in self.dropped.items() if v}
        return out
