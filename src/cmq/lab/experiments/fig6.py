"""CMQ paper, Figure 6: Figure 5's round trips under injected packet loss.

Injected exactly as the paper did: every (system, size, scenario) gets a
fresh pair of network namespaces (:class:`cmq.lab.netns.HostPair`) with
``iptables -A INPUT -m statistic --mode random --probability P -j DROP`` on
both hosts; the echo server runs on host ``b``, the client on host ``a``.
The lossless baseline runs first in the same namespaces with the rule at
probability 0 (the same path through netfilter), then the rule is set to P
and TCP's cached path metrics are flushed, so no TCP state (congestion
window, RTO estimate) carries from one run to the next. The whole is
repeated ``profile.loss_runs`` times; rows carry ``{"loss": p}`` in their
params, so the baseline and the lossy runs stay apart. The kernel reassembles IP
fragments before the INPUT chain, so the rule drops whole datagrams (a
16 KB cmq or UDP datagram is one chance of loss, not twelve), as it did in
the paper's setup.

Lost round trips are counted, not hidden. How long a client waits for a
reply depends on the transport: a datagram system's lost message never
comes, so waiting longer than :data:`LOSSY_DATAGRAM_TIMEOUT` only slows the run; a
stream system's reply always comes, after TCP retransmits (200 ms minimum
RTO, doubling), so it gets :data:`STREAM_TIMEOUT` and its slow replies are
measured rather than cut off.

The brokers (nats, rabbitmq) run in the host's network namespace, which the
lossy namespaces cannot reach: they are skipped here, with that reason.

Needs root, ``ip`` and ``iptables``; without them the experiment is skipped
with the reason (:func:`cmq.lab.netns.unavailable`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from cmq._errors import ConfigError
from cmq.lab import netns, runner
from cmq.lab import systems as lab_systems
from cmq.lab.experiments import Context, LabExperiment, register, register_page
from cmq.lab.experiments._common import (
    BROKER_REASON,
    BROKERS,
    CMQ_PAPER,
    DATAGRAM_TIMEOUT,
    STREAM_TIMEOUT,
    TCP_BASED,
    inconclusive,
    stalls,
)
from cmq.lab.experiments._record import RunBook
from cmq.pipeline.report import (
    Claim,
    Experiment,
    ReportData,
    Row,
    Section,
    Table,
    Verdict,
    latency_figure,
    latency_table,
)
from cmq.pipeline.stats import Interval, combine, decide, decide_within, ratio_interval

__all__ = ["BROKERS", "DATAGRAM_TIMEOUT", "EXPERIMENT", "LOSSY_DATAGRAM_TIMEOUT", "STREAM_TIMEOUT"]

SCENARIOS: Final = ("pingpong", "pingping")


def _unavailable(_ctx: Context) -> str | None:
    why = netns.unavailable(loss=True)
    return None if why is None else f"{why}; the lossy experiment cmq-fig6 is skipped"


def _measured(ctx: Context) -> list[str]:
    return [s for s in ctx.systems if s not in BROKERS]


def _steps(ctx: Context) -> int:
    p = ctx.profile
    return 2 * p.loss_runs * len(SCENARIOS) * len(_measured(ctx)) * len(p.loss_sizes)


#: How long a datagram system's client waits for a reply here before it counts
#: the round trip lost: 0.1 s, thousands of times the round trip through the
#: namespaces' veth pair. Each lost reply is waited out, so the shared 0.2 s
#: (:data:`DATAGRAM_TIMEOUT`) cost about 1.7 s per lossy 300-round-trip run.
LOSSY_DATAGRAM_TIMEOUT: Final = DATAGRAM_TIMEOUT / 2


def _timeout(system: str) -> float:
    return LOSSY_DATAGRAM_TIMEOUT if lab_systems.load(system).DATAGRAM else STREAM_TIMEOUT


def _one(ctx: Context, hosts: netns.HostPair, system: str, size: int, scenario: str) -> list[runner.Result]:
    """One run in ``hosts``: server on host b, client on host a."""
    p = ctx.profile
    if scenario == "pingpong":
        return runner.run_pingpong(
            [system],
            [size],
            count=p.loss_count,
            pin=ctx.pin,
            timeout=_timeout(system),
            server_prefix=hosts.command("b"),
            client_prefix=hosts.command("a"),
            bind=hosts.addr_b,
        )
    return runner.run_pingping(
        [system],
        [size],
        count=p.loss_count,
        pin=ctx.pin,
        timeout=_timeout(system),
        window=p.window,
        server_prefix=hosts.command("b"),
        client_prefix=hosts.command("a"),
        bind=hosts.addr_b,
    )


def _run(ctx: Context) -> None:
    p = ctx.profile
    params = {"count": p.loss_count}
    usable: list[str] = []
    with RunBook(ctx.out, EXPERIMENT.id, pin=ctx.pin, loss=ctx.loss, params=params) as book:
        for system in ctx.systems:
            if system in BROKERS:
                book.skip(system, BROKER_REASON)
                continue
            # A system that is missing here is skipped once, not once per run.
            why = lab_systems.load(system).available()
            if why is not None:
                book.skip(system, why)
                for _ in range(2 * p.loss_runs * len(SCENARIOS) * len(p.loss_sizes)):
                    ctx.step(f"{system} skipped")
                continue
            usable.append(system)
    # Each round is a run (a book, so a run id) per system and loss: the
    # verdicts are drawn from the spread between rounds. Within a round,
    # each (size, scenario) visits every system, in an order that rotates,
    # and each visit measures the lossless baseline, then the lossy run, in
    # the same fresh namespaces (rule at 0, then at the loss).
    turn = 0
    for _ in range(p.loss_runs):
        with (
            RunBook(ctx.out, EXPERIMENT.id, pin=ctx.pin, loss=0.0, params=params) as base,
            RunBook(ctx.out, EXPERIMENT.id, pin=ctx.pin, loss=ctx.loss, params=params) as lossy,
        ):
            for system in usable:
                base.open(system, params={"timeout": _timeout(system)})
                lossy.open(system, params={"timeout": _timeout(system)})
            for size in p.loss_sizes:
                for scenario in SCENARIOS:
                    k = turn % len(usable) if usable else 0
                    turn += 1
                    for system in usable[k:] + usable[:k]:
                        extra = {"window": p.window} if scenario == "pingping" else {}
                        try:
                            with netns.HostPair(loss=0.0, rule=True) as hosts:
                                results = _one(ctx, hosts, system, size, scenario)
                                base.add(results, params={**extra, "loss": 0.0})
                                ctx.step(f"{scenario} {system} {size} B, no loss")
                                hosts.set_loss(ctx.loss)
                                results = _one(ctx, hosts, system, size, scenario)
                                lossy.add(results, params={**extra, "loss": ctx.loss})
                                ctx.step(f"{scenario} {system} {size} B, loss {ctx.loss:g}")
                        except ConfigError as exc:
                            lossy.problem(system, f"{scenario} {size} B: network namespaces: {exc}")


EXPERIMENT: Final = register(
    LabExperiment(
        id="cmq-fig6",
        title="CMQ Figure 6: round trips under packet loss",
        aliases=("fig6", "loss"),
        order=20,
        run=_run,
        steps=_steps,
        unavailable=_unavailable,
        runs=lambda p: p.loss_runs,
    )
)


# -- the report's section and claims --------------------
#: Figure 6, "unaffected by loss": cmq's median round trip under loss over
#: its lossless one, per cell, must lie in this band.
FIG6_UNAFFECTED: Final = (0.8, 1.25)
#: "About 4x": the TCP-based systems' mean round trip under loss over the
#: lossless one within a factor of two of 4.
FIG6_ABOUT_4X: Final = (2.0, 8.0)
#: 512 B standard deviation under loss over lossless: "stays" for cmq at
#: most this, "grows" for MessagePack-RPC at least that.
FIG6_SD_STAYS: Final = 1.5
FIG6_SD_GROWS: Final = 3.0
_NO_BASELINE: Final = (
    "Needs the lossless baseline measured in the same namespaces, between the lossy runs "
    "(records of this version of the lab: rows with a 'loss' parameter)."
)


def _fig6_cells(data: ReportData, system: str) -> dict[tuple[str, int], tuple[list[Row], list[Row]]]:
    """Per (scenario, size): ``system``'s lossless and lossy per-run rows of cmq-fig6."""
    cells: dict[tuple[str, int], tuple[list[Row], list[Row]]] = {}
    for r in data.run_stat_rows("cmq-fig6", system=system):
        loss = r["p"].get("loss")
        if loss is None or not r["p50_ns"]:
            continue
        base, lossy = cells.setdefault((r["scenario"], r["size"]), ([], []))
        (lossy if loss > 0 else base).append(r)
    return {k: v for k, v in sorted(cells.items()) if v[0] and v[1]}


def _fig6_interval(base: list[Row], lossy: list[Row], column: str) -> Interval | None:
    a = [r[column] for r in lossy if r[column]]
    b = [r[column] for r in base if r[column]]
    return ratio_interval(a, b) if a and b else None


def _fig6_band(
    data: ReportData, systems: Sequence[str], column: str, band: tuple[float, float]
) -> tuple[list[str], list[str], list[Row]]:
    """Per system and cell: the verdict of "``column`` under loss over lossless
    lies in ``band``", its line of text, and the lossy rows judged."""
    verdicts: list[str] = []
    parts: list[str] = []
    lossy_rows: list[Row] = []
    for system in systems:
        for (scenario, size), (base, lossy) in _fig6_cells(data, system).items():
            iv = _fig6_interval(base, lossy, column)
            if iv is None:
                continue
            v = decide_within(iv, *band)
            verdicts.append(v)
            who = "" if len(systems) == 1 else f"{system} "
            parts.append(f"{who}{scenario} {size} B {iv} [{v}]")
            lossy_rows += lossy
    return verdicts, parts, lossy_rows


def _judge_fig6_cmq(data: ReportData) -> Verdict:
    verdicts, parts, lossy = _fig6_band(data, ["cmq"], "p50_ns", FIG6_UNAFFECTED)
    if not verdicts:
        return inconclusive(_NO_BASELINE)
    lost = sum(r["lost"] or 0 for r in lossy)
    sent = sum(r["messages"] or 0 for r in lossy)
    text = (
        "cmq's median round trip under loss over lossless: " + "; ".join(parts)
        + f". {lost} of {sent} round trips lost ({100 * lost / max(sent, 1):.2f}%), counted, not waited for."
    )  # fmt: skip
    return Verdict(status=combine(verdicts), result=text)


def _judge_fig6_tcp(data: ReportData) -> Verdict:
    verdicts, parts, _ = _fig6_band(data, sorted(TCP_BASED), "mean_ns", FIG6_ABOUT_4X)
    if not verdicts:
        return inconclusive("Needs a TCP-based system measured with and without loss. " + _NO_BASELINE)
    return Verdict(status=combine(verdicts), result="Mean round trip under loss over lossless: " + "; ".join(parts) + ".")


def _judge_fig6_512(data: ReportData) -> Verdict:
    def interval(system: str) -> Interval | None:
        base, lossy = _fig6_cells(data, system).get(("pingpong", 512), ([], []))
        return _fig6_interval(base, lossy, "stddev_ns") if base and lossy else None

    cmq, peer = interval("cmq"), interval("msgpack-rpc")
    if cmq is None or peer is None:
        return inconclusive("Needs 512 B ping-pong for cmq and msgpack-rpc with and without loss. " + _NO_BASELINE)
    verdicts = [decide(cmq, FIG6_SD_STAYS, "at_most"), decide(peer, FIG6_SD_GROWS, "at_least")]
    text = (
        f"512 B ping-pong sd under loss over lossless: cmq {cmq} [{verdicts[0]}], "
        f"msgpack-rpc {peer} [{verdicts[1]}] (paper: ~1x and ~15x)."
    )
    return Verdict(status=combine(verdicts), result=text)


def _fig6_section(data: ReportData, experiment: str) -> Section:
    rows = data.rows(experiment)
    lossy_rows = [r for r in rows if r["p"].get("loss", 1) != 0]
    figure = latency_figure(lossy_rows, title="under loss")
    losses = sorted({r["loss"] for r in data.run_rows(experiment)})
    ratio_rows = []
    for system in sorted({r["system"] for r in rows}):
        for (scenario, size), (base, lossy) in _fig6_cells(data, system).items():
            cells = [system, scenario, size, f"{len(base)} + {len(lossy)}"]
            for column in ("p50_ns", "mean_ns", "stddev_ns"):
                iv = _fig6_interval(base, lossy, column)
                cells.append("" if iv is None else f"{iv.point:.2f} ({iv.lo:.2f}-{iv.hi:.2f})")
            cells.append(sum(r["lost"] or 0 for r in lossy))
            ratio_rows.append(cells)
    tables = [latency_table(rows, "Round trips with (loss > 0) and without loss, all runs together")]
    if ratio_rows:
        tables.append(
            Table(
                caption="Under loss over lossless, same namespaces: ratio (95% interval over runs)",
                columns=["system", "scenario", "size (B)", "runs", "median", "mean", "sd", "lost"],
                rows=ratio_rows,
            )
        )
    notes = [
        f"Loss probabilities of the runs: {', '.join(f'{p:g}' for p in losses) or 'unknown'}; "
        "iptables statistic DROP on INPUT of both hosts, in fresh network namespaces; each lossless "
        "baseline runs just before its lossy run, in the same namespaces with the rule at 0."
    ]
    stalled = stalls(data, experiment)
    if stalled:
        notes.append("Stalls, shown and not judged: " + "; ".join(stalled) + ".")
    return Section(figures=[figure] if figure else [], tables=tables, notes=notes)


PAGE: Final = register_page(
    Experiment(
        id="cmq-fig6",
        title="CMQ Figure 6: round trips under 1.4% packet loss",
        paper=f"{CMQ_PAPER}, Figure 6",
        order=20,
        claims=[
            Claim(
                text="CMQ is unaffected by packet loss: its mean stays within the standard deviation of the lossless mean.",
                rule=(
                    "per (scenario, size), cmq's median round trip under loss over its lossless median "
                    "(same namespaces, interleaved rounds), 95% bootstrap interval over runs: pass when "
                    f"every interval lies within {FIG6_UNAFFECTED[0]:g}-{FIG6_UNAFFECTED[1]:g}x, fail when "
                    "any lies wholly outside, else inconclusive; lost round trips are counted beside it."
                ),
                judge=_judge_fig6_cmq,
            ),
            Claim(
                text="The TCP-based systems slow down about 4x under loss.",
                rule=(
                    "per TCP-based system and cell, mean round trip under loss over lossless (the mean: "
                    "retransmission stalls are what slows them), 95% interval over runs: pass when every "
                    f"interval lies within {FIG6_ABOUT_4X[0]:g}-{FIG6_ABOUT_4X[1]:g}x (4x within a factor "
                    "of two), fail when any lies wholly outside, else inconclusive."
                ),
                judge=_judge_fig6_tcp,
            ),
            Claim(
                text="For 512 B, CMQ's standard deviation stays at its lossless value, while MessagePack-RPC's grows from 54 ms to 820 ms.",
                rule=(
                    "512 B ping-pong, standard deviation under loss over lossless, 95% interval over runs: "
                    f"pass when cmq's lies at or below {FIG6_SD_STAYS:g}x and MessagePack-RPC's at or above "
                    f"{FIG6_SD_GROWS:g}x, fail when either is wholly on the wrong side, else inconclusive."
                ),
                judge=_judge_fig6_512,
            ),
        ],
        render=_fig6_section,
    )
)
