"""Worker processes of the scalability experiment: ``python -m cmq.lab.experiments._worker ROLE JSON``.

Roles (each prints ``TAG {json}`` lines on stdout, as the system adapters do):

``destinations``
    The sans-IO push-cost micro-benchmark (:func:`cmq.lab.runner.run_destinations`),
    one ``SAMPLE`` line per repeat, so a long million-destination run shows
    progress, and its memory is not the orchestrator's.
``rss-receiver``
    A :class:`cmq.Queue` that drains everything sent to it and prints its own
    resident set size every ``interval`` seconds (``SAMPLE``), from the first
    message to ``seconds`` later, the end marker, or an idle gap.
``rss-sender``
    Pushes ``size``-byte messages to the receiver as fast as ``push``
    returns for ``seconds``, then the end marker.
``poll-echo`` and ``poll-pingpong``
    Ping-pong written as the paper's applications were: ``push``, then poll
    the non-blocking ``pop`` (the paper's ``cwPop``) every
    :data:`POLL_INTERVAL`, never a blocking ``get`` (which flushes pending
    batches before it waits, and so hides what the batch timeout costs).
    Both endpoints take ``options`` (:class:`cmq.QueueConfig` fields).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Final

__all__ = ["main"]

_PAGE: Final = os.sysconf("SC_PAGE_SIZE")
_END: Final = b""
_POP_LIMIT: Final = 4096
#: Sleep between empty polls: short against any batch timeout of the sweep
#: (0.1 ms and up), and it lets the queue's I/O thread have the GIL.
POLL_INTERVAL: Final = 20e-6


def _emit(tag: str, value: Any) -> None:
    sys.stdout.write(f"{tag} {json.dumps(value)}\n")
    sys.stdout.flush()


def rss_bytes() -> int:
    """This process's resident set size now (not the peak), in bytes."""
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * _PAGE


def _destinations(params: dict[str, Any]) -> None:
    from cmq.lab.runner import run_destinations

    for k in range(int(params["repeat"])):
        for r in run_destinations(
            params["destinations"],
            per_destination=int(params["per_destination"]),
            size=int(params["size"]),
            repeat=1,
        ):
            _emit("SAMPLE", {"repeat": k, **r.to_json()})
    _emit("RESULT", {})


def _rss_receiver(params: dict[str, Any]) -> None:
    import cmq

    clock = time.monotonic_ns
    interval = int(float(params["interval"]) * 1e9)
    idle = int(float(params["idle"]) * 1e9)
    with cmq.Queue(port=0, host=params.get("bind", "127.0.0.1")) as q:
        host, port = q.address
        _emit("READY", {"host": host, "port": port})
        try:
            got = [q.get(timeout=float(params["startup"]))]
        except cmq.Timeout:
            _emit("RESULT", {"delivered": 0, "stopped": "startup"})
            return
        start = last = clock()
        stop_at = start + int(float(params["seconds"]) * 1e9)
        next_sample = start
        delivered = peak = 0
        stopped = "time"
        while True:
            now = clock()
            if got:
                last = now
                delivered += len(got) - got.count(_END)
                if got[-1] == _END:
                    stopped = "end"
                    break
            elif now - last > idle:
                stopped = "idle"
                break
            if now >= next_sample:
                # queued: messages received but not yet popped (the backlog
                # a stall of this process leaves; it sets the heap's high-water mark).
                queued = q.stats().queued
                peak = max(peak, queued)
                _emit("SAMPLE", {"t_ns": now, "rss_bytes": rss_bytes(), "delivered": delivered,
                                 "queued": queued})  # fmt: skip
                # Never fall behind by more than one sample (a stall is a gap, not a burst).
                next_sample = max(next_sample + interval, now)
            if now >= stop_at:
                break
            got = q.pop_many(_POP_LIMIT)
            if not got:
                try:
                    got = [q.get(timeout=max(0.0, min(next_sample - now, idle) / 1e9))]
                except cmq.Timeout:
                    got = []
        now = clock()
        _emit("SAMPLE", {"t_ns": now, "rss_bytes": rss_bytes(), "delivered": delivered,
                         "queued": q.stats().queued})  # fmt: skip
        _emit("RESULT", {"delivered": delivered, "stopped": stopped, "peak_queued": peak,
                         "stats": q.stats().as_dict()})  # fmt: skip


def _rss_sender(params: dict[str, Any]) -> None:
    import cmq

    peer = params["peer"]
    dest = (peer["host"], int(peer["port"]))
    payload = b"x" * int(params["size"])
    local = "127.0.0.1" if peer["host"] == "127.0.0.1" else "0.0.0.0"
    sent = refused = 0
    with cmq.Queue(port=0, host=local) as q:
        push = q.push
        end = time.monotonic() + float(params["seconds"])
        while time.monotonic() < end:
            # Check the clock every 1000 pushes: the clock costs as much as a push.
            for _ in range(1000):
                try:
                    push(dest, payload)
                    sent += 1
                except cmq.CmqError:
                    refused += 1
        q.flush()
        for _ in range(3):
            try:
                q.push(dest, _END)
                q.flush()
            except cmq.CmqError:
                break
        _emit("RESULT", {"sent": sent, "refused": refused})


def _poll_echo(params: dict[str, Any]) -> None:
    import cmq

    clock = time.monotonic_ns
    idle = int(float(params["idle"]) * 1e9)
    with cmq.Queue(port=0, host=params.get("bind", "127.0.0.1"), **params.get("options", {})) as q:
        host, port = q.address
        _emit("READY", {"host": host, "port": port})
        last = clock() + int(float(params["startup"]) * 1e9) - idle
        echoed = 0
        stopped = "idle"
        while True:
            m = q.pop_message()
            if m is None:
                if clock() - last > idle:
                    break
                time.sleep(POLL_INTERVAL)
                continue
            if not m.payload:
                stopped = "end"
                break
            q.push(m.sender, m.payload)
            echoed += 1
            last = clock()
        _emit("RESULT", {"echoed": echoed, "stopped": stopped})


def _poll_pingpong(params: dict[str, Any]) -> None:
    import cmq

    clock = time.monotonic_ns
    peer = params["peer"]
    dest = (peer["host"], int(peer["port"]))
    size = int(params["size"])
    timeout = int(float(params["timeout"]) * 1e9)
    local = "127.0.0.1" if peer["host"] == "127.0.0.1" else "0.0.0.0"
    send_ns: list[int] = []
    recv_ns: list[int] = []
    stale = 0
    with cmq.Queue(port=0, host=local, **params.get("options", {})) as q:
        for seq in range(int(params["count"])):
            # The sequence number leads the payload: a late reply to an
            # earlier round trip is never taken for this one's.
            tag = seq.to_bytes(4, "big")
            msg = tag + b"x" * max(0, size - 4)
            t0 = clock()
            q.push(dest, msg)
            got = -1
            while True:
                reply = q.pop()
                if reply is not None:
                    if reply[:4] == tag:
                        got = clock()
                        break
                    stale += 1
                    continue
                if clock() - t0 > timeout:
                    break
                time.sleep(POLL_INTERVAL)
            send_ns.append(t0)
            recv_ns.append(got)
        # The end marker must leave now, whatever the batching rules.
        for _ in range(3):
            q.push(dest, _END)
            q.flush()
        _emit("RESULT", {"send_ns": send_ns, "recv_ns": recv_ns, "stale": stale})


_ROLES: Final = {
    "destinations": _destinations,
    "rss-receiver": _rss_receiver,
    "rss-sender": _rss_sender,
    "poll-echo": _poll_echo,
    "poll-pingpong": _poll_pingpong,
}


def main(argv: list[str]) -> int:
    """Run one role; 2 on bad usage."""
    if len(argv) != 2 or argv[0] not in _ROLES:
        print(
            f"usage: python -m cmq.lab.experiments._worker {{{','.join(_ROLES)}}} JSON",
            file=sys.stderr,
        )
        return 2
    _ROLES[argv[0]](json.loads(argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
