"""Running nodes: build the app from a config and serve it with uvicorn.

With ``workers > 1`` uvicorn's supervisor starts that many processes on one
listening socket; each rebuilds the app from the config passed in the
environment (:data:`CONFIG_ENV`), since the processes are spawned.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import sys
from typing import Any

import uvicorn
from uvicorn.supervisors import Multiprocess

from cmq.service.app import SqsApp
from cmq.service.config import ServiceConfig, StoreConfig
from cmq.service.store import open_store

__all__ = ["CONFIG_ENV", "app_from_env", "build_app", "serve"]

CONFIG_ENV = "CMQ_SERVE_CONFIG"


def build_app(config: ServiceConfig) -> SqsApp:
    """The ASGI app of one node."""
    return SqsApp(
        open_store(config.store),
        region=config.region,
        account_id=config.account_id,
        max_request_bytes=config.max_request_bytes,
    )


def app_from_env() -> SqsApp:
    """App factory for worker processes: the config comes from CMQ_SERVE_CONFIG."""
    raw = json.loads(os.environ[CONFIG_ENV])
    nodes = tuple((str(host), int(port)) for host, port in raw.pop("nodes"))
    store = StoreConfig(**{**raw.pop("store"), "nodes": nodes})
    return build_app(ServiceConfig(store=store, **raw))


def _bind(host: str, port: int) -> socket.socket:
    """The listening socket, created with an explicit IPPROTO_TCP.

    asyncio turns on TCP_NODELAY only for sockets whose ``proto`` is
    IPPROTO_TCP, and accepted sockets inherit the listener's ``proto``; with
    uvicorn's own ``bind_socket`` (proto 0) every reply, written as headers
    then body, meets Nagle plus the client's delayed ACK: 40 ms per call.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def serve(config: ServiceConfig) -> None:
    """Serve until interrupted. Prints ``listening on http://HOST:PORT`` once bound.

    Raises OSError when the address cannot be bound.
    """
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
    }
    if config.workers == 1:
        uv = uvicorn.Config(build_app(config), **common)
    else:
        raw = dataclasses.asdict(config)
        raw["nodes"] = raw["store"].pop("nodes")
        os.environ[CONFIG_ENV] = json.dumps(raw)
        uv = uvicorn.Config(
            "cmq.service.server:app_from_env",
            factory=True,
            workers=config.workers,
            **common,
        )
    sock = _bind(config.host, config.port)
    host, port = sock.getsockname()[:2]
    print(f"listening on http://{host}:{port}", flush=True)
    sys.stdout.flush()
    if config.workers == 1:
        uvicorn.Server(uv).run(sockets=[sock])
    else:
        Multiprocess(uv, sockets=[sock]).run()
