"""The store contract, in virtual time, on every store.

Stores take the time as an argument, so visibility deadlines, delays and the
dedup window are tested here by passing later times: nothing waits.
"""

from __future__ import annotations

import asyncio
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


def _spec(now: int, n: int = 1, k: int = 1, vis: int = 30_000, fifo: bool = False) -> ReceiveSpec:
    return ReceiveSpec(
        now=now,
        max_messages=n,
        visibility_ms=vis,
        k=k,
        fifo=fifo,
        token=f"t{now}",
        rand=tuple(0.5 for _ in range(n)),
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
        await store.send(q, [_msg(i) for i in range(6)], T0)
        in_order = await store.receive(q, _spec(T0, n=3, k=1))
        assert [r.payload for r in in_order] == ["p0", "p1", "p2"]
        # rand 0.5 over a window of 3 picks the middle one each time.
        picked = await store.receive(q, _spec(T0, n=2, k=3))
        assert [r.payload for r in picked] == ["p4", "p5"]

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
