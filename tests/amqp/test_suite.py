"""The AMQP suite's shape: plans, records from stamps, and a tiny live run per benchmark kind."""

from __future__ import annotations

import dataclasses
import json
from array import array
from pathlib import Path

import pytest

from cmq import ConfigError
from cmq.lab.experiments import PROFILES, experiments, pages
from cmq.lab.experiments._record import RunBook
from cmq.lab.experiments.amqp import plans
from cmq.lab.experiments.amqp._worker import body, read_stamps, seq_of, write_stamps
from cmq.lab.experiments.amqp.plans import AMQP_PROFILES, AmqpProfile, amqp_profile, measure, points
from cmq.lab.experiments.amqp.report import collapse
from cmq.lab.experiments.amqp.suite import Point, Stream, sync_every
from cmq.lab.experiments.amqp.transport import rabbit_available
from cmq.lab.records import read_table

TINY = AMQP_PROFILES["tiny"]
BENCHES = ("de-spsc", "de-mpmc", "de-pp", "fe-spmc", "te-spsc")


def test_every_benchmark_and_the_simulation_are_lab_and_pages() -> None:
    ids = {f"amqp-{b}" for b in BENCHES} | {"amqp-stockex"}
    lab = {e.id: e for e in experiments()}
    assert ids <= set(lab)
    assert {a for i in ids for a in lab[i].aliases} == {*BENCHES, "stockex"}
    reports = {e.id: e for e in pages()}
    assert ids <= set(reports)
    for i in ids:
        assert reports[i].claims, i


def test_points_vary_what_the_paper_varies() -> None:
    p = AMQP_PROFILES["full"]
    spsc = points("de-spsc", p)
    assert [x.size for x in spsc] == list(p.sizes)
    assert min(p.sizes) == 1 and max(p.sizes) == 1 << 20
    mpmc = points("de-mpmc", p)
    assert [x.params["pairs"] for x in mpmc] == [1, 2, 4, 8]
    for x in mpmc:
        assert x.point is not None
        k = x.params["pairs"]
        assert len(x.point.publishers) == len(x.point.consumers) == len(x.point.queues) == k
        assert {s.key for s in x.point.publishers} == {
            k for keys in x.point.queues.values() for k in keys
        }
    fe = points("fe-spmc", p)
    assert max(x.params["consumers"] for x in fe) == 32
    assert all(x.point is not None and x.point.kind == "fanout" for x in fe)
    te = points("te-spsc", p)
    assert max(x.params["bindings"] for x in te) == 1024
    for x in te:
        assert x.point is not None
        assert len(x.point.queues["q"]) == 1 + x.params["bindings"]
    assert all(x.point is None for x in points("de-pp", p))
    with pytest.raises(ConfigError):
        points("de-nope", p)


def test_large_messages_are_capped_by_volume() -> None:
    p = AMQP_PROFILES["quick"]
    assert p.count_for(1 << 20, p.count) == 20 and p.count_for(16, p.count) == p.count
    assert sync_every(16) == 256 and sync_every(1 << 20) == 1


def test_profiles_validate_and_follow_the_lab_profile() -> None:
    with pytest.raises(ConfigError):
        AmqpProfile(name="x", sizes=())
    with pytest.raises(ConfigError):
        AmqpProfile(name="x", count=0)
    assert amqp_profile(PROFILES["quick"]) is AMQP_PROFILES["quick"]
    import dataclasses

    custom = dataclasses.replace(PROFILES["tiny"], name="tiny (custom)", tp_sizes=(7, 9))
    assert amqp_profile(custom).sizes == (7, 9) == amqp_profile(custom).pp_sizes


def test_point_validation() -> None:
    with pytest.raises(ConfigError):
        Point(kind="headers", queues={"q": []}, publishers=[Stream(key="", count=1, size=1)],
              consumers=["q"], expect=1)  # fmt: skip
    with pytest.raises(ConfigError):
        Point(kind="direct", queues={"q": []}, publishers=[Stream(key="", count=1, size=1)],
              consumers=["other"], expect=1)  # fmt: skip


@pytest.mark.parametrize("size", [1, 3, 4, 5, 1000])
def test_bodies_carry_their_seq_where_it_fits(size: int) -> None:
    b = body(70000, size)
    assert len(b) == size
    assert seq_of(b, 12) == (70000 if size >= 4 else 12)


def test_stamps_round_trip(tmp_path: Path) -> None:
    a, b = array("q", [1, 2, 3]), array("q", [-1, 5, 2**62])
    write_stamps(tmp_path / "s", a, b)
    assert read_stamps(tmp_path / "s") == [a, b]


def test_rows_count_losses_duplicates_and_strays() -> None:
    sent = array("q", [10, 20, 30, 40])
    seqs, recv = array("q", [0, 2, 2, 9]), array("q", [11, 32, 33, 99])
    seq, send, got, stray = plans._rows(sent, seqs, recv)
    assert stray == 1
    assert list(zip(seq, send, got, strict=True)) == [
        (0, 10, 11), (2, 30, 32), (2, 30, 33), (1, 20, None), (3, 40, None),
    ]  # fmt: skip


def _run(tmp_path: Path, bench: str, systems: list[str], profile: AmqpProfile) -> dict[str, int]:
    steps: list[str] = []
    with RunBook(tmp_path, f"amqp-{bench}") as book:
        measure(bench, f"amqp-{bench}", book, systems, profile, step=steps.append, say=print)
    assert len(steps) == len(points(bench, profile)) * len(systems) * profile.repeat
    runs = read_table(tmp_path, "runs").to_pylist()
    assert [r["status"] for r in runs] == ["ok"] * len(systems), runs
    rows = read_table(tmp_path, "records").to_pylist()
    return {
        "rows": len(rows),
        "lost": sum(r["lost"] for r in rows),
        "receivers": len({(r["system"], r["params"], r["receiver"]) for r in rows}),
        "cpu": len(read_table(tmp_path, "samples").to_pylist()),
    }


SMALL = AmqpProfile(name="test", sizes=(16,), count=200, volume=1 << 20, pp_sizes=(16,), pp_count=10,
                    pairs=(2,), pair_count=100, consumers=(3,), fanout_count=100, bindings=(8,),
                    topic_count=100, repeat=1)  # fmt: skip


@pytest.mark.slow
def test_fanout_one_row_per_consumer_and_message(tmp_path: Path) -> None:
    got = _run(tmp_path, "fe-spmc", ["cmq"], SMALL)
    assert got["rows"] == 3 * 100 and got["receivers"] == 3
    assert got["cpu"] == 2  # broker CPU per wall second, and per message


@pytest.mark.slow
def test_mpmc_and_topic_and_pingpong_on_cmq(tmp_path: Path) -> None:
    assert _run(tmp_path / "mpmc", "de-mpmc", ["cmq"], SMALL)["rows"] == 2 * 100
    assert _run(tmp_path / "te", "te-spsc", ["cmq"], SMALL)["rows"] == 100
    pp = read_pp(tmp_path / "pp")
    assert len(pp) == SMALL.count_for(16, SMALL.pp_count) and all(r["round_trip"] for r in pp)


def read_pp(out: Path) -> list[dict[str, object]]:
    _run(out, "de-pp", ["cmq"], SMALL)
    rows: list[dict[str, object]] = read_table(out, "records").to_pylist()
    return rows


@pytest.mark.slow
def test_spsc_beside_rabbitmq(tmp_path: Path) -> None:
    why = rabbit_available()
    if why is not None:
        pytest.skip(why)
    got = _run(tmp_path, "de-spsc", ["cmq", "rabbitmq"], SMALL)
    assert got["rows"] == 2 * 200 and got["receivers"] == 2


def test_spsc_and_pingpong_through_pika_on_the_cmq_broker(tmp_path: Path) -> None:
    pytest.importorskip("pika", reason="pika is not installed: pip install 'pycmq[test]'")
    pytest.importorskip("pamqp", reason="pamqp is not installed: pip install 'pycmq[broker]'")
    got = _run(tmp_path / "spsc", "de-spsc", ["cmq-pika"], SMALL)
    assert got["rows"] == 200 and got["lost"] == 0 and got["receivers"] == 1
    assert got["cpu"] == 2  # the broker's process is measured as for "cmq"
    rows = read_table(tmp_path / "spsc", "records").to_pylist()
    assert {r["system"] for r in rows} == {"cmq-pika"}


def _row(system: str, rate: float, repeat: int) -> dict[str, object]:
    params = {"bindings": 8, "repeat": repeat}
    return {"experiment": "amqp-te-spsc", "system": system, "scenario": "te-spsc", "size": 64,
            "params": json.dumps(params), "p": params, "msgs_per_s": rate, "mean_ns": rate}  # fmt: skip


def test_repeats_collapse_to_the_median_repeat() -> None:
    rows = [_row("cmq", r, k) for k, r in enumerate((30.0, 10.0, 20.0))] + [
        _row("rabbitmq", 5.0, 0)
    ]
    got = {r["system"]: r for r in collapse(rows)}
    assert got["cmq"]["msgs_per_s"] == 20.0 and got["cmq"]["mean_ns"] == 20.0
    assert (got["cmq"]["repeats"], got["cmq"]["rate_min"], got["cmq"]["rate_max"]) == (
        3,
        10.0,
        30.0,
    )
    assert got["cmq"]["p"] == {"bindings": 8} == got["rabbitmq"]["p"]
    assert got["cmq"]["params"] == got["rabbitmq"]["params"]


@pytest.mark.slow
def test_repeats_are_groups_of_their_own(tmp_path: Path) -> None:
    profile = dataclasses.replace(SMALL, repeat=2)
    got = _run(tmp_path, "te-spsc", ["cmq"], profile)
    assert got["rows"] == 2 * 100 and got["receivers"] == 2
