"""The reliability experiment's section of the report: two figures, two tables, notes.

Drawn from the pipeline's summary rows and sample statistics only
(:class:`cmq.pipeline.report.ReportData`), so it renders from hand-made
rows in tests as it does from Spark's.

- Figure 1: delivered (%) and msgs/s against loss, one line per delivery
  mode, with the throughput targets of the reliable modes marked.
- Figure 2: p50 and p99 round trip against loss, one line per cmq mode and
  per peer, with the p99 bounds drawn.
- Figure 3 (slow receiver, first run): push and take rates, and both
  processes' RSS and the sender's send buffer, against time, the paced
  phase shaded.
- Figure 4 (receiver restart): the detection time of every run in PTOs,
  from the restart and from the kill, with the bound drawn; and what
  became of the pushed messages.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

from cmq.lab.experiments.reliability.claims import (
    DETECT_PTOS,
    EXPERIMENT_ID,
    LATENCY_LOSS,
    MODES,
    P99_BOUND_NS,
    RELIABLE_MODES,
    THROUGHPUT_TARGETS,
    cell,
    loss_label,
    modes_missing,
    repeats,
    scalar,
    series,
)
from cmq.pipeline.report import ReportData, Row, Section, Table, new_figure, svg

if TYPE_CHECKING:
    from matplotlib.axes import Axes

__all__ = ["render"]

_COLOURS: Final = {"reliable": "C0", "unordered": "C1", "best-effort": "C2", "tcp": "C3",
                   "zmq": "C4", "nats": "C5"}  # fmt: skip


def _loss(r: Row) -> float:
    return float(r["p"].get("loss", math.nan))


def _label(r: Row) -> str:
    """``"reliable"``, ``"unordered"``, ``"best-effort"`` for cmq, else the system."""
    return str(r["p"].get("delivery", "")) if r["system"] == "cmq" else str(r["system"])


def _order(label: str) -> tuple[int, str]:
    return (MODES.index(label) if label in MODES else len(MODES), label)


def _loss_axis(ax: Axes, losses: Sequence[float]) -> None:
    # Evenly spaced categories: 1 and 1.4 % would sit on top of each other on a linear axis.
    ax.set_xticks(range(len(losses)), [loss_label(p) for p in losses])
    ax.set_xlabel("packet loss per host (iptables statistic DROP)")
    ax.grid(True, alpha=0.3)


def _sample(data: ReportData, metric: str, mode: str, loss: float) -> float | None:
    for r in data.sample_rows(EXPERIMENT_ID, scenario="throughput", metric=metric, system="cmq"):
        if r["p"].get("delivery") == mode and math.isclose(_loss(r), loss, abs_tol=1e-9):
            return float(r["mean"])
    return None


def _throughput_figure(rows: Sequence[Row]) -> str:
    rows = [r for r in rows if r["messages"]]
    if not rows:
        return ""
    losses = sorted({_loss(r) for r in rows})
    at = {p: i for i, p in enumerate(losses)}
    fig, (ax_d, ax_r) = new_figure(2)
    for mode in sorted({_label(r) for r in rows}, key=_order):
        mine = sorted((r for r in rows if _label(r) == mode), key=_loss)
        colour = _COLOURS.get(mode)
        ax_d.plot([at[_loss(r)] for r in mine], [100 * r["delivered"] / r["messages"] for r in mine],
                  marker="o", ms=4, color=colour, label=mode)  # fmt: skip
        rated = [r for r in mine if r["msgs_per_s"] is not None]
        ax_r.plot([at[_loss(r)] for r in rated], [r["msgs_per_s"] for r in rated],
                  marker="o", ms=4, color=colour, label=mode)  # fmt: skip
        base = next((r["msgs_per_s"] for r in rated if _loss(r) == 0.0), None)
        if mode in RELIABLE_MODES and base:
            pts = [(at[p], share * base) for p, share in THROUGHPUT_TARGETS.items() if p in at]
            if pts:
                ax_r.scatter([x for x, _ in pts], [y for _, y in pts], marker="_", s=300,
                             color=colour, label=f"{mode} target")  # fmt: skip
    for ax in (ax_d, ax_r):
        _loss_axis(ax, losses)
        ax.legend(fontsize=7)
    ax_d.set_ylabel("delivered (% of sent)")
    ax_d.set_title("delivered against loss", fontsize=10)
    ax_r.set_ylabel("messages/s, 512 B (first send to last delivery)")
    ax_r.set_ylim(bottom=0)
    ax_r.set_title("throughput against loss", fontsize=10)
    return svg(fig)


def _latency_figure(rows: Sequence[Row]) -> str:
    rows = [r for r in rows if r["p50_ns"] is not None]
    if not rows:
        return ""
    losses = sorted({_loss(r) for r in rows})
    at = {p: i for i, p in enumerate(losses)}
    fig, (ax_50, ax_99) = new_figure(2)
    for label in sorted({_label(r) for r in rows}, key=_order):
        mine = sorted((r for r in rows if _label(r) == label), key=_loss)
        name = f"cmq {label}" if label in MODES else label
        style: dict[str, Any] = {"marker": "o", "ms": 4, "color": _COLOURS.get(label),
                                 "ls": "-" if label in MODES else "--"}  # fmt: skip
        xs = [at[_loss(r)] for r in mine]
        ax_50.plot(xs, [r["p50_ns"] / 1e3 for r in mine], label=name, **style)
        ax_99.plot(xs, [r["p99_ns"] / 1e3 for r in mine], label=name, **style)
    for mode, bound in P99_BOUND_NS.items():
        ax_99.axhline(bound / 1e3, ls=":", lw=1, color=_COLOURS[mode],
                      label=f"{mode} p99 bound at {loss_label(LATENCY_LOSS)}")  # fmt: skip
    for ax, q in ((ax_50, "p50"), (ax_99, "p99")):
        _loss_axis(ax, losses)
        ax.set_yscale("log")
        ax.set_ylabel(f"{q} round trip (µs), completed ones")
        ax.set_title(f"512 B ping-pong {q} against loss", fontsize=10)
        ax.legend(fontsize=7)
    return svg(fig)


def _num(v: float | None, digits: int = 0) -> str:
    return "" if v is None else f"{v:,.{digits}f}"


def _us(ns: float | None) -> str:
    return "" if ns is None else f"{ns / 1e3:,.1f}"


def _throughput_table(data: ReportData, rows: Sequence[Row]) -> Table:
    out = []
    for r in sorted(rows, key=lambda r: (_order(_label(r)), _loss(r))):
        mode, loss = _label(r), _loss(r)
        base = cell(data, "throughput", mode, 0.0)
        vs = (
            f"{100 * r['msgs_per_s'] / base['msgs_per_s']:.0f}%"
            if base and base["msgs_per_s"] and r["msgs_per_s"]
            else ""
        )
        sent_dg = _sample(data, "sender_datagrams_sent", mode, loss)
        status = _sample(data, "receiver_status_sent", mode, loss)
        share = f"{100 * status / sent_dg:.1f}%" if status is not None and sent_dg else ""
        drop = _sample(data, "link_drop_rate", mode, loss)
        out.append([
            mode, loss_label(loss), r["runs"], r["messages"], r["delivered"],
            f"{100 * r['delivered'] / r['messages']:.2f}%" if r["messages"] else "",
            r["duplicates"], r["out_of_order"], _num(r["msgs_per_s"]), vs,
            _num(_sample(data, "sender_retransmits", mode, loss)), _num(status), share,
            _num(_sample(data, "sender_in_doubt", mode, loss)),
            _num(_sample(data, "receiver_kernel_drops", mode, loss)),
            "" if drop is None else f"{100 * drop:.2f}%",
        ])  # fmt: skip
    return Table(
        caption="Throughput runs (512 B) per delivery mode and loss; counters are means per run",
        columns=["delivery", "loss", "runs", "sent", "delivered", "delivered %", "duplicates",
                 "out of order", "msgs/s", "of lossless", "retransmits", "STATUS sent",
                 "STATUS / data datagrams", "in doubt", "kernel drops", "measured drop rate"],
        rows=out,
    )  # fmt: skip


def _latency_table(data: ReportData, rows: Sequence[Row]) -> Table:
    out = []
    for r in sorted(rows, key=lambda r: (r["system"] != "cmq", _order(_label(r)), _loss(r))):
        label = _label(r)
        mode = label if r["system"] == "cmq" else ""
        base = cell(data, "pingpong", mode, 0.0, system=r["system"])
        vs = (
            f"{100 * (r['p50_ns'] / base['p50_ns'] - 1):+.1f}%"
            if base and base["p50_ns"] and r["p50_ns"]
            else ""
        )
        out.append([
            r["system"], mode, loss_label(_loss(r)), r["messages"], r["lost"], _us(r["p50_ns"]),
            _us(r["p99_ns"]), _us(r["max_ns"]), vs, f"{r['p'].get('timeout', '')}",
        ])  # fmt: skip
    return Table(
        caption="512 B ping-pong per system, delivery mode and loss (percentiles of completed "
        "round trips; a round trip without its reply within the timeout is lost)",
        columns=["system", "delivery", "loss", "round trips", "lost", "p50 µs", "p99 µs",
                 "max µs", "p50 vs lossless", "timeout s"],
        rows=out,
    )  # fmt: skip


def _rates(points: Sequence[tuple[float, float]]) -> tuple[list[float], list[float]]:
    """Per-interval rates of a cumulative count, at each interval's end."""
    xs, ys = [], []
    for (x0, v0), (x1, v1) in itertools.pairwise(points):
        if x1 > x0:
            xs.append(x1)
            ys.append((v1 - v0) / (x1 - x0))
    return xs, ys


def _slow_figure(data: ReportData) -> str:
    ks = repeats(data, "slow")
    if not ks:
        return ""
    k = ks[0]
    pushed = series(data, "slow", k, "sender_pushed")
    taken = series(data, "slow", k, "receiver_taken")
    if not pushed or not taken:
        return ""
    fig, (ax_r, ax_m) = new_figure(2)
    for points, label, colour in ((pushed, "sender pushes/s", "C0"),
                                  (taken, "receiver takes/s", "C1")):  # fmt: skip
        ax_r.plot(*_rates(points), color=colour, lw=1, label=label)
    for metric, label, colour in (("sender_rss", "sender RSS", "C0"),
                                  ("receiver_rss", "receiver RSS", "C1"),
                                  ("sender_send_buffered", "sender send_buffered", "C2"),
                                  ("receiver_held_bytes", "receiver held_bytes", "C3")):  # fmt: skip
        points = series(data, "slow", k, metric)
        ax_m.plot([x for x, _ in points], [v / 2**20 for _, v in points], color=colour, lw=1,
                  label=label)  # fmt: skip
    lo, hi = scalar(data, "slow", k, "pace_from_s"), scalar(data, "slow", k, "pace_until_s")
    for ax in (ax_r, ax_m):
        if lo is not None and hi is not None:
            ax.axvspan(lo, hi, color="0.9", label="paced phase")
        ax.set_xlabel("seconds since the sender's first push")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    ax_r.set_yscale("log")
    ax_r.set_ylabel("messages/s (per 50 ms sample)")
    ax_r.set_title(f"slow receiver, run {k}: push and take rates", fontsize=10)
    ax_m.set_ylabel("MiB")
    ax_m.set_ylim(bottom=0)
    ax_m.set_title("memory and buffers", fontsize=10)
    return svg(fig)


def _restart_figure(data: ReportData) -> str:
    ks = [k for k in repeats(data, "restart") if scalar(data, "restart", k, "pto_s")]
    if not ks:
        return ""
    fig, (ax_d, ax_n) = new_figure(2)
    for metric, label, colour, dx in (("detect_from_ready_s", "from the restart", "C0", -0.15),
                                      ("detect_from_kill_s", "from the kill", "C1", 0.15)):  # fmt: skip
        ys = [(scalar(data, "restart", k, metric) or math.nan) / (scalar(data, "restart", k, "pto_s") or math.nan)
              for k in ks]  # fmt: skip
        ax_d.bar([k + dx for k in ks], ys, width=0.3, color=colour, label=label)
    ax_d.axhline(DETECT_PTOS, ls=":", color="k", lw=1, label=f"bound: {DETECT_PTOS:g} PTO")
    ax_d.set_xlabel("run")
    ax_d.set_ylabel("detection time (base PTOs of the sender)")
    ax_d.set_title("restart detected, in PTOs", fontsize=10)
    ax_d.legend(fontsize=7)
    bottom = [0.0] * len(ks)
    for metric, label, colour in (("taken_first", "taken by the first", "C0"),
                                  ("named", "named in doubt", "C3"),
                                  ("unaccounted", "neither (acknowledged, unread)", "C7"),
                                  ("taken_second", "taken by the second", "C2")):  # fmt: skip
        ys = [scalar(data, "restart", k, metric) or 0.0 for k in ks]
        if metric == "named":  # the named ones the first took are counted there already
            ys = [y - (scalar(data, "restart", k, "named_taken_first") or 0.0)
                  for y, k in zip(ys, ks, strict=True)]  # fmt: skip
        ax_n.bar(ks, ys, bottom=bottom, color=colour, label=label)
        bottom = [b + y for b, y in zip(bottom, ys, strict=True)]
    ax_n.set_xlabel("run")
    ax_n.set_ylabel("messages pushed")
    ax_n.set_title("what became of every message pushed", fontsize=10)
    ax_n.legend(fontsize=7)
    for ax in (ax_d, ax_n):
        ax.set_xticks(ks)
        ax.grid(True, axis="y", alpha=0.3)
    return svg(fig)


def _loopback_table(data: ReportData) -> Table | None:
    out = []
    for k in repeats(data, "slow"):

        def v(m: str, k: int = k) -> float | None:
            return scalar(data, "slow", k, m)

        drops = series(data, "slow", k, "receiver_kernel_drops")
        out.append(["slow receiver", k, _num(v("calib_rate")), _num(v("pace_rate")),
                    _num(drops[-1][1] - drops[0][1]) if drops else "", "", "", "", ""])  # fmt: skip
    for k in repeats(data, "restart"):

        def w(m: str, k: int = k) -> float | None:
            return scalar(data, "restart", k, m)

        pto = w("pto_s")
        out.append(["restart", k, "", "", "",
                    _num(None if w("restart_gap_s") is None else 1e3 * (w("restart_gap_s") or 0), 1),
                    _num(None if pto is None else 1e3 * pto, 1), _num(w("named")),
                    _num(w("unaccounted"))])  # fmt: skip
    if not out:
        return None
    return Table(
        caption="Loopback runs: the slow receiver's calibration and kernel drops; the "
        "restart's gap (kill to the new incarnation listening), the sender's PTO, what "
        "was named in doubt and what was neither taken nor named",
        columns=["scenario", "run", "unthrottled msgs/s", "paced msgs/s", "kernel drops",
                 "restart gap ms", "PTO ms", "named in doubt", "unnamed, not taken"],
        rows=out,
    )  # fmt: skip


def render(data: ReportData, experiment: str) -> Section:
    """The section: figures, tables and notes of ``experiment``'s rows."""
    tp = data.rows(experiment, scenario="throughput", system="cmq")
    rt = data.rows(experiment, scenario="pingpong")
    figures = [f for f in (_throughput_figure(tp), _latency_figure(rt), _slow_figure(data),
                           _restart_figure(data)) if f]  # fmt: skip
    notes = [
        "Every run in fresh network namespaces; the lossless baseline is measured in the same "
        "run, in the same kind of namespaces, interleaved with the lossy runs. Datagrams are "
        "at most 1472 B (one Ethernet frame), so the rule drops whole datagrams.",
        "Throughput comes from per-message records through the pipeline: distinct messages "
        "delivered / (last delivery - first send), summed over the runs of a cell.",
        "The rules judging the claims (sample minimums, how lost round trips count in a "
        "percentile) are in cmq.lab.experiments.reliability.claims, fixed before measuring.",
    ]
    notes.append(
        "The slow receiver and the restart run on loopback in the host's own network "
        "namespace (no loss needed, no root), 512 B messages, reliable mode with on_full="
        "'block' and every other option at its default; their time series' x is seconds since "
        "the sender's first push (one clock for both processes)."
    )
    why = modes_missing(data)
    if why is not None:
        notes.insert(0, f"Note: {why}.")
    tables = []
    if tp:
        tables.append(_throughput_table(data, tp))
    if rt:
        tables.append(_latency_table(data, rt))
    loop = _loopback_table(data)
    if loop is not None:
        tables.append(loop)
    if not tables:
        notes.append("No records for this experiment.")
    return Section(figures=figures, tables=tables, notes=notes)
