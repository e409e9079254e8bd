"""Tuning sweep: cmq's throughput and latency over qthresh x timeout.

The CMQ paper tuned its two knobs and found qthresh 512 B with a 200 ms
timeout best. For every cell of ``profile.tuning_qthresh`` x
``profile.tuning_timeouts`` this runs, with both endpoints configured so
(:class:`cmq.QueueConfig` ``qthresh`` and ``timeout``):

- throughput: ``profile.tuning_count`` messages of ``profile.tuning_size``
  bytes as fast as ``push`` returns (totals, scenario ``"throughput"``);
- latency: ping-ping of ``profile.tuning_rt_count`` messages with
  ``profile.window`` in flight, so batches can form (records, scenario
  ``"latency"``).

Both with ``params`` ``{"qthresh": bytes, "timeout": seconds}``, cmq only.
cmq sends a message to an idle destination at once (the idle rule), so
unlike the paper's CMQ the timeout only bounds how long a message can wait
when pushes come faster than the link drains: the surface shows how much
that still matters.

To answer that directly, experiment ``tuning-idle`` measures ping-pong (one
message in flight: the destination is idle before every message), written
as the paper's applications were (``push``, then poll the non-blocking
``pop``: a blocking ``get`` flushes what is pending before it waits, which
would hide the timeout either way), at
``qthresh = profile.tuning_idle_qthresh`` (512 B, the paper's) over every
timeout, with the idle rule on (``idle_gap`` the default, 5 µs) and off
(``idle_gap`` infinite: every message waits for a full batch or its timeout,
as in the paper's CMQ), ``profile.tuning_idle_count`` round trips each;
``params`` ``{"qthresh", "timeout", "idle_gap"}`` (``"inf"`` when off). Its
report section (registered here) sets the two side by side.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

from cmq._config import DEFAULT_IDLE_GAP
from cmq.lab import runner
from cmq.lab.experiments import Context, LabExperiment, Profile, register, register_page
from cmq.lab.experiments._common import (
    CMQ_PAPER,
    inconclusive,
)
from cmq.lab.experiments._proc import READY_TIMEOUT, WorkerError, pair
from cmq.lab.experiments._record import RunBook
from cmq.lab.records import params_json
from cmq.pipeline import report
from cmq.pipeline.report import (
    Claim,
    Experiment,
    ReportData,
    Row,
    Section,
    Table,
    Verdict,
    latency_table,
    new_figure,
    svg,
)
from cmq.pipeline.stats import combine, decide, ratio_interval

if TYPE_CHECKING:
    from matplotlib.axes import Axes

__all__ = ["EXPERIMENT", "IDLE_ID", "TIMEOUT"]

#: Experiment id of the idle-rule-off row of the sweep.
IDLE_ID: Final = "tuning-idle"

#: Round-trip timeout of the latency cells: above twice the largest batch
#: timeout of the sweep (200 ms; a message and its reply may each wait it
#: with the idle rule off), so a batch that waits its full timeout still
#: counts as delivered, not lost.
TIMEOUT: Final = 1.0


def _cells(ctx: Context) -> list[tuple[int, float]]:
    p = ctx.profile
    return list(itertools.product(p.tuning_qthresh, p.tuning_timeouts))


def _steps(ctx: Context) -> int:
    p = ctx.profile
    return (p.tuning_runs + 1) * len(_cells(ctx)) + 2 * len(p.tuning_timeouts)


def _throughput(
    ctx: Context, book: RunBook, params: dict[str, Any], options: dict[str, Any], label: str
) -> None:
    """One throughput run of a cell: its totals, and its msgs/s as a sample
    (the per-run values the best-cell verdict resamples)."""
    p: Profile = ctx.profile
    results = runner.run_throughput(
        ["cmq"], [p.tuning_size], count=p.tuning_count, pin=ctx.pin, options={"cmq": options}
    )
    book.add(results, params=params)
    for r in results:
        if isinstance(r, runner.ThroughputResult) and r.msgs_per_s > 0:
            book.writer("cmq").sample(
                scenario="throughput", metric="msgs_per_s", value=r.msgs_per_s, params=params
            )
    ctx.step(f"throughput, {label}")


def _latency(
    ctx: Context, book: RunBook, params: dict[str, Any], options: dict[str, Any], label: str
) -> None:
    """One cell's ping-ping latency run with ``options``."""
    p: Profile = ctx.profile
    size = p.tuning_size
    book.add(
        runner.run_pingping(
            ["cmq"], [size], count=p.tuning_rt_count, window=p.window, timeout=TIMEOUT,
            pin=ctx.pin, options={"cmq": options},
        ),
        scenario="latency",
        params=params,
    )  # fmt: skip
    ctx.step(f"latency, {label}")


def _run(ctx: Context) -> None:
    p = ctx.profile
    size = p.tuning_size
    run_params = {
        "size": size,
        "count": p.tuning_count,
        "rt_count": p.tuning_rt_count,
        "window": p.window,
    }
    cells = _cells(ctx)

    def cell(qthresh: int, timeout: float) -> tuple[dict[str, Any], str]:
        return {"qthresh": qthresh, "timeout": timeout}, f"qthresh {qthresh} B, timeout {timeout * 1e3:g} ms"

    with RunBook(ctx.out, EXPERIMENT.id, pin=ctx.pin, params=run_params) as book:
        # Throughput: every cell once a round, the order rotating from round
        # to round, so that no cell always runs first or after the same one.
        for rnd in range(p.tuning_runs):
            k = rnd * max(1, len(cells) // max(1, p.tuning_runs)) % len(cells)
            for qthresh, timeout in cells[k:] + cells[:k]:
                params, label = cell(qthresh, timeout)
                _throughput(ctx, book, params, params, f"{label}, run {rnd + 1}")
        # Latency (the figure only): one ping-ping run per cell.
        for qthresh, timeout in cells:
            params, label = cell(qthresh, timeout)
            _latency(ctx, book, params, params, label)
    idle_q = p.tuning_idle_qthresh
    with RunBook(ctx.out, IDLE_ID, pin="none", params={"size": p.tuning_size}) as book:
        for timeout in p.tuning_timeouts:
            # JSON has no infinity: the records say "inf", the worker gets the float.
            for idle_gap, recorded in ((DEFAULT_IDLE_GAP, DEFAULT_IDLE_GAP), (math.inf, "inf")):
                params = {"qthresh": idle_q, "timeout": timeout, "idle_gap": recorded}
                options = {"qthresh": idle_q, "timeout": timeout, "idle_gap": idle_gap}
                rule = "off" if recorded == "inf" else "on"
                try:
                    _poll_pingpong(ctx, book, params, options)
                except WorkerError as exc:
                    book.problem("cmq", f"idle rule {rule}, timeout {timeout:g} s: {exc}")
                ctx.step(f"polled ping-pong, idle rule {rule}, timeout {timeout * 1e3:g} ms")


def _poll_pingpong(
    ctx: Context, book: RunBook, params: dict[str, Any], options: dict[str, Any]
) -> None:
    """One polled ping-pong run (see :mod:`cmq.lab.experiments._worker`)."""
    count = ctx.profile.tuning_idle_count
    _, client = pair(
        "poll-echo",
        {"options": options, "startup": READY_TIMEOUT, "idle": 4 * TIMEOUT + 5.0},
        "poll-pingpong",
        {"options": options, "size": ctx.profile.tuning_size, "count": count, "timeout": TIMEOUT},
        client_time=count * TIMEOUT,
    )
    recv = [t if t >= 0 else None for t in client["recv_ns"]]
    book.writer("cmq").record_many(
        scenario="pingpong",
        params=params_json(params),
        size=ctx.profile.tuning_size,
        seq=range(len(recv)),
        send_ns=client["send_ns"],
        recv_ns=recv,
        round_trip=True,
    )


EXPERIMENT: Final = register(
    LabExperiment(
        id="tuning",
        title="Tuning: cmq over qthresh x timeout; the idle rule on and off",
        order=30,
        run=_run,
        steps=_steps,
        multi_system=False,
        runs=lambda p: p.tuning_runs,
    )
)


# -- the report's section for the idle rule --------------------------------


def _row(rows: Sequence[report.Row], scenario: str, key: str) -> dict[float, float]:
    """``timeout -> value`` of one scenario (mean over repeated runs)."""
    cells: dict[float, list[float]] = {}
    for r in rows:
        if r["scenario"] == scenario and r[key] is not None and "timeout" in r["p"]:
            cells.setdefault(float(r["p"]["timeout"]), []).append(float(r[key]))
    return {t: statistics.fmean(v) for t, v in cells.items()}


def _idle_rows(data: report.ReportData) -> tuple[int | None, list[report.Row], list[report.Row]]:
    """The qthresh compared, and the rows with the idle rule on and off."""
    rows = [r for r in data.rows(IDLE_ID) if "idle_gap" in r["p"]]
    if not rows:
        return None, [], []
    qthresh = int(rows[0]["p"].get("qthresh", 0))
    on = [r for r in rows if r["p"]["idle_gap"] != "inf"]
    off = [r for r in rows if r["p"]["idle_gap"] == "inf"]
    return qthresh, on, off


def _spread(values: dict[float, float]) -> float:
    low = min(values.values())
    return max(values.values()) / low if low > 0 else math.nan


def _judge_idle(data: report.ReportData) -> report.Verdict:
    qthresh, on, off = _idle_rows(data)
    lat_on, lat_off = _row(on, "pingpong", "mean_ns"), _row(off, "pingpong", "mean_ns")
    common = sorted(set(lat_on) & set(lat_off))
    if len(common) < 2:
        return report.Verdict(
            status="inconclusive",
            result="Needs ping-pong at two or more timeouts with the idle rule on and off.",
        )
    on_c = {t: lat_on[t] for t in common}
    off_c = {t: lat_off[t] for t in common}
    top = common[-1]
    text = (
        f"At qthresh {qthresh} B, mean ping-pong round trip across timeouts "
        f"{common[0] * 1e3:g}-{top * 1e3:g} ms varies {_spread(on_c):.1f}x with the idle rule and "
        f"{_spread(off_c):.1f}x without it; at {top * 1e3:g} ms it is "
        f"{on_c[top] / 1e3:,.0f} µs with the rule and {off_c[top] / 1e3:,.0f} µs without."
    )
    status: report.Status = "pass" if _spread(off_c) > _spread(on_c) else "fail"
    return report.Verdict(status=status, result=text)


def _idle_section(data: report.ReportData, experiment: str) -> report.Section:
    qthresh, on, off = _idle_rows(data)
    stats = [("mean", "mean_ns"), ("p99", "p99_ns")]
    lines = {
        (rule, stat): _row(rows, "pingpong", key)
        for rule, rows in (("on", on), ("off", off))
        for stat, key in stats
    }
    figures: list[str] = []
    if on or off:
        fig, (ax,) = report.new_figure(1)
        for rule, label in (("on", "idle rule on (cmq)"), ("off", "idle rule off (paper's CMQ)")):
            pts = sorted(lines[rule, "mean"].items())
            if pts:
                ax.plot([t * 1e3 for t, _ in pts], [v / 1e3 for _, v in pts], marker="o", ms=3,
                        label=label)  # fmt: skip
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("batch timeout (ms)")
        ax.set_ylabel("mean ping-pong round trip (µs)")
        ax.set_title(f"qthresh {qthresh} B: round trip against timeout", fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
        figures.append(report.svg(fig))
    timeouts = sorted({t for values in lines.values() for t in values})

    def cell(key: tuple[str, str], t: float) -> str:
        return f"{lines[key][t] / 1e3:,.0f}" if t in lines[key] else ""

    table = report.Table(
        caption=f"qthresh {qthresh} B, idle rule on and off: ping-pong round trip (µs)",
        columns=["timeout (ms)", "mean, on", "mean, off", "p99, on", "p99, off"],
        rows=[[f"{t * 1e3:g}", cell(("on", "mean"), t), cell(("off", "mean"), t),
               cell(("on", "p99"), t), cell(("off", "p99"), t)] for t in timeouts],
    )  # fmt: skip
    return report.Section(
        figures=figures,
        tables=[table, report.latency_table([*on, *off], "All groups")],
        notes=[
            "Ping-pong keeps one message in flight, so before every message the destination is "
            "idle. Idle rule on: such a message leaves at once; off (idle_gap infinite): it waits "
            "for a full batch (qthresh) or its timeout, on both sides of the round trip. Both "
            "sides poll the non-blocking pop (as the paper's applications did) every 20 µs; a "
            "blocking get would flush pending batches before waiting and hide the timeout."
        ],
    )


register_page(
    report.Experiment(
        id=IDLE_ID,
        title="Tuning: does cmq's idle-send rule make the batch timeout matter?",
        paper="Fritsch & Walker, CMQ (J. Cloud Computing, 2012), tuning; ØMQ v0.1's latency mode",
        order=31,
        claims=[
            report.Claim(
                text="With the idle-send rule a message to an idle "
                "destination leaves at once, so the batch timeout sets latency far less than in the "
                "paper's CMQ: latency varies less across timeouts with the rule than without it.",
                judge=_judge_idle,
                target=True,
            )
        ],
        render=_idle_section,
    )
)


# -- the report's section and claims --------------------
def _grid(rows: Sequence[Row], value: str) -> dict[tuple[float, float], float]:
    if value == "msgs_per_s" and any(r["scenario"] == "throughput" for r in rows):
        # Throughput comes from the throughput runs, not from the rate at
        # which a latency probe happened to send.
        rows = [r for r in rows if r["scenario"] == "throughput"]
    cells: dict[tuple[float, float], list[float]] = {}
    for r in rows:
        p = r["p"]
        if "qthresh" in p and "timeout" in p and r[value] is not None:
            cells.setdefault((float(p["qthresh"]), float(p["timeout"])), []).append(float(r[value]))
    return {k: statistics.fmean(v) for k, v in cells.items()}


def _short(v: float) -> str:
    """A cell label: 3 significant digits with k/M, no exponent notation."""
    for scale, suffix in ((1e6, "M"), (1e3, "k")):
        if abs(v) >= scale:
            return f"{v / scale:.3g}{suffix}"
    return f"{v:.3g}"


def _heatmap(ax: Axes, grid: dict[tuple[float, float], float], title: str) -> None:
    qs = sorted({q for q, _ in grid})
    ts = sorted({t for _, t in grid})
    matrix = [[grid.get((q, t), float("nan")) for t in ts] for q in qs]
    image = ax.imshow(matrix, origin="lower", aspect="auto", cmap="viridis")
    ax.set_xticks(range(len(ts)), [f"{t * 1e3:g}" for t in ts], fontsize=7)
    ax.set_yticks(range(len(qs)), [f"{q:g}" for q in qs], fontsize=7)
    ax.set_xlabel("timeout (ms)")
    ax.set_ylabel("qthresh (bytes)")
    ax.set_title(title, fontsize=10)
    for i, row in enumerate(matrix):
        for j, v in enumerate(row):
            if v == v:  # not NaN
                ax.text(j, i, _short(v), ha="center", va="center", fontsize=7, color="w")
    ax.figure.colorbar(image, ax=ax, shrink=0.8)


def _tuning_section(data: ReportData, experiment: str) -> Section:
    rows = data.rows(experiment)
    # Latency rows have a msgs/s too (ping-ping's pace): the rate is throughput's.
    rates = _grid([r for r in rows if r["scenario"] == "throughput"], "msgs_per_s")
    latency = _grid(rows, "mean_ns")
    panels = [
        (g, t)
        for g, t in (
            (rates, "messages/s"),
            ({k: v / 1e3 for k, v in latency.items()}, "mean latency (µs)"),
        )
        if g
    ]
    figures = []
    if panels:
        fig, axes = new_figure(len(panels), height=4.2)
        for ax, (grid, title) in zip(axes, panels, strict=True):
            _heatmap(ax, grid, title)
        figures.append(svg(fig))
    table = Table(
        caption="qthresh x timeout",
        columns=["qthresh (B)", "timeout (ms)", "messages/s", "mean latency µs"],
        rows=[[f"{q:g}", f"{t * 1e3:g}", f"{rates.get((q, t), float('nan')):,.0f}", f"{latency.get((q, t), float('nan')) / 1e3:,.1f}"]
              for q, t in sorted(set(rates) | set(latency))],
    )  # fmt: skip
    return Section(figures=figures, tables=[table, latency_table(rows, "All tuning groups")])


#: The paper's best cell: qthresh 512 B, timeout 200 ms.
PAPER_CELL: Final = (512.0, 0.2)


def _run_rates(data: ReportData) -> dict[tuple[float, float], list[float]]:
    """Each cell's msgs/s, one value per throughput run."""
    cells: dict[tuple[float, float], list[float]] = {}
    for r in data.sample_rows("tuning", metric="msgs_per_s"):
        p = r["p"]
        if "qthresh" in p and "timeout" in p:
            values = r.get("values") or [r["mean"]] * int(r["n"] or 1)
            cells.setdefault((float(p["qthresh"]), float(p["timeout"])), []).extend(
                float(v) for v in values if v
            )
    return {k: v for k, v in cells.items() if v}


def _judge_tuning(data: ReportData) -> Verdict:
    rates = _run_rates(data)
    if len({q for q, _ in rates}) < 2 or len({t for _, t in rates}) < 2:
        return inconclusive(
            "Needs msgs/s of each throughput run over at least 2 qthresh and 2 timeout values."
        )
    medians = {k: statistics.median(v) for k, v in rates.items()}
    best = max(medians, key=lambda k: medians[k])
    q_best = best[0]
    by_timeout = [v for (q, _t), v in medians.items() if q == q_best]
    spread = max(by_timeout) / min(by_timeout) - 1
    text = (
        f"Best median: qthresh {best[0]:g} B, timeout {best[1] * 1e3:g} ms ({medians[best]:,.0f} msgs/s, "
        f"{len(rates[best])} runs). At qthresh {q_best:g} B the timeout moves throughput by "
        f"{100 * spread:.0f}% "
        f"({'it matters' if spread > 0.1 else 'the idle-send rule makes it matter little'})."
    )
    if PAPER_CELL not in rates:
        return inconclusive(text + " The grid lacks the paper's 512 B / 200 ms cell.")
    # The paper's cell against every other: the ratio of medians with its
    # interval over runs; it is the best only if at or above 1x against all.
    intervals = {
        k: ratio_interval(rates[PAPER_CELL], v) for k, v in sorted(rates.items()) if k != PAPER_CELL
    }
    verdicts = {k: decide(iv, 1.0, "at_least") for k, iv in intervals.items()}
    losing = [f"{q:g} B / {t * 1e3:g} ms {intervals[(q, t)]}" for (q, t), v in verdicts.items() if v == "fail"]
    open_ = [f"{q:g} B / {t * 1e3:g} ms {intervals[(q, t)]}" for (q, t), v in verdicts.items()
             if v == "inconclusive"]  # fmt: skip
    if losing:
        text += " The paper's cell over cells that beat it: " + "; ".join(losing) + "."
    if open_:
        text += " Undecided against: " + "; ".join(open_) + "."
    return Verdict(status=combine(list(verdicts.values())), result=text)


PAGE: Final = register_page(
    Experiment(
        id="tuning",
        title="Tuning: cmq throughput and latency over qthresh x timeout",
        paper=f"{CMQ_PAPER}, tuning of qthresh and timeout",
        order=30,
        claims=[
            Claim(
                text="qthresh 512 B with a 200 ms timeout gives the best performance.",
                judge=_judge_tuning,
                rule=(
                    "msgs/s of the paper's cell (512 B, 200 ms) over each other cell's, each the median "
                    "of its interleaved throughput runs, with a 95% bootstrap interval over runs: pass "
                    "when every interval lies at or above 1x (no cell beats it), fail when any lies wholly "
                    "below 1x, otherwise (or with fewer than 3 runs a cell) inconclusive."
                ),
            )
        ],
        render=_tuning_section,
    )
)
