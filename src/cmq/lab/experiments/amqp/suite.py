"""The AMQP paper's five benchmarks, process-separated, cmq broker beside RabbitMQ.

Theory of operation
-------------------
A *point* is one measurement: an exchange of one kind with its queues and
bindings, some publishers and some consumers, each in a worker process of
its own (:mod:`cmq.lab.experiments.amqp._worker`), the broker in another (``cmq broker``
started here; RabbitMQ already running). :func:`run_point` declares the
topology, starts the consumers and waits until each is attached, starts the
publishers, releases them together, and collects every message's stamps:
the publisher's before each publish, the consumer's as it takes the
message (one clock, ``CLOCK_MONOTONIC``: the latency is one way). It also
reads the broker process's CPU time (``/proc/PID/stat``) before and after.

The five benchmarks (Subramoni et al. 2008, section 4) as point plans:

=========  ========  ===================================================  =========================
bench      exchange  topology                                             varies
=========  ========  ===================================================  =========================
DE-SPSC    direct    1 publisher -> 1 queue -> 1 consumer                 message size
DE-MPMC    direct    k publishers, each to its own queue and consumer     k = 1 .. 8 pairs
DE-PP      direct    ping -> queue -> echo -> queue -> ping, one in flight  message size
FE-SPMC    fanout    1 publisher -> n queues -> n consumers               n = 1 .. 32 consumers
TE-SPSC    topic     1 publisher -> 1 queue with 1 matching + b others    b = 1 .. 1024 bindings
=========  ========  ===================================================  =========================

A worker pool (:class:`Pool`) serves every point of an experiment, so
Python starts once per process, not once per point. A point that fails (a
worker error, a timeout) is reported, its workers are replaced, and the
experiment goes on with the next point.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import queue
import subprocess
import sys
import tempfile
import time
from array import array
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from cmq._errors import CmqError, ConfigError
from cmq.lab._child import LineProcess, child_env, stop_child
from cmq.lab.experiments.amqp._worker import read_stamps
from cmq.lab.experiments.amqp.transport import AMQP_URL, Transport, open_transport

__all__ = [
    "PREFETCH",
    "BrokerProcess",
    "Point",
    "PointResult",
    "Pool",
    "Stream",
    "WorkerError",
    "broker_session",
    "cmq_broker",
    "cpu_seconds",
    "rabbit_pid",
    "rabbitmq",
    "run_pingpong",
    "run_point",
    "sync_every",
]

#: Unacknowledged deliveries per consumer, both brokers (as ``cmq broker bench``).
PREFETCH: Final = 256
#: Bytes a publisher may have unconfirmed before its next flow-control
#: point: 256 small messages, fewer large ones (a 1 MB message alone). A
#: cmq publisher waits at that point for the broker's confirm, so the window
#: must cover the round trip: 1 MB doubles cmq's 4 KB rate against 256 KB;
#: pika's publisher only turns its I/O loop there (TCP paces it) and
#: measured the same with either.
SYNC_BYTES: Final = 1024 * 1024
#: A consumer that got nothing for this long after its first message stops:
#: what did not come by then is counted lost.
IDLE: Final = 3.0
#: How long a worker may take to start and attach (imports on a busy machine).
READY_TIMEOUT: Final = 60.0


class WorkerError(CmqError):
    """A worker process failed or did not answer in time; the message says how."""


def sync_every(size: int) -> int:
    """Messages between a publisher's flow-control points for ``size``-byte bodies."""
    return max(1, min(256, SYNC_BYTES // max(1, size)))


# -- processes ---------------------------------------------------------------


class Worker(LineProcess):
    """One worker process: commands as JSON lines in, ``TAG {json}`` lines out.

    ``argv`` runs another program with the same line protocol (default: the
    suite's worker, :mod:`cmq.lab.experiments.amqp._worker`).
    """

    def __init__(self, argv: Sequence[str] | None = None) -> None:
        super().__init__(
            argv or [sys.executable, "-m", "cmq.lab.experiments.amqp._worker"], stdin=subprocess.PIPE
        )

    def send(self, line: str) -> None:
        """Write one line to the worker.

        Raises:
            WorkerError: the worker has exited.
        """
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise WorkerError(f"worker {self.proc.pid} is gone{self._tail()}") from exc

    def command(self, params: Mapping[str, Any]) -> None:
        """Start a role (see :mod:`cmq.lab.experiments.amqp._worker`)."""
        self.send(json.dumps(params))

    def line(self, timeout: float, tags: Sequence[str]) -> tuple[str, dict[str, Any]]:
        """``(tag, value)`` of the next line whose tag is one of ``tags``.

        Raises:
            WorkerError: an ``ERROR`` line, the process exited, or nothing
                came within ``timeout`` seconds.
        """
        end = time.monotonic() + timeout
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, end - time.monotonic()))
            except queue.Empty:
                want = "/".join(tags)
                raise WorkerError(
                    f"worker {self.proc.pid}: no {want} within {timeout:.0f} s"
                ) from None
            if line is None:
                raise WorkerError(f"worker {self.proc.pid} exited{self._tail()}")
            got, _, rest = line.partition(" ")
            if got == "ERROR":
                raise WorkerError(json.loads(rest).get("error", rest.strip()))
            if got in tags:
                value: dict[str, Any] = json.loads(rest)
                return got, value
            # Anything else on stdout (a library's print) is not ours: skip it.

    def expect(self, tag: str, timeout: float) -> dict[str, Any]:
        """The value of the next line, which must carry ``tag`` (see :meth:`line`).

        Raises:
            WorkerError: as :meth:`line`.
        """
        return self.line(timeout, (tag,))[1]

    def stop(self) -> None:
        """End the process (stdin closed, then killed if it lingers) and reap it."""
        with contextlib.suppress(OSError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Pool:
    """Worker processes reused across points; ``take(n)`` gives ``n`` of them."""

    def __init__(self) -> None:
        self._workers: list[Worker] = []

    def take(self, n: int) -> list[Worker]:
        """``n`` idle workers, starting more as needed."""
        while len(self._workers) < n:
            self._workers.append(Worker())
        return self._workers[:n]

    def reset(self) -> None:
        """Stop every worker (after a failure, whatever state they are in)."""
        for w in self._workers:
            w.stop()
        self._workers.clear()

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.reset()


def cpu_seconds(pid: int) -> float | None:
    """CPU time (user + system) process ``pid`` has used so far, from /proc; None if unknown."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return None
    # Fields 14 and 15 of proc(5); the split starts at field 3.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rabbit_pid() -> int | None:
    """The pid of RabbitMQ's Erlang VM (``beam.smp`` running rabbit), if one runs here."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            comm = (entry / "comm").read_text(encoding="ascii").strip()
            if not comm.startswith("beam"):
                continue
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if b"rabbit" in cmdline:
            return int(entry.name)
    return None


@dataclass
class BrokerProcess:
    """A broker to measure: its system, its address for clients, its pid."""

    system: str
    address: str
    pid: int | None
    proc: subprocess.Popen[str] | None = None

    def cpu(self) -> float | None:
        """The broker process's CPU seconds so far (None if unknown)."""
        return None if self.pid is None else cpu_seconds(self.pid)

    def close(self) -> None:
        """Stop the broker if this process started it."""
        if self.proc is not None:
            stop_child(self.proc)


def cmq_broker(*, amqp: bool = False) -> BrokerProcess:
    """Start ``cmq broker --port 0`` in a process of its own; with ``amqp``,
    also its AMQP listener (``--amqp-port 0``), and the broker is system
    ``cmq-pika`` at that listener's URL.

    Raises:
        WorkerError: it did not say where it serves.
    """
    extra = ["--amqp-port", "0"] if amqp else []
    proc = subprocess.Popen(
        [sys.executable, "-m", "cmq", "broker", "--port", "0", "--in-memory", *extra],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # "cmq broker serving on HOST:PORT"
    if "serving on" not in line:
        proc.kill()
        proc.wait()
        raise WorkerError(f"cmq broker did not start: {line!r}")
    if amqp:
        # "cmq broker serving on HOST:PORT, AMQP 0-9-1 on HOST:PORT"
        return BrokerProcess(system="cmq-pika", address=f"amqp://guest:guest@{line.strip().rpartition(' ')[2]}/%2F",
                             pid=proc.pid, proc=proc)  # fmt: skip
    return BrokerProcess(system="cmq", address=line.strip().rpartition(" ")[2].rstrip(","), pid=proc.pid,
                         proc=proc)  # fmt: skip


def rabbitmq(url: str = AMQP_URL) -> BrokerProcess:
    """RabbitMQ, already running at ``url``."""
    return BrokerProcess(system="rabbitmq", address=url, pid=rabbit_pid())


# -- points ------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Stream:
    """One publisher of a point: ``count`` bodies of ``size`` bytes with ``key``."""

    key: str
    count: int
    size: int


@dataclass(frozen=True, kw_only=True)
class Point:
    """One measurement's topology and load.

    Raises:
        ConfigError: on construction, for no publishers, an unknown
            exchange kind, a consumer of an undeclared queue, or a count or
            size below 1.
    """

    kind: str
    """Exchange type: ``direct``, ``fanout`` or ``topic``."""
    queues: Mapping[str, Sequence[str]]
    """Queue name -> binding keys."""
    publishers: Sequence[Stream]
    consumers: Sequence[str]
    """The queue each consumer reads (one consumer per entry)."""
    expect: int
    """Messages each consumer should get."""

    def __post_init__(self) -> None:
        if self.kind not in ("direct", "fanout", "topic"):
            raise ConfigError(f"unknown exchange kind {self.kind!r}")
        if not self.publishers:
            raise ConfigError("a point needs a publisher")
        for c in self.consumers:
            if c not in self.queues:
                raise ConfigError(f"consumer of undeclared queue {c!r}")
        for s in self.publishers:
            if s.count < 1 or s.size < 1:
                raise ConfigError(f"bad stream {s!r}: count and size at least 1")


@dataclass
class PointResult:
    """What a point measured: stamps per publisher and per consumer, broker CPU."""

    sent: list[array[int]] = field(default_factory=list)
    """Per publisher: send stamp of each seq."""
    received: list[tuple[array[int], array[int]]] = field(default_factory=list)
    """Per consumer: (seqs, receive stamps) in arrival order."""
    cpu_s: float | None = None
    """Broker CPU seconds from the publishers' release to the last consumer's end."""
    wall_s: float = 0.0
    """Wall seconds of the same interval."""


_names = itertools.count()


def _budget(point: Point) -> float:
    # Generous: a loaded machine, and 1 MB messages; 20 µs per message and
    # 20 ns per byte above what a healthy run needs.
    total = sum(s.count for s in point.publishers) * max(1, len(point.consumers))
    volume = sum(s.count * s.size for s in point.publishers) * max(1, len(point.consumers))
    return READY_TIMEOUT + IDLE + 2e-5 * total + 2e-8 * volume


def run_point(broker: BrokerProcess, admin: Transport, pool: Pool, point: Point) -> PointResult:
    """Measure one point (module docstring); the topology is deleted afterwards.

    Raises:
        WorkerError: a worker failed or timed out (the pool should be reset).
        CmqError: the broker refused a declaration.
    """
    tag = f"{os.getpid()}-{next(_names)}-{time.monotonic_ns() % 10**9}"
    exchange = f"amqp-{tag}"
    queues = {f"{q}-{tag}": keys for q, keys in point.queues.items()}
    admin.declare(exchange, point.kind, queues)
    try:
        workers = pool.take(len(point.consumers) + len(point.publishers))
        consumers, publishers = workers[: len(point.consumers)], workers[len(point.consumers) :]
        result = PointResult()
        budget = _budget(point)
        with tempfile.TemporaryDirectory(prefix="cmq-amqp-") as tmp:
            common = {"system": broker.system, "address": broker.address}
            for j, (w, q) in enumerate(zip(consumers, point.consumers, strict=True)):
                w.command({**common, "role": "consume", "queue": f"{q}-{tag}", "count": point.expect,
                           "prefetch": PREFETCH, "idle": IDLE, "out": f"{tmp}/c{j}"})  # fmt: skip
            for w in consumers:
                w.expect("READY", READY_TIMEOUT)
            for i, (w, s) in enumerate(zip(publishers, point.publishers, strict=True)):
                w.command({**common, "role": "publish", "exchange": exchange, "key": s.key,
                           "count": s.count, "size": s.size, "sync_every": sync_every(s.size),
                           "out": f"{tmp}/p{i}"})  # fmt: skip
            for w in publishers:
                w.expect("READY", READY_TIMEOUT)
            cpu0, t0 = broker.cpu(), time.monotonic()
            for w in publishers:
                w.send("GO")
            for w in (*publishers, *consumers):
                w.expect("RESULT", budget)
            cpu1, t1 = broker.cpu(), time.monotonic()
            result.sent = [read_stamps(f"{tmp}/p{i}")[0] for i in range(len(publishers))]
            for j in range(len(consumers)):
                seqs, recv = read_stamps(f"{tmp}/c{j}")
                result.received.append((seqs, recv))
    finally:
        # Also after a failure: RabbitMQ would keep the queues and their messages.
        admin.delete(exchange, list(queues))
    result.wall_s = t1 - t0
    if cpu0 is not None and cpu1 is not None:
        result.cpu_s = cpu1 - cpu0
    return result


def run_pingpong(
    broker: BrokerProcess, admin: Transport, pool: Pool, *, size: int, count: int, timeout: float
) -> tuple[array[int], array[int]]:
    """DE-PP: ``count`` round trips of ``size`` bytes, one in flight; (send, reply) stamps,
    reply -1 for a round trip lost (no pong within ``timeout``).

    Raises:
        WorkerError: a worker failed or timed out (the pool should be reset).
        CmqError: the broker refused a declaration.
    """
    tag = f"{os.getpid()}-{next(_names)}-{time.monotonic_ns() % 10**9}"
    exchange, ping_q, pong_q = f"amqp-{tag}", f"ping-{tag}", f"pong-{tag}"
    admin.declare(exchange, "direct", {ping_q: ["ping"], pong_q: ["pong"]})
    try:
        echo, pinger = pool.take(2)
        common = {"system": broker.system, "address": broker.address}
        with tempfile.TemporaryDirectory(prefix="cmq-amqp-") as tmp:
            echo.command({**common, "role": "echo", "queue": ping_q, "exchange": exchange,
                          "key": "pong", "count": count, "prefetch": PREFETCH,
                          "idle": IDLE + timeout})  # fmt: skip
            echo.expect("READY", READY_TIMEOUT)
            pinger.command({**common, "role": "ping", "queue": pong_q, "exchange": exchange,
                            "key": "ping", "count": count, "size": size, "prefetch": PREFETCH,
                            "timeout": timeout, "out": f"{tmp}/pp"})  # fmt: skip
            pinger.expect("READY", READY_TIMEOUT)
            pinger.send("GO")
            budget = READY_TIMEOUT + count * (timeout + 0.01)
            pinger.expect("RESULT", budget)
            echo.expect("RESULT", budget)
            sent, back = read_stamps(f"{tmp}/pp")
    finally:
        admin.delete(exchange, [ping_q, pong_q])
    return sent, back


@contextlib.contextmanager
def broker_session(system: str) -> Iterator[tuple[BrokerProcess, Transport]]:
    """The broker of ``system`` (started when it is cmq) and an admin client of it.

    Raises:
        WorkerError: the cmq broker did not start.
    """
    broker = cmq_broker(amqp=system == "cmq-pika") if system in ("cmq", "cmq-pika") else rabbitmq()
    try:
        admin = open_transport(system, broker.address)
        try:
            yield broker, admin
        finally:
            admin.close()
    finally:
        broker.close()
