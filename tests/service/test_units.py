"""Unit tests without sockets: the protocol, the ordering rules, the operations
over the memory store driven by a virtual clock, and the configuration."""

from __future__ import annotations

import asyncio
import json
import os
import random
from collections.abc import Coroutine
from typing import Any, TypeVar

import botocore.session
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cmq._errors import CmqError, ConfigError
from cmq.service import errors
from cmq.service.config import ServiceConfig, StoreConfig
from cmq.service.operations import QueueService
from cmq.service.ordering import fifo_picks, standard_picks, window_picks
from cmq.service.protocol import (
    ACTIONS,
    UNSUPPORTED_ACTIONS,
    decode_request,
    encode_error,
    md5_of_body,
    md5_of_message_attributes,
)
from cmq.service.store.memory import MemoryStore

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


class Clock:
    """Virtual time in ms: tests move it by hand, nothing sleeps."""

    def __init__(self) -> None:
        self.now = 1_700_000_000_000

    def __call__(self) -> int:
        return self.now


def service() -> tuple[QueueService, Clock]:
    clock = Clock()
    return QueueService(MemoryStore(), clock=clock, rng=random.Random(7)), clock


# -- protocol -------------------------------------------------------------------


def test_actions_cover_the_sqs_model() -> None:
    model = botocore.session.get_session().get_service_model("sqs")
    assert set(model.operation_names) == ACTIONS | UNSUPPORTED_ACTIONS
    assert not UNSUPPORTED_ACTIONS  # the whole API of botocore's current model


def test_every_modelled_error_we_raise_is_in_botocores_model() -> None:
    model = botocore.session.get_session().get_service_model("sqs")
    modelled = {s.name for s in model.error_shapes}
    ours = {
        cls.type_name
        for cls in vars(errors).values()
        if isinstance(cls, type) and issubclass(cls, errors.SqsError) and "." in cls.query_code
    }
    assert ours <= modelled


@pytest.mark.parametrize(
    ("target", "body", "error"),
    [
        (None, b"{}", errors.InvalidAction),
        ("AmazonSQS.Nope", b"{}", errors.InvalidAction),
        ("AmazonSQS.SendMessage", b"{", errors.SerializationError),
        ("AmazonSQS.SendMessage", b"[]", errors.SerializationError),
        ("AmazonSQS.SendMessage", b"\xff", errors.SerializationError),
        ("AmazonSQS.SendMessage", b"[" * 100_000, errors.SerializationError),
    ],
)
def test_decode_request_rejects(target: str | None, body: bytes, error: type[Exception]) -> None:
    with pytest.raises(error):
        decode_request(target, body)


@given(st.binary(max_size=200))
@settings(max_examples=200, deadline=None)
def test_decode_request_never_raises_anything_else(body: bytes) -> None:
    """Invariant: decode it or raise an SqsError, nothing else."""
    try:
        decode_request("AmazonSQS.SendMessage", body)
    except errors.SqsError:
        pass


def test_error_encoding() -> None:
    status, headers, body = encode_error(errors.QueueDoesNotExist("gone"))
    assert status == 400
    assert (b"x-amzn-query-error", b"AWS.SimpleQueueService.NonExistentQueue;Sender") in headers
    assert json.loads(body) == {"__type": "com.amazonaws.sqs#QueueDoesNotExist", "message": "gone"}
    assert isinstance(errors.QueueDoesNotExist("x"), CmqError)


def test_md5s_known_answers() -> None:
    assert md5_of_body("hello") == "5d41402abc4b2a76b9719d911017c592"
    # Computed by hand from SQS's documented encoding.
    import hashlib
    import struct

    expected = hashlib.md5(
        struct.pack(">I", 1)
        + b"a"
        + struct.pack(">I", 6)
        + b"String"
        + b"\x01"
        + struct.pack(">I", 1)
        + b"x"
    ).hexdigest()
    assert md5_of_message_attributes({"a": {"DataType": "String", "StringValue": "x"}}) == expected


# -- ordering ---------------------------------------------------------------------


@given(
    st.lists(st.integers(0, 10_000), unique=True, max_size=40).map(sorted),
    st.integers(1, 50),
    st.integers(1, 10),
    st.lists(st.floats(0, 0.999999), min_size=10, max_size=10),
)
def test_standard_picks_stay_in_the_window(
    visible: list[int], k: int, n: int, rand: list[float]
) -> None:
    picks = standard_picks(visible, k, n, rand)
    assert len(picks) == min(n, len(visible))
    assert len(set(picks)) == len(picks)
    remaining = list(visible)
    for p in picks:
        assert p in remaining[:k]
        remaining.remove(p)
    if k == 1:
        assert picks == visible[: len(picks)]


@given(
    st.lists(st.tuples(st.integers(0, 10_000), st.booleans()), unique_by=lambda r: r[0],
             max_size=40).map(sorted),
    st.integers(1, 50),
    st.integers(1, 10),
    st.lists(st.floats(0, 0.999999), min_size=10, max_size=10),
)  # fmt: skip
def test_window_picks_count_in_flight_messages(
    rows: list[tuple[int, bool]], k: int, n: int, rand: list[float]
) -> None:
    # An atomic receive's window: the first k rows not picked yet, visible
    # or in flight; a pick is a visible one of them, or, when all of them
    # are in flight, the first visible row after them.
    picks = window_picks(rows, k, n, rand)
    visible = [s for s, v in rows if v]
    assert len(picks) == min(n, len(visible))
    remaining = list(rows)
    for p in picks:
        span = remaining[:k]
        if any(v for _, v in span):
            assert (p, True) in span
        else:
            assert p == next(s for s, v in remaining if v)
        remaining.remove((p, True))
    if k == 1:
        assert picks == visible[: len(picks)]
    # With nothing in flight it is the lock-free mode's window.
    assert window_picks([(s, True) for s in visible], k, n, rand) == standard_picks(
        visible, k, n, rand
    )


def test_window_picks_stay_behind_messages_in_flight() -> None:
    # Two receivers hold 1 and 3 of 1..6 at K=3: a third receive picks among
    # 2 only (K counts 1 and 3), where counting only visible messages it
    # picked among 2, 4 and 5.
    rows = [(1, False), (2, True), (3, False), (4, True), (5, True), (6, True)]
    assert window_picks(rows, 3, 1, [0.99]) == [2]
    assert standard_picks([2, 4, 5, 6], 3, 1, [0.99]) == [5]
    # All K in flight: the first visible message after them.
    assert window_picks([(1, False), (2, False), (3, True), (4, True)], 2, 1, [0.99]) == [3]
    assert window_picks([(1, False), (2, False)], 2, 1, [0.5]) == []


def test_fifo_picks_block_groups_behind_invisible_messages() -> None:
    rows = [(1, "a", False), (2, "a", True), (3, "b", True), (4, "b", True), (5, "c", True)]
    assert fifo_picks(rows, 10) == [3, 4, 5]
    assert fifo_picks(rows, 2) == [3, 4]


# -- operations on the memory store, in virtual time --------------------------------


def test_visibility_timeout_in_virtual_time() -> None:
    svc, clock = service()

    async def go() -> None:
        url = (await svc.handle("CreateQueue", {"QueueName": "q"}, "h"))["QueueUrl"]
        await svc.handle("SendMessage", {"QueueUrl": url, "MessageBody": "x"}, "h")
        got = await svc.handle("ReceiveMessage", {"QueueUrl": url, "VisibilityTimeout": 30}, "h")
        assert len(got["Messages"]) == 1
        clock.now += 29_999
        assert await svc.handle("ReceiveMessage", {"QueueUrl": url}, "h") == {}
        clock.now += 1
        again = await svc.handle(
            "ReceiveMessage", {"QueueUrl": url, "AttributeNames": ["All"]}, "h"
        )
        assert again["Messages"][0]["Attributes"]["ApproximateReceiveCount"] == "2"

    run(go())


def test_delay_and_dedup_window_in_virtual_time() -> None:
    svc, clock = service()

    async def go() -> None:
        url = (
            await svc.handle(
                "CreateQueue",
                {"QueueName": "q.fifo", "Attributes": {"FifoQueue": "true", "DelaySeconds": "5"}},
                "h",
            )
        )["QueueUrl"]
        send = {
            "QueueUrl": url,
            "MessageBody": "x",
            "MessageGroupId": "g",
            "MessageDeduplicationId": "d",
        }
        first = await svc.handle("SendMessage", send, "h")
        assert await svc.handle("ReceiveMessage", {"QueueUrl": url}, "h") == {}
        clock.now += 5_000
        got = await svc.handle("ReceiveMessage", {"QueueUrl": url}, "h")
        await svc.handle(
            "DeleteMessage",
            {"QueueUrl": url, "ReceiptHandle": got["Messages"][0]["ReceiptHandle"]},
            "h",
        )
        clock.now += 4 * 60_000  # inside the 5-minute window: a duplicate
        assert (await svc.handle("SendMessage", send, "h"))["MessageId"] == first["MessageId"]
        clock.now += 61_000  # outside: a new message
        assert (await svc.handle("SendMessage", send, "h"))["MessageId"] != first["MessageId"]

    run(go())


def test_retention_period_in_virtual_time() -> None:
    svc, clock = service()

    async def go() -> None:
        url = (
            await svc.handle(
                "CreateQueue",
                {"QueueName": "r", "Attributes": {"MessageRetentionPeriod": "60"}},
                "h",
            )
        )["QueueUrl"]
        await svc.handle("SendMessage", {"QueueUrl": url, "MessageBody": "old"}, "h")
        clock.now += 30_000
        await svc.handle("SendMessage", {"QueueUrl": url, "MessageBody": "young"}, "h")
        clock.now += 30_000  # "old" is 60 s old now: gone
        got = await svc.handle("ReceiveMessage", {"QueueUrl": url, "MaxNumberOfMessages": 10}, "h")
        assert [m["Body"] for m in got["Messages"]] == ["young"]
        attrs = await svc.handle(
            "GetQueueAttributes", {"QueueUrl": url, "AttributeNames": ["All"]}, "h"
        )
        assert attrs["Attributes"]["ApproximateNumberOfMessagesNotVisible"] == "1"
        assert attrs["Attributes"]["ApproximateNumberOfMessages"] == "0"

    run(go())


def test_attribute_changes_reach_other_nodes_within_the_cache_time() -> None:
    store = MemoryStore()
    clock = Clock()
    a = QueueService(store, clock=clock)
    b = QueueService(store, clock=clock)

    async def go() -> None:
        url = (await a.handle("CreateQueue", {"QueueName": "q"}, "h"))["QueueUrl"]
        await b.handle("SendMessage", {"QueueUrl": url, "MessageBody": "x"}, "h")  # b caches
        await a.handle(
            "SetQueueAttributes",
            {"QueueUrl": url, "Attributes": {"MaximumMessageSize": "1024"}},
            "h",
        )
        clock.now += 1_000
        with pytest.raises(errors.InvalidParameterValue):
            await b.handle("SendMessage", {"QueueUrl": url, "MessageBody": "x" * 2000}, "h")

    run(go())


def test_two_nodes_on_a_lock_free_queue_receive_the_same_message() -> None:
    # Two service nodes over one store; each receive is held after its read
    # until both have read (a deterministic interleaving, no timing): both
    # nodes hand out the head, with their own receipt handles.
    store = MemoryStore()
    clock = Clock()
    a = QueueService(store, clock=clock, rng=random.Random(1))
    b = QueueService(store, clock=clock, rng=random.Random(2))
    held: list[str] = []

    async def go() -> None:
        both_read = asyncio.Event()

        async def hold(name: str, picks: list[int]) -> None:
            held.append(name)
            if len(held) == 2:
                both_read.set()
            await asyncio.wait_for(both_read.wait(), 30)

        store.between_read_and_write = hold
        for mode, expect_same in (("lock-free", True), ("atomic", False)):
            held.clear()
            both_read.clear()
            name = f"q-{mode}"
            attrs = {"ReceiveMode": mode}
            url = (await a.handle("CreateQueue", {"QueueName": name, "Attributes": attrs}, "h"))[
                "QueueUrl"
            ]
            for body in ("first", "second"):
                await a.handle("SendMessage", {"QueueUrl": url, "MessageBody": body}, "h")
            got = await asyncio.gather(
                a.handle("ReceiveMessage", {"QueueUrl": url}, "h"),
                b.handle("ReceiveMessage", {"QueueUrl": url}, "h"),
            )
            bodies = [r["Messages"][0]["Body"] for r in got]
            handles = {r["Messages"][0]["ReceiptHandle"] for r in got}
            assert len(handles) == 2
            if expect_same:
                assert bodies == ["first", "first"] and held == [name, name]
            else:
                assert sorted(bodies) == ["first", "second"] and held == []

    run(go())


# -- configuration ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "kind"),
    [
        ("memory:", "memory"),
        ("sqlite:", "sqlite"),
        ("sqlite:/tmp/x.db?synchronous=normal", "sqlite"),
        ("redis-cluster://127.0.0.1:7000,127.0.0.1:7001?wait_replicas=0", "redis-cluster"),
    ],
)
def test_store_urls(url: str, kind: str) -> None:
    assert StoreConfig.from_url(url).kind == kind


def test_store_url_details() -> None:
    cfg = StoreConfig.from_url("redis-cluster://a:1,b:2?wait_replicas=0&wait_timeout_ms=5")
    assert cfg.nodes == (("a", 1), ("b", 2))
    assert (cfg.wait_replicas, cfg.wait_timeout_ms) == (0, 5)
    assert StoreConfig.from_url("sqlite:///abs/x.db").path == "/abs/x.db"


@pytest.mark.parametrize(
    "make",
    [
        lambda: StoreConfig.from_url("postgres://x"),
        lambda: StoreConfig.from_url("redis-cluster://h:notaport"),
        lambda: StoreConfig.from_url("sqlite:x?synchronous=off"),
        lambda: ServiceConfig(port=70000),
        lambda: ServiceConfig(workers=2, store=StoreConfig(kind="memory")),
        lambda: ServiceConfig(account_id="12"),
    ],
)
def test_bad_config_fails_at_once(make: Any) -> None:
    with pytest.raises(ConfigError):
        make()


# -- fuzz: any parameters give a result or an SqsError, never another exception ------

_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
_KEYS = [
    "QueueUrl",
    "QueueName",
    "MessageBody",
    "ReceiptHandle",
    "Entries",
    "Attributes",
    "AttributeNames",
    "MessageAttributes",
    "MessageSystemAttributes",
    "MaxNumberOfMessages",
    "VisibilityTimeout",
    "WaitTimeSeconds",
    "DelaySeconds",
    "MessageGroupId",
    "MessageDeduplicationId",
    "MessageAttributeNames",
    "QueueNamePrefix",
    "MaxResults",
    "NextToken",
]


@given(
    st.sampled_from(sorted(ACTIONS)),
    st.dictionaries(
        st.sampled_from(_KEYS), _json | st.just("http://h/000000000000/fuzz"), max_size=6
    ),
)
@settings(max_examples=200, deadline=None)
def test_operations_fuzz(action: str, params: dict[str, Any]) -> None:
    svc, _ = service()

    async def go() -> None:
        await svc.handle("CreateQueue", {"QueueName": "fuzz"}, "h")
        try:
            await svc.handle(action, {**params, "WaitTimeSeconds": 0}, "h")
        except errors.SqsError:
            pass

    run(go())


# -- the benchmark's figures -----------------------------------------------------------


def _rec(seq: int, t: int, receiver: int = 0, count: int = 1) -> dict[str, Any]:
    return {
        "system": "s",
        "queue": "q",
        "k": 1,
        "t_recv": 1,
        "receiver": receiver,
        "seq": seq,
        "send_ns": 0,
        "receive_ns": t,
        "receive_count": count,
        "message_id": str(seq),
    }


def test_summarise_known_answers() -> None:
    from cmq.lab.bench.sqs import lab_rows, summarise

    [in_order] = summarise([_rec(i, i) for i in range(10)])
    assert in_order["out_of_order_rate"] == 0 and in_order["duplication_rate"] == 0
    [backwards] = summarise([_rec(i, 10 - i) for i in range(10)])
    assert backwards["out_of_order_rate"] == 1.0
    [dup] = summarise([_rec(0, 1), _rec(1, 2), _rec(0, 3, count=2), _rec(2, 4)])
    assert dup["duplication_rate"] == round(1 / 3, 4)
    assert dup["out_of_order_rate"] == 0  # duplicates do not count as disorder
    # Two receivers each in order, interleaved out of order overall.
    [two] = summarise([_rec(1, 1, 0), _rec(0, 2, 1), _rec(3, 3, 0), _rec(2, 4, 1)])
    assert two["out_of_order_per_receiver"] == 0 and two["out_of_order_rate"] == round(2 / 3, 4)
    rows = lab_rows([_rec(5, 9)], "run1")
    assert rows[0]["recv_ns"] == 9 and rows[0]["stream"] == "q" and rows[0]["receiver"] == "0"
    [lock_free] = lab_rows([{**_rec(5, 9), "mode": "lock-free"}], "run1")
    assert lock_free["scenario"] == "T=1,K=1,lock-free"
    assert json.loads(lock_free["params"])["mode"] == "lock-free"


def test_lab_rows_fit_the_lab_schema() -> None:
    records = pytest.importorskip("cmq.lab.records")
    pa = pytest.importorskip("pyarrow")
    from cmq.lab.bench.sqs import lab_rows

    table = pa.Table.from_pylist(
        lab_rows([_rec(1, 2), {**_rec(2, 3), "request_ns": 1}], "r"),
        schema=records.RECORDS_SCHEMA,
    )
    assert table.num_rows == 2
    assert table.column("request_ns").to_pylist() == [None, 1]


@pytest.mark.slow
def test_throughput_counts_from_when_every_connection_has_warmed_up() -> None:
    from cmq.lab.bench.sqs import _cycles, start_cmq

    servers = start_cmq("memory:")
    try:
        opened: list[int] = []
        result = asyncio.run(_cycles(servers.urls, 0.3, 6, on_start=lambda: opened.append(1)))
    finally:
        servers.stop()
    assert opened == [1]  # once, when all 6 had run their uncounted cycle
    assert result["cycles"] > 0 and result["errors"] == 0


@pytest.mark.slow
def test_order_experiment_runs_end_to_end() -> None:
    from cmq.lab.bench.sqs import order_experiment, summarise

    records = order_experiment("memory:", t_recvs=(1,), ks=(1, 1_000_000), n=30)
    assert len(records) == 60
    k1, no_order = summarise(records)
    assert k1["out_of_order_rate"] == 0.0
    assert no_order["out_of_order_rate"] > 0.0


@given(st.binary(max_size=200), st.text(max_size=20))
@settings(max_examples=200, deadline=None)
def test_decode_form_never_raises_anything_else(body: bytes, path: str) -> None:
    """Invariant of the query protocol's decoder: a Request or an SqsError."""
    from cmq.service.query_protocol import decode_form

    try:
        decode_form(body, path)
    except errors.SqsError:
        pass


@pytest.mark.slow
def test_throughput_benchmark_runs_end_to_end() -> None:
    from cmq.lab.bench.sqs import throughput

    row = throughput("memory:", seconds=0.5, concurrency=4)
    assert row["cycles"] > 0 and row["errors"] == 0
    assert row["server_cpu_ms_per_cycle"] > 0
    # The event loop's thread is part of the node, the generator is apart.
    assert 0 < row["loop_cpu_ms_per_cycle"] <= row["server_cpu_ms_per_cycle"]
    assert row["client_cpu_ms_per_cycle"] > 0
    # No store processes of its own: per CPU-second is per the node's CPU.
    assert row["store_cpu_s"] == 0 and row["node_cpu_s"] > 0
    assert row["cycles_per_cpu_s"] == pytest.approx(row["cycles"] / row["node_cpu_s"], rel=0.01)


def test_cpu_used_counts_every_thread_of_a_process_and_ended_ones_by_ticks() -> None:
    import threading
    import time

    from cmq.lab.bench.sqs import _cpu_reading, _cpu_used
    from tests.waiting import wait_until

    spent: list[float] = []
    finish = threading.Event()

    def work() -> None:
        start = time.thread_time()
        sum(i * i for i in range(3_000_000))
        spent.append(time.thread_time() - start)
        finish.wait(30)

    me = os.getpid()
    before = _cpu_reading(me)
    worker = threading.Thread(target=work)
    worker.start()
    wait_until(lambda: bool(spent), timeout=30)
    # The worker is alive: its on-CPU nanoseconds are summed, exactly.
    during = _cpu_reading(me)
    assert spent[0] > 0.03
    assert _cpu_used(before, during) >= 0.99 * spent[0]
    # Once it has ended its time is gone from the exact sum (its schedstat
    # file with it): the ticks, which keep it, are used instead.
    finish.set()
    worker.join()
    assert _cpu_used(before, _cpu_reading(me)) >= spent[0] - 0.025  # to the 10 ms tick
    gone = _cpu_reading(2**22 + 7)  # no such process (above pid_max's default)
    assert (gone.exact, gone.ticks) == (0.0, 0.0)


@pytest.mark.slow
def test_wrk_generator_counts_every_cycle_it_completes() -> None:
    """The wrk generator's cycles are deletes it saw answered: what it sent
    minus what it deleted is what the queue still holds, give or take the
    requests in flight when it stopped."""
    import asyncio

    from cmq.lab.bench import sqs as bench
    from cmq.lab.bench.wrk_load import wrk_cycles, wrk_path

    if wrk_path() is None:
        pytest.skip("wrk is not installed (apt-get install wrk)")
    servers = bench.start_cmq("memory:")
    try:
        conn = bench._Conn(servers.urls[0])
        qurl = asyncio.run(bench._create(conn, "wrk-check", None))
        path = "/" + qurl.split("/", 3)[3]
        concurrency = 8
        row = wrk_cycles(servers.urls, path, 1, concurrency, bench._HEADERS["Authorization"])

        async def left() -> int:
            got = await bench._call(
                bench._Conn(servers.urls[0]),
                "GetQueueAttributes",
                {"QueueUrl": qurl, "AttributeNames": ["All"]},
            )
            a = got["Attributes"]
            return int(a["ApproximateNumberOfMessages"]) + int(
                a["ApproximateNumberOfMessagesNotVisible"]
            )

        remaining = asyncio.run(left())
    finally:
        servers.stop()
    assert row["cycles"] > 0 and row["errors"] == 0 and row["empty_receives"] == 0
    assert row["client_cpu_s"] > 0
    assert abs(remaining - (row["sent"] - row["cycles"])) <= concurrency
