"""Ping-pong through a cmq broker (the AMQP suite's DE-PP, alone): round trip and CPU per process.

Starts ``cmq broker`` on an ephemeral port, a pinger and an echoer as
processes of their own (each a BrokerClient consuming one queue of a direct
exchange), and times ``--count`` round trips after ``--warmup``. Prints the
mean, p50 and p99 round trip and the CPU each process spent per round trip
(user + system, and user alone), so that a change to the broker or the
endpoint can be judged in CPU, which the machine's noise moves less than
time. ``--pin`` places the three processes (e.g. ``0,0,0``: one core);
``--spin-us`` is the broker's (see ``cmq broker --help``). For instruction
counts, run it with ``--valgrind`` (each process under callgrind; slow):

    .venv/bin/python scripts/broker_pingpong.py [--count 3000] [--size 16] [--pin 0,1,0] [--spin-us 0]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from typing import Any

EXCHANGE = "pp"


def _cpu() -> tuple[float, float]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime, r.ru_utime


def _proc_cpu(pid: int) -> tuple[float, float]:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    user, system = int(fields[11]) / tick, int(fields[12]) / tick
    return user + system, user


def _role(args: argparse.Namespace) -> None:
    from cmq.routing import BrokerClient

    warm, count = args.warmup, args.count
    with BrokerClient(args.broker, timeout=10.0) as c:
        if args.role == "echo":
            with c.consume("to-echo", prefetch=256) as consumer:
                print("READY", flush=True)
                n, c0 = 0, _cpu()
                while n < warm + count:
                    for body in consumer.get_bodies(timeout=10.0):
                        c.publish(EXCHANGE, "to-ping", body)
                        c.flush()
                        n += 1
                        if n == warm:
                            c0 = _cpu()
                c1 = _cpu()
                print(json.dumps({"cpu": (c1[0] - c0[0]) / count, "user": (c1[1] - c0[1]) / count}), flush=True)
            return
        with c.consume("to-ping", prefetch=256) as consumer:
            body = b"x" * args.size
            times: list[float] = []
            c0 = _cpu()
            for i in range(warm + count):
                if i == warm:
                    c0 = _cpu()
                t = time.perf_counter()
                c.publish(EXCHANGE, "to-echo", body)
                c.flush()
                consumer.get_bodies(timeout=10.0)
                times.append(time.perf_counter() - t)
            c1 = _cpu()
            times = sorted(times[warm:])
            print(json.dumps({
                "mean_us": sum(times) / len(times) * 1e6,
                "p50_us": times[len(times) // 2] * 1e6,
                "p99_us": times[int(len(times) * 0.99)] * 1e6,
                "cpu": (c1[0] - c0[0]) / count, "user": (c1[1] - c0[1]) / count,
            }), flush=True)  # fmt: skip


def _spawn(cmd: list[str], cpus: str | None, valgrind: str | None) -> subprocess.Popen[str]:
    if valgrind:
        cmd = ["valgrind", "--tool=callgrind", "-q", f"--callgrind-out-file={valgrind}", *cmd]
    if cpus:
        cmd = ["taskset", "-c", cpus, *cmd]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--count", type=int, default=3000, help="timed round trips (default %(default)s)")
    p.add_argument("--warmup", type=int, default=200, help="round trips before timing (default %(default)s)")
    p.add_argument("--size", type=int, default=16, help="body bytes (default %(default)s)")
    p.add_argument("--pin", default=None, help="CPUs of broker,echo,ping, e.g. 0,0,0 (default: unpinned)")
    p.add_argument("--spin-us", type=float, default=None, help="the broker's --spin-us (default: its own)")
    p.add_argument("--valgrind", metavar="DIR", default=None, help="run each process under callgrind, files in DIR")
    p.add_argument("--role", choices=["echo", "ping"], help=argparse.SUPPRESS)
    p.add_argument("--broker", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.role:
        _role(args)
        return 0
    if args.count < 1 or args.warmup < 0 or args.size < 0:
        p.error("--count must be at least 1, --warmup and --size at least 0")
    pins: list[str | None] = [None, None, None]
    if args.pin:
        pins = list(args.pin.split(","))  # type: ignore[arg-type]
        if len(pins) != 3:
            p.error("--pin takes three CPU lists: broker,echo,ping")
    vg = (lambda role: os.path.join(args.valgrind, f"{role}.out")) if args.valgrind else (lambda role: None)
    if args.valgrind:
        os.makedirs(args.valgrind, exist_ok=True)
    py = sys.executable
    broker_cmd = [py, "-m", "cmq", "broker", "--port", "0", "--in-memory"]
    if args.spin_us is not None:
        broker_cmd += ["--spin-us", str(args.spin_us)]
    broker = _spawn(broker_cmd, pins[0], vg("broker"))
    procs: list[subprocess.Popen[str]] = [broker]
    try:
        assert broker.stdout is not None
        line = broker.stdout.readline()  # "cmq broker serving on HOST:PORT"
        if "serving on" not in line:
            print(f"broker did not start: {line!r}", file=sys.stderr)
            return 1
        address = line.rsplit(" ", 1)[1].strip()
        from cmq.routing import BrokerClient

        with BrokerClient(address, timeout=30.0) as admin:
            admin.declare_exchange(EXCHANGE, "direct")
            for q in ("to-echo", "to-ping"):
                admin.declare_queue(q)
                admin.bind(q, EXCHANGE, q)
        role = [__file__, "--broker", address, "--count", str(args.count), "--warmup", str(args.warmup),
                "--size", str(args.size), "--role"]  # fmt: skip
        echo = _spawn([py, *role, "echo"], pins[1], vg("echo"))
        procs.append(echo)
        assert echo.stdout is not None
        echo.stdout.readline()  # READY
        before = _proc_cpu(broker.pid) if not args.valgrind else (0.0, 0.0)
        ping = _spawn([py, *role, "ping"], pins[2], vg("ping"))
        procs.append(ping)
        out, _ = ping.communicate(timeout=600)
        after = _proc_cpu(broker.pid) if not args.valgrind else (0.0, 0.0)
        echo_out, _ = echo.communicate(timeout=60)
        r: dict[str, Any] = json.loads(out)
        e: dict[str, Any] = json.loads(echo_out)
        print(f"broker ping-pong, {args.size} B, {args.count} round trips: mean {r['mean_us']:.1f} us, "
              f"p50 {r['p50_us']:.1f} us, p99 {r['p99_us']:.1f} us")  # fmt: skip
        if not args.valgrind:
            total = args.count + args.warmup  # the broker's CPU covers the warm-up too
            print(f"CPU per round trip (user): ping {r['cpu'] * 1e6:.1f} us ({r['user'] * 1e6:.1f}), "
                  f"echo {e['cpu'] * 1e6:.1f} us ({e['user'] * 1e6:.1f}), "
                  f"broker {(after[0] - before[0]) / total * 1e6:.1f} us ({(after[1] - before[1]) / total * 1e6:.1f})")  # fmt: skip
        return 0
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()


if __name__ == "__main__":
    sys.exit(main())
