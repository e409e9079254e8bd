"""Servers the console tests start themselves, on ephemeral loopback ports."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import uvicorn

from cmq.service.server import _bind


class ThreadServer:
    """An ASGI app served by uvicorn in a daemon thread of this process."""

    def __init__(self, app: Any) -> None:
        self._sock = _bind("127.0.0.1", 0)
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(
            uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on")
        )
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self.server.serve(sockets=[self._sock])), daemon=True
        )

    def __enter__(self) -> ThreadServer:
        from tests.waiting import wait_until

        self._thread.start()
        assert wait_until(lambda: self.server.started, timeout=10)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()
