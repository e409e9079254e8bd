"""AMQP 0-9-1 for the broker: one client connection as a sans-IO object.

Theory of operation
-------------------
:class:`AmqpConnection` is one TCP connection's protocol state, with no socket
and no clock: the driver feeds it the bytes it read (``receive_data(data,
now)``), writes what ``data_to_send()`` returns, calls ``handle_timer(now)``
at ``next_deadline()``, hands it the core's messages for its channels
(``deliver``) and closes the socket once ``finished`` is set and everything
is written. pamqp marshals and unmarshals the frames.

The connection is a front end of the same :class:`~cmq.routing.BrokerCore`
that cmq-protocol clients use: each AMQP channel is a core sender whose
address is ``(connection key, channel number)``, and every AMQP method is
done with ``BrokerCore.call`` (in-process, no reply message). The core's
deliveries for a channel come back through ``deliver`` and leave as
basic.deliver with per-channel delivery tags (the core's tags are
broker-wide; a table maps each channel tag to its consumer and core tag).
The connection is *held* in the core: its consumers and deliveries are never
timed out; when it ends, the core requeues what it held and deletes its
exclusive queues.

Handshake (table ``_EXPECT``): protocol header, then Start / StartOk (PLAIN or
AMQPLAIN, checked by :class:`Users`), Tune / TuneOk, Open / OpenOk. A bad
protocol header is answered with the header we speak, then the connection
closes (as RabbitMQ does). Errors follow the spec and RabbitMQ: a channel
exception (404, 403, 405, 406) closes that channel with Channel.Close; a
connection exception (501, 503, 504, 505, 530, 540, 541) sends
Connection.Close and ends the connection after Close-Ok (or a second).
Heartbeats: ours every half interval of silence; a peer silent for two
intervals is dropped (not while the driver has paused reading it: see
``pause``, the memory alarm's connection.blocked).

Transactions (tx.select): a channel keeps its publishes and settlements in
``_Channel.tx`` and does them at tx.commit, publishes first (RabbitMQ's
order); tx.rollback drops the publishes and gives the settled deliveries back.

Properties. A message's basic properties are kept by the core as a map of
plain values (``timestamp`` as integer seconds), so that cmq-protocol
consumers get them too (``Delivery.properties``); an AMQP consumer gets them
back as they came. A body from a cmq publisher is delivered as bytes: bytes
as they are, text as UTF-8, anything else MessagePack-packed.
"""

from __future__ import annotations

import datetime
import secrets
import struct
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Final

import msgpack

from cmq._extras import optional_imports
from cmq.routing._core import (
    MAX_NAME,
    BrokerCore,
    ChannelPrefetch,
    ExchangeBind,
    ExchangeUnbind,
    ExclusiveConsume,
    PriorityConsume,
    Refused,
    server_queue_name,
)
from cmq.routing._protocol import (
    BODY_EXT,
    Ack,
    Bind,
    Cancel,
    Consume,
    DeclareExchange,
    DeclareQueue,
    DeleteExchange,
    DeleteQueue,
    ErrorCode,
    Get,
    Nack,
    Publish,
    PurgeQueue,
    Unbind,
)
from cmq.routing._users import Permissions, Users

with optional_imports("the AMQP listener"):
    from pamqp import commands as spec
    from pamqp import decode as pdecode
    from pamqp import frame as pframe
    from pamqp.exceptions import PAMQPException
    from pamqp.header import ContentHeader
    from pamqp.heartbeat import Heartbeat

__all__ = ["PROTOCOL_HEADER", "AmqpConnection", "Users"]

PROTOCOL_HEADER: Final = b"AMQP\x00\x00\x09\x01"
# RabbitMQ's defaults: the largest frame and channel number it offers, and
# the heartbeat interval it proposes (seconds).
FRAME_MAX: Final = 131072
CHANNEL_MAX: Final = 2047
HEARTBEAT: Final = 60
#: The least frame_max a peer may ask for (the spec's frame-min-size).
FRAME_MIN: Final = 4096
#: Seconds from accept to Connection.Open before the connection is dropped (RabbitMQ: 10).
HANDSHAKE_TIMEOUT: Final = 10.0
#: Seconds to wait for Close-Ok after we closed the connection.
CLOSE_TIMEOUT: Final = 1.0
#: A queue declared over AMQP without x-max-length holds this many ready
#: messages at most (RabbitMQ's queues are unbounded; the core's are bounded).
DEFAULT_AMQP_MAX_LENGTH: Final = 2**31 - 1

# Reply codes (AMQP 0-9-1 constants).
REPLY_SUCCESS: Final = 200
NO_ROUTE: Final = 312
ACCESS_REFUSED: Final = 403
NOT_FOUND: Final = 404
RESOURCE_LOCKED: Final = 405
PRECONDITION_FAILED: Final = 406
FRAME_ERROR: Final = 501
SYNTAX_ERROR: Final = 502
COMMAND_INVALID: Final = 503
CHANNEL_ERROR: Final = 504
UNEXPECTED_FRAME: Final = 505
NOT_ALLOWED: Final = 530
NOT_IMPLEMENTED: Final = 540
INTERNAL_ERROR: Final = 541

_TEXT: Final = {
    ACCESS_REFUSED: "ACCESS_REFUSED", NOT_FOUND: "NOT_FOUND", RESOURCE_LOCKED: "RESOURCE_LOCKED",
    PRECONDITION_FAILED: "PRECONDITION_FAILED", FRAME_ERROR: "FRAME_ERROR", SYNTAX_ERROR: "SYNTAX_ERROR",
    COMMAND_INVALID: "COMMAND_INVALID", CHANNEL_ERROR: "CHANNEL_ERROR", UNEXPECTED_FRAME: "UNEXPECTED_FRAME",
    NOT_ALLOWED: "NOT_ALLOWED", NOT_IMPLEMENTED: "NOT_IMPLEMENTED", INTERNAL_ERROR: "INTERNAL_ERROR",
}  # fmt: skip

#: The core's refusal codes as AMQP reply codes (True: a connection exception).
_CODE_OF: Final[dict[str, tuple[int, bool]]] = {
    ErrorCode.NOT_FOUND: (NOT_FOUND, False),
    ErrorCode.PRECONDITION_FAILED: (PRECONDITION_FAILED, False),
    ErrorCode.ACCESS_REFUSED: (ACCESS_REFUSED, False),
    ErrorCode.RESOURCE_LOCKED: (RESOURCE_LOCKED, False),
    ErrorCode.BAD_REQUEST: (PRECONDITION_FAILED, False),
    ErrorCode.QUEUE_FULL: (PRECONDITION_FAILED, False),
    ErrorCode.IN_USE: (NOT_ALLOWED, True),
    ErrorCode.INTERNAL_ERROR: (INTERNAL_ERROR, True),
}

_FRAME_HEAD = struct.Struct(">BHI")
_FRAME_END: Final = 0xCE
_METHOD, _HEADER, _BODY, _HEARTBEAT = 1, 2, 3, 8
_EXCHANGE_TYPES: Final = ("direct", "fanout", "topic", "headers")
_PROPERTY_NAMES: Final = tuple(spec.Basic.Properties.attributes())
_pack = msgpack.Packer(use_bin_type=True).pack


def _no_validation(self: Any) -> None:
    pass


def _lenient(cls: type[Any]) -> type[Any]:
    """``cls`` without pamqp's name check on construction and marshalling.

    pamqp refuses to marshal an exchange or queue name outside
    ``[a-zA-Z0-9-_.:@#,/+ ]`` (or an exchange name over 127 characters),
    which AMQP 0-9-1 allows and RabbitMQ accepts; names reach these frames
    from clients (any UTF-8 up to 255 bytes, already checked by the core).
    """
    sub = type(cls.__name__, (cls,), {"__slots__": (), "validate": _no_validation})
    sub.__slots__ = cls.__slots__  # type: ignore[attr-defined]  # what pamqp marshals
    return sub


_DeclareOk = _lenient(spec.Queue.DeclareOk)
_GetOk = _lenient(spec.Basic.GetOk)
_Return = _lenient(spec.Basic.Return)
_ConsumeOk = _lenient(spec.Basic.ConsumeOk)
_CancelOk = _lenient(spec.Basic.CancelOk)
_Cancel = _lenient(spec.Basic.Cancel)


class _ConnectionError(Exception):
    def __init__(self, code: int, text: str, method: Any = None) -> None:
        super().__init__(text)
        self.code, self.text, self.method = code, text, method


class _ChannelError(Exception):
    def __init__(self, code: int, text: str, method: Any = None) -> None:
        super().__init__(text)
        self.code, self.text, self.method = code, text, method


# -- login ----------------------------------------------------------------------


def _credentials(mechanism: str, response: Any) -> tuple[str, str] | None:
    """(user, password) from a StartOk response (PLAIN or AMQPLAIN), or None."""
    raw = response.encode("utf-8", "surrogateescape") if isinstance(response, str) else bytes(response or b"")
    if mechanism == "PLAIN":
        parts = raw.split(b"\x00")
        if len(parts) != 3:
            return None
        return parts[1].decode("utf-8", "replace"), parts[2].decode("utf-8", "replace")
    if mechanism == "AMQPLAIN":
        try:
            # A field table without its length prefix (RabbitMQ's reading).
            _, table = pdecode.field_table(struct.pack(">I", len(raw)) + raw)
        except Exception:  # noqa: BLE001 - any garbage: not credentials
            return None
        user, password = table.get("LOGIN"), table.get("PASSWORD")
        if isinstance(user, bytes):
            user = user.decode("utf-8", "replace")
        if isinstance(password, bytes):
            password = password.decode("utf-8", "replace")
        if not isinstance(user, str) or not isinstance(password, str):
            return None
        return user, password
    return None


# -- properties and bodies ---------------------------------------------------------


def _plain(v: Any, depth: int = 0) -> Any:
    """A header value as a MessagePack-able value (timestamps as integer seconds, decimals as text)."""
    if depth > 32:
        return None
    if isinstance(v, datetime.datetime):
        return int(v.replace(tzinfo=v.tzinfo or datetime.UTC).timestamp())
    if isinstance(v, Decimal):
        return str(v)
    if isinstance(v, dict):
        return {str(k): _plain(x, depth + 1) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_plain(x, depth + 1) for x in v]
    if isinstance(v, bytearray | memoryview):
        return bytes(v)
    return v


def props_to_plain(p: spec.Basic.Properties | None) -> dict[str, Any] | None:
    """The properties a publisher sent as the core keeps them (None: none set)."""
    if p is None:
        return None
    out: dict[str, Any] = {}
    for name in _PROPERTY_NAMES:
        v = getattr(p, name, None)
        if v is None or (name == "cluster_id" and not v):
            continue
        out[name] = _plain(v)
    return out or None


def props_from_plain(d: Any) -> spec.Basic.Properties:
    """Basic properties from the core's map (unknown or ill-typed entries left out)."""
    p = spec.Basic.Properties()
    if type(d) is not dict:
        return p
    for name, v in d.items():
        if name not in _PROPERTY_NAMES or name == "cluster_id" or v is None:
            continue
        if name == "timestamp":
            if type(v) is int:
                try:
                    p.timestamp = datetime.datetime.fromtimestamp(v, tz=datetime.UTC)
                except (OverflowError, OSError, ValueError):
                    pass
        elif name in ("delivery_mode", "priority"):
            if type(v) is int and 0 <= v <= 255:
                setattr(p, name, v)
        elif name == "headers":
            if type(v) is dict:
                p.headers = _wire_headers(v)
        elif type(v) is str:
            setattr(p, name, v)
    return p


_SKIP: Final = object()


def _wire_value(v: Any, depth: int = 0) -> Any:
    """A header value as pamqp can marshal it (bytes as a byte array), or
    ``_SKIP`` for one it cannot (a cmq publisher may send any MessagePack value)."""
    if v is None or type(v) in (bool, int, float, str, datetime.datetime, Decimal, bytearray):
        return v
    if type(v) is bytes:
        return bytearray(v)
    if depth < 32 and type(v) is dict:
        out = {}
        for k, x in v.items():
            x = _wire_value(x, depth + 1)
            if x is not _SKIP and type(k) is str:
                out[k] = x
        return out
    if depth < 32 and type(v) is list:
        return [x for x in (_wire_value(x, depth + 1) for x in v) if x is not _SKIP]
    return _SKIP


def _wire_headers(headers: dict[str, Any]) -> dict[str, Any]:
    """``headers`` as an AMQP consumer gets them: what pamqp can marshal, and
    each ``x-death`` record's ``time`` a timestamp (as RabbitMQ sends it; the
    core keeps integer seconds)."""
    out: dict[str, Any] = _wire_value(headers)
    records = out.get("x-death")
    if type(records) is list:
        for r in records:
            t = r.get("time") if type(r) is dict else None
            if type(t) is int:
                try:
                    r["time"] = datetime.datetime.fromtimestamp(t, tz=datetime.UTC)
                except (OverflowError, OSError, ValueError):
                    pass
    return out


def body_bytes(body: Any) -> bytes:
    """A body as an AMQP consumer gets it."""
    if type(body) is bytes:
        return body
    if type(body) is str:
        return body.encode("utf-8", "surrogatepass")
    if type(body) is msgpack.ExtType and body.code == BODY_EXT:
        return bytes(body.data)  # a packed container, as its publisher packed it
    try:
        return bytes(_pack(body))
    except Exception:  # noqa: BLE001 - an odd value from a hand-made publisher
        return b""


def _expiration_ms(p: spec.Basic.Properties | None) -> int | None:
    """A message's ``expiration`` property as milliseconds (RabbitMQ: a non-negative integer string).

    Raises:
        _ChannelError: 406 when it is not one.
    """
    exp = getattr(p, "expiration", None) if p is not None else None
    if exp is None:
        return None
    if not (isinstance(exp, str) and exp.isascii() and exp.isdigit()):
        raise _ChannelError(PRECONDITION_FAILED, f"invalid expiration '{exp!s:.40}'")
    return int(exp)


# -- channels -------------------------------------------------------------------


@dataclass(slots=True)
class _Publishing:
    method: spec.Basic.Publish
    properties: spec.Basic.Properties | None = None
    size: int = -1  # body size from the content header; -1: header not yet seen
    parts: list[bytes] = field(default_factory=list)
    got: int = 0


@dataclass(slots=True)
class _Channel:
    number: int
    closing: bool = False  # we sent Channel.Close: waiting for Close-Ok
    confirm: bool = False
    published: int = 0  # publish sequence number (in confirm mode)
    prefetch: int = 0  # basic.qos prefetch_count for consumers started next
    shared_prefetch: int = 0  # basic.qos with global: the limit all its consumers share
    next_tag: int = 1  # next delivery tag on this channel
    # channel delivery tag -> (core consumer tag, core delivery tag); order: oldest first
    unacked: dict[int, tuple[str, int]] = field(default_factory=dict)
    consumers: dict[str, bool] = field(default_factory=dict)  # consumer tag -> no_ack
    # Core tags that may hold unacked messages without consuming: basic.get's
    # holders and cancelled consumers; released when the channel closes.
    getters: set[str] = field(default_factory=set)
    last_queue: str = ""  # the queue last declared on the channel (for empty names)
    publishing: _Publishing | None = None
    # tx.select'ed: what waits for tx.commit, in order: ("publish", method,
    # properties, body) and ("settle", {channel tag: (consumer tag, core tag)},
    # requeue, None for an ack). None: the channel is not transactional.
    tx: list[Any] | None = None


# -- the connection ------------------------------------------------------------------

_WAIT_HEADER, _WAIT_START_OK, _WAIT_TUNE_OK, _WAIT_OPEN, _OPEN, _CLOSING, _DONE = range(7)

#: What each handshake state accepts on channel 0 (anything else: 503, or 505 for content).
_EXPECT: Final[dict[int, type[Any]]] = {
    _WAIT_START_OK: spec.Connection.StartOk,
    _WAIT_TUNE_OK: spec.Connection.TuneOk,
    _WAIT_OPEN: spec.Connection.Open,
}


class AmqpConnection:
    """One AMQP 0-9-1 client connection in front of ``core`` (see the module's notes).

    ``key`` names the connection in the core (its channels are senders
    ``(key, channel)``); ``peer_host`` is checked by ``users``. Never raises
    for what it receives.
    """

    def __init__(self, core: BrokerCore, key: str, peer_host: str, users: Users, now: float) -> None:
        self.core = core
        self.key = key
        self.peer_host = peer_host
        self.users = users
        self.user: str | None = None
        # What the user may do in the vhost (see cmq.routing._users): None
        # while every name is allowed (nothing to check), and whether it may
        # open the vhost at all.
        self._perms: Permissions | None = None
        self._vhost_ok = False
        self.state = _WAIT_HEADER
        self.finished = False  # the driver closes the socket once what is queued is written
        self.close_reason = ""
        self.frame_max = FRAME_MAX
        self.channel_max = CHANNEL_MAX
        self.heartbeat = 0
        self._buf = bytearray()
        self._out: list[bytes] = []
        self._channels: dict[int, _Channel] = {}
        self._plain_headers: dict[tuple[int, int], bytes] = {}
        self._last_recv = self._last_send = now
        self._close_by = now + HANDSHAKE_TIMEOUT
        # Flow control (see pause): whether the client asked to hear of
        # connection.blocked, whether it was told, whether it ever published.
        self._wants_blocked = False
        self._told_blocked = False
        self.published = False
        self.paused = False
        core.hold(key)

    # -- driver interface ---------------------------------------------------------

    def receive_data(self, data: bytes, now: float) -> None:
        """Take bytes read from the socket (b"": the peer closed it)."""
        if self.finished:
            return
        if not data:
            self._finish(now, "peer closed the connection")
            return
        self._last_recv = now
        try:
            if self._buf or self.state == _WAIT_HEADER:
                self._buf += data
                self._parse(now)
            else:
                # Nothing held from before: frames are sliced from this read
                # itself, and only an unfinished frame's bytes are kept.
                offset = self._frames(data, now)
                if offset < len(data) and self.state != _DONE:
                    self._buf += memoryview(data)[offset:]
        except _ConnectionError as exc:
            self._close_connection(exc.code, exc.text, exc.method, now)
        except Exception as exc:  # noqa: BLE001 - a bug must cost this connection, never the broker
            self.core.note_internal_error(exc, (self.key, 0), "handling AMQP input")
            self._close_connection(INTERNAL_ERROR, "internal error", None, now)

    def deliver(self, channel: int, payload: Any, now: float) -> None:
        """A core message for ``channel``: ``["d", tag, runs]`` or ``["x", tag, code, text]``."""
        ch = self._channels.get(channel)
        if ch is None or self.state != _OPEN:
            return  # the channel went; the core was told (its consumers cancelled)
        try:
            if payload[0] == "d":
                self._deliver_runs(ch, payload[1], payload[2])
            elif payload[0] == "x" and payload[1] in ch.consumers:
                del ch.consumers[payload[1]]
                self._send_method(ch.number, _Cancel(consumer_tag=payload[1], nowait=True))
        except Exception as exc:  # noqa: BLE001 - see receive_data
            self.core.note_internal_error(exc, (self.key, channel), "delivering over AMQP")
            self._close_connection(INTERNAL_ERROR, "internal error", None, now)

    def data_to_send(self, now: float) -> bytes:
        """What to write to the socket now (b"": nothing)."""
        if not self._out:
            return b""
        out = b"".join(self._out)
        self._out.clear()
        self._last_send = now
        return out

    def next_deadline(self) -> float | None:
        if self.finished:
            return None
        if self.state in (_OPEN,) and self.heartbeat:
            if self.paused:  # its heartbeats wait unread in the socket: only ours are due
                return self._last_send + self.heartbeat / 2
            return min(self._last_send + self.heartbeat / 2, self._last_recv + 2 * self.heartbeat)
        if self.state == _OPEN:
            return None
        return self._close_by

    def handle_timer(self, now: float) -> None:
        if self.finished:
            return
        if self.state != _OPEN:
            if now >= self._close_by:
                self._finish(now, "handshake or close timed out")
            return
        if self.heartbeat:
            if now >= self._last_recv + 2 * self.heartbeat and not self.paused:
                self._finish(now, "missed heartbeats")
            elif now >= self._last_send + self.heartbeat / 2:
                self._emit(pframe.marshal(Heartbeat(), 0))

    def pause(self, reason: str, now: float) -> None:
        """The driver stops reading this connection's socket (the broker is
        over its memory budget and the connection publishes): the client is
        told with connection.blocked when it asked for it, and its silence is
        not held against it meanwhile (its heartbeats wait in the socket)."""
        self.paused = True
        if self._wants_blocked and not self._told_blocked and self.state == _OPEN:
            self._told_blocked = True
            self._send_method(0, spec.Connection.Blocked(reason=reason))

    def resume(self, now: float) -> None:
        """The driver reads this connection's socket again (connection.unblocked)."""
        self.paused = False
        self._last_recv = now
        if self._told_blocked and self.state == _OPEN:
            self._told_blocked = False
            self._send_method(0, spec.Connection.Unblocked())

    def connection_lost(self, now: float) -> None:
        """The socket broke or was closed: give back what the connection held."""
        self._finish(now, "connection lost")

    # -- framing -----------------------------------------------------------------

    def _emit(self, data: bytes) -> None:
        self._out.append(data)

    def _finish(self, now: float, reason: str) -> None:
        if self.finished:
            return
        self.finished = True
        self.close_reason = reason
        self.state = _DONE
        self._channels.clear()
        self.core.release(self.key, now)

    def _parse(self, now: float) -> None:
        buf = self._buf
        if self.state == _WAIT_HEADER:
            if len(buf) < 8:
                if bytes(buf) != PROTOCOL_HEADER[: len(buf)]:
                    self._bad_header(now)
                return
            if bytes(buf[:8]) != PROTOCOL_HEADER:
                self._bad_header(now)
                return
            del buf[:8]
            self.state = _WAIT_START_OK
            caps = {"publisher_confirms": True, "basic.nack": True, "consumer_cancel_notify": True,
                    "exchange_exchange_bindings": True, "per_consumer_qos": True,
                    "authentication_failure_close": True, "connection.blocked": True}  # fmt: skip
            props: dict[str, Any] = {"product": "cmq", "version": "0.1.0", "platform": "Python",
                     "information": "cmq's broker, AMQP 0-9-1 front end", "capabilities": caps}  # fmt: skip
            self._send_method(0, spec.Connection.Start(server_properties=props, mechanisms="PLAIN AMQPLAIN"))
        del buf[: self._frames(bytes(buf), now)]  # one copy; frames are sliced from it

    def _frames(self, data: bytes, now: float) -> int:
        """Handle the whole frames at the start of ``data``; return how many bytes they take."""
        offset = 0
        n = len(data)
        while self.state != _DONE and n - offset >= 7:
            ftype, channel, size = _FRAME_HEAD.unpack_from(data, offset)
            if ftype not in (_METHOD, _HEADER, _BODY, _HEARTBEAT):
                raise _ConnectionError(FRAME_ERROR, f"unknown frame type {ftype}")
            if size + 8 > self.frame_max:
                raise _ConnectionError(FRAME_ERROR, f"frame size {size + 8} > frame_max {self.frame_max}")
            end = offset + 7 + size
            if end + 1 > n:
                break
            if data[end] != _FRAME_END:
                raise _ConnectionError(FRAME_ERROR, "frame does not end with 0xCE")
            start = offset
            offset = end + 1
            if ftype == _BODY:
                self._content_body(channel, data[start + 7 : end], now)
            else:
                self._frame(ftype, channel, data[start:offset], now)
        return offset

    def _bad_header(self, now: float) -> None:
        # RabbitMQ's answer to a protocol header it does not speak: its own, then close.
        self._emit(PROTOCOL_HEADER)
        self._buf.clear()
        self._finish(now, "bad protocol header")

    def _frame(self, ftype: int, channel: int, raw: bytes, now: float) -> None:
        if ftype == _HEARTBEAT:
            if channel != 0:
                raise _ConnectionError(FRAME_ERROR, "heartbeat frame on a channel other than 0")
            return
        if ftype == _METHOD:
            head = raw[7:11]
            if head == _PUBLISH_ID:
                m = _quick_publish(raw)
                if m is not None:
                    self._method(channel, m, now)
                    return
            elif head == _ACK_ID and len(raw) == _ACK_FRAME_SIZE:
                # basic.ack, a consumer's every few messages: its two fields by hand.
                m = _bare(_Ack)
                m.delivery_tag, bits = _ACK_TAIL.unpack_from(raw, 11)
                m.multiple = bool(bits & 1)
                self._method(channel, m, now)
                return
        elif len(raw) == 22 and raw[7:9] == _BASIC_CLASS and raw[19:21] == b"\x00\x00":
            # A content header with no properties (what most publishers send).
            self._content_header(channel, None, _U64.unpack_from(raw, 11)[0], now)
            return
        try:
            _, _, value = pframe.unmarshal(raw)
        except (PAMQPException, ValueError, struct.error, UnicodeDecodeError, KeyError) as exc:
            if ftype == _METHOD and len(raw) >= 12:
                raise _ConnectionError(SYNTAX_ERROR, f"malformed method frame: {str(exc)[:80]}") from None
            raise _ConnectionError(FRAME_ERROR, f"malformed frame: {str(exc)[:80]}") from None
        if ftype == _HEADER:
            if not isinstance(value, ContentHeader):
                raise _ConnectionError(FRAME_ERROR, "malformed content header frame")
            self._content_header(channel, value.properties, value.body_size, now)
            return
        self._method(channel, value, now)

    # -- outgoing -----------------------------------------------------------------

    def _send_method(self, channel: int, method: Any) -> None:
        self._emit(pframe.marshal(method, channel))

    def _send_content(self, channel: int, method: Any, props: spec.Basic.Properties | None, body: bytes) -> None:
        if props is None:
            # No properties: the header frame depends on channel and size only (cached).
            key = (channel, len(body))
            head = self._plain_headers.get(key)
            if head is None:
                if len(self._plain_headers) >= 256:
                    self._plain_headers.clear()
                head = self._plain_headers[key] = pframe.marshal(
                    ContentHeader(0, len(body), spec.Basic.Properties()), channel)
        else:
            head = pframe.marshal(ContentHeader(0, len(body), props), channel)
        out = [method if type(method) is bytes else pframe.marshal(method, channel), head]
        step = self.frame_max - 8
        for i in range(0, len(body), step):
            chunk = body[i : i + step]  # the body itself when it fits one frame
            out += (_FRAME_HEAD.pack(_BODY, channel, len(chunk)), chunk, b"\xce")  # pamqp's body frame, by hand
        self._emit(b"".join(out))

    def _close_connection(self, code: int, text: str, method: Any, now: float) -> None:
        if self.state in (_CLOSING, _DONE):
            self._finish(now, text)
            return
        if self.state == _WAIT_START_OK or self.state == _WAIT_HEADER:
            self._finish(now, text)
            return
        close = spec.Connection.Close(reply_code=code, reply_text=_reply_text(code, text),
                                      class_id=_class_id(method), method_id=_method_id(method))  # fmt: skip
        self._send_method(0, close)
        self.state = _CLOSING
        self._close_by = now + CLOSE_TIMEOUT
        self.close_reason = f"{code} {text}"
        # What the connection held goes back now; only Close-Ok is awaited.
        self._channels.clear()
        self.core.release(self.key, now)

    def _close_channel(self, ch: _Channel, code: int, text: str, method: Any, now: float) -> None:
        self._release_channel(ch, now)
        ch.closing = True
        close = spec.Channel.Close(reply_code=code, reply_text=_reply_text(code, text),
                                   class_id=_class_id(method), method_id=_method_id(method))  # fmt: skip
        self._send_method(ch.number, close)

    def _release_channel(self, ch: _Channel, now: float) -> None:
        """Cancel the channel's consumers and give back what it holds (to be redelivered)."""
        addr = (self.key, ch.number)
        for tag in list(ch.consumers) + list(ch.getters):
            self.core.call(Cancel(rid=0, tag=tag), addr, now)
        if ch.shared_prefetch:
            self.core.call(ChannelPrefetch(rid=0, prefetch=0), addr, now)
            ch.shared_prefetch = 0
        ch.consumers.clear()
        ch.getters.clear()
        ch.unacked.clear()
        ch.publishing = None

    # -- methods ---------------------------------------------------------------------

    def _method(self, channel: int, m: Any, now: float) -> None:
        if self.state == _CLOSING:
            if isinstance(m, spec.Connection.CloseOk | spec.Connection.Close):
                if isinstance(m, spec.Connection.Close):
                    self._send_method(0, spec.Connection.CloseOk())
                self._finish(now, self.close_reason or "closed")
            return
        expected = _EXPECT.get(self.state)
        if expected is not None:
            if channel != 0 or not isinstance(m, expected):
                raise _ConnectionError(COMMAND_INVALID, f"expected {expected.name}, got {m.name}", m)
            self._handshake(m, now)
            return
        if channel == 0:
            if isinstance(m, spec.Connection.Close):
                self._send_method(0, spec.Connection.CloseOk())
                self._finish(now, "closed by the client")
                return
            if isinstance(m, spec.Connection.CloseOk):
                self._finish(now, "closed")
                return
            raise _ConnectionError(COMMAND_INVALID, f"{m.name} on channel 0", m)
        if channel > self.channel_max:
            raise _ConnectionError(CHANNEL_ERROR, f"channel {channel} > channel_max {self.channel_max}", m)
        ch = self._channels.get(channel)
        if isinstance(m, spec.Channel.Open):
            if ch is not None:
                raise _ConnectionError(CHANNEL_ERROR, f"second 'channel.open' seen on channel {channel}", m)
            self._channels[channel] = _Channel(channel)
            self._send_method(channel, spec.Channel.OpenOk())
            return
        if ch is None:
            raise _ConnectionError(CHANNEL_ERROR, f"expected 'channel.open' on channel {channel}", m)
        if ch.closing:
            # After our Channel.Close only Close-Ok (or the peer's Close) counts.
            if isinstance(m, spec.Channel.CloseOk | spec.Channel.Close):
                if isinstance(m, spec.Channel.Close):
                    self._send_method(channel, spec.Channel.CloseOk())
                del self._channels[channel]
            return
        if ch.publishing is not None:
            raise _ConnectionError(UNEXPECTED_FRAME, f"expected content header for class 60, got {m.name}", m)
        handler = _METHODS.get(type(m))
        if handler is None:
            raise _ConnectionError(COMMAND_INVALID if type(m) in _SERVER_ONLY else NOT_IMPLEMENTED,
                                   f"{m.name} is not accepted here", m)  # fmt: skip
        try:
            handler(self, ch, m, now)
        except _ChannelError as exc:
            self._close_channel(ch, exc.code, exc.text, exc.method or m, now)
        except Refused as exc:
            code, connection = _CODE_OF.get(exc.code, (PRECONDITION_FAILED, False))
            text = str(exc) + (" in vhost '/'" if code == NOT_FOUND else "")
            if connection:
                raise _ConnectionError(code, text, m) from None
            self._close_channel(ch, code, text, m, now)

    def _handshake(self, m: Any, now: float) -> None:
        if isinstance(m, spec.Connection.StartOk):
            mech = m.mechanism
            creds = _credentials(mech, m.response) if mech in ("PLAIN", "AMQPLAIN") else None
            why = "unknown mechanism" if creds is None else self.users.check(creds[0], creds[1], self.peer_host)
            if why is not None or creds is None:
                # RabbitMQ (authentication_failure_close): Close 403, then the socket.
                text = (f"Login was refused using authentication mechanism {mech}. "
                        "For details see the broker logfile.")  # fmt: skip
                self._send_method(0, spec.Connection.Close(
                    reply_code=ACCESS_REFUSED, reply_text=_reply_text(ACCESS_REFUSED, text), class_id=0, method_id=0))
                self._finish(now, f"login refused ({why})")
                return
            self.user = creds[0]
            perms = self.users.permissions(self.user)
            self._vhost_ok = perms is not None
            self._perms = None if perms is None or perms.everything else perms
            caps = (m.client_properties or {}).get("capabilities")
            self._wants_blocked = type(caps) is dict and caps.get("connection.blocked") is True
            self.state = _WAIT_TUNE_OK
            self._send_method(0, spec.Connection.Tune(channel_max=CHANNEL_MAX, frame_max=FRAME_MAX,
                                                      heartbeat=HEARTBEAT))  # fmt: skip
        elif isinstance(m, spec.Connection.TuneOk):
            if m.frame_max and m.frame_max < FRAME_MIN:
                raise _ConnectionError(NOT_ALLOWED, f"frame_max={m.frame_max} < {FRAME_MIN} min size", m)
            self.frame_max = min(m.frame_max or FRAME_MAX, FRAME_MAX)
            self.channel_max = min(m.channel_max or CHANNEL_MAX, CHANNEL_MAX)
            self.heartbeat = m.heartbeat or 0
            self.state = _WAIT_OPEN
        elif isinstance(m, spec.Connection.Open):
            if m.virtual_host not in ("/", ""):
                raise _ConnectionError(NOT_ALLOWED, f"vhost {m.virtual_host!s:.60} not found", m)
            if not self._vhost_ok:
                raise _ConnectionError(NOT_ALLOWED, f"access to vhost '/' refused for user '{self.user}'", m)
            self.state = _OPEN
            self._send_method(0, spec.Connection.OpenOk())

    # -- content ----------------------------------------------------------------------

    def _content_channel(self, channel: int) -> Any:
        """The open channel a content frame belongs to; None to ignore the frame
        (its channel is closing).

        Raises:
            _ConnectionError: no such channel on an open connection.
        """
        ch = self._channels.get(channel)
        if ch is None or ch.closing:
            if ch is None and self.state == _OPEN:
                raise _ConnectionError(CHANNEL_ERROR, f"expected 'channel.open' on channel {channel}")
            return None
        return ch

    def _content_header(self, channel: int, properties: Any, size: int, now: float) -> None:
        ch = self._content_channel(channel)
        if ch is None:
            return
        pub = ch.publishing
        if pub is None or pub.size >= 0:
            raise _ConnectionError(UNEXPECTED_FRAME, "content header without basic.publish")
        pub.properties = properties
        pub.size = size
        if pub.size == 0:
            self._published(ch, now)

    def _content_body(self, channel: int, payload: bytes, now: float) -> None:
        ch = self._content_channel(channel)
        if ch is None:
            return
        pub = ch.publishing
        if pub is None or pub.size < 0:
            raise _ConnectionError(UNEXPECTED_FRAME, "content body without basic.publish and header")
        pub.parts.append(payload)
        pub.got += len(payload)
        if pub.got > pub.size:
            raise _ConnectionError(FRAME_ERROR, f"content body of {pub.got} bytes, header said {pub.size}")
        if pub.got == pub.size:
            self._published(ch, now)

    def _published(self, ch: _Channel, now: float) -> None:
        pub = ch.publishing
        assert pub is not None
        ch.publishing = None
        m = pub.method
        body = b"".join(pub.parts)
        if ch.tx is not None:
            # In a transaction: checked now, done at commit (as RabbitMQ).
            try:
                _expiration_ms(pub.properties)
                if self.core.exchange_type(m.exchange) is None:
                    raise _ChannelError(NOT_FOUND, f"no exchange '{m.exchange}' in vhost '/'")
            except _ChannelError as exc:
                self._close_channel(ch, exc.code, exc.text, m, now)
                return
            ch.tx.append(("publish", m, pub.properties, body))
            return
        self._publish(ch, m, pub.properties, body, now)

    def _publish(self, ch: _Channel, m: Any, properties: spec.Basic.Properties | None, body: bytes,
                 now: float) -> bool:  # fmt: skip
        """Publish one message; False when that closed the channel."""
        if ch.confirm:
            ch.published += 1
        elif not m.mandatory and properties is None and self.core.hand_over(m.exchange, m.routing_key, body, now):
            return True  # the latency path: straight to the queue's one consumer
        seq = ch.published
        try:
            expiration = _expiration_ms(properties)
            result = self.core.call(Publish(rid=0, exchange=m.exchange, routing_key=m.routing_key, body=body,
                                            expiration=expiration, properties=props_to_plain(properties)),
                                    (self.key, ch.number), now)  # fmt: skip
        except Refused as exc:
            if exc.code == ErrorCode.QUEUE_FULL:
                if ch.confirm:
                    self._send_method(ch.number, spec.Basic.Nack(delivery_tag=seq))
                return True
            code, connection = _CODE_OF.get(exc.code, (PRECONDITION_FAILED, False))
            text = f"no exchange '{m.exchange}' in vhost '/'" if code == NOT_FOUND else str(exc)
            if connection:
                raise _ConnectionError(code, text, m) from None
            self._close_channel(ch, code, text, m, now)
            return False
        except _ChannelError as exc:
            self._close_channel(ch, exc.code, exc.text, m, now)
            return False
        if m.mandatory and not result["routed"]:
            ret = _Return(reply_code=NO_ROUTE, reply_text="NO_ROUTE", exchange=m.exchange,
                          routing_key=m.routing_key)  # fmt: skip
            self._send_content(ch.number, ret, properties or spec.Basic.Properties(), body)
        if ch.confirm:
            self._emit(_ack_frame(ch.number, seq))
        return True

    def _deliver_runs(self, ch: _Channel, tag: str, runs: list[Any]) -> None:
        no_ack = ch.consumers.get(tag)
        if no_ack is None:
            return  # cancelled here; the core requeued (or dropped, no_ack) what it had sent
        for run in runs:
            first, ex, key, redelivered, bodies = run[:5]
            props = run[5] if len(run) > 5 else None
            for i, body in enumerate(bodies):
                dtag = ch.next_tag
                ch.next_tag += 1
                if not no_ack:
                    ch.unacked[dtag] = (tag, first + i)
                p = props[i] if props is not None else None
                method = _deliver_frame(ch.number, tag, dtag, redelivered, ex, key)
                self._send_content(ch.number, method, None if p is None else props_from_plain(p), body_bytes(body))

    # -- channel-level methods (rows of _METHODS) -------------------------------------

    def _allow(self, permission: str, kind: str, name: str) -> None:
        """Refuse with 403, as RabbitMQ does, unless the user's ``permission``
        (configure, write or read) covers the ``kind`` ("queue" or
        "exchange") called ``name``. Which method needs which: RabbitMQ's
        access-control table, at each method below.

        Raises:
            _ChannelError: ACCESS_REFUSED.
        """
        if self._perms is None:
            return  # every name allowed
        if kind == "exchange" and name == "":
            name = "amq.default"  # the default exchange's name for permissions (RabbitMQ's)
        if not self._perms.allows(permission, name):
            raise _ChannelError(ACCESS_REFUSED, f"access to {kind} '{name}' in vhost '/' refused for user "
                                f"'{self.user}'")  # fmt: skip

    def _channel_close(self, ch: _Channel, m: Any, now: float) -> None:
        self._release_channel(ch, now)
        del self._channels[ch.number]
        self._send_method(ch.number, spec.Channel.CloseOk())

    def _channel_close_ok(self, ch: _Channel, m: Any, now: float) -> None:
        pass  # only meaningful while closing (handled before)

    def _channel_flow(self, ch: _Channel, m: Any, now: float) -> None:
        if not m.active:
            raise _ConnectionError(NOT_IMPLEMENTED, "active=false", m)  # as RabbitMQ
        self._send_method(ch.number, spec.Channel.FlowOk(active=True))

    def _exchange_declare(self, ch: _Channel, m: Any, now: float) -> None:
        name, kind = m.exchange, m.exchange_type
        have = self.core.exchange_type(name)
        if m.passive:
            if have is None:
                raise _ChannelError(NOT_FOUND, f"no exchange '{name}' in vhost '/'")
        else:
            if kind not in _EXCHANGE_TYPES:
                raise _ConnectionError(COMMAND_INVALID, f"invalid exchange type '{kind!s:.40}'", m)
            self._allow("configure", "exchange", name)
            if have is not None and have != kind:
                raise _ChannelError(PRECONDITION_FAILED, f"inequivalent arg 'type' for exchange '{name}' in "
                                    f"vhost '/': received '{kind}' but current is '{have}'")  # fmt: skip
            if name != "":
                # The core checks the rest (durable the same; a system
                # exchange declared again; no new reserved name).
                self.core.call(DeclareExchange(rid=0, name=name, type=kind, durable=bool(m.durable)),
                               (self.key, ch.number), now)  # fmt: skip
        if not m.nowait:
            self._send_method(ch.number, spec.Exchange.DeclareOk())

    def _exchange_delete(self, ch: _Channel, m: Any, now: float) -> None:
        if m.exchange != "" and not m.exchange.startswith("amq."):
            # RabbitMQ refuses deleting the default and system exchanges
            # before it looks at permissions (the core refuses those below).
            self._allow("configure", "exchange", m.exchange)
        if m.if_unused and self.core.exchange_in_use(m.exchange):
            raise _ChannelError(PRECONDITION_FAILED, f"exchange '{m.exchange}' in vhost '/' in use")
        self.core.call(DeleteExchange(rid=0, name=m.exchange), (self.key, ch.number), now)
        if not m.nowait:
            self._send_method(ch.number, spec.Exchange.DeleteOk())

    def _queue_declare(self, ch: _Channel, m: Any, now: float) -> None:
        addr = (self.key, ch.number)
        name = m.queue
        if m.passive:
            if name == "":
                name = ch.last_queue
            messages, consumers = self.core.queue_info(name, addr, now)
        else:
            args = dict(m.arguments or {})
            generated = None
            if self._perms is not None:
                self._allow_declare(name, args)
                if name == "":
                    # Checked under the name it will have, as RabbitMQ does.
                    generated = server_queue_name()
                    self._allow("configure", "queue", generated)
            _check_queue_type(name, args.get("x-queue-type"), m)
            max_length = args.pop("x-max-length", None)
            overflow = args.pop("x-overflow", None)
            known = {k: _plain(v) for k, v in args.items() if k in ("x-dead-letter-exchange",
                     "x-dead-letter-routing-key", "x-message-ttl", "x-expires", "x-single-active-consumer",
                     "x-max-length-bytes", "x-max-priority")}  # fmt: skip
            existing = self.core.queue_options(name) if name else None
            if max_length is None:
                max_length = existing[0] if existing is not None else DEFAULT_AMQP_MAX_LENGTH
            if overflow is None:
                overflow = existing[1] if existing is not None else "drop-head"
            if isinstance(overflow, bytes):
                overflow = overflow.decode("utf-8", "replace")
            if type(max_length) is not int or max_length < 0 or not isinstance(overflow, str):
                raise _ChannelError(PRECONDITION_FAILED, "invalid arg 'x-max-length' or 'x-overflow'")
            if max_length == 0:
                # RabbitMQ keeps nothing ready in a queue of length 0; the core's least is 1.
                max_length = 1
            event = DeclareQueue(rid=0, name=name, max_length=max_length, overflow=overflow, arguments=known,
                                 exclusive=bool(m.exclusive), auto_delete=bool(m.auto_delete),
                                 durable=bool(m.durable))  # fmt: skip
            res = (self.core.call(event, addr, now) if generated is None
                   else self.core.declare_server_named(event, generated, addr, now))  # fmt: skip
            name, messages, consumers = res["queue"], res["messages"], res["consumers"]
        ch.last_queue = name
        if not m.nowait:
            self._send_method(ch.number, _DeclareOk(queue=name, message_count=messages, consumer_count=consumers))

    def _allow_declare(self, name: str, args: dict[str, Any]) -> None:
        # queue.declare: configure on the queue; a new queue with a
        # dead-letter exchange also needs read on itself and write on that
        # exchange (RabbitMQ's order). A server-named queue is checked by the caller.
        if name == "":
            return
        self._allow("configure", "queue", name)
        dlx = args.get("x-dead-letter-exchange")
        if isinstance(dlx, bytes):
            dlx = dlx.decode("utf-8", "replace")
        if isinstance(dlx, str) and self.core.queue_options(name) is None:
            self._allow("read", "queue", name)
            self._allow("write", "exchange", dlx)

    def _exchange_bind(self, ch: _Channel, m: Any, now: float) -> None:
        event = ExchangeBind if isinstance(m, spec.Exchange.Bind) else ExchangeUnbind
        self._allow("write", "exchange", m.destination)
        self._allow("read", "exchange", m.source)
        args = {str(k): _plain(v) for k, v in (m.arguments or {}).items()}
        self.core.call(event(rid=0, destination=m.destination, source=m.source, key=m.routing_key, arguments=args),
                       (self.key, ch.number), now)  # fmt: skip
        if not m.nowait:
            self._send_method(ch.number, spec.Exchange.BindOk() if event is ExchangeBind else spec.Exchange.UnbindOk())

    def _queue_bind(self, ch: _Channel, m: Any, now: float) -> None:
        queue = m.queue or ch.last_queue
        event = Bind if isinstance(m, spec.Queue.Bind) else Unbind
        self._allow("write", "queue", queue)
        self._allow("read", "exchange", m.exchange)
        args = {str(k): _plain(v) for k, v in (m.arguments or {}).items()}
        self.core.call(event(rid=0, queue=queue, exchange=m.exchange, key=m.routing_key, arguments=args),
                       (self.key, ch.number), now)  # fmt: skip
        if isinstance(m, spec.Queue.Unbind):
            self._send_method(ch.number, spec.Queue.UnbindOk())
        elif not m.nowait:
            self._send_method(ch.number, spec.Queue.BindOk())

    def _queue_purge(self, ch: _Channel, m: Any, now: float) -> None:
        name = m.queue or ch.last_queue
        self._allow("read", "queue", name)
        res = self.core.call(PurgeQueue(rid=0, name=name), (self.key, ch.number), now)
        if not m.nowait:
            self._send_method(ch.number, spec.Queue.PurgeOk(message_count=res["messages"]))

    def _queue_delete(self, ch: _Channel, m: Any, now: float) -> None:
        name, addr = m.queue or ch.last_queue, (self.key, ch.number)
        self._allow("configure", "queue", name)
        if m.if_unused or m.if_empty:
            try:
                messages, consumers = self.core.queue_info(name, addr)
            except Refused as exc:
                if exc.code != ErrorCode.NOT_FOUND:
                    raise
                messages = consumers = 0
            if m.if_unused and consumers:
                raise _ChannelError(PRECONDITION_FAILED, f"queue '{name}' in vhost '/' in use")
            if m.if_empty and messages:
                raise _ChannelError(PRECONDITION_FAILED, f"queue '{name}' in vhost '/' not empty")
        res = self.core.call(DeleteQueue(rid=0, name=name), addr, now)
        if not m.nowait:
            self._send_method(ch.number, spec.Queue.DeleteOk(message_count=res["messages"]))

    def _basic_qos(self, ch: _Channel, m: Any, now: float) -> None:
        if m.prefetch_size:
            # As RabbitMQ, which limits messages, never bytes.
            raise _ConnectionError(NOT_IMPLEMENTED, f"prefetch_size!=0 ({m.prefetch_size})", m)
        if m.global_:
            # RabbitMQ's reading of global: shared by the channel's
            # consumers, those it has and those it starts later.
            shared = m.prefetch_count
        else:
            ch.prefetch = m.prefetch_count
            shared = 0  # and, as in RabbitMQ, the channel's shared limit is lifted
        if shared != ch.shared_prefetch:
            self.core.call(ChannelPrefetch(rid=0, prefetch=shared), (self.key, ch.number), now)
            ch.shared_prefetch = shared
        self._send_method(ch.number, spec.Basic.QosOk())

    def _basic_consume(self, ch: _Channel, m: Any, now: float) -> None:
        tag = m.consumer_tag or "amq.ctag-" + secrets.token_urlsafe(16)
        if tag in ch.consumers:
            raise _ConnectionError(NOT_ALLOWED, f"attempt to reuse consumer tag '{tag}'", m)
        ch.getters.discard(tag)
        if len(tag.encode()) > MAX_NAME:
            raise _ConnectionError(SYNTAX_ERROR, "consumer tag too long", m)
        queue = m.queue or ch.last_queue
        self._allow("read", "queue", queue)
        ch.consumers[tag] = bool(m.no_ack)
        try:
            # ConsumeOk leaves first: the core's deliveries come out after this call.
            ok = _ConsumeOk(consumer_tag=tag)
            mark = len(self._out)
            if not m.nowait:
                self._send_method(ch.number, ok)
            fields: dict[str, Any] = {"rid": 0, "tag": tag, "queue": queue, "prefetch": ch.prefetch,
                                      "no_ack": bool(m.no_ack)}  # fmt: skip
            priority = (m.arguments or {}).get("x-priority")
            event: Consume
            if m.exclusive:
                event = ExclusiveConsume(**fields)
            elif priority is None:
                event = Consume(**fields)
            elif type(priority) is int:
                event = PriorityConsume(priority=priority, **fields)
            else:
                raise _ChannelError(PRECONDITION_FAILED, f"invalid arg 'x-priority' for consumer '{tag}'")
            self.core.call(event, (self.key, ch.number), now)
        except Exception:
            del ch.consumers[tag]
            del self._out[mark:]
            raise

    def _basic_cancel(self, ch: _Channel, m: Any, now: float) -> None:
        tag = m.consumer_tag
        if ch.consumers.pop(tag, None) is not None:
            # What it was sent and not yet acked stays the channel's to ack or
            # nack (as RabbitMQ's), until the channel closes.
            self.core.call(Cancel(rid=0, tag=tag, keep_unacked=True), (self.key, ch.number), now)
            ch.getters.add(tag)
        if not m.nowait:
            self._send_method(ch.number, _CancelOk(consumer_tag=tag))

    def _basic_publish(self, ch: _Channel, m: Any, now: float) -> None:
        if m.immediate:
            # AMQP 0-9-1's "deliver now or return": RabbitMQ dropped it (3.0) and answers so.
            raise _ConnectionError(NOT_IMPLEMENTED, "immediate=true", m)
        if self._perms is not None:  # the publish path: no call when nothing is restricted
            self._allow("write", "exchange", m.exchange)
        self.published = True
        ch.publishing = _Publishing(m)

    def _basic_get(self, ch: _Channel, m: Any, now: float) -> None:
        queue = m.queue or ch.last_queue
        self._allow("read", "queue", queue)
        res = self.core.call(Get(rid=0, queue=queue, no_ack=bool(m.no_ack)), (self.key, ch.number), now)
        if res is None:
            self._send_method(ch.number, spec.Basic.GetEmpty())
            return
        tag, core_tag, ex, key, redelivered, body, left, props = res
        dtag = ch.next_tag
        ch.next_tag += 1
        if not m.no_ack:
            ch.unacked[dtag] = (tag, core_tag)
            ch.getters.add(tag)
        ok = _GetOk(delivery_tag=dtag, redelivered=redelivered, exchange=ex, routing_key=key, message_count=left)
        self._send_content(ch.number, ok, props_from_plain(props), body_bytes(body))

    def _settle(self, ch: _Channel, m: Any, dtag: int, multiple: bool) -> dict[int, tuple[str, int]]:
        """The channel tags ``dtag`` (and, with ``multiple``, all before it)
        stands for, with their (consumer tag, core tag); forgotten here.

        Raises:
            _ChannelError: 406 for a tag that is not outstanding (RabbitMQ's "unknown delivery tag").
        """
        if multiple:
            tags = [t for t in ch.unacked if dtag == 0 or t <= dtag]
            if dtag and dtag not in ch.unacked and not tags:
                raise _ChannelError(PRECONDITION_FAILED, f"unknown delivery tag {dtag}", m)
        else:
            if dtag not in ch.unacked:
                raise _ChannelError(PRECONDITION_FAILED, f"unknown delivery tag {dtag}", m)
            tags = [dtag]
        return {t: ch.unacked.pop(t) for t in tags}

    def _apply(self, ch: _Channel, settled: dict[int, tuple[str, int]], requeue: bool | None, now: float) -> None:
        """Tell the core of settled deliveries: acked (``requeue`` None) or nacked."""
        by_consumer: dict[str, list[int]] = {}
        for tag, core_tag in settled.values():
            by_consumer.setdefault(tag, []).append(core_tag)
        addr = (self.key, ch.number)
        for tag, tags in by_consumer.items():
            if requeue is None:
                self.core.call(Ack(tag=tag, delivery_tags=tuple(tags)), addr, now)
            else:
                self.core.call(Nack(tag=tag, delivery_tags=tuple(tags), requeue=requeue), addr, now)

    def _settled(self, ch: _Channel, m: Any, requeue: bool | None, now: float) -> None:
        settled = self._settle(ch, m, m.delivery_tag, bool(getattr(m, "multiple", False)))
        if ch.tx is not None:
            ch.tx.append(("settle", settled, requeue))  # done at commit; given back to the channel by a rollback
        else:
            self._apply(ch, settled, requeue, now)

    def _basic_ack(self, ch: _Channel, m: Any, now: float) -> None:
        self._settled(ch, m, None, now)

    def _basic_nack(self, ch: _Channel, m: Any, now: float) -> None:
        self._settled(ch, m, bool(m.requeue), now)

    def _basic_recover(self, ch: _Channel, m: Any, now: float) -> None:
        # Everything unacked goes back to its queue, redelivered (requeue=false is treated as true).
        if ch.unacked:
            self._apply(ch, self._settle(ch, m, 0, True), True, now)
        if isinstance(m, spec.Basic.Recover):
            self._send_method(ch.number, spec.Basic.RecoverOk())

    def _confirm_select(self, ch: _Channel, m: Any, now: float) -> None:
        if ch.tx is not None:
            raise _ChannelError(PRECONDITION_FAILED, "cannot switch from tx to confirm mode", m)
        ch.confirm = True
        if not m.nowait:
            self._send_method(ch.number, spec.Confirm.SelectOk())

    # -- transactions (RabbitMQ's semantics) ---------------------------------------

    def _tx_select(self, ch: _Channel, m: Any, now: float) -> None:
        if ch.confirm:
            raise _ChannelError(PRECONDITION_FAILED, "cannot switch from confirm to tx mode", m)
        if ch.tx is None:
            ch.tx = []
        self._send_method(ch.number, spec.Tx.SelectOk())

    def _tx_commit(self, ch: _Channel, m: Any, now: float) -> None:
        """Publishes first, then settlements, each in the order they came
        (RabbitMQ's order); Commit-Ok leaves after the store's fsync of what
        it made persistent (the listener's turn commits before sending)."""
        if ch.tx is None:
            raise _ChannelError(PRECONDITION_FAILED, "channel is not transactional", m)
        work, ch.tx = ch.tx, []
        for entry in work:
            if entry[0] == "publish" and not self._publish(ch, entry[1], entry[2], entry[3], now):
                return  # the channel closed: the rest is dropped with it
        for entry in work:
            if entry[0] == "settle":
                self._apply(ch, entry[1], entry[2], now)
        self._send_method(ch.number, spec.Tx.CommitOk())

    def _tx_rollback(self, ch: _Channel, m: Any, now: float) -> None:
        """Publishes are dropped; settled deliveries are the channel's to settle
        again (not redelivered), as RabbitMQ's."""
        if ch.tx is None:
            raise _ChannelError(PRECONDITION_FAILED, "channel is not transactional", m)
        work, ch.tx = ch.tx, []
        back: dict[int, tuple[str, int]] = {}
        for entry in work:
            if entry[0] == "settle":
                back.update(entry[1])
        if back:
            ch.unacked = dict(sorted({**ch.unacked, **back}.items()))
        self._send_method(ch.number, spec.Tx.RollbackOk())


# -- the hot frames, by hand ------------------------------------------------------
# basic.publish in and basic.deliver out are most of the frames a busy
# connection carries; pamqp's generic (un)marshalling was a fifth of the
# listener's time for them. Anything unusual falls back to pamqp, so errors
# are reported exactly as before.

_BASIC_CLASS: Final = b"\x00\x3c"
_PUBLISH_ID: Final = b"\x00\x3c\x00\x28"  # class 60 (basic), method 40 (publish)
_ACK_ID: Final = b"\x00\x3c\x00\x50"  # class 60, method 80 (ack)
_ACK_TAIL = struct.Struct(">QB")  # delivery tag, bits (multiple)
_ACK_FRAME_SIZE: Final = 7 + 4 + 8 + 1 + 1
_Ack = spec.Basic.Ack


def _ack_frame(channel: int, tag: int) -> bytes:
    """A publisher confirm's basic.ack frame (``multiple`` off), as pamqp marshals it."""
    return _FRAME_HEAD.pack(_METHOD, channel, 13) + _ACK_ID + _ACK_TAIL.pack(tag, 0) + b"\xce"


_DELIVER_ID: Final = b"\x00\x3c\x00\x3c"  # class 60, method 60 (deliver)
_U64 = struct.Struct(">Q")
_DELIVER_TAIL = struct.Struct(">QB")


def _quick_publish(raw: bytes) -> Any:
    """The basic.publish in method frame ``raw``, or None to let pamqp read it."""
    try:
        p = 13  # 7 frame header + 4 class/method + 2 reserved
        n = raw[p]
        exchange = raw[p + 1 : p + 1 + n].decode("utf-8")
        p += 1 + n
        n = raw[p]
        key = raw[p + 1 : p + 1 + n].decode("utf-8")
        p += 1 + n
        bits = raw[p]
    except (IndexError, UnicodeDecodeError):
        return None
    if p + 2 != len(raw):
        return None
    m = _bare(_Publish)
    m.ticket, m.exchange, m.routing_key = 0, exchange, key
    m.mandatory, m.immediate = bool(bits & 1), bool(bits & 2)
    return m


_Publish = spec.Basic.Publish
_bare = object.__new__


def _short(text: str) -> bytes:
    """``text`` as AMQP's short string; the last few thousand are kept (a
    consumer's tag, exchange and key come back with every delivery)."""
    raw = _SHORTS.get(text)
    if raw is None:
        if len(_SHORTS) >= _SHORTS_KEPT:
            _SHORTS.clear()
        raw = text.encode("utf-8")
        raw = _SHORTS[text] = bytes((len(raw),)) + raw  # at most 255 bytes (checked by the core)
    return raw


_SHORTS: dict[str, bytes] = {}
_SHORTS_KEPT: Final = 4096


def _deliver_frame(channel: int, tag: str, dtag: int, redelivered: bool, exchange: str, key: str) -> bytes:
    """The basic.deliver method frame, as pamqp marshals it."""
    payload = b"".join((_DELIVER_ID, _short(tag), _DELIVER_TAIL.pack(dtag, 1 if redelivered else 0),
                        _short(exchange), _short(key)))  # fmt: skip
    return _FRAME_HEAD.pack(_METHOD, channel, len(payload)) + payload + b"\xce"


def _check_queue_type(name: str, kind: Any, m: Any) -> None:
    """Refuse what RabbitMQ refuses of ``x-queue-type``: a type it does not
    know, and a quorum queue that is exclusive, auto-delete or not durable.
    cmq's queues are all one kind (a classic queue, kept on disk when
    durable), so "classic" and "quorum" both make one; a stream (an
    append-only log read from an offset) is refused: cmq has none.

    Raises:
        _ChannelError: 406, with RabbitMQ's text.
    """
    if kind is None:
        return
    if isinstance(kind, bytes):
        kind = kind.decode("utf-8", "replace")
    where = f"for queue '{name}' in vhost '/'"
    if kind not in ("classic", "quorum"):
        why = "cmq has no stream queues" if kind == "stream" else f"unsupported queue type '{kind!s:.40}'"
        raise _ChannelError(PRECONDITION_FAILED, f"invalid arg 'x-queue-type' {where}: \"{why}\"")
    if kind == "quorum":
        for wrong, prop in ((m.exclusive, "exclusive-owner"), (m.auto_delete, "auto-delete"),
                            (not m.durable, "non-durable")):  # fmt: skip
            if wrong:
                raise _ChannelError(PRECONDITION_FAILED, f"invalid property '{prop}' {where}")


def _reply_text(code: int, text: str) -> str:
    name = _TEXT.get(code)
    out = f"{name} - {text}" if name else text
    raw = out.encode("utf-8")
    return out if len(raw) <= 255 else raw[:252].decode("utf-8", "ignore") + "..."


def _class_id(m: Any) -> int:
    index = getattr(m, "index", None)
    return (index >> 16) if isinstance(index, int) else 0


def _method_id(m: Any) -> int:
    index = getattr(m, "index", None)
    return (index & 0xFFFF) if isinstance(index, int) else 0


_Handler = Any

_METHODS: Final[dict[type[Any], _Handler]] = {
    spec.Channel.Close: AmqpConnection._channel_close,
    spec.Channel.CloseOk: AmqpConnection._channel_close_ok,
    spec.Channel.Flow: AmqpConnection._channel_flow,
    spec.Exchange.Declare: AmqpConnection._exchange_declare,
    spec.Exchange.Delete: AmqpConnection._exchange_delete,
    spec.Exchange.Bind: AmqpConnection._exchange_bind,
    spec.Exchange.Unbind: AmqpConnection._exchange_bind,
    spec.Queue.Declare: AmqpConnection._queue_declare,
    spec.Queue.Bind: AmqpConnection._queue_bind,
    spec.Queue.Unbind: AmqpConnection._queue_bind,
    spec.Queue.Purge: AmqpConnection._queue_purge,
    spec.Queue.Delete: AmqpConnection._queue_delete,
    spec.Basic.Qos: AmqpConnection._basic_qos,
    spec.Basic.Consume: AmqpConnection._basic_consume,
    spec.Basic.Cancel: AmqpConnection._basic_cancel,
    spec.Basic.Publish: AmqpConnection._basic_publish,
    spec.Basic.Get: AmqpConnection._basic_get,
    spec.Basic.Ack: AmqpConnection._basic_ack,
    spec.Basic.Nack: AmqpConnection._basic_nack,
    spec.Basic.Reject: AmqpConnection._basic_nack,
    spec.Basic.Recover: AmqpConnection._basic_recover,
    spec.Basic.RecoverAsync: AmqpConnection._basic_recover,
    spec.Confirm.Select: AmqpConnection._confirm_select,
    spec.Tx.Select: AmqpConnection._tx_select,
    spec.Tx.Commit: AmqpConnection._tx_commit,
    spec.Tx.Rollback: AmqpConnection._tx_rollback,
}

#: Methods only a server sends: a client sending one gets 503 (others: 540, not implemented).
_SERVER_ONLY: Final[frozenset[type[Any]]] = frozenset((
    spec.Connection.Start, spec.Connection.Tune, spec.Connection.OpenOk, spec.Channel.OpenOk,
    spec.Exchange.DeclareOk, spec.Exchange.DeleteOk, spec.Queue.DeclareOk, spec.Queue.BindOk,
    spec.Queue.UnbindOk, spec.Queue.PurgeOk, spec.Queue.DeleteOk, spec.Basic.QosOk, spec.Basic.ConsumeOk,
    spec.Basic.CancelOk, spec.Basic.Return, spec.Basic.Deliver, spec.Basic.GetOk, spec.Basic.GetEmpty,
    spec.Basic.RecoverOk, spec.Confirm.SelectOk, spec.Tx.SelectOk, spec.Tx.CommitOk, spec.Tx.RollbackOk,
    spec.Connection.StartOk, spec.Connection.TuneOk,
    spec.Connection.Open,
))  # fmt: skip

