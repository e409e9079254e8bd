"""cmq.Queue over loopback: the paper's push/pop, batching, fragments, keys, requests."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import cmq
from cmq.patterns import replace, retry
from cmq.wire.batcher import BUSY_GAP

from .conftest import dest, wait_until

# Every test here runs on the compiled core and on the pure-Python one.
pytestmark = pytest.mark.usefixtures("core")

MakeQueue = Callable[..., cmq.Queue]


def drain(q: cmq.Queue, n: int, timeout: float = 5.0, mailbox: int = 0) -> list[object]:
    out: list[object] = []
    while len(out) < n:
        out.append(q.get(timeout=timeout, mailbox=mailbox))
        out += q.pop_many(n - len(out), mailbox=mailbox)
    return out


def test_push_pop_round_trip_in_order(pair: tuple[cmq.Queue, cmq.Queue]) -> None:
    a, b = pair
    msgs = [b"m%d" % i for i in range(5000)]
    for m in msgs:
        a.push(dest(b), m)
    a.flush()
    assert drain(b, len(msgs)) == msgs
    assert b.pop() is None
    st = b.stats()
    assert st.messages_received == 5000
    assert st.datagrams_received < 5000  # batched
    assert st.total_dropped == 0


def test_pop_never_blocks(pair: tuple[cmq.Queue, cmq.Queue]) -> None:
    _, b = pair
    assert b.pop() is None
    assert b.pop(mailbox=12) is None
    assert b.pop_message() is None
    assert b.pop_many() == []


def test_destination_spellings_share_one_stream(pair: tuple[cmq.Queue, cmq.Queue]) -> None:
    a, b = pair
    a.push(f"127.0.0.1:{b.port}", b"1")
    a.push(("127.0.0.1", b.port), b"2")
    a.push(["127.0.0.1", b.port], b"3")  # unhashable spelling still works
    a.push(f"localhost:{b.port}", b"4")
    assert drain(b, 4) == [b"1", b"2", b"3", b"4"]
    assert a.stats().destinations == 1


def test_mailboxes(pair: tuple[cmq.Queue, cmq.Queue]) -> None:
    a, b = pair
    a.push(dest(b), b"zero")
    a.push(dest(b), b"seven", mailbox=7)
    assert b.get(timeout=2, mailbox=7) == b"seven"
    assert b.get(timeout=2) == b"zero"
    msg = None
    a.push(dest(b), b"again", mailbox=7)
    msg = b.get_message(timeout=2, mailbox=7)
    assert (msg.payload, msg.mailbox, msg.sender[1], msg.sender_id) == (b"again", 7, a.port, a.sender_id)


def test_idle_destination_gets_the_message_at_once(make_queue: MakeQueue) -> None:
    """A lone message leaves without waiting for the batch timeout (here an hour)."""
    a, b = make_queue(timeout=3600.0), make_queue()
    a.push(dest(b), b"now")
    assert b.get(timeout=2) == b"now"


def test_a_push_after_a_blocking_read_is_not_batched(make_queue: MakeQueue) -> None:
    """Ping-pong never waits for a batch, however fast the round trip.

    With a 10 s idle gap every push but the first would open a batch; a push
    that follows a datagram its caller waited for leaves at once all the
    same. (A reply that the I/O thread happened to read before the caller
    asked for it was not waited for: a round or two may so batch, which
    the flushes below keep from stalling the test.)
    """
    a, b = make_queue(idle_gap=10.0, timeout=3600.0), make_queue(idle_gap=10.0, timeout=3600.0)
    rounds = []
    for i in range(50):
        a.push(dest(b), b"%d" % i)
        pa = a.stats().pending
        a.flush()
        msg = b.get_message(timeout=2)
        b.push(msg.sender, msg.payload)
        pb = b.stats().pending
        b.flush()
        assert a.get(timeout=2) == b"%d" % i
        rounds.append(f"{pa}{pb}")
    assert sum(r.count("1") for r in rounds) <= 4, rounds
    # Without a wait in between, the idle gap applies: the second push batches.
    a.push(dest(b), b"x")
    a.push(dest(b), b"y")
    assert a.stats().pending == 1


def test_batched_message_leaves_by_its_timeout(make_queue: MakeQueue) -> None:
    a, b = make_queue(idle_gap=float("inf"), timeout=0.01), make_queue()
    a.push(dest(b), b"batched")
    assert a.stats().pending == 1
    assert b.get(timeout=2) == b"batched"  # the I/O thread sent it, nobody flushed


def test_full_batch_leaves_at_once(make_queue: MakeQueue) -> None:
    a, b = make_queue(idle_gap=float("inf"), timeout=3600.0, qthresh=64), make_queue()
    for i in range(16):
        a.push(dest(b), b"%03d" % i)  # 4 bytes framed each: 64 bytes at the 16th
    assert drain(b, 16, timeout=2) == [b"%03d" % i for i in range(16)]
    assert a.stats().datagrams_sent == 1


def test_large_message_is_fragmented_and_reassembled(make_queue: MakeQueue) -> None:
    a, b = make_queue(max_datagram=1472), make_queue()
    big = os.urandom(1_000_000)
    a.push(dest(b), b"before")
    a.push(dest(b), big)
    a.push(dest(b), b"after")
    assert drain(b, 3) == [b"before", big, b"after"]
    # header 16, v2 extension 8, fragment header 8
    assert a.stats().fragments_sent == -(-len(big) // (1472 - 16 - 8 - 8))


def test_message_over_max_message_raises_and_sends_nothing(make_queue: MakeQueue) -> None:
    a, b = make_queue(max_message=1000), make_queue()
    with pytest.raises(cmq.MessageTooLarge, match="max_message=1000"):
        a.push(dest(b), b"x" * 1001)
    assert a.stats().datagrams_sent == 0
    a.push(dest(b), b"x" * 1000)
    assert b.get(timeout=2) == b"x" * 1000


def test_msgpack_codec_carries_values(make_queue: MakeQueue) -> None:
    a, b = make_queue(codec="msgpack"), make_queue(codec="msgpack")
    values = [1, "two", [3, 4.5], {"k": b"bytes"}, None, True]
    for v in values:
        a.push(dest(b), v)
    assert drain(b, len(values)) == values
    with pytest.raises(TypeError, match="MessagePack"):
        a.push(dest(b), object())


def test_raw_codec_rejects_non_bytes(pair: tuple[cmq.Queue, cmq.Queue]) -> None:
    a, b = pair
    with pytest.raises(TypeError, match="bytes-like"):
        a.push(dest(b), "text")
    a.push(dest(b), bytearray(b"ba"))
    a.push(dest(b), memoryview(b"mv"))
    assert drain(b, 2) == [b"ba", b"mv"]


def test_keyed_endpoints_drop_and_count_untagged_datagrams(make_queue: MakeQueue) -> None:
    key = b"shared secret"
    # The two whose messages are dropped do not wait at close for
    # acknowledgements that cannot come (linger, 2 s each by default).
    a, b, stranger = make_queue(key=key), make_queue(key=key), make_queue(linger=0)
    stranger.push(dest(b), b"forged")
    make_queue(key=b"other", linger=0).push(dest(b), b"wrong key")
    a.push(dest(b), b"genuine")
    assert b.get(timeout=2) == b"genuine"
    assert wait_until(lambda: b.stats().dropped["bad_tag"] == 2)
    assert b.pop() is None


def test_selective_receive_leaves_the_others_in_order(pair: tuple[cmq.Queue, cmq.Queue]) -> None:
    a, b = pair
    for m in (b"a1", b"b1", b"a2", b"b2"):
        a.push(dest(b), m)
    assert b.receive(lambda m: m.startswith(b"b"), timeout=2) == b"b1"
    assert b.receive(lambda m: m == b"b2", timeout=2) == b"b2"
    assert drain(b, 2) == [b"a1", b"a2"]
    with pytest.raises(cmq.Timeout):
        b.receive(lambda m: False, timeout=0.05)


def test_blocking_get_times_out(pair: tuple[cmq.Queue, cmq.Queue]) -> None:
    _, b = pair
    t0 = time.monotonic()
    with pytest.raises(cmq.Timeout):
        b.get(timeout=0.05)
    assert time.monotonic() - t0 >= 0.05


def test_iteration_ends_when_closed(pair: tuple[cmq.Queue, cmq.Queue]) -> None:
    a, b = pair
    for m in (b"1", b"2", b"3"):
        a.push(dest(b), m)
    got: list[bytes] = []

    def consume() -> None:
        for m in b:
            got.append(m)
            if len(got) == 3:
                threading.Thread(target=b.close).start()

    t = threading.Thread(target=consume)
    t.start()
    t.join(5)
    assert not t.is_alive()
    assert got == [b"1", b"2", b"3"]


def _big(i: int, size: int = 20_000) -> bytes:
    return b"%05d" % i + bytes(size - 5)


def _read_one_by_one(a: cmq.Queue, b: cmq.Queue, messages: list[bytes], **push: Any) -> list[tuple[bytes, bool]]:
    """Each of ``messages`` pushed from ``a`` once ``b``'s reader waits in
    ``get`` (so that this read, not b's I/O thread, takes it): what each
    ``get`` returned, and whether b then read in its large-datagram mode."""
    got: list[tuple[bytes, bool]] = []

    def reader() -> None:
        for _ in messages:
            m = b.get(timeout=5)
            got.append((m, b._big_reads))

    t = threading.Thread(target=reader)
    t.start()
    try:
        for k, m in enumerate(messages):
            assert wait_until(lambda: b._rx_lock.locked())  # the reader waits in its read
            a.push(dest(b), m, **push)
            a.flush()
            assert wait_until(lambda k=k: len(got) > k)  # type: ignore[misc]
    finally:
        t.join(10)
    return got


@pytest.mark.parametrize("delivery", ["reliable", "best-effort"])
def test_gets_of_large_messages_and_then_small_ones_come_whole_and_in_order(
    make_queue: MakeQueue, delivery: str
) -> None:
    """A blocking read of a datagram of 8 KB or more reads the next ones
    another way (the kernel fills a fresh object, saving a copy); a small
    datagram ends it. Messages of both kinds come whole and in order."""
    a, b = make_queue(delivery=delivery), make_queue(delivery=delivery)
    sent = [_big(i) for i in range(6)] + [b"small %d" % i for i in range(6)] + [_big(i) for i in range(6, 12)]
    got = _read_one_by_one(a, b, sent)
    assert [m for m, _ in got] == sent
    assert [big for _, big in got] == [True] * 6 + [False] * 6 + [True] * 6


def test_a_get_after_large_datagrams_times_out_and_reads_other_mailboxes_later(make_queue: MakeQueue) -> None:
    a, b = make_queue(), make_queue()
    assert _read_one_by_one(a, b, [_big(0)]) == [(_big(0), True)]
    t0 = time.monotonic()
    with pytest.raises(cmq.Timeout):
        b.get(timeout=0.05)  # nothing comes: the wait ends in time
    assert time.monotonic() - t0 < 2.0
    assert b._big_reads
    a.push(dest(b), _big(1), mailbox=1)  # for another mailbox: it waits there
    a.flush()
    assert _read_one_by_one(a, b, [_big(2)]) == [(_big(2), True)]
    assert wait_until(lambda: b.pop(mailbox=1) == _big(1))


def _closed_while_reading(b: cmq.Queue) -> BaseException:
    """What a ``get`` blocked in another thread raises when ``b`` is closed
    under it (the thread must end within 5 s)."""
    errors: list[BaseException] = []

    def reader() -> None:
        try:
            b.get()
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    t = threading.Thread(target=reader)
    t.start()
    assert wait_until(lambda: b._rx_lock.locked())
    b.close()
    t.join(5)
    assert not t.is_alive()
    return errors[0]


def test_close_wakes_a_reader_blocked_after_large_datagrams(pair: tuple[cmq.Queue, cmq.Queue]) -> None:
    a, b = pair
    assert _read_one_by_one(a, b, [_big(0)]) == [(_big(0), True)]
    assert isinstance(_closed_while_reading(b), cmq.Closed)


def test_close_wakes_a_blocked_reader_and_later_calls_raise(pair: tuple[cmq.Queue, cmq.Queue]) -> None:
    a, b = pair
    assert isinstance(_closed_while_reading(b), cmq.Closed)
    with pytest.raises(cmq.Closed):
        b.push(dest(a), b"x")
    with pytest.raises(cmq.Closed):
        b.pop()
    b.close()  # idempotent


def test_request_reply(pair: tuple[cmq.Queue, cmq.Queue]) -> None:
    a, b = pair

    def serve() -> None:
        for _ in range(3):
            m = b.get_message(timeout=5)
            assert m.is_request
            b.reply(m, m.payload.upper())

    t = threading.Thread(target=serve)
    t.start()
    assert [a.request(dest(b), w, timeout=2) for w in (b"one", b"two", b"three")] == [b"ONE", b"TWO", b"THREE"]
    t.join()
    # The envelope never shows in the user's payload or mailbox range.
    a.push(dest(b), b"plain")
    m = b.get_message(timeout=2)
    assert (m.payload, m.correlation, m.is_request) == (b"plain", None, False)
    with pytest.raises(cmq.ConfigError, match="not a request"):
        b.reply(m, b"x")


def test_request_times_out_when_nobody_answers(pair: tuple[cmq.Queue, cmq.Queue]) -> None:
    a, b = pair
    with pytest.raises(cmq.Timeout):
        a.request(dest(b), b"hello?", timeout=0.05)
    assert b.get_message(timeout=1).is_request  # it did arrive


def test_future_resolves_and_late_reply_is_counted(pair: tuple[cmq.Queue, cmq.Queue]) -> None:
    a, b = pair
    fut = a.request_future(dest(b), b"q", timeout=5)
    m = b.get_message(timeout=2)
    b.reply(m, b"answer")
    assert fut.result(timeout=2) == b"answer"
    b.reply(m, b"duplicate")  # a second answer to the same request
    assert wait_until(lambda: (a.pop(), a.stats().dropped["late_reply"])[1] == 1)


def test_future_remedy_resends_with_a_new_future_id(pair: tuple[cmq.Queue, cmq.Queue]) -> None:
    """The paper's future-type message passing: on timeout, resend (replace) or report."""
    a, b = pair
    seen: list[int] = []
    fut = retry(a, dest(b), b"ping", timeout=0.05, attempts=3)
    for _ in range(2):  # ignore the first two attempts
        seen.append(b.get_message(timeout=2).correlation or 0)
    third = b.get_message(timeout=2)
    b.reply(third, b"pong")
    assert fut.result(timeout=2) == b"pong"
    assert len({*seen, third.correlation}) == 3  # each attempt has its own id


def test_replace_sends_fresh_data_and_reports_after_the_last_attempt(pair: tuple[cmq.Queue, cmq.Queue]) -> None:
    a, b = pair
    fut = replace(a, dest(b), lambda n: b"reading #%d" % n, timeout=0.03, attempts=3)
    with pytest.raises(cmq.Timeout):
        fut.result(timeout=5)
    got = [b.get(timeout=2) for _ in range(3)]
    assert got == [b"reading #1", b"reading #2", b"reading #3"]


def test_replace_does_not_hold_up_other_traffic(pair: tuple[cmq.Queue, cmq.Queue]) -> None:
    a, b = pair
    fut = replace(a, dest(b), lambda n: b"req", timeout=0.05, attempts=50)
    for i in range(100):
        a.push(dest(b), b"%d" % i, mailbox=1)
    assert drain(b, 100, mailbox=1) == [b"%d" % i for i in range(100)]
    assert not fut.done()
    fut.cancel()


def test_on_timeout_errors_are_reported_through_the_future(pair: tuple[cmq.Queue, cmq.Queue]) -> None:
    a, b = pair

    def broken(_attempt: int) -> object:
        raise RuntimeError("remedy failed")

    fut = a.request_future(dest(b), b"x", timeout=0.02, on_timeout=broken)
    with pytest.raises(RuntimeError, match="remedy failed"):
        fut.result(timeout=5)


def test_pending_requests_fail_with_closed_on_close(pair: tuple[cmq.Queue, cmq.Queue]) -> None:
    a, b = pair
    fut = a.request_future(dest(b), b"x", timeout=60)
    a.close()
    with pytest.raises(cmq.Closed):
        fut.result(timeout=2)


def test_bad_arguments_fail_at_once_with_clear_messages(make_queue: MakeQueue) -> None:
    a = make_queue()
    with pytest.raises(cmq.TransportError, match="in use"):
        cmq.Queue(a.port, "127.0.0.1")
    with pytest.raises(cmq.ConfigError, match="codec"):
        cmq.Queue(0, "127.0.0.1", codec="xml")
    with pytest.raises(cmq.ConfigError, match="qthresh"):
        cmq.Queue(0, "127.0.0.1", qthresh=-5)
    with pytest.raises(cmq.ConfigError, match="unknown option"):
        cmq.Queue(0, "127.0.0.1", qtresh=5)
    with pytest.raises(cmq.ConfigError, match="port"):
        cmq.Queue(70000, "127.0.0.1")
    with pytest.raises(cmq.ConfigError, match="cannot resolve"):
        a.push("no-such-host.invalid:4711", b"x")
    with pytest.raises(cmq.ConfigError, match="port"):
        a.push("127.0.0.1:0", b"x")
    with pytest.raises(cmq.ConfigError, match="host:port"):
        a.push("just-a-host", b"x")
    with pytest.raises(cmq.ConfigError, match="mailbox"):
        a.push(("127.0.0.1", 9), b"x", mailbox=-1)
    with pytest.raises(cmq.ConfigError, match="mailbox"):
        a.push(("127.0.0.1", 9), b"x", mailbox=2**31)


def test_live_endpoint_survives_100k_bad_datagrams(make_queue: MakeQueue) -> None:
    """Random and truncated datagrams are counted; the next valid message is delivered."""
    b = make_queue()
    raw = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    good = cmq.Queue(0, "127.0.0.1")
    try:
        sample = b"\xc3\x51\x01\x00" + bytes(12) + b"\x05hello"
        rng = __import__("random").Random(7)
        sent = 0
        for _chunk in range(20):
            for i in range(5000):
                kind = i % 3
                if kind == 0:
                    d = rng.randbytes(rng.randrange(0, 64))
                elif kind == 1:
                    d = sample[: rng.randrange(0, len(sample) - 1)]
                else:
                    d = b"\xc3\x51\x01\x00" + rng.randbytes(12) + bytes([rng.randrange(10, 255)])
                raw.sendto(d, dest(b))
            sent += 5000
            # Let the receiver catch up, so the kernel buffer never overflows.
            assert wait_until(lambda sent=sent: b.stats().datagrams_received + (b.stats().kernel_drops or 0) >= sent, 30)
        st = b.stats()
        assert st.datagrams_received + (st.kernel_drops or 0) == 100_000
        # Every one was counted; none became a message (a bare header is a
        # valid, empty datagram, the rest are malformed).
        assert st.messages_received == 0
        assert st.dropped["malformed"] > 90_000
        good.push(dest(b), b"still alive")
        assert b.get(timeout=2) == b"still alive"
    finally:
        raw.close()
        good.close()


def test_stats_is_a_frozen_snapshot(pair: tuple[cmq.Queue, cmq.Queue]) -> None:
    a, b = pair
    st = a.stats()
    a.push(dest(b), b"x")
    assert st.messages_sent == 0
    with pytest.raises(AttributeError):
        st.messages_sent = 5  # type: ignore[misc]
    with pytest.raises(TypeError):
        st.dropped["malformed"] = 1  # type: ignore[index]
    assert a.stats().as_dict()["messages_sent"] == 1


def test_pop_many_messages_gives_senders(pair: tuple[cmq.Queue, cmq.Queue]) -> None:
    a, b = pair
    for i in range(3):
        a.push(dest(b), b"%d" % i, mailbox=4)
    a.flush()
    assert b.get_message(timeout=2, mailbox=4).payload == b"0"
    assert wait_until(lambda: b.stats().queued == 2)
    got = b.pop_many_messages(mailbox=4)
    assert [(m.payload, m.sender[1], m.mailbox) for m in got] == [(b"1", a.port, 4), (b"2", a.port, 4)]
    assert b.pop_many_messages(mailbox=4) == []


def test_a_reused_mutable_destination_is_read_each_time(make_queue: MakeQueue) -> None:
    a, b, c = make_queue(), make_queue(), make_queue()
    where = ["127.0.0.1", b.port]
    a.push(where, b"to b")
    where[1] = c.port
    a.push(where, b"to c")
    assert b.get(timeout=2) == b"to b"
    assert c.get(timeout=2) == b"to c"
    cmq.Queue.push(a, dest(b), b"through the class")
    assert b.get(timeout=2) == b"through the class"


def test_sender_is_push_bound_to_one_destination(make_queue: MakeQueue) -> None:
    a, b = make_queue(max_datagram=1472, max_message=100_000), make_queue(max_message=100_000)
    send = a.sender(dest(b))
    msgs = [b"s%d" % i for i in range(20_000)]
    for m in msgs[:10_000]:
        send(m)
    for m in msgs[10_000:]:  # push and the bound sender share the stream and its order
        a.push(dest(b), m)
    big = os.urandom(50_000)
    send(big)  # fragments, after what is batched
    send(b"after")
    a.flush()
    assert drain(b, len(msgs) + 2) == [*msgs, big, b"after"]
    assert a.stats().destinations == 1
    with pytest.raises(cmq.MessageTooLarge):
        send(b"x" * 100_001)
    with pytest.raises(TypeError, match="bytes-like"):
        send("text")
    with pytest.raises(cmq.ConfigError):
        a.sender("no-port-here")


def test_a_bound_sender_and_a_remembered_destination_raise_closed_after_close(
    make_queue: MakeQueue,
) -> None:
    a, b = make_queue(), make_queue()
    send = a.sender(dest(b))
    to = dest(b)
    for _ in range(100):  # the batch is open: pushes take the fast half
        send(b"x")
        a.push(to, b"y")
    a.close()
    with pytest.raises(cmq.Closed):
        send(b"late")
    with pytest.raises(cmq.Closed):
        a.push(to, b"late")
    assert drain(b, 200) == [b"x", b"y"] * 100


def test_messages_pushed_from_many_threads_are_all_delivered(make_queue: MakeQueue) -> None:
    """The fast half of push takes no lock; racing the I/O thread's timeouts must lose nothing."""
    a, b = make_queue(), make_queue(max_queued=1_000_000)
    send = a.sender(dest(b))
    per_thread = 20_000
    # Every 1000th message a pusher waits until it has arrived: nothing is
    # flushed, so its batch left by its deadline (or filled), racing the
    # other pushers' appends.
    arrived = {b"%d:%d" % (k, i): threading.Event() for k in range(4) for i in range(0, per_thread, 1000)}
    stalled: list[bytes] = []

    def pusher(k: int) -> None:
        for i in range(per_thread):
            msg = b"%d:%d" % (k, i)
            send(msg)
            if i % 1000 == 0 and not arrived[msg].wait(timeout=10):
                stalled.append(msg)

    threads = [threading.Thread(target=pusher, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    got: list[bytes] = []
    while any(t.is_alive() for t in threads):
        # A blocking read, then what else is queued: a loop of pop_many alone
        # would hold the interpreter from the pushers (this test took 17-38 s).
        try:
            new = [b.get(timeout=0.05)]
        except cmq.Timeout:
            new = []
        new += b.pop_many()
        for m in new:
            if m in arrived:
                arrived[m].set()
        got += new
    for t in threads:
        t.join()
    assert stalled == []  # each waited-for message came by its batch's deadline
    # No flush: every batch must leave by its own deadline.
    while len(got) < 4 * per_thread:
        got.append(b.get(timeout=5))  # type: ignore[arg-type]
        got += b.pop_many()
    for k in range(4):  # each thread's messages in its order
        mine = [m for m in got if m.startswith(b"%d:" % k)]
        assert mine == [b"%d:%d" % (k, i) for i in range(per_thread)]


def test_a_loop_of_pops_that_find_nothing_lets_the_other_threads_run(
    make_queue: MakeQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read that cannot block keeps the interpreter: a loop of pops would
    otherwise hold it from the process's other threads (a message pushed by
    one of them took 5.6-5.9 ms to be popped, against 0.2-0.4 ms). After
    ``_EMPTY_POLLS`` empty pops in a row every further one yields; one
    that finds a message starts the count again."""
    from cmq.net import queue as queue_mod

    free = queue_mod._EMPTY_POLLS
    a, b = make_queue(), make_queue()
    pauses: list[int] = []
    monkeypatch.setattr(queue_mod, "yield_cpu", lambda: pauses.append(1))
    for _ in range(free):
        assert [b.pop(), b.pop_many(), b.pop_message()] == [None, [], None]
    assert len(pauses) == 2 * free  # the first free of the 3 * free did not pause
    a.push(dest(b), b"x")
    a.flush()
    assert wait_until(lambda: b.pop() == b"x")
    pauses.clear()
    for _ in range(free):
        assert b.pop() is None  # a drain's empty pop (code that takes all there is, each turn)
    assert pauses == []
    assert b.pop() is None
    assert pauses == [1]


def test_blocking_reads_keep_order_whichever_path_a_datagram_takes(make_queue: MakeQueue) -> None:
    """A lone message read straight into get() never overtakes messages already queued."""
    a, b = make_queue(), make_queue()
    to = dest(b)
    got: list[object] = []
    for i in range(300):
        if i % 3 == 0:  # a batch of three in one datagram: queued, then taken one by one
            for j in range(3):
                a.push(to, b"%d.%d" % (i, j))
            a.flush()
        else:  # one message in its own datagram: read straight back
            a.push(to, b"%d" % i)
        got.append(b.get(timeout=2) if i % 2 else b.get_message(timeout=2).payload)
    a.flush()
    got += drain(b, 200)
    want = [m for i in range(300) for m in ([b"%d.%d" % (i, j) for j in range(3)] if i % 3 == 0 else [b"%d" % i])]
    assert got == want
    assert b.stats().messages_received == len(want)


def test_a_zero_or_short_timeout_does_not_wait_a_timer_tick(
    make_queue: MakeQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SO_RCVTIMEO rounds up to a kernel tick: short waits must not go through it."""
    a, b = make_queue(), make_queue()
    used: list[object] = []
    real = b._set_rcvtimeo
    monkeypatch.setattr(b, "_set_rcvtimeo", lambda remaining: (used.append(remaining), real(remaining)))
    for call in (b.get, b.get_message):
        for timeout in (0, 0.001):
            with pytest.raises(cmq.Timeout):
                call(timeout=timeout)
    with pytest.raises(cmq.Timeout):
        b.receive(lambda m: True, timeout=0)
    assert used == []
    a.push(dest(b), b"later")
    assert b.get(timeout=0.015) == b"later"  # a short wait still receives


def test_a_timeout_names_the_wait_asked_for(make_queue: MakeQueue) -> None:
    """It once named what was left of it after the first read (``within 0.0468 s``)."""
    q = make_queue()
    with pytest.raises(cmq.Timeout, match=r"within 0\.1 s"):
        q.get(timeout=0.1)
    with pytest.raises(cmq.Timeout, match=r"within 0\.1 s"):
        q.get_message(timeout=0.1)


def test_net_does_not_import_patterns() -> None:
    """Layers point one way: patterns build on net, never the reverse."""
    import ast
    from pathlib import Path

    for path in Path(cmq.__file__).parent.joinpath("net").glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert not node.module.startswith("cmq.patterns"), f"{path.name} imports {node.module}"


def _blocked_signals(tid: int) -> set[int]:
    with open(f"/proc/self/task/{tid}/status", encoding="ascii") as f:
        mask = int(next(line for line in f if line.startswith("SigBlk:")).split()[1], 16)
    return {n for n in range(1, 65) if mask >> (n - 1) & 1}


def test_the_io_thread_leaves_sigint_and_sigterm_to_the_application() -> None:
    # Python runs signal handlers in the main thread only: a SIGTERM the
    # kernel gave the I/O thread would not wake a main thread blocked in
    # a system call.
    import signal

    with cmq.Queue(port=0, host="127.0.0.1") as q:
        io = q._io_thread.native_id
        assert io is not None
        assert wait_until(lambda: {signal.SIGINT, signal.SIGTERM} <= _blocked_signals(io))
        assert signal.SIGTERM not in _blocked_signals(threading.get_native_id())


def _data_seqs(peer: socket.socket, seconds: float) -> dict[int, bytes]:
    """The cmq data datagrams ``peer`` gets within ``seconds``: seq -> payload of
    a one-message datagram (control datagrams, PROBEs, left out)."""
    got: dict[int, bytes] = {}
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        peer.settimeout(left)
        try:
            data = peer.recv(65536)
        except TimeoutError:
            break
        if not data[3] & 0x10:
            # A 16-byte header, in version 2 an 8-byte extension, a one-byte length, the message.
            start = 25 if data[2] == 2 else 17
            got.setdefault(int.from_bytes(data[12:16], "big"), data[start:])
    return got


def test_idle_pushes_leave_at_once_within_credit_and_the_rest_wait(make_queue: MakeQueue) -> None:
    # A reliable stream may send 16 datagrams before its first STATUS. Each
    # push here finds its destination idle (it waits out the busy gap), so
    # it leaves at once, one datagram each, until the credit is
    # used: a peer that never answers gets exactly those 16. The 17th is
    # made a datagram too and waits for credit in the send buffer; behind
    # it the stream is busy, not idle, so the last 3 wait in an open batch.
    q = make_queue(linger=0.0)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as peer:
        peer.bind(("127.0.0.1", 0))
        for i in range(20):
            q.push(peer.getsockname(), b"m%d" % i)
            # A reliable stream with datagrams unacknowledged is idle again
            # once the busy gap has passed since its last datagram.
            idle_at = time.monotonic() + BUSY_GAP
            assert wait_until(lambda at=idle_at: time.monotonic() > at)
        got = _data_seqs(peer, 0.3)
        assert got == {i: b"m%d" % i for i in range(16)}
        assert q.unacknowledged() == 17
        stats = q.stats()
        assert (stats.messages_sent, stats.datagrams_sent) == (17, 17)


@pytest.mark.parametrize("delivery", ["best-effort", "reliable"])
def test_a_datagram_the_kernel_refuses_raises_and_is_counted(make_queue: MakeQueue, delivery: str) -> None:
    # Broadcast without SO_BROADCAST: the kernel refuses the datagram (EACCES).
    q = make_queue(delivery=delivery, linger=0.0)
    with pytest.raises(cmq.TransportError, match=r"sending to 255\.255\.255\.255:9 failed: Permission denied"):
        q.push(("255.255.255.255", 9), b"x")
    assert q.stats().dropped["send_failed"] == 1
    # A reliable message is kept all the same: it is sent again, and fails
    # as undeliverable if it never gets through.
    assert q.unacknowledged() == (1 if delivery == "reliable" else 0)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as peer:
        peer.bind(("127.0.0.1", 0))
        q.push(peer.getsockname(), b"after")  # the endpoint carries on
        assert list(_data_seqs(peer, 0.3).values()) == [b"after"]


def _datagrams_for(make_queue: MakeQueue, n: int) -> list[bytes]:
    """``n`` best-effort datagrams of one 153-byte message each (b"000...",
    b"001...", ...), as a queue sends them, caught by a plain socket."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as peer:
        peer.bind(("127.0.0.1", 0))
        sender = make_queue(delivery="best-effort", max_datagram=256, max_message=4096)
        for i in range(n):
            sender.push(peer.getsockname(), b"%03d" % i + bytes(150))  # one datagram each
        sender.flush()
        peer.settimeout(5.0)
        return [peer.recv(2048) for _ in range(n)]


def _queued_in_kernel(q: cmq.Queue, datagrams: list[bytes]) -> None:
    """``datagrams`` into ``q``'s socket, with q's I/O thread kept off it
    until the application's next read (see ``Queue._io_loop``)."""
    q._app_read_at = time.monotonic() + 60
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as peer:
        for d in datagrams:
            peer.sendto(d, dest(q))  # into q's socket before the call returns (loopback)


def _kernel_asked(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sockets the driver asks how long their last datagram waited
    (``queue_delay``, answered 4 ms from now on), in the order it asks."""
    import cmq.net._base as base_module

    asked: list[int] = []
    monkeypatch.setattr(base_module, "queue_delay", lambda fd: asked.append(fd) or 0.004)
    return asked


def test_a_read_of_several_datagrams_measures_how_long_the_last_one_waited(
    make_queue: MakeQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The receiver's windows answer to how long datagrams wait in the
    # socket (Receiver.queue_delay): after a read that found several
    # queued, the driver asks the kernel about the last one; one read alone
    # says the queue was about empty.
    asked = _kernel_asked(monkeypatch)
    q = make_queue()
    datagrams = _datagrams_for(make_queue, 40)
    # q's receive lock held: the I/O thread reads nothing meanwhile.
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as peer, q._rx_lock:
        for d in datagrams:
            peer.sendto(d, dest(q))  # into q's socket before the call returns (loopback)
        assert q._drain(64) == 40
        assert asked and q._receiver.queue_delay == 0.004
        peer.sendto(datagrams[0], dest(q))
        assert q._drain(64) == 1
        assert q._receiver.queue_delay == 0.0


def test_a_pop_that_reads_several_datagrams_measures_how_long_the_last_one_waited(
    make_queue: MakeQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As the drain above, through the application's own non-blocking read.
    asked = _kernel_asked(monkeypatch)
    q = make_queue()
    datagrams = _datagrams_for(make_queue, 41)
    _queued_in_kernel(q, datagrams[:40])
    assert q.pop_many() == [b"%03d" % i + bytes(150) for i in range(40)]
    assert asked and q._receiver.queue_delay == 0.004
    _queued_in_kernel(q, datagrams[40:])
    assert q.pop_many() == [b"040" + bytes(150)]
    assert q._receiver.queue_delay == 0.0


def test_pops_leave_what_the_mailbox_bound_has_no_room_for_in_the_kernel(make_queue: MakeQueue) -> None:
    """A pop reads no more datagrams than half the mailbox bound
    (``max_queued``) has room for: the rest waits in the socket's buffer,
    none is dropped, and later pops take them in order."""
    q = make_queue(max_queued=8)  # the backlog: 4 messages
    _queued_in_kernel(q, _datagrams_for(make_queue, 30))
    got = q.pop_many(1)
    assert q._receiver.queued() <= 4
    deadline = time.monotonic() + 5
    while len(got) < 30 and time.monotonic() < deadline:
        got += q.pop_many(3)
    assert got == [b"%03d" % i + bytes(150) for i in range(30)]
    assert not any(q.stats().dropped.values())


def test_queue_delay_is_the_wait_of_the_last_datagram_read() -> None:
    from cmq.net._sock import queue_delay

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as r, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        r.bind(("127.0.0.1", 0))
        assert queue_delay(r.fileno()) == 0.0  # nothing read: no stamp (this call turns them on)
        before = time.time()
        s.sendto(b"x", r.getsockname())
        assert r.recv(16) == b"x"
        waited = queue_delay(r.fileno())
        # It arrived after `before` and was read before now.
        assert 0.0 <= waited <= time.time() - before
