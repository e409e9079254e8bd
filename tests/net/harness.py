"""A deterministic network for cmq endpoints: virtual time, fake links, no threads.

Theory of operation
-------------------
:class:`SimEndpoint` is a real :class:`cmq.net._base.Endpoint` (the same
batcher, receiver and reliable sender as :class:`cmq.Queue`) with the driver
half replaced:

- its clock is the network's virtual clock;
- everything it sends (``_transmit``, ``_send_to``) goes into the
  :class:`SimNetwork`; its real socket (bound to 127.0.0.1, port 0) is never
  used;
- it receives only when the network hands it a *receive batch* (the
  datagrams arriving at one instant), exactly as the threaded driver's drain
  does: ``datagram_received`` for each, then ``_after_read``;
- its timers are fired as ``Queue._fire_deadlines`` fires them, when the
  clock reaches ``_next_deadline()``;
- ``_wait_room`` never blocks: it answers whether there is room, so a full
  send buffer raises :class:`cmq.WouldBlock` at once.

Each endpoint has a fake address, ``("10.0.0.n", 1000 + n)``: its identity
on the network, the ``addr`` its peers' receivers see and what a push names
(literal IPs resolve without DNS). An endpoint's *application* takes what
arrives into :attr:`SimEndpoint.received`: at once (``consume_every=0``,
the default), up to ``consume_batch`` messages every ``consume_every``
seconds, or never (``None``: a paused consumer).

Each direction between two addresses is a :class:`Link` (delay, jitter,
loss, duplication; jitter reorders). The network's random choices come from
one seeded generator, so a run is a pure function of the seed and the test's
actions. :class:`Rule` drops datagrams matching a predicate, for a count or
until a time, before the link sees them (``drop``, ``partition``).

:meth:`SimNetwork.step` advances the clock to the next event (a delivery,
an endpoint deadline, an application take) and handles everything due then;
:meth:`SimNetwork.run` and :meth:`SimNetwork.run_until` repeat it. Nothing
sleeps: a test of a five-second timeout takes milliseconds.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Final

from cmq import ProtocolError
from cmq.net._base import Endpoint
from cmq.wire.batcher import Stream
from cmq.wire.frames import FLAG_CONTROL, Fragment, Probe, Status, decode, parse_header

__all__ = ["Datagram", "Link", "Rule", "SimEndpoint", "SimNetwork"]

Addr = tuple[str, int]

#: Steps in a row at one instant before the run is declared stuck: a
#: deadline that firing does not move would spin a real driver too.
MAX_STEPS_AT_ONE_INSTANT: Final = 1000


@dataclass(frozen=True, slots=True)
class Datagram:
    """One datagram on the network, with what rules and tests ask of it."""

    src: Addr
    dst: Addr
    data: bytes

    @property
    def is_control(self) -> bool:
        return len(self.data) > 3 and bool(self.data[3] & FLAG_CONTROL)

    @property
    def is_data(self) -> bool:
        return not self.is_control

    @property
    def seq(self) -> int:
        return parse_header(self.data).seq

    @property
    def records(self) -> list[Status | Probe]:
        """The control records (empty for data)."""
        body = self._body()
        if not self.is_control or isinstance(body, Fragment):
            return []
        return [r for r in body if isinstance(r, Status | Probe)]

    @property
    def is_status(self) -> bool:
        return any(isinstance(r, Status) for r in self.records)

    @property
    def is_probe(self) -> bool:
        return any(isinstance(r, Probe) for r in self.records)

    @property
    def payloads(self) -> list[bytes]:
        """The frames of a data datagram as sent (a fragment's slice for a fragment)."""
        if self.is_control:
            return []
        body = self._body()
        return (
            [body.data] if isinstance(body, Fragment) else [p for p in body if isinstance(p, bytes)]
        )

    def _body(self) -> list[Any] | Fragment:
        try:
            return decode(self.data)[1]  # a tag, if any, is skipped unchecked
        except ProtocolError:
            return []


@dataclass(frozen=True, slots=True, kw_only=True)
class Link:
    """One direction between two addresses."""

    delay: float = 1e-4  # one-way, seconds
    jitter: float = 0.0  # extra delay, uniform in [0, jitter): reorders
    loss: float = 0.0  # probability a datagram is lost
    duplicate: float = 0.0  # probability it arrives twice


@dataclass(slots=True)
class Rule:
    """Drop datagrams for which ``match`` is true: ``count`` of them (None: all), until ``until``."""

    match: Callable[[Datagram], bool]
    count: int | None = None
    until: float | None = None
    dropped: int = 0

    def active(self, now: float) -> bool:
        return (self.count is None or self.dropped < self.count) and (
            self.until is None or now < self.until
        )


class SimEndpoint(Endpoint):
    """An endpoint whose clock, socket and timers are a :class:`SimNetwork`'s (see the module doc)."""

    _kind = "SimEndpoint"

    def __init__(
        self,
        net: SimNetwork,
        addr: Addr,
        *,
        consume_every: float | None = 0.0,
        consume_batch: int = 1 << 30,
        **options: Any,
    ) -> None:
        self.net = net
        self.addr = addr
        # No kernel buffers to size: the network is simulated.
        options.setdefault("rcvbuf", 0)
        options.setdefault("sndbuf", 0)
        super().__init__(0, "127.0.0.1", None, None, options)
        # The budget is max_buffered_bytes, whatever this host's kernel allows.
        self._receiver.set_kernel_budget(self.config.max_buffered_bytes)
        self.consume_every = consume_every
        self.consume_batch = consume_batch
        self._take_at = float("-inf")  # the application's next take (paced)
        #: What the application took, in order, and when.
        self.received: list[Any] = []
        self.received_at: list[float] = []

    # -- the driver half -----------------------------------------------------

    def _now(self) -> float:
        return self.net.now

    def _transmit(self, s: Stream, datagrams: list[bytes], *, raise_errors: bool = True) -> None:
        for d in datagrams:
            self.net.send(self.addr, s.addr, d)
        self._batcher.sent(s, self.net.now)

    def _send_to(self, data: bytes, addr: Any) -> None:
        self.net.send(self.addr, addr, data)

    def _wait_room(self, s: Stream, deadline: float) -> bool:
        return bool(s.rel.nbytes < self._send_buffer)

    def _deadline_armed(self, deadline: float) -> None:
        pass  # the network asks _next_deadline() before every step

    def _poll(self) -> None:
        pass  # datagrams arrive only when the network delivers them

    def _new_future(self) -> Future[Any]:
        return Future()

    @property
    def address(self) -> Addr:
        return self.addr

    @property
    def port(self) -> int:
        return self.addr[1]

    # -- what the network calls --------------------------------------------

    def receive_batch(self, batch: list[Datagram], now: float) -> None:
        """Datagrams read in one drain, as ``Queue._drain`` hands them over."""
        r = self._receiver
        for d in batch:
            r.datagram_received(d.data, d.src, now)
        if r.replies or r.controls or r.status_urgent or r.new_due:
            self._after_read(now)
        if self.consume_every == 0:
            self.consume()

    def fire_deadlines(self, now: float) -> None:
        """What ``Queue._fire_deadlines`` does when its timer expires."""
        for s in self._batcher.due(now):
            self._send_stream(s, now, raise_errors=False, force=False)
        if self._receiver.partials:
            self._receiver.expire(now)
        self._expire_requests(now)
        self._fire_reliable(now)

    def next_event(self) -> float | None:
        """When this endpoint next has something to do: a deadline or a paced take."""
        due = self._next_deadline()
        if self.consume_every and self._receiver.queued():
            at = max(self._take_at, self.net.now)
            due = at if due is None else min(due, at)
        return due

    def tick(self, now: float) -> None:
        """Do what is due at ``now``."""
        if self.consume_every and self._take_at <= now and self._receiver.queued():
            self.consume(self.consume_batch)
            self._take_at = now + self.consume_every
        due = self._next_deadline()
        if due is not None and due <= now:
            self.fire_deadlines(now)

    # -- the application ---------------------------------------------------

    def consume(self, limit: int = 1 << 30) -> int:
        """Take up to ``limit`` waiting messages (all mailboxes) into :attr:`received`."""
        taken = 0
        for mailbox in sorted(self._mailboxes):
            got = self.pop_many(limit - taken, mailbox)
            self.received.extend(got)
            self.received_at.extend([self.net.now] * len(got))
            taken += len(got)
        return taken

    def crash(self) -> None:
        """Vanish without a word: no STATUS, no close; datagrams to the address are lost."""
        self.net.detach(self)
        self._closed = True
        self._sock.close()


class SimNetwork:
    """Endpoints, links and a virtual clock (see the module doc).

    ``SimNetwork(seed, **link)``: ``link`` is the default :class:`Link` of
    every direction.
    """

    def __init__(self, seed: int = 0, **link: Any) -> None:
        self.now = 0.0
        self.rng = random.Random(seed)
        self.default = Link(**link)
        self.links: dict[tuple[Addr, Addr], Link] = {}
        self.rules: list[Rule] = []
        self.endpoints: dict[Addr, SimEndpoint] = {}
        self._all: list[SimEndpoint] = []
        self._flight: list[tuple[float, int, Datagram]] = []
        self._tiebreak = itertools.count()
        self._last_step = -1.0
        self._same_instant = 0
        #: sent, lost, dropped (by a rule), duplicated, delivered, unreachable.
        self.counts: Counter[str] = Counter()
        #: Every datagram delivered, with when.
        self.trace: list[tuple[float, Datagram]] = []

    # -- building ----------------------------------------------------------

    def add(self, addr: Addr | None = None, **options: Any) -> SimEndpoint:
        """A new endpoint at ``addr`` (the next free ``("10.0.0.n", 1000 + n)`` by default).

        ``options`` are QueueConfig fields, or ``consume_every`` / ``consume_batch``.
        """
        if addr is None:
            n = len(self._all) + 1
            addr = (f"10.0.0.{n}", 1000 + n)
        if addr in self.endpoints:
            raise ValueError(f"{addr} is taken: crash() its endpoint first")
        ep = SimEndpoint(self, addr, **options)
        self.endpoints[addr] = ep
        self._all.append(ep)
        return ep

    def detach(self, ep: SimEndpoint) -> None:
        if self.endpoints.get(ep.addr) is ep:
            del self.endpoints[ep.addr]

    def link(self, src: SimEndpoint | Addr, dst: SimEndpoint | Addr, **params: Any) -> None:
        """Set the link from ``src`` to ``dst`` (one direction)."""
        self.links[(_addr(src), _addr(dst))] = Link(**params)

    def drop(
        self,
        match: Callable[[Datagram], bool],
        count: int | None = None,
        until: float | None = None,
    ) -> Rule:
        """Drop the next ``count`` datagrams (None: all) matching ``match``, until ``until``."""
        rule = Rule(match, count, until)
        self.rules.append(rule)
        return rule

    def partition(
        self, a: SimEndpoint | Addr, b: SimEndpoint | Addr, until: float | None = None
    ) -> Rule:
        """Drop everything between ``a`` and ``b``, both ways, until ``until`` (None: until removed)."""
        ends = {_addr(a), _addr(b)}
        return self.drop(lambda d: {d.src, d.dst} == ends, until=until)

    def heal(self, rule: Rule) -> None:
        self.rules.remove(rule)

    # -- moving datagrams --------------------------------------------------

    def send(self, src: Addr, dst: Any, data: bytes) -> None:
        """What an endpoint's socket does: rules, then the link's loss, duplication and delay."""
        d = Datagram(src, (dst[0], dst[1]), bytes(data))
        self.counts["sent"] += 1
        for rule in self.rules:
            if rule.active(self.now) and rule.match(d):
                rule.dropped += 1
                self.counts["dropped"] += 1
                return
        link = self.links.get((d.src, d.dst), self.default)
        rng = self.rng
        if rng.random() < link.loss:
            self.counts["lost"] += 1
            return
        copies = 2 if rng.random() < link.duplicate else 1
        self.counts["duplicated"] += copies - 1
        for _ in range(copies):
            self.inject(d, link.delay + rng.random() * link.jitter)

    def inject(self, d: Datagram, delay: float = 0.0) -> None:
        """Put ``d`` on the wire as is (no rule, no loss): it arrives after ``delay``."""
        heapq.heappush(self._flight, (self.now + delay, next(self._tiebreak), d))

    @property
    def in_flight(self) -> int:
        return len(self._flight)

    # -- running -----------------------------------------------------------

    def next_event(self) -> float | None:
        times = [ep_t for ep in self.endpoints.values() if (ep_t := ep.next_event()) is not None]
        if self._flight:
            times.append(self._flight[0][0])
        return min(times) if times else None

    def step(self, horizon: float = float("inf")) -> bool:
        """Advance to the next event, if it is at or before ``horizon``, and handle
        everything due then; whether there was one.

        Raises:
            RuntimeError: the same instant came up too many times in a row (a
                deadline that firing does not move: a real driver would spin).
        """
        t = self.next_event()
        if t is None or t > horizon:
            return False
        self.now = max(self.now, t)
        now = self.now
        if now == self._last_step:
            self._same_instant += 1
            if self._same_instant > MAX_STEPS_AT_ONE_INSTANT:
                raise RuntimeError(f"stuck at t={now}: deadlines {self._deadlines()}")
        else:
            self._last_step, self._same_instant = now, 0
        arrivals: dict[Addr, list[Datagram]] = {}
        while self._flight and self._flight[0][0] <= now:
            d = heapq.heappop(self._flight)[2]
            arrivals.setdefault(d.dst, []).append(d)
        for dst, batch in arrivals.items():
            ep = self.endpoints.get(dst)
            if ep is None:
                self.counts["unreachable"] += len(batch)
                continue
            self.counts["delivered"] += len(batch)
            self.trace.extend((now, d) for d in batch)
            ep.receive_batch(batch, now)
        for ep in list(self.endpoints.values()):
            ep.tick(now)
        return True

    def run_until(self, t: float) -> None:
        """Handle every event up to virtual time ``t``, then set the clock to ``t``."""
        while self.step(horizon=t):
            pass
        self.now = max(self.now, t)

    def run_for(self, dt: float) -> None:
        self.run_until(self.now + dt)

    def run(self, until: Callable[[], bool] | None = None, limit: float = 60.0) -> bool:
        """Step until ``until()`` holds (None: until nothing is left to do) or
        ``limit`` virtual seconds pass; whether ``until()`` holds (or, without
        it, whether the network went quiet)."""
        end = self.now + limit
        while until is None or not until():
            if not self.step(horizon=end):
                return until() if until is not None else self.next_event() is None
        return True

    def quiet(self) -> bool:
        """Nothing in flight and no endpoint with anything left to do."""
        return self.next_event() is None

    def _deadlines(self) -> dict[Addr, Any]:
        return {
            a: (ep._batcher.next_deadline(), ep._receiver.next_deadline(), ep._rel.next_deadline())
            for a, ep in self.endpoints.items()
        }

    # -- lifecycle -----------------------------------------------------------

    def close(self) -> None:
        """Close every endpoint's (unused) socket."""
        for ep in self._all:
            ep._closed = True
            ep._sock.close()

    def __enter__(self) -> SimNetwork:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _addr(x: SimEndpoint | Addr) -> Addr:
    return x.addr if isinstance(x, SimEndpoint) else x
