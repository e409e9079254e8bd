"""Does a busy CPU slow the work on the other one? A diagnostic, no verdict.

Times a fixed pure-Python loop pinned to CPU 0 (the best of three) while
CPU 1 is idle, runs a polling read (``spin_readable`` on a socket nothing
is sent to: what a cmq reader waiting in ``QueueConfig.spin`` does), or
runs a plain compute loop. On bare metal with separate cores the three
agree. On this project's VMs (two vCPUs under KVM) the idle case was
steady (0.126-0.139 s) while a busy CPU 1, polling or computing, made the
same loop take up to 1.75x as long in about half of the rounds
(2026-11-24): the two vCPUs share something on the host (SMT siblings or
a shared physical CPU), which the guest does not report as steal time.

Why it matters: polling keeps the waiting vCPU busy, and on such a host a
busy vCPU can slow the peer it waits for. That is one reason the lab's
ping-ping and throughput cells (every process CPU-bound for 5-40 ms) move
between runs by more than their rules allow.

Run: python scripts/vcpu_contention.py [--rounds 8]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

_SIDE = {
    "poll": (
        "import os, socket\n"
        "from cmq.net._sock import spin_readable\n"
        "try:\n"
        "    from cmq._speedups import spin_readable\n"
        "except ImportError:\n"
        "    pass\n"
        "os.sched_setaffinity(0, {1})\n"
        "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        "s.bind(('127.0.0.1', 0))\n"
        "while True:\n"
        "    spin_readable(s.fileno(), 0.05)\n"
    ),
    "compute": "import os\nos.sched_setaffinity(0, {1})\nx = 0\nwhile True:\n    x += 1\n",
}


def _work() -> float:
    start = time.perf_counter()
    x = 0
    for i in range(3_000_000):
        x += i * i
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=8)
    args = ap.parse_args()
    if (os.cpu_count() or 1) < 2:
        sys.exit("needs two CPUs")
    os.sched_setaffinity(0, {0})
    results: dict[str, list[float]] = {"idle": [], "poll": [], "compute": []}
    for _ in range(args.rounds):
        for kind, times in results.items():
            side = None if kind == "idle" else subprocess.Popen([sys.executable, "-c", _SIDE[kind]])
            try:
                time.sleep(0.3)  # the side process is up and spinning
                times.append(min(_work() for _ in range(3)))
            finally:
                if side is not None:
                    side.kill()
                    side.wait()
            time.sleep(0.2)
    for kind, times in results.items():
        base = min(results["idle"])
        print(
            f"CPU 1 {kind:8} loop on CPU 0: "
            + " ".join(f"{t:.3f}" for t in times)
            + f" s (worst {max(times) / base:.2f}x the best idle)"
        )


if __name__ == "__main__":
    main()
