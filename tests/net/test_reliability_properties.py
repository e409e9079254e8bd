"""Properties of reliable and unordered delivery over random bad networks (virtual time).

Invariant: whatever the link loses, duplicates or reorders, and however
slowly the receiving application consumes (its budget and mailbox bound
small enough to matter), every message pushed is
delivered exactly once; in push order for "reliable". Nothing is reported
in doubt (the loss here is far from the dead-peer threshold), and once the
network is quiet nothing is left unacknowledged and no timer is armed.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from .harness import SimNetwork

# Every test here runs on the compiled core and on the pure-Python one.
pytestmark = pytest.mark.usefixtures("core")

#: Small datagrams: many per run, and messages over ~570 bytes are fragmented.
MAX_DATAGRAM = 600
#: The receiver's budget: small enough that a slow consumer throttles the sender.
BUDGET = 24_000

links = st.fixed_dictionaries(
    {
        "delay": st.sampled_from([1e-5, 1e-4, 1e-3]),
        "jitter": st.sampled_from([0.0, 1e-4, 2e-3]),
        "loss": st.floats(0.0, 0.2),
        "duplicate": st.floats(0.0, 0.2),
    }
)
# None: the application takes each message as it arrives; else (every, batch).
pacing = st.one_of(st.none(), st.tuples(st.sampled_from([1e-3, 1e-2, 5e-2]), st.integers(1, 20)))
size = st.one_of(st.integers(0, 120), st.integers(0, 3000))
# The count drawn first: a plain list strategy mostly makes short lists.
sizes = st.integers(1, 150).flatmap(lambda n: st.lists(size, min_size=n, max_size=n))


def payloads(sizes: list[int]) -> list[bytes]:
    """Distinct payloads of about these sizes (each starts with its number)."""
    return [(b"%05d" % i + b"x" * n)[: max(n, 5)] for i, n in enumerate(sizes)]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    forward=links,
    backward=links,
    delivery=st.sampled_from(["reliable", "unordered"]),
    sizes=sizes,
    gap=st.sampled_from([0.0, 1e-4, 1e-3]),
    pace=pacing,
    max_queued=st.sampled_from([8, 50, 1 << 18]),
)
def test_everything_pushed_is_delivered_exactly_once(
    seed: int,
    forward: dict[str, Any],
    backward: dict[str, Any],
    delivery: str,
    sizes: list[int],
    gap: float,
    pace: tuple[float, int] | None,
    max_queued: int,
) -> None:
    every, batch = pace if pace is not None else (0.0, 1 << 30)
    with SimNetwork(seed=seed) as net:
        a = net.add(delivery=delivery, max_datagram=MAX_DATAGRAM, max_probes=30)
        b = net.add(max_datagram=MAX_DATAGRAM, max_buffered_bytes=BUDGET, max_queued=max_queued,
                    consume_every=every, consume_batch=batch)  # fmt: skip
        net.link(a, b, **forward)
        net.link(b, a, **backward)
        msgs = payloads(sizes)
        for m in msgs:
            a.push(b.addr, m)
            if gap:
                net.run_for(gap)
        assert net.run(until=lambda: len(b.received) >= len(msgs), limit=300.0), (
            f"{len(b.received)} of {len(msgs)} delivered by t={net.now:.3f}"
        )
        assert not a.failures()
        event(f"retransmits: {'some' if a.stats().retransmits else 'none'}")
        event(f"messages: {'>= 50' if len(msgs) >= 50 else '< 50'}")
        if delivery == "reliable":
            assert b.received == msgs
        else:
            assert sorted(b.received) == sorted(msgs)
        assert net.run(limit=300.0), "the network never went quiet"
        assert len(b.received) == len(msgs)  # nothing came twice, later
        assert a.unacknowledged() == 0
        assert a._next_deadline() is None and b._next_deadline() is None
