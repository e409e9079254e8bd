"""The table of requests waiting for replies, without sockets or clocks.

Each attempt of a request has a correlation id and a deadline. The driver
adds attempts, resolves them when a reply arrives, and asks which expired;
what an attempt *is* (a future, a callback) is the driver's business.
"""

from __future__ import annotations

import heapq
import itertools
import secrets
from typing import Generic, TypeVar

__all__ = ["PendingTable"]

T = TypeVar("T")


class PendingTable(Generic[T]):
    """Attempts by correlation id, with a deadline heap."""

    def __init__(self) -> None:
        self._by_corr: dict[int, T] = {}
        self._heap: list[tuple[float, int]] = []
        # Random start, so a restarted endpoint does not take a late reply
        # meant for its previous life as an answer to a new request.
        self._ids = itertools.count(secrets.randbits(48))

    def new_id(self) -> int:
        """A fresh correlation id (64-bit)."""
        return next(self._ids) & 0xFFFF_FFFF_FFFF_FFFF

    def add(self, corr: int, attempt: T, deadline: float) -> None:
        """Track ``attempt`` under ``corr`` until ``deadline``."""
        self._by_corr[corr] = attempt
        heapq.heappush(self._heap, (deadline, corr))

    def resolve(self, corr: int) -> T | None:
        """Remove and return the attempt for ``corr``; None if unknown or expired."""
        return self._by_corr.pop(corr, None)

    def expired(self, now: float) -> list[T]:
        """Remove and return every attempt whose deadline is at or before ``now``."""
        heap = self._heap
        out: list[T] = []
        while heap and heap[0][0] <= now:
            _, corr = heapq.heappop(heap)
            attempt = self._by_corr.pop(corr, None)
            if attempt is not None:
                out.append(attempt)
        return out

    def next_deadline(self) -> float | None:
        """Earliest deadline in the heap (possibly of a resolved attempt), or None."""
        # Drop resolved attempts' entries from the top so the driver does not
        # wake for them.
        heap = self._heap
        while heap and heap[0][1] not in self._by_corr:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def drain(self) -> list[T]:
        """Remove and return every attempt (on close)."""
        out = list(self._by_corr.values())
        self._by_corr.clear()
        self._heap.clear()
        return out

    def __len__(self) -> int:
        return len(self._by_corr)
