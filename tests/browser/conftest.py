"""Browser tests: Debian's Chromium driven by Playwright, against the real ASGI
app (daphne in a subprocess on the pytest test database), the test Redis, and a
real Celery worker when a test asks for one.

Tests wait on state the page exposes (``data-version`` of each rack element,
``body[data-ws]``, ``window.rackwise``), never on fixed sleeps. A failed test
leaves a screenshot in ``var/screenshots/``."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connection

from tests.support import ROOT, AppServer, subprocess_env, wait_for, workers

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
SCREENSHOTS = ROOT / "var" / "screenshots"

# Playwright's sync API keeps an event loop on the main thread, which Django
# takes for async code; the test process's ORM calls are plain sync code.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


def pytest_collection_modifyitems(items):
    """Mark the browser tests, and run them last: Playwright's sync API leaves an
    event loop on the main thread for the rest of the session, which would make
    later tests' async_to_sync calls (the services' event publishing) refuse."""
    browser = [item for item in items if "tests/browser/" in str(item.fspath)]
    for item in browser:
        item.add_marker(pytest.mark.browser)
    items[:] = [item for item in items if item not in browser] + browser


@pytest.fixture(autouse=True)
def fast_password_hashing():
    """The app server checks passwords with its own (default) hashers, so the
    test process must hash them the same way: no MD5 shortcut here."""


@pytest.fixture(scope="session")
def app_server(django_db_setup) -> Iterator[AppServer]:
    # WhiteNoise serves collected files when DEBUG is off.
    subprocess.run(
        [sys.executable, "manage.py", "collectstatic", "--noinput", "-v0"],
        cwd=ROOT,
        env=subprocess_env(),
        check=True,
    )
    server = AppServer().start()
    yield server
    server.stop()


def _quiet_db() -> bool:
    """No other session is inside a query or a transaction on the test database."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND state IN ('active', 'idle in transaction', "
            "'idle in transaction (aborted)')"
        )
        return cursor.fetchone()[0] == 0


@pytest.fixture
def server(app_server, transactional_db) -> Iterator[AppServer]:
    if app_server.proc.poll() is not None:  # a test stopped it and failed before restarting
        app_server.start()
    yield app_server
    if app_server.proc.poll() is not None:
        app_server.start()
    # The test database is emptied next (TRUNCATE); let the app server finish the
    # requests the closed page left in flight, or the two deadlock.
    wait_for(_quiet_db, 15, "the app server's queries to finish")


@pytest.fixture
def worker(transactional_db):
    """A real Celery worker on the test database, stopped before the database is
    emptied (a worker left running between tests would race the flush)."""
    with workers(1) as started:
        yield started[0]


@pytest.fixture(scope="session")
def chromium():
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium (scripts/test does it)")
    from playwright.sync_api import sync_playwright

    pw = sync_playwright().start()
    browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
    yield browser
    browser.close()
    pw.stop()


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)


@pytest.fixture
def page(chromium, server, request):
    # bypass_csp: wait_for_function evaluates its string with eval, which the
    # policy refuses; tests/browser/test_console_csp.py runs the pages under it.
    context = chromium.new_context(
        base_url=server.url, viewport={"width": 1400, "height": 1000}, bypass_csp=True
    )
    context.set_default_timeout(15000)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.js_errors = errors
    page.base_url = server.url
    yield page
    failed = getattr(request.node, "rep_call", None)
    if failed is not None and failed.failed:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        name = request.node.nodeid.replace("/", "_").replace(":", "_")
        try:
            page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)
        except Exception:  # a screenshot must not hide the real failure
            pass
    context.close()
