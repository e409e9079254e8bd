"""The pipeline's aggregates on small records whose answers are known."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from cmq.lab.records import RecordWriter, RunInfo

pytestmark = pytest.mark.spark

# Epoch nanoseconds are above 2**53: a float64 anywhere would lose the units.
BASE = 1_700_000_000_000_000_123


def write_known(out: Path) -> None:
    # A: ping-pong, 10 round trips of 100..900 ns, the last one lost.
    with RecordWriter(out, RunInfo(experiment="e", system="cmq", run_id="a1"), flush_rows=4) as w:
        for i in range(10):
            send = BASE + 1000 * i
            w.record(
                scenario="pingpong",
                size=64,
                seq=i,
                send_ns=send,
                recv_ns=None if i == 9 else send + 100 * (i + 1),
                round_trip=True,
            )
    # B: one stream to two receivers; r1 gets 0 1 3 2 4 2 5 (2 late, then 2 again).
    with RecordWriter(out, RunInfo(experiment="e", system="udp", run_id="b1")) as w:
        order = [0, 1, 3, 2, 4, 2, 5]
        w.record_many(
            scenario="stream",
            size=16,
            params={"receivers": 2},
            seq=order,
            send_ns=[BASE + 10 * s for s in order],
            recv_ns=[BASE + 1000 + k for k in range(len(order))],
            stream="s",
            receiver="r1",
        )
        w.record_many(
            scenario="stream",
            size=16,
            params={"receivers": 2},
            seq=[0, 1, 2],
            send_ns=[BASE, BASE + 10, BASE + 20],
            recv_ns=[BASE + 500, BASE + 501, BASE + 502],
            stream="s",
            receiver="r2",
        )
    # C: throughput known only as totals, over two runs.
    for run_id, delivered in (("c1", 990), ("c2", 1000)):
        with RecordWriter(out, RunInfo(experiment="e", system="zmq", run_id=run_id)) as w:
            w.totals(
                scenario="throughput",
                size=1000,
                sent=1000,
                delivered=delivered,
                duration_ns=500_000_000,
            )


def by_system(rows: list[Any]) -> dict[str, dict[str, Any]]:
    return {r["system"]: r.asDict() for r in rows}


def test_summary_gives_the_known_answers(spark: Any, tmp_path: Path) -> None:
    from cmq.pipeline.jobs import load_tables, summary

    write_known(tmp_path)
    tables = load_tables(spark, tmp_path)
    rows = by_system(summary(tables.records, tables.totals).collect())
    assert set(rows) == {"cmq", "udp", "zmq"}

    a = rows["cmq"]
    assert (a["messages"], a["delivered"], a["lost"]) == (10, 9, 1)
    assert a["loss_rate"] == pytest.approx(0.1)
    assert a["round_trip"] is True
    assert a["mean_ns"] == pytest.approx(500.0)
    assert a["stddev_ns"] == pytest.approx(100 * math.sqrt(7.5))
    assert (a["p50_ns"], a["p99_ns"], a["min_ns"], a["max_ns"]) == (500, 900, 100, 900)
    assert (a["runs"], a["duplicates"], a["out_of_order"]) == (1, 0, 0)
    # 9 delivered between the first send and the last reply, 8900 ns apart.
    assert a["rate_source"] == "records"
    assert a["msgs_per_s"] == pytest.approx(9 / 8900e-9)
    assert a["mb_per_s"] == pytest.approx(9 / 8900e-9 * 64 / 1e6)

    b = rows["udp"]
    assert b["params"] == '{"receivers":2}'
    assert (b["delivered"], b["lost"], b["duplicates"], b["out_of_order"]) == (9, 0, 1, 1)
    assert b["dup_rate"] == pytest.approx(1 / 9)
    assert b["ooo_rate"] == pytest.approx(1 / 9)
    assert b["round_trip"] is False

    c = rows["zmq"]
    assert (c["runs"], c["messages"], c["delivered"], c["lost"]) == (2, 2000, 1990, 10)
    assert c["loss_rate"] == pytest.approx(0.005)
    assert c["rate_source"] == "totals"
    assert c["msgs_per_s"] == pytest.approx(1990.0)
    assert c["mb_per_s"] == pytest.approx(1.99)
    assert c["mean_ns"] is None


def test_out_of_order_by_request_leaves_out_replies_to_overlapping_receives(
    spark: Any, tmp_path: Path
) -> None:
    from cmq.pipeline.jobs import load_tables, summary

    # Three pulling receivers of one queue. Receives as (seq, request, reply):
    # 1 and 2 are asked for together and 2's reply comes first (overlapping:
    # out of order by arrival only); 0 is asked for after 3's reply came
    # (out of order by request too); 4 arrives last and in order.
    receipts = [(2, 10, 20), (1, 11, 25), (3, 30, 40), (0, 45, 50), (4, 60, 70)]
    with RecordWriter(tmp_path, RunInfo(experiment="e", system="q", run_id="r1")) as w:
        w.record_many(
            scenario="pull",
            size=0,
            seq=[s for s, _, _ in receipts],
            send_ns=[BASE] * len(receipts),
            recv_ns=[BASE + reply for _, _, reply in receipts],
            request_ns=[BASE + request for _, request, _ in receipts],
            stream="q",
        )
    with RecordWriter(tmp_path, RunInfo(experiment="e", system="push", run_id="p1")) as w:
        w.record_many(scenario="push", size=0, seq=[1, 0], send_ns=[BASE] * 2,
                      recv_ns=[BASE + 1, BASE + 2])  # fmt: skip
    tables = load_tables(spark, tmp_path)
    rows = by_system(summary(tables.records, tables.totals).collect())
    pull = rows["q"]
    assert (pull["out_of_order"], pull["ooo_by_request"]) == (2, 1)
    assert pull["ooo_by_request_rate"] == pytest.approx(1 / 5)
    push = rows["push"]  # no request times: no rate, not a 0
    assert (push["out_of_order"], push["ooo_by_request"]) == (1, 0)
    assert push["ooo_by_request_rate"] is None


def test_flags_keep_nanoseconds_exact(spark: Any, tmp_path: Path) -> None:
    from cmq.pipeline.jobs import flag_deliveries, load_tables

    write_known(tmp_path)
    records = load_tables(spark, tmp_path).records
    row = flag_deliveries(records.where("system = 'cmq' AND seq = 3")).collect()[0]
    assert row["send_ns"] == BASE + 3000
    assert row["recv_ns"] == BASE + 3400
    assert row["latency_ns"] == 400


def test_an_empty_directory_gives_empty_tables(spark: Any, tmp_path: Path) -> None:
    from cmq.pipeline.jobs import load_tables, summary

    tables = load_tables(spark, tmp_path)
    assert summary(tables.records, tables.totals).count() == 0
    assert tables.runs.count() == 0


def test_samples_stats_and_series(spark: Any, tmp_path: Path) -> None:
    from cmq.pipeline.jobs import load_tables, sample_series, sample_stats

    with RecordWriter(tmp_path, RunInfo(experiment="scalability", system="cmq", run_id="s1")) as w:
        for k, value in enumerate([10.0, 20.0, 30.0]):
            w.sample(metric="rss_bytes", t_ns=BASE + k * 2_000_000_000, value=value)
        for dests, cost in ((1, 100.0), (1, 300.0), (1000, 250.0)):
            w.sample(metric="push_ns", x=dests, value=cost)
    samples = load_tables(spark, tmp_path).samples
    stats = {r["x"]: r for r in sample_stats(samples.where("metric = 'push_ns'")).collect()}
    assert stats[1.0]["mean"] == pytest.approx(200.0)
    assert stats[1.0]["stddev"] == pytest.approx(math.sqrt(2) * 100)
    assert stats[1000.0]["n"] == 1
    series = [(r["t_s"], r["value"]) for r in sample_series(samples, "rss_bytes").collect()]
    assert series == [(0.0, 10.0), (2.0, 20.0), (4.0, 30.0)]


def reference_flags(deliveries: list[tuple[int, int]]) -> tuple[int, int]:
    """Duplicates and out-of-order deliveries of one stream, by the
    definition: walk deliveries in arrival order."""
    seen: set[int] = set()
    highest = -1
    duplicates = out_of_order = 0
    for _recv, seq in sorted(deliveries):
        if seq in seen:
            duplicates += 1
            continue
        if seq < highest:
            out_of_order += 1
        seen.add(seq)
        highest = max(highest, seq)
    return duplicates, out_of_order


def test_single_sort_flags_match_the_arrival_order_definition(spark: Any, tmp_path: Path) -> None:
    import random

    from cmq.pipeline.jobs import load_tables, summary

    rng = random.Random(20121011)
    expected: dict[int, tuple[int, int, int]] = {}
    with RecordWriter(tmp_path, RunInfo(experiment="prop", system="udp", run_id="p1")) as w:
        for stream in range(40):
            n = rng.randint(1, 30)
            seqs = [s for s in range(n) for _ in range(rng.choice((1, 1, 1, 2, 3)))]
            lost_seqs = {s for s in range(n) if rng.random() < 0.1}
            recvs = rng.sample(range(10_000), len(seqs))  # distinct arrival times
            deliveries = [(r, s) for r, s in zip(recvs, seqs, strict=True) if s not in lost_seqs]
            expected[stream] = (*reference_flags(deliveries), len(lost_seqs))
            # Each stream is its own size so that the summary has one row per stream.
            w.record_many(
                size=stream + 1,
                seq=[s for _, s in deliveries] + sorted(lost_seqs),
                send_ns=[0] * (len(deliveries) + len(lost_seqs)),
                recv_ns=[r for r, _ in deliveries] + [None] * len(lost_seqs),
                stream="s",
            )
    tables = load_tables(spark, tmp_path)
    got = {
        r["size"] - 1: (r["duplicates"], r["out_of_order"], r["lost"])
        for r in summary(tables.records, tables.totals).collect()
    }
    assert got == expected
    assert sum(d for d, _, _ in expected.values()) > 10
    assert sum(o for _, o, _ in expected.values()) > 10
