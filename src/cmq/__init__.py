"""cmq: a lightweight, inherently asynchronous UDP message queue."""

from __future__ import annotations

from cmq._config import QueueConfig
from cmq._errors import (
    Closed,
    CmqError,
    ConfigError,
    MessageTooLarge,
    ProtocolError,
    RemoteError,
    Timeout,
    TransportError,
    WouldBlock,
)
from cmq._types import Message, Stats
from cmq.net.aqueue import AsyncQueue
from cmq.net.queue import Queue

__version__ = "0.1.0"

__all__ = [
    "AsyncQueue",
    "Closed",
    "CmqError",
    "ConfigError",
    "Message",
    "MessageTooLarge",
    "ProtocolError",
    "Queue",
    "QueueConfig",
    "RemoteError",
    "Stats",
    "Timeout",
    "TransportError",
    "WouldBlock",
    "__version__",
]
