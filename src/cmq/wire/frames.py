"""Wire formats v1 and v2: encoding and decoding of datagrams, without any I/O.

Theory of operation
-------------------
A datagram is ``header body [tag]`` (all integers unsigned, big-endian)::

    offset size field
    0      2    magic    0xC3 0x51
    2      1    version  1
    3      1    flags    FLAG_MSGPACK | FLAG_FRAGMENT | FLAG_TAG | FLAG_ACK | FLAG_CONTROL
    4      4    sender   random non-zero id of the sending endpoint
    8      4    mailbox  destination mailbox (0 is the default)
    12     4    seq      datagram sequence number of the stream (sender, destination, mailbox)

A normal body is frames back to back: a length then that many bytes. The
length is one byte ``n`` when ``n < 255``, else ``0xFF`` and an 8-byte length
(ØMQ v0.1's compact framing: one byte of overhead for every message shorter
than 255 bytes).

A fragment body (``FLAG_FRAGMENT``) is ``message_id`` (4), ``index`` (2),
``count`` (2), then a slice of one message.

With ``FLAG_TAG`` the last 16 bytes are keyed BLAKE2b (digest size 16) over
header and body.

Version 2 (reliable and unordered delivery) keeps the header and adds, right
after it, an 8-byte *data extension* (``epoch`` (4), ``rflags`` (1: ``R_SYN``,
``R_ORDERED``), 3 reserved zero bytes) before the body. A v2 datagram with
``FLAG_CONTROL`` carries control *records* instead of frames (see
:class:`Status` and :class:`Probe`). v1 stays what best-effort endpoints emit;
every endpoint accepts both. ``docs/wire-format.md`` has the byte tables.

Decoding either returns what was in the datagram or raises
:class:`~cmq.ProtocolError`; nothing else escapes (see the fuzz test).
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import chain
from typing import Final

from cmq._errors import ProtocolError

__all__ = [
    "EXT_SIZE",
    "FLAG_ACK",
    "FLAG_CONTROL",
    "FLAG_FRAGMENT",
    "FLAG_MSGPACK",
    "FLAG_TAG",
    "FRAGMENT_HEADER_SIZE",
    "HEADER_SIZE",
    "MAGIC",
    "MAX_FRAGMENTS",
    "MAX_RANGES",
    "R_ORDERED",
    "R_SYN",
    "TAG_SIZE",
    "VERSION",
    "VERSION_2",
    "BadTag",
    "Fragment",
    "Header",
    "Probe",
    "Status",
    "body_start",
    "decode",
    "decode_control",
    "encode_control",
    "encode_fragment",
    "encode_frame",
    "encode_frames",
    "extension",
    "frame",
    "frame_size",
    "parse_header",
    "split_frames",
]

MAGIC: Final = b"\xc3\x51"
VERSION: Final = 1
#: The version of reliable data (with the extension) and of control datagrams.
VERSION_2: Final = 2
HEADER_SIZE: Final = 16
#: Bytes of the v2 data extension (epoch, rflags, reserved).
EXT_SIZE: Final = 8
#: rflags of the data extension: the sender has not heard from the receiver
#: in this epoch yet (a receiver that does not know the stream accepts it
#: as new rather than answering RESET).
R_SYN: Final = 0x01
#: rflags: deliver this stream's messages in sequence order.
R_ORDERED: Final = 0x02
#: Control record types.
REC_STATUS: Final = 1
REC_PROBE: Final = 2
#: STATUS flag: the receiver does not know the stream (it restarted or forgot).
S_RESET: Final = 0x01
#: STATUS flag: written in answer to a PROBE, whose serial follows the ranges.
S_ANSWER: Final = 0x02
#: Most missing ranges one STATUS carries.
MAX_RANGES: Final = 32
TAG_SIZE: Final = 16
FRAGMENT_HEADER_SIZE: Final = 8
#: A fragmented message has at most this many pieces (the 2-byte count).
MAX_FRAGMENTS: Final = 0xFFFF

FLAG_MSGPACK: Final = 0x01
FLAG_FRAGMENT: Final = 0x02
FLAG_TAG: Final = 0x04
FLAG_ACK: Final = 0x08
FLAG_CONTROL: Final = 0x10
_KNOWN_FLAGS: Final = FLAG_MSGPACK | FLAG_FRAGMENT | FLAG_TAG | FLAG_ACK | FLAG_CONTROL

_HEADER = struct.Struct(">2sBBIII")
_FRAGMENT = struct.Struct(">IHH")
_EXT = struct.Struct(">IB3x")
# STATUS: type, flags, ack delay (us), stream sender, mailbox, epoch,
# next expected, credit limit, largest seen, number of ranges.
_STATUS = struct.Struct(">BBHIIIIIIB")
_RANGE = struct.Struct(">IH")
# PROBE: type, flags (rflags), serial, mailbox, epoch, next seq.
_PROBE = struct.Struct(">BBHIII")
# A STATUS's answered PROBE serial (after its ranges, with S_ANSWER).
_SERIAL = struct.Struct(">H")
_LONG_LEN = struct.Struct(">Q")
# Length prefixes for short frames, precomputed: building them is the hot part
# of encoding a batch of small messages.
_SHORT_LEN: Final = [bytes((n,)) for n in range(255)]


class _Prefixes(dict[int, bytes]):
    """Length prefix of a frame by payload size, built on first use (C-speed lookups with ``map``)."""

    def __missing__(self, n: int) -> bytes:
        prefix = _SHORT_LEN[n] if n < 255 else b"\xff" + _LONG_LEN.pack(n)
        if n <= 0xFFFF:  # sizes of one datagram: a bounded table
            self[n] = prefix
        return prefix


_PREFIX: Final = _Prefixes()
#: A frame's length prefix by payload size (a table: ``PREFIX[n]``).
PREFIX: Final[dict[int, bytes]] = _PREFIX
#: The header's last field, packed alone (see :func:`stream_head`).
SEQ: Final = struct.Struct(">I")


def stream_head(flags: int, sender: int, mailbox: int, version: int = VERSION) -> bytes:
    """The header's bytes before the sequence number, the same for every
    unauthenticated datagram of one stream: ``stream_head(...) +
    SEQ.pack(seq) + ext`` is the header (and v2 extension) :func:`encode_frames` writes.
    """
    return _HEADER.pack(MAGIC, version, flags, sender, mailbox, 0)[:-4]


def extension(epoch: int, rflags: int) -> bytes:
    """The 8-byte v2 data extension."""
    return _EXT.pack(epoch & 0xFFFFFFFF, rflags)
#: Frames per cached struct format when splitting equal-size frames.
_SPLIT_BLOCK: Final = 64


@lru_cache(maxsize=512)
def _split_struct(n: int, prefix: int, count: int) -> struct.Struct:
    """A format that unpacks ``count`` frames of ``n`` bytes, each after a ``prefix``-byte length."""
    return struct.Struct(f"{prefix}x{n}s" * count)


class BadTag(ProtocolError):
    """The datagram's tag is missing or does not verify under the shared key."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Header:
    """The fixed 16-byte header of every datagram."""

    flags: int
    sender: int
    mailbox: int
    seq: int
    version: int = VERSION
    #: v2 data only: the stream's epoch and the extension's rflags.
    epoch: int = 0
    rflags: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Status:
    """A receiver's report on one stream (v2 control record, receiver to sender).

    Every seq before ``next_expected`` arrived; ``missing`` lists ``(start,
    length)`` ranges after it that did not (up to ``largest_seen``); the
    sender may send up to, not including, ``credit_limit``. ``ack_delay``
    is how long (µs) the receiver held the datagram ``largest_seen`` before
    this report. With ``reset`` the receiver does not know the stream.
    ``probe`` is the serial of the PROBE this report answers (0: none): it
    was written after everything sent before that PROBE had arrived or was
    lost.
    """

    stream_sender: int
    mailbox: int
    epoch: int
    next_expected: int
    credit_limit: int
    largest_seen: int
    missing: tuple[tuple[int, int], ...] = ()
    ack_delay: int = 0
    reset: bool = False
    probe: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Probe:
    """A sender's request for a STATUS now (v2 control record, sender to receiver).

    ``next_seq`` is the stream's next sequence number: everything before it
    was sent, so a receiver learns of a lost tail. ``serial`` (1 to 65,535;
    0 in a PROBE that wants no answer named) is echoed by the STATUS that
    answers it.
    """

    mailbox: int
    epoch: int
    next_seq: int
    rflags: int = 0
    serial: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Fragment:
    """One piece of a message too large for a single datagram."""

    message_id: int
    index: int
    count: int
    data: bytes


def frame_size(n: int) -> int:
    """Bytes a payload of ``n`` bytes takes in a body, prefix included."""
    return n + 1 if n < 255 else n + 9


def _tag(key: bytes, data: bytes) -> bytes:
    return hashlib.blake2b(data, key=key, digest_size=TAG_SIZE).digest()


def _header(flags: int, sender: int, mailbox: int, seq: int, ext: bytes = b"") -> bytes:
    if ext:
        return _HEADER.pack(MAGIC, VERSION_2, flags, sender, mailbox, seq & 0xFFFFFFFF) + ext
    return _HEADER.pack(MAGIC, VERSION, flags, sender, mailbox, seq & 0xFFFFFFFF)


def encode_frames(
    payloads: list[bytes],
    flags: int,
    sender: int,
    mailbox: int,
    seq: int,
    key: bytes | None = None,
    sizes: list[int] | None = None,
    ext: bytes = b"",
) -> bytes:
    """Encode one datagram carrying ``payloads`` as frames.

    The caller is responsible for the size: every payload is framed, none is
    split. ``flags`` must not contain ``FLAG_FRAGMENT`` or ``FLAG_TAG``; the
    tag flag is set here when ``key`` is given. ``sizes``, the payloads'
    lengths, saves computing them again when the caller has them. With
    ``ext`` (see :func:`extension`) the datagram is version 2.
    """
    if key is not None:
        flags |= FLAG_TAG
    header = _header(flags, sender, mailbox, seq, ext)
    if sizes is None:
        sizes = list(map(len, payloads))
    if not sizes:
        data = header
    elif sizes.count(sizes[0]) == len(sizes):
        # All of one size (the common case under load): the prefix is also
        # the separator, and one join copies each byte once.
        data = _PREFIX[sizes[0]].join([header, *payloads])
    else:
        parts: list[bytes] = [header] * (2 * len(sizes) + 1)
        parts[1::2] = map(_PREFIX.__getitem__, sizes)
        parts[2::2] = payloads
        data = b"".join(parts)
    if key is not None:
        data += _tag(key, data)
    return data


def frame(payloads: list[bytes], head: bytes, seq: int, ext: bytes) -> bytes:
    """An untagged datagram of one stream: ``head`` (:func:`stream_head`),
    ``seq``, ``ext`` (the v2 extension, or empty) and ``payloads`` framed.

    The same bytes as :func:`encode_frames` for that stream without a key,
    made from the stream's constant header bytes (the batcher's common
    case; the compiled core has a twin).
    """
    sizes = list(map(len, payloads))
    if sizes and sizes.count(sizes[0]) == len(sizes):
        return _PREFIX[sizes[0]].join([head + SEQ.pack(seq & 0xFFFFFFFF) + ext, *payloads])
    parts: list[bytes] = [head, SEQ.pack(seq & 0xFFFFFFFF), ext] + [b""] * (2 * len(sizes))
    parts[3::2] = map(_PREFIX.__getitem__, sizes)
    parts[4::2] = payloads
    return b"".join(parts)


def encode_frame(
    payload: bytes,
    flags: int,
    sender: int,
    mailbox: int,
    seq: int,
    key: bytes | None = None,
    ext: bytes = b"",
) -> bytes:
    """Encode one datagram carrying the single message ``payload`` (as :func:`encode_frames`)."""
    if key is not None or ext:
        return encode_frames([payload], flags, sender, mailbox, seq, key, ext=ext)
    n = len(payload)
    return b"".join(
        (
            _HEADER.pack(MAGIC, VERSION, flags, sender, mailbox, seq & 0xFFFFFFFF),
            _SHORT_LEN[n] if n < 255 else _PREFIX[n],
            payload,
        )
    )


def encode_fragment(
    chunk: bytes,
    *,
    message_id: int,
    index: int,
    count: int,
    flags: int,
    sender: int,
    mailbox: int,
    seq: int,
    key: bytes | None = None,
    ext: bytes = b"",
) -> bytes:
    """Encode one fragment datagram (``index`` of ``count``) of a large message."""
    flags |= FLAG_FRAGMENT
    if key is not None:
        flags |= FLAG_TAG
    data = b"".join(
        (
            _header(flags, sender, mailbox, seq, ext),
            _FRAGMENT.pack(message_id & 0xFFFFFFFF, index, count),
            chunk,
        )
    )
    if key is not None:
        data += _tag(key, data)
    return data


def parse_header(data: bytes) -> Header:
    """Parse and check the header of ``data`` (and a v2 data extension).

    Raises:
        ProtocolError: too short, wrong magic or version, or unknown flags.
    """
    if len(data) < HEADER_SIZE:
        raise ProtocolError(f"datagram of {len(data)} bytes is shorter than the header")
    magic, version, flags, sender, mailbox, seq = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise ProtocolError("wrong magic")
    if version != VERSION and version != VERSION_2:
        raise ProtocolError(f"unsupported version {version}")
    if flags & ~_KNOWN_FLAGS:
        raise ProtocolError(f"unknown flags 0x{flags:02x}")
    if version == VERSION_2 and not flags & FLAG_CONTROL:
        if len(data) < HEADER_SIZE + EXT_SIZE:
            raise ProtocolError("v2 data extension runs past the end")
        epoch, rflags = _EXT.unpack_from(data, HEADER_SIZE)
        if rflags & ~(R_SYN | R_ORDERED):
            raise ProtocolError(f"unknown rflags 0x{rflags:02x}")
        return Header(flags=flags, sender=sender, mailbox=mailbox, seq=seq, version=version, epoch=epoch, rflags=rflags)
    return Header(flags=flags, sender=sender, mailbox=mailbox, seq=seq, version=version)


def body_start(header: Header) -> int:
    """Where the body of a datagram with ``header`` starts."""
    return HEADER_SIZE + EXT_SIZE if header.version == VERSION_2 and not header.flags & FLAG_CONTROL else HEADER_SIZE


def split_frames(data: bytes, start: int, end: int) -> list[bytes]:
    """Split ``data[start:end]`` into frame payloads.

    Raises:
        ProtocolError: a frame runs past ``end``.
    """
    if start < end:
        # A batch of equal messages (the common case under load): if every
        # frame's length prefix, read at stride, says the same n, the frames
        # are all of length n and a cached struct format cuts them at C speed.
        n = data[start]
        if n < 255:
            step = n + 1
            count, rest = divmod(end - start, step)
            if not rest and data[start:end:step] == _SHORT_LEN[n] * count:
                return _split_equal(data, start, n, 1, count)
        elif end - start >= 9:
            n = _LONG_LEN.unpack_from(data, start + 1)[0]
            step = n + 9
            count, rest = divmod(end - start, step)
            # Nine strided checks cost more than the loop below for a few frames.
            if not rest and count >= 16 and all(
                data[start + i : end : step] == bytes((b,)) * count
                for i, b in enumerate(data[start : start + 9])
            ):
                return _split_equal(data, start, n, 9, count)
    out: list[bytes] = []
    append = out.append
    i = start
    # Otherwise a loop, kept tight for short frames.
    while i < end:
        n = data[i]
        if n == 255:
            if i + 9 > end:
                raise ProtocolError("long frame length runs past the end")
            n = _LONG_LEN.unpack_from(data, i + 1)[0]
            i += 9
        else:
            i += 1
        j = i + n
        if j > end:
            raise ProtocolError("frame runs past the end of the datagram")
        append(data[i:j])
        i = j
    return out


def _split_equal(data: bytes, start: int, n: int, prefix: int, count: int) -> list[bytes]:
    """``count`` frames of ``n`` bytes each from ``data[start:]`` (already checked)."""
    if n == 0:
        return [b""] * count
    block = _SPLIT_BLOCK * (n + prefix)
    full, tail = divmod(count, _SPLIT_BLOCK)
    out: list[bytes] = []
    if full:
        unpack = _split_struct(n, prefix, _SPLIT_BLOCK).unpack_from
        out.extend(chain.from_iterable(map(unpack, [data] * full, range(start, start + full * block, block))))
    if tail:
        out.extend(_split_struct(n, prefix, tail).unpack_from(data, start + full * block))
    return out


def decode(
    data: bytes,
    key: bytes | None = None,
    split: Callable[[bytes, int, int], list[bytes]] | None = None,
) -> tuple[Header, list[bytes] | Fragment | list[Status | Probe]]:
    """Decode a whole datagram: its header and its frames, its fragment or its control records.

    This is the one parser of the wire format: the receiver's fast paths
    handle a subset of datagrams (plain, untagged v1 and v2 data) and must
    agree with it. With ``key``, the datagram must carry a valid tag;
    without, a tag that is present is skipped unchecked. ``split`` cuts the
    frames (default :func:`split_frames`; the compiled core's twin).

    Raises:
        ProtocolError: anything that is not a valid v1 or v2 datagram
            (:class:`BadTag` for a tag that is missing or does not verify).
    """
    header = parse_header(data)
    end = len(data)
    if header.flags & FLAG_TAG:
        end -= TAG_SIZE
        if end < HEADER_SIZE:
            raise BadTag("datagram too short for its tag")
        if key is not None and not hmac.compare_digest(_tag(key, data[:end]), data[end:]):
            raise BadTag("tag does not verify")
    elif key is not None:
        raise BadTag("datagram has no tag")
    start = body_start(header)
    if end < start:
        raise ProtocolError("tag overlaps the header")
    if header.flags & FLAG_CONTROL:
        if header.version != VERSION_2:
            return header, []  # v1 defined no control records
        if header.flags & (FLAG_FRAGMENT | FLAG_MSGPACK):
            raise ProtocolError("control datagram with data flags")
        return header, decode_control(data, start, end)
    if header.flags & FLAG_FRAGMENT:
        if end - start < FRAGMENT_HEADER_SIZE:
            raise ProtocolError("fragment header runs past the end")
        message_id, index, count = _FRAGMENT.unpack_from(data, start)
        if count == 0 or index >= count:
            raise ProtocolError(f"fragment index {index} of {count}")
        return header, Fragment(
            message_id=message_id,
            index=index,
            count=count,
            data=data[start + FRAGMENT_HEADER_SIZE : end],
        )
    return header, (split_frames if split is None else split)(data, start, end)


def encode_control(records: Sequence[Status | Probe], sender: int, key: bytes | None = None) -> bytes:
    """One v2 control datagram carrying ``records`` (from endpoint ``sender``).

    The caller keeps it under a datagram: a STATUS takes 29 bytes plus 6 per
    missing range (and 2 when it answers a PROBE), a PROBE 16.
    """
    flags = FLAG_CONTROL | (FLAG_TAG if key is not None else 0)
    parts = [_HEADER.pack(MAGIC, VERSION_2, flags, sender, 0, 0)]
    for r in records:
        if isinstance(r, Status):
            ranges = r.missing[:MAX_RANGES]
            parts.append(
                _STATUS.pack(
                    REC_STATUS,
                    (S_RESET if r.reset else 0) | (S_ANSWER if r.probe else 0),
                    min(max(r.ack_delay, 0), 0xFFFF),
                    r.stream_sender,
                    r.mailbox,
                    r.epoch,
                    r.next_expected & 0xFFFFFFFF,
                    r.credit_limit & 0xFFFFFFFF,
                    r.largest_seen & 0xFFFFFFFF,
                    len(ranges),
                )
            )
            parts.extend(_RANGE.pack(a & 0xFFFFFFFF, min(n, 0xFFFF)) for a, n in ranges)
            if r.probe:
                parts.append(_SERIAL.pack(r.probe & 0xFFFF))
        else:
            parts.append(_PROBE.pack(REC_PROBE, r.rflags, r.serial & 0xFFFF, r.mailbox, r.epoch, r.next_seq & 0xFFFFFFFF))
    data = b"".join(parts)
    if key is not None:
        data += _tag(key, data)
    return data


def decode_control(data: bytes, start: int, end: int) -> list[Status | Probe]:
    """The control records in ``data[start:end]``.

    Raises:
        ProtocolError: an unknown record type or a record that runs past the end.
    """
    out: list[Status | Probe] = []
    i = start
    while i < end:
        kind = data[i]
        if kind == REC_STATUS:
            if i + _STATUS.size > end:
                raise ProtocolError("STATUS record runs past the end")
            _, flags, delay, ssender, mailbox, epoch, nxt, credit, largest, n = _STATUS.unpack_from(data, i)
            i += _STATUS.size
            if i + n * _RANGE.size > end:
                raise ProtocolError("STATUS ranges run past the end")
            missing = tuple(_RANGE.unpack_from(data, i + k * _RANGE.size) for k in range(n))
            i += n * _RANGE.size
            probe = 0
            if flags & S_ANSWER:
                if i + _SERIAL.size > end:
                    raise ProtocolError("STATUS serial runs past the end")
                (probe,) = _SERIAL.unpack_from(data, i)
                i += _SERIAL.size
            out.append(
                Status(
                    stream_sender=ssender,
                    mailbox=mailbox,
                    epoch=epoch,
                    next_expected=nxt,
                    credit_limit=credit,
                    largest_seen=largest,
                    missing=missing,
                    ack_delay=delay,
                    reset=bool(flags & S_RESET),
                    probe=probe,
                )
            )
        elif kind == REC_PROBE:
            if i + _PROBE.size > end:
                raise ProtocolError("PROBE record runs past the end")
            _, rflags, serial, mailbox, epoch, nxt = _PROBE.unpack_from(data, i)
            i += _PROBE.size
            out.append(Probe(mailbox=mailbox, epoch=epoch, next_seq=nxt, rflags=rflags, serial=serial))
        else:
            raise ProtocolError(f"unknown control record type {kind}")
    return out
