"""Scalability: push cost against the number of destinations, and receiver memory over time.

Push cost: the sans-IO micro-benchmark of cmq's batcher
(:func:`cmq.lab.runner.run_destinations`) pushes the same number of
messages round-robin to 1 ... ``max(profile.destinations)`` distinct
destinations, ``profile.push_repeats`` times, in a worker process of its
own (a million destinations take a few hundred MB, which should not stay
in the orchestrator). Samples ``metric="push_ns"``, ``x`` = destinations,
one per repeat.

Receiver memory: a cmq receiver drains a sender pushing 64-byte messages as
fast as it can for ``profile.rss_seconds`` (minutes in ``--full``), a
throughput run of :func:`cmq.lab.runner.run_throughput` whose runner reads
the receiver's resident set size from outside every
``profile.rss_interval`` seconds. Samples ``metric="rss_bytes"`` with
``t_ns``; the run's totals with scenario ``"memory"``. The paper reports an 80 KB Haskell heap over five hours;
we measure a whole Python process and test that it stops growing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from cmq.lab import runner
from cmq.lab.experiments import Context, LabExperiment, register
from cmq.lab.experiments._proc import GRACE as _GRACE
from cmq.lab.experiments._proc import Child, WorkerError
from cmq.lab.experiments._record import RunBook

__all__ = ["EXPERIMENT", "RSS_SIZE"]

#: Message size of the memory run: small messages stress per-message state.
RSS_SIZE: Final = 64


def _steps(ctx: Context) -> int:
    p = ctx.profile
    return p.push_repeats * len(p.destinations) + 1


def _push_cost(ctx: Context, book: RunBook) -> None:
    p = ctx.profile
    params = {"destinations": list(p.destinations), "per_destination": p.per_destination, "size": 4,
              "repeat": p.push_repeats}  # fmt: skip
    child = Child("destinations", params)
    try:
        # 10 µs per message is far above the batcher's cost on any machine.
        budget = (
            _GRACE
            + 1e-5 * max(p.destinations) * p.per_destination * len(p.destinations) * p.push_repeats
        )
        w = book.writer("cmq")
        for tag, value in child.lines(budget):
            if tag == "SAMPLE":
                w.sample(
                    scenario="push",
                    metric="push_ns",
                    x=float(value["destinations"]),
                    value=float(value["ns_per_msg"]),
                    params={"per_destination": p.per_destination, "size": value["size"]},
                )
                ctx.step(f"push cost, {value['destinations']:,} destinations")
    finally:
        child.stop()


def _memory(ctx: Context, book: RunBook) -> None:
    p = ctx.profile
    results = runner.run_throughput(
        ["cmq"], [RSS_SIZE], duration=p.rss_seconds, rss_interval=p.rss_interval, pin=ctx.pin
    )
    params = {"size": RSS_SIZE, "seconds": p.rss_seconds}
    # Totals (what went through), skips and failures, as every run's.
    book.add(results, scenario="memory", params=params)
    for r in results:
        if isinstance(r, runner.ThroughputResult):
            w = book.writer("cmq")
            for t_ns, rss in r.receiver_rss:
                w.sample(scenario="memory", metric="rss_bytes", t_ns=t_ns, value=float(rss),
                         params=params)  # fmt: skip
            ctx.say(
                f"scalability: the memory run's receiver got {r.delivered:,} of {r.sent:,} "
                f"messages in {p.rss_seconds:g} s; {len(r.receiver_rss)} RSS samples"
            )
    ctx.step("receiver memory")


def _run(ctx: Context) -> None:
    with RunBook(ctx.out, EXPERIMENT.id, pin="none") as book:
        for part in (_push_cost, _memory):
            try:
                part(ctx, book)
            except WorkerError as exc:
                book.problem("cmq", str(exc))
                ctx.say(f"scalability: {exc}")


def destinations_label(values: Sequence[int]) -> str:
    """``1 .. 1,000,000`` for the summary."""
    return f"{min(values):,} .. {max(values):,}"


EXPERIMENT: Final = register(
    LabExperiment(
        id="scalability",
        title="Scalability: push cost against destinations, receiver memory",
        aliases=("scale", "memory"),
        order=40,
        run=_run,
        steps=_steps,
        multi_system=False,
    )
)
