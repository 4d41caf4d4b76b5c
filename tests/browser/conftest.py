"""Headless Debian chromium driven by Python playwright, for the review page and mermaid parsing.

Never downloads a browser (no `playwright install`): it launches /usr/bin/chromium with a fresh
profile and refuses every request that is not file:, data: or about: (the page must be offline).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

CHROMIUM = Path(os.environ.get("LIFECYCLE_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
LOCAL_SCHEMES = ("file:", "data:", "about:", "blob:")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "browser: drives headless chromium through playwright (skipped without them)")


# module scope, not session: while playwright's sync API is alive it owns a running asyncio loop,
# and later tests calling asyncio.run() would fail.
@pytest.fixture(scope="module")
def browser_context(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    if not CHROMIUM.is_file():
        pytest.skip(f"no chromium at {CHROMIUM}: apt-get install chromium (or set LIFECYCLE_CHROMIUM)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("python playwright is not installed: pip install playwright (it uses /usr/bin/chromium)")
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")),
            executable_path=str(CHROMIUM),
            args=CHROMIUM_ARGS,
            headless=True,
            viewport={"width": 1400, "height": 1000},
        )
        context.outside_requests = []  # type: ignore[attr-defined]

        def guard(route: object) -> None:
            url = route.request.url  # type: ignore[attr-defined]
            if url.startswith(LOCAL_SCHEMES):
                route.continue_()  # type: ignore[attr-defined]
            else:
                context.outside_requests.append(url)  # type: ignore[attr-defined]
                route.abort()  # type: ignore[attr-defined]

        context.route("**/*", guard)
        yield context
        context.close()


@pytest.fixture
def page(browser_context: object) -> Iterator[object]:
    pg = browser_context.new_page()  # type: ignore[attr-defined]
    pg.errors = []
    pg.on("pageerror", lambda exc: pg.errors.append(str(exc)))
    pg.on("console", lambda msg: pg.errors.append(msg.text) if msg.type == "error" else None)
    browser_context.outside_requests.clear()  # type: ignore[attr-defined]
    yield pg
    pg.close()
