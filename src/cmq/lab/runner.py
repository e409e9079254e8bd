"""Run system adapters in pairs of processes and collect what they measured.

Theory of operation
-------------------

A run is one (system, size): the runner starts the receiving side (receiver
or echo server) in its own process, waits for its ``READY`` line (its
address), starts the sending side (sender or client) in another process with
that address, and reads one ``RESULT`` JSON line from each. Both processes
run the adapter module of :mod:`cmq.lab.systems`; nothing of a system is ever
loaded into the runner's process, so systems cannot disturb each other.

Pinning (``pin``): ``"same"`` puts both processes on one CPU, ``"spread"`` on
two different CPUs (receiver on the first, sender on the second), ``"none"``
leaves them to the scheduler. A broker (nats-server, RabbitMQ) is not pinned:
it is not ours.

Fairness: runs are interleaved. For every size, each system runs once before
any system runs again, and the order of systems rotates from size to size and
round to round, so that no system always runs first (on a cold machine) or
last (after the others warmed the caches, or while a neighbour is busy).

Counting rules:

- Throughput: ``sent`` is what the sender handed to the system;
  ``delivered`` is what the receiver got; ``seconds`` runs from the first to
  the last delivered message, stamped by the receiver, so process start-up,
  connection set-up and the receiver's idle wait at the end are outside it.
  ``msgs_per_s`` is ``(delivered - 1) / seconds`` (the first delivery starts
  the clock, each later one ends an interval): delivered messages only, a
  message the network dropped never counts. ``mb_per_s`` is ``msgs_per_s *
  size / 1e6`` (payload bytes, decimal megabytes).
- Round trips (ping-pong and ping-ping): ``sent`` round trips were started,
  ``round_trips`` of them got their reply within the timeout, ``lost`` did
  not. Latency statistics are over the completed round trips; the raw
  ``send_ns`` / ``recv_ns`` per message (``recv_ns`` -1 when lost) are kept
  for the lab's per-message records.

Use from the lab (every result is a frozen dataclass; ``to_json()`` gives the
``cmq bench --json`` shape)::

    from cmq.lab import runner

    for r in runner.run_pingpong(["cmq", "udp", "zmq"], [4, 512], count=1000, pin="same"):
        if isinstance(r, runner.RoundTripResult):
            for seq, (sent, got) in enumerate(zip(r.send_ns, r.recv_ns)):
                ...  # one record: r.system, r.size, seq, sent, got, lost = got < 0
        elif isinstance(r, runner.Skipped):
            ...  # r.reason says how to get the system
    runner.run_pingping(systems, sizes, count=1000, window=16, timeout=0.2)
    runner.run_throughput(["cmq"], [512], duration=2, options={"cmq": {"qthresh": 4096}})
    runner.run_destinations((1, 1000, 100_000, 1_000_000), per_destination=1)
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import queue
import statistics
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Literal

from cmq._errors import ConfigError
from cmq.lab import systems as _systems
from cmq.lab._child import LineProcess

__all__ = [
    "PINS",
    "DestinationsResult",
    "Failed",
    "Progress",
    "Result",
    "RoundTripResult",
    "Skipped",
    "ThroughputResult",
    "cpus_for",
    "run_destinations",
    "run_pingping",
    "run_pingpong",
    "run_throughput",
]

Pin = Literal["same", "spread", "none"]
PINS: tuple[str, ...] = ("same", "spread", "none")

Progress = Callable[[int, int, str], None]
"""Called as ``progress(done, total, label)`` before each run and at the end."""

# How long a receiving side may take to start and listen: importing pika or
# the cmq core on a loaded 2-core machine can take a few seconds.
_READY_TIMEOUT = 30.0
# How long the receiving side waits for the first message once it listens.
_STARTUP = 15.0
# Idle gap after which a receiver concludes the sender is done. Datagram
# systems need it (the end marker may be dropped); stream systems always get
# the end marker, so theirs is only a safety net against a stuck sender.
_IDLE_DATAGRAM = 1.0
_IDLE_STREAM = 10.0
# Beyond its own deadline, what a worker gets before the runner kills it.
_GRACE = 10.0


@dataclass(frozen=True, kw_only=True)
class Skipped:
    """A system (or one size of it) that was not run, and why."""

    system: str
    reason: str
    size: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The JSON object ``cmq bench --json`` prints for this skip."""
        out: dict[str, Any] = {"system": self.system, "skipped": self.reason}
        if self.size is not None:
            out["size"] = self.size
        return out


@dataclass(frozen=True, kw_only=True)
class Failed:
    """A run that started but broke (a worker crashed or hung)."""

    system: str
    size: int
    error: str

    def to_json(self) -> dict[str, Any]:
        """The JSON object ``cmq bench --json`` prints for this failure."""
        return {"system": self.system, "size": self.size, "error": self.error}


@dataclass(frozen=True, kw_only=True)
class ThroughputResult:
    """One throughput run: what was sent, what was delivered, how fast."""

    system: str
    size: int
    sent: int
    delivered: int
    seconds: float
    pin: str
    sender: dict[str, Any] = field(default_factory=dict)
    receiver: dict[str, Any] = field(default_factory=dict)
    receiver_rss: tuple[tuple[int, int], ...] = ()
    """``(monotonic_ns, rss_bytes)`` of the receiver process over the run
    (with ``rss_interval``), sampled from outside it."""

    @property
    def msgs_per_s(self) -> float:
        """Delivered messages per second, first to last delivery."""
        if self.delivered < 2 or self.seconds <= 0:
            return 0.0
        return (self.delivered - 1) / self.seconds

    @property
    def mb_per_s(self) -> float:
        """Delivered payload in decimal megabytes per second."""
        return self.msgs_per_s * self.size / 1e6

    @property
    def delivered_fraction(self) -> float:
        """Delivered over sent (0 when nothing was sent)."""
        return self.delivered / self.sent if self.sent else 0.0

    @property
    def cpu_ns_per_msg(self) -> float | None:
        """CPU time of both ends (every thread of the sender's and the
        receiver's process, over their roles) per delivered message; None
        when a side did not report it or nothing was delivered."""
        send, recv = self.sender.get("cpu_ns"), self.receiver.get("cpu_ns")
        if send is None or recv is None or not self.delivered:
            return None
        return float(send + recv) / self.delivered

    def to_json(self) -> dict[str, Any]:
        """The issue's JSON shape, plus ``delivered_fraction`` and memory."""
        return {
            "system": self.system,
            "size": self.size,
            "sent": self.sent,
            "delivered": self.delivered,
            "seconds": round(self.seconds, 6),
            "msgs_per_s": round(self.msgs_per_s, 1),
            "mb_per_s": round(self.mb_per_s, 3),
            "delivered_fraction": round(self.delivered_fraction, 6),
            "receiver_maxrss_kb": self.receiver.get("maxrss_kb"),
            "cpu_ns_per_msg": None if self.cpu_ns_per_msg is None else round(self.cpu_ns_per_msg, 1),
        }


@dataclass(frozen=True, kw_only=True)
class RoundTripResult:
    """One ping-pong or ping-ping run, with every message's raw stamps."""

    system: str
    size: int
    mode: str
    pin: str
    send_ns: tuple[int, ...]
    recv_ns: tuple[int, ...]
    """Reply time per message (``time.monotonic_ns``), -1 when lost."""
    stale: int = 0
    late: int = 0

    @property
    def sent(self) -> int:
        """Round trips started."""
        return len(self.send_ns)

    @property
    def latencies_ns(self) -> list[int]:
        """Round-trip times of the completed round trips, in send order."""
        return [r - s for s, r in zip(self.send_ns, self.recv_ns, strict=True) if r >= 0]

    @property
    def round_trips(self) -> int:
        """Round trips that got their reply in time."""
        return sum(1 for r in self.recv_ns if r >= 0)

    @property
    def lost(self) -> int:
        """Round trips whose reply did not come in time."""
        return self.sent - self.round_trips

    def stats_us(self) -> dict[str, float]:
        """Mean, p50, p99 and standard deviation of the latencies, in µs."""
        lat = sorted(self.latencies_ns)
        if not lat:
            return {"mean_us": 0.0, "p50_us": 0.0, "p99_us": 0.0, "stdev_us": 0.0}
        return {
            "mean_us": statistics.fmean(lat) / 1e3,
            "p50_us": _percentile(lat, 50) / 1e3,
            "p99_us": _percentile(lat, 99) / 1e3,
            "stdev_us": (statistics.stdev(lat) if len(lat) > 1 else 0.0) / 1e3,
        }

    def to_json(self, *, raw: bool = False) -> dict[str, Any]:
        """The issue's JSON shape; ``raw`` adds the per-message stamps."""
        out: dict[str, Any] = {
            "system": self.system,
            "size": self.size,
            "round_trips": self.round_trips,
            "lost": self.lost,
            **{k: round(v, 3) for k, v in self.stats_us().items()},
            "sent": self.sent,
            "stale": self.stale,
            "late": self.late,
        }
        if raw:
            out["send_ns"] = list(self.send_ns)
            out["recv_ns"] = list(self.recv_ns)
        return out


Result = ThroughputResult | RoundTripResult | Skipped | Failed


def _percentile(sorted_values: Sequence[int], pct: float) -> float:
    # Nearest rank: an observed value, the usual definition for latency tails.
    rank = max(1, math.ceil(pct / 100 * len(sorted_values)))
    return float(sorted_values[rank - 1])


def cpus_for(pin: str) -> tuple[int | None, int | None]:
    """The CPUs of (receiving side, sending side) for a pinning mode.

    Raises :class:`~cmq.ConfigError` for an unknown mode, or ``"spread"``
    when this process may use only one CPU.
    """
    if pin not in PINS:
        raise ConfigError(f"unknown pinning {pin!r}; use one of {', '.join(PINS)}")
    if pin == "none":
        return None, None
    allowed = sorted(os.sched_getaffinity(0))
    if pin == "same":
        return allowed[0], allowed[0]
    if len(allowed) < 2:
        raise ConfigError(
            f"--pin spread needs two CPUs; this process may use only CPU {allowed[0]}"
        )
    return allowed[0], allowed[1]


class _RunError(Exception):
    """A worker failed; the message says which and why."""


class _Worker(LineProcess):
    """One adapter role in a child process (:class:`~cmq.lab._child.LineProcess`),
    its ``TAG {json}`` lines read with :meth:`expect`."""

    def __init__(self, argv: list[str], label: str, *, stdin: int = subprocess.DEVNULL) -> None:
        self.label = label
        try:
            super().__init__(argv, stdin=stdin)
        except OSError as exc:
            raise _RunError(f"{label}: cannot start {argv[0]}: {exc.strerror or exc}") from exc

    def tell(self, value: dict[str, Any]) -> None:
        """Write ``value`` as one JSON line to the worker's stdin, and close it."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(value) + "\n")
            self.proc.stdin.close()
        except OSError as exc:  # it died before it could be told
            raise _RunError(f"{self.label}: exited before it got its peer{self._tail()}") from exc

    def expect(self, tag: str, timeout: float) -> dict[str, Any]:
        """The JSON of the next ``TAG {json}`` line, within ``timeout`` s."""
        end = time.monotonic() + timeout
        while True:
            left = end - time.monotonic()
            try:
                if left <= 0:
                    raise queue.Empty
                line = self._lines.get(timeout=left)
            except queue.Empty:
                raise _RunError(
                    f"{self.label}: no {tag} within {timeout:.0f} s{self._tail()}"
                ) from None
            if line is None:  # end of stdout: the process is exiting
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(timeout=5)
                raise _RunError(
                    f"{self.label}: exited (code {self.proc.returncode}) before {tag}{self._tail()}"
                )
            if line.startswith(tag + " "):
                try:
                    value: dict[str, Any] = json.loads(line[len(tag) + 1 :])
                except json.JSONDecodeError as exc:
                    raise _RunError(f"{self.label}: unreadable {tag} line: {exc}") from None
                return value

    def stop(self) -> None:
        """Kill the process if it still runs, and reap it."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


class _RssSampler:
    """Samples a process's resident memory from outside, every ``interval`` s.

    Reading ``/proc/PID/statm`` from the runner costs the measured process
    nothing, and works the same for every system.
    """

    def __init__(self, pid: int, interval: float) -> None:
        self.samples: list[tuple[int, int]] = []
        self._path = f"/proc/{pid}/statm"
        self._page = os.sysconf("SC_PAGE_SIZE")
        self._interval = interval
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                with open(self._path) as f:
                    rss_pages = int(f.read().split()[1])
            except (OSError, ValueError, IndexError):
                return  # the process is gone
            self.samples.append((time.monotonic_ns(), rss_pages * self._page))
            if self._done.wait(self._interval):
                return

    def stop(self) -> list[tuple[int, int]]:
        """Stop sampling; the samples as ``(monotonic_ns, rss_bytes)``."""
        self._done.set()
        self._thread.join()
        return self.samples


@dataclass(frozen=True)
class _Where:
    """Where the two processes of a run go: command prefixes and bind address."""

    server_prefix: Sequence[str]
    client_prefix: Sequence[str]
    bind: str


def _where(
    prefix: Sequence[str],
    server_prefix: Sequence[str] | None,
    client_prefix: Sequence[str] | None,
    bind: str,
) -> _Where:
    return _Where(
        server_prefix=list(prefix if server_prefix is None else server_prefix),
        client_prefix=list(prefix if client_prefix is None else client_prefix),
        bind=bind,
    )


def _argv(mod: ModuleType, role: str, params: dict[str, Any], prefix: Sequence[str]) -> list[str]:
    cmd: list[str] = mod.command()
    return [*prefix, *cmd, role, json.dumps(params)]


def _pair(
    mod: ModuleType,
    *,
    server_role: str,
    server_params: dict[str, Any],
    client_role: str,
    client_params: dict[str, Any],
    server_deadline: float,
    client_timeout: float,
    where: _Where,
    rss_interval: float | None = None,
) -> tuple[dict[str, Any], dict[str, Any], list[tuple[int, int]]]:
    """Run a receiving and a sending role: both results and the receiving
    side's memory samples (when ``rss_interval`` is given), or ``_RunError``."""
    name = mod.NAME
    server_params = {**server_params, "bind": where.bind}
    server = _Worker(
        _argv(mod, server_role, server_params, where.server_prefix), f"{name} {server_role}"
    )
    client: _Worker | None = None
    sampler = None if rss_interval is None else _RssSampler(server.proc.pid, rss_interval)
    try:
        # The sending side starts beside the receiving one and is told its
        # peer on stdin once that listens: the two interpreters' start-ups
        # (imports, about 70 ms each here) overlap instead of following each
        # other. Nothing is measured before the peer arrives.
        client = _Worker(
            _argv(mod, client_role, {**client_params, "peer_on_stdin": True}, where.client_prefix),
            f"{name} {client_role}",
            stdin=subprocess.PIPE,
        )
        client.tell(server.expect("READY", _READY_TIMEOUT))
        client_result = client.expect("RESULT", client_timeout)
        server_result = server.expect("RESULT", server_deadline + _GRACE)
        return server_result, client_result, [] if sampler is None else sampler.stop()
    finally:
        if sampler is not None:
            sampler.stop()
        for w in (client, server):
            if w is not None:
                w.stop()


def _validate(
    system_names: Iterable[str], sizes: Iterable[int]
) -> tuple[list[tuple[str, ModuleType]], list[int]]:
    names = list(system_names)
    if not names:
        raise ConfigError("no systems given")
    mods = [(n, _systems.load(n)) for n in dict.fromkeys(names)]
    size_list = list(dict.fromkeys(sizes))
    if not size_list:
        raise ConfigError("no sizes given")
    for s in size_list:
        if not isinstance(s, int) or isinstance(s, bool) or s < 1:
            raise ConfigError(f"bad size {s!r}: sizes are whole numbers of bytes, at least 1")
    return mods, size_list


def _plan(
    mods: list[tuple[str, ModuleType]], sizes: list[int], rounds: int, min_size: int = 1
) -> tuple[list[Skipped], list[tuple[ModuleType, int]]]:
    """Skips, and the interleaved order of runs (see the module docstring)."""
    skipped: list[Skipped] = []
    usable: list[ModuleType] = []
    for name, mod in mods:
        reason = mod.available()
        if reason is None:
            usable.append(mod)
        else:
            skipped.append(Skipped(system=name, reason=reason))
    order: list[tuple[ModuleType, int]] = []
    step = 0
    for _ in range(rounds):
        for size in sizes:
            k = step % len(usable) if usable else 0
            for mod in usable[k:] + usable[:k]:
                order.append((mod, size))
            step += 1
    runs: list[tuple[ModuleType, int]] = []
    for mod, size in order:
        if size > mod.MAX_SIZE:
            skip = Skipped(
                system=mod.NAME,
                size=size,
                reason=f"larger than {mod.NAME}'s limit of {mod.MAX_SIZE} bytes",
            )
            if skip not in skipped:
                skipped.append(skip)
        elif size < min_size:
            skip = Skipped(system=mod.NAME, size=size, reason=f"needs at least {min_size} bytes")
            if skip not in skipped:
                skipped.append(skip)
        else:
            runs.append((mod, size))
    return skipped, runs


def _options_for(
    mod: ModuleType, options: Mapping[str, Mapping[str, Any]] | None
) -> dict[str, Any]:
    """The ``options`` parameter for ``mod``'s roles, if any were given."""
    if not options or mod.NAME not in options:
        return {}
    return {"options": dict(options[mod.NAME])}


def _check_rounds(rounds: int) -> None:
    if rounds < 1:
        raise ConfigError(f"rounds must be at least 1, not {rounds}")


def run_throughput(
    systems: Iterable[str],
    sizes: Iterable[int],
    *,
    count: int | None = None,
    duration: float | None = None,
    pin: str = "none",
    rounds: int = 1,
    progress: Progress | None = None,
    prefix: Sequence[str] = (),
    server_prefix: Sequence[str] | None = None,
    client_prefix: Sequence[str] | None = None,
    bind: str = "127.0.0.1",
    options: Mapping[str, Mapping[str, Any]] | None = None,
    rss_interval: float | None = None,
) -> list[Result]:
    """Throughput of each system at each size, sender and receiver in two processes.

    The sender sends as fast as it can, ``count`` messages or for
    ``duration`` seconds (with both, whichever ends first). ``prefix`` is
    put before each worker's argv; ``server_prefix`` / ``client_prefix``
    override it for the receiving / sending side, and ``bind`` is the address
    the receiving side listens on (the lab puts the two sides on the two
    hosts of a :class:`cmq.lab.netns.HostPair`: the prefixes are its
    ``command("b")`` and ``command("a")``, ``bind`` its ``addr_b``). ``options`` maps a
    system's name to keyword options its roles take (for ``cmq``:
    :class:`cmq.QueueConfig` fields such as ``qthresh`` and ``timeout``).
    With ``rss_interval`` the receiver's resident memory is sampled that
    often (``ThroughputResult.receiver_rss``), for memory-over-time figures.

    Returns skips first, then one result per run in the order they ran.
    Raises :class:`~cmq.ConfigError` on a bad argument (unknown system or
    pinning, size below 1, no count and no duration).
    """
    mods, size_list = _validate(systems, sizes)
    if count is None and duration is None:
        raise ConfigError("give a message count or a duration")
    if count is not None and count < 1:
        raise ConfigError(f"count must be at least 1, not {count}")
    if duration is not None and not duration > 0:
        raise ConfigError(f"duration must be above 0 seconds, not {duration}")
    if rss_interval is not None and not rss_interval > 0:
        raise ConfigError(f"rss_interval must be above 0 seconds, not {rss_interval}")
    _check_rounds(rounds)
    rcpu, scpu = cpus_for(pin)
    where = _where(prefix, server_prefix, client_prefix, bind)
    skipped, runs = _plan(mods, size_list, rounds)
    results: list[Result] = list(skipped)
    # Count mode has no time bound of its own: allow 20 s plus 10 µs a message.
    send_time = duration if duration is not None else 20.0 + 1e-5 * (count or 0)
    for i, (mod, size) in enumerate(runs):
        if progress is not None:
            progress(i, len(runs), f"throughput {mod.NAME} {size} B")
        idle = _IDLE_DATAGRAM if mod.DATAGRAM else _IDLE_STREAM
        deadline = _STARTUP + send_time + idle + 5.0
        try:
            recv, send, rss = _pair(
                mod,
                server_role="throughput_receiver",
                server_params={
                    "size": size,
                    "startup": _STARTUP,
                    "idle": idle,
                    "deadline": deadline,
                    "cpu": rcpu,
                    **_options_for(mod, options),
                },
                client_role="throughput_sender",
                client_params={
                    "size": size,
                    "count": count,
                    "duration": duration,
                    "cpu": scpu,
                    **_options_for(mod, options),
                },
                server_deadline=deadline,
                client_timeout=_READY_TIMEOUT + send_time + _GRACE,
                where=where,
                rss_interval=rss_interval,
            )
        except _RunError as exc:
            results.append(Failed(system=mod.NAME, size=size, error=str(exc)))
            continue
        results.append(
            ThroughputResult(
                system=mod.NAME,
                size=size,
                sent=int(send["sent"]),
                delivered=int(recv["delivered"]),
                seconds=(int(recv["last_ns"]) - int(recv["first_ns"])) / 1e9,
                pin=pin,
                sender=send,
                receiver=recv,
                receiver_rss=tuple(rss),
            )
        )
    if progress is not None:
        progress(len(runs), len(runs), "done")
    return results


def _run_round_trips(
    mode: str,
    systems: Iterable[str],
    sizes: Iterable[int],
    *,
    count: int,
    pin: str,
    timeout: float,
    window: int,
    rounds: int,
    progress: Progress | None,
    where: _Where,
    options: Mapping[str, Mapping[str, Any]] | None,
) -> list[Result]:
    mods, size_list = _validate(systems, sizes)
    if count < 1:
        raise ConfigError(f"count must be at least 1, not {count}")
    if not timeout > 0:
        raise ConfigError(f"timeout must be above 0 seconds, not {timeout}")
    if window < 1:
        raise ConfigError(f"window must be at least 1, not {window}")
    _check_rounds(rounds)
    rcpu, scpu = cpus_for(pin)
    # Ping-ping numbers its messages in their first 4 bytes.
    skipped, runs = _plan(mods, size_list, rounds, min_size=4 if mode == "pingping" else 1)
    results: list[Result] = list(skipped)
    # The worst case: every round trip lost, each waited out.
    client_time = count * timeout + 20.0
    client_params: dict[str, Any] = {"count": count, "timeout": timeout, "cpu": scpu}
    if mode == "pingping":
        client_params["window"] = window
    for i, (mod, size) in enumerate(runs):
        if progress is not None:
            progress(i, len(runs), f"{mode} {mod.NAME} {size} B")
        # The server must outwait the client's longest gap between messages.
        idle = max(5.0, 4 * timeout)
        deadline = _STARTUP + client_time + idle
        try:
            _, client, _ = _pair(
                mod,
                server_role=f"{mode}_server",
                server_params={
                    "size": size,
                    "startup": _STARTUP,
                    "idle": idle,
                    "deadline": deadline,
                    "cpu": rcpu,
                    **_options_for(mod, options),
                },
                client_role=f"{mode}_client",
                client_params={**client_params, "size": size, **_options_for(mod, options)},
                server_deadline=deadline,
                client_timeout=_READY_TIMEOUT + client_time,
                where=where,
            )
        except _RunError as exc:
            results.append(Failed(system=mod.NAME, size=size, error=str(exc)))
            continue
        results.append(
            RoundTripResult(
                system=mod.NAME,
                size=size,
                mode=mode,
                pin=pin,
                send_ns=tuple(client["send_ns"]),
                recv_ns=tuple(client["recv_ns"]),
                stale=int(client.get("stale", 0)),
                late=int(client.get("late", 0)),
            )
        )
    if progress is not None:
        progress(len(runs), len(runs), "done")
    return results


def run_pingpong(
    systems: Iterable[str],
    sizes: Iterable[int],
    *,
    count: int,
    pin: str = "none",
    timeout: float = 0.2,
    rounds: int = 1,
    progress: Progress | None = None,
    prefix: Sequence[str] = (),
    server_prefix: Sequence[str] | None = None,
    client_prefix: Sequence[str] | None = None,
    bind: str = "127.0.0.1",
    options: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[Result]:
    """Ping-pong (the next message after the reply) of ``count`` messages.

    A round trip without its reply after ``timeout`` seconds is lost and
    counted, and the next one starts. ``prefix``, ``server_prefix``,
    ``client_prefix``, ``bind`` and ``options`` are as for
    :func:`run_throughput` (the server is the receiving side). Returns skips first, then one
    :class:`RoundTripResult` (or :class:`Failed`) per run.
    Raises :class:`~cmq.ConfigError` on a bad argument.
    """
    return _run_round_trips(
        "pingpong",
        systems,
        sizes,
        count=count,
        pin=pin,
        timeout=timeout,
        window=1,
        rounds=rounds,
        progress=progress,
        where=_where(prefix, server_prefix, client_prefix, bind),
        options=options,
    )


def run_pingping(
    systems: Iterable[str],
    sizes: Iterable[int],
    *,
    count: int,
    pin: str = "none",
    timeout: float = 0.2,
    window: int = 16,
    rounds: int = 1,
    progress: Progress | None = None,
    prefix: Sequence[str] = (),
    server_prefix: Sequence[str] | None = None,
    client_prefix: Sequence[str] | None = None,
    bind: str = "127.0.0.1",
    options: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[Result]:
    """Ping-ping (asynchronous: up to ``window`` messages in flight).

    Each message's latency is its own send-to-reply time; sizes must be at
    least 4 bytes (the sequence number). Otherwise as :func:`run_pingpong`.
    """
    return _run_round_trips(
        "pingping",
        systems,
        sizes,
        count=count,
        pin=pin,
        timeout=timeout,
        window=window,
        rounds=rounds,
        progress=progress,
        where=_where(prefix, server_prefix, client_prefix, bind),
        options=options,
    )


@dataclass(frozen=True, kw_only=True)
class PushCostResult:
    """CPU time of one push that joins an open batch, on one core."""

    core: str
    """``"compiled"`` or ``"python"`` (see :func:`cmq.implementation`)."""
    call: str
    """``"push"`` (``q.push(dest, msg)``) or ``"sender"`` (``send = q.sender(dest); send(msg)``)."""
    size: int
    messages: int
    ns_per_msg: float
    """Best of the repeats, the calling loop included."""
    loop_ns: float
    """What the same loop costs calling a builtin (``len``) instead: the loop's own share."""

    def to_json(self) -> dict[str, Any]:
        """A JSON object of this measurement."""
        return {
            "core": self.core,
            "call": self.call,
            "size": self.size,
            "messages": self.messages,
            "ns_per_msg": round(self.ns_per_msg, 1),
            "loop_ns": round(self.loop_ns, 1),
        }


def run_push_cost(*, count: int = 1_000_000, size: int = 4, repeat: int = 3) -> list[PushCostResult]:
    """What a push costs the pushing thread when it joins an open batch, per core.

    A best-effort :class:`cmq.Queue` that never counts a destination idle
    and whose batches never time out pushes ``count`` messages to a socket
    that is never read: nearly every push joins an open batch, and the
    datagram a full batch makes (one per few thousand 4 B messages) is
    included. Timed in CPU time of the pushing thread, best of ``repeat``
    runs interleaved across the cores (both where the compiled core is built).
    Raises :class:`~cmq.ConfigError` on bad arguments.
    """
    import gc
    import socket
    from itertools import repeat as times

    import cmq
    from cmq import _impl

    if count < 1 or size < 1 or repeat < 1:
        raise ConfigError("count, size and repeat must be at least 1")
    cores = ["compiled", "python"] if _impl.available() else ["python"]
    payload = b"x" * size
    best: dict[tuple[str, str], float] = {}
    loop = math.inf
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sink:
        sink.bind(("127.0.0.1", 0))
        dest = sink.getsockname()
        for _ in range(repeat):
            for core in cores:
                with _impl.using(core), cmq.Queue(
                    port=0, host="127.0.0.1", delivery="best-effort", idle_gap=float("inf"), timeout=60.0
                ) as q:
                    send, push = q.sender(dest), q.push
                    for call in ("sender", "push"):
                        gc.collect()
                        t0 = time.thread_time_ns()
                        if call == "sender":
                            for m in times(payload, count):
                                send(m)
                        else:
                            for m in times(payload, count):
                                push(dest, m)
                        ns = (time.thread_time_ns() - t0) / count
                        best[core, call] = min(best.get((core, call), math.inf), ns)
            t0 = time.thread_time_ns()
            for m in times(payload, count):
                len(m)
            loop = min(loop, (time.thread_time_ns() - t0) / count)
    return [
        PushCostResult(core=core, call=call, size=size, messages=count, ns_per_msg=ns, loop_ns=loop)
        for (core, call), ns in best.items()
    ]


@dataclass(frozen=True, kw_only=True)
class DestinationsResult:
    """Cost per pushed message with messages spread over ``destinations``."""

    destinations: int
    messages: int
    size: int
    qthresh: int
    ns_per_msg: float
    """Best of the repeats, in CPU time: stream lookup, push, arm, take, final flush."""
    datagrams: int

    def to_json(self) -> dict[str, Any]:
        """A JSON object of this measurement."""
        return {
            "destinations": self.destinations,
            "messages": self.messages,
            "size": self.size,
            "qthresh": self.qthresh,
            "datagrams": self.datagrams,
            "ns_per_msg": round(self.ns_per_msg, 1),
        }


def run_destinations(
    destinations: Sequence[int] = (1, 100_000),
    *,
    per_destination: int = 10,
    size: int = 4,
    repeat: int = 3,
) -> list[DestinationsResult]:
    """Sans-IO micro-benchmark: does push cost grow with the number of destinations?

    For each entry of ``destinations`` (D), the same number of messages
    (``max(destinations) * per_destination``) is pushed round-robin to D
    distinct addresses through :class:`cmq.wire.batcher.Batcher` exactly as
    the driver does on a busy link (``stream``, ``push``, ``arm`` when a batch
    opens, ``filled`` and ``take`` when it is full), then everything left is flushed
    (``due`` at infinity, ``take``): the timed region covers every message
    from push to datagram bytes. No sockets, no clock in the loop.

    To compare like with like, ``qthresh`` is set so that a batch holds
    ``per_destination`` messages: then every D makes the same number of
    datagrams of the same size, and only the number of destinations
    differs (dict size, heap size, cache misses). For the same reason
    batches never grow (the virtual clock passes a timeout per batch) and
    the idle rule is left out (every batch is armed, as on a link that is
    never idle).
    Raises :class:`~cmq.ConfigError` on bad arguments.
    """
    import gc

    from cmq._config import QueueConfig
    from cmq.wire import batcher as _batcher
    from cmq.wire.frames import frame_size

    if not destinations or min(destinations) < 1:
        raise ConfigError("destinations must be a non-empty list of counts of at least 1")
    if per_destination < 1 or size < 1 or repeat < 1:
        raise ConfigError("per_destination, size and repeat must be at least 1")
    messages = max(destinations) * per_destination
    qthresh = per_destination * frame_size(size)
    config = QueueConfig(qthresh=qthresh)
    step = 2 * config.timeout
    payload = b"x" * size
    opened, full = _batcher.OPENED, _batcher.FULL
    orders = {
        d: [(f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}", 9000) for i in range(d)]
        for d in dict.fromkeys(destinations)
    }
    best = dict.fromkeys(orders, math.inf)
    datagrams = dict.fromkeys(orders, 0)

    def once(d: int) -> tuple[float, int]:
        addrs = orders[d]
        order = [addrs[i % d] for i in range(messages)]
        b = _batcher.Batcher(config, sender=1)
        stream, push, arm, filled, take = b.stream, b.push, b.arm, b.filled, b.take
        now = 0.0
        sent = 0
        gc.collect()
        # CPU time of this thread, not wall time: on a shared machine a run
        # descheduled for a while would otherwise look slow.
        t0 = time.thread_time_ns()
        for addr in order:
            s = stream(addr, 0)
            r = push(s, payload)
            if r == opened:
                arm(s, now)
            elif r == full:
                # The virtual clock moves on by more than a timeout per
                # batch, so filled() never grows a batch: every D keeps the
                # same batch size (see the docstring).
                now += step
                filled(s, now)
                sent += len(take(s, now))
        for s in b.due(math.inf):
            sent += len(take(s, now))
        return (time.thread_time_ns() - t0) / messages, sent

    # Repeats are interleaved across the counts, as runs of systems are, so
    # a busy spell on the machine does not fall on one count only.
    for _ in range(repeat):
        for d in orders:
            ns, datagrams[d] = once(d)
            best[d] = min(best[d], ns)
    results = [
        DestinationsResult(
            destinations=d,
            messages=messages,
            size=size,
            qthresh=qthresh,
            ns_per_msg=best[d],
            datagrams=datagrams[d],
        )
        for d in orders
    ]
    return results
