"""Fault tests: killed nodes, a killed Redis master, restarts, malformed input.

The invariant throughout: every send that was acknowledged (HTTP 200) is
received at least once afterwards.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from botocore.exceptions import BotoCoreError, ClientError

from cmq.lab.bench.redis_local import LocalRedisCluster
from tests.service.conftest import store_url, unique
from tests.service.helpers import Node, wait_until

pytestmark = pytest.mark.slow


def _drain_all(client: Any, url: str, expect: set[str], timeout: float = 30.0) -> set[str]:
    """Receive until every body in ``expect`` was seen (or time runs out)."""
    seen: set[str] = set()

    def step() -> bool:
        got = client.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1)
        for m in got.get("Messages", []):
            seen.add(m["Body"])
            client.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
        return expect <= seen

    try:
        wait_until(step, timeout=timeout, interval=0)
    except AssertionError:
        pass
    return seen


class _Load:
    """Sender and receiver threads against one node, recording what was acknowledged."""

    def __init__(self, node: Node, url: str, senders: int = 2, receivers: int = 1) -> None:
        self.acked: set[str] = set()
        self.received: set[str] = set()
        self.stop = threading.Event()
        self.enough = threading.Event()
        self.lock = threading.Lock()
        self.threads = [
            threading.Thread(target=self._send, args=(node.client(), url, i), daemon=True)
            for i in range(senders)
        ] + [
            threading.Thread(target=self._receive, args=(node.client(), url), daemon=True)
            for _ in range(receivers)
        ]

    def start(self) -> _Load:
        for t in self.threads:
            t.start()
        return self

    def _send(self, client: Any, url: str, me: int) -> None:
        i = 0
        while not self.stop.is_set():
            body = f"{me}-{i}"
            i += 1
            try:
                client.send_message(QueueUrl=url, MessageBody=body)
            except (BotoCoreError, ClientError):
                continue  # not acknowledged: no promise made
            with self.lock:
                self.acked.add(body)
                if len(self.acked) >= 150:
                    self.enough.set()

    def _receive(self, client: Any, url: str) -> None:
        while not self.stop.is_set():
            try:
                got = client.receive_message(QueueUrl=url, MaxNumberOfMessages=10)
                for m in got.get("Messages", []):
                    with self.lock:
                        self.received.add(m["Body"])
                    client.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
            except (BotoCoreError, ClientError):
                continue

    def finish(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=30)


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_kill9_node_mid_load_loses_no_acknowledged_send(
    kind: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> None:
    store = store_url(kind, request, tmp_path_factory)
    victim, survivor = Node(store), Node(store)
    try:
        client = survivor.client()
        url = client.create_queue(QueueName=unique("kill"), Attributes={"VisibilityTimeout": "1"})[
            "QueueUrl"
        ]
        load = _Load(victim, url).start()
        assert load.enough.wait(timeout=60), "the load did not get going"
        victim.kill9()
        load.finish()
        with load.lock:
            acked, received = set(load.acked), set(load.received)
        assert len(acked) >= 150
        # In-flight messages of the dead node come back after 1 s.
        seen = _drain_all(client, url, acked - received)
        missing = acked - received - seen
        assert not missing, f"{len(missing)} acknowledged sends lost, e.g. {sorted(missing)[:5]}"
    finally:
        victim.stop()
        survivor.stop()


@pytest.fixture
def own_cluster() -> Iterator[LocalRedisCluster]:
    cluster = LocalRedisCluster(masters=3, replicas=1, node_timeout_ms=1000).start()
    try:
        yield cluster
    finally:
        cluster.stop()


def test_redis_master_failover_loses_no_acknowledged_send(own_cluster: LocalRedisCluster) -> None:
    node = Node(own_cluster.url())
    try:
        client = node.client()
        name = unique("failover")
        url = client.create_queue(QueueName=name)["QueueUrl"]
        load = _Load(node, url, senders=2, receivers=0).start()
        assert load.enough.wait(timeout=60)
        master = own_cluster.master_of(f"cmq:{{{name}}}:meta")
        assert master is not None
        own_cluster.kill(master)
        # The replica takes over after the node timeout; sends keep going.
        own_cluster.wait_ok(timeout=30)
        wait_until(
            lambda: own_cluster.master_of(f"cmq:{{{name}}}:meta") not in (None, master), timeout=30
        )
        before = len(load.acked)
        wait_until(lambda: len(load.acked) > before + 20, timeout=30)  # serving again
        load.finish()
        acked = set(load.acked)
        seen = _drain_all(client, url, acked)
        missing = acked - seen
        assert not missing, f"{len(missing)} acknowledged sends lost after failover"
    finally:
        node.stop()


@pytest.mark.parametrize("how", ["sigterm", "kill9"])
def test_sqlite_restart_keeps_messages_and_visibility(how: str, tmp_path: Path) -> None:
    store = f"sqlite:{tmp_path / 'db.sqlite3'}"
    node = Node(store)
    try:
        client = node.client()
        url = client.create_queue(QueueName="durable")["QueueUrl"]
        client.send_message_batch(
            QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": str(i)} for i in range(5)]
        )
        inflight = client.receive_message(
            QueueUrl=url, MaxNumberOfMessages=2, VisibilityTimeout=600
        )["Messages"]
        assert [m["Body"] for m in inflight] == ["0", "1"]
    finally:
        node.kill9() if how == "kill9" else node.stop()
    node = Node(store)
    try:
        client = node.client()
        attrs = client.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        assert attrs["ApproximateNumberOfMessages"] == "3"
        assert attrs["ApproximateNumberOfMessagesNotVisible"] == "2"
        got = client.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=600)
        assert sorted(m["Body"] for m in got["Messages"]) == ["2", "3", "4"]
        # The receipt handles issued before the restart still work.
        client.change_message_visibility(
            QueueUrl=url, ReceiptHandle=inflight[0]["ReceiptHandle"], VisibilityTimeout=0
        )
        client.delete_message(QueueUrl=url, ReceiptHandle=inflight[1]["ReceiptHandle"])
        again = client.receive_message(QueueUrl=url, AttributeNames=["All"])["Messages"]
        assert again[0]["Body"] == "0"
        assert again[0]["Attributes"]["ApproximateReceiveCount"] == "2"
    finally:
        node.stop()


def _malformed(i: int, url: str) -> tuple[str | None, bytes]:
    """The i-th malformed request: (target action or None, body)."""
    handle_junk = ["", "x", "!!!!", "YQ", "YQoxCg", "A" * 5000, "eHgKMQp0b2s"]
    cases: list[tuple[str | None, bytes]] = [
        ("SendMessage", b"{not json"),
        ("SendMessage", b"[1, 2, 3]"),
        ("SendMessage", b"\xff\xfe\x00garbage"),
        ("SendMessage", json.dumps({"QueueUrl": 5, "MessageBody": "x"}).encode()),
        ("SendMessage", json.dumps({"QueueUrl": url, "MessageBody": ["x"]}).encode()),
        ("SendMessage", json.dumps({"QueueUrl": url}).encode()),
        (
            "SendMessage",
            json.dumps({"QueueUrl": url, "MessageBody": "x", "DelaySeconds": -1}).encode(),
        ),
        (
            "SendMessage",
            json.dumps(
                {"QueueUrl": url, "MessageBody": "x", "MessageAttributes": {"a": "b"}}
            ).encode(),
        ),
        ("ReceiveMessage", json.dumps({"QueueUrl": url, "MaxNumberOfMessages": "abc"}).encode()),
        ("ReceiveMessage", json.dumps({"QueueUrl": url, "WaitTimeSeconds": 21}).encode()),
        ("ReceiveMessage", json.dumps({"QueueUrl": url, "MaxNumberOfMessages": True}).encode()),
        (
            "DeleteMessage",
            json.dumps({"QueueUrl": url, "ReceiptHandle": handle_junk[i % 7]}).encode(),
        ),
        (
            "ChangeMessageVisibility",
            json.dumps(
                {"QueueUrl": url, "ReceiptHandle": handle_junk[i % 7], "VisibilityTimeout": 1}
            ).encode(),
        ),
        ("DeleteMessageBatch", json.dumps({"QueueUrl": url, "Entries": "nope"}).encode()),
        ("SendMessageBatch", json.dumps({"QueueUrl": url, "Entries": [{"Id": 1}]}).encode()),
        ("CreateQueue", json.dumps({"QueueName": "a b c"}).encode()),
        ("CreateQueue", json.dumps({"QueueName": "ok", "Attributes": {"X": 1}}).encode()),
        (
            "SetQueueAttributes",
            json.dumps({"QueueUrl": url, "Attributes": {"ConsistencyK": "-3"}}).encode(),
        ),
        (f"NoSuchAction{i}", b"{}"),
        (None, b"{}"),
        ("ListQueues", json.dumps({"MaxResults": 0}).encode()),
    ]
    # Huge bodies cost the server real work to refuse: one in 100 requests.
    if i % 100 == 0:
        return "SendMessage", json.dumps({"QueueUrl": url, "MessageBody": "x" * 1_048_577}).encode()
    if i % 100 == 50:
        return "GetQueueUrl", b"[" * 100_000
    return cases[i % len(cases)]


async def _fire(node: Node, url: str, n: int) -> list[int]:
    statuses: list[int] = []
    conn = aiohttp.TCPConnector(limit=8)
    async with aiohttp.ClientSession(connector=conn) as session:
        sem = asyncio.Semaphore(8)

        async def one(i: int) -> None:
            target, body = _malformed(i, url)
            headers = {"Content-Type": "application/x-amz-json-1.0"}
            if target is not None:
                headers["X-Amz-Target"] = f"AmazonSQS.{target}"
            async with sem, session.post(node.url + "/", data=body, headers=headers) as resp:
                await resp.read()
                statuses.append(resp.status)

        await asyncio.gather(*(one(i) for i in range(n)))
    return statuses


def _oversized(node: Node) -> bytes:
    """A request announcing a 9 MiB body (over the 8 MiB cap): refused before the body is read."""
    with socket.create_connection(("127.0.0.1", node.port), timeout=10) as s:
        s.sendall(
            b"POST / HTTP/1.1\r\nHost: localhost\r\nX-Amz-Target: AmazonSQS.SendMessage\r\n"
            b"Content-Type: application/x-amz-json-1.0\r\nContent-Length: 9437184\r\n\r\n"
            + b"{"
            * 65536
        )
        return s.recv(200)


def test_ten_thousand_malformed_requests_all_4xx(tmp_path: Path) -> None:
    node = Node(f"sqlite:{tmp_path / 'db.sqlite3'}")
    try:
        client = node.client()
        url = client.create_queue(QueueName="target")["QueueUrl"]
        statuses = asyncio.run(_fire(node, url, 10_000))
        assert len(statuses) == 10_000
        assert all(400 <= s < 500 for s in statuses), sorted(set(statuses))
        for _ in range(5):
            assert _oversized(node).startswith(b"HTTP/1.1 413")
        # Still serving, and never answered with an internal error.
        assert node.healthy()
        client.send_message(QueueUrl=url, MessageBody="still here")
        assert client.receive_message(QueueUrl=url)["Messages"][0]["Body"] == "still here"
        _, _, metrics = node.raw("GET", "/metrics", b"", {})
        assert b"InternalError" not in metrics
    finally:
        node.stop()
