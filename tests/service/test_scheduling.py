"""A node's scheduling policy: every thread of every process of `cmq serve`
runs as SCHED_BATCH by default, as SCHED_OTHER with ``--scheduling normal``."""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest

from cmq._errors import ConfigError
from cmq.service.config import ServiceConfig
from cmq.service.server import apply_scheduling
from tests.service.helpers import Node, wait_until


def _batch_allowed() -> bool:
    """Whether this OS lets a thread become a batch thread (Linux does,
    without privilege; a sandbox may refuse), tried in a throwaway thread."""
    if not hasattr(os, "sched_getscheduler") or not hasattr(os, "SCHED_BATCH"):
        return False
    got: list[bool] = []
    t = threading.Thread(target=lambda: got.append(apply_scheduling("batch")))
    t.start()
    t.join()
    return got == [True]


pytestmark = pytest.mark.skipif(
    not _batch_allowed(), reason="needs Linux's scheduling policies, SCHED_BATCH allowed"
)


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (uvicorn's worker processes)."""
    out = [pid]
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/children", encoding="ascii") as f:
                children = [int(c) for c in f.read().split()]
        except OSError:
            continue
        for child in children:
            out += _tree(child)
    return out


def _policies(pid: int) -> set[int]:
    """The scheduling policies of every thread of ``pid`` and its descendants."""
    found = set()
    for proc in _tree(pid):
        for tid in os.listdir(f"/proc/{proc}/task"):
            try:
                found.add(os.sched_getscheduler(int(tid)))
            except OSError:  # a thread that has ended
                continue
    return found


def _exercise(node: Node) -> None:
    """A request that runs through the store, so its threads exist."""
    client = node.client()
    url = client.create_queue(QueueName="sched")["QueueUrl"]
    client.send_message(QueueUrl=url, MessageBody="x")
    assert client.receive_message(QueueUrl=url)["Messages"][0]["Body"] == "x"


@pytest.mark.parametrize(
    ("args", "policy"),
    [((), "SCHED_BATCH"), (("--scheduling", "normal"), "SCHED_OTHER")],
)
def test_every_thread_of_a_node_runs_by_its_policy(
    tmp_path: Any, args: tuple[str, ...], policy: str
) -> None:
    node = Node(f"sqlite:{tmp_path / 'db.sqlite3'}", *args)
    try:
        _exercise(node)
        # The writer, fsync and reader threads of the SQLite store and the
        # event loop's: more than one thread, all of them by the policy.
        assert len(os.listdir(f"/proc/{node.proc.pid}/task")) > 1
        assert _policies(node.proc.pid) == {getattr(os, policy)}
    finally:
        node.stop()


def test_worker_processes_run_by_the_policy_too(tmp_path: Any) -> None:
    node = Node(f"sqlite:{tmp_path / 'db.sqlite3'}", "--workers", "2")
    try:
        _exercise(node)
        wait_until(lambda: len(_tree(node.proc.pid)) >= 3, timeout=20)
        assert _policies(node.proc.pid) == {os.SCHED_BATCH}
    finally:
        node.stop()


def test_threads_started_after_apply_scheduling_inherit_it() -> None:
    """Run in a thread of its own: the policy is per thread, and the test
    process's own threads keep theirs."""
    seen: dict[str, Any] = {}

    def child() -> None:
        seen["child"] = os.sched_getscheduler(0)

    def main() -> None:
        seen["set"] = apply_scheduling("batch")
        seen["main"] = os.sched_getscheduler(0)
        t = threading.Thread(target=child)
        t.start()
        t.join()
        seen["normal"] = apply_scheduling("normal")
        seen["after"] = os.sched_getscheduler(0)

    before = os.sched_getscheduler(0)
    t = threading.Thread(target=main)
    t.start()
    t.join()
    assert seen == {"set": True, "main": os.SCHED_BATCH, "child": os.SCHED_BATCH,
                    "normal": True, "after": os.SCHED_OTHER}  # fmt: skip
    assert os.sched_getscheduler(0) == before


def test_an_unknown_policy_fails_at_once() -> None:
    with pytest.raises(ConfigError, match="scheduling"):
        ServiceConfig(scheduling="realtime")
