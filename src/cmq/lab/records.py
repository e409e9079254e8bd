"""Writing the lab's raw records: one :class:`RecordWriter` per run.

The tables and their schemas (what each row means, how the pipeline reads
them) are the pipeline's contract, :mod:`cmq.pipeline.schema`, re-exported
here for the experiments that write them. Files are written to a hidden
temporary name and renamed into place, so a reader (or Spark, which skips
names starting with ``.``) never sees half a file, and a run that crashes
leaves only whole parts behind.
"""

from __future__ import annotations

import json
import os
import re
import socket
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Literal

from cmq._errors import ConfigError
from cmq._extras import optional_imports
from cmq.pipeline.schema import (
    RECORDS_SCHEMA,
    RUNS_SCHEMA,
    SAMPLES_SCHEMA,
    TABLES,
    TOTALS_SCHEMA,
    read_table,
    table_paths,
)

with optional_imports("the lab"):
    import pyarrow as pa
    import pyarrow.parquet as pq

__all__ = [
    "DEFAULT_FLUSH_ROWS",
    "RECORDS_SCHEMA",
    "RUNS_SCHEMA",
    "SAMPLES_SCHEMA",
    "TABLES",
    "TOTALS_SCHEMA",
    "RecordWriter",
    "RunInfo",
    "RunStatus",
    "new_run_id",
    "params_json",
    "read_table",
    "table_paths",
]

#: Rows buffered per table before a Parquet part is written. 64k rows of the
#: records table are about 3 MB in memory and one ~1 MB file: few enough
#: files for Spark to list cheaply, small enough that a crash loses little.
DEFAULT_FLUSH_ROWS: Final = 65_536

RunStatus = Literal["ok", "skipped", "failed"]

# Run ids become file names: keep them to a safe alphabet.
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")

Params = Mapping[str, Any] | str | None


def new_run_id() -> str:
    """A fresh, sortable run id: UTC time to the second plus 8 random hex digits."""
    return f"{datetime.now(UTC):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:8]}"


def params_json(params: Params) -> str:
    """Canonical JSON of an experiment's parameters (sorted keys, no spaces).

    Canonical so that equal parameters are equal strings, and the pipeline can
    group by the string. ``None`` and ``{}`` both give ``"{}"``; a string is
    checked and re-encoded canonically.

    Raises:
        ConfigError: the parameters are not a JSON object of JSON values.
    """
    if params is None:
        return "{}"
    if isinstance(params, str):
        try:
            params = json.loads(params)
        except ValueError as exc:
            raise ConfigError(f"params is not valid JSON: {params!r}") from exc
        if not isinstance(params, dict):
            raise ConfigError(f"params must be a JSON object, got {params!r}")
    try:
        return json.dumps(dict(params), sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"params must hold JSON values: {params!r}") from exc


def _default_cores() -> int:
    # Cores this process may run on (taskset/cgroups), not the machine's count.
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


@dataclass(frozen=True, kw_only=True)
class RunInfo:
    """What is known about a run before it starts; one row of the runs table.

    Raises:
        ConfigError: on construction, for an empty experiment or system, a run
            id that is not a safe file name, a loss probability outside
            [0, 1], fewer than one core or unencodable versions/params.
    """

    experiment: str
    """Experiment id, e.g. ``"cmq-fig5"``; keys the report's sections."""
    system: str
    """System under test, e.g. ``"cmq"``, ``"zmq"``, ``"msgpack-rpc"``."""
    run_id: str = field(default_factory=new_run_id)
    """Unique id of the run; also the stem of its file names."""
    started_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    """When the run started (timezone-aware; stored as UTC)."""
    versions: Mapping[str, str] = field(default_factory=dict)
    """Versions of everything that matters: python, cmq, the peer library, server."""
    pin: str = "none"
    """CPU pinning, e.g. ``"none"``, ``"same-core:0"``, ``"cores:0,1"``."""
    loss: float = 0.0
    """Injected packet-loss probability (0 for none)."""
    host: str = field(default_factory=socket.gethostname)
    """Host name the run ran on."""
    cores: int = field(default_factory=_default_cores)
    """Cores available to the run."""
    params: Mapping[str, Any] = field(default_factory=dict)
    """Run-wide parameters (e.g. the message count); per-row params go with rows."""

    def __post_init__(self) -> None:
        if not self.experiment:
            raise ConfigError("RunInfo.experiment must not be empty")
        if not self.system:
            raise ConfigError("RunInfo.system must not be empty")
        if not _RUN_ID.match(self.run_id):
            raise ConfigError(
                f"RunInfo.run_id {self.run_id!r} must be 1-128 of [A-Za-z0-9_.-], not starting with . _ -"
            )
        if not 0.0 <= self.loss <= 1.0:
            raise ConfigError(f"RunInfo.loss must be a probability in [0, 1], got {self.loss}")
        if self.cores < 1:
            raise ConfigError(f"RunInfo.cores must be at least 1, got {self.cores}")
        if self.started_at.tzinfo is None:
            raise ConfigError("RunInfo.started_at must be timezone-aware")
        params_json(self.params)
        try:
            json.dumps(dict(self.versions), allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"RunInfo.versions must hold JSON values: {self.versions!r}") from exc


class _Buffer:
    """Column lists of one table, flushed to numbered Parquet parts."""

    def __init__(self, directory: Path, stem: str, schema: pa.Schema) -> None:
        self.directory = directory
        self.stem = stem
        self.schema = schema
        self.columns: dict[str, list[Any]] = {name: [] for name in schema.names}
        self.rows = 0
        self.parts = 0

    def flush(self) -> None:
        if not self.rows:
            return
        table = pa.Table.from_pydict(self.columns, schema=self.schema)
        _write_atomic(table, self.directory / f"{self.stem}-{self.parts:05d}.parquet")
        self.parts += 1
        self.rows = 0
        for column in self.columns.values():
            column.clear()


def _write_atomic(table: pa.Table, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(table, tmp, compression="zstd")
    os.replace(tmp, path)


class RecordWriter:
    """Buffers one run's rows and writes them as Parquet under ``out``.

    Use it as a context manager: on a clean exit the run row is written with
    status ``"ok"`` (or ``"skipped"`` after :meth:`skip`); if the block
    raises, the rows written so far are kept and the run is marked
    ``"failed"`` with the exception as reason (the exception propagates)::

        with RecordWriter(out, RunInfo(experiment="cmq-fig5", system="cmq")) as w:
            w.record(scenario="pingpong", size=64, seq=0, send_ns=t0, recv_ns=t1,
                     round_trip=True)
            w.record(scenario="pingpong", size=64, seq=1, send_ns=t2, recv_ns=None,
                     round_trip=True)                          # lost
            w.totals(scenario="throughput", size=64, sent=10**6, delivered=999_870,
                     duration_ns=2_100_000_000)

    Not thread-safe: one writer per run, used from one thread.

    Raises:
        ConfigError: ``flush_rows`` below 1.
    """

    def __init__(
        self, out: str | os.PathLike[str], run: RunInfo, *, flush_rows: int = DEFAULT_FLUSH_ROWS
    ) -> None:
        if flush_rows < 1:
            raise ConfigError(f"flush_rows must be at least 1, got {flush_rows}")
        self.out = Path(out)
        self.run = run
        self._flush_rows = flush_rows
        self._buffers = {
            name: _Buffer(self.out / name, run.run_id, schema)
            for name, schema in TABLES.items()
            if name != "runs"
        }
        self._status: RunStatus = "ok"
        self._reason = ""
        self._closed = False
        # Experiments pass the same params for thousands of rows: encode once.
        # The cache keeps a copy and compares by value: an id() is reused by
        # the next dict once one is freed, and a caller may mutate one dict
        # between rows; either way an identity check would hand out stale params.
        self._last_params: tuple[dict[str, Any], str] | None = None

    # -- rows -------------------------------------------------------------

    def _params(self, params: Params) -> str:
        if params is None or isinstance(params, str):
            return params_json(params)
        last = self._last_params
        if last is not None and last[0] == params:
            return last[1]
        encoded = params_json(params)
        self._last_params = (dict(params), encoded)
        return encoded

    def _append(self, name: str, row: Mapping[str, Any]) -> None:
        if self._closed:
            raise ConfigError("RecordWriter is closed")
        buffer = self._buffers[name]
        for key, column in buffer.columns.items():
            column.append(row[key])
        buffer.rows += 1
        if buffer.rows >= self._flush_rows:
            buffer.flush()

    def _keys(self, scenario: str, params: Params) -> dict[str, Any]:
        return {
            "experiment": self.run.experiment,
            "run_id": self.run.run_id,
            "system": self.run.system,
            "scenario": scenario,
            "params": self._params(params),
        }

    def record(
        self,
        *,
        size: int,
        seq: int,
        send_ns: int,
        recv_ns: int | None,
        scenario: str = "",
        params: Params = None,
        round_trip: bool = False,
        stream: str = "",
        receiver: str = "",
        request_ns: int | None = None,
    ) -> None:
        """Add one message's row; ``recv_ns=None`` records it as lost.

        ``stream`` names the sender/stream whose ``seq`` orders the messages
        and ``receiver`` the endpoint that received it (both for duplicate and
        out-of-order counting; leave empty for one sender and one receiver).

        Raises:
            ConfigError: the writer is closed, or ``params`` is not JSON.
        """
        row = self._keys(scenario, params)
        row.update(
            size=size,
            seq=seq,
            send_ns=send_ns,
            recv_ns=recv_ns,
            lost=recv_ns is None,
            round_trip=round_trip,
            stream=stream,
            receiver=receiver,
            request_ns=request_ns,
        )
        self._append("records", row)

    def record_many(
        self,
        *,
        size: int,
        seq: Sequence[int],
        send_ns: Sequence[int],
        recv_ns: Sequence[int | None],
        scenario: str = "",
        params: Params = None,
        round_trip: bool = False,
        stream: str = "",
        receiver: str = "",
        request_ns: Sequence[int | None] | None = None,
    ) -> None:
        """Add many messages of one (scenario, params, size) at once: the fast path.

        ``seq``, ``send_ns`` and ``recv_ns`` are parallel sequences (``None``
        in ``recv_ns`` marks a loss); so is ``request_ns`` when given (when
        each message was asked for, for pulled messages).

        Raises:
            ConfigError: the sequences differ in length, the writer is closed,
                or ``params`` is not JSON.
        """
        if self._closed:
            raise ConfigError("RecordWriter is closed")
        n = len(seq)
        if len(send_ns) != n or len(recv_ns) != n or (request_ns is not None
                                                     and len(request_ns) != n):
            raise ConfigError(
                f"seq, send_ns and recv_ns must have equal lengths, got {n}, {len(send_ns)}, {len(recv_ns)}"
            )
        keys = self._keys(scenario, params)
        buffer = self._buffers["records"]
        cols = buffer.columns
        for key, value in keys.items():
            cols[key].extend([value] * n)
        cols["size"].extend([size] * n)
        cols["seq"].extend(seq)
        cols["send_ns"].extend(send_ns)
        cols["recv_ns"].extend(recv_ns)
        cols["lost"].extend(r is None for r in recv_ns)
        cols["round_trip"].extend([round_trip] * n)
        cols["stream"].extend([stream] * n)
        cols["receiver"].extend([receiver] * n)
        cols["request_ns"].extend([None] * n if request_ns is None else request_ns)
        buffer.rows += n
        if buffer.rows >= self._flush_rows:
            buffer.flush()

    def totals(
        self,
        *,
        size: int,
        sent: int,
        delivered: int,
        duration_ns: int,
        scenario: str = "",
        params: Params = None,
    ) -> None:
        """Add an aggregate-only measurement: ``sent`` messages of ``size`` bytes,
        ``delivered`` of them arrived, in ``duration_ns``.

        Raises:
            ConfigError: a negative count, ``delivered > sent`` (duplicates
                belong in per-message records), a duration that is not
                positive, or the writer is closed.
        """
        if sent < 0 or delivered < 0 or delivered > sent:
            raise ConfigError(f"need 0 <= delivered <= sent, got sent={sent} delivered={delivered}")
        if duration_ns <= 0:
            raise ConfigError(f"duration_ns must be positive, got {duration_ns}")
        row = self._keys(scenario, params)
        row.update(size=size, sent=sent, delivered=delivered, duration_ns=duration_ns)
        self._append("totals", row)

    def sample(
        self,
        *,
        metric: str,
        value: float,
        x: float | None = None,
        t_ns: int | None = None,
        scenario: str = "",
        params: Params = None,
    ) -> None:
        """Add a numeric sample: e.g. ``metric="rss_bytes", t_ns=..., value=...``
        or ``metric="push_ns", x=destinations, value=ns_per_message``.

        Raises:
            ConfigError: empty ``metric``, or the writer is closed.
        """
        if not metric:
            raise ConfigError("sample metric must not be empty")
        row = self._keys(scenario, params)
        row.update(metric=metric, x=x, t_ns=t_ns, value=float(value))
        self._append("samples", row)

    # -- run status -------------------------------------------------------

    def skip(self, reason: str) -> None:
        """Mark the run skipped (a missing peer or server); ``reason`` says how
        to get it. The report lists it."""
        self._status = "skipped"
        self._reason = reason

    def fail(self, reason: str) -> None:
        """Mark the run failed; the report lists it with ``reason``."""
        self._status = "failed"
        self._reason = reason

    def flush(self) -> None:
        """Write every buffered row now (the run row is written by :meth:`close`)."""
        for buffer in self._buffers.values():
            buffer.flush()

    def close(self) -> None:
        """Flush the rows and write the run's metadata row. Idempotent."""
        if self._closed:
            return
        self.flush()
        self._closed = True
        run = self.run
        row = {
            "run_id": run.run_id,
            "experiment": run.experiment,
            "system": run.system,
            "started_at": run.started_at,
            "finished_at": datetime.now(UTC),
            "status": self._status,
            "skipped": self._status == "skipped",
            "reason": self._reason,
            "versions": json.dumps(dict(run.versions), sort_keys=True),
            "pin": run.pin,
            "loss": float(run.loss),
            "host": run.host,
            "cores": run.cores,
            "params": params_json(run.params),
        }
        table = pa.Table.from_pylist([row], schema=RUNS_SCHEMA)
        _write_atomic(table, self.out / "runs" / f"{run.run_id}.parquet")

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is not None:
            self.fail(f"{type(exc).__name__}: {exc}")
        self.close()
