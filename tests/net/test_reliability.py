"""Reliable and unordered delivery between two endpoints, on the simulated network.

Each test pairs real endpoints (batcher, receiver, reliable sender) on a
:class:`~tests.net.harness.SimNetwork` in virtual time, breaks the link in one
way, and checks what the application gets: every message once (in push
order for "reliable"), or an honest report of what is in doubt.
"""

from __future__ import annotations

import itertools
import pickle
import random
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from cmq import DeliveryFailure, WouldBlock
from cmq.wire.frames import Status, encode_control
from cmq.wire.receiver import QUEUE_TARGET
from cmq.wire.reliable import MAX_ACK_DELAY, START_WINDOW, seq_diff

from .harness import Datagram, SimEndpoint, SimNetwork

# Every test here runs on the compiled core and on the pure-Python one.
pytestmark = pytest.mark.usefixtures("core")

MODES = ["reliable", "unordered"]
#: Small datagrams, so that a few hundred messages make many of them.
SMALL: dict[str, Any] = {"max_datagram": 600}


@pytest.fixture
def net() -> Iterator[SimNetwork]:
    with SimNetwork(seed=1) as n:
        yield n


def messages(n: int, size: int = 100, start: int = 0) -> list[bytes]:
    """``n`` distinct payloads of ``size`` bytes, numbered from ``start``."""
    return [b"%06d" % i + b"." * (size - 6) for i in range(start, start + n)]


def push_all(a: SimEndpoint, b: SimEndpoint, msgs: list[Any], gap: float = 0.0) -> None:
    """``a`` pushes ``msgs`` to ``b``, all at once or one every ``gap`` seconds."""
    for m in msgs:
        a.push(b.addr, m)
        if gap:
            a.net.run_for(gap)


def every(k: int, match: Callable[[Datagram], bool]) -> Callable[[Datagram], bool]:
    """Matches every ``k``-th datagram that ``match`` matches."""
    n = itertools.count(1)
    return lambda d: match(d) and next(n) % k == 0


def carries(payload: bytes) -> Callable[[Datagram], bool]:
    return lambda d: payload in d.payloads


def got_all(b: SimEndpoint, msgs: list[bytes]) -> Callable[[], bool]:
    return lambda: len(b.received) >= len(msgs)


def check_delivered(b: SimEndpoint, msgs: list[bytes], delivery: str) -> None:
    """Everything once; in push order for "reliable"."""
    if delivery == "reliable":
        assert b.received == msgs
    else:
        assert sorted(b.received) == sorted(msgs)
        assert len(set(b.received)) == len(b.received)


def settle(net: SimNetwork, *eps: SimEndpoint) -> None:
    """Run until nothing is left to do; then nothing is unacknowledged and no timer armed."""
    assert net.run(limit=30.0), "the network never went quiet"
    for ep in eps:
        assert ep.unacknowledged() == 0
        assert ep._next_deadline() is None
        assert not ep.failures()


# -- a clean link -----------------------------------------------------------------


@pytest.mark.parametrize("delivery", MODES)
def test_lossless_link_delivers_each_message_once_in_order(net: SimNetwork, delivery: str) -> None:
    a, b = net.add(delivery=delivery, **SMALL), net.add(**SMALL)
    msgs = messages(300)
    push_all(a, b, msgs)
    assert net.run(until=got_all(b, msgs))
    assert b.received == msgs  # no loss, no reordering: in order even if unordered
    settle(net, a, b)
    sa, sb = a.stats(), b.stats()
    assert sa.status_received > 0 and sb.status_sent > 0  # acknowledgements flowed
    assert sa.retransmits == sa.probes == sa.in_doubt == 0
    assert sb.duplicates == sb.overruns == 0
    assert sa.send_buffered == 0


def test_spaced_pushes_are_acknowledged_and_the_link_goes_quiet(net: SimNetwork) -> None:
    a, b = net.add(**SMALL), net.add(**SMALL)
    msgs = messages(50)
    push_all(a, b, msgs, gap=0.01)  # each alone: the destination is idle every time
    settle(net, a, b)
    assert b.received == msgs
    assert a.stats().retransmits == 0


def test_stats_give_the_base_probe_timeout(net: SimNetwork) -> None:
    """``stats().pto`` is RFC 9002's srtt + max(4 rttvar, 1 ms) + max_ack_delay:
    from the initial RTT guess (1 ms, rttvar 0.5 ms) before any sample, from
    the samples after."""
    a, b = net.add(**SMALL), net.add(**SMALL)
    assert a.stats().pto == pytest.approx(0.001 + 4 * 0.0005 + 0.002)
    msgs = messages(100)
    push_all(a, b, msgs)
    settle(net, a, b)
    st = a.stats()
    assert st.srtt + 0.001 + 0.002 <= st.pto < 0.005


def test_a_loss_before_the_first_rtt_sample_is_repaired_within_a_few_ms(net: SimNetwork) -> None:
    """A fresh endpoint's first message, lost alone (nothing behind it for
    the receiver to notice the gap by), is repaired by the first probe
    timeout, which comes from the initial RTT guess: on this 0.2 ms link it
    is back within 6 ms of virtual time, not after an Internet-sized first
    guess (a 10 ms guess made it 32 ms)."""
    a, b = net.add(**SMALL), net.add(**SMALL)
    (msg,) = messages(1)
    net.drop(carries(msg), count=1)
    pushed = net.now
    a.push(b.addr, msg)
    assert net.run(until=got_all(b, [msg]))
    assert b.received == [msg]
    assert a.stats().probes >= 1 and a.stats().retransmits == 1
    assert net.now - pushed < 0.006
    settle(net, a, b)


def test_a_far_peer_is_not_declared_dead_while_its_first_answer_is_on_its_way() -> None:
    """The small first guess only brings the first probes forward: a peer
    100 ms away answers them and everything arrives once, with no failure,
    and the RTT learned is the link's."""
    with SimNetwork(seed=1, delay=0.05) as net:
        a, b = net.add(**SMALL), net.add(**SMALL)
        msgs = messages(40)
        push_all(a, b, msgs, gap=1e-3)
        assert net.run(until=got_all(b, msgs))
        settle(net, a, b)
        assert b.received == msgs
        assert not a.failures()
        assert a.stats().probes >= 1  # the first came long before the first answer
        assert a.stats().retransmits == 0
        assert 0.09 < a.stats().srtt < 0.12


# -- data loss ----------------------------------------------------------------------


@pytest.mark.parametrize("delivery", MODES)
def test_every_third_data_datagram_lost_is_repaired(net: SimNetwork, delivery: str) -> None:
    a, b = net.add(delivery=delivery, **SMALL), net.add(**SMALL)
    net.drop(every(3, lambda d: d.is_data))
    msgs = messages(300)
    push_all(a, b, msgs)
    assert net.run(until=got_all(b, msgs))
    check_delivered(b, msgs, delivery)
    settle(net, a, b)
    assert a.stats().retransmits > 0


@pytest.mark.parametrize("delivery", MODES)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_data_loss_is_repaired(delivery: str, seed: int) -> None:
    with SimNetwork(seed=seed) as net:
        a, b = net.add(delivery=delivery, **SMALL), net.add(**SMALL)
        net.link(a, b, loss=0.25, jitter=2e-4)
        msgs = messages(400)
        push_all(a, b, msgs, gap=1e-4)
        assert net.run(until=got_all(b, msgs))
        check_delivered(b, msgs, delivery)
        settle(net, a, b)
        assert b.stats().duplicates >= 0 and a.stats().retransmits > 0


@pytest.mark.parametrize("delivery", MODES)
def test_a_gap_blocks_only_ordered_delivery(net: SimNetwork, delivery: str) -> None:
    """Unordered: the message after a lost one is handed over before the
    repair (no head-of-line blocking). Reliable: it waits for it."""
    a, b = net.add(delivery=delivery, **SMALL), net.add(**SMALL)
    msgs = messages(10)
    lost, after = msgs[5], msgs[6]
    net.drop(carries(lost), count=1)
    push_all(a, b, msgs, gap=1e-3)  # one datagram each
    assert net.run(until=got_all(b, msgs))
    check_delivered(b, msgs, delivery)
    at = dict(zip(b.received, b.received_at, strict=True))
    if delivery == "unordered":
        assert at[after] < at[lost]
        assert b.received.index(after) < b.received.index(lost)
    else:
        assert at[after] == at[lost]  # released together by the repair
    assert a.stats().retransmits == 1


def test_tail_loss_is_repaired_by_the_probe_timeout(net: SimNetwork) -> None:
    a, b = net.add(**SMALL), net.add(**SMALL)
    msgs = messages(20)
    net.drop(carries(msgs[-1]), count=1)
    push_all(a, b, msgs, gap=1e-3)
    last_push = net.now - 1e-3
    assert net.run(until=got_all(b, msgs))
    assert b.received == msgs
    stats = a.stats()
    assert stats.probes >= 1 and stats.retransmits == 1
    # Within a few probe timeouts of virtual time (not a lucky later datagram).
    assert net.now - last_push <= 3 * a._rel.pto()
    settle(net, a, b)


def test_a_loss_reported_while_fresh_is_repaired_by_the_loss_timer() -> None:
    """A datagram reported missing by a report whose evidence went just
    after it (within the reordering window) may still be on its way; it is
    retransmitted once the evidence's round trip and the window (a quarter
    of the least RTT, as RACK) have passed since it went, not at a
    receiver's repeat later."""
    with SimNetwork(seed=1, delay=1e-3) as net:  # RTT 2 ms; pushes 50 us apart
        a, b = net.add(**SMALL), net.add(**SMALL)
        push_all(a, b, messages(20))
        assert net.run(until=lambda: a.unacknowledged() == 0)  # srtt learnt
        srtt = a._rel.srtt
        assert 1.9e-3 < srtt < 2.5e-3
        msgs = messages(20, start=20)
        lost = msgs[5]
        net.drop(carries(lost), count=1)
        sent_at = net.now + 5 * 5e-5
        push_all(a, b, msgs, gap=5e-5)
        assert net.run(until=got_all(b, messages(40)))
        assert b.received == messages(40)
        (arrived,) = [t for t, d in net.trace if d.dst == b.addr and lost in d.payloads]
        # Sent one round trip (2 ms: the datagram after it was the
        # evidence) and the window after the first copy, arriving one delay
        # later; the receiver's repeat (renak_interval, 3 ms) would have
        # taken longer.
        window = a._rel.min_rtt / 4
        assert 4e-4 < window < 6e-4
        assert arrived - sent_at == pytest.approx(2e-3 + window + 1e-3, abs=2e-4)
        assert a.stats().retransmits == 1
        settle(net, a, b)


@pytest.mark.parametrize("seed", range(5))
def test_late_reports_do_not_resend_a_repair_on_its_way(seed: int) -> None:
    """Reports delayed by up to 2 ms (their RTT samples swing as much) still
    list a gap whose repair is on its way: only a report that saw a datagram
    sent after the repair may call it lost, so nothing arrives twice."""
    with SimNetwork(seed=seed) as net:
        a, b = net.add(**SMALL), net.add(**SMALL)
        net.link(b, a, delay=1e-4, jitter=2e-3)
        net.drop(every(10, lambda d: d.is_data))
        msgs = messages(400)
        push_all(a, b, msgs, gap=5e-5)
        assert net.run(until=got_all(b, msgs))
        assert b.received == msgs
        assert a.stats().retransmits >= 19
        assert b.stats().duplicates == 0
        settle(net, a, b)


# -- control loss, duplication, reordering -----------------------------------------


@pytest.mark.parametrize("delivery", MODES)
def test_lost_status_records_cost_nothing_but_time(net: SimNetwork, delivery: str) -> None:
    a, b = net.add(delivery=delivery, **SMALL), net.add(**SMALL)
    net.link(b, a, loss=0.5)  # every control datagram goes this way
    msgs = messages(300)
    push_all(a, b, msgs, gap=5e-5)
    assert net.run(until=got_all(b, msgs))
    check_delivered(b, msgs, delivery)
    settle(net, a, b)


def test_the_first_status_records_lost_in_a_row(net: SimNetwork) -> None:
    a, b = net.add(**SMALL), net.add(**SMALL)
    rule = net.drop(lambda d: d.is_status, count=8)
    msgs = messages(100)
    push_all(a, b, msgs)
    assert net.run(until=got_all(b, msgs))
    assert b.received == msgs
    settle(net, a, b)
    assert rule.dropped == 8
    assert a.stats().probes >= 1  # the sender had to ask


@pytest.mark.parametrize("delivery", MODES)
def test_duplicated_datagrams_are_delivered_once(net: SimNetwork, delivery: str) -> None:
    net.default = net.default.__class__(duplicate=0.5)
    a, b = net.add(delivery=delivery, **SMALL), net.add(**SMALL)
    msgs = messages(300)
    push_all(a, b, msgs, gap=5e-5)
    assert net.run(until=got_all(b, msgs))
    check_delivered(b, msgs, delivery)
    settle(net, a, b)
    assert net.counts["duplicated"] > 0 and b.stats().duplicates > 0


@pytest.mark.parametrize("delivery", MODES)
def test_reordered_datagrams(net: SimNetwork, delivery: str) -> None:
    a, b = net.add(delivery=delivery, **SMALL), net.add(**SMALL)
    net.link(a, b, delay=1e-4, jitter=3e-3)
    msgs = messages(300)
    push_all(a, b, msgs, gap=5e-5)
    assert net.run(until=got_all(b, msgs))
    check_delivered(b, msgs, delivery)
    settle(net, a, b)
    seqs = [d.seq for _, d in net.trace if d.is_data and d.dst == b.addr]
    assert seqs != sorted(seqs)  # the link did reorder
    if delivery == "unordered":
        assert b.received != msgs  # and unordered delivery showed it


# -- flow control -----------------------------------------------------------------


def test_a_receiver_that_does_not_consume_gets_no_more_than_its_budget(net: SimNetwork) -> None:
    budget = 20_000
    b = net.add(consume_every=None, max_buffered_bytes=budget, **SMALL)
    a = net.add(send_buffer=12_000, on_full="raise", **SMALL)
    pushed: list[bytes] = []
    refused = None
    for m in messages(10_000):
        try:
            a.push(b.addr, m)
        except WouldBlock:
            refused = m
            break
        pushed.append(m)
        net.run_for(1e-4)
    assert refused is not None, "the send buffer never filled"
    net.run_for(10.0)  # the application sleeps for a long time
    held = b.stats().held_bytes
    assert 0 < held <= budget
    assert b.stats().queued * 100 <= budget  # the messages' own bytes too
    assert b.stats().overruns == 0  # the credit kept the sender within it
    # Nothing was acknowledged past the budget: the sender's buffer takes
    # only what room it had left, then refuses again.
    room = a._send_buffer - a.stats().send_buffered
    extra = 0
    with pytest.raises(WouldBlock):
        for _ in range(1000):
            a.push(b.addr, refused)
            extra += 1
    assert extra <= room // len(refused) + 1
    pushed += [refused] * extra
    assert not a.failures()  # a slow consumer is not a dead peer
    b.consume_every = 0  # the application wakes up
    b.consume()
    assert net.run(until=got_all(b, pushed))
    assert b.received == pushed  # the refused pushes were never queued
    settle(net, a, b)


def test_a_stream_that_comes_later_is_not_starved_of_credit(net: SimNetwork) -> None:
    """A server's first clients do not keep its whole budget: a stream that
    sends a message at a time is granted a window it uses, so a client that
    comes later gets credit at once, not 4 datagrams at a time with each
    raise waiting for the receiver's delayed re-check (a 2 ms stall every
    few round trips of a ping-pong through a broker)."""
    b = net.add(max_buffered_bytes=1_000_000, **SMALL)
    early = net.add(**SMALL)
    for n, m in enumerate(messages(5), 1):  # requests, one at a time: the first stream granted anything
        early.push(b.addr, m)
        assert net.run(until=lambda n=n: len(b.received) >= n)
    late = net.add(**SMALL)
    waits = []
    for n, m in enumerate(messages(200, start=5), 6):  # a ping-pong's side: one in flight
        pushed_at = net.now
        late.push(b.addr, m)
        assert net.run(until=lambda n=n: len(b.received) >= n)
        waits.append(net.now - pushed_at)
    assert b.received == messages(205)
    # One link delay each (1e-4 s here), none held for a STATUS's delay.
    assert max(waits) < MAX_ACK_DELAY / 2
    settle(net, b, early, late)


def test_a_fast_one_at_a_time_stream_is_acknowledged_by_the_timer_not_every_few_datagrams(
    net: SimNetwork,
) -> None:
    """A stream that sends a datagram at a time, fast (one every 10 us, as
    a ping-pong's side on loopback), uses a fifth of a small window well
    within max_ack_delay: its window grows until the delayed STATUS
    suffices, so it draws about one STATUS per max_ack_delay, not one every
    few datagrams (13 with a window of 64), and no more window than five
    delays' worth of its datagrams."""
    b = net.add(**SMALL)
    a = net.add(**SMALL)
    net.link(a, b, delay=1e-5)
    net.link(b, a, delay=1e-5)
    msgs = messages(2000)
    for n, m in enumerate(msgs, 1):
        a.push(b.addr, m)
        a.flush()  # as a blocking get does before it waits for the reply
        assert net.run(until=lambda n=n: len(b.received) >= n)
    assert b.received == msgs
    delays = net.now / MAX_ACK_DELAY
    (rs,) = b._receiver._rstreams.values()
    # With the window kept at 64: 154 STATUS in these 10 delays.
    assert b._receiver.status_sent <= 2 * delays + 10
    assert rs.win <= 8 * len(msgs) / delays
    settle(net, a, b)


@pytest.mark.parametrize("loss", [0.0, 0.03])
def test_a_bulk_senders_window_grows_to_the_endpoints_even_under_loss(net: SimNetwork, loss: float) -> None:
    """Windows start small and grow with what arrives (not with what is in
    order: behind a gap, a window kept small would hold the sender back
    exactly when repairs are under way)."""
    b = net.add(window=256, **SMALL)
    a = net.add(**SMALL)
    net.link(a, b, loss=loss)
    msgs = messages(3000)
    push_all(a, b, msgs)
    assert net.run(until=got_all(b, msgs))
    assert b.received == msgs
    (rs,) = b._receiver._rstreams.values()
    assert rs.win == 256
    settle(net, a, b)


def test_a_queue_in_the_readers_socket_shrinks_the_window_until_it_is_short_again(net: SimNetwork) -> None:
    """While the datagrams a reader reads have waited in its socket longer
    than QUEUE_TARGET (Receiver.queue_delay, which the driver measures after
    each read), grants halve the stream's window, at most once per that
    delay, down to START_WINDOW, without taking back credit already given;
    between half the target and the target it holds; under half it grows
    back. The window counts from the last datagram seen, so a gap's repair
    does not hold the sender at a cut window. Nothing is lost on the way."""
    b = net.add(window=256, **SMALL)
    a = net.add(**SMALL)
    net.link(a, b)
    msgs = messages(5000)
    r = b._receiver

    def send(part: list[bytes]) -> None:
        push_all(a, b, part)
        assert net.run(until=got_all(b, msgs[: msgs.index(part[-1]) + 1]))

    send(msgs[:1000])
    (rs,) = r._rstreams.values()
    assert rs.win == 256
    r.queue_delay = 2 * QUEUE_TARGET
    r._grant(rs, net.now)
    r._grant(rs, net.now + QUEUE_TARGET)  # within the queue's delay of the cut: no second one
    assert rs.win == 128
    wins = []
    for k in range(1000, 2500, 100):
        net.run_for(r.queue_delay)  # the last cut shows in the queue by now
        given = rs.credit
        send(msgs[k : k + 100])
        assert seq_diff(rs.credit, given) >= 0  # never lowered
        wins.append(rs.win)
    assert wins == sorted(wins, reverse=True) and wins[-1] == START_WINDOW  # 128, 64 and no more
    assert seq_diff(rs.credit, rs.next) <= START_WINDOW  # the sender may send no further ahead than that
    # A gap at the cut window: the credit goes past it by what arrived behind it.
    net.drop(carries(msgs[2600]), count=1)
    push_all(a, b, msgs[2500:3000])
    assert net.run(until=lambda: bool(rs.held) and seq_diff(rs.credit, rs.next) > START_WINDOW)
    assert net.run(until=got_all(b, msgs[:3000]))
    r.queue_delay = 0.75 * QUEUE_TARGET
    send(msgs[3000:4000])
    assert rs.win == START_WINDOW
    r.queue_delay = 0.0
    send(msgs[4000:])
    assert rs.win == 256
    assert b.received == msgs
    settle(net, a, b)


def test_the_endpoint_bound_holds_across_destinations(net: SimNetwork) -> None:
    """max_send_buffered bounds all streams together: one per-stream buffer
    is far from full when pushes to a second destination are refused."""
    b = net.add(consume_every=None, max_buffered_bytes=200_000, **SMALL)
    c = net.add(consume_every=None, max_buffered_bytes=200_000, **SMALL)
    a = net.add(send_buffer=100_000, max_send_buffered=30_000, on_full="raise", **SMALL)
    net.partition(a, b)  # nothing is ever acknowledged
    net.partition(a, c)
    pushed = {b.addr: 0, c.addr: 0}
    refusal = None
    for i, m in enumerate(messages(1000)):
        dest = (b, c)[i % 2].addr
        try:
            a.push(dest, m)
        except WouldBlock as exc:
            refusal = str(exc)
            break
        pushed[dest] += 1
    assert refusal is not None, "the endpoint bound never applied"
    assert "max_send_buffered=30000" in refusal
    held = a.stats().send_buffered
    assert 30_000 <= held <= 30_000 + 2 * a.config.max_datagram  # a batch over, at most
    assert min(pushed.values()) > 0  # both destinations took their share
    assert all(n * 100 < 100_000 for n in pushed.values())  # neither stream's own bound was reached


def test_a_paced_consumer_gets_everything_once(net: SimNetwork) -> None:
    b = net.add(consume_every=0.01, consume_batch=7, max_buffered_bytes=8_000, **SMALL)
    a = net.add(**SMALL)
    msgs = messages(300)
    push_all(a, b, msgs)
    assert net.run(until=got_all(b, msgs))
    assert b.received == msgs
    settle(net, a, b)


def test_a_full_mailbox_is_repaired_once_the_application_consumes() -> None:
    """Datagrams a full mailbox (max_queued) refuses, in order or from the
    reorder buffer, are overruns the sender repairs; the RTT estimate stays
    sane while the gap stays open."""
    for seed in range(4):
        with SimNetwork(seed=seed) as net:
            b = net.add(consume_every=None, max_queued=12, **SMALL)
            a = net.add(**SMALL)
            net.link(a, b, jitter=2e-3, loss=0.1)
            msgs = messages(100)
            push_all(a, b, msgs, gap=1e-4)
            net.run_for(2.0)
            assert b.stats().queued <= 12 and b.stats().overruns > 0
            assert a.stats().srtt < 0.01  # repeated STATUS do not inflate it
            b.consume_every = 0
            b.consume()
            assert net.run(until=got_all(b, msgs), limit=5.0)
            assert b.received == msgs
            settle(net, a, b)


# -- failures: restart, dead peer ------------------------------------------------


def test_receiver_restart_reports_exactly_the_unacknowledged_messages(net: SimNetwork) -> None:
    reported: list[Any] = []
    a = net.add(on_failure=reported.append, **SMALL)
    b = net.add(**SMALL)
    first = messages(10)
    push_all(a, b, first)
    assert net.run(until=lambda: a.unacknowledged() == 0)  # acknowledged: no SYN any more
    mute = net.drop(lambda d: d.src == b.addr)  # b's acknowledgements are lost ...
    unacked = messages(20, start=10)
    push_all(a, b, unacked, gap=1e-4)
    net.run_for(1e-3)
    assert b.received == first + unacked  # ... though b got everything
    b.crash()  # ... and b restarts, knowing nothing
    net.heal(mute)
    b2 = net.add(addr=b.addr, **SMALL)
    assert net.run(until=lambda: bool(a.failures()))
    (failure,) = a.failures()
    assert failure.reason == "peer_reset"
    assert failure.messages == tuple(unacked)  # in doubt: delivered or not, no one knows
    assert reported == [failure]
    assert a.stats().in_doubt == len(unacked) and a.unacknowledged() == 0
    later = messages(10, start=30)
    push_all(a, b2, later)
    assert net.run(until=got_all(b2, later))
    net.run(limit=5.0)
    assert b2.received == later  # nothing of the old epoch delivered again
    assert len(a.failures()) == 1


def test_a_failure_is_reported_before_its_messages_are_decoded_and_reads_like_a_value(
    net: SimNetwork,
) -> None:
    """Giving up on a window reports at once: the failure keeps the datagrams
    and names their messages (a fragmented one once, whole; MessagePack
    values decoded) the first time they are read."""
    reported: list[Any] = []
    a = net.add(on_failure=reported.append, codec="msgpack", **SMALL)
    b = net.add(codec="msgpack", **SMALL)
    push_all(a, b, messages(10, start=100))
    assert net.run(until=lambda: a.unacknowledged() == 0)  # acknowledged: no SYN any more
    mute = net.drop(lambda d: d.src == b.addr)  # nothing b says reaches a
    big = b"B" * 2500  # five fragments of 600-byte datagrams
    msgs: list[Any] = [*messages(30), big, {"k": [1, 2]}, *messages(5, start=30)]
    push_all(a, b, msgs, gap=1e-4)
    b.crash()
    net.heal(mute)
    net.add(addr=b.addr, codec="msgpack", **SMALL)
    assert net.run(until=lambda: bool(reported))
    (failure,) = reported
    assert failure._messages is None  # not decoded yet
    assert failure.messages == tuple(msgs)
    assert failure == DeliveryFailure(dest=b.addr, mailbox=0, reason="peer_reset", messages=tuple(msgs))
    assert pickle.loads(pickle.dumps(failure)) == failure
    assert repr(failure).startswith(f"DeliveryFailure(dest={b.addr!r}, mailbox=0, reason='peer_reset'")
    with pytest.raises(AttributeError):
        failure.reason = "closed"  # type: ignore[misc]
    assert a.stats().in_doubt == len(msgs)


@pytest.mark.parametrize("outage", [0.01, 0.2, 1.5])
def test_a_receiver_back_after_any_outage_is_found_within_three_probe_timeouts(
    net: SimNetwork, outage: float
) -> None:
    """However long it was gone (short of dead), a restarted receiver hears a
    probe within a few PTOs: probes do not back off past two PTOs apart."""
    a = net.add(**SMALL)
    b = net.add(**SMALL)
    push_all(a, b, messages(10))
    assert net.run(until=lambda: a.unacknowledged() == 0)
    b.crash()
    push_all(a, b, messages(5, start=10))
    net.run_for(outage)
    assert not a.failures()  # silent for less than max_probes' doubling schedule: not dead yet
    pto = a._rel.pto()
    back = net.now
    net.add(addr=b.addr, **SMALL)
    assert net.run(until=lambda: bool(a.failures()))
    (failure,) = a.failures()
    assert failure.reason == "peer_reset"
    assert net.now - back <= 3 * pto


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_receiver_restart_mid_stream_loses_nothing_unreported(seed: int) -> None:
    with SimNetwork(seed=seed, loss=0.1) as net:
        a, b = net.add(**SMALL), net.add(**SMALL)
        msgs = messages(200)
        for i, m in enumerate(msgs):
            a.push(b.addr, m)
            net.run_for(2e-4)
            if i == 100:
                b.crash()
                b = b2 = net.add(addr=b.addr, **SMALL)
        assert net.run(limit=30.0)
        first = net._all[1]
        in_doubt = [m for f in a.failures() for m in f.messages]
        assert {f.reason for f in a.failures()} == {"peer_reset"}
        assert a.stats().in_doubt == len(in_doubt) > 0
        assert len(set(b2.received)) == len(b2.received)  # once to the new incarnation
        assert not set(b2.received) & set(first.received)
        assert not set(b2.received) & set(in_doubt)
        assert set(first.received) | set(in_doubt) | set(b2.received) == set(msgs)
        assert b2.received == sorted(b2.received)  # in order
        assert b2.received[-1] == msgs[-1]
        assert a.unacknowledged() == 0


def test_a_dead_peer_is_reported_after_max_probes(net: SimNetwork) -> None:
    a = net.add(codec="msgpack", max_probes=4, **SMALL)
    b = net.add(codec="msgpack", **SMALL)
    push_all(a, b, list(range(10)))
    assert net.run(until=lambda: a.unacknowledged() == 0)
    cut = net.partition(a, b)
    push_all(a, b, [{"n": i} for i in range(10, 20)])
    assert net.run(until=lambda: bool(a.failures()), limit=60.0)
    (failure,) = a.failures()
    assert failure.reason == "peer_dead" and failure.dest == b.addr
    assert failure.messages == tuple({"n": i} for i in range(10, 20))
    stats = a.stats()
    assert stats.dead_streams == 1 and stats.in_doubt == 10
    # Probes at most two PTOs apart, for as long as four doubling ones take
    # (2 + 4 + 8 + 16 = 30 PTOs): about 15 of them.
    assert 10 <= stats.probes <= 20
    assert a.unacknowledged() == 0 and a._next_deadline() is None
    net.heal(cut)
    push_all(a, b, [20, 21])  # a new epoch: the peer is tried afresh
    assert net.run(until=lambda: len(b.received) == 12)
    assert b.received == [*range(10), 20, 21]


# -- keys, versions, fragments ---------------------------------------------------


def test_a_forged_status_is_dropped_and_acknowledges_nothing(net: SimNetwork) -> None:
    key = b"k" * 32
    a, b = net.add(key=key, **SMALL), net.add(key=key, **SMALL)
    mute = net.drop(lambda d: d.src == b.addr)
    msgs = messages(40)
    push_all(a, b, msgs)
    net.run_for(5e-3)
    unacked = a.unacknowledged()
    assert unacked > 0
    (epoch,) = a._rel.streams
    forged = Status(
        stream_sender=a.sender_id, mailbox=0, epoch=epoch,
        next_expected=1000, credit_limit=100_000, largest_seen=999,
    )  # fmt: skip
    for k in (None, b"x" * 32):  # no tag, and a tag under the wrong key
        net.inject(Datagram(b.addr, a.addr, encode_control([forged], b.sender_id, k)), 1e-4)
    net.run_for(1e-3)
    assert a.stats().dropped["bad_tag"] == 2
    assert a.unacknowledged() >= unacked
    assert a.stats().status_received == 0
    net.heal(mute)
    assert net.run(until=got_all(b, msgs))
    assert b.received == msgs
    settle(net, a, b)


def test_a_best_effort_sender_reaches_a_reliable_receiver(net: SimNetwork) -> None:
    a, b = net.add(delivery="best-effort", **SMALL), net.add(delivery="reliable", **SMALL)
    msgs = messages(100)
    push_all(a, b, msgs)
    assert net.run(until=got_all(b, msgs))
    assert b.received == msgs
    assert all(d.data[2] == 1 for _, d in net.trace)  # v1 only, no control records
    assert b.stats().status_sent == 0
    settle(net, a, b)


@pytest.mark.parametrize("delivery", MODES)
def test_a_reliable_sender_reaches_a_best_effort_receiver(net: SimNetwork, delivery: str) -> None:
    a, b = net.add(delivery=delivery, **SMALL), net.add(delivery="best-effort", **SMALL)
    net.link(a, b, loss=0.2)
    msgs = messages(100)
    push_all(a, b, msgs)
    assert net.run(until=got_all(b, msgs))
    check_delivered(b, msgs, delivery)
    assert b.stats().status_sent > 0  # v2 data is acknowledged whatever b sends itself
    settle(net, a, b)


@pytest.mark.parametrize("delivery", MODES)
def test_fragmented_messages_arrive_whole_and_once_under_loss(
    net: SimNetwork, delivery: str
) -> None:
    rng = random.Random(7)
    a, b = net.add(delivery=delivery, **SMALL), net.add(**SMALL)
    net.link(a, b, loss=0.15, jitter=5e-4)
    msgs = [
        m + bytes(rng.randrange(256) for _ in range(rng.randrange(500, 4000)))
        for m in messages(40, 6)
    ]
    push_all(a, b, msgs, gap=2e-4)
    assert net.run(until=got_all(b, msgs))
    check_delivered(b, msgs, delivery)
    assert a.stats().fragments_sent > len(msgs)
    settle(net, a, b)
    assert b._receiver.partials == 0


# -- regressions: a STATUS that is old news, repeats, a restart seen through SYN ----


def test_a_status_overtaken_by_a_later_one_is_ignored(net: SimNetwork) -> None:
    a, b = net.add(**SMALL), net.add(**SMALL)
    first = messages(10)
    push_all(a, b, first, gap=1e-3)
    assert net.run(until=lambda: a.unacknowledged() == 0)
    old = next(
        d for _, d in net.trace if d.is_status
    )  # the first: acknowledges less than later ones
    (rec,) = old.records
    assert isinstance(rec, Status) and rec.next_expected < len(first)
    mute = net.drop(lambda d: d.src == b.addr)
    more = messages(10, start=10)
    push_all(a, b, more)
    for delay in (1e-3, 50e-3):  # arrives late, twice, while more is unacknowledged
        net.inject(old, delay)
    net.run_for(0.1)
    net.heal(mute)
    assert net.run(until=lambda: a.unacknowledged() == 0)
    assert not a.failures()
    assert b.received == first + more
    settle(net, a, b)


def test_a_lost_retransmission_is_found_by_the_probe_sent_behind_it(net: SimNetwork) -> None:
    """The receiver's repeated reports say nothing of a retransmission sent
    after what they saw last (it may be on its way), so a PROBE goes right
    behind the repairs: its answer calls the lost one lost within a round
    trip, well before a probe timeout."""
    a, b = net.add(**SMALL), net.add(**SMALL)
    msgs = messages(5)
    # The datagram and its first retransmission; nothing new arrives after
    # them to prompt another STATUS.
    net.drop(carries(msgs[3]), count=2)
    push_all(a, b, msgs, gap=1e-3)
    pushed = net.now
    assert net.run(until=got_all(b, msgs))
    assert b.received == msgs
    assert a.stats().retransmits == 2 and a.stats().probes == 1
    assert net.now - pushed < a._rel.pto()


def test_a_restart_that_took_a_late_syn_datagram_is_detected(net: SimNetwork) -> None:
    """The restarted receiver accepts a stale SYN datagram as a new stream
    and keeps asking for what the old one acknowledged: the sender restarts."""
    a, b = net.add(**SMALL), net.add(**SMALL)
    first = messages(10)
    push_all(a, b, first, gap=1e-4)  # all leave with SYN, before the first STATUS
    assert net.run(until=lambda: a.unacknowledged() == 0)
    syn = next(d for _, d in net.trace if d.is_data and d.seq == 1)
    mute = net.drop(lambda d: d.src == b.addr)
    unacked = messages(10, start=10)
    push_all(a, b, unacked, gap=1e-4)
    net.run_for(1e-3)
    b.crash()
    net.heal(mute)
    b2 = net.add(addr=b.addr, **SMALL)
    net.inject(syn, 1e-4)  # a copy that wandered
    assert net.run(until=lambda: bool(a.failures()), limit=10.0)
    (failure,) = a.failures()
    assert failure.reason == "peer_reset" and failure.messages == tuple(unacked)
    later = messages(5, start=20)
    push_all(a, b2, later)
    assert net.run(until=got_all(b2, later))
    assert b2.received == later


def test_a_message_larger_than_the_receivers_budget_is_delivered(net: SimNetwork) -> None:
    """Its fragments fill the budget, but a stream whose application has
    nothing to take always gets some credit: only more data completes it."""
    b = net.add(max_buffered_bytes=20_000, **SMALL)
    a = net.add(**SMALL)
    a.push(b.addr, b"x" * 50_000)
    assert net.run(until=lambda: bool(b.received or a.failures()), limit=20.0)
    assert b.received == [b"x" * 50_000]
    assert not a.failures()
