"""Bounds: queues in a store, messages in a queue, bytes in a store, each refused
with SQS's OverLimit (403, which SDKs do not retry) once reached."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.service.conftest import store_url, unique
from tests.service.helpers import Node, wait_until


def _over_limit(exc: pytest.ExceptionInfo[ClientError]) -> str:
    err = exc.value.response
    assert err["Error"]["Code"] == "OverLimit"
    assert err["ResponseMetadata"]["HTTPStatusCode"] == 403
    return str(err["Error"]["Message"])


@pytest.fixture(params=["memory", "sqlite", "redis"])
def bounded(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Node]:
    node = Node(store_url(request.param, request, tmp_path_factory), "--max-queue-messages", "5")
    try:
        yield node
    finally:
        node.stop()


def test_messages_per_queue(bounded: Node) -> None:
    sqs = bounded.client()
    url = sqs.create_queue(QueueName=unique("full"))["QueueUrl"]
    sqs.send_message_batch(
        QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": str(i)} for i in range(3)]
    )
    sqs.send_message(QueueUrl=url, MessageBody="3")
    sqs.send_message(QueueUrl=url, MessageBody="4")
    with pytest.raises(ClientError) as exc:
        sqs.send_message(QueueUrl=url, MessageBody="5")
    assert _over_limit(exc) == f"The queue {url.rsplit('/', 1)[1]} holds its maximum of 5 messages."
    with pytest.raises(ClientError) as exc:
        sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": "a", "MessageBody": "a"}])
    _over_limit(exc)
    other = sqs.create_queue(QueueName=unique("other"))["QueueUrl"]
    sqs.send_message(QueueUrl=other, MessageBody="another queue has room")
    # Room again once messages are deleted (the node re-reads the depth).
    for m in sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=2)["Messages"]:
        sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])

    def sent() -> bool:
        try:
            sqs.send_message(QueueUrl=url, MessageBody="room")
        except ClientError:
            return False
        return True

    wait_until(sent)


def test_queues_per_store(tmp_path_factory: pytest.TempPathFactory) -> None:
    for store in ("memory:", f"sqlite:{tmp_path_factory.mktemp('bq') / 'db'}"):
        node = Node(store, "--max-queues", "2")
        try:
            sqs = node.client()
            sqs.create_queue(QueueName="a")
            sqs.create_queue(QueueName="b")
            sqs.create_queue(QueueName="a")  # existing: still answered
            with pytest.raises(ClientError) as exc:
                sqs.create_queue(QueueName="c")
            assert _over_limit(exc) == "The maximum number of queues (2) is reached."
            sqs.delete_queue(QueueUrl=sqs.get_queue_url(QueueName="b")["QueueUrl"])
            sqs.create_queue(QueueName="c")
        finally:
            node.stop()


def _fill(sqs: Any, url: str, body: str, limit: int) -> int:
    """Send ``body`` until refused; returns how many were accepted."""
    for accepted in range(limit):
        try:
            sqs.send_message(QueueUrl=url, MessageBody=body)
        except ClientError as exc:
            assert exc.response["Error"]["Message"].startswith("The store holds its maximum of")
            return accepted
    raise AssertionError(f"{limit} sends of {len(body)} bytes were all accepted")


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_bytes_per_store(
    kind: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> None:
    node = Node(store_url(kind, request, tmp_path_factory), "--max-store-bytes", "2000000")
    try:
        sqs = node.client()
        url = sqs.create_queue(QueueName="bytes")["QueueUrl"]
        accepted = _fill(sqs, url, "x" * 100_000, 100)
        # About 2 MB of 100 kB bodies, give or take the store's own overhead.
        assert 10 <= accepted <= 20
    finally:
        node.stop()


def test_bytes_bound_reads_redis_memory(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # A cluster's masters use megabytes before any message: a 1-byte bound refuses at once.
    node = Node(store_url("redis", request, tmp_path_factory), "--max-store-bytes", "1")
    try:
        sqs = node.client()
        url = sqs.create_queue(QueueName=unique("rb"))["QueueUrl"]
        assert _fill(sqs, url, "x", 5) == 0
    finally:
        node.stop()
