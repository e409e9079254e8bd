"""Tuning sweep: cmq's throughput and latency over qthresh x timeout.

The CMQ paper tuned its two knobs and found qthresh 512 B with a 200 ms
timeout best. For every cell of ``profile.tuning_qthresh`` x
``profile.tuning_timeouts`` this runs, with both endpoints configured so
(:class:`cmq.QueueConfig` ``qthresh`` and ``timeout``):

- throughput: ``profile.tuning_count`` messages of ``profile.tuning_size``
  bytes as fast as ``push`` returns (totals, scenario ``"throughput"``);
- latency: ping-ping of ``profile.tuning_rt_count`` messages with
  ``profile.window`` in flight, so batches can form (records, scenario
  ``"latency"``).

Both with ``params`` ``{"qthresh": bytes, "timeout": seconds}``, cmq only.
cmq sends a message to an idle destination at once (the idle rule), so
unlike the paper's CMQ the timeout only bounds how long a message can wait
when pushes come faster than the link drains: the surface shows how much
that still matters.
"""

from __future__ import annotations

import itertools
from typing import Final

from cmq.lab import runner
from cmq.lab.experiments import Context, LabExperiment, register
from cmq.lab.experiments._record import RunBook

__all__ = ["EXPERIMENT", "TIMEOUT"]

#: Round-trip timeout of the latency cells: above the largest batch timeout
#: of the sweep (200 ms), so a batch that waits its full timeout still
#: counts as delivered, not lost.
TIMEOUT: Final = 1.0


def _cells(ctx: Context) -> list[tuple[int, float]]:
    p = ctx.profile
    return list(itertools.product(p.tuning_qthresh, p.tuning_timeouts))


def _steps(ctx: Context) -> int:
    return 2 * len(_cells(ctx))


def _run(ctx: Context) -> None:
    p = ctx.profile
    size = p.tuning_size
    run_params = {
        "size": size,
        "count": p.tuning_count,
        "rt_count": p.tuning_rt_count,
        "window": p.window,
    }
    with RunBook(ctx.out, EXPERIMENT.id, pin=ctx.pin, params=run_params) as book:
        for qthresh, timeout in _cells(ctx):
            params = {"qthresh": qthresh, "timeout": timeout}
            options = {"cmq": params}
            label = f"qthresh {qthresh} B, timeout {timeout * 1e3:g} ms"
            book.add(
                runner.run_throughput(
                    ["cmq"], [size], count=p.tuning_count, pin=ctx.pin, options=options
                ),
                params=params,
            )
            ctx.step(f"throughput, {label}")
            book.add(
                runner.run_pingping(
                    ["cmq"], [size], count=p.tuning_rt_count, window=p.window, timeout=TIMEOUT,
                    pin=ctx.pin, options=options,
                ),
                scenario="latency",
                params=params,
            )  # fmt: skip
            ctx.step(f"latency, {label}")


EXPERIMENT: Final = register(
    LabExperiment(
        id="tuning",
        title="Tuning: cmq over qthresh x timeout",
        order=30,
        run=_run,
        steps=_steps,
        multi_system=False,
    )
)
