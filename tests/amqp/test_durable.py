"""The durable experiment: its kill -9 check, and its place in the lab and the report."""

from __future__ import annotations

from pathlib import Path

import pytest

from cmq.lab.experiments import experiments
from cmq.lab.experiments import pages as report_experiments
from cmq.lab.experiments._record import RunBook
from cmq.lab.experiments.amqp import durable
from cmq.lab.records import read_table

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
    assert len(exp.claims) == 2 and all(c.rule for c in exp.claims)
