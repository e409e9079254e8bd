"""The broker's durable state on disk: SQLite in the broker's data directory.

Theory of operation
-------------------
The core (:class:`~cmq.routing._core.BrokerCore`) never touches the disk: while
it handles requests it appends *records* to ``core.journal`` (table
:data:`RECORDS` below says what each one means), and the driver hands them
to :meth:`Store.write` once per loop turn, all of the turn's records in one
transaction, committed and then flushed to disk (``fdatasync`` of the WAL
file) before the turn's replies and confirms leave: a confirm for a
persistent message is only sent once that message is on disk, and confirms
batch (group commit).

The flush is the store's own rather than SQLite's ``synchronous=FULL``
(SQLite runs with ``NORMAL``: it syncs the WAL only around checkpoints), for
one reason: a turn whose records are all ``msg-`` (messages acknowledged or
otherwise gone) needs none. Its commit is in the OS's page cache, so it
survives a killed broker at once and a power cut at the next flush (which
covers every earlier write to the WAL, as WAL frames are replayed in
order); a deletion lost to a power cut only makes the message come back,
marked redelivered, which at-least-once allows. So a consumer's acks cost
no fsync, and a publisher's confirm one per turn. Should the WAL file not
open, every commit is ``synchronous=FULL`` as SQLite does it.

There is no index on ``messages`` besides its id: a commit writes one page
of messages fewer, and only purging or deleting a durable queue walks the
table.

What is kept (AMQP 0-9-1, as RabbitMQ): durable exchanges, durable queues,
bindings between a durable queue and a durable exchange, and persistent
messages (``delivery_mode`` 2) in durable queues until they are acknowledged
or otherwise leave their queue. :meth:`Store.load` reads them back, messages
in the order they were stored.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import msgpack

from cmq._errors import ConfigError

__all__ = ["DB_NAME", "Store", "StoredMessage", "StoredQueue", "StoredState"]

#: The database file inside the data directory.
DB_NAME: Final = "broker.sqlite3"

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS exchanges (name TEXT PRIMARY KEY, type TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS queues (
    name TEXT PRIMARY KEY, max_length INTEGER NOT NULL, overflow TEXT NOT NULL,
    arguments BLOB NOT NULL, auto_delete INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS bindings (
    queue TEXT NOT NULL, exchange TEXT NOT NULL, key TEXT NOT NULL,
    PRIMARY KEY (queue, exchange, key));
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY, queue TEXT NOT NULL, exchange TEXT NOT NULL,
    key TEXT NOT NULL, body BLOB NOT NULL, props BLOB, ttl REAL);
DROP INDEX IF EXISTS messages_by_queue;
"""

#: Record kind -> its SQL (the record's fields after the kind, in order).
RECORDS: Final[dict[str, tuple[str, ...]]] = {
    # ("exchange", name, type): a durable exchange was declared
    "exchange": ("INSERT OR REPLACE INTO exchanges VALUES (?, ?)",),
    # ("exchange-", name): it was deleted, and its bindings with it
    "exchange-": ("DELETE FROM exchanges WHERE name = ?", "DELETE FROM bindings WHERE exchange = ?"),
    # ("queue", name, max_length, overflow, arguments (msgpack), auto_delete)
    "queue": ("INSERT OR REPLACE INTO queues VALUES (?, ?, ?, ?, ?)",),
    # ("queue-", name): deleted, with its bindings and messages
    "queue-": (
        "DELETE FROM queues WHERE name = ?",
        "DELETE FROM bindings WHERE queue = ?",
        "DELETE FROM messages WHERE queue = ?",
    ),
    # ("purge", name): its stored messages went
    "purge": ("DELETE FROM messages WHERE queue = ?",),
    # ("bind", queue, exchange, key) / ("unbind", ...)
    "bind": ("INSERT OR IGNORE INTO bindings VALUES (?, ?, ?)",),
    "unbind": ("DELETE FROM bindings WHERE queue = ? AND exchange = ? AND key = ?",),
    # ("msg", id, queue, exchange, key, body (msgpack), props (msgpack), ttl (seconds or None))
    "msg": ("INSERT OR REPLACE INTO messages VALUES (?, ?, ?, ?, ?, ?, ?)",),
    # ("msg-", id): acknowledged, or otherwise gone from its queue
    "msg-": ("DELETE FROM messages WHERE id = ?",),
}


#: Records that need no flush before the turn's messages leave (see the module's notes).
UNSYNCED: Final = frozenset({"msg-"})

#: Record kind -> (SQL, how many of the record's fields it takes), precomputed.
_PLAN: Final = {kind: tuple((sql, sql.count("?")) for sql in sqls) for kind, sqls in RECORDS.items()}


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredQueue:
    name: str
    max_length: int
    overflow: str
    arguments: dict[str, Any]
    auto_delete: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredMessage:
    id: int
    queue: str
    exchange: str
    routing_key: str
    body: Any
    props: dict[str, Any] | None
    ttl: float | None = None  # seconds it may wait in its queue (counted again from a restart)


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredState:
    """What a broker finds on disk when it starts."""

    exchanges: list[tuple[str, str]]
    queues: list[StoredQueue]
    bindings: list[tuple[str, str, str]]  # (queue, exchange, key)
    messages: list[StoredMessage]  # in the order they were stored


def pack(value: Any) -> bytes:
    """A body or property map as stored (MessagePack, extension values kept)."""
    data: bytes = msgpack.packb(value, use_bin_type=True)
    return data


def _unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


class Store:
    """The broker's SQLite database under ``data_dir`` (created if missing).

    One broker at a time: the directory is locked (``broker.lock``, an
    advisory lock the kernel releases when the process ends, ``kill -9``
    included), and a second broker on it is refused.

    Raises:
        ConfigError: (constructor) the directory or database cannot be
            opened, or another broker is using it.
    """

    def __init__(self, data_dir: str | os.PathLike[str]) -> None:
        self.path = Path(data_dir) / DB_NAME
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._lock = open(self.path.parent / "broker.lock", "a+b")  # noqa: SIM115 - held until close()
        except OSError as exc:
            raise ConfigError(f"cannot use {str(self.path.parent)!r} as the broker's data directory: {exc}") from exc
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._lock.close()
            raise ConfigError(f"another broker is using the data directory {str(self.path.parent)!r}") from None
        try:
            # Used from the broker's loop and its AMQP thread, always under
            # the broker's lock (which also keeps the records in order).
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.executescript(_SCHEMA)
        except (OSError, sqlite3.Error) as exc:
            self._lock.close()
            raise ConfigError(f"cannot open the broker's store {str(self.path)!r}: {exc}") from exc
        # The WAL is flushed here after each commit that needs it (see the
        # module's notes); SQLite keeps the file while we are connected.
        self._wal: int | None
        try:
            self._wal = os.open(f"{self.path}-wal", os.O_RDONLY)
        except OSError:
            self._wal = None
        # NORMAL with our own flush; without it FULL (SQLite fsyncs every commit).
        self._db.execute(f"PRAGMA synchronous={'NORMAL' if self._wal is not None else 'FULL'}")
        self.commits = 0
        self.flushes = 0

    def load(self) -> StoredState:
        """Everything kept, messages in the order they were stored."""
        db = self._db
        return StoredState(
            exchanges=[(n, t) for n, t in db.execute("SELECT name, type FROM exchanges ORDER BY name")],
            queues=[
                StoredQueue(name=n, max_length=m, overflow=o, arguments=_unpack(a), auto_delete=bool(ad))
                for n, m, o, a, ad in db.execute("SELECT * FROM queues ORDER BY name")
            ],
            bindings=list(db.execute("SELECT queue, exchange, key FROM bindings")),
            messages=[
                StoredMessage(id=i, queue=q, exchange=e, routing_key=k, body=_unpack(b),
                              props=None if p is None else _unpack(p), ttl=t)
                for i, q, e, k, b, p, t in db.execute("SELECT * FROM messages ORDER BY id")
            ],
        )

    def last_message_id(self) -> int:
        """The largest message id stored (0: none)."""
        row = self._db.execute("SELECT COALESCE(MAX(id), 0) FROM messages").fetchone()
        return int(row[0])

    def write(self, records: Iterable[tuple[Any, ...]]) -> None:
        """Apply ``records`` in one transaction, commit it, and flush it to
        disk unless every record is one of :data:`UNSYNCED`.

        Raises:
            sqlite3.Error: the write or the flush failed (a failed write
                keeps nothing of it; after a failed flush, the records may
                be kept, as after a crash).
        """
        db, plan, unsynced = self._db, _PLAN, UNSYNCED
        sync = False
        db.execute("BEGIN")
        try:
            for rec in records:
                kind = rec[0]
                if kind not in unsynced:
                    sync = True
                for sql, n in plan[kind]:
                    db.execute(sql, rec[1 : n + 1])
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
        self.commits += 1
        if sync and self._wal is not None:
            try:
                os.fdatasync(self._wal)
            except OSError as exc:
                raise sqlite3.OperationalError(f"flushing the WAL failed: {exc}") from exc
            self.flushes += 1

    def close(self) -> None:
        if self._wal is not None:
            os.close(self._wal)
            self._wal = None
        self._db.close()
        self._lock.close()  # releases the directory
