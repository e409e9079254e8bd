"""The lab's report: one self-contained HTML page, drawn from the experiments it is handed.

Theory of operation
-------------------
1. :func:`collect` runs the Spark jobs of :mod:`cmq.pipeline.jobs` over an
   output directory and collects their (small) results into a
   :class:`ReportData`: plain Python rows, so that everything after this
   point is ordinary, Spark-free code that tests can feed by hand.
2. Each experiment the page shows is an :class:`Experiment`: a title, the
   paper, its :class:`Claim` objects (the paper's words, the rule, and a
   ``judge`` that turns the data into our result and a verdict: pass, fail,
   inconclusive or context) and a ``render`` function that draws its
   figures and tables as a :class:`Section`. This module knows none of
   them: the lab's registry (``cmq.lab.experiments.pages()``) hands the
   list to :func:`render_html` and :func:`build_report`. An experiment with
   records but no page still gets a generic section.
3. :func:`render_html` lays the sections out in one page: inline CSS, figures
   as inline SVG, no scripts and no external references, so the file can be
   mailed, archived or opened offline.

:func:`build_report` does all three for ``cmq report DIR`` and ``cmq lab``.
"""

from __future__ import annotations

import html
import io
import json
import math
import os
import platform
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

from cmq._errors import ConfigError

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from pyspark.sql import SparkSession

__all__ = [
    "Claim",
    "Experiment",
    "ReportData",
    "Section",
    "Status",
    "Table",
    "Verdict",
    "build_report",
    "collect",
    "generic_section",
    "indicative",
    "latency_figure",
    "latency_table",
    "render_html",
    "svg",
]

#: A verdict: ``context`` is for a claim that cannot be measured here
#: (another system's figure, an analytic result, a value true by
#: construction): shown beside the paper's words, never judged.
Status = Literal["pass", "fail", "inconclusive", "context"]
Row = dict[str, Any]



# -- data ------------------------------------------------------------------


@dataclass(frozen=True)
class ReportData:
    """The collected results the report is drawn from.

    ``summary`` rows are :func:`cmq.pipeline.jobs.summary` rows with one
    extra key, ``p``: the parsed ``params``. ``samples`` are
    :func:`~cmq.pipeline.jobs.sample_stats` rows (plus ``p``), ``series``
    the timed samples (``metric``, ``run_id``, ``t_s``, ``value``, ...), and
    ``runs`` the run metadata rows (``versions`` parsed into a dict).
    """

    summary: Sequence[Row] = ()
    samples: Sequence[Row] = ()
    series: Sequence[Row] = ()
    runs: Sequence[Row] = ()
    per_run: Sequence[Row] = ()
    """:func:`cmq.pipeline.jobs.run_stats` rows (plus ``p``): the summary's
    latency columns per run, for intervals over runs (:mod:`cmq.pipeline.stats`)."""
    pipeline: Mapping[str, str] = field(default_factory=dict)
    """What built the report (Spark version, master): shown under Environment."""

    def rows(self, experiment: str, **match: Any) -> list[Row]:
        """Summary rows of one experiment whose columns equal ``match``."""
        return _match(self.summary, experiment, match)

    def run_stat_rows(self, experiment: str, **match: Any) -> list[Row]:
        """Per-run latency rows of one experiment whose columns equal ``match``."""
        return _match(self.per_run, experiment, match)

    def sample_rows(self, experiment: str, **match: Any) -> list[Row]:
        """Sample-stats rows of one experiment whose columns equal ``match``."""
        return _match(self.samples, experiment, match)

    def series_rows(self, experiment: str, **match: Any) -> list[Row]:
        """Timed samples of one experiment whose columns equal ``match``."""
        return _match(self.series, experiment, match)

    def run_rows(self, experiment: str | None = None, **match: Any) -> list[Row]:
        """Run metadata rows (of one experiment, if given)."""
        runs = (
            self.runs
            if experiment is None
            else [r for r in self.runs if r["experiment"] == experiment]
        )
        return [r for r in runs if all(r.get(k) == v for k, v in match.items())]

    def experiment_ids(self) -> list[str]:
        """Experiments that have any rows or runs, sorted."""
        ids = {r["experiment"] for r in (*self.summary, *self.samples, *self.series, *self.runs)}
        return sorted(ids)


def _match(rows: Iterable[Row], experiment: str, match: Mapping[str, Any]) -> list[Row]:
    return [
        r
        for r in rows
        if r["experiment"] == experiment and all(r.get(k) == v for k, v in match.items())
    ]


def _parse(params: str | None) -> dict[str, Any]:
    try:
        value = json.loads(params or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def collect(spark: SparkSession, out: str | os.PathLike[str]) -> ReportData:
    """Run the pipeline's jobs on ``out`` and collect their results."""
    import pyspark
    from pyspark.sql import functions as F

    from cmq.pipeline.jobs import flag_deliveries, load_tables, run_stats, sample_stats, summary

    tables = load_tables(spark, out)
    # The summary and the per-run statistics both need every stream sorted
    # and flagged (the costly part): do it once, cached for both.
    flagged = flag_deliveries(tables.records).persist()
    summary_rows = [_with_params(r.asDict()) for r in summary(flagged, tables.totals).collect()]
    per_run_rows = [_with_params(r.asDict()) for r in run_stats(flagged).collect()]
    flagged.unpersist()
    sample_rows = [_with_params(r.asDict()) for r in sample_stats(tables.samples).collect()]
    timed = tables.samples.where(F.col("t_ns").isNotNull())
    start = F.min("t_ns").over(_run_window())
    series_rows = [
        _with_params(r.asDict())
        for r in timed.select(
            "experiment",
            "scenario",
            "system",
            "params",
            "run_id",
            "metric",
            ((F.col("t_ns") - start) / 1e9).alias("t_s"),
            "value",
        )
        .orderBy("run_id", "metric", "t_s")
        .collect()
    ]
    runs = []
    for r in tables.runs.orderBy("started_at").collect():
        row = r.asDict()
        row["versions"] = _parse(row.get("versions"))
        row["p"] = _parse(row.get("params"))
        runs.append(row)
    return ReportData(
        summary=summary_rows,
        samples=sample_rows,
        series=series_rows,
        runs=runs,
        per_run=per_run_rows,
        pipeline={
            "pyspark": pyspark.__version__,
            "spark master": str(spark.sparkContext.master),
            "spark parallelism": str(spark.sparkContext.defaultParallelism),
        },
    )


def _run_window() -> Any:
    from pyspark.sql import Window

    return Window.partitionBy("run_id", "metric")


def _with_params(row: Row) -> Row:
    row["p"] = _parse(row.get("params"))
    return row


# -- experiments -------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """Our result for one claim, in words, and whether it holds."""

    status: Status
    result: str


@dataclass(frozen=True, kw_only=True)
class Claim:
    """One claim of a paper and how to judge it from the data.

    ``judge`` must not raise on missing data: it returns an
    ``"inconclusive"`` verdict saying what is missing.
    """

    text: str
    """The paper's claim (its numbers; say so where it is a paraphrase)."""
    judge: Callable[[ReportData], Verdict]
    """Turns the collected data into our result and a verdict."""
    rule: str = ""
    """How ``judge`` decides, in one sentence, shown under the claim: fixed
    before anything is measured, about the statistic the paper meant."""
    target: bool = False
    """A target cmq set itself, not a paper's claim: shown apart, under
    "cmq's targets"."""


@dataclass(frozen=True, kw_only=True)
class Table:
    """A table of a section: caption, column names and rows of cell values."""

    caption: str
    columns: Sequence[str]
    rows: Sequence[Sequence[Any]]


@dataclass(frozen=True, kw_only=True)
class Section:
    """What an experiment shows: SVG figures (see :func:`svg`), tables, notes."""

    figures: Sequence[str] = ()
    tables: Sequence[Table] = ()
    notes: Sequence[str] = ()


def _generic_render(data: ReportData, experiment: str) -> Section:
    return generic_section(data, experiment)


@dataclass(frozen=True, kw_only=True)
class Experiment:
    """One experiment of the report.

    Raises:
        ConfigError: on construction, for an id that is empty or not made of
            lower-case letters, digits and dashes, or an empty title.
    """

    id: str
    """Id used in the records' ``experiment`` column, e.g. ``"cmq-fig5"``."""
    title: str
    """Section heading."""
    paper: str = ""
    """The paper and the figure or table reproduced."""
    claims: Sequence[Claim] = ()
    """The paper's claims, each judged against our data."""
    render: Callable[[ReportData, str], Section] = _generic_render
    """Draws the section's figures and tables from the data."""
    order: int = 100
    """Sections are sorted by (order, id)."""

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", self.id):
            raise ConfigError(
                f"experiment id {self.id!r} must be lower-case letters, digits, dashes"
            )
        if not self.title:
            raise ConfigError(f"experiment {self.id!r} needs a title")


# -- figures and tables ----------------------------------------------------

_SVG_START = re.compile(r"<svg\b")
_METADATA = re.compile(r"<metadata>.*?</metadata>\s*", re.S)


def svg(fig: Figure) -> str:
    """Render a matplotlib figure as inline SVG markup (no XML prolog, no
    metadata block: the metadata names external RDF vocabularies)."""
    buf = io.StringIO()
    # No bbox_inches="tight": the figures use constrained layout, which keeps
    # every label inside the figure already, and the tight box drew each
    # figure twice (a third of the page's rendering time).
    fig.savefig(buf, format="svg", metadata={"Date": None})
    text = buf.getvalue()
    match = _SVG_START.search(text)
    if match is None:  # pragma: no cover - matplotlib always writes <svg
        raise ConfigError("matplotlib produced no <svg> element")
    return _METADATA.sub("", text[match.start() :])


def new_figure(ncols: int = 1, *, height: float = 3.6) -> tuple[Figure, list[Axes]]:
    """A matplotlib figure with ``ncols`` side-by-side axes (no pyplot state)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4.8 * ncols + 0.6, height), layout="constrained")
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    return fig, list(axes)


def _err_below(mean: float, sd: float) -> float:
    # On a log axis an error bar may not reach zero or below.
    return min(sd, mean * 0.95)


def size_axis(ax: Axes, label: str = "message size (bytes)") -> None:
    """Log-2 x axis of message sizes with plain-number tick labels."""
    from matplotlib.ticker import FuncFormatter

    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: _size_label(v)))
    ax.set_xlabel(label)
    ax.grid(True, which="major", alpha=0.3)


def _size_label(v: float) -> str:
    if v >= 1024 and v % 1024 == 0:
        return f"{int(v // 1024)}K"
    return f"{v:g}"


def latency_figure(
    rows: Sequence[Row], *, title: str = "", scenarios: Sequence[str] | None = None
) -> str:
    """Mean latency (µs, log) against size (log), one panel per scenario,
    one line per system, stddev as error bars."""
    scenarios = list(scenarios or sorted({r["scenario"] for r in rows if r["mean_ns"] is not None}))
    if not scenarios:
        return ""
    fig, axes = new_figure(len(scenarios))
    for ax, scenario in zip(axes, scenarios, strict=True):
        for system in sorted({r["system"] for r in rows}):
            pts = sorted(
                (r["size"], r["mean_ns"] / 1e3, (r["stddev_ns"] or 0.0) / 1e3)
                for r in rows
                if r["system"] == system and r["scenario"] == scenario and r["mean_ns"] is not None
            )
            if not pts:
                continue
            xs, ys, sds = zip(*pts, strict=True)
            low = [_err_below(y, s) for y, s in zip(ys, sds, strict=True)]
            ax.errorbar(xs, ys, yerr=[low, sds], marker="o", ms=3, capsize=2, label=system)
        size_axis(ax)
        ax.set_yscale("log")
        ax.set_ylabel("mean latency (µs), ±1 sd")
        kind = (
            "round trip"
            if any(r["round_trip"] for r in rows if r["scenario"] == scenario)
            else "one way"
        )
        ax.set_title(f"{title} {scenario} ({kind})".strip(), fontsize=10)
        ax.legend(fontsize=7)
    return svg(fig)


def rate_figure(
    rows: Sequence[Row],
    *,
    title: str = "",
    extra: Callable[[Axes, Axes], None] | None = None,
) -> str:
    """msgs/s and MB/s against size (log-log), one line per system.
    ``extra(ax_msgs, ax_mb)`` may add reference curves."""
    rows = [r for r in rows if r["msgs_per_s"] is not None]
    if not rows:
        return ""
    fig, (ax_m, ax_b) = new_figure(2)
    for system in sorted({r["system"] for r in rows}):
        pts = sorted(
            (r["size"], r["msgs_per_s"], r["mb_per_s"]) for r in rows if r["system"] == system
        )
        xs, ms, mbs = zip(*pts, strict=True)
        ax_m.plot(xs, ms, marker="o", ms=3, label=system)
        ax_b.plot(xs, mbs, marker="o", ms=3, label=system)
    if extra is not None:
        extra(ax_m, ax_b)
    for ax, label in ((ax_m, "messages per second"), (ax_b, "MB/s (10^6 B of payload)")):
        size_axis(ax)
        ax.set_yscale("log")
        ax.set_ylabel(label)
        ax.legend(fontsize=7)
    ax_m.set_title(f"{title} throughput".strip(), fontsize=10)
    return svg(fig)


def _us(ns: float | None) -> str:
    return "" if ns is None else f"{ns / 1e3:,.1f}"


def _num(value: float | None, digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return f"{value:,.{digits}f}"


def _pct(value: float | None) -> str:
    return "" if value is None else f"{100 * value:.2f}%"


def _params_label(p: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(p.items()))


def latency_table(rows: Sequence[Row], caption: str) -> Table:
    """The summary table of latency experiments (one row per group)."""
    ordered = sorted(rows, key=lambda r: (r["scenario"], r["system"], r["size"], r["params"]))
    return Table(
        caption=caption,
        columns=[
            "system", "scenario", "params", "size (B)", "messages", "lost", "loss",
            "mean µs", "sd µs", "p50 µs", "p99 µs", "dup", "ooo", "msgs/s",
        ],
        rows=[
            [
                r["system"], r["scenario"], _params_label(r["p"]), r["size"], r["messages"],
                r["lost"], _pct(r["loss_rate"]), _us(r["mean_ns"]), _us(r["stddev_ns"]),
                _us(r["p50_ns"]), _us(r["p99_ns"]), r["duplicates"], r["out_of_order"],
                _num(r["msgs_per_s"]),
            ]
            for r in ordered
        ],
    )  # fmt: skip


def rate_table(rows: Sequence[Row], caption: str) -> Table:
    """The summary table of throughput experiments."""
    ordered = sorted(rows, key=lambda r: (r["scenario"], r["system"], r["size"], r["params"]))
    return Table(
        caption=caption,
        columns=["system", "scenario", "params", "size (B)", "sent", "delivered", "loss", "msgs/s", "MB/s", "from"],
        rows=[
            [
                r["system"], r["scenario"], _params_label(r["p"]), r["size"], r["messages"],
                r["delivered"], _pct(r["loss_rate"]), _num(r["msgs_per_s"]), _num(r["mb_per_s"], 2),
                r["rate_source"],
            ]
            for r in ordered
        ],
    )  # fmt: skip


def generic_section(data: ReportData, experiment: str) -> Section:
    """Latency figure and table if the experiment has latencies, else a
    throughput figure and table; for experiments without their own renderer."""
    rows = data.rows(experiment)
    if any(r["mean_ns"] is not None for r in rows):
        return Section(
            figures=[f for f in [latency_figure(rows)] if f],
            tables=[latency_table(rows, f"{experiment}: latency per system and size")],
        )
    if rows:
        return Section(
            figures=[f for f in [rate_figure(rows)] if f],
            tables=[rate_table(rows, f"{experiment}: throughput per system and size")],
        )
    return Section(notes=["No per-message records or totals for this experiment."])


# -- HTML ------------------------------------------------------------------

_CSS: Final = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1d1d1f;
       max-width: 1180px; margin: 0 auto; padding: 16px 24px 64px; background: #fff; }
h1 { font-size: 26px; margin: 8px 0 4px; }
h2 { font-size: 20px; margin: 36px 0 8px; border-bottom: 2px solid #e3e3e8; padding-bottom: 4px; }
h3 { font-size: 15px; margin: 18px 0 6px; }
.meta { color: #666; }
table { border-collapse: collapse; margin: 8px 0 16px; font-size: 12.5px; }
caption { text-align: left; font-weight: 600; padding: 4px 0; }
th, td { border: 1px solid #d9d9de; padding: 3px 7px; text-align: right; vertical-align: top; }
th { background: #f4f4f7; }
td.l, th.l { text-align: left; }
.claims { display: grid; grid-template-columns: 1fr 1fr 110px; gap: 0; margin: 8px 0 12px; }
.claims > div { border-top: 1px solid #e3e3e8; padding: 8px 10px; }
.claims .head { font-weight: 600; background: #f4f4f7; border-top: none; }
.claims .rule { color: #555; font-size: 0.9em; margin-top: 4px; }
.badge { display: inline-block; padding: 1px 8px; border-radius: 10px; font-size: 12px; font-weight: 600; }
.pass { background: #d9f2df; color: #17612c; }
.fail { background: #fbdcdc; color: #8c1c1c; }
.inconclusive { background: #eeeeee; color: #555; }
.context { background: #e6eefa; color: #234; }
.indicative { background: #fff3d6; color: #6b4a00; font-weight: 500; }
.figure { margin: 8px 0; overflow-x: auto; }
.table { overflow-x: auto; max-width: 100%; }
.figure svg { max-width: 100%; height: auto; }
.note { color: #444; background: #fafafa; border-left: 3px solid #ccc; padding: 4px 10px; margin: 6px 0; }
.skipped { color: #8a5a00; }
nav a { margin-right: 12px; }
"""


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


_NUMERIC = re.compile(r"^[-+]?[\d,]*\.?\d+(?:e[-+]?\d+)?[%x]?$")


def _table_html(table: Table) -> str:
    def cell(tag: str, value: Any) -> str:
        numeric = isinstance(value, int | float) or bool(_NUMERIC.match(str(value)))
        cls = "" if numeric else ' class="l"'
        return f"<{tag}{cls}>{_e(value)}</{tag}>"

    head = "".join(f'<th class="l">{_e(c)}</th>' for c in table.columns)
    body = "".join("<tr>" + "".join(cell("td", v) for v in row) + "</tr>\n" for row in table.rows)
    # In a box of its own: a wide table scrolls there on a narrow screen
    # instead of running off the page.
    return (
        f'<div class="table"><table><caption>{_e(table.caption)}</caption>'
        f"<thead><tr>{head}</tr></thead><tbody>\n{body}</tbody></table></div>"
    )


_ID_ATTR = re.compile(r'\bid="([^"]+)"')


def _scope_ids(markup: str, prefix: str) -> str:
    # Every inline SVG shares the page's id space, and matplotlib reuses ids
    # (markers, clip paths) between figures: give each figure its own prefix.
    ids = set(_ID_ATTR.findall(markup))
    if not ids:
        return markup
    pattern = re.compile(
        r'(id="|#)(' + "|".join(re.escape(i) for i in sorted(ids, key=len, reverse=True)) + r")\b"
    )
    return pattern.sub(lambda m: f"{m.group(1)}{prefix}{m.group(2)}", markup)


def indicative(runs: tuple[int, int] | None) -> bool:
    """The rule that marks a verdict "indicative": the profile that made it
    measured fewer runs behind the claim's figures than the full profile
    does (``runs`` is (this profile's, the full profile's)). Decided by the
    profiles alone, before anything is measured; never by the result."""
    return runs is not None and runs[0] < runs[1]


def _badge(status: Status, marked: bool = False) -> str:
    badge = f'<span class="badge {status}">{status}</span>'
    if marked and status in ("pass", "fail", "inconclusive"):
        badge += ' <span class="badge indicative" title="fewer runs than the full profile">indicative</span>'
    return badge


def _runs_note(runs: tuple[int, int] | None, profile: str) -> str:
    if runs is None:
        return ""
    made = f"the {profile} profile" if profile else "this run"
    text = (f"Runs behind each judged figure: {runs[0]} in {made}, {runs[1]} in the full profile.")
    if indicative(runs):
        text += (" Fewer than the full profile's, so the verdicts are marked indicative: with these "
                 "few runs they can differ from the full profile's.")  # fmt: skip
    return f'<p class="note">{_e(text)}</p>'


def _judge(claim: Claim, data: ReportData) -> Verdict:
    # A judge that crashes must not take the whole report down: the page says so.
    try:
        return claim.judge(data)
    except Exception as exc:  # noqa: BLE001 - any bug in a judge becomes a visible verdict
        return Verdict(
            status="inconclusive", result=f"could not judge: {type(exc).__name__}: {exc}"
        )


def _skipped_html(runs: Sequence[Row]) -> str:
    bad = [r for r in runs if r["status"] != "ok"]
    if not bad:
        return ""
    items = "".join(
        f'<li class="skipped"><b>{_e(r["system"])}</b> {_e(r["status"])}: {_e(r["reason"])}</li>'
        for r in bad
    )
    return f"<h3>Systems skipped or failed</h3><ul>{items}</ul>"


def _environment_html(data: ReportData) -> str:
    runs = data.runs
    rows: list[list[Any]] = []

    def distinct(key: str) -> str:
        return ", ".join(sorted({str(r[key]) for r in runs})) or "(no runs)"

    rows.append(["hosts", distinct("host")])
    rows.append(["cores available to runs", distinct("cores")])
    rows.append(["CPU pinning", distinct("pin")])
    rows.append(["packet loss probabilities", distinct("loss")])
    if runs:
        first = min(r["started_at"] for r in runs)
        last = max((r["finished_at"] or r["started_at"]) for r in runs)
        rows.append(
            ["runs", f"{len(runs)} from {first:%Y-%m-%d %H:%M} to {last:%Y-%m-%d %H:%M} UTC"]
        )
    versions: dict[str, set[str]] = {}
    for r in runs:
        for name, version in r["versions"].items():
            versions.setdefault(name, set()).add(str(version))
    for name in sorted(versions):
        rows.append([f"version: {name}", ", ".join(sorted(versions[name]))])
    rows.append(["report built with python", platform.python_version()])
    for key, value in data.pipeline.items():
        rows.append([f"report built with {key}", value])
    return _table_html(Table(caption="Environment", columns=["what", "value"], rows=rows))


def _claims_grid(head: str, rows: list[tuple[Claim, Verdict]], marked: bool = False) -> str:
    parts = [f'<div class="claims"><div class="head">{_e(head)}</div>'
             '<div class="head">We measured</div><div class="head">Verdict</div>']  # fmt: skip
    for claim, verdict in rows:
        said = _e(claim.text) + (f'<div class="rule">Rule: {_e(claim.rule)}</div>' if claim.rule else "")
        parts.append(
            f"<div>{said}</div><div>{_e(verdict.result)}</div><div>{_badge(verdict.status, marked)}</div>"
        )
    parts.append("</div>")
    return "".join(parts)


def _section_html(
    exp: Experiment,
    data: ReportData,
    index: int,
    runs: tuple[int, int] | None = None,
    profile: str = "",
) -> tuple[str, list[tuple[str, Verdict, bool, bool]]]:
    judged = [(c, _judge(c, data)) for c in exp.claims]
    try:
        section = exp.render(data, exp.id)
    except Exception as exc:  # noqa: BLE001 - a renderer bug shows in its section only
        section = Section(notes=[f"could not render: {type(exc).__name__}: {exc}"])
    parts = [f'<section id="{_e(exp.id)}"><h2>{_e(exp.title)}</h2>']
    if exp.paper:
        parts.append(
            f'<p class="meta">{_e(exp.paper)} · experiment id <code>{_e(exp.id)}</code></p>'
        )
    papers = [(c, v) for c, v in judged if not c.target]
    targets = [(c, v) for c, v in judged if c.target]
    marked = indicative(runs)
    if papers:
        parts.append(_claims_grid("The paper says", papers, marked))
    if targets:
        parts.append(_claims_grid("cmq's target", targets, marked))
    if judged:
        parts.append(_runs_note(runs, profile))
    for k, figure in enumerate(section.figures):
        parts.append(f'<div class="figure">{_scope_ids(figure, f"f{index}-{k}-")}</div>')
    parts.extend(f'<p class="note">{_e(note)}</p>' for note in section.notes)
    parts.extend(_table_html(t) for t in section.tables)
    parts.append(_skipped_html(data.run_rows(exp.id)))
    parts.append("</section>")
    return "\n".join(parts), [(f"{exp.id}: {c.text}", v, c.target, marked) for c, v in judged]


def _pipeline_sentence(data: ReportData) -> str:
    """Which Spark jobs computed the page's numbers, and where (the page's first line)."""
    where = data.pipeline.get("spark master")
    version = data.pipeline.get("pyspark")
    spark = f"PySpark {version}" if version else "PySpark"
    return (
        f"Every table and verdict below was computed by {spark}"
        + (f" on master {where}" if where else "")
        + " from the raw records: cmq.pipeline.jobs.summary (delivered, lost, duplicates, "
        "out-of-order, latency percentiles and rates per system, scenario, size and parameters), "
        "run_stats (the same per run, for the intervals over runs) and sample_stats (series "
        "such as push cost and memory); the verdicts apply each claim's stated rule to them."
    )


def render_html(
    data: ReportData,
    experiments: Sequence[Experiment],
    *,
    title: str = "cmq lab report",
    source: str = "",
    facts: Mapping[str, str] | None = None,
    runs: Mapping[str, tuple[int, int]] | None = None,
    profile: str = "",
) -> str:
    """The whole page as a string: one section per experiment that has data
    (those of ``experiments`` in their order, then any others the records
    name, with a generic section), a verdict overview, the skipped systems
    and the environment. ``facts`` are lines about how the records were made
    (the lab's profile, its time per experiment), shown under the title.
    ``runs`` maps an experiment's id to the runs behind its judged figures
    in the ``profile`` that made the records and in the full profile: each
    section says them, and its verdicts are marked by :func:`indicative`."""
    registered = list(experiments)
    present = set(data.experiment_ids())
    shown = [e for e in registered if e.id in present]
    known = {e.id for e in registered}
    shown += [
        Experiment(id=i, title=f"{i} (no registered claims)") for i in sorted(present - known)
    ]

    sections: list[str] = []
    overview: list[tuple[str, Verdict, bool, bool]] = []
    for index, exp in enumerate(shown):
        markup, verdicts = _section_html(exp, data, index, (runs or {}).get(exp.id), profile)
        sections.append(markup)
        overview.extend(verdicts)
    not_run = [e for e in registered if e.id not in present]

    generated = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    nav = "".join(f'<a href="#{_e(e.id)}">{_e(e.id)}</a>' for e in shown)
    head = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8"/>',
        '<meta name="viewport" content="width=device-width, initial-scale=1"/>',
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{_e(title)}</h1>",
        f'<p class="meta">Generated {generated}{" from " + _e(source) if source else ""}. '
        f"{len(data.runs)} runs, {sum(r['messages'] or 0 for r in data.summary):,} messages in "
        f"{len(data.summary)} groups.</p>",
        f'<p class="meta">{_e(_pipeline_sentence(data))}</p>',
        *(f'<p class="meta"><b>{_e(k)}:</b> {_e(v)}</p>' for k, v in (facts or {}).items()),
        f"<nav>{nav}</nav>",
    ]
    body = []
    for heading, want in (("The papers' claims at a glance", False), ("cmq's targets", True)):
        chosen = [(t, v, marked) for t, v, target, marked in overview if target == want]
        if not chosen:
            continue
        body.append(f"<h2>{_e(heading)}</h2>")
        rows = "".join(
            f'<tr><td class="l">{_e(t)}</td><td class="l">{_badge(v.status, marked)}</td></tr>\n'
            for t, v, marked in chosen
        )
        body.append(
            '<div class="table"><table><thead><tr><th class="l">claim</th><th class="l">verdict</th>'
            f"</tr></thead><tbody>\n{rows}</tbody></table></div>"
        )
    if any(marked for *_, marked in overview):
        body.append(
            '<p class="note">Marked <span class="badge indicative">indicative</span>: a verdict of a '
            "profile that measured fewer runs behind the claim's figures than the full profile "
            "(<code>cmq lab --full</code>) does; each section says how many.</p>"
        )
    if not_run:
        body.append(
            '<p class="note">Not in this output: '
            + ", ".join(f"{_e(e.id)} ({_e(e.title)})" for e in not_run)
            + ".</p>"
        )
    body.extend(sections)
    body.append('<h2 id="skipped">Skipped and failed runs</h2>')
    body.append(_skipped_html(data.runs) or "<p>None: every system ran.</p>")
    body.append('<h2 id="environment">Environment</h2>')
    body.append(_environment_html(data))
    body.append("</body></html>\n")
    return "\n".join(head + body)


def build_report(
    out: str | os.PathLike[str],
    experiments: Sequence[Experiment],
    *,
    spark: SparkSession | None = None,
    master: str | None = None,
    path: str | os.PathLike[str] | None = None,
    title: str = "cmq lab report",
    facts: Mapping[str, str] | None = None,
    runs: Mapping[str, tuple[int, int]] | None = None,
    profile: str = "",
) -> Path:
    """Aggregate ``out``'s records on Spark and write the page (default
    ``out/report.html``) with a section per experiment of ``experiments``;
    returns its path. Starts a session on ``master``
    (default local) unless ``spark`` is given.

    Raises:
        ConfigError: ``out`` is not a directory.
        MissingExtra: PySpark (the ``lab`` extra) is not installed.
    """
    out_dir = Path(out)
    if not out_dir.is_dir():
        raise ConfigError(f"{out_dir} is not a directory of lab records")
    if spark is None:
        from cmq.pipeline.session import SessionConfig, build_session

        spark = build_session(SessionConfig(master=master) if master else SessionConfig())
    data = collect(spark, out_dir)
    page = render_html(data, experiments, title=title, source=str(out_dir), facts=facts, runs=runs,
                       profile=profile)  # fmt: skip
    target = Path(path) if path is not None else out_dir / "report.html"
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_text(page, encoding="utf-8")
    os.replace(tmp, target)
    return target
