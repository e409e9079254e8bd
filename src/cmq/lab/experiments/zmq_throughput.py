"""ØMQ v0.1: throughput in messages/s and MB/s against message size, every system.

Each sender sends as fast as its system takes messages for
``profile.tp_duration`` seconds, at every size of ``profile.tp_sizes``
(1 B to 16 KB in the full profile); one runner call for all systems, so the
runs are interleaved. msgs/s counts delivered messages only, from the first
to the last delivery at the receiver (:mod:`cmq.lab.runner`). The report
draws the measured curves beside the ØMQ document's analytic 1 Gb/s limit
(:mod:`cmq.pipeline.claims`).

Records: one totals row per (system, size), scenario ``"throughput"``.
"""

from __future__ import annotations

from typing import Final

from cmq.lab import runner
from cmq.lab.experiments import Context, LabExperiment, register
from cmq.lab.experiments._record import RunBook, step_progress

__all__ = ["EXPERIMENT"]


def _steps(ctx: Context) -> int:
    return len(ctx.systems) * len(ctx.profile.tp_sizes)


def _run(ctx: Context) -> None:
    p = ctx.profile
    with RunBook(ctx.out, EXPERIMENT.id, pin=ctx.pin, params={"duration": p.tp_duration}) as book:
        book.add(
            runner.run_throughput(
                ctx.systems,
                p.tp_sizes,
                duration=p.tp_duration,
                pin=ctx.pin,
                progress=step_progress(ctx.step),
            )
        )


EXPERIMENT: Final = register(
    LabExperiment(
        id="zmq-throughput",
        title="ØMQ v0.1: throughput against size",
        aliases=("zmq", "throughput"),
        order=50,
        run=_run,
        steps=_steps,
    )
)
