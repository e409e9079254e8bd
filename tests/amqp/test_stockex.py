"""The stock-exchange simulation end to end (seconds, small rates), and its statistics reporter."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cmq import ConfigError
from cmq.lab.experiments._record import RunBook
from cmq.lab.experiments.stockex.report import EXPERIMENT_ID, write_records
from cmq.lab.experiments.stockex.reporter import python_stats, rates, spark_stats
from cmq.lab.experiments.stockex.roles import kept, marker
from cmq.lab.experiments.stockex.run import SimConfig, SimResult, run_simulation
from cmq.lab.records import read_table


def test_config_is_validated() -> None:
    for bad in (dict(rates=()), dict(rates=(0,)), dict(seconds=0), dict(reporter="pandas")):
        with pytest.raises(ConfigError):
            SimConfig(**bad)


@pytest.mark.parametrize(
    ("rate", "sent", "confirmed", "seconds", "ok"),
    [
        (1000, 1000, 1000, 1.0, True),
        (1000, 1000, 1000, 1.06, False),  # 943/s: under 95% of the rate
        (1000, 10000, 9990, 10.0, True),  # 0.1% unconfirmed
        (1000, 10000, 9989, 10.0, False),
        (1000, 0, 0, 1.0, False),
    ],
)
def test_kept(rate: int, sent: int, confirmed: int, seconds: float, ok: bool) -> None:
    assert kept(rate, sent, confirmed, seconds) is ok


def test_markers_are_not_orders() -> None:
    assert marker(3, 1000) == b"\x00\x03\x00\x00\x03\xe8"
    assert marker(255)[:2] == b"\x00\xff"


@pytest.fixture(scope="module")
def run() -> SimResult:
    return run_simulation(SimConfig(rates=(300, 600), seconds=0.5, drain=3.0, interval=0.05,
                                    reporter="python"))  # fmt: skip


@pytest.mark.slow
def test_simulation_end_to_end(run: SimResult) -> None:
    # Which rates are kept is the benchmark's business, not this test's: on
    # a loaded machine even 300/s may need its second attempt.
    assert (run.steps[0].step, run.steps[0].rate, run.steps[0].attempt) == (0, 300, 1)
    assert [s.step for s in run.steps] == list(range(len(run.steps)))
    assert {s.rate for s in run.steps} <= {300, 600}
    for s in run.steps:
        assert s.sent == round(s.rate * 0.5)
        assert s.confirmed == s.sent, "loopback at a few hundred orders/s loses nothing"
        assert all(d > t for t, d in zip(s.sent_ns, s.done_ns, strict=True))
    assert run.engine["orders"] == sum(s.sent for s in run.steps)
    assert run.engine["bad"] == 0
    assert set(run.cpu) == {"broker", "engine", "gateway"}


@pytest.mark.slow
def test_reporter_counts_agree_with_the_processes(run: SimResult) -> None:
    by_step: dict[int, dict[str, dict[str, Any]]] = {}
    for r in run.stats:
        by_step.setdefault(r["step"], {})[r["role"]] = r
    for i, s in enumerate(run.steps):
        gw, en = by_step[i]["gateway"], by_step[i]["engine"]
        assert gw["orders_sent"] == s.sent and gw["confirms"] == s.confirmed
        assert en["orders"] == s.sent and en["conf"] == s.sent
        assert en["trade"] % 2 == 0  # both sides of every fill
    # Trades and quotes of a step's last orders may still be on their way when
    # its last confirmation ends the step (and count in the next one): compare totals.
    for gw_key, en_key in (("trades", "trade"), ("quotes", "quote")):
        got = sum(r[gw_key] for r in run.stats if r["role"] == "gateway")
        sent = sum(r[en_key] for r in run.stats if r["role"] == "engine")
        assert sum(getattr(s, gw_key) for s in run.steps) <= got <= sent
    got = rates(run.stats)
    for row in got.values():
        # Every message is 9 bytes but cancels (none here): the paper's "about 9".
        assert row["avg_message_bytes"] == 9.0
        assert row["orders_sent_per_s"] > 0 and row["confirms_per_s"] > 0


@pytest.mark.slow
def test_records_of_a_run(run: SimResult, tmp_path: Path) -> None:
    with RunBook(tmp_path, EXPERIMENT_ID) as book:
        write_records(book, run)
    rows = read_table(tmp_path, "records").to_pylist()
    assert len(rows) == sum(s.sent for s in run.steps)
    assert {
        (json.loads(r["params"])["rate"], json.loads(r["params"])["attempt"]) for r in rows
    } == {
        (300, 1),
        (600, 1),
    }
    assert all(r["round_trip"] and not r["lost"] for r in rows)
    metrics = {r["metric"] for r in read_table(tmp_path, "samples").to_pylist()}
    assert {"kept", "orders_sent_per_s", "confirms_per_s", "quotes_per_s", "avg_message_bytes",
            "cpu_us_per_order"} <= metrics  # fmt: skip


def _spool(tmp_path: Path, messages: list[dict[str, Any]]) -> Path:
    from cmq.net import Queue
    from cmq.pipeline.source import SpoolReceiver

    spool = tmp_path / "spool"
    with SpoolReceiver(spool, port=0, codec="raw") as rx, Queue(port=0, codec="raw") as q:
        for m in messages:
            q.push(rx.address, json.dumps(m).encode())
        q.flush()
        assert rx.wait_spooled(len(messages), timeout=10)
    return spool


MEASUREMENTS = [
    {"role": "gateway", "step": 0, "rate": 100.0, "t0": 0, "t1": 10**9, "orders_sent": 100, "confirms": 90},
    {"role": "gateway", "step": 0, "rate": 100.0, "t0": 10**9, "t1": 2 * 10**9, "confirms": 10},
    {"role": "engine", "step": 0, "rate": 100.0, "t0": 0, "t1": 10**9, "orders": 100, "conf": 100,
     "trade": 50, "quote": 50, "bytes_in": 900, "bytes_out": 1800},
]  # fmt: skip


def test_python_reporter_on_known_messages(tmp_path: Path) -> None:
    stats = python_stats(_spool(tmp_path, MEASUREMENTS))
    (row,) = rates(stats).values()
    assert row["orders_sent_per_s"] == 100.0  # over its own active second, not the drain
    assert row["confirms_back_per_s"] == 50.0
    assert row["avg_message_bytes"] == 2700 / 300


@pytest.mark.spark
def test_spark_reporter_equals_the_python_sums(tmp_path: Path, spark: Any) -> None:
    spool = _spool(tmp_path, MEASUREMENTS)
    expected = python_stats(spool)
    got = spark_stats(spark, spool, name="stockex_test")
    assert len(got) == len(expected) == 2
    for g, e in zip(got, expected, strict=True):
        for key, value in e.items():
            assert g[key] == value, key


@pytest.mark.slow
def test_a_rate_not_kept_is_tried_once_more_then_the_sweep_stops() -> None:
    # 5,000,000 orders/s is far beyond one Python gateway (the batched one
    # keeps about 100,000): the step cannot be kept however idle the machine.
    got = run_simulation(SimConfig(rates=(5_000_000, 400), seconds=0.02, drain=2.0,
                                   interval=0.05, reporter="python"))  # fmt: skip
    assert [(s.rate, s.attempt, s.kept) for s in got.steps] == [
        (5_000_000, 1, False),
        (5_000_000, 2, False),
    ]
    assert {r["step"] for r in got.stats} == {0, 1}


@pytest.mark.slow
def test_without_acknowledgements() -> None:
    got = run_simulation(SimConfig(rates=(300,), seconds=0.3, drain=3.0, interval=0.05,
                                   no_ack=True, reporter="python"))  # fmt: skip
    # (A stall on a loaded machine may cost the step its first attempt: count them all.)
    assert got.engine["orders"] == sum(s.sent for s in got.steps)
    assert {s.rate for s in got.steps} == {300}
