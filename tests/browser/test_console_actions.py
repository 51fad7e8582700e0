"""The approval queue: an operator approves a defrag plan and watches it run; a
viewer gets no button, and a forged approval is refused by the server; a drain
shows its node drained in the "after" picture."""

from __future__ import annotations

import pytest

from fleet import locks
from fleet.choices import ActionKind, ActionState
from fleet.models import Action
from fleet.services.actions.propose import propose
from fleet.services.decisions.defrag import plan_defrag
from tests.browser.helpers import grid_cells, in_thread, log_in_as, open_live, post_api

pytestmark = pytest.mark.browser


@pytest.fixture
def defrag_plan(request, operator):
    """The ``fragmented`` fleet and a defrag plan for it. The decision lock is
    held meanwhile, so a live worker's scheduling pass cannot place the set-up
    jobs before the fixture does."""
    with locks.decisions(wait=30):
        request.getfixturevalue("fragmented")
        outcome = plan_defrag(operator)
    assert outcome.action is not None, outcome.reason
    return outcome.action


def test_an_operator_approves_a_defrag_plan_and_watches_it_to_the_final_grid(
    page, fleet, defrag_plan, fragmented, operator, worker
):
    a, b, _waiting = fragmented
    r1, r2 = fleet
    log_in_as(page, operator)
    open_live(page, "/actions/")
    card = page.locator(f"[data-action-id='{defrag_plan.pk}']")
    # Before: job A in r1; after: A next to B in r2, r1 whole and free.
    grid = f"[data-action-id='{defrag_plan.pk}'] [data-testid=grid-{{}}][data-rack-id='{{}}']"

    def painted(side, rack, job):
        return [c for c in grid_cells(page, grid.format(side, rack.pk)) if c["fill"] == job]

    assert len(painted("before", r1, a.pk)) == 16
    assert [c for c in grid_cells(page, grid.format("after", r1.pk)) if c["fill"] != "free"] == []
    assert len(painted("after", r2, a.pk)) == 16
    assert "GPU-hours" in card.text_content()

    # While it executes, the card shows where it is now and its target (#28 item 8:
    # an executing card lost the target grid).
    card.evaluate("""el => { window.sawTarget = false; new MutationObserver(() => {
        if (el.dataset.state === 'executing' && el.querySelector('[data-testid=grid-target]')
            && el.querySelector('[data-testid=grid-now]')) window.sawTarget = true;
    }).observe(el, { subtree: true, childList: true, attributes: true }); }""")
    card.locator("[data-testid=approve]").click()
    page.wait_for_function(
        f"document.querySelector('[data-action-id=\"{defrag_plan.pk}\"]').dataset.state === 'succeeded'",
        timeout=30000,
    )
    assert page.evaluate("window.sawTarget")
    assert card.locator("[data-testid=progress]").evaluate("el => el.value") == 1
    # The event carries the state; the step log comes with the re-fetch that follows it.
    page.wait_for_function(
        f"document.querySelectorAll('[data-action-id=\"{defrag_plan.pk}\"] [data-testid=steplog] div').length"
        f" >= {len(defrag_plan.steps)}"
    )
    assert card.locator("[data-testid=approve]").is_hidden()
    # The final grid: A now runs in r2.
    page.wait_for_function(
        f"window.rackwise.jobCells({a.pk}).length === 16 && "
        f"window.rackwise.jobCells({a.pk}).every(c => c.rack === {r2.pk})"
    )
    page.wait_for_function(
        "([s, job]) => window.rackwiseGrid.cells(s).filter(c => c.fill === job).length === 16",
        arg=[grid.format("now", r2.pk), a.pk],
    )
    assert len(painted("now", r2, b.pk)) == 16


def test_a_viewer_sees_no_approve_button_and_a_forged_approval_is_refused(page, defrag_plan, viewer):
    log_in_as(page, viewer)
    open_live(page, "/actions/")
    card = page.locator(f"[data-action-id='{defrag_plan.pk}']")
    assert card.count() == 1
    assert page.locator("[data-testid=approve]").count() == 0
    assert page.locator("[data-testid=reject]").count() == 0
    assert page.locator("[data-testid=read-only]").is_visible()

    status, body = post_api(page, f"/api/actions/{defrag_plan.pk}/approve/", {"note": "forged"})
    assert status == 403, body
    assert Action.objects.get(pk=defrag_plan.pk).state == ActionState.PROPOSED


def test_a_proposed_drain_shows_the_node_drained_in_the_after_picture(page, fleet, operator):
    node = fleet[0].nodes.get(slot=7)
    drain = in_thread(
        propose,
        kind=ActionKind.DRAIN,
        title=f"drain {node.hostname}: degraded GPU",
        steps=[{"op": "drain", "node": node.pk, "hostname": node.hostname, "reason": "degraded GPU"}],
        jobs=[],
    )
    log_in_as(page, operator)
    open_live(page, "/actions/")
    card = f"[data-action-id='{drain.pk}']"
    after = f"{card} [data-testid=grid-after][data-rack-id='{fleet[0].pk}']"
    before = f"{card} [data-testid=grid-before][data-rack-id='{fleet[0].pk}']"
    page.wait_for_function("s => window.rackwiseGrid.cells(s).length === 72", arg=after)

    after_cells = [c for c in grid_cells(page, after) if c["node"] == node.pk]
    before_cells = [c for c in grid_cells(page, before) if c["node"] == node.pk]
    assert len(after_cells) == 4
    assert {(c["state"], c["pattern"], c["letter"]) for c in after_cells} == {("drained", "p-drain", "D")}
    assert {(c["state"], c["pattern"], c["letter"], "free" in c["edges"]) for c in before_cells} == {
        ("free", None, None, True)
    }
