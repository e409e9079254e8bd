"""One small ``cmq lab`` run through everything: processes, namespaces, Parquet, Spark, the page.

The only lab test that starts Spark (it shares the pipeline tests' session):
Figures 5 and 6 for cmq and raw UDP at 512 B, 30 round trips each, and the
scalability experiment at its tiny scale.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from cmq import cli
from cmq.lab import netns
from cmq.lab.records import read_table

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_a_tiny_lab_run_writes_records_and_the_report(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "lab"
    code = cli.main(["lab", "--profile", "tiny", "--only", "fig5,fig6,scale", "--systems", "cmq,udp",
                     "--sizes", "512", "--count", "30", "--out", str(out)])  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured.out + captured.err
    lossy = netns.unavailable(loss=True) is None

    records = read_table(out, "records").to_pylist()
    groups = {(r["experiment"], r["system"], r["scenario"], r["size"]) for r in records}
    expected = {("cmq-fig5", s, m, 512) for s in ("cmq", "udp") for m in ("pingpong", "pingping")}
    if lossy:
        expected |= {
            ("cmq-fig6", s, m, 512) for s in ("cmq", "udp") for m in ("pingpong", "pingping")
        }
    assert groups == expected
    # Figure 6 runs each cell twice: its lossless baseline, then under loss.
    per_group = {g: 60 if g[0] == "cmq-fig6" else 30 for g in expected}
    assert len(records) == sum(per_group.values())
    fig6 = [r for r in records if r["experiment"] == "cmq-fig6"]
    assert sorted({json.loads(r["params"])["loss"] for r in fig6}) == ([0.0, 0.014] if lossy else [])
    assert all(r["round_trip"] for r in records)
    runs = read_table(out, "runs").to_pylist()
    assert {r["status"] for r in runs} == {"ok"} if lossy else {"ok", "skipped"}
    fig6_losses = {r["loss"] for r in runs if r["experiment"] == "cmq-fig6"}
    assert fig6_losses == ({0.0, 0.014} if lossy else {0.0})
    samples = read_table(out, "samples").to_pylist()
    assert {r["metric"] for r in samples} == {"push_ns", "rss_bytes"}
    assert {r["x"] for r in samples if r["metric"] == "push_ns"} == {1.0, 1000.0}

    page = (out / "report.html").read_text(encoding="utf-8")
    for section in ("cmq-fig5", "cmq-fig6", "scalability"):
        assert f'<section id="{section}">' in page
    assert page.count("<svg") >= 3
    assert not re.search(r"<script|https?://(?!www\.w3\.org)", page)
    # The page says which profile made it and how long each experiment took.
    assert "<b>lab profile:</b> tiny (custom)" in page
    assert re.search(r"<b>time per experiment:</b> cmq-fig5 \d+ s, cmq-fig6 \d+ s, scalability \d+ s", page)

    summary = captured.out
    assert "tiny (custom) profile, 3 experiments" in summary
    assert re.search(r"time per experiment: cmq-fig5 \d+s, cmq-fig6 \d+s, scalability \d+s", summary)
    assert "ping-pong 512 B, median round trip (runs): " in summary
    # A tiny run has one run a side and a short range: its verdicts say what
    # they lack rather than pass or fail on too little.
    verdicts = [line for line in summary.splitlines() if line.startswith("  [")]
    statuses = [line.split("]")[0][3:] for line in verdicts]
    assert verdicts and all(s.split(", ")[0] in ("pass", "fail", "inconclusive", "context") for s in statuses)
    # Fewer runs than the full profile's: every judged verdict is marked indicative.
    assert all(s.endswith(", indicative") for s in statuses if s != "context")
    assert "Runs behind each judged figure: 1 in the tiny (custom) profile, 5 in the full profile." in page
    assert any("3 runs a side" in line or "needs" in line.lower() for line in verdicts)
    assert summary.rstrip().endswith(f"report: {(out / 'report.html').resolve()}")
