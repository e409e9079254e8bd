"""The throughput part's two programs: ``python .../_peer.py ROLE JSON``, one per namespace.

Run by path, not with ``-m``: that imports only ``cmq`` and the standard
library, not this experiment's package (the report and Parquet modules),
so a run's two processes start in a tenth of a second.

Both print ``TAG {json}`` lines on stdout, as the lab's other workers do:
``READY {"host", "port"}`` once the receiver listens, ``RESULT {...}`` at
the end. Every role stops by itself (end marker, idle gap or deadline):
it never hangs.

``receiver``
    Takes messages until the sender's end marker and then a short quiet
    ``linger``, or an ``idle`` gap, or the deadline. Every delivery,
    duplicates included, is reported as ``(seq, send_ns, recv_ns)``:
    ``recv_ns`` is this process's clock read once per batch that
    ``pop_many`` returns, each later message of the batch one nanosecond
    later, so stamps are strictly increasing in delivery order and the
    pipeline can read order violations from them.
``sender``
    Pushes ``count`` messages of ``size`` bytes as fast as ``push`` returns,
    each carrying its sequence number and a send stamp (the clock read once
    per ``chunk`` messages, whose stamps the result lists so that lost
    messages get one too); then, when the queue has delivery modes and the
    mode is not best-effort, ``drain`` (every message acknowledged) before
    the end marker, so the end marker never overtakes a repair.
"""

from __future__ import annotations

import json
import os
import struct
import sys
import time
from collections.abc import Callable
from typing import Any, Final

__all__ = ["HEAD", "main", "receiver", "sender"]

#: A payload starts with its sequence number and its send stamp.
HEAD: Final = struct.Struct("<Qq")
#: Messages taken per pop_many: bounds the list, not the rate.
_POP_LIMIT: Final = 4096
#: How long a push that would block is retried before it counts as failed.
_BLOCKED_LIMIT_NS: Final = 5_000_000_000


def _emit(tag: str, value: Any) -> None:
    sys.stdout.write(f"{tag} {json.dumps(value, default=str)}\n")
    sys.stdout.flush()


def _stats(q: Any) -> dict[str, Any]:
    stats: dict[str, Any] = q.stats().as_dict()
    return stats


def receiver(
    *,
    bind: str,
    options: dict[str, Any],
    startup: float,
    idle: float,
    linger: float,
    deadline: float,
) -> dict[str, Any]:
    """Take messages until the end marker and ``linger`` quiet seconds, an
    ``idle`` gap, or ``deadline`` seconds; every delivery's stamps."""
    import cmq

    clock = time.monotonic_ns
    unpack = HEAD.unpack_from
    seqs: list[int] = []
    sends: list[int] = []
    recvs: list[int] = []
    # Any: the delivery options and drain() are newer than some cmq this may run.
    queue: Any = cmq.Queue
    with queue(port=0, host=bind, **options) as q:
        host, port = q.address
        _emit("READY", {"host": host, "port": port})
        stop_at = clock() + int(deadline * 1e9)
        pop_many, get = q.pop_many, q.get
        last = 0
        ended = False
        wait = startup
        stopped = "startup"
        while True:
            got = pop_many(_POP_LIMIT)
            if not got:
                try:
                    got = [get(timeout=wait)]
                except cmq.Timeout:
                    stopped = "end" if ended else ("idle" if seqs else "startup")
                    break
            now = clock()
            if now <= last:
                now = last + 1
            for m in got:
                if len(m) < HEAD.size:
                    ended = True
                    continue
                seq, sent = unpack(m)
                seqs.append(seq)
                sends.append(sent)
                recvs.append(now)
                now += 1
            last = now - 1
            wait = linger if ended else idle
            if last > stop_at:
                stopped = "deadline"
                break
        stats = _stats(q)
    return {"seq": seqs, "send_ns": sends, "recv_ns": recvs, "stopped": stopped, "stats": stats}


def sender(
    *,
    peer: dict[str, Any],
    size: int,
    count: int,
    options: dict[str, Any],
    chunk: int,
    drain: float,
) -> dict[str, Any]:
    """Push ``count`` numbered, stamped messages; drain (reliable modes); end."""
    import cmq
    from cmq.lab.systems.cmq import push_end

    if size < HEAD.size:
        raise ValueError(f"size must be at least {HEAD.size} bytes (sequence number and stamp)")
    clock = time.monotonic_ns
    pack = HEAD.pack
    pad = b"x" * (size - HEAD.size)
    dest = (peer["host"], int(peer["port"]))
    stamps: list[int] = []
    failed: list[int] = []
    blocked = 0
    queue: Any = cmq.Queue
    with queue(port=0, host="0.0.0.0", **options) as q:
        send = q.sender(dest)
        start = clock()
        for base in range(0, count, chunk):
            t = clock()
            stamps.append(t)
            for seq in range(base, min(base + chunk, count)):
                msg = pack(seq, t) + pad
                try:
                    send(msg)
                except cmq.WouldBlock:
                    # A flow-controlled queue: wait for room, as an application would.
                    give_up = clock() + _BLOCKED_LIMIT_NS
                    while True:
                        blocked += 1
                        time.sleep(0.0001)
                        try:
                            send(msg)
                            break
                        except cmq.WouldBlock:
                            if clock() > give_up:
                                failed.append(seq)
                                break
                except cmq.CmqError:
                    failed.append(seq)
        q.flush()
        pushed = clock()
        drained: bool | None = None
        can_drain = options.get("delivery", "best-effort") != "best-effort" and hasattr(q, "drain")
        if can_drain:
            drained = bool(q.drain(drain))
        done = clock()
        push_end(q, dest)
        if can_drain:
            q.drain(min(drain, 1.0))
        stats = _stats(q)
    return {
        "sent": count - len(failed),
        "failed": failed,
        "blocked": blocked,
        "chunk": chunk,
        "stamps": stamps,
        "start_ns": start,
        "pushed_ns": pushed,
        "drained": drained,
        "done_ns": done,
        "stats": stats,
    }


_ROLES: Final[dict[str, Callable[..., dict[str, Any]]]] = {"receiver": receiver, "sender": sender}


def main(argv: list[str]) -> int:
    """Run one role: ``ROLE JSON_PARAMS`` (``cpu`` in the params pins the
    process to that CPU first); 2 on bad usage."""
    if len(argv) != 2 or argv[0] not in _ROLES:
        print(f"usage: _peer.py {{{','.join(_ROLES)}}} JSON_PARAMS", file=sys.stderr)
        return 2
    params = json.loads(argv[1])
    cpu = params.pop("cpu", None)
    if cpu is not None:
        os.sched_setaffinity(0, {int(cpu)})
    result: dict[str, Any] = _ROLES[argv[0]](**params)
    _emit("RESULT", result)
    return 0


if __name__ == "__main__":
    # Run by path, this folder is sys.path[0]: drop it, so that its modules
    # never shadow a top-level one.
    del sys.path[0]
    sys.exit(main(sys.argv[1:]))
