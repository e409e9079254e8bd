"""Control records (v2 STATUS and PROBE): what is encoded is decoded, byte for byte as
docs/wire-format.md tables it, and a record cut short is refused."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cmq._errors import ProtocolError
from cmq.wire.frames import HEADER_SIZE, MAX_RANGES, Probe, Status, decode, encode_control

u32 = st.integers(0, 2**32 - 1)
u16 = st.integers(0, 2**16 - 1)

statuses = st.builds(
    Status,
    stream_sender=u32,
    mailbox=u32,
    epoch=u32,
    next_expected=u32,
    credit_limit=u32,
    largest_seen=u32,
    missing=st.lists(st.tuples(u32, u16), max_size=MAX_RANGES).map(tuple),
    ack_delay=u16,
    reset=st.booleans(),
    probe=u16,
)
probes = st.builds(Probe, mailbox=u32, epoch=u32, next_seq=u32, rflags=st.integers(0, 3), serial=u16)


@given(st.lists(st.one_of(statuses, probes), min_size=1, max_size=4), st.sampled_from([None, b"k" * 16]))
def test_records_come_back_as_they_went(records: list[Status | Probe], key: bytes | None) -> None:
    _, got = decode(encode_control(records, 7, key), key)
    assert got == records


def test_a_status_naming_a_probe_carries_its_serial_after_the_ranges() -> None:
    status = Status(stream_sender=1, mailbox=2, epoch=3, next_expected=4, credit_limit=5,
                    largest_seen=6, missing=((5, 1),), probe=0x1234)  # fmt: skip
    data = encode_control([status], 9)
    record = data[HEADER_SIZE:]
    assert record[1] == 0x02  # flags: answers a PROBE
    assert len(record) == 29 + 6 + 2
    assert record[-2:] == b"\x12\x34"
    plain = encode_control([Status(stream_sender=1, mailbox=2, epoch=3, next_expected=4,
                                   credit_limit=5, largest_seen=6, missing=((5, 1),))], 9)  # fmt: skip
    assert plain[HEADER_SIZE + 1] == 0 and len(plain) == len(data) - 2


def test_a_probe_carries_its_serial_where_version_2_reserved_two_bytes() -> None:
    data = encode_control([Probe(mailbox=2, epoch=3, next_seq=4, rflags=1, serial=0xBEEF)], 9)
    assert data[HEADER_SIZE:][2:4] == b"\xbe\xef"
    assert len(data) == HEADER_SIZE + 16


@pytest.mark.parametrize("cut", [1, 2])
def test_a_serial_cut_short_is_refused(cut: int) -> None:
    data = encode_control([Status(stream_sender=1, mailbox=2, epoch=3, next_expected=4,
                                  credit_limit=5, largest_seen=6, probe=77)], 9)  # fmt: skip
    with pytest.raises(ProtocolError, match="serial"):
        decode(data[:-cut])
