"""CMQ paper, Figure 5: ping-pong and ping-ping round trips against message size.

Ping-pong is the Intel MPI Benchmarks' pattern (the next message goes after
the reply), ping-ping the asynchronous one (up to ``profile.window``
messages in flight, the next before the reply). Every system of
``ctx.systems`` at every size of ``profile.rt_sizes``, ``profile.rt_count``
round trips each, on loopback. All systems of one scenario go through one
runner call, so their runs are interleaved (fair on a shared machine).

The two systems the paper compares (:data:`COMPARED`) get ``profile.rt_runs``
runs of every cell, each a fresh process pair, alternated between them; the
others one run each.

Records: one row per round trip (``round_trip=True``), scenario
``"pingpong"`` or ``"pingping"``; a round trip whose reply did not come
within :data:`TIMEOUT` is a row with ``recv_ns`` null.
"""

from __future__ import annotations

from typing import Final

from cmq.lab import runner
from cmq.lab import systems as lab_systems
from cmq.lab.experiments import Context, LabExperiment, register
from cmq.lab.experiments._record import RunBook, step_progress

__all__ = ["COMPARED", "EXPERIMENT", "TIMEOUT"]

#: A reply later than this is a lost round trip. Loopback replies take
#: microseconds to a few milliseconds (brokers); 1 s is far above any of
#: them yet bounds the wait for a datagram that was dropped.
TIMEOUT: Final = 1.0


#: The two systems Figure 5's claim compares: measured ``rt_runs`` times.
COMPARED: Final[tuple[str, ...]] = ("cmq", "msgpack-rpc")


def _compared(ctx: Context) -> list[str]:
    """The compared systems this run has (a missing one was reported by the first pass)."""
    names = [s for s in COMPARED if s in ctx.systems and lab_systems.load(s).available() is None]
    return names if len(names) == len(COMPARED) else []


def _steps(ctx: Context) -> int:
    sizes = len(ctx.profile.rt_sizes)
    extra = (ctx.profile.rt_runs - 1) * len(_compared(ctx))
    return 2 * (len(ctx.systems) + extra) * sizes


def _measure(ctx: Context, book: RunBook, systems: list[str]) -> None:
    """Both scenarios, every size, ``systems`` interleaved: one run each."""
    p = ctx.profile
    progress = step_progress(ctx.step)
    book.add(
        runner.run_pingpong(
            systems, p.rt_sizes, count=p.rt_count, pin=ctx.pin, timeout=TIMEOUT, progress=progress
        )
    )
    progress = step_progress(ctx.step)
    book.add(
        runner.run_pingping(
            systems,
            p.rt_sizes,
            count=p.rt_count,
            pin=ctx.pin,
            timeout=TIMEOUT,
            window=p.window,
            progress=progress,
        ),
        params={"window": p.window},
    )


def _run(ctx: Context) -> None:
    p = ctx.profile
    params = {"count": p.rt_count, "timeout": TIMEOUT}
    # Every system once (the figure), then more runs of the compared pair,
    # alternating between the two, each round a book (so a run id) of its
    # own: the claim's verdict is drawn from the spread between runs (see
    # cmq.pipeline.stats).
    with RunBook(ctx.out, EXPERIMENT.id, pin=ctx.pin, params=params) as book:
        _measure(ctx, book, list(ctx.systems))
    compared = _compared(ctx)
    for _ in range(p.rt_runs - 1 if compared else 0):
        with RunBook(ctx.out, EXPERIMENT.id, pin=ctx.pin, params=params) as book:
            _measure(ctx, book, compared)


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
