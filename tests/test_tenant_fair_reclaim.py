"""A shared fleet's fair share, enforced: a tenant that borrows the whole idle
fleet gives back, rack by rack, what another tenant's fair share owes it, even
when that tenant asks for more than its nominal quota (services and the
scheduling pass, steps carried out in-process)."""

from __future__ import annotations

import pytest

from fleet.choices import ActionKind, ActionState, JobState
from fleet.models import Action, Job, Node
from fleet.services.decisions.scheduling import schedule_pass
from fleet.services.jobs import submit as job_services
from fleet.services.tenants import quotas
from tests.support import carry_out, nodes_of, pass_carried_out

pytestmark = pytest.mark.django_db


def _submit(user, tenant: str, name: str, nodes: int, **kw) -> Job:
    spec = job_services.JobSpec(name=name, tenant=tenant, num_nodes=nodes, gpus_per_node=4, **kw)
    return job_services.submit_job(user, spec)


@pytest.fixture
def borrowed(fleet, operator, submitter, other_submitter) -> list[Job]:
    """llm and vision, 32 nominal GPUs each of the fleet's 128 (the other 64 are
    nobody's); vision borrows the whole idle fleet with eight 4-node jobs."""
    quotas.set_quotas(operator, "llm", [{"gpus_per_node": 4, "nominal_gpus": 32}])
    quotas.set_quotas(operator, "vision", [{"gpus_per_node": 4, "nominal_gpus": 32}])
    jobs = [_submit(other_submitter, "vision", f"v{i}", 4) for i in range(8)]
    pass_carried_out()
    assert {Job.objects.get(pk=j.pk).state for j in jobs} == {JobState.RUNNING}
    return jobs


def _preempted(action: Action) -> list[int]:
    return [s["job"] for s in action.steps if s["op"] == "preempt"]


def test_a_gang_beyond_its_nominal_quota_but_within_its_fair_share_reclaims_one_rack(
    borrowed, submitter, other_submitter
):
    # llm's 64 GPUs borrow 32 beyond its quota; the cohort lends nothing (vision
    # holds it all). Equal weights: llm's fair share is its 32 plus half the 64
    # nobody's, so 64; vision's the same, and it holds 128.
    gang = _submit(submitter, "llm", "gang", 16, locality="required")
    schedule_pass()
    action = Action.objects.get(kind=ActionKind.RECLAIM)
    assert action.state == ActionState.APPROVED
    assert "reclaims GPUs held above their fair share" in action.title
    victims = _preempted(action)
    assert len(victims) == 4, "half of vision's work: what it holds above its fair share, no more"
    assert len({n.rack_id for v in victims for n in _nodes(v)}) == 1, "one rack"

    carry_out(action.pk)
    gang.refresh_from_db()
    assert gang.state == JobState.RUNNING and len({n.rack_id for n in _nodes(gang.pk)}) == 1
    running = Job.objects.filter(tenant__name="vision", state=JobState.RUNNING).count()
    assert running == 4, "vision keeps its fair share (64 GPUs)"

    # Beyond its fair share, llm waits on its quota and nothing more is taken.
    more = _submit(submitter, "llm", "more", 4)
    schedule_pass()
    more.refresh_from_db()
    assert more.state == JobState.PENDING and more.state_reason.startswith("quota: llm holds 64 of 32")
    assert Action.objects.filter(kind=ActionKind.RECLAIM).count() == 1


def test_the_fair_share_follows_the_weights(borrowed, operator, submitter):
    # vision weighs 3: llm's fair share is 32 + 64/4 = 48 GPUs.
    quotas.set_share(operator, "vision", weight=3)
    too_big = _submit(submitter, "llm", "too-big", 16, locality="required")
    schedule_pass()
    assert not Action.objects.filter(kind=ActionKind.RECLAIM).exists()
    too_big.refresh_from_db()
    assert too_big.state == JobState.PENDING and too_big.state_reason.startswith("quota: ")

    fits = _submit(submitter, "llm", "fits", 12, locality="required")
    schedule_pass()
    action = Action.objects.get(kind=ActionKind.RECLAIM)
    assert fits.pk in set(action.jobs.values_list("pk", flat=True))
    assert len(_preempted(action)) == 3, "12 nodes: three of vision's 4-node jobs, in one rack"


def _nodes(job_id: int) -> list[Node]:
    return list(Node.objects.filter(pk__in=nodes_of(job_id)))
