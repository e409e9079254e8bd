"""The pipeline's jobs: pure DataFrame -> DataFrame functions on Spark.

Every function here takes DataFrames with the schemas of
:mod:`cmq.lab.records` and returns a new DataFrame; none collects, writes or
reads a clock, so they run unchanged on ``local[*]`` and on a cluster, and
tests check them on small records whose answers are known.

Definitions (per group of :data:`GROUP_KEYS`):

``lost``
    rows with ``lost`` true.
``duplicates``
    deliveries of a ``(run_id, stream, receiver, seq)`` after its first one
    (first = earliest ``recv_ns``).
``delivered``
    distinct messages delivered: delivered rows minus duplicates.
``messages``
    ``delivered + lost``; ``loss_rate = lost / messages``.
``dup_rate``
    ``duplicates / delivered`` (extra copies per delivered message).
``out_of_order``
    first deliveries whose ``seq`` is lower than a ``seq`` the same
    ``(run_id, stream, receiver)`` received earlier (ordered by
    ``recv_ns``); ``ooo_rate = out_of_order / delivered``.
latency
    ``recv_ns - send_ns`` of first deliveries, in ns: one way, or the round
    trip where the rows say ``round_trip``. ``stddev_ns`` is the sample
    standard deviation (null for one message); ``p50_ns`` and ``p99_ns`` come
    from ``percentile_approx`` (exact for up to 10,000 values per group).
``msgs_per_s``, ``mb_per_s``
    from ``totals`` rows when the group has any: ``sum(delivered) /
    sum(duration)``; else from records: ``sum(delivered) / sum(span)`` where a
    run's span is its last ``recv_ns`` minus its first ``send_ns``.
    ``rate_source`` says which. MB is 10**6 bytes of payload (``size``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from cmq.lab.records import RECORDS_SCHEMA, RUNS_SCHEMA, SAMPLES_SCHEMA, TOTALS_SCHEMA, table_paths

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

__all__ = [
    "GROUP_KEYS",
    "STREAM_KEYS",
    "Tables",
    "flag_deliveries",
    "latency_stats",
    "load_tables",
    "sample_series",
    "sample_stats",
    "summary",
    "throughput",
]

#: What one row of the summary describes.
GROUP_KEYS: Final = ("experiment", "scenario", "system", "size", "params")
#: One ordered stream of sequence numbers, within which duplicates and
#: out-of-order deliveries are counted.
STREAM_KEYS: Final = (*GROUP_KEYS, "run_id", "stream", "receiver")
#: ``percentile_approx``'s accuracy: exact up to this many values per group,
#: and a relative rank error of 1/accuracy beyond.
PERCENTILE_ACCURACY: Final = 10_000
_NS_PER_S: Final = 1e9
_BYTES_PER_MB: Final = 1e6


def _spark_schema(schema: pa.Schema) -> StructType:
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema)


@dataclass(frozen=True)
class Tables:
    """The four lab tables of one output directory, as Spark DataFrames."""

    records: DataFrame
    totals: DataFrame
    samples: DataFrame
    runs: DataFrame


def load_tables(spark: SparkSession, out: str | os.PathLike[str]) -> Tables:
    """Read ``out/records``, ``out/totals``, ``out/samples`` and ``out/runs``.

    The schema is given, not inferred, so an empty or missing table is an
    empty DataFrame of the right shape rather than an error.
    """

    def read(name: str, schema: pa.Schema) -> DataFrame:
        spark_schema = _spark_schema(schema)
        paths = table_paths(out, name)
        if not paths:
            return spark.createDataFrame([], spark_schema)
        return spark.read.schema(spark_schema).parquet(*paths)

    return Tables(
        records=read("records", RECORDS_SCHEMA),
        totals=read("totals", TOTALS_SCHEMA),
        samples=read("samples", SAMPLES_SCHEMA),
        runs=read("runs", RUNS_SCHEMA),
    )


def flag_deliveries(records: DataFrame) -> DataFrame:
    """Delivered rows of ``records`` with ``latency_ns``, ``duplicate`` and
    ``out_of_order`` columns added (see the module docstring)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    delivered = records.where(~F.col("lost"))
    # Ties on recv_ns are broken by seq so that the result is deterministic.
    by_copy = Window.partitionBy(*STREAM_KEYS, "seq").orderBy("recv_ns", "send_ns")
    before = (
        Window.partitionBy(*STREAM_KEYS)
        .orderBy("recv_ns", "seq")
        .rowsBetween(Window.unboundedPreceding, -1)
    )
    flagged = delivered.withColumn("duplicate", F.row_number().over(by_copy) > 1).withColumn(
        "_prev_max", F.max("seq").over(before)
    )
    return flagged.select(
        *records.columns,
        (F.col("recv_ns") - F.col("send_ns")).alias("latency_ns"),
        "duplicate",
        (
            ~F.col("duplicate")
            & F.col("_prev_max").isNotNull()
            & (F.col("seq") < F.col("_prev_max"))
        ).alias("out_of_order"),
    )


def latency_stats(records: DataFrame) -> DataFrame:
    """Counts, loss, duplicates, out-of-order and latency per :data:`GROUP_KEYS`."""
    from pyspark.sql import functions as F

    flagged = flag_deliveries(records)
    lost = records.where(F.col("lost")).select(
        *records.columns,
        F.lit(None).cast("long").alias("latency_ns"),
        F.lit(False).alias("duplicate"),
        F.lit(False).alias("out_of_order"),
    )
    rows = flagged.unionByName(lost)
    first = ~F.col("lost") & ~F.col("duplicate")
    latency = F.when(first, F.col("latency_ns"))
    agg = rows.groupBy(*GROUP_KEYS).agg(
        F.countDistinct("run_id").alias("runs"),
        F.count_if(first).alias("delivered"),
        F.count_if(F.col("lost")).alias("lost"),
        F.count_if(F.col("duplicate")).alias("duplicates"),
        F.count_if(F.col("out_of_order")).alias("out_of_order"),
        F.max(F.col("round_trip")).alias("round_trip"),
        F.mean(latency).alias("mean_ns"),
        F.stddev_samp(latency).alias("stddev_ns"),
        F.min(latency).alias("min_ns"),
        F.max(latency).alias("max_ns"),
        F.percentile_approx(latency, [0.5, 0.99], PERCENTILE_ACCURACY).alias("_pct"),
    )
    messages = F.col("delivered") + F.col("lost")
    return agg.select(
        *GROUP_KEYS,
        "runs",
        messages.alias("messages"),
        "delivered",
        "lost",
        _ratio(F.col("lost"), messages).alias("loss_rate"),
        "duplicates",
        _ratio(F.col("duplicates"), F.col("delivered")).alias("dup_rate"),
        "out_of_order",
        _ratio(F.col("out_of_order"), F.col("delivered")).alias("ooo_rate"),
        "round_trip",
        "mean_ns",
        "stddev_ns",
        F.col("_pct")[0].alias("p50_ns"),
        F.col("_pct")[1].alias("p99_ns"),
        "min_ns",
        "max_ns",
    )


def _ratio(numerator: Column, denominator: Column) -> Column:
    from pyspark.sql import functions as F

    return F.when(denominator > 0, numerator / denominator)


def throughput(records: DataFrame, totals: DataFrame) -> DataFrame:
    """msgs/s and MB/s per :data:`GROUP_KEYS`, from totals where a group has
    them, else from per-message timestamps (column ``rate_source``)."""
    from pyspark.sql import functions as F

    per_run = (
        records.where(~F.col("lost"))
        .groupBy(*GROUP_KEYS, "run_id")
        .agg(
            # Distinct seqs: a duplicate is not a second message delivered.
            F.count_distinct("stream", "receiver", "seq").alias("n"),
            (F.max("recv_ns") - F.min("send_ns")).alias("span_ns"),
        )
    )
    from_records = per_run.groupBy(*GROUP_KEYS).agg(
        F.sum("n").alias("_delivered"), F.sum("span_ns").alias("_ns")
    )
    from_totals = totals.groupBy(*GROUP_KEYS).agg(
        F.sum("sent").alias("t_sent"),
        F.sum("delivered").alias("t_delivered"),
        F.sum("duration_ns").alias("t_ns"),
    )
    joined = from_records.join(from_totals, list(GROUP_KEYS), "full_outer")
    has_totals = F.col("t_ns").isNotNull()
    delivered = F.when(has_totals, F.col("t_delivered")).otherwise(F.col("_delivered"))
    ns = F.when(has_totals, F.col("t_ns")).otherwise(F.col("_ns"))
    rate = F.when(ns > 0, delivered * _NS_PER_S / ns)
    return joined.select(
        *GROUP_KEYS,
        rate.alias("msgs_per_s"),
        (rate * F.col("size") / _BYTES_PER_MB).alias("mb_per_s"),
        F.when(has_totals, F.lit("totals")).otherwise(F.lit("records")).alias("rate_source"),
        "t_sent",
        "t_delivered",
    )


def summary(records: DataFrame, totals: DataFrame) -> DataFrame:
    """One row per :data:`GROUP_KEYS`: :func:`latency_stats` joined with
    :func:`throughput`. A group with only totals has counts from its totals
    (``lost = sent - delivered``) and null latency."""
    from pyspark.sql import functions as F

    stats = latency_stats(records)
    rates = throughput(records, totals)
    joined = stats.join(rates, list(GROUP_KEYS), "full_outer")
    t_lost = F.col("t_sent") - F.col("t_delivered")
    delivered = F.coalesce(F.col("delivered"), F.col("t_delivered"))
    lost = F.coalesce(F.col("lost"), t_lost)
    messages = F.coalesce(F.col("messages"), F.col("t_sent"))
    return joined.select(
        *GROUP_KEYS,
        F.coalesce(F.col("runs"), F.lit(0)).alias("runs"),
        messages.alias("messages"),
        delivered.alias("delivered"),
        lost.alias("lost"),
        F.coalesce(F.col("loss_rate"), _ratio(t_lost, F.col("t_sent"))).alias("loss_rate"),
        F.coalesce(F.col("duplicates"), F.lit(0)).alias("duplicates"),
        "dup_rate",
        F.coalesce(F.col("out_of_order"), F.lit(0)).alias("out_of_order"),
        "ooo_rate",
        F.coalesce(F.col("round_trip"), F.lit(False)).alias("round_trip"),
        "mean_ns",
        "stddev_ns",
        "p50_ns",
        "p99_ns",
        "min_ns",
        "max_ns",
        "msgs_per_s",
        "mb_per_s",
        "rate_source",
    )


def sample_stats(samples: DataFrame) -> DataFrame:
    """Mean, sample stddev, min, max and count of ``value`` per
    (experiment, scenario, system, params, metric, x)."""
    from pyspark.sql import functions as F

    return samples.groupBy("experiment", "scenario", "system", "params", "metric", "x").agg(
        F.count("value").alias("n"),
        F.mean("value").alias("mean"),
        F.stddev_samp("value").alias("stddev"),
        F.min("value").alias("min"),
        F.max("value").alias("max"),
    )


def sample_series(samples: DataFrame, metric: str) -> DataFrame:
    """Time series of one metric: ``t_s`` seconds since each run's first
    sample, and ``value``, ordered by run and time."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    timed = samples.where((F.col("metric") == metric) & F.col("t_ns").isNotNull())
    start = F.min("t_ns").over(Window.partitionBy("run_id"))
    return timed.select(
        "experiment",
        "scenario",
        "system",
        "params",
        "run_id",
        ((F.col("t_ns") - start) / _NS_PER_S).alias("t_s"),
        "value",
    ).orderBy("run_id", "t_s")
