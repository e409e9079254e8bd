"""What the pipeline costs: time of the summary job on 1M and 10M records.

Run ``python -m cmq.lab.bench.pipeline`` (options: ``--records 1000000
10000000``, ``--master URL``, ``--dir DIR``, ``--json FILE``).

It starts one SparkSession (timed on its own), generates synthetic records
with Spark itself straight into Parquet (timed on its own), runs the summary
job :data:`WARM_UP` times on the smallest set to warm the JVM (C2 compiles
the hot code over the first jobs), then times the job (read Parquet ->
:func:`cmq.pipeline.jobs.summary` -> collect) ``--repeat`` times per size,
each on a fresh DataFrame, and reports the median.
Spark's start-up is thus outside every per-record figure, and the figures
show how the cost grows with the number of records.

The synthetic records look like a lab run: 4 systems x 8 sizes, 2 runs per
system, latencies of 50-70 us with jitter (so some deliveries are out of
order), 1% lost.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from cmq._errors import ConfigError
from cmq.pipeline.session import SessionConfig, build_session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["BenchResult", "generate", "main", "run_bench"]

DEFAULT_RECORDS: Final = (1_000_000, 10_000_000)
_SYSTEMS: Final = ("cmq", "udp", "tcp", "zmq")
_SIZES: Final = (4, 16, 64, 256, 512, 1024, 4096, 16384)
_BASE_NS: Final = 1_700_000_000_000_000_000
#: Untimed jobs before the first timed one.
WARM_UP: Final = 2
#: Timed jobs per size; the figure is their median.
DEFAULT_REPEAT: Final = 3


@dataclass(frozen=True)
class BenchResult:
    """Timings of one size: generation and the warm summary job."""

    records: int
    groups: int
    generate_s: float
    job_s: float
    """Median of the timed jobs."""
    job_times: tuple[float, ...] = ()
    """Every timed job, in order."""

    @property
    def records_per_s(self) -> float:
        """Records aggregated per second of the warm job."""
        return self.records / self.job_s


def generate(spark: SparkSession, n: int, out: Path) -> None:
    """Write ``n`` synthetic records as ``out/records/*.parquet`` with Spark."""
    from pyspark.sql import functions as F

    from cmq.pipeline.jobs import spark_schema
    from cmq.pipeline.schema import RECORDS_SCHEMA

    i = F.col("id")
    systems = F.array(*[F.lit(s) for s in _SYSTEMS])
    sizes = F.array(*[F.lit(s) for s in _SIZES])
    send = F.lit(_BASE_NS) + i * 1000
    lost = F.rand(seed=1) < 0.01
    latency = (F.lit(50_000) + F.rand(seed=2) * 20_000).cast("long")
    df = spark.range(n).select(
        F.lit("bench").alias("experiment"),
        F.concat(F.lit("run-"), (i % 8).cast("string")).alias("run_id"),
        F.element_at(systems, (i % 4 + 1).cast("int")).alias("system"),
        F.lit("pingping").alias("scenario"),
        F.lit("{}").alias("params"),
        F.element_at(sizes, ((i / 8).cast("long") % 8 + 1).cast("int")).cast("long").alias("size"),
        i.alias("seq"),
        send.alias("send_ns"),
        F.when(~lost, send + latency).alias("recv_ns"),
        lost.alias("lost"),
        F.lit(False).alias("round_trip"),
        F.lit("s").alias("stream"),
        F.lit("").alias("receiver"),
        F.lit(None).cast("long").alias("request_ns"),
    )
    schema = spark_schema(RECORDS_SCHEMA)
    # Columns in the schema's order, as the lab's writer leaves them.
    df.select(*schema.fieldNames()).write.mode("overwrite").parquet(str(out / "records"))


def _job(spark: SparkSession, out: Path) -> int:
    from cmq.pipeline.jobs import load_tables, summary

    tables = load_tables(spark, out)
    return len(summary(tables.records, tables.totals).collect())


def run_bench(
    spark: SparkSession,
    sizes: Sequence[int],
    directory: Path,
    *,
    log: bool = True,
    repeat: int = DEFAULT_REPEAT,
) -> list[BenchResult]:
    """Generate and time each size (see the module docstring).

    Raises:
        ConfigError: a size below 1, or ``repeat`` below 1.
    """
    if not sizes or min(sizes) < 1:
        raise ConfigError(f"record counts must be positive, got {list(sizes)}")
    if repeat < 1:
        raise ConfigError(f"repeat must be at least 1, got {repeat}")
    results = []
    sizes = sorted(sizes)
    for k, n in enumerate(sizes):
        out = directory / f"n{n}"
        t0 = time.perf_counter()
        generate(spark, n, out)
        generate_s = time.perf_counter() - t0
        if k == 0:
            for _ in range(WARM_UP):  # class loading and JIT, not counted
                _job(spark, out)
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            groups = _job(spark, out)
            times.append(time.perf_counter() - t0)
        result = BenchResult(records=n, groups=groups, generate_s=generate_s,
                             job_s=statistics.median(times), job_times=tuple(times))  # fmt: skip
        if log:
            print(
                f"{n:>12,} records: generate {generate_s:6.1f} s, summary job median "
                f"{result.job_s:6.2f} s of {', '.join(f'{t:.2f}' for t in times)} "
                f"= {result.records_per_s:,.0f} records/s ({groups} groups)",
                file=sys.stderr,
            )
        results.append(result)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; prints a table and optionally writes JSON."""
    parser = argparse.ArgumentParser(prog="python -m cmq.lab.bench.pipeline", description=__doc__)
    parser.add_argument("--records", type=int, nargs="+", default=list(DEFAULT_RECORDS))
    parser.add_argument("--master", default="local[*]", help="Spark master URL (default local[*])")
    parser.add_argument("--driver-memory", default="3g")
    parser.add_argument(
        "--dir",
        type=Path,
        help="where to write the synthetic records (default: a temp dir, removed)",
    )
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    parser.add_argument("--repeat", type=int, default=DEFAULT_REPEAT,
                        help=f"timed jobs per size, the median is reported (default {DEFAULT_REPEAT})")  # fmt: skip
    args = parser.parse_args(argv)

    directory = args.dir or Path(tempfile.mkdtemp(prefix="cmq-pipeline-bench-"))
    try:
        t0 = time.perf_counter()
        spark = build_session(
            SessionConfig(
                master=args.master, app_name="cmq-pipeline-bench", driver_memory=args.driver_memory
            )
        )
        spark.range(1).count()
        startup_s = time.perf_counter() - t0
        print(
            f"SparkSession start-up (incl. first trivial job): {startup_s:.1f} s", file=sys.stderr
        )
        cores = spark.sparkContext.defaultParallelism
        results = run_bench(spark, args.records, directory, repeat=args.repeat)
        spark.stop()
    finally:
        if args.dir is None:
            shutil.rmtree(directory, ignore_errors=True)
    print("| records | summary job (warm, median) | records/s | generate |")
    print("|---:|---:|---:|---:|")
    for r in results:
        print(
            f"| {r.records:,} | {r.job_s:.2f} s | {r.records_per_s:,.0f} | {r.generate_s:.1f} s |"
        )
    # Other work on the machine slows every figure: say how busy it was.
    load = os.getloadavg()
    print(
        f"\nSpark start-up {startup_s:.1f} s, master {args.master}, parallelism {cores}, "
        f"load average at the end {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} on {os.cpu_count()} CPUs"
    )
    if args.json:
        payload = {
            "master": args.master,
            "parallelism": cores,
            "startup_s": startup_s,
            "loadavg_end": load,
            "results": [{**asdict(r), "records_per_s": r.records_per_s} for r in results],
        }
        args.json.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
