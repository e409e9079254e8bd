"""CMQ paper, Figure 5: ping-pong and ping-ping round trips against message size.

Ping-pong is the Intel MPI Benchmarks' pattern (the next message goes after
the reply), ping-ping the asynchronous one (up to ``profile.window``
messages in flight, the next before the reply). Every system of
``ctx.systems`` at every size of ``profile.rt_sizes``, ``profile.rt_count``
round trips each, on loopback. All systems of one scenario go through one
runner call, so their runs are interleaved (fair on a shared machine).

The two systems the paper compares (:data:`COMPARED`) get ``profile.rt_runs``
runs of every cell, each a fresh process pair, alternated between them; the
others one run each.

Records: one row per round trip (``round_trip=True``), scenario
``"pingpong"`` or ``"pingping"``; a round trip whose reply did not come
within :data:`TIMEOUT` is a row with ``recv_ns`` null.
"""

from __future__ import annotations

from typing import Final

from cmq.lab import runner
from cmq.lab import systems as lab_systems
from cmq.lab.experiments import Context, LabExperiment, register, register_page
from cmq.lab.experiments._common import (
    CMQ_PAPER,
    STALL_FACTOR,
    inconclusive,
    stalls,
)
from cmq.lab.experiments._record import RunBook, step_progress
from cmq.pipeline.report import (
    Claim,
    Experiment,
    ReportData,
    Row,
    Section,
    Status,
    Table,
    Verdict,
    latency_figure,
    latency_table,
)
from cmq.pipeline.stats import Interval, decide, ratio_interval

__all__ = ["COMPARED", "EXPERIMENT", "TIMEOUT"]

#: A reply later than this is a lost round trip. Loopback replies take
#: microseconds to a few milliseconds (brokers); 1 s is far above any of
#: them yet bounds the wait for a datagram that was dropped.
TIMEOUT: Final = 1.0


#: The two systems Figure 5's claim compares: measured ``rt_runs`` times.
COMPARED: Final[tuple[str, ...]] = ("cmq", "msgpack-rpc")


def _compared(ctx: Context) -> list[str]:
    """The compared systems this run has (a missing one was reported by the first pass)."""
    names = [s for s in COMPARED if s in ctx.systems and lab_systems.load(s).available() is None]
    return names if len(names) == len(COMPARED) else []


def _steps(ctx: Context) -> int:
    sizes = len(ctx.profile.rt_sizes)
    extra = (ctx.profile.rt_runs - 1) * len(_compared(ctx))
    return 2 * (len(ctx.systems) + extra) * sizes


def _measure(ctx: Context, book: RunBook, systems: list[str]) -> None:
    """Both scenarios, every size, ``systems`` interleaved: one run each."""
    p = ctx.profile
    progress = step_progress(ctx.step)
    book.add(
        runner.run_pingpong(
            systems, p.rt_sizes, count=p.rt_count, pin=ctx.pin, timeout=TIMEOUT, progress=progress
        )
    )
    progress = step_progress(ctx.step)
    book.add(
        runner.run_pingping(
            systems,
            p.rt_sizes,
            count=p.rt_count,
            pin=ctx.pin,
            timeout=TIMEOUT,
            window=p.window,
            progress=progress,
        ),
        params={"window": p.window},
    )


def _run(ctx: Context) -> None:
    p = ctx.profile
    params = {"count": p.rt_count, "timeout": TIMEOUT}
    # Every system once (the figure), then more runs of the compared pair,
    # alternating between the two, each round a book (so a run id) of its
    # own: the claim's verdict is drawn from the spread between runs (see
    # cmq.pipeline.stats).
    with RunBook(ctx.out, EXPERIMENT.id, pin=ctx.pin, params=params) as book:
        _measure(ctx, book, list(ctx.systems))
    compared = _compared(ctx)
    for _ in range(p.rt_runs - 1 if compared else 0):
        with RunBook(ctx.out, EXPERIMENT.id, pin=ctx.pin, params=params) as book:
            _measure(ctx, book, compared)


EXPERIMENT: Final = register(
    LabExperiment(
        id="cmq-fig5",
        title="CMQ Figure 5: ping-pong and ping-ping against size",
        aliases=("fig5",),
        order=10,
        run=_run,
        steps=_steps,
        runs=lambda p: p.rt_runs,
    )
)


# -- the report's section and claims --------------------
#: Figure 5's allowance for "at": cmq's median round trip may exceed
#: MessagePack-RPC's by this factor and still count as "at or below".
FIG5_AT_MOST: Final = 1.10


def _fig5_cells(data: ReportData) -> dict[tuple[str, int], tuple[list[Row], list[Row]]]:
    """Per (scenario, size): the per-run rows of cmq and of MessagePack-RPC."""
    rows = [r for r in data.run_stat_rows("cmq-fig5") if r["p50_ns"]]
    cells: dict[tuple[str, int], tuple[list[Row], list[Row]]] = {}
    for r in rows:
        if r["system"] not in ("cmq", "msgpack-rpc"):
            continue
        mine, peer = cells.setdefault((r["scenario"], r["size"]), ([], []))
        (mine if r["system"] == "cmq" else peer).append(r)
    return {k: v for k, v in cells.items() if v[0] and v[1]}


def _fig5_intervals(data: ReportData) -> dict[tuple[str, int], Interval]:
    return {
        k: ratio_interval([r["p50_ns"] for r in mine], [r["p50_ns"] for r in peer])
        for k, (mine, peer) in sorted(_fig5_cells(data).items())
    }


def _fig5_section(data: ReportData, experiment: str) -> Section:
    rows = data.rows(experiment)
    figure = latency_figure(
        rows,
        scenarios=[s for s in ("pingpong", "pingping") if any(r["scenario"] == s for r in rows)]
        or None,
    )
    tables = [latency_table(rows, "Round trips per system, scenario and size (all runs together)")]
    intervals = _fig5_intervals(data)
    if intervals:
        tables.append(
            Table(
                caption="cmq against MessagePack-RPC: median round trip ratio over runs",
                columns=["scenario", "size (B)", "runs", "ratio", "95% interval", "verdict"],
                rows=[
                    [s, z, f"{iv.runs_a} + {iv.runs_b}", f"{iv.point:.2f}", f"{iv.lo:.2f}-{iv.hi:.2f}",
                     decide(iv, FIG5_AT_MOST, "at_most")]
                    for (s, z), iv in intervals.items()
                ],
            )
        )
    notes = ["Lost round trips are counted in 'lost' and left out of the latency statistics."]
    stalled = stalls(data, experiment)
    if stalled:
        notes.append(
            f"Stalls (a round trip over {STALL_FACTOR}x its run's median), shown and not judged: "
            + "; ".join(stalled)
            + "."
        )
    return Section(figures=[figure] if figure else [], tables=tables, notes=notes)


def _judge_fig5(data: ReportData) -> Verdict:
    intervals = _fig5_intervals(data)
    if not intervals:
        return inconclusive("Needs cmq and msgpack-rpc round trips at the same scenario and size.")
    verdicts = {k: decide(iv, FIG5_AT_MOST, "at_most") for k, iv in intervals.items()}
    if "fail" in verdicts.values():
        status: Status = "fail"
    elif all(v == "pass" for v in verdicts.values()):
        status = "pass"
    else:
        status = "inconclusive"

    def cells(which: str) -> str:
        ks = [k for k, v in verdicts.items() if v == which]
        return ", ".join(f"{s} {z} B {intervals[(s, z)]}" for s, z in ks)

    parts = [f"cmq/msgpack-rpc median round trip at or below {FIG5_AT_MOST:.2f}x in "
             f"{sum(v == 'pass' for v in verdicts.values())} of {len(verdicts)} (scenario, size) cells"]  # fmt: skip
    if cells("fail"):
        parts.append(f"above it in {cells('fail')}")
    if cells("inconclusive"):
        parts.append(f"undecided in {cells('inconclusive')}")
    stalled = stalls(data, "cmq-fig5")
    text = "; ".join(parts) + "."
    if stalled:
        text += f" {len(stalled)} run(s) had a stall, shown under the figure."
    return Verdict(status=status, result=text)


PAGE: Final = register_page(
    Experiment(
        id="cmq-fig5",
        title="CMQ Figure 5: ping-pong and ping-ping round trips against message size",
        paper=f"{CMQ_PAPER}, Figure 5",
        order=10,
        claims=[
            Claim(
                text="(Paraphrase of Figure 5, check against the paper.) CMQ's round trip, "
                "ping-pong and ping-ping, 4 B to 16 KB, is at or below MessagePack-RPC's.",
                rule=(
                    "per (scenario, size), cmq's median round trip over MessagePack-RPC's (each the median "
                    "of its runs' medians, runs interleaved) with a 95% bootstrap interval over runs: pass "
                    f"when every interval lies at or below {FIG5_AT_MOST:.2f}x, fail when any lies wholly "
                    "above it, otherwise inconclusive (fewer than 3 runs a side: inconclusive)."
                ),
                judge=_judge_fig5,
            )
        ],
        render=_fig5_section,
    )
)
