"""The console's HTTP side: pages, a JSON API, and who may use them.

Theory of operation
-------------------
:class:`ConsoleApp` is an ASGI app mounted under ``/console`` by both
servers: ``cmq serve`` hands it every request whose path starts there, and
``cmq broker --http-port`` serves it (with ``/metrics``) on a port of its
own (:mod:`cmq.console._broker_http`). Pages are Jinja2 templates; each
page's script (``static/console.js``) polls the JSON API once a second and
redraws in place, charts drawn by the vendored uPlot. Every asset is served
from this package: the console works with no network.

Every request passes, in order, before any route sees it:

1. **Host** (DNS rebinding): the same rule as the service's edge
   (:class:`~cmq.service.edge.EdgePolicy`); 403 otherwise.
2. **Who** (:class:`Access`): the server's own authentication. The service
   with ``--auth`` and the broker always (its AMQP users, ``guest``/``guest``
   from loopback by default) ask for HTTP Basic credentials: for the service
   an access key id and its secret key, for the broker a user name and
   password. The service without ``--auth`` serves loopback clients only,
   as its API does.
3. **Cross-site requests**, for anything that changes state (every non-GET
   request): its ``Origin`` must be the console's own and ``Sec-Fetch-Site``
   not cross-site (the edge's rule), and it must carry the page's CSRF token
   in ``X-CSRF-Token``: a header no cross-site form can set and no other
   origin can read from the page.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hmac
import json
import secrets
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from importlib import resources
from typing import Any

from cmq._errors import ConfigError
from cmq._extras import optional_imports
from cmq.console._backends import PEEK_MAX, Backend, Refused
from cmq.console._model import SORT_KEYS, RateHistory, page_of
from cmq.service.edge import EdgePolicy, is_loopback

__all__ = ["SAMPLE_INTERVAL", "Access", "ConsoleApp"]

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

#: Seconds between two samples of the rate counters (the overview's chart),
#: and the pages' polling interval: "at most once a second".
SAMPLE_INTERVAL = 1.0
#: A test message's body at most, bytes (the service refuses more itself).
MAX_SEND_BYTES = 256 * 1024
PREFIX = "/console"

_SECURITY_HEADERS = [
    (b"content-security-policy",
     b"default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
     b"frame-ancestors 'none'; form-action 'self'; base-uri 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
]  # fmt: skip


@dataclass(frozen=True, slots=True, kw_only=True)
class Access:
    """Who may use the console: ``check(client, user, password)`` returns
    None to let the request in, or the reason to refuse it. With ``login``,
    requests without credentials are asked for them (HTTP Basic)."""

    check: Callable[[str | None, str | None, str | None], str | None]
    login: bool
    realm: str = "cmq console"

    @classmethod
    def keys(cls, keys: dict[str, str] | None, *, allow_remote: bool = False) -> Access:
        """The service's rule: its access keys (id as user, secret as
        password), or without keys loopback clients only (unless ``allow_remote``)."""
        if keys is None:

            def local(client: str | None, user: str | None, password: str | None) -> str | None:
                if allow_remote or (client is not None and is_loopback(client)):
                    return None
                return ("Without --auth the console, like the API, is served to loopback "
                        "clients only.")  # fmt: skip

            return cls(check=local, login=False)

        def signed(client: str | None, user: str | None, password: str | None) -> str | None:
            want = keys.get(user or "")
            if want is None or password is None or not hmac.compare_digest(
                want.encode(), password.encode()
            ):
                return "Log in with an access key id and its secret access key."
            return None

        return cls(check=signed, login=True)

    @classmethod
    def users(cls, check_user: Callable[[str, str, str], str | None]) -> Access:
        """The broker's rule: its AMQP users (``Users.check(user, password, peer)``)."""

        def check(client: str | None, user: str | None, password: str | None) -> str | None:
            if user is None or password is None:
                return "Log in as one of the broker's users."
            return check_user(user, password, client or "")

        return cls(check=check, login=True)


def _credentials(header: str | None) -> tuple[str | None, str | None]:
    if not header or header[:6].lower() != "basic ":
        return None, None
    try:
        raw = base64.b64decode(header[6:].strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None, None
    user, sep, password = raw.partition(":")
    return (user, password) if sep else (None, None)


def _header(scope: Scope, name: bytes) -> str | None:
    for k, v in scope["headers"]:
        if k == name:
            return str(v.decode("latin-1"))
    return None


class ConsoleApp:
    """The console of one server over ``backend`` (see module doc)."""

    def __init__(
        self, backend: Backend, *, policy: EdgePolicy, access: Access, csrf_token: str | None = None
    ) -> None:
        with optional_imports("the console"):
            from jinja2 import Environment, PackageLoader, select_autoescape
            from starlette.routing import Mount, Route, Router
            from starlette.staticfiles import StaticFiles

        self.backend = backend
        self.policy = policy
        self.access = access
        self.history = RateHistory()
        #: Sent in each page, required on each state change (see module doc);
        #: the processes of one server share it (``cmq serve --workers N``).
        self.csrf_token = csrf_token or secrets.token_urlsafe(32)
        self._templates = Environment(
            loader=PackageLoader("cmq.console", "templates"),
            autoescape=select_autoescape(["html"]),
        )
        static = resources.files("cmq.console") / "static"
        P = PREFIX
        self._router = Router(routes=[
            Route(P, self._to_root), Route(P + "/", self._page("overview")),
            Route(P + "/queues", self._page("queues")),
            Route(P + "/queues/{name:path}", self._page("queue")),
            Route(P + "/exchanges", self._page("exchanges")),
            Route(P + "/api/overview", self._api_overview),
            Route(P + "/api/queues", self._api_queues),
            Route(P + "/api/queue/{name:path}", self._api_queue),
            Route(P + "/api/peek/{name:path}", self._api_peek),
            Route(P + "/api/send/{name:path}", self._api_send, methods=["POST"]),
            Route(P + "/api/purge/{name:path}", self._api_purge, methods=["POST"]),
            Route(P + "/api/redrive/{name:path}", self._api_redrive, methods=["POST"]),
            Route(P + "/api/exchanges", self._api_exchanges),
            Route(P + "/api/route", self._api_route),
            Mount(P + "/static", app=StaticFiles(directory=str(static)), name="static"),
        ])  # fmt: skip

    # -- sampling ------------------------------------------------------------------

    def sample(self, now: float) -> None:
        """Take one sample of the rate counters (``now``: monotonic seconds)."""
        self.history.sample(now, self.backend.totals())

    async def run_sampler(self) -> None:
        """Sample every :data:`SAMPLE_INTERVAL` until cancelled."""
        while True:
            try:
                self.sample(time.monotonic())
            except Exception:  # noqa: BLE001 - a failed read costs one point, not the chart
                pass
            await asyncio.sleep(SAMPLE_INTERVAL)

    # -- the gate --------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        refusal = self._refusal(scope)
        if refusal is not None:
            status, message, extra = refusal
            await self._plain(send, status, message, extra)
            return

        async def send_secured(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *_SECURITY_HEADERS]
            await send(message)

        await self._router(scope, receive, send_secured)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        task: asyncio.Task[None] | None = None
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                task = asyncio.get_running_loop().create_task(self.run_sampler())
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
                await send({"type": "lifespan.shutdown.complete"})
                return

    def _refusal(self, scope: Scope) -> tuple[int, str, list[tuple[bytes, bytes]]] | None:
        from cmq.service.errors import SqsError

        host = _header(scope, b"host")
        try:
            self.policy.check_host(host)
        except SqsError as exc:
            return 403, exc.message, []
        client = scope.get("client")
        user, password = _credentials(_header(scope, b"authorization"))
        why = self.access.check(client[0] if client else None, user, password)
        if why is not None:
            if self.access.login:
                realm = self.access.realm.replace('"', "")
                return 401, why, [(b"www-authenticate", f'Basic realm="{realm}"'.encode())]
            return 403, why, []
        if scope["method"] not in ("GET", "HEAD"):
            try:
                self.policy.check_origin(
                    _header(scope, b"origin"), _header(scope, b"sec-fetch-site"), host
                )
            except SqsError as exc:
                return 403, exc.message, []
            token = _header(scope, b"x-csrf-token") or ""
            if not hmac.compare_digest(token.encode(), self.csrf_token.encode()):
                return 403, "A state change needs the console page's CSRF token.", []
        return None

    @staticmethod
    async def _plain(send: Send, status: int, text: str, extra: list[tuple[bytes, bytes]]) -> None:
        body = json.dumps({"error": text}).encode()
        headers = [(b"content-type", b"application/json"), *extra, *_SECURITY_HEADERS]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    # -- pages -------------------------------------------------------------------------

    async def _to_root(self, request: Any) -> Any:
        from starlette.responses import RedirectResponse

        return RedirectResponse(PREFIX + "/", status_code=308)

    def _page(self, page: str) -> Callable[[Any], Awaitable[Any]]:
        async def render(request: Any) -> Any:
            from starlette.responses import HTMLResponse

            if page == "exchanges" and self.backend.kind != "broker":
                return HTMLResponse("This server has no exchanges.", status_code=404)
            template = self._templates.get_template(f"{page}.html")
            html = template.render(
                page=page,
                kind=self.backend.kind,
                prefix=PREFIX,
                csrf=self.csrf_token,
                name=request.path_params.get("name", ""),
                sort_keys=SORT_KEYS,
            )
            return HTMLResponse(html, headers={"cache-control": "no-store"})

        return render

    # -- the JSON API ---------------------------------------------------------------

    @staticmethod
    def _json(data: Any, status: int = 200) -> Any:
        from starlette.responses import JSONResponse

        return JSONResponse(data, status_code=status, headers={"cache-control": "no-store"})

    async def _guarded(self, work: Awaitable[Any]) -> Any:
        try:
            return self._json(await work)
        except Refused as exc:
            return self._json({"error": exc.message}, exc.status)
        except ConfigError as exc:
            return self._json({"error": str(exc)}, 400)

    @staticmethod
    def _host(request: Any) -> str:
        host = request.headers.get("host")
        if host:
            return str(host)
        server = request.scope.get("server") or ("127.0.0.1", 0)
        return f"{server[0]}:{server[1]}"

    async def _api_overview(self, request: Any) -> Any:
        async def work() -> dict[str, Any]:
            out = await self.backend.overview()
            out["rates"] = self.history.latest()
            history = self.history.series()
            # Monotonic sample times to wall-clock seconds, for the chart's axis.
            offset = time.time() - time.monotonic()
            history["t"] = [round(t + offset, 3) for t in history["t"]]
            out["history"] = history
            out["sample_interval"] = SAMPLE_INTERVAL
            return out

        return await self._guarded(work())

    async def _api_queues(self, request: Any) -> Any:
        q = request.query_params

        async def work() -> dict[str, Any]:
            try:
                page = int(q.get("page", "1"))
                per_page = int(q.get("per_page", "50"))
            except ValueError as exc:
                raise ConfigError("page and per_page must be whole numbers") from exc
            sort = q.get("sort", "name")
            names = await self.backend.queue_names()

            async def rows(chosen: Any) -> Any:
                return await self.backend.queue_rows(chosen, all_rows=sort != "name")

            got = await page_of(names, rows, text=q.get("filter", ""), sort=sort,
                                descending=q.get("order", "asc") == "desc", page=page,
                                per_page=per_page)  # fmt: skip
            return got.as_dict()

        return await self._guarded(work())

    async def _api_queue(self, request: Any) -> Any:
        return await self._guarded(
            self.backend.queue(request.path_params["name"], self._host(request))
        )

    async def _api_peek(self, request: Any) -> Any:
        async def work() -> dict[str, Any]:
            try:
                n = int(request.query_params.get("n", "10"))
            except ValueError as exc:
                raise ConfigError("n must be a whole number") from exc
            if not 1 <= n <= PEEK_MAX:
                raise ConfigError(f"n must be 1..{PEEK_MAX}")
            return {"messages": await self.backend.peek(request.path_params["name"], n)}

        return await self._guarded(work())

    async def _body(self, request: Any) -> dict[str, Any]:
        raw = await request.body()
        if len(raw) > MAX_SEND_BYTES + 1024:
            raise Refused(413, f"A test message may have at most {MAX_SEND_BYTES} bytes.")
        try:
            data = json.loads(raw or b"{}")
        except ValueError as exc:
            raise Refused(400, "The request body must be JSON.") from exc
        if not isinstance(data, dict):
            raise Refused(400, "The request body must be a JSON object.")
        return data

    async def _api_send(self, request: Any) -> Any:
        async def work() -> dict[str, Any]:
            body = (await self._body(request)).get("body")
            if not isinstance(body, str) or not body:
                raise Refused(400, "Give the message's body as a non-empty string.")
            return await self.backend.send(request.path_params["name"], body, self._host(request))

        return await self._guarded(work())

    async def _api_purge(self, request: Any) -> Any:
        return await self._guarded(
            self.backend.purge(request.path_params["name"], self._host(request))
        )

    async def _api_redrive(self, request: Any) -> Any:
        return await self._guarded(
            self.backend.redrive(request.path_params["name"], self._host(request))
        )

    async def _api_exchanges(self, request: Any) -> Any:
        async def work() -> dict[str, Any]:
            return {"exchanges": await self.backend.exchanges()}

        return await self._guarded(work())

    async def _api_route(self, request: Any) -> Any:
        q = request.query_params

        async def work() -> dict[str, Any]:
            exchange, key = q.get("exchange", ""), q.get("key", "")
            return {"exchange": exchange, "key": key,
                    "queues": await self.backend.route(exchange, key)}  # fmt: skip

        return await self._guarded(work())
