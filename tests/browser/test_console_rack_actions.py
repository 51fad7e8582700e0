"""The rack page's node controls: only the moves the node's state allows are
shown; an operator drains a busy node with a reason, confirms in a dialog that
names the job it affects, and the grid shows it draining; a refusal is shown on
the row; a viewer gets no
controls, and the API refuses the drain anyway. The fleet page's rack cards
count the node and "problems only" finds its rack; a rack whose fabric degrades
gets its badge live, and the rack page draws a reporting node's sparklines."""

from __future__ import annotations

import pytest

from fleet.choices import NodeState
from fleet.models import Node
from fleet.services.intake.health import record_heartbeat
from fleet.services.jobs.allocations import apply_placement
from fleet.services.jobs.submit import JobSpec, submit_job
from fleet.services.nodes.moves import drain_node
from fleet.services.racks import set_fabric_state
from tests.browser.helpers import grid_cells, in_thread, log_in_as, open_live, post_api
from tests.signals_support import signals_beat

pytestmark = pytest.mark.browser


def _four_node_job(rack, submitter):
    nodes = list(Node.objects.filter(rack=rack).order_by("slot")[:4])
    job = in_thread(
        submit_job, submitter, JobSpec(name="llama-70b", num_nodes=4, gpus_per_node=4, tenant="llm")
    )
    in_thread(apply_placement, None, job.pk, {n.pk: [0, 1, 2, 3] for n in nodes}, reason="test setup")
    return job, nodes


def test_an_operator_drains_a_node_from_the_rack_page_and_the_grid_shows_it_draining(
    page, fleet, operator, submitter
):
    rack = fleet[0]
    job, nodes = _four_node_job(rack, submitter)
    node = nodes[1]
    log_in_as(page, operator)
    open_live(page, f"/racks/{rack.pk}/")
    # The big job is labelled on the grid, and its table row carries its grid colour.
    assert page.locator(f"text.job-label[data-job-label='{job.pk}']").text_content().startswith(f"#{job.pk}")
    cell_fill = page.evaluate(
        "getComputedStyle("
        f"document.querySelector('[data-testid=rack] path.fill[data-job=\"{job.pk}\"]')).fill"
    )
    swatch = page.locator(f"[data-testid=rack-jobs] [data-job-swatch='{job.pk}']")
    assert swatch.evaluate("el => getComputedStyle(el).backgroundColor") == cell_fill

    row = page.locator(f"[data-testid=node-row][data-node-id='{node.pk}']")
    visible = row.locator("[data-node-action]:visible")
    assert visible.all_text_contents() == ["Drain", "Mark failed"]
    # A disruptive move without a reason: refused on the row, nothing changed.
    row.locator("[data-testid=node-mark-failed]").click()
    row.locator("[data-testid=node-reason-error]").wait_for(state="visible")
    assert "takes the node out of service" in row.locator("[data-testid=node-reason-error]").text_content()

    row.locator("[data-testid=node-reason]").fill("fan noise, RMA 4711")
    row.locator("[data-testid=node-drain]").click()
    # The node runs a job: the console asks first, naming it.
    dialog = page.locator("[data-testid=node-confirm]")
    dialog.wait_for(state="visible")
    assert f"#{job.pk} llama-70b" in dialog.text_content()
    assert Node.objects.get(pk=node.pk).state == NodeState.HEALTHY
    dialog.locator("[data-testid=node-confirm-go]").click()

    page.wait_for_function(
        f"""() => {{
          const c = window.rackwise.cellState({node.pk}, 0);
          const drawn = window.rackwiseGrid.cells('[data-testid=rack]').filter(x => x.node === {node.pk});
          return c && c.mark === 'draining' && drawn.length === 4
            && drawn.every(x => x.state === 'draining' && x.letter === 'D' && \
x.pattern === 'p-drain' && x.fill === {job.pk});
        }}"""
    )
    # The row is filled from the API's answer, which may come after the live event.
    page.wait_for_function(
        f"document.querySelector('[data-testid=node-row][data-node-id=\"{node.pk}\"] [data-node-reason]')"
        ".textContent === 'fan noise, RMA 4711'"
    )
    assert row.locator("[data-node-state]").text_content() == "Draining"
    assert row.locator("[data-testid=node-reason]").input_value() == ""
    fresh = Node.objects.get(pk=node.pk)
    assert (fresh.state, fresh.state_reason) == (NodeState.DRAINING, "fan noise, RMA 4711")

    # A draining node offers undrain and mark failed, not drain or return to service.
    assert visible.all_text_contents() == ["Undrain", "Mark failed"]
    # Cancelling the confirmation changes nothing.
    row.locator("[data-testid=node-reason]").fill("XID 79")
    row.locator("[data-testid=node-mark-failed]").click()
    dialog.wait_for(state="visible")
    assert "interrupts 1 job" in dialog.text_content()
    dialog.locator("[data-testid=node-confirm-cancel]").click()
    dialog.wait_for(state="hidden")
    assert Node.objects.get(pk=node.pk).state == NodeState.DRAINING
    assert page.js_errors == []


def test_a_viewer_sees_no_node_controls_and_the_api_refuses_the_drain(page, fleet, viewer):
    rack = fleet[0]
    node = rack.nodes.get(slot=3)
    log_in_as(page, viewer)
    open_live(page, f"/racks/{rack.pk}/")
    assert page.locator("[data-testid=node-row]").count() == 18
    assert page.locator("[data-testid=node-actions]").count() == 0
    assert page.locator("[data-node-action]").count() == 0

    status, body = post_api(page, f"/api/nodes/{node.pk}/drain/", {"reason": "forged"})
    assert status == 403, body
    assert Node.objects.get(pk=node.pk).state == NodeState.HEALTHY


def test_fleet_cards_count_failed_draining_and_spares_live_and_problems_only_finds_the_rack(
    page, fleet, operator, submitter, clock
):
    r1, r2 = fleet
    _four_node_job(r1, submitter)
    # r1's first node reports for three minutes: its sparklines on the rack page.
    reporting = r1.nodes.get(slot=0)
    for minute in range(3):
        clock.at = minute
        in_thread(record_heartbeat, reporting.pk, signals_beat())
    drained = r2.nodes.get(slot=5)
    in_thread(drain_node, operator, drained.pk, "firmware")
    log_in_as(page, operator)
    open_live(page)
    card1, card2 = (page.locator(f"article.rack[data-rack-id='{r.pk}']") for r in fleet)

    def stat(card, k):
        return card.locator(f"[data-stat={k}]").text_content()

    # r1: 4 nodes busy, 14 idle; the busy ones hold a preemptible job, which the
    # engine counts as borrowing the 2 spares (recovery can reclaim its nodes), so
    # a non-preemptible gang is offered all 14 (the slice, as the header's largest
    # free slice counts it); the last 2 idle are still marked S.
    # r2: 1 drained, 17 idle of which 2 spares kept: a slice of 15.
    assert [stat(card1, k) for k in ("slice", "failed", "draining", "spares")] == ["14", "0", "0", "2"]
    assert [stat(card2, k) for k in ("slice", "failed", "draining", "spares")] == ["15", "0", "1", "2"]
    # The drained node is marked with its letter even in the fleet page's small cells.
    drawn = [c for c in grid_cells(page, f"article.rack[data-rack-id='{r2.pk}']") if c["node"] == drained.pk]
    assert len(drawn) == 4 and {c["letter"] for c in drawn} == {"D"}

    page.check("[data-testid=problems-only]")
    assert card1.is_hidden() and card2.is_visible()
    assert page.text_content("[data-testid=shown]") == "1"
    page.uncheck("[data-testid=problems-only]")
    page.select_option("[data-testid=sort]", "slice")
    order = page.eval_on_selector_all("article.rack", "els => els.map(el => Number(el.dataset.rackId))")
    assert order == [r2.pk, r1.pk]

    # Live: a node of r1 fails; its card counts it, and "problems only" now shows it too.
    page.check("[data-testid=problems-only]")
    failed = r1.nodes.get(slot=10)
    status, body = post_api(page, f"/api/nodes/{failed.pk}/mark-failed/", {"reason": "XID 79"})
    assert status == 200, body
    page.wait_for_function(
        f"document.querySelector('article.rack[data-rack-id=\"{r1.pk}\"] [data-stat=failed]')"
        ".textContent === '1'"
    )
    page.wait_for_function(f"!document.querySelector('article.rack[data-rack-id=\"{r1.pk}\"]').hidden")
    assert page.text_content("[data-testid=shown]") == "2"
    # The slice follows with the next fragmentation report (at most 4 s).
    page.wait_for_function(
        f"document.querySelector('article.rack[data-rack-id=\"{r1.pk}\"] [data-stat=slice]')"
        ".textContent === '13'"
    )
    assert page.text_content("[data-testid=largest]") == "15 nodes (60 GPUs)"

    # Live: r2's fabric degrades; its card says so, and why.
    badge = card2.locator("[data-testid=rack-fabric-badge]")
    assert badge.is_hidden()
    why = "NVLink fabric degraded on 2 of 18 nodes (r2-n00: IMEX unavailable; r2-n01: IMEX unavailable)"
    in_thread(set_fabric_state, None, r2.pk, why)
    badge.wait_for(state="visible")
    assert badge.text_content() == "fabric degraded" and badge.get_attribute("title").startswith(why)

    # The rack page: the reporting node's temperature and power, a line of three minutes each.
    open_live(page, f"/racks/{r1.pk}/")
    row = page.locator(f"[data-testid=node-health-row][data-node-id='{reporting.pk}']")
    lines = row.locator("svg[data-testid=sparkline]")
    assert lines.count() == 2 and lines.first.is_visible()
    assert lines.first.get_attribute("data-points") == "3"
    assert lines.first.locator("path").get_attribute("d").count("L") == 2
    assert "43 °C" in row.text_content()
    # Its fabric degrades: the table is fetched again at the rack event.
    in_thread(set_fabric_state, None, r1.pk, why.replace("r2-", "r1-"))
    page.locator("[data-testid=rack-fabric-degraded]").wait_for(state="visible")
    assert page.locator("[data-testid=node-health-row]").count() == 18
    assert page.js_errors == []
    assert page.js_errors == []
