"""CMQ paper, Figure 5: ping-pong and ping-ping round trips against message size.

Ping-pong is the Intel MPI Benchmarks' pattern (the next message goes after
the reply), ping-ping the asynchronous one (up to ``profile.window``
messages in flight, the next before the reply). Every system of
``ctx.systems`` at every size of ``profile.rt_sizes``, ``profile.rt_count``
round trips each, on loopback. All systems of one scenario go through one
runner call, so their runs are interleaved (fair on a shared machine).

Records: one row per round trip (``round_trip=True``), scenario
``"pingpong"`` or ``"pingping"``; a round trip whose reply did not come
within :data:`TIMEOUT` is a row with ``recv_ns`` null.
"""

from __future__ import annotations

from typing import Final

from cmq.lab import runner
from cmq.lab.experiments import Context, LabExperiment, register
from cmq.lab.experiments._record import RunBook, step_progress

__all__ = ["EXPERIMENT", "TIMEOUT"]

#: A reply later than this is a lost round trip. Loopback replies take
#: microseconds to a few milliseconds (brokers); 1 s is far above any of
#: them yet bounds the wait for a datagram that was dropped.
TIMEOUT: Final = 1.0


def _steps(ctx: Context) -> int:
    return 2 * len(ctx.systems) * len(ctx.profile.rt_sizes)


def _run(ctx: Context) -> None:
    p = ctx.profile
    with RunBook(
        ctx.out, EXPERIMENT.id, pin=ctx.pin, params={"count": p.rt_count, "timeout": TIMEOUT}
    ) as book:
        progress = step_progress(ctx.step)
        book.add(
            runner.run_pingpong(
                ctx.systems,
                p.rt_sizes,
                count=p.rt_count,
                pin=ctx.pin,
                timeout=TIMEOUT,
                progress=progress,
            )
        )
        progress = step_progress(ctx.step)
        book.add(
            runner.run_pingping(
                ctx.systems,
                p.rt_sizes,
                count=p.rt_count,
                pin=ctx.pin,
                timeout=TIMEOUT,
                window=p.window,
                progress=progress,
            ),
            params={"window": p.window},
        )


EXPERIMENT: Final = register(
    LabExperiment(
        id="cmq-fig5",
        title="CMQ Figure 5: ping-pong and ping-ping against size",
        aliases=("fig5",),
        order=10,
        run=_run,
        steps=_steps,
    )
)
