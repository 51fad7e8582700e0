"""A shared fleet: quotas set by operators, admission before placement, and a
reclaim that takes back borrowed GPUs from one rack for a tenant under its
quota (services and the scheduling pass, steps carried out in-process)."""

from __future__ import annotations

import pytest

from fleet.choices import ActionKind, ActionState, JobState
from fleet.models import Action, AuditEvent, Job, Node, Quota
from fleet.services.decisions.scheduling import schedule_pass
from fleet.services.errors import Conflict, InvalidInput, NotAllowed
from fleet.services.jobs import submit as job_services
from fleet.services.tenants import quotas
from tests.support import carry_out, nodes_of, pass_carried_out

pytestmark = pytest.mark.django_db


def _submit(user, tenant: str, name: str, nodes: int, **kw) -> Job:
    spec = job_services.JobSpec(name=name, tenant=tenant, num_nodes=nodes, gpus_per_node=4, **kw)
    return job_services.submit_job(user, spec)


@pytest.fixture
def shared(fleet, operator, submitter, other_submitter):
    """llm and vision, 64 GPUs each of the fleet's 128 (2 racks x 16 nodes x 4, spares left out)."""
    quotas.set_quotas(operator, "llm", [{"gpus_per_node": 4, "nominal_gpus": 64}])
    quotas.set_quotas(operator, "vision", [{"gpus_per_node": 4, "nominal_gpus": 64}])
    return fleet


def test_only_operators_set_quotas_and_every_figure_is_bounded_by_the_fleet(
    fleet, operator, submitter, viewer
):
    with pytest.raises(NotAllowed):
        quotas.set_quotas(submitter, "llm", [{"gpus_per_node": 4, "nominal_gpus": 8}])
    with pytest.raises(NotAllowed):
        quotas.set_quotas(viewer, "llm", [{"gpus_per_node": 4, "nominal_gpus": 8}])
    with pytest.raises(InvalidInput) as bad:
        quotas.set_quotas(
            operator,
            "llm",
            [{"gpus_per_node": 8, "nominal_gpus": 8}, {"gpus_per_node": 4, "nominal_gpus": 129}],
        )
    assert bad.value.errors == {
        "quotas[0].gpus_per_node": ["the fleet has no 8-GPU nodes; its shapes: 4"],
        "quotas[1].nominal_gpus": [
            "129 GPUs is more than the fleet's 128 GPUs on 4-GPU nodes (spare nodes not counted)"
        ],
    }
    with pytest.raises(InvalidInput, match="no tenant 'nobody'"):
        quotas.set_quotas(operator, "nobody", [])
    quotas.set_quotas(operator, "llm", [{"gpus_per_node": 4, "nominal_gpus": 64, "borrowing_limit_gpus": 32}])
    event = AuditEvent.objects.get(action="tenant.quota")
    assert event.after == {"4": {"nominal_gpus": 64, "borrowing_limit_gpus": 32, "lending_limit_gpus": None}}
    assert event.message == "llm: 64 GPUs on 4-GPU nodes (borrows at most 32)"


def test_nominal_quotas_together_never_promise_more_than_the_fleet_has(
    fleet, operator, submitter, other_submitter
):
    """Nominal quotas are guarantees: 64 + 65 of 128 GPUs is refused (409) and
    changes nothing; a change that does not raise an over-promise (a quota
    lowered after the fleet shrank) goes through."""
    quotas.set_quotas(operator, "vision", [{"gpus_per_node": 4, "nominal_gpus": 64}])
    with pytest.raises(Conflict) as over:
        quotas.set_quotas(operator, "llm", [{"gpus_per_node": 4, "nominal_gpus": 65}])
    assert str(over.value) == (
        "llm's nominal quota of 65 GPUs on 4-GPU nodes would promise 129 GPUs of the fleet's 128 "
        "(spare nodes not counted; other tenants' nominal quotas hold 64): give at most 64, or lower "
        "another tenant's nominal quota first"
    )
    assert not Quota.objects.filter(tenant__name="llm").exists()
    assert AuditEvent.objects.filter(action="tenant.quota").count() == 1
    quotas.set_quotas(operator, "llm", [{"gpus_per_node": 4, "nominal_gpus": 64, "borrowing_limit_gpus": 8}])
    # Over-promised already (as a fleet that lost racks leaves it): llm may not
    # raise its quota, but may lower it.
    Quota.objects.filter(tenant__name="vision").update(nominal_gpus=100)
    with pytest.raises(Conflict):
        quotas.set_quotas(operator, "llm", [{"gpus_per_node": 4, "nominal_gpus": 65}])
    quotas.set_quotas(operator, "llm", [{"gpus_per_node": 4, "nominal_gpus": 40}])
    assert Quota.objects.get(tenant__name="llm").nominal_gpus == 40


def test_a_job_beyond_its_tenants_quota_and_borrowing_limit_waits_with_the_numbers(
    fleet, operator, submitter
):
    quotas.set_quotas(operator, "llm", [{"gpus_per_node": 4, "nominal_gpus": 32, "borrowing_limit_gpus": 16}])
    first = _submit(submitter, "llm", "first", 8)
    second = _submit(submitter, "llm", "second", 8)
    pass_carried_out()
    first.refresh_from_db()
    second.refresh_from_db()
    assert first.state == JobState.RUNNING
    assert second.state == JobState.PENDING
    assert second.state_reason == (
        "quota: llm holds 32 of 32 nominal GPUs and may borrow 16: this job's 32 GPUs would borrow 32"
    )


def test_a_tenant_under_its_quota_reclaims_one_rack_of_borrowed_work_for_its_gang(
    shared, operator, submitter, other_submitter
):
    # vision borrows the whole idle fleet: eight 4-node jobs, four in each rack.
    borrowed = [_submit(other_submitter, "vision", f"v{i}", 4) for i in range(8)]
    pass_carried_out()
    assert {Job.objects.get(pk=j.pk).state for j in borrowed} == {JobState.RUNNING}

    gang = _submit(submitter, "llm", "gang", 16, locality="required")
    schedule_pass()
    action = Action.objects.get(kind=ActionKind.RECLAIM)
    assert action.state == ActionState.APPROVED, "a reclaim under the cost threshold runs without an operator"
    victims = [s["job"] for s in action.steps if s["op"] == "preempt"]
    assert len(victims) == 4, "one rack's worth: no more than needed"
    racks = {n.rack_id for v in victims for n in _nodes(v)}
    assert len(racks) == 1
    assert action.steps[0]["op"] == "checkpoint", "the victims are told to checkpoint before they stop"

    carry_out(action.pk)
    gang.refresh_from_db()
    assert gang.state == JobState.RUNNING
    assert {n.rack_id for n in _nodes(gang.pk)} == racks, "the gang runs rack-local, in the rack reclaimed"
    for v in Job.objects.filter(pk__in=victims):
        assert v.state == JobState.PENDING
        assert (
            v.state_reason == f"preempted by action #{action.pk} (reclaim) to start job #{gang.pk} gang (llm)"
        )

    # Back in the queue, vision's stopped jobs wait on the quota, saying why.
    schedule_pass()
    for v in Job.objects.filter(pk__in=victims):
        assert v.state == JobState.PENDING
        assert v.state_reason.startswith(
            "quota: vision holds 64 of 64 nominal GPUs; the cohort has 0 GPUs to lend"
        )


def test_a_reclaim_never_takes_from_a_tenant_within_its_nominal_quota(shared, submitter, other_submitter):
    # Both tenants hold their nominal 64 GPUs: llm's next job would borrow, and
    # the cohort has nothing to lend; vision is within its quota, so nothing is reclaimed.
    held = [_submit(other_submitter, "vision", f"v{i}", 4) for i in range(4)]
    mine = [_submit(submitter, "llm", f"l{i}", 4) for i in range(4)]
    pass_carried_out()
    assert {Job.objects.get(pk=j.pk).state for j in held + mine} == {JobState.RUNNING}
    late = _submit(submitter, "llm", "late", 4)
    schedule_pass()
    late.refresh_from_db()
    assert late.state == JobState.PENDING and late.state_reason.startswith("quota: llm holds 64 of 64")
    assert not Action.objects.filter(kind=ActionKind.RECLAIM).exists()


def test_without_quotas_nothing_changes_and_nothing_is_preempted(fleet, submitter, other_submitter):
    jobs = [_submit(other_submitter, "vision", f"v{i}", 4) for i in range(8)]
    pass_carried_out()
    gang = _submit(submitter, "llm", "gang", 16, priority=5)
    schedule_pass()
    gang.refresh_from_db()
    assert gang.state == JobState.PENDING and not gang.state_reason.startswith("quota")
    assert not Action.objects.filter(kind=ActionKind.RECLAIM).exists()
    assert {Job.objects.get(pk=j.pk).state for j in jobs} == {JobState.RUNNING}


def _nodes(job_id: int) -> list[Node]:
    return list(Node.objects.filter(pk__in=nodes_of(job_id)))


def test_without_quotas_a_higher_priority_stops_only_its_own_tenants_lower_priority_preemptible_jobs(
    fleet, submitter, other_submitter
):
    # The fleet full: llm's preemptible and non-preemptible 4-node jobs, and vision's.
    cheap = [_submit(submitter, "llm", f"cheap{i}", 4, preemptible=True) for i in range(4)]
    kept = [_submit(submitter, "llm", f"kept{i}", 4, preemptible=False) for i in range(2)]
    theirs = [_submit(other_submitter, "vision", f"v{i}", 4, preemptible=True) for i in range(2)]
    pass_carried_out()
    everyone = cheap + kept + theirs
    assert {Job.objects.get(pk=j.pk).state for j in everyone} == {JobState.RUNNING}

    urgent = _submit(submitter, "llm", "urgent", 16, locality="required", priority=5)
    schedule_pass()
    action = Action.objects.get(kind=ActionKind.RECLAIM)
    victims = {s["job"] for s in action.steps if s["op"] == "preempt"}
    assert victims <= {j.pk for j in cheap}, "only llm's own preemptible, lower-priority jobs"
    carry_out(action.pk)
    urgent.refresh_from_db()
    assert urgent.state == JobState.RUNNING and len({n.rack_id for n in _nodes(urgent.pk)}) == 1
    assert {Job.objects.get(pk=j.pk).state for j in kept + theirs} == {JobState.RUNNING}

    # An equal priority preempts nothing.
    same = _submit(submitter, "llm", "same", 16, locality="required", priority=0)
    schedule_pass()
    assert Action.objects.filter(kind=ActionKind.RECLAIM).count() == 1
    same.refresh_from_db()
    assert same.state == JobState.PENDING


def test_a_borrowers_job_that_straddles_its_nominal_line_is_reclaimed_when_nothing_smaller_makes_room(
    fleet, operator, submitter, other_submitter
):
    # vision may keep 48 GPUs and runs one 16-node job (64 GPUs): it borrows 16,
    # all in that one job. llm, within its 80, holds one rack with 16 nodes.
    quotas.set_quotas(operator, "vision", [{"gpus_per_node": 4, "nominal_gpus": 48}])
    quotas.set_quotas(operator, "llm", [{"gpus_per_node": 4, "nominal_gpus": 80}])
    big = _submit(other_submitter, "vision", "big", 16, locality="required")
    mine = _submit(submitter, "llm", "mine", 16, locality="required")
    pass_carried_out()
    assert {Job.objects.get(pk=j.pk).state for j in (big, mine)} == {JobState.RUNNING}

    # llm's next 4 nodes keep it within its quota: vision's borrowed job goes,
    # though stopping it takes vision below its nominal 48 (it was above when stopped).
    more = _submit(submitter, "llm", "more", 4, locality="required")
    schedule_pass()
    action = Action.objects.get(kind=ActionKind.RECLAIM)
    assert [s["job"] for s in action.steps if s["op"] == "preempt"] == [big.pk]
    carry_out(action.pk)
    more.refresh_from_db()
    assert more.state == JobState.RUNNING
