"""The queue service's lab experiments: shape, a tiny run of each, and the claims on known data.

The tiny runs start real ``cmq serve`` processes over SQLite and moto's server
(when installed): a few seconds for both. The claims are judged on summary
rows written by hand, whose answers are known; one Spark test checks that the
pipeline reads the tiny run's records as the experiment means them.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cmq import ConfigError
from cmq.lab.bench.sqs import moto_server
from cmq.lab.experiments import PROFILE_NAMES, PROFILES, Context, bdqs, get, pages, resolve
from cmq.lab.experiments import page as lab_page
from cmq.lab.records import read_table
from cmq.pipeline import report
from cmq.pipeline.report import ReportData, render_html

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
        section = lab_page(exp.id)
        assert section is not None and section.claims
        for name in PROFILE_NAMES:
            assert exp.steps(_ctx(Path("/nonexistent"), name)) >= 1


def test_every_profile_has_a_scale_and_quick_is_the_issue_scale() -> None:
    assert set(bdqs.ORDER_PROFILES) == set(bdqs.THROUGHPUT_PROFILES) == set(PROFILE_NAMES)
    for name in ("quick", "full"):
        order = bdqs.ORDER_PROFILES[name]
        assert order.t_recvs == (1, 2, 3) and len(order.ks) == 4
        assert set(order.modes) == {"atomic", "lock-free"}
        assert order.repeats >= 3 and order.nodes >= 3  # intervals; receivers on several nodes
        assert set(order.stores) == {"sqlite", "redis-cluster"}
        # Every reference of the atomic mode's corrected rule is run: one
        # receiver at K + T_recv - 1.
        one_receiver = {str(k) for k in (*order.ks, *order.depth_ks) if k < 1_000_000}
        for t, k in itertools.product(order.t_recvs, order.ks):
            if t > 1 and 1 < k < 1_000_000:
                assert bdqs.depth_k(t, str(k)) in one_receiver
        tp = bdqs.THROUGHPUT_PROFILES[name]
        # The claims compare 4 nodes with 1 (and 1 with moto); the full
        # profile draws 2 nodes too.
        assert {1, 4} <= set(tp.nodes) and set(tp.stores) == {"sqlite", "redis-cluster"}
        assert tp.rounds >= 10  # enough rounds for the bootstrap intervals
    assert bdqs.THROUGHPUT_PROFILES["full"].nodes == (1, 2, 4)


@pytest.mark.parametrize(
    "make",
    [
        lambda: bdqs.OrderConfig(n=1, moto_n=10),
        lambda: bdqs.OrderConfig(n=10, moto_n=10, ks=()),
        lambda: bdqs.OrderConfig(n=10, moto_n=10, stores=("postgres",)),
        lambda: bdqs.OrderConfig(n=10, moto_n=10, modes=("optimistic",)),
        lambda: bdqs.OrderConfig(n=10, moto_n=10, repeats=0),
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
    expected = {("cmq-sqlite", f"T={t},K={k},{mode}")
                for t in (1, 2) for k in ("1", "no-order") for mode in ("atomic", "lock-free")}  # fmt: skip
    if MOTO:
        expected |= {("moto", f"T={t},K=n/a") for t in (1, 2)}
    assert set(groups) == expected
    for (system, scenario), got in groups.items():
        n = config.moto_n if system == "moto" else config.n
        runs = 1 if system == "moto" else config.repeats
        streams: dict[str, list[int]] = {}
        for r in got:
            streams.setdefault(r["stream"], []).append(r["seq"])
        assert len(streams) == runs and {r["receiver"] for r in got} == {""}
        assert {json.loads(r["params"])["rep"] for r in got} == set(range(runs))
        for seqs in streams.values():
            assert not [r for r in got if r["lost"]]  # none lost
            if not scenario.endswith("lock-free"):
                assert sorted(seqs) == list(range(n))  # each exactly once
            else:
                assert set(seqs) == set(range(n))  # each at least once
        assert all(r["recv_ns"] >= r["send_ns"] and not r["round_trip"] for r in got)
    for mode in ("atomic", "lock-free"):
        one = sorted(groups[("cmq-sqlite", f"T=1,K=1,{mode}")], key=lambda r: r["recv_ns"])
        # K=1, one receiver: FIFO in every run, in either mode.
        assert [r["seq"] for r in one] == [
            s for _ in range(config.repeats) for s in range(config.n)
        ]
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
    samples = read_table(out, "samples").to_pylist()
    assert {r["metric"] for r in samples} == {
        "server_cpu_ms_per_cycle", "store_cpu_ms_per_cycle", "cycles_per_cpu_s", "cycles_per_s",
        "errors", "load_average",
    }  # fmt: skip
    # Every sample of a round carries the round's stamp (how rounds pair up).
    assert len({r["t_ns"] for r in samples}) == 1 and samples[0]["t_ns"] is not None
    cmq = {r["metric"]: r["value"] for r in samples if r["system"] == "cmq-sqlite"}
    assert cmq["cycles_per_cpu_s"] > 0  # the nodes' CPU was read
    assert cmq["store_cpu_ms_per_cycle"] == 0.0  # SQLite runs inside the nodes


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
        ("T=2,K=no-order", '{"k":"no-order","mode":"n/a","rep":0,"t_recv":2}', "q1", "")
    }
    [run] = read_table(tmp_path, "runs").to_pylist()
    assert run["status"] == "failed" and "1 of 4 messages never received" in run["reason"]


# -- claims on known data ------------------------------------------------------------


def _order_row(
    system: str,
    t: int,
    k: str,
    delivered: int,
    ooo: int,
    dups: int = 0,
    mode: str = "lock-free",
    rep: int = 0,
) -> dict[str, Any]:
    kp: int | str = int(k) if k.isdigit() else k
    scenario = f"T={t},K={k}" + ("" if mode == "n/a" else f",{mode}")
    return {
        "experiment": "bdqs-order", "scenario": scenario, "system": system, "size": 0,
        "params": "", "p": {"t_recv": t, "k": kp, "mode": mode, "rep": rep}, "runs": 1,
        "messages": delivered, "delivered": delivered, "lost": 0, "loss_rate": 0.0,
        "duplicates": dups, "dup_rate": dups / delivered, "out_of_order": ooo,
        "ooo_rate": ooo / delivered, "ooo_by_request_rate": ooo / delivered,
        "round_trip": False, "mean_ns": 1e6, "stddev_ns": 1e5,
        "p50_ns": 1e6, "p99_ns": 2e6, "min_ns": 1e5, "max_ns": 3e6, "msgs_per_s": 100.0,
        "mb_per_s": 0.0, "rate_source": "records",
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


#: Out of order, then duplicates, per K of the lock-free runs at T_recv > 1.
PAPER_LIKE = {"1": (2, 30), "2": (90, 20), "3": (130, 10), "no-order": (RANDOM, 2)}


def _as_paper_says() -> list[dict[str, Any]]:
    """Three runs per cell that behave as the paper says, atomic beside them."""
    rows = []
    for t in (1, 2, 3):
        for rep in range(3):
            for k, (ooo, dups) in PAPER_LIKE.items():
                ooo = 0 if t == 1 and k == "1" else ooo + rep
                rows.append(_order_row("cmq-sqlite", t, k, M, ooo, 0 if t == 1 else dups + rep,
                                       rep=rep))  # fmt: skip
                rows.append(_order_row("cmq-sqlite", t, k, M, ooo, 0, mode="atomic", rep=rep))
        rows.append(_order_row("moto", t, "n/a", 100, 3, mode="n/a"))
    for rep in range(3):  # one atomic receiver deeper: the references at K + T_recv - 1
        for k, ooo in (("4", 150), ("5", 160)):
            rows.append(_order_row("cmq-sqlite", 1, k, M, ooo + rep, 0, mode="atomic", rep=rep))
    return rows


def _replace(rows: list[dict[str, Any]], t: int, k: str, mode: str, by: list[tuple[int, int]]
             ) -> list[dict[str, Any]]:  # fmt: skip
    """``rows`` with the runs of one cell replaced by (out of order, duplicates) pairs."""
    kept = [r for r in rows
            if not (r["p"]["t_recv"] == t and str(r["p"]["k"]) == k and r["p"]["mode"] == mode)]  # fmt: skip
    return kept + [_order_row("cmq-sqlite", t, k, M, ooo, dups, mode=mode, rep=i)
                   for i, (ooo, dups) in enumerate(by)]  # fmt: skip


def _verdicts(
    exp_id: str, rows: list[dict[str, Any]], samples: list[dict[str, Any]] | None = None
) -> list[str]:
    exp = lab_page(exp_id)
    assert exp is not None
    data = ReportData(summary=rows, samples=samples or [])
    return [c.judge(data).status for c in exp.claims]


def test_interval_is_the_student_t_95_percent_interval() -> None:
    iv = bdqs.interval([0.11, 0.12, 0.13])
    half = 4.303 * 0.01 / math.sqrt(3)
    assert math.isclose(iv.mean, 0.12) and iv.runs == 3
    assert math.isclose(iv.lo, 0.12 - half) and math.isclose(iv.hi, 0.12 + half)
    one = bdqs.interval([0.5])
    assert (one.lo, one.hi, one.runs) == (0.5, 0.5, 1)
    rare = bdqs.interval([0.0, 0.0, 0.03])  # a rate is never below 0
    assert rare.lo == 0.0 and math.isclose(rare.hi, 0.01 + 4.303 * math.sqrt(0.0003) / math.sqrt(3))


def test_order_claims_on_data_that_behaves_as_the_paper_says() -> None:
    # K=1 in order, no-order a random order, disorder rising and duplicates
    # falling with K in lock-free mode, none at T=1; atomic: no duplicates.
    assert _verdicts("bdqs-order", _as_paper_says()) == ["pass"] * 8


def test_order_claims_fail_where_the_data_says_otherwise() -> None:
    rows = _as_paper_says()
    rows = _replace(rows, 1, "1", "lock-free", [(4, 0)] * 3)  # 2% out of order with K=1
    rows = _replace(rows, 1, "no-order", "atomic", [(M // 2, 0)] * 3)  # half: not random
    rows = _replace(rows, 3, "1", "lock-free", [(40, 30), (41, 31), (42, 32)])
    rows = _replace(rows, 3, "3", "lock-free", [(0, 60), (1, 61), (2, 62)])  # K=3 better,
    rows = _replace(rows, 1, "2", "lock-free", [(90, 10)] * 3)  # T=1 duplicates,
    rows = _replace(rows, 2, "2", "atomic", [(300, 1), (90, 0), (90, 0)])  # an atomic duplicate
    assert _verdicts("bdqs-order", rows) == ["fail"] * 8


def test_overlapping_intervals_are_inconclusive() -> None:
    rows = _replace(_as_paper_says(), 3, "1", "lock-free", [(2, 4), (2, 30), (2, 8)])
    rows = _replace(rows, 3, "3", "lock-free", [(2, 12), (130, 8), (2, 11)])
    assert _verdicts("bdqs-order", rows)[2:4] == ["inconclusive", "inconclusive"]
    # A single run has no interval: inconclusive, never a pass.
    single = [r for r in _as_paper_says() if r["p"]["rep"] == 0]
    assert _verdicts("bdqs-order", single)[2:4] == ["inconclusive", "inconclusive"]


def test_atomic_order_worse_than_lock_free_fails() -> None:
    rows = _replace(_as_paper_says(), 1, "2", "atomic", [(150, 0)] * 3)
    assert _verdicts("bdqs-order", rows)[5:] == ["fail"] * 3  # one receiver: every rule


def test_atomic_order_with_several_receivers_is_judged_at_its_depth() -> None:
    # T=3, K=2: atomic reaches 4 deep. Worse than lock-free at K=2 (the first
    # rule fails) but within one receiver's interval at K=4: the corrected
    # rule passes.
    rows = _replace(_as_paper_says(), 3, "2", "atomic", [(150, 0)] * 3)
    assert _verdicts("bdqs-order", rows)[5:] == ["fail", "pass", "fail"]
    assert bdqs.depth_k(3, "2") == "4" and bdqs.depth_k(2, "no-order") == "no-order"
    # Deeper than that depth: fails.
    worse = _replace(rows, 3, "2", "atomic", [(170, 0)] * 3)
    assert _verdicts("bdqs-order", worse)[6] == "fail"
    # Without the one-receiver runs at K=4: inconclusive.
    gone = [r for r in rows if not (r["p"]["t_recv"] == 1 and r["p"]["k"] == 4)]
    assert _verdicts("bdqs-order", gone)[6] == "inconclusive"


def test_atomic_order_is_judged_by_request_not_by_arrival() -> None:
    # Atomic at T=3, K=1: 15% out of order by arrival (replies to receives
    # that overlapped in time), none by request: as good as lock-free.
    rows = _replace(_as_paper_says(), 3, "1", "atomic", [(30, 0)] * 3)
    for r in rows:
        if r["p"]["mode"] == "atomic" and r["p"]["t_recv"] == 3 and r["p"]["k"] == 1:
            r["ooo_by_request_rate"] = 0.0
    assert _verdicts("bdqs-order", rows)[5:] == ["pass"] * 3
    # Records without request times cannot be judged so: inconclusive.
    for r in rows:
        r["ooo_by_request_rate"] = None
    assert _verdicts("bdqs-order", rows)[5:] == ["inconclusive"] * 3


def test_atomic_order_by_intervals_tells_chance_from_worse() -> None:
    # One receiver, no order: the same design in both modes. Atomic's mean
    # a little above lock-free's interval fails the two mean-in-interval
    # rules; the intervals overlap, so the interval rule passes.
    same = [(RANDOM, 0), (RANDOM, 0), (RANDOM + 1, 0)]
    rows = _replace(_as_paper_says(), 1, "no-order", "lock-free", same)
    rows = _replace(rows, 1, "no-order", "atomic", [(RANDOM + d, 0) for d in (1, 3, 4)])
    assert _verdicts("bdqs-order", rows)[5:] == ["fail", "fail", "pass"]
    # Atomic's interval entirely above lock-free's: fails.
    worse = _replace(rows, 1, "no-order", "atomic", [(RANDOM + d, 0) for d in (9, 10, 11)])
    assert _verdicts("bdqs-order", worse)[7] == "fail"
    # One run a cell has no interval: inconclusive.
    single = _replace(rows, 2, "3", "atomic", [(120, 0)])
    assert _verdicts("bdqs-order", single)[7] == "inconclusive"


def test_claims_without_data_are_inconclusive() -> None:
    assert set(_verdicts("bdqs-order", [])) == {"inconclusive"}
    assert _verdicts("bdqs-throughput", [_tp_row("cmq-sqlite", 1, 900.0)]) == [
        "inconclusive", "inconclusive"
    ]  # fmt: skip


def _rate_series(system: str, nodes: int, per_round: list[float]) -> list[dict[str, Any]]:
    """Timed cycles_per_s samples of one configuration, one per round."""
    return [{"experiment": "bdqs-throughput", "scenario": "cycles", "system": system,
             "params": "", "p": {"nodes": nodes}, "run_id": system, "metric": "cycles_per_s",
             "t_s": 2.5 * i, "value": value} for i, value in enumerate(per_round)]  # fmt: skip


def _x_moto(*series: list[dict[str, Any]]) -> str:
    exp = lab_page("bdqs-throughput")
    assert exp is not None
    return exp.claims[0].judge(ReportData(series=[s for ss in series for s in ss])).status


def test_throughput_claim_is_ten_times_moto_at_one_node_paired_by_round() -> None:
    moto = _rate_series("moto", 1, [60.0, 30.0, 65.0, 50.0])
    # Rounds differ (moto 30-65/s), the ratios do not: 11-12x each round.
    sqlite = _rate_series("cmq-sqlite", 1, [700.0, 350.0, 720.0, 600.0])
    assert _x_moto(moto, sqlite) == "pass"
    # Every store must reach it; more nodes do not count.
    redis = _rate_series("cmq-redis-cluster", 1, [400.0, 200.0, 420.0, 300.0])
    more = _rate_series("cmq-redis-cluster", 4, [900.0, 600.0, 900.0, 900.0])
    assert _x_moto(moto, sqlite, redis, more) == "fail"
    # 8x to 13x: the interval straddles 10x.
    swings = _rate_series("cmq-redis-cluster", 1, [480.0, 390.0, 650.0, 600.0])
    assert _x_moto(moto, sqlite, swings) == "inconclusive"
    assert _x_moto(moto[:2], sqlite[:2]) == "inconclusive"  # fewer than 3 rounds
    assert _x_moto(sqlite) == "inconclusive"  # no moto


def _cpu_series(system: str, per_round: list[tuple[float, float]]) -> list[dict[str, Any]]:
    """Timed cycles_per_cpu_s samples: (1 node, 4 nodes) of each round."""
    return [{"experiment": "bdqs-throughput", "scenario": "cycles", "system": system,
             "params": "", "p": {"nodes": nodes}, "run_id": system, "metric": "cycles_per_cpu_s",
             "t_s": 2.5 * i, "value": value}
            for i, pair in enumerate(per_round) for nodes, value in zip((1, 4), pair, strict=True)]  # fmt: skip


def _per_cpu_verdict(sqlite: list[tuple[float, float]], redis: list[tuple[float, float]]) -> str:
    exp = lab_page("bdqs-throughput")
    assert exp is not None
    data = ReportData(series=_cpu_series("cmq-sqlite", sqlite)
                      + _cpu_series("cmq-redis-cluster", redis))  # fmt: skip
    return exp.claims[1].judge(data).status


def test_scaling_claim_is_per_round_ratios_of_4_nodes_to_1_on_both_stores() -> None:
    good = [(1000.0, 900.0), (1200.0, 1100.0), (800.0, 740.0)]  # about 91 %
    poor = [(1000.0, 600.0), (1200.0, 700.0), (800.0, 500.0)]  # about 60 %
    # Rounds differ (other work on the machine): only the ratios matter.
    assert _per_cpu_verdict(good, good) == "pass"
    assert _per_cpu_verdict(good, poor) == "fail"
    straddles = [(1000.0, 700.0), (1000.0, 950.0), (1000.0, 820.0)]
    assert _per_cpu_verdict(good, straddles) == "inconclusive"
    assert _per_cpu_verdict(good, good[:1]) == "inconclusive"  # one round: no interval
    assert _per_cpu_verdict(good, []) == "inconclusive"
    # Each round's 4 nodes are divided by the same round's 1 node.
    swing = [(3000.0, 1500.0), (400.0, 480.0)]
    ratios = bdqs.per_round_ratios(ReportData(series=_cpu_series("s", swing)), "s", 4)
    assert ratios == [pytest.approx(0.5), pytest.approx(1.2)]


def test_each_round_runs_every_configuration_in_a_shuffled_order() -> None:
    c = bdqs.THROUGHPUT_PROFILES["quick"]
    orders = [bdqs.round_order(c, r) for r in range(c.rounds)]
    for order in orders:
        assert sorted(order) == sorted(orders[0]) and len(order) == len(set(order))
    assert len({tuple(o) for o in orders}) > 1  # not the same order every round
    assert orders == [bdqs.round_order(c, r) for r in range(c.rounds)]  # seeded


def test_sections_render_with_figures_and_tables() -> None:
    rows = [
        *_as_paper_says(),
        _tp_row("moto", 1, 60.0),
        _tp_row("cmq-sqlite", 1, 700.0),
        _tp_row("cmq-sqlite", 2, 590.0),
    ]
    page = render_html(ReportData(summary=rows), pages())
    for exp_id in ("bdqs-order", "bdqs-throughput"):
        start = page.index(f'<section id="{exp_id}">')
        section = page[start : page.index("</section>", start)]
        assert section.count("<svg") == 1 and "<table>" in section  # one cmq store
    assert "moto (SQS stand-in), T_recv=1" in page and "11.7x" in page


# -- the pipeline on the tiny run ------------------------------------------------------


@pytest.mark.spark
@pytest.mark.slow
def test_the_pipeline_reads_the_tiny_run_as_meant(
    spark: Any, tiny_out: tuple[Path, dict[str, int]]
) -> None:
    out, _ = tiny_out
    data = report.collect(spark, out)
    order: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in data.rows("bdqs-order"):
        order.setdefault((r["system"], r["scenario"]), []).append(r)
    config = bdqs.ORDER_PROFILES["tiny"]
    n = config.n
    for mode in ("atomic", "lock-free"):
        k1 = order[("cmq-sqlite", f"T=1,K=1,{mode}")]  # one summary row per run
        assert sorted(r["p"]["rep"] for r in k1) == list(range(config.repeats))
        for r in k1:
            assert (r["delivered"], r["duplicates"], r["out_of_order"], r["lost"]) == (n, 0, 0, 0)
            assert r["ooo_by_request_rate"] == 0.0  # request times reached the pipeline
        assert sum(r["out_of_order"] for r in order[("cmq-sqlite", f"T=1,K=no-order,{mode}")]) > 0
    for r in order[("cmq-sqlite", "T=2,K=1,atomic")]:
        assert r["duplicates"] == 0  # atomic never duplicates
    totals = {r["system"]: r for r in read_table(out, "totals").to_pylist()}
    for r in data.rows("bdqs-throughput"):
        t = totals[r["system"]]
        assert r["rate_source"] == "totals"
        assert math.isclose(r["msgs_per_s"], t["delivered"] * 1e9 / t["duration_ns"])
