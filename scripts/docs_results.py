"""The documentation site's results page, from a lab run's output directory.

An MkDocs hook (``hooks:`` in mkdocs.yml). Built as usual, ``results.md``
shows the checked-in figures, each with the date and command of the run that
made them. Built with ``CMQ_LAB_OUT=DIR`` (a directory ``cmq lab --out DIR``
wrote), the page opens with that run instead: when and where it ran, its
profile, every experiment's runs by system (done or skipped, and why), and
the run's own report page, copied into the site as ``lab-report.html``.
The checked-in figures follow, for comparison.

The page reads the run's metadata (``DIR/runs/*.parquet``, ``DIR/lab.json``)
and, for one headline table, CMQ Figure 5's round-trip records, with
pyarrow: no Spark at build time. Every other figure is on the run's report
page, which the lab's PySpark jobs computed when it ran.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

ENV = "CMQ_LAB_OUT"
PAGE = "results.md"
MARK = "<!-- results: lab run -->"
REPORT = "lab-report.html"


def render(out: Path) -> str:
    """Markdown describing the lab run in ``out``.

    Raises:
        FileNotFoundError: ``out`` holds no lab run (no runs table).
    """
    from cmq.pipeline.schema import read_table

    runs = read_table(out, "runs").to_pylist()
    if not runs:
        raise FileNotFoundError(f"{ENV}={out}: no lab runs there (no {out}/runs/*.parquet)")
    try:
        facts: dict[str, Any] = json.loads((out / "lab.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        facts = {}
    started = min(r["started_at"] for r in runs)
    finished = max((r["finished_at"] or r["started_at"]) for r in runs)
    hosts = sorted({f"{r['host']} ({r['cores']} cores)" for r in runs})
    lines = [
        "## This build's lab run",
        "",
        f"Rendered from the lab output directory `{out}` when this site was built. "
        f"The run started {started:%Y-%m-%d %H:%M} UTC and its last run ended "
        f"{finished:%Y-%m-%d %H:%M} UTC, on {', '.join(hosts)}; "
        f"profile: {facts.get('profile', 'not recorded')}.",
        "",
    ]
    if (out / "report.html").is_file():
        lines += [
            f"Its figures, tables and verdicts are on [the run's report page]({REPORT}) "
            "(self-contained; computed by the lab's PySpark jobs).",
            "",
        ]
    seconds = facts.get("experiment_seconds") or {}
    by_exp: dict[str, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for r in runs:
        by_exp[r["experiment"]][r["system"]].append(r)
    lines += ["| experiment | seconds | system | runs done | skipped (why) |", "|---|---|---|---|---|"]
    for exp in sorted(by_exp):
        for i, system in enumerate(sorted(by_exp[exp])):
            rs = by_exp[exp][system]
            done = sum(1 for r in rs if not r["skipped"])
            why = sorted({r["reason"] for r in rs if r["skipped"] and r["reason"]})
            skipped = sum(1 for r in rs if r["skipped"])
            skip_text = f"{skipped} ({'; '.join(why)})" if why else str(skipped)
            secs = f"{float(seconds[exp]):.0f}" if i == 0 and exp in seconds else ""
            lines.append(f"| {exp if i == 0 else ''} | {secs} | {system} | {done} | {skip_text} |")
    lines += ["", *_round_trips(out)]
    return "\n".join(lines) + "\n"


def _round_trips(out: Path) -> list[str]:
    """CMQ Figure 5's round trips from the records: the median per scenario, size and system."""
    import statistics

    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    from cmq.pipeline.schema import RECORDS_SCHEMA, table_paths

    paths = table_paths(out, "records")
    if not paths:
        return []
    wanted = (
        (pc.field("experiment") == "cmq-fig5") & pc.field("round_trip")
        & ~pc.field("lost") & pc.field("recv_ns").is_valid()
    )  # fmt: skip
    rows = ds.dataset(paths, schema=RECORDS_SCHEMA, format="parquet").to_table(
        columns=["system", "scenario", "size", "send_ns", "recv_ns"], filter=wanted
    ).to_pylist()
    if not rows:
        return []
    cells: dict[tuple[str, int], dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        cells[(r["scenario"], r["size"])][r["system"]].append(r["recv_ns"] - r["send_ns"])
    systems = sorted({r["system"] for r in rows})
    lines = [
        "### Round trips (CMQ Figure 5), from the records",
        "",
        "The median of every round trip recorded, in µs, all of a cell's runs "
        "pooled (the report page gives each statistic as its claim's rule asks).",
        "",
        "| scenario | size (B) | " + " | ".join(systems) + " |",
        "|---|---|" + "---|" * len(systems),
    ]
    for (scenario, size), by_system in sorted(cells.items()):
        figures = [
            f"{statistics.median(by_system[s]) / 1000:,.1f}" if by_system.get(s) else "-"
            for s in systems
        ]
        lines.append(f"| {scenario} | {size:,} | " + " | ".join(figures) + " |")
    return [*lines, ""]


def _out() -> Path | None:
    value = os.environ.get(ENV, "").strip()
    return Path(value).expanduser().resolve() if value else None


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Put the given lab run, if any, where the results page has its mark."""
    if page.file.src_uri != PAGE:
        return markdown
    out = _out()
    if out is None:
        return markdown.replace(MARK, "")
    return markdown.replace(MARK, render(out) + "\n## The checked-in runs, for comparison\n")


def on_files(files: Any, config: Any) -> Any:
    """Add the given run's report page to the site, beside the results page."""
    out = _out()
    if out is not None and (out / "report.html").is_file():
        from mkdocs.structure.files import File

        files.append(File.generated(config, REPORT, abs_src_path=str(out / "report.html")))
    return files
