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

The loopback scenarios (``"slow"``, ``"restart"``) are judged per run: each
run's rows carry ``{"delivery": "reliable", "repeat": k}`` as params, its
time series are samples whose ``x`` is seconds since the sender's first
push (both processes read CLOCK_MONOTONIC on one host), and its scalars are
samples without ``x``. Every run is one cell; a claim over fewer than
:data:`MIN_LOOPBACK_RUNS` runs is inconclusive unless one of them fails.

Slow receiver
    The receiver takes the first messages as they come, which measures the
    sender's unthrottled push rate from their send stamps; then it takes
    :data:`SLOW_SHARE` of that rate, paced, until the sender stops (the
    *paced phase*); then the rest as it comes. The rules:

    - kernel drops: the receiver socket's drop counter did not move over
      the run;
    - held back: over the second half of the paced phase, the sender's push
      rate (pushes returned per second) is within :data:`HELD_BACK_TOLERANCE`
      of the receiver's consumption rate, either way;
    - memory flat: for each process, the largest RSS sample of the paced
      phase's last third is at most :data:`RSS_GROWTH_BOUND` above the
      largest of its first third;
    - delivered: every message pushed was taken once, in order.

    A window (half, third) with fewer than :data:`MIN_WINDOW_SAMPLES`
    samples leaves its cell inconclusive.

Receiver restart
    The first incarnation of the receiver takes every message as it comes,
    logging each (seq) with one write(2) per batch, so what its application
    took survives its SIGKILL; a second incarnation, started beforehand
    and waiting, binds the same port right after the kill and logs the same
    way. The sender pushes throughout. From what was pushed (P), what each
    incarnation took (A1, A2) and what the sender's DeliveryFailures named
    (D), :func:`classify_restart` counts the cases, and:

    - detection: the time from the second incarnation starting to open its
      endpoint (it listens from then on; its reader may answer before the
      constructor returns) to the sender's first failure report is at most :data:`DETECT_PTOS` times the
      sender's base PTO then (``stats().pto``: srtt + max(4 rttvar, 1 ms) +
      max_ack_delay; no STATUS arrives between the kill and the report, so
      it is the PTO of the moment of the kill too);
    - exactly the messages in doubt: D names no message twice, none that
      was not pushed, none the second incarnation took; every message of P
      that neither incarnation took is named, except the ones the first
      incarnation's endpoint had acknowledged but its application had not
      yet taken at the kill (delivery is to the endpoint): those must be
      the ones right after the last it took, and at most its
      ``max_buffered_bytes`` of them. A named message the first
      incarnation did take (delivered, its acknowledgement lost in the
      kill) is allowed only at the end of what it took. A run where nothing
      was in doubt is inconclusive;
    - no duplicate: no message is taken twice over both incarnations (the
      pipeline's duplicates, both incarnations' deliveries in one stream),
      none by both, and the second incarnation took some.

Ratios under loss (throughput, p50), and the reliable modes' round trip
    The round trip without loss is the median run's p50 of a reliable mode
    over best-effort's (best-effort runs in every lossless repeat for it).
    Each is judged, as the lab's other comparisons are
    (:mod:`cmq.pipeline.stats`), on per-run values: each run's msgs/s (its
    first deliveries over the span from the first one's send to the last
    one's receipt) or its median round trip, at the loss and lossless, runs
    interleaved in the same namespaces. The ratio of the two sides' medians
    over runs has a bootstrap interval resampling runs; the cell passes only
    when the whole interval meets the target, fails only when the whole
    interval misses it, and is inconclusive otherwise or with fewer than
    :data:`cmq.pipeline.stats.MIN_RUNS` runs a side. (Until 2026-11-24 these
    two rules compared one pooled figure a side with no interval, which
    runs of a fraction of a second on a shared 2-core machine flipped
    between pass and fail; the targets themselves are unchanged.)

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
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from cmq.pipeline.report import Claim, ReportData, Row, Status, Verdict
from cmq.pipeline.stats import Interval, decide, decide_within, ratio_interval

__all__ = [
    "CLAIMS",
    "DETECT_PTOS",
    "EXPERIMENT_ID",
    "HELD_BACK_TOLERANCE",
    "LATENCY_LOSS",
    "LOSSES",
    "MIN_DELIVERY_MESSAGES",
    "MIN_LOOPBACK_RUNS",
    "MIN_P50_ROUND_TRIPS",
    "MIN_P99_ROUND_TRIPS",
    "MIN_TP_MESSAGES",
    "MIN_TP_RUNS",
    "MIN_WINDOW_SAMPLES",
    "MODES",
    "P50_TOLERANCE",
    "P99_BOUND_NS",
    "RELIABLE_MODES",
    "RSS_GROWTH_BOUND",
    "RT_COST_LIMIT",
    "SLOW_SHARE",
    "THROUGHPUT_TARGETS",
    "Cell",
    "cell",
    "classify_restart",
    "combine",
    "judge_delivery",
    "judge_detection",
    "judge_held_back",
    "judge_memory",
    "judge_named",
    "judge_no_duplicate",
    "judge_p50",
    "judge_p99",
    "judge_round_trip_cost",
    "judge_slow_delivery",
    "judge_slow_drops",
    "judge_throughput",
    "loss_label",
    "modes_missing",
    "quantile_bounds",
    "rate",
    "repeats",
    "scalar",
    "series",
    "summary_row",
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
#: Without loss, a reliable mode's 512 B round trip (its median run's p50)
#: at most this multiple of best-effort's.
RT_COST_LIMIT: Final = 1.1
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

#: The slow receiver consumes this share of the sender's unthrottled rate.
SLOW_SHARE: Final = 0.10
#: The sender's push rate within this share of the slow receiver's
#: consumption rate, either way, over the second half of the paced phase.
HELD_BACK_TOLERANCE: Final = 0.20
#: RSS in the paced phase's last third at most this many bytes above its first third's (10 MiB).
RSS_GROWTH_BOUND: Final = 10 * 2**20
#: Fewest runs behind each loopback claim.
MIN_LOOPBACK_RUNS: Final = 3
#: Fewest samples in a window of a paced phase (a half, a third) to judge it.
MIN_WINDOW_SAMPLES: Final = 5
#: A restart is detected within this many base PTOs of the new incarnation listening.
DETECT_PTOS: Final = 3.0

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


def _delivery_cell(row: Row | None, loss: float, in_order: bool, head: str = "") -> Cell:
    at = head or loss_label(loss)
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


def per_run(data: ReportData, scenario: str, mode: str, loss: float, column: str) -> list[float]:
    """cmq's per-run values of ``column`` (positive ones) in the cell (scenario, mode, loss)."""
    out = []
    for r in data.run_stat_rows(EXPERIMENT_ID, scenario=scenario, system="cmq"):
        p = r["p"]
        if str(p.get("delivery", "")) == mode and _same(p.get("loss"), loss):
            v = r.get(column)
            if v is not None and v > 0:
                out.append(float(v))
    return out


def under_loss(
    data: ReportData, scenario: str, mode: str, loss: float, column: str
) -> tuple[Interval, float, float] | None:
    """cmq's per-run ``column`` at ``loss`` over lossless in (scenario, mode):
    the interval of the ratio of medians, and each side's median run; None
    when a side has no runs."""
    at_loss = per_run(data, scenario, mode, loss, column)
    lossless = per_run(data, scenario, mode, 0.0, column)
    if not at_loss or not lossless:
        return None
    return ratio_interval(at_loss, lossless), statistics.median(at_loss), statistics.median(lossless)


def _throughput_cell(data: ReportData, mode: str, loss: float, share: float) -> Cell:
    base = cell(data, "throughput", mode, 0.0)
    lossy = cell(data, "throughput", mode, loss)
    head = f"{mode} {loss_label(loss)}"
    for name, row in (("lossless", base), (loss_label(loss), lossy)):
        why = _enough_tp(row)
        if why is not None:
            return "inconclusive", f"{head}: {name} {why}"
    ratio = under_loss(data, "throughput", mode, loss, "msgs_per_s")
    if ratio is None:
        return "inconclusive", f"{head}: no per-run rates"
    iv, at_loss, lossless = ratio
    text = (
        f"{head}: median run {at_loss:,.0f} msgs/s = "
        f"{100 * iv.point:.0f}% of lossless {lossless:,.0f} "
        f"(95% interval {100 * iv.lo:.0f}-{100 * iv.hi:.0f}%, {iv.runs_a} and {iv.runs_b} runs; "
        f"target >= {100 * share:.0f}%)"
    )
    return decide(iv, share, "at_least"), text


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
        return "inconclusive", f"{head}: the lossless runs lost half their round trips"
    if math.isinf(l_lo):
        return "fail", f"{head}: more than half the round trips at {loss_label(LATENCY_LOSS)} were lost"
    ratio = under_loss(data, "pingpong", mode, LATENCY_LOSS, "p50_ns")
    if ratio is None:
        return "inconclusive", f"{head}: no per-run medians"
    iv, at_loss, lossless = ratio
    # Lost round trips (infinitely slow) widen it as they bracket each side's p50.
    wide = Interval(point=iv.point, lo=iv.lo * b_lo / b_hi, hi=iv.hi * l_hi / l_lo,
                    runs_a=iv.runs_a, runs_b=iv.runs_b)  # fmt: skip
    text = (
        f"{head}: median run's p50 {at_loss / 1e6:.3f} ms at "
        f"{loss_label(LATENCY_LOSS)} against {lossless / 1e6:.3f} ms lossless "
        f"({_ratio(iv.point, iv.point)}; 95% interval {_ratio(wide.lo, wide.hi)}, "
        f"{iv.runs_a} and {iv.runs_b} runs"
        + (f", {lossy['lost'] + base['lost']} round trips lost" if wide != iv else "")
        + ")"
    )
    return decide_within(wide, 1 - P50_TOLERANCE, 1 + P50_TOLERANCE), text


def _ratio(lo: float, hi: float) -> str:
    def one(v: float) -> str:
        return "inf" if math.isinf(v) else f"{100 * (v - 1):+.1f}%"

    return one(lo) if lo == hi else f"{one(lo)} to {one(hi)}"


def judge_p50(data: ReportData) -> Verdict:
    """p50 at :data:`LATENCY_LOSS` within :data:`P50_TOLERANCE` of the
    lossless p50, for reliable and unordered."""
    return _with_missing(data, combine([_p50_cell(data, m) for m in RELIABLE_MODES], "p50"))


def _cost_cell(data: ReportData, mode: str) -> Cell:
    mine = per_run(data, "pingpong", mode, 0.0, "p50_ns")
    base = per_run(data, "pingpong", "best-effort", 0.0, "p50_ns")
    if not mine or not base:
        return "inconclusive", f"{mode}: {'best-effort' if mine else mode} not measured without loss"
    iv = ratio_interval(mine, base)
    text = (
        f"{mode}: median run's p50 {statistics.median(mine) / 1e3:.1f} µs against best-effort's "
        f"{statistics.median(base) / 1e3:.1f} µs ({iv.point:.2f}x; 95% interval "
        f"{iv.lo:.2f}-{iv.hi:.2f}x, {iv.runs_a} and {iv.runs_b} runs)"
    )
    return decide(iv, RT_COST_LIMIT, "at_most"), text


def judge_round_trip_cost(data: ReportData) -> Verdict:
    """Without loss, the reliable modes' 512 B round trip at most
    :data:`RT_COST_LIMIT` times best-effort's (the median runs' p50s)."""
    return _with_missing(data, combine([_cost_cell(data, m) for m in RELIABLE_MODES], "round trip"))


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


# -- the loopback scenarios ------------------------------------------------------


def repeats(data: ReportData, scenario: str) -> list[int]:
    """The runs (``repeat`` params) of a loopback scenario that left any row."""
    found = {
        r["p"].get("repeat")
        for r in (*data.rows(EXPERIMENT_ID, scenario=scenario, system="cmq"),
                  *data.sample_rows(EXPERIMENT_ID, scenario=scenario, system="cmq"))
    }  # fmt: skip
    return sorted(k for k in found if isinstance(k, int) and not isinstance(k, bool))


def summary_row(data: ReportData, scenario: str, repeat: int) -> Row | None:
    """The pipeline's summary row of one run of a loopback scenario."""
    for r in data.rows(EXPERIMENT_ID, scenario=scenario, system="cmq"):
        if r["p"].get("repeat") == repeat:
            return r
    return None


def series(data: ReportData, scenario: str, repeat: int, metric: str) -> list[tuple[float, float]]:
    """``(x, value)`` of a run's timed metric, by ``x`` (seconds since the sender's first push)."""
    rows = data.sample_rows(EXPERIMENT_ID, scenario=scenario, system="cmq", metric=metric)
    return sorted(
        (float(r["x"]), float(r["mean"]))
        for r in rows
        if r["p"].get("repeat") == repeat and r["x"] is not None
    )


def scalar(data: ReportData, scenario: str, repeat: int, metric: str) -> float | None:
    """A run's metric without ``x``, if measured."""
    for r in data.sample_rows(EXPERIMENT_ID, scenario=scenario, system="cmq", metric=metric):
        if r["p"].get("repeat") == repeat and r["x"] is None:
            return float(r["mean"])
    return None


def _window(
    points: Sequence[tuple[float, float]], lo: float, hi: float
) -> list[tuple[float, float]]:
    return [(x, v) for x, v in points if lo <= x <= hi]


def rate(points: Sequence[tuple[float, float]]) -> float | None:
    """Growth per second of a cumulative count from its first to its last point."""
    if len(points) < 2 or points[-1][0] <= points[0][0]:
        return None
    return (points[-1][1] - points[0][1]) / (points[-1][0] - points[0][0])


def _runs_cells(data: ReportData, scenario: str, judge: Any) -> list[Cell]:
    """One cell per run, and an inconclusive one when there are too few runs."""
    ks = repeats(data, scenario)
    cells: list[Cell] = [judge(data, k) for k in ks]
    if len(ks) < MIN_LOOPBACK_RUNS:
        cells.append(("inconclusive", f"{len(ks)} runs (needs {MIN_LOOPBACK_RUNS})"))
    return cells


def _paced(data: ReportData, k: int) -> tuple[float, float] | None:
    lo = scalar(data, "slow", k, "pace_from_s")
    hi = scalar(data, "slow", k, "pace_until_s")
    return None if lo is None or hi is None or hi <= lo else (lo, hi)


def _drops_cell(data: ReportData, k: int) -> Cell:
    points = series(data, "slow", k, "receiver_kernel_drops")
    if len(points) < 2:
        return "inconclusive", f"run {k}: no kernel drop counter"
    grew = points[-1][1] - points[0][1]
    return ("pass" if grew == 0 else "fail"), f"run {k}: {grew:.0f} kernel drops"


def judge_slow_drops(data: ReportData) -> Verdict:
    """The slow receiver's socket dropped nothing, in every run."""
    return _with_missing(data, combine(_runs_cells(data, "slow", _drops_cell), "the slow receiver"))


def _held_back_cell(data: ReportData, k: int) -> Cell:
    paced = _paced(data, k)
    if paced is None:
        return "inconclusive", f"run {k}: no paced phase"
    lo, hi = paced
    mid = (lo + hi) / 2
    pushed = _window(series(data, "slow", k, "sender_pushed"), mid, hi)
    taken = _window(series(data, "slow", k, "receiver_taken"), mid, hi)
    if min(len(pushed), len(taken)) < MIN_WINDOW_SAMPLES:
        return "inconclusive", (
            f"run {k}: {len(pushed)} and {len(taken)} samples in the second half "
            f"(needs {MIN_WINDOW_SAMPLES})"
        )
    push, take = rate(pushed), rate(taken)
    if push is None or not take:
        return "inconclusive", f"run {k}: the receiver took nothing in the second half"
    calib = scalar(data, "slow", k, "calib_rate")
    ratio = push / take
    text = (
        f"run {k}: pushes {push:,.0f}/s against {take:,.0f}/s taken "
        f"({100 * (ratio - 1):+.1f}%)" + (f"; unthrottled {calib:,.0f}/s" if calib else "")
    )
    return ("pass" if abs(ratio - 1) <= HELD_BACK_TOLERANCE else "fail"), text


def judge_held_back(data: ReportData) -> Verdict:
    """The sender's push rate follows the slow receiver's consumption (see the module doc)."""
    return _with_missing(
        data, combine(_runs_cells(data, "slow", _held_back_cell), "the slow receiver")
    )


def _rss_growth(points: Sequence[tuple[float, float]], lo: float, hi: float) -> float | str:
    third = (hi - lo) / 3
    first = _window(points, lo, lo + third)
    last = _window(points, hi - third, hi)
    if min(len(first), len(last)) < MIN_WINDOW_SAMPLES:
        return f"{len(first)} and {len(last)} samples in the thirds (needs {MIN_WINDOW_SAMPLES})"
    return max(v for _, v in last) - max(v for _, v in first)


def _memory_cell(data: ReportData, k: int) -> Cell:
    paced = _paced(data, k)
    if paced is None:
        return "inconclusive", f"run {k}: no paced phase"
    parts: list[str] = []
    status: Status = "pass"
    for who in ("sender", "receiver"):
        growth = _rss_growth(series(data, "slow", k, f"{who}_rss"), *paced)
        if isinstance(growth, str):
            return "inconclusive", f"run {k}: {who} {growth}"
        parts.append(f"{who} {growth / 2**20:+.1f} MiB")
        if growth > RSS_GROWTH_BOUND:
            status = "fail"
    return status, f"run {k}: " + ", ".join(parts)


def judge_memory(data: ReportData) -> Verdict:
    """Both ends' RSS flat over the paced phase (see the module doc)."""
    return _with_missing(
        data, combine(_runs_cells(data, "slow", _memory_cell), "the slow receiver")
    )


def _slow_delivery_cell(data: ReportData, k: int) -> Cell:
    return _delivery_cell(summary_row(data, "slow", k), 0.0, True, f"run {k}")


def judge_slow_delivery(data: ReportData) -> Verdict:
    """Every message to the slow receiver taken once, in order, in every run."""
    return _with_missing(
        data, combine(_runs_cells(data, "slow", _slow_delivery_cell), "the slow receiver")
    )


def classify_restart(
    pushed: Iterable[int],
    taken1: Iterable[int],
    taken2: Iterable[int],
    named: Sequence[int],
    bound: int,
) -> dict[str, int]:
    """The counts the restart rules turn on (see the module doc), from what
    was pushed, what each incarnation took, what the failures named (in
    order, with repeats) and how many messages the first incarnation's
    budget holds (``bound``)."""
    p, a1, a2 = set(pushed), set(taken1), set(taken2)
    d = set(named)
    last = max(a1, default=-1)
    unaccounted = p - a1 - a2 - d
    named_first = d & a1
    return {
        "pushed": len(p),
        "taken_first": len(a1),
        "taken_second": len(a2),
        "named": len(d),
        "named_twice": len(named) - len(d),
        "named_unpushed": len(d - p),
        "named_taken_first": len(named_first),
        "named_taken_first_in_place": int(
            named_first == set(sorted(a1)[len(a1) - len(named_first) :])
        ),
        "named_taken_second": len(d & a2),
        "taken_both": len(a1 & a2),
        "unaccounted": len(unaccounted),
        "unaccounted_in_place": int(
            unaccounted == set(range(last + 1, last + 1 + len(unaccounted)))
        ),
        "unaccounted_bound": bound,
    }


def _detect_cell(data: ReportData, k: int) -> Cell:
    detected = scalar(data, "restart", k, "detected")
    if detected is None:
        return "inconclusive", f"run {k}: not measured"
    if not detected:
        return "fail", f"run {k}: the sender never reported the restart"
    ready = scalar(data, "restart", k, "detect_from_ready_s")
    kill = scalar(data, "restart", k, "detect_from_kill_s")
    pto = scalar(data, "restart", k, "pto_s")
    if ready is None or kill is None or not pto:
        return "inconclusive", f"run {k}: no detection time or PTO"
    text = (
        f"run {k}: {ready * 1e3:.1f} ms after the restart = {ready / pto:.1f} PTO "
        f"(PTO {pto * 1e3:.1f} ms; {kill * 1e3:.1f} ms after the kill)"
    )
    if ready < 0:
        return "inconclusive", text + ": reported before the restart"
    return ("pass" if ready <= DETECT_PTOS * pto else "fail"), text


def judge_detection(data: ReportData) -> Verdict:
    """Every restart reported within :data:`DETECT_PTOS` base PTOs."""
    return _with_missing(data, combine(_runs_cells(data, "restart", _detect_cell), "the restart"))


_CLASSES: Final = ("named", "named_twice", "named_unpushed", "named_taken_first",
                   "named_taken_first_in_place", "named_taken_second", "unaccounted",
                   "unaccounted_in_place", "unaccounted_bound")  # fmt: skip


def _named_cell(data: ReportData, k: int) -> Cell:
    c = {name: scalar(data, "restart", k, name) for name in _CLASSES}
    if any(v is None for v in c.values()):
        return "inconclusive", f"run {k}: not measured"
    n = {name: int(v or 0) for name, v in c.items()}
    text = (
        f"run {k}: {n['named']:,} named, {n['named_taken_first']} of them taken by the first "
        f"incarnation, {n['unaccounted']} unnamed and not taken (bound {n['unaccounted_bound']})"
    )
    wrong = [
        what
        for what, bad in (
            (f"{n['named_twice']} named twice", n["named_twice"]),
            (f"{n['named_unpushed']} named but never pushed", n["named_unpushed"]),
            (f"{n['named_taken_second']} named and taken by the second", n["named_taken_second"]),
            ("named ones taken not at the end of what it took",
             n["named_taken_first"] and not n["named_taken_first_in_place"]),
            ("unnamed ones not right after what it took",
             n["unaccounted"] and not n["unaccounted_in_place"]),
            ("more unnamed than its budget holds", n["unaccounted"] > n["unaccounted_bound"]),
        )
        if bad
    ]  # fmt: skip
    if wrong:
        return "fail", text + ": " + ", ".join(wrong)
    if not n["named"]:
        return "inconclusive", text + ": nothing was in doubt"
    return "pass", text


def judge_named(data: ReportData) -> Verdict:
    """The failures name exactly the messages in doubt (see the module doc)."""
    return _with_missing(data, combine(_runs_cells(data, "restart", _named_cell), "the restart"))


def _no_dup_cell(data: ReportData, k: int) -> Cell:
    row = summary_row(data, "restart", k)
    both = scalar(data, "restart", k, "taken_both")
    again = scalar(data, "restart", k, "named_taken_second")
    second = scalar(data, "restart", k, "taken_second")
    if row is None or both is None or again is None or second is None:
        return "inconclusive", f"run {k}: not measured"
    text = (
        f"run {k}: {row['duplicates']} duplicates, {both:.0f} taken by both incarnations, "
        f"{again:.0f} named and taken again, {second:,.0f} taken by the second"
    )
    if row["duplicates"] or both or again:
        return "fail", text
    if not second:
        return "inconclusive", text + ": the second incarnation took nothing"
    return "pass", text


def judge_no_duplicate(data: ReportData) -> Verdict:
    """Nothing the first incarnation took reaches the second (see the module doc)."""
    return _with_missing(data, combine(_runs_cells(data, "restart", _no_dup_cell), "the restart"))


def _pct_list(values: Iterable[float]) -> str:
    return ", ".join(loss_label(v) for v in values)


CLAIMS: Final = (
    Claim(
        target=True,
        text=f"Reliable mode delivers 100 % of the messages, none twice, in order, at every "
        f"loss ({_pct_list(LOSSES)}; at least {MIN_DELIVERY_MESSAGES:,} messages each).",
        judge=lambda data: judge_delivery(data, "reliable", in_order=True),
    ),
    Claim(
        target=True,
        text="Unordered mode delivers 100 % of the messages, none twice, at every loss "
        f"({_pct_list(LOSSES)}).",
        judge=lambda data: judge_delivery(data, "unordered", in_order=False),
    ),
    Claim(
        target=True,
        text="Throughput under loss (reliable and unordered, 512 B): at 1 % at least 90 % of "
        f"the lossless run's, at 3 % at least 80 % (each cell: {MIN_TP_RUNS}+ runs, "
        f"{MIN_TP_MESSAGES:,}+ messages; the median run's msgs/s, with a 95 % bootstrap "
        "interval over runs clear of the target to pass or fail).",
        judge=judge_throughput,
    ),
    Claim(
        target=True,
        text="512 B ping-pong at 1.4 % loss: p50 within ±10 % of the lossless p50 "
        f"(reliable and unordered; {MIN_P50_ROUND_TRIPS}+ round trips each side; the median "
        "run's p50, with a 95 % bootstrap interval over runs inside or outside the band "
        "to pass or fail).",
        judge=judge_p50,
    ),
    Claim(
        target=True,
        text=f"512 B ping-pong without loss: the reliable modes' p50 at most {RT_COST_LIMIT:g}x "
        "best-effort's (reliable and unordered, in the same namespaces, runs interleaved; the "
        "median run's p50 over best-effort's, with a 95 % bootstrap interval over runs at or "
        "below the limit to pass, above it to fail).",
        judge=judge_round_trip_cost,
    ),
    Claim(
        target=True,
        text="512 B ping-pong at 1.4 % loss: p99 at most 10 ms unordered and 15 ms reliable "
        f"({MIN_P99_ROUND_TRIPS:,}+ round trips; a lost round trip counts as infinitely slow).",
        judge=judge_p99,
    ),
    Claim(
        target=True,
        text="A receiver taking a tenth of the sender's unthrottled rate (loopback, reliable, "
        "on_full='block'): its kernel drops nothing.",
        judge=judge_slow_drops,
    ),
    Claim(
        target=True,
        text="That sender is held back: over the second half of the paced phase its push rate "
        f"is within ±{100 * HELD_BACK_TOLERANCE:.0f} % of the receiver's consumption.",
        judge=judge_held_back,
    ),
    Claim(
        target=True,
        text="Both ends' memory stays flat meanwhile: RSS in the paced phase's last third at "
        f"most {RSS_GROWTH_BOUND / 2**20:.0f} MiB above its first third's maximum.",
        judge=judge_memory,
    ),
    Claim(
        target=True,
        text="The slow receiver takes every message once, in order.",
        judge=judge_slow_delivery,
    ),
    Claim(
        target=True,
        text="A receiver killed (SIGKILL) mid-stream and restarted on its port is detected "
        f"within {DETECT_PTOS:g} probe timeouts (the sender's base PTO) of the restart.",
        judge=judge_detection,
    ),
    Claim(
        target=True,
        text="The sender names exactly the messages in doubt: every message neither "
        "incarnation took, except the first one's acknowledged-but-unread tail (at most its "
        "max_buffered_bytes), none twice, none the new incarnation took.",
        judge=judge_named,
    ),
    Claim(
        target=True,
        text="No message the first incarnation took is delivered again to the second, and "
        "none twice at all.",
        judge=judge_no_duplicate,
    ),
)
"""The delivery targets, in the report's order."""
