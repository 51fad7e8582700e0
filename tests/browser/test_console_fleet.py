"""The fleet page: log in, see every rack as a live grid, watch a job land."""

from __future__ import annotations

import pytest

from fleet.services.nodes.inventory import create_rack
from fleet.services.users import ensure_user
from tests.browser.helpers import (
    grid_cells,
    hover_cell,
    in_thread,
    log_in_as,
    open_live,
    post_api,
    rack_version,
)

pytestmark = pytest.mark.browser


def test_a_viewer_logs_in_and_sees_a_grid_of_72_gpus_per_rack(page, fleet):
    ensure_user(None, "vic", role="viewer", password="correct-horse-battery")
    page.goto("/")
    page.fill("input[name=username]", "vic")
    page.fill("input[name=password]", "correct-horse-battery")
    page.click("button[type=submit]")
    page.wait_for_function("document.body.dataset.ws === 'open' && document.body.dataset.ready === '1'")

    assert page.text_content("[data-testid=who]").split()[:2] == ["vic", "Viewer"]
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
    wide = create_rack(
        None,
        name="w1",
        kind="CUSTOM",
        nodes=18,
        gpus_per_node=8,
        spare_nodes=2,
        site="dc",
        row="A",
        position=9,
    )
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

    status, job = post_api(
        page, "/api/jobs/", {"name": "llama-8b", "tenant": "llm", "num_nodes": 2, "gpus_per_node": 4}
    )
    assert status == 201, job

    # Painted: 8 cells in the job's colour.
    page.wait_for_function(
        "id => window.rackwiseGrid.cells('main').filter(c => c.fill === id).length === 8",
        arg=job["id"],
        timeout=20000,
    )
    cells = page.evaluate(f"window.rackwise.jobCells({job['id']})")
    rack_id = cells[0]["rack"]
    assert rack_version(page, rack_id) > before[rack_id]
    assert page.evaluate("window.__noReload") is True  # the same document: no reload
    painted = {(c["node"], c["gpu"]) for c in grid_cells(page) if c["fill"] == job["id"]}
    assert painted == {(c["node"], c["gpu"]) for c in cells}
    title = hover_cell(page, f"article.rack[data-rack-id='{rack_id}']", cells[0]["node"], cells[0]["gpu"])
    assert "llama-8b" in title and "llm" in title


def _eight_racks_with_big_jobs(submitter):
    from fleet.choices import RackKind
    from fleet.models import Node
    from fleet.services.jobs.allocations import apply_placement, start_job
    from fleet.services.jobs.submit import JobSpec, submit_job
    from fleet.services.nodes.inventory import create_rack

    for i in range(8):
        rack = create_rack(None, name=f"wall-{i:02d}", kind=RackKind.NVL72, site="dc1", row="A", position=i)
        nodes = list(Node.objects.filter(rack=rack).order_by("slot"))[: 8 + i % 4]
        job = submit_job(
            submitter,
            JobSpec(
                name=f"llama-{i}",
                num_nodes=len(nodes),
                gpus_per_node=4,
                tenant="llm",
                expected_duration_s=10**6,
            ),
        )
        apply_placement(None, job.pk, {n.pk: [0, 1, 2, 3] for n in nodes}, reason="test setup")
        start_job(None, job.pk)


def test_the_racks_are_on_the_first_screen_and_a_wall_reads_from_afar(chromium, server, submitter, operator):
    """#28 item 8: at 1440x900 the Fleet page showed charts and no rack on the
    first screen; the kiosk at 4K had no job labels and 14 px totals."""
    in_thread(_eight_racks_with_big_jobs, submitter)
    seen = {}
    for name, (width, height), path in [("laptop", (1440, 900), "/"), ("wall", (3840, 2160), "/?kiosk=1")]:
        context = chromium.new_context(
            base_url=server.url, viewport={"width": width, "height": height}, bypass_csp=True
        )
        page = context.new_page()
        page.base_url = server.url
        log_in_as(page, operator)
        open_live(page, path)
        page.wait_for_function("document.querySelectorAll('article.rack[data-painted]').length === 8")
        seen[name] = page.evaluate("""() => {
            const racks = [...document.querySelectorAll('article.rack')].map((r) => \
r.getBoundingClientRect());
            return { firstBottom: racks[0].bottom, \
chartTop: document.querySelector('.chart-panel')?.getBoundingClientRect().top ?? null,
                     totals: parseFloat(getComputedStyle(document.querySelector('.totals')).fontSize),
                     labels: document.querySelectorAll('.job-label').length };
        }""")
        context.close()
    laptop, wall = seen["laptop"], seen["wall"]
    assert laptop["firstBottom"] <= 900, laptop  # a whole rack card on the first screen
    assert laptop["chartTop"] > laptop["firstBottom"], "the charts come after the racks"
    assert wall["totals"] >= 30 and wall["labels"] == 8, wall
