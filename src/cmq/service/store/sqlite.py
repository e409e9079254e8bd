"""The SQLite store: the embedded default, one file in WAL mode.

Theory of operation
-------------------
One thread per process owns the connection and runs every operation. The
event loop hands it jobs (plain functions of the connection) through a queue,
all jobs of one loop turn at once; the thread takes all jobs waiting at that
moment and runs them in ONE
``BEGIN IMMEDIATE`` transaction, each inside its own savepoint (so one
failing job rolls back alone), then commits once and only then resolves the
jobs' futures. That is group commit: under load many requests share one
commit, and a SendMessage is never answered before the commit that holds its
message.

Durability (``synchronous="full"``, the default): no job is answered before
an ``fdatasync`` of the WAL file that followed its commit. That fsync is
cmq's, not SQLite's: the connection runs with ``PRAGMA synchronous=NORMAL``
(SQLite then syncs the WAL only around checkpoints) and a second thread, the
syncer, fsyncs the WAL after each commit and only then resolves the
commit's futures. Meanwhile the writer runs the next transaction, so
execution and the disk flush overlap instead of taking turns (with SQLite's
own FULL the writer stood idle through every fsync, a few ms here). The
guarantee is the one FULL gives: every answered request's commit is on
disk. A commit not yet synced is visible to other transactions, including
other processes' on the same file; what they answer waits for their own
fsync of the same WAL file, which covers every write made to it before it
began. A crash of the OS can lose only commits no one was answered for
(and, since the WAL is replayed in order, nothing after them). Should the
WAL file not be there to open, SQLite's FULL is used as before.
``synchronous="normal"`` answers after the commit, without any fsync.

Several processes (``--workers N``, or several ``cmq serve`` on one file)
each have such a thread; SQLite's write lock (``BEGIN IMMEDIATE`` with a busy
timeout) serialises them, so every operation stays atomic across nodes.

In-flight state is just ``visible_at`` and the receipt token in the message
row, so it survives a restart like the messages do.

A lock-free receive (``ReceiveMode=lock-free``) is two transactions. The
read of the index (:meth:`SqliteStore.peek`) runs on a second connection
owned by a reader thread, as a plain WAL read transaction: it takes no write
lock, so it never waits for another process's writes, and it sees the last
committed state. The write (:meth:`SqliteStore.mark`) is then a job of the
writer thread, in a later transaction. Any node's transactions may commit in
between; the write does not re-check visibility, so two receives that read
the same head both take it. (Running the read through the writer thread, as
a first version did, made it queue for the write lock like any write: the
nodes took turns, each reading and marking while the others slept in
SQLite's busy handler, and the racing window the paper describes was mostly
closed.)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import queue
import sqlite3
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from cmq.service.errors import QueueDoesNotExist, SqsError, StoreUnavailable
from cmq.service.model import (
    Browsed,
    ChangeResult,
    NewMessage,
    QueueCounts,
    QueueRecord,
    Received,
    ReceiveSpec,
    SendResult,
)
from cmq.service.ordering import standard_picks, window_picks
from cmq.service.store.base import Store

__all__ = ["SqliteStore"]

T = TypeVar("T")

#: Jobs one transaction takes at most; bounds the latency a commit adds.
MAX_GROUP = 256
#: How long a process waits for another process's write lock, ms.
BUSY_TIMEOUT_MS = 10_000

_SCHEMA = """
CREATE TABLE IF NOT EXISTS queues (
    name TEXT PRIMARY KEY,
    attributes TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    modified_at INTEGER NOT NULL,
    next_seq INTEGER NOT NULL DEFAULT 1
);
CREATE TABLE IF NOT EXISTS messages (
    queue TEXT NOT NULL,
    seq INTEGER NOT NULL,
    payload TEXT NOT NULL,
    group_id TEXT,
    visible_at INTEGER NOT NULL,
    receive_count INTEGER NOT NULL DEFAULT 0,
    first_receive_at INTEGER NOT NULL DEFAULT 0,
    token TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (queue, seq)
) WITHOUT ROWID;
-- FIFO receives walk groups, not messages (see _fifo_picks).
CREATE INDEX IF NOT EXISTS messages_group ON messages (queue, group_id, seq)
    WHERE group_id IS NOT NULL;
CREATE TABLE IF NOT EXISTS dedup (
    queue TEXT NOT NULL,
    dedup_id TEXT NOT NULL,
    message_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    until INTEGER NOT NULL,
    PRIMARY KEY (queue, dedup_id)
) WITHOUT ROWID;
"""

_Job = tuple[Callable[[sqlite3.Connection], Any], "asyncio.Future[Any]", asyncio.AbstractEventLoop]


_Done = tuple[list[_Job], list[tuple[bool, Any]]]


def _answer(batch: list[_Job], results: list[tuple[bool, Any]]) -> None:
    """Resolve a batch's futures: one call into each callers' loop, not one a job."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], bool, Any]]] = {}
    for (_, fut, loop), (ok, value) in zip(batch, results, strict=True):
        by_loop.setdefault(loop, []).append((fut, ok, value))
    for loop, answers in by_loop.items():
        with contextlib.suppress(RuntimeError):  # the caller's loop is closed: no one waits
            loop.call_soon_threadsafe(_resolve, answers)


def _resolve(answers: list[tuple[asyncio.Future[Any], bool, Any]]) -> None:
    for fut, ok, value in answers:
        if fut.done():  # the request was cancelled (client went away)
            continue
        if ok:
            fut.set_result(value)
        else:
            fut.set_exception(value)


def _attempt(
    conn: sqlite3.Connection, batch: list[_Job], *, careful: bool
) -> list[tuple[bool, Any]] | None:
    """Run ``batch`` in one transaction and commit it; the jobs' outcomes.

    A job that fails leaves no trace. Careless (the usual case), jobs run
    bare, and one that fails before writing anything (``total_changes``
    unchanged: the usual failure, a missing queue) simply fails; one that
    fails after writing rolls the whole transaction back and returns None,
    for a careful attempt. Careful, every job runs in a savepoint, released
    after it, and a failing one is rolled back to it. Savepoints are dear: a
    job of three small writes took about 10 us bare and 35 us with its
    savepoint and release, in a micro-benchmark on this 2-core machine, so
    only a batch that needs them pays for them.

    Raises sqlite3.Error when the transaction as a whole fails.
    """
    results: list[tuple[bool, Any]] = []
    conn.execute("BEGIN IMMEDIATE")
    for fn, _, _ in batch:
        if careful:
            conn.execute("SAVEPOINT job")
        before = conn.total_changes
        try:
            value = fn(conn)
        except Exception as exc:  # an SqsError, or a bug that must not kill the writer
            if not conn.in_transaction:
                # SQLite ended the transaction itself (some I/O errors do):
                # what the jobs before wrote is gone too.
                raise sqlite3.OperationalError(f"transaction rolled back: {exc}") from exc
            if careful:
                conn.execute("ROLLBACK TO job")
                conn.execute("RELEASE job")
            elif conn.total_changes != before:
                conn.execute("ROLLBACK")
                return None
            if isinstance(exc, sqlite3.Error):
                err = StoreUnavailable(f"SQLite failed: {exc}")
                err.__cause__ = exc
                results.append((False, err))
            else:
                results.append((False, exc))
        else:
            results.append((True, value))
            if careful:
                conn.execute("RELEASE job")
    conn.execute("COMMIT")
    return results


def _check_queue(conn: sqlite3.Connection, name: str) -> None:
    if conn.execute("SELECT 1 FROM queues WHERE name = ?", (name,)).fetchone() is None:
        raise QueueDoesNotExist(f"The specified queue {name} does not exist.")


class SqliteStore(Store):
    """Queues in one SQLite file, group-committed by a writer thread."""

    def __init__(self, path: str, *, synchronous: str = "full") -> None:
        self.path = path
        self.synchronous = synchronous
        # Jobs go to the writer a loop turn's worth at a time (see _run).
        self._jobs: queue.SimpleQueue[list[_Job] | None] = queue.SimpleQueue()
        self._outbox: list[_Job] = []
        # Committed batches waiting for the syncer's fsync (None: stop).
        self._committed: queue.SimpleQueue[_Done | None] = queue.SimpleQueue()
        self._wal_fd: int | None = None
        self._thread: threading.Thread | None = None
        self._syncer: threading.Thread | None = None
        self._ready = threading.Event()
        self._open_error: BaseException | None = None
        # Lock-free reads: their own connection and thread (see the module doc).
        self._reads: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._reader: threading.Thread | None = None

    async def open(self) -> None:
        """Create the file, schema and writer thread. Raises StoreUnavailable."""
        self._thread = threading.Thread(target=self._main, name="cmq-sqlite", daemon=True)
        self._thread.start()
        await asyncio.get_running_loop().run_in_executor(None, self._ready.wait)
        if self._wal_fd is not None:
            self._syncer = threading.Thread(
                target=self._sync_main, args=(self._wal_fd,), name="cmq-sqlite-sync", daemon=True
            )
            self._syncer.start()
        if self._open_error is not None:
            raise StoreUnavailable(
                f"cannot open SQLite store {self.path}: {self._open_error}"
            ) from self._open_error
        self._reader = threading.Thread(target=self._read_main, name="cmq-sqlite-read",
                                        daemon=True)  # fmt: skip
        self._reader.start()

    async def close(self) -> None:
        """Finish queued jobs and stop the writer, syncer and reader threads."""
        loop = asyncio.get_running_loop()
        if self._reader is not None:
            self._reads.put(None)
            await loop.run_in_executor(None, self._reader.join)
            self._reader = None
        if self._thread is not None:
            self._hand_over()
            self._jobs.put(None)
            await loop.run_in_executor(None, self._thread.join)
            self._thread = None
        if self._syncer is not None:
            self._committed.put(None)
            await loop.run_in_executor(None, self._syncer.join)
            self._syncer = None
        if self._wal_fd is not None:
            os.close(self._wal_fd)
            self._wal_fd = None

    def _connect(self) -> sqlite3.Connection:
        directory = os.path.dirname(self.path)
        if directory:
            os.makedirs(directory, exist_ok=True)
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA synchronous = {self.synchronous.upper()}")
        conn.executescript(_SCHEMA)
        if self.synchronous == "full":
            # The syncer's fsync replaces SQLite's own (module doc). SQLite
            # keeps the WAL file while a connection is open, ours included.
            try:
                self._wal_fd = os.open(self.path + "-wal", os.O_RDONLY)
            except OSError:
                self._wal_fd = None
            else:
                conn.execute("PRAGMA synchronous = NORMAL")
        return conn

    def _main(self) -> None:
        try:
            conn = self._connect()
        except (sqlite3.Error, OSError) as exc:
            self._open_error = exc
            self._ready.set()
            return
        self._ready.set()
        try:
            while True:
                jobs = self._jobs.get()
                if jobs is None:
                    return
                batch = list(jobs)
                stop = False
                while len(batch) < MAX_GROUP:
                    try:
                        more = self._jobs.get_nowait()
                    except queue.Empty:
                        break
                    if more is None:
                        stop = True
                        break
                    batch += more
                self._run_batch(conn, batch)
                if stop:
                    return
        finally:
            conn.close()

    def _read_main(self) -> None:
        """The reader thread: each job in its own read transaction (``BEGIN``
        deferred, which in WAL mode takes no lock that a writer waits for and
        waits for none), on a connection of its own."""
        conn: sqlite3.Connection | None = None
        try:
            while True:
                job = self._reads.get()
                if job is None:
                    return
                fn, fut, loop = job
                try:
                    if conn is None:
                        conn = sqlite3.connect(self.path, isolation_level=None,
                                               check_same_thread=False)  # fmt: skip
                        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
                    conn.execute("BEGIN")
                    try:
                        ok, value = True, fn(conn)
                    finally:
                        conn.execute("COMMIT")
                except SqsError as exc:
                    ok, value = False, exc
                except sqlite3.Error as exc:
                    err = StoreUnavailable(f"SQLite failed: {exc}")
                    err.__cause__ = exc
                    ok, value = False, err
                except Exception as exc:  # noqa: BLE001 - a bug in one job must not kill the thread
                    ok, value = False, exc
                with contextlib.suppress(RuntimeError):  # the caller's loop is closed
                    loop.call_soon_threadsafe(_resolve, [(fut, ok, value)])
        finally:
            if conn is not None:
                conn.close()

    def _run_batch(self, conn: sqlite3.Connection, batch: list[_Job]) -> None:
        try:
            results = _attempt(conn, batch, careful=False)
            if results is None:
                # A job failed after it had written: that first attempt was
                # rolled back whole; run the batch again, each job in a
                # savepoint of its own so that the failing one rolls back alone.
                results = _attempt(conn, batch, careful=True)
                assert results is not None
        except sqlite3.Error as exc:
            # The transaction as a whole failed (lock timeout, disk full):
            # nothing of it is committed, so every job of it fails.
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            err = StoreUnavailable(f"SQLite transaction failed: {exc}")
            err.__cause__ = exc
            results = [(False, err)] * len(batch)
        if self._wal_fd is not None:
            self._committed.put((batch, results))
        else:
            _answer(batch, results)

    def _sync_main(self, fd: int) -> None:
        """The syncer: fsync the WAL after commits, then answer their jobs."""
        while True:
            done = self._committed.get()
            if done is None:
                return
            pending = [done]
            stop = False
            while True:  # every commit made before this fsync rides on it
                try:
                    more = self._committed.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    stop = True
                    break
                pending.append(more)
            try:
                os.fdatasync(fd)
            except OSError as exc:
                # Committed but not known to be on disk: the callers are told
                # the store failed (a retried send may then be a duplicate).
                err = StoreUnavailable(f"SQLite WAL fsync failed: {exc}")
                err.__cause__ = exc
                pending = [(batch, [(False, err)] * len(batch)) for batch, _ in pending]
            for batch, results in pending:
                _answer(batch, results)
            if stop:
                return

    async def _run(self, fn: Callable[[sqlite3.Connection], T], *, read: bool = False) -> T:
        """Run ``fn`` in the writer thread's next group transaction, or with
        ``read`` in a read transaction of the reader thread."""
        if self._thread is None or (read and self._reader is None):
            raise StoreUnavailable("the SQLite store is not open")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        if read:
            self._reads.put((fn, fut, loop))
            return await fut
        # Handed to the writer at the end of this loop turn, with every other
        # job of the turn: one wake-up of the writer thread for all of them,
        # not one each (each was a futex call, and a thread woken to fight
        # the event loop for the GIL).
        if not self._outbox:
            loop.call_soon(self._hand_over)
        self._outbox.append((fn, fut, loop))
        return await fut

    def _hand_over(self) -> None:
        if self._outbox:
            jobs, self._outbox = self._outbox, []
            self._jobs.put(jobs)

    # -- operations --------------------------------------------------------

    async def create_queue(self, record: QueueRecord) -> tuple[QueueRecord, bool]:
        def job(conn: sqlite3.Connection) -> tuple[QueueRecord, bool]:
            cur = conn.execute(
                "INSERT OR IGNORE INTO queues (name, attributes, created_at, modified_at) "
                "VALUES (?, ?, ?, ?)",
                (
                    record.name,
                    json.dumps(dict(record.attributes)),
                    record.created_at,
                    record.modified_at,
                ),
            )
            if cur.rowcount:
                return record, True
            return _get_queue(conn, record.name), False

        return await self._run(job)

    async def get_queue(self, name: str) -> QueueRecord:
        return await self._run(lambda conn: _get_queue(conn, name))

    async def list_queues(self, prefix: str) -> list[str]:
        def job(conn: sqlite3.Connection) -> list[str]:
            rows = conn.execute(
                "SELECT name FROM queues WHERE substr(name, 1, ?) = ? ORDER BY name",
                (len(prefix), prefix),
            )
            return [r[0] for r in rows]

        return await self._run(job)

    async def delete_queue(self, name: str) -> None:
        def job(conn: sqlite3.Connection) -> None:
            _check_queue(conn, name)
            for table, column in (("queues", "name"), ("messages", "queue"), ("dedup", "queue")):
                conn.execute(f"DELETE FROM {table} WHERE {column} = ?", (name,))

        await self._run(job)

    async def set_attributes(self, name: str, attributes: Mapping[str, str], now: int) -> None:
        def job(conn: sqlite3.Connection) -> None:
            current = _get_queue(conn, name)
            merged = {**current.attributes, **attributes}
            conn.execute(
                "UPDATE queues SET attributes = ?, modified_at = ? WHERE name = ?",
                (json.dumps(merged), now, name),
            )

        await self._run(job)

    async def counts(self, name: str, now: int) -> QueueCounts:
        def job(conn: sqlite3.Connection) -> QueueCounts:
            _check_queue(conn, name)
            row = conn.execute(
                "SELECT count(*), "
                "coalesce(sum(visible_at > ? AND receive_count > 0), 0), "
                "coalesce(sum(visible_at > ? AND receive_count = 0), 0) "
                "FROM messages WHERE queue = ?",
                (now, now, name),
            ).fetchone()
            total, in_flight, delayed = row
            return QueueCounts(
                visible=total - in_flight - delayed, in_flight=in_flight, delayed=delayed
            )

        return await self._run(job)

    async def counts_many(self, names: Sequence[str], now: int) -> dict[str, QueueCounts]:
        """One read for all of ``names``: a walk of the messages grouped by queue."""

        def job(conn: sqlite3.Connection) -> dict[str, QueueCounts]:
            exists = {r[0] for r in conn.execute("SELECT name FROM queues")}
            out = {n: QueueCounts() for n in names if n in exists}
            for qname, total, in_flight, delayed in conn.execute(
                "SELECT queue, count(*), "
                "coalesce(sum(visible_at > ? AND receive_count > 0), 0), "
                "coalesce(sum(visible_at > ? AND receive_count = 0), 0) "
                "FROM messages GROUP BY queue",
                (now, now),
            ):
                if qname in out:
                    out[qname] = QueueCounts(visible=total - in_flight - delayed,
                                             in_flight=in_flight, delayed=delayed)  # fmt: skip
            return out

        return await self._run(job)

    async def send(self, name: str, messages: Sequence[NewMessage], now: int) -> list[SendResult]:
        def job(conn: sqlite3.Connection) -> list[SendResult]:
            dedup = any(m.dedup_id is not None for m in messages)
            if dedup or not messages:
                _check_queue(conn, name)
            # Otherwise the first sequence number taken below shows the queue
            # exists: one statement fewer on the hot path.
            if dedup:
                conn.execute("DELETE FROM dedup WHERE queue = ? AND until <= ?", (name, now))
            results = []
            for m in messages:
                if m.dedup_id is not None:
                    seen = conn.execute(
                        "SELECT message_id, seq FROM dedup WHERE queue = ? AND dedup_id = ?",
                        (name, m.dedup_id),
                    ).fetchone()
                    if seen is not None:
                        results.append(SendResult(message_id=seen[0], seq=seen[1], duplicate=True))
                        continue
                row = conn.execute(
                    "UPDATE queues SET next_seq = next_seq + 1 WHERE name = ? "
                    "RETURNING next_seq - 1",
                    (name,),
                ).fetchone()
                if row is None:
                    raise QueueDoesNotExist(f"The specified queue {name} does not exist.")
                seq = row[0]
                conn.execute(
                    "INSERT INTO messages (queue, seq, payload, group_id, visible_at) "
                    "VALUES (?, ?, ?, ?, ?)",
                    (name, seq, m.payload, m.group_id, m.visible_at),
                )
                if m.dedup_id is not None:
                    conn.execute(
                        "INSERT INTO dedup VALUES (?, ?, ?, ?, ?)",
                        (name, m.dedup_id, m.message_id, seq, m.dedup_until),
                    )
                results.append(SendResult(message_id=m.message_id, seq=seq))
            return results

        return await self._run(job)

    async def receive_atomic(self, name: str, spec: ReceiveSpec) -> list[Received]:
        def job(conn: sqlite3.Connection) -> list[Received]:
            if spec.fifo:
                picks = _fifo_picks(conn, name, spec.now, spec.max_messages)
            elif spec.k == 1:
                got = _take_head(conn, name, spec)
                if not got:
                    _check_queue(conn, name)
                return got
            else:
                picks = _atomic_window(conn, name, spec)
            if not picks:
                # A queue's messages go with it (delete_queue), so picks show
                # that it exists; only an empty answer needs the check.
                _check_queue(conn, name)
            return _mark(conn, name, spec, picks)

        return await self._run(job)

    async def peek(self, name: str, spec: ReceiveSpec) -> list[int]:
        def job(conn: sqlite3.Connection) -> list[int]:
            _check_queue(conn, name)
            return _window(conn, name, spec)

        # Not through the writer: a lock-free read must not queue for the
        # write lock (see the module doc).
        return await self._run(job, read=True)

    async def mark(self, name: str, spec: ReceiveSpec, picks: Sequence[int]) -> list[Received]:
        return await self._run(lambda conn: _mark(conn, name, spec, picks))

    async def delete(self, name: str, receipts: Sequence[tuple[int, str]]) -> None:
        def job(conn: sqlite3.Connection) -> None:
            cur = conn.executemany(
                "DELETE FROM messages WHERE queue = ? AND seq = ? AND token = ?",
                [(name, seq, token) for seq, token in receipts],
            )
            if not receipts or cur.rowcount < len(receipts):
                # A stale handle deletes nothing, as in SQS; the queue must
                # still exist (a deleted row shows that it does).
                _check_queue(conn, name)

        await self._run(job)

    async def change_visibility(
        self, name: str, seq: int, token: str, visible_at: int, now: int
    ) -> ChangeResult:
        def job(conn: sqlite3.Connection) -> ChangeResult:
            _check_queue(conn, name)
            row = conn.execute(
                "SELECT token, visible_at FROM messages WHERE queue = ? AND seq = ?", (name, seq)
            ).fetchone()
            if row is None:
                return ChangeResult.NOT_FOUND
            if row[0] != token or row[1] <= now:
                return ChangeResult.NOT_IN_FLIGHT
            conn.execute(
                "UPDATE messages SET visible_at = ? WHERE queue = ? AND seq = ?",
                (visible_at, name, seq),
            )
            return ChangeResult.OK

        return await self._run(job)

    async def purge(self, name: str) -> None:
        def job(conn: sqlite3.Connection) -> None:
            _check_queue(conn, name)
            conn.execute("DELETE FROM messages WHERE queue = ?", (name,))

        await self._run(job)

    async def browse(self, name: str, limit: int) -> list[Browsed]:
        def job(conn: sqlite3.Connection) -> list[Browsed]:
            _check_queue(conn, name)
            return [
                Browsed(seq=r[0], payload=r[1], visible_at=r[2], receive_count=r[3])
                for r in conn.execute(
                    "SELECT seq, payload, visible_at, receive_count FROM messages "
                    "WHERE queue = ? ORDER BY seq LIMIT ?",
                    (name, limit),
                )
            ]

        return await self._run(job)

    async def usage(self) -> int:
        """Bytes of the database file in use (pages minus free pages)."""

        def job(conn: sqlite3.Connection) -> int:
            pages = conn.execute("PRAGMA page_count").fetchone()[0]
            free = conn.execute("PRAGMA freelist_count").fetchone()[0]
            size = conn.execute("PRAGMA page_size").fetchone()[0]
            return int((pages - free) * size)

        return await self._run(job)


def _fifo_picks(conn: sqlite3.Connection, name: str, now: int, n: int) -> list[int]:
    """:func:`~cmq.service.ordering.fifo_picks` over the group index.

    The picks are the visible prefix of each group, merged in sequence order,
    first ``n``. So walk the groups (one index seek each) and read at most
    ``n`` rows of each: the cost grows with the number of groups, never with
    the messages a blocked group holds (a full scan of the queue, in the
    writer thread, once made a 20,000-message blocked group slow down every
    other queue's requests).
    """
    prefix: list[int] = []
    group = conn.execute(
        "SELECT min(group_id) FROM messages WHERE queue = ? AND group_id IS NOT NULL", (name,)
    ).fetchone()[0]
    while group is not None:
        for seq, visible_at in conn.execute(
            "SELECT seq, visible_at FROM messages INDEXED BY messages_group "
            "WHERE queue = ? AND group_id = ? ORDER BY seq LIMIT ?",
            (name, group, n),
        ):
            if visible_at > now:
                break
            prefix.append(seq)
        group = conn.execute(
            "SELECT min(group_id) FROM messages WHERE queue = ? AND group_id > ?", (name, group)
        ).fetchone()[0]
    return sorted(prefix)[:n]


def _get_queue(conn: sqlite3.Connection, name: str) -> QueueRecord:
    row = conn.execute(
        "SELECT attributes, created_at, modified_at FROM queues WHERE name = ?", (name,)
    ).fetchone()
    if row is None:
        raise QueueDoesNotExist(f"The specified queue {name} does not exist.")
    return QueueRecord(
        name=name, attributes=json.loads(row[0]), created_at=row[1], modified_at=row[2]
    )


def _window(conn: sqlite3.Connection, name: str, spec: ReceiveSpec) -> list[int]:
    """A standard queue's picks among its first visible messages."""
    # The primary key (queue, seq) is the sequence index: this walks it in
    # order and stops after k + n - 1 visible rows.
    visible = [
        r[0]
        for r in conn.execute(
            "SELECT seq FROM messages WHERE queue = ? AND visible_at <= ? ORDER BY seq LIMIT ?",
            (name, spec.now, spec.k + spec.max_messages - 1),
        )
    ]
    return standard_picks(visible, spec.k, spec.max_messages, spec.rand)


def _atomic_window(conn: sqlite3.Connection, name: str, spec: ReceiveSpec) -> list[int]:
    """An atomic receive's picks: :func:`~cmq.service.ordering.window_picks`
    over the first messages that are visible or in flight (received, not yet
    visible again; a delayed one is neither), then the visible ones after
    them that a pick may fall back on, when the window has too few."""
    want = spec.k + spec.max_messages - 1
    rows: list[tuple[int, bool]] = conn.execute(
        "SELECT seq, visible_at <= ? FROM messages WHERE queue = ? "
        "AND (visible_at <= ? OR receive_count > 0) ORDER BY seq LIMIT ?",
        (spec.now, name, spec.now, want),
    ).fetchall()
    short = spec.max_messages - sum(visible for _, visible in rows)
    if len(rows) == want and short > 0:
        rows += [
            (r[0], True)
            for r in conn.execute(
                "SELECT seq FROM messages WHERE queue = ? AND seq > ? AND visible_at <= ? "
                "ORDER BY seq LIMIT ?",
                (name, rows[-1][0], spec.now, short),
            )
        ]
    return window_picks(rows, spec.k, spec.max_messages, spec.rand)


def _take_head(conn: sqlite3.Connection, name: str, spec: ReceiveSpec) -> list[Received]:
    """:func:`_window` then :func:`_mark` for ``k = 1`` in one statement.

    With ``k = 1`` the picks are simply the first ``n`` visible messages in
    sequence order (:func:`~cmq.service.ordering.standard_picks`), which SQL
    can select and mark at once: one statement, one round trip of the GIL
    between the writer thread and the event loop, instead of two.
    """
    rows = conn.execute(
        "UPDATE messages SET visible_at = ?, receive_count = receive_count + 1, "
        "first_receive_at = CASE receive_count WHEN 0 THEN ? ELSE first_receive_at END, "
        "token = ? WHERE queue = ? AND seq IN ("
        "SELECT seq FROM messages WHERE queue = ? AND visible_at <= ? ORDER BY seq LIMIT ?) "
        "RETURNING seq, payload, receive_count, first_receive_at",
        (
            spec.now + spec.visibility_ms,
            spec.now,
            spec.token,
            name,
            name,
            spec.now,
            spec.max_messages,
        ),
    ).fetchall()
    rows.sort()  # RETURNING's order is SQLite's; picks go out in sequence order
    return [
        Received(
            seq=seq, payload=payload, receive_count=count, first_receive_at=first, token=spec.token
        )
        for seq, payload, count, first in rows
    ]


def _mark(
    conn: sqlite3.Connection, name: str, spec: ReceiveSpec, picks: Sequence[int]
) -> list[Received]:
    """Mark ``picks`` in flight under ``spec.token``; skip the deleted ones."""
    out = []
    for seq in picks:
        row = conn.execute(
            "UPDATE messages SET visible_at = ?, receive_count = receive_count + 1, "
            "first_receive_at = CASE receive_count WHEN 0 THEN ? ELSE first_receive_at "
            "END, token = ? WHERE queue = ? AND seq = ? "
            "RETURNING payload, receive_count, first_receive_at",
            (spec.now + spec.visibility_ms, spec.now, spec.token, name, seq),
        ).fetchone()
        if row is None:  # deleted since a lock-free read
            continue
        payload, count, first = row
        out.append(
            Received(
                seq=seq,
                payload=payload,
                receive_count=count,
                first_receive_at=first,
                token=spec.token,
            )
        )
    return out
