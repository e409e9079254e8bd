"""System adapters: one module per system, the same few names in each.

Every adapter module defines:

- ``NAME``: the system's name on the command line (``"zmq"``).
- ``DATAGRAM``: ``True`` when the system may lose messages (UDP-based): its
  receivers stop after an idle gap and its round trips have a timeout.
- ``MAX_SIZE``: the largest message, in bytes, the adapter can send.
- ``available() -> str | None``: ``None`` when the system can be used here,
  else one line saying what is missing and how to get it.
- ``command() -> list[str]``: the argv that runs one role of this adapter in
  its own process (see :func:`cmq.lab.systems._common.worker_main`).
- The six roles, each run alone in a process by :mod:`cmq.lab.runner`, all
  keyword-only and returning a JSON-able dict:

  - ``throughput_receiver(ready, size, bind, startup, idle, deadline)``
  - ``throughput_sender(peer, size, count, duration)``
  - ``pingpong_server(ready, size, bind, startup, idle, deadline)``
  - ``pingpong_client(peer, size, count, timeout)``
  - ``pingping_server(...)`` and ``pingping_client(..., window)``: the same,
    asynchronous (the next message goes before the reply).

A receiver or server calls ``ready(info)`` once it listens; ``info`` is
passed to the other side as ``peer``. It stops on the end marker, or when no
message came for ``idle`` seconds (``startup`` before the first one), or after
``deadline`` seconds in all: it never hangs.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from cmq._errors import ConfigError

__all__ = ["ADAPTER_NAMES", "SYSTEMS", "load"]

SYSTEMS: tuple[str, ...] = ("cmq", "udp", "tcp", "zmq", "nats", "rabbitmq", "msgpack-rpc")
"""Every system with an adapter, in the order tables list them."""

ADAPTER_NAMES: tuple[str, ...] = (
    "NAME",
    "DATAGRAM",
    "MAX_SIZE",
    "available",
    "command",
    "throughput_receiver",
    "throughput_sender",
    "pingpong_server",
    "pingpong_client",
    "pingping_server",
    "pingping_client",
)
"""The names every adapter module defines."""


def load(name: str) -> ModuleType:
    """The adapter module of system ``name``.

    Raises :class:`~cmq.ConfigError` for a system without an adapter.
    """
    if name not in SYSTEMS:
        raise ConfigError(f"unknown system {name!r}; known systems: {', '.join(SYSTEMS)}")
    return importlib.import_module(f"{__name__}.{name.replace('-', '_')}")
