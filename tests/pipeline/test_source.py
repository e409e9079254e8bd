"""The cmq streaming source and sink on a real Spark session and real sockets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import cmq
from cmq.pipeline.source import SpoolReceiver, read_spool, register

pytestmark = pytest.mark.spark

N = 300


def lost(rx: SpoolReceiver, sender: Any) -> int:
    # Every way a message can go missing that cmq counts.
    stats = rx.stats()
    return (
        sum(stats["dropped"].values()) + (stats["kernel_drops"] or 0) + sender.stats().total_dropped
    )


def fill(spool: Path) -> tuple[SpoolReceiver, set[bytes], tuple[str, int]]:
    rx = SpoolReceiver(spool, port=0, host="127.0.0.1")
    payloads = {f"message {i}".encode() for i in range(N)}
    with cmq.Queue(port=0, host="127.0.0.1", codec="raw") as sender:
        for p in sorted(payloads):
            sender.push(rx.address, p)
        sender.flush()
        # Waits on a condition the receiver thread signals, not a sleep.
        rx.wait_spooled(N, timeout=10)
        assert rx.spooled + lost(rx, sender) == N, rx.stats()
        address = sender.address
    return rx, payloads, address


def test_the_spool_is_readable_by_offset(tmp_path: Path) -> None:
    rx, payloads, (host, port) = fill(tmp_path)
    with rx:
        end = rx.stats()["offset"]
    rows = list(read_spool(tmp_path, 0, end))
    assert len(rows) == rx.spooled
    assert {r[4] for r in rows} <= payloads
    assert {r[0] for r in rows} == {f"{host}:{port}"}
    assert all(isinstance(r[6], int) for r in rows)


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
    # At most once: what Spark holds is exactly what arrived; the rest is counted.
    assert len(rows) == stats["spooled"] == stats["messages_received"]
    assert {bytes(r["payload"]) for r in rows} <= payloads
    assert len({bytes(r["payload"]) for r in rows}) == len(rows)  # no duplicates
    assert all(r["mailbox"] == 0 and r["received_ns"] > 0 for r in rows)


def test_stream_sink_pushes_rows_to_a_destination(spark: Any, tmp_path: Path) -> None:
    rx, _, _ = fill(tmp_path / "in")
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
        out.wait_spooled(rx.spooled, timeout=10)
        got = out.stats()
    sent_in = sorted(r[4] for r in read_spool(tmp_path / "in", 0, rx.stats()["offset"]))
    received = sorted(r[4] for r in read_spool(tmp_path / "out", 0, got["offset"]))
    lost_on_the_way = sum(got["dropped"].values()) + (got["kernel_drops"] or 0)
    assert len(received) + lost_on_the_way == len(sent_in)
    assert set(received) <= set(sent_in)
