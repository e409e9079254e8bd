"""Wire format v1: encode/decode tables shared by both directions, and fuzzing."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cmq import ProtocolError
from cmq.wire.frames import (
    FLAG_FRAGMENT,
    FLAG_MSGPACK,
    FLAG_TAG,
    HEADER_SIZE,
    BadTag,
    Fragment,
    decode,
    encode_fragment,
    encode_frames,
    frame_size,
    parse_header,
)

# Every test here runs on the compiled core and on the pure-Python one.
pytestmark = pytest.mark.usefixtures("core")

KEY = b"k" * 32

# (payloads, expected body bytes): the framing rule of the design, both ways.
FRAMING = [
    ([], b""),
    ([b""], b"\x00"),
    ([b"a"], b"\x01a"),
    ([b"ab", b"c"], b"\x02ab\x01c"),
    ([b"x" * 254], b"\xfe" + b"x" * 254),
    ([b"x" * 255], b"\xff" + struct.pack(">Q", 255) + b"x" * 255),
    ([b"y" * 1000, b""], b"\xff" + struct.pack(">Q", 1000) + b"y" * 1000 + b"\x00"),
]


@pytest.mark.parametrize(("payloads", "body"), FRAMING)
def test_framing_table_encodes_and_decodes(payloads: list[bytes], body: bytes) -> None:
    data = encode_frames(payloads, flags=0, sender=7, mailbox=3, seq=9)
    assert data[:HEADER_SIZE] == b"\xc3\x51\x01\x00" + struct.pack(">III", 7, 3, 9)
    assert data[HEADER_SIZE:] == body
    header, got = decode(data)
    assert (header.sender, header.mailbox, header.seq, header.flags) == (7, 3, 9, 0)
    assert got == payloads


def test_frame_size_is_one_byte_prefix_below_255() -> None:
    assert [frame_size(n) for n in (0, 1, 254, 255, 1000)] == [1, 2, 255, 264, 1009]


def test_seq_wraps_to_32_bits() -> None:
    data = encode_frames([b"a"], flags=0, sender=1, mailbox=0, seq=2**32 + 5)
    assert parse_header(data).seq == 5


def test_tag_is_added_verified_and_required() -> None:
    data = encode_frames([b"hello"], flags=FLAG_MSGPACK, sender=1, mailbox=0, seq=0, key=KEY)
    header, got = decode(data, KEY)
    assert header.flags == FLAG_MSGPACK | FLAG_TAG
    assert got == [b"hello"]
    tampered = bytearray(data)
    tampered[HEADER_SIZE] ^= 1
    with pytest.raises(BadTag):
        decode(bytes(tampered), KEY)
    with pytest.raises(BadTag):
        decode(data, b"other key")
    plain = encode_frames([b"hello"], flags=0, sender=1, mailbox=0, seq=0)
    with pytest.raises(BadTag):
        decode(plain, KEY)
    # Without a key, a tagged datagram's tag is skipped unchecked.
    assert decode(data)[1] == [b"hello"]


def test_fragment_round_trip() -> None:
    data = encode_fragment(b"piece", message_id=42, index=1, count=3, flags=0, sender=5, mailbox=2, seq=11)
    header, frag = decode(data)
    assert header.flags & FLAG_FRAGMENT
    assert frag == Fragment(message_id=42, index=1, count=3, data=b"piece")


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xc3\x51\x01",
        b"\x00\x00\x01\x00" + bytes(12),  # wrong magic
        b"\xc3\x51\x02\x00" + bytes(12),  # version 2
        b"\xc3\x51\x01\x80" + bytes(12),  # unknown flag
        b"\xc3\x51\x01\x00" + bytes(12) + b"\x05abc",  # frame runs past the end
        b"\xc3\x51\x01\x00" + bytes(12) + b"\xff\x00\x00",  # long length truncated
        b"\xc3\x51\x01\x02" + bytes(12) + b"\x00\x00",  # fragment header truncated
        b"\xc3\x51\x01\x02" + bytes(12) + struct.pack(">IHH", 1, 3, 3),  # index >= count
        b"\xc3\x51\x01\x02" + bytes(12) + struct.pack(">IHH", 1, 0, 0),  # count 0
        b"\xc3\x51\x01\x04" + bytes(12) + b"short",  # tag flag without room
    ],
)
def test_malformed_datagrams_raise_protocol_error(data: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode(data)


@given(
    payloads=st.lists(st.binary(max_size=600), max_size=20),
    sender=st.integers(1, 2**32 - 1),
    mailbox=st.integers(0, 2**32 - 1),
    seq=st.integers(0, 2**32 - 1),
    msgpack_flag=st.booleans(),
    keyed=st.booleans(),
)
def test_round_trip_property(
    payloads: list[bytes], sender: int, mailbox: int, seq: int, msgpack_flag: bool, keyed: bool
) -> None:
    key = KEY if keyed else None
    flags = FLAG_MSGPACK if msgpack_flag else 0
    header, got = decode(encode_frames(payloads, flags=flags, sender=sender, mailbox=mailbox, seq=seq, key=key), key)
    assert got == payloads
    assert (header.sender, header.mailbox, header.seq) == (sender, mailbox, seq)
    assert header.flags & FLAG_MSGPACK == flags


def _valid() -> st.SearchStrategy[bytes]:
    return st.builds(
        lambda p, s: encode_frames(p, flags=0, sender=1, mailbox=0, seq=s),
        st.lists(st.binary(max_size=300), max_size=5),
        st.integers(0, 100),
    )


@st.composite
def _mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(_valid()))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "truncate", "extend"]))
        if kind == "flip" and data:
            i = draw(st.integers(0, len(data) - 1))
            data[i] = draw(st.integers(0, 255))
        elif kind == "truncate":
            del data[draw(st.integers(0, len(data))) :]
        else:
            data += draw(st.binary(max_size=20))
    return bytes(data)


@settings(max_examples=500)
@given(st.one_of(st.binary(max_size=200), _mutated()))
def test_decoder_returns_or_raises_protocol_error_only(data: bytes) -> None:
    """The fuzz invariant: any bytes either decode or raise ProtocolError, nothing else."""
    for key in (None, KEY):
        try:
            decode(data, key)
        except ProtocolError:
            pass


@given(size=st.integers(0, 254), count=st.integers(1, 200), fill=st.integers(0, 255))
def test_equal_frames_round_trip(size: int, count: int, fill: int) -> None:
    """A batch of equal messages takes the receiver's C-level path; it must agree with the loop."""
    payloads = [bytes([fill]) * size] * count
    assert decode(encode_frames(payloads, flags=0, sender=1, mailbox=0, seq=0))[1] == payloads
    # One odd frame in the middle breaks the pattern: the loop handles it.
    mixed = [*payloads, b"odd!" * 3, *payloads]
    assert decode(encode_frames(mixed, flags=0, sender=1, mailbox=0, seq=0))[1] == mixed


@given(size=st.integers(255, 3000), count=st.integers(1, 150), fill=st.integers(0, 255))
def test_equal_long_frames_round_trip(size: int, count: int, fill: int) -> None:
    """Equal messages of 255 bytes or more (nine-byte prefixes) also take the C-level path."""
    payloads = [bytes([fill]) * size] * count
    assert decode(encode_frames(payloads, flags=0, sender=1, mailbox=0, seq=0))[1] == payloads
    mixed = [*payloads, b"x" * (size + 1), *payloads]
    assert decode(encode_frames(mixed, flags=0, sender=1, mailbox=0, seq=0))[1] == mixed


def test_frames_that_only_look_equal_at_stride_are_decoded_frame_by_frame() -> None:
    """Payload bytes that mimic the stride of equal frames must not fool the fast split."""
    # Frames of 2, 1 and 3 bytes whose bytes at every third position read 2:
    # an encoder that trusted the stride would cut them as three 2-byte frames.
    payloads = [b"ab", b"c", b"\x02de"]
    assert decode(encode_frames(payloads, flags=0, sender=1, mailbox=0, seq=0))[1] == payloads


@given(sizes=st.lists(st.integers(0, 600), min_size=1, max_size=40))
def test_mixed_sizes_round_trip(sizes: list[int]) -> None:
    payloads = [bytes([i % 256]) * n for i, n in enumerate(sizes)]
    assert decode(encode_frames(payloads, flags=0, sender=1, mailbox=0, seq=0))[1] == payloads
