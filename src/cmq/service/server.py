"""Running nodes: build the app from a config and serve it with uvicorn.

With ``workers > 1`` uvicorn's supervisor starts that many processes on one
listening socket; each rebuilds the app from the config passed in the
environment (:data:`CONFIG_ENV`), since the processes are spawned.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import json
import os
import secrets
import socket
from collections.abc import Iterator
from typing import Any

from cmq._errors import ConfigError, TransportError
from cmq._extras import optional_imports
from cmq.service.app import CONSOLE_TOKEN_ENV, SqsApp
from cmq.service.config import ServiceConfig, StoreConfig
from cmq.service.connection import EdgeHttpProtocol, HttpLimits
from cmq.service.edge import EdgePolicy
from cmq.service.errors import StoreUnavailable
from cmq.service.operations import Bounds
from cmq.service.sigv4 import load_keys
from cmq.service.store import open_store

with optional_imports("the queue service"):
    import uvicorn
    from uvicorn.supervisors import Multiprocess

__all__ = [
    "CONFIG_ENV",
    "app_from_env",
    "apply_scheduling",
    "build_app",
    "check_store",
    "load_auth",
    "serve",
]

CONFIG_ENV = "CMQ_SERVE_CONFIG"


def load_auth(path: str) -> dict[str, str]:
    """The access keys of an auth file. Raises ConfigError."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the auth file {path}: {exc}") from exc
    try:
        return load_keys(text, path)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


def apply_scheduling(policy: str) -> bool:
    """Ask Linux to schedule the calling thread by ``policy`` (``"batch"``:
    SCHED_BATCH, ``"normal"``: SCHED_OTHER); the threads and processes it
    starts afterwards inherit it. So :func:`serve` calls it first, before
    the store's threads and any worker process exist.

    A batch thread that wakes does not preempt the thread running on its
    core; it runs when that one's turn ends (or at once on an idle core). A
    node wakes its own threads several times a request (the SQLite store's
    writer and fsync threads, the event loop when their answers come back),
    and where nodes outnumber cores each of those wake-ups used to preempt
    another node, or the node itself, in the middle of its work: CPU spent
    on switching and on refilling caches rather than on requests. Same CPU
    share either way (the nice value is unchanged); no privilege needed.

    Returns whether the policy was set: False where the OS has no such
    policy (not Linux) or refuses it, and the node runs as it was.
    """
    setter = getattr(os, "sched_setscheduler", None)
    wanted = getattr(os, "SCHED_BATCH" if policy == "batch" else "SCHED_OTHER", None)
    if setter is None or wanted is None:
        return False
    try:
        setter(0, wanted, os.sched_param(0))
    except OSError:
        return False
    return True


def build_app(config: ServiceConfig) -> SqsApp:
    """The ASGI app of one node. Raises ConfigError for an unreadable auth file."""
    return SqsApp(
        open_store(config.store),
        store_name=_describe(config.store),
        region=config.region,
        account_id=config.account_id,
        max_request_bytes=config.max_request_bytes,
        policy=EdgePolicy(
            listen_host=config.host,
            allowed_hosts=frozenset(config.allow_hosts),
            keys=load_auth(config.auth_file) if config.auth_file else None,
            allow_remote_unsigned=config.allow_remote_unsigned,
        ),
        bounds=Bounds(
            max_queues=config.max_queues,
            max_queue_messages=config.max_queue_messages,
            max_store_bytes=config.max_store_bytes,
        ),
        limits=HttpLimits(
            max_header_bytes=config.max_header_bytes,
            max_headers=config.max_headers,
            request_timeout=config.request_timeout,
        ),
    )


def app_from_env() -> SqsApp:
    """App factory for worker processes: the config comes from CMQ_SERVE_CONFIG."""
    raw = json.loads(os.environ[CONFIG_ENV])
    nodes = tuple((str(host), int(port)) for host, port in raw.pop("nodes"))
    store = StoreConfig(**{**raw.pop("store"), "nodes": nodes})
    raw["allow_hosts"] = tuple(raw["allow_hosts"])
    config = ServiceConfig(store=store, **raw)
    # Inherited from the supervisor already; set again in case it was not.
    apply_scheduling(config.scheduling)
    return build_app(config)


def _bind(host: str, port: int) -> socket.socket:
    """The listening socket, created with an explicit IPPROTO_TCP.

    asyncio turns on TCP_NODELAY only for sockets whose ``proto`` is
    IPPROTO_TCP, and accepted sockets inherit the listener's ``proto``; with
    uvicorn's own ``bind_socket`` (proto 0) every reply, written as headers
    then body, meets Nagle plus the client's delayed ACK: 40 ms per call.

    Raises TransportError (port in use, address not on this machine).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        reason = "the port is in use" if exc.errno == errno.EADDRINUSE else exc.strerror
        raise TransportError(f"cannot listen on {host}:{port}: {reason}") from exc
    sock.set_inheritable(True)
    return sock


async def _probe(config: StoreConfig) -> None:
    store = open_store(config)
    try:
        await store.open()
    finally:
        await store.close()


def check_store(config: StoreConfig) -> None:
    """Open and close the store once. Raises StoreUnavailable with the reason."""
    try:
        asyncio.run(_probe(config))
    except StoreUnavailable:
        raise
    except Exception as exc:  # any failure to open is reported in one line
        raise StoreUnavailable(f"cannot open the store {_describe(config)}: {exc}") from exc


def _describe(config: StoreConfig) -> str:
    if config.kind == "sqlite":
        return f"sqlite:{config.path}"
    if config.kind == "redis-cluster":
        return "redis-cluster://" + ",".join(f"{h}:{p}" for h, p in config.nodes)
    return "memory:"


class _Server(uvicorn.Server):
    """Prints the ready line once the app started (store open) and serves."""

    def __init__(self, config: uvicorn.Config, ready: str) -> None:
        super().__init__(config)
        self.ready = ready

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if not self.should_exit:
            print(self.ready, flush=True)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        with super().capture_signals():
            yield
            # SIGTERM or SIGINT asked for a clean stop and got one: exit 0,
            # rather than die of the signal uvicorn would raise again.
            self._captured_signals.clear()


def serve(config: ServiceConfig) -> None:
    """Serve until interrupted.

    Prints ``listening on http://HOST:PORT`` once bound and the store is
    open, and nothing before. Raises ConfigError (bad auth file),
    TransportError (cannot bind) or StoreUnavailable (the store does not
    open), each with a one-line message.
    """
    if config.auth_file:
        load_auth(config.auth_file)
    # First, so that every thread and worker process started below inherits it.
    apply_scheduling(config.scheduling)
    common: dict[str, Any] = {
        "host": config.host,
        "port": config.port,
        "log_level": "warning",
        "access_log": False,
        "lifespan": "on",
        # Idle keep-alive connections of load generators stay open.
        "timeout_keep_alive": 60,
        # Queue URLs come from the Host header; X-Forwarded-* are not trusted.
        "proxy_headers": False,
        # Bounded heads and request deadlines (cmq.service.connection).
        "http": EdgeHttpProtocol,
    }
    sock = _bind(config.host, config.port)
    try:
        check_store(config.store)
    except BaseException:
        sock.close()
        raise
    host, port = sock.getsockname()[:2]
    ready = f"listening on http://{host}:{port}"
    if config.workers == 1:
        app = build_app(config)
        server = _Server(uvicorn.Config(app, **common), ready)
        server.run(sockets=[sock])
        if app.startup_error is not None:
            raise StoreUnavailable(f"cannot open the store: {app.startup_error}")
        return
    raw = dataclasses.asdict(config)
    raw["nodes"] = raw["store"].pop("nodes")
    os.environ[CONFIG_ENV] = json.dumps(raw)
    os.environ.setdefault(CONSOLE_TOKEN_ENV, secrets.token_urlsafe(32))
    uv = uvicorn.Config(
        "cmq.service.server:app_from_env",
        factory=True,
        workers=config.workers,
        **common,
    )
    # Its signal handlers are in place once it exists: a SIGTERM right after
    # the ready line stops it cleanly rather than kill this process.
    supervisor = Multiprocess(uv, sockets=[sock])
    # Each worker opens the store itself; it opened here just above.
    print(ready, flush=True)
    supervisor.run()
