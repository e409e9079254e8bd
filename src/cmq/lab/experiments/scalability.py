"""Scalability: push cost against the number of destinations, and receiver memory over time.

Push cost: the sans-IO micro-benchmark of cmq's batcher
(:func:`cmq.lab.runner.run_destinations`) pushes the same number of
messages round-robin to 1 ... ``max(profile.destinations)`` distinct
destinations, ``profile.push_repeats`` times, in a worker process of its
own (a million destinations take a few hundred MB, which should not stay
in the orchestrator). Samples ``metric="push_ns"``, ``x`` = destinations,
one per repeat.

Receiver memory: a cmq receiver drains a sender pushing 64-byte messages as
fast as it can for ``profile.rss_seconds`` (minutes in ``--full``), a
throughput run of :func:`cmq.lab.runner.run_throughput` whose runner reads
the receiver's resident set size from outside every
``profile.rss_interval`` seconds. Samples ``metric="rss_bytes"`` with
``t_ns``; the run's totals with scenario ``"memory"``. The paper reports an 80 KB Haskell heap over five hours;
we measure a whole Python process and test that it stops growing.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Final

from cmq.lab import runner
from cmq.lab.experiments import Context, LabExperiment, register, register_page
from cmq.lab.experiments._common import (
    CMQ_PAPER,
    inconclusive,
)
from cmq.lab.experiments._proc import GRACE as _GRACE
from cmq.lab.experiments._proc import Child, WorkerError
from cmq.lab.experiments._record import RunBook
from cmq.pipeline.report import (
    Claim,
    Experiment,
    ReportData,
    Row,
    Section,
    Table,
    Verdict,
    new_figure,
    svg,
)
from cmq.pipeline.stats import decide, ratio_interval

__all__ = ["EXPERIMENT", "RSS_SIZE"]

#: Shortest RSS series the memory claim is judged on: in the first seconds
#: a receiver's buffers and allocator are still growing to their working size.
MIN_RSS_SECONDS: Final = 60.0

#: Message size of the memory run: small messages stress per-message state.
RSS_SIZE: Final = 64


def _steps(ctx: Context) -> int:
    p = ctx.profile
    return p.push_repeats * len(p.destinations) + 1


def _push_cost(ctx: Context, book: RunBook) -> None:
    p = ctx.profile
    params = {"destinations": list(p.destinations), "per_destination": p.per_destination, "size": 4,
              "repeat": p.push_repeats}  # fmt: skip
    child = Child("destinations", params)
    try:
        # 10 µs per message is far above the batcher's cost on any machine.
        budget = (
            _GRACE
            + 1e-5 * max(p.destinations) * p.per_destination * len(p.destinations) * p.push_repeats
        )
        w = book.writer("cmq")
        for tag, value in child.lines(budget):
            if tag == "SAMPLE":
                w.sample(
                    scenario="push",
                    metric="push_ns",
                    x=float(value["destinations"]),
                    value=float(value["ns_per_msg"]),
                    params={"per_destination": p.per_destination, "size": value["size"]},
                )
                ctx.step(f"push cost, {value['destinations']:,} destinations")
    finally:
        child.stop()


def _memory(ctx: Context, book: RunBook) -> None:
    p = ctx.profile
    results = runner.run_throughput(
        ["cmq"], [RSS_SIZE], duration=p.rss_seconds, rss_interval=p.rss_interval, pin=ctx.pin
    )
    params = {"size": RSS_SIZE, "seconds": p.rss_seconds}
    # Totals (what went through), skips and failures, as every run's.
    book.add(results, scenario="memory", params=params)
    for r in results:
        if isinstance(r, runner.ThroughputResult):
            w = book.writer("cmq")
            for t_ns, rss in r.receiver_rss:
                w.sample(scenario="memory", metric="rss_bytes", t_ns=t_ns, value=float(rss),
                         params=params)  # fmt: skip
            ctx.say(
                f"scalability: the memory run's receiver got {r.delivered:,} of {r.sent:,} "
                f"messages in {p.rss_seconds:g} s; {len(r.receiver_rss)} RSS samples"
            )
    ctx.step("receiver memory")


def _run(ctx: Context) -> None:
    with RunBook(ctx.out, EXPERIMENT.id, pin="none") as book:
        for part in (_push_cost, _memory):
            try:
                part(ctx, book)
            except WorkerError as exc:
                book.problem("cmq", str(exc))
                ctx.say(f"scalability: {exc}")


def destinations_label(values: Sequence[int]) -> str:
    """``1 .. 1,000,000`` for the summary."""
    return f"{min(values):,} .. {max(values):,}"


EXPERIMENT: Final = register(
    LabExperiment(
        id="scalability",
        title="Scalability: push cost against destinations, receiver memory",
        aliases=("scale", "memory"),
        order=40,
        run=_run,
        steps=_steps,
        multi_system=False,
        runs=lambda p: p.push_repeats,
    )
)


# -- the report's section and claims --------------------
def _scal_section(data: ReportData, experiment: str) -> Section:
    push = [r for r in data.sample_rows(experiment, metric="push_ns") if r["x"] is not None]
    rss = data.series_rows(experiment, metric="rss_bytes")
    panels = int(bool(push)) + int(bool(rss))
    figures = []
    if panels:
        fig, axes = new_figure(panels)
        it = iter(axes)
        if push:
            ax = next(it)
            for system in sorted({r["system"] for r in push}):
                pts = sorted(
                    (r["x"], r["mean"], r["stddev"] or 0.0) for r in push if r["system"] == system
                )
                xs, ys, sds = zip(*pts, strict=True)
                ax.errorbar(xs, ys, yerr=sds, marker="o", ms=3, capsize=2, label=system)
            ax.set_xscale("log")
            ax.set_xlabel("destinations")
            ax.set_ylabel("push cost (ns per message), ±1 sd")
            ax.set_title("push cost against destinations", fontsize=10)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7)
        if rss:
            ax = next(it)
            for run in sorted({r["run_id"] for r in rss}):
                mine = [r for r in rss if r["run_id"] == run]
                ax.plot(
                    [r["t_s"] for r in mine],
                    [r["value"] / 1e6 for r in mine],
                    label=f"{mine[0]['system']} ({run})",
                )
            ax.set_xlabel("seconds since start")
            ax.set_ylabel("receiver RSS (MB)")
            ax.set_title("receiver memory over time", fontsize=10)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7)
        figures.append(svg(fig))
    table = Table(
        caption="Push cost per message",
        columns=["system", "destinations", "samples", "mean ns", "sd ns"],
        rows=[[r["system"], int(r["x"]), r["n"], f"{r['mean']:,.0f}", f"{(r['stddev'] or 0):,.0f}"]
              for r in sorted(push, key=lambda r: (r["system"], r["x"]))],
    )  # fmt: skip
    return Section(
        figures=figures,
        tables=[table],
        notes=[
            "RSS is the whole Python process, not the paper's Haskell heap; the claim we test is that it stops growing."
        ],
    )


#: "Does not grow": the cheapest push at the most destinations at most this
#: many times the cheapest at one destination.
PUSH_FLAT: Final = 1.25
#: The claim's range: a profile that stops short of it cannot judge it.
PUSH_RANGE: Final = 1_000_000


def _push_samples(row: Row) -> list[float]:
    """The repeats of one destination count (``values``; a row aggregated
    before the pipeline kept them has only its least)."""
    values = row.get("values")
    if isinstance(values, (list, tuple)) and values:
        return [float(v) for v in values]
    return [float(row["min"])]


def _judge_push(data: ReportData) -> Verdict:
    push = [
        r
        for r in data.sample_rows("scalability", metric="push_ns", system="cmq")
        if r["x"] is not None
    ]
    if len({r["x"] for r in push}) < 2:
        return inconclusive("Needs cmq push cost at two or more destination counts.")
    lo = min(push, key=lambda r: r["x"])
    hi = max(push, key=lambda r: r["x"])
    # The least of a micro-benchmark's repeats is its cost with the least
    # interference (the machine is shared); means are shown in the table.
    # The interval resamples the repeats of each side and takes their least.
    iv = ratio_interval(_push_samples(hi), _push_samples(lo), statistic=min)
    verdict = decide(iv, PUSH_FLAT, "at_most")
    text = (
        f"Least push cost of {hi['n']} repeats: {lo['min']:,.0f} ns at {lo['x']:,.0f} destination(s), "
        f"{hi['min']:,.0f} ns at {hi['x']:,.0f}: {iv}."
    )
    if verdict == "pass" and hi["x"] < PUSH_RANGE:
        return inconclusive(text + f" Flat so far, but the claim is up to {PUSH_RANGE:,} destinations "
                             "(the full profile measures them).")  # fmt: skip
    return Verdict(status=verdict, result=text)


def _judge_rss(data: ReportData) -> Verdict:
    series = [r for r in data.series_rows("scalability", metric="rss_bytes", system="cmq")]
    runs = sorted({r["run_id"] for r in series})
    if not runs:
        return inconclusive("Needs a cmq receiver RSS series.")
    pts = [r for r in series if r["run_id"] == runs[-1]]
    if len(pts) < 5:
        return inconclusive(f"Only {len(pts)} RSS samples; needs 5 or more.")
    warm = pts[len(pts) // 5]["value"]
    tail = statistics.fmean(r["value"] for r in pts[-max(1, len(pts) // 5) :])
    growth = tail / warm - 1
    text = (
        f"RSS {warm / 1e6:.1f} MB after warm-up, {tail / 1e6:.1f} MB at the end of "
        f"{pts[-1]['t_s']:.0f} s ({100 * growth:+.1f}%)."
    )
    if pts[-1]["t_s"] < MIN_RSS_SECONDS:
        return inconclusive(text + f" Too short to judge: needs {MIN_RSS_SECONDS:.0f} s or more.")
    # Our criterion for "bounded": under 10% growth after the first fifth of the run.
    return Verdict(status="pass" if growth < 0.10 else "fail", result=text)


PAGE: Final = register_page(
    Experiment(
        id="scalability",
        title="Scalability: push cost against destinations, receiver memory over time",
        paper=f"{CMQ_PAPER}, scalability",
        order=40,
        claims=[
            Claim(
                text="(Our reading.) The cost of a push does not grow with the number of destinations, 1 to 1,000,000.",
                rule=(
                    f"the least of the repeats at the most destinations over the least at one, with a 95% "
                    f"bootstrap interval over the repeats: pass when the interval lies at or below "
                    f"{PUSH_FLAT:g}x and the range reaches 1,000,000, fail when it lies wholly above "
                    f"{PUSH_FLAT:g}x, otherwise (a straddling interval, fewer than 3 repeats a side, or "
                    "flat over a shorter range) inconclusive."
                ),
                judge=_judge_push,
            ),
            Claim(
                text="The receiver's memory stays bounded: an 80 KB heap over five hours (we run minutes and test that RSS stops growing).",
                judge=_judge_rss,
            ),
        ],
        render=_scal_section,
    )
)
