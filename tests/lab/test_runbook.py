"""How runner results become lab records: rows, totals, skips and failures (no processes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cmq.lab import runner
from cmq.lab.experiments._record import RunBook, pin_label, step_progress
from cmq.lab.records import read_table


def _rt(
    system: str, size: int, recv: tuple[int, ...], mode: str = "pingpong"
) -> runner.RoundTripResult:
    return runner.RoundTripResult(
        system=system, size=size, mode=mode, pin="none",
        send_ns=tuple(1000 * i for i in range(len(recv))), recv_ns=recv,
    )  # fmt: skip


def test_round_trips_totals_skips_and_failures(tmp_path: Path) -> None:
    results: list[runner.Result] = [
        runner.Skipped(system="nats", reason="no nats-server: apt-get install nats-server"),
        _rt("cmq", 512, (500, -1, 2500)),
        runner.Failed(system="zmq", size=512, error="zmq pingpong_server: exited (code 1)"),
        _rt("zmq", 4, (100, 1200, 2300)),
        runner.ThroughputResult(system="udp", size=64, sent=1000, delivered=990, seconds=0.01,
                                pin="none"),
        runner.ThroughputResult(system="tcp", size=64, sent=10, delivered=0, seconds=0.0,
                                pin="none"),
    ]  # fmt: skip
    with RunBook(tmp_path, "cmq-fig5", pin="none", loss=0.0, params={"count": 3}) as book:
        book.add(results, params={"window": 16})
    records = read_table(tmp_path, "records").to_pylist()
    cmq_rows = sorted((r for r in records if r["system"] == "cmq"), key=lambda r: r["seq"])
    assert [(r["seq"], r["send_ns"], r["recv_ns"], r["lost"]) for r in cmq_rows] == [
        (0, 0, 500, False), (1, 1000, None, True), (2, 2000, 2500, False),
    ]  # fmt: skip
    assert {r["scenario"] for r in records} == {"pingpong"}
    assert all(r["round_trip"] and json.loads(r["params"]) == {"window": 16} for r in records)
    totals = read_table(tmp_path, "totals").to_pylist()
    assert [(t["system"], t["sent"], t["delivered"], t["duration_ns"]) for t in totals] == [
        ("udp", 1000, 990, 10_000_000)
    ]
    runs = {r["system"]: r for r in read_table(tmp_path, "runs").to_pylist()}
    assert runs["nats"]["status"] == "skipped" and "apt-get" in runs["nats"]["reason"]
    assert runs["cmq"]["status"] == "ok" and runs["udp"]["status"] == "ok"
    # A run that measured some sizes keeps its rows but says what failed.
    assert runs["zmq"]["status"] == "failed" and "512 B failed" in runs["zmq"]["reason"]
    assert runs["tcp"]["status"] == "failed" and "no rate" in runs["tcp"]["reason"]
    assert json.loads(runs["cmq"]["params"]) == {"count": 3}
    assert "python" in json.loads(runs["cmq"]["versions"])
    assert set(book.failures) == {
        "cmq-fig5 zmq 512 B failed: zmq pingpong_server: exited (code 1)",
        "cmq-fig5 tcp 64 B: 0 of 10 delivered, no rate to measure",
    }


def test_params_of_successive_calls_stay_apart(tmp_path: Path) -> None:
    # Each add() has its own params, even when a dict's memory is reused.
    with RunBook(tmp_path, "tuning") as book:
        for q in (64, 512, 4096):
            book.add([_rt("cmq", 64, (10,))], scenario="latency", params={"qthresh": q})
    got = sorted(
        json.loads(r["params"])["qthresh"] for r in read_table(tmp_path, "records").to_pylist()
    )
    assert got == [64, 512, 4096]


def test_an_exception_marks_every_run_failed_and_keeps_rows(tmp_path: Path) -> None:
    with pytest.raises(KeyboardInterrupt), RunBook(tmp_path, "cmq-fig5") as book:
        book.add([_rt("cmq", 4, (10, 20))])
        raise KeyboardInterrupt
    assert len(read_table(tmp_path, "records")) == 2
    (run,) = read_table(tmp_path, "runs").to_pylist()
    assert run["status"] == "failed" and "KeyboardInterrupt" in run["reason"]


def test_step_progress_advances_once_per_finished_run() -> None:
    labels: list[str] = []
    progress = step_progress(labels.append)
    for done, label in [(0, "a"), (1, "b"), (2, "c"), (3, "done")]:
        progress(done, 3, label)
    assert labels == ["b", "c", "done"]


def test_pin_label() -> None:
    assert pin_label("none") == "none"
    assert pin_label("same").startswith("same-core:")
