"""MessagePack-RPC through msgpack-rpc-python, the library the CMQ paper measured.

msgpack-rpc-python (0.4.1, on tornado 4) pins the old ``msgpack-python``
0.5, which cannot live beside cmq's msgpack 1.x. So this adapter runs its
roles under its own virtual environment, made on first use (``available()``)
under ``$CMQ_MSGPACK_RPC_VENV``, by default
``~/.cache/cmq/msgpack-rpc-venv``; its workers run this file by path with that
interpreter and import nothing of cmq (only :mod:`_common`, which is
standard-library only).

Throughput: ``notify("push", payload)`` (MessagePack-RPC's one-way message)
as fast as the client takes them, then one ``call("end")``, which also waits
until every notification before it has left. Round trips: ``call("echo",
payload)``; ping-ping keeps up to ``window`` ``call_async`` futures in flight.
The library checks call timeouts about once a second, so a lost round trip
is detected that late.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING or __package__:
    from cmq.lab.systems import _common
else:  # run by path under msgpack-rpc's own interpreter: no cmq there
    import _common

__all__ = [
    "DATAGRAM",
    "MAX_SIZE",
    "NAME",
    "available",
    "command",
    "pingping_client",
    "pingping_server",
    "pingpong_client",
    "pingpong_server",
    "throughput_receiver",
    "throughput_sender",
]

NAME = "msgpack-rpc"
DATAGRAM = False
MAX_SIZE = 16 << 20

PACKAGE = "msgpack-rpc-python==0.4.1"
"""What the adapter's own virtual environment installs (the last release)."""

_READY_STAMP = ".cmq-ready"
_TICK_MS = 50  # how often a waiting server looks at its idle and deadline clocks


def venv_dir() -> Path:
    """Where msgpack-rpc's own virtual environment lives (or will)."""
    env = os.environ.get("CMQ_MSGPACK_RPC_VENV")
    if env:
        return Path(env)
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "cmq" / "msgpack-rpc-venv"


def _venv_python() -> Path:
    return venv_dir() / "bin" / "python"


def _setup() -> str | None:
    """Make the virtual environment once; ``None`` when it is ready, else why not."""
    import fcntl

    root = venv_dir()
    if (root / _READY_STAMP).exists():
        return None
    root.parent.mkdir(parents=True, exist_ok=True)
    # Two processes setting it up at once (two test workers) take turns.
    with open(root.parent / f"{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (root / _READY_STAMP).exists():
            return None
        steps = [
            [sys.executable, "-m", "venv", "--clear", str(root)],
            [
                str(_venv_python()),
                "-m",
                "pip",
                "install",
                "-q",
                "--disable-pip-version-check",
                PACKAGE,
            ],
            [str(_venv_python()), "-c", "import msgpackrpc"],
        ]
        for step in steps:
            done = subprocess.run(step, capture_output=True, text=True, check=False)
            if done.returncode:
                lines = [ln for ln in (done.stderr or done.stdout).splitlines() if ln.strip()]
                why = lines[-1] if lines else f"exit code {done.returncode}"
                return f"could not set up its own virtualenv at {root} ({' '.join(step[:4])}...: {why})"
        (root / _READY_STAMP).touch()
    return None


def available() -> str | None:
    """``None`` once msgpack-rpc's own virtual environment works (made on first use)."""
    reason = _setup()
    if reason is not None:
        return f"{reason}; it needs PyPI's {PACKAGE}"
    return None


def command() -> list[str]:
    """This file, run by path with msgpack-rpc's own interpreter."""
    return [str(_venv_python()), str(Path(__file__).resolve())]


def _free_port(bind: str) -> int:
    # msgpack-rpc's listen() does not tell the port it bound; take a free
    # one first (another process could take it in between: then the run fails
    # with a clear error, it does not measure the wrong thing).
    with socket.socket() as s:
        s.bind((bind, 0))
        port: int = s.getsockname()[1]
        return port


def _ioloop() -> Any:
    # tornado exists only in msgpack-rpc's own environment (no stubs here).
    import importlib

    return importlib.import_module("tornado.ioloop")


def _address(peer: dict[str, Any]) -> Any:
    import msgpackrpc

    return msgpackrpc.Address(peer["host"], peer["port"])


class _Watch:
    """Stops a server's loop at the end marker, an idle gap, or the deadline."""

    def __init__(self, server: Any, startup: float, idle: float, deadline: float) -> None:
        ioloop = _ioloop()
        self.server = server
        self.clock = time.monotonic_ns
        self.begin = self.clock()
        self.startup_ns = int(startup * 1e9)
        self.idle_ns = int(idle * 1e9)
        self.stop_at = self.begin + int(deadline * 1e9)
        self.n = 0
        self.first = self.last = 0
        self.stopped = ""
        self._timer = ioloop.PeriodicCallback(self._check, _TICK_MS)

    def run(self) -> None:
        self._timer.start()
        self.server.start()  # returns when stop() is called
        self._timer.stop()

    def stop(self, why: str) -> None:
        if not self.stopped:
            self.stopped = why
            self.server.stop()

    def _check(self) -> None:
        now = self.clock()
        if now > self.stop_at:
            self.stop("deadline")
        elif not self.n and now - self.begin > self.startup_ns:
            self.stop("startup")
        elif self.n and now - self.last > self.idle_ns:
            self.stop("idle")


def _serve(
    handler_cls: type, bind: str, ready: _common.Ready, startup: float, idle: float, deadline: float
) -> _Watch:
    import msgpackrpc

    port = _free_port(bind)
    handler = handler_cls()
    server = msgpackrpc.Server(handler)
    server.listen(msgpackrpc.Address(bind, port))
    watch = _Watch(server, startup, idle, deadline)
    handler.watch = watch
    ready({"host": bind, "port": port})
    watch.run()
    server.close()
    return watch


class _Sink:
    """Throughput receiver's RPC methods."""

    watch: _Watch

    def push(self, msg: bytes) -> None:
        w = self.watch
        w.last = w.clock()
        if not w.n:
            w.first = w.last
        w.n += 1

    def ping(self) -> bool:
        return True

    def end(self) -> int:
        self.watch.last = self.watch.clock() if not self.watch.n else self.watch.last
        # Answer first, stop the loop on its next turn.
        _ioloop().IOLoop.current().add_callback(self.watch.stop, "end")
        return self.watch.n


class _Echo:
    """Echo server's RPC methods."""

    watch: _Watch

    def echo(self, msg: bytes) -> bytes:
        w = self.watch
        w.last = w.clock()
        w.n += 1
        return msg

    def end(self) -> bool:
        _ioloop().IOLoop.current().add_callback(self.watch.stop, "end")
        return True


def throughput_receiver(
    *,
    ready: _common.Ready,
    size: int,
    bind: str = "127.0.0.1",
    startup: float = 10.0,
    idle: float = 10.0,
    deadline: float = 120.0,
) -> dict[str, Any]:
    """Count ``push`` notifications until ``end``, an idle gap, or the deadline."""
    w = _serve(_Sink, bind, ready, startup, idle, deadline)
    return _common.receiver_result(
        delivered=w.n, size=size, first_ns=w.first, last_ns=w.last, stopped=w.stopped
    )


def throughput_sender(
    *, peer: dict[str, Any], size: int, count: int | None = None, duration: float | None = None
) -> dict[str, Any]:
    """Notify as fast as the client takes them; one ``end`` call waits for them to leave."""
    import msgpackrpc

    client = msgpackrpc.Client(_address(peer), timeout=60)
    try:
        client.call("ping")  # connect before the clock starts
        notify = client.notify
        result = _common.send_loop(
            lambda m: notify("push", m), _common.payload(size), count=count, duration=duration
        )
        client.call("end")
        return result
    finally:
        client.close()


def pingpong_server(
    *,
    ready: _common.Ready,
    size: int,
    bind: str = "127.0.0.1",
    startup: float = 10.0,
    idle: float = 5.0,
    deadline: float = 120.0,
) -> dict[str, Any]:
    """Answer ``echo`` calls with their argument until ``end`` or an idle gap."""
    w = _serve(_Echo, bind, ready, startup, idle, deadline)
    return {"echoed": w.n, "stopped": w.stopped}


pingping_server = pingpong_server


def _client(
    peer: dict[str, Any], size: int, count: int, timeout: float, window: int | None
) -> dict[str, Any]:
    # window None: ping-pong; a number: ping-ping with that many in flight.
    from collections import deque

    import msgpackrpc
    from msgpackrpc.error import TimeoutError as RpcTimeout

    # The library's own timeout is whole seconds, checked about once a second.
    client = msgpackrpc.Client(_address(peer), timeout=max(1, round(timeout)))
    futures: deque[Any] = deque()
    call_async = client.call_async

    def send(msg: bytes) -> None:
        futures.append(call_async("echo", msg))

    def recv(_left: float) -> bytes | None:
        # Replies come in call order on the one connection: the oldest
        # future is the next reply.
        if not futures:
            return None
        try:
            reply: bytes = futures.popleft().get()
        except RpcTimeout:
            return None
        return reply

    try:
        client.call("echo", b"")  # connect before the clock starts
        if window is None:
            return _common.pingpong_loop(send, recv, size=size, count=count, timeout=timeout)
        return _common.pingping_loop(
            send, recv, size=size, count=count, timeout=timeout, window=window
        )
    finally:
        try:
            client.call("end")
        except Exception:  # noqa: BLE001 - the server may be gone; it idles out then
            pass
        client.close()


def pingpong_client(
    *, peer: dict[str, Any], size: int, count: int, timeout: float = 0.2
) -> dict[str, Any]:
    """Ping-pong ``count`` ``echo`` calls."""
    return _client(peer, size, count, timeout, None)


def pingping_client(
    *, peer: dict[str, Any], size: int, count: int, timeout: float = 0.2, window: int = 16
) -> dict[str, Any]:
    """Ping-ping ``count`` ``echo`` calls, up to ``window`` in flight."""
    return _client(peer, size, count, timeout, window)


if __name__ == "__main__":
    sys.exit(_common.worker_main(sys.modules[__name__], sys.argv[1:]))
