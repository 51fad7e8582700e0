"""The Slurm adapter driven by Rackwise's own services (scheduling pass, action
execution, recovery, the Slurm sync and cluster_sync.sync_jobs), with
RACKWISE_CLUSTER=slurm, against the real test cluster. Celery is not used: the
test calls what the tasks would call. (The end-to-end tests through the API
and workers are the integration's.)"""

from __future__ import annotations

import io
import time

import pytest
from django.core.management import call_command

from fleet.choices import ActionState, JobState, NodeState
from fleet.models import Action, Allocation, Job, Node, Tenant
from fleet.services import actions as action_services
from fleet.services import cluster_sync, recovery, scheduling, slurm_sync
from fleet.services import jobs as job_services

pytestmark = pytest.mark.django_db

TRAIN = "#!/bin/bash\ntrap 'echo checkpoint' USR1\nwhile true; do sleep 5 & wait $!; done\n"


@pytest.fixture
def slurm(slurm_cluster, settings, operator):
    slurm_cluster.reset()
    settings.RACKWISE_CLUSTER = "slurm"
    settings.RACKWISE_SLURM_BIN = str(slurm_cluster.bin)
    settings.RACKWISE_SLURM_PARTITION = slurm_cluster.partition
    settings.RACKWISE_SLURM_JOBS_DIR = str(slurm_cluster.jobs_dir)
    settings.RACKWISE_SLURM_JOBS_DIR_IN_CLUSTER = slurm_cluster.jobs_dir_in_cluster
    settings.RACKWISE_SLURM_CHECKPOINT_GRACE_S = 0.2
    Tenant.objects.get_or_create(name="llm")
    call_command("import_topology", "--from", "slurm-live", stdout=io.StringIO())
    return slurm_cluster


def run_action(action_id: int, timeout: float = 30) -> Action:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = action_services.execute_next_step(action_id)
        action = Action.objects.get(pk=action_id)
        if action.state not in (ActionState.APPROVED, ActionState.EXECUTING):
            return action
        if not result.more:
            time.sleep(0.2)
    raise AssertionError(f"action #{action_id} still {action.state}: {action.log[-1:]}")


def slurm_hosts(cluster, job_id: str) -> list[str]:
    job = cluster.job(job_id)
    assert job["job_state"] == ["RUNNING"], job["job_state"]
    return cluster.run("scontrol", "show", "hostnames", job["nodes"]).stdout.split()


def test_submit_place_run_fail_swap_and_end_in_slurm(slurm, operator):
    from fleet.cluster.base import get_adapter

    job = job_services.submit_job(
        operator,
        job_services.JobSpec(name="train", tenant="llm", num_nodes=8, gpus_per_node=4, slurm={"script": TRAIN}),
    )

    # 1. The scheduling pass places it (allocate inline); the start step submits and releases it.
    scheduling.schedule_pass()
    action = Action.objects.get(jobs=job)
    assert run_action(action.pk).state == ActionState.SUCCEEDED
    job.refresh_from_db()
    assert job.state == JobState.RUNNING and job.external_id
    chosen = sorted(job.placement["nodes"])
    assert slurm_hosts(slurm, job.external_id) == chosen
    assert len({h[:3] for h in chosen}) == 1  # one block

    # 2. A node goes DOWN in Slurm: the sync fails it, recovery swaps a spare of the same rack.
    failed = chosen[3]
    slurm.run("scontrol", "update", f"NodeName={failed}", "State=DOWN", "Reason=test: XID 79")
    adapter = get_adapter()
    assert slurm_sync.sync(adapter)["nodes"]["fail"] == [failed]
    job.refresh_from_db()
    assert job.state == JobState.RECOVERING
    t0 = time.monotonic()
    plan = recovery.plan_recovery(job.pk)
    assert plan is not None and plan.kind == "recovery"
    assert run_action(plan.pk).state == ActionState.SUCCEEDED
    took = time.monotonic() - t0
    job.refresh_from_db()
    now = sorted(job.placement["nodes"])
    assert failed not in now and len(set(now) - set(chosen)) == 1
    spare = (set(now) - set(chosen)).pop()
    assert spare[:3] == failed[:3]  # same rack
    assert slurm_hosts(slurm, job.external_id) == now
    assert Node.objects.get(hostname=failed).state == NodeState.FAILED
    print(f"\nrecovery action (plan + swap + restart): {took:.2f} s, {failed} -> {spare}")

    # 3. It ends in Slurm: the sync ends it in Rackwise and frees its GPUs.
    slurm.run("scancel", job.external_id)
    slurm.wait_job_state(job.external_id, "CANCELLED")
    result = cluster_sync.sync_jobs(adapter)
    assert result["cancelled"] == [job.pk]
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED
    assert not Allocation.objects.filter(job=job, released_at__isnull=True).exists()


def test_a_drain_in_rackwise_is_a_drain_in_slurm(slurm, operator):
    from fleet.services import nodes as node_services

    node = Node.objects.get(hostname="r02n03")
    node_services.drain_node(operator, node.pk, "bad cable")
    slurm_node = next(n for n in slurm.json("scontrol", "show", "nodes")["nodes"] if n["name"] == "r02n03")
    assert "DRAIN" in slurm_node["state"] and slurm_node["reason"] == "rackwise: bad cable"
    node_services.undrain_node(operator, node.pk, "fixed")
    slurm_node = next(n for n in slurm.json("scontrol", "show", "nodes")["nodes"] if n["name"] == "r02n03")
    assert "DRAIN" not in slurm_node["state"]


def test_an_adopted_job_is_placed_by_rackwise_and_released(slurm):
    (slurm.jobs_dir / "user.sh").write_text(TRAIN)
    inside = slurm.jobs_dir_in_cluster
    sid = slurm.run(
        "sbatch", "--parsable", "--hold", "-N", "4", "--gres=gpu:4", "--exclusive", f"--partition={slurm.partition}",
        f"--chdir={inside}", f"--output={inside}/user-%j.out", f"{inside}/user.sh",
    ).stdout.strip()  # fmt: skip
    from fleet.cluster.base import get_adapter

    [job_id] = slurm_sync.adopt_held_jobs(get_adapter())
    scheduling.schedule_pass()
    job = Job.objects.get(pk=job_id)
    assert job.state == JobState.PLACED
    assert run_action(Action.objects.get(jobs=job).pk).state == ActionState.SUCCEEDED
    job.refresh_from_db()
    assert job.external_id == sid and job.state == JobState.RUNNING
    assert slurm_hosts(slurm, sid) == sorted(job.placement["nodes"])


def test_slurmctld_down_mid_action_is_retried_and_nothing_is_lost(slurm, operator):
    job = job_services.submit_job(
        operator,
        job_services.JobSpec(name="train", tenant="llm", num_nodes=2, gpus_per_node=4, slurm={"script": TRAIN}),
    )
    scheduling.schedule_pass()
    action = Action.objects.get(jobs=job)
    slurm.stop_slurmctld()
    try:
        result = action_services.execute_next_step(action.pk)
    finally:
        slurm.start_slurmctld()
    action.refresh_from_db()
    assert action.state == ActionState.EXECUTING and action.step_index == 1
    assert result.retry_in and "slurmctld unreachable" in action.log[-1]["message"]
    job.refresh_from_db()
    assert job.state == JobState.PLACED and not job.external_id  # nothing marked done that Slurm did not do
    assert run_action(action.pk).state == ActionState.SUCCEEDED
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    assert slurm_hosts(slurm, job.external_id) == sorted(job.placement["nodes"])
    mine = [j for j in slurm.json("squeue")["jobs"] if j["comment"].startswith(f"rackwise:{job.pk}:")]
    assert len(mine) == 1

