"""Run the stock-exchange simulation: broker, engine, gateway, statistics reporter.

Theory of operation
-------------------
:func:`run_simulation` starts a ``cmq broker`` process, declares one direct
exchange with two queues (``orders``: key ``order``, read by the engine;
the gateway's: keys ``conf``, ``trade`` and ``quote``), opens the
statistics reporter's cmq endpoint (a :class:`~cmq.pipeline.source.SpoolReceiver`),
starts the engine and the gateway as processes of their own
(:mod:`cmq.lab.experiments.stockex.roles`) and follows the gateway's rate steps. The
gateway stops after the first rate it could not keep (after ``retries``
further attempts at it). Then the reporter's
query (:mod:`cmq.lab.experiments.stockex.reporter`: Spark Structured Streaming, or the
same sums in Python without Spark) turns the measurement messages into
per-step rates. Everything is torn down on the way out, whatever happened.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Literal

from cmq._errors import ConfigError
from cmq.lab.experiments.amqp._worker import read_stamps
from cmq.lab.experiments.amqp.suite import READY_TIMEOUT, Worker, WorkerError, cmq_broker
from cmq.lab.experiments.stockex import reporter as stats

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["PAPER_RATES", "SimConfig", "SimResult", "StepResult", "WorkerError", "run_simulation"]

#: The paper's rates (orders/s); Qpid began failing at 8000.
PAPER_RATES: Final = (1000, 2000, 4000, 6000, 8000)


@dataclass(frozen=True, kw_only=True)
class SimConfig:
    """One simulation run.

    Raises:
        ConfigError: on construction, for no rates, a rate or duration that
            is not positive, or an unknown reporter.
    """

    rates: tuple[int, ...] = (*PAPER_RATES, 12000, 16000, 24000, 32000, 48000, 64000, 96000,
                              128000, 192000)  # fmt: skip
    """Orders per second of each step, in order; the run stops after the first not kept."""
    seconds: float = 5.0
    """How long the gateway sends at each rate."""
    drain: float = 2.0
    """After a step's last order, how long to wait for the confirmations still out."""
    interval: float = 0.1
    """Seconds between two measurement messages of one role."""
    seed: int = 1
    """The gateway's random orders."""
    retries: int = 1
    """Further attempts at a rate not kept before the sweep stops (a shared
    machine's burst can sink one step the system otherwise keeps)."""
    no_ack: bool = False
    """Engine and gateway consume without acknowledgements (at most once; a
    lost datagram is an unconfirmed order). Off: at least once, as the AMQP
    suite's consumers. Measured here, no_ack costs the broker about a fifth
    less CPU per order."""
    reporter: Literal["spark", "python"] = "spark"
    """The statistics reporter: the Spark streaming query, or its sums in Python."""

    def __post_init__(self) -> None:
        if not self.rates or any(r <= 0 for r in self.rates):
            raise ConfigError("SimConfig.rates must be positive orders/s, at least one")
        if self.retries < 0:
            raise ConfigError("SimConfig.retries must be 0 or more")
        if not (self.seconds > 0 and self.drain > 0 and self.interval > 0):
            raise ConfigError("SimConfig.seconds, drain and interval must be positive")
        if self.reporter not in ("spark", "python"):
            raise ConfigError(
                f"SimConfig.reporter must be 'spark' or 'python', not {self.reporter!r}"
            )


@dataclass
class StepResult:
    """One rate step, as the gateway saw it."""

    step: int
    """Its number in the run (the reporter's key)."""
    attempt: int
    """1, or 2 .. for a rate tried again after it was not kept."""
    rate: int
    sent: int
    confirmed: int
    span: float
    """Seconds from the step's first order to its last confirmation."""
    send_seconds: float
    """Seconds the gateway took to send the step's orders (the rate it kept sending)."""
    kept: bool
    trades: int
    quotes: int
    sent_ns: array[int]
    done_ns: array[int]
    """Confirmation stamp per order, -1 if never confirmed."""

    @classmethod
    def from_line(cls, value: dict[str, Any]) -> StepResult:
        """The step of a gateway's ``STEP`` line (its stamps read from their file)."""
        sent_ns, done_ns = read_stamps(value["stamps"])
        ints = {
            k: int(value[k])
            for k in ("step", "attempt", "rate", "sent", "confirmed", "trades", "quotes")
        }
        return cls(**ints, span=float(value["span"]), send_seconds=float(value["send_seconds"]),
                   kept=bool(value["kept"]), sent_ns=sent_ns, done_ns=done_ns)  # fmt: skip


@dataclass
class SimResult:
    """What a run measured."""

    steps: list[StepResult] = field(default_factory=list)
    engine: dict[str, Any] = field(default_factory=dict)
    """The engine's totals (orders, events, bytes in and out, bad messages)."""
    stats: list[dict[str, Any]] = field(default_factory=list)
    """The reporter's rows: per (step, role) counters (see :mod:`.reporter`)."""
    reporter: str = ""
    """Which reporter computed ``stats`` (``spark`` or ``python``)."""
    spool: dict[str, Any] = field(default_factory=dict)
    """The reporter endpoint's counters (received, dropped)."""
    cpu: dict[str, float] = field(default_factory=dict)
    """CPU seconds each process used over the whole run (broker, engine, gateway)."""
    seconds: float = 0.0
    """Wall seconds from the gateway's start to its end."""


def _role(role: str, params: dict[str, Any]) -> Worker:
    return Worker([sys.executable, "-m", "cmq.lab.experiments.stockex.roles", role, json.dumps(params)])


def run_simulation(
    config: SimConfig,
    *,
    spark: SparkSession | None = None,
    step: Callable[[StepResult], None] | None = None,
) -> SimResult:
    """Run the simulation (module docstring); ``step`` is called after each rate.

    ``spark`` is the session of the Spark reporter (one is built if needed).

    Raises:
        WorkerError: the broker or a role failed or stopped answering.
    """
    from cmq.pipeline.source import SpoolReceiver
    from cmq.routing import BrokerClient

    result = SimResult()
    tag = f"{os.getpid()}-{time.monotonic_ns() % 10**9}"
    exchange, orders_q, gw_q = f"se-{tag}", f"se-orders-{tag}", f"se-gw-{tag}"
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="cmq-stockex-"))
        broker = cmq_broker()
        stack.callback(broker.close)
        admin = stack.enter_context(BrokerClient(broker.address, timeout=10.0))
        admin.declare_exchange(exchange, "direct")
        admin.declare_queue(orders_q, max_length=1_000_000)
        admin.bind(orders_q, exchange, "order")
        admin.declare_queue(gw_q, max_length=1_000_000)
        for key in ("conf", "trade", "quote"):
            admin.bind(gw_q, exchange, key)
        spool = os.path.join(tmp, "spool")
        rx = stack.enter_context(SpoolReceiver(spool, port=0, codec="raw"))
        report = list(rx.address)
        common = {"broker": broker.address, "exchange": exchange, "interval": config.interval,
                  "report": report, "rates": list(config.rates), "no_ack": config.no_ack}  # fmt: skip
        engine = _role("engine", {**common, "queue": orders_q})
        stack.callback(engine.stop)
        engine.expect("READY", READY_TIMEOUT)
        gateway = _role("gateway", {**common, "queue": gw_q, "seconds": config.seconds,
                                    "drain": config.drain, "seed": config.seed, "retries": config.retries,
                                    "out": os.path.join(tmp, "stamps")})  # fmt: skip
        stack.callback(gateway.stop)
        gateway.expect("READY", READY_TIMEOUT)
        per_step = READY_TIMEOUT + config.seconds + config.drain
        started = time.monotonic()
        while True:
            tag_, value = gateway.line(per_step, ("STEP", "RESULT"))
            if tag_ == "RESULT":
                result.cpu["gateway"] = float(value["cpu_s"])
                reports = int(value["reports"])
                break
            s = StepResult.from_line(value)
            result.steps.append(s)
            if step is not None:
                step(s)
        # The engine ends at the gateway's end marker, after its backlog.
        result.engine = engine.expect("RESULT", READY_TIMEOUT + 30.0)
        result.seconds = time.monotonic() - started
        result.cpu["engine"] = float(result.engine.get("cpu_s", 0.0))
        used = broker.cpu()
        if used is not None:
            result.cpu["broker"] = used
        admin.delete_queue(orders_q)
        admin.delete_queue(gw_q)
        admin.delete_exchange(exchange)
        # Measurement messages are pushed with a flush each; the spool has
        # them once the receiver has written what its queue holds.
        rx.wait_spooled(reports + int(result.engine.get("reports", 0)), timeout=5.0)
        result.spool = rx.stats()
        rx.close()
        if config.reporter == "spark":
            if spark is None:
                from cmq.pipeline.session import SessionConfig, build_session

                spark = build_session(SessionConfig())
            result.stats = stats.spark_stats(spark, spool, name=f"stockex_{tag.replace('-', '_')}")
        else:
            result.stats = stats.python_stats(spool)
        result.reporter = config.reporter
    return result


def main(argv: list[str] | None = None) -> int:
    """``python -m cmq.lab.experiments.stockex.run``: one sweep, a table on stdout (no records)."""
    import argparse

    from cmq.lab.experiments.stockex.reporter import rates as reporter_rates

    parser = argparse.ArgumentParser(prog="python -m cmq.lab.experiments.stockex.run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--rates", default=",".join(map(str, SimConfig().rates)),
                        help="orders/s of each step, comma separated (default: %(default)s)")  # fmt: skip
    parser.add_argument(
        "--seconds", type=float, default=2.0, help="per step (default: %(default)s)"
    )
    parser.add_argument("--no-ack", action="store_true", help="consume at most once")
    parser.add_argument("--reporter", choices=("spark", "python"), default="python")
    args = parser.parse_args(argv)
    config = SimConfig(rates=tuple(int(r) for r in args.rates.split(",")), seconds=args.seconds,
                       no_ack=args.no_ack, reporter=args.reporter)  # fmt: skip

    def show(s: StepResult) -> None:
        lat = sorted(d - t for t, d in zip(s.sent_ns, s.done_ns, strict=True) if d >= 0)
        p50, p99 = (lat[len(lat) // 2] / 1e6, lat[int(len(lat) * 0.99)] / 1e6) if lat else (0, 0)
        print(f"{s.rate:>7,} orders/s attempt {s.attempt}: {'kept' if s.kept else 'NOT kept'}, "
              f"{s.sent - s.confirmed} unconfirmed, completion p50 {p50:.1f} ms p99 {p99:.1f} ms",
              flush=True)  # fmt: skip

    result = run_simulation(config, step=show)
    orders = sum(s.sent for s in result.steps) or 1
    cpu = ", ".join(f"{k} {v / orders * 1e6:.0f}" for k, v in sorted(result.cpu.items()))
    print(f"CPU µs per order: {cpu}")
    for row in reporter_rates(result.stats).values():
        print(f"reporter ({result.reporter}) at {row['rate']:,.0f}/s: "
              + ", ".join(f"{k} {v:,.0f}" for k, v in row.items() if k != "rate"))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
