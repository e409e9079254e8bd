"""``cmq lab``: its help, its errors on bad input, and its skip lines (no Spark here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cmq import cli
from cmq.lab import netns, runner
from cmq.lab.records import read_table
from cmq.lab.systems import load


def test_help_lists_the_experiments_and_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["lab", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for text in ("--out", "--quick", "--full", "--only", "--systems", "--master", "--loss",
                 "cmq-fig5", "cmq-fig6", "tuning", "scalability", "zmq-throughput"):  # fmt: skip
        assert text in out
    assert "--profile" not in out  # the tests' profile stays hidden


def test_top_level_help_names_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help"]) == 0
    assert "lab " in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--only", "fig7"], "unknown experiment 'fig7'"),
        (["--only", "fig5,"], "empty experiment name"),
        (["--systems", "cmq,kafka"], "unknown system 'kafka'"),
        (["--sizes", "4,0"], "at least 1 byte"),
        (["--sizes", "4,x"], "bad size"),
        (["--count", "0"], "at least 1"),
        (["--loss", "1.5"], "probability"),
        (["--loss", "lots"], "not a number"),
        (["--quick", "--full"], "not allowed with"),
        (["--pin", "sideways"], "invalid choice"),
    ],
)
def test_bad_arguments_fail_at_once(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["lab", *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_an_output_directory_with_records_is_not_overwritten(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "records").mkdir()
    (tmp_path / "records" / "old-00000.parquet").write_bytes(b"x")
    assert cli.main(["lab", "--out", str(tmp_path), "--only", "fig5"]) == 1
    err = capsys.readouterr().err
    assert "already holds lab records" in err and "--overwrite" in err
    assert (tmp_path / "records" / "old-00000.parquet").exists()


def test_missing_system_and_missing_root_are_skipped_with_one_line_each(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(load("nats"), "available",
                        lambda: "no nats-server at nats://127.0.0.1:4222: apt-get install nats-server")  # fmt: skip
    monkeypatch.setattr(netns, "unavailable", lambda loss=False: "network namespaces need root")
    out = tmp_path / "out"
    code = cli.main(["lab", "--profile", "tiny", "--only", "fig5,fig6", "--systems", "cmq,nats",
                     "--sizes", "64", "--count", "20", "--out", str(out), "--no-report"])  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured.err
    lines = captured.err.splitlines()
    assert [ln for ln in lines if "skipping nats" in ln] == [
        "cmq lab: skipping nats: no nats-server at nats://127.0.0.1:4222: apt-get install nats-server"
    ]
    assert len([ln for ln in lines if "skipping cmq-fig6" in ln and "need root" in ln]) == 1
    runs = {(r["experiment"], r["system"]): r for r in read_table(out, "runs").to_pylist()}
    assert runs["cmq-fig5", "cmq"]["status"] == "ok"
    assert runs["cmq-fig5", "nats"]["status"] == "skipped"
    assert "apt-get install nats-server" in runs["cmq-fig5", "nats"]["reason"]
    assert runs["cmq-fig6", "cmq"]["status"] == "skipped"
    assert "need root" in runs["cmq-fig6", "cmq"]["reason"]
    records = read_table(out, "records").to_pylist()
    assert {(r["system"], r["scenario"], r["size"]) for r in records} == {
        ("cmq", "pingpong", 64), ("cmq", "pingping", 64),
    }  # fmt: skip
    assert len(records) == 40
    assert "records:" in captured.out and "cmq report" in captured.out
    assert not (out / "report.html").exists()


def test_a_broken_experiment_does_not_stop_the_others(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object, **kwargs: object) -> list[runner.Result]:
        raise RuntimeError("runner broke")

    monkeypatch.setattr(runner, "run_pingpong", broken)
    out = tmp_path / "out"
    code = cli.main(["lab", "--profile", "tiny", "--only", "fig5,zmq", "--systems", "cmq",
                     "--sizes", "64", "--out", str(out), "--no-report"])  # fmt: skip
    captured = capsys.readouterr()
    assert code == 1
    assert "cmq lab: cmq-fig5 stopped: RuntimeError: runner broke" in captured.err
    assert "failed cmq-fig5 stopped: RuntimeError: runner broke" in captured.out
    totals = read_table(out, "totals").to_pylist()
    assert [(t["experiment"], t["system"], t["size"]) for t in totals] == [
        ("zmq-throughput", "cmq", 64)
    ]
