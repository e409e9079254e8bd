"""``cmq lab``: run the experiments, aggregate their records on Spark, write the report.

Theory of operation
-------------------
1. :class:`LabConfig` (frozen, validated) names the output directory, the
   profile (``quick`` by default, ``full``, or ``tiny`` for tests) and any
   overrides (systems, sizes, round-trip count, loss probability, pinning).
2. Systems that cannot run here (no server, no package) are found once, up
   front, and reported with one line each saying how to get them;
   experiments that cannot run here (no root for the lossy namespaces) the
   same. Both are written as skipped runs, so the report lists them.
3. Each experiment of :mod:`cmq.lab.experiments` runs in turn, writing raw
   records under ``out`` (:mod:`cmq.lab.records`) and advancing the
   progress bar.
4. The PySpark pipeline aggregates ``out`` (:func:`cmq.pipeline.report.collect`)
   and the report page is written to ``out/report.html``; the claims'
   verdicts and a few headline figures come back in :class:`LabResult` for
   the command's summary.

Nothing here measures anything itself: it only sequences the experiments
and the pipeline, so ``cmq report DIR`` rebuilds the same page from the
same records.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import statistics
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from cmq._errors import ConfigError
from cmq.lab import experiments as lab_experiments
from cmq.lab import runner
from cmq.lab import systems as lab_systems
from cmq.lab.experiments import DEFAULT_LOSS, PROFILES, Context, LabExperiment, Profile
from cmq.lab.experiments._record import RunBook, skip_all
from cmq.lab.records import TABLES

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from cmq.pipeline.report import ReportData

__all__ = ["LabConfig", "LabResult", "Ui", "Verdict", "default_out", "run_lab"]

#: Where ``cmq lab`` writes when no ``--out`` is given: a fresh directory per run.
DEFAULT_OUT_ROOT: Final = Path("cmq-lab")


def default_out() -> Path:
    """A fresh output directory: ``cmq-lab/<UTC time>``."""
    return DEFAULT_OUT_ROOT / datetime.now(UTC).strftime("%Y%m%d-%H%M%S")


@dataclass(frozen=True, kw_only=True)
class LabConfig:
    """What ``cmq lab`` runs, and where it writes.

    Raises:
        ConfigError: on construction, for an unknown profile, experiment,
            system or pinning, a loss probability outside [0, 1), a count
            below 1, or a bad size.
    """

    out: Path
    """Output directory: records, report.html."""
    profile: str = "quick"
    """``"quick"`` (a few minutes), ``"full"`` (the papers' scale) or ``"tiny"``."""
    only: tuple[str, ...] = ()
    """Experiment ids or aliases to run; empty runs all."""
    systems: tuple[str, ...] | None = None
    """Systems to compare; ``None`` takes the profile's (every system)."""
    sizes: tuple[int, ...] | None = None
    """Message sizes of the round-trip and throughput experiments, overriding the profile's."""
    count: int | None = None
    """Round trips per (system, size) of Figures 5 and 6, overriding the profile's."""
    loss: float = DEFAULT_LOSS
    """Packet-loss probability of Figure 6 (the paper's 1.4 %)."""
    pin: str = "none"
    """CPU pinning of each run's two processes: ``none``, ``same`` or ``spread``."""
    master: str | None = None
    """Spark master URL for the pipeline; ``None`` is local mode in this process."""
    overwrite: bool = False
    """Replace the records of an earlier run in ``out`` (else that is an error)."""
    report: bool = True
    """Run the Spark pipeline and write the report (off: records only)."""

    def __post_init__(self) -> None:
        if self.profile not in PROFILES:
            raise ConfigError(f"unknown profile {self.profile!r}; one of {', '.join(PROFILES)}")
        lab_experiments.resolve(self.only)  # raises for an unknown name
        if self.systems is not None:
            if not self.systems:
                raise ConfigError("no systems given")
            for s in self.systems:
                lab_systems.load(s)  # raises for an unknown system
        if self.sizes is not None:
            if not self.sizes:
                raise ConfigError("no sizes given")
            for size in self.sizes:
                if not isinstance(size, int) or isinstance(size, bool) or size < 1:
                    raise ConfigError(f"bad size {size!r}: whole bytes, at least 1")
        if self.count is not None and self.count < 1:
            raise ConfigError(f"count must be at least 1, not {self.count}")
        if not 0.0 <= self.loss < 1.0:
            raise ConfigError(f"loss {self.loss!r} must be a probability in [0, 1)")
        runner.cpus_for(self.pin)  # raises for an unknown mode, or spread on one CPU

    def resolved_profile(self) -> Profile:
        """The profile with this config's overrides applied."""
        base = PROFILES[self.profile]
        changes: dict[str, Any] = {}
        if self.systems is not None:
            changes["systems"] = tuple(self.systems)
        if self.sizes is not None:
            sizes = tuple(sorted(set(self.sizes)))
            changes.update(rt_sizes=sizes, loss_sizes=sizes, tp_sizes=sizes)
        if self.count is not None:
            changes.update(rt_count=self.count, loss_count=self.count)
        if not changes:
            return base
        return dataclasses.replace(base, name=f"{base.name} (custom)", **changes)


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """One claim of the report and what we found."""

    experiment: str
    claim: str
    status: str
    result: str
    indicative: bool = False
    """Made on fewer runs than the full profile's (:func:`cmq.pipeline.report.indicative`)."""


@dataclass(frozen=True, kw_only=True)
class LabResult:
    """What a lab run did: for the command's summary."""

    out: Path
    report: Path | None
    profile: str
    experiments: tuple[str, ...]
    seconds: float
    """Wall time of the whole run, experiments and pipeline."""
    pipeline_seconds: float
    times: dict[str, float] = field(default_factory=dict)
    """Wall seconds of each experiment that ran, by id, in run order."""
    runs: dict[str, int] = field(default_factory=dict)
    """Runs by status (``ok``, ``skipped``, ``failed``)."""
    skipped: tuple[str, ...] = ()
    """One line per skipped system or experiment."""
    failures: tuple[str, ...] = ()
    """One line per failed run."""
    verdicts: tuple[Verdict, ...] = ()
    headlines: tuple[str, ...] = ()


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s"


class Ui:
    """Where progress and messages go: a rich progress bar on a terminal,
    plain lines otherwise, nothing with ``quiet``. All on stderr."""

    #: Without a bar (output piped or redirected), a line at least this often.
    HEARTBEAT: float = 10.0

    def __init__(self, *, quiet: bool = False, bar: bool | None = None) -> None:
        self.quiet = quiet
        self.bar = sys.stderr.isatty() if bar is None else bar
        self._progress: Any = None
        self._task: Any = None
        self._console: Any = None
        # The plain-lines progress: steps done of the total, what runs now,
        # and when the last line went out (for the heartbeat).
        self._done = 0
        self._total = 0
        self._label = ""
        self._started = time.monotonic()
        self._last_line = time.monotonic()
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def _heartbeat(self) -> Iterator[None]:
        """Without a bar: a progress line whenever HEARTBEAT passes without one."""
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(min(1.0, self.HEARTBEAT / 2)):
                with self._lock:
                    quiet_for = time.monotonic() - self._last_line
                if quiet_for >= self.HEARTBEAT:
                    self.say(self._progress_line())

        thread = threading.Thread(target=beat, name="cmq-lab-heartbeat", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def _progress_line(self) -> str:
        elapsed = _duration(time.monotonic() - self._started)
        steps = f"{self._done}/{self._total} steps, " if self._total else ""
        return f"cmq lab: {steps}{elapsed}: {self._label or 'working'} ..."

    @contextlib.contextmanager
    def session(self, total: int) -> Iterator[None]:
        """Show the progress bar (``total`` steps) while the block runs."""
        if self.quiet:
            yield
            return
        if not self.bar:
            self._total, self._done = total, 0
            with self._heartbeat():
                yield
            return
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self._console = Console(stderr=True)
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=self._console,
            transient=True,
        ) as progress:
            self._progress = progress
            self._task = progress.add_task("cmq lab", total=total)
            try:
                yield
            finally:
                self._progress = None

    def advance(self, label: str, steps: int = 1) -> None:
        """Move the bar on by ``steps``; ``label`` says what runs now."""
        with self._lock:
            self._done += steps
            self._label = label
        if self._progress is not None:
            self._progress.update(self._task, advance=steps, description=label)

    def extend(self, steps: int) -> None:
        """Add ``steps`` to the bar's total (an experiment overran its estimate)."""
        with self._lock:
            self._total += steps
        if self._progress is not None:
            total = self._progress.tasks[0].total or 0
            self._progress.update(self._task, total=total + steps)

    @contextlib.contextmanager
    def status(self, text: str) -> Iterator[None]:
        """A spinner with ``text`` on a terminal (a plain line otherwise) while the block runs."""
        if self.quiet:
            yield
        elif not self.bar:
            self.say(text)
            with self._lock:
                self._label, self._total = text.rstrip(". "), 0
            with self._heartbeat():
                yield
        else:
            from rich.console import Console

            with Console(stderr=True).status(text):
                yield

    def say(self, text: str) -> None:
        """One line for the user."""
        if self.quiet:
            return
        with self._lock:
            self._last_line = time.monotonic()
        if self._progress is not None:
            self._progress.console.print(text, markup=False, highlight=False)
        else:
            print(text, file=sys.stderr, flush=True)


class _Steps:
    """Counts one experiment's progress steps against its estimate."""

    def __init__(self, ui: Ui, experiment: str, expected: int) -> None:
        self.ui = ui
        self.experiment = experiment
        self.expected = expected
        self.taken = 0

    def step(self, label: str) -> None:
        self.taken += 1
        if self.taken > self.expected:
            self.ui.extend(1)
        self.ui.advance(f"{self.experiment}: {label}")

    def finish(self) -> None:
        # Steps not taken (a system skipped by the runner) are done now.
        if self.taken < self.expected:
            self.ui.advance(f"{self.experiment}: done", self.expected - self.taken)


def _prepare_out(out: Path, overwrite: bool) -> None:
    existing = [
        out / name for name in TABLES if (out / name).is_dir() and any((out / name).iterdir())
    ]
    if existing and not overwrite:
        raise ConfigError(
            f"{out} already holds lab records; give another --out, or --overwrite to replace them"
        )
    # Only our own directories and page are removed, never anything else in out.
    for directory in existing:
        shutil.rmtree(directory)
    for name in ("report.html", FACTS):
        with contextlib.suppress(FileNotFoundError):
            (out / name).unlink()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create {out}: {exc.strerror}") from exc
    if not os.access(out, os.W_OK):
        raise ConfigError(f"cannot write to {out}")


#: What the page says about the run besides its records: the profile and
#: the time each experiment took (written by :func:`run_lab`, read back by
#: ``cmq report``).
FACTS: Final = "lab.json"


def write_facts(
    out: Path,
    profile: str,
    times: Mapping[str, float],
    runs: Mapping[str, tuple[int, int]] | None = None,
) -> None:
    """Write ``out/lab.json``: the profile's name, each experiment's seconds,
    and the runs behind each experiment's judged figures (this profile's and
    the full profile's)."""
    payload = {
        "profile": profile,
        "experiment_seconds": {k: round(v, 1) for k, v in times.items()},
        "runs": {k: list(v) for k, v in (runs or {}).items()},
    }
    (out / FACTS).write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")


def read_runs(out: Path) -> tuple[str, dict[str, tuple[int, int]]]:
    """The profile's name and the runs behind each experiment's judged
    figures (this profile's, the full profile's), from ``out/lab.json``;
    empty for records written without them."""
    try:
        payload = json.loads((out / FACTS).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "", {}
    runs: dict[str, tuple[int, int]] = {}
    for k, v in (payload.get("runs") or {}).items():
        if isinstance(v, list) and len(v) == 2:
            runs[str(k)] = (int(v[0]), int(v[1]))
    return str(payload.get("profile", "")), runs


def read_facts(out: Path) -> dict[str, str]:
    """The lines the page shows about the run (from ``out/lab.json``); empty
    for records written without it."""
    try:
        payload = json.loads((out / FACTS).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    facts = {"lab profile": str(payload.get("profile", "unknown"))}
    times = payload.get("experiment_seconds") or {}
    if isinstance(times, dict) and times:
        facts["time per experiment"] = ", ".join(f"{k} {float(v):.0f} s" for k, v in times.items())
    return facts


def _system_skips(systems: Sequence[str], ui: Ui) -> dict[str, str]:
    """Why each system that cannot run here cannot, found once and said once."""
    skips: dict[str, str] = {}
    for name in systems:
        why = lab_systems.load(name).available()
        if why is not None:
            skips[name] = why
            ui.say(f"cmq lab: skipping {name}: {why}")
    return skips


def run_lab(
    config: LabConfig,
    *,
    ui: Ui | None = None,
    spark: SparkSession | None = None,
) -> LabResult:
    """Run the experiments of ``config``, then the pipeline and the report.

    ``spark`` reuses a running session (tests); otherwise one is started on
    ``config.master`` (local mode by default) and left running for the
    process's life.

    Raises:
        ConfigError: ``out`` holds earlier records (without ``overwrite``) or
            cannot be written, or PySpark is missing.
    """
    ui = ui or Ui()
    started = time.monotonic()
    profile = config.resolved_profile()
    chosen = lab_experiments.resolve(config.only)
    out = config.out
    _prepare_out(out, config.overwrite)

    systems = tuple(profile.systems)
    if any(e.multi_system for e in chosen):
        ui.say(f"cmq lab: {profile.name} profile, checking {len(systems)} systems ...")
        system_skips = _system_skips(systems, ui)
    else:
        system_skips = _system_skips(("cmq",), ui)
    usable = tuple(s for s in systems if s not in system_skips) or ("cmq",)

    skipped: list[str] = [f"{s}: {why}" for s, why in system_skips.items()]
    failures: list[str] = []
    plans: list[tuple[LabExperiment, Context, str | None]] = []
    for exp in chosen:
        ctx = Context(out=out, profile=profile, systems=usable, loss=config.loss, pin=config.pin)
        why = exp.unavailable(ctx)
        plans.append((exp, ctx, why))
        if why is not None:
            ui.say(f"cmq lab: skipping {exp.id}: {why}")
            skipped.append(f"{exp.id}: {why}")

    total = sum(exp.steps(ctx) for exp, ctx, why in plans if why is None) or 1
    times: dict[str, float] = {}
    with ui.session(total):
        for exp, ctx, why in plans:
            exp_started = time.monotonic()
            exp_systems = systems if exp.multi_system else ("cmq",)
            if why is not None:
                with RunBook(out, exp.id, pin=config.pin) as book:
                    skip_all(book, exp_systems, why)
                continue
            counter = _Steps(ui, exp.id, exp.steps(ctx))
            ui.advance(f"{exp.id}: starting", 0)
            if not ui.bar:
                ui.say(f"cmq lab: {exp.id} ({exp.title}) ...")
            # Systems found missing up front are written as skipped runs of
            # every experiment that compares systems, so each section lists them.
            if exp.multi_system:
                with RunBook(out, exp.id, pin=config.pin) as book:
                    for s, reason in system_skips.items():
                        book.skip(s, reason)
            try:
                exp.run(dataclasses.replace(ctx, step=counter.step, say=ui.say))
            except Exception as exc:  # noqa: BLE001 - one broken experiment must not cost the others
                # Its runs are marked failed by its RunBook; the others still run.
                text = f"{exp.id} stopped: {type(exc).__name__}: {exc}"
                ui.say(f"cmq lab: {text}")
                failures.append(text)
            counter.finish()
            times[exp.id] = time.monotonic() - exp_started

    from cmq.lab.records import read_table

    runs = read_table(out, "runs").to_pylist()
    counts: dict[str, int] = {}
    for r in runs:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
        if r["status"] == "failed":
            failures.append(f"{r['experiment']} {r['system']}: {r['reason']}")

    behind = {
        e.id: n for e in chosen if e.id in times and (n := lab_experiments.runs_behind(e, profile))
    }
    write_facts(out, profile.name, times, behind)
    report_path: Path | None = None
    verdicts: list[Verdict] = []
    headlines: list[str] = []
    pipeline_started = time.monotonic()
    if config.report:
        with ui.status(
            f"cmq lab: aggregating the records on Spark and writing the report "
            f"(Spark's log: {out / 'spark.log'}) ..."
        ):
            report_path, data = _report(out, spark=spark, master=config.master)
        # Every section with data, including report-only ones an experiment
        # writes besides its own (tuning writes tuning-idle).
        verdicts = _verdicts(data, set(data.experiment_ids()), behind)
        headlines = headline_figures(data)
    pipeline_seconds = time.monotonic() - pipeline_started
    return LabResult(
        out=out,
        report=report_path,
        profile=profile.name,
        experiments=tuple(e.id for e in chosen),
        seconds=time.monotonic() - started,
        pipeline_seconds=pipeline_seconds,
        times=times,
        runs=counts,
        skipped=tuple(skipped),
        failures=tuple(failures),
        verdicts=tuple(verdicts),
        headlines=tuple(headlines),
    )


def _report(
    out: Path, *, spark: SparkSession | None, master: str | None
) -> tuple[Path, ReportData]:
    """Aggregate on Spark, write ``out/report.html``; the page's path and data."""
    from cmq.lab.experiments import pages
    from cmq.pipeline.report import collect, render_html

    if spark is None:
        spark = _start_spark(out, master)
    data = collect(spark, out)
    profile, runs = read_runs(out)
    page = render_html(data, pages(), source=str(out), facts=read_facts(out), runs=runs,
                       profile=profile)  # fmt: skip
    target = out / "report.html"
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_text(page, encoding="utf-8")
    os.replace(tmp, target)
    return target, data


def _start_spark(out: Path, master: str | None) -> SparkSession:
    """Start the pipeline's session, its JVM's chatter going to ``out/spark.log``.

    The JVM inherits this process's stderr when it starts and writes its
    start-up notes there (log4j profile, native-hadoop and module warnings):
    it gets the log file instead, so the lab's own lines stay readable.
    """
    from cmq.pipeline.session import SessionConfig, build_session

    config = SessionConfig(master=master) if master else SessionConfig()
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(out / "spark.log", "ab") as log:
            os.dup2(log.fileno(), 2)
            try:
                return build_session(config)
            finally:
                os.dup2(saved, 2)
    finally:
        os.close(saved)


def _verdicts(
    data: ReportData, ran: set[str], runs: Mapping[str, tuple[int, int]] | None = None
) -> list[Verdict]:
    from cmq.lab.experiments import pages
    from cmq.pipeline.report import indicative

    found = []
    for exp in pages():
        if exp.id not in ran:
            continue
        for claim in exp.claims:
            try:
                v = claim.judge(data)
                status, result = v.status, v.result
            except Exception as exc:  # noqa: BLE001 - the report shows a broken judge the same way
                status, result = "inconclusive", f"could not judge: {type(exc).__name__}: {exc}"
            marked = status != "context" and indicative((runs or {}).get(exp.id))
            found.append(Verdict(experiment=exp.id, claim=claim.text, status=status, result=result,
                                 indicative=marked))  # fmt: skip
    return found


def _fmt_us(ns: float) -> str:
    us = ns / 1e3
    if us >= 10_000:
        return f"{us / 1e3:,.0f} ms"
    return f"{us:,.0f} µs" if us >= 100 else f"{us:,.1f} µs"


def headline_figures(data: ReportData) -> list[str]:
    """A few lines of the figures a reader looks for first, from the aggregates."""
    lines: list[str] = []
    rows = [r for r in data.rows("cmq-fig5", scenario="pingpong") if r["p50_ns"] is not None]
    if rows:
        # Medians, with their run counts: a mean of one run is one stall
        # away from any value, and one run says nothing of the next.
        size = 512 if any(r["size"] == 512 for r in rows) else min(r["size"] for r in rows)
        at = sorted((r for r in rows if r["size"] == size), key=lambda r: r["p50_ns"])
        lines.append(
            f"ping-pong {size} B, median round trip (runs): "
            + ", ".join(f"{r['system']} {_fmt_us(r['p50_ns'])} ({r['runs']})" for r in at)
        )
    lossy = [
        r
        for r in data.rows("cmq-fig6", scenario="pingpong")
        if r["mean_ns"] is not None and r["p"].get("loss") != 0
    ]
    if lossy:
        size = 512 if any(r["size"] == 512 for r in lossy) else min(r["size"] for r in lossy)
        at = sorted((r for r in lossy if r["size"] == size), key=lambda r: r["mean_ns"])
        lines.append(
            f"ping-pong {size} B under loss, mean (sd): "
            + ", ".join(
                f"{r['system']} {_fmt_us(r['mean_ns'])} ({_fmt_us(r['stddev_ns'] or 0)})"
                for r in at
            )
        )
    tp = [r for r in data.rows("zmq-throughput") if r["msgs_per_s"] is not None]
    if tp:
        for size in sorted({min(r["size"] for r in tp), max(r["size"] for r in tp)}):
            at = sorted((r for r in tp if r["size"] == size), key=lambda r: -r["msgs_per_s"])
            lines.append(
                f"throughput {size} B: "
                + ", ".join(
                    f"{r['system']} {r['msgs_per_s'] / 1e3:,.0f}k msgs/s ({r['mb_per_s']:,.1f} MB/s)"
                    for r in at
                )
            )
    idle = [r for r in data.rows("tuning-idle", scenario="pingpong") if r["mean_ns"] is not None]
    if idle:
        top = max(r["p"].get("timeout", 0) for r in idle)
        cells = {str(r["p"].get("idle_gap")): r for r in idle if r["p"].get("timeout") == top}
        off = cells.pop("inf", None)
        on = next(iter(cells.values()), None)
        if on is not None and off is not None:
            lines.append(
                f"batch timeout {top * 1e3:g} ms, polled ping-pong mean: {_fmt_us(on['mean_ns'])} "
                f"with the idle rule, {_fmt_us(off['mean_ns'])} without"
            )
    push = [r for r in data.sample_rows("scalability", metric="push_ns") if r["x"] is not None]
    if push:
        pts = sorted((r["x"], r["mean"]) for r in push)
        lines.append(
            "push cost: "
            + ", ".join(f"{x:,.0f} destinations {m:,.0f} ns" for x, m in (pts[0], pts[-1]))
        )
    rss = data.series_rows("scalability", metric="rss_bytes")
    if rss:
        values = [r["value"] for r in rss]
        lines.append(
            f"receiver RSS: {values[0] / 1e6:.1f} MB at start, {values[-1] / 1e6:.1f} MB after "
            f"{rss[-1]['t_s']:.0f} s (median {statistics.median(values) / 1e6:.1f} MB)"
        )
    return lines
