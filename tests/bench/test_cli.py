"""``cmq bench``: the JSON it prints, its table, and its errors on bad input."""

from __future__ import annotations

import json
import os

import pytest

from cmq import cli
from cmq.lab.systems import load

PIN = "spread" if len(os.sched_getaffinity(0)) > 1 else "same"
THROUGHPUT_KEYS = {"system", "size", "sent", "delivered", "seconds", "msgs_per_s", "mb_per_s"}
PINGPONG_KEYS = {"system", "size", "round_trips", "lost", "mean_us", "p50_us", "p99_us", "stdev_us"}


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[dict[str, object], str]:
    assert cli.main(["bench", *argv]) == 0
    out, err = capsys.readouterr()
    return json.loads(out), err


def test_throughput_json_shape_and_a_skipped_system(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        load("nats"), "available", lambda: "no nats-server here: apt-get install it"
    )
    doc, err = _json(
        capsys,
        ["throughput", "--systems", "udp,tcp,nats", "--sizes", "16,1K", "--count", "300",
         "--pin", PIN, "--json"],
    )  # fmt: skip
    assert doc["scenario"] == "throughput" and doc["pin"] == PIN
    results = doc["results"]
    assert isinstance(results, list)
    assert {"system": "nats", "skipped": "no nats-server here: apt-get install it"} in results
    measured = [r for r in results if "skipped" not in r]
    assert sorted((r["system"], r["size"]) for r in measured) == [
        ("tcp", 16), ("tcp", 1024), ("udp", 16), ("udp", 1024)
    ]  # fmt: skip
    for r in measured:
        assert set(r) >= THROUGHPUT_KEYS
        assert r["sent"] == 300
    # One clear line on stderr for the skip.
    assert "skipped nats: no nats-server here" in err


def test_pingpong_json_shape_with_raw_stamps(capsys: pytest.CaptureFixture[str]) -> None:
    doc, _ = _json(
        capsys,
        ["pingpong", "--systems", "udp", "--sizes", "4", "--count", "20", "--pin", "same",
         "--json", "--raw"],
    )  # fmt: skip
    assert doc["scenario"] == "pingpong" and doc["pin"] == "same"
    [r] = doc["results"]  # type: ignore[misc]
    assert set(r) >= PINGPONG_KEYS
    assert r["round_trips"] + r["lost"] == 20
    assert len(r["send_ns"]) == len(r["recv_ns"]) == 20


def test_table_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", "pingping", "--systems", "tcp", "--sizes", "8", "--count", "10"]) == 0
    out = capsys.readouterr().out
    assert "cmq bench pingping" in out and "tcp" in out and "mean µs" in out


def test_destinations_json(capsys: pytest.CaptureFixture[str]) -> None:
    doc, _ = _json(capsys, ["destinations", "--count", "1", "--rounds", "1", "--json"])
    assert doc["scenario"] == "destinations"
    assert [r["destinations"] for r in doc["results"]] == [1, 100_000]  # type: ignore[union-attr]
    assert isinstance(doc["ratio"], float) and doc["ratio"] > 0


def test_push_cost_json_names_each_core_and_call(capsys: pytest.CaptureFixture[str]) -> None:
    from cmq import _impl

    doc, _ = _json(capsys, ["push", "--count", "2000", "--rounds", "1", "--json"])
    assert doc["scenario"] == "push"
    cores = {"compiled", "python"} if _impl.available() else {"python"}
    got = {(r["core"], r["call"]) for r in doc["results"]}  # type: ignore[union-attr]
    assert got == {(c, call) for c in cores for call in ("push", "sender")}
    assert all(r["ns_per_msg"] > 0 for r in doc["results"])  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["throughput", "--systems", "cmq,foo"], "unknown system 'foo'"),
        (["throughput", "--systems", "udp,,tcp"], "empty system name"),
        (["throughput", "--sizes", "4,abc"], "bad size 'abc'"),
        (["throughput", "--sizes", "0"], "at least 1 byte"),
        (["throughput", "--sizes", "-4"], "bad size '-4'"),
        (["throughput", "--count", "0"], "must be above 0"),
        (["throughput", "--duration", "x"], "not a float"),
        (["throughput", "--duration", "1", "--count", "5"], "not allowed with"),
        (["throughput", "--pin", "both"], "invalid choice: 'both'"),
        (["latency"], "invalid choice: 'latency'"),
    ],
)
def test_bad_arguments_fail_with_a_clear_message(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["bench", *argv])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["pingpong", "--systems", "udp", "--duration", "1"], "use --count, not --duration"),
        (["pingpong", "--systems", "udp", "--raw"], "--raw needs --json"),
    ],
)
def test_bad_combinations_fail_with_a_clear_message(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert cli.main(["bench", *argv]) == 1
    assert message in capsys.readouterr().err


def test_spread_on_one_cpu_is_a_clear_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from cmq.lab import runner

    monkeypatch.setattr(runner.os, "sched_getaffinity", lambda pid: {0})
    assert cli.main(["bench", "pingpong", "--systems", "udp", "--pin", "spread"]) == 1
    assert "--pin spread needs two CPUs" in capsys.readouterr().err
