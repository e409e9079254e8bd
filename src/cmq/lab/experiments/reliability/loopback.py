"""The reliability experiment's loopback scenarios: a slow receiver, a receiver restart.

Theory of operation
-------------------
Neither scenario needs loss, so both run on loopback in the host's own
network namespace (no root needed), every process pinned as ``--pin``
says, with the reliable delivery mode and the lab's 1472 B datagrams. Each
repeat is a run of its own (its rows carry ``{"delivery": "reliable",
"repeat": k}``); the rules that judge them are in :mod:`.claims`.

Slow receiver (scenario ``"slow"``)
    :func:`._peer.slow_receiver` takes the first ``slow_calib`` messages as
    they come (the sender's unthrottled rate, from their send stamps), then
    :data:`~.claims.SLOW_SHARE` of that rate, paced, until the sender stops
    ``slow_seconds`` after its first push; :func:`._peer.flood` pushes as
    fast as ``push`` returns (``on_full="block"``). Every take becomes a
    record (a message never taken, a lost row), so the pipeline counts
    delivered, duplicates and order; both processes' samples (sender:
    pushed, send_buffered, unacked, RSS; receiver: taken, kernel drops,
    held bytes, RSS, every :data:`SAMPLE_INTERVAL`) become timed samples
    whose ``x`` is seconds since the sender's first push.
Receiver restart (scenario ``"restart"``)
    A first incarnation (:func:`._peer.incarnation`, budget
    :data:`RESTART_BUDGET`) takes and logs everything; a second one is
    started beside it and waits. Once the first has taken
    ``restart_kill_after`` messages it is SIGKILLed and, once reaped, the
    second binds its port. :func:`._peer.restart_sender` pushes
    throughout, until ``restart_after`` seconds past its first failure
    report. Both incarnations' takes become records of one stream (so the
    pipeline's duplicates span both), the never-taken lost rows; the
    detection times, the PTO and :func:`~.claims.classify_restart`'s
    counts become samples.
"""

from __future__ import annotations

import contextlib
import subprocess
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from cmq.lab import runner
from cmq.lab.experiments import Context
from cmq.lab.experiments._proc import GRACE, READY_TIMEOUT, WorkerError
from cmq.lab.experiments._record import RunBook
from cmq.lab.experiments.reliability import _peer
from cmq.lab.experiments.reliability.claims import EXPERIMENT_ID, SLOW_SHARE, classify_restart

__all__ = [
    "LOOPBACK",
    "RESTART_BUDGET",
    "SAMPLE_INTERVAL",
    "read_log",
    "run",
    "steps",
    "write_restart",
    "write_slow",
]

#: Where both scenarios run: loopback of the host's namespace.
LOOPBACK: Final = "127.0.0.1"
#: How often both processes sample their counters and RSS (seconds).
SAMPLE_INTERVAL: Final = 0.05
#: The first incarnation's max_buffered_bytes: what it may have acknowledged
#: and not handed to its application when killed (the in-doubt rule's bound).
RESTART_BUDGET: Final = 256 * 1024
#: A receiver's longest quiet gap (longer than a blocked sender's wait for a
#: restart to be detected), and its quiet after the end marker.
IDLE: Final = 15.0
LINGER: Final = 0.1
#: The senders' drain before their end marker.
DRAIN: Final = 20.0
#: Longest a restart run's sender pushes when it never hears of the restart.
RESTART_SECONDS: Final = 20.0
#: Longest wait for the first incarnation to take its share before the kill.
KILL_WAIT: Final = 30.0

_PARAMS: Final = {"delivery": "reliable"}


def steps(scale: Any) -> int:
    """Progress steps: one per run of either scenario."""
    return int(scale.slow_repeats) + int(scale.restart_repeats)


def _x(t_ns: int, origin: int) -> float:
    return (t_ns - origin) / 1e9


def _timed(
    w: Any, scenario: str, params: Mapping[str, Any], origin: int, prefix: str,
    samples: Mapping[str, Sequence[Any]], metrics: Iterable[str],
) -> None:  # fmt: skip
    for metric in metrics:
        for t, v in zip(samples["t_ns"], samples[metric], strict=True):
            if v is not None:
                w.sample(metric=f"{prefix}_{metric}", value=float(v), x=_x(int(t), origin),
                         t_ns=int(t), scenario=scenario, params=params)  # fmt: skip


def _scalars(w: Any, scenario: str, params: Mapping[str, Any], values: Mapping[str, Any]) -> None:
    for metric, v in values.items():
        if v is not None:
            w.sample(metric=metric, value=float(v), scenario=scenario, params=params)


def _deliveries(
    w: Any, scenario: str, params: Mapping[str, Any], size: int, count: int,
    seqs: Sequence[int], sends: Sequence[int], recvs: Sequence[int],
    stamps: Sequence[int], chunk: int,
) -> None:  # fmt: skip
    """Every take a record, every message of ``range(count)`` never taken a lost one."""
    w.record_many(scenario=scenario, params=params, size=size, seq=list(seqs),
                  send_ns=list(sends), recv_ns=list(recvs))  # fmt: skip
    missing = sorted(set(range(count)) - set(seqs))
    if missing:
        w.record_many(scenario=scenario, params=params, size=size, seq=missing,
                      send_ns=[stamps[min(s // chunk, len(stamps) - 1)] for s in missing],
                      recv_ns=[None] * len(missing))  # fmt: skip


# -- slow receiver ------------------------------------------------------------------


def _slow_pair(
    scale: Any, options: dict[str, Any], pin: str, workdir: Path
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Receiver and sender of one slow-receiver run: both results (the
    receiver's with what it took, from its log: ``seq``, ``send_ns``, ``recv_ns``).

    Raises:
        WorkerError: either side failed or overran its time.
    """
    from cmq.lab.experiments.reliability.measure import CHUNK, _expect, _Peer

    rcpu, scpu = runner.cpus_for(pin)
    log = workdir / "slow.log"
    run_time = READY_TIMEOUT + scale.slow_seconds + DRAIN + GRACE
    receiver = _Peer([], "slow_receiver", {
        "bind": LOOPBACK, "options": options, "calib": scale.slow_calib, "share": SLOW_SHARE,
        "seconds": scale.slow_seconds, "interval": SAMPLE_INTERVAL, "startup": READY_TIMEOUT,
        "log": str(log),
        "idle": IDLE, "linger": LINGER, "deadline": run_time, "cpu": rcpu,
    })  # fmt: skip
    sender = None
    try:
        ready = _expect(receiver, "READY", READY_TIMEOUT)
        sender = _Peer([], "flood", {
            "peer": ready, "size": scale.size, "seconds": scale.slow_seconds, "options": options,
            "chunk": CHUNK, "drain": DRAIN, "interval": SAMPLE_INTERVAL, "cpu": scpu,
        })  # fmt: skip
        sent = _expect(sender, "RESULT", run_time)
        received = _expect(receiver, "RESULT", IDLE + GRACE)
        received["seq"], received["send_ns"], received["recv_ns"] = read_log(log)
        return received, sent
    finally:
        for peer in (sender, receiver):
            if peer is not None:
                peer.stop()


def write_slow(
    book: RunBook, *, repeat: int, size: int, received: Mapping[str, Any], sent: Mapping[str, Any]
) -> list[str]:
    """One slow-receiver run's records and samples; the problems to note."""
    params = {**_PARAMS, "repeat": repeat}
    w = book.writer("cmq")
    stamps = list(sent["stamps"])
    _deliveries(w, "slow", params, size, int(sent["count"]), received["seq"],
                received["send_ns"], received["recv_ns"], stamps, int(sent["chunk"]))  # fmt: skip
    problems = []
    origin = stamps[0] if stamps else None
    if origin is None:
        return ["slow receiver: the sender pushed nothing"]
    _timed(w, "slow", params, origin, "sender", sent["samples"],
           ("pushed", "send_buffered", "unacked", "rss"))  # fmt: skip
    _timed(w, "slow", params, origin, "receiver", received["samples"],
           ("taken", "kernel_drops", "held_bytes", "rss"))  # fmt: skip
    frm, until = received.get("pace_from_ns"), received.get("pace_until_ns")
    rstats, sstats = received.get("stats", {}), sent.get("stats", {})
    _scalars(w, "slow", params, {
        "calib_rate": received.get("calib_rate"), "pace_rate": received.get("pace_rate"),
        "pace_from_s": None if frm is None else _x(frm, origin),
        "pace_until_s": None if until is None else _x(until, origin),
        "push_failed": len(sent.get("failed", ())),
        "receiver_overruns": rstats.get("overruns"), "sender_retransmits": sstats.get("retransmits"),
        "sender_probes": sstats.get("probes"), "sender_in_doubt": sstats.get("in_doubt"),
    })  # fmt: skip
    if frm is None:
        problems.append(f"slow receiver run {repeat}: no paced phase (calibration failed)")
    elif until is not None and until <= frm:
        problems.append(f"slow receiver run {repeat}: calibration outlasted the sender")
    if received.get("stopped") != "end":
        problems.append(f"slow receiver run {repeat}: the receiver stopped at its "
                        f"{received.get('stopped')}, not at the end marker")  # fmt: skip
    if sent.get("failed"):
        problems.append(f"slow receiver run {repeat}: {len(sent['failed'])} pushes failed")
    if sent.get("drained") is False:
        problems.append(f"slow receiver run {repeat}: drain timed out")
    return problems


# -- receiver restart ---------------------------------------------------------------


def read_log(path: Path) -> tuple[list[int], list[int], list[int]]:
    """An incarnation's log: seqs, send and take stamps (a torn last record left out)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return [], [], []
    n = len(data) // _peer.RECORD.size
    rows = list(_peer.RECORD.iter_unpack(data[: n * _peer.RECORD.size]))
    return [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]


def _wait_for(path: Path, nbytes: int, peers: Sequence[Any], timeout: float) -> None:
    """Until ``path`` holds ``nbytes``.

    Raises:
        WorkerError: a peer exited first, or ``timeout`` passed.
    """
    end = time.monotonic() + timeout
    while True:
        with contextlib.suppress(FileNotFoundError):
            if path.stat().st_size >= nbytes:
                return
        for p in peers:
            if p.proc.poll() is not None:
                raise WorkerError(f"{p.role}: exited before the kill{p._tail()}")
        if time.monotonic() > end:
            raise WorkerError(f"the first incarnation took too little in {timeout:.0f} s")
        time.sleep(0.002)  # polling a file another process writes; not a test's wait


def _restart_run(scale: Any, options: dict[str, Any], pin: str, workdir: Path) -> dict[str, Any]:
    """One restart run: the sender's result, both incarnations' logs, the kill's times.

    Raises:
        WorkerError: a process failed or overran its time.
    """
    from cmq.lab.experiments.reliability.measure import CHUNK, _expect, _Peer

    rcpu, scpu = runner.cpus_for(pin)
    log1, log2 = workdir / "first.log", workdir / "second.log"
    common = {"bind": LOOPBACK, "idle": IDLE, "linger": LINGER,
              "deadline": RESTART_SECONDS + DRAIN + GRACE, "cpu": rcpu}  # fmt: skip
    first = _Peer([], "incarnation", {**common, "port": 0, "log": str(log1), "go": False,
                                      "options": {**options, "max_buffered_bytes": RESTART_BUDGET}})  # fmt: skip
    second = sender = None
    try:
        ready1 = _expect(first, "READY", READY_TIMEOUT)
        second = _Peer([], "incarnation", {**common, "port": int(ready1["port"]), "log": str(log2),
                                           "go": True, "options": options},
                       stdin=subprocess.PIPE)  # fmt: skip
        sender = _Peer([], "restart_sender", {
            "peer": ready1, "size": scale.size, "options": options, "chunk": CHUNK,
            "after": scale.restart_after, "seconds": RESTART_SECONDS, "drain": DRAIN,
            "interval": SAMPLE_INTERVAL / 5, "cpu": scpu,
        })  # fmt: skip
        _wait_for(log1, scale.restart_kill_after * _peer.RECORD.size, (first, second, sender),
                  KILL_WAIT)  # fmt: skip
        kill_ns = time.monotonic_ns()
        first.proc.kill()
        first.proc.wait()
        dead_ns = time.monotonic_ns()
        assert second.proc.stdin is not None
        second.proc.stdin.write("go\n")
        second.proc.stdin.flush()
        ready2 = _expect(second, "READY", READY_TIMEOUT)
        sent = _expect(sender, "RESULT", RESTART_SECONDS + DRAIN + GRACE)
        received = _expect(second, "RESULT", IDLE + GRACE)
    finally:
        for peer in (sender, second, first):
            if peer is not None:
                peer.stop()
    return {"sent": sent, "received": received, "first": read_log(log1),
            "second": read_log(log2), "kill_ns": kill_ns, "dead_ns": dead_ns,
            "ready_ns": int(ready2["ready_ns"])}  # fmt: skip


def write_restart(book: RunBook, *, repeat: int, size: int, run: Mapping[str, Any]) -> list[str]:
    """One restart run's records and samples; the problems to note."""
    params = {**_PARAMS, "repeat": repeat}
    w = book.writer("cmq")
    sent = run["sent"]
    (s1, d1, r1), (s2, d2, r2) = run["first"], run["second"]
    stamps = list(sent["stamps"])
    if not stamps:
        return [f"restart run {repeat}: the sender pushed nothing"]
    # One stream, one receiver (the same port): a message both took is a duplicate.
    _deliveries(w, "restart", params, size, int(sent["count"]), [*s1, *s2], [*d1, *d2],
                [*r1, *r2], stamps, int(sent["chunk"]))  # fmt: skip
    failures = list(sent.get("failures", ()))
    given_up = [f for f in failures if f["reason"] in ("peer_reset", "peer_dead")]
    named = [s for f in given_up for s in f["seq"]]
    failed = set(sent.get("failed", ()))
    pushed = [s for s in range(int(sent["count"])) if s not in failed]
    counts = classify_restart(pushed, s1, s2, named, RESTART_BUDGET // size)
    scalars: dict[str, Any] = {**counts, "detected": 1 if given_up else 0,
                               "detected_by_reset": int(bool(given_up) and given_up[0]["reason"] == "peer_reset"),
                               "restart_gap_s": (run["ready_ns"] - run["kill_ns"]) / 1e9}  # fmt: skip
    if given_up:
        at = int(given_up[0]["t_ns"])
        scalars.update(detect_from_ready_s=(at - run["ready_ns"]) / 1e9,
                       detect_from_kill_s=(at - run["kill_ns"]) / 1e9,
                       pto_s=given_up[0]["pto"])  # fmt: skip
    _scalars(w, "restart", params, scalars)
    samples = sent["samples"]
    _timed(w, "restart", params, stamps[0], "sender", samples, ("pushed", "unacked", "pto"))
    problems = []
    if not given_up:
        problems.append(f"restart run {repeat}: the sender reported no failure")
    if run["received"].get("stopped") != "end":
        problems.append(f"restart run {repeat}: the second incarnation stopped at its "
                        f"{run['received'].get('stopped')}, not at the end marker")  # fmt: skip
    if sent.get("drained") is False:
        problems.append(f"restart run {repeat}: drain timed out")
    return problems


def run(ctx: Context, scale: Any, options: dict[str, Any], run_params: dict[str, Any]) -> None:
    """Both scenarios, ``scale.slow_repeats`` and ``scale.restart_repeats`` runs,
    alternating; each run a :class:`RunBook` of its own."""
    options = {**options, "delivery": "reliable", "on_full": "block"}
    for repeat in range(max(scale.slow_repeats, scale.restart_repeats)):
        if repeat < scale.slow_repeats:
            with RunBook(ctx.out, EXPERIMENT_ID, pin=ctx.pin,
                         params={**run_params, "scenario": "slow", "repeat": repeat}) as book,\
                    tempfile.TemporaryDirectory(prefix="cmq-slow-") as tmp:  # fmt: skip
                try:
                    received, sent = _slow_pair(scale, options, ctx.pin, Path(tmp))
                except WorkerError as exc:
                    book.problem("cmq", f"slow receiver run {repeat}: {exc}")
                else:
                    for text in write_slow(book, repeat=repeat, size=scale.size,
                                           received=received, sent=sent):  # fmt: skip
                        book.problem("cmq", text)
            ctx.step(f"slow receiver, run {repeat + 1}")
        if repeat < scale.restart_repeats:
            with RunBook(ctx.out, EXPERIMENT_ID, pin=ctx.pin,
                         params={**run_params, "scenario": "restart", "repeat": repeat}) as book,\
                    tempfile.TemporaryDirectory(prefix="cmq-restart-") as tmp:  # fmt: skip
                try:
                    result = _restart_run(scale, options, ctx.pin, Path(tmp))
                except WorkerError as exc:
                    book.problem("cmq", f"restart run {repeat}: {exc}")
                else:
                    for text in write_restart(book, repeat=repeat, size=scale.size, run=result):
                        book.problem("cmq", text)
            ctx.step(f"receiver restart, run {repeat + 1}")
