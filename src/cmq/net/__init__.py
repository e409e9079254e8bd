"""Drivers: the only code that touches sockets and clocks.

:class:`Queue` (threads) and :class:`AsyncQueue` (asyncio, imported on first
use, as it brings in asyncio).
"""

from typing import TYPE_CHECKING, Any

from cmq.net.queue import Queue

if TYPE_CHECKING:
    from cmq.net.aqueue import AsyncQueue

__all__ = ["AsyncQueue", "Queue"]


def __getattr__(name: str) -> Any:
    if name == "AsyncQueue":
        from cmq.net.aqueue import AsyncQueue

        return AsyncQueue
    raise AttributeError(f"module 'cmq.net' has no attribute {name!r}")
