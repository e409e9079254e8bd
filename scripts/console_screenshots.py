"""Regenerate the console screenshots in docs/ (shown in the README).

    .venv/bin/python scripts/console_screenshots.py [--out docs] [--seconds 20]

Starts `cmq serve --store memory:` and `cmq broker --http-port 0` on
ephemeral loopback ports, gives them a few queues, a dead-letter queue,
exchanges and bindings and a steady trickle of traffic for --seconds (so the
charts have something to show), then has Debian's chromium (through
Playwright) photograph the overview, the queue table, one queue's page and
the broker's exchanges. Needs the test extra (playwright) and chromium.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import boto3

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("CMQ_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]  # fmt: skip


def start(*args: str, pattern: str) -> tuple[subprocess.Popen[str], re.Match[str]]:
    proc = subprocess.Popen([sys.executable, "-m", "cmq", *args], stdout=subprocess.PIPE,
                            text=True, cwd=REPO)  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()
    m = re.search(pattern, line)
    if m is None:
        proc.kill()
        raise SystemExit(f"{args[0]} did not start: {line!r}")
    return proc, m


def traffic(sqs: Any, urls: dict[str, str], broker: Any, stop: threading.Event) -> None:
    """A few dozen messages a second in and out, and some left waiting."""
    i = 0
    while not stop.is_set():
        i += 1
        sqs.send_message_batch(QueueUrl=urls["orders"], Entries=[
            {"Id": str(k), "MessageBody": json.dumps({"order": i * 10 + k, "sku": "A-17"})}
            for k in range(6)])  # fmt: skip
        sqs.send_message(QueueUrl=urls["emails"], MessageBody=f"welcome mail #{i}")
        got = sqs.receive_message(QueueUrl=urls["orders"], MaxNumberOfMessages=5)
        for m in got.get("Messages", []):
            sqs.delete_message(QueueUrl=urls["orders"], ReceiptHandle=m["ReceiptHandle"])
        broker.publish_many([("prices", f"stock.ibm.{'nyse' if i % 2 else 'xetra'}", f"IBM {100 + i % 7}.5")])
        stop.wait(0.2)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(REPO / "docs"))
    ap.add_argument("--seconds", type=float, default=20.0)
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    from cmq.routing import BrokerClient

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    serve, m = start("serve", "--store", "memory:", "--port", "0", pattern=r"listening on (\S+)")
    service = m.group(1)
    broker_proc, bm = start("broker", "--port", "0", "--in-memory", "--http-port", "0",
                            pattern=r"serving on 127\.0\.0\.1:(\d+).*console on (http://\S+)/console/")  # fmt: skip
    console = bm.group(2)
    stop = threading.Event()
    try:
        sqs = boto3.client("sqs", endpoint_url=service, region_name="us-east-1",
                           aws_access_key_id="x", aws_secret_access_key="x")  # fmt: skip
        urls = {}
        dlq = sqs.create_queue(QueueName="orders-dlq")["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        urls["orders"] = sqs.create_queue(QueueName="orders", Attributes={
            "RedrivePolicy": json.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": "3"})})["QueueUrl"]  # fmt: skip
        urls["emails"] = sqs.create_queue(QueueName="emails")["QueueUrl"]
        sqs.create_queue(QueueName="invoices.fifo", Attributes={"FifoQueue": "true",
                         "ContentBasedDeduplication": "true"})  # fmt: skip
        for n in range(3):
            sqs.send_message(QueueUrl=dlq, MessageBody=json.dumps({"order": 900 + n, "error": "bad sku"}))
        client = BrokerClient(f"127.0.0.1:{bm.group(1)}", timeout=2)
        client.declare_exchange("prices", "topic")
        client.declare_exchange("alerts", "fanout")
        for q, ex, key in [("ibm", "prices", "stock.ibm.#"), ("all-stocks", "prices", "stock.#"),
                           ("pager", "alerts", ""), ("audit", "alerts", "")]:  # fmt: skip
            client.declare_queue(q)
            client.bind(q, ex, key)
        worker = threading.Thread(target=traffic, args=(sqs, urls, client, stop), daemon=True)
        worker.start()
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 860})
            page.goto(service + "/console/queues/orders")  # its depth chart starts now
            time.sleep(args.seconds)
            page.screenshot(path=str(out / "console-queue.png"))
            page.goto(service + "/console/")
            page.wait_for_selector("#rate-chart canvas")
            time.sleep(1.5)
            page.screenshot(path=str(out / "console-overview.png"))
            page.goto(service + "/console/queues")
            page.wait_for_selector('#queue-table tr[data-queue="orders"]')
            time.sleep(1.5)
            page.screenshot(path=str(out / "console-queues.png"))
            ctx = browser.new_context(viewport={"width": 1400, "height": 700},
                                      http_credentials={"username": "guest", "password": "guest"})  # fmt: skip
            bpage = ctx.new_page()
            bpage.goto(console + "/console/exchanges")
            bpage.wait_for_selector('#exchange-table tr[data-exchange="prices"]')
            bpage.select_option("#route-exchange", "prices")
            bpage.fill("#route-key", "stock.ibm.nyse")
            bpage.click("#route-button")
            bpage.wait_for_selector("#route-result:has-text('Reaches')")
            bpage.screenshot(path=str(out / "console-exchanges.png"))
            browser.close()
        stop.set()
        worker.join(timeout=5)
        client.close()
    finally:
        stop.set()
        for proc in (serve, broker_proc):
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=15)
    for name in ("overview", "queues", "queue", "exchanges"):
        print(out / f"console-{name}.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
