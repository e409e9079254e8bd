"""The documentation site builds with warnings as errors, and its results page renders a lab run."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs.examples import ROOT

pytest.importorskip("mkdocs", reason="the site needs the 'docs' extra")


def _build(site: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1", **env},
    )  # fmt: skip


def _lab_run(out: Path) -> None:
    """A lab output directory as `cmq lab --out` leaves it: runs table, lab.json, report page."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from cmq.pipeline.schema import TABLES

    schema = TABLES["runs"]
    start = dt.datetime(2026, 11, 24, 1, 42, tzinfo=dt.UTC)
    base = {f.name: None for f in schema}
    rows = []
    for i, (exp, system, skipped, reason) in enumerate([
        ("cmq-fig5", "cmq", False, ""), ("cmq-fig5", "udp", False, ""),
        ("cmq-fig5", "nats", True, "nothing answers on 127.0.0.1:4222"),
    ]):  # fmt: skip
        rows.append({
            **base, "run_id": f"r{i}", "experiment": exp, "system": system,
            "started_at": start + dt.timedelta(seconds=i), "finished_at": start + dt.timedelta(seconds=i + 1),
            "status": "skipped" if skipped else "ok", "skipped": skipped, "reason": reason,
            "versions": "{}", "pin": "none", "loss": 0.0, "host": "testhost", "cores": 2, "params": "{}",
        })  # fmt: skip
    (out / "runs").mkdir(parents=True)
    for f in schema:  # every column the schema has, with a value where it must
        if not f.nullable and any(r[f.name] is None for r in rows):
            default = {pa.string(): "", pa.int32(): 0, pa.int64(): 0, pa.float64(): 0.0, pa.bool_(): False}
            for r in rows:
                if r[f.name] is None:
                    r[f.name] = default.get(f.type, "")
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), out / "runs" / "part-0.parquet")
    # Round trips of 10, 20 and 30 µs (cmq) and 5 µs (udp), a lost one, and another experiment's.
    t0 = 1_000_000_000
    records = [
        {"experiment": "cmq-fig5", "run_id": "r0", "system": "cmq", "scenario": "ping-pong",
         "params": "{}", "size": 512, "seq": i, "send_ns": t0, "recv_ns": t0 + us * 1000,
         "lost": False, "round_trip": True, "stream": "", "receiver": "", "request_ns": None}
        for i, us in enumerate([10, 30, 20])
    ] + [
        {"experiment": "cmq-fig5", "run_id": "r1", "system": "udp", "scenario": "ping-pong",
         "params": "{}", "size": 512, "seq": 0, "send_ns": t0, "recv_ns": t0 + 5000,
         "lost": False, "round_trip": True, "stream": "", "receiver": "", "request_ns": None},
        {"experiment": "cmq-fig5", "run_id": "r1", "system": "udp", "scenario": "ping-pong",
         "params": "{}", "size": 512, "seq": 1, "send_ns": t0, "recv_ns": None,
         "lost": True, "round_trip": True, "stream": "", "receiver": "", "request_ns": None},
        {"experiment": "tuning", "run_id": "r2", "system": "cmq", "scenario": "ping-pong",
         "params": "{}", "size": 512, "seq": 0, "send_ns": t0, "recv_ns": t0 + 9_000_000,
         "lost": False, "round_trip": True, "stream": "", "receiver": "", "request_ns": None},
    ]  # fmt: skip
    (out / "records").mkdir()
    pq.write_table(pa.Table.from_pylist(records, schema=TABLES["records"]), out / "records" / "part-0.parquet")
    (out / "lab.json").write_text(json.dumps({"profile": "quick", "experiment_seconds": {"cmq-fig5": 41.0}}))
    (out / "report.html").write_text("<html><body>the run's own page</body></html>")


def test_site_builds_strict(tmp_path: Path) -> None:
    """Every page, link, anchor and API reference entry resolves; a warning fails the build."""
    proc = _build(tmp_path / "site")
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = (tmp_path / "site" / "results" / "index.html").read_text(encoding="utf-8")
    assert "2026-11-24 at 01:42 UTC" in results  # the checked-in run, named with its date
    assert "This build's lab run" not in results
    reference = (tmp_path / "site" / "reference" / "index.html").read_text(encoding="utf-8")
    assert "AsyncQueue" in reference and "Send everything batched" in reference
    assert ":class:" not in reference and ":meth:" not in reference  # roles shown as code


def test_results_page_renders_a_given_lab_run(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import docs_results
    finally:
        sys.path.pop(0)
    out = tmp_path / "lab-out"
    _lab_run(out)
    text = docs_results.render(out)
    assert f"`{out}`" in text
    assert "started 2026-11-24 01:42 UTC" in text and "testhost (2 cores)" in text
    assert "profile: quick" in text
    assert "| cmq-fig5 | 41 | cmq | 1 | 0 |" in text
    assert "| nats | 0 | 1 (nothing answers on 127.0.0.1:4222) |" in text
    assert "| scenario | size (B) | cmq | udp |" in text  # only Figure 5's records
    assert "| ping-pong | 512 | 20.0 | 5.0 |" in text  # medians; the lost one left out
    with pytest.raises(FileNotFoundError):
        docs_results.render(tmp_path / "empty")


def test_site_builds_with_a_lab_run(tmp_path: Path) -> None:
    out = tmp_path / "lab-out"
    _lab_run(out)
    proc = _build(tmp_path / "site", CMQ_LAB_OUT=str(out))
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = (tmp_path / "site" / "results" / "index.html").read_text(encoding="utf-8")
    assert "This build's lab run" in results and "testhost (2 cores)" in results
    assert (tmp_path / "site" / "lab-report.html").read_text() == "<html><body>the run's own page</body></html>"
