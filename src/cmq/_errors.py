"""One error tree for all of cmq.

Every error cmq raises on purpose is a :class:`CmqError`, so a caller can catch
that one class. Below it, the split follows what a caller can do about it:

- :class:`ConfigError` (also a ``ValueError``): a bad argument or option. Raised
  at once, at construction or call time, never later. Fix the call.
- :class:`MessageTooLarge` (also a ``ValueError``): a message over the
  configured maximum. Raised by ``push`` before anything is sent, so no half
  message ever leaves.
- :class:`ProtocolError`: bytes that do not follow wire format v1. The sans-IO
  decoder raises it; live endpoints never let it escape: they count the
  datagram as dropped in ``stats()`` and carry on.
- :class:`WouldBlock`: a call could not complete without (more) waiting: a
  reliable stream's send buffer is full (``push`` with ``on_full="raise"``,
  or after ``push_timeout``); the message was not queued. Retrying later may
  succeed.
- :class:`Timeout` (also the builtin ``TimeoutError``): a blocking call or a
  request ran out of time.
- :class:`Closed`: the endpoint was closed by this process; calls after
  ``close()`` raise it.
- :class:`TransportError` (also an ``OSError``): the operating system refused
  a socket operation (port in use, unreachable host). The original ``OSError``
  is chained as ``__cause__``.
- :class:`RemoteError`: the peer answered, but with an error (used by the
  broker and the queue service clients).
- :class:`MissingExtra` (also a ``ModuleNotFoundError``): a part of cmq needs
  an optional dependency that is not installed. Its one-line message names
  the extra that brings it (``pip install 'pycmq[service]'``). Install it.
"""

from __future__ import annotations

__all__ = [
    "Closed",
    "CmqError",
    "ConfigError",
    "MessageTooLarge",
    "MissingExtra",
    "ProtocolError",
    "RemoteError",
    "Timeout",
    "TransportError",
    "WouldBlock",
]


class CmqError(Exception):
    """Base class of every error cmq raises on purpose."""


class ConfigError(CmqError, ValueError):
    """A bad argument or configuration value (local fault, fix the call)."""


class MessageTooLarge(CmqError, ValueError):
    """A message is larger than the configured maximum; nothing was sent."""


class ProtocolError(CmqError):
    """Bytes that are not a valid wire format v1 datagram."""


class WouldBlock(CmqError):
    """The operation cannot complete without blocking; try again later."""


class Timeout(CmqError, TimeoutError):
    """A blocking call or a request did not complete in time."""


class Closed(CmqError):
    """The endpoint was closed locally; no more calls are accepted."""


class TransportError(CmqError, OSError):
    """The operating system refused a socket operation (see ``__cause__``)."""


class RemoteError(CmqError):
    """The remote side answered with an error."""

    def __init__(self, message: str, *, code: str = "") -> None:
        super().__init__(message)
        self.code = code


class MissingExtra(CmqError, ModuleNotFoundError):
    """An optional dependency is missing; the message names the extra to install.

    ``name`` is the missing module (as on ``ModuleNotFoundError``) and
    ``extra`` the extra of ``pycmq`` that installs it.
    """

    def __init__(self, message: str, *, name: str | None = None, extra: str = "") -> None:
        super().__init__(message, name=name)
        self.extra = extra

    def __reduce__(self) -> tuple[type[MissingExtra], tuple[str], dict[str, str | None]]:
        # Keyword arguments do not survive the default pickling of exceptions
        # (a worker process may send one back).
        return (type(self), (str(self),), {"name": self.name, "extra": self.extra})
