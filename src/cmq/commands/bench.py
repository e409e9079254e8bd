"""Measure cmq against raw UDP, TCP, ZeroMQ and brokers: throughput and round trips.

Scenarios:

  throughput    the sender sends as fast as it can (--duration or --count);
                msgs/s counts delivered messages only, measured at the
                receiver from the first to the last delivered message; CPU
                ns/msg is the CPU time of both processes (all their
                threads) per delivered message
  pingpong      the next message after the reply (--count round trips);
                a reply later than --timeout is a lost round trip
  pingping      asynchronous: up to --window messages in flight
  destinations  sans-IO micro-benchmark: cost per push to 1 destination and
                to 100,000 distinct destinations (cmq's batcher alone)
  push          CPU time of one q.push / q.sender() call that joins an open
                batch, on the compiled core and on the pure-Python one
                (--count pushes, 4 B; --rounds repeats, the best counts)

Sender and receiver run in two processes (--pin same: one CPU; spread: two
CPUs; none: the scheduler decides). Runs of different systems are
interleaved, so a comparison within one run is fair. A system that is not
usable here (no server, no package) is skipped with one line saying how to
get it. Examples:

  cmq bench throughput --systems cmq,udp,tcp,zmq --sizes 4,512,16384 --duration 2 --pin spread --json
  cmq bench pingpong --systems cmq,udp,zmq --sizes 4,512 --count 2000 --pin same
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from cmq._errors import ConfigError
from cmq.lab import runner
from cmq.lab.systems import SYSTEMS

__all__ = ["configure", "parse_sizes", "parse_systems", "run"]

SCENARIOS = ("throughput", "pingpong", "pingping", "destinations", "push")
DEFAULT_SYSTEMS = "cmq,udp,tcp,zmq"
DEFAULT_SIZES = "4,512,16384"
DEFAULT_DURATION = 2.0  # throughput, seconds per run
DEFAULT_COUNT = 2000  # round trips per run

_UNITS = {
    "": 1,
    "B": 1,
    "K": 1024,
    "KB": 1024,
    "KIB": 1024,
    "M": 1 << 20,
    "MB": 1 << 20,
    "MIB": 1 << 20,
}


def parse_systems(text: str) -> list[str]:
    """``"cmq,udp"`` -> ``["cmq", "udp"]``; ``"all"`` is every system.

    Raises ``argparse.ArgumentTypeError`` for an unknown or empty name.
    """
    if text.strip() == "all":
        return list(SYSTEMS)
    names = [n.strip() for n in text.split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(f"empty system name in {text!r}")
    unknown = [n for n in names if n not in SYSTEMS]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown system {', '.join(map(repr, unknown))}; known systems: {', '.join(SYSTEMS)}"
        )
    return list(dict.fromkeys(names))


def parse_sizes(text: str) -> list[int]:
    """``"4,512,16K"`` -> ``[4, 512, 16384]`` (K and M are powers of 1024).

    Raises ``argparse.ArgumentTypeError`` for anything but whole sizes of at
    least 1 byte.
    """
    sizes: list[int] = []
    for item in text.split(","):
        raw = item.strip().upper()
        digits = raw.rstrip("KMIB")
        unit = raw[len(digits) :]
        if not digits.isdigit() or unit not in _UNITS:
            raise argparse.ArgumentTypeError(
                f"bad size {item.strip()!r}: give bytes as whole numbers, e.g. 4,512,16K"
            )
        size = int(digits) * _UNITS[unit]
        if size < 1:
            raise argparse.ArgumentTypeError(
                f"bad size {item.strip()!r}: sizes are at least 1 byte"
            )
        sizes.append(size)
    return list(dict.fromkeys(sizes))


def _positive(kind: type[int] | type[float]) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a {kind.__name__}: {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be above 0, not {text}")
        return value

    parse.__name__ = kind.__name__
    return parse


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``cmq bench``."""
    parser.add_argument("scenario", choices=SCENARIOS, help="what to measure")
    parser.add_argument(
        "--systems",
        type=parse_systems,
        default=parse_systems(DEFAULT_SYSTEMS),
        metavar="LIST",
        help=f"comma separated, or 'all' (default {DEFAULT_SYSTEMS}; known: {', '.join(SYSTEMS)})",
    )
    parser.add_argument(
        "--sizes",
        type=parse_sizes,
        default=parse_sizes(DEFAULT_SIZES),
        metavar="LIST",
        help=f"message sizes in bytes, comma separated (default {DEFAULT_SIZES})",
    )
    amount = parser.add_mutually_exclusive_group()
    amount.add_argument(
        "--duration",
        type=_positive(float),
        metavar="S",
        help=f"throughput: seconds each sender sends (default {DEFAULT_DURATION:g})",
    )
    amount.add_argument(
        "--count",
        type=_positive(int),
        metavar="N",
        help=f"messages per throughput run, or round trips per run (default {DEFAULT_COUNT})",
    )
    parser.add_argument(
        "--pin",
        choices=runner.PINS,
        default="none",
        help="same: both processes on one CPU; spread: on two CPUs; none: the scheduler's choice",
    )
    parser.add_argument(
        "--timeout",
        type=_positive(float),
        default=0.2,
        metavar="S",
        help="round trips: a reply later than this is lost (default 0.2)",
    )
    parser.add_argument(
        "--window",
        type=_positive(int),
        default=16,
        metavar="N",
        help="pingping: messages in flight (default 16)",
    )
    parser.add_argument(
        "--rounds",
        type=_positive(int),
        metavar="N",
        help="run every (system, size) N times, interleaved (default 1); "
        "destinations: repeats, the best counts (default 3)",
    )
    parser.add_argument(
        "--delivery",
        choices=("reliable", "unordered", "best-effort"),
        default="reliable",
        help="how cmq delivers: reliable (the default: every message once, in order, "
        "flow-controlled), unordered (the same, handed over as it arrives) or best-effort "
        "(the CMQ paper's datagrams: at most once)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--raw",
        action="store_true",
        help="with --json, round trips: add every message's send_ns and recv_ns",
    )


@contextmanager
def _progress(enabled: bool) -> Iterator[runner.Progress | None]:
    """A rich progress bar on stderr while the runs go (only on a terminal)."""
    if not enabled or not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as bar:
        task = bar.add_task("bench", total=None)

        def update(done: int, total: int, label: str) -> None:
            bar.update(task, completed=done, total=total, description=label)

        yield update


def _report_problems(results: list[runner.Result]) -> bool:
    """One stderr line per skipped or failed run; True when a run failed."""
    failed = False
    for r in results:
        if isinstance(r, runner.Skipped):
            what = r.system if r.size is None else f"{r.system} at {r.size} B"
            print(f"cmq bench: skipped {what}: {r.reason}", file=sys.stderr)
        elif isinstance(r, runner.Failed):
            failed = True
            print(f"cmq bench: {r.system} at {r.size} B failed: {r.error}", file=sys.stderr)
    return failed


def _environment() -> dict[str, Any]:
    """What a reader needs to judge the figures: version, CPUs, and how busy the machine was."""
    import os

    import cmq

    return {
        "cmq_version": cmq.__version__,
        "cpus": sorted(os.sched_getaffinity(0)),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }


def _json_results(results: list[runner.Result], raw: bool) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for r in results:
        if isinstance(r, runner.RoundTripResult):
            out.append(r.to_json(raw=raw))
        else:
            out.append(r.to_json())
    return out


def _table(scenario: str, pin: str, results: list[runner.Result]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"cmq bench {scenario} (pin {pin})")
    measured = [
        r for r in results if isinstance(r, runner.ThroughputResult | runner.RoundTripResult)
    ]
    if scenario == "throughput":
        for col in (
            "system",
            "size B",
            "sent",
            "delivered",
            "delivered %",
            "seconds",
            "msgs/s",
            "MB/s",
            "CPU ns/msg",
        ):
            table.add_column(col, justify="left" if col == "system" else "right")
        for t in sorted(
            (r for r in measured if isinstance(r, runner.ThroughputResult)), key=lambda r: r.size
        ):
            table.add_row(
                t.system,
                f"{t.size:,}",
                f"{t.sent:,}",
                f"{t.delivered:,}",
                f"{100 * t.delivered_fraction:.2f}",
                f"{t.seconds:.3f}",
                f"{t.msgs_per_s:,.0f}",
                f"{t.mb_per_s:,.2f}",
                "-" if t.cpu_ns_per_msg is None else f"{t.cpu_ns_per_msg:,.0f}",
            )
    else:
        for col in (
            "system",
            "size B",
            "round trips",
            "lost",
            "mean µs",
            "p50 µs",
            "p99 µs",
            "stdev µs",
        ):
            table.add_column(col, justify="left" if col == "system" else "right")
        for p in sorted(
            (r for r in measured if isinstance(r, runner.RoundTripResult)), key=lambda r: r.size
        ):
            st = p.stats_us()
            table.add_row(
                p.system,
                f"{p.size:,}",
                f"{p.round_trips:,}",
                f"{p.lost:,}",
                f"{st['mean_us']:.1f}",
                f"{st['p50_us']:.1f}",
                f"{st['p99_us']:.1f}",
                f"{st['stdev_us']:.1f}",
            )
    # Off a terminal rich assumes 80 columns and squeezes the headers.
    console = Console() if sys.stdout.isatty() else Console(width=120)
    console.print(table)


def _destinations(args: argparse.Namespace) -> int:
    per_destination = 10
    if args.count is not None:
        # --count is the total number of messages, spread over 100,000
        # destinations: at least one message each.
        per_destination = max(1, int(args.count) // 100_000)
    results = runner.run_destinations(
        (1, 100_000), per_destination=per_destination, repeat=args.rounds or 3
    )
    one, many = results[0], results[-1]
    ratio = many.ns_per_msg / one.ns_per_msg
    if args.json:
        doc = {
            "scenario": "destinations",
            "results": [r.to_json() for r in results],
            "ratio": round(ratio, 3),
            **_environment(),
        }
        print(json.dumps(doc))
    else:
        for r in results:
            print(
                f"{r.destinations:>7,} destinations: {r.ns_per_msg:7.1f} ns per message "
                f"({r.messages:,} messages of {r.size} B, {r.datagrams:,} datagrams)"
            )
        print(f"ratio {many.destinations:,} : 1 = {ratio:.2f} (target: at most 1.2)")
    return 0


def _push(args: argparse.Namespace) -> int:
    results = runner.run_push_cost(count=int(args.count or 1_000_000), repeat=args.rounds or 3)
    if args.json:
        print(json.dumps({"scenario": "push", "results": [r.to_json() for r in results], **_environment()}))
        return 0
    for r in results:
        print(
            f"{r.core:>8} core, {r.call:>6}: {r.ns_per_msg:6.1f} ns per message "
            f"({r.messages:,} messages of {r.size} B; the loop alone {r.loop_ns:.1f} ns)"
        )
    return 0


def run(args: argparse.Namespace) -> int:
    """Run one scenario; 0 when every run worked, 1 when one failed.

    Raises :class:`~cmq.ConfigError` on a bad combination of options.
    """
    scenario: str = args.scenario
    if args.raw and not args.json:
        raise ConfigError("--raw needs --json")
    if scenario == "destinations":
        return _destinations(args)
    if scenario == "push":
        return _push(args)
    with _progress(True) as progress:
        if scenario == "throughput":
            duration = args.duration
            if duration is None and args.count is None:
                duration = DEFAULT_DURATION
            results = runner.run_throughput(
                args.systems,
                args.sizes,
                count=args.count,
                duration=duration,
                pin=args.pin,
                rounds=args.rounds or 1,
                progress=progress,
                options={"cmq": {"delivery": args.delivery}},
            )
        else:
            if args.duration is not None:
                raise ConfigError(
                    f"{scenario} runs a number of round trips: use --count, not --duration"
                )
            run_round_trips = runner.run_pingpong if scenario == "pingpong" else runner.run_pingping
            kwargs: dict[str, Any] = {"window": args.window} if scenario == "pingping" else {}
            results = run_round_trips(
                args.systems,
                args.sizes,
                count=args.count or DEFAULT_COUNT,
                pin=args.pin,
                timeout=args.timeout,
                rounds=args.rounds or 1,
                progress=progress,
                options={"cmq": {"delivery": args.delivery}},
                **kwargs,
            )
    failed = _report_problems(results)
    if args.json:
        doc = {
            "scenario": scenario,
            "pin": args.pin,
            "delivery": args.delivery,
            "results": _json_results(results, args.raw),
            **_environment(),
        }
        print(json.dumps(doc))
    else:
        _table(scenario, args.pin, results)
    return 1 if failed else 0
