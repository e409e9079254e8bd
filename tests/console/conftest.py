"""Fixtures of the console's browser tests: Debian's chromium driven by
Playwright (never Playwright's own browser download), and screenshots of
every page a failed test had open, in ``artifacts/console-screenshots/``."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SHOTS = REPO / "artifacts" / "console-screenshots"
#: The browser: Debian's chromium (bootstrap.sh installs it as root).
CHROMIUM = os.environ.get("CMQ_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"report_{report.when}", report)


# Module scope: Playwright's sync API runs an event loop in this thread while
# it is open, and tests of other modules call asyncio.run().
@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright missing: pip install playwright (the test extra)")
    if shutil.which(CHROMIUM) is None and not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"no chromium at {CHROMIUM}: apt-get install -y chromium (bootstrap.sh does, as root)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


class Pages:
    """Browser contexts a test opens; each context's pages are shot on failure."""

    def __init__(self, browser: Any) -> None:
        self.browser = browser
        self.contexts: list[Any] = []

    def open(self, url: str, *, width: int = 1400, login: tuple[str, str] | None = None) -> Any:
        options: dict[str, Any] = {"viewport": {"width": width, "height": 900}}
        if login is not None:
            options["http_credentials"] = {"username": login[0], "password": login[1]}
        context = self.browser.new_context(**options)
        context.set_default_timeout(10_000)
        # Nothing but the server under test: any other request fails the page.
        context.route(re.compile(r"^(?!http://(127\.0\.0\.1|localhost)[:/]).*"), lambda r: r.abort())
        self.contexts.append(context)
        page = context.new_page()
        page.goto(url)
        return page


@pytest.fixture
def pages(browser: Any, request: pytest.FixtureRequest) -> Iterator[Pages]:
    opened = Pages(browser)
    yield opened
    report = getattr(request.node, "report_call", None)
    failed = report is not None and report.failed
    for ci, context in enumerate(opened.contexts):
        if failed:
            SHOTS.mkdir(parents=True, exist_ok=True)
            name = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name)
            for pi, page in enumerate(context.pages):
                try:
                    page.screenshot(path=str(SHOTS / f"{name}-{ci}-{pi}.png"), full_page=True)
                except Exception:  # noqa: BLE001 - a page that cannot be shot must not hide the failure
                    pass
        context.close()
