"""A Spark data source for cmq: ``format("cmq")`` to read and to write.

Reading::

    from cmq.pipeline.source import SpoolReceiver, register
    register(spark)
    with SpoolReceiver("/data/spool", port=5555) as rx:        # outlives every task
        df = spark.readStream.format("cmq").option("spool", "/data/spool").load()

    # or let the source start its own receiver (in the query's planning process):
    df = spark.readStream.format("cmq").option("port", 5555).load()

Each row is one received message: ``sender`` ("host:port"), ``sender_id``,
``mailbox``, ``seq`` (the datagram sequence number of the sender's
stream), ``payload`` (binary), ``received_at`` (timestamp) and
``received_ns`` (int64 ns, wall clock when the spool receiver took the
message from its queue: cmq does not stamp arrivals).

Writing: ``df.writeStream.format("cmq").option("dest", "host:port")`` (or
``df.write``...) pushes each row's ``payload`` column (binary or string; the
first column if there is no ``payload``) to ``dest``, mailbox
``option("mailbox")``.

Theory of operation
-------------------
Spark runs a Python source's planning methods in one long-lived Python
process per query and its ``read()`` in executor workers; neither is the
driver, and no task lives as long as the stream. So messages are received by
a :class:`SpoolReceiver`, a cmq :class:`~cmq.Queue` with a thread that appends
every message to an append-only log, ``SPOOL/messages.log``, and after each
write publishes the log's committed length in ``SPOOL/offset``. An offset is
a byte position in that log: the planner reads ``SPOOL/offset`` for the
latest offset, splits ``[start, end)`` at record boundaries into partitions,
and ``read()`` parses one byte range. On a cluster the spool must be on a
file system the executors share.

Log record: 4-byte big-endian length, then a MessagePack array ``[host,
port, sender_id, mailbox, seq, received_ns, payload]``.

Delivery semantics
------------------
*At most once* from the network into the spool: cmq is UDP without a
reliability layer, so a datagram lost on the way, or dropped by a full
receive queue, never reaches the spool. Nothing is lost silently: every drop
cmq sees is counted in the receiver's ``stats()`` (and in
``SPOOL/stats.json``), and the kernel's own drops where Linux reports them.
From the spool on, the log is replayable by offset, so a query restarted from
its checkpoint rereads the same rows: exactly once into a sink whose writes
are idempotent by batch id, at least once otherwise. The cmq *sink* is at
most once (UDP again): its commit messages count what each task sent and what
its endpoint dropped.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

import msgpack

from cmq._errors import Closed, ConfigError, Timeout

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

__all__ = [
    "SCHEMA",
    "CmqDataSource",
    "SendResult",
    "SpoolReceiver",
    "main",
    "read_spool",
    "register",
]

SCHEMA: Final = (
    "sender STRING, sender_id BIGINT, mailbox INT, seq BIGINT, payload BINARY, "
    "received_at TIMESTAMP, received_ns BIGINT"
)
LOG_NAME: Final = "messages.log"
OFFSET_NAME: Final = "offset"
STATS_NAME: Final = "stats.json"
_LEN: Final = struct.Struct(">I")
#: Messages the receiver writes per log append: bounds the latency a burst
#: adds before its first messages become visible to Spark.
_SPOOL_BATCH: Final = 4096
#: How long the receiver thread waits for a message before checking whether
#: it should stop (a bound on close(), not a poll of the socket: get_message
#: blocks in the kernel).
_WAIT: Final = 0.1
#: Bytes of log per Spark partition of one micro-batch.
DEFAULT_PARTITION_BYTES: Final = 16 * 1024 * 1024


def _payload_bytes(payload: Any) -> bytes:
    if isinstance(payload, bytes):
        return payload
    if isinstance(payload, bytearray | memoryview):
        return bytes(payload)
    if isinstance(payload, str):
        return payload.encode("utf-8")
    # A msgpack-codec queue hands back decoded values: store their encoding.
    return msgpack.packb(payload, use_bin_type=True)  # type: ignore[no-any-return]


# -- the spool ------------------------------------------------------------


class SpoolReceiver:
    """A cmq endpoint whose received messages are appended to a spool log.

    Start it where it outlives the stream (the driver, or a process of its
    own: ``python -m cmq.pipeline.source --port P --spool DIR``) and point
    ``readStream.format("cmq").option("spool", DIR)`` at the directory.

    Raises:
        ConfigError: a bad option for the queue.
        TransportError: the port is in use.
    """

    def __init__(
        self,
        spool: str | os.PathLike[str],
        *,
        port: int = 0,
        host: str = "127.0.0.1",
        mailbox: int = 0,
        **queue_options: Any,
    ) -> None:
        from cmq.net.queue import Queue

        self.spool = Path(spool)
        self.spool.mkdir(parents=True, exist_ok=True)
        self.mailbox = mailbox
        self._queue = Queue(port=port, host=host, **queue_options)
        self._log = open(self.spool / LOG_NAME, "ab")  # noqa: SIM115 - closed in close()
        self._offset = self._log.tell()
        self._spooled = 0
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._publish()
        self._thread = threading.Thread(target=self._run, name=f"cmq-spool-{port}", daemon=True)
        self._thread.start()

    @property
    def address(self) -> tuple[str, int]:
        """The (host, port) senders push to."""
        return self._queue.address

    @property
    def spooled(self) -> int:
        """Messages written to the log since this receiver started."""
        with self._cond:
            return self._spooled

    def stats(self) -> dict[str, Any]:
        """The queue's counters (``messages_received``, ``dropped``, ...) plus
        ``spooled`` and the log's committed ``offset``."""
        with self._cond:
            out = self._queue.stats().as_dict() if not self._queue.closed else {}
            out.update(spooled=self._spooled, offset=self._offset)
            return out

    def wait_spooled(self, count: int, timeout: float) -> bool:
        """Block until at least ``count`` messages are spooled or ``timeout``
        seconds pass; returns whether they were."""
        with self._cond:
            return self._cond.wait_for(lambda: self._spooled >= count, timeout)

    def _run(self) -> None:
        q = self._queue
        while not self._stop.is_set():
            try:
                first = q.get_message(timeout=_WAIT, mailbox=self.mailbox)
            except Timeout:
                continue
            except Closed:
                return
            batch = [first]
            while len(batch) < _SPOOL_BATCH:
                m = q.pop_message(self.mailbox)
                if m is None:
                    break
                batch.append(m)
            now = time.time_ns()
            chunks = []
            for m in batch:
                host, port = m.sender[0], m.sender[1]
                body = msgpack.packb(
                    [host, port, m.sender_id, m.mailbox, m.seq, now, _payload_bytes(m.payload)],
                    use_bin_type=True,
                )
                chunks.append(_LEN.pack(len(body)))
                chunks.append(body)
            self._log.write(b"".join(chunks))
            self._log.flush()
            with self._cond:
                self._offset = self._log.tell()
                self._spooled += len(batch)
                self._cond.notify_all()
            self._publish()

    def _publish(self) -> None:
        # Readers in other processes learn the committed length from this
        # file, replaced atomically, never from the log's size (which may
        # include a record being written).
        with self._cond:
            offset, stats = self._offset, self.stats()
        _atomic_write(self.spool / OFFSET_NAME, str(offset))
        _atomic_write(self.spool / STATS_NAME, json.dumps(stats, sort_keys=True))

    def close(self) -> None:
        """Stop receiving, write the final counters and close the log. Idempotent."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join()
        self._publish()
        self._queue.close()
        self._log.close()

    def __enter__(self) -> SpoolReceiver:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{threading.get_ident()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def committed_offset(spool: str | os.PathLike[str]) -> int:
    """The spool log's committed length in bytes (0 before the first message)."""
    try:
        return int((Path(spool) / OFFSET_NAME).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return 0


def read_spool(spool: str | os.PathLike[str], start: int, end: int) -> Iterator[tuple[Any, ...]]:
    """Rows of the log's records in ``[start, end)`` (``start`` and ``end``
    must be record boundaries), in the column order of :data:`SCHEMA`.

    Raises:
        ConfigError: the range does not end on a record boundary (a corrupt
            spool or offsets from another spool).
    """
    from datetime import UTC, datetime

    if end <= start:
        return
    with open(Path(spool) / LOG_NAME, "rb") as f:
        f.seek(start)
        data = f.read(end - start)
    pos = 0
    while pos < len(data):
        if pos + _LEN.size > len(data):
            raise ConfigError(f"spool record header cut at byte {start + pos}")
        (n,) = _LEN.unpack_from(data, pos)
        pos += _LEN.size
        if pos + n > len(data):
            raise ConfigError(f"spool record cut at byte {start + pos}")
        host, port, sender_id, mailbox, seq, received_ns, payload = msgpack.unpackb(
            data[pos : pos + n], raw=False
        )
        pos += n
        received_at = datetime.fromtimestamp(received_ns / 1e9, tz=UTC)
        yield (f"{host}:{port}", sender_id, mailbox, seq, payload, received_at, received_ns)


def _split(spool: Path, start: int, end: int, max_bytes: int) -> list[tuple[int, int]]:
    # Cut [start, end) at record boundaries into ranges of about max_bytes,
    # reading only the 4-byte headers.
    if end - start <= max_bytes:
        return [(start, end)] if end > start else []
    ranges = []
    with open(spool / LOG_NAME, "rb") as f:
        lo = pos = start
        while pos < end:
            f.seek(pos)
            (n,) = _LEN.unpack(f.read(_LEN.size))
            pos += _LEN.size + n
            if pos - lo >= max_bytes or pos >= end:
                ranges.append((lo, pos))
                lo = pos
    return ranges


# -- the Spark data source -------------------------------------------------


def _options(options: Mapping[str, str]) -> dict[str, str]:
    # Spark hands options in a case-insensitive map with lower-cased keys;
    # keep that contract explicit in a plain dict.
    return {str(k).lower(): str(v) for k, v in options.items()}


def _int_option(options: Mapping[str, str], name: str, default: int) -> int:
    raw = options.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError as exc:
        raise ConfigError(f"option {name!r} must be an integer, got {raw!r}") from exc


@dataclass
class _Range(InputPartition):
    start: int
    end: int


class _StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: Mapping[str, str]) -> None:
        self.options = options
        self.max_bytes = _int_option(options, "maxpartitionbytes", DEFAULT_PARTITION_BYTES)
        spool = options.get("spool")
        self.port = _int_option(options, "port", -1)
        if spool is None and self.port < 0:
            raise ConfigError(
                "format('cmq') needs option 'spool' (a SpoolReceiver's directory) or 'port'"
            )
        if spool is None:
            host = options.get("host", "127.0.0.1")
            spool = os.path.join(tempfile.gettempdir(), f"cmq-spool-{host}-{self.port}")
        self.spool = Path(spool)
        self._receiver: SpoolReceiver | None = None
        self._target: int | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Pickled to the workers: the receiver (socket, thread) stays here.
        state = self.__dict__.copy()
        state["_receiver"] = None
        return state

    def _ensure_receiver(self) -> None:
        # Only with 'port' and no external spool: receive in this planning
        # process, which lives as long as the query.
        if self._receiver is None and self.options.get("spool") is None:
            self._receiver = SpoolReceiver(
                self.spool,
                port=self.port,
                host=self.options.get("host", "127.0.0.1"),
                mailbox=_int_option(self.options, "mailbox", 0),
            )

    def initialOffset(self) -> dict[str, int]:
        self._ensure_receiver()
        start = (
            0
            if self.options.get("startingoffsets", "earliest") == "earliest"
            else committed_offset(self.spool)
        )
        return {"offset": start}

    def prepareForTriggerAvailableNow(self) -> None:
        self._ensure_receiver()
        self._target = committed_offset(self.spool)

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadAllAvailable()

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        self._ensure_receiver()
        latest = committed_offset(self.spool)
        if self._target is not None:
            latest = min(latest, self._target)
        return {"offset": max(latest, start["offset"])}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        return [
            _Range(lo, hi)
            for lo, hi in _split(self.spool, start["offset"], end["offset"], self.max_bytes)
        ]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, _Range)
        return read_spool(self.spool, partition.start, partition.end)

    def commit(self, end: dict[str, int]) -> None:
        # The log is kept: it is what makes a restarted query replayable.
        return None

    def stop(self) -> None:
        if self._receiver is not None:
            self._receiver.close()
            self._receiver = None


@dataclass
class SendResult(WriterCommitMessage):
    """What one write task did: messages pushed and messages its endpoint dropped."""

    sent: int
    dropped: int


def _send_rows(options: Mapping[str, str], rows: Iterator[Any]) -> SendResult:
    from cmq.net.queue import Queue

    dest = options.get("dest")
    if not dest:
        raise ConfigError("format('cmq') as a sink needs option 'dest' (host:port)")
    mailbox = _int_option(options, "mailbox", 0)
    sent = 0
    with Queue(port=0, host=options.get("bind", "0.0.0.0"), codec="raw") as q:
        for row in rows:
            value = row["payload"] if "payload" in row.__fields__ else row[0]
            q.push(dest, _payload_bytes(value), mailbox=mailbox)
            sent += 1
        q.flush()
        dropped = q.stats().total_dropped
    return SendResult(sent=sent, dropped=dropped)


class _StreamWriter(DataSourceStreamWriter):
    def __init__(self, options: Mapping[str, str]) -> None:
        self.options = options

    def write(self, iterator: Iterator[Any]) -> SendResult:
        return _send_rows(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        # At most once: there is nothing to make durable or to undo.
        return None

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        return None


class _BatchWriter(DataSourceWriter):
    def __init__(self, options: Mapping[str, str]) -> None:
        self.options = options

    def write(self, iterator: Iterator[Any]) -> SendResult:
        return _send_rows(self.options, iterator)


class CmqDataSource(DataSource):
    """``format("cmq")``: a streaming source of received cmq messages and a
    (batch and streaming) sink that pushes rows to a cmq destination.

    Options: ``spool`` (directory of a :class:`SpoolReceiver`) or ``port``
    (+ ``host``, ``mailbox``) to receive; ``startingOffsets`` ``earliest``
    (default) or ``latest``; ``maxPartitionBytes``. Sink: ``dest``,
    ``mailbox``, ``bind``.
    """

    @classmethod
    def name(cls) -> str:
        return "cmq"

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return _StreamReader(_options(self.options))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return _StreamWriter(_options(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return _BatchWriter(_options(self.options))


def register(spark: SparkSession) -> None:
    """Make ``format("cmq")`` available in ``spark``."""
    spark.dataSource.register(CmqDataSource)


def main(argv: Sequence[str] | None = None) -> int:
    """Run a :class:`SpoolReceiver` until SIGINT or SIGTERM."""
    parser = argparse.ArgumentParser(
        prog="python -m cmq.pipeline.source", description=SpoolReceiver.__doc__
    )
    parser.add_argument("--spool", required=True, type=Path)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--mailbox", type=int, default=0)
    args = parser.parse_args(argv)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    with SpoolReceiver(args.spool, port=args.port, host=args.host, mailbox=args.mailbox) as rx:
        print(
            f"spooling {rx.address[0]}:{rx.address[1]} into {args.spool}",
            file=sys.stderr,
            flush=True,
        )
        try:
            done.wait()
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
