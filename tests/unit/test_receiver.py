"""The sans-IO receiver: delivery, every drop counted by reason, reassembly, envelopes."""

from __future__ import annotations

import struct
from operator import length_hint

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cmq import QueueConfig
from cmq.wire.batcher import LARGE, Batcher
from cmq.wire.frames import FLAG_MSGPACK, encode_fragment, encode_frames
from cmq.wire.receiver import EMPTY, ENVELOPE_BIT, KIND_REPLY, KIND_REQUEST, Receiver

# Every test here runs on the compiled core and on the pure-Python one.
pytestmark = pytest.mark.usefixtures("core")

ADDR = ("127.0.0.1", 5555)


def items(rx: Receiver, mailbox: int = 0) -> list[tuple[object, tuple[object, ...]]]:
    """What waits in ``mailbox``, with meta, without taking it."""
    out = []
    for chunk in rx.mailbox(mailbox).chunks:
        left = length_hint(chunk.it)
        out += [(p, chunk.meta) for p in chunk.items[len(chunk.items) - left :]]
    return out


def payloads(rx: Receiver, mailbox: int = 0) -> list[object]:
    return [p for p, _ in items(rx, mailbox)]


def dgram(*msgs: bytes, seq: int = 0, mailbox: int = 0, flags: int = 0, sender: int = 1, key: bytes | None = None) -> bytes:
    return encode_frames(list(msgs), flags=flags, sender=sender, mailbox=mailbox, seq=seq, key=key)


def test_messages_are_delivered_in_datagram_order_with_meta() -> None:
    rx = Receiver(QueueConfig())
    assert rx.datagram_received(dgram(b"a", b"b", seq=0), ADDR, 0.0) == 2
    assert rx.datagram_received(dgram(b"c", seq=1), ADDR, 0.0) == 1
    assert payloads(rx) == [b"a", b"b", b"c"]
    _, meta = items(rx)[2]
    assert meta == (ADDR, 1, 0, 1, None)
    assert (rx.messages_received, rx.datagrams_received) == (3, 2)


def test_mailboxes_are_separate() -> None:
    rx = Receiver(QueueConfig())
    rx.datagram_received(dgram(b"to7", mailbox=7), ADDR, 0.0)
    assert payloads(rx, 0) == []
    assert payloads(rx, 7) == [b"to7"]


def test_each_kind_of_bad_datagram_is_counted_and_the_next_good_one_delivered() -> None:
    key = b"key"
    rx = Receiver(QueueConfig(key=key))
    bad = {
        "malformed": [b"", b"junk" * 10, b"\xc3\x51\x09" + bytes(13)],
        "bad_tag": [dgram(b"x"), dgram(b"x", key=b"wrong")],
    }
    for reason, datagrams in bad.items():
        for d in datagrams:
            assert rx.datagram_received(d, ADDR, 0.0) == 0
        assert rx.dropped[reason] == len(datagrams)
    assert rx.datagram_received(dgram(b"good", key=key), ADDR, 0.0) == 1
    assert payloads(rx) == [b"good"]


def test_undecodable_msgpack_payload_is_dropped_alone() -> None:
    rx = Receiver(QueueConfig(codec="msgpack"))
    good = msgpack.packb({"a": 1})
    rx.datagram_received(dgram(good, b"\xc1", msgpack.packb([1, 2]), flags=FLAG_MSGPACK), ADDR, 0.0)
    assert payloads(rx) == [{"a": 1}, [1, 2]]
    assert rx.dropped["undecodable"] == 1


def test_receive_queue_is_bounded_and_overflow_counted() -> None:
    rx = Receiver(QueueConfig(max_queued=3))
    rx.datagram_received(dgram(b"1", b"2"), ADDR, 0.0)
    rx.datagram_received(dgram(b"3", b"4", b"5", seq=1), ADDR, 0.0)
    assert payloads(rx) == [b"1", b"2", b"3"]
    assert rx.dropped["queue_full"] == 2
    assert rx.mailbox(0).pop() == b"1"
    rx.datagram_received(dgram(b"6", seq=2), ADDR, 0.0)
    assert payloads(rx) == [b"2", b"3", b"6"]


def test_sequence_gaps_and_late_datagrams_are_counted() -> None:
    rx = Receiver(QueueConfig())
    for seq in (0, 1, 4, 2, 5):
        rx.datagram_received(dgram(b"m", seq=seq), ADDR, 0.0)
    assert rx.datagrams_missing == 2  # 2 and 3 skipped when 4 came
    assert rx.datagrams_late == 1  # 2 came after 4
    assert len(payloads(rx)) == 5  # nothing is dropped for being late


def test_sequence_wraps_without_a_gap() -> None:
    rx = Receiver(QueueConfig())
    for seq in (2**32 - 2, 2**32 - 1, 0, 1):
        rx.datagram_received(dgram(b"m", seq=seq), ADDR, 0.0)
    assert (rx.datagrams_missing, rx.datagrams_late) == (0, 0)


def _fragments(payload: bytes, max_datagram: int = 300) -> list[bytes]:
    b = Batcher(QueueConfig(max_datagram=max_datagram, max_message=10**6), sender=9)
    s = b.stream(ADDR, 0)
    assert b.push(s, payload) == LARGE
    return b.fragments(s, payload, 0.0)


def test_fragments_reassemble_in_any_order() -> None:
    big = bytes(range(256)) * 10
    frags = _fragments(big)
    rx = Receiver(QueueConfig())
    for d in reversed(frags):
        rx.datagram_received(d, ADDR, 0.0)
    assert payloads(rx) == [big]
    assert rx.reassembly_bytes == 0 and rx.partials == 0


def test_incomplete_message_expires_and_is_counted() -> None:
    frags = _fragments(b"z" * 1000)
    rx = Receiver(QueueConfig(reassembly_timeout=2.0))
    rx.datagram_received(frags[0], ADDR, now=10.0)
    assert rx.next_deadline() == 12.0
    assert rx.expire(11.9) == 0
    assert rx.expire(12.0) == 1
    assert rx.dropped["fragment_expired"] == 1
    assert rx.reassembly_bytes == 0
    for d in frags[1:]:  # the rest, late: a new partial that never completes
        rx.datagram_received(d, ADDR, now=13.0)
    assert payloads(rx) == []


def test_reassembly_memory_is_bounded() -> None:
    frags = _fragments(b"q" * 2000)
    rx = Receiver(QueueConfig(max_reassembly=500))
    for d in frags:
        rx.datagram_received(d, ADDR, 0.0)
    assert rx.dropped["reassembly_full"] >= 1
    assert rx.reassembly_bytes <= 500
    assert payloads(rx) == []


def test_fragment_count_mismatch_is_malformed() -> None:
    rx = Receiver(QueueConfig())
    rx.datagram_received(encode_fragment(b"a", message_id=1, index=0, count=3, flags=0, sender=1, mailbox=0, seq=0), ADDR, 0.0)
    rx.datagram_received(encode_fragment(b"b", message_id=1, index=1, count=4, flags=0, sender=1, mailbox=0, seq=1), ADDR, 0.0)
    assert rx.dropped["malformed"] == 1
    assert rx.partials == 0


def test_requests_go_to_the_mailbox_and_replies_to_the_reply_list() -> None:
    rx = Receiver(QueueConfig())
    env = struct.Struct(">BQ")
    rx.datagram_received(dgram(env.pack(KIND_REQUEST, 99) + b"question", mailbox=ENVELOPE_BIT | 3), ADDR, 0.0)
    rx.datagram_received(dgram(env.pack(KIND_REPLY, 5) + b"answer", mailbox=ENVELOPE_BIT, seq=0, sender=2), ADDR, 0.0)
    rx.datagram_received(dgram(b"tiny", mailbox=ENVELOPE_BIT, sender=3), ADDR, 0.0)
    [(payload, meta)] = items(rx, 3)
    assert payload == b"question" and meta[4] == 99 and meta[2] == 3
    assert list(rx.replies) == [(5, b"answer", ADDR)]
    assert rx.dropped["bad_envelope"] == 1


@settings(max_examples=400)
@given(st.lists(st.binary(max_size=120), max_size=30), st.booleans())
def test_receiver_never_raises_and_accounts_for_every_datagram(datagrams: list[bytes], keyed: bool) -> None:
    rx = Receiver(QueueConfig(key=b"k" if keyed else None, codec="msgpack"))
    for d in datagrams:
        rx.datagram_received(d, ADDR, 0.0)
        rx.datagram_received(b"\xc3\x51\x01" + d, ADDR, 0.0)
    assert rx.datagrams_received == 2 * len(datagrams)


def test_mailbox_takes_in_order_across_chunks() -> None:
    rx = Receiver(QueueConfig())
    for seq, msgs in enumerate([[b"a", b"b", b"c"], [b"d"], [b"e", b"f"]]):
        rx.datagram_received(dgram(*msgs, seq=seq), ADDR, 0.0)
    mb = rx.mailbox(0)
    assert mb.queued() == 6
    assert mb.pop() == b"a"
    assert mb.take(3) == [b"b", b"c", b"d"]
    assert mb.take_matching(lambda p: p == b"f") is not None
    assert mb.any_matching(lambda p: p == b"e")
    assert [p for p, _ in mb.take_items(10)] == [b"e"]
    assert mb.pop() is EMPTY
    assert mb.exact() == 0 and mb.queued() == 0 and not mb.chunks


def test_concurrent_consumers_never_take_a_message_twice() -> None:
    import threading

    rx = Receiver(QueueConfig(max_queued=10**6))
    for seq in range(2000):
        rx.datagram_received(dgram(*[b"%d" % (seq * 10 + i) for i in range(10)], seq=seq), ADDR, 0.0)
    mb = rx.mailbox(0)
    taken: list[list[object]] = [[], [], []]

    def consume(k: int) -> None:
        while True:
            got = mb.take(7) if k == 0 else [mb.pop()]
            if got == [EMPTY] or not got:
                return
            taken[k].extend(got)

    threads = [threading.Thread(target=consume, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    everything = sorted(int(p) for part in taken for p in part)  # type: ignore[call-overload]
    assert everything == list(range(20000))


def test_receive_one_hands_a_lone_message_to_the_reader_and_counts_it() -> None:
    rx = Receiver(QueueConfig())
    # The first datagram of a stream goes the general way (it registers the stream).
    assert rx.receive_one(dgram(b"first", seq=0), ADDR, 0.0, 0) is None
    assert payloads(rx) == [b"first"]
    rx.mailbox(0).take(10)
    assert rx.receive_one(dgram(b"short", seq=1), ADDR, 0.0, 0) == (b"short", (ADDR, 1, 0, 1, None))
    long = bytes(range(256)) * 3
    assert rx.receive_one(dgram(long, seq=2), ADDR, 0.0, 0) == (long, (ADDR, 1, 0, 2, None))
    assert (rx.messages_received, rx.datagrams_received) == (3, 3)
    assert payloads(rx) == []


def test_receive_one_queues_what_is_not_one_message_for_the_reader() -> None:
    rx = Receiver(QueueConfig())
    rx.receive_one(dgram(b"x", seq=0), ADDR, 0.0, 0)
    rx.mailbox(0).take(10)
    assert rx.receive_one(dgram(b"a", b"b", seq=1), ADDR, 0.0, 0) is None  # two messages
    assert rx.receive_one(dgram(b"other", seq=2, mailbox=4), ADDR, 0.0, 0) is None  # another mailbox
    assert rx.receive_one(dgram(b"gap", seq=9), ADDR, 0.0, 0) is None  # out of sequence: accounted
    assert rx.receive_one(b"\xc3\x51\x01\x00" + bytes(12) + b"\x05ab", ADDR, 0.0, 0) is None  # truncated
    assert payloads(rx) == [b"a", b"b", b"gap"]
    assert payloads(rx, 4) == [b"other"]
    assert rx.datagrams_missing == 7  # seqs 2-8 of mailbox 0 (mailbox 4 is its own stream)
    assert rx.dropped["malformed"] == 1


def test_receive_one_decodes_msgpack_and_counts_what_does_not_decode() -> None:
    rx = Receiver(QueueConfig(codec="msgpack"))
    rx.receive_one(dgram(msgpack.packb(0), seq=0, flags=FLAG_MSGPACK), ADDR, 0.0, 0)
    rx.mailbox(0).take(10)
    assert rx.receive_one(dgram(msgpack.packb({"k": [1]}), seq=1, flags=FLAG_MSGPACK), ADDR, 0.0, 0) == (
        {"k": [1]},
        (ADDR, 1, 0, 1, None),
    )
    assert rx.receive_one(dgram(b"\xc1", seq=2, flags=FLAG_MSGPACK), ADDR, 0.0, 0) is None
    assert rx.dropped["undecodable"] == 1
    assert rx.datagrams_received == 3


def _counters(rx: Receiver) -> tuple[object, ...]:
    return (rx.messages_received, rx.datagrams_received, rx.bytes_received, rx.datagrams_missing, dict(rx.dropped))


_PRIMED = 5  # both receivers have seen seqs 0..4 of the stream (sender 1, mailbox 0)


def _mutate(payload: bytes, at: int, byte: int, how: str) -> bytes:
    d = dgram(payload, seq=_PRIMED)
    if how == "cut":
        return d[:at]
    if how == "grow":
        return d + bytes([byte])
    i = at % len(d)
    return d[:i] + bytes([byte]) + d[i + 1 :]


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        # well-formed datagrams of every shape the fast path must judge
        st.builds(
            lambda msgs, seq, mailbox, flags, sender: dgram(
                *msgs, seq=seq, mailbox=mailbox, flags=flags, sender=sender
            ),
            st.lists(st.binary(max_size=300), min_size=1, max_size=3),
            st.sampled_from([_PRIMED, _PRIMED + 1, _PRIMED - 1, 0]),
            st.sampled_from([0, 0, 3]),
            st.sampled_from([0, FLAG_MSGPACK]),
            st.sampled_from([1, 1, 2]),
        ),
        # and mutations of one: truncated, extended, a byte flipped
        st.builds(
            _mutate,
            st.binary(min_size=1, max_size=300),
            st.integers(min_value=0, max_value=400),
            st.integers(min_value=0, max_value=255),
            st.sampled_from(["cut", "flip", "grow"]),
        ),
    )
)
def test_receive_one_delivers_exactly_what_the_general_path_delivers(data: bytes) -> None:
    """The latency path is a shortcut, never a different outcome: the same
    message with the same meta, the same counters, the same drops."""
    fast, general = Receiver(QueueConfig()), Receiver(QueueConfig())
    for rx in (fast, general):
        for seq in range(_PRIMED):
            rx.datagram_received(dgram(b"p", seq=seq), ADDR, 0.0)
        rx.mailbox(0).take(100)
    item = fast.receive_one(data, ADDR, 0.0, 0)
    general.datagram_received(data, ADDR, 0.0)
    expected = items(general, 0)
    if item is not None:
        assert [item] == expected
        general.mailbox(0).take(100)
    for mailbox in (0, 3):
        assert items(fast, mailbox) == items(general, mailbox)
    assert _counters(fast) == _counters(general)
