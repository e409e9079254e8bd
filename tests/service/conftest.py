"""Fixtures of the queue-service tests.

Every behavioural test runs against a live `cmq serve` subprocess for each
store (memory, SQLite, Redis Cluster), driven by unmodified boto3. The Redis
Cluster (3 masters, 3 replicas) starts once per session; nodes once per
session and store. Each test works on its own uniquely named queue.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from cmq.lab.bench.redis_local import LocalRedisCluster
from tests.service.helpers import Node

STORES = ["memory", "sqlite", "redis"]


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[LocalRedisCluster]:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server missing: apt-get install -y redis-server")
    cluster = LocalRedisCluster(masters=3, replicas=1).start()
    try:
        yield cluster
    finally:
        cluster.stop()


def store_url(
    kind: str, request: pytest.FixtureRequest, tmp_factory: pytest.TempPathFactory
) -> str:
    if kind == "memory":
        return "memory:"
    if kind == "sqlite":
        return f"sqlite:{tmp_factory.mktemp('sqlite') / 'cmq.sqlite3'}"
    cluster: LocalRedisCluster = request.getfixturevalue("redis_cluster")
    return cluster.url()


@pytest.fixture(scope="session", params=STORES)
def node(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Node]:
    n = Node(store_url(request.param, request, tmp_path_factory))
    try:
        yield n
    finally:
        n.stop()


@pytest.fixture
def sqs(node: Node) -> Any:
    return node.client()


@pytest.fixture
def queue(sqs: Any) -> str:
    url: str = sqs.create_queue(QueueName=f"t-{uuid.uuid4().hex[:12]}")["QueueUrl"]
    return url


def unique(prefix: str = "q") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"
