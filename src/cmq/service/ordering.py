"""Which messages a receive hands out: the BDQS consistency hint and FIFO.

Pure functions, shared by the memory and SQLite stores; the Redis Cluster
store does the same in Lua (``store/redis_cluster.py``), and the behavioural
suite holds all three to it.

Standard queues (BDQS): each of the up to ``n`` messages of one receive is
picked at random among the first ``k`` messages of the queue's sequence
index that this receive has not picked yet. ``k = 1`` is best-effort in
order; ``k`` at least the queue's depth is a no-order queue.

What "the first ``k``" counts depends on the receive mode. A lock-free
receive (the BDQS paper's design) reads the first ``k`` *visible* messages
(:func:`standard_picks`): racing receivers read the same ones and may take
the same message. An atomic receive counts the messages in flight too
(:func:`window_picks`): it picks among the visible ones of the first ``k``
messages that are visible or in flight. Counting only visible ones, T
concurrent atomic receives reached ``k + T - 1`` deep (each one's window
slid past the others' picks, which are in flight), which put the atomic
mode's order below the lock-free mode's at the same ``k``; counted, they
stay within the first ``k``. When all of those ``k`` are in flight (more
receivers than ``k``), the receive takes the first visible message after
them, as ``k = 1`` would, rather than nothing: a receiver is never kept
waiting behind the others' picks, and ``k = 1`` behaves as before.
Delayed messages (never received, not yet visible) are not counted.

FIFO queues: messages of one group go out strictly in sequence. A message
may go out only when every earlier message of its group is visible and goes
out in the same receive; so a group with a message in flight (or delayed) is
blocked, and a receive takes messages from the head of each open group.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

__all__ = ["fifo_picks", "standard_picks", "window_picks"]


def standard_picks(visible: Sequence[int], k: int, n: int, rand: Sequence[float]) -> list[int]:
    """Pick up to ``n`` of the ``visible`` sequence numbers (ascending).

    ``visible`` must hold at least the first ``k + n - 1`` visible messages
    (fewer only if the queue has fewer); ``rand`` supplies ``n`` numbers in
    [0, 1). Returns the picked sequence numbers in pick order.
    """
    return window_picks([(seq, True) for seq in visible[: k + n - 1]], k, n, rand)


def window_picks(rows: Sequence[tuple[int, bool]], k: int, n: int,
                 rand: Sequence[float]) -> list[int]:  # fmt: skip
    """Pick up to ``n`` messages of an atomic receive, in-flight ones counted.

    ``rows`` are ``(seq, visible)`` in ascending ``seq`` order: at least the
    first ``k + n - 1`` messages that are visible or in flight (fewer only if
    the queue has fewer), then, when those hold fewer than ``n`` visible
    ones, at least as many further visible messages as are missing. Each
    pick is made at random (``rand[i]`` in [0, 1)) among the visible rows of
    the first ``k`` rows not picked yet; when none of them is visible, it is
    the first visible row after them. Returns the picked sequence numbers in
    pick order. With every row visible this is :func:`standard_picks`.
    """
    window = list(rows)
    picks: list[int] = []
    for i in range(n):
        open_ = [j for j in range(min(k, len(window))) if window[j][1]]
        if open_:
            j = open_[int(rand[i] * len(open_)) % len(open_)]
        else:
            later = next((j for j in range(k, len(window)) if window[j][1]), None)
            if later is None:
                break
            j = later
        picks.append(window.pop(j)[0])
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
