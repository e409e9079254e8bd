"""The compiled core's CPU target, in interleaved rounds: compiled, pure, floor.

Each round runs, for each size, ``cmq bench throughput``'s measurement
(reliable delivery, both processes' CPU per delivered message) once on the
compiled core and once with ``CMQ_PURE_PYTHON=1``, then
``scripts/udp_cpu_floor.py`` (what the kernel and a bare loop cost, with
as many messages a datagram as cmq packs). One run of each in turn, so a
busy spell of a shared machine falls on all three; on a noisy host single
runs of the same build differ by 2x. Prints each round's figures and
ratios, then the medians. The target (a third of the pure core's CPU per
message) is met in a round when the compiled core's ratio is at most 1/3:

    .venv/bin/python scripts/cpu_rounds.py --rounds 5
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

from cmq.lab import runner

# Messages a datagram as a reliable run of cmq packs them (the floor's --per): measured
# 119-120 at 512 B and 2.9-3 at 16 KB; a full body would hold 124 and 3, but batches
# leave on their timeout a little before they fill.
_PER = {512: 120, 16384: 3}
_FLOOR = Path(__file__).with_name("udp_cpu_floor.py")


def _cmq(size: int, pure: bool, duration: float) -> float:
    if pure:
        os.environ["CMQ_PURE_PYTHON"] = "1"
    else:
        os.environ.pop("CMQ_PURE_PYTHON", None)
    try:
        (res,) = runner.run_throughput(
            ["cmq"], [size], duration=duration, options={"cmq": {"delivery": "reliable"}}
        )
    finally:
        os.environ.pop("CMQ_PURE_PYTHON", None)
    if not isinstance(res, runner.ThroughputResult) or res.cpu_ns_per_msg is None:
        raise SystemExit(
            f"the {'pure' if pure else 'compiled'} core's run at {size} B failed: {res}"
        )
    if res.delivered != res.sent:
        raise SystemExit(f"{res.sent - res.delivered} of {res.sent} messages lost at {size} B")
    return res.cpu_ns_per_msg


def _floor(size: int, duration: float) -> float:
    argv = [
        sys.executable,
        str(_FLOOR),
        "--size",
        str(size),
        "--per",
        str(_PER[size]),
        "--duration",
        str(duration),
    ]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    found = re.search(r"CPU per delivered message ([\d,]+) ns", out)
    if found is None:
        raise SystemExit(f"udp_cpu_floor.py said: {out!r}")
    return float(found.group(1).replace(",", ""))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5, help="rounds (default %(default)s)")
    p.add_argument(
        "--sizes",
        default="512,16384",
        help="comma-separated: 512 and/or 16384 (default %(default)s)",
    )
    p.add_argument(
        "--duration", type=float, default=3.0, help="seconds of sending a run (default %(default)s)"
    )
    args = p.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    if args.rounds < 1 or not sizes or any(s not in _PER for s in sizes):
        p.error(f"--rounds must be at least 1 and --sizes among {sorted(_PER)}")
    runs: dict[tuple[int, str], list[float]] = {}
    for r in range(args.rounds):
        for size in sizes:
            got = {
                "compiled": _cmq(size, False, args.duration),
                "pure": _cmq(size, True, args.duration),
            }
            got["floor"] = _floor(size, args.duration)
            for k, v in got.items():
                runs.setdefault((size, k), []).append(v)
            c, pure, f = got["compiled"], got["pure"], got["floor"]
            print(
                f"round {r + 1}/{args.rounds} {size:6,d} B: compiled {c:8,.0f} ns  pure {pure:8,.0f} ns  "
                f"floor {f:7,.0f} ns  compiled/pure {c / pure:.2f}  floor/pure {f / pure:.2f}",
                flush=True,
            )
    for size in sizes:
        c, pure, f = (statistics.median(runs[(size, k)]) for k in ("compiled", "pure", "floor"))
        met = sum(
            a / b <= 1 / 3
            for a, b in zip(runs[(size, "compiled")], runs[(size, "pure")], strict=True)
        )
        print(
            f"{size:,d} B medians: compiled {c:,.0f}, pure {pure:,.0f} (a third {pure / 3:,.0f}), floor {f:,.0f}; "
            f"compiled/pure {c / pure:.2f}, floor/pure {f / pure:.2f}; a third met in {met} of {args.rounds} rounds"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
