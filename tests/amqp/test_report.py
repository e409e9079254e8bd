"""The AMQP sections' claims and figures on hand-made aggregates (no Spark)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cmq.lab.experiments import page as get_experiment
from cmq.lab.experiments import pages
from cmq.lab.experiments.amqp.report import RATIO_TARGET, ratio_claim
from cmq.lab.experiments.stockex.report import EXPERIMENT_ID as STOCKEX
from cmq.pipeline.report import ReportData, render_html


def row(experiment: str, system: str, size: int, msgs: float, **params: Any) -> dict[str, Any]:
    scenario = experiment.removeprefix("amqp-")
    return {
        "experiment": experiment, "scenario": scenario, "system": system, "size": size,
        "params": json.dumps(params, sort_keys=True, separators=(",", ":")), "p": params,
        "runs": 1, "messages": 1000, "delivered": 1000, "lost": 0, "loss_rate": 0.0,
        "duplicates": 0, "dup_rate": 0.0, "out_of_order": 0, "ooo_rate": 0.0,
        "round_trip": scenario in ("de-pp", "completion"), "mean_ns": 2e6, "stddev_ns": 1e5,
        "p50_ns": 1.5e6, "p99_ns": 4e6, "min_ns": 1e6, "max_ns": 5e6, "msgs_per_s": msgs,
        "mb_per_s": msgs * size / 1e6, "rate_source": "records",
    }  # fmt: skip


def sample(experiment: str, system: str, metric: str, x: float | None, value: float,
           **params: Any) -> dict[str, Any]:  # fmt: skip
    return {"experiment": experiment, "scenario": "", "system": system, "metric": metric, "x": x,
            "params": json.dumps(params), "p": params, "n": 1, "mean": value, "stddev": None,
            "min": value, "max": value}  # fmt: skip


def spsc(cmq_rates: list[float], rabbit_rates: list[float] | None, repeats: int = 3) -> ReportData:
    """DE-SPSC at 1 B, 4 KB and 1 MB: each rate measured ``repeats`` times, 1 % apart."""
    sizes = [1, 4096, 1 << 20]
    sides = [("cmq", cmq_rates), *([("rabbitmq", rabbit_rates)] if rabbit_rates is not None else [])]
    rows = [row("amqp-de-spsc", system, s, r * (1 + 0.01 * k), pairs=1, repeat=k)
            for system, rates in sides for s, r in zip(sizes, rates, strict=True)
            for k in range(repeats)]  # fmt: skip
    return ReportData(summary=rows)


@pytest.mark.parametrize(
    ("cmq", "rabbit", "status"),
    [
        ([40_000, 20_000, 100], [10_000, 5_000, 100], "pass"),  # 4x up to 4 KB; 1 MB not judged
        ([40_000, 20_000, 100], [10_000, 10_000, 10], "fail"),  # 2x at 4 KB
        ([40_000, 20_000, 100], None, "inconclusive"),  # RabbitMQ skipped
    ],
)
def test_ratio_claim(cmq: list[float], rabbit: list[float] | None, status: str) -> None:
    verdict = ratio_claim("amqp-de-spsc").judge(spsc(cmq, rabbit))
    assert verdict.status == status, verdict.result
    assert RATIO_TARGET == 3.0


def repeats(cmq: list[float], rabbit: list[float]) -> ReportData:
    rows = [row("amqp-de-pp", "cmq", 16, r, repeat=k) for k, r in enumerate(cmq)]
    rows += [row("amqp-de-pp", "rabbitmq", 16, r, repeat=k) for k, r in enumerate(rabbit)]
    return ReportData(summary=rows)


def test_ratio_claim_is_judged_on_the_interval_over_repeats() -> None:
    claim = ratio_claim("amqp-de-pp")
    # A stall in every cmq repeat (a tenth of RabbitMQ's rate): fail.
    stalled = claim.judge(repeats([1000, 1100, 1050], [10_000, 9_800, 10_100]))
    assert stalled.status == "fail", stalled.result
    # A noisy pair whose median is above 3x but whose repeats straddle it: inconclusive,
    # with the interval shown (the old rule passed it on the median repeat).
    noisy = claim.judge(repeats([15_000, 40_000, 60_000], [10_000, 10_000, 10_000]))
    assert noisy.status == "inconclusive", noisy.result
    assert "interval" in noisy.result
    # Clear of the threshold in every repeat: pass.
    assert claim.judge(repeats([40_000, 41_000, 39_000], [10_000, 9_000, 11_000])).status == "pass"
    # Fewer than 3 repeats a side decide nothing.
    assert claim.judge(repeats([40_000, 41_000], [10_000, 9_000])).status == "inconclusive"


def test_the_de_pp_shape_is_judged_on_the_interval_over_repeats() -> None:
    exp = get_experiment("amqp-de-pp")
    assert exp is not None
    claim = next(c for c in exp.claims if "grows with" in c.text)
    assert "interval" in claim.rule

    def data(small_us: list[float], large_us: list[float]) -> ReportData:
        rows = []
        for size, means in ((16, small_us), (65536, large_us)):
            rows += [dict(row("amqp-de-pp", "cmq", size, 1000.0, repeat=k), mean_ns=m * 1e3)
                     for k, m in enumerate(means)]  # fmt: skip
        return ReportData(summary=rows)

    assert claim.judge(data([300, 310, 305], [900, 950, 920])).status == "pass"
    # The large round trip faster in every repeat: fail.
    assert claim.judge(data([900, 950, 920], [300, 310, 305])).status == "fail"
    # One stall in the small size's repeats moves the old rule's single mean; here the
    # repeats straddle 1x: inconclusive.
    assert claim.judge(data([300, 2000, 310], [350, 280, 900])).status == "inconclusive"


def te(rate_1: float, rate_top: float, top: int) -> ReportData:
    return ReportData(summary=[row("amqp-te-spsc", "cmq", 64, rate_1, bindings=1),
                               row("amqp-te-spsc", "cmq", 64, rate_top, bindings=top)])  # fmt: skip


@pytest.mark.parametrize(
    ("data", "status"),
    [(te(50_000, 45_000, 1024), "pass"), (te(50_000, 30_000, 1024), "fail"),
     (te(50_000, 50_000, 64), "inconclusive")],
)  # fmt: skip
def test_te_target(data: ReportData, status: str) -> None:
    exp = get_experiment("amqp-te-spsc")
    assert exp is not None
    (target,) = [c for c in exp.claims if "1024" in c.text]
    assert target.judge(data).status == status


def stockex(p99_ms: dict[int, float], kept: dict[int, bool]) -> ReportData:
    rows = [dict(row(STOCKEX, "cmq", 9, r, rate=r, attempt=1), scenario="completion", p99_ns=v * 1e6)
            for r, v in p99_ms.items()]  # fmt: skip
    samples = [sample(STOCKEX, "cmq", "kept", r, 1.0 if k else 0.0) for r, k in kept.items()]
    samples += [sample(STOCKEX, "cmq", "avg_message_bytes", r, 9.0, reporter="spark") for r in kept]
    samples.append(sample(STOCKEX, "cmq", "cpu_us_per_order", None, 100.0, process="broker"))
    return ReportData(summary=rows, samples=samples)


def test_stockex_claims() -> None:
    exp = get_experiment(STOCKEX)
    assert exp is not None
    qpid, size, target = exp.claims
    weak = stockex({1000: 2.0, 8000: 50.0, 16000: 900.0}, {1000: True, 8000: True, 16000: False})
    # Qpid's figure and a size true by construction are context, never judged.
    verdict = qpid.judge(weak)
    assert verdict.status == "context" and "not measured here" in verdict.result
    assert "kept up to 8,000" in verdict.result
    assert size.judge(weak).status == "context"
    verdict = target.judge(weak)
    assert verdict.status == "fail" and "1,000 orders/s" in verdict.result
    assert "interval" in target.rule


def target_steps(p99_ms: list[float], kept: list[bool]) -> ReportData:
    """Steps of the sweep at 32,000 orders/s (the quick profile repeats the target rate)."""
    rows = [dict(row(STOCKEX, "cmq", 9, 32000, rate=32000, attempt=1, step=5 + k, kept=ok),
                 scenario="completion", p99_ns=v * 1e6)
            for k, (v, ok) in enumerate(zip(p99_ms, kept, strict=True))]  # fmt: skip
    return ReportData(summary=rows, samples=[sample(STOCKEX, "cmq", "kept", 32000, 1.0 if kept[-1] else 0.0)])


def test_the_stockex_target_is_judged_on_the_steps_at_the_target_rate() -> None:
    exp = get_experiment(STOCKEX)
    assert exp is not None
    target = exp.claims[-1]
    assert target.judge(target_steps([6.0, 7.5, 6.8], [True] * 3)).status == "pass"
    # A stalled tail in every step: fail.
    assert target.judge(target_steps([40.0, 35.0, 52.0], [True] * 3)).status == "fail"
    # A noisy tail around the bound (once a single step's p99 decided it): inconclusive.
    noisy = target.judge(target_steps([6.0, 14.0, 9.0], [True] * 3))
    assert noisy.status == "inconclusive" and "interval" in noisy.result
    # Not one step kept at the target rate: fail; one kept step decides nothing.
    assert target.judge(target_steps([3.0, 3.0], [False, False])).status == "fail"
    assert target.judge(target_steps([3.0, 3.0, 3.0], [False, False, True])).status == "inconclusive"


def test_every_section_renders_without_spark() -> None:
    summary = spsc([40_000, 20_000, 100], [10_000, 5_000, 100]).summary
    summary = [*summary,
               *[row("amqp-de-mpmc", s, 1024, 1e4 * k, pairs=k) for s in ("cmq", "rabbitmq") for k in (1, 8)],
               *[row("amqp-de-pp", s, 16, 800.0) for s in ("cmq", "rabbitmq")],
               *[row("amqp-fe-spmc", s, 64, 1e4 * k, consumers=k) for s in ("cmq", "rabbitmq") for k in (1, 16)],
               *te(50_000, 45_000, 1024).summary]  # fmt: skip
    samples = [sample("amqp-de-mpmc", s, "broker_cpu", k, 0.1 * k, pairs=k)
               for s in ("cmq", "rabbitmq") for k in (1, 8)]  # fmt: skip
    data = stockex({1000: 2.0}, {1000: True})
    page = render_html(
        ReportData(summary=[*summary, *data.summary], samples=[*samples, *data.samples]), pages()
    )
    for exp in (
        "amqp-de-spsc",
        "amqp-de-mpmc",
        "amqp-de-pp",
        "amqp-fe-spmc",
        "amqp-te-spsc",
        STOCKEX,
    ):
        assert f'<section id="{exp}">' in page
    assert "could not render" not in page and "could not judge" not in page
    assert page.count("<svg") >= 7


def test_a_broker_is_the_bottleneck_only_when_it_is_busy() -> None:
    """At 44-58 % of one core a broker is not what holds throughput back."""
    exp = get_experiment("amqp-de-mpmc")
    assert exp is not None
    claim = next(c for c in exp.claims if "bottleneck" in c.text)
    assert "90%" in claim.rule

    def data(cpu_at_8: float, growth: float) -> ReportData:
        summary = [row("amqp-de-mpmc", "cmq", 1024, 1e4 * (growth if k == 8 else 1) * (1 + 0.01 * r),
                       pairs=k, repeat=r) for k in (1, 8) for r in range(3)]  # fmt: skip
        samples = [sample("amqp-de-mpmc", "cmq", "broker_cpu", k, (0.3 if k == 1 else cpu_at_8) + 0.005 * r,
                          pairs=k, repeat=r) for k in (1, 8) for r in range(3)]  # fmt: skip
        return ReportData(summary=summary, samples=samples)

    assert claim.judge(data(0.58, 2.0)).status == "fail"  # stalled, but the broker idles half the time
    assert claim.judge(data(0.97, 2.0)).status == "pass"  # saturated and stalled
    assert claim.judge(data(0.97, 7.0)).status == "fail"  # saturated yet scaling: not the bottleneck
    # A broker near 90 % whose repeats straddle it: inconclusive, not a coin toss.
    summary = [row("amqp-de-mpmc", "cmq", 1024, 1e4 * (2 if k == 8 else 1), pairs=k, repeat=r)
               for k in (1, 8) for r in range(3)]  # fmt: skip
    samples = [sample("amqp-de-mpmc", "cmq", "broker_cpu", k, v, pairs=k, repeat=r)
               for k, values in ((1, (0.3, 0.3, 0.3)), (8, (0.8, 0.95, 0.99)))
               for r, v in enumerate(values)]  # fmt: skip
    assert claim.judge(ReportData(summary=summary, samples=samples)).status == "inconclusive"
