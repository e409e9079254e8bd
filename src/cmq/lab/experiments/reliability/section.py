"""The reliability experiment's section of the report: two figures, two tables, notes.

Drawn from the pipeline's summary rows and sample statistics only
(:class:`cmq.pipeline.report.ReportData`), so it renders from hand-made
rows in tests as it does from Spark's.

- Figure 1: delivered (%) and msgs/s against loss, one line per delivery
  mode, with the throughput targets of the reliable modes marked.
- Figure 2: p50 and p99 round trip against loss, one line per cmq mode and
  per peer, with the p99 bounds drawn.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

from cmq.lab.experiments.reliability.claims import (
    EXPERIMENT_ID,
    LATENCY_LOSS,
    MODES,
    P99_BOUND_NS,
    RELIABLE_MODES,
    THROUGHPUT_TARGETS,
    cell,
    loss_label,
    modes_missing,
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


def render(data: ReportData, experiment: str) -> Section:
    """The section: figures, tables and notes of ``experiment``'s rows."""
    tp = data.rows(experiment, scenario="throughput", system="cmq")
    rt = data.rows(experiment, scenario="pingpong")
    figures = [f for f in (_throughput_figure(tp), _latency_figure(rt)) if f]
    notes = [
        "Every run in fresh network namespaces; the lossless baseline is measured in the same "
        "run, in the same kind of namespaces, interleaved with the lossy runs. Datagrams are "
        "at most 1472 B (one Ethernet frame), so the rule drops whole datagrams.",
        "Throughput comes from per-message records through the pipeline: distinct messages "
        "delivered / (last delivery - first send), summed over the runs of a cell.",
        "The rules judging the claims (sample minimums, how lost round trips count in a "
        "percentile) are in cmq.lab.experiments.reliability.claims, fixed before measuring.",
    ]
    why = modes_missing(data)
    if why is not None:
        notes.insert(0, f"Note: {why}.")
    tables = []
    if tp:
        tables.append(_throughput_table(data, tp))
    if rt:
        tables.append(_latency_table(data, rt))
    if not tables:
        notes.append("No records for this experiment.")
    return Section(figures=figures, tables=tables, notes=notes)
