"""The console in a real browser (Debian's chromium, driven by Playwright).

Each test starts the server it needs on an ephemeral loopback port, makes
its changes through the servers' own APIs (boto3, the broker client) and
watches the pages follow without a reload. Waits are Playwright's
assertions, which retry until their timeout; nothing here sleeps.
Screenshots of every open page land in artifacts/console-screenshots/ when
a test fails (see conftest.py).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from cmq.routing import Broker, BrokerClient
from cmq.service.app import SqsApp
from cmq.service.model import QueueRecord
from cmq.service.store.memory import MemoryStore
from tests.console.conftest import Pages
from tests.console.servers import ThreadServer
from tests.service.helpers import Node

pytest.importorskip("playwright", reason="playwright missing: pip install playwright (the test extra)")
from playwright.sync_api import expect

GUEST = ("guest", "guest")


@pytest.fixture(scope="module")
def node() -> Iterator[Node]:
    n = Node("memory:")
    try:
        yield n
    finally:
        n.stop()


@pytest.fixture(scope="module")
def broker() -> Iterator[tuple[Broker, str]]:
    from cmq.console import BrokerHttp

    with Broker(port=0) as b:
        b.start()
        http = BrokerHttp(b).start()
        try:
            yield b, f"http://127.0.0.1:{http.address[1]}"
        finally:
            http.close()


def _no_sideways_scroll(page: Any) -> None:
    wide = page.evaluate("document.documentElement.scrollWidth")
    assert wide <= page.viewport_size["width"], f"page is {wide} px wide"


def test_service_queue_appears_fills_is_peeked_and_purged(node: Node, pages: Pages) -> None:
    sqs = node.client()
    table = pages.open(node.url + "/console/queues")
    expect(table.locator("#live")).to_have_text("live")
    url = sqs.create_queue(QueueName="browser-jobs")["QueueUrl"]
    row = table.locator('#queue-table tr[data-queue="browser-jobs"]')
    expect(row).to_be_visible()  # appeared without a reload
    for i in range(3):
        sqs.send_message(QueueUrl=url, MessageBody=f"job {i}")
    expect(row.locator("td").nth(1)).to_have_text("3")

    row.locator("a").click()
    expect(table).to_have_url(node.url + "/console/queues/browser-jobs")
    depth = table.locator("#depth")
    expect(depth).to_have_text("3")
    expect(table.locator("#attributes")).to_contain_text("VisibilityTimeout")
    expect(table.locator(".uplot canvas").first).to_be_visible()
    sqs.send_message(QueueUrl=url, MessageBody="job 3")
    expect(depth).to_have_text("4")  # the API's change, seen live

    table.fill("#send-body", "hello from the console")
    table.click("#send-button")
    expect(table.locator("#action-status")).to_contain_text("Sent message")
    expect(depth).to_have_text("5")

    table.click("#peek-button")
    bodies = table.locator("#peek-table tbody td.body")
    expect(bodies).to_have_count(5)
    expect(bodies.last).to_have_text("hello from the console")
    expect(table.locator("#peek-table tbody")).not_to_contain_text("in flight")
    got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, AttributeNames=["All"])
    assert {m["Attributes"]["ApproximateReceiveCount"] for m in got["Messages"]} == {"1"}
    expect(table.locator("#in-flight")).to_have_text("5")

    table.click("#purge-button")
    expect(table.locator("#purge-confirm")).to_be_visible()
    table.click("#purge-no")  # cancel first: nothing happens
    expect(table.locator("#purge-confirm")).to_be_hidden()
    assert sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessagesNotVisible"])[
        "Attributes"]["ApproximateNumberOfMessagesNotVisible"] == "5"  # fmt: skip
    table.click("#purge-button")
    table.click("#purge-yes")
    expect(table.locator("#action-status")).to_have_text("Purged.")
    expect(table.locator("#in-flight")).to_have_text("0")
    expect(depth).to_have_text("0")


def test_service_dead_letter_queue_redriven_from_the_page(node: Node, pages: Pages) -> None:
    sqs = node.client()
    dlq = sqs.create_queue(QueueName="browser-dlq")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    src = sqs.create_queue(QueueName="browser-src", Attributes={
        "RedrivePolicy": json.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": "1"})})["QueueUrl"]  # fmt: skip
    sqs.send_message(QueueUrl=src, MessageBody="poison")
    for _ in range(2):
        sqs.receive_message(QueueUrl=src, VisibilityTimeout=0)
    page = pages.open(node.url + "/console/queues/browser-dlq")
    expect(page.locator("#depth")).to_have_text("1")
    expect(page.locator("#dlq-sources")).to_have_text("browser-src")
    page.click("#peek-button")
    expect(page.locator("#peek-table tbody td.body")).to_have_text("poison")
    page.click("#redrive-button")
    expect(page.locator("#action-status")).to_contain_text("Moving the messages back")
    expect(page.locator("#depth")).to_have_text("0")
    back = pages.open(node.url + "/console/queues/browser-src")
    expect(back.locator("#depth")).to_have_text("1")
    assert sqs.receive_message(QueueUrl=src)["Messages"][0]["Body"] == "poison"


def test_overview_shows_live_rates(node: Node, pages: Pages) -> None:
    sqs = node.client()
    url = sqs.create_queue(QueueName="browser-rates")["QueueUrl"]
    page = pages.open(node.url + "/console/")
    expect(page.locator("#server")).to_contain_text("memory:")
    expect(page.locator("#server")).to_contain_text("ok")
    expect(page.locator("#rate-chart canvas")).to_be_visible()
    before = int(page.locator("#totals tr", has_text="sent").locator("td").inner_text().replace(",", ""))
    sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": "x"} for i in range(10)])
    expect(page.locator("#totals tr", has_text="sent").locator("td")).to_have_text(f"{before + 10:,}")
    # The next sample after the batch shows a rate above zero (10 in about a second).
    expect(page.locator("#rate-in")).not_to_have_text("0.0", timeout=10_000)


def test_broker_exchanges_bindings_and_queue(broker: tuple[Broker, str], pages: Pages) -> None:
    b, base = broker
    page = pages.open(base + "/console/exchanges", login=GUEST)
    with BrokerClient(b.address, timeout=2) as client:
        client.declare_exchange("prices", "topic")
        client.declare_queue("ibm", max_length=1000, overflow="reject-publish")
        client.declare_queue("all-prices")
        client.bind("ibm", "prices", "stock.ibm.#")
        client.bind("all-prices", "prices", "stock.#")
        row = page.locator('#exchange-table tr[data-exchange="prices"]')
        expect(row).to_contain_text("ibm ← stock.ibm.#")
        expect(row).to_contain_text("all-prices ← stock.#")
        page.select_option("#route-exchange", "prices")
        page.fill("#route-key", "stock.ibm.nyse")
        page.click("#route-button")
        expect(page.locator("#route-result")).to_have_text("Reaches 2 queues: all-prices, ibm")
        page.fill("#route-key", "stock")
        page.click("#route-button")
        expect(page.locator("#route-result")).to_have_text("Reaches 1 queue: all-prices")
        page.fill("#route-key", "bonds.x")
        page.click("#route-button")
        expect(page.locator("#route-result")).to_have_text("Reaches no queue (unroutable).")

        q = pages.open(base + "/console/queues/ibm", login=GUEST)
        expect(q.locator("#attributes")).to_contain_text("reject-publish")
        expect(q.locator("#bindings")).to_contain_text("stock.ibm.#")
        client.publish_many([("prices", "stock.ibm.nyse", f"IBM {i}") for i in range(4)])
        expect(q.locator("#depth")).to_have_text("4")
        q.fill("#send-body", "test message")
        q.click("#send-button")
        expect(q.locator("#depth")).to_have_text("5")
        q.click("#peek-button")
        expect(q.locator("#peek-table tbody td.body")).to_have_text(
            ["IBM 0", "IBM 1", "IBM 2", "IBM 3", "test message"]
        )
        with client.consume("ibm", prefetch=2) as consumer:
            consumer.get(timeout=2)
            expect(q.locator("#consumers")).to_have_text("1")
            expect(q.locator("#in-flight")).to_have_text("2")
        q.click("#purge-button")
        q.click("#purge-yes")
        expect(q.locator("#depth")).to_have_text("0")
        expect(q.locator("#redrive-button")).to_be_hidden()


def test_ten_thousand_queues_are_paged_not_drawn(pages: Pages) -> None:
    store = MemoryStore()

    async def fill() -> None:
        for i in range(10_000):
            await store.create_queue(QueueRecord(name=f"q-{i:05d}"))

    # Playwright's sync API runs an event loop in this thread: fill elsewhere.
    filler = threading.Thread(target=asyncio.run, args=(fill(),))
    filler.start()
    filler.join()
    with ThreadServer(SqsApp(store)) as server:
        page = pages.open(server.url + "/console/queues")
        expect(page.locator("#queue-total")).to_have_text("10,000 queues")
        expect(page.locator("#page-of")).to_have_text("page 1 of 200")
        expect(page.locator("#queue-table tbody tr")).to_have_count(50)
        page.click("#next-page")
        expect(page.locator("#queue-table tbody tr").first).to_have_attribute("data-queue", "q-00050")
        page.fill("#queue-filter", "q-0999")
        expect(page.locator("#queue-table tbody tr")).to_have_count(10)
        expect(page.locator("#page-of")).to_have_text("page 1 of 1")
        page.fill("#queue-filter", "")
        page.click('#queue-table th[data-sort="name"]')  # now descending
        expect(page.locator("#queue-table tbody tr").first).to_have_attribute("data-queue", "q-09999")


@pytest.mark.parametrize("width", [1400, 800])
def test_pages_fit_the_window(node: Node, broker: tuple[Broker, str], pages: Pages, width: int) -> None:
    node.client().create_queue(QueueName="layout-check")
    b, base = broker
    with BrokerClient(b.address, timeout=2) as client:
        client.declare_exchange("layout", "fanout")
    checks = [
        (node.url + "/console/", None, "#rate-chart canvas"),
        (node.url + "/console/queues", None, '#queue-table tr[data-queue="layout-check"]'),
        (node.url + "/console/queues/layout-check", None, "#send-button"),
        (base + "/console/", GUEST, "#rate-chart canvas"),
        (base + "/console/exchanges", GUEST, '#exchange-table tr[data-exchange="layout"]'),
    ]
    for url, login, marker in checks:
        page = pages.open(url, width=width, login=login)
        expect(page.locator(marker)).to_be_visible()
        expect(page.locator("nav")).to_be_visible()
        _no_sideways_scroll(page)
