"""The broker's durable state on disk, in the broker's data directory:
SQLite for what is declared, an append-only log for persistent messages.

Theory of operation
-------------------
The core (:class:`~cmq.routing._core.BrokerCore`) never touches the disk: while
it handles requests it appends *records* to ``core.journal`` (table
:data:`RECORDS` below says what each one means), and the driver hands them
to :meth:`Store.write` once per loop turn, all of the turn's records at once,
written and then flushed to disk before the turn's replies and confirms
leave: a confirm for a persistent message is only sent once that message is
on disk, and confirms batch (group commit).

Declarations (exchanges, queues, bindings) are rare: they go to SQLite
(``broker.sqlite3``, WAL, ``synchronous=FULL``: SQLite fsyncs each commit).

Messages are frequent: they go to a log of segments ``messages.N.log``, each
record a frame ``length (4 bytes) crc32 (4 bytes) MessagePack`` of ``["m",
id, queue, exchange, key, body, props, ttl]`` (a message kept), ``["d", id]``
(it left its queue) or ``["p", queue]`` (every message of that queue stored
before it went: a purge, or the queue deleted). A turn's frames are one
``pwrite`` and, unless they are all ``d``, one ``fdatasync``. A segment's
file is filled with zeros ahead of the frames written to it (a chunk at a
time, flushed once), so that the flush of a frame writes the frame's blocks
only, never the file's size or extents: on these machines an ``fdatasync``
after an append that grows a file costs 2 to 6 times one that does not.
A zero length ends a segment's frames, and so does a frame whose checksum
does not match (a write torn by a crash: nothing after it was flushed).

A turn of ``d`` frames only (acknowledgements) is not flushed: it is in the
OS's page cache, so it survives a killed broker at once and a power cut at
the next flush (which writes every earlier block of the file); a deletion
lost to a power cut only makes the message come back, marked redelivered,
which at-least-once allows. So a consumer's acks cost no fsync, and a
publisher's confirm one per turn.

Segments go when nothing in them is kept any more, oldest first (a ``d``
frame in a newer segment may name a message of an older one, so a newer
segment never goes before an older one). When more than
:data:`_MAX_SEGMENTS` segments are kept because their oldest holds a few
messages still queued (at most a quarter of those written to it), those messages are written again at the head, flushed,
and the oldest segment removed. When a store opens, it reads the log, writes
what is still kept (in durable queues that still exist) into a fresh segment,
flushes it, and removes the old segments: a log never outgrows the messages
it keeps for long, and what a crash left torn at a segment's end is gone.

What is kept (AMQP 0-9-1, as RabbitMQ): durable exchanges, durable queues,
bindings between a durable queue and a durable exchange, and persistent
messages (``delivery_mode`` 2) in durable queues until they are acknowledged
or otherwise leave their queue. :meth:`Store.load` reads them back, messages
in the order they were stored. A data directory written by an earlier cmq
(messages in SQLite's ``messages`` table) is taken over: its messages move
to the log when the store opens.
"""

from __future__ import annotations

import fcntl
import os
import re
import sqlite3
import struct
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
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
CREATE TABLE IF NOT EXISTS exchange_bindings (
    destination TEXT NOT NULL, source TEXT NOT NULL, key TEXT NOT NULL,
    PRIMARY KEY (destination, source, key));
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY, queue TEXT NOT NULL, exchange TEXT NOT NULL,
    key TEXT NOT NULL, body BLOB NOT NULL, props BLOB, ttl REAL);
DROP INDEX IF EXISTS messages_by_queue;
"""

#: Record kind -> its SQL (the record's fields after the kind, in order); the
#: message records (``msg``, ``msg-``, and the message side of ``purge`` and
#: ``queue-``) go to the log instead (see the module's notes).
RECORDS: Final[dict[str, tuple[str, ...]]] = {
    # ("exchange", name, type): a durable exchange was declared
    "exchange": ("INSERT OR REPLACE INTO exchanges VALUES (?, ?)",),
    # ("exchange-", name): it was deleted, and its bindings with it
    "exchange-": ("DELETE FROM exchanges WHERE name = ?", "DELETE FROM bindings WHERE exchange = ?",
                  "DELETE FROM exchange_bindings WHERE ?1 IN (source, destination)"),
    # ("queue", name, max_length, overflow, arguments (msgpack), auto_delete)
    "queue": ("INSERT OR REPLACE INTO queues VALUES (?, ?, ?, ?, ?)",),
    # ("queue-", name): deleted, with its bindings (and, in the log, its messages)
    "queue-": ("DELETE FROM queues WHERE name = ?", "DELETE FROM bindings WHERE queue = ?"),
    # ("purge", name): its stored messages went (log only)
    "purge": (),
    # ("bind", queue, exchange, key) / ("unbind", ...)
    "bind": ("INSERT OR IGNORE INTO bindings VALUES (?, ?, ?)",),
    "unbind": ("DELETE FROM bindings WHERE queue = ? AND exchange = ? AND key = ?",),
    # ("xbind", destination, source, key) / ("xunbind", ...): an exchange-to-exchange binding
    "xbind": ("INSERT OR IGNORE INTO exchange_bindings VALUES (?, ?, ?)",),
    "xunbind": ("DELETE FROM exchange_bindings WHERE destination = ? AND source = ? AND key = ?",),
    # ("msg", id, queue, exchange, key, body (msgpack), props (msgpack), ttl (seconds or None)) (log only)
    "msg": (),
    # ("msg-", id): acknowledged, or otherwise gone from its queue (log only)
    "msg-": (),
}


#: Records that need no flush before the turn's messages leave (see the module's notes).
UNSYNCED: Final = frozenset({"msg-"})

#: Record kind -> (SQL, how many of the record's fields it takes), precomputed.
_PLAN: Final = {kind: tuple((sql, sql.count("?")) for sql in sqls) for kind, sqls in RECORDS.items()}

#: A segment is closed (the next frame starts a new one) past this many bytes.
SEGMENT_BYTES: Final = 16 << 20
#: Zeros written ahead of a segment's frames, a chunk at a time.
_ZERO_CHUNK: Final = 1 << 20
_ZEROS: Final = bytes(_ZERO_CHUNK)
#: More segments than this, and the oldest's remaining messages are written again at the head.
_MAX_SEGMENTS: Final = 8
_FRAME: Final = struct.Struct(">II")  # payload length, crc32 of the payload
_SEGMENT_RE: Final = re.compile(r"^messages\.(\d+)\.log$")

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
    exchange_bindings: list[tuple[str, str, str]] = field(default_factory=list)  # (destination, source, key)


def pack(value: Any) -> bytes:
    """A body or property map as stored (MessagePack, extension values kept)."""
    data: bytes = msgpack.packb(value, use_bin_type=True)
    return data


def _unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


def _frame(record: list[Any]) -> bytes:
    """One log frame: length, crc32, then the record in MessagePack."""
    payload: bytes = msgpack.packb(record, use_bin_type=True)
    return _FRAME.pack(len(payload), zlib.crc32(payload)) + payload


def _frames(data: bytes) -> Iterator[list[Any]]:
    """The records of one segment's bytes, up to its end: a zero length, a
    frame that runs past the data, or one whose checksum does not match."""
    pos, end, head = 0, len(data), _FRAME.size
    while pos + head <= end:
        length, crc = _FRAME.unpack_from(data, pos)
        start = pos + head
        if length == 0 or start + length > end:
            return
        payload = data[start : start + length]
        if zlib.crc32(payload) != crc:
            return
        record = msgpack.unpackb(payload, raw=False, strict_map_key=False)
        if not isinstance(record, list) or not record:
            return
        yield record
        pos = start + length


def _replay(segments: Iterable[bytes]) -> dict[int, list[Any]]:
    """Message id -> its ``m`` record, of the messages the segments (oldest
    first) still keep, in the order they were written."""
    kept: dict[int, list[Any]] = {}
    for data in segments:
        for rec in _frames(data):
            kind = rec[0]
            if kind == "m":
                kept.pop(rec[1], None)  # written again (moved to the head): it is there now
                kept[rec[1]] = rec
            elif kind == "d":
                kept.pop(rec[1], None)
            elif kind == "p":
                for mid in [mid for mid, m in kept.items() if m[2] == rec[1]]:
                    del kept[mid]
    return kept


class Store:
    """The broker's store under ``data_dir`` (created if missing): SQLite's
    ``broker.sqlite3`` and the message log's segments (see the module's notes).

    One broker at a time: the directory is locked (``broker.lock``, an
    advisory lock the kernel releases when the process ends, ``kill -9``
    included), and a second broker on it is refused.

    Raises:
        ConfigError: (constructor) the directory, the database or the log
            cannot be opened, or another broker is using the directory.
    """

    def __init__(self, data_dir: str | os.PathLike[str]) -> None:
        self.path = Path(data_dir) / DB_NAME
        self._dir = self.path.parent
        try:
            self._dir.mkdir(parents=True, exist_ok=True)
            self._lock = open(self._dir / "broker.lock", "a+b")  # noqa: SIM115 - held until close()
        except OSError as exc:
            raise ConfigError(f"cannot use {str(self._dir)!r} as the broker's data directory: {exc}") from exc
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._lock.close()
            raise ConfigError(f"another broker is using the data directory {str(self._dir)!r}") from None
        try:
            # Used from the broker's loop and its AMQP thread, always under
            # the broker's lock (which also keeps the records in order).
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")  # declarations are rare: SQLite fsyncs each commit
            self._db.executescript(_SCHEMA)
        except (OSError, sqlite3.Error) as exc:
            self._lock.close()
            raise ConfigError(f"cannot open the broker's store {str(self.path)!r}: {exc}") from exc
        self.commits = 0
        self.flushes = 0
        # The log: the segment written to, its file, where the next frame
        # goes, how far its zeros reach; bytes used by each segment kept;
        # where each kept message is (segment, queue); messages kept per
        # segment and per queue.
        self._seg = 0
        self._fd = -1
        self._pos = 0
        self._zeroed = 0
        self._used: dict[int, int] = {}
        self._where: dict[int, tuple[int, str]] = {}
        self._live: dict[int, int] = {}
        self._written: dict[int, int] = {}
        self._by_queue: dict[str, set[int]] = {}
        self._dirfd = -1
        try:
            self._dirfd = os.open(self._dir, os.O_RDONLY)
            self._open_log()
        except (OSError, sqlite3.Error, ValueError, msgpack.UnpackException) as exc:
            self.close()
            raise ConfigError(f"cannot open the broker's message log in {str(self._dir)!r}: {exc}") from exc

    # -- the log ------------------------------------------------------------------

    def _segment_path(self, seg: int) -> Path:
        return self._dir / f"messages.{seg}.log"

    def _segments_on_disk(self) -> list[int]:
        found = (_SEGMENT_RE.match(name) for name in os.listdir(self._dir))
        return sorted(int(m.group(1)) for m in found if m is not None)

    def _open_log(self) -> None:
        """Read what the log (and an earlier cmq's ``messages`` table) keeps,
        write what is still queued into a fresh segment, flush it, and remove
        the old segments (see the module's notes)."""
        old = self._segments_on_disk()
        kept = _replay(self._segment_path(seg).read_bytes() for seg in old)
        legacy = self._db.execute("SELECT id, queue, exchange, key, body, props, ttl FROM messages").fetchall()
        for row in legacy:
            kept.setdefault(row[0], ["m", *row])
        queues = {name for (name,) in self._db.execute("SELECT name FROM queues")}
        self._start_segment((old[-1] if old else 0) + 1)
        records = [["msg", *m[1:]] for mid, m in sorted(kept.items()) if m[2] in queues]
        if records:
            self._append(b"".join(_frame(["m", *r[1:]]) for r in records))
            os.fdatasync(self._fd)
            self._index(records)
        if legacy:
            self._db.execute("DELETE FROM messages")
        for seg in old:
            os.unlink(self._segment_path(seg))
        if old:
            os.fsync(self._dirfd)

    def _start_segment(self, seg: int) -> None:
        """Make segment ``seg`` the one written to (its name flushed to the directory)."""
        fd = os.open(self._segment_path(seg), os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        if self._fd >= 0:
            os.close(self._fd)
        self._fd, self._seg, self._pos, self._zeroed = fd, seg, 0, 0
        self._used[seg] = 0
        self._live[seg] = 0
        self._written[seg] = 0
        os.fsync(self._dirfd)

    def _append(self, data: bytes) -> None:
        """Write ``data`` at the head of the log (not flushed)."""
        if self._pos and self._pos + len(data) > SEGMENT_BYTES:
            self._start_segment(self._seg + 1)
        end = self._pos + len(data)
        while self._zeroed < end + _ZERO_CHUNK // 2:  # zeros ahead: flushes never grow the file
            os.pwrite(self._fd, _ZEROS, self._zeroed)
            self._zeroed += _ZERO_CHUNK
        view, pos = memoryview(data), self._pos
        while view:
            n = os.pwrite(self._fd, view, pos)
            view, pos = view[n:], pos + n
        self._pos = self._used[self._seg] = end

    def _index(self, records: Iterable[tuple[Any, ...] | list[Any]]) -> None:
        """Note where the messages of ``records`` (just written) are, and which went."""
        where, live, written, by_queue, seg = self._where, self._live, self._written, self._by_queue, self._seg
        for rec in records:
            kind = rec[0]
            if kind == "msg":
                mid, queue = rec[1], rec[2]
                before = where.get(mid)
                if before is not None:
                    live[before[0]] -= 1
                where[mid] = (seg, queue)
                live[seg] += 1
                written[seg] += 1
                by_queue.setdefault(queue, set()).add(mid)
            elif kind == "msg-":
                self._gone(rec[1])
            elif kind in ("purge", "queue-"):
                for mid in list(by_queue.get(rec[1], ())):
                    self._gone(mid)

    def _gone(self, mid: int) -> None:
        at = self._where.pop(mid, None)
        if at is not None:
            self._live[at[0]] -= 1
            ids = self._by_queue[at[1]]
            ids.discard(mid)
            if not ids:
                del self._by_queue[at[1]]

    def _tidy(self) -> None:
        """Remove the oldest segments while nothing in them is kept; past
        :data:`_MAX_SEGMENTS`, move the oldest's messages to the head first."""
        live = self._live
        while len(live) > 1:
            oldest = min(live)
            if live[oldest]:
                if len(live) <= _MAX_SEGMENTS or live[oldest] * 4 > self._written[oldest]:
                    return  # few segments, or the oldest is mostly still queued: nothing to gain
                data = self._segment_path(oldest).read_bytes()[: self._used[oldest]]
                moved = [["msg", *rec[1:]] for rec in _frames(data)
                         if rec[0] == "m" and self._where.get(rec[1], (None,))[0] == oldest]  # fmt: skip
                self._append(b"".join(_frame(["m", *r[1:]]) for r in moved))
                os.fdatasync(self._fd)
                self._index(moved)
            os.unlink(self._segment_path(oldest))
            os.fsync(self._dirfd)
            del live[oldest], self._used[oldest], self._written[oldest]

    # -- reading and writing ---------------------------------------------------------

    def load(self) -> StoredState:
        """Everything kept, messages in the order they were stored."""
        db = self._db
        segments = []
        for seg in sorted(self._used):
            with open(self._segment_path(seg), "rb") as f:
                segments.append(f.read(self._used[seg]))
        return StoredState(
            exchanges=[(n, t) for n, t in db.execute("SELECT name, type FROM exchanges ORDER BY name")],
            queues=[
                StoredQueue(name=n, max_length=m, overflow=o, arguments=_unpack(a), auto_delete=bool(ad))
                for n, m, o, a, ad in db.execute("SELECT * FROM queues ORDER BY name")
            ],
            bindings=list(db.execute("SELECT queue, exchange, key FROM bindings")),
            exchange_bindings=list(db.execute("SELECT destination, source, key FROM exchange_bindings")),
            messages=[
                StoredMessage(id=i, queue=q, exchange=e, routing_key=k, body=_unpack(b),
                              props=None if p is None else _unpack(p), ttl=t)
                for _, i, q, e, k, b, p, t in sorted(_replay(segments).values(), key=lambda m: m[1])
            ],
        )

    def last_message_id(self) -> int:
        """The largest message id stored (0: none)."""
        return max(self._where, default=0)

    def write(self, records: Iterable[tuple[Any, ...]]) -> None:
        """Apply ``records``: the declarations in one SQLite transaction
        (committed with an fsync), the messages' frames in one write to the
        log, flushed unless every record is one of :data:`UNSYNCED`.

        Raises:
            sqlite3.Error: the write or the flush failed (nothing of the
                records is taken as written; written again, they change
                nothing more: every record can be applied twice).
        """
        records = list(records)
        db, plan, unsynced = self._db, _PLAN, UNSYNCED
        frames: list[bytes] = []
        sync = declared = False
        try:
            for rec in records:
                kind = rec[0]
                if kind not in unsynced:
                    sync = True
                if kind == "msg":
                    frames.append(_frame(["m", *rec[1:8]]))
                elif kind == "msg-":
                    frames.append(_frame(["d", rec[1]]))
                else:
                    if kind in ("purge", "queue-"):
                        frames.append(_frame(["p", rec[1]]))
                    if plan[kind]:
                        if not declared:
                            db.execute("BEGIN")
                            declared = True
                        for sql, n in plan[kind]:
                            db.execute(sql, rec[1 : n + 1])
        except BaseException:
            if declared:
                db.execute("ROLLBACK")
            raise
        if declared:
            db.execute("COMMIT")
        if frames:
            try:
                self._append(b"".join(frames))
                if sync:
                    os.fdatasync(self._fd)
            except OSError as exc:
                raise sqlite3.OperationalError(f"writing the message log failed: {exc}") from exc
        self.commits += 1
        if sync:
            self.flushes += 1
        self._index(records)
        try:
            self._tidy()
        except OSError as exc:
            raise sqlite3.OperationalError(f"removing an old segment of the message log failed: {exc}") from exc

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._dirfd >= 0:
            os.close(self._dirfd)
            self._dirfd = -1
        self._db.close()
        self._lock.close()  # releases the directory
