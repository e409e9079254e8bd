"""Turning the runner's results into lab records: shared by the experiment modules.

The runner (:mod:`cmq.lab.runner`) returns plain result objects; these
helpers write them through :class:`~cmq.lab.records.RecordWriter` with the
run metadata the report shows (versions, pinning, loss), so every experiment
records the same way:

- a :class:`~cmq.lab.runner.RoundTripResult` becomes one row per round trip
  (``round_trip=True``, a lost one with ``recv_ns`` null), scenario
  ``"pingpong"`` / ``"pingping"`` unless the caller names another;
- a :class:`~cmq.lab.runner.ThroughputResult` becomes one totals row
  (scenario ``"throughput"``), its interval first to last delivery, as the
  runner counts;
- a :class:`~cmq.lab.runner.Skipped` of a whole system becomes a skipped
  run, a :class:`~cmq.lab.runner.Failed` (or a skip of one size) a note in
  the run's reason: a run that measured some sizes keeps its records but is
  marked failed, so the report shows both.
"""

from __future__ import annotations

import functools
import importlib.metadata
import platform
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Final

import cmq
from cmq.lab import runner
from cmq.lab.records import RecordWriter, RunInfo, params_json

__all__ = ["RunBook", "pin_label", "skip_all", "step_progress", "versions"]

# The Python distribution of each system's client library.
_PACKAGES: Final = {
    "zmq": ("pyzmq",),
    "nats": ("nats-py",),
    "rabbitmq": ("pika",),
    "msgpack-rpc": (),
}


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.cache
def versions(system: str) -> dict[str, str]:
    """Versions that matter for a run of ``system``: Python, cmq, the kernel
    and the system's client library."""
    out = {
        "python": platform.python_version(),
        "cmq": str(getattr(cmq, "__version__", "?")),
        "kernel": platform.release(),
    }
    for dist in _PACKAGES.get(system, ()):
        version = _dist_version(dist)
        if version is not None:
            out[dist] = version
    if system == "msgpack-rpc":
        out["msgpack-rpc-python"] = "own virtualenv (see cmq.lab.systems.msgpack_rpc)"
    return out


def pin_label(pin: str) -> str:
    """The runs table's pinning text: ``none``, ``same-core:0`` or ``cores:0,1``.

    Raises:
        ConfigError: an unknown pinning mode (see :func:`runner.cpus_for`).
    """
    rcpu, scpu = runner.cpus_for(pin)
    if rcpu is None or scpu is None:
        return "none"
    if rcpu == scpu:
        return f"same-core:{rcpu}"
    return f"cores:{rcpu},{scpu}"


@dataclass
class _Run:
    writer: RecordWriter
    problems: list[str] = field(default_factory=list)
    measured: int = 0


class RunBook:
    """One :class:`RecordWriter` per system of one experiment, opened on first use.

    ``with RunBook(out, "cmq-fig5", pin="none") as book: book.add(results)``;
    on exit every writer is closed with its status: ``skipped`` when the
    system was skipped, ``failed`` when any of its runs failed (its reason
    lists them), else ``ok``.

    Raises:
        ConfigError: on construction, an unknown pinning mode; on a system's
            first row, run metadata the records schema refuses (see
            :class:`~cmq.lab.records.RunInfo`).
    """

    def __init__(
        self,
        out: Path,
        experiment: str,
        *,
        pin: str = "none",
        loss: float = 0.0,
        params: Mapping[str, Any] | None = None,
    ) -> None:
        self.out = out
        self.experiment = experiment
        self.pin = pin_label(pin)
        self.loss = loss
        self.params = dict(params or {})
        self._runs: dict[str, _Run] = {}
        self.skips: dict[str, str] = {}
        self.failures: list[str] = []

    def _run(self, system: str, params: Mapping[str, Any] | None = None) -> _Run:
        run = self._runs.get(system)
        if run is None:
            info = RunInfo(
                experiment=self.experiment,
                system=system,
                versions=versions(system),
                pin=self.pin,
                loss=self.loss,
                params={**self.params, **(params or {})},
            )
            run = self._runs[system] = _Run(writer=RecordWriter(self.out, info))
        return run

    def open(self, system: str, params: Mapping[str, Any] | None = None) -> None:
        """Start ``system``'s run now, with run-wide ``params`` of its own."""
        self._run(system, params)

    def skip(self, system: str, reason: str) -> None:
        """Record that ``system`` was not run at all, and why."""
        self.skips.setdefault(system, reason)
        self._run(system)

    def add(
        self,
        results: Iterable[runner.Result],
        *,
        scenario: str | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> None:
        """Write the runner's results: records, totals, skips and failures.

        ``scenario`` overrides the row scenario (default: the round-trip mode,
        or ``"throughput"``); ``params`` go with every row.
        """
        # Encoded once, as a string: the writer keeps it as is for every row.
        row_params = params_json(params)
        for r in results:
            if isinstance(r, runner.Skipped):
                if r.size is None:
                    self.skip(r.system, r.reason)
                else:
                    self._run(r.system).problems.append(f"{r.size} B skipped: {r.reason}")
            elif isinstance(r, runner.Failed):
                text = f"{r.size} B failed: {r.error}"
                self._run(r.system).problems.append(text)
                self.failures.append(f"{self.experiment} {r.system} {text}")
            elif isinstance(r, runner.RoundTripResult):
                run = self._run(r.system)
                run.writer.record_many(
                    scenario=scenario or r.mode,
                    params=row_params,
                    size=r.size,
                    seq=range(r.sent),
                    send_ns=r.send_ns,
                    recv_ns=[t if t >= 0 else None for t in r.recv_ns],
                    round_trip=True,
                )
                run.measured += 1
            elif isinstance(r, runner.ThroughputResult):
                self._throughput(r, scenario or "throughput", row_params)

    def _throughput(self, r: runner.ThroughputResult, scenario: str, params: str) -> None:
        run = self._run(r.system)
        duration = round(r.seconds * 1e9)
        if r.delivered < 2 or duration <= 0:
            text = f"{r.size} B: {r.delivered} of {r.sent} delivered, no rate to measure"
            run.problems.append(text)
            self.failures.append(f"{self.experiment} {r.system} {text}")
            return
        # A receiver that counted more than was sent saw duplicates; the
        # totals table cannot hold that, so cap it and say so.
        delivered = min(r.delivered, r.sent)
        if delivered < r.delivered:
            run.problems.append(f"{r.size} B: {r.delivered - r.sent} more delivered than sent")
        run.writer.totals(
            scenario=scenario,
            params=params,
            size=r.size,
            sent=r.sent,
            delivered=delivered,
            duration_ns=duration,
        )
        run.measured += 1

    def writer(self, system: str, params: Mapping[str, Any] | None = None) -> RecordWriter:
        """The writer of ``system``'s run (for samples and custom rows)."""
        run = self._run(system, params)
        run.measured += 1
        return run.writer

    def problem(self, system: str, text: str) -> None:
        """Note a failed part of ``system``'s run (it is marked failed)."""
        self._run(system).problems.append(text)
        self.failures.append(f"{self.experiment} {system} {text}")

    def close(self) -> None:
        """Close every writer with its status."""
        for system, run in self._runs.items():
            if system in self.skips and not run.measured:
                run.writer.skip(self.skips[system])
            elif run.problems:
                run.writer.fail("; ".join(run.problems)[:2000])
            run.writer.close()
        self._runs.clear()

    def __enter__(self) -> RunBook:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is not None:
            # Whatever was measured stays; every run of the experiment says
            # it broke, and why.
            for run in self._runs.values():
                run.problems.append(f"{type(exc).__name__}: {exc}")
        self.close()


def step_progress(step: Callable[[str], None]) -> runner.Progress:
    """A runner progress callback that advances ``step`` once per finished run."""
    state = {"done": 0}

    def progress(done: int, _total: int, label: str) -> None:
        while state["done"] < done:
            state["done"] += 1
            step(label)

    return progress


def skip_all(book: RunBook, systems: Sequence[str], reason: str) -> None:
    """Mark every system of an experiment skipped for one reason."""
    for s in systems:
        book.skip(s, reason)
