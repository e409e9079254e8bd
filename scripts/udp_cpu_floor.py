"""The floor of CPU per message over loopback UDP: what the kernel and a bare loop cost.

A sender process sends prebuilt datagrams of ``--per`` messages of
``--size`` bytes as fast as ``sendto`` takes them; the receiver reads them
with ``recv_into`` into one buffer: no framing, no per-message object, no
acknowledgement. Prints the CPU time of both processes (user and system)
per delivered message, the figure ``cmq bench throughput`` gives as
``CPU ns/msg``, so that a CPU target can be set against what no
implementation in this process model can go below. ``--per 1`` is what
``cmq bench throughput --systems udp`` measures too; ``--per`` above 1 packs
messages as cmq's batches do:

    .venv/bin/python scripts/udp_cpu_floor.py --size 16384 --per 1
    .venv/bin/python scripts/udp_cpu_floor.py --size 512 --per 120
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import sys
import time

_BUFFER = 8 << 20  # both sockets' kernel buffers (capped by net.core.*mem_max)


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _send(addr: tuple[str, int], datagram: bytes, seconds: float, out: int) -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _BUFFER)
    send, clock = s.sendto, time.monotonic
    end = clock() + seconds
    n = 0
    while clock() < end:
        for _ in range(64):
            send(datagram, addr)
        n += 64
    os.write(out, f"{n} {_cpu()}".encode())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=int, default=16384, help="message bytes (default %(default)s)")
    p.add_argument("--per", type=int, default=1, help="messages a datagram (default %(default)s)")
    p.add_argument("--duration", type=float, default=2.0, help="seconds of sending (default %(default)s)")
    args = p.parse_args()
    if args.size < 1 or args.per < 1 or args.duration <= 0:
        p.error("--size and --per must be at least 1, --duration above 0")
    if args.size * args.per > 65507:
        p.error("--size x --per must fit one UDP datagram (65,507 bytes)")
    r = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    r.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _BUFFER)
    r.bind(("127.0.0.1", 0))
    addr = r.getsockname()
    rd, wr = os.pipe()
    pid = os.fork()
    if pid == 0:
        r.close()
        try:
            _send(addr, b"x" * (args.size * args.per), args.duration, wr)
        finally:
            os._exit(0)
    buf = bytearray(65536)
    got = 0
    r.settimeout(0.5)  # the sender's end: half a second without a datagram
    c0 = _cpu()
    try:
        while True:
            got += r.recv_into(buf)
    except TimeoutError:
        pass
    receiver = _cpu() - c0
    os.waitpid(pid, 0)
    sent, sender = os.read(rd, 100).decode().split()
    delivered = got // args.size
    if not delivered:
        print("nothing was delivered", file=sys.stderr)
        return 1
    print(f"{args.size:,} B, {args.per} a datagram: {delivered:,} of {int(sent) * args.per:,} messages delivered; "
          f"CPU per delivered message {(float(sender) + receiver) / delivered * 1e9:,.0f} ns "
          f"(sender {float(sender) / delivered * 1e9:,.0f}, receiver {receiver / delivered * 1e9:,.0f})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
