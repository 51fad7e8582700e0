"""The fleet page: log in, see every rack as a live grid, watch a job land."""

from __future__ import annotations

import pytest

from fleet.services.users import ensure_user
from tests.browser.helpers import log_in_as, open_live, post_api, rack_version

pytestmark = pytest.mark.browser


def test_a_viewer_logs_in_and_sees_a_grid_of_72_gpus_per_rack(page, fleet):
    ensure_user(None, "vic", role="viewer", password="correct-horse-battery")
    page.goto("/")
    page.fill("input[name=username]", "vic")
    page.fill("input[name=password]", "correct-horse-battery")
    page.click("button[type=submit]")
    page.wait_for_function("document.body.dataset.ws === 'open' && document.body.dataset.ready === '1'")

    assert page.text_content("[data-testid=who]").split() [:2] == ["vic", "Viewer"]
    for rack in fleet:
        el = page.locator(f"article.rack[data-rack-id='{rack.pk}']")
        assert int(el.get_attribute("data-version")) == rack.version
        assert el.locator("g.cell").count() == 72
    # Spares are marked in the picture and in words, not by colour alone.
    spares = page.locator(f"article.rack[data-rack-id='{fleet[0].pk}'] g.cell[data-state=spare]")
    assert spares.count() == 8
    assert "spare" in spares.first.locator("title").text_content()
    assert page.js_errors == []


def test_hover_and_keyboard_focus_show_the_gpu_node_job_and_health(page, fleet, viewer):
    log_in_as(page, viewer)
    open_live(page)
    grid = page.locator(f"article.rack[data-rack-id='{fleet[0].pk}'] .grid")
    grid.locator("g.cell").nth(5).hover()
    tip = page.locator("[data-testid=tooltip]")
    assert "r1-" in tip.text_content() and "GPU 1" in tip.text_content() and "free" in tip.text_content()
    grid.focus()
    page.keyboard.press("ArrowDown")
    page.keyboard.press("ArrowRight")
    tip.wait_for(state="visible", timeout=5000)
    assert "GPU 1" in tip.text_content() and "healthy" in tip.text_content()


def test_a_job_submitted_through_the_api_appears_on_the_grid_without_a_reload(page, fleet, submitter, worker):
    log_in_as(page, submitter)
    open_live(page)
    before = {r.pk: rack_version(page, r.pk) for r in fleet}
    page.evaluate("window.__noReload = true")

    status, job = post_api(page, "/api/jobs/", {"name": "llama-8b", "tenant": "llm", "num_nodes": 2, "gpus_per_node": 4})
    assert status == 201, job

    page.wait_for_function(f"document.querySelectorAll('g.cell[data-job=\"{job['id']}\"]').length === 8", timeout=20000)
    cells = page.evaluate(f"window.rackwise.jobCells({job['id']})")
    rack_id = cells[0]["rack"]
    assert rack_version(page, rack_id) > before[rack_id]
    assert page.evaluate("window.__noReload") is True  # the same document: no reload
    title = page.locator(f"g.cell[data-job='{job['id']}'] title").first.text_content()
    assert "llama-8b" in title and "llm" in title
