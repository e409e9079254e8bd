"""Worker processes of the AMQP suite: ``python -m cmq.lab.experiments.amqp._worker``.

A worker reads one JSON command per line on stdin and answers with ``TAG
{json}`` lines on stdout, then waits for the next command (so one pool of
processes serves every run of an experiment: starting Python with pika and
cmq costs about a second on a loaded 2-core machine). Commands::

    {"role": ROLE, "system": "cmq" | "rabbitmq", "address": ..., ...params}

Roles:

``consume``
    Attach to ``queue``, print ``READY``, then take ``count`` bodies (or
    stop after ``idle`` seconds without one), stamping each with
    ``time.monotonic_ns()``; write the stamps and sequence numbers to
    ``out``; print ``RESULT {"received": n}``.
``publish``
    Connect, print ``READY``, wait for a ``GO`` line, publish ``count``
    bodies of ``size`` bytes to ``exchange``/``key`` stamping each before
    its publish, a flow-control point every ``sync_every``; write the stamps
    to ``out``; print ``RESULT``.
``echo``
    Attach to ``queue``, print ``READY``, publish every body taken to
    ``exchange``/``key`` at once, until ``count`` or ``idle``.
``ping``
    Attach to ``queue`` (the pongs), print ``READY``, wait for ``GO``; then
    ``count`` times: publish one body to ``exchange``/``key`` and wait for
    its pong (or ``timeout``). Writes send and reply stamps to ``out``.

A body carries its sequence number in its first 4 bytes (big-endian) when
it is at least 4 bytes long; a shorter body carries none, and the consumer
numbers bodies in arrival order (both brokers keep one publisher's order on
one queue). Stamps are ``CLOCK_MONOTONIC``, which every process of the
machine shares, so a consumer's stamp minus a publisher's is a one-way
latency.
"""

from __future__ import annotations

import json
import sys
import time
from array import array
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from cmq.lab.experiments.amqp.transport import Transport

__all__ = ["body", "main", "read_stamps", "seq_of", "write_stamps"]

_SEQ_BYTES: Final = 4
_FILL: Final = b"x"


def body(seq: int, size: int) -> bytes:
    """A ``size``-byte body carrying ``seq`` where it fits (module docstring)."""
    if size >= _SEQ_BYTES:
        return (seq & 0xFFFF_FFFF).to_bytes(_SEQ_BYTES, "big") + _FILL * (size - _SEQ_BYTES)
    return _FILL * size


def seq_of(data: bytes, arrival: int) -> int:
    """The sequence number of a body: from its bytes, or its arrival index."""
    if len(data) >= _SEQ_BYTES:
        return int.from_bytes(data[:_SEQ_BYTES], "big")
    return arrival


def write_stamps(path: str | Path, *columns: array[int]) -> None:
    """Write int64 columns of equal length to ``path`` (count, then each column)."""
    with open(path, "wb") as f:
        n = len(columns[0]) if columns else 0
        array("q", [n, len(columns)]).tofile(f)
        for c in columns:
            c.tofile(f)


def read_stamps(path: str | Path) -> list[array[int]]:
    """The columns written by :func:`write_stamps`."""
    with open(path, "rb") as f:
        head = array("q")
        head.fromfile(f, 2)
        n, k = head
        out = []
        for _ in range(k):
            c = array("q")
            c.fromfile(f, n)
            out.append(c)
    return out


def _emit(tag: str, value: Any = None) -> None:
    sys.stdout.write(f"{tag} {json.dumps(value if value is not None else {})}\n")
    sys.stdout.flush()


def _wait_go() -> None:
    line = sys.stdin.readline()
    if line.strip() != "GO":
        raise SystemExit(f"expected GO, got {line!r}")


def _consume(t: Transport, p: dict[str, Any]) -> dict[str, Any]:
    count, clock = int(p["count"]), time.monotonic_ns
    recv, seqs = array("q"), array("q")
    stream = t.consume(p["queue"], prefetch=int(p["prefetch"]), idle=float(p["idle"]))
    _emit("READY")
    n = 0
    started = False
    for b in stream:
        if b is None:
            if started or n >= count:
                break
            continue  # before the first message the publisher may still be starting
        recv.append(clock())
        seqs.append(seq_of(b, n))
        n += 1
        started = True
        if n >= count:
            break
    stream.close()
    write_stamps(p["out"], seqs, recv)
    return {"received": n}


def _publish(t: Transport, p: dict[str, Any]) -> dict[str, Any]:
    count, size, every = int(p["count"]), int(p["size"]), int(p["sync_every"])
    exchange, key, clock = p["exchange"], p["key"], time.monotonic_ns
    sent = array("q", bytes(8 * count))
    publish = t.publish
    _emit("READY")
    _wait_go()
    for i in range(count):
        b = body(i, size)
        sent[i] = clock()
        publish(exchange, key, b, sync=(i % every == every - 1) or i == count - 1)
    write_stamps(p["out"], sent)
    return {"sent": count}


def _echo(t: Transport, p: dict[str, Any]) -> dict[str, Any]:
    count, exchange, key = int(p["count"]), p["exchange"], p["key"]
    stream = t.consume(p["queue"], prefetch=int(p["prefetch"]), idle=float(p["idle"]))
    _emit("READY")
    n = 0
    started = False
    for b in stream:
        if b is None:
            if started:
                break
            continue
        started = True
        t.publish(exchange, key, b)
        t.flush()
        n += 1
        if n >= count:
            break
    stream.close()
    return {"echoed": n}


def _ping(t: Transport, p: dict[str, Any]) -> dict[str, Any]:
    count, size, exchange, key = int(p["count"]), int(p["size"]), p["exchange"], p["key"]
    clock = time.monotonic_ns
    sent, back = array("q", bytes(8 * count)), array("q", [-1] * count)
    stream = t.consume(p["queue"], prefetch=int(p["prefetch"]), idle=float(p["timeout"]))
    _emit("READY")
    _wait_go()
    lost = 0
    for i in range(count):
        sent[i] = clock()
        t.publish(exchange, key, body(i, size))
        t.flush()
        while True:
            b = next(stream)
            if b is None:
                lost += 1
                break
            # A late pong of an earlier ping is not this one's reply.
            if seq_of(b, i) == i:
                back[i] = clock()
                break
    stream.close()
    write_stamps(p["out"], sent, back)
    return {"lost": lost}


_ROLES: Final = {"consume": _consume, "publish": _publish, "echo": _echo, "ping": _ping}


def main() -> int:
    """Serve commands from stdin until it closes."""
    from cmq.lab.experiments.amqp.transport import open_transport

    for line in sys.stdin:
        if not line.strip():
            continue
        p = json.loads(line)
        try:
            t = open_transport(p["system"], p["address"])
            try:
                result = _ROLES[p["role"]](t, p)
            finally:
                t.close()
        except Exception as exc:  # noqa: BLE001 - reported to the parent, which records the failure
            _emit("ERROR", {"error": f"{type(exc).__name__}: {exc}"})
            continue
        _emit("RESULT", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
