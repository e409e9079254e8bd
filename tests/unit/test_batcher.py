"""The sans-IO batcher: batching rules, datagram limits, deadlines, fragments."""

from __future__ import annotations

from unittest import mock

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cmq import QueueConfig
from cmq.wire.batcher import CHECK, FULL, LARGE, OPENED, QUEUED, Batcher
from cmq.wire.frames import HEADER_SIZE, decode

# Every test here runs on the compiled core and on the pure-Python one.
pytestmark = pytest.mark.usefixtures("core")

DEST = ("127.0.0.1", 9)


def encoder(b: Batcher) -> str:
    """The attribute a take encodes a batch with: the compiled core's cutter, or the pure framer."""
    return "_cut" if b._cut is not None else "_frame"


def make(**options: object) -> Batcher:
    return Batcher(QueueConfig(**options), sender=77)  # type: ignore[arg-type]


def decode_all(datagrams: list[bytes]) -> list[bytes]:
    out: list[bytes] = []
    for d in datagrams:
        _, body = decode(d)
        assert isinstance(body, list)
        out.extend(body)
    return out


def test_first_push_opens_then_queues_until_qthresh() -> None:
    b = make(qthresh=20)
    s = b.stream(DEST, 0)
    assert b.push(s, b"aaaa") == OPENED  # 5 bytes framed
    assert b.push(s, b"bbbb") == QUEUED  # 10
    assert b.push(s, b"cccc") == QUEUED  # 15
    assert b.push(s, b"dddd") == FULL  # 20 >= qthresh
    (d,) = b.take(s, now=1.0)
    assert decode_all([d]) == [b"aaaa", b"bbbb", b"cccc", b"dddd"]
    assert b.push(s, b"eeee") == OPENED  # a new batch


def test_batches_are_keyed_by_destination_and_mailbox() -> None:
    b = make()
    s1, s2, s3 = b.stream(DEST, 0), b.stream(DEST, 1), b.stream(("127.0.0.1", 10), 0)
    assert len({id(s1), id(s2), id(s3)}) == 3
    assert b.stream(DEST, 0) is s1
    for s in (s1, s2, s3):
        assert b.push(s, b"x") == OPENED


def test_message_larger_than_qthresh_fills_a_batch_by_itself() -> None:
    b = make(qthresh=16)
    s = b.stream(DEST, 0)
    assert b.push(s, b"z" * 100) == FULL
    assert decode_all(b.take(s, 0.0)) == [b"z" * 100]


def test_payload_too_large_for_a_datagram_is_not_appended() -> None:
    b = make(max_datagram=1000)
    s = b.stream(DEST, 0)
    assert b.push(s, b"q" * 2000) == LARGE
    assert s.pending == 0


def test_over_max_message_is_large_even_if_it_fits_a_datagram() -> None:
    b = make(max_message=10)
    s = b.stream(DEST, 0)
    assert b.push(s, b"q" * 11) == LARGE
    assert b.push(s, b"q" * 10) == OPENED


@given(sizes=st.lists(st.integers(0, 3000), min_size=1, max_size=60), max_datagram=st.integers(200, 4000))
def test_a_datagram_never_exceeds_max_datagram(sizes: list[int], max_datagram: int) -> None:
    """Property: whatever is batched, take() cuts datagrams within the limit and keeps order."""
    b = make(max_datagram=max_datagram, qthresh=10**6, max_message=10**5)
    s = b.stream(DEST, 0)
    sent: list[bytes] = []
    out: list[bytes] = []
    for i, n in enumerate(sizes):
        payload = bytes([i % 256]) * n
        if b.push(s, payload) == LARGE:
            out += b.fragments(s, payload, 0.0)
        sent.append(payload)
    out += b.take(s, 0.0)
    assert all(len(d) <= max_datagram for d in out)
    # Reassemble: frames in order, fragments joined.
    got: list[bytes] = []
    pieces: list[bytes] = []
    for d in out:
        _, body = decode(d)
        if isinstance(body, list):
            got.extend(body)
        else:
            pieces.append(body.data)
            if body.index == body.count - 1:
                got.append(b"".join(pieces))
                pieces = []
    assert got == sent


def test_sequence_numbers_count_datagrams_per_stream() -> None:
    b = make(qthresh=1)
    s = b.stream(DEST, 0)
    other = b.stream(DEST, 5)
    seqs = []
    for payload in (b"a", b"b", b"c"):
        b.push(s, payload)
        seqs.append(decode(b.take(s, 0.0)[0])[0].seq)
    b.push(other, b"z")
    assert seqs == [0, 1, 2]
    assert decode(b.take(other, 0.0)[0])[0].seq == 0


def test_a_stream_is_one_per_address_and_mailbox_made_once() -> None:
    b = make()
    s = b.stream(DEST, 0)
    assert b.stream(("127.0.0.1", 9), 0) is s  # an equal address, another object
    assert b.stream(DEST, 0, reliable=True) is s  # made already: reliable only matters when made
    other = b.stream(DEST, 1, reliable=True)
    third = b.stream(("127.0.0.1", 10), 1)
    assert len({id(s), id(other), id(third)}) == 3
    assert (s.addr, s.mailbox, other.mailbox) == (DEST, 0, 1)
    assert decode(s.head + bytes(4))[0].version == 1
    assert decode(other.head + bytes(12))[0].version == 2
    assert b.destinations == 3
    assert sorted(map(id, b.streams())) == sorted(map(id, (s, other, third)))


def test_idle_rule() -> None:
    b = make(idle_gap=0.001, timeout=0.5)
    s = b.stream(DEST, 0)
    assert b.is_idle(s, now=0.0)  # never sent: idle
    b.push(s, b"a")
    assert b.opened(s, now=0.0) is None  # so the batch leaves at once
    b.take(s, now=10.0)
    assert not b.is_idle(s, now=10.0005)
    b.push(s, b"b")
    assert b.opened(s, now=10.0005) == 10.5005  # busy: armed for its timeout
    assert b.is_idle(s, now=10.002)
    assert not make(idle_gap=float("inf")).is_idle(s, now=1e9)


def test_a_stream_is_idle_once_the_application_got_what_it_waited_for() -> None:
    """A reply (or the next ping) follows a wait for input: it leaves at once however soon."""
    b = make(idle_gap=10.0, timeout=0.5)
    s = b.stream(DEST, 0)
    s.frames.append(b"ping")  # as the drivers push: append, then take_idle
    assert b.take_idle(s, now=1.0) is not None  # never sent: idle
    s.frames.append(b"pong?")
    assert b.take_idle(s, now=1.001) is None  # 1 ms after a send, with a 10 s gap: busy
    assert not b.is_idle(s, now=1.001)
    b.waited_at = 1.0005  # the application got a datagram it had been waiting for
    assert b.is_idle(s, now=1.001)
    datagram = b.take_idle(s, now=1.001)
    assert datagram is not None
    assert decode(datagram)[1] == [b"pong?"]
    # Only a wait after the last send counts.
    s.frames.append(b"again")
    assert b.take_idle(s, now=1.002) is None
    assert b.check(s) == OPENED
    assert b.opened(s, now=1.002) == 1.502
    never = make(idle_gap=float("inf"))
    t = never.stream(DEST, 0)
    never.waited_at = 1e9
    t.frames.append(b"x")
    assert not never.is_idle(t, now=1e9) and never.take_idle(t, now=1e9) is None


def test_deadlines_fire_once_and_skip_batches_that_already_left() -> None:
    b = make(timeout=0.5, qthresh=10)
    s, t = b.stream(DEST, 0), b.stream(DEST, 1)
    b.push(s, b"a")
    assert b.arm(s, now=1.0) == 1.5
    b.push(t, b"b")
    b.arm(t, now=1.2)
    assert b.next_deadline() == 1.5
    assert b.due(1.4) == []
    assert b.due(1.5) == [s]
    b.take(s, 1.5)
    # t's batch leaves early because it filled up; its deadline is then stale.
    b.push(t, b"c" * 20)
    b.take(t, 1.6)
    assert b.due(2.0) == []
    assert b.next_deadline() is None


def test_pending_streams_are_found_from_deadlines_not_by_scanning() -> None:
    b = make()
    streams = [b.stream(("127.0.0.1", p), 0) for p in range(1, 1001)]
    b.push(streams[500], b"x")
    b.arm(streams[500], 0.0)
    assert b.pending_streams() == [streams[500]]


def test_push_does_not_encode_the_pending_batch() -> None:
    """The original re-encoded the whole batch on every push (O(n) per push)."""
    b = make(qthresh=10**6)
    s = b.stream(DEST, 0)
    with mock.patch.object(b, encoder(b), wraps=getattr(b, encoder(b))) as enc:
        for _ in range(1000):
            b.push(s, b"m")
        assert enc.call_count == 0
        b.take(s, 0.0)
        assert enc.call_count == 1


def test_take_removes_exactly_what_it_encoded() -> None:
    """A push landing during a take (another thread) stays for the next datagram."""
    b = make()
    s = b.stream(DEST, 0)
    b.push(s, b"first")
    real_encode = getattr(b, encoder(b))

    def encode_and_race(*args: object) -> bytes:
        s.frames.append(b"raced")  # what a concurrent push does
        return real_encode(*args)  # type: ignore[no-any-return]

    with mock.patch.object(b, encoder(b), side_effect=encode_and_race):
        first = b.take(s, 0.0)
    assert decode_all(first) == [b"first"]
    assert decode_all(b.take(s, 0.0)) == [b"raced"]


def test_fragments_flush_the_pending_batch_first() -> None:
    b = make(max_datagram=200, max_message=10**5)
    s = b.stream(DEST, 0)
    b.push(s, b"before")
    big = bytes(range(256)) * 3
    out = b.fragments(s, big, 0.0)
    assert decode_all(out[:1]) == [b"before"]
    frags = [decode(d)[1] for d in out[1:]]
    assert [f.index for f in frags] == list(range(len(frags)))  # type: ignore[union-attr]
    assert b"".join(f.data for f in frags) == big  # type: ignore[union-attr]
    assert all(len(d) <= 200 for d in out)
    assert b.fragments_sent == len(frags)


def test_keyed_batcher_leaves_room_for_the_tag() -> None:
    b = make(key=b"secret", max_datagram=200, qthresh=10**6, max_message=10**5)
    s = b.stream(DEST, 0)
    for _ in range(100):
        b.push(s, b"0123456789")
    out = b.take(s, 0.0)
    assert len(out) > 1
    assert all(len(d) <= 200 for d in out)
    assert all(decode(d, b"secret")[0].flags for d in out)
    assert len(out[0]) > HEADER_SIZE


@pytest.mark.parametrize("n", [1, 100_000])
def test_push_work_does_not_depend_on_the_number_of_destinations(n: int) -> None:
    """Structural check of the Map + heap argument: one stream lookup and, per batch, one heap entry."""
    b = make(idle_gap=float("inf"))
    streams = [b.stream(("10.0.0.1", 1 + p % 65535), p // 65535) for p in range(n)]
    for s in streams[:50]:
        assert b.push(s, b"x") == OPENED
        b.arm(s, 0.0)
        assert b.push(s, b"y") == QUEUED
    assert b.armed == min(n, 50)
    assert b.destinations == n


def test_batch_limit_grows_under_load_and_shrinks_back() -> None:
    """qthresh is the batch size at a moderate rate; at full rate batches grow to one datagram."""
    b = make(qthresh=100, timeout=0.001, max_datagram=1000)
    s = b.stream(DEST, 0)
    assert s.limit == 100
    now = 1.0
    for _ in range(5):  # batches that fill within a timeout of the previous datagram
        while b.push(s, b"x" * 20) != FULL:
            pass
        b.filled(s, now)
        b.take(s, now)
        now += 0.0001
    assert s.limit == b.config.max_body  # one datagram's body, no more
    # A batch that leaves by its deadline halves the limit...
    b.push(s, b"y")
    b.arm(s, now)
    assert b.due(now + 0.001) == [s]
    assert s.limit == b.config.max_body // 2
    # ... and a message to an idle destination resets it.
    b.take(s, now + 0.001)
    assert b.opened(s, now + 1.0) is None  # idle: send at once
    assert s.limit == 100


def test_slow_batches_do_not_grow() -> None:
    b = make(qthresh=100, timeout=0.001)
    s = b.stream(DEST, 0)
    now = 1.0
    for _ in range(3):
        while b.push(s, b"x" * 20) != FULL:
            pass
        b.filled(s, now)
        b.take(s, now)
        now += 0.01  # ten timeouts between datagrams
    assert s.limit == 100


def test_a_push_landing_after_a_take_opens_the_next_batch() -> None:
    """The fast half takes no lock: a message appended during a take must still get a deadline.

    take() lowers check_at before it copies the batch, so whoever appends
    after the copy reaches check(), which opens (arms) the next batch.
    """
    b = make(idle_gap=float("inf"))
    s = b.stream(DEST, 0)
    assert b.push(s, b"first") == OPENED
    for _ in range(5):
        assert b.push(s, b"more") == QUEUED
    real_encode = getattr(b, encoder(b))
    raced: list[int] = []

    def encode_and_race(*args: object, **kwargs: object) -> bytes:
        # A concurrent push's fast half: append, then compare with check_at.
        s.frames.append(b"raced")
        raced.append(len(s.frames) >= s.check_at)
        return real_encode(*args, **kwargs)  # type: ignore[no-any-return]

    with mock.patch.object(b, encoder(b), side_effect=encode_and_race):
        b.take(s, 0.0)
    assert raced == [True]  # the racing push goes on to check()...
    assert b.check(s) == OPENED  # ...which arms the batch holding it
    assert decode_all(b.take(s, 0.0)) == [b"raced"]


def test_check_counts_only_new_messages_and_aims_at_the_limit() -> None:
    b = make(qthresh=1000, idle_gap=float("inf"))
    s = b.stream(DEST, 0)
    assert b.push(s, b"x" * 9) == OPENED  # 10 bytes framed
    assert s.check_at == 1 + 99  # 99 more of the average size reach the limit
    results = [b.push(s, b"x" * 9) for _ in range(98)]
    assert set(results) == {QUEUED}
    assert b.push(s, b"x" * 9) == FULL  # the hundredth: 1000 bytes
    (d,) = b.take(s, 0.0)
    assert len(decode_all([d])) == 100


def test_a_full_datagram_is_not_followed_by_a_tiny_one() -> None:
    """At the datagram limit, a batch is full when one more message of its size would not fit."""
    b = make(qthresh=60_000, max_datagram=2000, idle_gap=float("inf"))
    s = b.stream(DEST, 0)
    while b.push(s, b"y" * 300) != FULL:
        pass
    out = b.take(s, 0.0)
    assert len(out) == 1
    assert len(out[0]) + 309 > 2000


def test_an_emptied_batch_is_not_checked_as_open() -> None:
    b = make()
    s = b.stream(DEST, 0)
    assert b.push(s, b"a") == OPENED
    b.take(s, 0.0)
    assert b.check(s) == QUEUED  # nothing there: the next push opens a batch
    assert s.check_at == 1
    assert b.push(s, b"b") == OPENED


def test_sizes_kept_by_check_stay_aligned_with_the_batch() -> None:
    """check keeps the sizes of large runs for take; small runs in between must not shift them."""
    b = make(qthresh=10**6, max_datagram=65_000, idle_gap=float("inf"))
    s = b.stream(DEST, 0)
    sent: list[bytes] = []
    for run in (1, 10, 100, 3, 200):  # checks after runs below and above the keeping threshold
        for i in range(run):
            payload = bytes([len(sent) % 251]) * (len(sent) % 7 + (300 if i % 5 == 0 else 1))
            s.frames.append(payload)
            sent.append(payload)
        b.check(s)
    s.frames.append(b"unchecked")  # appended after the last check
    sent.append(b"unchecked")
    assert decode_all(b.take(s, 0.0)) == sent


@given(
    st.binary(max_size=600),
    st.sampled_from(["raw", "msgpack"]),
    st.integers(min_value=0, max_value=2**31 - 1),
    st.integers(min_value=0, max_value=40),
)
def test_take_idle_writes_the_datagram_encode_frames_writes(payload: bytes, codec: str, mailbox: int, seq: int) -> None:
    """The idle path builds its header from the stream's constant bytes:
    byte for byte what the general encoder makes."""
    from cmq.wire.frames import FLAG_MSGPACK, encode_frames

    b = Batcher(QueueConfig(codec=codec), sender=77)
    s = b.stream(("127.0.0.1", 9), mailbox)
    s.seq = seq
    s.frames.append(payload)
    data = b.take_idle(s, 1.0)
    flags = FLAG_MSGPACK if codec == "msgpack" else 0
    assert data == encode_frames([payload], flags=flags, sender=77, mailbox=mailbox, seq=seq)
    assert decode(data)[1] == [payload]
    assert s.seq == seq + 1 and not s.frames


class _Clock:
    """A clock that counts its reads (advance reads it at most once)."""

    def __init__(self, now: float) -> None:
        self.now = now
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        return self.now


def test_advance_sends_to_an_idle_destination_at_once() -> None:
    b = make(idle_gap=0.001, timeout=0.5)
    s = b.stream(DEST, 0)
    assert b.append(s, b"hello") == CHECK  # an empty batch: the slow half opens it
    clock = _Clock(1.0)
    out = b.advance(s, clock)
    assert isinstance(out, list) and decode_all(out) == [b"hello"]
    assert clock.reads == 1 and s.last_send == 1.0 and not s.frames


def test_advance_arms_a_busy_destination_then_queues_then_takes_it_full() -> None:
    b = make(idle_gap=0.001, timeout=0.5, qthresh=20)
    s = b.stream(DEST, 0)
    b.sent(s, 10.0)  # a datagram just left: busy
    assert b.append(s, b"aaaa") == CHECK
    assert b.advance(s, _Clock(10.0001)) == 10.5001  # a deadline the driver's timer must honour
    # Below check_at the fast half answers QUEUED: no lock, no clock.
    assert [b.append(s, p) for p in (b"bbbb", b"cccc")] == [QUEUED, QUEUED]
    assert b.append(s, b"dddd") == CHECK  # 20 bytes framed: the limit
    clock = _Clock(10.0002)
    out = b.advance(s, clock)
    assert isinstance(out, list) and decode_all(out) == [b"aaaa", b"bbbb", b"cccc", b"dddd"]
    assert clock.reads == 1


def test_advance_reads_no_clock_while_the_batch_has_room() -> None:
    b = make(idle_gap=0.001, timeout=0.5, qthresh=1000)
    s = b.stream(DEST, 0)
    b.sent(s, 5.0)
    b.append(s, b"x")
    assert isinstance(b.advance(s, _Clock(5.0)), float)
    s.check_at = len(s.frames) + 1  # as if check had asked to be called at the next push
    assert b.append(s, b"y") == CHECK
    clock = _Clock(5.0)
    assert b.advance(s, clock) is None and clock.reads == 0


def test_the_fast_half_refuses_a_payload_too_large_without_appending_it() -> None:
    b = make(max_datagram=1000)
    s = b.stream(DEST, 0)
    assert b.append(s, b"q" * 2000) == LARGE and not s.frames


def test_hold_and_close_send_every_push_to_the_slow_half() -> None:
    b = make(qthresh=10_000)
    s, t = b.stream(DEST, 0), b.stream(DEST, 1)
    for x in (s, t):
        b.append(x, b"a")
        b.check(x)
    assert b.append(s, b"b") == QUEUED
    b.hold(s)
    assert b.append(s, b"c") == CHECK
    assert b.append(t, b"b") == QUEUED
    b.close()
    assert b.append(s, b"d") == CHECK and b.append(t, b"c") == CHECK
