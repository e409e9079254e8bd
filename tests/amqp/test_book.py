"""The matching engine by tables (price-time priority, partial fills, cancels) and properties."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cmq import ConfigError, ProtocolError
from cmq.lab.experiments.stockex.book import (
    Cancel,
    Cancelled,
    Command,
    Event,
    Order,
    OrderBook,
    OrderConfirmed,
    Quote,
    Side,
    Trade,
)
from cmq.lab.experiments.stockex.codec import decode, encode

B, S = Side.BUY, Side.SELL


def buy(id: int, price: int, qty: int) -> Order:
    return Order(id=id, side=B, price=price, qty=qty)


def sell(id: int, price: int, qty: int) -> Order:
    return Order(id=id, side=S, price=price, qty=qty)


def q(bid: int = 0, bid_qty: int = 0, ask: int = 0, ask_qty: int = 0) -> Quote:
    return Quote(bid=bid, bid_qty=bid_qty, ask=ask, ask_qty=ask_qty)


def conf(id: int, filled: int, resting: int) -> OrderConfirmed:
    return OrderConfirmed(id=id, filled=filled, resting=resting)


def trade(id: int, price: int, qty: int) -> Trade:
    return Trade(id=id, price=price, qty=qty)


# Each case: commands before, the command, the events it must cause.
CASES: list[tuple[str, list[Command], Command, list[Event]]] = [
    ("first order rests and quotes", [], buy(1, 100, 5), [conf(1, 0, 5), q(100, 5)]),
    ("no cross: both rest", [buy(1, 99, 5)], sell(2, 100, 3), [conf(2, 0, 3), q(99, 5, 100, 3)]),
    (
        "full fill at the resting price, not the incoming limit",
        [sell(1, 100, 5)],
        buy(2, 105, 5),
        [conf(2, 5, 0), trade(2, 100, 5), trade(1, 100, 5), q()],
    ),
    (
        "partial fill: the rest of the incoming order rests at its limit",
        [sell(1, 100, 3)],
        buy(2, 101, 5),
        [conf(2, 3, 2), trade(2, 100, 3), trade(1, 100, 3), q(101, 2)],
    ),
    (
        "partial fill of the resting order",
        [sell(1, 100, 10)],
        buy(2, 100, 4),
        [conf(2, 4, 0), trade(2, 100, 4), trade(1, 100, 4), q(0, 0, 100, 6)],
    ),
    (
        "price priority: the best price first, across levels",
        [sell(1, 102, 5), sell(2, 100, 5), sell(3, 101, 5)],
        buy(4, 102, 12),
        [
            conf(4, 12, 0),
            trade(4, 100, 5),
            trade(2, 100, 5),
            trade(4, 101, 5),
            trade(3, 101, 5),
            trade(4, 102, 2),
            trade(1, 102, 2),
            q(0, 0, 102, 3),
        ],
    ),
    (
        "time priority: at one price, the earliest first",
        [buy(1, 100, 2), buy(2, 100, 2), buy(3, 100, 2)],
        sell(4, 100, 3),
        [
            conf(4, 3, 0),
            trade(4, 100, 2),
            trade(1, 100, 2),
            trade(4, 100, 1),
            trade(2, 100, 1),
            q(100, 3),
        ],
    ),
    (
        "a limit stops the walk: no trade above a buy's limit",
        [sell(1, 100, 1), sell(2, 103, 5)],
        buy(3, 101, 4),
        [conf(3, 1, 3), trade(3, 100, 1), trade(1, 100, 1), q(101, 3, 103, 5)],
    ),
    (
        "cancel takes the rest off and requotes",
        [buy(1, 100, 5), buy(2, 99, 1)],
        Cancel(id=1),
        [Cancelled(id=1, qty=5), q(99, 1)],
    ),
    (
        "cancel of an unknown order is a no-op",
        [buy(1, 100, 5)],
        Cancel(id=9),
        [Cancelled(id=9, qty=0)],
    ),
    (
        "a cancelled order is skipped by matching (time priority goes to the next)",
        [sell(1, 100, 5), sell(2, 100, 5), Cancel(id=1)],
        buy(3, 100, 5),
        [conf(3, 5, 0), trade(3, 100, 5), trade(2, 100, 5), q()],
    ),
    (
        "cancel after a partial fill removes only what rests",
        [sell(1, 100, 5), buy(2, 100, 2)],
        Cancel(id=1),
        [Cancelled(id=1, qty=3), q()],
    ),
    (
        "a level emptied by cancels can be used again, at the back of the line",
        [buy(1, 100, 5), Cancel(id=1), buy(2, 100, 1), buy(3, 100, 1)],
        sell(4, 100, 1),
        [conf(4, 1, 0), trade(4, 100, 1), trade(2, 100, 1), q(100, 1)],
    ),
    ("same top, no quote", [buy(1, 100, 5)], buy(2, 99, 5), [conf(2, 0, 5)]),
]


@pytest.mark.parametrize(("before", "command", "events"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])  # fmt: skip
def test_book_table(before: list[Command], command: Command, events: list[Event]) -> None:
    book = OrderBook()
    for c in before:
        book.handle(c)
    assert book.handle(command) == events


def test_resting_id_twice_is_refused_and_changes_nothing() -> None:
    book = OrderBook()
    book.handle(buy(1, 100, 5))
    with pytest.raises(ConfigError):
        book.handle(sell(1, 90, 5))
    assert book.depth(B) == [(100, 5)] and book.depth(S) == []


@pytest.mark.parametrize(
    "bad", [dict(price=0), dict(qty=0), dict(qty=70000), dict(id=-1), dict(id=2**32)]
)
def test_order_fields_are_validated(bad: dict[str, int]) -> None:
    with pytest.raises(ConfigError):
        Order(**{"id": 1, "side": B, "price": 100, "qty": 1, **bad})  # type: ignore[arg-type]


# -- codec -------------------------------------------------------------------------

MESSAGES: list[tuple[Command | Event, int]] = [
    (buy(7, 1000, 25), 9),
    (sell(2**32 - 1, 65535, 65535), 9),
    (Cancel(id=7), 5),
    (conf(7, 20, 5), 9),
    (trade(7, 999, 20), 9),
    (q(999, 3, 1001, 80), 9),
    (Cancelled(id=7, qty=5), 7),
]


@pytest.mark.parametrize(("message", "size"), MESSAGES, ids=lambda v: type(v).__name__)
def test_codec_round_trip_and_size(message: Command | Event, size: int) -> None:
    data = encode(message)
    assert len(data) == size
    assert decode(data) == message


def test_codec_caps_market_data_sizes() -> None:
    assert decode(encode(q(1, 100_000, 2, 1))) == q(1, 65535, 2, 1)


@given(st.binary(max_size=12))
@settings(max_examples=300, deadline=None)
def test_decode_parses_or_raises_protocol_error(data: bytes) -> None:
    try:
        message = decode(data)
    except ProtocolError:
        return
    assert encode(message) == data


# -- properties ----------------------------------------------------------------------

commands = st.lists(
    st.one_of(
        st.tuples(st.sampled_from([B, S]), st.integers(95, 105), st.integers(1, 20)),
        st.tuples(st.just("cancel"), st.integers(0, 60), st.just(0)),
    ),
    max_size=60,
)


@given(commands)
@settings(max_examples=150, deadline=None)
def test_book_invariants(script: list[tuple[object, int, int]]) -> None:
    """Never crossed; fills balance; every order's lots are filled, resting or cancelled;
    the last quote is the top of the depth."""
    book = OrderBook()
    placed: dict[int, int] = {}
    filled: dict[int, int] = {}
    cancelled: dict[int, int] = {}
    quote = q()
    for n, (kind, a, b) in enumerate(script):
        if kind == "cancel":
            events = book.handle(Cancel(id=a))
        else:
            assert isinstance(kind, Side)
            events = book.handle(Order(id=n, side=kind, price=a, qty=b))
            placed[n] = b
        trades = [e for e in events if isinstance(e, Trade)]
        # Both sides of every fill: pairs of equal price and size, the incoming side first.
        assert len(trades) % 2 == 0
        for t_in, t_rest in zip(trades[::2], trades[1::2], strict=True):
            assert (t_in.price, t_in.qty) == (t_rest.price, t_rest.qty)
            assert t_in.id == n and t_rest.id != n
        for t in trades:
            filled[t.id] = filled.get(t.id, 0) + t.qty
        for e in events:
            if isinstance(e, Cancelled):
                cancelled[e.id] = cancelled.get(e.id, 0) + e.qty
            if isinstance(e, Quote):
                quote = e
        bids, asks = book.depth(B), book.depth(S)
        if bids and asks:
            assert bids[0][0] < asks[0][0], "the book is crossed"
        top = q(*(bids[0] if bids else (0, 0)), *(asks[0] if asks else (0, 0)))
        assert quote == top == book.quote
    for oid, qty in placed.items():
        assert filled.get(oid, 0) + book.resting(oid) + cancelled.get(oid, 0) == qty
    assert sum(book.resting(o) for o in placed) == sum(v for _, v in book.depth(B) + book.depth(S))


class _Collect:
    """A stand-in for the broker client: what the engine publishes, by key."""

    def __init__(self) -> None:
        self.out: dict[str, list[bytes]] = {"conf": [], "trade": [], "quote": []}

    def publish_batch(self, exchange: str, key: str, bodies: list[bytes]) -> None:
        self.out[key].extend(bodies)


@settings(max_examples=100, deadline=None)
@given(
    orders=st.lists(
        st.tuples(st.sampled_from([B, S]), st.integers(95, 105), st.integers(1, 20)), max_size=40
    ),
    split=st.integers(1, 40),
)
def test_the_engines_batch_path_publishes_what_the_event_path_says(
    orders: list[tuple[Side, int, int]], split: int
) -> None:
    """The engine's tuple-and-struct path (any batch split) equals handle() + encode()."""
    from cmq.lab.experiments.stockex.roles import _match, _Reporter

    bodies = [encode(Order(id=i, side=side, price=p, qty=n)) for i, (side, p, n) in enumerate(orders)]
    bodies.append(b"\x09junk")  # counted bad, nothing published
    want: dict[str, list[bytes]] = {"conf": [], "trade": [], "quote": []}
    ref = OrderBook()
    for b in bodies[:-1]:
        for e in ref.handle(decode(b)):  # type: ignore[arg-type]
            key = {OrderConfirmed: "conf", Trade: "trade", Quote: "quote"}[type(e)]
            want[key].append(encode(e))
    book, client = OrderBook(), _Collect()
    rep = _Reporter(None, None, "engine", 1.0)
    totals = {"orders": 0, "events": 0, "bytes_in": 0, "bytes_out": 0, "bad": 0}
    for i in range(0, len(bodies), split):
        _match(book, bodies[i : i + split], "x", client, rep, totals)
    assert client.out == want
    assert totals["orders"] == len(bodies) and totals["bad"] == 1
    assert totals["events"] == sum(len(v) for v in want.values())
