"""ØMQ v0.1: throughput in messages/s and MB/s against message size, every system.

Each sender sends as fast as its system takes messages for
``profile.tp_duration`` seconds, at every size of ``profile.tp_sizes``
(1 B to 16 KB in the full profile); one runner call for all systems, so the
runs are interleaved. msgs/s counts delivered messages only, from the first
to the last delivery at the receiver (:mod:`cmq.lab.runner`). The report
draws the measured curves beside the ØMQ document's analytic 1 Gb/s limit
(:func:`link_rate`, below with the claims and the section).

Records: one totals row per (system, size), scenario ``"throughput"``.
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Final

from cmq.lab import runner
from cmq.lab.experiments import Context, LabExperiment, register, register_page
from cmq.lab.experiments._common import (
    ZMQ_PAPER,
    by,
    inconclusive,
)
from cmq.lab.experiments._record import RunBook, step_progress
from cmq.pipeline.report import (
    Claim,
    Experiment,
    ReportData,
    Section,
    Table,
    Verdict,
    rate_figure,
    rate_table,
)

if TYPE_CHECKING:
    from matplotlib.axes import Axes

__all__ = ["EXPERIMENT"]

#: The link of the ØMQ document's analysis: 1 Gb/s.
LINK_BPS: Final = 1e9
#: The ØMQ document's figure for the 254 -> 255 byte step.
ZMQ_STEP_CLAIM_PCT: Final = 3.41
#: Header sizes of the analytic figure, in bytes.
HEADER_SIZES: Final = (1, 2, 4, 8)
#: Bytes an Ethernet link spends per TCP segment besides its payload:
#: preamble+SFD 8, MAC header 14, FCS 4, inter-frame gap 12, IPv4 20,
#: TCP 20 + timestamps option 12.
WIRE_OVERHEAD: Final = 8 + 14 + 4 + 12 + 20 + 20 + 12
#: TCP payload per full 1500-byte Ethernet frame (1500 - 20 - 32).
MSS: Final = 1448


def _steps(ctx: Context) -> int:
    return len(ctx.systems) * len(ctx.profile.tp_sizes)


def _run(ctx: Context) -> None:
    p = ctx.profile
    with RunBook(ctx.out, EXPERIMENT.id, pin=ctx.pin, params={"duration": p.tp_duration}) as book:
        book.add(
            runner.run_throughput(
                ctx.systems,
                p.tp_sizes,
                duration=p.tp_duration,
                pin=ctx.pin,
                progress=step_progress(ctx.step),
            )
        )


EXPERIMENT: Final = register(
    LabExperiment(
        id="zmq-throughput",
        title="ØMQ v0.1: throughput against size",
        aliases=("zmq", "throughput"),
        order=50,
        run=_run,
        steps=_steps,
        runs=lambda _p: 1,  # one run per (system, size), in every profile
    )
)


# -- the report's section and claims --------------------
def zmq_header(size: int) -> int:
    """ØMQ v0.1's length prefix: 1 byte below 255, else 0xFF + 8 bytes."""
    return 1 if size < 255 else 9


def link_rate(size: int, header: int, *, link_bps: float = LINK_BPS, wire: bool = False) -> float:
    """Most messages per second a link carries for ``size``-byte messages
    with a ``header``-byte prefix, messages back to back in one stream.

    ``wire=False`` is the ØMQ document's model (only message bytes count);
    ``wire=True`` adds Ethernet, IP and TCP overhead per full segment, which
    scales every rate by the same factor (MSS / (MSS + overhead)).
    """
    per_message = float(size + header)
    if wire:
        per_message *= (MSS + WIRE_OVERHEAD) / MSS
    return link_bps / 8 / per_message


def zmq_step() -> dict[str, float]:
    """The 254 -> 255 byte step of ØMQ v0.1's framing, in per cent.

    ``rate_drop_pct``: fall in messages/s (the document's 3.41%): 1 - 255/264
    = 9/264. ``header_share_pct``: the part due to the 8 extra header bytes,
    8/264; the other 1/264 is the extra payload byte itself.
    ``goodput_drop_pct``: fall in payload bytes/s, (254/255 -> 255/264).
    ``wire_rate_drop_pct``: the rate drop with Ethernet/IP/TCP overhead, the
    same as the document's because that overhead scales both sizes equally.
    """
    r254, r255 = link_rate(254, zmq_header(254)), link_rate(255, zmq_header(255))
    w254, w255 = (
        link_rate(254, zmq_header(254), wire=True),
        link_rate(255, zmq_header(255), wire=True),
    )
    total = 255 + zmq_header(255)
    return {
        "rate_drop_pct": 100 * (1 - r255 / r254),
        "header_share_pct": 100 * (zmq_header(255) - zmq_header(254)) / total,
        "goodput_drop_pct": 100 * (1 - (r255 * 255) / (r254 * 254)),
        "wire_rate_drop_pct": 100 * (1 - w255 / w254),
    }


def _judge_zmq_step(_data: ReportData) -> Verdict:
    step = zmq_step()
    # Arithmetic, not a measurement: shown as context (the measured side of
    # the step is the next claim's).
    return Verdict(
        status="context",
        result=(
            f"Computed, not measured: messages/s fall by {step['rate_drop_pct']:.3f}% from 254 to 255 bytes "
            f"(255 -> 264 bytes per message = 9/264). Of that, {step['header_share_pct']:.2f}% is the "
            f"8 extra header bytes and {100 / 264:.2f}% the extra payload byte; payload MB/s fall by "
            f"only {step['goodput_drop_pct']:.2f}%. Ethernet/IP/TCP overhead scales both sizes alike, "
            f"so on the wire the step stays {step['wire_rate_drop_pct']:.2f}%."
        ),
    )


def _analytic(ax_m: Axes, ax_b: Axes) -> None:
    sizes = [2**k for k in range(15)]
    for h in HEADER_SIZES:
        ax_m.plot(
            sizes, [link_rate(s, h) for s in sizes], ls=":", lw=1, label=f"1 Gb/s, {h} B header"
        )
    fine = list(range(1, 16385))
    ax_m.plot(
        fine,
        [link_rate(s, zmq_header(s)) for s in fine],
        ls="--",
        lw=1,
        color="k",
        label="1 Gb/s, ØMQ v0.1 framing",
    )
    ax_b.plot(
        fine,
        [link_rate(s, zmq_header(s)) * s / 1e6 for s in fine],
        ls="--",
        lw=1,
        color="k",
        label="1 Gb/s, ØMQ v0.1 framing",
    )


def _zmq_section(data: ReportData, experiment: str) -> Section:
    rows = data.rows(experiment)
    figures = [f for f in [rate_figure(rows, extra=_analytic)] if f]
    step = zmq_step()
    analytic = Table(
        caption="Analytic: most messages/s on a 1 Gb/s link (message bytes only)",
        columns=["size (B)", *[f"{h} B header" for h in HEADER_SIZES], "ØMQ v0.1 framing"],
        rows=[
            [
                s,
                *[f"{link_rate(s, h):,.0f}" for h in HEADER_SIZES],
                f"{link_rate(s, zmq_header(s)):,.0f}",
            ]
            for s in (1, 16, 64, 254, 255, 1024, 16384)
        ],
    )
    notes = [
        f"254 -> 255 bytes: messages/s -{step['rate_drop_pct']:.3f}%, payload MB/s "
        f"-{step['goodput_drop_pct']:.3f}%, header share {step['header_share_pct']:.3f}%.",
        "Measured curves are over loopback on this machine, not a 1 Gb/s link: they show where "
        "each system's per-message cost, not the link, is the limit.",
    ]
    tables = [rate_table(rows, "Measured throughput")] if rows else []
    return Section(figures=figures, tables=[*tables, analytic], notes=notes)


def _judge_zmq_measured(data: ReportData) -> Verdict:
    rows = [r for r in data.rows("zmq-throughput") if r["msgs_per_s"] is not None]
    cmq = by([r for r in rows if r["system"] == "cmq"], "size")
    zmq = by([r for r in rows if r["system"] == "zmq"], "size")
    common = sorted(set(cmq) & set(zmq))
    if not common:
        return inconclusive("Needs cmq and zmq throughput at the same sizes.")
    ratios = [cmq[k]["msgs_per_s"] / zmq[k]["msgs_per_s"] for k in common]
    small = [cmq[k]["msgs_per_s"] / zmq[k]["msgs_per_s"] for k in common if k[0] <= 256]
    text = (
        f"cmq/zmq messages/s: median {statistics.median(ratios):.2f}x over {len(common)} sizes "
        f"(min {min(ratios):.2f}x, max {max(ratios):.2f}x)."
    )
    if not small:
        return inconclusive(
            text + " No sizes of 256 B or less to judge batching of small messages."
        )
    return Verdict(status="pass" if statistics.median(small) >= 0.5 else "fail", result=text)


PAGE: Final = register_page(
    Experiment(
        id="zmq-throughput",
        title="ØMQ v0.1: throughput against message size, and the 1 Gb/s analytic limit",
        paper=ZMQ_PAPER,
        order=50,
        claims=[
            Claim(
                text="Going from 254 to 255 bytes, the length prefix grows from 1 to 9 bytes and the "
                "most messages a 1 Gb/s link carries drops by 3.41%.",
                judge=_judge_zmq_step,
            ),
            Claim(
                text="Batching small messages keeps a UDP queue within 2x of ØMQ's messages/s for "
                "sizes up to 256 B.",
                judge=_judge_zmq_measured,
                target=True,
            ),
        ],
        render=_zmq_section,
    )
)
