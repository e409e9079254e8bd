"""Reliable delivery (wire v2) over real loopback sockets and real processes.

``tests/net`` drives the protocol on a simulated network with a virtual
clock; these tests check what only the real thing shows: a slow consumer
holding back a fast sender through the kernel's buffers, a receiver process
killed with SIGKILL and started again on the same port, a port where nobody
listens, backpressure in both drivers, the receiver's memory bound, and the
tags that keep a forged STATUS from acknowledging anything.

Every message carries its id in its first 8 bytes (:func:`msg`), so what
arrived can be compared with what was pushed, exactly and in order.
"""

from __future__ import annotations

import asyncio
import json
import select
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import cmq
from cmq.wire.frames import Status, encode_control
from cmq.wire.reliable import DeliveryFailure

from .conftest import dest, wait_until

# Every test here runs on the compiled core and on the pure-Python one.
pytestmark = pytest.mark.usefixtures("core")

MakeQueue = Callable[..., cmq.Queue]


def msg(i: int, size: int = 100) -> bytes:
    """Message number ``i``: its id as 8 decimal digits, padded to ``size`` bytes."""
    return b"%08d" % i + bytes(size - 8)


def ident(m: bytes) -> int:
    return int(m[:8])


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Peak:
    """The largest value of ``read()``, sampled every millisecond from a thread."""

    def __init__(self, read: Callable[[], int]) -> None:
        self.max = 0
        self._read = read
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.001):
            try:
                self.max = max(self.max, self._read())
            except RuntimeError:  # a dict resized under the snapshot: sample again
                continue

    def __enter__(self) -> Peak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self.max = max(self.max, self._read())


# -- receiver processes ------------------------------------------------------

#: A receiver in its own process. ``consume`` mode takes every message and
#: appends its id to a file, one write(2) each (so what it got survives a
#: SIGKILL), pausing now and then like a slow application, and hangs after
#: ``stop_after`` messages if that is set; ``hold`` mode
#: never consumes, samples its own ``held_bytes`` and answers each line on
#: stdin with its figures as JSON.
_CHILD = r"""
import json, os, select, signal, sys, time
import cmq

args = json.loads(sys.argv[1])
q = cmq.Queue(args["port"], "127.0.0.1", **args["options"])

def rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0

print(json.dumps({"port": q.port}), flush=True)
if args["mode"] == "consume":
    fd = os.open(args["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    n = 0
    while True:
        m = q.get()
        os.write(fd, m[:8] + b"\n")
        n += 1
        if n == args["stop_after"]:
            while True:
                signal.pause()  # hang, reading nothing more, until killed
else:
    base = rss()
    peak = 0
    while True:
        peak = max(peak, q.stats().held_bytes)
        if select.select([sys.stdin], [], [], 0.002)[0]:
            if not sys.stdin.readline():
                break
            st = q.stats()
            print(json.dumps({
                "peak_held": peak, "held": st.held_bytes, "rss_growth": rss() - base,
                "dropped": dict(st.dropped), "overruns": st.overruns,
                "messages_received": st.messages_received, "kernel_drops": st.kernel_drops,
            }), flush=True)
"""


class Child:
    """A receiver process (see :data:`_CHILD`)."""

    def __init__(self, mode: str, *, port: int = 0, log: Path | None = None, stop_after: int = 0,
                 **options: Any) -> None:
        args = {"mode": mode, "port": port, "log": str(log), "stop_after": stop_after, "options": options}
        self.proc = subprocess.Popen([sys.executable, "-c", _CHILD, json.dumps(args)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.port = int(self._line()["port"])

    def _line(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        ready = select.select([self.proc.stdout], [], [], 20)[0]
        assert ready, "the receiver process said nothing for 20 s"
        line = self.proc.stdout.readline()
        assert line, f"the receiver process exited ({self.proc.poll()})"
        return dict(json.loads(line))

    def report(self) -> dict[str, Any]:
        """``hold`` mode: the receiver's figures now."""
        assert self.proc.stdin is not None
        self.proc.stdin.write("report\n")
        self.proc.stdin.flush()
        return self._line()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                f.close()


@contextmanager
def child(mode: str, **kwargs: Any) -> Iterator[Child]:
    c = Child(mode, **kwargs)
    try:
        yield c
    finally:
        c.kill()


def logged_ids(path: Path) -> list[int]:
    """The ids a ``consume`` receiver wrote, in order (a torn last line is left out)."""
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        return []
    return [int(line) for line in text.split(b"\n") if len(line) == 8]


# -- 1. a slow consumer --------------------------------------------------------

def test_slow_consumer_holds_the_sender_back_and_loses_nothing(make_queue: MakeQueue) -> None:
    """A consumer slower than the sender: flow control, not loss.

    The receiver's application pops 100 messages, then waits until the
    sender has filled a quarter of its budget again before the next batch;
    the sender pushes 30,000 of 512 B as fast as push lets it. Everything arrives once
    and in order, the kernel drops nothing, the sender's buffer never holds
    more than ``send_buffer`` plus a datagram, the receiver never more than
    its budget plus a datagram, and the sender cannot run further ahead of
    the consumer than those two buffers.
    """
    n, size = 30_000, 512
    send_buffer, budget, datagram = 256 * 1024, 1 << 20, 1472
    b = make_queue(max_buffered_bytes=budget)
    a = make_queue(send_buffer=send_buffer, max_datagram=datagram)
    drops_before = b.stats().kernel_drops
    got: list[bytes] = []
    pushed = threading.Event()

    def consume() -> None:
        while len(got) < n:
            batch = b.pop_many(100)
            if not batch:
                try:
                    got.append(b.get(timeout=10))
                except cmq.Timeout:
                    return
                continue
            got.extend(batch)
            # The slow application: it takes its next batch only once the
            # sender has filled a quarter of its budget (or is done), so the
            # sender always runs ahead and is held back by flow control.
            wait_until(lambda: pushed.is_set() or b.stats().held_bytes >= budget // 4, 10)

    consumer = threading.Thread(target=consume)
    with Peak(lambda: a.stats().send_buffered) as sent, Peak(lambda: b.stats().held_bytes) as held:
        consumer.start()
        send = a.sender(dest(b))
        for i in range(n):
            send(msg(i, size))
        consumed_when_pushed = len(got)
        pushed.set()
        assert a.drain(30)
        consumer.join(30)
    assert [ident(m) for m in got] == list(range(n))
    assert got == [msg(i, size) for i in range(n)]
    assert sent.max <= send_buffer + datagram
    # Held back (by the receiver's credit, or its own buffer filling): what ran ahead of the consumer fits in the two buffers (a message takes
    # at least size + 9 bytes in a datagram), plus a batch it was taking.
    assert n - consumed_when_pushed <= (send_buffer + budget + 2 * datagram) // (size + 9) + 100
    assert held.max <= budget + datagram
    drops_after = b.stats().kernel_drops
    if drops_before is not None and drops_after is not None:
        assert drops_after == drops_before
    st = a.stats()
    assert (st.unacked, st.in_doubt, st.dead_streams) == (0, 0, 0)
    assert a.failures() == []


# -- 2. a receiver killed and restarted -----------------------------------------

def _run_kill_and_restart(make_queue: MakeQueue, tmp_path: Path) -> dict[str, Any]:
    """Push 3,000 messages to a receiver process whose application takes 300
    and hangs, SIGKILL it mid-stream, start another on the same port, then
    push 1,000 more; what each incarnation took, and what was reported.

    A message of 1,000 B in datagrams of at most 1,472 B: one message a
    datagram, so the sender's ``unacked`` counts messages. The receiver's
    64 KiB budget keeps most of the 3,000 in the sender's buffer at the
    kill (unacknowledged: the sender's probes find the new incarnation).
    """
    before, after, size = 3000, 1000, 1000
    failures: list[DeliveryFailure] = []
    a = make_queue(on_failure=failures.append, max_datagram=1472)
    log1, log2 = tmp_path / "first.log", tmp_path / "second.log"
    with child("consume", log=log1, stop_after=300, max_buffered_bytes=65536) as c1:
        port = c1.port
        for i in range(before):
            a.push(("127.0.0.1", port), msg(i, size))
        a.flush()
        assert wait_until(lambda: len(logged_ids(log1)) == 300, 20)
        # Its endpoint acknowledged more than its application took.
        assert wait_until(lambda: before - a.stats().unacked > 300, 20)
        unacked_at_kill = a.stats().unacked
    # (leaving the context was the SIGKILL; the child's write(2)s are all in the file)
    got1 = logged_ids(log1)
    with child("consume", port=port, log=log2) as c2:
        assert c2.port == port
        assert wait_until(lambda: bool(failures), 20), "the sender never noticed the restart"
        for i in range(before, before + after):
            a.push(("127.0.0.1", port), msg(i, size))
        drained = a.drain(20)
        wait_until(lambda: len(logged_ids(log2)) >= after, 20)
        got2 = logged_ids(log2)
    return {
        "before": before, "after": after, "unacked_at_kill": unacked_at_kill, "got1": got1,
        "got2": got2, "drained": drained, "failures": failures, "a": a,
    }


def test_restarted_receiver_is_detected_and_the_new_one_gets_each_new_message_once(
    make_queue: MakeQueue, tmp_path: Path
) -> None:
    r = _run_kill_and_restart(make_queue, tmp_path)
    before, after, failures, a = r["before"], r["after"], r["failures"], r["a"]
    assert r["unacked_at_kill"] > 0  # killed mid-stream, with data outstanding
    assert r["got1"] == list(range(300))  # the first incarnation's application: once, in order
    assert failures and failures == a.failures()
    assert {f.reason for f in failures} <= {"peer_reset", "peer_dead"}
    assert a.stats().epoch_resets >= 1
    in_doubt = [ident(m) for f in failures for m in f.messages]
    assert len(in_doubt) == len(set(in_doubt)) == a.stats().in_doubt
    # In doubt: the tail the sender held unacknowledged at the kill, in push
    # order; nothing the first application took, nothing pushed after.
    assert in_doubt and in_doubt == list(range(in_doubt[0], before))
    assert len(in_doubt) <= r["unacked_at_kill"]
    assert not set(in_doubt) & set(r["got1"])
    # The second incarnation gets exactly what was pushed after the restart:
    # each once, in order, and nothing of the first incarnation's stream.
    assert r["drained"]
    assert r["got2"] == list(range(before, before + after))


def test_a_killed_receiver_loses_at_most_what_it_had_acknowledged_and_not_handed_over(
    make_queue: MakeQueue, tmp_path: Path
) -> None:
    """Delivery is to the receiving endpoint: a STATUS acknowledges what
    reached its mailboxes. So every message pushed before the kill was taken
    by the first incarnation's application, named in doubt, or was among
    what it held acknowledged but unread when it died: at most its budget
    (64 KiB here) of messages, never more."""
    r = _run_kill_and_restart(make_queue, tmp_path)
    in_doubt = {ident(m) for f in r["failures"] for m in f.messages}
    lost = set(range(r["before"])) - set(r["got1"]) - in_doubt
    assert len(lost) * 1000 <= 65536 + 1472, f"{len(lost)} messages unaccounted for"  # 1,000 B each
    # and they are the oldest not taken: the ones right after what it took
    if lost:
        assert min(lost) == max(r["got1"]) + 1


# -- 3. a peer that is gone -------------------------------------------------------

@pytest.mark.parametrize("gone", ["never_bound", "closed"])
def test_dead_peer_is_reported_in_doubt_and_close_does_not_hang(make_queue: MakeQueue, gone: str) -> None:
    failures: list[DeliveryFailure] = []
    a = make_queue(max_probes=3, linger=0.2, on_failure=failures.append)
    if gone == "closed":
        b = make_queue()
        port = b.port
        for i in range(100):
            a.push(("127.0.0.1", port), msg(i))
        assert a.drain(10)
        assert [b.get(timeout=5) for _ in range(100)] == [msg(i) for i in range(100)]
        b.close()
    else:
        port = free_port()
    pushed = [msg(i) for i in range(1000, 1010)]
    for m in pushed:
        a.push(("127.0.0.1", port), m)
    a.flush()
    assert wait_until(lambda: bool(failures), 10)
    assert failures == a.failures() == [
        DeliveryFailure(dest=("127.0.0.1", port), mailbox=0, reason="peer_dead", messages=tuple(pushed))
    ]
    st = a.stats()
    assert (st.dead_streams, st.in_doubt, st.unacked, st.send_buffered) == (1, 10, 0, 0)
    assert st.probes >= 3

    # One more, then close: close waits up to linger, then reports it.
    a.push(("127.0.0.1", port), b"last")
    closer = threading.Thread(target=a.close)
    closer.start()
    closer.join(10)
    assert not closer.is_alive(), "close() hung on a dead peer"
    assert a.failures()[-1].messages == (b"last",)
    assert a.failures()[-1].reason in ("closed", "peer_dead")


# -- 4. on_full="raise" -----------------------------------------------------------

def test_on_full_raise_refuses_the_message_and_delivers_all_the_others(make_queue: MakeQueue) -> None:
    """A receiver that does not consume, with a tiny budget: the sender's
    buffer fills and push raises WouldBlock; the refused messages are never
    delivered, every other one is, once, in order, once the receiver reads."""
    b = make_queue(max_buffered_bytes=65536)
    a = make_queue(on_full="raise", send_buffer=32 * 1024, max_datagram=1472)
    send = a.sender(dest(b))
    refused: list[int] = []
    i = 0
    while len(refused) < 20:
        assert i < 100_000, "push never raised WouldBlock"
        try:
            send(msg(i))
        except cmq.WouldBlock:
            refused.append(i)
        i += 1

    got: list[bytes] = []
    stop = threading.Event()

    def consume() -> None:
        while not stop.is_set():
            try:
                got.append(b.get(timeout=0.05))
            except cmq.Timeout:
                continue

    consumer = threading.Thread(target=consume)
    consumer.start()
    try:
        for j in range(i, i + 2000):  # the receiver reads: each push gets in, after waiting for room
            while True:
                try:
                    send(msg(j))
                    break
                except cmq.WouldBlock:
                    assert wait_until(lambda: a.stats().send_buffered < 32 * 1024, 10)
        assert a.drain(10)  # everything queued was acknowledged: it is in b's mailbox, or taken
        expected = [msg(k) for k in range(i + 2000) if k not in set(refused)]
        assert wait_until(lambda: len(got) >= len(expected), 10)
    finally:
        stop.set()
        consumer.join(10)
    assert got == expected
    assert b.pop() is None  # and nothing else came
    assert a.stats().in_doubt == 0


# -- 5. AsyncQueue -------------------------------------------------------------------

def test_async_push_raises_send_waits_and_drain_confirms() -> None:
    async def main() -> None:
        a = await cmq.AsyncQueue.open(0, "127.0.0.1", send_buffer=32 * 1024, max_datagram=1472)
        b = await cmq.AsyncQueue.open(0, "127.0.0.1", max_buffered_bytes=65536)
        d = ("127.0.0.1", b.port)
        refused: list[int] = []
        i = 0
        while not refused:
            assert i < 100_000, "push never raised WouldBlock"
            try:
                a.push(d, msg(i))
            except cmq.WouldBlock:
                refused.append(i)
            i += 1
        # send waits for room: each succeeds while b's budget has room for
        # more, until one waits its whole timeout for room that never comes.
        while True:
            assert i < 100_000, "send never ran out of room"
            try:
                await a.send(d, msg(i), timeout=0.3)
            except cmq.WouldBlock:
                refused.append(i)
                i += 1
                break
            i += 1
        assert not await a.drain(0.1)  # b takes nothing: it cannot all be acknowledged

        total = i + 2000
        expected = [msg(k) for k in range(total) if k not in set(refused)]

        async def consume() -> list[bytes]:
            got = []
            while len(got) < len(expected):
                got.append(await b.get(timeout=10))
            return got

        consumer = asyncio.create_task(consume())
        for k in range(i, total):
            await a.send(d, msg(k), timeout=10)  # waits for room, then succeeds
        assert await a.drain(10)
        assert a.stats().unacked == 0
        assert await consumer == expected
        assert b.pop() is None
        await a.aclose()
        await b.aclose()
        assert a.failures() == []

    asyncio.run(asyncio.wait_for(main(), 30))


# -- 6. unread mailboxes and the receiver's memory ------------------------------------

_BUDGET = 8 << 20
_BIG = 60_000


def _flood_unread_mailboxes(make_queue: MakeQueue, delivery: str, mailboxes: int) -> dict[str, Any]:
    """Push 3,000 messages of 60 KB, round robin over ``mailboxes`` that
    nobody reads, to a receiver process with an 8 MiB budget; its figures."""
    with child("hold", max_buffered_bytes=_BUDGET) as c:
        a = make_queue(delivery=delivery, on_full="raise", send_buffer=1 << 20, linger=0.1)
        refused = accepted = 0
        # Reliable: past 3,000 attempts, on until more was accepted than the
        # receiver can ever hold (on a busy machine it may not have taken
        # its fill while the attempts were refused for want of
        # acknowledgements), each refusal waiting a little for them.
        beyond = _BUDGET // _BIG + 8
        i = 0
        while i < 3000 or (delivery != "best-effort" and accepted < beyond and i < 30_000):
            try:
                a.push(("127.0.0.1", c.port), msg(i, _BIG), mailbox=1 + i % mailboxes)
                accepted += 1
            except cmq.WouldBlock:
                refused += 1
                if i >= 3000:
                    a.drain(0.01)
            i += 1
        a.flush()
        if delivery == "best-effort":

            def accounted() -> bool:
                r = c.report()
                return r["messages_received"] + sum(r["dropped"].values()) + (r["kernel_drops"] or 0) >= 3000

            wait_until(accounted, 5)
        else:
            assert accepted >= beyond
            assert not a.drain(0.5)  # nobody reads: it cannot all be acknowledged
        report = c.report()
        report["refused"] = refused
        return report


@pytest.mark.parametrize(
    ("delivery", "mailboxes"),
    [
        pytest.param("reliable", 3),
        pytest.param("reliable", 300),
        pytest.param("best-effort", 3),
        pytest.param("best-effort", 300),
    ],
)
def test_unread_mailboxes_stay_within_the_receivers_budget(
    make_queue: MakeQueue, delivery: str, mailboxes: int
) -> None:
    r = _flood_unread_mailboxes(make_queue, delivery, mailboxes)
    datagram = _BIG + 64
    assert r["peak_held"] <= _BUDGET + datagram
    assert r["rss_growth"] <= _BUDGET * 3 // 2  # of 180 MB pushed
    if delivery == "best-effort":
        assert r["dropped"]["buffer_full"] + r["dropped"]["queue_full"] > 0
    else:
        if mailboxes == 3:
            # A stream's send buffer (1 MiB) fills: the sender was held back.
            # With 300 each stream holds 10 messages, under its buffer: the
            # sender keeps them (a send buffer is per stream).
            assert r["refused"] > 0
        assert r["dropped"]["buffer_full"] == r["dropped"]["queue_full"] == 0


# -- 7. keyed endpoints ----------------------------------------------------------------

def test_keyed_stream_delivers_and_a_forged_status_acknowledges_nothing(make_queue: MakeQueue) -> None:
    key = b"k" * 16
    a, b = make_queue(key=key), make_queue(key=key)
    for i in range(2000):
        a.push(dest(b), msg(i))
    assert a.drain(10)
    assert [b.get(timeout=5) for _ in range(2000)] == [msg(i) for i in range(2000)]
    assert b.stats().dropped["bad_tag"] == 0
    b.close()  # b sends nothing after this; what it sent before, a may not have read yet

    # A destination that never acknowledges: a plain socket. What it
    # receives tells a forger everything but the key (sender id, epoch).
    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sink.bind(("127.0.0.1", 0))
        sink.settimeout(5)
        for i in range(5):
            a.push(sink.getsockname(), msg(i))
        a.flush()
        data, _ = sink.recvfrom(65536)
        sender, epoch = int.from_bytes(data[4:8], "big"), int.from_bytes(data[16:20], "big")
        assert sender == a.sender_id
        # A barrier: once a has counted this untagged datagram, it has
        # handled everything b sent it before closing (one socket queue,
        # in order), such as a STATUS raising the credit after b's gets.
        sink.sendto(encode_control([], 12345, key=None), ("127.0.0.1", a.port))
        assert wait_until(lambda: a.stats().dropped["bad_tag"] == 1)
        st = a.stats()
        assert st.unacked > 0

        forged = Status(stream_sender=sender, mailbox=0, epoch=epoch, next_expected=st.unacked,
                        credit_limit=1000, largest_seen=st.unacked - 1)
        sink.sendto(encode_control([forged], 12345, key=None), ("127.0.0.1", a.port))
        assert wait_until(lambda: a.stats().dropped["bad_tag"] == 2)
        after = a.stats()
        assert after.unacked == st.unacked
        assert after.status_received == st.status_received

        # The same record with the right tag would have acknowledged it all:
        # the tag, not the record, is what made the difference.
        sink.sendto(encode_control([forged], 12345, key=key), ("127.0.0.1", a.port))
        assert wait_until(lambda: a.stats().unacked == 0)
        assert a.stats().dropped["bad_tag"] == 2
    finally:
        sink.close()


def test_no_status_is_written_while_another_thread_delivers_a_datagram(make_queue: MakeQueue) -> None:
    """A STATUS written while a reader is halfway through a datagram could
    see the datagram's successor and not the datagram, and name it missing
    (its sender then resends what arrived). The timer side's report waits
    for the delivery to finish."""
    q = make_queue()
    r = q._receiver
    inside, release = threading.Event(), threading.Event()
    written_inside: list[str] = []

    def held(real: Callable[..., Any]) -> Callable[..., Any]:
        def deliver(*args: Any) -> Any:
            inside.set()
            try:
                release.wait(10)
                return real(*args)
            finally:
                inside.clear()

        return deliver

    real_take = r.take_status

    def take_status(now: float, **kwargs: Any) -> Any:
        if inside.is_set():
            written_inside.append(threading.current_thread().name)
        return real_take(now, **kwargs)

    r.receive_one = held(r.receive_one)  # type: ignore[method-assign]
    r.datagram_received = held(r.datagram_received)  # type: ignore[method-assign]
    # A drain on the compiled core hands a reliable datagram to the fast
    # path in C, not through datagram_received: without it, every one goes there.
    r._fast_v2 = None
    r.take_status = take_status  # type: ignore[method-assign]
    with make_queue() as sender:
        sender.push(dest(q), msg(1))
        sender.flush()
        reader = threading.Thread(target=q.get, kwargs={"timeout": 10})
        reader.start()
        assert inside.wait(10)
        r.status_urgent = True  # a STATUS is owed now
        timer = threading.Thread(target=q._fire_reliable, args=(0.0,), name="timer")
        timer.start()
        timer.join(0.3)  # without the lock, it writes the STATUS here
        release.set()
        reader.join(10)
        timer.join(10)
    assert written_inside == []


def test_a_paced_stream_is_acknowledged_before_its_probe_timeout(make_queue: MakeQueue) -> None:
    """A sender pushing its next message once the last is acknowledged, to a
    receiver blocked in ``get()``: the receiver's STATUS, owed 2 ms after
    each message, goes in time, so the sender's probe timeout (about 3 ms)
    rarely fires. (A blocking read whose wait the STATUS bounds must not use
    SO_RCVTIMEO, which the kernel rounds up to a 4 ms tick: then nearly every
    message drew a PROBE.)"""
    rx, tx = make_queue(), make_queue()
    n = 30
    got: list[bytes] = []

    def read() -> None:
        for _ in range(n):
            got.append(rx.get())

    t = threading.Thread(target=read)
    t.start()
    try:
        for i in range(n):
            tx.push(dest(rx), msg(i))
            tx.flush()
            assert wait_until(lambda: tx.unacknowledged() == 0)
    finally:
        t.join(10)
    assert got == [msg(i) for i in range(n)]
    assert tx.stats().probes < n // 3


def test_a_request_loop_leaves_the_acknowledgements_to_its_reads() -> None:
    """A reliable request/response of 4 KB messages: acknowledgements come
    every few milliseconds, so a stream has 64 KB unacknowledged
    (``_ack_poll_at``) after a few dozen round trips, the point where a
    streaming pusher reads them itself. A loop that reads its answers reads
    them anyway: its pushes leave the socket to its gets (they took the
    slow half of a push, and read the socket, four pushes in five)."""
    with cmq.Queue(0, "127.0.0.1") as a, cmq.Queue(0, "127.0.0.1") as b:
        body = b"x" * 4096
        for _ in range(50):  # past the point: 200 KB sent before the first STATUS is due
            a.push(b.address, body)
            b.push(a.address, b.get(timeout=10))
            assert a.get(timeout=10) == body
        polls = []
        real = a._poll_acks

        def counted() -> None:
            before = a._app_read_at  # a read of the acknowledgements moves it
            real()
            polls.append(a._app_read_at != before)

        a._poll_acks = counted  # type: ignore[method-assign]
        rounds = 400
        for _ in range(rounds):
            a.push(b.address, body)
            b.push(a.address, b.get(timeout=10))
            assert a.get(timeout=10) == body
        # A push right after a get reads nothing (none, here); on a loaded
        # machine a gap of more than _ACK_POLL_GAP between the two lets a few
        # through. Before, one push in every _ACK_POLL_GAP read: at 20-60 µs
        # a round trip, 80-200 of these 400.
        assert sum(polls) < rounds // 20
        if a._mmsg is not None:
            # The compiled core's pushes took the fast half: they did not
            # even call the read that would have returned at once.
            assert len(polls) < rounds // 20
        assert a.stats().unacked < rounds  # the gets did read the acknowledgements
