"""Worker processes of the lab's own experiments: ``python -m cmq.lab.experiments._worker ROLE JSON``.

Roles (each prints ``TAG {json}`` lines on stdout, as the system adapters do):

``destinations``
    The sans-IO push-cost micro-benchmark (:func:`cmq.lab.runner.run_destinations`),
    one ``SAMPLE`` line per repeat, so a long million-destination run shows
    progress, and its memory is not the orchestrator's.
``poll-echo`` and ``poll-pingpong``
    Ping-pong written as the paper's applications were: ``push``, then poll
    the non-blocking ``pop`` (the paper's ``cwPop``) every
    :data:`POLL_INTERVAL`, never a blocking ``get`` (which flushes pending
    batches before it waits, and so hides what the batch timeout costs).
    Both endpoints take ``options`` (:class:`cmq.QueueConfig` fields).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any, Final

__all__ = ["main"]

_END: Final = b""
#: Sleep between empty polls: short against any batch timeout of the sweep
#: (0.1 ms and up), and it lets the queue's I/O thread have the GIL.
POLL_INTERVAL: Final = 20e-6


def _emit(tag: str, value: Any) -> None:
    sys.stdout.write(f"{tag} {json.dumps(value)}\n")
    sys.stdout.flush()


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


def _options(params: dict[str, Any]) -> dict[str, Any]:
    """QueueConfig options of a run: the papers' best-effort delivery unless it says otherwise."""
    from cmq.lab.systems.cmq import PAPER_DELIVERY

    return {"delivery": PAPER_DELIVERY, **params.get("options", {})}


def _poll_echo(params: dict[str, Any]) -> None:
    import cmq

    clock = time.monotonic_ns
    idle = int(float(params["idle"]) * 1e9)
    with cmq.Queue(port=0, host=params.get("bind", "127.0.0.1"), **_options(params)) as q:
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
    with cmq.Queue(port=0, host=local, **_options(params)) as q:
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
