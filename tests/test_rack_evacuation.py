"""Long gangs on a rack whose NVLink fabric turns degraded are proposed a move
to healthy racks (issue #31): one proposal per gang, waiting for an operator;
carried out, the gang runs elsewhere; a gang ending soon stays; the proposals
go when the fabric is healthy again; a rejected one leaves the job running."""

from __future__ import annotations

import pytest

from fleet.choices import ActionKind, ActionState, JobState, NodeState
from fleet.models import Action, Job, Node
from fleet.services.actions.propose import approve
from fleet.services.decisions.evacuation import propose_evacuations
from fleet.services.jobs.allocations import apply_placement, start_job
from fleet.services.jobs.submit import JobSpec, submit_job
from fleet.services.nodes.moves import drain_node
from tests.signals_support import send_beat
from tests.support import carry_out, nodes_of

pytestmark = pytest.mark.django_db


def _run(submitter, rack, name: str, slots: range, duration_s: int) -> Job:
    job = submit_job(
        submitter,
        JobSpec(
            name=name, tenant="llm", num_nodes=len(slots), gpus_per_node=4, expected_duration_s=duration_s
        ),
    )
    nodes = Node.objects.filter(rack=rack).order_by("slot")[slots.start : slots.stop]
    apply_placement(None, job.pk, {n.pk: [0, 1, 2, 3] for n in nodes}, reason="test setup")
    return start_job(None, job.pk)


def _racks(job: Job) -> set[str]:
    return set(Node.objects.filter(pk__in=nodes_of(job.pk)).values_list("rack__name", flat=True))


@pytest.fixture
def degraded(fleet, submitter, django_capture_on_commit_callbacks):
    r1, _ = fleet
    long = _run(submitter, r1, "long", range(0, 8), 10**6)
    short = _run(submitter, r1, "short", range(8, 10), 600)
    with django_capture_on_commit_callbacks(execute=True):
        send_beat("r1-n00", imex="unavailable")
        send_beat("r1-n01", fabric__health_mask=2)
    r1.refresh_from_db()
    assert r1.fabric_degraded
    return long, short


def test_a_long_gang_on_a_degraded_rack_is_proposed_a_move_and_runs_elsewhere(
    degraded, operator_client, viewer_client
):
    long, short = degraded
    [action] = propose_evacuations()
    assert action.kind == ActionKind.EVACUATION and action.state == ActionState.PROPOSED
    assert action.title == f"move job #{long.pk} long off r1 (NVLink fabric degraded) to r2"
    assert [s["op"] for s in action.steps] == ["checkpoint", "stop", "allocate", "start"]
    assert action.cost_gpu_hours > 0
    assert propose_evacuations() == [], "one proposal per gang: it is held by the open one"

    listed = viewer_client.get("/api/actions/", {"state": "proposed"}).json()
    assert [a["id"] for a in listed["results"]] == [action.pk]

    response = operator_client.post(f"/api/actions/{action.pk}/approve/", {}, format="json")
    assert response.status_code == 200, response.content
    carry_out(action.pk)
    long.refresh_from_db()
    assert long.state == JobState.RUNNING and _racks(long) == {"r2"}
    assert _racks(short) == {"r1"}, "the gang ending in 10 minutes stays"


def test_the_proposal_goes_when_the_fabric_is_healthy_again(degraded, django_capture_on_commit_callbacks):
    [action] = propose_evacuations()
    with django_capture_on_commit_callbacks(execute=True):
        send_beat("r1-n00")
        send_beat("r1-n01")
    assert propose_evacuations() == []
    action.refresh_from_db()
    assert action.state == ActionState.EXPIRED
    assert "the NVLink fabric of r1 is healthy again" in action.error


def test_a_rejected_move_leaves_the_gang_running_where_it_is(degraded, operator_client):
    long, _ = degraded
    [action] = propose_evacuations()
    response = operator_client.post(
        f"/api/actions/{action.pk}/reject/", {"note": "ends tonight"}, format="json"
    )
    assert response.status_code == 200, response.content
    long.refresh_from_db()
    assert long.state == JobState.RUNNING and _racks(long) == {"r1"}


def test_one_node_work_on_a_degraded_rack_is_not_moved(fleet, submitter, django_capture_on_commit_callbacks):
    r1, _ = fleet
    _run(submitter, r1, "one", range(0, 1), 10**6)
    with django_capture_on_commit_callbacks(execute=True):
        send_beat("r1-n00", imex="unavailable")
        send_beat("r1-n01", imex="unavailable")
    assert propose_evacuations() == []
    assert not Action.objects.filter(kind=ActionKind.EVACUATION).exists()


def test_a_long_job_on_a_node_a_rule_drains_is_proposed_a_swap_and_an_operators_drain_is_not(
    fleet, submitter, operator, default_health_rules, django_capture_on_commit_callbacks
):
    r1, _ = fleet
    long = _run(submitter, r1, "long", range(0, 4), 10**6)
    drain_node(operator, Node.objects.get(hostname="r1-n03").pk, reason="maintenance")
    assert propose_evacuations() == [], "an operator's drain lets jobs finish"
    with django_capture_on_commit_callbacks(execute=True):
        send_beat("r1-n00", remapped_rows__pending=True)
    [action] = propose_evacuations()
    assert action.title == f"move job #{long.pk} long off r1-n00 (drained by a health rule) to r1"
    approve(operator, action.pk)
    with django_capture_on_commit_callbacks(execute=True):
        carry_out(action.pk)
    long.refresh_from_db()
    hosts = set(Node.objects.filter(pk__in=nodes_of(long.pk)).values_list("hostname", flat=True))
    assert long.state == JobState.RUNNING and len(hosts) == 4
    assert not hosts & {"r1-n00", "r1-n03"}, "a restart leaves every node that takes no new work"
    assert set(Node.objects.filter(hostname__in=["r1-n00", "r1-n03"]).values_list("state", flat=True)) == {
        NodeState.DRAINED
    }, "left idle, both drains settle"
