"""Raw UDP ping-pong, blocking against polling before the read, beside cmq's polling reads.

A diagnostic (no verdict) for what `QueueConfig.spin` buys and what it does
not: the same 512 B ping-pong over two plain sockets in two processes,
each side either blocking in ``recv`` (as the lab's ``udp`` peer does) or
polling the socket without blocking, yielding the CPU between polls, for up
to ``--spin-us`` before it blocks (as a cmq ``Queue`` does by default).
``--stall-every N`` makes the server sleep 5 ms before every Nth reply, as
a lost datagram's repair would. Prints one line per variant and round: the
median and 90th percentile round trip.

cmq against the polling raw socket says what cmq's own work costs per
round trip; against the blocking one, what a user sees beside plain
sockets.

Run: python scripts/raw_udp_polling.py [--pin spread|same|none] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import socket
import time

_END = b"q"


def _recv(sock: socket.socket, spin: float) -> tuple[bytes, object]:
    if spin > 0:
        end = time.perf_counter() + spin
        sock.setblocking(False)
        try:
            while True:
                try:
                    return sock.recvfrom(65536)
                except BlockingIOError:
                    if time.perf_counter() > end:
                        break
                    os.sched_yield()
        finally:
            sock.setblocking(True)
    return sock.recvfrom(65536)


def _server(sock: socket.socket, spin: float, stall_every: int, cpu: int | None) -> None:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    n = 0
    while True:
        data, addr = _recv(sock, spin)
        if data == _END:
            return
        n += 1
        if stall_every and n % stall_every == 0:
            time.sleep(0.005)
        sock.sendto(data, addr)


def one_run(spin: float, stall_every: int, count: int, size: int, pins: tuple[int, int] | None) -> list[float]:
    """Round trips in microseconds of one ping-pong (the first tenth dropped as warm-up)."""
    srv = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    srv.bind(("127.0.0.1", 0))
    addr = srv.getsockname()
    pid = os.fork()
    if pid == 0:  # the server
        try:
            _server(srv, spin, stall_every, None if pins is None else pins[1])
        finally:
            os._exit(0)
    srv.close()
    if pins is not None:
        os.sched_setaffinity(0, {pins[0]})
    cli = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    cli.connect(addr)
    msg = b"x" * size
    out = []
    try:
        for _ in range(count):
            t0 = time.perf_counter()
            cli.send(msg)
            _recv(cli, spin)
            out.append((time.perf_counter() - t0) * 1e6)
    finally:
        cli.send(_END)
        os.waitpid(pid, 0)
        cli.close()
    return out[count // 10 :]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pin", choices=("spread", "same", "none"), default="spread")
    ap.add_argument("--spin-us", type=float, default=100.0, help="polling budget of the polling variant")
    ap.add_argument("--stall-every", type=int, default=0, help="server sleeps 5 ms before every Nth reply")
    ap.add_argument("--count", type=int, default=5000)
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    first = min(os.sched_getaffinity(0))
    others = sorted(os.sched_getaffinity(0) - {first})
    pins = {"same": (first, first), "spread": (first, others[0] if others else first), "none": None}[args.pin]
    for r in range(args.rounds):
        for name, spin in (("blocking", 0.0), ("polling", args.spin_us * 1e-6)):
            rts = sorted(one_run(spin, args.stall_every, args.count, args.size, pins))
            print(
                f"round {r} {name:8s} pin={args.pin} stall_every={args.stall_every}: "
                f"p50 {rts[len(rts) // 2]:.1f} us, p90 {rts[int(len(rts) * 0.9)]:.1f} us"
            )


if __name__ == "__main__":
    main()
