"""The reliability experiment's targets, the rules that judge them, and nothing else.

Theory of operation
-------------------
The targets are cmq's delivery targets; each is a
named constant below, and each rule is a plain function of the pipeline's
summary rows (:class:`cmq.pipeline.report.ReportData`), so a test can judge
hand-made rows without Spark. The rules were written before anything was
measured and are not to be loosened to fit a measurement.

How a claim is judged:

1. Every claim looks at *cells*: one summary row of cmq for one
   (scenario, delivery mode, loss probability), found by the row's params
   ``{"delivery": ..., "loss": ...}``.
2. Each cell gives ``pass``, ``fail`` or ``inconclusive`` with a few words.
   A cell that was not measured, or with fewer samples than the rule needs
   (the ``MIN_*`` constants), is ``inconclusive``: too few samples never
   pass and never fail.
3. The claim's verdict combines its cells (:func:`combine`): ``fail`` if
   any cell fails, else ``inconclusive`` if any is, else ``pass``.

Percentiles of round trips count a lost round trip (no reply within the
run's timeout) as infinitely slow. The pipeline's ``p50_ns``/``p99_ns`` are
over the completed round trips only, so with losses the true percentile is
bracketed (:func:`quantile_bounds`): at least the completed ones' percentile,
at most the slowest completed one, or infinite when the losses alone reach
past the percentile's rank. A bound is passed only when the whole bracket
is inside it, failed only when the whole bracket is outside.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from cmq.pipeline.report import Claim, ReportData, Row, Status, Verdict

__all__ = [
    "CLAIMS",
    "EXPERIMENT_ID",
    "LATENCY_LOSS",
    "LOSSES",
    "MIN_DELIVERY_MESSAGES",
    "MIN_P50_ROUND_TRIPS",
    "MIN_P99_ROUND_TRIPS",
    "MIN_TP_MESSAGES",
    "MIN_TP_RUNS",
    "MODES",
    "P50_TOLERANCE",
    "P99_BOUND_NS",
    "RELIABLE_MODES",
    "THROUGHPUT_TARGETS",
    "Cell",
    "cell",
    "combine",
    "judge_delivery",
    "judge_p50",
    "judge_p99",
    "judge_throughput",
    "loss_label",
    "modes_missing",
    "quantile_bounds",
]

EXPERIMENT_ID: Final = "reliability"

#: Delivery modes, in the order tables and figures list them.
MODES: Final = ("reliable", "unordered", "best-effort")
#: The modes the claims are about (best-effort is today's behaviour, shown beside).
RELIABLE_MODES: Final = ("reliable", "unordered")
#: The loss probabilities: 0 (the baseline), 1, 1.4, 3 and 10 % (stress).
LOSSES: Final = (0.0, 0.01, 0.014, 0.03, 0.10)
#: Throughput under loss as a share of the lossless throughput, at least.
THROUGHPUT_TARGETS: Final[Mapping[float, float]] = {0.01: 0.90, 0.03: 0.80}
#: The loss of the latency targets (the CMQ paper's Figure 6).
LATENCY_LOSS: Final = 0.014
#: p50 under loss within this share of the lossless p50, either way.
P50_TOLERANCE: Final = 0.10
#: p99 under loss at most this, per mode (ordered delivery adds head-of-line blocking).
P99_BOUND_NS: Final[Mapping[str, float]] = {"unordered": 10e6, "reliable": 15e6}

#: Fewest messages a delivery cell needs: at 1 % loss, about ten repairs.
MIN_DELIVERY_MESSAGES: Final = 1000
#: Fewest runs (repeats) behind each throughput cell of a ratio: one run of
#: a fraction of a second on a shared 2-core machine is noise at the 10 % scale.
MIN_TP_RUNS: Final = 3
#: Fewest messages behind each throughput cell of a ratio, over its runs.
MIN_TP_MESSAGES: Final = 15_000
#: Fewest round trips for a p50 (each side of the comparison).
MIN_P50_ROUND_TRIPS: Final = 200
#: Fewest round trips for a p99: ten or more of them above it.
MIN_P99_ROUND_TRIPS: Final = 1000

Cell = tuple[Status, str]
"""One cell's verdict and what was found there, in a few words."""


def loss_label(loss: float) -> str:
    """``0.014`` -> ``"1.4%"``."""
    return f"{100 * loss:g}%"


def _same(a: Any, b: float) -> bool:
    return isinstance(a, int | float) and math.isclose(float(a), b, abs_tol=1e-9)


def cell(
    data: ReportData, scenario: str, mode: str, loss: float, system: str = "cmq"
) -> Row | None:
    """The summary row of ``system`` for (scenario, delivery mode, loss), if measured.

    Peers (tcp, zmq) have no delivery mode: pass ``mode=""``.
    """
    for r in data.rows(EXPERIMENT_ID, scenario=scenario, system=system):
        p = r["p"]
        if str(p.get("delivery", "")) == mode and _same(p.get("loss"), loss):
            return r
    return None


def combine(cells: Sequence[Cell], what: str) -> Verdict:
    """``fail`` if any cell fails, else ``inconclusive`` if any is, else ``pass``;
    the result lists every cell. No cells at all is inconclusive."""
    if not cells:
        return Verdict(status="inconclusive", result=f"Nothing measured for {what}.")
    statuses = {s for s, _ in cells}
    status: Status = (
        "fail" if "fail" in statuses else "inconclusive" if "inconclusive" in statuses else "pass"
    )
    return Verdict(status=status, result="; ".join(text for _, text in cells) + ".")


def modes_missing(data: ReportData) -> str | None:
    """Why there are no reliable rows, when the measured cmq had no delivery modes."""
    runs = data.run_rows(EXPERIMENT_ID, system="cmq")
    if runs and all(r["p"].get("delivery_modes") is False for r in runs):
        return (
            "the cmq measured has no delivery modes (QueueConfig has no 'delivery'): "
            "only best-effort was run"
        )
    return None


def _with_missing(data: ReportData, verdict: Verdict) -> Verdict:
    why = modes_missing(data)
    if why is None or verdict.status != "inconclusive":
        return verdict
    return Verdict(status="inconclusive", result=f"{why[0].upper()}{why[1:]}. {verdict.result}")


# -- delivery ----------------------------------------------------------------


def _delivery_cell(row: Row | None, loss: float, in_order: bool) -> Cell:
    at = loss_label(loss)
    if row is None:
        return "inconclusive", f"{at}: not measured"
    n = int(row["messages"] or 0)
    text = (
        f"{at}: {row['delivered']:,}/{n:,} delivered, {row['duplicates']} duplicates, "
        f"{row['out_of_order']} out of order"
    )
    if row["lost"] or row["duplicates"] or (in_order and row["out_of_order"]):
        return "fail", text
    if n < MIN_DELIVERY_MESSAGES:
        return "inconclusive", f"{text} (too few: needs {MIN_DELIVERY_MESSAGES:,})"
    return "pass", text


def judge_delivery(data: ReportData, mode: str, *, in_order: bool) -> Verdict:
    """Every message delivered, none twice (and, ``in_order``, none after a
    later one) at every loss of :data:`LOSSES`: one cell per loss."""
    cells = [_delivery_cell(cell(data, "throughput", mode, p), p, in_order) for p in LOSSES]
    return _with_missing(data, combine(cells, mode))


# -- throughput ---------------------------------------------------------------


def _enough_tp(row: Row | None) -> str | None:
    if row is None:
        return "not measured"
    if row["msgs_per_s"] is None:
        return "no rate"
    runs, n = int(row["runs"] or 0), int(row["messages"] or 0)
    if runs < MIN_TP_RUNS or n < MIN_TP_MESSAGES:
        return (
            f"too few: {runs} runs, {n:,} messages (needs {MIN_TP_RUNS} runs and "
            f"{MIN_TP_MESSAGES:,} messages)"
        )
    return None


def _throughput_cell(data: ReportData, mode: str, loss: float, share: float) -> Cell:
    base = cell(data, "throughput", mode, 0.0)
    lossy = cell(data, "throughput", mode, loss)
    head = f"{mode} {loss_label(loss)}"
    for name, row in (("lossless", base), (loss_label(loss), lossy)):
        why = _enough_tp(row)
        if why is not None:
            return "inconclusive", f"{head}: {name} {why}"
    assert base is not None and lossy is not None
    ratio = float(lossy["msgs_per_s"]) / float(base["msgs_per_s"])
    text = (
        f"{head}: {lossy['msgs_per_s']:,.0f} msgs/s = {100 * ratio:.0f}% of lossless "
        f"{base['msgs_per_s']:,.0f} (target >= {100 * share:.0f}%)"
    )
    return ("pass" if ratio >= share else "fail"), text


def judge_throughput(data: ReportData) -> Verdict:
    """Throughput at each loss of :data:`THROUGHPUT_TARGETS` at least that
    share of the lossless throughput, for reliable and unordered."""
    cells = [
        _throughput_cell(data, mode, loss, share)
        for mode in RELIABLE_MODES
        for loss, share in THROUGHPUT_TARGETS.items()
    ]
    return _with_missing(data, combine(cells, "throughput"))


# -- latency -------------------------------------------------------------------


def quantile_bounds(row: Row, q: float) -> tuple[float, float]:
    """Bounds (ns) of the ``q`` quantile over *all* round trips of a row, a
    lost one counting as infinitely slow (see the module docstring).

    Raises:
        ValueError: ``q`` is not one of the pipeline's quantiles (0.5, 0.99).
    """
    column = {0.5: "p50_ns", 0.99: "p99_ns"}.get(q)
    if column is None:
        raise ValueError(f"the pipeline gives the 0.5 and 0.99 quantiles, not {q}")
    n, lost = int(row["messages"] or 0), int(row["lost"] or 0)
    if n == 0 or math.ceil(q * n) > n - lost or row[column] is None:
        return math.inf, math.inf
    low = float(row[column])
    if lost == 0:
        return low, low
    return low, float(row["max_ns"])


def _ms(ns: float) -> str:
    return "never (lost)" if math.isinf(ns) else f"{ns / 1e6:.2f} ms"


def _bracket(lo: float, hi: float) -> str:
    return _ms(lo) if lo == hi else f"{_ms(lo)} to {_ms(hi)}"


def _p50_cell(data: ReportData, mode: str) -> Cell:
    base = cell(data, "pingpong", mode, 0.0)
    lossy = cell(data, "pingpong", mode, LATENCY_LOSS)
    head = f"{mode}"
    for name, row in (("lossless", base), (loss_label(LATENCY_LOSS), lossy)):
        if row is None:
            return "inconclusive", f"{head}: {name} not measured"
        if int(row["messages"] or 0) < MIN_P50_ROUND_TRIPS:
            return "inconclusive", (
                f"{head}: {name} has {row['messages']} round trips (needs {MIN_P50_ROUND_TRIPS})"
            )
    assert base is not None and lossy is not None
    b_lo, b_hi = quantile_bounds(base, 0.5)
    l_lo, l_hi = quantile_bounds(lossy, 0.5)
    if math.isinf(b_hi):
        return "inconclusive", f"{head}: the lossless run lost half its round trips"
    r_lo, r_hi = l_lo / b_hi, (l_hi / b_lo if b_lo > 0 else math.inf)
    text = (
        f"{head}: p50 {_bracket(l_lo, l_hi)} at {loss_label(LATENCY_LOSS)} against "
        f"{_bracket(b_lo, b_hi)} lossless ({_ratio(r_lo, r_hi)})"
    )
    low, high = 1 - P50_TOLERANCE, 1 + P50_TOLERANCE
    if low <= r_lo and r_hi <= high:
        return "pass", text
    if r_hi < low or r_lo > high:
        return "fail", text
    return "inconclusive", text + " (lost round trips leave it open)"


def _ratio(lo: float, hi: float) -> str:
    def one(v: float) -> str:
        return "inf" if math.isinf(v) else f"{100 * (v - 1):+.1f}%"

    return one(lo) if lo == hi else f"{one(lo)} to {one(hi)}"


def judge_p50(data: ReportData) -> Verdict:
    """p50 at :data:`LATENCY_LOSS` within :data:`P50_TOLERANCE` of the
    lossless p50, for reliable and unordered."""
    return _with_missing(data, combine([_p50_cell(data, m) for m in RELIABLE_MODES], "p50"))


def _p99_cell(data: ReportData, mode: str) -> Cell:
    bound = P99_BOUND_NS[mode]
    row = cell(data, "pingpong", mode, LATENCY_LOSS)
    head = f"{mode} (bound {_ms(bound)})"
    if row is None:
        return "inconclusive", f"{head}: not measured at {loss_label(LATENCY_LOSS)}"
    n = int(row["messages"] or 0)
    lo, hi = quantile_bounds(row, 0.99)
    text = f"{head}: p99 {_bracket(lo, hi)} over {n:,} round trips, {row['lost']} lost"
    if n < MIN_P99_ROUND_TRIPS:
        return "inconclusive", f"{text} (too few: needs {MIN_P99_ROUND_TRIPS:,})"
    if hi <= bound:
        return "pass", text
    if lo > bound:
        return "fail", text
    return "inconclusive", text + " (lost round trips leave it open)"


def _peers_p99(data: ReportData) -> str:
    found = []
    for r in data.rows(EXPERIMENT_ID, scenario="pingpong"):
        if r["system"] != "cmq" and _same(r["p"].get("loss"), LATENCY_LOSS):
            lo, hi = quantile_bounds(r, 0.99)
            found.append(f"{r['system']} {_bracket(lo, hi)}")
    return f" Beside, measured the same way: {', '.join(sorted(found))}." if found else ""


def judge_p99(data: ReportData) -> Verdict:
    """p99 at :data:`LATENCY_LOSS` at most :data:`P99_BOUND_NS` of its mode."""
    verdict = combine([_p99_cell(data, m) for m in RELIABLE_MODES], "p99")
    verdict = Verdict(status=verdict.status, result=verdict.result + _peers_p99(data))
    return _with_missing(data, verdict)


def _pct_list(values: Iterable[float]) -> str:
    return ", ".join(loss_label(v) for v in values)


CLAIMS: Final = (
    Claim(
        text=f"Reliable mode delivers 100 % of the messages, none twice, in order, at every "
        f"loss ({_pct_list(LOSSES)}; at least {MIN_DELIVERY_MESSAGES:,} messages each).",
        judge=lambda data: judge_delivery(data, "reliable", in_order=True),
    ),
    Claim(
        text="Unordered mode delivers 100 % of the messages, none twice, at every loss "
        f"({_pct_list(LOSSES)}).",
        judge=lambda data: judge_delivery(data, "unordered", in_order=False),
    ),
    Claim(
        text="Throughput under loss (reliable and unordered, 512 B): at 1 % at least 90 % of "
        f"the lossless run's, at 3 % at least 80 % (each cell: {MIN_TP_RUNS}+ runs, "
        f"{MIN_TP_MESSAGES:,}+ messages).",
        judge=judge_throughput,
    ),
    Claim(
        text="512 B ping-pong at 1.4 % loss: p50 within ±10 % of the lossless p50 "
        f"(reliable and unordered; {MIN_P50_ROUND_TRIPS}+ round trips each).",
        judge=judge_p50,
    ),
    Claim(
        text="512 B ping-pong at 1.4 % loss: p99 at most 10 ms unordered and 15 ms reliable "
        f"({MIN_P99_ROUND_TRIPS:,}+ round trips; a lost round trip counts as infinitely slow).",
        judge=judge_p99,
    ),
)
"""The delivery targets, in the report's order."""
