"""Scalability: push cost against the number of destinations, and receiver memory over time.

Push cost: the sans-IO micro-benchmark of cmq's batcher
(:func:`cmq.lab.runner.run_destinations`) pushes the same number of
messages round-robin to 1 ... ``max(profile.destinations)`` distinct
destinations, ``profile.push_repeats`` times, in a worker process of its
own (a million destinations take a few hundred MB, which should not stay
in the orchestrator). Samples ``metric="push_ns"``, ``x`` = destinations,
one per repeat.

Receiver memory: a cmq receiver drains a sender pushing 64-byte messages as
fast as it can for ``profile.rss_seconds`` (minutes in ``--full``), and
samples its own resident set size every ``profile.rss_interval`` seconds.
Samples ``metric="rss_bytes"`` (and ``"delivered"``, the running count, and
``"queued"``, the receiver's backlog: a stall leaves one, and Python keeps
the memory it took), with ``t_ns``. The paper reports an 80 KB Haskell heap over five hours;
we measure a whole Python process and test that it stops growing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from cmq.lab.experiments import Context, LabExperiment, register
from cmq.lab.experiments._proc import GRACE as _GRACE
from cmq.lab.experiments._proc import READY_TIMEOUT as _READY_TIMEOUT
from cmq.lab.experiments._proc import Child, WorkerError
from cmq.lab.experiments._record import RunBook

__all__ = ["EXPERIMENT", "RSS_SIZE"]

#: Message size of the memory run: small messages stress per-message state.
RSS_SIZE: Final = 64


def _steps(ctx: Context) -> int:
    p = ctx.profile
    # The memory run samples at the start, every interval, and once at the end.
    return p.push_repeats * len(p.destinations) + round(p.rss_seconds / p.rss_interval) + 2


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
    receiver = Child(
        "rss-receiver",
        {
            "seconds": p.rss_seconds,
            "interval": p.rss_interval,
            "startup": _READY_TIMEOUT,
            "idle": 5.0,
        },
    )
    sender: Child | None = None
    try:
        ready = dict(next(iter(receiver.lines(_READY_TIMEOUT)))[1])
        sender = Child("rss-sender", {"peer": ready, "seconds": p.rss_seconds, "size": RSS_SIZE})
        w = book.writer("cmq")
        params = {"size": RSS_SIZE, "seconds": p.rss_seconds}
        result: dict[str, Any] = {}
        samples = 0
        for tag, value in receiver.lines(_READY_TIMEOUT + p.rss_seconds + _GRACE):
            if tag == "SAMPLE":
                w.sample(scenario="memory", metric="rss_bytes", t_ns=int(value["t_ns"]),
                         value=float(value["rss_bytes"]), params=params)  # fmt: skip
                for metric in ("delivered", "queued"):
                    w.sample(scenario="memory", metric=metric, t_ns=int(value["t_ns"]),
                             value=float(value.get(metric, 0)), params=params)  # fmt: skip
                samples += 1
                ctx.step(f"receiver memory, {samples * p.rss_interval:.0f} s")
            elif tag == "RESULT":
                result = value
        sent = dict(next(iter(sender.lines(_GRACE)))[1])
        if not result.get("delivered"):
            book.problem("cmq", f"memory run: the receiver got nothing ({result.get('stopped')})")
        else:
            ctx.say(
                f"scalability: the memory run's receiver drained {result['delivered']:,} messages "
                f"in {p.rss_seconds:g} s (the sender pushed {sent.get('sent', 0):,}; largest "
                f"backlog seen {result.get('peak_queued', 0):,} messages)"
            )
    finally:
        for child in (sender, receiver):
            if child is not None:
                child.stop()


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
