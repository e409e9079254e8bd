"""Rebuild DIR/report.html from the lab records in DIR, without rerunning experiments.

Aggregates DIR/records, DIR/totals, DIR/samples and DIR/runs on Spark (local
mode unless --master names a cluster) and writes one self-contained HTML page.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``cmq report``."""
    parser.add_argument("dir", type=Path, help="lab output directory (holds records/ and runs/)")
    parser.add_argument(
        "--master",
        default=None,
        help="Spark master URL, e.g. spark://host:7077 (default: local[*], in this process)",
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="where to write the page (default DIR/report.html)"
    )
    parser.add_argument("--title", default="cmq lab report", help="page title")


def run(args: argparse.Namespace) -> int:
    """Build the report; prints its path.

    Raises:
        ConfigError: DIR is not a directory.
        MissingExtra: PySpark (the ``lab`` extra) is not installed.
    """
    from cmq.lab.experiments import pages
    from cmq.lab.orchestrate import read_facts, read_runs
    from cmq.pipeline.report import build_report

    profile, runs = read_runs(args.dir)
    path = build_report(args.dir, pages(), master=args.master, path=args.out, title=args.title,
                        facts=read_facts(args.dir), runs=runs, profile=profile)  # fmt: skip
    print(path)
    print(f"open file://{path.resolve()}", file=sys.stderr)
    return 0
