"""Stateless nodes: several `cmq serve` processes over one store, and --workers."""

from __future__ import annotations

import subprocess
import sys
import threading
from typing import Any

import pytest

from tests.service.conftest import store_url, unique
from tests.service.helpers import Node

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_two_nodes_share_queues_and_long_poll_wakes_across_nodes(
    kind: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> None:
    store = store_url(kind, request, tmp_path_factory)
    a, b = Node(store), Node(store)
    try:
        ca, cb = a.client(), b.client()
        name = unique("shared")
        ca.create_queue(QueueName=name)
        url_b = cb.get_queue_url(QueueName=name)["QueueUrl"]
        assert url_b.startswith(b.url)  # built from b's Host header
        result: dict[str, Any] = {}

        def poll() -> None:
            result.update(
                ca.receive_message(QueueUrl=f"{a.url}/000000000000/{name}", WaitTimeSeconds=15)
            )

        t = threading.Thread(target=poll)
        t.start()
        cb.send_message(QueueUrl=url_b, MessageBody="through b")
        t.join(timeout=20)
        assert not t.is_alive()
        msg = result["Messages"][0]
        assert msg["Body"] == "through b"
        # A receipt handle from node a works on node b: no node-local state.
        cb.delete_message(QueueUrl=url_b, ReceiptHandle=msg["ReceiptHandle"])
        attrs = cb.get_queue_attributes(QueueUrl=url_b, AttributeNames=["All"])["Attributes"]
        assert (
            attrs["ApproximateNumberOfMessages"]
            == attrs["ApproximateNumberOfMessagesNotVisible"]
            == "0"
        )
    finally:
        a.stop()
        b.stop()


def test_workers_serve_one_port(tmp_path: Any) -> None:
    node = Node(f"sqlite:{tmp_path / 'db.sqlite3'}", "--workers", "2")
    try:
        clients = [node.client() for _ in range(4)]
        url = clients[0].create_queue(QueueName="w")["QueueUrl"]
        for i, c in enumerate(clients):
            c.send_message_batch(
                QueueUrl=url, Entries=[{"Id": str(j), "MessageBody": f"{i}-{j}"} for j in range(5)]
            )
        seen = []
        for c in clients * 3:
            for m in c.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", []):
                seen.append(m["Body"])
                c.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
        assert sorted(seen) == sorted(f"{i}-{j}" for i in range(4) for j in range(5))
    finally:
        node.stop()


def test_memory_store_refuses_several_workers() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "cmq", "serve", "--store", "memory:", "--workers", "2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1
    assert "--workers 1" in out.stderr


def test_serve_is_a_cmq_command() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "cmq", "--help"], capture_output=True, text=True, timeout=60
    )
    assert "serve" in out.stdout and "SQS-compatible" in out.stdout
