"""The simulation's processes: ``python -m cmq.lab.experiments.stockex.roles ROLE JSON``.

``engine``
    The matching engine (:class:`~cmq.lab.experiments.stockex.book.OrderBook`) on the
    broker: takes orders from the ``orders`` queue and publishes every event
    to the exchange with routing key ``conf`` (order confirmations and
    cancels), ``trade`` or ``quote``. Prints ``READY``, then ``RESULT``
    with its totals when the gateway's end marker arrives.
``gateway``
    Sends random buy and sell orders at each rate of ``rates`` for
    ``seconds``, through the broker, and takes confirmations, trades and
    quotes from its own queue. Stamps each order before its publish and its
    confirmation on receipt (order completion time), prints ``STEP`` per
    rate and stops after the first rate the system could not keep (see
    :func:`kept`), then ``RESULT``.

A rate step begins with a marker through the broker (body ``b"\\x00"``, a
kind no order uses, then the step's number and its rate as 4 bytes), so the
engine, which sees the orders in the order they were sent, knows which step
each order belongs to; step number 255 ends the run. A rate not kept is
tried ``retries`` more times (one by default) before the sweep stops.
Both consume with acknowledgements unless ``no_ack`` (at most once).

Both work in batches, which is what lets two cores carry tens of thousands
of orders a second: the gateway publishes every order due at a turn of its
loop as one batch publish stamped with one clock read, the engine takes what
one read brings, matches it on plain tuples (:meth:`OrderBook.submit`) and
publishes the confirmations, trades and quotes as one batch per routing key,
and the broker routes each batch once.
Both processes push measurement messages (JSON, one per ``interval`` and
role) straight to the statistics reporter's cmq endpoint
(``report``), the input of its Spark query (:mod:`cmq.lab.experiments.stockex.reporter`);
the orders and their answers go through the broker.
"""

from __future__ import annotations

import json
import random
import sys
import time
from array import array
from typing import Any, Final

from cmq._errors import CmqError, ConfigError, ProtocolError, Timeout
from cmq.lab.experiments.stockex.book import MAX_QTY, OrderBook, Quote, Side, Trade
from cmq.lab.experiments.stockex.codec import (
    IHH,
    IHH_SIZE,
    KIND_CONFIRM,
    KIND_QUOTE,
    KIND_TRADE,
    QUOTE,
    decode,
    encode,
)

__all__ = ["END", "MARKER", "kept", "main", "marker"]

MARKER: Final = 0
END: Final = 0xFF
#: Unacknowledged deliveries per consumer: a 10 ms burst at 50k msgs/s.
PREFETCH: Final = 512
#: Messages taken per turn before the engine flushes what it publishes.
_TURN: Final = 2048
#: A step is kept when the orders confirmed per second reach this share of the rate ...
KEEP_SHARE: Final = 0.95
#: ... and at most this share of its orders was never confirmed.
KEEP_LOST: Final = 0.001
#: Shortest wait of the gateway's loop: below this, sleeping costs more than it saves.
_MIN_WAIT: Final = 0.0005

BUY: Final = int(Side.BUY)
SELL: Final = int(Side.SELL)


def marker(step: int, rate: int = 0) -> bytes:
    """The body that starts rate step ``step`` at ``rate`` orders/s (``END`` ends the run)."""
    return bytes((MARKER, step)) + rate.to_bytes(4, "big")


def kept(rate: float, sent: int, confirmed: int, seconds: float) -> bool:
    """Whether a step kept its rate: confirmations per second of its span at
    least :data:`KEEP_SHARE` of ``rate``, and at most :data:`KEEP_LOST` lost."""
    if sent == 0 or seconds <= 0:
        return False
    return confirmed / seconds >= KEEP_SHARE * rate and (sent - confirmed) <= KEEP_LOST * sent


def _emit(tag: str, value: Any) -> None:
    sys.stdout.write(f"{tag} {json.dumps(value)}\n")
    sys.stdout.flush()


class _Reporter:
    """Pushes one JSON measurement message per interval to the statistics reporter."""

    def __init__(
        self, queue: Any, dest: tuple[str, int] | None, role: str, interval: float
    ) -> None:
        self.queue, self.dest, self.role = queue, dest, role
        self.interval_ns = int(interval * 1e9)
        self.counts: dict[str, int] = {}
        self.step, self.rate = -1, 0.0
        self.t0 = time.time_ns()
        self.sent = 0

    def add(self, name: str, n: int = 1) -> None:
        self.counts[name] = self.counts.get(name, 0) + n

    def tick(self, now: int, force: bool = False) -> None:
        if self.dest is None or (not force and now - self.t0 < self.interval_ns):
            return
        if self.step >= 0 and (self.counts or force):
            msg = {"role": self.role, "step": self.step, "rate": self.rate, "t0": self.t0, "t1": now,
                   **self.counts}  # fmt: skip
            try:
                self.queue.push(self.dest, json.dumps(msg).encode())
                self.queue.flush()
                self.sent += 1
            except CmqError:
                pass  # the reporter is at most once by design; counted by its receiver
        self.counts = {}
        self.t0 = now


def _engine(p: dict[str, Any]) -> None:
    from cmq.net import Queue
    from cmq.routing import BrokerClient

    book = OrderBook()
    exchange = p["exchange"]
    report = p.get("report")
    with BrokerClient(p["broker"], timeout=10.0) as client, Queue(port=0, codec="raw") as side:
        rep = _Reporter(
            side, (report[0], int(report[1])) if report else None, "engine", float(p["interval"])
        )
        consumer = client.consume(p["queue"], prefetch=PREFETCH, no_ack=bool(p.get("no_ack")))
        totals = {"orders": 0, "events": 0, "bytes_in": 0, "bytes_out": 0, "bad": 0}
        _emit("READY", {})
        clock = time.time_ns
        running = True
        while running:
            try:
                bodies = consumer.get_bodies(timeout=float(p["interval"]), limit=_TURN)
            except Timeout:
                rep.tick(clock())
                continue
            # Orders run to the next marker are matched as one batch, and what
            # they cause leaves as one batch publish per routing key.
            start = 0
            for i, body in enumerate(bodies):
                if body[0] == MARKER:
                    _match(book, bodies[start:i], exchange, client, rep, totals)
                    start = i + 1
                    if body[1] == END:
                        running = False
                        break
                    rep.tick(clock(), force=True)
                    rep.step, rep.rate = body[1], float(int.from_bytes(body[2:6], "big"))
            else:
                _match(book, bodies[start:] if start else bodies, exchange, client, rep, totals)
            client.flush()
            rep.tick(clock())
        rep.tick(clock(), force=True)
        consumer.cancel()
        quote = book.quote
        _emit(
            "RESULT",
            {
                **totals,
                "reports": rep.sent,
                "cpu_s": time.process_time(),
                "book_bid": quote.bid,
                "book_ask": quote.ask,
            },
        )


def _match(
    book: OrderBook,
    orders: list[bytes],
    exchange: str,
    client: Any,
    rep: _Reporter,
    totals: dict[str, int],
) -> None:
    """Match a batch of encoded orders; publish the confirmations, trades and quotes."""
    if not orders:
        return
    confs: list[bytes] = []
    fills: list[tuple[int, int, int]] = []
    quotes: list[bytes] = []
    submit, top = book.submit, book.top
    last = top()
    bad = 0
    for body in orders:
        kind = body[0]
        if kind in (BUY, SELL) and len(body) == IHH_SIZE:
            _, oid, price, qty = IHH.unpack(body)
            try:
                left = submit(oid, Side.BUY if kind == BUY else Side.SELL, price, qty, fills)
            except ConfigError:
                bad += 1
                continue
            confs.append(IHH.pack(KIND_CONFIRM, oid, qty - left, left))
        else:  # a cancel, or something else: the general path
            try:
                events = book.handle(decode(body))  # type: ignore[arg-type]
            except (ProtocolError, ConfigError):
                bad += 1
                continue
            for e in events:
                if isinstance(e, Trade):
                    fills.append((e.id, e.price, e.qty))
                elif not isinstance(e, Quote):
                    confs.append(encode(e))
        now = top()
        if now != last:
            last = now
            quotes.append(QUOTE.pack(KIND_QUOTE, now[0], min(now[1], MAX_QTY), now[2],
                                     min(now[3], MAX_QTY)))  # fmt: skip
    trades = [IHH.pack(KIND_TRADE, i, price, q) for i, price, q in fills]
    publish = client.publish_batch
    for key, out in (("conf", confs), ("trade", trades), ("quote", quotes)):
        if out:
            publish(exchange, key, out)
            rep.add(key, len(out))
    n_events = len(confs) + len(trades) + len(quotes)
    nbytes = sum(map(len, orders))
    out_bytes = sum(map(len, confs)) + IHH_SIZE * len(trades) + QUOTE.size * len(quotes)
    rep.add("orders", len(orders))
    rep.add("bytes_in", nbytes)
    rep.add("bytes_out", out_bytes)
    totals["orders"] += len(orders)
    totals["events"] += n_events
    totals["bytes_in"] += nbytes
    totals["bytes_out"] += out_bytes
    totals["bad"] += bad


class _Step:
    """The gateway's books of one rate step: send and confirmation stamps by order."""

    def __init__(self, first: int, total: int, rep: _Reporter) -> None:
        self.first, self.total, self.rep = first, total, rep
        self.sent = array("q", bytes(8 * total))
        self.done = array("q", [-1] * total)
        self.confirmed = 0
        self.counts = {"trades": 0, "quotes": 0, "late": 0}

    def take(self, bodies: list[bytes], now: int) -> None:
        """Count what one read brought; confirmations are stamped ``now`` (one clock read a batch)."""
        first, total, done = self.first, self.total, self.done
        confirmed = trades = quotes = late = 0
        for b in bodies:
            kind = b[0]
            if kind == KIND_CONFIRM:
                i = int.from_bytes(b[1:5], "big") - first
                if 0 <= i < total and done[i] < 0:
                    done[i] = now
                    confirmed += 1
                else:  # a confirmation of an earlier step's order, after its drain ended
                    late += 1
            elif kind == KIND_TRADE:
                trades += 1
            elif kind == KIND_QUOTE:
                quotes += 1
        self.confirmed += confirmed
        counts, rep = self.counts, self.rep
        counts["trades"] += trades
        counts["quotes"] += quotes
        counts["late"] += late
        rep.add("confirms", confirmed)
        rep.add("trades", trades)
        rep.add("quotes", quotes)


def _gateway(p: dict[str, Any]) -> None:
    from cmq.lab.experiments.amqp._worker import write_stamps
    from cmq.net import Queue
    from cmq.routing import BrokerClient

    rng = random.Random(int(p.get("seed", 1)))
    exchange, key = p["exchange"], "order"
    seconds, drain = float(p["seconds"]), float(p["drain"])
    clock, wall = time.monotonic_ns, time.time_ns
    report = p.get("report")
    mid, spread = int(p.get("mid", 1000)), int(p.get("spread", 10))
    next_id = 0
    with BrokerClient(p["broker"], timeout=10.0) as client, Queue(port=0, codec="raw") as side:
        rep = _Reporter(
            side, (report[0], int(report[1])) if report else None, "gateway", float(p["interval"])
        )
        consumer = client.consume(p["queue"], prefetch=PREFETCH, no_ack=bool(p.get("no_ack")))
        publish, publish_batch = client.publish, client.publish_batch
        random_, pack, buy, sell = rng.random, IHH.pack, BUY, SELL
        prices = 2 * spread + 1
        _emit("READY", {})
        rates, retries = [int(r) for r in p["rates"]], int(p.get("retries", 1))
        step = i = 0
        attempt = 1
        while i < len(rates):
            rate = rates[i]
            total = max(1, round(rate * seconds))
            st = _Step(next_id, total, rep)
            publish(exchange, key, marker(step, rate), confirm=True)  # the engine is at this step
            rep.tick(wall(), force=True)
            rep.step, rep.rate = step, float(rate)
            n = 0
            t0 = clock()
            deadline = t0
            while True:
                if n < total:
                    # Every order due by now, random around ``mid``, as one batch
                    # publish stamped with one clock read.
                    due = min(total, int((clock() - t0) * rate / 1e9) + 1)
                    batch = [
                        pack(buy if random_() < 0.5 else sell, oid,
                             mid - spread + int(random_() * prices), 1 + int(random_() * 100))
                        for oid in range(next_id, next_id + due - n)
                    ]  # fmt: skip
                    now = clock()
                    st.sent[n:due] = array("q", [now]) * (due - n)
                    publish_batch(exchange, key, batch)
                    client.flush()
                    rep.add("orders_sent", len(batch))
                    rep.add("bytes_sent", IHH_SIZE * len(batch))
                    next_id += len(batch)
                    n = due
                    if n == total:
                        deadline = clock() + int(drain * 1e9)
                while bodies := consumer.get_bodies_nowait():
                    st.take(bodies, clock())
                rep.tick(wall())
                if n == total and (st.confirmed == total or clock() > deadline):
                    break
                # Wait for an answer until the next order is due (or a while, draining).
                wait = (t0 + (n + 1) * 1e9 / rate - clock()) / 1e9 if n < total else 0.005
                try:
                    bodies = consumer.get_bodies(timeout=max(_MIN_WAIT, wait))
                except Timeout:
                    continue
                st.take(bodies, clock())
            last = max((t for t in st.done if t >= 0), default=t0)
            span = (last - t0) / 1e9
            out = f"{p['out']}-{step}"
            write_stamps(out, st.sent, st.done)
            ok = kept(rate, total, st.confirmed, span)
            _emit("STEP", {"step": step, "rate": rate, "attempt": attempt, "sent": total,
                           "confirmed": st.confirmed, "send_seconds": (st.sent[total - 1] - t0) / 1e9,
                           "span": span, "kept": ok, "stamps": out, **st.counts})  # fmt: skip
            step += 1
            if ok:
                i, attempt = i + 1, 1
            elif attempt <= retries:
                # Once more before giving up: on a shared machine a neighbour's
                # burst can sink one step that the system can otherwise keep.
                attempt += 1
            else:
                break
        rep.tick(wall(), force=True)
        publish(exchange, key, marker(END), confirm=True)
        consumer.cancel()
        _emit("RESULT", {"orders": next_id, "reports": rep.sent, "cpu_s": time.process_time()})


_ROLES: Final = {"engine": _engine, "gateway": _gateway}


def main(argv: list[str]) -> int:
    """Run one role; 2 on bad usage."""
    if len(argv) != 2 or argv[0] not in _ROLES:
        print(
            f"usage: python -m cmq.lab.experiments.stockex.roles {{{','.join(_ROLES)}}} JSON", file=sys.stderr
        )
        return 2
    _ROLES[argv[0]](json.loads(argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
