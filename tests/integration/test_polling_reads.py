"""Polling before a blocking read (``QueueConfig.spin``): the poll itself on
both cores, and the budget's policy, driven by a scripted poll."""

from __future__ import annotations

import contextlib
import os
import select
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator

import pytest

import cmq
from cmq import _impl
from cmq.net import _reader as reader_mod
from cmq.net import _sock
from cmq.net import queue as queue_mod
from tests.conftest import CORES

Spin = Callable[[int, float], int]


def _spins() -> list[tuple[str, Spin]]:
    found: list[tuple[str, Spin]] = [("python", _sock.spin_readable)]
    if "compiled" in CORES:
        from cmq import _speedups  # type: ignore[attr-defined]

        found.append(("compiled", _speedups.spin_readable))
    return found


@pytest.fixture(params=_spins(), ids=lambda p: p[0])
def spin(request: pytest.FixtureRequest) -> Spin:
    fn: Spin = request.param[1]
    return fn


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx.connect(rx.getsockname())
    yield rx, tx
    rx.close()
    tx.close()


def test_a_waiting_datagram_is_found_at_once(spin: Spin, pair: tuple[socket.socket, socket.socket]) -> None:
    rx, tx = pair
    tx.send(b"x")
    # Loopback delivers before send returns: readable on the first poll.
    assert spin(rx.fileno(), 10.0) == 1
    assert rx.recv(16) == b"x"


def test_a_datagram_sent_during_the_poll_ends_it(spin: Spin, pair: tuple[socket.socket, socket.socket]) -> None:
    rx, tx = pair
    results: list[int] = []

    def poll() -> None:
        # The budget is far longer than the test: only the datagram ends the
        # poll (or a process sharing this CPU: then poll again).
        while (got := spin(rx.fileno(), 30.0)) == -1:
            pass
        results.append(got)

    t = threading.Thread(target=poll)
    t.start()
    tx.send(b"y")
    t.join(30)
    assert results == [1]
    assert rx.recv(16) == b"y"


def test_nothing_to_read_never_reads_as_readable(spin: Spin, pair: tuple[socket.socket, socket.socket]) -> None:
    rx, _tx = pair
    assert spin(rx.fileno(), 0.0) in (0, -1)
    assert spin(rx.fileno(), 0.002) in (0, -1)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs sched_setaffinity (Linux)")
def test_a_process_running_on_the_same_cpu_stops_the_poll(
    spin: Spin, pair: tuple[socket.socket, socket.socket]
) -> None:
    rx, _tx = pair
    cpu = min(os.sched_getaffinity(0))
    busy = subprocess.Popen(
        [sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{cpu}}}); print(flush=True)\nwhile True: pass"],
        stdout=subprocess.PIPE,
    )
    mine = os.sched_getaffinity(0)
    try:
        assert busy.stdout is not None
        busy.stdout.readline()  # pinned and spinning
        os.sched_setaffinity(0, {cpu})
        # A yield hands the CPU to the busy process, which keeps it for a
        # scheduler slice: the poll says so rather than running out its time.
        assert spin(rx.fileno(), 2.0) == -1
    finally:
        os.sched_setaffinity(0, mine)
        busy.kill()
        busy.wait()


class _ScriptedPolls:
    """Stands in for the poll: answers from a script, records the budgets asked."""

    def __init__(self, answers: list[int]) -> None:
        self.answers = answers
        self.asked: list[float] = []

    def __call__(self, fd: int, seconds: float) -> int:
        self.asked.append(seconds)
        return self.answers.pop(0)


@pytest.fixture
def polled(core: str) -> Iterator[cmq.Queue]:
    q = cmq.Queue(0, "127.0.0.1", spin=80e-6)
    q._reader.spin_max = 80e-6  # whatever the machine's CPU count
    q._reader.spin = q._reader.spin_max
    yield q
    q.close()


def _reads(q: cmq.Queue, answers: list[int], n: int, wait: float | None = None) -> list[float]:
    script = _ScriptedPolls(answers)
    q._reader.poll = script
    for _ in range(n):
        q._reader.poll_first(wait)
    return script.asked


def test_empty_polls_halve_the_budget_then_rest_then_try_it_whole(polled: cmq.Queue) -> None:
    us = 1e-6
    asked = _reads(polled, [0, 0, 0, 0, 1], 4 + reader_mod.SPIN_REST)
    assert asked == pytest.approx([80 * us, 40 * us, 20 * us, 10 * us, 80 * us])


def test_a_found_datagram_restores_the_whole_budget(polled: cmq.Queue) -> None:
    asked = _reads(polled, [0, 0, 1, 1], 4)
    assert asked == pytest.approx([80e-6, 40e-6, 20e-6, 80e-6])


def test_the_poll_never_outlasts_the_read_it_precedes(polled: cmq.Queue) -> None:
    assert _reads(polled, [1], 1, wait=5e-6) == pytest.approx([5e-6])
    assert _reads(polled, [], 1, wait=0.0) == []


def test_a_cpu_shared_with_another_process_turns_polling_off_for_a_few_reads(polled: cmq.Queue) -> None:
    off = reader_mod.CROWDED_OFF
    # Now and then crowded (a timer, a kernel thread): the budget stays.
    asked = _reads(polled, [-1, 1, -1, 1], 4)
    assert asked == pytest.approx([80e-6] * 4)
    # Crowded every time: off for _CROWDED_REST reads, then whole again.
    asked = _reads(polled, [-1] * off + [1], off + reader_mod.CROWDED_REST)
    assert asked == pytest.approx([80e-6] * (off + 1))


def test_a_cpu_that_stays_shared_keeps_polling_off_longer_each_time(polled: cmq.Queue) -> None:
    """Two processes pinned to one CPU: every poll after a rest is crowded
    again, so each rest is twice the one before, up to a ceiling; one poll
    that is not crowded brings the short rest back."""
    off, rest = reader_mod.CROWDED_OFF, reader_mod.CROWDED_REST
    for turn in range(12):
        # off crowded polls, then the reads of the rest but its last, which polls
        # again (the next turn's first).
        skipped = min(rest << turn, reader_mod.CROWDED_REST_MAX) - 1
        assert len(_reads(polled, [-1] * off, off + skipped)) == off
    assert polled._reader.crowded_rest == reader_mod.CROWDED_REST_MAX
    # Not crowded once (the scheduler moved one of the two): back to the short rest.
    assert _reads(polled, [1], 1) == pytest.approx([80e-6])
    assert polled._reader.crowded_rest == rest


@pytest.mark.usefixtures("core")
def test_a_queue_with_polling_off_never_polls() -> None:
    with cmq.Queue(0, "127.0.0.1", spin=0) as q:
        assert _reads(q, [], 3) == []


@contextlib.contextmanager
def _echoing(b: cmq.Queue) -> Iterator[None]:
    """A thread pushing every message ``b`` gets back to its sender, while the block runs."""
    stop = threading.Event()

    def echo() -> None:
        while not stop.is_set():
            try:
                m = b.get_message(timeout=0.2)
            except cmq.Timeout:
                continue
            b.push(m.sender, m.payload)

    t = threading.Thread(target=echo)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join(5)


@pytest.mark.usefixtures("core")
@pytest.mark.parametrize("spin_s", [0.0, 100e-6])
def test_request_and_reply_arrive_with_polling_on_or_off(spin_s: float) -> None:
    with cmq.Queue(0, "127.0.0.1", spin=spin_s) as a, cmq.Queue(0, "127.0.0.1", spin=spin_s) as b, _echoing(b):
        for i in range(200):
            a.push(b.address, b"%d" % i)
            assert a.get(timeout=10) == b"%d" % i


def _bounded_waits_in_round_trips(monkeypatch: pytest.MonkeyPatch, polls: Spin) -> tuple[int, int]:
    """A reliable request/response over real sockets, the client's polls
    answered by ``polls``: (the client's reads that a STATUS due bounded,
    the waits its thread made bounded to the nanosecond: select calls in
    the pure core, ``DatagramIO.recv1_within``'s ppoll in the compiled
    one), over 200 round trips."""
    me = threading.get_ident()
    selects: list[int] = []
    real = queue_mod.select.select

    def counted(*args: object) -> object:
        if threading.get_ident() == me:
            selects.append(1)
        return real(*args)  # type: ignore[arg-type]

    with cmq.Queue(0, "127.0.0.1") as a, cmq.Queue(0, "127.0.0.1", spin=0) as b, _echoing(b):
        a._reader.spin_max = a._reader.spin = 100e-6  # whatever the machine's CPU count
        a._reader.poll = polls
        for i in range(20):  # the streams open (their first datagrams take the general path)
            a.push(b.address, b"%d" % i)
            assert a.get(timeout=10) == b"%d" % i
        ppolls_before = a._mmsg.bounded_waits if a._mmsg is not None else 0
        monkeypatch.setattr(queue_mod.select, "select", counted)
        timed = 0
        for i in range(200):
            timed += a._rel_at != float("inf")
            a.push(b.address, b"%d" % i)
            assert a.get(timeout=10) == b"%d" % i
        monkeypatch.undo()
        ppolls = (a._mmsg.bounded_waits if a._mmsg is not None else 0) - ppolls_before
    return timed, len(selects) + ppolls


@pytest.mark.usefixtures("core")
def test_a_read_awaiting_its_answer_on_a_shared_cpu_sleeps_in_the_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reliable request/response owes a STATUS a few ms after each answer,
    which bounds most reads' waits. On a CPU it shares with another process
    (every poll crowded), a read that awaits its answer still sleeps in the
    socket read, as the answer comes first: a wake-up from select made such
    a round trip about 1.5x as long."""
    timed, bounded = _bounded_waits_in_round_trips(monkeypatch, lambda fd, seconds: -1)
    assert timed > 100  # most reads had a STATUS due: a short, timer-bounded wait
    assert bounded == 0


@pytest.mark.usefixtures("core")
def test_a_read_on_a_cpu_of_its_own_keeps_its_timers_on_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Polls that are not crowded (and find nothing): a timer-bounded wait
    is select's (ppoll's in the compiled core), which wakes on time (the
    socket's timeout would be up to a kernel tick late, and a repair that
    late shows in the tail under loss)."""
    timed, bounded = _bounded_waits_in_round_trips(monkeypatch, lambda fd, seconds: 0)
    assert timed > 100
    assert bounded > 100


def test_each_core_reads_through_its_own_reader_and_poll() -> None:
    for name in CORES:
        with _impl.using(name), cmq.Queue(0, "127.0.0.1") as q:
            if name == "python":
                assert type(q._reader) is reader_mod.DirectReader
                assert q._reader.poll is _sock.spin_readable
            else:
                assert type(q._reader) is _impl.speedups.DirectReader  # type: ignore[union-attr]
                assert q._reader.poll is _impl.speedups.spin_readable  # type: ignore[union-attr]
                # The non-blocking read too: pop_many and the poll before it.
                assert q._poll == q._reader.poll_once  # type: ignore[union-attr]
                assert q.pop_many == q._reader.pop_many  # type: ignore[union-attr]


@pytest.mark.usefixtures("core")
@pytest.mark.parametrize("delivery", ["best-effort", "reliable"])
def test_a_datagram_for_another_mailbox_keeps_the_read_on_its_latency_path(
    delivery: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A blocking read that first meets a datagram it does not return (for
    another mailbox here; a STATUS in a reliable request/response) reads
    again with its poll, rather than through the general path, whose read
    sleeps at once. (Were the I/O thread to take both datagrams first, the
    read would find its message queued: never a false failure.)"""
    with cmq.Queue(0, "127.0.0.1", delivery=delivery) as rx, cmq.Queue(0, "127.0.0.1", delivery=delivery) as tx:
        general: list[int] = []
        real = rx._wait_item

        def counted(*args: object, **kwargs: object) -> object:
            general.append(1)
            return real(*args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(rx, "_wait_item", counted)
        # A stream's first datagram takes the general path (it opens the
        # stream): open mailbox 0's first.
        tx.push(rx.address, b"first")
        tx.flush()
        assert rx.get(timeout=10) == b"first"
        with pytest.raises(cmq.Timeout):
            # The application reads (the I/O thread stays off the socket),
            # long enough for a reliable stream's first STATUS to go.
            rx.get(timeout=0.005)
        general.clear()
        tx.push(rx.address, b"other", 5)
        tx.flush()
        tx.push(rx.address, b"mine")
        tx.flush()
        assert rx.get(timeout=10) == b"mine"
        assert general == []
        assert rx.get(timeout=10, mailbox=5) == b"other"


def test_a_poll_cut_short_by_the_reads_bound_leaves_the_budget_whole(polled: cmq.Queue) -> None:
    """A poll that ends because the read's wait does (a timer due sooner than
    the budget) says nothing about how far apart messages come."""
    assert _reads(polled, [0, 0], 2, wait=5e-6) == pytest.approx([5e-6, 5e-6])
    assert polled._reader.spin == polled._reader.spin_max


def test_a_read_that_waits_through_a_timer_polls_once(polled: cmq.Queue) -> None:
    """A blocking read whose wait a reliability timer cuts fires it and reads
    on, without polling again: one empty poll per read halves the budget once,
    so a reader waiting out a lost message does not turn polling off for the
    round trips after it."""
    script = _ScriptedPolls([0, 0, 0, 0])
    polled._reader.poll = script
    polled._reader.ahead = reader_mod.AHEAD_POLL  # it awaits the answer to a request of its own
    polled._rel_at = queue_mod._monotonic() + 0.002
    with pytest.raises(cmq.Timeout):
        polled.get(timeout=0.01)
    assert script.asked == pytest.approx([80e-6])
    assert polled._reader.spin == pytest.approx(40e-6)


# -- which reads poll: those awaiting the answer to one message of their own --


def _counts(q: cmq.Queue, sent: int, got: int) -> bool:
    """Set the queue's message counts, then ask whether the next read polls."""
    q._batcher.messages_sent, q._receiver.messages_received = sent, got
    return q._reader.awaits_one_answer()


def test_a_request_then_its_answer_polls_on_both_sides(polled: cmq.Queue) -> None:
    # The client: a request out, then the read for its answer, every round.
    assert [_counts(polled, n + 1, n) for n in range(5)] == [True] * 5
    with cmq.Queue(0, "127.0.0.1", spin=80e-6) as server:
        # The server: its first read awaits nothing of its own; each later one
        # follows the answer it sent to the request it got.
        assert _counts(server, 0, 0) is False
        assert [_counts(server, n, n) for n in range(1, 6)] == [True] * 5


def test_a_window_of_requests_does_not_poll_until_answered(polled: cmq.Queue) -> None:
    # Ping-ping: eight out, then one answer in and one more out per read.
    assert _counts(polled, 8, 0) is False
    assert [_counts(polled, 8 + n, n) for n in range(1, 6)] == [False] * 5
    # The window drains (the count stops at _AHEAD_CAP, so it reaches none
    # early): no polls; then a request alone again.
    assert [_counts(polled, 13, n) for n in range(6, 14)] == [True] + [False] * 7
    assert _counts(polled, 14, 13) is True


def test_a_request_whose_answer_was_read_unseen_still_counts_as_one(polled: cmq.Queue) -> None:
    # The first read found its answer queued and did not look: the next look
    # sees two requests and one answer, which leaves one awaited, not two.
    assert _counts(polled, 2, 1) is True
    assert [_counts(polled, n + 1, n) for n in range(2, 7)] == [True] * 5


def test_a_read_that_times_out_forgets_what_was_unanswered(polled: cmq.Queue) -> None:
    # A request whose answer was lost (best-effort), and the next request:
    # two unanswered, which would keep the count up for every round after.
    assert _counts(polled, 1, 0) is True
    assert _counts(polled, 2, 0) is False
    with pytest.raises(cmq.Timeout):
        polled.get(timeout=0.001)
    assert [_counts(polled, n + 1, n - 2) for n in range(2, 7)] == [True] * 5


def test_a_reader_that_only_receives_does_not_poll(polled: cmq.Queue) -> None:
    assert [_counts(polled, 0, n) for n in (0, 1, 100, 10_000)] == [False] * 4


def test_one_way_pushes_stop_polling_until_more_came_back(polled: cmq.Queue) -> None:
    assert _counts(polled, 1000, 0) is False
    assert _counts(polled, 1001, 1) is False  # a request and its answer on top: still behind
    assert _counts(polled, 1001, 3) is False  # more back than sent: none unanswered
    assert _counts(polled, 1002, 3) is True  # a request alone again


class _CountedPolls:
    """The real poll, counted."""

    def __init__(self, real: Spin) -> None:
        self.real = real
        self.calls = 0

    def __call__(self, fd: int, seconds: float) -> int:
        self.calls += 1
        return self.real(fd, seconds)


@pytest.mark.usefixtures("core")
def test_a_consumer_never_polls_over_real_sockets() -> None:
    with cmq.Queue(0, "127.0.0.1", spin=100e-6) as a, cmq.Queue(0, "127.0.0.1", spin=100e-6) as b:
        b._reader.spin_max = b._reader.spin = 100e-6  # whatever the machine's CPU count
        polls = _CountedPolls(b._reader.poll)
        b._reader.poll = polls
        for i in range(50):
            a.push(b.address, b"%d" % i)
            assert b.get(timeout=10) == b"%d" % i
        assert polls.calls == 0


# -- a request at a time, with a message that is never answered counted on top --


def _at_the_cap_in_lockstep(q: cmq.Queue) -> None:
    """A request, and a one-way message beside it: the count stands at the
    cap; then a request and its answer per look, up to the look that tries,
    which the next read makes."""
    assert _counts(q, 2, 0) is False
    lockstep = reader_mod.LOCKSTEP
    assert [_counts(q, 2 + n, n) for n in range(1, lockstep)] == [False] * (lockstep - 1)
    q._batcher.messages_sent, q._receiver.messages_received = 2 + lockstep, lockstep


def test_lockstep_at_the_cap_tries_a_poll_every_so_many_looks(polled: cmq.Queue) -> None:
    _at_the_cap_in_lockstep(polled)
    assert polled._reader.awaits_one_answer() is True
    assert polled._reader.trial
    assert polled._reader.ahead == reader_mod.AHEAD_CAP
    # No poll came of it (the answer was read without one): the next trial
    # is as many looks away again.
    lockstep = reader_mod.LOCKSTEP
    base = 2 + lockstep
    assert [_counts(polled, base + n, lockstep + n) for n in range(1, lockstep)] == [False] * (lockstep - 1)
    assert not polled._reader.trial
    assert _counts(polled, base + lockstep, 2 * lockstep) is True
    # A look out of step starts the count again.
    assert _counts(polled, base + lockstep + 2, 2 * lockstep + 1) is False
    assert polled._reader.lockstep == 0


@pytest.fixture
def plain_pair(core: str) -> Iterator[tuple[cmq.Queue, cmq.Queue]]:
    """A best-effort receiver that polls and its sender: each datagram is one
    message, read on the latency path."""
    with cmq.Queue(0, "127.0.0.1", delivery="best-effort", spin=80e-6) as q, \
            cmq.Queue(0, "127.0.0.1", delivery="best-effort") as tx:  # fmt: skip
        q._reader.spin_max = q._reader.spin = 80e-6  # whatever the machine's CPU count
        yield q, tx


def test_a_trial_poll_that_waits_for_its_answer_brings_the_count_down(
    plain_pair: tuple[cmq.Queue, cmq.Queue],
) -> None:
    """Nothing is queued when the read begins and the answer comes within the
    budget: one message was awaited, and the reads after it poll again."""
    q, tx = plain_pair
    _at_the_cap_in_lockstep(q)
    asked: list[float] = []

    def polls(fd: int, seconds: float) -> int:
        asked.append(seconds)
        if seconds == 0.0:
            return 0  # the look at what is queued: nothing
        tx.push(q.address, b"answer")  # it comes while the read polls
        tx.flush()
        return 1

    q._reader.poll = polls
    assert q.get(timeout=10) == b"answer"
    assert asked == pytest.approx([0.0, 80e-6])
    assert q._reader.ahead == reader_mod.AHEAD_POLL
    assert _counts(q, 3 + reader_mod.LOCKSTEP, 1 + reader_mod.LOCKSTEP) is True  # and the next read polls


def test_a_trial_polls_through_a_resting_budget_and_makes_it_whole(
    plain_pair: tuple[cmq.Queue, cmq.Queue],
) -> None:
    """Empty polls had put the budget to rest when the count went up: at the
    cap only trials poll, so a rest counted down by polls would outlast
    thousands of reads. The trial polls the whole budget anyway."""
    q, tx = plain_pair
    _at_the_cap_in_lockstep(q)
    q._reader.spin, q._reader.spin_rest = 0.0, reader_mod.SPIN_REST
    asked: list[float] = []

    def polls(fd: int, seconds: float) -> int:
        asked.append(seconds)
        if seconds:
            tx.push(q.address, b"answer")
            tx.flush()
            return 1
        return 0

    q._reader.poll = polls
    assert q.get(timeout=10) == b"answer"
    assert asked == pytest.approx([0.0, 80e-6])
    assert q._reader.ahead == reader_mod.AHEAD_POLL
    assert (q._reader.spin, q._reader.spin_rest) == (q._reader.spin_max, 0)


def test_an_answer_queued_before_the_trial_leaves_the_count(plain_pair: tuple[cmq.Queue, cmq.Queue]) -> None:
    """A window of requests kept full has its next answer queued already: it
    does not tell that one message was awaited."""
    q, tx = plain_pair
    _at_the_cap_in_lockstep(q)

    def polls(fd: int, seconds: float) -> int:
        assert seconds == 0.0, "no poll for what is queued"
        tx.push(q.address, b"queued")
        tx.flush()
        return 1

    q._reader.poll = polls
    assert q.get(timeout=10) == b"queued"
    assert q._reader.ahead == reader_mod.AHEAD_CAP
    assert not q._reader.trial


def test_no_answer_within_the_budget_of_the_trial_leaves_the_count(plain_pair: tuple[cmq.Queue, cmq.Queue]) -> None:
    """A peer working through a window answers later than the budget: the
    count stays."""
    q, tx = plain_pair
    _at_the_cap_in_lockstep(q)

    def polls(fd: int, seconds: float) -> int:
        if seconds:
            tx.push(q.address, b"late")  # it comes as the poll gives up
            tx.flush()
        return 0

    q._reader.poll = polls
    assert q.get(timeout=10) == b"late"
    assert q._reader.ahead == reader_mod.AHEAD_CAP


@pytest.mark.usefixtures("core")
def test_a_one_way_message_does_not_stop_a_request_loop_polling_for_good() -> None:
    """Over real sockets: a request and its answer at a time, one message
    that is never answered in between; the reads poll again after a trial.
    The polls wait for the answer, as on an idle machine (a loaded one makes
    them give up, and polling stays off there by design)."""
    with cmq.Queue(0, "127.0.0.1") as a, cmq.Queue(0, "127.0.0.1", spin=0) as b, _echoing(b):
        a._reader.spin_max = a._reader.spin = 100e-6  # whatever the machine's CPU count
        for i in range(20):
            a.push(b.address, b"%d" % i)
            assert a.get(timeout=10) == b"%d" % i
        a.push(b.address, b"notice", 7)  # nobody answers mailbox 7
        # Whatever the polls so far left of the budget: here, a rest.
        a._reader.spin, a._reader.spin_rest = 0.0, reader_mod.SPIN_REST
        look = a._reader.poll

        def until_readable(fd: int, seconds: float) -> int:
            if not seconds:
                return look(fd, 0.0)
            return 1 if select.select([fd], [], [], 10.0)[0] else 0

        polls = _CountedPolls(until_readable)
        a._reader.poll = polls
        seen = []
        for i in range(8 * reader_mod.LOCKSTEP):
            a.push(b.address, b"%d" % i)
            assert a.get(timeout=10) == b"%d" % i
            seen.append(a._reader.ahead)
        assert seen[:2] == [reader_mod.AHEAD_CAP] * 2  # the notice counted as unanswered
        assert seen[-1] == reader_mod.AHEAD_POLL
        # Polling for good again: more polls than the trials alone make (one
        # in LOCKSTEP reads, 8 here). Not one a read: on a loaded machine the
        # I/O thread takes some answers first, and a read that finds its
        # answer queued does not poll (seen in CI: 141 polls in 512 reads).
        assert polls.calls > reader_mod.LOCKSTEP
