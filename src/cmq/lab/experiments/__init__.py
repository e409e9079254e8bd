"""The lab's experiments: one module each, found and run by ``cmq lab``.

Theory of operation
-------------------
This module is the lab's one registry, and :func:`_load` the one place
that imports experiments by name. An experiment is a module of this package
(``fig5``, ``fig6``, ``tuning``, ``scalability``, ``zmq_throughput``,
``bdqs``) or a folder where it needs several files (``reliability/``,
``amqp/``, ``stockex/``). It declares everything about itself there:

- how to measure: one :class:`LabExperiment` (or several), passed to
  :func:`register` at import;
- what the results mean: its part of the report (a
  :class:`cmq.pipeline.report.Experiment`: title, paper, claims with their
  rules and judges, and the function that draws its section), passed to
  :func:`register_page` under the id its records carry in their
  ``experiment`` column.

The pipeline knows no experiment: ``cmq lab`` and ``cmq report`` hand
:func:`cmq.pipeline.report.render_html` the list :func:`pages` returns.

A :class:`LabExperiment` is data plus three functions:

- ``unavailable(ctx)``: ``None``, or one line saying why the whole
  experiment cannot run here (no root for network namespaces) and how to
  make it run. The orchestrator then writes a skipped run per system so the
  report lists it.
- ``steps(ctx)``: how many progress steps ``run`` will take (one per
  measured run, about), for the progress bar's total.
- ``run(ctx)``: measure, writing raw records under ``ctx.out`` with
  :class:`cmq.lab.records.RecordWriter`, advancing ``ctx.step`` as it goes.

A :class:`Profile` says how much to measure: ``quick`` (the default, a few
minutes on a 2-core machine), ``full`` (the papers' scale) and ``tiny``
(tests). Everything an experiment varies comes from its profile, so
``cmq lab --full`` changes scale without changing code.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from cmq._errors import ConfigError
from cmq.lab.systems import SYSTEMS
from cmq.pipeline.report import Experiment as Page

__all__ = [
    "DEFAULT_LOSS",
    "PROFILES",
    "PROFILE_NAMES",
    "Context",
    "LabExperiment",
    "Profile",
    "experiments",
    "get",
    "page",
    "pages",
    "register",
    "register_page",
    "resolve",
    "runs_behind",
]

#: The CMQ paper's loss probability for Figure 6 (1.4 %).
DEFAULT_LOSS: Final = 0.014

#: The CMQ paper's message sizes for Figures 5 and 6.
PAPER_SIZES: Final = (4, 16, 64, 256, 512, 1024, 4096, 16384)


def _check_sizes(name: str, sizes: Sequence[int]) -> None:
    if not sizes:
        raise ConfigError(f"Profile.{name} must not be empty")
    for s in sizes:
        if not isinstance(s, int) or isinstance(s, bool) or s < 1:
            raise ConfigError(f"Profile.{name}: bad size {s!r} (whole bytes, at least 1)")


@dataclass(frozen=True, kw_only=True)
class Profile:
    """How much each experiment measures.

    Raises:
        ConfigError: on construction, for an empty or non-positive size list,
            a count, repeat or duration below its minimum, or an unknown
            system.
    """

    name: str
    """``"quick"``, ``"full"``, ``"tiny"`` or ``"custom"`` (after overrides)."""
    systems: tuple[str, ...] = SYSTEMS
    """Systems the multi-system experiments compare."""
    rt_sizes: tuple[int, ...] = PAPER_SIZES
    """Figure 5: message sizes of ping-pong and ping-ping."""
    rt_count: int = 1000
    """Figure 5: round trips per (system, size, scenario); the paper's 1000."""
    rt_runs: int = 5
    """Figure 5: runs of each (size, scenario) of the two systems its claim
    compares (cmq and MessagePack-RPC), interleaved: the verdict is drawn
    from the spread between runs. The other systems run once (the figure)."""
    window: int = 16
    """Ping-ping: messages in flight."""
    loss_sizes: tuple[int, ...] = PAPER_SIZES
    """Figure 6: message sizes under loss."""
    loss_count: int = 1000
    """Figure 6: round trips per (system, size, scenario)."""
    loss_runs: int = 5
    """Figure 6: rounds, each a lossless baseline then a lossy run of every
    (system, size, scenario) in the same namespaces: the verdicts are drawn
    from the spread between rounds."""
    tuning_size: int = 64
    """Tuning: message size of the sweep (small, so batching matters)."""
    tuning_qthresh: tuple[int, ...] = tuple(64 << k for k in range(11))
    """Tuning: qthresh values in bytes (64 B to 64 KB)."""
    tuning_timeouts: tuple[float, ...] = (0.0001, 0.001, 0.01, 0.05, 0.1, 0.2)
    """Tuning: batch timeouts in seconds (0.1 ms to 200 ms)."""
    tuning_count: int = 1_000_000
    """Tuning: messages per throughput cell (a second or more: shorter runs
    measure start-up noise, not the batching)."""
    tuning_runs: int = 3
    """Tuning: throughput runs of every cell, the cells interleaved in each
    round: the best-cell verdict is drawn from the spread between runs."""
    tuning_rt_count: int = 1000
    """Tuning: ping-ping round trips per latency cell."""
    tuning_idle_qthresh: int = 512
    """Tuning: qthresh of the idle-rule comparison (the paper's best)."""
    tuning_idle_count: int = 100
    """Tuning: ping-pong round trips per cell of the idle-rule comparison (with the
    rule off each waits up to twice the timeout: 100 take 40 s at 200 ms)."""
    destinations: tuple[int, ...] = (1, 10, 100, 1000, 10_000, 100_000, 1_000_000)
    """Scalability: destination counts of the push-cost micro-benchmark."""
    per_destination: int = 2
    """Scalability: messages per destination at the largest count."""
    push_repeats: int = 3
    """Scalability: samples of push cost per destination count (at a million
    destinations one sample takes 5-10 s and 650 MB here)."""
    rss_seconds: float = 300.0
    """Scalability: length of the receiver-memory run."""
    rss_interval: float = 2.0
    """Scalability: seconds between RSS samples."""
    tp_sizes: tuple[int, ...] = tuple(1 << k for k in range(15))
    """ØMQ throughput: message sizes (1 B to 16 KB)."""
    tp_duration: float = 2.0
    """ØMQ throughput: seconds each sender sends."""

    def __post_init__(self) -> None:
        for name in ("rt_sizes", "loss_sizes", "tuning_qthresh", "destinations", "tp_sizes"):
            _check_sizes(name, getattr(self, name))
        if not self.systems:
            raise ConfigError("Profile.systems must not be empty")
        unknown = [s for s in self.systems if s not in SYSTEMS]
        if unknown:
            raise ConfigError(f"unknown system {', '.join(unknown)}; known: {', '.join(SYSTEMS)}")
        for name in ("rt_count", "rt_runs", "window", "loss_count", "loss_runs", "tuning_size", "tuning_count",
                     "tuning_runs", "tuning_rt_count", "tuning_idle_qthresh", "tuning_idle_count",
                     "per_destination", "push_repeats"):  # fmt: skip
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(
                    f"Profile.{name} must be a whole number of at least 1, not {value!r}"
                )
        if not self.tuning_timeouts or min(self.tuning_timeouts) <= 0:
            raise ConfigError("Profile.tuning_timeouts must be positive seconds")
        if not self.rss_seconds > 0 or not 0 < self.rss_interval <= self.rss_seconds:
            raise ConfigError(
                "Profile.rss_seconds and rss_interval must be positive, interval <= seconds"
            )
        if not self.tp_duration > 0:
            raise ConfigError("Profile.tp_duration must be above 0 seconds")


PROFILES: Final[dict[str, Profile]] = {
    # The papers' scale: 1000 round trips at every size, the full tuning
    # grid, a million destinations and five minutes of receiver memory.
    "full": Profile(name="full"),
    # A few minutes here (2 cores): the sizes where the papers' claims are
    # made (4 B, 512 B, 16 KB), fewer round trips, a 3 x 3 tuning grid that
    # holds the paper's 512 B / 200 ms cell, and a 12 s memory run (past
    # the first seconds, when the receiver's heap settles).
    "quick": Profile(
        name="quick",
        rt_sizes=(4, 512, 16384),
        rt_count=300,
        rt_runs=3,
        # Figure 6's claims are made at 512 B; the baseline and three rounds
        # fit the quick profile's minutes at one size. 200 round trips: at
        # 1.4 % loss each TCP-based run waits out about six 200 ms
        # retransmissions (300 cost the lab 6 s more).
        loss_sizes=(512,),
        loss_count=200,
        loss_runs=3,
        tuning_qthresh=(64, 512, 4096),
        tuning_timeouts=(0.0001, 0.005, 0.2),
        tuning_count=200_000,
        tuning_rt_count=300,
        # With the idle rule off a round trip waits up to twice the timeout
        # (0.4 s at 200 ms): 10 show the 100x-and-more gap as well as 20.
        tuning_idle_count=10,
        destinations=(1, 100, 10_000, 100_000),
        per_destination=2,
        push_repeats=3,
        # The memory claim needs 60 s (inconclusive here at any shorter
        # length): 4 s draw the figure past the heap's first second.
        rss_seconds=4.0,
        rss_interval=0.2,
        # The measured claim is judged at 256 B and below (1 B and 256 B
        # here); 16 KB draws the large end of the figure.
        tp_sizes=(1, 256, 16384),
        tp_duration=0.3,
    ),
    # Seconds: for tests of the whole path (records, Spark, report).
    "tiny": Profile(
        name="tiny",
        systems=("cmq", "udp"),
        rt_sizes=(4, 512),
        rt_count=50,
        rt_runs=1,
        loss_sizes=(512,),
        loss_count=50,
        loss_runs=1,
        tuning_qthresh=(64, 512),
        tuning_timeouts=(0.001, 0.2),
        tuning_count=5000,
        tuning_runs=1,
        tuning_rt_count=50,
        tuning_idle_count=10,
        destinations=(1, 1000),
        per_destination=2,
        push_repeats=2,
        rss_seconds=1.5,
        rss_interval=0.25,
        tp_sizes=(64, 512),
        tp_duration=0.3,
    ),
}
PROFILE_NAMES: Final = tuple(PROFILES)

Step = Callable[[str], None]
"""Called once per finished progress step with a label of what runs next."""
Say = Callable[[str], None]
"""Prints one line for the user (skips, failures) on stderr."""


def _quiet(_text: str) -> None:
    pass


@dataclass(frozen=True, kw_only=True)
class Context:
    """What an experiment's ``run`` is given.

    Raises:
        ConfigError: on construction, for a loss probability outside [0, 1)
            or an empty system list.
    """

    out: Path
    """The lab's output directory; records go in its table directories."""
    profile: Profile
    """How much to measure."""
    systems: tuple[str, ...]
    """Systems to compare (the profile's, or ``--systems``)."""
    loss: float = DEFAULT_LOSS
    """Packet-loss probability of the lossy experiments."""
    pin: str = "none"
    """CPU pinning of the two processes of a run (see :mod:`cmq.lab.runner`)."""
    step: Step = _quiet
    """Advance the progress bar by one."""
    say: Say = _quiet
    """Tell the user something (one line)."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.loss < 1.0:
            raise ConfigError(f"loss {self.loss!r} must be a probability in [0, 1)")
        if not self.systems:
            raise ConfigError("no systems to run")


def _always(_ctx: Context) -> str | None:
    return None


@dataclass(frozen=True, kw_only=True)
class LabExperiment:
    """One experiment ``cmq lab`` can run.

    Raises:
        ConfigError: on construction, for an id that is not lower-case
            letters, digits and dashes, or an empty title.
    """

    id: str
    """The records' ``experiment`` value and the report's section id."""
    title: str
    """One line for progress and summaries."""
    run: Callable[[Context], None]
    """Measure and write records (see the module docstring)."""
    steps: Callable[[Context], int]
    """How many times ``run`` will call ``ctx.step``."""
    unavailable: Callable[[Context], str | None] = _always
    """Why it cannot run here (and how to fix that), or ``None``."""
    aliases: tuple[str, ...] = ()
    """Short names ``--only`` also accepts (``"fig5"`` for ``"cmq-fig5"``)."""
    order: int = 100
    """Experiments run (and are listed) by (order, id)."""
    multi_system: bool = True
    """Whether it compares ``ctx.systems`` (else it measures cmq alone)."""
    runs: Callable[[Profile], int] | None = None
    """The fewest runs (repeats, rounds) behind any figure its claims judge,
    under a profile. The page marks its verdicts "indicative" when this is
    below the full profile's (:func:`runs_behind`); ``None``: not stated."""
    _names: tuple[str, ...] = field(init=False, repr=False, compare=False, default=())

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", self.id):
            raise ConfigError(
                f"experiment id {self.id!r} must be lower-case letters, digits, dashes"
            )
        if not self.title:
            raise ConfigError(f"experiment {self.id!r} needs a title")
        object.__setattr__(self, "_names", (self.id, *self.aliases))


_REGISTRY: dict[str, LabExperiment] = {}
_PAGES: dict[str, Page] = {}
_loaded = False


def register(experiment: LabExperiment) -> LabExperiment:
    """Add ``experiment`` to the lab; returns it.

    Raises:
        ConfigError: its id or an alias is taken already.
    """
    taken = {n: e.id for e in _REGISTRY.values() for n in e._names}
    for name in experiment._names:
        if name in taken and taken[name] != experiment.id:
            raise ConfigError(f"experiment name {name!r} is taken by {taken[name]!r}")
    if experiment.id in _REGISTRY and _REGISTRY[experiment.id] is not experiment:
        raise ConfigError(f"experiment {experiment.id!r} is registered already")
    _REGISTRY[experiment.id] = experiment
    return experiment


def _load() -> None:
    # The one place that imports experiments by name: each registers itself
    # at import. Helpers (``_proc``, ``_record``, ``_worker``) register nothing.
    # Marked loaded only once all imported: after a MissingExtra the next
    # call raises it again instead of answering from half a registry.
    global _loaded
    if _loaded:
        return
    from cmq.lab.experiments import (  # noqa: F401
        bdqs,
        fig5,
        fig6,
        reliability,
        scalability,
        tuning,
        zmq_throughput,
    )
    from cmq.lab.experiments.amqp import experiment as _amqp  # noqa: F401
    from cmq.lab.experiments.stockex import experiment as _stockex  # noqa: F401

    _loaded = True


def register_page(section: Page, *, replace: bool = False) -> Page:
    """Add an experiment's part of the report (title, paper, claims, how
    its section is drawn) under the id its records carry; returns it.

    Raises:
        ConfigError: the id has a page already and ``replace`` is false.
    """
    if section.id in _PAGES and _PAGES[section.id] is not section and not replace:
        raise ConfigError(f"experiment {section.id!r} has a report page already")
    _PAGES[section.id] = section
    return section


def pages() -> list[Page]:
    """Every experiment's part of the report, in page order: what the lab
    hands :func:`cmq.pipeline.report.render_html`."""
    _load()
    return sorted(_PAGES.values(), key=lambda e: (e.order, e.id))


def page(experiment_id: str) -> Page | None:
    """The report page of the experiment whose records carry this id, if any."""
    _load()
    return _PAGES.get(experiment_id)


def runs_behind(experiment: LabExperiment, profile: Profile) -> tuple[int, int] | None:
    """``(runs under profile, runs under the full profile)`` behind the
    experiment's judged figures, or ``None`` when it does not say."""
    if experiment.runs is None:
        return None
    return experiment.runs(profile), experiment.runs(PROFILES["full"])


def experiments() -> list[LabExperiment]:
    """Every registered experiment, in run order."""
    _load()
    return sorted(_REGISTRY.values(), key=lambda e: (e.order, e.id))


def get(name: str) -> LabExperiment:
    """The experiment with this id or alias.

    Raises:
        ConfigError: no experiment has that name.
    """
    for e in experiments():
        if name in e._names:
            return e
    known = ", ".join(
        f"{e.id} ({', '.join(e.aliases)})" if e.aliases else e.id for e in experiments()
    )
    raise ConfigError(f"unknown experiment {name!r}; known: {known}")


def resolve(names: Sequence[str]) -> list[LabExperiment]:
    """The experiments named (ids or aliases), in run order; all when empty.

    Raises:
        ConfigError: an unknown name.
    """
    if not names:
        return experiments()
    chosen = {get(n).id for n in names}
    return [e for e in experiments() if e.id in chosen]
