"""The lab's record contract: the four tables every experiment writes and the pipeline reads.

The pipeline owns the contract (the lab writes what it says, through
:class:`cmq.lab.records.RecordWriter`); nothing here imports the lab.

Theory of operation
-------------------
A *run* is one system measured by one experiment in one process. It writes
rows into four tables, each a directory of Parquet files under the lab's
output directory ``OUT``:

``OUT/records/<run_id>-<part>.parquet``
    One row per message delivery (or loss): :data:`RECORDS_SCHEMA`. The
    latency of a row is ``recv_ns - send_ns``; when ``round_trip`` is true the
    two stamps are the sender's (send, reply received), so it is a round trip,
    else it is one way (both stamps from the same clock: same host). A lost
    message has ``recv_ns`` null and ``lost`` true. A duplicate delivery is a
    second row with the same ``(stream, receiver, seq)``; out-of-order is read
    from the order of ``recv_ns`` within one ``(stream, receiver)``.
``OUT/totals/<run_id>-<part>.parquet``
    Aggregate-only measurements: :data:`TOTALS_SCHEMA`, one row per
    (scenario, params, size) of a run: messages sent, delivered and the
    seconds (ns) it took. For throughput runs, where stamping every message
    would cost more than the message.
``OUT/samples/<run_id>-<part>.parquet``
    Free-form numeric series: :data:`SAMPLES_SCHEMA` (``metric``, ``x``,
    ``t_ns``, ``value``), for measurements that are not messages: receiver
    RSS over time, push cost against the number of destinations.
``OUT/runs/<run_id>.parquet``
    One row per run: :data:`RUNS_SCHEMA` (versions, CPU pinning, loss
    probability, host, cores, status and, for a skipped or failed run, why).

Throughput: the pipeline computes msgs/s and MB/s from ``totals`` rows when a
group has any (``delivered / duration``: the sender's own measured interval),
and otherwise from per-message records (``delivered / (last recv_ns - first
send_ns)`` per run). Its output says which source it used.

Timestamps are int64 nanoseconds end to end (pyarrow, never pandas: a nullable
int64 column through pandas turns into float64 and loses precision above
2**53 ns, about 104 days of ``time.monotonic_ns``).

Files are written to a hidden temporary name and renamed into place, so a
reader (or Spark, which skips names starting with ``.``) never sees half a
file, and a run that crashes leaves only whole parts behind.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from cmq._errors import ConfigError
from cmq._extras import optional_imports

with optional_imports("the lab"):
    import pyarrow as pa
    import pyarrow.parquet as pq

__all__ = [
    "RECORDS_SCHEMA",
    "RUNS_SCHEMA",
    "SAMPLES_SCHEMA",
    "TABLES",
    "TOTALS_SCHEMA",
    "read_table",
    "table_paths",
]

_KEYS: Final = [
    pa.field("experiment", pa.string(), nullable=False),
    pa.field("run_id", pa.string(), nullable=False),
    pa.field("system", pa.string(), nullable=False),
    pa.field("scenario", pa.string(), nullable=False),
    pa.field("params", pa.string(), nullable=False),
]

RECORDS_SCHEMA: Final = pa.schema(
    [
        *_KEYS,
        pa.field("size", pa.int64(), nullable=False),
        pa.field("seq", pa.int64(), nullable=False),
        pa.field("send_ns", pa.int64(), nullable=False),
        pa.field("recv_ns", pa.int64(), nullable=True),
        pa.field("lost", pa.bool_(), nullable=False),
        pa.field("round_trip", pa.bool_(), nullable=False),
        pa.field("stream", pa.string(), nullable=False),
        pa.field("receiver", pa.string(), nullable=False),
        pa.field("request_ns", pa.int64(), nullable=True),
    ]
)
"""One row per delivery or loss of one message (see the module docstring).
``request_ns``, when known, is when the receiver asked for the message (a
pull: the receive request's send time, same clock as ``recv_ns``); null for
pushed messages."""

TOTALS_SCHEMA: Final = pa.schema(
    [
        *_KEYS,
        pa.field("size", pa.int64(), nullable=False),
        pa.field("sent", pa.int64(), nullable=False),
        pa.field("delivered", pa.int64(), nullable=False),
        pa.field("duration_ns", pa.int64(), nullable=False),
    ]
)
"""Aggregate-only measurement of one (scenario, params, size) of a run."""

SAMPLES_SCHEMA: Final = pa.schema(
    [
        *_KEYS,
        pa.field("metric", pa.string(), nullable=False),
        pa.field("x", pa.float64(), nullable=True),
        pa.field("t_ns", pa.int64(), nullable=True),
        pa.field("value", pa.float64(), nullable=False),
    ]
)
"""A numeric sample that is not a message (RSS over time, cost against x)."""

RUNS_SCHEMA: Final = pa.schema(
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("experiment", pa.string(), nullable=False),
        pa.field("system", pa.string(), nullable=False),
        pa.field("started_at", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("finished_at", pa.timestamp("us", tz="UTC"), nullable=True),
        pa.field("status", pa.string(), nullable=False),
        pa.field("skipped", pa.bool_(), nullable=False),
        pa.field("reason", pa.string(), nullable=False),
        pa.field("versions", pa.string(), nullable=False),
        pa.field("pin", pa.string(), nullable=False),
        pa.field("loss", pa.float64(), nullable=False),
        pa.field("host", pa.string(), nullable=False),
        pa.field("cores", pa.int32(), nullable=False),
        pa.field("params", pa.string(), nullable=False),
    ]
)
"""One row per run: its environment and whether it ran, was skipped or failed."""

#: Every table, by the name of its directory under ``OUT``.
TABLES: Final[Mapping[str, pa.Schema]] = {
    "records": RECORDS_SCHEMA,
    "totals": TOTALS_SCHEMA,
    "samples": SAMPLES_SCHEMA,
    "runs": RUNS_SCHEMA,
}


def _parts(out: Path, name: str) -> list[Path]:
    directory = out / name
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.glob("*.parquet") if not p.name.startswith("."))


def read_table(out: str | os.PathLike[str], name: str) -> pa.Table:
    """Read one table (``"records"``, ``"totals"``, ``"samples"``, ``"runs"``)
    of ``out`` with pyarrow; an empty table when nothing was written.

    For small reads (tests, the report's metadata); the aggregates go
    through :mod:`cmq.pipeline.jobs` on Spark.

    Raises:
        ConfigError: an unknown table name.
    """
    if name not in TABLES:
        raise ConfigError(f"unknown table {name!r}; one of {sorted(TABLES)}")
    schema = TABLES[name]
    tables = [pq.read_table(p, schema=schema) for p in _parts(Path(out), name)]
    if not tables:
        return schema.empty_table()
    return pa.concat_tables(tables)


def table_paths(out: str | os.PathLike[str], name: str) -> list[str]:
    """The Parquet part files of one table of ``out`` (for Spark to read)."""
    return [str(p) for p in _parts(Path(out), name)]
