"""Scalability: push cost against the number of destinations, and receiver memory over time.

Push cost: the sans-IO micro-benchmark of cmq's batcher
(:func:`cmq.lab.runner.run_destinations`) pushes the same number of
messages round-robin to 1 ... ``max(profile.destinations)`` distinct
destinations, ``profile.push_repeats`` times, in a worker process of its
own (a million destinations take a few hundred MB, which should not stay
in the orchestrator). Samples ``metric="push_ns"``, ``x`` = destinations,
one per repeat.

Receiver memory: a cmq receiver drains a sender pushing 64-byte messages as
fast as it can for ``profile.rss_seconds`` (minutes in ``--full``), and
samples its own resident set size every ``profile.rss_interval`` seconds.
Samples ``metric="rss_bytes"`` (and ``"delivered"``, the running count),
with ``t_ns``. The paper reports an 80 KB Haskell heap over five hours;
we measure a whole Python process and test that it stops growing.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any, Final

import cmq
from cmq.lab.experiments import Context, LabExperiment, register
from cmq.lab.experiments._record import RunBook

__all__ = ["EXPERIMENT", "RSS_SIZE"]

#: Message size of the memory run: small messages stress per-message state.
RSS_SIZE: Final = 64
#: How long a worker may take to start and print READY (imports on a busy machine).
_READY_TIMEOUT: Final = 30.0
#: Beyond a role's own time, what it gets before it is killed.
_GRACE: Final = 30.0


class WorkerError(Exception):
    """A worker process failed; the message says how."""


class _Child:
    """One worker role in a child process, its ``TAG {json}`` lines read by a thread."""

    def __init__(self, role: str, params: dict[str, Any]) -> None:
        env = dict(os.environ)
        # Children import cmq from the same tree as this process.
        src = str(Path(cmq.__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
        self.role = role
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cmq.lab.experiments._worker", role, json.dumps(params)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._err: list[str] = []
        assert self.proc.stdout is not None and self.proc.stderr is not None
        threading.Thread(target=self._pump, args=(self.proc.stdout,), daemon=True).start()
        self._drain = threading.Thread(
            target=self._err.extend, args=(self.proc.stderr,), daemon=True
        )
        self._drain.start()

    def _pump(self, stream: IO[str]) -> None:
        for line in stream:
            self._lines.put(line)
        self._lines.put(None)

    def lines(self, timeout: float) -> Iterator[tuple[str, dict[str, Any]]]:
        """``(tag, value)`` of each line until ``RESULT`` (included).

        Raises:
            WorkerError: the process exited first, or ``timeout`` seconds passed.
        """
        end = time.monotonic() + timeout
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, end - time.monotonic()))
            except queue.Empty:
                raise WorkerError(
                    f"{self.role}: no result within {timeout:.0f} s{self._tail()}"
                ) from None
            if line is None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(timeout=5)
                raise WorkerError(
                    f"{self.role}: exited with code {self.proc.returncode}{self._tail()}"
                )
            tag, _, rest = line.partition(" ")
            if tag in ("READY", "SAMPLE", "RESULT"):
                yield tag, json.loads(rest)
                if tag in ("READY", "RESULT"):
                    return

    def _tail(self) -> str:
        self._drain.join(timeout=1)
        err = [ln.rstrip() for ln in self._err if ln.strip()]
        return (": " + " | ".join(err[-3:])) if err else ""

    def stop(self) -> None:
        """Kill the process if it still runs, and reap it."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


def _steps(ctx: Context) -> int:
    p = ctx.profile
    # The memory run samples at the start, every interval, and once at the end.
    return p.push_repeats * len(p.destinations) + round(p.rss_seconds / p.rss_interval) + 2


def _push_cost(ctx: Context, book: RunBook) -> None:
    p = ctx.profile
    params = {"destinations": list(p.destinations), "per_destination": p.per_destination, "size": 4,
              "repeat": p.push_repeats}  # fmt: skip
    child = _Child("destinations", params)
    try:
        # 10 µs per message is far above the batcher's cost on any machine.
        budget = (
            _GRACE
            + 1e-5 * max(p.destinations) * p.per_destination * len(p.destinations) * p.push_repeats
        )
        w = book.writer("cmq")
        for tag, value in child.lines(budget):
            if tag == "SAMPLE":
                w.sample(
                    scenario="push",
                    metric="push_ns",
                    x=float(value["destinations"]),
                    value=float(value["ns_per_msg"]),
                    params={"per_destination": p.per_destination, "size": value["size"]},
                )
                ctx.step(f"push cost, {value['destinations']:,} destinations")
    finally:
        child.stop()


def _memory(ctx: Context, book: RunBook) -> None:
    p = ctx.profile
    receiver = _Child(
        "rss-receiver",
        {
            "seconds": p.rss_seconds,
            "interval": p.rss_interval,
            "startup": _READY_TIMEOUT,
            "idle": 5.0,
        },
    )
    sender: _Child | None = None
    try:
        ready = dict(next(iter(receiver.lines(_READY_TIMEOUT)))[1])
        sender = _Child("rss-sender", {"peer": ready, "seconds": p.rss_seconds, "size": RSS_SIZE})
        w = book.writer("cmq")
        params = {"size": RSS_SIZE, "seconds": p.rss_seconds}
        result: dict[str, Any] = {}
        samples = 0
        for tag, value in receiver.lines(_READY_TIMEOUT + p.rss_seconds + _GRACE):
            if tag == "SAMPLE":
                w.sample(scenario="memory", metric="rss_bytes", t_ns=int(value["t_ns"]),
                         value=float(value["rss_bytes"]), params=params)  # fmt: skip
                w.sample(scenario="memory", metric="delivered", t_ns=int(value["t_ns"]),
                         value=float(value["delivered"]), params=params)  # fmt: skip
                samples += 1
                ctx.step(f"receiver memory, {samples * p.rss_interval:.0f} s")
            elif tag == "RESULT":
                result = value
        sent = dict(next(iter(sender.lines(_GRACE)))[1])
        if not result.get("delivered"):
            book.problem("cmq", f"memory run: the receiver got nothing ({result.get('stopped')})")
        else:
            ctx.say(
                f"scalability: receiver got {result['delivered']:,} of {sent.get('sent', 0):,} "
                f"messages in the memory run"
            )
    finally:
        for child in (sender, receiver):
            if child is not None:
                child.stop()


def _run(ctx: Context) -> None:
    with RunBook(ctx.out, EXPERIMENT.id, pin="none") as book:
        for part in (_push_cost, _memory):
            try:
                part(ctx, book)
            except WorkerError as exc:
                book.problem("cmq", str(exc))
                ctx.say(f"scalability: {exc}")


def destinations_label(values: Sequence[int]) -> str:
    """``1 .. 1,000,000`` for the summary."""
    return f"{min(values):,} .. {max(values):,}"


EXPERIMENT: Final = register(
    LabExperiment(
        id="scalability",
        title="Scalability: push cost against destinations, receiver memory",
        aliases=("scale", "memory"),
        order=40,
        run=_run,
        steps=_steps,
        multi_system=False,
    )
)
