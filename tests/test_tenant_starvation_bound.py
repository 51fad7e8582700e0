"""The starvation bound in the service's admission (issue #30): fair share
admits the tenant with the least recent usage first, until a job of another
tenant has waited as long as it will run (and at least the floor), or, with a
cap set, that long whatever its run: then it is admitted first, whatever the shares
(placement.quota.overdue)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from fleet.models import Allocation, Job
from fleet.services.decisions.admission import admit
from fleet.services.jobs import submit as job_services
from fleet.services.tenants import quotas
from placement.quota import overdue

pytestmark = pytest.mark.django_db


def _submit(user, tenant: str, name: str, nodes: int, **kw) -> Job:
    spec = job_services.JobSpec(name=name, tenant=tenant, num_nodes=nodes, gpus_per_node=4, **kw)
    return job_services.submit_job(user, spec)


@pytest.fixture
def contended(fleet, operator, submitter, other_submitter):
    """llm and vision, 32 nominal GPUs each of 128; llm used a rack for the last
    two hours, vision nothing; each asks for 96 GPUs: the pool holds one of them."""
    from fleet.models import Node
    from fleet.services.jobs.allocations import apply_placement, start_job

    quotas.set_quotas(operator, "llm", [{"gpus_per_node": 4, "nominal_gpus": 32}])
    quotas.set_quotas(operator, "vision", [{"gpus_per_node": 4, "nominal_gpus": 32}])
    used = _submit(submitter, "llm", "used", 1)
    apply_placement(None, used.pk, {Node.objects.get(hostname="r1-n00").pk: [0, 1, 2, 3]}, reason="test")
    start_job(None, used.pk)
    Allocation.objects.filter(job=used).update(created_at=timezone.now() - timedelta(hours=2))
    mine = _submit(submitter, "llm", "mine", 24, expected_duration_s=3600, locality="preferred")
    theirs = _submit(other_submitter, "vision", "theirs", 24, expected_duration_s=3600, locality="preferred")
    return mine, theirs


def _admitted(*jobs: Job) -> list[str]:
    out = admit([Job.objects.select_related("tenant").get(pk=j.pk) for j in jobs], set())
    return [j.name for j in out.jobs]


def test_fair_share_admits_the_tenant_with_less_recent_usage(contended):
    mine, theirs = contended
    assert _admitted(mine, theirs) == ["theirs"]


def test_a_job_within_its_tenants_fair_share_is_admitted_ahead_of_one_beyond_it(contended, submitter):
    """llm used more lately, but its 8-node job keeps it within its fair share
    of the 128 GPUs (36 of 36: 32 nominal, 4 of the leftover it asks for) while
    vision's 24-node job would take vision past its own (96 > 92): llm's goes first,
    and the cohort cannot lend to both."""
    _, theirs = contended
    small = _submit(submitter, "llm", "small", 8, expected_duration_s=3600, locality="preferred")
    assert _admitted(small, theirs) == ["small"]


def test_a_job_that_waited_as_long_as_it_runs_is_admitted_ahead_of_fair_share(contended, settings):
    mine, theirs = contended
    Job.objects.filter(pk=mine.pk).update(submitted_at=timezone.now() - timedelta(minutes=61))
    assert _admitted(mine, theirs) == ["mine"]
    settings.RACKWISE_OVERDUE_SLOWDOWN = 0  # the bound off: fair share again
    assert _admitted(mine, theirs) == ["theirs"]


def test_a_short_job_is_not_overdue_before_the_floor():
    # A 5-minute job that waited 30 minutes: (30 + 5) / max(5, 60) < 2.
    assert not overdue(1800, 300, slowdown=2.0, floor_s=3600)
    assert overdue(7200 - 300, 300, slowdown=2.0, floor_s=3600)
    assert not overdue(10**9, 300, slowdown=None, floor_s=3600)


def test_a_long_job_is_overdue_after_the_cap_whatever_its_run():
    # A 20-hour job: by slowdown only after 20 hours of waiting; with the 4-hour cap, at 4 hours.
    assert not overdue(4 * 3600, 20 * 3600, slowdown=2.0, floor_s=3600)
    assert not overdue(4 * 3600 - 1, 20 * 3600, slowdown=2.0, floor_s=3600, cap_s=4 * 3600)
    assert overdue(4 * 3600, 20 * 3600, slowdown=2.0, floor_s=3600, cap_s=4 * 3600)
    assert not overdue(10**9, 300, slowdown=None, floor_s=3600, cap_s=4 * 3600), "the bound off: no cap"


def test_the_service_admits_a_long_job_ahead_of_fair_share_once_it_waited_the_cap(contended, settings):
    mine, theirs = contended
    settings.RACKWISE_OVERDUE_CAP_S = 4 * 3600
    Job.objects.filter(pk=mine.pk).update(
        expected_duration_s=20 * 3600, submitted_at=timezone.now() - timedelta(hours=4, minutes=1)
    )
    assert _admitted(mine, theirs) == ["mine"]
    settings.RACKWISE_OVERDUE_CAP_S = 0  # no cap: a 20-hour job is not overdue after 4 hours
    assert _admitted(mine, theirs) == ["theirs"]
