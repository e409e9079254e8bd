"""The broker's HTTP port (``cmq broker --http-port P``): console and metrics.

Off unless asked for. It serves, on its own thread and event loop (uvicorn),
``/console`` (:class:`~cmq.console.ConsoleApp` over a
:class:`~cmq.console._backends.BrokerBackend`), ``/metrics`` (Prometheus
text, named as the queue service's: ``cmq_broker_*``, counters ending in
``_total``, per-queue gauges labelled ``queue``) and ``/health``. It binds
to loopback unless told otherwise, and asks for the broker's AMQP users
(``guest``/``guest`` from loopback by default) on every console page;
``/metrics`` and ``/health`` follow the service's rule instead (loopback
clients, or anyone when the broker has a users file and so listens for the
world: scrapers do not log in).
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from typing import TYPE_CHECKING

from cmq._errors import TransportError
from cmq._extras import optional_imports
from cmq.console._app import Access, ConsoleApp, Receive, Scope, Send
from cmq.console._backends import BrokerBackend
from cmq.service.edge import EdgePolicy, is_loopback

if TYPE_CHECKING:
    from cmq.routing import Broker, BrokerCore, BrokerStats
    from cmq.routing._users import Users

__all__ = ["MAX_METRIC_QUEUES", "BrokerHttp", "render_metrics"]

#: Seconds the HTTP thread may take to start serving.
_START_TIMEOUT = 10.0
#: Queues whose figures one /metrics scrape reports at most (as the service).
MAX_METRIC_QUEUES = 1000

#: Counters of BrokerStats exported as cmq_broker_messages_total{op=...}.
_MESSAGE_OPS = ("published", "unroutable", "enqueued", "delivered", "acked", "redelivered",
                "nacked", "rejected", "expired", "purged", "dropped_old", "dead_lettered",
                "dead_letters_dropped")  # fmt: skip
_ERRORS = ("malformed", "bad_bodies", "internal_errors", "send_failed", "stale_acks",
           "resent_requests")  # fmt: skip


def _label(value: str) -> str:
    """A Prometheus label value, escaped (broker names may hold anything)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render_metrics(s: BrokerStats) -> str:
    """The Prometheus text exposition of a broker's stats."""
    out = [
        "# HELP cmq_broker_messages_total Messages, per what happened to them.",
        "# TYPE cmq_broker_messages_total counter",
        *(f'cmq_broker_messages_total{{op="{op}"}} {getattr(s, op)}' for op in _MESSAGE_OPS),
        "# HELP cmq_broker_errors_total Requests and messages refused or failed, per reason.",
        "# TYPE cmq_broker_errors_total counter",
        *(f'cmq_broker_errors_total{{reason="{r}"}} {getattr(s, r)}' for r in _ERRORS),
    ]
    for metric, help_text, value in (
        ("cmq_broker_exchanges", "Exchanges declared.", s.exchanges),
        ("cmq_broker_queues", "Queues declared.", s.queues),
        ("cmq_broker_consumers", "Consumers attached.", s.consumers),
    ):
        out += [f"# HELP {metric} {help_text}", f"# TYPE {metric} gauge", f"{metric} {value}"]
    queues = sorted(s.per_queue, key=lambda q: q.name)[:MAX_METRIC_QUEUES]
    for metric, help_text, attr in (
        ("cmq_broker_queue_messages", "Ready messages per queue.", "ready"),
        ("cmq_broker_queue_messages_unacked", "Delivered, unacknowledged messages per queue.",
         "unacked"),
        ("cmq_broker_queue_consumers", "Consumers per queue.", "consumers"),
    ):  # fmt: skip
        out += [f"# HELP {metric} {help_text}", f"# TYPE {metric} gauge"]
        out += [f'{metric}{{queue="{_label(q.name)}"}} {getattr(q, attr)}' for q in queues]
    return "\n".join(out) + "\n"


def _scrape(core: BrokerCore) -> BrokerStats:
    """The counters and the first MAX_METRIC_QUEUES queues by name (only those
    are snapshot: the broker's lock is held meanwhile)."""
    names = sorted(core.queue_names())[:MAX_METRIC_QUEUES]
    return dataclasses.replace(core.stats(per_queue=False), per_queue=tuple(core.queue_stats(names)))


class _BrokerHttpApp:
    """/metrics, /health and /console of one broker."""

    def __init__(self, broker: Broker, console: ConsoleApp, open_metrics: bool) -> None:
        self.broker = broker
        self.console = console
        self.open_metrics = open_metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.console(scope, receive, send)
            return
        if scope["type"] != "http":
            return
        path = scope["path"]
        if path == "/console" or path.startswith("/console/"):
            await self.console(scope, receive, send)
            return
        status, ctype, body = 404, b"text/plain", b"not found; the console is at /console/\n"
        host = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"host"), None)
        client = scope.get("client")
        if not self.console.policy.accepts_host(host) if host is not None else False:
            status, body = 403, b"Host not served here (a defence against DNS rebinding)\n"
        elif not (self.open_metrics or (client is not None and is_loopback(client[0]))):
            status, body = 403, b"served to loopback clients only\n"
        elif scope["method"] == "GET" and path == "/metrics":
            status, ctype = 200, b"text/plain; version=0.0.4"
            body = render_metrics(self.broker.inspect(_scrape)).encode()
        elif scope["method"] == "GET" and path == "/health":
            status, body = 200, b"ok\n"
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", ctype)]})  # fmt: skip
        await send({"type": "http.response.body", "body": body})


class BrokerHttp:
    """The broker's HTTP port, served by uvicorn in a daemon thread.

    Raises TransportError (from the constructor) when the port cannot be bound.
    """

    def __init__(
        self,
        broker: Broker,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        users: Users | None = None,
        store_name: str = "memory",
        allow_hosts: frozenset[str] = frozenset(),
    ) -> None:
        with optional_imports("the console"):
            import uvicorn

        from cmq.routing._users import Users
        from cmq.service.server import _bind

        self._sock = _bind(host, port)
        self.address: tuple[str, int] = self._sock.getsockname()[:2]
        who = users if users is not None else Users.default()
        self.console = ConsoleApp(
            BrokerBackend(broker, store_name),
            policy=EdgePolicy(listen_host=host, allowed_hosts=allow_hosts),
            access=Access.users(who.check_console),
        )
        app = _BrokerHttpApp(broker, self.console, open_metrics=users is not None)
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on",
                                proxy_headers=False, timeout_keep_alive=30)  # fmt: skip
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    def start(self) -> BrokerHttp:
        """Serve in a daemon thread; returns once it accepts connections.

        Raises TransportError when it does not start.
        """
        self._thread = threading.Thread(target=self._run, name="cmq-broker-http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + _START_TIMEOUT
        while not self._server.started and self._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        if not self._server.started:
            raise TransportError(f"the HTTP port {self.address[1]} did not start")
        return self

    def _run(self) -> None:
        # No signal handlers: they belong to the broker's main thread.
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        # uvicorn installs signal handlers only in the main thread: the
        # broker's own stay as they are.
        await self._server.serve(sockets=[self._sock])

    def close(self) -> None:
        """Stop serving and wait for the thread (a few seconds at most)."""
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._sock.close()
