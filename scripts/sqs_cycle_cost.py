"""Instructions a `cmq serve` node executes per send+receive+delete cycle.

Starts one node on a fresh SQLite file under ``valgrind --tool=callgrind``,
runs --warm cycles (not counted), zeroes callgrind's counters, runs --cycles
cycles from --concurrency closed-loop clients (the asyncio load generator of
``cmq.lab.bench.sqs``), dumps the counters and prints instructions per
cycle. Instruction counts do not depend on other load on the machine, so
they compare two versions of the code where cycles/s cannot; they do not
count time spent waiting (fsync, the kernel's side of a send). With
--out DIR the callgrind files stay there for ``callgrind_annotate``.

Run: python scripts/sqs_cycle_cost.py [--cycles 400 --concurrency 16]
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from cmq.lab.bench.sqs import _call, _Conn


async def _run(base: str, url: str, n: int, concurrency: int) -> None:
    async def worker(count: int) -> None:
        conn = _Conn(base)
        for i in range(count):
            await _call(conn, "SendMessage", {"QueueUrl": url, "MessageBody": f"m{i}"})
            got: dict[str, object] = {}
            while not got.get("Messages"):
                got = await _call(conn, "ReceiveMessage", {"QueueUrl": url})
            handle = got["Messages"][0]["ReceiptHandle"]  # type: ignore[index]
            await _call(conn, "DeleteMessage", {"QueueUrl": url, "ReceiptHandle": handle})
        conn.close()

    shares = [n // concurrency + (i < n % concurrency) for i in range(concurrency)]
    await asyncio.gather(*(worker(s) for s in shares if s))


def _total(pattern: str) -> int:
    total = 0
    for path in glob.glob(pattern):
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("summary:") or line.startswith("totals:"):
                    total += int(line.split()[1])
                    break
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=400)
    ap.add_argument("--warm", type=int, default=100)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--out", help="keep the callgrind files in this directory")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="cmq-cg-")
    out = args.out or tmp
    os.makedirs(out, exist_ok=True)
    for old in glob.glob(f"{out}/callgrind.out.*"):
        os.unlink(old)
    proc = subprocess.Popen(
        [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out}/callgrind.out.%p",
            sys.executable,
            "-m",
            "cmq",
            "serve",
            "--port",
            "0",
            "--store",
            f"sqlite:{tmp}/db.sqlite3",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        m = re.search(r"http://(\S+)", line)
        if m is None:
            raise SystemExit(f"cmq serve did not start: {line!r}")
        base = f"http://{m.group(1)}"

        async def setup() -> str:
            conn = _Conn(base)
            url: str = (await _call(conn, "CreateQueue", {"QueueName": "cost"}))["QueueUrl"]
            conn.close()
            await _run(base, url, args.warm, args.concurrency)
            return url

        url = asyncio.run(setup())
        subprocess.run(["callgrind_control", "--zero", str(proc.pid)], check=True,
                       capture_output=True)  # fmt: skip
        start = time.monotonic()
        asyncio.run(_run(base, url, args.cycles, args.concurrency))
        elapsed = time.monotonic() - start
        subprocess.run(["callgrind_control", "--dump=cycles", str(proc.pid)], check=True,
                       capture_output=True)  # fmt: skip
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=120)
    dumps = [p for p in glob.glob(f"{out}/callgrind.out.*") if re.search(r"\.\d+\.\d+", p)]
    total = sum(_total(p) for p in dumps) if dumps else 0
    print(
        f"{args.cycles} cycles at concurrency {args.concurrency} in {elapsed:.1f} s under "
        f"callgrind: {total:,} instructions, {total / args.cycles:,.0f} per cycle"
    )
    if args.out is None:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
