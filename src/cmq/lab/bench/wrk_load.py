"""A compiled load generator for the throughput benchmark: wrk with a Lua script.

The asyncio generator of :mod:`cmq.lab.bench.sqs` spends about 0.2 ms of
client CPU a cycle; on two cores that is CPU the node under test does not
get. wrk (Debian's ``wrk`` package, C with LuaJIT) drives the same
send+receive+delete cycles of the SQS JSON protocol with less (the
benchmark reports both generators' CPU per cycle beside the node's).

How the script keeps a cycle's steps in order: wrk keeps one Lua state per
thread, calls ``request()`` whenever one of the thread's connections is
ready for its next request and ``response()`` with each reply, without
saying which connection it is. So the cycle is kept per thread, not per
connection: a connection's next request is a DeleteMessage when a receipt
handle waits for one, else a ReceiveMessage when more sends have been
answered than receives made, else a SendMessage. A receive is made only for
a message whose send was answered and that no other receive was made for,
so it always finds one (the queue is this run's alone, and every thread
keeps the same rule); an empty ``{}`` reply is therefore a DeleteMessage's,
and each one completes a cycle. A cycle is the same three calls as in the
asyncio generator. ``done()`` prints the totals of every thread as one JSON
line.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from typing import Any

from cmq._errors import CmqError, ConfigError

__all__ = ["THREADS", "WRK_MISSING", "wrk_cycles", "wrk_path"]

#: wrk threads per node: each serves many connections from one epoll loop.
THREADS = 2

#: Why the wrk generator cannot run, and how to get it.
WRK_MISSING = "wrk not found: apt-get install wrk"

_SCRIPT = r"""
local qurl = os.getenv("CMQ_BENCH_QUEUE")
local auth = os.getenv("CMQ_BENCH_AUTH")
local threads = {}

function setup(thread)
  table.insert(threads, thread)
end

function init(args)
  sent = 0        -- SendMessage replies
  claimed = 0     -- ReceiveMessage requests made
  handles = {}    -- receipt handles waiting for their DeleteMessage
  cycles = 0      -- DeleteMessage replies
  empty = 0       -- {} replies beyond the deletes made
  deleting = 0    -- DeleteMessage requests made
  failed = 0
end

local function call(action, body)
  return wrk.format("POST", "/", {
    ["Content-Type"] = "application/x-amz-json-1.0",
    ["X-Amz-Target"] = "AmazonSQS." .. action,
    ["Authorization"] = auth,
  }, body)
end

function request()
  local handle = table.remove(handles)
  if handle then
    deleting = deleting + 1
    return call("DeleteMessage",
      '{"QueueUrl":"' .. qurl .. '","ReceiptHandle":"' .. handle .. '"}')
  elseif sent > claimed then
    claimed = claimed + 1
    return call("ReceiveMessage", '{"QueueUrl":"' .. qurl .. '"}')
  else
    return call("SendMessage",
      '{"QueueUrl":"' .. qurl .. '","MessageBody":"m' .. (sent + claimed) .. '"}')
  end
end

function response(status, headers, body)
  if status ~= 200 then
    failed = failed + 1
    return
  end
  local handle = string.match(body, '"ReceiptHandle"%s*:%s*"([^"]+)"')
  if handle then
    table.insert(handles, handle)
  elseif string.find(body, "MD5OfMessageBody", 1, true) then
    sent = sent + 1
  elseif cycles < deleting then
    cycles = cycles + 1
  else
    empty = empty + 1
  end
end

function done(summary, latency, requests)
  local c, e, f, s = 0, 0, 0, 0
  for _, t in ipairs(threads) do
    c = c + t:get("cycles")
    e = e + t:get("empty")
    f = f + t:get("failed")
    s = s + t:get("sent")
  end
  io.write(string.format(
    '{"cycles":%d,"sent":%d,"empty":%d,"failed":%d,"requests":%d,"micros":%d,' ..
    '"socket_errors":%d}\n',
    c, s, e, f, summary.requests, summary.duration,
    summary.errors.connect + summary.errors.read + summary.errors.write +
    summary.errors.timeout))
end
"""


def wrk_path() -> str | None:
    """The wrk executable, or None when it is not installed."""
    return shutil.which("wrk")


def wrk_cycles(
    bases: Sequence[str], path: str, seconds: float, concurrency: int, authorization: str
) -> dict[str, Any]:
    """Run wrk against the nodes at ``bases`` for ``seconds``: ``concurrency``
    closed-loop workers (one thread and one connection each), spread over the
    nodes as evenly as they go, cycling on the queue at ``path``
    (``/ACCOUNT/NAME``) through whichever node they talk to.

    Returns cycles, seconds, cycles_per_s, errors (non-200 replies and socket
    errors), sent (SendMessage replies), empty_receives (none, unless
    another client takes the queue's messages) and ``client_cpu_s``, the CPU
    the wrk processes used. Raises
    ConfigError when wrk is missing, CmqError when it fails.
    """
    exe = wrk_path()
    if exe is None:
        raise ConfigError(WRK_MISSING)
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(_SCRIPT)
        script = f.name
    shares = [concurrency // len(bases) + (i < concurrency % len(bases)) for i in range(len(bases))]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    procs: list[subprocess.Popen[str]] = []
    try:
        for base, share in zip(bases, shares, strict=True):
            if share == 0:
                continue
            procs.append(
                subprocess.Popen(
                    [
                        exe,
                        f"-t{min(share, THREADS)}",
                        f"-c{share}",
                        f"-d{max(1, round(seconds))}s",
                        "--timeout",
                        "30s",
                        "-s",
                        script,
                        base + "/",
                    ],
                    env={
                        **os.environ,
                        "CMQ_BENCH_QUEUE": base + path,
                        "CMQ_BENCH_AUTH": authorization,
                    },
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        outputs = [proc.communicate(timeout=seconds + 60) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        os.unlink(script)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cycles = errors = sent = empty = 0
    elapsed = 0.0
    for proc, (out, err) in zip(procs, outputs, strict=True):
        lines = [line for line in out.splitlines() if line.startswith("{")]
        if proc.returncode != 0 or not lines:
            raise CmqError(f"wrk failed ({proc.returncode}): {err.strip()[-300:]}")
        totals = json.loads(lines[-1])
        cycles += totals["cycles"]
        sent += totals["sent"]
        empty += totals["empty"]
        errors += totals["failed"] + totals["socket_errors"]
        elapsed = max(elapsed, totals["micros"] / 1e6)
    return {
        "cycles": cycles,
        "seconds": round(elapsed, 3),
        "cycles_per_s": round(cycles / elapsed, 1) if elapsed > 0 else 0.0,
        "errors": errors,
        "sent": sent,
        "empty_receives": empty,
        "client_cpu_s": round(
            after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 3
        ),
    }
