"""The queue service's lab experiments: shape, a tiny run of each, and the claims on known data.

The tiny runs start real ``cmq serve`` processes over SQLite and moto's server
(when installed): a few seconds for both. The claims are judged on summary
rows written by hand, whose answers are known; one Spark test checks that the
pipeline reads the tiny run's records as the experiment means them.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cmq import ConfigError
from cmq.lab.experiments import PROFILE_NAMES, PROFILES, Context, bdqs, get, resolve
from cmq.lab.records import read_table
from cmq.pipeline import report
from cmq.pipeline.report import ReportData, render_html
from cmq.service.bench import moto_server

MOTO = moto_server() is not None


def _ctx(out: Path, profile: str = "tiny", steps: list[str] | None = None) -> Context:
    p = PROFILES[profile]
    return Context(
        out=out,
        profile=p,
        systems=p.systems,
        step=(steps.append if steps is not None else lambda _label: None),
    )


# -- registry and configs ----------------------------------------------------------


def test_both_experiments_are_registered_with_the_lab_and_the_report() -> None:
    assert bdqs.EXPERIMENTS == (bdqs.ORDER, bdqs.THROUGHPUT)
    assert get("bdqs-fig2") is bdqs.ORDER and get("sqs-throughput") is bdqs.THROUGHPUT
    assert [e.id for e in resolve(["bdqs-throughput", "bdqs-order"])] == [
        "bdqs-order",
        "bdqs-throughput",
    ]
    for exp in bdqs.EXPERIMENTS:
        assert not exp.multi_system
        section = report.get_experiment(exp.id)
        assert section is not None and section.claims
        for name in PROFILE_NAMES:
            assert exp.steps(_ctx(Path("/nonexistent"), name)) >= 1


def test_every_profile_has_a_scale_and_quick_is_the_issue_scale() -> None:
    assert set(bdqs.ORDER_PROFILES) == set(bdqs.THROUGHPUT_PROFILES) == set(PROFILE_NAMES)
    quick = bdqs.ORDER_PROFILES["quick"]
    assert quick.t_recvs == (1, 2, 3) and len(quick.ks) == 4 and quick.stores == ("sqlite",)
    assert "redis-cluster" in bdqs.ORDER_PROFILES["full"].stores
    assert bdqs.THROUGHPUT_PROFILES["quick"].nodes == (1, 2)
    assert bdqs.THROUGHPUT_PROFILES["full"].nodes == (1, 2, 4)


@pytest.mark.parametrize(
    "make",
    [
        lambda: bdqs.OrderConfig(n=1, moto_n=10),
        lambda: bdqs.OrderConfig(n=10, moto_n=10, ks=()),
        lambda: bdqs.OrderConfig(n=10, moto_n=10, stores=("postgres",)),
        lambda: bdqs.ThroughputConfig(nodes=(), rounds=1, seconds=1.0),
        lambda: bdqs.ThroughputConfig(nodes=(1,), rounds=1, seconds=0.0),
    ],
)
def test_bad_configs_fail_on_construction(make: Any) -> None:
    with pytest.raises(ConfigError):
        make()


def test_random_order_rate_is_the_share_of_non_maxima() -> None:
    # Brute force over every order of m messages: a message is out of order
    # when a higher one came before it (the pipeline's definition).
    for m in range(1, 7):
        perms = list(itertools.permutations(range(m)))
        late = sum(sum(1 for i, s in enumerate(p) if any(x > s for x in p[:i])) for p in perms)
        assert math.isclose(bdqs.random_order_rate(m), late / (len(perms) * m))
    assert bdqs.random_order_rate(0) == 0.0


# -- a tiny run of each --------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_out(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, int]]]:
    out = tmp_path_factory.mktemp("bdqs")
    counted: dict[str, int] = {}
    for exp in bdqs.EXPERIMENTS:
        steps: list[str] = []
        ctx = _ctx(out, steps=steps)
        assert exp.unavailable(ctx) is None
        exp.run(ctx)
        counted[exp.id] = len(steps) - exp.steps(ctx)
    yield out, counted


def test_tiny_order_run_writes_one_record_per_receipt(
    tiny_out: tuple[Path, dict[str, int]],
) -> None:
    out, counted = tiny_out
    assert counted["bdqs-order"] == 0  # exactly as many steps as announced
    config = bdqs.ORDER_PROFILES["tiny"]
    rows = [r for r in read_table(out, "records").to_pylist() if r["experiment"] == "bdqs-order"]
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["system"], r["scenario"]), []).append(r)
    expected = {("cmq-sqlite", f"T={t},K={k}") for t in (1, 2) for k in ("1", "no-order")}
    if MOTO:
        expected |= {("moto", f"T={t},K=n/a") for t in (1, 2)}
    assert set(groups) == expected
    for (system, _), got in groups.items():
        n = config.moto_n if system == "moto" else config.n
        assert sorted(r["seq"] for r in got) == list(range(n))  # each once, none lost
        assert len({r["stream"] for r in got}) == 1 and {r["receiver"] for r in got} == {""}
        assert all(r["recv_ns"] >= r["send_ns"] and not r["round_trip"] for r in got)
    one = sorted(groups[("cmq-sqlite", "T=1,K=1")], key=lambda r: r["recv_ns"])
    assert [r["seq"] for r in one] == list(range(config.n))  # K=1, one receiver: FIFO
    runs = [r for r in read_table(out, "runs").to_pylist() if r["experiment"] == "bdqs-order"]
    assert {r["status"] for r in runs} == {"ok"}


def test_tiny_throughput_run_writes_totals_beside_moto(
    tiny_out: tuple[Path, dict[str, int]],
) -> None:
    out, counted = tiny_out
    assert counted["bdqs-throughput"] == 0
    totals = [r for r in read_table(out, "totals").to_pylist()
              if r["experiment"] == "bdqs-throughput"]  # fmt: skip
    assert {r["system"] for r in totals} == ({"cmq-sqlite", "moto"} if MOTO else {"cmq-sqlite"})
    for r in totals:
        assert r["scenario"] == "cycles" and r["params"] == '{"nodes":1}'
        assert r["sent"] == r["delivered"] > 0 and r["duration_ns"] > 0
    metrics = {r["metric"] for r in read_table(out, "samples").to_pylist()}
    assert metrics == {"server_cpu_ms_per_cycle", "errors"}


def test_missing_moto_and_redis_are_skipped_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No store runs: only the skip paths, in milliseconds.
    monkeypatch.setattr(bdqs, "_moto_missing", lambda: "moto_server not found: pip install x")
    monkeypatch.setattr(bdqs, "_redis_missing", lambda: "redis-server not found: apt-get y")
    monkeypatch.setitem(bdqs.ORDER_PROFILES, "tiny",
                        bdqs.OrderConfig(n=5, moto_n=5, stores=("redis-cluster",)))  # fmt: skip
    monkeypatch.setitem(bdqs.THROUGHPUT_PROFILES, "tiny",
                        bdqs.ThroughputConfig(nodes=(1, 2), rounds=2, seconds=0.1,
                                              stores=("redis-cluster",)))  # fmt: skip
    for exp in bdqs.EXPERIMENTS:
        steps: list[str] = []
        said: list[str] = []
        ctx = _ctx(tmp_path, steps=steps)
        exp.run(Context(out=ctx.out, profile=ctx.profile, systems=ctx.systems,
                        step=ctx.step, say=said.append))  # fmt: skip
        assert len(steps) == exp.steps(ctx)
        assert any("skipping moto" in s and "pip install x" in s for s in said)
    runs = read_table(tmp_path, "runs").to_pylist()
    assert {(r["experiment"], r["system"], r["status"]) for r in runs} == {
        (e, s, "skipped")
        for e in ("bdqs-order", "bdqs-throughput")
        for s in ("moto", "cmq-redis-cluster")
    }
    reasons = {r["system"]: r["reason"] for r in runs}
    assert reasons == {"moto": "moto_server not found: pip install x",
                       "cmq-redis-cluster": "redis-server not found: apt-get y"}  # fmt: skip
    assert read_table(tmp_path, "records").num_rows == 0


def test_a_message_never_received_is_a_lost_row_and_fails_the_run(tmp_path: Path) -> None:
    from cmq.lab.experiments._record import RunBook

    receipts = [
        {"queue": "q1", "t_recv": 2, "k": 1_000_000, "receiver": r, "seq": s,
         "send_ns": 100, "receive_ns": 200 + t}
        for t, (s, r) in enumerate([(2, 0), (0, 1), (3, 0)])
    ]  # fmt: skip
    with RunBook(tmp_path, "bdqs-order") as book:
        bdqs._write_order(book, "cmq-sqlite", receipts, 4)
    rows = read_table(tmp_path, "records").to_pylist()
    assert [(r["seq"], r["lost"]) for r in rows] == [(2, False), (0, False), (3, False), (1, True)]
    assert {(r["scenario"], r["params"], r["stream"], r["receiver"]) for r in rows} == {
        ("T=2,K=no-order", '{"k":"no-order","t_recv":2}', "q1", "")
    }
    [run] = read_table(tmp_path, "runs").to_pylist()
    assert run["status"] == "failed" and "1 of 4 messages never received" in run["reason"]


# -- claims on known data ------------------------------------------------------------


def _order_row(
    system: str, t: int, k: str, delivered: int, ooo: int, dups: int = 0
) -> dict[str, Any]:
    kp: int | str = int(k) if k.isdigit() else k
    return {
        "experiment": "bdqs-order", "scenario": f"T={t},K={k}", "system": system, "size": 0,
        "params": "", "p": {"t_recv": t, "k": kp}, "runs": 1, "messages": delivered,
        "delivered": delivered, "lost": 0, "loss_rate": 0.0, "duplicates": dups,
        "dup_rate": dups / delivered, "out_of_order": ooo, "ooo_rate": ooo / delivered,
        "round_trip": False, "mean_ns": 1e6, "stddev_ns": 1e5, "p50_ns": 1e6, "p99_ns": 2e6,
        "min_ns": 1e5, "max_ns": 3e6, "msgs_per_s": 100.0, "mb_per_s": 0.0,
        "rate_source": "records",
    }  # fmt: skip


def _tp_row(system: str, nodes: int, rate: float) -> dict[str, Any]:
    return {
        "experiment": "bdqs-throughput", "scenario": "cycles", "system": system, "size": 0,
        "params": "", "p": {"nodes": nodes}, "runs": 1, "messages": int(rate),
        "delivered": int(rate), "lost": 0, "loss_rate": 0.0, "duplicates": 0, "dup_rate": None,
        "out_of_order": 0, "ooo_rate": None, "round_trip": False, "mean_ns": None,
        "stddev_ns": None, "p50_ns": None, "p99_ns": None, "min_ns": None, "max_ns": None,
        "msgs_per_s": rate, "mb_per_s": 0.0, "rate_source": "totals",
    }  # fmt: skip


M = 200
RANDOM = round(bdqs.random_order_rate(M) * M)  # out-of-order count of a random order of 200


def _as_paper_says() -> list[dict[str, Any]]:
    rows = []
    for t in (1, 2, 3):
        for k, ooo in (("1", 0), ("2", 90), ("3", 130), ("no-order", RANDOM)):
            rows.append(_order_row("cmq-sqlite", t, k, M, ooo))
        rows.append(_order_row("moto", t, "n/a", 100, 3))
    return rows


def _verdicts(exp_id: str, rows: list[dict[str, Any]]) -> list[str]:
    exp = report.get_experiment(exp_id)
    assert exp is not None
    data = ReportData(summary=rows)
    return [c.judge(data).status for c in exp.claims]


def test_order_claims_on_data_that_behaves_as_the_paper_says() -> None:
    # K=1 in order, no-order a random order, disorder rising with K; no duplicates.
    assert _verdicts("bdqs-order", _as_paper_says()) == ["pass", "pass", "pass", "inconclusive"]


def test_order_claims_fail_where_the_data_says_otherwise() -> None:
    rows = [r for r in _as_paper_says() if r["system"] == "moto" or r["p"]["t_recv"] != 1]
    rows += [
        _order_row("cmq-sqlite", 1, "1", M, 4),  # 2% out of order with K=1
        _order_row("cmq-sqlite", 1, "2", M, 150),
        _order_row("cmq-sqlite", 1, "3", M, 60),  # falls as K grows
        _order_row("cmq-sqlite", 1, "no-order", M, M // 2, dups=20),  # half: not random
    ]
    assert _verdicts("bdqs-order", rows) == ["fail", "fail", "fail", "fail"]
    rows[-1] = _order_row("cmq-sqlite", 1, "no-order", M, RANDOM, dups=0)
    rows[-4] = _order_row("cmq-sqlite", 1, "1", M, 0, dups=30)  # duplicates fall with K
    assert _verdicts("bdqs-order", rows)[3] == "pass"


def test_claims_without_data_are_inconclusive() -> None:
    assert set(_verdicts("bdqs-order", [])) == {"inconclusive"}
    assert _verdicts("bdqs-throughput", [_tp_row("cmq-sqlite", 1, 900.0)]) == ["inconclusive"]


def test_throughput_claim_is_ten_times_moto_at_the_best_node_count() -> None:
    rows = [_tp_row("moto", 1, 60.0), _tp_row("cmq-sqlite", 1, 700.0),
            _tp_row("cmq-sqlite", 2, 590.0)]  # fmt: skip
    assert _verdicts("bdqs-throughput", rows) == ["pass"]
    rows.append(_tp_row("cmq-redis-cluster", 1, 500.0))  # every store must reach 10x
    assert _verdicts("bdqs-throughput", rows) == ["fail"]


def test_sections_render_with_figures_and_tables() -> None:
    rows = [
        *_as_paper_says(),
        _tp_row("moto", 1, 60.0),
        _tp_row("cmq-sqlite", 1, 700.0),
        _tp_row("cmq-sqlite", 2, 590.0),
    ]
    page = render_html(ReportData(summary=rows))
    for exp_id in ("bdqs-order", "bdqs-throughput"):
        start = page.index(f'<section id="{exp_id}">')
        section = page[start : page.index("</section>", start)]
        assert section.count("<svg") == 1 and "<table>" in section
    assert "moto (SQS stand-in), T_recv=1" in page and "11.7x" in page


# -- the pipeline on the tiny run ------------------------------------------------------


@pytest.mark.spark
@pytest.mark.slow
def test_the_pipeline_reads_the_tiny_run_as_meant(
    spark: Any, tiny_out: tuple[Path, dict[str, int]]
) -> None:
    out, _ = tiny_out
    data = report.collect(spark, out)
    order = {(r["system"], r["scenario"]): r for r in data.rows("bdqs-order")}
    n = bdqs.ORDER_PROFILES["tiny"].n
    k1 = order[("cmq-sqlite", "T=1,K=1")]
    assert (k1["delivered"], k1["duplicates"], k1["out_of_order"], k1["lost"]) == (n, 0, 0, 0)
    assert order[("cmq-sqlite", "T=1,K=no-order")]["out_of_order"] > 0
    totals = {r["system"]: r for r in read_table(out, "totals").to_pylist()}
    for r in data.rows("bdqs-throughput"):
        t = totals[r["system"]]
        assert r["rate_source"] == "totals"
        assert math.isclose(r["msgs_per_s"], t["delivered"] * 1e9 / t["duration_ns"])
