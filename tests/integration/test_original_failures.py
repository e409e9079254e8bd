"""Each known failure of the original Haskell CMQ, shown absent from cmq.

(The O(n) re-encode per push is shown by the unit test
``test_push_does_not_encode_the_pending_batch``; a datagram never exceeding
its limit by the batcher's property test.)
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable

import cmq

from .conftest import dest, wait_until

MakeQueue = Callable[..., cmq.Queue]


def test_receiver_survives_an_undecodable_datagram(make_queue: MakeQueue) -> None:
    """Original: the receiver thread died on the first undecodable packet."""
    a, b = make_queue(codec="msgpack"), make_queue(codec="msgpack")
    raw = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        # Valid framing, but the payload is not MessagePack.
        raw.sendto(b"\xc3\x51\x01\x01" + bytes(12) + b"\x01\xc1", dest(b))
        raw.sendto(b"garbage", dest(b))
    finally:
        raw.close()
    a.push(dest(b), {"ok": True})
    assert b.get(timeout=2) == {"ok": True}
    st = b.stats()
    assert (st.dropped["undecodable"], st.dropped["malformed"]) == (1, 1)


def test_batches_larger_than_512_bytes_are_not_truncated(make_queue: MakeQueue) -> None:
    """Original: a fixed 512-byte receive buffer truncated larger batches."""
    a, b = make_queue(qthresh=60_000, idle_gap=float("inf"), timeout=3600), make_queue()
    msgs = [bytes([i % 256]) * 100 for i in range(500)]  # one 50 KB datagram
    for m in msgs:
        a.push(dest(b), m)
    a.flush()
    got = [b.get(timeout=2) for _ in msgs]
    assert got == msgs
    assert b.stats().datagrams_received == 1


def test_message_larger_than_qthresh_is_size_checked_and_fragmented(make_queue: MakeQueue) -> None:
    """Original: a message larger than qthresh was sent alone with no size check."""
    a, b = make_queue(max_message=300_000), make_queue()
    try:
        a.push(dest(b), b"x" * 300_001)
        raise AssertionError("expected MessageTooLarge")
    except cmq.MessageTooLarge:
        pass
    big = b"y" * 200_000  # over qthresh and over one datagram
    a.push(dest(b), big)
    assert b.get(timeout=2) == big


def test_push_racing_the_timeout_flusher_loses_nothing(make_queue: MakeQueue) -> None:
    """Original: a push racing the timeout thread could drop a message silently.

    A tiny batch timeout keeps the I/O thread flushing while this thread
    pushes; every message must arrive exactly once, in order.
    """
    a, b = make_queue(timeout=0.00005, idle_gap=float("inf"), qthresh=4096), make_queue()
    n = 50_000
    received: list[bytes] = []

    def consume() -> None:
        while len(received) < n:
            try:
                received.append(b.get(timeout=5))
            except cmq.Timeout:
                return
            received.extend(b.pop_many())

    t = threading.Thread(target=consume)
    t.start()
    for i in range(n):
        a.push(dest(b), i.to_bytes(4, "big"))
        if i % 2000 == 0:
            # Give the receiver a chance: this test is about the race, not about overload.
            wait_until(lambda i=i: len(received) >= i - 20_000)
    a.flush()
    t.join(30)
    assert [int.from_bytes(m, "big") for m in received] == list(range(n))
    assert a.stats().total_dropped == 0


def test_idle_endpoint_does_not_poll(make_queue: MakeQueue) -> None:
    """Original: the timeout thread woke every 20 us. An idle cmq endpoint has no deadline at all."""
    a, b = make_queue(), make_queue()
    assert a._next_deadline() is None
    a.push(dest(b), b"x")
    assert b.get(timeout=2) == b"x"
    # Sent at once; once acknowledged (within the receiver's ack delay),
    # nothing is left to wait for on either side.
    assert a.drain(timeout=2)
    assert a._next_deadline() is None
    assert b._next_deadline() is None
    a2 = make_queue(idle_gap=float("inf"), timeout=0.01)
    a2.push(dest(b), b"y")
    assert a2._next_deadline() is not None  # one deadline for the open batch
    assert b.get(timeout=2) == b"y"
    assert wait_until(lambda: a2._next_deadline() is None)


def test_receive_queue_is_bounded(make_queue: MakeQueue) -> None:
    """Original: the receive channel was unbounded.

    The I/O thread reads ahead only up to half of ``max_queued``, leaving the
    rest in the kernel's (bounded) buffer, so nothing is lost while the
    application catches up; a single datagram larger than the room left is
    cut, and the cut counted.
    """
    a, b = make_queue(), make_queue(max_queued=100)
    for i in range(250):
        a.push(dest(b), b"%d" % i)
        a.flush()  # one datagram each
    assert wait_until(lambda: b.stats().queued >= 50)
    assert b.stats().queued <= 100
    assert [b.get(timeout=2) for _ in range(250)] == [b"%d" % i for i in range(250)]
    assert b.stats().dropped["queue_full"] == 0

    # A best-effort datagram of 250 messages is cut to the room left, and
    # the cut counted.
    big = make_queue(qthresh=60_000, idle_gap=float("inf"), timeout=3600, delivery="best-effort")
    for i in range(250):
        big.push(dest(b), b"%d" % i)
    big.flush()  # one datagram of 250 messages
    assert wait_until(lambda: b.stats().dropped["queue_full"] == 150)
    assert [b.pop() for _ in range(100)] == [b"%d" % i for i in range(100)]
    assert b.pop() is None

    # A reliable datagram is taken whole or not at all (into an empty
    # mailbox even past the bound): nothing is cut.
    rel = make_queue(qthresh=60_000, idle_gap=float("inf"), timeout=3600)
    for i in range(250):
        rel.push(dest(b), b"r%d" % i)
    rel.flush()
    assert [b.get(timeout=2) for _ in range(250)] == [b"r%d" % i for i in range(250)]
    assert b.stats().dropped["queue_full"] == 150  # the best-effort cut only


def test_close_flushes_pending_batches(make_queue: MakeQueue) -> None:
    """Original: nothing was flushed on exit, the last batches were lost."""
    b = make_queue()
    a = cmq.Queue(0, "127.0.0.1", idle_gap=float("inf"), timeout=3600)
    for i in range(10):
        a.push(dest(b), b"last words %d" % i)
    assert a.stats().pending == 10
    a.close()
    assert [b.get(timeout=2) for _ in range(10)] == [b"last words %d" % i for i in range(10)]


def test_messages_of_different_datagrams_are_never_interleaved(make_queue: MakeQueue) -> None:
    """Original: messages from different datagrams could be interleaved out of order.

    Two senders, many datagrams each, while the I/O thread and this thread
    both read: per sender, messages arrive in push order, and each
    datagram's messages stay contiguous.
    """
    b = make_queue(codec="msgpack")
    senders = [make_queue(codec="msgpack", qthresh=200) for _ in range(2)]
    n = 5000
    for i in range(n):
        for k, s in enumerate(senders):
            s.push(dest(b), [k, i])
    for s in senders:
        s.flush()
    got = []
    while len(got) < 2 * n:
        got.append(b.get_message(timeout=5))
        if len(got) % 7 == 0:
            m = b.pop_message()
            if m is not None:
                got.append(m)
    for k in range(2):
        mine = [m.payload[1] for m in got if m.payload[0] == k]
        assert mine == list(range(n))
    # Messages of one datagram (same sender and seq) are contiguous.
    keys = [(m.sender_id, m.seq) for m in got]
    seen: set[tuple[int, int]] = set()
    for prev, key in zip([None, *keys], keys, strict=False):
        if key != prev:
            assert key not in seen
            seen.add(key)
