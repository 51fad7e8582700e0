"""The operator's cockpit on the Actions page: a defrag planned and approved from
the console (a refused field's message next to the field, a costly approval
confirmed), a proposal made elsewhere appearing without a reload with the nav
badge counting it, and a viewer who gets none of the operator tools (and whose
forged calls the API refuses)."""

from __future__ import annotations

import pytest

from fleet.choices import ActionKind, ActionState, ApprovalMode
from fleet.models import Action, ApprovalPolicy
from fleet.services.actions.propose import propose
from tests.browser.helpers import grid_cells, in_thread, log_in_as, open_live, post_api

pytestmark = pytest.mark.browser


def test_an_operator_plans_a_defrag_from_the_console_and_approves_it_there(
    page, fleet, fragmented, operator, worker
):
    a, _b, c = fragmented
    log_in_as(page, operator)
    open_live(page, "/actions/")
    page.locator("[data-testid=defrag-panel] summary").click()
    form = page.locator("[data-testid=defrag-form]")

    # A refused field: the API's message, next to the field; nothing planned.
    form.locator("input[name=free_racks]").fill("0")
    form.locator("[data-testid=defrag-submit]").click()
    error = form.locator("[data-field-error=free_racks]")
    error.wait_for(state="visible")
    page.wait_for_function("document.querySelector('[data-field-error=free_racks]').textContent.length > 0")
    assert "greater than or equal to 1" in error.text_content()
    assert not Action.objects.filter(kind=ActionKind.DEFRAG).exists()

    # Two whole free racks cannot be had (B may not move): the plan frees one
    # and says plainly that it misses the target.
    form.locator("input[name=free_racks]").fill("2")
    form.locator("[data-testid=defrag-submit]").click()
    page.wait_for_selector("[data-testid=decisions] article[data-kind=defrag]")
    short = Action.objects.get(kind=ActionKind.DEFRAG)
    assert error.text_content() == ""
    assert (
        "this plan misses it"
        in page.locator(f"#action-{short.pk} [data-testid=target-missed]").text_content()
    )

    # Room for the waiting gangs (no target): this plan replaces it and opens here.
    form.locator("input[name=free_racks]").fill("")
    form.locator("[data-testid=defrag-submit]").click()
    page.wait_for_selector(
        f"[data-testid=decisions] article[data-kind=defrag][data-state=proposed]:not(#action-{short.pk})"
    )
    plan = Action.objects.filter(kind=ActionKind.DEFRAG).exclude(pk=short.pk).get()
    assert Action.objects.get(pk=short.pk).state == ActionState.EXPIRED
    assert f"action #{plan.pk}" in form.locator("[data-testid=defrag-result]").text_content()
    card = page.locator(f"#action-{plan.pk}")
    after = grid_cells(page, f"#action-{plan.pk} [data-testid=grid-after]")
    assert len([c for c in after if c["fill"] == a.pk]) == 16
    # The moved cells are outlined in the "after" grid: A's new cells in r2 and its old ones in r1.
    moved = [c for c in after if "moved" in c["edges"]]
    assert len(moved) == 32
    assert {c["rack"] for c in moved if c["fill"] == a.pk} == {fleet[1].pk} and len(
        [c for c in moved if c["fill"] == "free"]
    ) == 16
    before = grid_cells(page, f"#action-{plan.pk} [data-testid=grid-before]")
    assert len(before) == 144 and [c for c in before if "moved" in c["edges"]] == []
    assert "this plan meets it" in card.locator("[data-testid=defrag-target]").text_content()
    assert card.locator("[data-testid=free-racks-now]").text_content() == "0"
    page.wait_for_function(
        "document.querySelector('[data-testid=nav-badge]').dataset.count === "
        f"'{Action.objects.filter(state=ActionState.PROPOSED).count()}'"
    )

    # Costly: the first click asks to confirm the GPU-hours (the page's threshold
    # is lowered below this plan's cost), the second approves.
    page.evaluate("document.querySelector('[data-testid=decisions]').dataset.confirmGpuHours = '0'")
    approve = card.locator("[data-testid=approve]")
    approve.click()
    assert approve.text_content() == f"Confirm: lose {plan.cost_gpu_hours:.1f} GPU-hours"
    assert Action.objects.get(pk=plan.pk).state == ActionState.PROPOSED
    approve.click()
    page.wait_for_function(
        f"document.getElementById('action-{plan.pk}').dataset.state === 'succeeded'", timeout=30000
    )
    assert Action.objects.get(pk=plan.pk).decided_by_name == operator.username
    # The target stays in view; the waiting gang C takes the room the plan made.
    assert card.locator("[data-testid=defrag-target]").is_visible()
    page.wait_for_function(
        f"window.rackwise.jobCells({c.pk}).length === 64 && "
        f"window.rackwise.jobCells({c.pk}).every(x => x.rack === {fleet[0].pk})",
        timeout=30000,
    )
    assert card.locator("[data-testid=free-racks-now]").text_content() == "0"


def test_a_proposal_made_elsewhere_appears_without_a_reload_and_the_badge_counts_it(page, fleet, operator):
    node = fleet[0].nodes.get(slot=3)
    log_in_as(page, operator)
    open_live(page, "/actions/")
    assert page.locator("[data-testid=nav-badge]").is_hidden()
    page.evaluate("window.__sameDocument = true")

    drain = in_thread(
        propose,
        kind=ActionKind.DRAIN,
        title=f"drain {node.hostname}: <b>ECC</b> errors",
        steps=[
            {
                "op": "drain",
                "node": node.pk,
                "hostname": node.hostname,
                "reason": "<img src=x onerror=alert(1)>",
            }
        ],
        jobs=[],
    )
    card = page.locator(f"#action-{drain.pk}")
    card.wait_for()
    assert card.locator("[data-testid=approve]").is_visible()
    assert "<b>ECC</b>" in card.text_content(), "titles and reasons are text, not markup"
    page.wait_for_function(
        "([s, node]) => window.rackwiseGrid.cells(s)"
        ".filter(c => c.node === node && c.state === 'drained' && c.letter === 'D').length === 4",
        arg=[f"#action-{drain.pk} [data-testid=grid-after]", node.pk],
    )
    badge = page.locator("[data-testid=nav-badge]")
    page.wait_for_function("document.querySelector('[data-testid=nav-badge]').dataset.count === '1'")
    assert badge.is_visible() and badge.text_content().startswith("1 awaiting approval · oldest ")
    assert page.evaluate("window.__sameDocument") is True, "no reload"


def test_a_viewer_gets_no_operator_tools_and_the_api_refuses_them(page, fleet, viewer):
    in_thread(
        propose,
        kind=ActionKind.DRAIN,
        title="drain",
        jobs=[],
        steps=[{"op": "drain", "node": fleet[0].nodes.first().pk, "hostname": "h", "reason": "r"}],
    )
    log_in_as(page, viewer)
    open_live(page, "/actions/")
    for testid in ("defrag-panel", "policy-panel", "approve", "reject"):
        assert page.locator(f"[data-testid={testid}]").count() == 0, testid
    assert page.locator("[data-testid=nav-badge]").is_visible(), "viewers see what waits, too"

    status, _ = post_api(page, "/api/actions/defrag/", {})
    assert status == 403
    token = next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")
    response = page.request.put(
        "/api/approval-policy/",
        data={"kind": "drain", "mode": "auto"},
        headers={"X-CSRFToken": token, "Referer": page.url},
    )
    assert response.status == 403
    assert ApprovalPolicy.mode_for(ActionKind.DRAIN) == ApprovalMode.MANUAL


def test_an_operator_edits_the_approval_policy(page, fleet, operator):
    log_in_as(page, operator)
    open_live(page, "/actions/")
    page.locator("[data-testid=policy-panel] summary").click()
    page.locator("[data-policy-kind=drain]").select_option("auto")
    page.wait_for_function("document.querySelector('[data-policy-status=drain]').textContent === 'saved'")
    assert ApprovalPolicy.mode_for(ActionKind.DRAIN) == ApprovalMode.AUTO
