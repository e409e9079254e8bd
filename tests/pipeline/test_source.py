"""The cmq streaming source and sink on a real Spark session and real sockets."""

from __future__ import annotations

import re
import socket
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import cmq
from cmq import ConfigError
from cmq.pipeline.source import SpoolReceiver, _send_rows, committed_offset, read_spool, register

N = 300


def numbered(n: int) -> list[bytes]:
    return [f"message {i:05d}".encode() for i in range(n)]


def fill(spool: Path) -> tuple[SpoolReceiver, list[bytes], tuple[str, int]]:
    rx = SpoolReceiver(spool, port=0, host="127.0.0.1")
    payloads = numbered(N)
    with cmq.Queue(port=0, host="127.0.0.1", codec="raw") as sender:  # reliable by default
        for p in payloads:
            sender.push(rx.address, p)
        assert sender.drain(timeout=30), sender.stats()
        # Waits on a condition the receiver thread signals, not a sleep.
        assert rx.wait_spooled(N, timeout=30), rx.stats()
        assert sender.stats().in_doubt == 0
        address = sender.address
    return rx, payloads, address


def test_the_spool_is_readable_by_offset(tmp_path: Path) -> None:
    rx, payloads, (host, port) = fill(tmp_path)
    with rx:
        end = rx.stats()["offset"]
    rows = list(read_spool(tmp_path, 0, end))
    assert [r[4] for r in rows] == payloads  # every message once, in push order
    assert {r[0] for r in rows} == {f"{host}:{port}"}
    assert all(isinstance(r[6], int) for r in rows)


@pytest.mark.spark
def test_stream_source_holds_every_spooled_message(spark: Any, tmp_path: Path) -> None:
    rx, payloads, _ = fill(tmp_path / "spool")
    with rx:
        register(spark)
        stream = spark.readStream.format("cmq").option("spool", str(tmp_path / "spool")).load()
        query = (
            stream.writeStream.format("memory")
            .queryName("cmq_in")
            .option("checkpointLocation", str(tmp_path / "ckpt"))
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(90)
        assert query.exception() is None
        rows = spark.sql("SELECT * FROM cmq_in").collect()
        stats = rx.stats()
    # A reliable sender: every message once, in push order.
    assert len(rows) == stats["spooled"] == stats["messages_received"] == N
    assert [bytes(r["payload"]) for r in rows] == payloads
    assert all(r["mailbox"] == 0 and r["received_ns"] > 0 for r in rows)


@pytest.mark.spark
def test_stream_sink_pushes_rows_to_a_destination(spark: Any, tmp_path: Path) -> None:
    rx, payloads, _ = fill(tmp_path / "in")
    with rx, SpoolReceiver(tmp_path / "out", port=0, host="127.0.0.1") as out:
        register(spark)
        query = (
            spark.readStream.format("cmq")
            .option("spool", str(tmp_path / "in"))
            .load()
            .select("payload")
            .writeStream.format("cmq")
            .option("dest", f"{out.address[0]}:{out.address[1]}")
            .option("checkpointLocation", str(tmp_path / "ckpt"))
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(90)
        assert query.exception() is None
        # The sink's tasks returned only once `out` had acknowledged every
        # row, so the spool thread has them all or is writing them now.
        assert out.wait_spooled(N, timeout=30), out.stats()
        got = out.stats()
    received = [r[4] for r in read_spool(tmp_path / "out", 0, got["offset"])]
    assert received == payloads  # one task, one stream: once each, in order


def rows_of(payloads: list[bytes]) -> Iterator[Any]:
    from pyspark.sql import Row

    return iter([Row(payload=p) for p in payloads])


def test_a_sink_task_returns_once_every_row_is_confirmed(tmp_path: Path) -> None:
    with SpoolReceiver(tmp_path, port=0, host="127.0.0.1") as out:
        dest = f"{out.address[0]}:{out.address[1]}"
        result = _send_rows({"dest": dest}, rows_of(numbered(N)))
        assert (result.sent, result.confirmed) == (N, N)
        # Confirmed means acknowledged by the receiving endpoint: the spool
        # thread has them, or is writing them now.
        assert out.wait_spooled(N, timeout=30)
        end = out.stats()["offset"]
    assert [r[4] for r in read_spool(tmp_path, 0, end)] == numbered(N)


def test_a_sink_task_fails_naming_what_was_not_confirmed() -> None:
    # A socket that takes datagrams and never answers: nothing is acknowledged.
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as silent:
        silent.bind(("127.0.0.1", 0))
        dest = f"127.0.0.1:{silent.getsockname()[1]}"
        with pytest.raises(
            cmq.Timeout,
            match=rf"^format\('cmq'\) sink: 7 of 7 messages to {dest} not confirmed \(no acknowledgement within drainTimeout\)",
        ):
            _send_rows({"dest": dest, "draintimeout": "0.2"}, rows_of(numbered(7)))


def test_a_best_effort_sink_task_does_not_wait() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as silent:
        silent.bind(("127.0.0.1", 0))
        dest = f"127.0.0.1:{silent.getsockname()[1]}"
        result = _send_rows({"dest": dest, "delivery": "best-effort"}, rows_of(numbered(7)))
    assert (result.sent, result.confirmed, result.dropped) == (7, 0, 0)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "needs option 'dest'"),
        (
            {"dest": "127.0.0.1:9", "delivery": "exactly-once"},
            "option 'delivery' must be one of reliable, unordered, best-effort",
        ),
        ({"dest": "127.0.0.1:9", "draintimeout": "soon"}, "option 'draintimeout' must be a number"),
        ({"dest": "127.0.0.1:9", "draintimeout": "-1"}, "must not be negative"),
    ],
)
def test_bad_sink_options_are_refused(options: dict[str, str], message: str) -> None:
    with pytest.raises(cmq.ConfigError, match=re.escape(message)):
        _send_rows(options, rows_of([b"x"]))


def test_opening_a_spool_cuts_off_a_record_torn_by_a_killed_receiver(tmp_path: Path) -> None:
    rx, payloads, _ = fill(tmp_path)
    rx.close()
    end = committed_offset(tmp_path)
    log = tmp_path / "messages.log"
    # A receiver killed between the two halves of one write: a record whose
    # header promises more bytes than follow.
    with open(log, "ab") as f:
        f.write(struct.pack(">I", 100) + b"only part of it")
    with SpoolReceiver(tmp_path, port=0, host="127.0.0.1") as again:
        assert again.recovered == 4 + len(b"only part of it")
        assert again.stats()["offset"] == end
        with cmq.Queue(port=0, host="127.0.0.1") as sender:
            sender.push(again.address, b"after the restart")
            assert sender.drain(timeout=30)
        assert again.wait_spooled(1, timeout=30)
        new_end = again.stats()["offset"]
    assert [r[4] for r in read_spool(tmp_path, 0, new_end)] == [*payloads, b"after the restart"]


def test_the_spool_cli_refuses_a_bad_option_in_one_line(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "cmq.pipeline.source", "--spool", str(tmp_path), "--max-buffered-bytes", "10"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.startswith(
        "python -m cmq.pipeline.source: max_buffered_bytes=10: must hold at least one datagram"
    )
    assert "Traceback" not in proc.stderr


@pytest.mark.spark
def test_register_refuses_workers_that_cannot_import_cmq(spark: Any, tmp_path: Path) -> None:
    """A local session whose workers are set to a Python without cmq fails at once, saying what to set.

    (A session with nothing set gets this interpreter instead: the Spark guide's
    example runs on a plain session, with PYSPARK_PYTHON unset, in tests/docs.)
    """
    conf = spark.sparkContext._jsc.sc().conf()
    conf.set("spark.pyspark.python", str(tmp_path / "no-such-python"))
    try:
        with pytest.raises(ConfigError, match=r"cannot import cmq: set PYSPARK_PYTHON="):
            register(spark)
    finally:
        conf.remove("spark.pyspark.python")
    register(spark)  # the session's own PYSPARK_PYTHON (this interpreter) is fine
