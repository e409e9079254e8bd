"""The latency path of a blocking read, and the polling policy before it.

:class:`DirectReader` is the pure-Python reference; the compiled core has a
twin of the same name (``cmq._speedups.DirectReader``) that does the same in
C, and the tests run the policy's tests against both. A :class:`cmq.Queue`
makes one of them and reads through it (``Queue.get`` and
``Queue.get_message`` when their mailbox is empty).

Polling (``QueueConfig.spin``): before a blocking read that most likely
waits for the answer to a message of the queue's own, the socket is polled
for a short budget, so that an answer that comes soon is read without a
thread wake-up. The constants below are the policy's; the compiled twin
reads them from here when it is made.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:  # pragma: no cover - typing only
    from collections.abc import Callable

    from cmq.wire.receiver import Meta

__all__ = ["DirectReader"]

#: Waits shorter than this use select, not SO_RCVTIMEO (which rounds up to a timer tick).
SHORT_WAIT: Final = 0.02
#: Above this size a datagram is read straight into its own bytes object.
BIG_DATAGRAM: Final = 8192
#: Most datagrams one blocking read takes on its latency path.
DIRECT_READS: Final = 8
#: The least wait a reliability timer imposes on a blocking read (it fires
#: up to a kernel tick late anyway).
TIMER_SLACK: Final = 0.001
#: A polling budget that halved below this share of QueueConfig.spin is off ...
SPIN_FLOOR: Final = 1 / 8
#: ... for this many blocking reads, after which polling is tried again whole.
SPIN_REST: Final = 32
#: Polls in a row that gave the CPU to another process before polling is off ...
CROWDED_OFF: Final = 3
#: ... for this many reads (few: the scheduler soon moves one of the two),
#: twice as many each time it is found crowded again without a poll in
#: between that was not, up to ``CROWDED_REST_MAX``: two processes pinned
#: to one CPU stay crowded, and each crowded poll costs the round trip a
#: switch to the peer and back.
CROWDED_REST: Final = 4
CROWDED_REST_MAX: Final = 256
#: Messages of this queue's own a read may wait on, unanswered, and still
#: poll: one, a request and its answer (ping-pong). With more the peer has a
#: backlog of them to work through, which hides a wake-up, and a poll would
#: only take CPU from that peer (see DirectReader.awaits_one_answer).
AHEAD_POLL: Final = 1
#: The count of unanswered messages stops here, so that it comes down soon
#: after a window of requests; but a queue that left more than one message
#: unanswered (one-way pushes) polls again only once it got more back than
#: it sent since, or a trial poll tells (``LOCKSTEP``), as the counts cannot
#: tell answers from other messages.
AHEAD_CAP: Final = AHEAD_POLL + 1
#: Looks in a row at the cap that each saw one message go and one come (a
#: window of requests kept full, or one request at a time with a one-way
#: message once counted on top: the counts cannot tell) before a read
#: polls once to tell (see DirectReader.awaits_one_answer).
LOCKSTEP: Final = 64

_monotonic = time.monotonic
_FOREVER: Final = float("inf")


class DirectReader:
    """A queue's blocking read when nothing it waits for is queued: see :meth:`read`.

    ``queue`` is the :class:`cmq.Queue` it reads for (typed loosely: this
    module sits below the queue's, and reads the queue's private state as
    the queue's own methods did). ``poll(fd, seconds)`` polls the socket
    (``spin_readable``: 1 readable, 0 nothing within the time, -1 the CPU
    was found crowded); ``spin_max`` is the polling budget (0: never
    poll). The policy's state is public: the queue resets ``ahead`` when a
    read times out, and tests script it.
    """

    def __init__(self, queue: Any, spin_max: float, poll: Callable[[int, float], int]) -> None:
        self.queue = queue
        self.poll = poll
        self.spin_max = spin_max
        self.spin = spin_max  # the budget now: halved by each poll that found nothing
        self.spin_rest = 0  # blocking reads left before polling again
        self.crowded = 0  # polls in a row that found another process on this CPU
        self.crowded_rest = CROWDED_REST  # reads without polling after the next crowded run
        self.ahead = 0  # own messages not yet answered, as the counts tell (capped)
        self.lockstep = 0  # looks in a row at the cap in lockstep (see awaits_one_answer)
        self.trial = False  # whether the read being begun polls to test the count
        self.sent_seen = self.got_seen = 0  # the counts when ahead was last brought up to date

    def read(
        self, timeout: float | None, mailbox: int
    ) -> tuple[tuple[Any, Meta] | None, float | None]:
        """The latency path of a blocking read: ``(item or None, the timeout left)``.

        When nothing is batched, ``mailbox`` holds nothing and no other
        thread reads, reads datagrams here; a datagram of one message for
        ``mailbox`` comes straight back, anything else is queued as usual.
        A datagram that leaves ``mailbox`` empty (a STATUS, a message for
        another mailbox) and a reliability timer that cut the wait short
        are followed by another read here, up to ``DIRECT_READS`` in all:
        the general path's read does not poll first, and in a reliable
        request/response the STATUS that comes a few times a round trip in
        a hundred would cost a process wake-up each. The reliability timers
        due are fired as a read starts (while the caller waits anyway), not
        as it returns a message.
        """
        q = self.queue
        if q._heap or not q._rx_lock.acquire(False):
            return None, timeout
        # The application reads: the I/O thread leaves the socket to it.
        start = now = q._app_read_at = _monotonic()
        deadline = None if timeout is None else start + timeout
        # Poll until a poll finds nothing (then this read has waited a
        # while: polling again would only shrink the budget, which is
        # for spacing between messages, not for each datagram of a read).
        awaits = poll = bool(self.spin_max) and self.awaits_one_answer()
        try:
            for _ in range(DIRECT_READS):
                mb = q._mailboxes.get(mailbox)  # again: another reader may have filled it
                if q._closed or q._heap or (mb is not None and mb.chunks and mb.available()):
                    break
                if now >= q._rel_at:
                    q._fire_reliable(now)
                left = None if deadline is None else deadline - now
                if left is not None and left <= 0.0:
                    break
                # A reliability timer due first bounds the wait: this thread
                # fires it (the I/O thread stays off while the application
                # reads). A short wait is select's (SO_RCVTIMEO rounds up
                # to a timer tick, 4 ms here: a STATUS owed in 2 ms would go
                # so late that its sender's probe timeout fires first, and
                # a repair a tick late shows in the tail under loss), but
                # for a read that awaits its answer on a CPU it shares with
                # another process (its polls found it crowded: a rest above
                # the first, and no uncrowded poll since): there a
                # wake-up from select made the one-CPU round trip about 1.5x
                # as long as one from the read itself, and the answer most
                # likely comes before the timer. Nor when the poll found a
                # datagram: the read takes it at once.
                wait = q._rel_bound(left, now, TIMER_SLACK)
                found = False
                if poll:
                    if self.trial:
                        self.trial = False
                        found = poll = self.trial_poll(wait)
                    else:
                        found = poll = self.poll_first(wait)
                try:
                    if q._big_reads or (
                        not found
                        and wait is not None
                        and wait < SHORT_WAIT
                        and not (awaits and self.crowded_rest > CROWDED_REST)
                    ):
                        data, addr = q._recv_within(wait)
                    else:
                        # _recv_within's common case, inline: a blocking read
                        # into the reused buffer.
                        if wait is None:
                            if q._rcvtimeo:
                                q._set_rcvtimeo(None)
                        elif not q._rcv_lo <= wait <= q._rcv_hi:
                            q._set_rcvtimeo(wait)
                        data, addr = q._recv_small(True)
                        if len(data) >= BIG_DATAGRAM:
                            q._big_reads = True
                except OSError:
                    addr = None  # timed out, closed, or an ICMP error
                if addr is not None:
                    now = q._app_read_at = q._batcher.waited_at = _monotonic()
                    with q._state_lock:
                        item = q._receiver.receive_one(data, addr, now, mailbox)
                    if item is not None:
                        # The timers that fell due wait for this thread's
                        # next read: a STATUS sent now would reach the peer
                        # before the request the caller is about to send in
                        # answer, and delay it.
                        q._after_read(now, fire=False)
                        return item, timeout
                    q._after_read(now)
                    continue
                now = _monotonic()
                if now < q._rel_at:
                    break  # timed out, closed, or an ICMP error: the general path decides
                # A timer cut the wait: the next turn fires it and reads on.
        finally:
            q._rx_lock.release()
        if timeout is not None:
            timeout = max(timeout - (_monotonic() - start), 0.0)
        return None, timeout

    def awaits_one_answer(self) -> bool:
        """Whether a blocking read now most likely waits for the answer to
        the one message of this queue's own that is unanswered: then polling
        saves a wake-up (ping-pong, request and reply).

        A reader with none unanswered (it only receives: a stream's
        consumer) or several (ping-ping, a window of requests) waits on a
        peer that is busy producing or working through a backlog; a
        wake-up's delay is hidden behind that work, and a poll would keep
        this CPU busy beside the peer's. On these VMs a busy vCPU slowed
        the other one by up to 1.8x (scripts/vcpu_contention.py), so a poll
        beside a busy peer can slow the very work it waits for.

        Counts messages, not answers: the messages received since the last
        look cancel as many sent before them, then those sent since are
        added, capped at ``AHEAD_CAP``. Received messages left over (more
        than were unanswered) cancel those sent since too, all but the last:
        a read that came back without looking (its message was queued
        already) leaves a request and its answer, then the next request, to
        the next look, which must count one, not two. A read that times out
        sets the count to none (see ``Queue._wait_item``): what was
        unanswered is lost or late, and the count would otherwise stay up
        for good.

        At the cap, a queue whose looks each see one message go and one come
        may keep a window of requests full, or send one request at a time
        and have once sent a message that is not answered (a notice, an
        acknowledgement), which the counts take for a second request for
        good: its reads would never poll again. So after ``LOCKSTEP`` such
        looks in a row, one read polls as a trial (``trial``): a datagram
        that was not queued when the read began and comes within the budget
        tells that one message was awaited, and the count comes down to
        one. An answer queued already, or none within the budget (a peer
        working through a window), leaves it.
        """
        self.trial = False
        q = self.queue
        sent, got = q._batcher.messages_sent, q._receiver.messages_received
        ahead, came, went = self.ahead, got - self.got_seen, sent - self.sent_seen
        # max(ahead - came, 0) + went - min(max(came - ahead, 0), max(went - 1, 0)),
        # without the builtins' calls (this runs at every blocking read).
        if came <= ahead:
            ahead += went - came
        elif went:
            surplus = came - ahead
            ahead = went - surplus if surplus < went else 1
        else:
            ahead = 0
        if ahead > AHEAD_CAP:
            ahead = AHEAD_CAP
        self.ahead = ahead
        self.sent_seen, self.got_seen = sent, got
        if ahead == AHEAD_CAP and came == went == 1:
            self.lockstep += 1
            if self.lockstep >= LOCKSTEP:
                self.lockstep = 0
                self.trial = True
                return True
        else:
            self.lockstep = 0
        return ahead == AHEAD_POLL

    def trial_poll(self, wait: float | None) -> bool:
        """The trial of a read whose count stands at the cap (see
        :meth:`awaits_one_answer`): whether a datagram is there to read.

        Nothing queued yet, and a datagram within the whole budget (bounded
        by ``wait``; a resting budget too, which only trials would count
        down at the cap): one message was awaited, not a window of them, so
        the count comes down to one and the budget is whole again."""
        fd = self.queue._sock.fileno()
        if self.poll(fd, 0.0) > 0:
            return True  # queued already: it tells nothing
        spin = self.spin_max if wait is None else min(self.spin_max, wait)
        if spin <= 0.0 or self.poll(fd, spin) <= 0:
            return False
        self.ahead = AHEAD_POLL
        self.spin, self.spin_rest = self.spin_max, 0
        return True

    def poll_first(self, wait: float | None) -> bool:
        """Before a blocking read of at most ``wait`` seconds (None: no
        bound), poll the socket for the budget (QueueConfig.spin), so that an
        answer that comes soon is read without a thread wake-up.

        A poll that finds a datagram restores the budget; one that finds
        nothing halves it, and below an eighth it is off for ``SPIN_REST``
        reads, then tried whole again: a reader whose messages come seldom
        polls on a few reads in thirty-odd. A poll that finds another
        process running on this CPU between its polls (most likely the peer
        it waits for) stops; after ``CROWDED_OFF`` such polls in a row,
        polling is off for ``CROWDED_REST`` reads, doubling up to
        ``CROWDED_REST_MAX`` while the polls after each rest are crowded
        too: a sleeping reader gives that process the CPU sooner, and lets
        the scheduler move one of the two to another CPU. Returns whether it
        found a datagram."""
        spin = self.spin
        if not spin:
            self.spin_rest -= 1
            if self.spin_rest > 0:
                return False
            spin = self.spin = self.spin_max
        cut = False
        if wait is not None and wait < spin:
            spin, cut = wait, True
        if spin <= 0.0:
            return False
        got = self.poll(self.queue._sock.fileno(), spin)
        if got < 0:
            # Another process ran on this CPU while this one yielded: once
            # in a while that is a kernel thread or a timer; every time, the
            # peer on the same CPU.
            self.crowded += 1
            if self.crowded >= CROWDED_OFF:
                self.spin, self.spin_rest, self.crowded = 0.0, self.crowded_rest, 0
                self.crowded_rest = min(self.crowded_rest * 2, CROWDED_REST_MAX)
            return False
        self.crowded, self.crowded_rest = 0, CROWDED_REST
        if got > 0:
            self.spin = self.spin_max
            return True
        if cut:
            return False  # ended by the read's bound (a timer due), not for want of a datagram
        if self.spin * 0.5 < self.spin_max * SPIN_FLOOR:
            self.spin, self.spin_rest = 0.0, SPIN_REST
        else:
            self.spin *= 0.5
        return False
