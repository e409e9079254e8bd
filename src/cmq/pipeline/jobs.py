"""The pipeline's jobs: pure DataFrame -> DataFrame functions on Spark.

Every function here takes DataFrames with the schemas of
:mod:`cmq.pipeline.schema` and returns a new DataFrame; none collects, writes or
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
``ooo_by_request``
    out-of-order first deliveries that were asked for (``request_ns``) only
    after a higher ``seq`` of the stream had been received: the disorder that
    concurrency cannot explain. With several pulling receivers, messages
    handed out in strict order to receives that overlap in time may arrive
    in any order (``out_of_order`` counts those too); this count does not.
    ``ooo_by_request_rate = ooo_by_request / delivered``, null when no first
    delivery of the group has a ``request_ns``.
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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from cmq.pipeline.schema import (
    RECORDS_SCHEMA,
    RUNS_SCHEMA,
    SAMPLES_SCHEMA,
    TOTALS_SCHEMA,
    table_paths,
)

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
    "run_spans",
    "run_stats",
    "sample_series",
    "sample_stats",
    "spark_schema",
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


def spark_schema(schema: pa.Schema) -> StructType:
    """The Spark schema of one of :mod:`cmq.pipeline.schema`'s pyarrow schemas."""
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
    from pyspark.sql import functions as F

    def read(name: str, schema: pa.Schema) -> DataFrame:
        struct = spark_schema(schema)
        paths = table_paths(out, name)
        if paths:
            return spark.read.schema(struct).parquet(*paths)
        # Not createDataFrame([]): that goes through a Python RDD, and so
        # through Python workers, for nothing.
        return spark.range(0).select(
            *[F.lit(None).cast(f.dataType).alias(f.name) for f in struct.fields]
        )

    return Tables(
        records=read("records", RECORDS_SCHEMA),
        totals=read("totals", TOTALS_SCHEMA),
        samples=read("samples", SAMPLES_SCHEMA),
        runs=read("runs", RUNS_SCHEMA),
    )


def flag_deliveries(records: DataFrame) -> DataFrame:
    """``records`` with ``latency_ns``, ``duplicate`` and ``out_of_order``
    columns added (see the module docstring); lost rows get a null latency
    and both flags false.

    One window, one shuffle, one sort: within a stream, rows are ordered by
    ``seq`` descending (then ``recv_ns`` descending, so a message's first
    delivery is the last of its copies). A row is a duplicate when the next
    row is a delivered copy of the same ``seq``; a first delivery is out of
    order when some higher ``seq`` (a preceding row) was received earlier,
    which is the same as "its seq is lower than one received before it".
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    lost = F.col("lost")
    order = Window.partitionBy(*STREAM_KEYS).orderBy(F.desc("seq"), F.desc_nulls_last("recv_ns"))
    before = order.rowsBetween(Window.unboundedPreceding, -1)
    # Both window expressions in one select, so Spark evaluates them in one
    # Window operator over one buffer of each stream (written as two
    # withColumn calls they became two operators, each buffering every
    # stream again: most of the summary job's time, by its plan and timings).
    # The next row is a delivered copy of this seq: one lead, not two.
    next_delivered_seq = F.lead(F.when(~lost, F.col("seq"))).over(order)
    duplicate = ~lost & F.coalesce(next_delivered_seq == F.col("seq"), F.lit(False))
    earliest_higher = F.min(F.when(~lost, F.col("recv_ns"))).over(before)
    flagged = records.select(
        *records.columns, duplicate.alias("duplicate"), earliest_higher.alias("_earliest_higher")
    )
    out_of_order = (
        ~lost
        & ~F.col("duplicate")
        & F.coalesce(F.col("_earliest_higher") < F.col("recv_ns"), F.lit(False))
    )
    # A higher seq was received before this one was even asked for.
    by_request = out_of_order & F.coalesce(
        F.col("_earliest_higher") < F.col("request_ns"), F.lit(False)
    )
    return flagged.select(
        *records.columns,
        (F.col("recv_ns") - F.col("send_ns")).alias("latency_ns"),
        "duplicate",
        out_of_order.alias("out_of_order"),
        by_request.alias("ooo_by_request"),
    )


def _ratio(numerator: Column, denominator: Column) -> Column:
    from pyspark.sql import functions as F

    return F.when(denominator > 0, numerator / denominator)


def latency_stats(
    records: DataFrame, keys: Sequence[str] = GROUP_KEYS, *, rate: bool = False
) -> DataFrame:
    """Counts, loss, duplicates, out-of-order and latency per ``keys`` (:data:`GROUP_KEYS`).

    ``records`` may be :func:`flag_deliveries`'s output already (it has a
    ``duplicate`` column): it is then not flagged again, so a caller that
    needs several of these aggregates can flag once and cache the result.
    With ``rate``, also ``msgs_per_s``: first deliveries over the span from
    the first one's send to the last one's receipt (meant per run; null for
    a group whose span is not positive).
    """
    from pyspark.sql import functions as F

    flagged = records if "duplicate" in records.columns else flag_deliveries(records)
    first = ~F.col("lost") & ~F.col("duplicate")
    latency = F.when(first, F.col("latency_ns"))
    agg = flagged.groupBy(*keys).agg(
        F.count_if(first).alias("delivered"),
        F.count_if(F.col("lost")).alias("lost"),
        F.count_if(F.col("duplicate")).alias("duplicates"),
        F.count_if(F.col("out_of_order")).alias("out_of_order"),
        F.count_if(F.col("ooo_by_request")).alias("ooo_by_request"),
        F.count_if(first & F.col("request_ns").isNotNull()).alias("_requested"),
        F.max(F.col("round_trip")).alias("round_trip"),
        F.mean(latency).alias("mean_ns"),
        F.stddev_samp(latency).alias("stddev_ns"),
        F.min(latency).alias("min_ns"),
        F.max(latency).alias("max_ns"),
        F.percentile_approx(latency, [0.5, 0.99], PERCENTILE_ACCURACY).alias("_pct"),
        *(
            (
                F.min(F.when(first, F.col("send_ns"))).alias("_t0"),
                F.max(F.when(first, F.col("recv_ns"))).alias("_t1"),
            )
            if rate
            else ()
        ),
    )
    messages = F.col("delivered") + F.col("lost")
    return agg.select(
        *keys,
        messages.alias("messages"),
        "delivered",
        "lost",
        _ratio(F.col("lost"), messages).alias("loss_rate"),
        "duplicates",
        _ratio(F.col("duplicates"), F.col("delivered")).alias("dup_rate"),
        "out_of_order",
        _ratio(F.col("out_of_order"), F.col("delivered")).alias("ooo_rate"),
        "ooo_by_request",
        F.when(F.col("_requested") > 0, _ratio(F.col("ooo_by_request"), F.col("delivered")))
        .alias("ooo_by_request_rate"),
        "round_trip",
        "mean_ns",
        "stddev_ns",
        F.col("_pct")[0].alias("p50_ns"),
        F.col("_pct")[1].alias("p99_ns"),
        "min_ns",
        "max_ns",
        *(
            (
                F.when(
                    F.col("_t1") > F.col("_t0"),
                    F.col("delivered") * _NS_PER_S / (F.col("_t1") - F.col("_t0")),
                ).alias("msgs_per_s"),
            )
            if rate
            else ()
        ),
    )


def run_stats(records: DataFrame) -> DataFrame:
    """:func:`latency_stats` per run (:data:`GROUP_KEYS` and ``run_id``), with
    each run's ``msgs_per_s``: the per-run values whose spread the report's
    intervals are drawn from (:mod:`cmq.pipeline.stats`)."""
    return latency_stats(records, (*GROUP_KEYS, "run_id"), rate=True)


def run_spans(records: DataFrame) -> DataFrame:
    """Per :data:`GROUP_KEYS`: ``runs`` and ``span_ns``, the sum over runs of
    (last ``recv_ns`` - first ``send_ns`` of delivered rows). A plain hash
    aggregate: no sort."""
    from pyspark.sql import functions as F

    delivered = records.where(~F.col("lost"))
    per_run = delivered.groupBy(*GROUP_KEYS, "run_id").agg(
        (F.max("recv_ns") - F.min("send_ns")).alias("span_ns")
    )
    return per_run.groupBy(*GROUP_KEYS).agg(
        F.count("run_id").alias("runs"), F.sum("span_ns").alias("span_ns")
    )


def summary(records: DataFrame, totals: DataFrame) -> DataFrame:
    """One row per :data:`GROUP_KEYS`: :func:`latency_stats`, :func:`run_spans`
    and the totals joined, with msgs/s and MB/s (see the module docstring). A
    group with only totals has counts from its totals (``lost = sent -
    delivered``) and null latency."""
    from pyspark.sql import functions as F

    keys = list(GROUP_KEYS)
    from_totals = totals.groupBy(*GROUP_KEYS).agg(
        F.countDistinct("run_id").alias("t_runs"),
        F.sum("sent").alias("t_sent"),
        F.sum("delivered").alias("t_delivered"),
        F.sum("duration_ns").alias("t_ns"),
    )
    joined = (
        latency_stats(records)
        .join(run_spans(records), keys, "full_outer")
        .join(from_totals, keys, "full_outer")
    )
    has_totals = F.col("t_ns").isNotNull()
    delivered = F.when(has_totals, F.col("t_delivered")).otherwise(F.col("delivered"))
    ns = F.when(has_totals, F.col("t_ns")).otherwise(F.col("span_ns"))
    rate = F.when(ns > 0, delivered * _NS_PER_S / ns)
    t_lost = F.col("t_sent") - F.col("t_delivered")
    return joined.select(
        *GROUP_KEYS,
        F.coalesce(F.col("runs"), F.col("t_runs"), F.lit(0)).alias("runs"),
        F.coalesce(F.col("messages"), F.col("t_sent")).alias("messages"),
        F.coalesce(F.col("delivered"), F.col("t_delivered")).alias("delivered"),
        F.coalesce(F.col("lost"), t_lost).alias("lost"),
        F.coalesce(F.col("loss_rate"), _ratio(t_lost, F.col("t_sent"))).alias("loss_rate"),
        F.coalesce(F.col("duplicates"), F.lit(0)).alias("duplicates"),
        "dup_rate",
        F.coalesce(F.col("out_of_order"), F.lit(0)).alias("out_of_order"),
        "ooo_rate",
        F.coalesce(F.col("ooo_by_request"), F.lit(0)).alias("ooo_by_request"),
        "ooo_by_request_rate",
        F.coalesce(F.col("round_trip"), F.lit(False)).alias("round_trip"),
        "mean_ns",
        "stddev_ns",
        "p50_ns",
        "p99_ns",
        "min_ns",
        "max_ns",
        rate.alias("msgs_per_s"),
        (rate * F.col("size") / _BYTES_PER_MB).alias("mb_per_s"),
        F.when(has_totals, F.lit("totals")).otherwise(F.lit("records")).alias("rate_source"),
    )


def throughput(records: DataFrame, totals: DataFrame) -> DataFrame:
    """msgs/s and MB/s per :data:`GROUP_KEYS`, from totals where a group has
    them, else from per-message timestamps (column ``rate_source``)."""
    return summary(records, totals).select(
        *GROUP_KEYS, "runs", "msgs_per_s", "mb_per_s", "rate_source"
    )


def sample_stats(samples: DataFrame) -> DataFrame:
    """Mean, sample stddev, min, max and count of ``value`` per
    (experiment, scenario, system, params, metric, x), and the ``values``
    themselves in ascending order (a few per group: repeats, for the
    intervals over repeats of :mod:`cmq.pipeline.stats`)."""
    from pyspark.sql import functions as F

    return samples.groupBy("experiment", "scenario", "system", "params", "metric", "x").agg(
        F.count("value").alias("n"),
        F.mean("value").alias("mean"),
        F.stddev_samp("value").alias("stddev"),
        F.min("value").alias("min"),
        F.max("value").alias("max"),
        F.sort_array(F.collect_list("value")).alias("values"),
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
