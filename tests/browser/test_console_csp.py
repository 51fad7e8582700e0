"""The console works under its Content-Security-Policy (#28 item 16): every page
loads, goes live and draws with no script, style or connection the policy
refuses. (The other browser tests bypass the policy, since Playwright's
wait_for_function evaluates strings; this one does not.)"""

from __future__ import annotations

import pytest

from fleet.services.decisions.defrag import plan_defrag
from tests.browser.helpers import in_thread, log_in_as

pytestmark = pytest.mark.browser

PAGES = [
    "/",
    "/?kiosk=1",
    "/racks/{rack}/",
    "/jobs/",
    "/jobs/{job}/",
    "/jobs/submit/",
    "/actions/",
    "/audit/",
    "/tenants/",
    "/webhooks/",
    "/api/docs/",
]


def test_every_page_runs_under_the_policy(chromium, server, fragmented, fleet, operator):
    in_thread(plan_defrag, None)
    context = chromium.new_context(base_url=server.url)  # the policy enforced
    page = context.new_page()
    page.base_url = server.url
    refused: list[str] = []
    page.on("console", lambda m: refused.append(m.text) if "Content Security Policy" in m.text else None)
    page.on("pageerror", lambda exc: refused.append(str(exc)))
    log_in_as(page, operator)
    try:
        for path in PAGES:
            page.goto(path.format(rack=fleet[0].pk, job=fragmented[0].pk))
            page.wait_for_load_state("networkidle")
            if path in ("/", "/actions/"):
                page.wait_for_selector("body[data-ws=open]")  # the live feed's socket is allowed
        # Swagger UI's start-up script is a file of its own (no inline script).
        page.wait_for_selector(".swagger-ui .info")
    finally:
        context.close()
    assert refused == [], refused
