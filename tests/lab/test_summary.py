"""The command's summary: headline figures from the aggregates, and its layout (no Spark)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cmq.commands.lab import _summary
from cmq.lab.orchestrate import LabResult, Verdict, headline_figures
from cmq.pipeline.report import ReportData


def _rt(experiment: str, system: str, size: int, mean_us: float, sd_us: float = 1.0,
        p50_us: float | None = None, runs: int = 1, **p: Any) -> dict[str, Any]:  # fmt: skip
    return {"experiment": experiment, "scenario": "pingpong", "system": system, "size": size,
            "p": p, "mean_ns": mean_us * 1e3, "stddev_ns": sd_us * 1e3, "msgs_per_s": None,
            "p50_ns": (p50_us if p50_us is not None else mean_us) * 1e3, "runs": runs}  # fmt: skip


def _tp(system: str, size: int, rate: float) -> dict[str, Any]:
    return {"experiment": "zmq-throughput", "scenario": "throughput", "system": system,
            "size": size, "p": {}, "mean_ns": None, "msgs_per_s": rate,
            "mb_per_s": rate * size / 1e6}  # fmt: skip


def test_headline_figures() -> None:
    data = ReportData(
        summary=[
            _rt("cmq-fig5", "cmq", 512, 1_777.0, p50_us=41.0, runs=3), _rt("cmq-fig5", "udp", 512, 44.2),
            _rt("cmq-fig5", "cmq", 4, 50.0),
            _rt("cmq-fig6", "tcp", 512, 7097.0, 38227.0), _rt("cmq-fig6", "cmq", 512, 132.4, 526.6),
            _tp("cmq", 1, 391_000), _tp("zmq", 1, 1_020_000), _tp("zmq", 16384, 31_000),
            _rt("tuning-idle", "cmq", 64, 213.0, qthresh=512, timeout=0.2, idle_gap=5e-6),
            _rt("tuning-idle", "cmq", 64, 402_000.0, qthresh=512, timeout=0.2, idle_gap="inf"),
        ],
        samples=[
            {"experiment": "scalability", "metric": "push_ns", "system": "cmq", "x": 1.0, "mean": 5384.0},
            {"experiment": "scalability", "metric": "push_ns", "system": "cmq", "x": 1e5, "mean": 10657.0},
        ],
        series=[
            {"experiment": "scalability", "metric": "rss_bytes", "system": "cmq", "t_s": t, "value": v}
            for t, v in ((0.0, 24.8e6), (6.0, 32.7e6), (12.0, 32.7e6))
        ],
    )  # fmt: skip
    assert headline_figures(data) == [
        "ping-pong 512 B, median round trip (runs): cmq 41.0 µs (3), udp 44.2 µs (1)",
        "ping-pong 512 B under loss, mean (sd): cmq 132 µs (527 µs), tcp 7,097 µs (38 ms)",
        "throughput 1 B: zmq 1,020k msgs/s (1.0 MB/s), cmq 391k msgs/s (0.4 MB/s)",
        "throughput 16384 B: zmq 31k msgs/s (507.9 MB/s)",
        "batch timeout 200 ms, polled ping-pong mean: 213 µs with the idle rule, 402 ms without",
        "push cost: 1 destinations 5,384 ns, 100,000 destinations 10,657 ns",
        "receiver RSS: 24.8 MB at start, 32.7 MB after 12 s (median 32.7 MB)",
    ]
    assert headline_figures(ReportData()) == []


def test_summary_layout() -> None:
    result = LabResult(
        out=Path("/tmp/x"), report=Path("/tmp/x/report.html"), profile="quick",
        experiments=("cmq-fig5",), seconds=250.3, pipeline_seconds=55.4, times={"cmq-fig5": 190.2},
        runs={"ok": 21, "skipped": 2}, skipped=("nats: no nats-server: apt-get install nats-server",),
        failures=(), headlines=("ping-pong 512 B, mean round trip: udp 44.2 µs",),
        verdicts=(Verdict(experiment="cmq-fig5", claim="c", status="pass", result="r"),
                  Verdict(experiment="cmq-fig6", claim="c", status="fail", result="q", indicative=True)),
    )  # fmt: skip
    assert _summary(result).splitlines() == [
        "cmq lab: quick profile, 1 experiments, runs: 21 ok, 2 skipped; 4m10.3s (pipeline 55.4s)",
        "  time per experiment: cmq-fig5 190s",
        "  ping-pong 512 B, mean round trip: udp 44.2 µs",
        "claims:",
        "  [pass] cmq-fig5: r",
        "  [fail, indicative] cmq-fig6: q",
        "skipped nats: no nats-server: apt-get install nats-server",
        "report: /tmp/x/report.html",
    ]


def test_piped_progress_prints_a_line_at_least_every_heartbeat() -> None:
    """Without a terminal (output piped), a long step still says what runs."""
    import threading

    from cmq.lab.orchestrate import Ui

    lines: list[str] = []
    beat = threading.Event()

    class Recording(Ui):
        HEARTBEAT = 0.1

        def say(self, text: str) -> None:
            super().say(text)
            lines.append(text)
            if "steps" in text:
                beat.set()

    ui = Recording(bar=False)
    with ui.session(8):
        ui.advance("cmq-fig5: pingpong cmq 512 B", 3)
        assert beat.wait(timeout=30), "no heartbeat line"
    (line,) = [x for x in lines if "steps" in x][:1]
    assert line.startswith("cmq lab: 3/8 steps, 0m")
    assert line.endswith(": cmq-fig5: pingpong cmq 512 B ...")
    quiet = Recording(bar=False, quiet=True)
    with quiet.session(8):
        quiet.advance("x")
    # A quiet run prints nothing; the heartbeat thread is not even started.
    assert all("x ..." not in x for x in lines)


def test_lab_json_carries_the_runs_behind_each_experiment(tmp_path: Path) -> None:
    from cmq.lab.experiments import PROFILES, get, runs_behind
    from cmq.lab.orchestrate import read_runs, write_facts

    # The quick profile measures Figure 5's compared cells in fewer runs than the full one.
    fig5 = runs_behind(get("cmq-fig5"), PROFILES["quick"])
    assert fig5 is not None and fig5[0] < fig5[1]
    write_facts(tmp_path, "quick", {"cmq-fig5": 12.0}, {"cmq-fig5": fig5})
    assert read_runs(tmp_path) == ("quick", {"cmq-fig5": fig5})
    assert read_runs(tmp_path / "missing") == ("", {})
