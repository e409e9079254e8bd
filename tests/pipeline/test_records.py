"""The record writer and reader (pyarrow only, no Spark)."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cmq import ConfigError
from cmq.lab.records import RecordWriter, RunInfo, params_json, read_table


def test_rows_round_trip_with_exact_int64_nanoseconds(tmp_path: Path) -> None:
    big = 2**62 + 1  # beyond float64's 53 bits
    run = RunInfo(experiment="x", system="cmq", run_id="r1", versions={"cmq": "0.1"}, loss=0.014)
    with RecordWriter(tmp_path, run, flush_rows=2) as w:
        w.record(
            size=4,
            seq=0,
            send_ns=big,
            recv_ns=big + 7,
            scenario="pingpong",
            params={"b": 1, "a": 2},
        )
        w.record(
            size=4, seq=1, send_ns=big, recv_ns=None, scenario="pingpong", params={"a": 2, "b": 1}
        )
        w.record_many(size=8, seq=[2, 3], send_ns=[1, 2], recv_ns=[None, 5])
    records = read_table(tmp_path, "records")
    assert records.num_rows == 4
    assert sorted(p.name for p in (tmp_path / "records").iterdir()) == [
        "r1-00000.parquet",
        "r1-00001.parquet",
    ]
    rows = records.to_pylist()
    assert rows[0]["recv_ns"] - rows[0]["send_ns"] == 7
    assert rows[0]["recv_ns"] == big + 7
    assert [r["lost"] for r in rows] == [False, True, True, False]
    assert {r["params"] for r in rows[:2]} == {'{"a":2,"b":1}'}
    (meta,) = read_table(tmp_path, "runs").to_pylist()
    assert meta["status"] == "ok" and meta["skipped"] is False
    assert json.loads(meta["versions"]) == {"cmq": "0.1"}
    assert meta["loss"] == 0.014
    assert meta["cores"] >= 1


def test_params_follow_each_row_even_when_a_dict_is_reused_or_mutated(tmp_path: Path) -> None:
    with RecordWriter(tmp_path, RunInfo(experiment="x", system="cmq")) as w:
        for q in (64, 512):
            w.record(size=1, seq=q, send_ns=0, recv_ns=1, params={"qthresh": q})
        params = {"qthresh": 1}
        w.record(size=1, seq=1, send_ns=0, recv_ns=1, params=params)
        params["qthresh"] = 2
        w.record(size=1, seq=2, send_ns=0, recv_ns=1, params=params)
    got = [(r["seq"], r["params"]) for r in read_table(tmp_path, "records").to_pylist()]
    assert got == [
        (64, '{"qthresh":64}'),
        (512, '{"qthresh":512}'),
        (1, '{"qthresh":1}'),
        (2, '{"qthresh":2}'),
    ]


def test_a_failing_run_keeps_its_rows_and_says_why(tmp_path: Path) -> None:
    with (
        pytest.raises(RuntimeError),
        RecordWriter(tmp_path, RunInfo(experiment="x", system="tcp", run_id="r2")) as w,
    ):
        w.totals(size=1, sent=10, delivered=10, duration_ns=5)
        raise RuntimeError("peer vanished")
    (meta,) = read_table(tmp_path, "runs").to_pylist()
    assert meta["status"] == "failed"
    assert meta["reason"] == "RuntimeError: peer vanished"
    assert read_table(tmp_path, "totals").num_rows == 1


def test_a_skipped_run_is_one_metadata_row(tmp_path: Path) -> None:
    with RecordWriter(tmp_path, RunInfo(experiment="x", system="nats", run_id="r3")) as w:
        w.skip("no nats-server on 127.0.0.1:4222: apt-get install nats-server")
    (meta,) = read_table(tmp_path, "runs").to_pylist()
    assert meta["skipped"] is True and meta["status"] == "skipped"
    assert "nats-server" in meta["reason"]
    assert read_table(tmp_path, "records").num_rows == 0
    assert not (tmp_path / "records").exists()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"experiment": ""},
        {"system": ""},
        {"run_id": "../etc"},
        {"loss": 1.5},
        {"cores": 0},
        {"started_at": datetime(2026, 1, 1)},
        {"params": {"x": object()}},
    ],
)
def test_bad_run_info_is_refused_at_construction(kwargs: dict[str, object]) -> None:
    base: dict[str, object] = {"experiment": "x", "system": "cmq"}
    with pytest.raises(ConfigError):
        RunInfo(**{**base, **kwargs})  # type: ignore[arg-type]


def test_bad_rows_are_refused(tmp_path: Path) -> None:
    w = RecordWriter(tmp_path, RunInfo(experiment="x", system="cmq"))
    with pytest.raises(ConfigError):
        w.record_many(size=1, seq=[1, 2], send_ns=[1], recv_ns=[1, 2])
    with pytest.raises(ConfigError):
        w.totals(size=1, sent=1, delivered=2, duration_ns=1)
    with pytest.raises(ConfigError):
        w.record(size=1, seq=0, send_ns=0, recv_ns=0, params="[1]")
    w.close()
    with pytest.raises(ConfigError):
        w.record(size=1, seq=0, send_ns=0, recv_ns=0)
    with pytest.raises(ConfigError):
        read_table(tmp_path, "nope")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)


@given(st.dictionaries(st.text(max_size=8), json_values, max_size=5))
def test_params_json_is_canonical(params: dict[str, object]) -> None:
    encoded = params_json(params)
    assert params_json(encoded) == encoded
    assert json.loads(encoded) == params
    assert params_json(dict(reversed(list(params.items())))) == encoded
