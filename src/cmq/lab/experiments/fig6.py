"""CMQ paper, Figure 6: Figure 5's round trips under injected packet loss.

Injected exactly as the paper did: every (system, size, scenario) gets a
fresh pair of network namespaces (:class:`cmq.lab.netns.HostPair`) with
``iptables -A INPUT -m statistic --mode random --probability P -j DROP`` on
both hosts; the echo server runs on host ``b``, the client on host ``a``.
The lossless baseline runs first in the same namespaces with the rule at
probability 0 (the same path through netfilter), then the rule is set to P
and TCP's cached path metrics are flushed, so no TCP state (congestion
window, RTO estimate) carries from one run to the next. The whole is
repeated ``profile.loss_runs`` times; rows carry ``{"loss": p}`` in their
params, so the baseline and the lossy runs stay apart. The kernel reassembles IP
fragments before the INPUT chain, so the rule drops whole datagrams (a
16 KB cmq or UDP datagram is one chance of loss, not twelve), as it did in
the paper's setup.

Lost round trips are counted, not hidden. How long a client waits for a
reply depends on the transport: a datagram system's lost message never
comes, so waiting longer than :data:`DATAGRAM_TIMEOUT` only slows the run; a
stream system's reply always comes, after TCP retransmits (200 ms minimum
RTO, doubling), so it gets :data:`STREAM_TIMEOUT` and its slow replies are
measured rather than cut off.

The brokers (nats, rabbitmq) run in the host's network namespace, which the
lossy namespaces cannot reach: they are skipped here, with that reason.

Needs root, ``ip`` and ``iptables``; without them the experiment is skipped
with the reason (:func:`cmq.lab.netns.unavailable`).
"""

from __future__ import annotations

from typing import Final

from cmq._errors import ConfigError
from cmq.lab import netns, runner
from cmq.lab import systems as lab_systems
from cmq.lab.experiments import Context, LabExperiment, register
from cmq.lab.experiments._record import RunBook

__all__ = ["BROKERS", "DATAGRAM_TIMEOUT", "EXPERIMENT", "STREAM_TIMEOUT"]

#: Round-trip timeout of datagram systems: far above a lossless round trip
#: (well under 10 ms here), short enough that 1000 round trips with 3 % lost
#: add only seconds.
DATAGRAM_TIMEOUT: Final = 0.2
#: Round-trip timeout of stream systems: room for four retransmissions
#: (0.2 + 0.4 + 0.8 + 1.6 s) of one segment.
STREAM_TIMEOUT: Final = 5.0
#: Systems whose server is a broker outside the namespaces.
BROKERS: Final = frozenset({"nats", "rabbitmq"})
BROKER_REASON: Final = (
    "its broker runs in the host's network namespace, out of reach of the lossy "
    "namespaces: not measured under loss"
)
SCENARIOS: Final = ("pingpong", "pingping")


def _unavailable(_ctx: Context) -> str | None:
    why = netns.unavailable(loss=True)
    return None if why is None else f"{why}; the lossy experiment cmq-fig6 is skipped"


def _measured(ctx: Context) -> list[str]:
    return [s for s in ctx.systems if s not in BROKERS]


def _steps(ctx: Context) -> int:
    p = ctx.profile
    return 2 * p.loss_runs * len(SCENARIOS) * len(_measured(ctx)) * len(p.loss_sizes)


def _timeout(system: str) -> float:
    return DATAGRAM_TIMEOUT if lab_systems.load(system).DATAGRAM else STREAM_TIMEOUT


def _one(ctx: Context, hosts: netns.HostPair, system: str, size: int, scenario: str) -> list[runner.Result]:
    """One run in ``hosts``: server on host b, client on host a."""
    p = ctx.profile
    if scenario == "pingpong":
        return runner.run_pingpong(
            [system],
            [size],
            count=p.loss_count,
            pin=ctx.pin,
            timeout=_timeout(system),
            server_prefix=hosts.command("b"),
            client_prefix=hosts.command("a"),
            bind=hosts.addr_b,
        )
    return runner.run_pingping(
        [system],
        [size],
        count=p.loss_count,
        pin=ctx.pin,
        timeout=_timeout(system),
        window=p.window,
        server_prefix=hosts.command("b"),
        client_prefix=hosts.command("a"),
        bind=hosts.addr_b,
    )


def _run(ctx: Context) -> None:
    p = ctx.profile
    params = {"count": p.loss_count}
    usable: list[str] = []
    with RunBook(ctx.out, EXPERIMENT.id, pin=ctx.pin, loss=ctx.loss, params=params) as book:
        for system in ctx.systems:
            if system in BROKERS:
                book.skip(system, BROKER_REASON)
                continue
            # A system that is missing here is skipped once, not once per run.
            why = lab_systems.load(system).available()
            if why is not None:
                book.skip(system, why)
                for _ in range(2 * p.loss_runs * len(SCENARIOS) * len(p.loss_sizes)):
                    ctx.step(f"{system} skipped")
                continue
            usable.append(system)
    # Each round is a run (a book, so a run id) per system and loss: the
    # verdicts are drawn from the spread between rounds. Within a round,
    # each (size, scenario) visits every system, in an order that rotates,
    # and each visit measures the lossless baseline, then the lossy run, in
    # the same fresh namespaces (rule at 0, then at the loss).
    turn = 0
    for _ in range(p.loss_runs):
        with (
            RunBook(ctx.out, EXPERIMENT.id, pin=ctx.pin, loss=0.0, params=params) as base,
            RunBook(ctx.out, EXPERIMENT.id, pin=ctx.pin, loss=ctx.loss, params=params) as lossy,
        ):
            for system in usable:
                base.open(system, params={"timeout": _timeout(system)})
                lossy.open(system, params={"timeout": _timeout(system)})
            for size in p.loss_sizes:
                for scenario in SCENARIOS:
                    k = turn % len(usable) if usable else 0
                    turn += 1
                    for system in usable[k:] + usable[:k]:
                        extra = {"window": p.window} if scenario == "pingping" else {}
                        try:
                            with netns.HostPair(loss=0.0, rule=True) as hosts:
                                results = _one(ctx, hosts, system, size, scenario)
                                base.add(results, params={**extra, "loss": 0.0})
                                ctx.step(f"{scenario} {system} {size} B, no loss")
                                hosts.set_loss(ctx.loss)
                                results = _one(ctx, hosts, system, size, scenario)
                                lossy.add(results, params={**extra, "loss": ctx.loss})
                                ctx.step(f"{scenario} {system} {size} B, loss {ctx.loss:g}")
                        except ConfigError as exc:
                            lossy.problem(system, f"{scenario} {size} B: network namespaces: {exc}")


EXPERIMENT: Final = register(
    LabExperiment(
        id="cmq-fig6",
        title="CMQ Figure 6: round trips under packet loss",
        aliases=("fig6", "loss"),
        order=20,
        run=_run,
        steps=_steps,
        unavailable=_unavailable,
    )
)
