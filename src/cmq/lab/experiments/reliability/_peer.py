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

__all__ = [
    "HEAD",
    "RECORD",
    "flood",
    "incarnation",
    "main",
    "receiver",
    "restart_sender",
    "sender",
    "slow_receiver",
]

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


# -- the slow receiver and the restarted receiver (loopback) ----------------------

#: A delivery in an incarnation's log: seq, send stamp, take stamp.
RECORD: Final = struct.Struct("<Qqq")
#: How often the paced receiver takes its share (its pace is per second).
_PACE_TICK: Final = 0.01
#: At most this many seconds of its pace a paced receiver may owe itself
#: (after a stall, it does not catch up in one burst).
_PACE_DEBT: Final = 0.05


def _rss() -> int:
    """This process's resident set (bytes), from /proc; 0 where there is none."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class _Sampler:
    """``read()`` every ``interval`` seconds on a thread, stamped: ``rows`` of
    ``[t_ns, *values]``, one at start and one at stop."""

    def __init__(self, interval: float, read: Callable[[], list[Any]]) -> None:
        import threading

        self.rows: list[list[Any]] = []
        self._read, self._interval = read, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        self.rows.append([time.monotonic_ns(), *self._read()])

    def _run(self) -> None:
        self._sample()
        while not self._stop.wait(self._interval):
            self._sample()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self._thread.is_alive():
            self._stop.set()
            self._thread.join()
            self._sample()


class _Taker:
    """What a receiver took, logged: one :data:`RECORD` (seq, send stamp,
    take stamp) per message, a batch's in one write(2) to the ``log`` file
    descriptor before the next pop (so a SIGKILL loses none it took, and the
    receiver's memory does not grow with what it took). Take stamps are
    strictly increasing, as in :func:`receiver`. The send stamps of the
    first ``keep`` messages are kept (a calibration)."""

    def __init__(self, log: int, keep: int = 0) -> None:
        self.log = log
        self.count = 0
        self.sends: list[int] = []
        self.ended = False
        self._keep = keep
        self._last = 0

    def take(self, got: list[Any]) -> None:
        """Log a batch just popped."""
        now = time.monotonic_ns()
        if now <= self._last:
            now = self._last + 1
        out = []
        pack, unpack = RECORD.pack, HEAD.unpack_from
        for m in got:
            if len(m) < HEAD.size:
                self.ended = True
                continue
            seq, sent = unpack(m)
            out.append(pack(seq, sent, now))
            if len(self.sends) < self._keep:
                self.sends.append(sent)
            now += 1
        self._last = now - 1
        if out:
            os.write(self.log, b"".join(out))
            self.count += len(out)


def _flat_out(q: Any, taker: _Taker, *, idle: float, linger: float, stop_at: int) -> str:
    """Take everything as it comes until the end marker and ``linger`` quiet
    seconds, an ``idle`` gap, or ``stop_at`` (monotonic ns); why it stopped."""
    import cmq

    pop_many, get = q.pop_many, q.get
    wait = linger if taker.ended else idle
    while True:
        got = pop_many(_POP_LIMIT)
        if not got:
            try:
                got = [get(timeout=wait)]
            except cmq.Timeout:
                return "end" if taker.ended else ("idle" if taker.count else "startup")
        taker.take(got)
        wait = linger if taker.ended else idle
        if time.monotonic_ns() > stop_at:
            return "deadline"


def _open_log(path: str) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)


def slow_receiver(
    *,
    bind: str,
    options: dict[str, Any],
    calib: int,
    share: float,
    seconds: float,
    interval: float,
    log: str,
    startup: float,
    idle: float,
    linger: float,
    deadline: float,
) -> dict[str, Any]:
    """Take the first ``calib`` messages as they come (the sender's unthrottled
    rate, from their send stamps), then ``share`` of that rate, paced, until
    ``seconds`` after the first message's send stamp; then everything as it
    comes until the end marker; every take logged in ``log``. Samples taken,
    kernel drops, held bytes and RSS every ``interval`` seconds."""
    import cmq

    clock = time.monotonic_ns
    taker = _Taker(_open_log(log), keep=calib)
    queue: Any = cmq.Queue
    with queue(port=0, host=bind, **options) as q:
        host, port = q.address
        _emit("READY", {"host": host, "port": port})
        stop_at = clock() + int(deadline * 1e9)

        def read() -> list[Any]:
            st = q.stats()
            return [taker.count, st.kernel_drops, st.held_bytes, _rss()]

        sampler = _Sampler(interval, read)
        result: dict[str, Any] = {"calib_rate": None, "pace_rate": None,
                                  "pace_from_ns": None, "pace_until_ns": None}  # fmt: skip
        try:
            first = q.get(timeout=startup)
        except cmq.Timeout:
            stopped = "startup"
        else:
            sampler.start()
            taker.take([first])
            stopped = ""
            while taker.count < calib and not taker.ended:
                got = q.pop_many(calib - taker.count) or [q.get(timeout=idle)]
                taker.take(got)
            sends = taker.sends
            # Over the second half of them (past the sender's start-up); send
            # stamps are per chunk: messages from one chunk's stamp to another's.
            i0 = sends.index(sends[len(sends) // 2])
            i1 = sends.index(sends[-1])
            span = (sends[i1] - sends[i0]) / 1e9
            if i1 > i0 and span > 0:
                rate = (i1 - i0) / span
                pace = share * rate
                pace_from = clock()
                pace_until = sends[0] + int(seconds * 1e9)
                result.update(calib_rate=rate, pace_rate=pace, pace_from_ns=pace_from,
                              pace_until_ns=pace_until)  # fmt: skip
                owed, last = 0.0, pace_from
                while (now := clock()) < pace_until and not taker.ended:
                    owed = min(owed + pace * (now - last) / 1e9, pace * _PACE_DEBT + 1)
                    last = now
                    if owed >= 1:
                        got = q.pop_many(int(owed))
                        taker.take(got)
                        owed -= len(got)
                    time.sleep(_PACE_TICK)
            stopped = _flat_out(q, taker, idle=idle, linger=linger, stop_at=stop_at)
        sampler.stop()
        os.close(taker.log)
        stats = _stats(q)
    columns: list[Any] = list(zip(*sampler.rows, strict=True)) if sampler.rows else [()] * 5
    return {
        "taken": taker.count, "stopped": stopped, "stats": stats,
        "origin_ns": taker.sends[0] if taker.sends else None,
        "samples": {"t_ns": columns[0], "taken": columns[1], "kernel_drops": columns[2],
                    "held_bytes": columns[3], "rss": columns[4]},
        **result,
    }  # fmt: skip


def _push_until(
    q: Any, dest: Any, *, size: int, chunk: int, state: list[int], until: Callable[[int], bool]
) -> tuple[list[int], list[int]]:
    """Push numbered, stamped messages (one clock read per ``chunk``) until
    ``until(now_ns)``; ``state[0]`` is how many were pushed. Returns the
    chunks' stamps and the seqs whose push failed (blocked past push_timeout)."""
    import cmq

    clock = time.monotonic_ns
    pack = HEAD.pack
    pad = b"x" * (size - HEAD.size)
    send = q.sender(dest)
    stamps: list[int] = []
    failed: list[int] = []
    seq = 0
    while not until(t := clock()):
        stamps.append(t)
        for s in range(seq, seq + chunk):
            try:
                send(pack(s, t) + pad)
            except cmq.CmqError:
                failed.append(s)
        seq += chunk
        state[0] = seq
    return stamps, failed


def _finish(q: Any, dest: Any, drain: float) -> bool:
    """Flush, wait until everything is acknowledged, then the end marker."""
    from cmq.lab.systems.cmq import push_end

    q.flush()
    drained = bool(q.drain(drain))
    push_end(q, dest)
    q.drain(min(drain, 1.0))
    return drained


def flood(
    *,
    peer: dict[str, Any],
    size: int,
    seconds: float,
    options: dict[str, Any],
    chunk: int,
    drain: float,
    interval: float,
) -> dict[str, Any]:
    """Push as fast as ``push`` returns for ``seconds``; samples pushed,
    send_buffered, unacked and RSS every ``interval`` seconds."""
    import cmq

    if size < HEAD.size:
        raise ValueError(f"size must be at least {HEAD.size} bytes (sequence number and stamp)")
    dest = (peer["host"], int(peer["port"]))
    state = [0]
    queue: Any = cmq.Queue
    with queue(port=0, host="127.0.0.1", **options) as q:

        def read() -> list[Any]:
            st = q.stats()
            return [state[0], st.send_buffered, st.unacked, _rss()]

        sampler = _Sampler(interval, read)
        sampler.start()
        stop = time.monotonic_ns() + int(seconds * 1e9)
        stamps, failed = _push_until(q, dest, size=size, chunk=chunk, state=state,
                                     until=lambda now: now >= stop)  # fmt: skip
        pushed = time.monotonic_ns()
        drained = _finish(q, dest, drain)
        sampler.stop()
        stats = _stats(q)
    columns = list(zip(*sampler.rows, strict=True))
    return {
        "sent": state[0] - len(failed), "count": state[0], "failed": failed, "chunk": chunk,
        "stamps": stamps, "pushed_ns": pushed, "drained": drained, "stats": stats,
        "samples": {"t_ns": columns[0], "pushed": columns[1], "send_buffered": columns[2],
                    "unacked": columns[3], "rss": columns[4]},
    }  # fmt: skip


def incarnation(
    *,
    bind: str,
    port: int,
    options: dict[str, Any],
    log: str,
    go: bool,
    idle: float,
    linger: float,
    deadline: float,
) -> dict[str, Any]:
    """A receiver whose every take is logged (:data:`RECORD`s in ``log``, one
    write(2) per batch, so a SIGKILL loses none it took). With ``go`` it
    binds only once a line arrives on stdin (a restart on a port another
    incarnation held: started early, so that the restart is a bind, not an
    interpreter's start-up). ``READY`` says when it began to open its
    endpoint (``ready_ns``: it listens from then on, at the latest by
    ``opened_ns``)."""
    import cmq

    if go:
        sys.stdin.readline()
    queue: Any = cmq.Queue
    # Stamped before the endpoint opens: its reader may answer a probe
    # before the constructor returns, so "listening" is at or after this.
    ready = time.monotonic_ns()
    with queue(port=port, host=bind, **options) as q:
        opened = time.monotonic_ns()
        host, bound = q.address
        _emit("READY", {"host": host, "port": bound, "ready_ns": ready, "opened_ns": opened})
        taker = _Taker(_open_log(log))
        try:
            stopped = _flat_out(q, taker, idle=idle, linger=linger,
                                stop_at=ready + int(deadline * 1e9))  # fmt: skip
        finally:
            os.close(taker.log)
        stats = _stats(q)
    return {"stopped": stopped, "ready_ns": ready, "stats": stats}


def restart_sender(
    *,
    peer: dict[str, Any],
    size: int,
    options: dict[str, Any],
    chunk: int,
    after: float,
    seconds: float,
    drain: float,
    interval: float,
) -> dict[str, Any]:
    """Push as fast as ``push`` returns until ``after`` seconds past the first
    delivery failure reported (at most ``seconds``); every failure with the
    time it was reported, the base PTO then, and the seqs it names. Samples
    pushed, unacked and the PTO every ``interval`` seconds."""
    import cmq

    clock = time.monotonic_ns
    dest = (peer["host"], int(peer["port"]))
    failures: list[dict[str, Any]] = []
    holder: list[Any] = []

    def on_failure(f: Any) -> None:
        at = clock()
        pto = holder[0].stats().pto if holder else None
        seqs = [HEAD.unpack_from(m)[0] for m in f.messages
                if isinstance(m, bytes) and len(m) >= HEAD.size]  # fmt: skip
        failures.append({"t_ns": at, "reason": f.reason, "pto": pto, "seq": seqs})

    state = [0]
    queue: Any = cmq.Queue
    with queue(port=0, host="127.0.0.1", on_failure=on_failure, **options) as q:
        holder.append(q)

        def read() -> list[Any]:
            st = q.stats()
            return [state[0], st.unacked, st.pto, st.epoch_resets]

        sampler = _Sampler(interval, read)
        sampler.start()
        stop = clock() + int(seconds * 1e9)
        wait = int(after * 1e9)

        def until(now: int) -> bool:
            return now >= stop or bool(failures and now >= failures[0]["t_ns"] + wait)

        stamps, failed = _push_until(q, dest, size=size, chunk=chunk, state=state, until=until)
        drained = _finish(q, dest, drain)
        sampler.stop()
        stats = _stats(q)
    columns = list(zip(*sampler.rows, strict=True))
    return {
        "sent": state[0] - len(failed), "count": state[0], "failed": failed, "chunk": chunk,
        "stamps": stamps, "drained": drained, "stats": stats, "failures": failures,
        "samples": {"t_ns": columns[0], "pushed": columns[1], "unacked": columns[2],
                    "pto": columns[3], "epoch_resets": columns[4]},
    }  # fmt: skip


_ROLES: Final[dict[str, Callable[..., dict[str, Any]]]] = {
    "receiver": receiver,
    "sender": sender,
    "slow_receiver": slow_receiver,
    "flood": flood,
    "incarnation": incarnation,
    "restart_sender": restart_sender,
}


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
    # The process's CPU seconds (user and system, every thread), for the
    # cost of a run's messages at each end.
    result.setdefault("cpu_s", time.process_time())
    _emit("RESULT", result)
    return 0


if __name__ == "__main__":
    # Run by path, this folder is sys.path[0]: drop it, so that its modules
    # never shadow a top-level one.
    del sys.path[0]
    sys.exit(main(sys.argv[1:]))
