"""Instructions a cmq round trip costs the application's thread, counted by callgrind. A diagnostic, no verdict.

Two queues in one thread, one message of ``--size`` bytes each way per
round trip (``push``, ``get_message``, ``push``, ``get``), ``spin=0``, run
under ``valgrind --tool=callgrind --separate-threads=yes`` twice: once with
no timed round trips and once with ``--count`` of them; the difference over
the count is what a round trip costs the main thread, in user-space
instructions. Counts do not depend on what else the machine does, so a
change to the hot path can be judged on a busy machine.

Only the main thread is counted: the queues' I/O threads wake on their
timers, and under valgrind a round trip lasts some fifty times longer, so
their share would be that of a much slower program. For the same reason a
reliable queue's acknowledgement delay is raised to 0.5 s for the run (a
STATUS every 2 ms would otherwise come with most round trips under
valgrind; with it, 28 in 2,300), and so is the gap within which a push
counts the application's last read as recent (``_ACK_POLL_GAP``, 100 us):
with acknowledgements that rare, more than 64 KB stays unacknowledged, and
past that a push whose application read longer than the gap ago reads the
acknowledgements itself, through the pure ``_after_append``. In real time
the read before a push is a microsecond old; under valgrind it was older
than 100 us in most round trips of the slower code and in few of the
faster, so the counts depended on the code's own speed (before 2026-11-28,
21:10 UTC, the script did not raise the gap: its counts then include that
path for many pushes: 2,405 of the 4,000 of 2,000 round trips on the code
of 030f049). ``--top N`` prints the N functions that cost the most per
round trip (self cost).

What it showed on 2026-11-28 at 21:10 UTC (512 B, 3,000 round trips):
reliable 57,128 and 59,643 instructions a round trip on the code of
030f049, 35,961-36,512 once the endpoint's, the receiver's and the
batcher's hot fields were C members; best-effort 57,308 before and 49,590
after (its receive path is still Python). Raw ``send`` and ``recv`` on two sockets
cost 8,257 a round trip in the same kind of count. (Earlier figures,
reliable 71,357-77,570 and best-effort 63,449-64,165, were counted without
the gap raised.) At 23:40 UTC: 33,407 (reliable) and 26,633 (best-effort)
on the code of 959af55, 23,709 and 19,831 once the compiled parts of a
round trip called each other in C; about 3,900 of the reliable count are
Python functions the reliability timers call, which fire by the clock and
so some fifty times as often per round trip as in real time.

Larger messages fill a reliable stream's window sooner, and what that
sets off comes by the clock too: at 4 KB the count was 101,719 (65,186 at
256 B), 15,428 of it in Python functions called from the compiled code,
where cProfile in real time finds none of them called more than once in
fifty round trips. Compare sizes by their own runs before and after a
change, not with each other.

Run (needs valgrind): python scripts/roundtrip_instructions.py [--delivery reliable] [--count 3000] [--size 512] [--top 0]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

_CHILD = """
import sys
import cmq.wire.reliable as R, cmq.wire.receiver as RX, cmq.net.queue as Q
R.MAX_ACK_DELAY = RX.MAX_ACK_DELAY = 0.5
Q._ACK_POLL_GAP = 0.5
import cmq
n, mode, size = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
a = cmq.Queue(0, "127.0.0.1", spin=0, delivery=mode)
b = cmq.Queue(0, "127.0.0.1", spin=0, delivery=mode)
ba, aa = b.address, a.address
body = b"x" * size
for _ in range(300):
    a.push(ba, body); b.get_message(timeout=5); b.push(aa, body); a.get(timeout=5)
for _ in range(n):
    a.push(ba, body); b.get_message(timeout=5); b.push(aa, body); a.get(timeout=5)
a.close(); b.close()
"""


def _run(out: str, count: int, delivery: str, size: int) -> None:
    cmd = ["valgrind", "--tool=callgrind", "--separate-threads=yes", f"--callgrind-out-file={out}", "-q",
           sys.executable, "-c", _CHILD, str(count), delivery, str(size)]  # fmt: skip
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _functions(path: str) -> dict[str, int]:
    """Self cost by function (``PROGRAM TOTALS`` included) of one callgrind file."""
    text = subprocess.run(
        ["callgrind_annotate", "--threshold=100", path], capture_output=True, text=True, check=True
    ).stdout
    costs: dict[str, int] = {}
    for line in text.splitlines():
        m = re.match(r"\s*([\d,]+)\s+\(\s*[\d.]+%\)\s+(.*)", line)
        if m:
            name = re.sub(
                r" \[.*\]$", "", re.sub(r"/tmp/python-build[^:]*/", "", m.group(2).strip())
            )
            costs[name] = costs.get(name, 0) + int(m.group(1).replace(",", ""))
    return costs


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--delivery", choices=["reliable", "unordered", "best-effort"], default="reliable"
    )
    p.add_argument(
        "--count", type=int, default=3000, help="timed round trips (default %(default)s)"
    )
    p.add_argument("--size", type=int, default=512, help="message bytes (default %(default)s)")
    p.add_argument("--top", type=int, default=0, help="print the N costliest functions (self cost)")
    args = p.parse_args()
    if args.count < 100 or args.size < 1 or args.top < 0:
        p.error("--count must be at least 100, --size at least 1, --top at least 0")
    for tool in ("valgrind", "callgrind_annotate"):
        if shutil.which(tool) is None:
            print(f"skipped: {tool} is not installed (apt-get install valgrind)")
            return 0
    with tempfile.TemporaryDirectory(prefix="cmq-callgrind-") as tmp:
        runs = {}
        for n in (0, args.count):
            out = os.path.join(tmp, f"run{n}.out")
            _run(out, n, args.delivery, args.size)
            runs[n] = _functions(f"{out}-01")  # thread 1: the main thread
    base, timed = runs[0], runs[args.count]
    per = {k: (timed.get(k, 0) - base.get(k, 0)) / args.count for k in set(base) | set(timed)}
    print(
        f"{args.delivery}, {args.size} B: {per.pop('PROGRAM TOTALS'):,.0f} instructions a round trip (main thread)"
    )
    for name, cost in sorted(per.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"  {cost:9,.0f}  {name[:110]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
