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
``option("mailbox")``. Sink options: ``delivery`` (``"reliable"``,
``"unordered"``, ``"best-effort"``), ``drainTimeout`` (seconds),
``maxDatagram`` (bytes; 1472 keeps each datagram in one Ethernet frame on a
lossy path), ``bind``.

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
*Into the spool.* What holds is chosen by the *sender*'s ``delivery``
(every cmq endpoint receives all three modes). From a ``"reliable"`` sender
(cmq's default) every message reaches the spool exactly once and in push
order per sender stream (sender, spool address, mailbox), through loss,
reordering and duplication on the network, as long as the spool receiver
lives; a message cmq cannot confirm is reported to the sender
(``Queue.failures()``, ``stats().in_doubt``), never dropped silently.
``"unordered"`` gives the same but in arrival order; ``"best-effort"`` is
at most once (UDP), and what cmq sees missing is counted
(``datagrams_missing``, ``dropped``, ``kernel_drops`` in the receiver's
``stats()`` and ``SPOOL/stats.json``).

*If the spool receiver dies.* Its endpoint acknowledges a message when the
message arrives in its queue, before the spool thread writes it. A receiver
killed at the wrong moment therefore loses, without the sender hearing of
it, what it had acknowledged and not yet written: the messages waiting in
its queue (at most ``max_buffered_bytes``, 4 MiB by default, which its
credit keeps senders under) and the one batch the thread is writing. What
it had not acknowledged the sender reports in doubt (``"peer_dead"`` after
its probes go unanswered, or ``"peer_reset"`` when a restarted receiver
answers), without sending it again. What was written survives the process
(the log is flushed to the operating system after every batch, not
``fsync``-ed: a machine crash can lose the last writes); a record torn by
the kill is cut off when a receiver next opens the spool.

*From the spool on,* the log is replayable by offset, so a query restarted
from its checkpoint rereads the same rows: exactly once into a sink whose
writes are idempotent by batch id, at least once otherwise.

*The sink* pushes reliably by default (option ``delivery``) and each task
waits, after pushing its rows, until the destination has acknowledged all of
them (``drainTimeout`` seconds, 30 by default). When some are not confirmed
in time, or the receiver stops answering or restarts, the task fails with an
error saying how many, so Spark runs it again: at least once into the
receiving endpoint (a retried task sends all its rows again, including those
that arrived). Spark retries a failed task ``spark.task.maxFailures`` times
(4 on a cluster; local mode does not retry unless the master is
``local[N,F]``). A task's commit message (:class:`SendResult`) counts what
it sent, what was confirmed and what its endpoint dropped.
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

from cmq._config import DEFAULT_DELIVERY, DEFAULT_MAX_DATAGRAM
from cmq._errors import Closed, CmqError, ConfigError, Timeout
from cmq._extras import optional_imports
from cmq._types import Message

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

with optional_imports("the Spark pipeline"):
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
_DELIVERIES: Final = ("reliable", "unordered", "best-effort")
#: Received messages the spool receiver's endpoint holds before its thread
#: writes them (cmq's max_buffered_bytes). The endpoint acknowledges a
#: message when it arrives, not when it is written, so this is the most a
#: crash of the receiver process can lose unreported; credit, which follows
#: what the thread has taken, keeps senders under it. 4 MiB is still many
#: round trips of a fast sender's output.
DEFAULT_SPOOL_BUFFERED: Final = 4 * 1024 * 1024
#: How long a sink task waits, after pushing its rows, for the destination
#: to acknowledge them before it fails (and Spark retries it). A live
#: receiver acknowledges within milliseconds, and repairs under a few per
#: cent loss take a few round trips; a dead one is declared dead by cmq's
#: probes within about 3-5 s, which this leaves room for.
DEFAULT_DRAIN_TIMEOUT: Final = 30.0
#: What a sink task's error says for each reason a message is in doubt.
_WHY: Final = {
    "closed": "no acknowledgement within drainTimeout",
    "peer_dead": "the receiver stopped answering",
    "peer_reset": "the receiver restarted",
}


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

    With reliable senders (cmq's default) the log holds every message once,
    in push order per sender stream, while this receiver lives; if its
    process dies, what it had acknowledged but not yet written (at most
    ``max_buffered_bytes`` and one write batch) is lost unreported, and what
    it had not acknowledged is reported to the senders in doubt (see the
    module's "Delivery semantics"). Opening a spool cuts off a record torn
    by such a death (:attr:`recovered` says how many bytes).

    ``delivery`` is this endpoint's own mode (``"reliable"`` by default),
    for what it sends; what it receives is delivered as each sender's mode
    says. ``max_buffered_bytes`` and the other keyword options are
    :class:`cmq.QueueConfig` fields.

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
        delivery: str = DEFAULT_DELIVERY,
        max_buffered_bytes: int = DEFAULT_SPOOL_BUFFERED,
        **queue_options: Any,
    ) -> None:
        from cmq.net.queue import Queue

        self.spool = Path(spool)
        self.spool.mkdir(parents=True, exist_ok=True)
        self.mailbox = mailbox
        self.recovered = _recover(self.spool)
        self._queue = Queue(
            port=port,
            host=host,
            delivery=delivery,
            max_buffered_bytes=max_buffered_bytes,
            **queue_options,
        )
        try:
            self._log = open(self.spool / LOG_NAME, "ab")  # noqa: SIM115 - closed in close()
        except BaseException:
            self._queue.close()
            raise
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
            out = self._queue.stats().as_dict()  # final counters after close too
            out.update(spooled=self._spooled, offset=self._offset)
            return out

    def wait_spooled(self, count: int, timeout: float) -> bool:
        """Block until at least ``count`` messages are spooled or ``timeout``
        seconds pass; returns whether they were."""
        with self._cond:
            return self._cond.wait_for(lambda: self._spooled >= count, timeout)

    def _run(self) -> None:
        # Signals go to the main thread (see the I/O thread of cmq.Queue).
        signal.pthread_sigmask(signal.SIG_BLOCK, (signal.SIGINT, signal.SIGTERM))
        q = self._queue
        while not self._stop.is_set():
            try:
                first = q.get_message(timeout=_WAIT, mailbox=self.mailbox)
            except Timeout:
                continue
            except Closed:
                return
            self._write([first, *q.pop_many_messages(_SPOOL_BATCH - 1, self.mailbox)])

    def _write(self, batch: list[Message]) -> None:
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
        """Stop receiving, write every message received so far, the final
        counters, and close the log. Idempotent."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join()
        # Close the endpoint first (it acknowledges what it received), then
        # write everything it still holds: a clean close loses nothing it
        # acknowledged.
        self._queue.close()
        while True:
            try:
                rest = self._queue.pop_many_messages(_SPOOL_BATCH, self.mailbox)
            except Closed:
                break
            if not rest:
                break
            self._write(rest)
        self._publish()
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


def _recover(spool: Path) -> int:
    """Cut a torn record off the end of the log (a receiver killed while
    writing), so that appends start at a record boundary; returns the bytes
    cut. Complete records after the published offset are kept (they were
    written, only the offset file lagged) and the offset is republished on
    start."""
    path = spool / LOG_NAME
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return 0
    pos = min(committed_offset(spool), size)
    with open(path, "rb") as f:
        while pos + _LEN.size <= size:
            f.seek(pos)
            (n,) = _LEN.unpack(f.read(_LEN.size))
            if pos + _LEN.size + n > size:
                break
            pos += _LEN.size + n
    if pos < size:
        os.truncate(path, pos)
    return size - pos


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
                delivery=_delivery_option(self.options),
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
    """What one write task did: messages pushed (``sent``), messages the
    destination acknowledged (``confirmed``; 0 with ``delivery``
    ``"best-effort"``, which has no acknowledgements) and messages its
    endpoint dropped."""

    sent: int
    confirmed: int
    dropped: int


def _delivery_option(options: Mapping[str, str]) -> str:
    delivery = options.get("delivery", DEFAULT_DELIVERY)
    if delivery not in _DELIVERIES:
        raise ConfigError(
            f"option 'delivery' must be one of {', '.join(_DELIVERIES)}, got {delivery!r}"
        )
    return delivery


def _float_option(options: Mapping[str, str], name: str, default: float) -> float:
    raw = options.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError as exc:
        raise ConfigError(f"option {name!r} must be a number, got {raw!r}") from exc
    if not value >= 0:  # also refuses NaN
        raise ConfigError(f"option {name!r} must not be negative, got {raw!r}")
    return value


def _send_rows(options: Mapping[str, str], rows: Iterator[Any]) -> SendResult:
    """Push ``rows`` to the sink's ``dest`` and, in the reliable modes, wait
    until the destination has acknowledged every one.

    Raises:
        ConfigError: a missing or bad option.
        Timeout: some messages were not confirmed within ``drainTimeout``
            seconds (or their receiver was declared dead, or restarted):
            the task fails, and Spark runs it again (at least once).
        WouldBlock: the send buffer stayed full for ``push_timeout``.
    """
    from cmq.net.queue import Queue

    dest = options.get("dest")
    if not dest:
        raise ConfigError("format('cmq') as a sink needs option 'dest' (host:port)")
    mailbox = _int_option(options, "mailbox", 0)
    delivery = _delivery_option(options)
    drain_timeout = _float_option(options, "draintimeout", DEFAULT_DRAIN_TIMEOUT)
    max_datagram = _int_option(options, "maxdatagram", DEFAULT_MAX_DATAGRAM)
    sent = 0
    # linger=0: the wait for acknowledgements is the drain below, bounded by
    # drainTimeout; close() then reports whatever is still unconfirmed.
    q = Queue(
        port=0,
        host=options.get("bind", "0.0.0.0"),
        codec="raw",
        delivery=delivery,
        max_datagram=max_datagram,
        linger=0.0,
    )
    try:
        for row in rows:
            value = row["payload"] if "payload" in row.__fields__ else row[0]
            q.push(dest, _payload_bytes(value), mailbox=mailbox)
            sent += 1
        if delivery != "best-effort":
            q.drain(drain_timeout)
    finally:
        q.close()
    stats = q.stats()
    if delivery == "best-effort":
        return SendResult(sent=sent, confirmed=0, dropped=stats.total_dropped)
    unconfirmed = stats.in_doubt
    if unconfirmed:
        why = sorted({_WHY.get(f.reason, f.reason) for f in q.failures()})
        raise Timeout(
            f"format('cmq') sink: {unconfirmed} of {sent} messages to {dest} not confirmed "
            f"({'; '.join(why) or f'no acknowledgement within drainTimeout={drain_timeout:g}s'}); "
            "the task fails so that Spark runs it again"
        )
    return SendResult(sent=sent, confirmed=sent - unconfirmed, dropped=stats.total_dropped)


class _StreamWriter(DataSourceStreamWriter):
    def __init__(self, options: Mapping[str, str]) -> None:
        self.options = options

    def write(self, iterator: Iterator[Any]) -> SendResult:
        return _send_rows(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        # Each task returned only once its destination acknowledged every
        # row (reliable modes): nothing is left to make durable. A batch
        # replayed after a failure is pushed again (at least once).
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
    (+ ``host``, ``mailbox``, ``delivery``) to receive; ``startingOffsets``
    ``earliest`` (default) or ``latest``; ``maxPartitionBytes``. Sink:
    ``dest``, ``mailbox``, ``delivery`` (``reliable`` by default),
    ``drainTimeout`` (seconds a task waits for acknowledgements, 30),
    ``maxDatagram``, ``bind``.
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
    """Make ``format("cmq")`` available in ``spark``, with workers that can import cmq.

    The source is planned and read in Spark's Python workers, which run
    ``spark.pyspark.python``, else the ``PYSPARK_PYTHON`` the session started
    with, else whatever ``python3`` is on the PATH (which usually lacks
    cmq). In a local session (master ``local`` or ``local[...]``) with
    neither set, this sets the session's ``spark.pyspark.python`` to this
    interpreter, so the workers run the Python that imported cmq. On a
    cluster it changes nothing: the executors' Python is the cluster's to set.

    Raises:
        ConfigError: a local session's workers are set to run a Python that
            cannot import cmq; the message names it and what to set instead.
    """
    _local_workers_find_cmq(spark)
    spark.dataSource.register(CmqDataSource)


_PYSPARK_PYTHON: Final = "spark.pyspark.python"


def _local_workers_find_cmq(spark: SparkSession) -> None:
    try:
        sc = spark.sparkContext
        master = str(sc.master)
        jvm_conf = sc._jsc.sc().conf()  # the live SparkConf the Python workers are started from
        jvm: Any = sc._jvm
        jvm_env = jvm.java.lang.System.getenv("PYSPARK_PYTHON")
    except Exception:  # noqa: BLE001 - Spark Connect and the like: no JVM here to look at
        return
    if master != "local" and not master.startswith("local["):
        return
    configured = jvm_conf.get(_PYSPARK_PYTHON, None) or jvm_env
    if not configured:
        jvm_conf.set(_PYSPARK_PYTHON, sys.executable)
        sc.pythonExec = sys.executable  # what this side hands the JVM for RDD functions
        return
    if configured == sys.executable:
        return
    import subprocess

    try:
        found = subprocess.run(
            [configured, "-c", "import cmq"], capture_output=True, timeout=60
        ).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        found = False
    if not found:
        raise ConfigError(
            f"Spark's Python workers run {configured!r}, which cannot import cmq: "
            f"set PYSPARK_PYTHON={sys.executable} before the session starts, "
            f"or .config({_PYSPARK_PYTHON!r}, {sys.executable!r}) on its builder"
        )


#: Seconds between the main thread's looks for a signal while it waits.
_SIGNAL_CHECK: Final = 0.2


def main(argv: Sequence[str] | None = None) -> int:
    """Run a :class:`SpoolReceiver` until SIGINT or SIGTERM."""
    parser = argparse.ArgumentParser(
        prog="python -m cmq.pipeline.source", description=SpoolReceiver.__doc__
    )
    parser.add_argument("--spool", required=True, type=Path)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--mailbox", type=int, default=0)
    parser.add_argument(
        "--delivery",
        choices=_DELIVERIES,
        default=DEFAULT_DELIVERY,
        help="this endpoint's own delivery mode; what it receives follows each sender's (default: %(default)s)",
    )
    parser.add_argument(
        "--max-buffered-bytes",
        type=int,
        default=DEFAULT_SPOOL_BUFFERED,
        help="received messages held before they are written; the most a crash can lose unreported "
        "(default: %(default)s)",
    )
    args = parser.parse_args(argv)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    try:
        rx = SpoolReceiver(
            args.spool,
            port=args.port,
            host=args.host,
            mailbox=args.mailbox,
            delivery=args.delivery,
            max_buffered_bytes=args.max_buffered_bytes,
        )
    except CmqError as exc:
        print(f"python -m cmq.pipeline.source: {exc}", file=sys.stderr)
        return 2
    with rx:
        print(
            f"spooling {rx.address[0]}:{rx.address[1]} into {args.spool}",
            file=sys.stderr,
            flush=True,
        )
        try:
            # Woken every _SIGNAL_CHECK seconds: a signal the kernel gives to
            # another of this process's threads sets no error on the main
            # thread's lock wait, and Python runs handlers only in the main
            # thread, so an endless wait could miss SIGTERM for good.
            while not done.wait(_SIGNAL_CHECK):
                pass
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
