"""The same pika code against cmq's broker and against RabbitMQ, where behaviour can be compared.

Each test runs twice: on a cmq broker it starts itself, and on the RabbitMQ
at 127.0.0.1:5672 (guest/guest) when one is running there (skipped when
not). Names carry a random suffix and everything made is deleted, so the
RabbitMQ run leaves that broker as it found it.
"""

from __future__ import annotations

import datetime
import secrets
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

pika = pytest.importorskip("pika", reason="pika is not installed: pip install 'pycmq[test]'")
pytest.importorskip("pamqp", reason="pamqp is not installed: pip install 'pycmq[broker]'")

from cmq.routing import Broker, BrokerConfig  # noqa: E402
from tests.routing.test_exchanges import HEADERS_TABLE  # noqa: E402
from tests.waiting import wait_until  # noqa: E402

pytestmark = pytest.mark.timeout(60)

RABBITMQ = ("127.0.0.1", 5672)


def _rabbitmq_up() -> bool:
    try:
        with socket.create_connection(RABBITMQ, timeout=0.5):
            return True
    except OSError:
        return False


@pytest.fixture(params=["cmq", "rabbitmq"])
def address(request: pytest.FixtureRequest) -> Iterator[tuple[str, int]]:
    if request.param == "rabbitmq":
        if not _rabbitmq_up():
            pytest.skip("no RabbitMQ on 127.0.0.1:5672")
        yield RABBITMQ
        return
    with Broker(config=BrokerConfig(consumer_timeout=60.0), amqp_port=0).start() as b:
        assert b.amqp_address is not None
        yield b.amqp_address


def _connect(address: tuple[str, int]) -> Any:
    """A pika connection to ``address`` as guest."""
    params = pika.ConnectionParameters(*address, credentials=pika.PlainCredentials("guest", "guest"))
    return pika.BlockingConnection(params)


@pytest.fixture
def channel(address: tuple[str, int]) -> Iterator[Any]:
    conn = _connect(address)
    ch = conn.channel()
    ch.confirm_delivery()  # a confirmed publish is in its queues when basic_publish returns
    yield ch
    if conn.is_open:
        conn.close()


def name(what: str) -> str:
    return f"cmq-parity-{what}-{secrets.token_hex(4)}"


# pika cannot send a float in a table: those rows are checked in test_exchanges.py only.
_PIKA_ROWS = [row for row in HEADERS_TABLE if not any(type(v) is float for v in (row[1] or {}).values())]


def test_headers_exchange_routes_as_rabbitmq(channel: Any) -> None:
    ex = name("headers")
    channel.exchange_declare(ex, "headers", auto_delete=False)
    try:
        queues = []
        for args, _, _ in _PIKA_ROWS:
            q = channel.queue_declare("", exclusive=True).method.queue
            channel.queue_bind(q, ex, arguments=args)
            queues.append(q)
        got = []
        for i, (_, headers, _) in enumerate(_PIKA_ROWS):
            channel.basic_publish(ex, "any.key", b"%d" % i, pika.BasicProperties(headers=headers))
            method, _, _ = channel.basic_get(queues[i], auto_ack=True)
            got.append(method is not None)
            for q in queues:
                channel.queue_purge(q)
        assert got == [expected for _, _, expected in _PIKA_ROWS]
    finally:
        channel.exchange_delete(ex)


def test_a_bad_x_match_is_refused_with_406(channel: Any) -> None:
    ex = name("headers")
    channel.exchange_declare(ex, "headers")
    q = channel.queue_declare("", exclusive=True).method.queue
    try:
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            channel.queue_bind(q, ex, arguments={"x-match": "some"})
        assert info.value.reply_code == 406
        assert "x-match" in info.value.reply_text
    finally:
        again = channel.connection.channel()
        again.exchange_delete(ex)


def test_x_death_as_rabbitmq_writes_it(channel: Any) -> None:
    dlx, src, dlq = name("dlx"), name("src"), name("dlq")
    channel.exchange_declare(dlx, "fanout")
    try:
        channel.queue_declare(dlq, exclusive=True)
        channel.queue_bind(dlq, dlx)
        channel.queue_declare(src, exclusive=True, arguments={"x-dead-letter-exchange": dlx})
        before = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
        channel.basic_publish("", src, b"m", pika.BasicProperties(headers={"a": 1}, expiration="60000"))
        method, _, _ = channel.basic_get(src)
        channel.basic_reject(method.delivery_tag, requeue=False)
        deaths = []
        for _ in range(2):
            method, props, body = channel.basic_get(dlq, auto_ack=True)
            for _ in range(200):  # dead-lettering is asynchronous in RabbitMQ: a few round trips
                if method is not None:
                    break
                method, props, body = channel.basic_get(dlq, auto_ack=True)
            assert method is not None and body == b"m"
            assert props.expiration is None  # the expiration goes with the death
            deaths.append(props.headers)
            # Its consumer sends it back as it came, and it dies the same way again.
            channel.basic_publish("", src, body, props)
            method, _, _ = channel.basic_get(src)
            channel.basic_reject(method.delivery_tag, requeue=False)
        first, second = deaths
        assert first["a"] == 1
        (record,) = first["x-death"]
        assert record.pop("time") >= before
        assert {k: (int(v) if isinstance(v, int) else v) for k, v in record.items()} == {
            "count": 1, "reason": "rejected", "queue": src, "exchange": "", "routing-keys": [src],
            "original-expiration": "60000"}  # fmt: skip
        assert (first["x-first-death-queue"], first["x-first-death-reason"], first["x-first-death-exchange"]) == (
            src, "rejected", "")  # fmt: skip
        (record,) = second["x-death"]
        assert int(record["count"]) == 2  # the same (queue, reason): counted, not repeated
    finally:
        channel.exchange_delete(dlx)


def ready(channel: Any, queue: str) -> int:
    return int(channel.queue_declare(queue, passive=True).method.message_count)


def test_tx_publishes_wait_for_commit_and_rollback_drops_them(channel: Any) -> None:
    q = channel.queue_declare("", exclusive=True).method.queue
    tx = channel.connection.channel()
    tx.tx_select()
    for i in range(2):
        tx.basic_publish("", q, b"%d" % i)
    assert ready(channel, q) == 0  # not before the commit
    tx.tx_commit()
    assert ready(channel, q) == 2
    tx.basic_publish("", q, b"dropped")
    tx.tx_rollback()
    tx.tx_commit()  # the rollback left nothing to commit
    assert ready(channel, q) == 2
    assert [channel.basic_get(q, auto_ack=True)[2] for _ in range(2)] == [b"0", b"1"]


def test_tx_acks_wait_for_commit_and_a_rollback_gives_them_back_unsettled(channel: Any) -> None:
    q = channel.queue_declare("", exclusive=True).method.queue
    for i in range(2):
        channel.basic_publish("", q, b"%d" % i)
    tx = channel.connection.channel()
    tx.tx_select()
    first = tx.basic_get(q)[0].delivery_tag
    second = tx.basic_get(q)[0].delivery_tag
    tx.basic_ack(first)
    tx.tx_rollback()  # the ack is undone: the message is still the channel's to settle, not redelivered
    assert ready(channel, q) == 0
    tx.basic_ack(first)  # the same tag again: outstanding once more, so no 406
    tx.basic_reject(second, requeue=True)
    assert ready(channel, q) == 0  # the reject waits for the commit too
    tx.tx_commit()
    assert ready(channel, q) == 1
    tx.close()
    assert [channel.basic_get(q, auto_ack=True)[2]] == [b"1"]  # the acked one is gone for good


def test_tx_and_confirm_modes_exclude_each_other_and_commit_needs_select(address: tuple[str, int]) -> None:
    conn = _connect(address)
    try:
        for setup, then in ((lambda c: None, lambda c: c.tx_commit()),
                            (lambda c: None, lambda c: c.tx_rollback()),
                            (lambda c: c.confirm_delivery(), lambda c: c.tx_select()),
                            (lambda c: c.tx_select(), lambda c: c.confirm_delivery())):  # fmt: skip
            ch = conn.channel()
            setup(ch)
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
                then(ch)
            assert info.value.reply_code == 406
    finally:
        conn.close()


SYSTEM_EXCHANGES = [("amq.direct", "direct"), ("amq.fanout", "fanout"), ("amq.topic", "topic"),
                    ("amq.headers", "headers"), ("amq.match", "headers")]  # fmt: skip


def _closed_with(address: tuple[str, int], call: Any) -> tuple[int, str]:
    """The reply code and text of the channel error ``call(channel)`` raises, on a channel of its own."""
    conn = _connect(address)
    try:
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            call(conn.channel())
        return info.value.reply_code, info.value.reply_text
    finally:
        if conn.is_open:
            conn.close()


@pytest.mark.parametrize(("ex", "kind"), SYSTEM_EXCHANGES)
def test_the_system_exchanges_exist_and_cannot_be_changed_or_deleted(
    address: tuple[str, int], channel: Any, ex: str, kind: str
) -> None:
    channel.exchange_declare(ex, passive=True)
    channel.exchange_declare(ex, kind, durable=True)  # declared again as it is: a no-op
    other = "fanout" if kind != "fanout" else "direct"
    code, text = _closed_with(address, lambda ch: ch.exchange_declare(ex, other, durable=True))
    assert code == 406 and "type" in text
    code, text = _closed_with(address, lambda ch: ch.exchange_declare(ex, kind, durable=False))
    assert code == 406 and "durable" in text
    code, _ = _closed_with(address, lambda ch: ch.exchange_delete(ex))
    assert code == 403
    code, _ = _closed_with(address, lambda ch: ch.exchange_declare("amq." + name("mine"), "direct"))
    assert code == 403
    channel.exchange_declare(ex, passive=True)  # still there


def test_the_system_exchanges_route_by_their_types(channel: Any) -> None:
    q = channel.queue_declare("", exclusive=True).method.queue
    channel.queue_bind(q, "amq.direct", "k1")
    channel.queue_bind(q, "amq.fanout", "")
    channel.queue_bind(q, "amq.topic", "a.*")
    channel.queue_bind(q, "amq.headers", arguments={"x-match": "all", "h": "v"})
    try:
        channel.basic_publish("amq.direct", "k1", b"direct")
        channel.basic_publish("amq.direct", "k2", b"not routed")
        channel.basic_publish("amq.fanout", "any", b"fanout")
        channel.basic_publish("amq.topic", "a.b", b"topic")
        channel.basic_publish("amq.topic", "b.a", b"not routed")
        channel.basic_publish("amq.headers", "", b"headers", pika.BasicProperties(headers={"h": "v"}))
        got = []
        for _ in range(4):
            method, _, body = channel.basic_get(q, auto_ack=True)
            assert method is not None
            got.append(body)
        assert got == [b"direct", b"fanout", b"topic", b"headers"]
        assert channel.basic_get(q, auto_ack=True)[0] is None
    finally:
        channel.queue_unbind(q, "amq.direct", "k1")
        channel.queue_unbind(q, "amq.fanout", "")
        channel.queue_unbind(q, "amq.topic", "a.*")
        channel.queue_unbind(q, "amq.headers", arguments={"x-match": "all", "h": "v"})


@pytest.mark.parametrize("bad", [0, -5, "1000"])
def test_a_bad_x_expires_is_refused_with_406(address: tuple[str, int], bad: Any) -> None:
    code, text = _closed_with(address, lambda ch: ch.queue_declare(name("exp"), arguments={"x-expires": bad}))
    assert code == 406 and "x-expires" in text


def test_a_queue_unused_for_its_x_expires_goes_and_a_passive_declare_is_a_use(
    address: tuple[str, int], channel: Any
) -> None:
    q = name("exp")
    channel.queue_declare(q, arguments={"x-expires": 1000})
    conn = _connect(address)
    returned: list[bytes] = []
    try:
        watch = conn.channel()
        watch.add_on_return_callback(lambda _ch, _m, _p, body: returned.append(body))

        def gone() -> bool:
            # A publish is not a use: mandatory, it comes back once the queue is gone.
            watch.basic_publish("", q, b"probe", mandatory=True)
            conn.process_data_events(0)
            return bool(returned)

        # Passive declares, each within the expiry of the one before, keep it
        # (RabbitMQ counts them as uses), as long as they come.
        kept_until = time.monotonic() + 2.0
        while time.monotonic() < kept_until:
            channel.queue_declare(q, passive=True)
            channel.connection.sleep(0.05)
        assert not gone()
        assert wait_until(gone, timeout=10.0)
    finally:
        conn.close()


def test_an_exclusive_consumer_has_its_queue_to_itself_until_it_cancels(
    address: tuple[str, int], channel: Any
) -> None:
    q = channel.queue_declare(name("excl"), auto_delete=False).method.queue
    try:
        tag = channel.basic_consume(q, lambda *_: None, exclusive=True)
        for exclusive in (False, True):
            code, text = _closed_with(address, lambda ch, e=exclusive: ch.basic_consume(q, lambda *_: None, exclusive=e))
            assert code == 403 and "exclusive use" in text
        channel.basic_cancel(tag)
        plain = channel.basic_consume(q, lambda *_: None)  # free again
        code, text = _closed_with(address, lambda ch: ch.basic_consume(q, lambda *_: None, exclusive=True))
        assert code == 403 and "exclusive use" in text
        channel.basic_cancel(plain)
    finally:
        channel.queue_delete(q)


def test_a_single_active_consumer_queue_delivers_to_its_first_consumer_only(channel: Any) -> None:
    q = channel.queue_declare(name("sac"), exclusive=True, arguments={"x-single-active-consumer": True}).method.queue
    got: dict[str, list[bytes]] = {"first": [], "second": []}
    first = channel.basic_consume(q, lambda _ch, m, _p, body: got["first"].append(body), auto_ack=True)
    channel.basic_consume(q, lambda _ch, m, _p, body: got["second"].append(body), auto_ack=True)
    for i in range(4):
        channel.basic_publish("", q, b"%d" % i)
    assert wait_until(lambda: channel.connection.process_data_events(0) or len(got["first"]) == 4)
    channel.basic_cancel(first)  # the next consumer becomes the active one
    for i in range(4, 6):
        channel.basic_publish("", q, b"%d" % i)
    assert wait_until(lambda: channel.connection.process_data_events(0) or len(got["second"]) == 2)
    assert got == {"first": [b"0", b"1", b"2", b"3"], "second": [b"4", b"5"]}


def test_a_bad_x_single_active_consumer_is_refused_with_406(address: tuple[str, int]) -> None:
    code, text = _closed_with(
        address, lambda ch: ch.queue_declare(name("sac"), arguments={"x-single-active-consumer": "yes"})
    )
    assert code == 406 and "x-single-active-consumer" in text


def _drain(channel: Any, q: str) -> list[bytes]:
    """Every ready message of ``q``, taken with basic.get."""
    got: list[bytes] = []
    while True:
        method, _, body = channel.basic_get(q, auto_ack=True)
        if method is None:
            return got
        got.append(body)


def test_x_max_length_bytes_drops_the_oldest_until_the_bodies_fit(channel: Any) -> None:
    q = channel.queue_declare(name("bytes"), exclusive=True, arguments={"x-max-length-bytes": 10}).method.queue
    for body in (b"aaaa", b"bbbb", b"cccc", b"dddd"):
        channel.basic_publish("", q, body)
    assert channel.queue_declare(q, passive=True).method.message_count == 2
    channel.basic_publish("", q, b"E" * 9)  # only it fits: both older ones go
    assert _drain(channel, q) == [b"E" * 9]
    channel.basic_publish("", q, b"aaaa")
    channel.basic_publish("", q, b"x" * 11)  # bigger than the bound alone: it goes too
    assert _drain(channel, q) == []


def test_x_max_length_bytes_with_reject_publish_nacks_what_would_not_fit(channel: Any) -> None:
    q = channel.queue_declare(
        name("bytes"), exclusive=True, arguments={"x-max-length-bytes": 10, "x-overflow": "reject-publish"}
    ).method.queue
    nacked = []
    for body in (b"aaaa", b"bbbb", b"cccc", b"dd", b"e"):
        try:
            channel.basic_publish("", q, body)
        except pika.exceptions.NackError:
            nacked.append(body)
    assert nacked == [b"cccc", b"e"]
    assert _drain(channel, q) == [b"aaaa", b"bbbb", b"dd"]


@pytest.mark.parametrize("bad", [-1, "10"])
def test_a_bad_x_max_length_bytes_is_refused_with_406(address: tuple[str, int], bad: Any) -> None:
    code, text = _closed_with(address, lambda ch: ch.queue_declare(name("bytes"), arguments={"x-max-length-bytes": bad}))
    assert code == 406 and "x-max-length-bytes" in text


def test_a_priority_queue_gives_the_highest_priority_first(channel: Any) -> None:
    q = channel.queue_declare(name("prio"), exclusive=True, arguments={"x-max-priority": 5}).method.queue
    for body, p in ((b"a", None), (b"b", 3), (b"c", 0), (b"d", 9), (b"e", 3), (b"f", 5)):
        channel.basic_publish("", q, body, pika.BasicProperties(priority=p))
    assert _drain(channel, q) == [b"d", b"f", b"b", b"e", b"a", b"c"]  # 9 counts as 5


def test_a_full_priority_queue_drops_its_highest_priority_first(channel: Any) -> None:
    q = channel.queue_declare(
        name("prio"), exclusive=True, arguments={"x-max-priority": 9, "x-max-length": 2}
    ).method.queue
    for body, p in ((b"low", 1), (b"high", 9), (b"new", 1)):
        channel.basic_publish("", q, body, pika.BasicProperties(priority=p))
    assert _drain(channel, q) == [b"low", b"new"]


@pytest.mark.parametrize("bad", [-1, 256, "5"])
def test_a_bad_x_max_priority_is_refused_with_406(address: tuple[str, int], bad: Any) -> None:
    code, text = _closed_with(address, lambda ch: ch.queue_declare(name("prio"), arguments={"x-max-priority": bad}))
    assert code == 406 and "x-max-priority" in text


@pytest.mark.parametrize(
    ("options", "text"),
    [
        ({"exclusive": True, "durable": True}, "invalid property 'exclusive-owner'"),
        ({"auto_delete": True, "durable": True}, "invalid property 'auto-delete'"),
        ({"durable": False}, "invalid property 'non-durable'"),
    ],
)
def test_a_quorum_queue_must_be_durable_shared_and_kept(address: tuple[str, int], options: Any, text: str) -> None:
    code, reply = _closed_with(
        address, lambda ch: ch.queue_declare(name("qq"), arguments={"x-queue-type": "quorum"}, **options)
    )
    assert code == 406 and text in reply


def test_an_unknown_queue_type_is_refused_with_406(address: tuple[str, int]) -> None:
    code, text = _closed_with(address, lambda ch: ch.queue_declare(name("qq"), arguments={"x-queue-type": "weird"}))
    assert code == 406 and "unsupported queue type 'weird'" in text


@pytest.mark.parametrize("kind", ["classic", "quorum"])
def test_a_classic_or_quorum_queue_is_made(channel: Any, kind: str) -> None:
    q = channel.queue_declare(name("qq"), durable=True, arguments={"x-queue-type": kind}).method.queue
    try:
        channel.basic_publish("", q, b"m")
        assert _drain(channel, q) == [b"m"]
    finally:
        channel.queue_delete(q)


def _exchanges(channel: Any, *specs: tuple[str, str]) -> list[str]:
    """Exchanges of these (label, type), named for this test (auto-delete off)."""
    names = []
    for label, kind in specs:
        ex = name(label)
        channel.exchange_declare(ex, kind)
        names.append(ex)
    return names


def _queue_bound(channel: Any, exchange: str, key: str = "") -> str:
    q = channel.queue_declare(name("q"), exclusive=True).method.queue
    channel.queue_bind(q, exchange, key)
    return q


def test_an_exchange_bound_to_an_exchange_routes_on_with_the_same_key(channel: Any) -> None:
    src, dest = _exchanges(channel, ("src", "topic"), ("dest", "fanout"))
    try:
        channel.exchange_bind(dest, src, "stock.#")
        q1, q2 = _queue_bound(channel, dest), _queue_bound(channel, dest)
        direct = _queue_bound(channel, src, "stock.ibm")  # also reached straight from the source
        channel.basic_publish(src, "stock.ibm", b"m")
        channel.basic_publish(src, "bond.x", b"not routed on")
        assert (_drain(channel, q1), _drain(channel, q2), _drain(channel, direct)) == ([b"m"], [b"m"], [b"m"])
        channel.exchange_unbind(dest, src, "stock.#")
        channel.basic_publish(src, "stock.ibm", b"after")
        assert (_drain(channel, q1), _drain(channel, direct)) == ([], [b"after"])
    finally:
        channel.exchange_delete(src)
        channel.exchange_delete(dest)


def test_two_paths_and_a_cycle_of_exchanges_give_a_queue_one_copy(channel: Any) -> None:
    a, b = _exchanges(channel, ("a", "fanout"), ("b", "fanout"))
    try:
        channel.exchange_bind(b, a)
        channel.exchange_bind(a, b)  # a cycle
        q = _queue_bound(channel, b)
        channel.queue_bind(q, a)  # and a second path
        channel.basic_publish(a, "", b"once")
        channel.basic_publish(b, "", b"twice?")
        assert _drain(channel, q) == [b"once", b"twice?"]
    finally:
        channel.exchange_delete(a)
        channel.exchange_delete(b)


def test_deleting_the_destination_exchange_drops_its_bindings(channel: Any) -> None:
    src, dest = _exchanges(channel, ("src", "direct"), ("dest", "fanout"))
    try:
        channel.exchange_bind(dest, src, "k")
        q = _queue_bound(channel, dest)
        channel.basic_publish(src, "k", b"through", mandatory=True)
        assert _drain(channel, q) == [b"through"]
        channel.exchange_delete(dest)
        channel.exchange_declare(dest, "fanout")  # the same name again: not bound
        channel.queue_bind(q, dest)
        with pytest.raises(pika.exceptions.UnroutableError):  # mandatory, confirmed: returned
            channel.basic_publish(src, "k", b"nowhere", mandatory=True)
        assert _drain(channel, q) == []
    finally:
        channel.exchange_delete(src)
        channel.exchange_delete(dest)


@pytest.mark.parametrize("missing", ["source", "destination"])
def test_binding_a_missing_exchange_is_refused_with_404(address: tuple[str, int], channel: Any, missing: str) -> None:
    (there,) = _exchanges(channel, ("there", "direct"))
    try:
        ends = {"source": "cmq-parity-absent", "destination": there}
        if missing == "destination":
            ends = {"source": there, "destination": "cmq-parity-absent"}
        code, text = _closed_with(address, lambda ch: ch.exchange_bind(ends["destination"], ends["source"], "k"))
        assert code == 404 and "no exchange 'cmq-parity-absent'" in text
    finally:
        channel.exchange_delete(there)


def test_a_headers_exchange_binds_an_exchange_by_its_arguments(channel: Any) -> None:
    src, dest = _exchanges(channel, ("src", "headers"), ("dest", "fanout"))
    try:
        channel.exchange_bind(dest, src, arguments={"x-match": "all", "kind": "trade"})
        q = _queue_bound(channel, dest)
        channel.basic_publish(src, "", b"trade", pika.BasicProperties(headers={"kind": "trade"}))
        channel.basic_publish(src, "", b"quote", pika.BasicProperties(headers={"kind": "quote"}))
        assert _drain(channel, q) == [b"trade"]
    finally:
        channel.exchange_delete(src)
        channel.exchange_delete(dest)


def test_a_higher_priority_consumer_gets_messages_while_it_has_credit(channel: Any) -> None:
    q = channel.queue_declare(name("cprio"), exclusive=True).method.queue
    channel.basic_qos(prefetch_count=2)
    got: dict[str, list[tuple[int, bytes]]] = {"low": [], "high": []}

    def on(who: str) -> Any:
        return lambda _ch, m, _p, body: got[who].append((m.delivery_tag, body))

    channel.basic_consume(q, on("low"))  # no x-priority: 0
    channel.basic_consume(q, on("high"), arguments={"x-priority": 10})
    for i in range(6):
        channel.basic_publish("", q, b"%d" % i)
    assert wait_until(lambda: channel.connection.process_data_events(0) or len(got["low"]) == 2)
    channel.connection.process_data_events(0.2)
    assert [b for _, b in got["high"]] == [b"0", b"1"]  # first, until its window was full
    assert [b for _, b in got["low"]] == [b"2", b"3"]  # then the lower one
    for tag, _ in got["high"]:
        channel.basic_ack(tag)
    assert wait_until(lambda: channel.connection.process_data_events(0) or len(got["high"]) == 4)
    assert [b for _, b in got["high"]] == [b"0", b"1", b"4", b"5"]


def test_a_bad_x_priority_is_refused_with_406(address: tuple[str, int]) -> None:
    def consume(ch: Any) -> None:
        q = ch.queue_declare(name("cprio"), exclusive=True).method.queue
        ch.basic_consume(q, lambda *_: None, arguments={"x-priority": "high"})

    code, text = _closed_with(address, consume)
    assert code == 406 and "x-priority" in text


def test_a_global_prefetch_is_shared_by_the_channels_consumers(channel: Any) -> None:
    queues = [channel.queue_declare(name(f"gqos{i}"), exclusive=True).method.queue for i in range(2)]
    for i in range(4):
        for q, tag in zip(queues, "ab", strict=True):
            channel.basic_publish("", q, b"%s%d" % (tag.encode(), i))
    channel.basic_qos(prefetch_count=2)  # each consumer started next, on its own
    channel.basic_qos(prefetch_count=3, global_qos=True)  # and the channel's consumers together
    got: list[tuple[int, bytes]] = []

    def on(_ch: Any, m: Any, _p: Any, body: bytes) -> None:
        got.append((m.delivery_tag, body))

    def settle(n: int) -> list[bytes]:
        assert wait_until(lambda: channel.connection.process_data_events(0) or len(got) >= n)
        channel.connection.process_data_events(0.2)  # and nothing more comes
        return [b for _, b in got]

    for q in queues:
        channel.basic_consume(q, on)
    # The first consumer its own two, the second what is left of the channel's three.
    assert settle(3) == [b"a0", b"a1", b"b0"]
    channel.basic_ack(got[0][0])  # room for one, on either consumer
    assert len(settle(4)) == 4 and got[3][1] in (b"a2", b"b1")
    channel.basic_qos(prefetch_count=5, global_qos=True)  # raised: each consumer now full at two
    assert len(settle(5)) == 5
    assert sorted(b for _, b in got[1:]) == [b"a1", b"a2", b"b0", b"b1"]


def test_a_per_consumer_prefetch_set_after_a_global_one_lifts_it(channel: Any) -> None:
    # RabbitMQ's rule: basic.qos without global sets the limit of each
    # consumer started next and removes the channel's shared one.
    queues = [channel.queue_declare(name(f"gqos{i}"), exclusive=True).method.queue for i in range(2)]
    for q in queues:
        for i in range(4):
            channel.basic_publish("", q, b"%d" % i)
    channel.basic_qos(prefetch_count=1, global_qos=True)
    channel.basic_qos(prefetch_count=2)
    got: list[bytes] = []
    for q in queues:
        channel.basic_consume(q, lambda _c, _m, _p, body: got.append(body))
    assert wait_until(lambda: channel.connection.process_data_events(0) or len(got) >= 4)
    channel.connection.process_data_events(0.2)
    assert len(got) == 4  # two each: no shared limit of one


def test_a_global_prefetch_holds_for_consumers_started_later_and_ends_with_its_channel(
    address: tuple[str, int],
) -> None:
    conn = _connect(address)
    try:
        ch = conn.channel()
        q = ch.queue_declare(name("gqos"), auto_delete=False).method.queue
        for i in range(5):
            ch.basic_publish("", q, b"%d" % i)
        ch.basic_qos(prefetch_count=1, global_qos=True)
        got: list[bytes] = []
        ch.basic_consume(q, lambda _c, _m, _p, body: got.append(body))
        ch.basic_consume(q, lambda _c, _m, _p, body: got.append(body))
        assert wait_until(lambda: conn.process_data_events(0) or got)
        conn.process_data_events(0.2)
        assert got == [b"0"]  # one between the two of them
        ch.close()
        other = conn.channel()  # a new channel: no shared limit
        again: list[bytes] = []
        other.basic_consume(q, lambda _c, _m, _p, body: again.append(body))
        assert wait_until(lambda: conn.process_data_events(0) or len(again) == 5)
        assert sorted(again) == [b"0", b"1", b"2", b"3", b"4"]  # the unacked one came back too
        other.queue_delete(q)
    finally:
        if conn.is_open:
            conn.close()


def test_a_prefetch_size_is_refused_with_540(address: tuple[str, int]) -> None:
    conn = _connect(address)
    try:
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
            conn.channel().basic_qos(prefetch_size=4096, prefetch_count=1)
        assert info.value.reply_code == 540 and "prefetch_size" in info.value.reply_text
    finally:
        if conn.is_open:
            conn.close()
