"""The durable experiment: its kill -9 check, and its place in the lab and the report."""

from __future__ import annotations

from pathlib import Path

import pytest

from cmq.lab.experiments import experiments
from cmq.lab.experiments import pages as report_experiments
from cmq.lab.experiments._record import RunBook
from cmq.lab.experiments.amqp import durable
from cmq.lab.records import read_table
from cmq.pipeline.report import ReportData

pytestmark = pytest.mark.timeout(120)


def test_a_run_writes_rates_and_no_confirmed_message_is_lost_to_a_kill_9(tmp_path: Path) -> None:
    steps: list[str] = []
    with RunBook(tmp_path, durable.EXPERIMENT_ID) as book:
        durable.measure_durable(book, ["cmq"], seconds=0.3, repeat=1, step=steps.append, say=print)
    assert steps == ["cmq confirm-each", "cmq kill-9"]
    rows = {r["scenario"]: r for r in read_table(tmp_path, "totals").to_pylist()}
    assert rows["confirm-each"]["delivered"] == rows["confirm-each"]["sent"] > 0
    assert rows["kill-9"]["delivered"] == rows["kill-9"]["sent"] > 0
    assert [r["status"] for r in read_table(tmp_path, "runs").to_pylist()] == ["ok"]


def test_it_is_a_lab_and_report_experiment() -> None:
    assert durable.EXPERIMENT_ID in {e.id for e in experiments()}
    (exp,) = [e for e in report_experiments() if e.id == durable.EXPERIMENT_ID]
    assert len(exp.claims) == 3 and all(c.rule for c in exp.claims)
    assert [c.target for c in exp.claims] == [False, True, True]  # the first rate rule is kept for the record


def _rates(*rounds: tuple[float, float]) -> ReportData:
    rows = []
    for rep, (cmq, rabbit) in enumerate(rounds):
        for system, rate in (("cmq", cmq), ("rabbitmq", rabbit), ("cmq-pika", cmq / 2)):
            rows.append({"experiment": durable.EXPERIMENT_ID, "scenario": "confirm-each", "system": system,
                         "params": f'{{"repeat": {rep}}}', "p": {"repeat": rep}, "msgs_per_s": rate})  # fmt: skip
    return ReportData(summary=rows)


def _rate_verdicts(data: ReportData) -> list[str]:
    (exp,) = [e for e in report_experiments() if e.id == durable.EXPERIMENT_ID]
    return [c.judge(data).status for c in exp.claims[:2]]


def test_the_rate_is_judged_by_the_interval_of_the_per_round_ratios() -> None:
    # Every round at or above 2x: the interval clears the target.
    assert _rate_verdicts(_rates((5000, 2000), (4400, 2100), (4600, 1900))) == ["pass", "pass"]
    assert durable.round_ratios(_rates((5000, 2000), (4400, 2000))) == [2.5, 2.2]
    # Medians 2.0x apart but one round below: the first rule passes, the interval rule cannot.
    straddles = _rates((4000, 2000), (3000, 2000), (5000, 2000))
    assert _rate_verdicts(straddles) == ["pass", "inconclusive"]
    # Every round below 2x: fail under both.
    assert _rate_verdicts(_rates((3000, 2000), (3500, 2000), (3100, 2000))) == ["fail", "fail"]
    # Two rounds are too few for an interval; no RabbitMQ, no verdict.
    assert _rate_verdicts(_rates((5000, 2000), (5000, 2000)))[1] == "inconclusive"
    no_rabbit = ReportData(summary=[r for r in _rates((5000, 2000)).summary if r["system"] != "rabbitmq"])
    assert _rate_verdicts(no_rabbit) == ["inconclusive", "inconclusive"]


def test_bench_durable_runs_one_consumer_beside_the_publisher(capsys: pytest.CaptureFixture[str]) -> None:
    import argparse
    import json

    from cmq.lab.bench.broker_durable import main

    args = argparse.Namespace(seconds=0.3, size=1024, window=16, json=True,
                              amqp_url="amqp://guest:guest@127.0.0.1:1/%2F")  # no RabbitMQ there: skipped
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["rabbitmq_skipped"] is not None
    runs = out["runs"]
    assert [(r["persistent"], r["window"]) for r in runs] == [(True, 1), (True, 16), (False, 1), (False, 16)]
    for r in runs:  # the consumer took messages in every run, never more than were confirmed
        assert 0 < r["consumed"] <= r["published"]
