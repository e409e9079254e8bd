"""Ping-pong on one CPU: how far Python framing alone is from raw UDP.

Times a round trip between two processes pinned to the same CPU for four
implementations, interleaved, each in its own pair of processes:

- ``udp``: raw sockets, one datagram each way (unconnected, as cmq's own socket);
- ``framing``: twenty lines of Python that write and check cmq's 16-byte
  header and length prefix, nothing else (the floor for any Python framing);
- ``core``: cmq's sans-IO core (``Batcher.take_idle``, ``Receiver.receive_one``)
  on a bare socket;
- ``queue``: ``cmq.Queue`` (``push`` and ``get``; the server ``get_message``).

``--no-aslr`` starts every process under ``setarch -R`` (no address-space
randomisation): then both processes have their interpreter at the same
addresses, as processes forked from one parent do, and the one-core figures
drop. Run from the repository root::

    .venv/bin/python scripts/onecore_roundtrip.py
    .venv/bin/python scripts/onecore_roundtrip.py --no-aslr --repeat 5
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

MODES = ("udp", "framing", "core", "queue")
Send = Callable[[bytes, Any], None]
Recv = Callable[[], tuple[bytes, Any]]


def _endpoint(mode: str) -> tuple[int, Send, Recv]:
    """(port, send(payload, addr), recv() -> (payload, addr)) for ``mode``."""
    if mode == "queue":
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
        import cmq

        q = cmq.Queue(0, "127.0.0.1")
        push, get_message = q.push, q.get_message

        def q_send(payload: bytes, addr: Any) -> None:
            push(addr, payload)

        def q_recv() -> tuple[bytes, Any]:
            m = get_message(timeout=5.0)
            return m.payload, m.sender

        return q.port, q_send, q_recv
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    port: int = sock.getsockname()[1]
    buf = bytearray(65536)
    view = memoryview(buf)
    recvfrom_into, sendto = sock.recvfrom_into, sock.sendto
    if mode == "udp":

        def u_recv() -> tuple[bytes, Any]:
            n, addr = recvfrom_into(buf)
            return view[:n].tobytes(), addr

        return port, cast(Send, sendto), u_recv  # the socket's own method: no wrapper
    if mode == "framing":
        one = struct.Struct(">IIIIB")
        pack_seq = struct.Struct(">I").pack
        head = bytes.fromhex("c3510100") + struct.pack(">II", 4242, 0)
        expected: dict[Any, int] = {}
        seqs = [0]

        def f_send(payload: bytes, addr: Any) -> None:
            seq = seqs[0]
            seqs[0] = seq + 1
            sendto(b"".join((head, pack_seq(seq), bytes((len(payload),)), payload)), addr)

        def f_recv() -> tuple[bytes, Any]:
            n, addr = recvfrom_into(buf)
            data = view[:n].tobytes()
            _, sender, mailbox, seq, length = one.unpack_from(data)
            key = (addr, sender, mailbox)
            if length != n - 17 or expected.get(key, seq) != seq:
                raise RuntimeError("unexpected datagram")
            expected[key] = seq + 1
            return data[17:], addr

        return port, f_send, f_recv
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
    from cmq._config import QueueConfig
    from cmq.wire.batcher import Batcher
    from cmq.wire.receiver import Receiver

    config = QueueConfig()
    batcher, receiver = Batcher(config, 4242), Receiver(config)
    lock = threading.Lock()
    clock = time.monotonic
    streams: dict[Any, Any] = {}

    def c_send(payload: bytes, addr: Any) -> None:
        s = streams.get(addr)
        if s is None:
            s = streams[addr] = batcher.stream(addr, 0)
        s.frames.append(payload)
        with lock:
            datagram = batcher.take_idle(s, clock())
            if datagram is None:
                raise RuntimeError("the destination was not idle")
            sendto(datagram, addr)
            s.last_send = clock()

    def c_recv() -> tuple[bytes, Any]:
        with lock:
            n, addr = recvfrom_into(buf)
            data = view[:n].tobytes()
            now = batcher.waited_at = clock()
            item = receiver.receive_one(data, addr, now, 0)
        if item is None:  # a stream's first datagram takes the general path
            item = receiver.mailboxes[0].pop_item()
            if item is None:
                raise RuntimeError("undelivered datagram")
        payload: bytes = item[0]
        return payload, addr

    return port, c_send, c_recv


def _serve(mode: str, count: int) -> None:
    port, send, recv = _endpoint(mode)
    print(port, flush=True)
    for _ in range(count + 1):  # one warm-up round trip
        payload, addr = recv()
        send(payload, addr)
    time.sleep(0.2)  # let the last reply leave before the socket closes


def _client(mode: str, count: int, port: int) -> None:
    _, send, recv = _endpoint(mode)
    dest = ("127.0.0.1", port)
    msg = b"ping"
    send(msg, dest)
    recv()
    t0 = time.perf_counter()
    for _ in range(count):
        send(msg, dest)
        recv()
    print(f"{(time.perf_counter() - t0) / count * 1e6:.2f}", flush=True)


def _measure(mode: str, count: int, cpu: int, prefix: list[str]) -> float:
    me = [sys.executable, str(Path(__file__).resolve())]

    def pin() -> None:
        os.sched_setaffinity(0, {cpu})

    server = subprocess.Popen(
        [*prefix, *me, "--serve", mode, "--count", str(count)],
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=pin,
    )
    try:
        assert server.stdout is not None
        port = server.stdout.readline().strip()
        if not port:
            raise SystemExit(f"the {mode} server did not start")
        out = subprocess.run(
            [*prefix, *me, "--client", mode, "--count", str(count), "--port", port],
            capture_output=True,
            text=True,
            preexec_fn=pin,
            timeout=120,
            check=True,
        )
        return float(out.stdout.strip())
    finally:
        server.wait(timeout=30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=20000, help="round trips per run (default 20000)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each mode, interleaved (default 3)")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma separated, of {', '.join(MODES)}")
    parser.add_argument("--no-aslr", action="store_true", help="start every process under setarch -R")
    parser.add_argument("--serve", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--client", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        _serve(args.serve, args.count)
        return 0
    if args.client:
        _client(args.client, args.count, args.port)
        return 0
    modes = [m for m in args.modes.split(",") if m]
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        parser.error(f"unknown modes {unknown}; use {', '.join(MODES)}")
    if args.count < 1 or args.repeat < 1:
        parser.error("--count and --repeat must be at least 1")
    prefix: list[str] = []
    if args.no_aslr:
        setarch = shutil.which("setarch")
        if setarch is None:
            parser.error("--no-aslr needs setarch (util-linux)")
        prefix = [setarch, "-R"]
    cpu = min(os.sched_getaffinity(0))
    runs: dict[str, list[float]] = {m: [] for m in modes}
    for r in range(args.repeat):
        for mode in modes:
            us = _measure(mode, args.count, cpu, prefix)
            runs[mode].append(us)
            print(f"run {r + 1}/{args.repeat} {mode:8s} {us:7.2f} us", file=sys.stderr)
    base = min(runs["udp"]) if "udp" in runs else None
    aslr = "off (setarch -R)" if args.no_aslr else "on"
    print(f"one-core round trip on CPU {cpu}, {args.count} round trips a run, address randomisation {aslr}")
    for mode in modes:
        values = sorted(runs[mode])
        ratio = f"  {values[0] / base:.2f}x-{values[-1] / base:.2f}x fastest udp" if base else ""
        print(f"{mode:8s} {values[0]:7.2f}-{values[-1]:7.2f} us{ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
