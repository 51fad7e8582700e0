"""The fleet page: log in, see every rack as a live grid, watch a job land."""

from __future__ import annotations

import pytest

from fleet.services.inventory import create_rack
from fleet.services.users import ensure_user
from tests.browser.helpers import grid_cells, hover_cell, log_in_as, open_live, post_api, rack_version

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
        cells = grid_cells(page, f"article.rack[data-rack-id='{rack.pk}']")
        assert len(cells) == 72 and {c["fill"] for c in cells} == {"free"}
        assert {c["version"] for c in cells} == {rack.version}
    # Spares are marked in the picture and in words, not by colour alone.
    card = f"article.rack[data-rack-id='{fleet[0].pk}']"
    spares = [c for c in grid_cells(page, card) if c["state"] == "spare"]
    assert len(spares) == 8
    assert all(c["letter"] == "S" and "spare" in c["edges"] for c in spares)
    assert "spare" in hover_cell(page, card, spares[0]["node"], spares[0]["gpu"])
    assert page.js_errors == []


def test_a_rack_grid_is_a_few_elements_whatever_its_gpu_count(page, fleet, viewer):
    """One path per fill, pattern and edge, one text for the letters: a rack of
    18 x 8 GPUs takes as many elements as one of 18 x 4."""
    wide = create_rack(None, name="w1", kind="CUSTOM", nodes=18, gpus_per_node=8, spare_nodes=2, site="dc", row="A", position=9)
    log_in_as(page, viewer)
    open_live(page)
    count = "s => document.querySelector(s).getElementsByTagName('*').length"
    narrow = page.evaluate(count, f"article.rack[data-rack-id='{fleet[0].pk}'] .grid")
    assert len(grid_cells(page, f"article.rack[data-rack-id='{wide.pk}']")) == 144
    assert page.evaluate(count, f"article.rack[data-rack-id='{wide.pk}'] .grid") == narrow
    # svg, free cells, their edge, the spares' edge, the letters.
    assert narrow == 5
    assert page.js_errors == []


def test_hover_and_keyboard_focus_show_the_gpu_node_job_and_health(page, fleet, viewer):
    log_in_as(page, viewer)
    open_live(page)
    card = f"article.rack[data-rack-id='{fleet[0].pk}']"
    grid = page.locator(f"{card} .grid")
    sixth = grid_cells(page, card)[5]  # the second node's GPU 1
    text = hover_cell(page, card, sixth["node"], sixth["gpu"])
    assert text.startswith(f"r1 · {sixth['host']} GPU 1: free") and "healthy" in text
    tip = page.locator("[data-testid=tooltip]")
    grid.focus()
    page.keyboard.press("ArrowDown")
    page.keyboard.press("ArrowRight")
    tip.wait_for(state="visible", timeout=5000)
    assert "GPU 1" in tip.text_content() and "healthy" in tip.text_content()
    # The keyboard went down a node and right a GPU from the first cell: the sixth.
    assert tip.text_content() == text


def test_a_job_submitted_through_the_api_appears_on_the_grid_without_a_reload(page, fleet, submitter, worker):
    log_in_as(page, submitter)
    open_live(page)
    before = {r.pk: rack_version(page, r.pk) for r in fleet}
    page.evaluate("window.__noReload = true")

    status, job = post_api(page, "/api/jobs/", {"name": "llama-8b", "tenant": "llm", "num_nodes": 2, "gpus_per_node": 4})
    assert status == 201, job

    # Painted: 8 cells in the job's colour.
    page.wait_for_function("id => window.rackwiseGrid.cells('main').filter(c => c.fill === id).length === 8", arg=job["id"], timeout=20000)
    cells = page.evaluate(f"window.rackwise.jobCells({job['id']})")
    rack_id = cells[0]["rack"]
    assert rack_version(page, rack_id) > before[rack_id]
    assert page.evaluate("window.__noReload") is True  # the same document: no reload
    painted = {(c["node"], c["gpu"]) for c in grid_cells(page) if c["fill"] == job["id"]}
    assert painted == {(c["node"], c["gpu"]) for c in cells}
    title = hover_cell(page, f"article.rack[data-rack-id='{rack_id}']", cells[0]["node"], cells[0]["gpu"])
    assert "llama-8b" in title and "llm" in title
