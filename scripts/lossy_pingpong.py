"""Where a reliable ping-pong's median goes under loss. A diagnostic, no verdict.

Runs cmq's ping-pong (the lab's adapter, 512 B, reliable by default) in
the lab's two network namespaces, lossless and then with each host
dropping ``--loss`` of its incoming packets (the same iptables rule in
both runs), ``--pairs`` times in turn. For each run it prints the median
round trip and the median of the round trips grouped by how many came
after the last one that took over 1 ms (a repair: a loss and its probe
timeout), and the nonvoluntary context switches of each process's
threads (a thread preempted while it could run: by its peer woken on the
same CPU, most often). Needs root, ``ip`` and ``iptables``.

What it showed on 2026-11-28 (a slow day: raw UDP 28 µs a round trip on
one CPU), 5,000 round trips a run: lossless medians 28-44 µs, at 1.4 %
43-76 µs. A repair itself took 6.2-6.7 ms (the median of those round
trips), and the round trips after it came back slowly: 53-74 µs 4-10 after
it, 44-72 µs 11-50 after it, against 30-53 µs in the same stretches after a
lossless run's rare stalls. At 1.4 % a repair comes every 30-35 round
trips, so the median is taken mostly from round trips still coming back.
The processes' nonvoluntary context switches were 300-630 a run lossless
and 390-3,070 at 1.4 %, the I/O threads idle (0-30).

``--burn`` runs an idle-priority busy loop (``SCHED_IDLE``) on every CPU
beside the runs: it takes no time from the two processes but keeps the
CPUs from going idle between their turns.

Run: python scripts/lossy_pingpong.py [--count 5000] [--loss 0.014] [--pairs 2] [--delivery reliable] [--pin none] [--burn]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

#: Round trips after a repair, grouped: (upper bound, label).
_GROUPS = (
    (0, "the repair"),
    (1, "1"),
    (3, "2-3"),
    (10, "4-10"),
    (50, "11-50"),
    (200, "51-200"),
    (None, "later"),
)
#: A round trip longer than this carried a repair.
_REPAIR_NS = 1_000_000


def _children() -> dict[int, str]:
    """The lab adapter's processes now running: pid -> role."""
    found = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if b"python" in cmd and b"cmq.lab.systems" in cmd:
            found[int(pid)] = "client" if b"client" in cmd else "server"
    return found


def _switches(pid: int) -> list[int]:
    """Nonvoluntary context switches of each thread of ``pid``."""
    out = []
    try:
        for tid in sorted(os.listdir(f"/proc/{pid}/task"), key=int):
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                text = f.read()
            out.append(int(text.split("nonvoluntary_ctxt_switches:")[1].split()[0]))
    except (OSError, IndexError, ValueError):
        pass
    return out


class _Watch:
    """Reads the children's switch counts every 20 ms; keeps the last seen."""

    def __init__(self) -> None:
        self.last: dict[int, tuple[str, list[int]]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for pid, role in _children().items():
                seen = _switches(pid)
                if seen:
                    self.last[pid] = (role, seen)
            time.sleep(0.02)

    def __enter__(self) -> _Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


_BURNER = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nos.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\nwhile True: pass"


@contextlib.contextmanager
def _burners(on: bool) -> Iterator[None]:
    """An idle-priority busy loop on each CPU this process may use, while inside (``on``)."""
    procs = [
        subprocess.Popen([sys.executable, "-c", _BURNER, str(cpu)])
        for cpu in (os.sched_getaffinity(0) if on else ())
    ]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def _groups(latencies: list[int]) -> str:
    by: dict[str, list[int]] = collections.defaultdict(list)
    last = -(10**9)
    for i, ns in enumerate(latencies):
        if ns > _REPAIR_NS:
            last = i
        after = i - last
        for bound, label in _GROUPS:
            if bound is None or after <= bound:
                by[label].append(ns)
                break
    parts = []
    for _, label in _GROUPS:
        if by[label]:
            v = sorted(by[label])
            parts.append(f"{label}: {v[len(v) // 2] / 1e3:.0f} µs ({len(v)})")
    return ", ".join(parts)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--count", type=int, default=5000, help="round trips a run (default %(default)s)"
    )
    p.add_argument(
        "--loss",
        type=float,
        default=0.014,
        help="drop probability of the lossy runs (default %(default)s)",
    )
    p.add_argument(
        "--pairs",
        type=int,
        default=2,
        help="lossless and lossy runs, in turn (default %(default)s)",
    )
    p.add_argument("--delivery", default="reliable", choices=["reliable", "unordered", "best-effort"],
                   help="cmq's delivery mode (default %(default)s)")  # fmt: skip
    p.add_argument("--pin", choices=["none", "same", "spread"], default="none",
                   help="where the two processes run (default: unpinned)")  # fmt: skip
    p.add_argument(
        "--burn",
        action="store_true",
        help="an idle-priority busy loop on every CPU beside the runs",
    )
    args = p.parse_args()
    if args.count < 100 or args.pairs < 1 or not 0.0 < args.loss < 1.0:
        p.error("--count must be at least 100, --pairs at least 1, --loss in (0, 1)")
    from cmq.lab import netns, runner
    from cmq.lab.experiments.reliability.measure import RT_TIMEOUT, queue_options

    why = netns.unavailable(loss=True)
    if why:
        print(f"skipped: {why}")
        return 0
    with netns.HostPair(rule=True) as hosts, _burners(args.burn):
        for _ in range(args.pairs):
            for loss in (0.0, args.loss):
                hosts.set_loss(loss)
                with _Watch() as watch:
                    results = runner.run_pingpong(
                        ["cmq"], [512], count=args.count, pin=args.pin, timeout=RT_TIMEOUT[args.delivery],
                        server_prefix=hosts.command("b"), client_prefix=hosts.command("a"),
                        bind=hosts.addr_b, options={"cmq": queue_options(args.delivery, True)},
                    )  # fmt: skip
                r = results[-1]
                lat = getattr(r, "latencies_ns", None)
                if not lat:
                    print(f"loss {loss:g}: the run failed: {r}")
                    continue
                print(f"loss {loss:g}: median {sorted(lat)[len(lat) // 2] / 1e3:.1f} µs; "
                      f"after a repair: {_groups(list(lat))}")  # fmt: skip
                for role, seen in sorted(watch.last.values()):
                    print(f"  {role}: nonvoluntary switches per thread {seen}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
