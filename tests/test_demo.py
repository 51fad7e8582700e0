"""Demo mode: the workload generator, failures and repairs that keep the demo
fleet alive."""

from __future__ import annotations

import random
from datetime import timedelta

from django.core.management import call_command
from django.utils import timezone

from fleet.choices import JobState, NodeState
from fleet.models import Job, Node
from fleet.services.intake import demo
from fleet.services.jobs.allocations import apply_placement, start_job
from fleet.services.nodes.moves import mark_node_failed


def test_a_tick_submits_a_mix_of_jobs_for_the_demo_tenants(db):
    call_command("seed_demo", stdout=open("/dev/null", "w"))
    demo.tick(random.Random(3))
    jobs = list(Job.objects.all())
    assert jobs, "an idle fleet gets work"
    assert {j.tenant.name for j in jobs} <= {"llm", "vision"}
    assert all(j.state == JobState.PENDING and j.expected_duration_s for j in jobs)


def test_a_busy_fleet_gets_no_more_work(db):
    call_command("seed_demo", stdout=open("/dev/null", "w"))
    rng = random.Random(1)
    for _ in range(200):
        demo.tick(rng)
    asked = sum(Job.objects.filter(state=JobState.PENDING).values_list("num_gpus", flat=True))
    before = Job.objects.count()
    demo.tick(rng)
    assert asked >= 0.8 * 576
    assert Job.objects.count() == before


def test_a_node_running_a_job_fails_now_and_then_and_failed_nodes_come_back(db):
    call_command("seed_demo", stdout=open("/dev/null", "w"))
    demo.tick(random.Random(5))
    job = Job.objects.filter(num_nodes__isnull=False).first() or Job.objects.first()
    node = Node.objects.order_by("id").first()
    apply_placement(
        None, job.pk, {node.pk: list(range(job.num_gpus if not job.num_nodes else 4))[:4]}, reason="t"
    )
    start_job(None, job.pk)

    demo.tick(random.Random(0), failures_per_minute=10**6)  # a failure this tick, surely
    node.refresh_from_db()
    assert node.state == NodeState.FAILED and "XID 79" in node.state_reason

    other = Node.objects.exclude(pk=node.pk).order_by("id").first()
    mark_node_failed(None, other.pk, "old failure")
    Node.objects.filter(pk=other.pk).update(
        state_changed_at=timezone.now() - demo.REPAIR_AFTER - timedelta(seconds=1)
    )
    demo.tick(random.Random(0))
    other.refresh_from_db()
    assert other.state == NodeState.HEALTHY
