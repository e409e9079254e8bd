"""cmq.AsyncQueue: the same behaviour on asyncio, from the same sans-IO core."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

import cmq
from cmq.patterns import replace


def run(coro_fn: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(asyncio.wait_for(coro_fn(), 20))


def test_push_get_and_async_for() -> None:
    async def main() -> list[bytes]:
        async with await cmq.AsyncQueue.open(0, "127.0.0.1") as a, await cmq.AsyncQueue.open(0, "127.0.0.1") as b:
            for i in range(1000):
                a.push(("127.0.0.1", b.port), b"%d" % i)
            a.flush()
            got = []
            async for m in b:
                got.append(m)
                if len(got) == 1000:
                    break
            assert b.pop() is None
            return got

    assert run(main) == [b"%d" % i for i in range(1000)]


def test_get_times_out_and_batch_leaves_by_timer() -> None:
    async def main() -> None:
        a = await cmq.AsyncQueue.open(0, "127.0.0.1", idle_gap=float("inf"), timeout=0.01)
        b = await cmq.AsyncQueue.open(0, "127.0.0.1")
        with pytest.raises(cmq.Timeout):
            await b.get(timeout=0.02)
        a.push(("127.0.0.1", b.port), b"batched")
        assert a.stats().pending == 1
        # Nobody flushes: the timer must.
        assert await b.get(timeout=2) == b"batched"
        a.close()
        b.close()

    run(main)


def test_a_push_after_awaited_input_is_not_batched() -> None:
    """As Queue's: with a 10 s idle gap, ping-pong still never opens a batch."""

    async def main() -> None:
        a = await cmq.AsyncQueue.open(0, "127.0.0.1", idle_gap=10.0, timeout=3600.0)
        b = await cmq.AsyncQueue.open(0, "127.0.0.1", idle_gap=10.0, timeout=3600.0)
        dest = ("127.0.0.1", b.port)

        async def echo() -> None:
            for _ in range(10):
                m = await b.get_message(timeout=5)
                b.push(m.sender, m.payload)
                assert b.stats().pending == 0

        server = asyncio.create_task(echo())
        for i in range(10):
            a.push(dest, b"%d" % i)
            assert a.stats().pending == 0
            assert await a.get(timeout=5) == b"%d" % i
        await server
        a.push(dest, b"x")
        a.push(dest, b"y")  # no wait in between: the idle gap applies
        assert a.stats().pending == 1
        a.close()
        b.close()

    run(main)


def test_request_reply_fragments_and_selective_receive() -> None:
    async def main() -> None:
        a = await cmq.AsyncQueue.open(0, "127.0.0.1", codec="msgpack")
        b = await cmq.AsyncQueue.open(0, "127.0.0.1", codec="msgpack")
        dest = ("127.0.0.1", b.port)

        async def serve() -> None:
            m = await b.get_message(timeout=5)
            b.reply(m, {"len": len(m.payload)})

        server = asyncio.create_task(serve())
        assert await a.request(dest, "x" * 300_000, timeout=5) == {"len": 300_000}
        await server
        for v in ("a", "b", "c"):
            a.push(dest, v)
        assert await b.receive(lambda v: v == "b", timeout=2) == "b"
        assert [await b.get(timeout=2), await b.get(timeout=2)] == ["a", "c"]
        fut = replace(a, dest, lambda n: n, timeout=0.02, attempts=2)
        with pytest.raises(cmq.Timeout):
            await fut
        assert [await b.get(timeout=2), await b.get(timeout=2)] == [1, 2]
        a.close()
        b.close()

    run(main)


def test_close_wakes_waiters_and_fails_requests() -> None:
    async def main() -> None:
        a = await cmq.AsyncQueue.open(0, "127.0.0.1")
        b = await cmq.AsyncQueue.open(0, "127.0.0.1")
        waiter = asyncio.create_task(b.get())
        req = a.request_future(("127.0.0.1", b.port), b"?", timeout=60)
        await asyncio.sleep(0)
        b.close()
        a.close()
        with pytest.raises(cmq.Closed):
            await waiter
        with pytest.raises(cmq.Closed):
            await req

    run(main)


def test_close_closes_at_once_and_may_be_awaited() -> None:
    """`await q.close()` (as with the other asyncio clients) works, and so does a plain call."""

    async def main() -> None:
        a = await cmq.AsyncQueue.open(0, "127.0.0.1")
        b = await cmq.AsyncQueue.open(0, "127.0.0.1")
        assert await a.close() is None
        assert a.closed
        with pytest.raises(cmq.Closed):
            a.push(("127.0.0.1", b.port), b"late")
        b.close()  # not awaited: closed all the same, nothing left pending
        assert b.closed
        await b.close()  # again: a no-op

    run(main)
