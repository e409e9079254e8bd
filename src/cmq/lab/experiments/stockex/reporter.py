"""The statistics reporter: a Spark Structured Streaming query over measurement messages.

The gateway and the matching engine push one JSON measurement message per
interval (counts of what they did since the last one, with the interval's
wall-clock bounds ``t0``/``t1`` in ns, their rate ``step`` and ``rate``)
to the reporter's cmq endpoint, a :class:`~cmq.pipeline.source.SpoolReceiver`.
:func:`spark_stats` reads them with ``spark.readStream.format("cmq")`` (the
lab's data source), parses the JSON and sums the counts per (step, rate,
role) in a streaming aggregation; :func:`python_stats` computes the same from
the spool without Spark (tests, and a cross-check).

The query runs with ``trigger(availableNow=True)`` once the run is over: it
drains what the spool holds and stops, so the reporter's Spark work does
not compete for the two cores with the processes being measured. The
measurement messages are UDP without acknowledgement (at most once): the
receiver's drop counters are reported beside the figures.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["COUNTERS", "RATES", "python_stats", "rates", "spark_stats"]

#: What the two roles count (absent counters are 0).
COUNTERS: Final = ("orders_sent", "bytes_sent", "orders", "bytes_in", "conf", "trade", "quote",
                   "bytes_out", "confirms", "trades", "quotes")  # fmt: skip

_JSON_SCHEMA: Final = "role STRING, step INT, rate DOUBLE, t0 BIGINT, t1 BIGINT, " + ", ".join(
    f"{c} BIGINT" for c in COUNTERS
)


def _totals(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    out: dict[tuple[int, str], dict[str, Any]] = {}
    for m in rows:
        k = (int(m["step"]), str(m["role"]))
        agg = out.setdefault(k, {"step": k[0], "rate": float(m["rate"]), "role": k[1], "t0": m["t0"],
                                 "t1": m["t1"], "reports": 0, **dict.fromkeys(COUNTERS, 0),
                                 **{f"{c}_t0": None for c in COUNTERS},
                                 **{f"{c}_t1": None for c in COUNTERS}})  # fmt: skip
        agg["t0"], agg["t1"] = min(agg["t0"], m["t0"]), max(agg["t1"], m["t1"])
        agg["reports"] += 1
        for c in COUNTERS:
            n = int(m.get(c) or 0)
            agg[c] += n
            if n:
                t0, t1 = agg[f"{c}_t0"], agg[f"{c}_t1"]
                agg[f"{c}_t0"] = m["t0"] if t0 is None else min(t0, m["t0"])
                agg[f"{c}_t1"] = m["t1"] if t1 is None else max(t1, m["t1"])
    return [out[k] for k in sorted(out)]


def python_stats(spool: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Per (step, role): summed counters, first ``t0``, last ``t1``, reports; from the spool."""
    from cmq.pipeline.source import committed_offset, read_spool

    rows = [json.loads(r[4]) for r in read_spool(spool, 0, committed_offset(spool))]
    return _totals(rows)


def spark_stats(
    spark: SparkSession, spool: str | os.PathLike[str], name: str = "stockex_stats"
) -> list[dict[str, Any]]:
    """The same as :func:`python_stats`, computed by a Structured Streaming query on
    ``format("cmq")``, drained with ``availableNow``.

    Each micro-batch is aggregated by Spark (``foreachBatch``: a plain batch
    aggregation, no state store, which costs seconds per trigger here) and
    the per-batch sums are merged on the driver.
    """
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F

    from cmq.pipeline.source import register

    register(spark)
    raw = spark.readStream.format("cmq").option("spool", str(spool)).load()
    m = raw.select(F.from_json(F.col("payload").cast("string"), _JSON_SCHEMA).alias("m")).select(
        "m.*"
    )
    partial: list[dict[str, Any]] = []

    def batch(df: DataFrame, _batch_id: int) -> None:
        agg = df.groupBy("step", "role").agg(
            F.first("rate").alias("rate"),
            F.min("t0").alias("t0"),
            F.max("t1").alias("t1"),
            F.count(F.lit(1)).alias("reports"),
            *[F.sum(F.coalesce(F.col(c), F.lit(0))).alias(c) for c in COUNTERS],
            # Each counter's own active window: a rate is its count over the
            # intervals in which it moved, not over the step's drain as well.
            *[F.min(F.when(F.col(c) > 0, F.col("t0"))).alias(f"{c}_t0") for c in COUNTERS],
            *[F.max(F.when(F.col(c) > 0, F.col("t1"))).alias(f"{c}_t1") for c in COUNTERS],
        )
        partial.extend(r.asDict() for r in agg.collect())

    query = m.writeStream.foreachBatch(batch).queryName(name).trigger(availableNow=True).start()
    try:
        query.awaitTermination()
    finally:
        query.stop()
    return _merge(partial)


def _merge(partial: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Merge per-batch sums of one (step, role) into one row."""
    out: dict[tuple[int, str], dict[str, Any]] = {}
    for r in partial:
        k = (int(r["step"]), str(r["role"]))
        if k not in out:
            out[k] = {**r, "step": k[0], "role": k[1], "rate": float(r["rate"])}
            continue
        agg = out[k]
        for key in ("t0", *(f"{c}_t0" for c in COUNTERS)):
            agg[key] = _pick(min, agg[key], r[key])
        for key in ("t1", *(f"{c}_t1" for c in COUNTERS)):
            agg[key] = _pick(max, agg[key], r[key])
        for key in ("reports", *COUNTERS):
            agg[key] += r[key]
    return [out[k] for k in sorted(out)]


def _pick(f: Callable[[int, int], int], a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    return a if b is None else f(a, b)


def _per_s(row: Mapping[str, Any], counter: str) -> float | None:
    t0, t1 = row.get(f"{counter}_t0"), row.get(f"{counter}_t1")
    if not row.get(counter) or t0 is None or t1 is None or t1 <= t0:
        return None
    return float(row[counter]) * 1e9 / float(t1 - t0)


#: rates() keys: (role, counter) of each per-second figure.
RATES: Final = {
    "orders_sent_per_s": ("gateway", "orders_sent"),
    "orders_received_per_s": ("engine", "orders"),
    "confirms_per_s": ("engine", "conf"),
    "trades_per_s": ("engine", "trade"),
    "quotes_per_s": ("engine", "quote"),
    "confirms_back_per_s": ("gateway", "confirms"),
}


def rates(stats: Iterable[Mapping[str, Any]]) -> dict[int, dict[str, float]]:
    """Per step: ``rate`` (offered), the per-second figures of :data:`RATES`
    (each counter over its own active intervals: 1 interval of error at most)
    and ``avg_message_bytes``, the weighted average size of every order and
    every event the engine handled."""
    by: dict[int, dict[str, Mapping[str, Any]]] = {}
    for r in stats:
        by.setdefault(int(r["step"]), {})[str(r["role"])] = r
    out: dict[int, dict[str, float]] = {}
    for step, roles in sorted(by.items()):
        row: dict[str, float] = {"rate": float(next(iter(roles.values()))["rate"])}
        for name, (role, counter) in RATES.items():
            value = _per_s(roles[role], counter) if role in roles else None
            if value is not None:
                row[name] = value
        en = roles.get("engine")
        if en is not None:
            msgs = en["orders"] + en["conf"] + en["trade"] + en["quote"]
            if msgs:
                row["avg_message_bytes"] = (en["bytes_in"] + en["bytes_out"]) / msgs
        out[step] = row
    return out
