"""Replace, not replay: re-submitting a request that timed out, without holding up other traffic.

The CMQ paper argues that when a request goes unanswered, the sender should
not replay a log of what it sent (as a reliable transport would, holding up
everything behind it) but *replace* it: send a new message, with the same or
fresher data, under a new correlation id, while all other traffic flows on.
A late reply to the replaced request is dropped (and counted as
``late_reply``), so the caller only ever sees the answer to what it last
asked.

Both helpers work with :class:`cmq.Queue` (returning a
``concurrent.futures.Future``) and :class:`cmq.AsyncQueue` (an
``asyncio.Future``), through ``request_future``'s ``on_timeout`` hook, which
runs on the endpoint's timer: nothing blocks while waiting.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from cmq._errors import ConfigError

__all__ = ["replace", "retry"]


class _Requester(Protocol):
    def request_future(
        self,
        dest: Any,
        msg: Any,
        timeout: float = ...,
        mailbox: int = ...,
        on_timeout: Callable[[int], Any] | None = ...,
    ) -> Any: ...


def _check_attempts(attempts: int) -> None:
    if not isinstance(attempts, int) or isinstance(attempts, bool) or attempts < 1:
        raise ConfigError(f"attempts={attempts!r}: must be an integer >= 1")


def replace(
    queue: _Requester,
    dest: Any,
    make: Callable[[int], Any],
    *,
    timeout: float = 1.0,
    attempts: int = 3,
    mailbox: int = 0,
) -> Any:
    """Request ``make(1)``; on each timeout replace it with ``make(n)``, up to ``attempts`` tries.

    ``make`` builds the message for attempt ``n`` (1-based), so each try can
    carry fresh data (the paper's "replace"). Returns the future of the
    reply; it fails with :class:`cmq.Timeout` after the last attempt, or
    with whatever ``make`` raised.

    Raises:
        ConfigError: ``attempts`` below 1 or a bad ``timeout``, address or mailbox.
    """
    _check_attempts(attempts)

    def on_timeout(attempt: int) -> Any:
        return make(attempt + 1) if attempt < attempts else None

    return queue.request_future(dest, make(1), timeout=timeout, mailbox=mailbox, on_timeout=on_timeout)


def retry(
    queue: _Requester, dest: Any, msg: Any, *, timeout: float = 1.0, attempts: int = 3, mailbox: int = 0
) -> Any:
    """Request ``msg``, re-sending the same message on timeout, up to ``attempts`` tries.

    Raises:
        ConfigError: as :func:`replace`.
    """
    return replace(queue, dest, lambda _n: msg, timeout=timeout, attempts=attempts, mailbox=mailbox)
