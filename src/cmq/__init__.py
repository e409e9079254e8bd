"""cmq: a lightweight, inherently asynchronous UDP message queue."""

from __future__ import annotations

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

__version__ = "0.1.0"

__all__ = [
    "Closed",
    "CmqError",
    "ConfigError",
    "MessageTooLarge",
    "ProtocolError",
    "RemoteError",
    "Timeout",
    "TransportError",
    "WouldBlock",
    "__version__",
]
