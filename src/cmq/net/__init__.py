"""Drivers: the only code that touches sockets and clocks."""

from cmq.net.queue import Queue

__all__ = ["Queue"]
