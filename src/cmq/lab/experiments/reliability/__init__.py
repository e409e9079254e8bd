"""Reliable delivery under packet loss: delivered, throughput and round trips per delivery mode.

cmq's delivery targets, measured on the lab's lossy
network namespaces: at loss p = 0, 1, 1.4, 3 and 10 % on both hosts, for
``delivery`` = reliable, unordered and best-effort,

1. throughput: a sender streams 512 B messages to a receiver; delivered,
   duplicates, order violations and msgs/s (:mod:`.measure`, with the two
   programs of :mod:`._peer`);
2. round trips: 512 B ping-pong, p50 and p99, beside TCP and ZeroMQ on the
   same rig (NATS's broker is out of the namespaces' reach: skipped, with
   Figure 6's reason);
3. on loopback (:mod:`.loopback`): a receiver consuming a tenth of the
   sender's rate, and a receiver killed and restarted mid-stream.

The folder holds the whole experiment: :mod:`.measure` runs it and writes
records, :mod:`.claims` holds the targets and the rules that judge them,
:mod:`.section` draws the report's section. Importing the package
registers it with the lab (``cmq lab --only reliability``) and with the
report.

The runs under loss need root, ``ip`` and ``iptables``; without them they
are skipped with one line saying so (:func:`cmq.lab.netns.unavailable`)
and the loopback runs still run.
"""

from __future__ import annotations

from typing import Final

from cmq.lab.experiments import Context, LabExperiment, register, register_page
from cmq.lab.experiments.reliability import measure
from cmq.lab.experiments.reliability.claims import CLAIMS, EXPERIMENT_ID
from cmq.lab.experiments.reliability.section import render
from cmq.pipeline import report

__all__ = ["EXPERIMENT", "REPORT", "unavailable"]


def unavailable(_ctx: Context) -> str | None:
    """Never: without lossy namespaces (root, ``ip``, ``iptables``) the runs
    under loss are skipped with one line (:func:`.measure.run`) and the
    loopback ones still run."""
    return None


EXPERIMENT: Final = register(
    LabExperiment(
        id=EXPERIMENT_ID,
        title="Delivery modes under 0-10 % loss: delivered, throughput, round trips",
        aliases=("delivery",),
        order=25,
        run=measure.run,
        steps=measure.steps,
        unavailable=unavailable,
        multi_system=False,
        runs=measure.fewest_runs,
    )
)

REPORT: Final = register_page(
    report.Experiment(
        id=EXPERIMENT_ID,
        title="Reliable delivery under 0-10 % packet loss, by delivery mode",
        paper="cmq's own delivery targets, stated before the measurement",
        order=25,
        claims=CLAIMS,
        render=render,
    ),
    replace=True,
)
