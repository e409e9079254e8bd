"""Which messages a receive hands out: the BDQS consistency hint and FIFO.

Pure functions, shared by the memory and SQLite stores; the Redis Cluster
store does the same in Lua (``store/redis_cluster.py``), and the behavioural
suite holds all three to it.

Standard queues (BDQS): each of the up to ``n`` messages of one receive is
picked at random among the first ``k`` visible messages of the queue's
sequence index that this receive has not picked yet. ``k = 1`` is
best-effort in order; ``k`` at least the queue's depth is a no-order queue.

FIFO queues: messages of one group go out strictly in sequence. A message
may go out only when every earlier message of its group is visible and goes
out in the same receive; so a group with a message in flight (or delayed) is
blocked, and a receive takes messages from the head of each open group.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

__all__ = ["fifo_picks", "standard_picks"]


def standard_picks(visible: Sequence[int], k: int, n: int, rand: Sequence[float]) -> list[int]:
    """Pick up to ``n`` of the ``visible`` sequence numbers (ascending).

    ``visible`` must hold at least the first ``k + n - 1`` visible messages
    (fewer only if the queue has fewer); ``rand`` supplies ``n`` numbers in
    [0, 1). Returns the picked sequence numbers in pick order.
    """
    window = list(visible[: k + n - 1])
    picks: list[int] = []
    for i in range(min(n, len(window))):
        span = min(k, len(window))
        picks.append(window.pop(int(rand[i] * span) % span))
    return picks


def fifo_picks(rows: Iterable[tuple[int, str | None, bool]], n: int) -> list[int]:
    """Pick up to ``n`` messages of a FIFO queue.

    ``rows`` are ``(seq, group_id, visible)`` in ascending ``seq`` order,
    covering every message of the queue (an invisible one blocks its group).
    """
    blocked: set[str | None] = set()
    picks: list[int] = []
    for seq, group, visible in rows:
        if len(picks) >= n:
            break
        if group in blocked:
            continue
        if visible:
            picks.append(seq)
        else:
            blocked.add(group)
    return picks
