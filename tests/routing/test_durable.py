"""Durable exchanges and queues, persistent messages: the core's journal, the
store, and a real broker process killed with SIGKILL and started again."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cmq import ConfigError, RemoteError
from cmq.routing import BrokerClient
from cmq.routing._core import BrokerCore
from cmq.routing._protocol import Ack, Bind, Consume, DeclareExchange, DeclareQueue, Publish
from cmq.routing._server import Broker
from cmq.routing._store import Store

WAIT = 10.0
P = {"delivery_mode": 2}
ME = ("127.0.0.1", 4000)


# -- the core's journal (sans-IO) ---------------------------------------------------


def _core() -> BrokerCore:
    core = BrokerCore()
    core.persisting = True
    core.call(DeclareExchange(rid=0, name="x", type="topic", durable=True), ME, 0.0)
    core.call(DeclareQueue(rid=0, name="dq", max_length=100, overflow="drop-head", durable=True), ME, 0.0)
    core.call(DeclareQueue(rid=0, name="tq", max_length=100, overflow="drop-head"), ME, 0.0)
    core.call(Bind(rid=0, queue="dq", exchange="x", key="a.#"), ME, 0.0)
    core.call(Bind(rid=0, queue="tq", exchange="x", key="a.#"), ME, 0.0)
    return core


def test_journal_keeps_durable_things_and_persistent_messages_in_durable_queues_only() -> None:
    core = _core()
    kinds = [r[0] for r in core.journal]
    assert kinds == ["exchange", "queue", "bind"]  # tq and its binding are not kept
    core.journal.clear()
    core.call(Publish(rid=0, exchange="x", routing_key="a.b", body=b"p", properties=P), ME, 0.0)
    core.call(Publish(rid=0, exchange="x", routing_key="a.b", body=b"t"), ME, 0.0)
    # One record: the persistent message in dq (not its copy in tq, not the transient one).
    assert [(r[0], r[2]) for r in core.journal] == [("msg", "dq")]


def test_an_ack_forgets_the_record_and_a_journal_off_core_writes_nothing() -> None:
    core = _core()
    core.call(Publish(rid=0, exchange="x", routing_key="a.b", body=b"p", properties=P), ME, 0.0)
    pid = core.journal[-1][1]
    core.journal.clear()
    core.call(Consume(rid=0, tag="c", queue="dq", prefetch=0, no_ack=False), ME, 0.0)
    out = core.messages_to_send()
    dtag = out[-1].payload[2][0][0]
    core.call(Ack(tag="c", delivery_tags=(dtag,)), ME, 0.0)
    assert core.journal == [("msg-", pid)]

    plain = BrokerCore()  # no store: durable accepted, nothing journalled
    plain.call(DeclareQueue(rid=0, name="dq", max_length=10, overflow="drop-head", durable=True), ME, 0.0)
    plain.call(Publish(rid=0, exchange="", routing_key="dq", body=b"p", properties=P), ME, 0.0)
    assert plain.journal == []


def test_redeclaring_with_another_durability_is_refused() -> None:
    from cmq.routing._core import Refused

    core = _core()
    with pytest.raises(Refused, match="durable"):
        core.call(DeclareQueue(rid=0, name="dq", max_length=100, overflow="drop-head"), ME, 0.0)
    with pytest.raises(Refused, match="durable"):
        core.call(DeclareExchange(rid=0, name="x", type="topic"), ME, 0.0)


def _restarted(core: BrokerCore, data_dir: Path, now: float = 0.0) -> BrokerCore:
    """A new core that took back what ``core``'s journal wrote to a store in ``data_dir``."""
    store = Store(data_dir)
    store.write(core.journal)
    store.close()
    again = BrokerCore()
    store = Store(data_dir)
    again.restore(store.load(), now)
    store.close()
    return again


def test_store_round_trip_in_order_marked_redelivered(tmp_path: Path) -> None:
    core = _core()
    for i in range(5):
        core.call(Publish(rid=0, exchange="x", routing_key="a.b", body=b"m%d" % i, properties=P), ME, 0.0)
    again = _restarted(core, tmp_path)
    assert set(again._queues) == {"dq"}
    assert again.exchange_type("x") == "topic"
    assert [(m[2], m[3]) for m in again._queues["dq"].ready] == [(b"m%d" % i, True) for i in range(5)]
    assert ("x", "a.#") in again._queues["dq"].bindings
    assert again.next_message_id > max(m[4].pid for m in again._queues["dq"].ready if m[4] is not None)


def test_a_durable_queues_binding_to_a_system_exchange_is_kept_and_the_exchange_never_stored(
    tmp_path: Path,
) -> None:
    core = BrokerCore()
    core.persisting = True
    core.call(DeclareExchange(rid=0, name="amq.direct", type="direct", durable=True), ME, 0.0)
    core.call(DeclareQueue(rid=0, name="dq", max_length=10, overflow="drop-head", durable=True), ME, 0.0)
    core.call(Bind(rid=0, queue="dq", exchange="amq.direct", key="k"), ME, 0.0)
    assert [r[0] for r in core.journal] == ["queue", "bind"]
    again = _restarted(core, tmp_path)
    assert ("amq.direct", "k") in again._queues["dq"].bindings
    again.call(Publish(rid=0, exchange="amq.direct", routing_key="k", body=b"m"), ME, 0.0)
    assert len(again._queues["dq"].ready) == 1


def test_a_durable_queues_byte_bound_is_kept_and_counts_the_messages_taken_back(tmp_path: Path) -> None:
    """x-max-length-bytes survives a restart, and the persistent messages
    taken back count against it: one more drops the oldest."""
    core = BrokerCore()
    core.persisting = True
    core.call(DeclareQueue(rid=0, name="dq", max_length=10, overflow="drop-head", durable=True,
                           arguments={"x-max-length-bytes": 8}), ME, 0.0)  # fmt: skip
    for body in (b"aaaa", b"bbbb"):
        core.call(Publish(rid=0, exchange="", routing_key="dq", body=body, properties=P), ME, 0.0)
    again = _restarted(core, tmp_path)
    assert again.queue_options("dq") == (10, "drop-head", {"x-max-length-bytes": 8})
    again.call(Publish(rid=0, exchange="", routing_key="dq", body=b"cccc", properties=P), ME, 0.0)
    assert [m[2] for m in again._queues["dq"].ready] == [b"bbbb", b"cccc"]


def test_a_durable_priority_queue_takes_its_messages_back_in_priority_order(tmp_path: Path) -> None:
    core = BrokerCore()
    core.persisting = True
    core.call(DeclareQueue(rid=0, name="dq", max_length=10, overflow="drop-head", durable=True,
                           arguments={"x-max-priority": 5}), ME, 0.0)  # fmt: skip
    for body, p in ((b"low", 1), (b"high", 5), (b"none", None)):
        props = dict(P) if p is None else {**P, "priority": p}
        core.call(Publish(rid=0, exchange="", routing_key="dq", body=body, properties=props), ME, 0.0)
    again = _restarted(core, tmp_path)
    assert again.queue_options("dq") == (10, "drop-head", {"x-max-priority": 5})
    assert [m[2] for m in again._queues["dq"].ready] == [b"high", b"low", b"none"]


def test_an_exchange_binding_is_kept_when_both_exchanges_are_durable(tmp_path: Path) -> None:
    from cmq.routing._core import ExchangeBind, ExchangeUnbind

    core = BrokerCore()
    core.persisting = True
    for name, durable in (("src", True), ("dest", True), ("brief", False)):
        core.call(DeclareExchange(rid=0, name=name, type="fanout", durable=durable), ME, 0.0)
    core.call(ExchangeBind(rid=0, destination="dest", source="src", key=""), ME, 0.0)
    core.call(ExchangeBind(rid=0, destination="brief", source="src", key=""), ME, 0.0)  # not kept
    core.call(ExchangeBind(rid=0, destination="src", source="dest", key="k"), ME, 0.0)
    core.call(ExchangeUnbind(rid=0, destination="src", source="dest", key="k"), ME, 0.0)
    core.call(DeclareQueue(rid=0, name="dq", max_length=10, overflow="drop-head", durable=True), ME, 0.0)
    core.call(Bind(rid=0, queue="dq", exchange="dest", key=""), ME, 0.0)
    again = _restarted(core, tmp_path)
    assert again.route_preview("src", "") == ["dq"]
    assert again.route_preview("dest", "k") == ["dq"]  # the unbound one stayed unbound
    assert again._into == {"dest": {("src", "")}}
    # Deleting an end deletes the kept binding too.
    again.persisting = True
    from cmq.routing._protocol import DeleteExchange

    again.call(DeleteExchange(rid=0, name="dest"), ME, 0.0)
    third = _restarted(again, tmp_path)
    third.call(DeclareExchange(rid=0, name="dest", type="fanout", durable=True), ME, 0.0)
    third.call(Bind(rid=0, queue="dq", exchange="dest", key=""), ME, 0.0)
    assert third.route_preview("src", "") == []


def test_a_durable_queues_x_expires_is_kept_and_counts_again_from_the_restart(tmp_path: Path) -> None:
    core = BrokerCore()
    core.persisting = True
    core.call(DeclareQueue(rid=0, name="dq", max_length=10, overflow="drop-head", durable=True,
                           arguments={"x-expires": 2000}), ME, 0.0)  # fmt: skip
    again = _restarted(core, tmp_path, now=100.0)
    assert again.queue_options("dq") == (10, "drop-head", {"x-expires": 2000})
    assert again.next_deadline() == 102.0
    again.handle_timer(102.0)
    assert again.queue_options("dq") is None


def test_a_turn_that_publishes_is_flushed_and_one_of_acks_only_is_not(tmp_path: Path) -> None:
    """A publish's records are fsynced before its confirm may leave; a turn
    of acknowledgements only is committed (it survives a killed process)
    without an fsync, and the next flush covers it."""
    store = Store(tmp_path)
    store.write([("queue", "q", 10, "drop-head", b"\x80", 0), ("msg", 1, "q", "", "q", b"a", None, None),
                 ("msg", 2, "q", "", "q", b"b", None, None)])  # fmt: skip
    assert (store.commits, store.flushes) == (1, 1)
    store.write([("msg-", 1)])
    assert (store.commits, store.flushes) == (2, 1)
    store.write([("msg-", 2), ("msg", 3, "q", "", "q", b"c", None, None)])
    assert (store.commits, store.flushes) == (3, 2)
    store.close()
    store = Store(tmp_path)
    assert [m.id for m in store.load().messages] == [3]
    store.close()


def _msg(mid: int, queue: str = "q", body: bytes = b"x") -> tuple[Any, ...]:
    from cmq.routing._store import pack

    return ("msg", mid, queue, "", queue, pack(body), pack({"delivery_mode": 2}), None)


def _kept(data_dir: Path) -> list[int]:
    store = Store(data_dir)
    try:
        return [m.id for m in store.load().messages]
    finally:
        store.close()


def test_a_frame_torn_by_a_crash_ends_the_log_and_what_came_before_is_kept(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.write([("queue", "q", 10, "drop-head", b"\x80", 0), _msg(1), _msg(2)])
    seg, used = store._seg, store._pos
    store.write([_msg(3, body=b"y" * 500)])
    store.close()
    path = tmp_path / f"messages.{seg}.log"
    data = bytearray(path.read_bytes())
    data[used + 20 : used + 30] = bytes(10)  # the third frame half written (zeros where its bytes should be)
    path.write_bytes(bytes(data))
    assert _kept(tmp_path) == [1, 2]
    assert _kept(tmp_path) == [1, 2]  # and the reopened log is whole again


def test_a_flush_never_grows_the_segment_file(tmp_path: Path) -> None:
    """Zeros are written ahead of the frames, so a flush writes data blocks only."""
    store = Store(tmp_path)
    store.write([("queue", "q", 10, "drop-head", b"\x80", 0), _msg(1)])
    path = tmp_path / f"messages.{store._seg}.log"
    size = path.stat().st_size
    for i in range(2, 50):
        store.write([_msg(i, body=b"z" * 1024)])
    assert path.stat().st_size == size
    store.close()


def test_segments_go_when_emptied_oldest_first_and_a_lingering_message_moves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import cmq.routing._store as st

    monkeypatch.setattr(st, "SEGMENT_BYTES", 4096)
    store = Store(tmp_path)
    store.write([("queue", "q", 10**6, "drop-head", b"\x80", 0)])
    body = b"b" * 500
    for i in range(1, 81):  # about 7 messages a segment
        store.write([_msg(i, body=body)])
    assert len(store._segments_on_disk()) > st._MAX_SEGMENTS  # all kept: every segment stays
    store.write([("msg-", i) for i in range(2, 81)])  # all but the first go
    # The first segment's lingering message 1 was written again at the head,
    # and every segment with nothing kept in it is gone.
    assert len(store._segments_on_disk()) <= 2
    for i in range(81, 85):
        store.write([_msg(i, body=body)])
    store.close()
    assert _kept(tmp_path) == [1, 81, 82, 83, 84]


def test_a_purge_or_a_deleted_queue_takes_its_messages_from_the_log(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.write([("queue", "q", 10, "drop-head", b"\x80", 0), ("queue", "r", 10, "drop-head", b"\x80", 0),
                 _msg(1), _msg(2, "r"), ("purge", "q"), _msg(3), _msg(4, "r")])  # fmt: skip
    assert [m.id for m in store.load().messages] == [2, 3, 4]
    store.write([("queue-", "r"), ("queue", "r", 10, "drop-head", b"\x80", 0), _msg(5, "r")])
    store.close()
    assert _kept(tmp_path) == [3, 5]


def test_messages_of_an_earlier_sqlite_store_move_to_the_log(tmp_path: Path) -> None:
    import sqlite3

    from cmq.routing._store import pack

    store = Store(tmp_path)
    store.write([("queue", "q", 10, "drop-head", b"\x80", 0)])
    store.close()
    db = sqlite3.connect(tmp_path / "broker.sqlite3")
    db.execute("INSERT INTO messages VALUES (7, 'q', '', 'q', ?, NULL, NULL)", (pack(b"old"),))
    db.commit()
    db.close()
    store = Store(tmp_path)
    assert [(m.id, m.body) for m in store.load().messages] == [(7, b"old")]
    store.close()
    db = sqlite3.connect(tmp_path / "broker.sqlite3")
    assert db.execute("SELECT COUNT(*) FROM messages").fetchone() == (0,)
    db.close()
    assert _kept(tmp_path) == [7]


def test_a_write_that_fails_keeps_nothing_and_the_next_one_works(tmp_path: Path) -> None:
    store = Store(tmp_path)
    with pytest.raises(KeyError):  # a declaration, then a record the store does not know
        store.write([("queue", "q", 10, "drop-head", b"\x80", 0), ("nonsense", 1)])
    assert store.load().queues == []
    store.write([("queue", "q", 10, "drop-head", b"\x80", 0), _msg(1)])
    store.close()
    assert _kept(tmp_path) == [1]


def test_one_broker_per_data_directory(tmp_path: Path) -> None:
    with Broker(data_dir=tmp_path), pytest.raises(ConfigError, match="another broker is using"):
        Broker(data_dir=tmp_path)


# -- a real broker process, killed -----------------------------------------------


class _Proc:
    def __init__(self, data_dir: Path | None, *extra: str, cwd: Path | None = None) -> None:
        where = [] if data_dir is None else ["--data-dir", str(data_dir)]
        self.p = subprocess.Popen(
            [sys.executable, "-m", "cmq", "broker", "--port", "0", *where, *extra],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd,
        )  # fmt: skip
        assert self.p.stdout is not None
        self.line = self.p.stdout.readline()
        m = re.search(r"serving on ([\d.]+):(\d+)", self.line)
        if m is None:
            self.p.kill()
            raise AssertionError(f"the broker did not start: {self.line!r} {self.p.stderr.read()!r}")  # type: ignore[union-attr]
        self.addr = f"{m.group(1)}:{m.group(2)}"
        a = re.search(r"AMQP 0-9-1 on ([\d.]+):(\d+)", self.line)
        self.amqp = (a.group(1), int(a.group(2))) if a else None

    def kill9(self) -> None:
        self.p.kill()  # SIGKILL: nothing flushed, nothing closed
        self.p.wait(timeout=WAIT)

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait(timeout=WAIT)


@pytest.fixture
def procs() -> Iterator[list[_Proc]]:
    started: list[_Proc] = []
    yield started
    for p in started:
        p.stop()


def _drain(client: BrokerClient, queue: str, n: int) -> list[Any]:
    got = []
    c = client.consume(queue, prefetch=0, auto_ack=False)
    for _ in range(n):
        got.append(c.get(timeout=WAIT))
    return got


def test_kill_9_keeps_durable_queue_bindings_and_confirmed_persistent_messages(
    tmp_path: Path, procs: list[_Proc]
) -> None:
    n = 40
    b = _Proc(tmp_path)
    procs.append(b)
    with BrokerClient(b.addr, timeout=WAIT) as c:
        c.declare_exchange("px", "topic", durable=True)
        c.declare_exchange("tx", "fanout")
        c.declare_queue("dq", durable=True)
        c.declare_queue("tq")
        c.bind("dq", "px", "stock.#")
        c.bind("dq", "tx")
        c.bind("tq", "px", "stock.#")
        for i in range(n):
            assert c.publish("px", "stock.ibm", b"p%d" % i, confirm=True, persistent=True) == 2
        assert c.publish("px", "stock.ibm", b"transient", confirm=True) == 2
        # Two consumed and acknowledged before the kill: they must not come back.
        consumer = c.consume("dq", prefetch=2, auto_ack=False)
        first = [consumer.get(timeout=WAIT) for _ in range(2)]
        assert [d.body for d in first] == [b"p0", b"p1"]
        for d in first:
            consumer.ack(d)
        consumer.cancel()  # sends the acks; its answer leaves after they are on disk
    b.kill9()

    again = _Proc(tmp_path)
    procs.append(again)
    with BrokerClient(again.addr, timeout=WAIT) as c:
        names = {q["name"] for q in c.stats()["per_queue"]}
        assert names == {"dq"}, "the non-durable queue is gone, the durable one is there"
        got = _drain(c, "dq", n - 2)
        assert [d.body for d in got] == [b"p%d" % i for i in range(2, n)]
        assert all(d.redelivered for d in got)
        assert all((d.properties or {}).get("delivery_mode") == 2 for d in got)
        # The durable binding routes; the non-durable exchange is gone.
        assert c.publish("px", "stock.x", b"after", confirm=True, persistent=True) == 1
        with pytest.raises(RemoteError, match="no exchange"):
            c.publish("tx", "", b"x", confirm=True)


def test_without_data_dir_the_state_lives_in_cmq_data_where_the_broker_starts(
    tmp_path: Path, procs: list[_Proc]
) -> None:
    b = _Proc(None, cwd=tmp_path)
    procs.append(b)
    with BrokerClient(b.addr, timeout=WAIT) as c:
        c.declare_queue("dq", durable=True)
        assert c.publish("", "dq", b"kept", confirm=True, persistent=True) == 1
    b.kill9()
    assert (tmp_path / "cmq-data" / "broker.sqlite3").exists()
    again = _Proc(None, cwd=tmp_path)  # started again in the same place: finds it
    procs.append(again)
    with BrokerClient(again.addr, timeout=WAIT) as c:
        assert [d.body for d in _drain(c, "dq", 1)] == [b"kept"]


def test_acked_messages_stay_gone_across_two_restarts(tmp_path: Path, procs: list[_Proc]) -> None:
    b = _Proc(tmp_path)
    procs.append(b)
    with BrokerClient(b.addr, timeout=WAIT) as c:
        c.declare_queue("q", durable=True)
        for i in range(5):
            c.publish("", "q", b"m%d" % i, confirm=True, persistent=True)
    b.kill9()
    b = _Proc(tmp_path)
    procs.append(b)
    with BrokerClient(b.addr, timeout=WAIT) as c:
        consumer = c.consume("q", prefetch=0, auto_ack=False)
        got = [consumer.get(timeout=WAIT) for _ in range(5)]
        for d in got[:3]:
            consumer.ack(d)
        consumer.cancel()
    b.kill9()
    b = _Proc(tmp_path)
    procs.append(b)
    with BrokerClient(b.addr, timeout=WAIT) as c:
        assert [d.body for d in _drain(c, "q", 2)] == [b"m3", b"m4"]
        (q,) = c.stats()["per_queue"]
        assert (q["ready"], q["unacked"]) == (0, 2), "nothing else came back"


def test_amqp_durable_queue_and_delivery_mode_2_survive_kill_9(tmp_path: Path, procs: list[_Proc]) -> None:
    """pika, unmodified: a durable queue, confirmed delivery_mode=2 messages
    and a transient one; after SIGKILL the persistent ones come back to pika,
    redelivered, and the transient queue and message are gone."""
    pika = pytest.importorskip("pika", reason="pika is not installed: pip install 'pycmq[test]'")
    pytest.importorskip("pamqp", reason="pamqp is not installed: pip install 'pycmq[broker]'")

    def connect(p: _Proc) -> Any:
        assert p.amqp is not None
        return pika.BlockingConnection(pika.ConnectionParameters(p.amqp[0], p.amqp[1]))

    b = _Proc(tmp_path, "--amqp-port", "0")
    procs.append(b)
    conn = connect(b)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.exchange_declare("orders", "direct", durable=True)
    ch.queue_declare("work", durable=True)
    ch.queue_declare("scratch")
    ch.queue_bind("work", "orders", "new")
    ch.queue_bind("scratch", "orders", "new")
    persistent = pika.BasicProperties(delivery_mode=2, content_type="text/plain")
    for i in range(10):
        ch.basic_publish("orders", "new", b"o%d" % i, persistent)  # confirmed: raises if nacked
    ch.basic_publish("orders", "new", b"transient")
    b.kill9()

    b = _Proc(tmp_path, "--amqp-port", "0")
    procs.append(b)
    conn = connect(b)
    ch = conn.channel()
    assert ch.queue_declare("work", durable=True, passive=True).method.message_count == 10
    with pytest.raises(pika.exceptions.ChannelClosedByBroker):
        conn.channel().queue_declare("scratch", passive=True)
    got = []
    for _ in range(10):
        method, props, body = ch.basic_get("work")
        assert method is not None
        assert method.redelivered and props.delivery_mode == 2 and props.content_type == "text/plain"
        got.append(body)
        ch.basic_ack(method.delivery_tag)
    assert got == [b"o%d" % i for i in range(10)]
    conn.close()


def test_cli_durable_queue_and_persistent_publish(tmp_path: Path) -> None:
    from cmq.cli import main

    with Broker(data_dir=tmp_path).start() as b:
        addr = f"{b.address[0]}:{b.address[1]}"
        assert main(["broker", "declare-exchange", "ex", "--durable", "--broker", addr]) == 0
        assert main(["broker", "declare-queue", "orders", "--durable", "--broker", addr]) == 0
        assert main(["broker", "bind", "orders", "ex", "k", "--broker", addr]) == 0
        assert main(["broker", "publish", "ex", "k", "one", "two", "--persistent", "--confirm", "--broker", addr]) == 0
        assert main(["broker", "publish", "ex", "k", "three", "--confirm", "--broker", addr]) == 0
    with Broker(data_dir=tmp_path).start() as b, BrokerClient(b.address, timeout=WAIT) as c:
        got = _drain(c, "orders", 2)
        assert [(d.body, d.redelivered) for d in got] == [("one", True), ("two", True)]
        (q,) = c.stats()["per_queue"]
        assert q["ready"] == 0, "the transient message is not kept"


def test_no_confirm_while_the_store_cannot_be_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A failing disk holds every reply back (a confirm never precedes its
    fsync); once a write succeeds the held records are on disk and the
    replies leave."""
    import sqlite3
    import threading

    from cmq import Timeout

    b = Broker(data_dir=tmp_path)
    store = b.store
    assert store is not None
    real_write = store.write
    failing = threading.Event()

    def write(records: Any) -> None:
        if failing.is_set():
            raise sqlite3.OperationalError("disk I/O error")
        real_write(records)

    monkeypatch.setattr(store, "write", write)
    with b.start():
        with BrokerClient(b.address, timeout=WAIT) as c:
            c.declare_queue("q", durable=True)
            assert c.publish("", "q", b"one", confirm=True, persistent=True) == 1
        failing.set()
        with BrokerClient(b.address, timeout=0.5, retries=0) as c, pytest.raises(Timeout):
            c.publish("", "q", b"two", confirm=True, persistent=True)
        assert b.stats().as_dict()["internal_errors"] >= 1
        failing.clear()
        with BrokerClient(b.address, timeout=WAIT) as c:
            c.stats()  # answered once the held records are committed
    with Broker(data_dir=tmp_path).start() as again, BrokerClient(again.address, timeout=WAIT) as c:
        assert [d.body for d in _drain(c, "q", 2)] == [b"one", b"two"]


def test_async_client_durable_and_persistent(tmp_path: Path) -> None:
    import asyncio

    from cmq.routing import AsyncBrokerClient

    async def publish(addr: Any) -> None:
        async with await AsyncBrokerClient.open(addr, timeout=WAIT) as c:
            await c.declare_exchange("ax", "fanout", durable=True)
            await c.declare_queue("aq", durable=True)
            await c.bind("aq", "ax")
            assert await c.publish("ax", "", b"a1", confirm=True, persistent=True) == 1
            assert await c.publish_many([("ax", "", b"a2"), ("ax", "", b"a3")], window=2, persistent=True) == [1, 1]
            await c.publish("ax", "", b"a4", persistent=True)  # unconfirmed: on disk by the next answer
            assert await c.publish("ax", "", b"transient", confirm=True) == 1

    with Broker(data_dir=tmp_path).start() as b:
        asyncio.run(publish(b.address))
    with Broker(data_dir=tmp_path).start() as b, BrokerClient(b.address, timeout=WAIT) as c:
        assert [d.body for d in _drain(c, "aq", 4)] == [b"a1", b"a2", b"a3", b"a4"]
        (q,) = c.stats()["per_queue"]
        assert q["ready"] == 0


def test_a_kept_message_ttl_counts_again_from_the_restart(tmp_path: Path) -> None:
    core = _core()
    core.call(Publish(rid=0, exchange="", routing_key="dq", body=b"short", expiration=1000, properties=P), ME, 0.0)
    core.call(Publish(rid=0, exchange="", routing_key="dq", body=b"forever", properties=P), ME, 0.0)
    with_store = Store(tmp_path)
    with_store.write(core.journal)
    state = with_store.load()
    again = BrokerCore()
    again.persisting = True
    again.restore(state, 100.0)
    again.handle_timer(100.5)
    assert [m[2] for m in again._queues["dq"].ready] == [b"short", b"forever"]
    deadline = again.next_deadline()
    assert deadline is not None and deadline <= 101.0
    again.handle_timer(101.0)
    assert [m[2] for m in again._queues["dq"].ready] == [b"forever"]
    with_store.write(again.journal)  # the expired one's record goes
    assert [m.body for m in with_store.load().messages] == [b"forever"]
    with_store.close()


def test_persistent_batches_survive_kill_9(tmp_path: Path, procs: list[_Proc]) -> None:
    b = _Proc(tmp_path)
    procs.append(b)
    with BrokerClient(b.addr, timeout=WAIT) as c:
        c.declare_queue("bq", durable=True)
        assert c.publish_batch("", "bq", [b"b%d" % i for i in range(100)], confirm=True, persistent=True) == 1
        c.publish_batch("", "bq", [b"u%d" % i for i in range(3)], persistent=True)
        c.publish_batch("", "bq", [b"transient"] * 3, confirm=True)
        c.stats()  # answered after the unconfirmed batch's turn: it is on disk
    b.kill9()
    b = _Proc(tmp_path)
    procs.append(b)
    with BrokerClient(b.addr, timeout=WAIT) as c:
        got = [d.body for d in _drain(c, "bq", 103)]
        assert got == [b"b%d" % i for i in range(100)] + [b"u%d" % i for i in range(3)]
        (q,) = c.stats()["per_queue"]
        assert q["ready"] == 0
