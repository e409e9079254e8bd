"""The stock exchange's report section, its records, and its claims beside the paper's.

Records (experiment ``amqp-stockex``, system ``cmq``):

- one row per order: scenario ``"completion"``, ``params {"rate": R, "attempt": a,
  "step": s, "kept": k}`` (the step's number in the sweep and whether it was kept; a
  rate the sweep repeats has a group per step),
  ``size`` 9 (an order's bytes), ``round_trip=True`` (both stamps are the
  gateway's: order sent, its confirmation received); an order never
  confirmed is a lost row;
- samples with ``x`` = the offered rate: the statistics reporter's
  per-second figures (``orders_sent_per_s``, ``orders_received_per_s``,
  ``confirms_per_s``, ``trades_per_s``, ``quotes_per_s``,
  ``avg_message_bytes``; ``params {"reporter": "spark"}`` or ``"python"``)
  and the gateway's own ``kept`` (1 or 0);
- samples without ``x``: CPU microseconds per order of each process
  (``cpu_us_per_order``, ``params {"process": ...}``).

A rate tried twice (the first attempt not kept) has completion rows for
both attempts (``params {"rate": R, "attempt": a}``); its samples are the
last attempt's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from cmq.lab.experiments import register_page
from cmq.lab.experiments._record import RunBook
from cmq.lab.experiments.amqp.report import PAPER
from cmq.lab.experiments.stockex.reporter import rates
from cmq.lab.experiments.stockex.run import SimResult
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
from cmq.pipeline.stats import decide, paired_interval

__all__ = [
    "EXPERIMENT_ID",
    "ORDER_BYTES",
    "P99_TARGET_MS",
    "RATE_TARGET",
    "register_report",
    "write_records",
]

EXPERIMENT_ID: Final = "amqp-stockex"
#: Bytes of an order in the compact form.
ORDER_BYTES: Final = 9
#: cmq's own target: hold at least this many orders/s ...
RATE_TARGET: Final = 32_000
#: ... with p99 order completion under this.
P99_TARGET_MS: Final = 10.0
#: Where the paper's Qpid setup began failing.
QPID_FAILED_AT: Final = 8000


def write_records(book: RunBook, result: SimResult) -> None:
    """Write a run's records (module docstring)."""
    w = book.writer("cmq")
    # A rate tried twice is judged by its last attempt; the earlier one stays in the records.
    final = {s.rate: s.step for s in result.steps}
    for s in result.steps:
        params = {"rate": s.rate, "attempt": s.attempt, "step": s.step, "kept": s.kept}
        w.record_many(scenario="completion", params=params, size=ORDER_BYTES, seq=range(s.sent),
                      send_ns=s.sent_ns, recv_ns=[d if d >= 0 else None for d in s.done_ns],
                      round_trip=True)  # fmt: skip
        if final[s.rate] != s.step:
            continue
        w.sample(scenario="steps", metric="kept", x=float(s.rate), value=1.0 if s.kept else 0.0)
        w.sample(scenario="steps", metric="attempts", x=float(s.rate), value=float(s.attempt))
        w.sample(scenario="steps", metric="gateway_send_per_s", x=float(s.rate),
                 value=s.sent / s.send_seconds if s.send_seconds > 0 else 0.0)  # fmt: skip
    finals = set(final.values())
    for step, row in rates(result.stats).items():
        if step not in finals:
            continue
        x = row["rate"]
        for metric, value in row.items():
            if metric != "rate":
                w.sample(scenario="reporter", metric=metric, x=x, value=value,
                         params={"reporter": result.reporter})  # fmt: skip
    orders = sum(s.sent for s in result.steps)
    if orders:
        for process, cpu in result.cpu.items():
            w.sample(scenario="cpu", metric="cpu_us_per_order", value=cpu / orders * 1e6,
                     params={"process": process})  # fmt: skip


def _completion(data: ReportData) -> dict[int, Row]:
    """The completion row of each rate's last step."""
    rows = sorted((r for r in data.rows(EXPERIMENT_ID, scenario="completion") if "rate" in r["p"]),
                  key=lambda r: (int(r["p"].get("step", 0)), int(r["p"].get("attempt", 1))))  # fmt: skip
    return {int(r["p"]["rate"]): r for r in rows}


def _target_steps(data: ReportData) -> tuple[list[float], int]:
    """The p99 completion (ms) of each kept step at :data:`RATE_TARGET`, and
    how many steps at that rate were not kept."""
    p99s, missed = [], 0
    for r in data.rows(EXPERIMENT_ID, scenario="completion"):
        if int(r["p"].get("rate", 0)) != RATE_TARGET:
            continue
        if r["p"].get("kept") is False or r["p99_ns"] is None:
            missed += 1
        else:
            p99s.append(r["p99_ns"] / 1e6)
    return p99s, missed


def _kept(data: ReportData) -> dict[int, bool]:
    return {int(r["x"]): r["mean"] >= 0.5 for r in data.sample_rows(EXPERIMENT_ID, metric="kept")
            if r["x"] is not None}  # fmt: skip


def _metric(data: ReportData, metric: str) -> dict[int, float]:
    return {int(r["x"]): float(r["mean"]) for r in data.sample_rows(EXPERIMENT_ID, metric=metric)
            if r["x"] is not None}  # fmt: skip


def _held(data: ReportData) -> tuple[int, Row | None]:
    """The highest rate kept with p99 under target (0, None if none)."""
    comp, kept = _completion(data), _kept(data)
    best, row = 0, None
    for rate in sorted(comp):
        r = comp[rate]
        if kept.get(rate) and r["p99_ns"] is not None and r["p99_ns"] / 1e6 < P99_TARGET_MS:
            best, row = rate, r
    return best, row


def _judge_target(data: ReportData) -> Verdict:
    comp = _completion(data)
    if not comp:
        return Verdict(status="inconclusive", result="No stock exchange run.")
    best, row = _held(data)
    kept = _kept(data)
    top_kept = max((r for r, k in kept.items() if k), default=0)
    text = (f"Highest rate kept with p99 completion under {P99_TARGET_MS:g} ms: {best:,} orders/s"
            + (f" (p99 {row['p99_ns'] / 1e6:.1f} ms)" if row else "")
            + f"; highest rate kept at all: {top_kept:,} orders/s; rates tried: "
            + ", ".join(f"{r:,}" for r in sorted(comp)) + ".")  # fmt: skip
    p99s, missed = _target_steps(data)
    if not p99s:
        # The sweep never kept the target rate: it does not hold it.
        return Verdict(status="fail", result=text + f" No step at {RATE_TARGET:,} orders/s was kept.")
    # Each kept step at the target rate is a run; the p99's median over runs,
    # against the bound, with its interval over runs.
    iv = paired_interval([v / P99_TARGET_MS for v in p99s])
    verdict = decide(iv, 1.0, "at_most")
    text += (f" At {RATE_TARGET:,} orders/s: p99 " + ", ".join(f"{v:.1f}" for v in p99s)
             + f" ms in {len(p99s)} kept step(s) ({missed} not kept); median over the bound "
             f"{iv.point:.2f}x (95% interval {iv.lo:.2f}-{iv.hi:.2f}) [{verdict}].")  # fmt: skip
    return Verdict(status=verdict, result=text)


def _judge_qpid(data: ReportData) -> Verdict:
    kept = _kept(data)
    if not kept:
        return Verdict(status="inconclusive", result="No stock exchange run.")
    top = max((r for r, k in kept.items() if k), default=0)
    first_fail = min((r for r, k in kept.items() if not k), default=None)
    text = f"Qpid's figure, not measured here. On the same simulation the cmq broker kept up to {top:,} orders/s" + (
        f" and first failed at {first_fail:,}."
        if first_fail
        else " and did not fail at any rate tried."
    )
    # Another system's figure: context beside ours, not a verdict on either.
    return Verdict(status="context", result=text)


def _judge_size(data: ReportData) -> Verdict:
    sizes = _metric(data, "avg_message_bytes")
    if not sizes:
        return Verdict(status="inconclusive", result="No reporter figures.")
    lo, hi = min(sizes.values()), max(sizes.values())
    # The compact form is built to the paper's sizes, so this is true by
    # construction: context, not a verdict.
    return Verdict(status="context",
                   result=f"True by construction (our compact form follows the paper's): weighted average "
                          f"message size {lo:.2f} .. {hi:.2f} bytes over the rates (orders in, confirmations, "
                          "trades, quotes out; before the broker's framing).")  # fmt: skip


def _section(data: ReportData, experiment: str) -> Section:
    comp = _completion(data)
    series = {m: _metric(data, m) for m in ("orders_sent_per_s", "orders_received_per_s",
                                             "confirms_per_s", "trades_per_s", "quotes_per_s")}  # fmt: skip
    figures = []
    if comp:
        fig, (ax_r, ax_l) = new_figure(2)
        offered = sorted(comp)
        ax_r.plot(offered, offered, ls=":", color="k", lw=1, label="offered")
        for name, pts in series.items():
            if pts:
                xs = sorted(pts)
                ax_r.plot(
                    xs, [pts[x] for x in xs], marker="o", ms=3, label=name.replace("_per_s", "/s")
                )
        ax_r.set_xlabel("offered orders/s")
        ax_r.set_ylabel("messages/s (statistics reporter)")
        ax_r.set_title("rates per step", fontsize=10)
        for q, key in (("p50", "p50_ns"), ("p99", "p99_ns")):
            xs = [x for x in offered if comp[x][key] is not None]
            ax_l.plot(xs, [comp[x][key] / 1e6 for x in xs], marker="o", ms=3, label=q)
        ax_l.axhline(P99_TARGET_MS, ls=":", color="r", lw=1, label=f"{P99_TARGET_MS:g} ms target")
        ax_l.set_yscale("log")
        ax_l.set_xlabel("offered orders/s")
        ax_l.set_ylabel("order completion (ms)")
        ax_l.set_title("order sent -> confirmation received", fontsize=10)
        for ax in (ax_r, ax_l):
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7)
        figures.append(svg(fig))
    kept = _kept(data)

    def f(v: float | None, d: int = 0) -> str:
        return "" if v is None else f"{v:,.{d}f}"

    rows: list[Sequence[object]] = []
    for rate in sorted(comp):
        r = comp[rate]
        rows.append([rate, "yes" if kept.get(rate) else "no", r["p"].get("attempt", 1), r["messages"], r["lost"],
                     *(f(series[m].get(rate)) for m in series),
                     f(_metric(data, "avg_message_bytes").get(rate), 2),
                     f((r["p50_ns"] or 0) / 1e6, 2), f((r["p99_ns"] or 0) / 1e6, 2), f((r["max_ns"] or 0) / 1e6, 1)])  # fmt: skip
    table = Table(caption="Per offered rate", columns=[
        "offered /s", "kept", "attempt", "orders", "unconfirmed", "sent /s", "received /s", "confirms /s", "trades /s",
        "quotes /s", "avg msg B", "p50 ms", "p99 ms", "max ms"], rows=rows)  # fmt: skip
    cpu = [r for r in data.sample_rows(experiment, metric="cpu_us_per_order")]
    cpu_table = Table(caption="CPU per order over the whole run (µs), per process",
                      columns=["process", "µs per order"],
                      rows=[[r["p"].get("process", ""), f(r["mean"], 1)] for r in sorted(cpu, key=lambda r: r["params"])])  # fmt: skip
    modes = sorted({"no_ack (at most once)" if r["p"].get("no_ack") else "acknowledged (at least once)"
                    for r in data.run_rows(experiment)})  # fmt: skip
    reporters = sorted(
        {
            r["p"].get("reporter", "")
            for r in data.sample_rows(experiment)
            if r["scenario"] == "reporter"
        }
    )
    return Section(figures=figures, tables=[table, cpu_table], notes=[
        "Gateway, matching engine and broker are three processes (the statistics reporter is the "
        "lab's own process); orders, confirmations, trades and quotes go through the cmq broker, "
        "the measurement messages straight to the reporter's cmq endpoint.",
        f"The per-second figures come from the statistics reporter ({', '.join(reporters) or 'none'}): "
        "a Spark Structured Streaming query on format('cmq'), drained after the run.",
        "A step is kept when confirmations per second over the step reach 95% of the offered rate "
        "and at most 0.1% of its orders go unconfirmed; a rate not kept is tried once more, and the "
        "sweep stops at the first rate whose second attempt is not kept either (the table shows "
        "each rate's last attempt).",
        f"Engine and gateway consume {', '.join(modes) or 'acknowledged'}; every order the gateway "
        "never saw confirmed is counted unconfirmed.",
        "CPU per order shows the ceiling on two shared cores: at one full core each, a process "
        "spending c µs per order caps the rate at 10^6/c orders/s."])  # fmt: skip


def register_report() -> None:
    """Register the section (idempotent)."""
    register_page(Experiment(
        id=EXPERIMENT_ID, title="AMQP stock-exchange simulation: gateway, matching engine, statistics reporter",
        paper=PAPER, order=65, render=_section,
        claims=[
            Claim(text="(Paraphrase.) The simulated stock exchange on Qpid kept its rate up to about "
                       "6000 orders/s and began failing at 8000 orders/s.", judge=_judge_qpid),
            Claim(text="(Paraphrase.) The simulation's messages average about 9 bytes, weighted by "
                       "how often each kind is sent.", judge=_judge_size),
            Claim(text=f"The stock exchange on the cmq broker holds at least "
                       f"{RATE_TARGET:,} orders/s with p99 order completion under {P99_TARGET_MS:g} ms.",
                  judge=_judge_target, target=True,
                  rule=f"every step of the sweep at {RATE_TARGET:,} orders/s (the profile repeats it) is "
                       f"a run: fail when none was kept; otherwise the median over the kept runs of the "
                       f"p99 completion, over {P99_TARGET_MS:g} ms, with a 95% bootstrap interval over "
                       "runs: pass when the interval lies at or below 1x, fail when it lies wholly above, "
                       "otherwise (or with fewer than 3 kept runs) inconclusive."),
        ]), replace=True)  # fmt: skip
