"""The store contract, in virtual time, on every store.

Stores take the time as an argument, so visibility deadlines, delays and the
dedup window are tested here by passing later times: nothing waits.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from cmq.service.errors import QueueDoesNotExist
from cmq.service.model import ChangeResult, NewMessage, QueueRecord, ReceiveSpec
from cmq.service.store.base import Store
from cmq.service.store.memory import MemoryStore
from cmq.service.store.sqlite import SqliteStore

T0 = 1_700_000_000_000


def _make(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    if kind == "memory":
        return MemoryStore()
    if kind == "sqlite":
        return SqliteStore(str(tmp_path / "s.sqlite3"))
    from cmq.service.store.redis_cluster import RedisClusterStore

    cluster = request.getfixturevalue("redis_cluster")
    return RedisClusterStore([("127.0.0.1", p) for p in cluster.live_ports()])


@pytest.fixture(params=["memory", "sqlite", "redis"])
def with_store(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Callable[[Callable[[Store, str], Awaitable[None]]], None]:
    def runner(body: Callable[[Store, str], Awaitable[None]]) -> None:
        async def go() -> None:
            store = _make(request.param, request, tmp_path)
            await store.open()
            try:
                name = f"s-{uuid.uuid4().hex[:10]}"
                await store.create_queue(QueueRecord(name=name, created_at=T0, modified_at=T0))
                await body(store, name)
            finally:
                await store.close()

        asyncio.run(go())

    return runner


def _msg(i: int, at: int = T0, **kw: Any) -> NewMessage:
    return NewMessage(message_id=f"id{i}", payload=f"p{i}", visible_at=at, **kw)


def _spec(
    now: int,
    n: int = 1,
    k: int = 1,
    vis: int = 30_000,
    fifo: bool = False,
    lock_free: bool = False,
    token: str = "",
) -> ReceiveSpec:
    return ReceiveSpec(
        now=now,
        max_messages=n,
        visibility_ms=vis,
        k=k,
        fifo=fifo,
        token=token or f"t{now}",
        rand=tuple(0.5 for _ in range(n)),
        lock_free=lock_free,
    )


def test_visibility_deadline(with_store: Any) -> None:
    async def body(store: Store, q: str) -> None:
        await store.send(q, [_msg(1)], T0)
        [r] = await store.receive(q, _spec(T0, vis=10_000))
        assert (r.payload, r.receive_count, r.first_receive_at) == ("p1", 1, T0)
        assert await store.receive(q, _spec(T0 + 9_999)) == []
        counts = await store.counts(q, T0 + 9_999)
        assert (counts.visible, counts.in_flight, counts.delayed) == (0, 1, 0)
        [again] = await store.receive(q, _spec(T0 + 10_000))
        assert (again.receive_count, again.first_receive_at) == (2, T0)

    with_store(body)


def test_delay_counts_as_delayed(with_store: Any) -> None:
    async def body(store: Store, q: str) -> None:
        await store.send(q, [_msg(1, at=T0 + 5_000)], T0)
        counts = await store.counts(q, T0)
        assert (counts.visible, counts.in_flight, counts.delayed) == (0, 0, 1)
        assert await store.receive(q, _spec(T0 + 4_999)) == []
        assert len(await store.receive(q, _spec(T0 + 5_000))) == 1

    with_store(body)


def test_change_visibility_and_stale_tokens(with_store: Any) -> None:
    async def body(store: Store, q: str) -> None:
        [sent] = await store.send(q, [_msg(1)], T0)
        [r] = await store.receive(q, _spec(T0))
        assert (
            await store.change_visibility(q, r.seq, "other", T0, T0) is ChangeResult.NOT_IN_FLIGHT
        )
        assert await store.change_visibility(q, r.seq, r.token, T0 + 1, T0) is ChangeResult.OK
        [r2] = await store.receive(q, _spec(T0 + 1))
        assert (
            await store.change_visibility(q, r.seq, r.token, T0, T0 + 1)
            is ChangeResult.NOT_IN_FLIGHT
        )
        await store.delete(q, [(r2.seq, r.token)])  # stale token: not deleted
        assert (await store.counts(q, T0 + 1)).in_flight == 1
        await store.delete(q, [(r2.seq, r2.token)])
        assert (
            await store.change_visibility(q, sent.seq, r2.token, T0, T0) is ChangeResult.NOT_FOUND
        )

    with_store(body)


def test_k_window_and_order(with_store: Any) -> None:
    async def body(store: Store, q: str) -> None:
        await store.send(q, [_msg(i) for i in range(10)], T0)
        in_order = await store.receive(q, _spec(T0, n=3, k=1))
        assert [r.payload for r in in_order] == ["p0", "p1", "p2"]
        # p0-p2, in flight, fill the window of 3: each pick is the first
        # visible message after them.
        picked = await store.receive(q, _spec(T0, n=2, k=3))
        assert [r.payload for r in picked] == ["p3", "p4"]
        # rand 0.5 over a window of 3 visible picks the middle one each time.
        await store.delete(q, [(r.seq, r.token) for r in in_order + picked])
        picked = await store.receive(q, _spec(T0, n=2, k=3, lock_free=True))
        assert [r.payload for r in picked] == ["p6", "p7"]

    with_store(body)


def test_fifo_groups_and_dedup_window(with_store: Any) -> None:
    async def body(store: Store, q: str) -> None:
        window = T0 + 300_000
        sent = await store.send(
            q,
            [
                _msg(1, group_id="a", dedup_id="d1", dedup_until=window),
                _msg(2, group_id="a", dedup_id="d2", dedup_until=window),
                _msg(3, group_id="b", dedup_id="d3", dedup_until=window),
                _msg(9, group_id="a", dedup_id="d1", dedup_until=window),
            ],
            T0,
        )
        assert [s.duplicate for s in sent] == [False, False, False, True]
        assert sent[3].message_id == "id1" and sent[3].seq == sent[0].seq
        [a1] = await store.receive(q, _spec(T0, n=1, fifo=True))
        assert a1.payload == "p1"
        [b] = await store.receive(q, _spec(T0, n=10, fifo=True))  # a is blocked
        assert b.payload == "p3"
        later = await store.send(
            q, [_msg(9, group_id="a", dedup_id="d1", dedup_until=window + 1)], window
        )
        assert not later[0].duplicate

    with_store(body)


def test_purge_delete_queue_and_missing_queue(with_store: Any) -> None:
    async def body(store: Store, q: str) -> None:
        await store.send(q, [_msg(1), _msg(2)], T0)
        await store.purge(q)
        assert await store.receive(q, _spec(T0, n=10)) == []
        assert q in await store.list_queues(q[:4])
        await store.set_attributes(q, {"VisibilityTimeout": "5"}, T0 + 1)
        record = await store.get_queue(q)
        assert record.attributes["VisibilityTimeout"] == "5" and record.modified_at == T0 + 1
        _, created = await store.create_queue(QueueRecord(name=q))
        assert not created
        await store.delete_queue(q)
        with pytest.raises(QueueDoesNotExist):
            await store.send(q, [_msg(3)], T0)
        with pytest.raises(QueueDoesNotExist):
            await store.receive(q, _spec(T0))
        assert q not in await store.list_queues("")

    with_store(body)


def test_redis_store_acknowledges_after_a_replica_has_the_write(redis_cluster: Any) -> None:
    from cmq.service.store.redis_cluster import RedisClusterStore

    async def go() -> None:
        store = RedisClusterStore([("127.0.0.1", p) for p in redis_cluster.live_ports()])
        await store.open()
        try:
            # Every master of the test cluster has one online replica, so
            # every send is followed by WAIT 1 on its connection.
            assert {entry[1] for entry in store._slots if entry is not None} == {1}
            name = f"w-{uuid.uuid4().hex[:8]}"
            await store.create_queue(QueueRecord(name=name))
            [sent] = await store.send(name, [_msg(1)], T0)
            assert sent.seq == 1
        finally:
            await store.close()

    asyncio.run(go())


def test_sqlite_writer_survives_a_failing_job(tmp_path: Path) -> None:
    async def go() -> None:
        store = SqliteStore(str(tmp_path / "w.sqlite3"))
        await store.open()
        try:

            def broken(conn: Any) -> None:
                raise TypeError("a bug")

            with pytest.raises(TypeError):
                await store._run(broken)
            await store.create_queue(QueueRecord(name="after"))
            assert await store.list_queues("") == ["after"]
        finally:
            await store.close()

    asyncio.run(go())


# -- receive modes ---------------------------------------------------------------


class _Gate:
    """A ``between_read_and_write`` hook that holds every receive after its
    read until ``parties`` receives have read: all of them read the same
    index before any writes (a deterministic interleaving, no timing)."""

    def __init__(self, parties: int) -> None:
        self.parties, self.reads, self.calls = parties, 0, 0
        self.all_read = asyncio.Event()

    async def __call__(self, name: str, picks: list[int]) -> None:
        self.calls += 1
        self.reads += 1
        if self.reads >= self.parties:
            self.all_read.set()
        await asyncio.wait_for(self.all_read.wait(), 30)


def test_atomic_receives_never_share_a_message(with_store: Any) -> None:
    async def body(store: Store, q: str) -> None:
        await store.send(q, [_msg(i) for i in range(3)], T0)
        gate = _Gate(2)
        store.between_read_and_write = gate
        a, b = await asyncio.gather(
            store.receive(q, _spec(T0, token="a")), store.receive(q, _spec(T0, token="b"))
        )
        assert gate.calls == 0  # an atomic receive has no gap to pause in
        assert sorted(r.payload for r in a + b) == ["p0", "p1"]
        assert {r.receive_count for r in a + b} == {1}

    with_store(body)


def test_lock_free_receives_that_read_before_either_writes_share_a_message(
    with_store: Any,
) -> None:
    async def body(store: Store, q: str) -> None:
        await store.send(q, [_msg(i) for i in range(3)], T0)
        gate = _Gate(2)
        store.between_read_and_write = gate
        a, b = await asyncio.gather(
            store.receive(q, _spec(T0, lock_free=True, token="a")),
            store.receive(q, _spec(T0, lock_free=True, token="b")),
        )
        assert gate.calls == 2
        [ra], [rb] = a, b
        assert ra.payload == rb.payload == "p0"  # the duplicate
        assert sorted((ra.receive_count, rb.receive_count)) == [1, 2]
        store.between_read_and_write = None
        # Nothing lost: the duplicate is in flight once, the others visible,
        # and the two handles together delete it.
        counts = await store.counts(q, T0)
        assert (counts.visible, counts.in_flight) == (2, 1)
        await store.delete(q, [(ra.seq, "a"), (rb.seq, "b")])
        assert (await store.counts(q, T0)).in_flight == 0
        rest = await store.receive(q, _spec(T0, n=10, lock_free=True, token="c"))
        assert [r.payload for r in rest] == ["p1", "p2"]

    with_store(body)


def _two_nodes(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Store, Store]:
    """Two stores over the same data, as two service nodes have: the memory
    store is one process, so both are the same object there."""
    first = _make(kind, request, tmp_path)
    return first, (first if kind == "memory" else _make(kind, request, tmp_path))


@pytest.mark.parametrize("kind", ["memory", "sqlite", "redis"])
def test_lock_free_on_two_nodes_last_write_wins_and_nothing_is_lost(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    async def go() -> None:
        one, two = _two_nodes(kind, request, tmp_path)
        await one.open()
        if two is not one:
            await two.open()
        try:
            q = f"lf-{uuid.uuid4().hex[:10]}"
            await one.create_queue(QueueRecord(name=q, created_at=T0, modified_at=T0))
            await one.send(q, [_msg(i) for i in range(4)], T0)
            a = _spec(T0, k=2, lock_free=True, token="a")
            b = _spec(T0 + 1, k=2, lock_free=True, token="b")
            # Node one reads, node two reads, node one writes, node two writes.
            picks_a, picks_b = await one.peek(q, a), await two.peek(q, b)
            assert picks_a == picks_b == [2]  # rand 0.5 of the window [1, 2]
            [ra] = await one.mark(q, a, picks_a)
            [rb] = await two.mark(q, b, picks_b)
            assert (ra.payload, ra.receive_count, ra.first_receive_at) == ("p1", 1, T0)
            assert (rb.payload, rb.receive_count, rb.first_receive_at) == ("p1", 2, T0)
            # The later write's token is the message's: the earlier handle is
            # stale (it deletes nothing, as in SQS), the later one deletes.
            await one.delete(q, [(ra.seq, "a")])
            assert (await two.counts(q, T0 + 1)).in_flight == 1
            await two.delete(q, [(rb.seq, "b")])
            assert (await one.counts(q, T0 + 1)).in_flight == 0
            # A pick deleted between the read and the write is skipped and
            # leaves nothing behind.
            c = _spec(T0 + 2, lock_free=True, token="c")
            d = _spec(T0 + 2, lock_free=True, token="d")
            picks_c, picks_d = await one.peek(q, c), await two.peek(q, d)
            assert picks_c == picks_d == [1]
            [rc] = await one.mark(q, c, picks_c)
            await one.delete(q, [(rc.seq, "c")])
            assert await two.mark(q, d, picks_d) == []
            counts = await one.counts(q, T0 + 2)
            assert (counts.visible, counts.in_flight, counts.delayed) == (2, 0, 0)
            rest = await two.receive(q, _spec(T0 + 3, n=10, lock_free=True, token="e"))
            assert sorted(r.payload for r in rest) == ["p2", "p3"]
        finally:
            await one.close()
            if two is not one:
                await two.close()

    asyncio.run(go())


def test_memory_lock_free_without_a_pause_behaves_atomically() -> None:
    # One process, and nothing yields between the read and the write: the
    # documented behaviour of the memory store (no duplicates).
    async def go() -> None:
        store = MemoryStore()
        await store.create_queue(QueueRecord(name="m"))
        await store.send("m", [_msg(i) for i in range(5)], T0)
        got = await asyncio.gather(
            *(store.receive("m", _spec(T0, lock_free=True, token=f"t{i}")) for i in range(5))
        )
        assert sorted(r.payload for rs in got for r in rs) == [f"p{i}" for i in range(5)]

    asyncio.run(go())


def test_fifo_queue_receives_atomically_even_when_asked_lock_free(with_store: Any) -> None:
    async def body(store: Store, q: str) -> None:
        await store.send(q, [_msg(1, group_id="g"), _msg(2, group_id="g")], T0)
        gate = _Gate(2)
        store.between_read_and_write = gate
        [first] = await store.receive(q, _spec(T0, fifo=True, lock_free=True))
        assert first.payload == "p1" and gate.calls == 0
        assert await store.receive(q, _spec(T0, fifo=True, lock_free=True)) == []

    with_store(body)


def test_browse_shows_messages_without_receiving_them(with_store: Any) -> None:
    async def body(store: Store, name: str) -> None:
        await store.send(name, [_msg(i, T0 + (0 if i < 3 else 60_000)) for i in range(4)], T0)
        got = await store.receive(name, _spec(T0, n=1, token="t1"))
        assert len(got) == 1
        seen = await store.browse(name, 10)
        assert [b.payload for b in seen] == ["p0", "p1", "p2", "p3"]
        assert [b.receive_count for b in seen] == [1, 0, 0, 0]
        assert (await store.browse(name, 2))[1].payload == "p1"
        # Browsing twice changed nothing: the next receive takes p1, first time.
        again = await store.receive(name, _spec(T0, n=1, token="t2"))
        assert (again[0].payload, again[0].receive_count) == ("p1", 1)
        counts = await store.counts_many([name, "no-such-queue"], T0)
        assert list(counts) == [name]
        assert counts[name] == await store.counts(name, T0)
        with pytest.raises(QueueDoesNotExist):
            await store.browse("no-such-queue", 1)

    with_store(body)


def test_sqlite_lock_free_read_does_not_wait_for_another_nodes_write_lock(tmp_path: Path) -> None:
    # The paper's lock-free read takes no lock. Another process (a raw
    # connection here) holds SQLite's write lock: the read of a lock-free
    # receive still answers, from the last committed state, while an atomic
    # receive (read and write in one write transaction) has to wait.
    import sqlite3

    path = str(tmp_path / "s.sqlite3")

    async def go() -> None:
        store = SqliteStore(path)
        await store.open()
        other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        try:
            await store.create_queue(QueueRecord(name="q", created_at=T0, modified_at=T0))
            await store.send("q", [_msg(i) for i in range(3)], T0)
            other.execute("BEGIN IMMEDIATE")  # the other node is mid-write
            other.execute("UPDATE messages SET receive_count = 0 WHERE seq = 3")
            atomic = asyncio.ensure_future(store.receive("q", _spec(T0, token="a")))
            picks = await asyncio.wait_for(store.peek("q", _spec(T0, lock_free=True)), 30)
            assert picks == [1]
            assert not atomic.done()  # still queued behind the write lock
            other.execute("COMMIT")
            [got] = await asyncio.wait_for(atomic, 30)
            assert got.payload == "p0"
        finally:
            other.close()
            await store.close()

    asyncio.run(go())


def _last_of_window(now: int, k: int, token: str, lock_free: bool) -> ReceiveSpec:
    """A receive of one message that picks the last of its window of K."""
    return ReceiveSpec(now=now, max_messages=1, visibility_ms=30_000, k=k, fifo=False,
                       token=token, rand=(0.99,), lock_free=lock_free)  # fmt: skip


def test_atomic_receives_count_messages_in_flight_in_the_k_window(with_store: Any) -> None:
    # Three receivers at K=2, each holding its pick (in flight) while the
    # next one receives, as concurrent receivers do. Each picks the last of
    # its window. The window counts the picks in flight: the second receive
    # is left p0 only, the third finds both in flight and takes the first
    # visible message after them. (Counting only visible messages, they
    # handed out p1, p2, p3: K + T - 1 deep, more out of order than racing
    # lock-free receivers, which all read p0, p1 and take p1.)
    async def body(store: Store, q: str) -> None:
        await store.send(q, [_msg(i) for i in range(6)], T0)
        atomic = [await store.receive(q, _last_of_window(T0, 2, f"a{i}", False))
                  for i in range(3)]  # fmt: skip
        assert [r.payload for rs in atomic for r in rs] == ["p1", "p0", "p2"]
        # p0 deleted, p1 back in view after its timeout, p2 still held: the
        # window is p1 and p2, so the last of it that is visible is p1.
        await store.delete(q, [(atomic[1][0].seq, "a1")])
        later = T0 + 30_000
        await store.change_visibility(q, atomic[2][0].seq, "a2", later + 30_000, T0)
        [again] = await store.receive(q, _last_of_window(later, 2, "b", False))
        assert (again.payload, again.receive_count) == ("p1", 2)

    with_store(body)


def test_a_delayed_message_holds_no_place_in_the_atomic_window(with_store: Any) -> None:
    # Delayed (never received) is not in flight: the window of K=2 is p1, p2.
    async def body(store: Store, q: str) -> None:
        await store.send(q, [_msg(0, at=T0 + 60_000), _msg(1), _msg(2)], T0)
        [r] = await store.receive(q, _last_of_window(T0, 2, "a", False))
        assert r.payload == "p2"

    with_store(body)


def test_racing_lock_free_receives_read_k_visible_messages(with_store: Any) -> None:
    # The lock-free mode keeps the paper's window of the first K visible
    # messages: with p1 held, three racing receives at K=2 read p0 and p2
    # and all take p2 (2 duplicates).
    async def body(store: Store, q: str) -> None:
        await store.send(q, [_msg(i) for i in range(6)], T0)
        [held] = await store.receive(q, _last_of_window(T0, 2, "h", False))
        assert held.payload == "p1"
        gate = _Gate(3)
        store.between_read_and_write = gate
        racing = await asyncio.gather(
            *(store.receive(q, _last_of_window(T0, 2, f"l{i}", True)) for i in range(3))
        )
        assert [r.payload for rs in racing for r in rs] == ["p2"] * 3

    with_store(body)


@pytest.mark.parametrize("t_recv", [2, 3])
@pytest.mark.parametrize("k", [2, 3])
def test_interleaved_atomic_drains_stay_within_the_first_k(
    with_store: Any, t_recv: int, k: int
) -> None:
    # T receivers take turns: each deletes what it holds, then receives
    # again, so the other T - 1 always hold a message in flight, as in the
    # lab's drains. Every pick lies within the first K messages not yet
    # deleted, unless all K of them are in flight; then it is the first
    # visible message. (Counting only visible messages, picks reached
    # K + T - 1 deep.)
    async def body(store: Store, q: str) -> None:
        total = 30
        await store.send(q, [_msg(i) for i in range(total)], T0)
        undeleted = list(range(1, total + 1))
        held: dict[int, tuple[int, str]] = {}
        rng = random.Random(f"{t_recv}-{k}")
        for turn in range(total):
            who = turn % t_recv
            if who in held:
                seq, token = held.pop(who)
                await store.delete(q, [(seq, token)])
                undeleted.remove(seq)
            token = f"r{who}-{turn}"
            spec = ReceiveSpec(now=T0, max_messages=1, visibility_ms=30_000, k=k, fifo=False,
                               token=token, rand=(rng.random(),))  # fmt: skip
            got = await store.receive(q, spec)
            if not got:
                continue
            [r] = got
            window = undeleted[:k]
            in_flight = {s for s, _ in held.values()}
            if all(s in in_flight for s in window):
                assert r.seq == next(s for s in undeleted if s not in in_flight)
            else:
                assert r.seq in window and r.seq not in in_flight
            held[who] = (r.seq, token)

    with_store(body)
