"""The AMQP paper's stock-exchange simulation as a lab experiment (``amqp-stockex`` [stockex]).

Gateway, matching engine and broker in processes of their own
(:mod:`cmq.lab.experiments.stockex.run`), the statistics reporter a Spark Structured
Streaming query in the lab's process; records and report section in
:mod:`cmq.lab.experiments.stockex.report`. The rates come from :data:`PROFILES` by the
lab profile's name: the paper's 1000 .. 8000 orders/s, then upward until
a rate is not kept. The tiny profile (tests) sums the reporter's messages
in Python instead of starting Spark.
"""

from __future__ import annotations

import dataclasses
from typing import Final

from cmq.lab.experiments import Context, LabExperiment, Profile, register
from cmq.lab.experiments._record import RunBook
from cmq.lab.experiments.stockex.report import (
    EXPERIMENT_ID,
    RATE_TARGET,
    register_report,
    write_records,
)
from cmq.lab.experiments.stockex.run import PAPER_RATES, SimConfig, StepResult, run_simulation

__all__ = ["EXPERIMENT", "PROFILES", "sim_config"]

#: The target rate (32,000 orders/s) three times in a row: the target's
#: verdict is drawn from the spread between those steps.
_TARGET_RUNS: Final = (RATE_TARGET,) * 3

PROFILES: Final[dict[str, SimConfig]] = {
    "full": SimConfig(
        rates=(*PAPER_RATES, 12000, 16000, 24000, *_TARGET_RUNS, 48000, 64000, 96000, 128000, 192000),
        seconds=5.0,
        drain=3.0,
    ),
    # The paper's rates, then up by doubling to 128,000 with the target
    # rate repeated (each step 1 s: 32,000 orders at the target rate).
    "quick": SimConfig(
        rates=(*PAPER_RATES, 16000, *_TARGET_RUNS, 64000, 128000),
        seconds=1.0,
        drain=2.0,
    ),
    "tiny": SimConfig(rates=(200, 400), seconds=0.5, drain=2.0, reporter="python"),
}


def sim_config(ctx: Context) -> SimConfig:
    """The simulation's config for the lab profile of ``ctx``."""
    return _config(ctx.profile)


def _config(profile: Profile) -> SimConfig:
    return PROFILES.get(str(profile.name).split(" ")[0], PROFILES["quick"])


def _steps(ctx: Context) -> int:
    return len(sim_config(ctx).rates)


def _run(ctx: Context) -> None:
    config = sim_config(ctx)
    with RunBook(ctx.out, EXPERIMENT_ID, pin="none",
                 params={"seconds": config.seconds, "rates": list(config.rates), "no_ack": config.no_ack}) as book:  # fmt: skip

        def step(s: StepResult) -> None:
            ctx.step(f"{s.rate:,} orders/s {'kept' if s.kept else 'not kept'}")

        spark = None
        if config.reporter == "spark":
            # The lab's own start-up: the JVM's chatter goes to OUT/spark.log,
            # and the report later reuses this session.
            from cmq.lab.orchestrate import _start_spark

            try:
                spark = _start_spark(ctx.out, None)
            except Exception as exc:  # noqa: BLE001 - the simulation still runs; the report says so
                why = f"no Spark for the statistics reporter ({type(exc).__name__}: {exc})"
                book.problem("cmq", f"{why}; its sums were computed in Python")
                ctx.say(f"{EXPERIMENT_ID}: {why}")
                config = dataclasses.replace(config, reporter="python")
        result = run_simulation(config, step=step, spark=spark)
        write_records(book, result)
        if result.spool.get("dropped"):
            book.problem(
                "cmq",
                f"the reporter's endpoint dropped measurement messages: {result.spool['dropped']}",
            )
        top = max((s.rate for s in result.steps if s.kept), default=0)
        ctx.say(f"{EXPERIMENT_ID}: kept up to {top:,} orders/s ({len(result.steps)} rates tried)")


EXPERIMENT: Final = register(
    LabExperiment(id=EXPERIMENT_ID, title="AMQP stock-exchange simulation: orders/s until the rate is not kept",
                  aliases=("stockex",), order=65, run=_run, steps=_steps, multi_system=False,
                  runs=lambda p: _config(p).rates.count(RATE_TARGET))
)  # fmt: skip
register_report()
