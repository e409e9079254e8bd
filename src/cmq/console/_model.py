"""The console's view of a server, sans-IO: rate history and queue paging.

Theory of operation
-------------------
A backend (:mod:`cmq.console._backends`) reads a server's counters and
queues; these pieces turn what it read into what the pages show, and never
read a clock or a socket themselves.

- :class:`RateHistory` is fed cumulative counters (``sample(now, totals)``)
  about once a second by the driver and keeps the per-second rates between
  consecutive samples for the last :data:`HISTORY_SECONDS`: the overview's
  live chart. A counter that goes down (a restart) counts as 0, not as a
  negative rate.
- :class:`QueueRates` keeps the previous cumulative counters of each queue
  and gives each queue's rates since it last looked.
- :func:`page_of` filters, sorts and cuts one page out of the queue rows:
  with 10,000 queues the browser draws one page, never all of them.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cmq._errors import ConfigError

__all__ = [
    "HISTORY_SECONDS",
    "MAX_PER_PAGE",
    "SORT_KEYS",
    "QueuePage",
    "QueueRates",
    "QueueRow",
    "RateHistory",
    "page_of",
]

#: How far back the overview's chart reaches ("the last minutes").
HISTORY_SECONDS = 300
#: Rows one page may ask for: a screenful or a few, never all 10,000.
MAX_PER_PAGE = 500
#: Columns the queue table sorts by.
SORT_KEYS = ("name", "depth", "in_flight", "delayed", "consumers", "rate_in", "rate_out")


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueRow:
    """One line of the queue table (None: the server has no such figure)."""

    name: str
    depth: int
    """Messages ready to be received or delivered."""
    in_flight: int
    """Received or delivered and not yet deleted or acknowledged."""
    delayed: int | None = None
    consumers: int | None = None
    rate_in: float | None = None
    """Messages in per second since the last look."""
    rate_out: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass(frozen=True, slots=True, kw_only=True)
class QueuePage:
    """One page of the filtered, sorted queue table."""

    rows: tuple[QueueRow, ...]
    total: int
    """Queues that match the filter (all pages)."""
    page: int
    per_page: int
    sort: str
    descending: bool

    def as_dict(self) -> dict[str, Any]:
        return {
            "rows": [r.as_dict() for r in self.rows],
            "total": self.total,
            "page": self.page,
            "per_page": self.per_page,
            "pages": max(1, math.ceil(self.total / self.per_page)),
            "sort": self.sort,
            "descending": self.descending,
        }


async def page_of(
    names: Sequence[str],
    rows: Callable[[Sequence[str]], Awaitable[list[QueueRow]]],
    *,
    text: str = "",
    sort: str = "name",
    descending: bool = False,
    page: int = 1,
    per_page: int = 50,
) -> QueuePage:
    """Page ``page`` (from 1) of the queues whose name contains ``text``.

    ``rows(names)`` builds the rows of the given queues (leaving out those
    gone meanwhile). Sorted by name, only the page's rows are built; sorted
    by a figure, every matching queue's row is.

    Raises ConfigError for an unknown sort key or a bad page size.
    """
    if sort not in SORT_KEYS:
        raise ConfigError(f"cannot sort by {sort!r}; one of {', '.join(SORT_KEYS)}")
    if not 1 <= per_page <= MAX_PER_PAGE:
        raise ConfigError(f"per_page must be 1..{MAX_PER_PAGE}, not {per_page}")
    needle = text.strip().lower()
    matching = [n for n in names if needle in n.lower()] if needle else list(names)
    total = len(matching)
    pages = max(1, math.ceil(total / per_page))
    page = min(max(page, 1), pages)
    start = (page - 1) * per_page
    if sort == "name":
        matching.sort(reverse=descending)
        built = await rows(matching[start : start + per_page])
    else:
        every = await rows(matching)
        present = [r for r in every if getattr(r, sort) is not None]
        absent = [r for r in every if getattr(r, sort) is None]
        present.sort(key=lambda r: (getattr(r, sort), r.name), reverse=descending)
        # Queues without the figure go last whichever way it is sorted.
        built = (present + sorted(absent, key=lambda r: r.name))[start : start + per_page]
    return QueuePage(
        rows=tuple(built), total=total, page=page, per_page=per_page, sort=sort,
        descending=descending,
    )  # fmt: skip


@dataclass(slots=True)
class RateHistory:
    """Per-second rates of cumulative counters over the last ``seconds``."""

    seconds: float = HISTORY_SECONDS
    _last: tuple[float, dict[str, int]] | None = None
    _points: deque[tuple[float, dict[str, float]]] = field(default_factory=deque)

    def sample(self, now: float, totals: Mapping[str, int]) -> None:
        """Take the counters' values at ``now`` (seconds, any monotonic origin)."""
        if self._last is not None:
            then, before = self._last
            dt = now - then
            if dt <= 0:
                return
            rates = {k: max(0, v - before.get(k, 0)) / dt for k, v in totals.items()}
            self._points.append((now, rates))
            while self._points and self._points[0][0] < now - self.seconds:
                self._points.popleft()
        self._last = (now, dict(totals))

    def series(self) -> dict[str, list[float]]:
        """``{"t": [...], name: [...]}``: the times and each counter's rate."""
        out: dict[str, list[float]] = {"t": [t for t, _ in self._points]}
        names = sorted({k for _, r in self._points for k in r})
        for k in names:
            out[k] = [r.get(k, 0.0) for _, r in self._points]
        return out

    def latest(self) -> dict[str, float]:
        """The most recent rates ({} before two samples)."""
        return dict(self._points[-1][1]) if self._points else {}


@dataclass(slots=True)
class QueueRates:
    """Each queue's in and out rates since it was last looked at."""

    _seen: dict[str, tuple[float, int, int, float | None, float | None]] = field(
        default_factory=dict
    )
    #: Looks closer together than this keep the previous rates (a page and
    #: a queue view polling at once would otherwise see a rate over 1 ms).
    min_interval: float = 0.5

    def rates(self, name: str, now: float, sent: int, taken: int) -> tuple[float | None, float | None]:
        """(in, out) per second for ``name`` given its cumulative counters;
        (None, None) the first time it is seen."""
        seen = self._seen.get(name)
        if seen is None:
            self._seen[name] = (now, sent, taken, None, None)
            return None, None
        then, s0, t0, r_in, r_out = seen
        if now - then < self.min_interval:
            return r_in, r_out
        dt = now - then
        r_in, r_out = max(0, sent - s0) / dt, max(0, taken - t0) / dt
        self._seen[name] = (now, sent, taken, r_in, r_out)
        return r_in, r_out

    def forget_except(self, names: Iterable[str]) -> None:
        """Drop queues not in ``names`` (deleted ones)."""
        keep = set(names)
        for n in [n for n in self._seen if n not in keep]:
            del self._seen[n]
