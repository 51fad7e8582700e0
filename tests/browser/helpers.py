"""Helpers for the browser tests: log in, open a live page, call the API as the page."""

from __future__ import annotations

from django.conf import settings
from django.test import Client
from playwright.sync_api import TimeoutError as PlaywrightTimeout


def log_in_as(page, user) -> None:
    """Reuse a session made in the test process (same SECRET_KEY and database)."""
    client = Client()
    client.force_login(user)
    cookie = client.cookies[settings.SESSION_COOKIE_NAME].value
    page.context.add_cookies([{"name": settings.SESSION_COOKIE_NAME, "value": cookie, "url": page.base_url}])


def open_live(page, path: str = "/") -> None:
    """Open a console page and wait until the live feed is open and every rack
    shown has applied a version."""
    page.goto(path)
    page.wait_for_function("document.body.dataset.ws === 'open' && document.body.dataset.ready === '1'")


def rack_version(page, rack_id: int) -> int:
    return page.evaluate(f"window.rackwise.appliedVersion({rack_id})")


def grid_cells(page, selector: str = "main") -> list[dict]:
    """Every GPU cell of the grids drawn in what ``selector`` matches, as
    window.rackwiseGrid reads them: what each was drawn from (rack, version,
    node, gpu, host, job, state, mark, dim, matched, moved) and what the grid's
    SVG paints there (fill: a job id, "free" or None; pattern; edges; letter)."""
    return page.evaluate("s => window.rackwiseGrid.cells(s)", selector)


def hover_cell(page, selector: str, node: int, gpu: int) -> str:
    """Move the mouse onto one GPU's cell of the grid under ``selector`` and
    return the tooltip's text."""
    tip = page.locator("[data-testid=tooltip]")
    # The page may still move under the pointer (a figure arriving re-lays out the
    # cards above): if no tooltip shows, read the cell's box again and move again.
    for attempt in range(5):
        page.locator(selector).first.scroll_into_view_if_needed()
        box = page.evaluate("([s, n, g]) => window.rackwiseGrid.box(s, n, g)", [selector, node, gpu])
        assert box, f"no drawn cell {node}:{gpu} under {selector}"
        page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        try:
            tip.wait_for(state="visible", timeout=1000)
            return tip.text_content()
        except PlaywrightTimeout:
            if attempt == 4:
                raise
            page.mouse.move(0, 0)


def post_api(page, path: str, data: dict | None = None) -> tuple[int, dict]:
    """POST to the API with the page's session and CSRF token, as the page would."""
    token = next((c["value"] for c in page.context.cookies() if c["name"] == "csrftoken"), "")
    response = page.request.post(path, data=data or {}, headers={"X-CSRFToken": token, "Referer": page.url})
    try:
        body = response.json()
    except Exception:
        body = {}
    return response.status, body


def in_thread(fn, *args, **kwargs):
    """Call a service from a worker thread: Playwright's loop owns the main
    thread, and the services publish their events with async_to_sync."""
    from concurrent.futures import ThreadPoolExecutor

    from django.db import connection

    def run():
        try:
            return fn(*args, **kwargs)
        finally:
            connection.close()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(run).result()
