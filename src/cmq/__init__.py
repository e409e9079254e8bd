"""cmq: a lightweight, inherently asynchronous UDP message queue."""

from __future__ import annotations

from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

from cmq._config import QueueConfig
from cmq._errors import (
    Closed,
    CmqError,
    ConfigError,
    MessageTooLarge,
    MissingExtra,
    ProtocolError,
    RemoteError,
    Timeout,
    TransportError,
    WouldBlock,
)
from cmq._impl import implementation
from cmq._types import Message, Stats
from cmq.net.queue import Queue
from cmq.wire.reliable import DeliveryFailure

if _TYPE_CHECKING:
    from cmq.net.aqueue import AsyncQueue

    __version__: str

__all__ = [
    "AsyncQueue",
    "Closed",
    "CmqError",
    "ConfigError",
    "DeliveryFailure",
    "Message",
    "MessageTooLarge",
    "MissingExtra",
    "ProtocolError",
    "Queue",
    "QueueConfig",
    "RemoteError",
    "Stats",
    "Timeout",
    "TransportError",
    "WouldBlock",
    "__version__",
    "implementation",
]


def __getattr__(name: str) -> _Any:
    # AsyncQueue imports asyncio, which costs every `cmq send` and every
    # benchmark worker a noticeable start-up; load it on first use.
    if name == "AsyncQueue":
        from cmq.net.aqueue import AsyncQueue

        return AsyncQueue
    if name == "__version__":
        # One place holds the version: pyproject.toml, read back from the
        # installed metadata. Looked up on first use: reading the metadata
        # takes longer than importing cmq.
        from importlib.metadata import PackageNotFoundError, version

        try:
            found = version("pycmq")
        except PackageNotFoundError:  # run from a source tree that was never installed
            found = "0+unknown"
        globals()["__version__"] = found
        return found
    raise AttributeError(f"module 'cmq' has no attribute {name!r}")
