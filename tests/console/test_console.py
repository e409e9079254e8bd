"""The console without a browser: its sans-IO parts, its gate (who may use
it, cross-site requests) and its API over the service and the broker."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import re
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from cmq._errors import ConfigError
from cmq.console import Access, ConsoleApp, render_metrics
from cmq.console._model import QueueRates, QueueRow, RateHistory, page_of
from cmq.routing import Broker, BrokerClient
from cmq.service.app import SqsApp
from cmq.service.edge import EdgePolicy
from cmq.service.model import QueueRecord
from cmq.service.store.memory import MemoryStore
from cmq.service.store.sqlite import SqliteStore
from tests.console.asgi import Response, call

SQS = {"Content-Type": "application/x-amz-json-1.0"}


# -- sans-IO parts ----------------------------------------------------------------


def test_rate_history_gives_rates_between_samples_and_forgets_old_ones() -> None:
    h = RateHistory(seconds=10)
    assert h.series() == {"t": []} and h.latest() == {}
    h.sample(100.0, {"in": 0, "out": 0})
    h.sample(101.0, {"in": 50, "out": 10})
    h.sample(103.0, {"in": 150, "out": 10})
    assert h.series() == {"t": [101.0, 103.0], "in": [50.0, 50.0], "out": [10.0, 0.0]}
    h.sample(104.0, {"in": 20, "out": 10})  # a restart: counters went down
    assert h.latest() == {"in": 0.0, "out": 0.0}
    h.sample(120.0, {"in": 20, "out": 10})
    assert h.series()["t"] == [120.0]


def test_queue_rates_are_none_at_first_then_per_second() -> None:
    r = QueueRates(min_interval=0.5)
    assert r.rates("q", 10.0, 5, 0) == (None, None)
    assert r.rates("q", 12.0, 25, 4) == (10.0, 2.0)
    assert r.rates("q", 12.1, 99, 99) == (10.0, 2.0)  # too soon: the last rates
    r.forget_except(["other"])
    assert r.rates("q", 13.0, 0, 0) == (None, None)


def _rows(figures: dict[str, int | None]) -> Any:
    built: list[list[str]] = []

    async def rows(names: Any) -> list[QueueRow]:
        built.append(list(names))
        return [QueueRow(name=n, depth=0, in_flight=0, consumers=figures[n]) for n in names]

    return rows, built


def test_page_of_builds_only_the_page_when_sorted_by_name() -> None:
    names = [f"q{i:05d}" for i in range(10_000)]
    rows, built = _rows(dict.fromkeys(names, 1))
    page = asyncio.run(page_of(names, rows, page=3, per_page=50))
    assert page.total == 10_000 and page.as_dict()["pages"] == 200
    assert [r.name for r in page.rows] == names[100:150]
    assert built == [names[100:150]]
    last = asyncio.run(page_of(names, rows, page=999, per_page=50, descending=True))
    assert last.page == 200 and last.rows[-1].name == "q00000"
    found = asyncio.run(page_of(names, rows, text="Q0999", per_page=25))
    assert found.total == 10 and found.rows[0].name == "q09990"


def test_page_of_sorts_by_a_figure_with_missing_figures_last() -> None:
    figures: dict[str, int | None] = {"a": 3, "b": None, "c": 7, "d": 1}
    rows, _ = _rows(figures)
    down = asyncio.run(page_of(list(figures), rows, sort="consumers", descending=True))
    assert [r.name for r in down.rows] == ["c", "a", "d", "b"]
    up = asyncio.run(page_of(list(figures), rows, sort="consumers"))
    assert [r.name for r in up.rows] == ["d", "a", "c", "b"]
    with pytest.raises(ConfigError):
        asyncio.run(page_of([], rows, sort="colour"))
    with pytest.raises(ConfigError):
        asyncio.run(page_of([], rows, per_page=100_000))


def test_vendored_front_end_is_the_recorded_release() -> None:
    folder = resources.files("cmq.console") / "static" / "vendor" / "uplot"
    record = (folder / "VENDORED.txt").read_text()
    pairs = re.findall(r"^sha256 (\S+)\s+([0-9a-f]{64})$", record, re.M)
    assert {name for name, _ in pairs} == {"uPlot.iife.min.js", "uPlot.min.css"}
    for name, digest in pairs:
        assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == digest, name


def test_pages_load_nothing_from_another_origin() -> None:
    root = Path(str(resources.files("cmq.console")))
    for path in [*root.glob("templates/*.html"), root / "static/console.js", root / "static/console.css"]:
        text = path.read_text()
        assert not re.search(r"(src|href)=\"(https?:)?//", text), path
        assert "https://" not in text and "http://" not in text, path


# -- the service's console -------------------------------------------------------


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


def _token(page: Response) -> str:
    m = re.search(r'name="csrf-token" content="([^"]+)"', page.text)
    assert m is not None
    return m.group(1)


async def _sqs(app: Any, action: str, **params: Any) -> Any:
    r = await call(app, "POST", "/", headers={**SQS, "X-Amz-Target": f"AmazonSQS.{action}"},
                   body=json.dumps(params).encode())  # fmt: skip
    assert r.status == 200, r.text
    return r.json()


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    yield MemoryStore() if request.param == "memory" else SqliteStore(str(tmp_path / "db.sqlite3"))


def test_service_console_send_peek_purge_and_counters(store: Any) -> None:
    async def go() -> None:
        app = SqsApp(store, store_name="test")
        await store.open()
        try:
            url = (await _sqs(app, "CreateQueue", QueueName="jobs"))["QueueUrl"]
            for i in range(3):
                await _sqs(app, "SendMessage", QueueUrl=url, MessageBody=f"m{i}")
            token = _token(await call(app, "GET", "/console/queues/jobs"))
            sent = await call(app, "POST", "/console/api/send/jobs", body=b'{"body":"from console"}',
                              headers={"X-CSRF-Token": token, "Origin": "http://127.0.0.1:9324"})  # fmt: skip
            assert sent.status == 200, sent.text
            peek = (await call(app, "GET", "/console/api/peek/jobs?n=10")).json()["messages"]
            assert [m["body"] for m in peek] == ["m0", "m1", "m2", "from console"]
            assert {m["state"] for m in peek} == {"visible"}
            # Peeking changed nothing: the first receive is still the first.
            got = await _sqs(app, "ReceiveMessage", QueueUrl=url, MaxNumberOfMessages=10,
                             AttributeNames=["ApproximateReceiveCount"])  # fmt: skip
            assert {m["Attributes"]["ApproximateReceiveCount"] for m in got["Messages"]} == {"1"}
            row = (await call(app, "GET", "/console/api/queue/jobs")).json()["row"]
            assert (row["depth"], row["in_flight"]) == (0, 4)
            peek = (await call(app, "GET", "/console/api/peek/jobs")).json()["messages"]
            assert {m["state"] for m in peek} == {"in flight"}
            await _sqs(app, "DeleteMessage", QueueUrl=url,
                       ReceiptHandle=got["Messages"][0]["ReceiptHandle"])  # fmt: skip
            assert dict(app.metrics.messages) == {"sent": 4, "received": 4, "deleted": 1}
            metrics = (await call(app, "GET", "/metrics")).text
            assert 'cmq_sqs_messages_total{op="sent"} 4' in metrics
            purged = await call(app, "POST", "/console/api/purge/jobs", headers={"X-CSRF-Token": token})
            assert purged.status == 200
            assert (await call(app, "GET", "/console/api/peek/jobs")).json()["messages"] == []
            missing = await call(app, "GET", "/console/api/queue/nope")
            assert missing.status == 404
        finally:
            await store.close()

    _run(go())


def test_service_console_redrives_a_dead_letter_queue() -> None:
    async def go() -> None:
        store = MemoryStore()
        app = SqsApp(store)
        await _sqs(app, "CreateQueue", QueueName="dead")
        arn = "arn:aws:sqs:us-east-1:000000000000:dead"
        src = (await _sqs(app, "CreateQueue", QueueName="work", Attributes={
            "RedrivePolicy": json.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": 1})}))["QueueUrl"]  # fmt: skip
        await _sqs(app, "SendMessage", QueueUrl=src, MessageBody="poison")
        for _ in range(2):
            await _sqs(app, "ReceiveMessage", QueueUrl=src, VisibilityTimeout=0)
        info = (await call(app, "GET", "/console/api/queue/dead")).json()
        assert info["can_redrive"] and info["dead_letter_sources"] == ["work"]
        peek = (await call(app, "GET", "/console/api/peek/dead")).json()["messages"]
        assert [(m["body"], m["dead_letter_source"]) for m in peek] == [("poison", "work")]
        token = _token(await call(app, "GET", "/console/"))
        not_dlq = await call(app, "POST", "/console/api/redrive/work", headers={"X-CSRF-Token": token})
        assert not_dlq.status == 400
        r = await call(app, "POST", "/console/api/redrive/dead", headers={"X-CSRF-Token": token})
        assert r.status == 200, r.text
        # The move task runs in this loop: wait for it to end.
        await asyncio.gather(*(t.job for t in app.service.mover._tasks.values() if t.job is not None))
        assert (await store.counts("work", 2**62)).visible == 1
        assert (await store.counts("dead", 2**62)).visible == 0

    _run(go())


def test_queue_table_pages_ten_thousand_queues() -> None:
    async def go() -> None:
        store = MemoryStore()
        for i in range(10_000):
            await store.create_queue(QueueRecord(name=f"q-{i:05d}"))
        app = SqsApp(store)
        page = (await call(app, "GET", "/console/api/queues?page=200&per_page=50")).json()
        assert (page["total"], page["pages"], len(page["rows"])) == (10_000, 200, 50)
        assert page["rows"][-1]["name"] == "q-09999"
        deep = (await call(app, "GET", "/console/api/queues?sort=depth&order=desc&per_page=25")).json()
        assert len(deep["rows"]) == 25 and deep["total"] == 10_000
        one = (await call(app, "GET", "/console/api/queues?filter=q-01234")).json()
        assert [r["name"] for r in one["rows"]] == ["q-01234"]
        bad = await call(app, "GET", "/console/api/queues?sort=colour")
        assert bad.status == 400

    _run(go())


# -- who may use it ------------------------------------------------------------------


def _app(**policy: Any) -> SqsApp:
    return SqsApp(MemoryStore(), policy=EdgePolicy(**policy))


def _basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def test_without_auth_only_loopback_clients() -> None:
    app = _app()
    assert _run(call(app, "GET", "/console/", client="10.0.0.9")).status == 403
    assert _run(call(app, "GET", "/console/", client="::1")).status == 200
    assert _run(call(_app(allow_remote_unsigned=True), "GET", "/console/", client="10.0.0.9")).status == 200


def test_with_auth_a_key_logs_in() -> None:
    app = _app(keys={"AKID": "s3cret"})
    asked = _run(call(app, "GET", "/console/api/overview"))
    assert asked.status == 401 and asked.headers["www-authenticate"].startswith("Basic ")
    assert _run(call(app, "GET", "/console/", headers=_basic("AKID", "wrong"))).status == 401
    assert _run(call(app, "GET", "/console/", headers=_basic("AKID", "s3cret"), client="10.0.0.9")).status == 200


def test_state_changes_need_the_token_and_the_same_origin() -> None:
    app = _app()
    _run(_sqs(app, "CreateQueue", QueueName="q"))
    page = _run(call(app, "GET", "/console/"))
    token = _token(page)
    assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
    body = b'{"body": "x"}'
    refused = [
        {},
        {"X-CSRF-Token": "guess"},
        {"X-CSRF-Token": token, "Origin": "http://evil.example"},
        {"X-CSRF-Token": token, "Sec-Fetch-Site": "cross-site"},
    ]
    for headers in refused:
        assert _run(call(app, "POST", "/console/api/send/q", headers=headers, body=body)).status == 403
    assert _run(call(app, "POST", "/console/api/send/q", headers={"X-CSRF-Token": token}, body=body)).status == 200
    ok = {"X-CSRF-Token": token, "Origin": "http://127.0.0.1:9324", "Sec-Fetch-Site": "same-origin"}
    assert _run(call(app, "POST", "/console/api/purge/q", headers=ok)).status == 200
    # A page of another name (DNS rebinding) is refused whatever it asks.
    assert _run(call(app, "GET", "/console/", host="evil.example:9324")).status == 403
    # GET never changes anything.
    assert _run(call(app, "GET", "/console/api/purge/q")).status == 405


# -- the broker's console ------------------------------------------------------------


@pytest.fixture
def broker() -> Iterator[Broker]:
    with Broker(port=0) as b:
        b.start()
        yield b


def test_broker_backend_views_and_changes(broker: Broker) -> None:
    from cmq.console import BrokerBackend
    from cmq.routing._amqp import Users

    with BrokerClient(broker.address, timeout=2) as client:
        client.declare_exchange("prices", "topic")
        client.declare_queue("ibm", max_length=10, overflow="reject-publish")
        client.bind("ibm", "prices", "stock.ibm.#")
        client.publish_many([("prices", "stock.ibm.nyse", "IBM 101.5")])
    console = ConsoleApp(BrokerBackend(broker, "memory"), policy=EdgePolicy(),
                         access=Access.users(Users.default().check))  # fmt: skip
    login = _basic("guest", "guest")
    assert _run(call(console, "GET", "/console/exchanges")).status == 401
    assert _run(call(console, "GET", "/console/exchanges", headers=login, client="10.0.0.9")).status == 401
    page = _run(call(console, "GET", "/console/exchanges", headers=login))
    assert page.status == 200
    token = _token(page)
    ex = {e["name"]: e for e in _run(call(console, "GET", "/console/api/exchanges", headers=login)).json()["exchanges"]}
    assert ex["prices"]["type"] == "topic" and ex["prices"]["bindings"] == [{"queue": "ibm", "key": "stock.ibm.#"}]
    route = _run(call(console, "GET", "/console/api/route?exchange=prices&key=stock.ibm.x", headers=login)).json()
    assert route["queues"] == ["ibm"]
    assert _run(call(console, "GET", "/console/api/route?exchange=prices&key=stock.hp", headers=login)).json()["queues"] == []
    assert _run(call(console, "GET", "/console/api/route?exchange=nope&key=a", headers=login)).status == 404
    q = _run(call(console, "GET", "/console/api/queue/ibm", headers=login)).json()
    assert q["attributes"]["overflow"] == "reject-publish" and q["attributes"]["max_length"] == 10
    assert {"exchange": "prices", "key": "stock.ibm.#"} in q["bindings"]
    sent = _run(call(console, "POST", "/console/api/send/ibm", body=b'{"body":"test"}',
                     headers={**login, "X-CSRF-Token": token}))  # fmt: skip
    assert sent.json() == {"routed": 1}
    peek = _run(call(console, "GET", "/console/api/peek/ibm", headers=login)).json()["messages"]
    assert [(m["routing_key"], m["body"]) for m in peek] == [("stock.ibm.nyse", "IBM 101.5"), ("ibm", "test")]
    assert broker.stats().per_queue[0].ready == 2  # peek took nothing
    purged = _run(call(console, "POST", "/console/api/purge/ibm", headers={**login, "X-CSRF-Token": token}))
    assert purged.json() == {"purged": True, "messages": 2}
    assert _run(call(console, "POST", "/console/api/send/nope", body=b'{"body":"x"}',
                     headers={**login, "X-CSRF-Token": token})).status == 404  # fmt: skip


def test_broker_metrics_follow_the_service_naming() -> None:
    with Broker(port=0) as b:
        b.start()
        with BrokerClient(b.address, timeout=2) as client:
            client.declare_queue('we"ird\\q')
            client.publish_many([("", 'we"ird\\q', "x")] * 3)
        text = render_metrics(b.stats())
    assert 'cmq_broker_messages_total{op="published"} 3' in text
    assert 'cmq_broker_queue_messages{queue="we\\"ird\\\\q"} 3' in text
    for line in text.splitlines():
        if line.startswith("# TYPE"):
            name, kind = line.split()[2:4]
            assert name.startswith("cmq_broker_")
            assert name.endswith("_total") == (kind == "counter")


def test_worker_processes_share_one_csrf_token(monkeypatch: pytest.MonkeyPatch) -> None:
    from cmq.service.app import CONSOLE_TOKEN_ENV

    monkeypatch.setenv(CONSOLE_TOKEN_ENV, "shared-token")
    tokens = {_token(_run(call(SqsApp(MemoryStore()), "GET", "/console/"))) for _ in range(2)}
    assert tokens == {"shared-token"}
    monkeypatch.delenv(CONSOLE_TOKEN_ENV)
    assert len({_token(_run(call(SqsApp(MemoryStore()), "GET", "/console/"))) for _ in range(2)}) == 2


def test_cmq_broker_http_port_serves_console_and_metrics(tmp_path: Path) -> None:
    import http.client
    import signal
    import subprocess
    import sys

    users = tmp_path / "users.txt"
    users.write_text("admin:pw\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "cmq", "broker", "--port", "0", "--in-memory", "--http-port", "0",
         "--users", str(users)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        m = re.search(r"console on http://127\.0\.0\.1:(\d+)/console/", line)
        assert m is not None, (line, proc.stderr.read() if proc.stderr else "")
        port = int(m.group(1))

        def get(path: str, headers: dict[str, str]) -> tuple[int, str]:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            try:
                conn.request("GET", path, headers=headers)
                r = conn.getresponse()
                return r.status, r.read().decode()
            finally:
                conn.close()

        assert get("/console/", {})[0] == 401
        assert get("/console/", _basic("guest", "guest"))[0] == 401  # a users file replaces guest
        assert get("/console/", _basic("admin", "pw"))[0] == 200
        status, text = get("/metrics", {})
        assert status == 200 and "cmq_broker_queues 0" in text
        assert get("/health", {}) == (200, "ok\n")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
    assert proc.returncode == 0


def test_counts_many_agrees_with_counts(store: Any) -> None:
    from cmq.service.model import NewMessage, ReceiveSpec

    async def go() -> None:
        await store.open()
        try:
            for name in ("a", "b", "empty"):
                await store.create_queue(QueueRecord(name=name))
            await store.send("a", [NewMessage(message_id=str(i), payload="{}", visible_at=0 if i < 3 else 500)
                                   for i in range(5)], 0)  # fmt: skip
            await store.send("b", [NewMessage(message_id="x", payload="{}", visible_at=0)], 0)
            spec = ReceiveSpec(now=100, max_messages=2, visibility_ms=1000, k=1, fifo=False,
                               token="t", rand=(0.0, 0.0))  # fmt: skip
            await store.receive("a", spec)
            got = await store.counts_many(["a", "b", "empty", "gone"], 100)
            assert set(got) == {"a", "b", "empty"}
            for name in ("a", "b", "empty"):
                assert got[name] == await store.counts(name, 100)
            assert (got["a"].visible, got["a"].in_flight, got["a"].delayed) == (1, 2, 2)
        finally:
            await store.close()

    _run(go())
