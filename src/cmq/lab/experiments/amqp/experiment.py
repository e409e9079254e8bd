"""The AMQP paper's five benchmarks as lab experiments: the cmq broker beside RabbitMQ.

``amqp-de-spsc`` [de-spsc], ``amqp-de-mpmc`` [de-mpmc], ``amqp-de-pp``
[de-pp], ``amqp-fe-spmc`` [fe-spmc] and ``amqp-te-spsc`` [te-spsc]: one
experiment each (:mod:`cmq.lab.experiments.amqp.plans` says what each measures and
records, :mod:`cmq.lab.experiments.amqp.report` how the report shows and judges it).
Publishers, consumers and the broker run in separate processes.

Systems: ``cmq`` (a ``cmq broker`` started for the experiment) always,
``cmq-pika`` (that broker's AMQP listener, through the pika code that drives
RabbitMQ) with ``rabbitmq``, and ``rabbitmq`` when it is among the lab's systems (``--systems``; the quick
and full profiles have it) and its server answers; otherwise RabbitMQ is
written as a skipped run with the reason. Scale comes from
:data:`cmq.lab.experiments.amqp.plans.AMQP_PROFILES` by the lab profile's name;
``--sizes`` sets the DE-SPSC and DE-PP sizes.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Final

from cmq.lab.experiments import Context, LabExperiment, register
from cmq.lab.experiments._record import RunBook
from cmq.lab.experiments.amqp import durable
from cmq.lab.experiments.amqp.plans import MEASURES, amqp_profile, measure, points
from cmq.lab.experiments.amqp.report import register_reports
from cmq.lab.experiments.amqp.transport import rabbit_available

__all__ = ["EXPERIMENTS", "systems_for"]


def systems_for(ctx: Context, book: RunBook | None = None) -> list[str]:
    """``cmq``, plus ``rabbitmq`` when asked for and reachable (else a skipped run in
    ``book``) and then also ``cmq-pika`` (the cmq broker through pika) when pika is there."""
    systems = ["cmq"]
    if "rabbitmq" in ctx.systems:
        if importlib.util.find_spec("pika") is not None:
            systems.append("cmq-pika")  # the cmq broker behind RabbitMQ's client
        why = rabbit_available()
        if why is None:
            systems.append("rabbitmq")
        elif book is not None:
            book.skip("rabbitmq", why)
            ctx.say(f"amqp: skipping rabbitmq: {why}")
    return systems


def _experiment(bench: str, order: int, title: str) -> LabExperiment:
    exp_id = f"amqp-{bench}"

    def steps(ctx: Context) -> int:
        n = 3 if "rabbitmq" in ctx.systems else 1
        p = amqp_profile(ctx.profile)
        return n * len(points(bench, p)) * p.repeat

    def run(ctx: Context) -> None:
        p = amqp_profile(ctx.profile)
        with RunBook(ctx.out, exp_id, pin="none", params={"profile": p.name}) as book:
            measure(bench, exp_id, book, systems_for(ctx, book), p, step=ctx.step, say=ctx.say)

    run_fn: Callable[[Context], None] = run
    return register(
        LabExperiment(
            id=exp_id, title=title, aliases=(bench,), order=order, run=run_fn, steps=steps,
            multi_system=False, runs=lambda lab: amqp_profile(lab).repeat,
        )
    )  # fmt: skip


_TITLES: Final = {
    "de-spsc": "AMQP DE-SPSC: direct exchange, 1 publisher, 1 consumer, 1 B .. 1 MB",
    "de-mpmc": "AMQP DE-MPMC: 1 .. 8 publisher/consumer pairs, broker CPU",
    "de-pp": "AMQP DE-PP: ping-pong latency through the broker",
    "fe-spmc": "AMQP FE-SPMC: fanout to 1 .. 32 consumers",
    "te-spsc": "AMQP TE-SPSC: topic exchange, 1 .. 1024 non-matching bindings",
}

def _durable_experiment() -> LabExperiment:
    """``amqp-durable`` [durable]: see :mod:`cmq.lab.experiments.amqp.durable`."""

    def plan(ctx: Context) -> tuple[float, int]:
        return durable.PROFILES.get(getattr(ctx.profile, "name", ""), durable.PROFILES["quick"])

    def steps(ctx: Context) -> int:
        systems, _ = durable.systems_for(ctx.systems)
        return plan(ctx)[1] * (len(systems) + 1)

    def run(ctx: Context) -> None:
        seconds, repeat = plan(ctx)
        systems, skipped = durable.systems_for(ctx.systems)
        with RunBook(ctx.out, durable.EXPERIMENT_ID, pin="none", params={"seconds": seconds}) as book:
            for system, why in skipped.items():
                book.skip(system, why)
                ctx.say(f"{durable.EXPERIMENT_ID}: skipping {system}: {why}")
            durable.measure_durable(book, systems, seconds=seconds, repeat=repeat, step=ctx.step, say=ctx.say)

    return register(
        LabExperiment(id=durable.EXPERIMENT_ID, title="AMQP durable: confirmed persistent publishes, kill -9",
                      aliases=("durable",), order=66, run=run, steps=steps, multi_system=False,
                      runs=lambda p: durable.PROFILES.get(p.name.split(" ")[0], durable.PROFILES["quick"])[1])
    )  # fmt: skip


EXPERIMENTS: Final = (
    *(_experiment(bench, 60 + k, _TITLES[bench]) for k, bench in enumerate(MEASURES)),
    _durable_experiment(),
)
register_reports()
durable.register_report()
