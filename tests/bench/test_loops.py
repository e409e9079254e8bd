"""The shared round-trip loops, driven by in-memory peers (no sockets)."""

from __future__ import annotations

import asyncio
from collections import deque

import pytest

from cmq.lab.systems import _common


class EchoPeer:
    """Echoes what is sent, except the sequence numbers in ``drop``."""

    def __init__(self, drop: set[int] = frozenset(), late: bool = False) -> None:
        self.drop = drop
        self.late = late  # deliver dropped ones after the rest
        self.queue: deque[bytes] = deque()
        self.held: list[bytes] = []
        self.sent: list[bytes] = []

    def send(self, msg: bytes) -> None:
        self.sent.append(msg)
        seq = _common.seq_of(msg)
        if seq in self.drop:
            self.held.append(msg)
        else:
            self.queue.append(msg)

    def recv(self, left: float) -> bytes | None:
        assert left > 0
        if self.queue:
            return self.queue.popleft()
        return None


def test_numbered_payloads_carry_their_sequence() -> None:
    for size in (4, 5, 512):
        msg = _common.numbered(70000, size)
        assert len(msg) == size and _common.seq_of(msg) == 70000
    assert _common.seq_of(_common.numbered(3, 3)) is None
    assert _common.payload(7) == b"x" * 7 and _common.payload(1) != _common.END


def test_pingpong_counts_every_round_trip() -> None:
    peer = EchoPeer()
    out = _common.pingpong_loop(peer.send, peer.recv, size=8, count=100, timeout=1.0)
    assert len(out["send_ns"]) == len(out["recv_ns"]) == 100
    assert all(r >= s for s, r in zip(out["send_ns"], out["recv_ns"], strict=True))
    assert out["stale"] == 0 and len(peer.sent) == 100


def test_pingpong_counts_lost_round_trips_and_skips_stale_replies() -> None:
    peer = EchoPeer(drop={3, 7})
    out = _common.pingpong_loop(peer.send, peer.recv, size=8, count=10, timeout=1.0)
    lost = [i for i, r in enumerate(out["recv_ns"]) if r < 0]
    assert lost == [3, 7]
    # A late reply to round trip 3 arriving during round trip 4 is stale.
    peer = EchoPeer()
    peer.queue.append(_common.numbered(99, 8))
    out = _common.pingpong_loop(peer.send, peer.recv, size=8, count=1, timeout=1.0)
    assert out["stale"] == 1 and out["recv_ns"][0] >= 0


@pytest.mark.parametrize("window", [1, 4, 64])
def test_pingping_fills_the_window_and_loses_nothing(window: int) -> None:
    peer = EchoPeer()
    outstanding = most = 0

    def send(msg: bytes) -> None:
        nonlocal outstanding, most
        peer.send(msg)
        outstanding += 1
        most = max(most, outstanding)

    def recv(left: float) -> bytes | None:
        nonlocal outstanding
        msg = peer.recv(left)
        outstanding -= msg is not None
        return msg

    out = _common.pingping_loop(send, recv, size=8, count=100, timeout=1.0, window=window)
    assert all(r >= 0 for r in out["recv_ns"])
    assert out["late"] == out["stale"] == 0
    # The next message goes before the reply: the window fills, never overflows.
    assert most == window


def test_pingping_expires_a_lost_message() -> None:
    peer = EchoPeer(drop={2})
    out = _common.pingping_loop(peer.send, peer.recv, size=8, count=5, timeout=1e-4, window=8)
    assert [r < 0 for r in out["recv_ns"]] == [False, False, True, False, False]
    assert out["late"] == 0


def test_pingping_counts_a_reply_after_its_timeout_as_late() -> None:
    peer = EchoPeer(drop={0})

    def send(msg: bytes) -> None:
        if _common.seq_of(msg) == 1:
            # Message 0's reply turns up only once message 1 is sent, which
            # with a window of 1 is after message 0 expired.
            peer.queue.extend(peer.held)
            peer.held.clear()
        peer.send(msg)

    out = _common.pingping_loop(send, peer.recv, size=8, count=3, timeout=1e-4, window=1)
    assert out["recv_ns"][0] == -1 and out["late"] == 1
    assert out["recv_ns"][1] >= 0 and out["recv_ns"][2] >= 0


def test_pingping_needs_room_for_the_sequence_number() -> None:
    peer = EchoPeer()
    with pytest.raises(ValueError, match="at least 4 bytes"):
        _common.pingping_loop(peer.send, peer.recv, size=3, count=1, timeout=1.0, window=2)


def test_async_loops_match_the_sync_ones() -> None:
    peer = EchoPeer(drop={1})

    async def send(msg: bytes) -> None:
        peer.send(msg)

    async def recv(left: float) -> bytes | None:
        return peer.recv(left)

    async def main() -> tuple[dict[str, list[int]], dict[str, list[int]]]:
        a = await _common.pingpong_loop_async(send, recv, size=8, count=5, timeout=1.0)
        b = await _common.pingping_loop_async(send, recv, size=8, count=5, timeout=1e-4, window=3)
        return a, b

    a, b = asyncio.run(main())
    assert [r < 0 for r in a["recv_ns"]] == [False, True, False, False, False]
    assert [r < 0 for r in b["recv_ns"]] == [False, True, False, False, False]


def test_send_loop_counts_sends_and_failures() -> None:
    seen: list[bytes] = []

    def send(msg: bytes) -> None:
        if len(seen) % 10 == 9:
            seen.append(b"")
            raise OSError("no buffer space")
        seen.append(msg)

    out = _common.send_loop(send, b"abc", count=1000, duration=None)
    assert out["sent"] == 900 and out["failed"] == 100
    with pytest.raises(ValueError):
        _common.send_loop(send, b"abc", count=None, duration=None)


def test_a_reply_from_a_receive_that_overran_its_timeout_is_lost() -> None:
    # Some libraries check their timeouts coarsely (msgpack-rpc: once a
    # second); the loop holds every system to the same rule.
    import time

    peer = EchoPeer()

    def slow_recv(left: float) -> bytes | None:
        end = time.monotonic() + 2 * left  # overrun the time left (busy, no sleep)
        while time.monotonic() < end:
            pass
        return peer.recv(left)

    out = _common.pingpong_loop(peer.send, slow_recv, size=8, count=3, timeout=1e-4)
    assert out["recv_ns"] == [-1, -1, -1] and out["late"] == 3
    out = _common.pingping_loop(peer.send, slow_recv, size=8, count=3, timeout=1e-4, window=2)
    assert out["recv_ns"] == [-1, -1, -1]
