"""The compiled core and the pure-Python core agree byte for byte.

Each property feeds the same inputs to both twins (framing, splitting, a
batcher's datagrams, a receiver's deliveries) and compares what comes out,
errors included. The rest of the sans-IO suite runs on both cores too (the
``core`` fixture).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import shutil
import socket
import struct
import sys
import threading
import time
from typing import Any

import msgpack
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import cmq
from cmq import QueueConfig, _impl
from cmq._errors import ProtocolError
from cmq.wire import frames
from cmq.wire.batcher import CHECK, Batcher, Stream
from cmq.wire.receiver import _V2_SLOW, Receiver
from cmq.wire.reliable import (
    RecvStream,
    ReliableSender,
    SendStream,
    recv_stream_type,
    release_acked,
    send_stream_type,
)

if not _impl.available():
    pytest.skip("the compiled core is not built here (no C compiler at install time)", allow_module_level=True)

from cmq import _speedups  # type: ignore[attr-defined]

payload_lists = st.lists(
    st.one_of(st.binary(max_size=300), st.sampled_from([b"", b"x" * 254, b"y" * 255, b"z" * 256, b"w" * 1000])),
    max_size=40,
)


def test_bootstrap_builds_the_compiled_core_where_gcc_is() -> None:
    # Where a compiler is, the README's commands run the compiled core.
    if shutil.which("gcc") is None:
        pytest.skip("no gcc: the pure-Python core is what runs here")
    assert _impl.available()
    assert cmq.implementation() in ("compiled", "python")


def test_implementation_names_the_selected_core() -> None:
    with _impl.using("python"):
        assert cmq.implementation() == "python"
        with _impl.using("compiled"):
            assert cmq.implementation() == "compiled"
        assert cmq.implementation() == "python"
    with pytest.raises(ValueError, match="unknown core"):
        _impl.use("fortran")


def test_compiled_stream_has_the_pure_streams_attributes() -> None:
    pure = Stream(("127.0.0.1", 1), 3, 512, b"head")
    compiled = _speedups.Stream(("127.0.0.1", 1), 3, 512, b"head")
    for name in Stream.__slots__:
        if name == "sizes":  # the compiled check keeps none: a shared empty tuple
            assert list(compiled.sizes) == pure.sizes == []
            continue
        assert getattr(compiled, name) == getattr(pure, name) or name == "last_send"
    assert compiled.pending == pure.pending == 0


@given(
    payloads=payload_lists,
    seq=st.integers(0, 2**33),
    mailbox=st.integers(0, 2**32 - 1),
    sender=st.integers(1, 2**32 - 1),
    flags=st.sampled_from([0, frames.FLAG_MSGPACK]),
    reliable=st.booleans(),
    epoch=st.integers(0, 2**32 - 1),
)
@settings(max_examples=300, deadline=None)
def test_frame_is_byte_for_byte_the_pure_twin_and_encode_frames(
    payloads: list[bytes], seq: int, mailbox: int, sender: int, flags: int, reliable: bool, epoch: int
) -> None:
    version = frames.VERSION_2 if reliable else frames.VERSION
    head = frames.stream_head(flags, sender, mailbox, version)
    ext = frames.extension(epoch, frames.R_ORDERED) if reliable else b""
    compiled = _speedups.frame(payloads, head, seq, ext)
    assert compiled == frames.frame(payloads, head, seq, ext)
    assert compiled == frames.encode_frames(payloads, flags, sender, mailbox, seq & 0xFFFFFFFF, ext=ext)


def test_frame_refuses_what_is_not_bytes() -> None:
    with pytest.raises(TypeError):
        _speedups.frame([bytearray(b"x")], b"h" * 12, 0, b"")


def _split(fn: object, data: bytes, start: int, end: int) -> tuple[str, object]:
    try:
        return "ok", fn(data, start, end)  # type: ignore[operator]
    except ProtocolError as exc:
        return "error", str(exc)


@given(data=st.binary(max_size=600), cut=st.integers(0, 20))
@settings(max_examples=500, deadline=None)
def test_split_agrees_on_any_bytes(data: bytes, cut: int) -> None:
    start = min(cut, len(data))
    assert _split(_speedups.split_frames, data, start, len(data)) == _split(frames.split_frames, data, start, len(data))


@given(payloads=payload_lists)
@settings(max_examples=300, deadline=None)
def test_split_inverts_frame_on_both_cores(payloads: list[bytes]) -> None:
    data = frames.frame(payloads, b"h" * 12, 7, b"")
    assert _speedups.split_frames(data, 16, len(data)) == payloads
    assert frames.split_frames(data, 16, len(data)) == payloads


def _datagrams(core: str, sizes: list[int], qthresh: int, reliable: bool) -> list[bytes]:
    with _impl.using(core):
        b = Batcher(QueueConfig(qthresh=qthresh, idle_gap=float("inf"), max_datagram=2000), sender=9)
    s = b.stream(("127.0.0.1", 4000), 2, reliable=reliable)
    if reliable:
        s.ext = frames.extension(5, frames.R_SYN)
    out: list[bytes] = []
    for i, n in enumerate(sizes):
        payload = bytes([i % 251]) * n
        r = b.push(s, payload)
        if r == 3:  # LARGE
            out += b.fragments(s, payload, float(i))
        elif r == 2:  # FULL
            out += b.take(s, float(i))
    out += b.take(s, float(len(sizes)))
    return out


@given(
    sizes=st.lists(st.one_of(st.integers(0, 40), st.integers(200, 300), st.integers(1900, 2100)), max_size=80),
    qthresh=st.sampled_from([1, 64, 512, 1500]),
    reliable=st.booleans(),
)
@settings(max_examples=150, deadline=None)
def test_batchers_of_both_cores_emit_the_same_datagrams(
    sizes: list[int], qthresh: int, reliable: bool
) -> None:
    assert _datagrams("compiled", sizes, qthresh, reliable) == _datagrams("python", sizes, qthresh, reliable)


def _deadline_answers(core: str, ops: list[tuple[int, int, int]]) -> list[object]:
    """What a deadline heap of ``core`` answers to ``ops`` on four streams:
    ``(0, i, t)`` pushes stream ``i`` due at ``t`` (few values, so deadlines
    tie), ``(1, i, _)`` takes stream ``i``'s batch (its entries die), ``(2, i, _)``
    appends to it, ``(3, _, t)`` pops what is due at ``t``, ``(4, _, _)`` asks
    for the first deadline and the waiting streams. Streams are named by index."""
    with _impl.using(core):
        b = Batcher(QueueConfig(idle_gap=float("inf")), sender=1)
    streams = [b.stream(("127.0.0.1", 4000 + i), 0) for i in range(4)]
    heap = b.heap
    index = {id(s): i for i, s in enumerate(streams)}
    seen: list[object] = []
    for op, i, t in ops:
        s = streams[i]
        if op == 0:
            heap.push(float(t), s)
        elif op == 1:
            b.take(s, 0.0)
        elif op == 2:
            b.append(s, b"m")
        elif op == 3:
            seen.append(("due", [index[id(x)] for x in heap.pop_due(float(t))]))
        else:
            seen.append(("first", heap.first(), [index[id(x)] for x in heap.waiting()]))
        seen.append(len(heap))
    seen.append(("rest", [index[id(x)] for x in heap.pop_due(float("inf"))]))
    return seen


@given(ops=st.lists(st.tuples(st.integers(0, 4), st.integers(0, 3), st.integers(0, 5)), max_size=80))
@settings(max_examples=300, deadline=None)
def test_deadline_heaps_of_both_cores_answer_the_same(ops: list[tuple[int, int, int]]) -> None:
    assert _deadline_answers("compiled", ops) == _deadline_answers("python", ops)


def test_compiled_heap_keeps_its_streams_alive_and_lets_them_go() -> None:
    heap = _speedups.Deadlines()
    s = _speedups.Stream(("127.0.0.1", 1), 0, 512)
    s.frames.append(b"x")
    before = sys.getrefcount(s)
    for t in (3.0, 1.0, 2.0):
        heap.push(t, s)
    assert sys.getrefcount(s) == before + 3
    assert heap.pop_due(1.5) == [s]
    del heap
    assert sys.getrefcount(s) == before
    with pytest.raises(TypeError):
        _speedups.Deadlines().push(1.0, None)


class _Rel:
    """A stand-in for a reliable stream's state: it refers back to its stream."""

    def __init__(self, stream: object, freed: list[bool]) -> None:
        self.stream = stream
        self.freed = freed

    def __del__(self) -> None:
        self.freed.append(True)


def test_a_best_effort_stream_is_no_work_for_the_cycle_collector_and_a_reliable_one_is_collected() -> None:
    s = _speedups.Stream(("127.0.0.1", 1), 0, 512)
    assert not gc.is_tracked(s) and not gc.is_tracked(s.frames)
    freed: list[bool] = []
    s.rel = _Rel(s, freed)  # a cycle: the collector must see it
    assert gc.is_tracked(s)
    del s
    gc.collect()
    assert freed == [True]


def _deliveries(core: str, datagrams: list[bytes]) -> tuple[list[object], dict[str, int]]:
    with _impl.using(core):
        rx = Receiver(QueueConfig())
    for d in datagrams:
        rx.datagram_received(d, ("127.0.0.1", 1), 0.0)
    return rx.mailbox(0).take(1 << 20), dict(rx.dropped)


@given(
    chunks=st.lists(payload_lists, max_size=8),
    garbage=st.lists(st.binary(min_size=16, max_size=80), max_size=3),
)
@settings(max_examples=150, deadline=None)
def test_receivers_of_both_cores_deliver_the_same(
    chunks: list[list[bytes]], garbage: list[bytes]
) -> None:
    head = frames.stream_head(0, 3, 0)
    datagrams = [frames.frame(p, head, seq, b"") for seq, p in enumerate(chunks)]
    # Valid headers with bodies that may not split: the fast path's errors.
    datagrams += [head + bytes(4) + g for g in garbage]
    assert _deliveries("compiled", datagrams) == _deliveries("python", datagrams)


def _reliable_deliveries(
    core: str, datagrams: list[bytes], ops: list[tuple[int, int]], budget: int = 6000
) -> list[object]:
    """What a receiver of ``core`` does with a reliable stream's ``datagrams``
    fed as ``ops`` say: ``(0, i)`` delivers datagram ``i`` (again, or out of
    order), ``(3, _)`` the one after the last delivered, ``(1, _)`` takes the
    STATUS due, ``(2, k)`` takes ``k`` messages, ``(4, k)`` reads the one
    after the last delivered as a reader waiting on a mailbox does, once
    it took all of mailbox 2 and the STATUS owed (``receive_one``: mailbox
    2, or 0 when ``k`` is a multiple of 3), ``(5, _)`` the same without
    taking anything first."""
    with _impl.using(core):
        rx = Receiver(QueueConfig(max_queued=12, max_buffered_bytes=budget, max_datagram=2000), sender_id=1)
    rx.set_kernel_budget(budget)
    seen: list[object] = []
    now = 0.0
    last = -1
    for op, arg in ops:
        now += 0.003 if op == 1 else 0.0005  # a STATUS taken is due (max_ack_delay)
        if op in (0, 3):
            last = arg % len(datagrams) if op == 0 else (last + 1) % len(datagrams)
            got = rx.datagram_received(datagrams[last], ("127.0.0.1", 4000), now)
            # With the budget's running count: a path that took a datagram
            # near the budget without measuring it leaves another count.
            seen.append(("got", got, rx.status_urgent, rx.new_due, rx._unchecked, rx._free))
        elif op == 5:
            # A reader waiting on mailbox 2 that took nothing (the budget may be full).
            last = (last + 1) % len(datagrams)
            one = rx.receive_one(datagrams[last], ("127.0.0.1", 4000), now, 2)
            seen.append(("one", one, rx.datagrams_received, rx._unchecked, rx._free, rx.new_due))
        elif op == 4:
            # A reader that took everything, so that credit is open, then waits.
            seen.append(("took", rx.mailbox(2).take(1 << 20), rx.take_status(now, all_owed=True)))
            last = (last + 1) % len(datagrams)
            one = rx.receive_one(datagrams[last], ("127.0.0.1", 4000), now, 2 if arg % 3 else 0)
            seen.append(("one", one, rx.datagrams_received, rx.bytes_received, rx.new_due))
        elif op == 1:
            seen.append(("status", rx.take_status(now)))
        else:
            seen.append(("took", rx.mailbox(2).take(arg)))
    streams = sorted(
        (k, [getattr(rs, f) for f in sorted(RecvStream.__slots__) if f not in ("held", "seen")], sorted(rs.held), sorted(rs.seen))
        for k, rs in rx._rstreams.items()
    )
    counters = (
        rx.duplicates, rx.overruns, rx.messages_received, rx.status_urgent, rx.owed, rx._unchecked, rx._held_rel, dict(rx.dropped),
    )  # fmt: skip
    return [seen, streams, counters, rx.mailbox(2).take(1 << 20)]


def _stream(chunks: list[list[bytes]], syn: int, codec: int, broken: list[int], *, ordered: bool = True) -> list[bytes]:
    """A reliable stream's datagrams (ordered, or unordered), one per chunk
    of payloads (the first ``syn`` with R_SYN; those in ``broken`` with a
    last frame that runs past the end, or is garbage MessagePack)."""
    head = frames.stream_head(codec, 3, 2, frames.VERSION_2)
    datagrams = []
    for seq, payloads in enumerate(chunks):
        ext = frames.extension(77, (frames.R_ORDERED if ordered else 0) | (frames.R_SYN if seq < syn else 0))
        if codec:
            payloads = [msgpack.packb(p) for p in payloads]
        d = frames.frame(payloads, head, seq, ext)
        if seq in broken:
            d = d[:-1] + b"\xff"
        datagrams.append(d)
    return datagrams


@given(
    chunks=st.lists(st.lists(st.binary(max_size=120), min_size=1, max_size=6), min_size=1, max_size=12),
    syn=st.integers(0, 4),
    codec=st.sampled_from([0, frames.FLAG_MSGPACK]),
    broken=st.lists(st.integers(0, 11), max_size=2),
    ops=st.lists(st.tuples(st.sampled_from([3, 3, 3, 3, 0, 1, 2, 4, 4]), st.integers(0, 30)), max_size=60),
    ordered=st.booleans(),
)
@settings(max_examples=300, deadline=None)
def test_receivers_of_both_cores_keep_reliable_streams_alike(
    chunks: list[list[bytes]], syn: int, codec: int, broken: list[int], ops: list[tuple[int, int]], ordered: bool
) -> None:
    """The reliable fast paths (compiled or pure: a drain's and a waiting
    reader's) and the general path they fall back to: in-order, repeated,
    reordered, over credit, over a full mailbox, malformed and undecodable
    datagrams, STATUS between them; ordered and unordered streams."""
    datagrams = _stream(chunks, syn, codec, broken, ordered=ordered)
    # The stream starts with its first datagram, so that the rest can be fast.
    ops = [(0, 0), (1, 0), *ops, (1, 0), (0, 1), (0, 2), (0, 3)]
    assert _reliable_deliveries("compiled", datagrams, ops) == _reliable_deliveries("python", datagrams, ops)


@given(
    chunks=st.lists(st.lists(st.binary(max_size=120), min_size=1, max_size=6), min_size=2, max_size=16),
    codec=st.sampled_from([0, frames.FLAG_MSGPACK]),
    broken=st.lists(st.integers(0, 15), max_size=2),
    ops=st.lists(st.tuples(st.sampled_from([0, 0, 0, 3, 3, 1, 2]), st.integers(0, 30)), max_size=60),
    ordered=st.booleans(),
    budget=st.sampled_from([200_000, 200_000, 3000]),
)
@settings(max_examples=400, deadline=None)
def test_receivers_of_both_cores_take_what_comes_past_a_gap_alike(
    chunks: list[list[bytes]], codec: int, broken: list[int], ops: list[tuple[int, int]], ordered: bool, budget: int
) -> None:
    """With credit for many datagrams, what arrives past a gap is held
    (ordered) or delivered and noted as seen (unordered), and the datagram
    that fills the gap is delivered with what was held after it (the
    compiled core's fast path does it in C, the pure core's general path
    in Python): the same deliveries, STATUS, held and seen datagrams,
    stream fields and counters, with the budget near and far."""
    datagrams = _stream(chunks, 1, codec, broken, ordered=ordered)
    ops = [(0, 0), (1, 0), *ops, (1, 0), *[(3, 0)] * len(datagrams)]
    assert _reliable_deliveries("compiled", datagrams, ops, budget) == _reliable_deliveries(
        "python", datagrams, ops, budget
    )


@pytest.mark.parametrize("way", ["past a gap", "in order", "to a waiting reader"])
@pytest.mark.parametrize("ordered", [True, False])
def test_receivers_of_both_cores_refuse_alike_what_credit_allows_and_the_budget_cannot_hold(
    ordered: bool, way: str
) -> None:
    """Credit counts datagrams of the size the stream's datagrams had so far:
    after small ones, larger ones within credit can be more than the
    receive budget holds. Past a gap (held, or delivered and noted as
    seen), in order, or to a reader waiting on the mailbox, both cores take
    and refuse the same ones, with the same running count of the budget
    (the compiled fast paths hand a datagram near the budget to the general
    path, which measures the budget exactly)."""
    ops: list[tuple[int, int]] = []
    if way == "past a gap":
        # Three small datagrams, then big ones past a gap at datagram 3
        # (six messages each), then the gap filled and all again.
        n, big = 3, [[bytes(120)] * 6] * 12
        ops = [(0, 0), (0, 1), (0, 2), (1, 0), *[(0, i) for i in range(4, 15)], (1, 0), (0, 3)]
    else:
        # Small datagrams taken as they come, so that credit grows (a STATUS
        # every three), then big ones (one message each: the mailbox holds
        # 12, so that the budget, not the mailbox, is full first), none taken.
        n, big = 24, [[bytes(720)]] * 12
        for i in range(n):
            ops += [(0, i), (2, 30), (1, 0)] if i % 3 == 2 else [(0, i)]
        ops += [(0, i) for i in range(n, n + 12)] if way == "in order" else [(5, 0)] * 12
    datagrams = _stream([[b"a"]] * n + big, 1, 0, [], ordered=ordered)  # big ones: about 750 bytes each
    ops += [(1, 0), (2, 30), *[(0, i) for i in range(n, n + 12)]]
    compiled = _reliable_deliveries("compiled", datagrams, ops, 3000)
    assert compiled == _reliable_deliveries("python", datagrams, ops, 3000)
    assert any(step[0] == "got" and step[1] == 0 for step in compiled[0])  # some were refused


def _drained(datagrams: list[bytes], ops: list[tuple[int, int]], *, through_io: bool) -> list[object]:
    """What a compiled receiver does with ``datagrams`` sent over loopback in
    the groups ``ops`` say (``(0, i)`` sends datagram ``i`` next, ``(1, k)``
    reads what was sent and takes ``k`` messages of mailbox 2 and the STATUS
    due), read either by ``DatagramIO.read`` and ``deliver`` or by
    ``DatagramIO.recv`` and ``datagram_received`` on each."""
    with _impl.using("compiled"):
        rx = Receiver(QueueConfig(max_queued=12, max_buffered_bytes=6000, max_datagram=2000), sender_id=1)
    rx.set_kernel_budget(6000)
    a, b = _pair()
    seen: list[object] = []
    with a, b:
        io = _speedups.DatagramIO(socket.dup(b.fileno()), 4, 4096)
        sent = 0
        now = 0.0
        try:
            for op, arg in [*ops, (1, 1 << 20)]:
                if op == 0:
                    a.sendto(datagrams[arg % len(datagrams)], b.getsockname())
                    sent += 1
                    continue
                now += 0.003
                while sent:
                    if through_io:
                        got = io.read(min(sent, 3))
                        assert io.deliver(rx, rx._fast_v2, rx.datagram_received, rx._general, _V2_SLOW, now) is False
                    else:
                        batch = io.recv(min(sent, 3))
                        got = len(batch)
                        for d, addr in batch:
                            rx.datagram_received(d, addr, now)
                    assert got, "a datagram sent over loopback did not arrive"
                    sent -= got
                seen.append((rx.mailbox(2).take(arg), [d for d, _ in rx.take_status(now)]))
        finally:
            io.close()
    streams = sorted(
        (k[1:], [getattr(rs, f) for f in sorted(RecvStream.__slots__) if f not in ("held", "seen", "addr")], sorted(rs.held), sorted(rs.seen))
        for k, rs in rx._rstreams.items()
    )
    counters = (
        rx.datagrams_received, rx.bytes_received, rx.duplicates, rx.overruns, rx.messages_received,
        rx.status_urgent, rx.owed, rx._unchecked, dict(rx.dropped),
    )  # fmt: skip
    return [seen, streams, counters]


@given(
    chunks=st.lists(st.lists(st.binary(max_size=120), min_size=1, max_size=6), min_size=1, max_size=10),
    syn=st.integers(0, 3),
    broken=st.lists(st.integers(0, 9), max_size=2),
    ops=st.lists(st.tuples(st.sampled_from([0, 0, 0, 0, 1]), st.integers(0, 20)), max_size=50),
)
@settings(max_examples=60, deadline=None)
def test_a_drain_delivering_where_it_read_is_datagram_received_on_each(
    chunks: list[list[bytes]], syn: int, broken: list[int], ops: list[tuple[int, int]]
) -> None:
    """DatagramIO.deliver hands each datagram it read to the receiver's
    compiled fast path where it lies, or as bytes to the general path: the
    same deliveries, STATUS, stream state and counters as the bytes read by
    recv, each given to datagram_received. The datagrams: a reliable stream's
    (in order, repeated, reordered, malformed, past the mailbox's room), a
    best-effort one and bytes that are no datagram."""
    head = frames.stream_head(0, 3, 2, frames.VERSION_2)
    datagrams = [
        frames.frame(payloads, head, seq, frames.extension(77, frames.R_ORDERED | (frames.R_SYN if seq < syn else 0)))
        for seq, payloads in enumerate(chunks)
    ]
    for i in broken:
        if i < len(datagrams):
            datagrams[i] = datagrams[i][:-1] + b"\xff"  # the last frame now runs past the end
    datagrams += [frames.frame([b"plain"], frames.stream_head(0, 3, 2), 0, b""), b"\xc3Q\x02", b"junk"]
    ops = [(0, 0), (1, 0), *ops]
    assert _drained(datagrams, ops, through_io=True) == _drained(datagrams, ops, through_io=False)


def _reliable_sends(core: str, ops: list[tuple[int, int, int]]) -> list[object]:
    """What a reliable sender of ``core`` does with ``ops``: ``(0, n, k)``
    sends ``n`` new datagrams of stream ``k`` (as the driver's ``_emit``:
    ``clear`` then ``sent``, else ``outgoing``), ``(1, a, k)`` applies a
    STATUS acknowledging ``a`` more of them (past what was sent when ``a``
    is large) with more credit, ``(2, _, _)`` fires the timers due."""
    with _impl.using(core):
        b = Batcher(QueueConfig(max_datagram=2000), sender=9)
        rel = ReliableSender(9, codec_msgpack=False, key=None, max_probes=3)
    epochs = iter(range(100, 1 << 20))
    rel._new_epoch = lambda: next(epochs)  # type: ignore[method-assign]  # the same epochs on both cores
    streams = [rel.attach(b.stream(("127.0.0.1", 4000 + k), 2, reliable=True), ordered=True) for k in range(2)]
    seen: list[object] = []
    now = 0.0
    for op, arg, k in ops:
        now += 0.0007
        st = streams[k]
        if op == 0:
            n = arg % 5 + 1
            ds = [bytes([st.stream.seq % 251]) * (st.stream.seq % 40 + 20) for _ in range(n)]
            st.stream.seq = (st.stream.seq + n) & 0xFFFFFFFF
            if rel.clear(st, n):
                rel.sent(st, ds, now)
                seen.append(("sent", n))
            else:
                seen.append(("out", rel.outgoing(st, ds, now)))
        elif op == 1:
            nxt = (st.una + arg % 9) & 0xFFFFFFFF
            rec = frames.Status(
                stream_sender=9, mailbox=2, epoch=st.epoch, next_expected=nxt,
                credit_limit=(nxt + arg % 23) & 0xFFFFFFFF, largest_seen=(nxt - 1) & 0xFFFFFFFF, ack_delay=50,
            )
            got, out = rel.on_status(rec, now)
            seen.append(("status", got is st, out))
        else:
            seen.append(("timer", rel.on_timer(now + arg * 0.01)))
    state = [
        (st.epoch, st.una, st.sent_upto, st.credit, st.nbytes, st.pto_at, st.pto_count, st.syn, dict(st.buf), st.stream.seq)
        for st in streams
    ]
    return [seen, state, rel.total, sorted(rel._timers), rel.retransmits, rel.probes, rel.in_doubt]


@given(
    ops=st.lists(
        st.tuples(st.sampled_from([0, 0, 0, 1, 1, 2]), st.integers(0, 60), st.integers(0, 1)), max_size=60
    )
)
@settings(max_examples=300, deadline=None)
def test_reliable_senders_of_both_cores_keep_the_same_books(ops: list[tuple[int, int, int]]) -> None:
    """clear, sent and the release of acknowledged datagrams, compiled or
    pure: the same answers, buffers, counters and timers, sending within
    credit and over it, acknowledging in part, at once and past what went."""
    assert _reliable_sends("compiled", ops) == _reliable_sends("python", ops)


@given(
    present=st.sets(st.integers(0, 40)),
    start=st.sampled_from([0, 5, 0xFFFFFFF0, 0xFFFFFFFF]),
    count=st.integers(-2, 45),
)
@settings(max_examples=300, deadline=None)
def test_release_acked_frees_the_same_on_both_cores(present: set[int], start: int, count: int) -> None:
    def buf() -> dict[int, list[object]]:
        return {(start + i) & 0xFFFFFFFF: [b"d" * i, 0.0, 1] for i in sorted(present)}

    pure, compiled = buf(), buf()
    assert _speedups.release_acked(compiled, start, count) == release_acked(pure, start, count)
    assert compiled == pure


def _pair() -> tuple[socket.socket, socket.socket]:
    a = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    b = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    a.bind(("127.0.0.1", 0))
    b.bind(("127.0.0.1", 0))
    # A blocking read gives up after 5 s (a lost datagram fails the test, not hangs it).
    b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", 5, 0))
    return a, b


def test_datagram_io_sends_and_reads_many_per_call_with_the_socket_modules_addresses() -> None:
    a, b = _pair()
    with a, b:
        tx = _speedups.DatagramIO(socket.dup(a.fileno()), 4, 65536)
        rx = _speedups.DatagramIO(socket.dup(b.fileno()), 4, 65536)
        try:
            datagrams = [bytes([i]) * (i * 100) for i in range(10)]
            assert tx.send(datagrams, b.getsockname()) == 10
            got: list[tuple[bytes, object]] = []
            while len(got) < 10:
                got += rx.recv(0, True)  # blocks for the first, takes what is there (at most 4)
            assert [d for d, _ in got] == datagrams
            assert {addr for _, addr in got} == {a.getsockname()}
            assert rx.recv() == []  # nothing left: never blocks
        finally:
            tx.close()
            rx.close()
        with pytest.raises(OSError):
            rx.recv()


def test_datagram_io_sends_one_and_says_when_one_waits() -> None:
    a, b = _pair()
    with a, b:
        tx = _speedups.DatagramIO(socket.dup(a.fileno()), 2, 65536)
        rx = _speedups.DatagramIO(socket.dup(b.fileno()), 2, 65536)
        try:
            assert not rx.ready()
            # Small and large ones, to two addresses in turn.
            datagrams = [b"s" * 100, bytes(range(256)) * 40, b"", b"L" * 60000]
            for d in datagrams:
                tx.send1(d, b.getsockname())
                tx.send1(d, a.getsockname())  # the cached address changes every time
            got: list[bytes] = []
            while len(got) < len(datagrams):
                assert rx.ready()
                got += [d for d, _ in rx.recv(0, True)]
            assert got == datagrams
            assert not rx.ready()
            assert [a.recvfrom(65536)[0] for _ in datagrams] == datagrams
            with pytest.raises(ValueError):
                tx.send1(b"x", ("not an address", 1))
            tx.send1(b"again", b.getsockname())  # a refused name is not cached
            assert rx.recv(0, True) == [(b"again", a.getsockname())]
        finally:
            tx.close()
            rx.close()
        with pytest.raises(OSError):
            tx.send1(b"x", b.getsockname())


def test_datagram_io_keeps_the_socket_open_until_closed_and_reports_shutdown() -> None:
    a, b = _pair()
    with a:
        rx = _speedups.DatagramIO(socket.dup(b.fileno()), 2, 2048)
        where = b.getsockname()
        b.close()  # the duplicate keeps the socket (and its port) open
        a.sendto(b"still here", where)
        assert rx.recv(0, True) == [(b"still here", a.getsockname())]
        rx.close()


def test_datagram_io_reads_one_as_recvfrom_does() -> None:
    a, b = _pair()
    c, _d = _pair()
    with a, b, c, _d:
        rx = _speedups.DatagramIO(socket.dup(b.fileno()), 2, 2048)
        try:
            with pytest.raises(BlockingIOError):
                rx.recv1()  # nothing there: never blocks
            for d in (b"one", b"", b"x" * 2000, b"y" * 3000):
                a.sendto(d, b.getsockname())
            c.sendto(b"other", b.getsockname())
            a.sendto(b"again", b.getsockname())
            got = [rx.recv1(True) for _ in range(6)]
            # As recvfrom(2048) would: a longer datagram is cut to the size.
            assert got == [(b"one", a.getsockname()), (b"", a.getsockname()), (b"x" * 2000, a.getsockname()),
                           (b"y" * 2048, a.getsockname()), (b"other", c.getsockname()),
                           (b"again", a.getsockname())]  # fmt: skip
            # One source, one address object (dict lookups match by identity),
            # a new one when the source changes.
            assert got[0][1] is got[3][1] and got[4][1] is not got[3][1] and got[5][1] == got[0][1]
            # The bytes are the datagram's own: the next read does not overwrite them.
            a.sendto(b"z" * 5, b.getsockname())
            assert rx.recv1(True) == (b"z" * 5, a.getsockname()) and got[0][0] == b"one"
            # A wait ends at SO_RCVTIMEO.
            b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("@ll", 0, 20_000))
            with pytest.raises(BlockingIOError):
                rx.recv1(True)
            with contextlib.suppress(OSError):
                b.shutdown(socket.SHUT_RD)  # ENOTCONN, but shut down all the same (as Queue.close does)
            assert rx.recv1(True) == (b"", None)
        finally:
            rx.close()
        with pytest.raises(OSError):
            rx.recv1()


def test_datagram_io_reads_one_within_a_bound() -> None:
    a, b = _pair()
    with a, b:
        rx = _speedups.DatagramIO(socket.dup(b.fileno()), 2, 2048)
        try:
            # Nothing comes: BlockingIOError once the bound is over (no bound: at once).
            with pytest.raises(BlockingIOError):
                rx.recv1_within(0.0)
            assert rx.bounded_waits == 0
            with pytest.raises(BlockingIOError):
                rx.recv1_within(0.002)
            assert rx.bounded_waits == 1
            # What is there, or comes within the bound, is read as recv1 reads it.
            a.sendto(b"here", b.getsockname())
            assert rx.recv1_within(0.0) == (b"here", a.getsockname())
            a.sendto(b"x" * 3000, b.getsockname())
            assert rx.recv1_within(5.0) == (b"x" * 2048, a.getsockname())
            sender = threading.Timer(0.01, a.sendto, (b"later", b.getsockname()))
            sender.start()
            try:
                assert rx.recv1_within(10.0) == (b"later", a.getsockname())
            finally:
                sender.join()
            assert rx.bounded_waits == 3
        finally:
            rx.close()
        with pytest.raises(OSError):
            rx.recv1_within(0.01)


def test_datagram_io_refuses_a_name_that_is_not_an_address() -> None:
    a, _b = _pair()
    with a, _b:
        tx = _speedups.DatagramIO(socket.dup(a.fileno()))
        with pytest.raises(ValueError, match="not a numeric address"):
            tx.send([b"x"], ("localhost", 9))
        tx.close()


def _receive_all(rx: object, n: int) -> list[bytes]:
    got: list[bytes] = []
    while len(got) < n:
        got += [d for d, _ in rx.recv(0, True)]  # type: ignore[attr-defined]
    return got


@given(
    sizes=st.lists(st.sampled_from([0, 1, 100, 1400, 1400, 1400, 1472, 9000]), min_size=1, max_size=150).filter(
        lambda sizes: sum(sizes) <= 100_000  # within the kernel's default receive buffer
    )
)
@settings(max_examples=40, deadline=None)
def test_segmented_sends_arrive_as_the_datagrams_sent(sizes: list[int]) -> None:
    # GSO on the sending side, GRO (coalesced reads, cut again) on the
    # receiving one: whatever the kernel does, each datagram arrives whole.
    a, b = _pair()
    with a, b:
        tx = _speedups.DatagramIO(socket.dup(a.fileno()), 8, 65536)
        rx = _speedups.DatagramIO(socket.dup(b.fileno()), 8, 65536, True, True)
        try:
            datagrams = [bytes([i % 256]) * n for i, n in enumerate(sizes)]
            assert tx.send(datagrams, b.getsockname()) == len(datagrams)
            assert _receive_all(rx, len(datagrams)) == datagrams
        finally:
            tx.close()
            rx.close()


def test_segmented_sends_reach_a_plain_socket_one_datagram_per_read() -> None:
    a, b = _pair()
    with a, b:
        tx = _speedups.DatagramIO(socket.dup(a.fileno()), 8, 65536)
        datagrams = [bytes([i]) * 1400 for i in range(20)] + [b"tail"]
        assert tx.send(datagrams, b.getsockname()) == 21
        assert tx.gso and tx.segmented >= 1  # this kernel segments (Linux 4.18 and later)
        assert [b.recvfrom(65536)[0] for _ in datagrams] == datagrams
        tx.close()


def test_coalesced_reads_are_cut_and_counted() -> None:
    a, b = _pair()
    with a, b:
        tx = _speedups.DatagramIO(socket.dup(a.fileno()), 8, 65536)
        rx = _speedups.DatagramIO(socket.dup(b.fileno()), 8, 65536, True, True)
        datagrams = [bytes([i]) * 1000 for i in range(30)]
        tx.send(datagrams, b.getsockname())
        assert _receive_all(rx, 30) == datagrams
        assert rx.gro and rx.coalesced >= 1  # loopback coalesces a segmented send (Linux 5.0 and later)
        tx.close()
        rx.close()


def test_queues_with_small_datagrams_deliver_everything_in_order_on_both_cores() -> None:
    # Small datagrams make runs the compiled core sends segmented (GSO); the
    # receiver reads them through every read path of the threaded driver.
    for core in ("compiled", "python"):
        with (
            _impl.using(core),
            cmq.Queue(port=0, host="127.0.0.1", max_datagram=1200) as rx,
            cmq.Queue(port=0, host="127.0.0.1", max_datagram=1200) as tx,
        ):
            msgs = [b"%06d" % i + bytes(200) for i in range(3000)]
            send = tx.sender(rx.address)
            for m in msgs:
                send(m)
            assert tx.drain(10)
            got = [rx.get(timeout=5) for _ in msgs]
            assert got == msgs, core


def test_the_compiled_cores_receiving_streams_have_every_field_and_method_of_recvstream() -> None:
    twin = recv_stream_type(_speedups)
    assert twin is not RecvStream and recv_stream_type(_speedups) is twin and recv_stream_type(None) is RecvStream
    made = [cls(("127.0.0.1", 4000), 3, 2, 77, True, 1.5) for cls in (RecvStream, twin)]
    for f in RecvStream.__slots__:
        assert getattr(made[0], f) == getattr(made[1], f), f
    made[1].largest = 5  # seq 0 to 5 missing: the methods work on the C fields
    made[0].largest = 5
    assert made[1].gaps() == made[0].gaps() == ((0, 6),)
    assert made[1].status(2.0) == made[0].status(2.0)


def test_the_compiled_cores_sending_streams_have_every_field_and_method_of_sendstream() -> None:
    twin = send_stream_type(_speedups)
    assert twin is not SendStream and send_stream_type(_speedups) is twin and send_stream_type(None) is SendStream
    made = [cls(Stream(("127.0.0.1", 4000), 2, 512), 77, True) for cls in (SendStream, twin)]
    for f in SendStream.__slots__:
        assert f == "stream" or getattr(made[0], f) == getattr(made[1], f), f
    assert made[1].ext() == made[0].ext() and made[1].unacked == made[0].unacked == 0
    assert made[1].waiting == made[0].waiting == 0
    with pytest.raises(TypeError):
        _speedups.reliable_clear(made[0], 1)  # the compiled bookkeeping takes the compiled twin only


def _idle_pushes(core: str, ops: list[tuple[int, int, int]]) -> list[object]:
    """What a batcher of ``core`` answers to pushes through ``advance`` (the
    idle rule's short path included): ``(0, size, k)`` pushes a message of
    ``size`` bytes to stream ``k`` (0: best-effort, 1 and 2: reliable),
    ``(1, _, _)`` says the application got a datagram it waited for
    (``waited_at``), ``(2, n, k)`` acknowledges stream ``k``'s buffer (for
    ``n`` 2 mod 4 all but one datagram) or, for odd ``n``, leaves ``n``
    datagrams waiting for credit, ``(3, _, k)`` takes
    stream ``k``'s batch. The clock steps 0 to 117 us a push (around the
    idle and busy gaps) or up to 26 ms (past the batch timeout)."""
    with _impl.using(core):
        b = Batcher(QueueConfig(qthresh=600, timeout=0.003, max_datagram=2000), sender=9)
        rel = ReliableSender(9, codec_msgpack=False, key=None, max_probes=3)
    epochs = iter(range(100, 1 << 20))
    rel._new_epoch = lambda: next(epochs)  # type: ignore[method-assign]
    streams = [b.stream(("127.0.0.1", 4000 + k), 2, reliable=k > 0) for k in range(3)]
    for s in streams[1:]:
        rel.attach(s, ordered=True)
    seen: list[object] = []
    now = 0.0
    clock = lambda: now  # noqa: E731 - advance reads the clock through a callable
    for op, arg, k in ops:
        s = streams[k]
        if op == 0:
            now += (arg % 40) * 3e-6 if arg % 3 else arg * 1e-4  # around the idle and busy gaps, or the timeout
            r = b.append(s, bytes([arg % 251]) * arg)
            seen.append(("push", r, b.advance(s, clock) if r == CHECK else None))
        elif op == 1:
            b.waited_at = now
        elif op == 2 and s.rel is not None:
            st = s.rel
            if arg % 2:
                s.seq = (s.seq + arg) & 0xFFFFFFFF  # encoded, not sent: waiting for credit
            else:
                st.buf.clear()
                if arg % 4:
                    st.buf[s.seq] = [b"d", now, 1]  # one sent, not acknowledged: the busy gap
                st.sent_upto = s.seq
        elif op == 3:
            seen.append(("take", b.take(s, now)))
        seen.append((s.limit, s.check_at, s.gen, s.armed, s.counted, s.size, s.last_send, s.seq, len(s.frames)))
    return [seen, b.messages_sent, b.datagrams_sent, b.bytes_sent]


@given(
    ops=st.lists(
        st.tuples(st.sampled_from([0, 0, 0, 1, 2, 3]), st.one_of(st.integers(0, 40), st.integers(250, 260)), st.integers(0, 2)),
        max_size=60,
    )
)
@example(ops=[(0, 10, 1), (2, 2, 1), (0, 10, 1), (0, 20, 1), (0, 22, 1), (3, 0, 1), (0, 1, 0), (1, 0, 0), (0, 1, 0)])
@example(ops=[(0, 10, 1), (2, 3, 1), (0, 10, 1), (2, 0, 1), (0, 250, 1), (0, 255, 1), (0, 90, 2), (0, 260, 2)])
@settings(max_examples=300, deadline=None)
def test_the_idle_rule_takes_the_same_datagrams_on_both_cores(ops: list[tuple[int, int, int]]) -> None:
    assert _idle_pushes("compiled", ops) == _idle_pushes("python", ops)


def test_the_compiled_idle_rule_hands_a_message_that_is_not_bytes_to_the_pure_one() -> None:
    with _impl.using("compiled"):
        b = Batcher(QueueConfig(codec="raw"), sender=9)
    s = b.stream(("127.0.0.1", 4000), 0)
    b.append(s, bytearray(b"abc"))
    [datagram] = b.advance(s, lambda: 1.0)  # type: ignore[misc]
    assert datagram.endswith(b"\x03abc") and not s.frames and b.datagrams_sent == 1


# -- the blocking read's polling policy ------------------------------------------


class _PolicyQueue:
    """What a DirectReader takes from its queue, for the policy alone: the
    message counts it reads (for the compiled reader, in the C state that
    a compiled batcher and receiver keep them in), and a socket whose polls
    a script answers."""

    def __init__(self) -> None:
        compiled = isinstance(self, _speedups.EndpointState)
        self._heap: list[object] = []
        self._rx_lock = self._state_lock = None
        self._mailboxes: dict[int, object] = {}
        self._batcher: Any = _speedups.BatcherState() if compiled else type("Counts", (), {"messages_sent": 0})()
        self._receiver: Any = (
            _speedups.ReceiverState() if compiled else type("Counts", (), {"messages_received": 0})()
        )
        self._sock = type("Sock", (), {"fileno": lambda self: 7})()


_CompiledPolicyQueue = type("_CompiledPolicyQueue", (_speedups.EndpointState, _PolicyQueue), {})

_POLICY = ("spin", "spin_rest", "crowded", "crowded_rest", "ahead", "lockstep", "trial", "sent_seen", "got_seen")

# A look: new messages sent and received since the last one, then a poll of
# the budget (with the read's bound or none) that the script answers.
policy_steps = st.lists(
    st.tuples(
        st.integers(0, 3),
        st.integers(0, 3),
        st.sampled_from([-1, 0, 1]),
        st.one_of(st.none(), st.sampled_from([0.0, 5e-6, 30e-6, 1.0])),
        st.booleans(),
    ),
    max_size=400,
)


@given(policy_steps)
@settings(max_examples=150, deadline=None)
def test_the_reads_polling_policy_is_the_same_on_both_cores(steps: list[tuple[int, int, int, float | None, bool]]) -> None:
    from cmq.net import _reader

    readers = []
    for make in (_reader.DirectReader, _speedups.DirectReader):
        # The compiled reader's queue keeps its hot fields in C, as a compiled Queue does.
        q = _CompiledPolicyQueue() if make is _speedups.DirectReader else _PolicyQueue()
        asked: list[float] = []

        def poll(fd: int, seconds: float, asked: list[float] = asked) -> int:
            asked.append(seconds)
            return answer[0]

        readers.append((q, make(q, 80e-6, poll), asked))
    answer = [0]
    for went, came, polled, wait, trial in steps:
        answer[0] = polled
        seen = []
        for q, r, asked in readers:
            q._batcher.messages_sent += went
            q._receiver.messages_received += came
            looks = r.awaits_one_answer()
            found = r.trial_poll(wait) if trial else r.poll_first(wait)
            seen.append((looks, found, asked[-2:], [getattr(r, name) for name in _POLICY]))
        assert seen[0] == seen[1]


_values = st.one_of(st.none(), st.integers(), st.binary(max_size=20), st.text(max_size=10), st.lists(st.integers(), max_size=3))


@given(
    payload=_values,
    addr=st.tuples(st.text(max_size=15), st.integers(0, 65535)),
    sender=st.integers(0, 2**64 - 1),
    mailbox=st.integers(0, 65535),
    seq=st.integers(0, 2**32),
    correlation=st.one_of(st.none(), st.integers(0, 2**63)),
)
@settings(max_examples=200, deadline=None)
def test_a_delivered_message_is_the_same_on_both_cores(
    payload: object, addr: tuple[str, int], sender: int, mailbox: int, seq: int, correlation: int | None
) -> None:
    from cmq.net._base import message_of

    item = (payload, (addr, sender, mailbox, seq, correlation))
    compiled = _speedups.MessageOf(cmq.Message)(item)
    pure = message_of(item)
    assert type(compiled) is cmq.Message
    assert compiled == pure
    assert compiled.payload is payload and compiled.sender is addr and compiled.correlation is correlation
    assert gc.is_tracked(compiled) == gc.is_tracked(pure)


def test_a_compiled_message_holds_its_references_and_lets_them_go() -> None:
    make = _speedups.MessageOf(cmq.Message)
    payload, addr = object(), ("127.0.0.1", 9)
    before = sys.getrefcount(payload), sys.getrefcount(addr)
    messages = [make((payload, (addr, 1, 2, 3, None))) for _ in range(100)]
    assert sys.getrefcount(payload) == before[0] + 100
    with pytest.raises(dataclasses.FrozenInstanceError):
        messages[0].payload = 1  # type: ignore[misc]
    del messages
    assert (sys.getrefcount(payload), sys.getrefcount(addr)) == before


def test_the_compiled_message_maker_refuses_what_it_cannot_fill() -> None:
    with pytest.raises(TypeError, match="no slot 'payload'"):
        _speedups.MessageOf(int)
    make = _speedups.MessageOf(cmq.Message)
    with pytest.raises(ValueError, match="five fields"):
        make((b"x", (("h", 1), 1, 2)))
    with pytest.raises(TypeError):
        make([b"x", (("h", 1), 1, 2, 3, None)])


def test_a_queue_of_each_core_gives_messages_through_every_getter() -> None:
    for name in ("python", "compiled"):
        with _impl.using(name):
            a, b = cmq.Queue(0, "127.0.0.1"), cmq.Queue(0, "127.0.0.1")
        try:
            for i in range(4):
                a.push(b.address, b"m%d" % i)
            a.flush()
            got = [b.get_message(timeout=5)]
            deadline = time.monotonic() + 5
            while len(got) < 4 and time.monotonic() < deadline:
                one = b.pop_message()
                got += ([one] if one is not None else []) + b.pop_many_messages(limit=1)
            assert [m.payload for m in got] == [b"m0", b"m1", b"m2", b"m3"]
            assert all(type(m) is cmq.Message and m.sender == a.address and m.mailbox == 0 for m in got)
        finally:
            a.close()
            b.close()


# -- the hot state in C ------------------------------------------------------------


def test_the_compiled_cores_objects_keep_their_hot_fields_in_c_and_stay_what_they_were() -> None:
    with _impl.using("compiled"):
        q = cmq.Queue(0, "127.0.0.1")
        b, r = Batcher(QueueConfig(), 7), Receiver(QueueConfig(), 7)
    with _impl.using("python"):
        pure_q = cmq.Queue(0, "127.0.0.1")
        pure_b, pure_r = Batcher(QueueConfig(), 7), Receiver(QueueConfig(), 7)
    try:
        assert isinstance(q, cmq.Queue) and isinstance(q, _speedups.EndpointState)
        assert isinstance(b, Batcher) and isinstance(b, _speedups.BatcherState)
        assert isinstance(r, Receiver) and isinstance(r, _speedups.ReceiverState)
        assert isinstance(q._rel, ReliableSender) and isinstance(q._rel, _speedups.SenderState)
        assert q._rel.total == pure_q._rel.total == 0
        assert type(q).__name__ == "Queue" and type(q)._kind == "Queue"
        assert type(pure_q) is cmq.Queue and type(pure_b) is Batcher and type(pure_r) is Receiver
        # One twin per class, and the same values in the fields whichever core made the object.
        with _impl.using("compiled"):
            assert type(Receiver(QueueConfig(), 8)) is type(r)
        for name in ("waited_at", "messages_sent", "datagrams_sent", "bytes_sent"):
            assert getattr(b, name) == getattr(pure_b, name), name
        for name in ("_unchecked", "_free", "_max_queued", "messages_received", "status_urgent", "new_due",
                     "mailboxes", "dropped", "_rstreams", "_owed"):  # fmt: skip
            assert getattr(r, name) == getattr(pure_r, name), name
        for name in ("_closed", "_big_reads", "_io_delivered", "_app_read_at", "_rel_at", "_rcvtimeo"):
            assert getattr(q, name) == getattr(pure_q, name), name
        b.messages_sent += 3  # Python code reads and writes them as before
        assert b.messages_sent == 3 and type(b.messages_sent) is int
        with pytest.raises(TypeError):
            r.mailboxes = []  # type: ignore[assignment]
    finally:
        q.close()
        pure_q.close()
    assert q.closed


@pytest.mark.parametrize("delivery", ["reliable", "best-effort"])
def test_counts_kept_in_c_are_the_ones_stats_reports_on_both_cores(delivery: str) -> None:
    # Each delivery mode's blocking read takes its own compiled receive path.
    for name in ("compiled", "python"):
        with _impl.using(name):
            a, b = cmq.Queue(0, "127.0.0.1", delivery=delivery), cmq.Queue(0, "127.0.0.1", delivery=delivery)
        try:
            for _ in range(20):
                a.push(b.address, b"x" * 100)
                assert b.get(timeout=5) == b"x" * 100
                b.push(a.address, b"y")
                assert a.get(timeout=5) == b"y"
            sa, sb = a.stats(), b.stats()
            assert (sa.messages_sent, sa.messages_received) == (20, 20), name
            assert (sb.messages_sent, sb.messages_received) == (20, 20), name
            assert sb.bytes_received >= 20 * 100 and sa.bytes_sent >= 20 * 100, name
            assert type(sa.messages_sent) is int and type(sb.datagrams_received) is int, name
        finally:
            a.close()
            b.close()


class _SlottedQueue(cmq.Queue):
    """A subclass with ``__slots__`` of its own: its objects cannot be twins."""

    __slots__ = ("note",)


def test_a_queue_subclass_with_slots_of_its_own_works_on_both_cores() -> None:
    for name in ("compiled", "python"):
        with _impl.using(name):
            a, b = _SlottedQueue(0, "127.0.0.1"), cmq.Queue(0, "127.0.0.1")
        try:
            assert type(a) is _SlottedQueue  # a plain object: the pure reader, the compiled receiver
            a.note = "mine"
            for i in range(5):
                a.push(b.address, b"%d" % i)
                assert b.get(timeout=5) == b"%d" % i
                b.push(a.address, b"ok")
                assert a.get(timeout=5) == b"ok"
            b.push(a.address, b"m")
            assert a.get_message(timeout=5).payload == b"m"
        finally:
            a.close()
            b.close()


def _receive_one_after_a_drop(core: str) -> list[object]:
    """Stream X's next datagram read by a waiting reader (receive_one), after
    the receiver dropped X's stream (another took its place, one stream at
    most) and made it again from the same datagrams: what each step gave
    and X's stream at the end."""
    with _impl.using(core):
        rx = Receiver(QueueConfig(max_datagram=2000), sender_id=1)
    rx.set_kernel_budget(1 << 20)
    head = frames.stream_head(0, 3, 0, frames.VERSION_2)

    def d(seq: int, syn: bool) -> bytes:
        return frames.frame([b"m%d" % seq], head, seq, frames.extension(77, frames.R_ORDERED | (frames.R_SYN if syn else 0)))

    x, y = ("127.0.0.1", 4000), ("127.0.0.1", 4001)
    seen: list[object] = []
    now = 1.0
    seen.append(rx.datagram_received(d(0, True), x, now))
    seen.append(rx.take_status(now, all_owed=True))  # X's stream is granted credit
    seen.append(rx.receive_one(d(1, False), x, now, 0))  # the fast path: X's stream is remembered
    seen.append(rx.datagram_received(d(0, True), y, now))  # Y's stream takes X's place
    seen.append(rx.datagram_received(d(0, True), x, now))  # X again: a new stream, not granted yet
    seen.append(rx.datagram_received(d(1, True), x, now))
    seen.append(rx.receive_one(d(2, False), x, now, 0))  # the new stream's, through the general path
    rs = rx._rstreams[(x, 3, 0)]
    seen.append([getattr(rs, f) for f in sorted(RecvStream.__slots__) if f not in ("held", "seen")])
    seen.append(rx.mailbox(0).take(100))
    return seen


def test_the_compiled_receive_one_never_takes_a_stream_the_receiver_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    from cmq.wire import receiver as receiver_mod

    monkeypatch.setattr(receiver_mod, "MAX_RELIABLE_STREAMS", 1)
    compiled = _receive_one_after_a_drop("compiled")
    assert compiled == _receive_one_after_a_drop("python")
    assert compiled[6] is None or compiled[6][0] == b"m2"


def test_the_compiled_lock_acts_as_threading_lock() -> None:
    lock = _speedups.Lock()
    assert not lock.locked()
    assert lock.acquire() is True
    assert lock.locked()
    assert lock.acquire(False) is False
    assert lock.acquire(True, 0.01) is False
    assert lock.acquire(timeout=0) is False
    lock.release()
    assert not lock.locked()
    with pytest.raises(RuntimeError, match="release unlocked lock"):
        lock.release()
    with pytest.raises(ValueError, match="non-blocking"):
        lock.acquire(False, 1.0)
    with pytest.raises(ValueError, match="non-negative"):
        lock.acquire(True, -2.0)
    with pytest.raises(OverflowError):
        lock.acquire(True, 1e300)
    with lock:
        assert lock.locked()
    assert not lock.locked()
    # Another thread waits (without the GIL) until the holder releases it.
    order: list[str] = []
    lock.acquire()
    trying = threading.Event()
    t = threading.Thread(target=lambda: (trying.set(), lock.acquire(), order.append("taken"), lock.release()))
    t.start()
    trying.wait(10)
    order.append("released")
    lock.release()
    t.join(10)
    assert order == ["released", "taken"]


def test_a_wait_for_the_compiled_lock_runs_signal_handlers() -> None:
    import signal

    class Interrupted(Exception):
        pass

    def handler(signum: int, frame: object) -> None:
        raise Interrupted

    lock = _speedups.Lock()
    lock.acquire()
    rescue = threading.Timer(10.0, lock.release)  # never a hang, whatever happens
    rescue.start()
    old = signal.signal(signal.SIGALRM, handler)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        with pytest.raises(Interrupted):
            lock.acquire()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        rescue.cancel()
    assert lock.locked()  # still the first holder's


def _pushes(busy_in_c: bool, reliable: bool, sizes: list[int]) -> list[object]:
    """What a compiled queue that is never idle sends for pushes of ``sizes``
    bytes (0: a flush) to a destination that never answers, its slow half
    in C (IdleAfter: the busy half takes every batch that the idle rule
    does not) or in Python (``_after_append``, the pure slow half): each
    push's outcome, the first datagram of each sequence number (sender id
    and epoch blanked: each queue has its own) and the counters."""
    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sink.bind(("127.0.0.1", 0))
    sink.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
    q = cmq.Queue(
        0, "127.0.0.1", delivery="reliable" if reliable else "best-effort", idle_gap=float("inf"), timeout=60.0,
        max_datagram=2000, qthresh=700, on_full="raise", send_buffer=5_000, window=6, max_probes=30, linger=0.0,
    )  # fmt: skip
    outcomes: list[object] = []
    try:
        assert type(q._after) is _speedups.IdleAfter
        if not busy_in_c:
            q._after = q._after_append
            q.push = q._make_push()  # type: ignore[method-assign]
        dest = sink.getsockname()
        for i, n in enumerate(sizes):
            try:
                if n:
                    q.push(dest, bytes([i % 251]) * n)
                else:
                    q.flush()
                outcomes.append("ok")
            except cmq.CmqError as exc:
                outcomes.append(type(exc).__name__)
        b = q._batcher
        counters = (b.messages_sent, b.datagrams_sent, b.bytes_sent, [(s.armed == s.gen, len(s.frames), s.limit) for s in b.streams()])
    finally:
        q.close()
    first: dict[int, bytes] = {}
    sink.setblocking(False)
    with sink:
        while True:
            try:
                d = sink.recv(65536)
            except BlockingIOError:
                break
            if len(d) >= 16 and not d[3] & (frames.FLAG_CONTROL | frames.FLAG_ACK):
                seq = int.from_bytes(d[12:16], "big")
                first.setdefault(seq, d[:4] + bytes(4) + d[8:16] + (bytes(4) + d[20:] if reliable else d[16:]))
    return [outcomes, sorted(first.items()), counters]


@given(
    sizes=st.lists(st.one_of(st.integers(1, 300), st.integers(600, 1990), st.just(0)), max_size=60),
    reliable=st.booleans(),
)
@settings(max_examples=40, deadline=None)
def test_the_busy_half_in_c_sends_what_the_pure_slow_half_sends(sizes: list[int], reliable: bool) -> None:
    """A stream that streams (never idle): batches opened (their deadline
    armed), filled, taken and cut, sent within credit or held for it, a
    send buffer that fills; the same outcomes, datagrams and counters."""
    assert _pushes(True, reliable, sizes) == _pushes(False, reliable, sizes)


def test_compiled_queues_take_their_locks_and_parts_in_c() -> None:
    q = cmq.Queue(0, "127.0.0.1")
    try:
        assert type(q._rx_lock) is _speedups.Lock and type(q._state_lock) is _speedups.Lock
        assert type(q._after) is _speedups.IdleAfter
        assert type(q._receiver._fast_one) is _speedups.ReceiveOne
    finally:
        q.close()


u32 = st.integers(0, 0xFFFFFFFF)
statuses = st.builds(
    frames.Status,
    stream_sender=st.one_of(u32, st.integers(-2, 2**33)),
    mailbox=u32,
    epoch=u32,
    next_expected=st.integers(-(2**33), 2**33),
    credit_limit=u32,
    largest_seen=u32,
    missing=st.lists(st.tuples(st.integers(-5, 2**33), st.integers(-1, 70_000)), max_size=40).map(tuple),
    ack_delay=st.integers(-10, 100_000),
    reset=st.booleans(),
    probe=st.integers(0, 70_000),
)
probes = st.builds(
    frames.Probe, mailbox=u32, epoch=st.one_of(u32, st.just(2**32)), next_seq=st.integers(-5, 2**33),
    rflags=st.integers(0, 300), serial=st.integers(0, 70_000),
)


def _outcome(f: Any, *args: Any) -> object:
    try:
        return ("ok", f(*args))
    except Exception as exc:  # noqa: BLE001 - the twins must fail alike
        return ("error", type(exc).__name__, str(exc))


@given(records=st.lists(st.one_of(statuses, probes), max_size=5), sender=st.one_of(u32, st.just(2**32)))
@settings(max_examples=400, deadline=None)
def test_control_records_encode_the_same_on_both_cores(records: list[object], sender: int) -> None:
    assert _outcome(_speedups.encode_control, records, sender) == _outcome(frames.encode_control, records, sender)


@given(records=st.lists(st.one_of(statuses, probes), max_size=5), cut=st.integers(0, 400), noise=st.binary(max_size=40))
@settings(max_examples=400, deadline=None)
@example(records=[], cut=0, noise=b"\x01" + bytes(28))
def test_control_records_decode_the_same_on_both_cores(records: list[object], cut: int, noise: bytes) -> None:
    try:
        data = frames.encode_control(records, 9)
    except Exception:  # noqa: BLE001 - out-of-range fields: decode noise alone
        data = frames.encode_control([], 9)
    for d in (data, data[: max(16, len(data) - cut % 40)], data + noise, data[:16] + noise):
        got = _outcome(_speedups.decode_control, d, 16, len(d))
        assert got == _outcome(frames.decode_control, d, 16, len(d))


def _control_outcome(core: str, datagrams: list[bytes], general: bool) -> list[object]:
    """What a receiver of ``core`` makes of control datagrams, through
    ``datagram_received`` or (``general``) the general path alone."""
    with _impl.using(core):
        rx = Receiver(QueueConfig(max_datagram=2000), sender_id=1)
    seen: list[object] = []
    now = 1.0
    for d in datagrams:
        now += 0.001
        if general:
            rx.datagrams_received += 1
            rx.bytes_received += len(d)
            seen.append(rx._general(d, ("127.0.0.1", 4000), now))
        else:
            seen.append(rx.datagram_received(d, ("127.0.0.1", 4000), now))
        seen.append(list(rx.controls))
        rx.controls.clear()
        seen.append(rx.take_status(now, all_owed=True))
    streams = sorted(
        (k, [getattr(rs, f) for f in sorted(RecvStream.__slots__) if f not in ("held", "seen")])
        for k, rs in rx._rstreams.items()
    )
    return [seen, streams, dict(rx.dropped), rx.datagrams_received, rx.bytes_received, rx.status_sent]


@given(
    batches=st.lists(st.lists(st.one_of(statuses, probes), max_size=3), min_size=1, max_size=6),
    flips=st.lists(st.tuples(st.integers(0, 200), st.integers(0, 255)), max_size=3),
)
@settings(max_examples=200, deadline=None)
def test_a_control_datagram_takes_its_fast_path_as_the_general_path_would(
    batches: list[list[object]], flips: list[tuple[int, int]]
) -> None:
    """STATUS and PROBE datagrams, valid and damaged (a byte changed: the
    flags, the version, a record's type or length), through the receiver's
    control fast path and through the general path, on both cores."""
    datagrams = []
    for recs in batches:
        try:
            d = bytearray(frames.encode_control(recs, 77))
        except Exception:  # noqa: BLE001 - out-of-range fields
            continue
        for at, value in flips:
            if d:
                d[at % len(d)] = value
        datagrams.append(bytes(d))
    datagrams.append(frames.encode_control([], 77)[:10])  # shorter than a header
    expected = _control_outcome("python", datagrams, general=True)
    for core in ("python", "compiled"):
        assert _control_outcome(core, datagrams, general=False) == expected


@given(
    nxt=u32, ahead=st.integers(-3, 40), held=st.lists(st.integers(1, 40), max_size=6), ordered=st.booleans(),
    held_for=st.floats(0, 1e4), answer=st.integers(0, 65_535),
)
@settings(max_examples=300, deadline=None)
def test_a_streams_status_is_the_same_from_the_compiled_twin(
    nxt: int, ahead: int, held: list[int], ordered: bool, held_for: float, answer: int
) -> None:
    rs = recv_stream_type(_speedups)(("127.0.0.1", 9), 77, 3, 1234, ordered, 5.0)
    rs.next = nxt
    rs.largest = (nxt + ahead) & 0xFFFFFFFF
    for off in held:
        if off <= ahead:
            q = (nxt + off) & 0xFFFFFFFF
            if ordered:
                rs.held[q] = (1, None, b"")
            else:
                rs.seen.add(q)
    rs.largest_at = 5.0
    rs.credit = (nxt + 100) & 0xFFFFFFFF
    rs.answer = answer
    assert _speedups.status_of(rs, 5.0 + held_for) == RecvStream.status(rs, 5.0 + held_for)
