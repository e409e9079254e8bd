"""Run the lab: reproduce the CMQ and ØMQ papers' experiments, aggregate on Spark, write a report.

--quick (the default) takes seven to ten minutes on 2 cores; --full runs the papers' scale
(1000 round trips at every size, the whole tuning grid, a million
destinations, five minutes of receiver memory). Raw records go to OUT as
Parquet, the PySpark pipeline aggregates them, and OUT/report.html puts each
paper's claim beside our result. A system whose server or package is
missing is skipped with a line saying how to get it. `cmq report OUT`
rebuilds the page from the records. Examples:

  cmq lab
  cmq lab --full --out lab-full
  cmq lab --only fig5,zmq --systems cmq,udp,zmq --out /tmp/lab
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from cmq._errors import MissingExtra
from cmq._extras import install_hint, require
from cmq.commands.bench import parse_sizes, parse_systems
from cmq.lab.experiments import DEFAULT_LOSS, PROFILE_NAMES
from cmq.lab.runner import PINS

if TYPE_CHECKING:
    # The orchestrator imports the records' writer, which needs pyarrow (the
    # lab extra): loaded in run(), so that --help works without it.
    from cmq.lab.orchestrate import LabResult

__all__ = ["configure", "run"]


def _experiments(text: str) -> list[str]:
    from cmq._errors import ConfigError
    from cmq.lab.experiments import get

    names = [n.strip() for n in text.split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(f"empty experiment name in {text!r}")
    try:
        return list(dict.fromkeys(get(n).id for n in names))
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _probability(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"must be a probability in [0, 1), not {text}")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {text}")
    return value


def _experiment_list() -> str:
    from cmq.lab.experiments import experiments

    lines = ["experiments (--only takes the ids, or the short names in brackets):", ""]
    try:
        found = experiments()
    except MissingExtra as exc:
        # The experiments' modules write records with pyarrow.
        return f"experiments: listed here once the {exc.extra!r} extra is installed ({install_hint(exc.extra)})"
    for e in found:
        names = f"{e.id} [{', '.join(e.aliases)}]" if e.aliases else e.id
        lines.append(f"  {names:<34} {e.title}")
    return "\n".join(lines)


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``cmq lab``."""
    # Listed from the registry, so experiments of later issues show up.
    parser.epilog = _experiment_list()
    parser.add_argument("--out", type=Path, default=None,
                        help="output directory (default: a new cmq-lab/<UTC time>)")  # fmt: skip
    scale = parser.add_mutually_exclusive_group()
    scale.add_argument("--quick", dest="profile", action="store_const", const="quick",
                       help="seven to ten minutes on 2 cores (the default)")  # fmt: skip
    scale.add_argument("--full", dest="profile", action="store_const", const="full",
                       help="the papers' scale (the CMQ and ØMQ experiments: about 25 minutes on 2 cores; the AMQP and queue-service ones add more)")  # fmt: skip
    # Hidden: "tiny" is for tests of the whole path.
    scale.add_argument("--profile", dest="profile", choices=PROFILE_NAMES, help=argparse.SUPPRESS)
    parser.set_defaults(profile="quick")
    parser.add_argument("--only", type=_experiments, default=[], metavar="EXP,...",
                        help="run only these experiments (ids or short names, see above)")  # fmt: skip
    parser.add_argument("--systems", type=parse_systems, default=None, metavar="LIST",
                        help="systems to compare, comma separated, or 'all' (default all)")  # fmt: skip
    parser.add_argument("--sizes", type=parse_sizes, default=None, metavar="LIST",
                        help="message sizes in bytes for the round-trip and throughput "
                             "experiments, e.g. 4,512,16K (default: the profile's)")  # fmt: skip
    parser.add_argument("--count", type=_count, default=None, metavar="N",
                        help="round trips per system and size (default 300 quick, 200 under loss; 1000 full)")  # fmt: skip
    parser.add_argument("--loss", type=_probability, default=DEFAULT_LOSS, metavar="P",
                        help=f"packet-loss probability of Figure 6 (default {DEFAULT_LOSS}, the paper's)")  # fmt: skip
    parser.add_argument("--pin", choices=PINS, default="none",
                        help="CPU pinning of each run's two processes (default none)")  # fmt: skip
    parser.add_argument("--master", default=None, metavar="URL",
                        help="Spark master for the pipeline (default: local mode in this process); "
                             "OUT must then be on storage the cluster's executors can read")  # fmt: skip
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the records of an earlier run in --out")  # fmt: skip
    parser.add_argument("--no-report", dest="report", action="store_false",
                        help="write the records only; build the page later with 'cmq report OUT'")  # fmt: skip
    parser.add_argument("--quiet", action="store_true", help="no progress or skip lines on stderr")


def _summary(result: LabResult) -> str:
    lines = []
    minutes, seconds = divmod(result.seconds, 60)
    runs = ", ".join(f"{n} {status}" for status, n in sorted(result.runs.items()))
    lines.append(
        f"cmq lab: {result.profile} profile, {len(result.experiments)} experiments, "
        f"runs: {runs or 'none'}; {int(minutes)}m{seconds:04.1f}s "
        f"(pipeline {result.pipeline_seconds:.1f}s)"
    )
    if result.times:
        # Where the minutes went: what to trim when a profile runs long.
        lines.append(
            "  time per experiment: " + ", ".join(f"{k} {v:.0f}s" for k, v in result.times.items())
        )
    for text in result.headlines:
        lines.append(f"  {text}")
    if result.verdicts:
        lines.append("claims:")
        for v in result.verdicts:
            status = f"{v.status}, indicative" if v.indicative else v.status
            lines.append(f"  [{status}] {v.experiment}: {v.result}")
    for text in result.skipped:
        lines.append(f"skipped {text}")
    for text in result.failures:
        lines.append(f"failed {text}")
    if result.report is not None:
        lines.append(f"report: {result.report.resolve()}")
    else:
        lines.append(
            f"records: {result.out.resolve()} (build the page with: cmq report {result.out})"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Run the lab and print a summary and the report's path; 0 unless a run failed.

    Raises:
        ConfigError: a bad combination of options, or an output directory
            that holds earlier records.
        MissingExtra: the lab extra is not installed.
    """
    # Checked before anything runs: the records need pyarrow, the report Spark
    # and matplotlib, and a missing one should not cost ten minutes of runs.
    require("the lab", "pyarrow")
    if args.report:
        require("the lab's report", "pyspark", "matplotlib")
    from cmq.lab.orchestrate import LabConfig, Ui, default_out, run_lab

    config = LabConfig(
        out=args.out if args.out is not None else default_out(),
        profile=args.profile,
        only=tuple(args.only),
        systems=tuple(args.systems) if args.systems is not None else None,
        sizes=tuple(args.sizes) if args.sizes is not None else None,
        count=args.count,
        loss=args.loss,
        pin=args.pin,
        master=args.master,
        overwrite=args.overwrite,
        report=args.report,
    )
    result = run_lab(config, ui=Ui(quiet=args.quiet))
    print(_summary(result))
    sys.stdout.flush()
    return 1 if result.failures else 0
