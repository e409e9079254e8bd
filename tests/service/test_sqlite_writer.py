"""The SQLite store's writer: group commit, job isolation, and answers only
after the WAL fsync (the syncer thread) with ``synchronous="full"``."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cmq.service.errors import QueueDoesNotExist, SqsError, StoreUnavailable
from cmq.service.model import NewMessage, QueueRecord
from cmq.service.store import sqlite as sqlite_store
from cmq.service.store.sqlite import SqliteStore

T0 = 1_700_000_000_000


def _rows(path: Path) -> int:
    """Messages committed, as another connection (another process) sees them."""
    with sqlite3.connect(path) as other:
        return int(other.execute("SELECT count(*) FROM messages").fetchone()[0])


def test_a_send_is_answered_only_after_the_wal_fsync_that_follows_its_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "s.sqlite3"
    entered, gate = threading.Event(), threading.Event()
    synced: list[int] = []
    real = os.fdatasync

    def held_fdatasync(fd: int) -> None:
        entered.set()
        gate.wait(10)
        real(fd)
        synced.append(fd)

    async def go() -> None:
        store = SqliteStore(str(path))
        await store.open()
        try:
            await store.create_queue(QueueRecord(name="q", created_at=T0, modified_at=T0))
            monkeypatch.setattr(sqlite_store.os, "fdatasync", held_fdatasync)
            answered: list[int] = []
            real_answer = sqlite_store._answer

            def recorded_answer(batch: Any, results: Any) -> None:
                answered.append(len(batch))
                real_answer(batch, results)

            monkeypatch.setattr(sqlite_store, "_answer", recorded_answer)
            send = asyncio.ensure_future(
                store.send("q", [NewMessage(message_id="m", payload="p", visible_at=T0)], T0)
            )
            # The fsync began after the commit (another connection reads
            # the message), and the answer waits for it.
            assert await asyncio.to_thread(entered.wait, 10)
            assert _rows(path) == 1
            # No thread has answered the batch (which is what resolves the send).
            assert not answered and not send.done() and not synced
            gate.set()
            [result] = await send
            assert result.seq == 1 and synced
        finally:
            gate.set()
            await store.close()

    asyncio.run(go())


def test_synchronous_normal_answers_after_the_commit_without_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    monkeypatch.setattr(sqlite_store.os, "fdatasync", calls.append)

    async def go() -> None:
        store = SqliteStore(str(tmp_path / "s.sqlite3"), synchronous="normal")
        await store.open()
        try:
            await store.create_queue(QueueRecord(name="q", created_at=T0, modified_at=T0))
            await store.send("q", [NewMessage(message_id="m", payload="p", visible_at=T0)], T0)
        finally:
            await store.close()

    asyncio.run(go())
    assert calls == []


def test_a_failed_fsync_fails_the_jobs_it_was_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(fd: int) -> None:
        raise OSError(5, "Input/output error")

    async def go() -> None:
        store = SqliteStore(str(tmp_path / "s.sqlite3"))
        await store.open()
        try:
            await store.create_queue(QueueRecord(name="q", created_at=T0, modified_at=T0))
            monkeypatch.setattr(sqlite_store.os, "fdatasync", broken)
            with pytest.raises(StoreUnavailable, match="fsync"):
                await store.get_queue("q")
        finally:
            monkeypatch.undo()
            await store.close()

    asyncio.run(go())


def test_a_reopened_store_syncs_its_wal_too(tmp_path: Path) -> None:
    path = str(tmp_path / "s.sqlite3")

    async def once(name: str) -> int | None:
        store = SqliteStore(path)
        await store.open()
        try:
            fd = store._wal_fd
            await store.create_queue(QueueRecord(name=name, created_at=T0, modified_at=T0))
            return fd
        finally:
            await store.close()

    assert asyncio.run(once("a")) is not None
    assert asyncio.run(once("b")) is not None


def _batch(store: SqliteStore, conn: sqlite3.Connection, jobs: list[Any]) -> list[Any]:
    async def go() -> list[Any]:
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in jobs]
        store._run_batch(conn, [(j, f, loop) for j, f in zip(jobs, futures, strict=True)])
        return await asyncio.gather(*futures, return_exceptions=True)

    return asyncio.run(go())


def test_a_job_that_fails_before_writing_costs_the_batch_no_second_run(tmp_path: Path) -> None:
    """The usual failure (a missing queue) writes nothing: the other jobs run
    once, without savepoints, and commit."""
    store = SqliteStore(str(tmp_path / "s.sqlite3"), synchronous="normal")
    conn = store._connect()
    runs: list[str] = []

    def insert(name: str) -> Any:
        def job(c: sqlite3.Connection) -> str:
            runs.append(name)
            c.execute(
                "INSERT INTO queues (name, attributes, created_at, modified_at) "
                "VALUES (?, '{}', 0, 0)",
                (name,),
            )
            return name

        return job

    def missing(c: sqlite3.Connection) -> None:
        runs.append("missing")
        sqlite_store._check_queue(c, "nope")

    try:
        outcomes = _batch(store, conn, [insert("a"), missing, insert("b")])
        names = [r[0] for r in conn.execute("SELECT name FROM queues ORDER BY name")]
    finally:
        conn.close()
    assert runs == ["a", "missing", "b"]
    assert names == ["a", "b"]
    assert outcomes[0] == "a" and outcomes[2] == "b"
    assert isinstance(outcomes[1], QueueDoesNotExist)


def test_one_failing_job_rolls_back_alone_in_a_shared_transaction(tmp_path: Path) -> None:
    """Jobs of one batch share a transaction; each runs in its own savepoint,
    so a job that wrote and then failed leaves nothing, and the jobs before
    and after it commit."""
    store = SqliteStore(str(tmp_path / "s.sqlite3"), synchronous="normal")
    conn = store._connect()

    def insert(name: str, then: str | None = None) -> Any:
        def job(c: sqlite3.Connection) -> str:
            c.execute(
                "INSERT INTO queues (name, attributes, created_at, modified_at) "
                "VALUES (?, '{}', 0, 0)",
                (name,),
            )
            if then == "sqs":
                raise QueueDoesNotExist("gone")
            if then == "sqlite":
                c.execute("SELECT * FROM no_such_table")
            if then == "bug":
                raise KeyError(name)
            return name

        return job

    async def go() -> list[Any]:
        loop = asyncio.get_running_loop()
        jobs = [
            insert("a"),
            insert("b", "sqs"),
            insert("c", "sqlite"),
            insert("d"),
            insert("e", "bug"),
            insert("f"),
        ]
        futures = [loop.create_future() for _ in jobs]
        store._run_batch(conn, [(j, f, loop) for j, f in zip(jobs, futures, strict=True)])
        return await asyncio.gather(*futures, return_exceptions=True)

    try:
        outcomes = asyncio.run(go())
        names = [r[0] for r in conn.execute("SELECT name FROM queues ORDER BY name")]
    finally:
        conn.close()
    assert names == ["a", "d", "f"]
    assert outcomes[0] == "a" and outcomes[3] == "d" and outcomes[5] == "f"
    assert isinstance(outcomes[1], SqsError)
    assert isinstance(outcomes[2], StoreUnavailable)
    assert isinstance(outcomes[4], KeyError)


def test_operations_on_a_deleted_queue_say_so_on_the_shortened_paths(tmp_path: Path) -> None:
    """send, receive and delete check the queue only when their own
    statements do not show it exists; a missing queue still fails."""
    from cmq.service.model import ReceiveSpec

    async def go() -> None:
        store = SqliteStore(str(tmp_path / "s.sqlite3"))
        await store.open()
        try:
            spec = ReceiveSpec(
                now=T0, max_messages=1, visibility_ms=1000, k=1, fifo=False, token="t", rand=(0.0,)
            )
            with pytest.raises(QueueDoesNotExist):
                await store.send(
                    "gone", [NewMessage(message_id="m", payload="p", visible_at=T0)], T0
                )
            with pytest.raises(QueueDoesNotExist):
                await store.receive("gone", spec)
            with pytest.raises(QueueDoesNotExist):
                await store.delete("gone", [(1, "t")])
            with pytest.raises(QueueDoesNotExist):
                await store.delete("gone", [])
            await store.create_queue(QueueRecord(name="q", created_at=T0, modified_at=T0))
            [sent] = await store.send(
                "q", [NewMessage(message_id="m", payload="p", visible_at=T0)], T0
            )
            [got] = await store.receive("q", spec)
            await store.delete("q", [(got.seq, "stale")])  # a stale handle: no error
            await store.delete("q", [(got.seq, got.token)])
            assert await store.receive("q", spec) == []
            assert sent.seq == got.seq
        finally:
            await store.close()

    asyncio.run(go())


@given(
    visible=st.lists(st.booleans(), max_size=30),
    n=st.integers(1, 10),
    counts=st.lists(st.integers(0, 3), min_size=30, max_size=30),
)
@settings(max_examples=30, deadline=None)
def test_a_k1_receive_in_one_statement_picks_what_the_window_picks(
    tmp_path_factory: pytest.TempPathFactory, visible: list[bool], n: int, counts: list[int]
) -> None:
    """_take_head (k = 1, one UPDATE ... RETURNING) hands out exactly what
    standard_picks over _window would, in the same order, marked alike."""
    from cmq.service.model import ReceiveSpec
    from cmq.service.ordering import standard_picks

    path = tmp_path_factory.mktemp("k1") / "s.sqlite3"
    store = SqliteStore(str(path), synchronous="normal")
    conn = store._connect()
    try:
        conn.execute(
            "INSERT INTO queues (name, attributes, created_at, modified_at) VALUES ('q', '{}', 0, 0)"
        )
        for seq, vis in enumerate(visible, start=1):
            conn.execute(
                "INSERT INTO messages (queue, seq, payload, visible_at, receive_count) "
                "VALUES ('q', ?, ?, ?, ?)",
                (seq, f"p{seq}", T0 - 1 if vis else T0 + 1, counts[seq - 1]),
            )
        spec = ReceiveSpec(
            now=T0, max_messages=n, visibility_ms=5, k=1, fifo=False, token="t", rand=(0.5,) * n
        )
        expected = standard_picks(sqlite_store._window(conn, "q", spec), 1, n, spec.rand)
        # The atomic window (in-flight messages counted) picks the same at k = 1.
        assert sqlite_store._atomic_window(conn, "q", spec) == expected
        got = sqlite_store._take_head(conn, "q", spec)
    finally:
        conn.close()
    assert [r.seq for r in got] == expected
    for r in got:
        assert r.payload == f"p{r.seq}" and r.token == "t"
        assert r.receive_count == counts[r.seq - 1] + 1
        assert r.first_receive_at == (T0 if counts[r.seq - 1] == 0 else 0)
