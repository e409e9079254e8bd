"""Call timing for the diagnostic scripts: wrap a method, count its calls and time."""

from __future__ import annotations

import time
from typing import Any


def time_calls(acc: dict[str, list[int]], tag: str, obj: Any, name: str) -> None:
    """Replace ``obj.name`` with a wrapper that adds one call and its
    nanoseconds to ``acc[tag]`` (a ``[calls, ns]`` pair: give ``acc`` as a
    ``defaultdict(lambda: [0, 0])``)."""
    f = getattr(obj, name)

    def timed(*a: Any, **k: Any) -> Any:
        t = time.perf_counter_ns()
        try:
            return f(*a, **k)
        finally:
            e = acc[tag]
            e[0] += 1
            e[1] += time.perf_counter_ns() - t

    setattr(obj, name, timed)
