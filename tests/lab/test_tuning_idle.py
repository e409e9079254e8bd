"""The idle-rule section of the tuning experiment, judged on hand-made aggregates (no Spark)."""

from __future__ import annotations

from typing import Any

from cmq.lab.experiments import page as get_experiment
from cmq.lab.experiments import tuning
from cmq.pipeline.report import ReportData


def _row(timeout: float, idle_gap: float | str, mean_us: float) -> dict[str, Any]:
    p: dict[str, Any] = {"qthresh": 512, "timeout": timeout, "idle_gap": idle_gap}
    return {
        "experiment": tuning.IDLE_ID, "scenario": "pingpong", "system": "cmq", "size": 64,
        "params": str(p), "p": p, "messages": 20, "delivered": 20, "lost": 0, "loss_rate": 0.0,
        "mean_ns": mean_us * 1e3, "stddev_ns": 10.0, "p50_ns": 1.0, "p99_ns": 2 * mean_us * 1e3,
        "duplicates": 0, "out_of_order": 0, "msgs_per_s": 1e3, "mb_per_s": 0.0,
        "round_trip": True, "rate_source": "records",
    }  # fmt: skip


def _data(off_latency_us: tuple[float, float]) -> ReportData:
    rows = []
    for t, on_us, off_us in zip((0.001, 0.2), (120.0, 130.0), off_latency_us, strict=True):
        rows += [_row(t, 5e-6, on_us), _row(t, "inf", off_us)]
    return ReportData(summary=rows)


def test_the_section_is_registered_with_the_report() -> None:
    exp = get_experiment(tuning.IDLE_ID)
    assert exp is not None and len(exp.claims) == 1


def test_the_timeout_matters_without_the_idle_rule() -> None:
    exp = get_experiment(tuning.IDLE_ID)
    assert exp is not None
    verdict = exp.claims[0].judge(_data((1500.0, 200_000.0)))
    assert verdict.status == "pass"
    assert (
        "round trip across timeouts 1-200 ms varies 1.1x with the idle rule and 133.3x without it"
        in verdict.result
    )
    assert "at 200 ms it is 130 µs with the rule and 200,000 µs without" in verdict.result
    assert exp.claims[0].judge(_data((130.0, 125.0))).status == "fail"
    assert exp.claims[0].judge(ReportData()).status == "inconclusive"


def test_the_section_renders() -> None:
    exp = get_experiment(tuning.IDLE_ID)
    assert exp is not None
    section = exp.render(_data((1500.0, 200_000.0)), tuning.IDLE_ID)
    assert len(section.figures) == 1 and section.figures[0].startswith("<svg")
    table = section.tables[0]
    assert table.caption == "qthresh 512 B, idle rule on and off: ping-pong round trip (µs)"
    assert [list(r) for r in table.rows] == [
        ["1", "120", "1,500", "240", "3,000"],
        ["200", "130", "200,000", "260", "400,000"],
    ]
