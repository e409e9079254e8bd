"""The stock exchange's compact wire form: 5 to 9 bytes a message.

The AMQP paper's simulation averaged about 9 bytes a message; this form
keeps every message at or under that. Big-endian, first byte the kind:

====  ==========================  ======  =====================================
kind  message                     bytes   layout after the kind byte
====  ==========================  ======  =====================================
1, 2  :class:`Order` buy / sell    9      id u32, price u16, qty u16
3     :class:`Cancel`              5      id u32
4     :class:`OrderConfirmed`      9      id u32, filled u16, resting u16
5     :class:`Trade`               9      id u32, price u16, qty u16
6     :class:`Quote`               9      bid u16, bid_qty u16, ask u16, ask_qty u16
7     :class:`Cancelled`           7      id u32, qty u16
====  ==========================  ======  =====================================

Sizes above 65535 lots on one level are sent as 65535 (a quote is market
data, not an account). :func:`decode` raises :class:`~cmq.ProtocolError` for
anything else, and nothing else.
"""

from __future__ import annotations

import struct
from typing import Final

from cmq._errors import ConfigError, ProtocolError
from cmq.lab.experiments.stockex.book import (
    MAX_QTY,
    Cancel,
    Cancelled,
    Command,
    Event,
    Order,
    OrderConfirmed,
    Quote,
    Side,
    Trade,
)

__all__ = ["IHH", "IHH_SIZE", "KIND_CANCEL", "KIND_CANCELLED", "KIND_CONFIRM", "KIND_QUOTE",
           "KIND_TRADE", "QUOTE", "decode", "encode"]  # fmt: skip

KIND_CANCEL: Final = 3
KIND_CONFIRM: Final = 4
KIND_TRADE: Final = 5
KIND_QUOTE: Final = 6
KIND_CANCELLED: Final = 7

#: Kind, id u32, u16, u16: orders, confirmations and trades (for code that
#: packs them without an event object each).
IHH: Final = struct.Struct(">BIHH")
IHH_SIZE: Final = IHH.size
#: Kind, bid, bid size, ask, ask size: quotes.
QUOTE: Final = struct.Struct(">BHHHH")
_IHH: Final = IHH
_HHHH: Final = QUOTE
_I: Final = struct.Struct(">BI")
_IH: Final = struct.Struct(">BIH")


def _cap(q: int) -> int:
    return q if q <= MAX_QTY else MAX_QTY


def encode(message: Command | Event) -> bytes:
    """The compact bytes of one message.

    Raises:
        ConfigError: a field does not fit its width (an id over 2**32 - 1, a
            negative number).
    """
    try:
        if isinstance(message, Order):
            return _IHH.pack(int(message.side), message.id, message.price, message.qty)
        if isinstance(message, OrderConfirmed):
            return _IHH.pack(KIND_CONFIRM, message.id, _cap(message.filled), _cap(message.resting))
        if isinstance(message, Trade):
            return _IHH.pack(KIND_TRADE, message.id, message.price, message.qty)
        if isinstance(message, Quote):
            return _HHHH.pack(
                KIND_QUOTE, message.bid, _cap(message.bid_qty), message.ask, _cap(message.ask_qty)
            )
        if isinstance(message, Cancel):
            return _I.pack(KIND_CANCEL, message.id)
        if isinstance(message, Cancelled):
            return _IH.pack(KIND_CANCELLED, message.id, _cap(message.qty))
    except struct.error as exc:
        raise ConfigError(f"{message!r} does not fit the compact form: {exc}") from exc
    raise ConfigError(f"cannot encode {type(message).__name__}")


def decode(data: bytes) -> Command | Event:
    """The message in ``data``.

    Raises:
        ProtocolError: an unknown kind, a wrong length, or an order whose
            fields are out of range.
    """
    if not data:
        raise ProtocolError("empty stock exchange message")
    kind = data[0]
    try:
        if kind in (Side.BUY, Side.SELL):
            _, oid, price, qty = _IHH.unpack(data)
            return Order(id=oid, side=Side(kind), price=price, qty=qty)
        if kind == KIND_CONFIRM:
            _, oid, filled, resting = _IHH.unpack(data)
            return OrderConfirmed(id=oid, filled=filled, resting=resting)
        if kind == KIND_TRADE:
            _, oid, price, qty = _IHH.unpack(data)
            return Trade(id=oid, price=price, qty=qty)
        if kind == KIND_QUOTE:
            _, bid, bid_qty, ask, ask_qty = _HHHH.unpack(data)
            return Quote(bid=bid, bid_qty=bid_qty, ask=ask, ask_qty=ask_qty)
        if kind == KIND_CANCEL:
            _, oid = _I.unpack(data)
            return Cancel(id=oid)
        if kind == KIND_CANCELLED:
            _, oid, qty = _IH.unpack(data)
            return Cancelled(id=oid, qty=qty)
    except struct.error as exc:
        raise ProtocolError(f"stock exchange message of kind {kind}: {exc}") from exc
    except ConfigError as exc:
        raise ProtocolError(f"bad order: {exc}") from exc
    raise ProtocolError(f"unknown stock exchange message kind {kind}")
