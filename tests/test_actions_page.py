"""The Actions page as the operator's queue: decisions that need a person as
cards, automatic placements folded into a compact table, the fragment the page
adds live proposals from, and the operator tools (a defrag request, the
approval policy) shown to operators only."""

from __future__ import annotations

import pytest
from django.test import Client

from fleet.choices import ActionKind, ActionState
from fleet.models import Action, Node
from fleet.services.actions import propose as action_services
from fleet.services.jobs.submit import JobSpec, submit_job


@pytest.fixture
def queue(fleet, submitter, other_submitter):
    job = submit_job(submitter, JobSpec(name="llm-job", num_gpus=4, tenant="llm"))
    vision = submit_job(other_submitter, JobSpec(name="vision-secret", num_gpus=4, tenant="vision"))
    node = Node.objects.order_by("id").first()
    step = {
        "op": "allocate",
        "job": job.pk,
        "nodes": {str(node.pk): [0, 1, 2, 3]},
        "hostnames": [node.hostname],
    }
    auto = action_services.propose(
        kind=ActionKind.PLACEMENT, title=f"place #{job.pk}", jobs=[job.pk], steps=[step]
    )
    manual = action_services.propose(
        kind=ActionKind.PLACEMENT_SPILL, title=f"spill #{job.pk}", jobs=[job.pk], steps=[step]
    )
    foreign = action_services.propose(
        kind=ActionKind.MIGRATION,
        title=f"move #{vision.pk} vision-secret",
        jobs=[vision.pk],
        steps=[{"op": "start", "job": vision.pk}],
    )
    assert Action.objects.get(pk=auto.pk).state != ActionState.PROPOSED, (
        "placements run automatically by default"
    )
    return {"auto": auto, "manual": manual, "foreign": foreign}


def _get(user, path: str):
    client = Client()
    client.force_login(user)
    return client.get(path)


def test_automatic_placements_fold_into_the_compact_table_and_decisions_stand_out(queue, operator):
    html = _get(operator, "/actions/").content.decode()
    decisions, automatic = html.split('data-testid="automatic"')
    assert f'id="action-{queue["manual"].pk}" data-testid="action"' in decisions
    assert f'id="action-{queue["foreign"].pk}" data-testid="action"' in decisions
    assert f'data-action-id="{queue["auto"].pk}"' not in decisions
    assert f'id="action-{queue["auto"].pk}" data-testid="auto-action"' in automatic


def test_the_fragment_is_the_card_or_row_the_page_would_draw(queue, operator):
    card = _get(operator, f"/actions/{queue['manual'].pk}/fragment/")
    assert card.status_code == 200 and card["X-Rackwise-Compact"] == "0"
    assert card.content.decode().lstrip().startswith("<") and 'data-testid="approve"' in card.content.decode()
    row = _get(operator, f"/actions/{queue['auto'].pk}/fragment/")
    assert row["X-Rackwise-Compact"] == "1" and 'data-testid="auto-action"' in row.content.decode()


def test_the_fragment_keeps_the_pages_visibility_rules(queue, submitter, viewer, outsider):
    assert _get(submitter, f"/actions/{queue['foreign'].pk}/fragment/").status_code == 404
    assert _get(outsider, f"/actions/{queue['manual'].pk}/fragment/").status_code == 403
    html = _get(viewer, f"/actions/{queue['manual'].pk}/fragment/").content.decode()
    assert 'data-testid="approve"' not in html, "no decision buttons for a viewer"
    assert _get(viewer, "/actions/999999/fragment/").status_code == 404


def test_operator_tools_are_for_operators_only(queue, operator, viewer, submitter):
    html = _get(operator, "/actions/").content.decode()
    assert 'data-testid="defrag-form"' in html and 'data-testid="policy"' in html
    assert 'data-policy-kind="placement"' in html
    for user in (viewer, submitter):
        html = _get(user, "/actions/").content.decode()
        assert 'data-testid="defrag-form"' not in html and 'data-testid="policy"' not in html
        assert 'data-testid="approve"' not in html


def test_the_costly_approval_threshold_reaches_the_page(queue, operator, settings):
    settings.RACKWISE_CONFIRM_GPU_HOURS = 12.5
    assert 'data-confirm-gpu-hours="12.5"' in _get(operator, "/actions/").content.decode()


def test_a_kind_filter_the_page_does_not_know_is_a_400(queue, operator):
    response = _get(operator, "/actions/?kind=teleport")
    assert response.status_code == 400 and "teleport" in response.content.decode()


def test_a_card_names_its_jobs_and_withholds_other_tenants_names(queue, operator, submitter, other_submitter):
    """Action cards listed jobs as bare ids (#28 item 8)."""
    mixed = action_services.propose(
        kind=ActionKind.MIGRATION,
        title="mixed",
        jobs=[
            *queue["manual"].jobs.values_list("pk", flat=True),
            *queue["foreign"].jobs.values_list("pk", flat=True),
        ],
        steps=[
            {"op": "start", "job": j.pk} for j in [*queue["manual"].jobs.all(), *queue["foreign"].jobs.all()]
        ],
    )
    llm, vision = queue["manual"].jobs.get(), queue["foreign"].jobs.get()

    html = _get(operator, f"/actions/{mixed.pk}/fragment/").content.decode()
    assert f">#{llm.pk} llm-job</a>" in html and f">#{vision.pk} vision-secret</a>" in html
    html = _get(submitter, f"/actions/{mixed.pk}/fragment/").content.decode()
    assert f">#{llm.pk} llm-job</a>" in html and f">#{vision.pk}</a>" in html and "vision-secret" not in html
