"""Drivers: the only code that touches sockets and clocks."""

from cmq.net.aqueue import AsyncQueue
from cmq.net.queue import Queue

__all__ = ["AsyncQueue", "Queue"]
