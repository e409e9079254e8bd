"""The matching engine: a price-time priority limit order book, sans-IO.

Theory of operation
-------------------
:class:`OrderBook` holds resting limit orders of one instrument. Feed it
:class:`Order` and :class:`Cancel` commands with :meth:`OrderBook.handle`; it
returns the events they caused, in this order:

1. :class:`OrderConfirmed` for the command's order (what was filled at once,
   what rests), or :class:`Cancelled` for a cancel;
2. one :class:`Trade` per side of every fill, incoming side first, in the
   order the fills happened;
3. a :class:`Quote` when the top of the book (best bid and ask, and their
   sizes) changed.

Price-time priority: an incoming buy trades against the lowest ask first,
and at one price against the order that arrived first; a fill happens at the
resting order's price (the incoming order may get a better price than its
limit, never a worse one). Whatever is left of an incoming order rests at
its limit price, behind the orders already there.

Data structures: per side, a dict of price level -> FIFO of resting orders
(with the level's total size), and a heap of the level prices. Cancelling
marks the order dead and takes its size off the level at once (so quotes are
right); the dead entry leaves its FIFO when it reaches the front, and an
empty level leaves the heap when it reaches the top. Every command is
O(log levels + fills).

Prices are integer ticks and sizes integer lots, both 1 .. 65535, and order
ids 0 .. 2**32 - 1: what the compact wire form (:mod:`.codec`) carries.
Nothing here reads a clock or touches a socket.

Two ways in: :meth:`OrderBook.handle` takes and returns the event objects
above; :meth:`OrderBook.submit` and :meth:`OrderBook.top` are the same rules
on plain ints and tuples, for a matching engine that handles tens of
thousands of orders a second (an event object each was most of its cost).
"""

from __future__ import annotations

import enum
import heapq
from collections import deque
from dataclasses import dataclass
from typing import Final

from cmq._errors import ConfigError

__all__ = [
    "MAX_ID",
    "MAX_PRICE",
    "MAX_QTY",
    "Cancel",
    "Cancelled",
    "Command",
    "Event",
    "Order",
    "OrderBook",
    "OrderConfirmed",
    "Quote",
    "Side",
    "Trade",
]

MAX_PRICE: Final = 0xFFFF
MAX_QTY: Final = 0xFFFF
MAX_ID: Final = 0xFFFF_FFFF


class Side(enum.IntEnum):
    """Buy or sell (the values are the wire's message kinds)."""

    BUY = 1
    SELL = 2


@dataclass(frozen=True, slots=True, kw_only=True)
class Order:
    """A limit order: buy or sell ``qty`` lots at ``price`` ticks or better.

    Raises:
        ConfigError: on construction, for an id, price or size out of range.
    """

    id: int
    side: Side
    price: int
    qty: int

    def __post_init__(self) -> None:
        _check_order(self.id, self.price, self.qty)


@dataclass(frozen=True, slots=True, kw_only=True)
class Cancel:
    """Cancel what rests of order ``id``."""

    id: int


Command = Order | Cancel


@dataclass(frozen=True, slots=True, kw_only=True)
class OrderConfirmed:
    """Order ``id`` was accepted: ``filled`` lots traded at once, ``resting`` rest."""

    id: int
    filled: int
    resting: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Cancelled:
    """A cancel of order ``id`` took ``qty`` lots off the book (0: nothing rested)."""

    id: int
    qty: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Trade:
    """One side of a fill: order ``id`` traded ``qty`` lots at ``price``."""

    id: int
    price: int
    qty: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Quote:
    """The top of the book: best bid and ask with their sizes (0 0 for an empty side)."""

    bid: int
    bid_qty: int
    ask: int
    ask_qty: int


Event = OrderConfirmed | Cancelled | Trade | Quote


class _Resting:
    __slots__ = ("id", "price", "qty", "side")

    def __init__(self, id: int, side: Side, price: int, qty: int) -> None:
        self.id = id
        self.side = side
        self.price = price
        self.qty = qty  # 0 once filled or cancelled (dead)


class _BookSide:
    """One side's levels: price -> FIFO and total size, and a heap of prices."""

    def __init__(self, side: Side) -> None:
        self.side = side
        # Bids want the highest price first: their heap holds negated prices.
        self.sign = -1 if side is Side.BUY else 1
        self.levels: dict[int, deque[_Resting]] = {}
        self.sizes: dict[int, int] = {}
        self.heap: list[int] = []

    def best(self) -> int | None:
        heap, sizes = self.heap, self.sizes
        while heap:
            price = heap[0] * self.sign
            if sizes.get(price, 0) > 0:
                return price
            # An emptied level leaves the heap when it reaches the top.
            heapq.heappop(heap)
            self.levels.pop(price, None)
            sizes.pop(price, None)
        return None

    def add(self, order: _Resting) -> None:
        level = self.levels.get(order.price)
        if level is None or self.sizes.get(order.price, 0) == 0:
            if level is None:
                level = self.levels[order.price] = deque()
                heapq.heappush(self.heap, order.price * self.sign)
            self.sizes[order.price] = 0
        level.append(order)
        self.sizes[order.price] += order.qty

    def top(self) -> tuple[int, int]:
        price = self.best()
        return (0, 0) if price is None else (price, self.sizes[price])


def _check_order(order_id: int, price: int, qty: int) -> None:
    if not 0 <= order_id <= MAX_ID:
        raise ConfigError(f"order id {order_id} out of range 0..{MAX_ID}")
    if not 1 <= price <= MAX_PRICE:
        raise ConfigError(f"order price {price} out of range 1..{MAX_PRICE}")
    if not 1 <= qty <= MAX_QTY:
        raise ConfigError(f"order size {qty} out of range 1..{MAX_QTY}")


class OrderBook:
    """A price-time priority limit order book for one instrument (see the module)."""

    def __init__(self) -> None:
        self._bids = _BookSide(Side.BUY)
        self._asks = _BookSide(Side.SELL)
        self._sides = {Side.BUY: self._bids, Side.SELL: self._asks}
        self._live: dict[int, _Resting] = {}

    @property
    def quote(self) -> Quote:
        """The current top of the book."""
        bid, bid_qty, ask, ask_qty = self.top()
        return Quote(bid=bid, bid_qty=bid_qty, ask=ask, ask_qty=ask_qty)

    def resting(self, order_id: int) -> int:
        """Lots of order ``order_id`` resting on the book (0 if none)."""
        r = self._live.get(order_id)
        return 0 if r is None else r.qty

    def depth(self, side: Side) -> list[tuple[int, int]]:
        """``(price, total size)`` of every level of ``side``, best first."""
        s = self._sides[side]
        levels = [(p, q) for p, q in s.sizes.items() if q > 0]
        return sorted(levels, key=lambda pq: pq[0] * s.sign)

    def handle(self, command: Command) -> list[Event]:
        """Apply one command; return the events it caused (module docstring).

        Raises:
            ConfigError: an order whose id rests on the book already.
        """
        before = self.top()
        if isinstance(command, Cancel):
            events: list[Event] = [self._cancel(command.id)]
        else:
            fills: list[tuple[int, int, int]] = []
            left = self.submit(command.id, command.side, command.price, command.qty, fills)
            events = [OrderConfirmed(id=command.id, filled=command.qty - left, resting=left)]
            events += [Trade(id=i, price=p, qty=q) for i, p, q in fills]
        if self.top() != before:
            events.append(self.quote)
        return events

    def top(self) -> tuple[int, int, int, int]:
        """The top of the book as ``(bid, bid_qty, ask, ask_qty)`` (0 0 for an empty side)."""
        bids, asks = self._bids, self._asks
        bid = bids.best()
        ask = asks.best()
        return (
            0 if bid is None else bid,
            0 if bid is None else bids.sizes[bid],
            0 if ask is None else ask,
            0 if ask is None else asks.sizes[ask],
        )

    def _cancel(self, order_id: int) -> Cancelled:
        r = self._live.pop(order_id, None)
        if r is None:
            return Cancelled(id=order_id, qty=0)
        qty, r.qty = r.qty, 0
        self._sides[r.side].sizes[r.price] -= qty
        return Cancelled(id=order_id, qty=qty)

    def submit(
        self, order_id: int, side: Side, price: int, qty: int, fills: list[tuple[int, int, int]]
    ) -> int:
        """Match one limit order; return the lots of it that now rest on the book.

        Appends ``(order id, price, qty)`` to ``fills`` for each side of each
        fill, incoming side first (the :class:`Trade` events, as tuples). The
        caller asks :meth:`top` whether the quote changed.

        Raises:
            ConfigError: an id, price or size out of range, or an order whose
                id rests on the book already.
        """
        if not (1 <= price <= MAX_PRICE and 1 <= qty <= MAX_QTY and 0 <= order_id <= MAX_ID):
            _check_order(order_id, price, qty)
        live = self._live
        if order_id in live:
            raise ConfigError(f"order id {order_id} rests on the book already")
        buy = side is Side.BUY
        other = self._asks if buy else self._bids
        # Crossing: a buy takes asks at or below its limit, a sell bids at or above.
        left = qty
        while left:
            best = other.best()
            if best is None or (best > price if buy else best < price):
                break
            level = other.levels[best]
            sizes = other.sizes
            while left and level:
                head = level[0]
                if head.qty == 0:  # cancelled earlier: leaves when it reaches the front
                    level.popleft()
                    continue
                q = left if left < head.qty else head.qty
                left -= q
                head.qty -= q
                sizes[best] -= q
                fills.append((order_id, best, q))
                fills.append((head.id, best, q))
                if head.qty == 0:
                    level.popleft()
                    del live[head.id]
        if left:
            r = _Resting(order_id, side, price, left)
            (self._bids if buy else self._asks).add(r)
            live[order_id] = r
        return left
