"""Issue #11 end to end: Rackwise driving a real Slurm 24.11 (2 racks x 18
nodes, ``tests/slurm/conftest.py``) through the API, real Celery workers and
the sync pass, with Slurm's own tools as the witness.

The sync pass is called from the test process, as beat would call it every
``RACKWISE_SLURM_SYNC_S``; everything else happens in the workers."""

from __future__ import annotations

import io
import time
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from fleet.choices import ActionKind, ActionState, JobState, NodeState
from fleet.cluster.slurm_cli import is_held
from fleet.models import Action, Allocation, Job, Node, Rack
from fleet.services.execution import cluster_sync
from fleet.tasks import reconcile_once
from tests.support import Worker, consistent_violations, flush_broker, wait_for, workers

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def slurm_fleet(slurm_cluster, settings, operator, submitter):
    """The Rackwise fleet imported live from the test Slurm, with this process
    (and the workers it starts) driving that Slurm."""
    slurm_cluster.reset()
    settings.RACKWISE_CLUSTER = "slurm"
    settings.RACKWISE_SLURM_BIN = slurm_cluster.env["RACKWISE_SLURM_BIN"]
    settings.RACKWISE_SLURM_PARTITION = slurm_cluster.partition
    settings.RACKWISE_SLURM_JOBS_DIR = str(slurm_cluster.jobs_dir)
    settings.RACKWISE_SLURM_JOBS_DIR_IN_CLUSTER = slurm_cluster.jobs_dir_in_cluster
    settings.RACKWISE_SLURM_CHECKPOINT_GRACE_S = 0.0
    call_command("import_topology", "--from", "slurm-live", stdout=io.StringIO())
    assert Node.objects.count() == len(slurm_cluster.nodes)
    return slurm_cluster


def worker_env(cluster) -> dict[str, str]:
    return cluster.env | {"RACKWISE_CLUSTER": "slurm", "RACKWISE_SLURM_CHECKPOINT_GRACE_S": "0"}


def slurm_job(cluster, external_id: str) -> dict:
    return cluster.job(external_id)


def slurm_nodes(cluster, external_id: str) -> set[str]:
    job = slurm_job(cluster, external_id)
    nodes = job.get("nodes") or ""
    return set(cluster.run("scontrol", "show", "hostnames", nodes).stdout.split()) if nodes else set()


def slurm_state(cluster, external_id: str) -> str:
    return slurm_job(cluster, external_id)["job_state"][0]


def rackwise_hostnames(job_id: int) -> set[str]:
    return set(
        Allocation.objects.filter(job_id=job_id, released_at__isnull=True).values_list(
            "gpu__node__hostname", flat=True
        )
    )


def racks_of(hostnames) -> set[str]:
    return set(Node.objects.filter(hostname__in=hostnames).values_list("rack__name", flat=True))


def sync_until(predicate, timeout: float = 40, what: str = "condition"):
    """Run sync passes (as beat would) until ``predicate`` holds."""
    deadline = time.monotonic() + timeout
    while True:
        cluster_sync.sync()
        if result := predicate():
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.3)


def running_in_slurm(cluster, job_id: int):
    job = Job.objects.get(pk=job_id)
    if job.state != JobState.RUNNING or not job.external_id:
        return None
    if slurm_state(cluster, job.external_id) != "RUNNING":
        return None
    return job


def submit(client, nodes: int, script: str, **extra) -> int:
    response = client.post(
        "/api/jobs/",
        {
            "name": f"train-{nodes}n",
            "num_nodes": nodes,
            "gpus_per_node": 4,
            "slurm": {"script": script},
            **extra,
        },
        format="json",
    )
    assert response.status_code == 201, response.content
    return response.json()["id"]


# A long job that saves on the checkpoint signal (USR1) instead of dying of it.
SLEEPER = "#!/bin/bash\ntrap 'echo checkpoint requested' USR1\nsrun hostname\nwhile true; do sleep 1; done\n"


def test_a_submitted_job_runs_on_the_chosen_nodes_in_one_block_and_its_end_frees_the_gpus(
    slurm_fleet, submitter_client
):
    cluster = slurm_fleet
    with workers(1, worker_env(cluster)):
        job_id = submit(submitter_client, 4, "#!/bin/bash\nsrun hostname\nsleep 4\n")
        job = wait_for(lambda: running_in_slurm(cluster, job_id), 40, "the job to run in Slurm")
        chosen = rackwise_hostnames(job_id)
        assert len(chosen) == 4
        assert slurm_nodes(cluster, job.external_id) == chosen
        (rack,) = racks_of(chosen)
        blocks = cluster.run("scontrol", "show", "topology").stdout
        line = next(
            row
            for row in blocks.splitlines()
            if f"BlockName={rack} " in row or row.startswith(f"BlockName={rack}")
        )
        in_block = set(
            cluster.run("scontrol", "show", "hostnames", line.split("Nodes=")[1].split()[0]).stdout.split()
        )
        assert chosen <= in_block
        sync_until(lambda: Job.objects.get(pk=job_id).state == JobState.COMPLETED, 40, "the job to complete")
    assert not Allocation.objects.filter(job_id=job_id, released_at__isnull=True).exists()
    assert consistent_violations() == []


def test_a_job_held_in_slurm_is_adopted_placed_rack_locally_released_and_its_scancel_ends_it(slurm_fleet):
    cluster = slurm_fleet
    out = cluster.run(
        "sbatch",
        "--parsable",
        "--hold",
        "-p",
        cluster.partition,
        "-N",
        "8",
        "--gres=gpu:4",
        "--exclusive",
        "--requeue",
        f"--chdir={cluster.jobs_dir_in_cluster}",
        "--wrap",
        "srun hostname; sleep 600",
    ).stdout.strip()
    slurm_id = out.split(";")[0]
    with workers(1, worker_env(cluster)):
        job = sync_until(
            lambda: Job.objects.filter(external_id=slurm_id).first(), 20, "the held job to be adopted"
        )
        assert (job.num_nodes, job.gpus_per_node) == (8, 4)
        wait_for(lambda: running_in_slurm(cluster, job.pk), 40, "the adopted job to run")
        chosen = rackwise_hostnames(job.pk)
        assert len(chosen) == 8 and len(racks_of(chosen)) == 1
        assert slurm_nodes(cluster, slurm_id) == chosen
        # Its user cancels it in Slurm: the Rackwise job is cancelled and its GPUs freed.
        cluster.run("scancel", slurm_id)
        sync_until(
            lambda: Job.objects.get(pk=job.pk).state == JobState.CANCELLED,
            20,
            "the scancel to reach Rackwise",
        )
    assert rackwise_hostnames(job.pk) == set()
    assert consistent_violations() == []


def test_a_node_down_under_an_8_node_job_is_swapped_for_a_spare_in_its_rack(slurm_fleet, submitter_client):
    cluster = slurm_fleet
    with workers(1, worker_env(cluster)):
        job_id = submit(submitter_client, 8, SLEEPER)
        job = wait_for(lambda: running_in_slurm(cluster, job_id), 40, "the job to run")
        before = rackwise_hostnames(job_id)
        (rack,) = racks_of(before)
        victim = sorted(before)[3]
        cluster.run(
            "scontrol", "update", f"NodeName={victim}", "State=DOWN", "Reason=test: GPU fell off the bus"
        )
        started = time.monotonic()
        sync_until(
            lambda: Action.objects.filter(
                jobs=job_id, kind=ActionKind.RECOVERY, state=ActionState.SUCCEEDED
            ).exists(),
            60,
            "the swap",
        )
        wait_for(lambda: running_in_slurm(cluster, job_id), 30, "the job to run again")
        elapsed = time.monotonic() - started
        after = slurm_nodes(cluster, job.external_id)
        assert victim not in after and len(after) == 8
        assert len(after & before) == 7
        assert racks_of(after) == {rack}
        assert rackwise_hostnames(job_id) == after
        assert Node.objects.get(hostname=victim).state == NodeState.FAILED
        print(f"node DOWN to job running on the spare: {elapsed:.2f} s")
    assert consistent_violations() == []


def _drain_rack(client, rack: str, undo: bool = False) -> None:
    for node in Node.objects.filter(rack__name=rack):
        verb = "undrain" if undo else "drain"
        response = client.post(
            f"/api/nodes/{node.pk}/{verb}/",
            {"reason": "test: steer placement", "confirm": True},
            format="json",
        )
        assert response.status_code == 200, response.content


def test_an_approved_defrag_migration_moves_a_running_slurm_job(
    slurm_fleet, submitter_client, operator_client
):
    cluster = slurm_fleet
    first, second = Rack.objects.order_by("name").values_list("name", flat=True)
    with workers(1, worker_env(cluster)):
        # One 4-node job in each rack, steered there by draining the other rack.
        _drain_rack(operator_client, second)
        a = submit(submitter_client, 4, SLEEPER)
        wait_for(lambda: running_in_slurm(cluster, a), 40, "job a to run")
        _drain_rack(operator_client, second, undo=True)
        _drain_rack(operator_client, first)
        b = submit(submitter_client, 4, SLEEPER)
        wait_for(lambda: running_in_slurm(cluster, b), 40, "job b to run")
        _drain_rack(operator_client, first, undo=True)
        assert racks_of(rackwise_hostnames(a)) == {first} and racks_of(rackwise_hostnames(b)) == {second}

        plan = operator_client.post("/api/actions/defrag/", {"free_racks": 1}, format="json")
        assert plan.status_code in (200, 201), plan.content
        plan = plan.json()
        (moved,) = {
            step["job"] for step in Action.objects.get(pk=plan["id"]).steps if step["op"] == "allocate"
        }
        approve = operator_client.post(f"/api/actions/{plan['id']}/approve/", {}, format="json")
        assert approve.status_code == 200, approve.content
        wait_for(
            lambda: Action.objects.filter(pk=plan["id"], state=ActionState.SUCCEEDED).exists(),
            60,
            "the migration",
        )
        job = wait_for(lambda: running_in_slurm(cluster, moved), 30, "the moved job to run")
        new_nodes = rackwise_hostnames(moved)
        assert slurm_nodes(cluster, job.external_id) == new_nodes
        assert len(racks_of(rackwise_hostnames(a)) | racks_of(rackwise_hostnames(b))) == 1
    assert consistent_violations() == []


def slurm_node(cluster, hostname: str) -> dict:
    (node,) = cluster.json("scontrol", "show", "node", hostname)["nodes"]
    return node


def test_a_drain_in_rackwise_is_a_drain_in_slurm_and_a_drain_in_slurm_shows_in_rackwise(
    slurm_fleet, operator_client
):
    cluster = slurm_fleet
    ours, theirs = Node.objects.order_by("hostname")[:2]
    response = operator_client.post(f"/api/nodes/{ours.pk}/drain/", {"reason": "bad fan"}, format="json")
    assert response.status_code == 200, response.content
    node = slurm_node(cluster, ours.hostname)
    assert "DRAIN" in node["state"] and "bad fan" in node["reason"]

    cluster.run("scontrol", "update", f"NodeName={theirs.hostname}", "State=DRAIN", "Reason=firmware update")
    sync_until(
        lambda: Node.objects.get(pk=theirs.pk).state in (NodeState.DRAINING, NodeState.DRAINED),
        20,
        "the Slurm drain",
    )
    rack = operator_client.get(f"/api/racks/{theirs.rack_id}/").json()
    states = {n["hostname"]: n["state"] for n in rack["nodes"]}
    assert states[theirs.hostname] in ("draining", "drained")

    # And back: undrain in Rackwise resumes it in Slurm; resume in Slurm returns ours.
    operator_client.post(f"/api/nodes/{theirs.pk}/undrain/", {"reason": "done"}, format="json")
    assert "DRAIN" not in slurm_node(cluster, theirs.hostname)["state"]
    cluster.run("scontrol", "update", f"NodeName={ours.hostname}", "State=RESUME")
    sync_until(lambda: Node.objects.get(pk=ours.pk).state == NodeState.HEALTHY, 20, "the Slurm resume")


def test_a_worker_killed_mid_swap_leaves_slurm_and_rackwise_agreeing(slurm_fleet, submitter_client, settings):
    cluster = slurm_fleet
    settings.RACKWISE_STALL_S = 3
    flush_broker()
    worker = Worker(worker_env(cluster)).start()
    try:
        job_id = submit(submitter_client, 8, SLEEPER)
        job = wait_for(lambda: running_in_slurm(cluster, job_id), 40, "the job to run")
        victim = sorted(rackwise_hostnames(job_id))[0]
        cluster.run("scontrol", "update", f"NodeName={victim}", "State=DOWN", "Reason=test")
        # Kill the worker once Slurm has taken the job off its nodes (the swap is under way).
        sync_until(lambda: slurm_state(cluster, job.external_id) == "PENDING", 30, "the swap to start")
        worker.kill()
    finally:
        worker.stop()
    with workers(1, worker_env(cluster)):
        deadline = time.monotonic() + 60
        while not running_in_slurm(cluster, job_id):
            assert time.monotonic() < deadline, "the job did not run again after the worker was replaced"
            cluster_sync.sync()
            reconcile_once(now=timezone.now() + timedelta(seconds=settings.RACKWISE_STALL_S))
            time.sleep(0.5)
    squeue = cluster.json("squeue")["jobs"]
    mine = [j for j in squeue if str(j["job_id"]) == job.external_id or j.get("name") == f"rackwise-{job_id}"]
    assert len(mine) == 1, mine
    assert slurm_nodes(cluster, job.external_id) == rackwise_hostnames(job_id)
    assert victim not in rackwise_hostnames(job_id)
    assert consistent_violations() == []


def test_slurmctld_stopped_mid_action_is_a_clear_error_a_retry_and_nothing_lost(
    slurm_fleet, submitter_client
):
    cluster = slurm_fleet
    with workers(1, worker_env(cluster)):
        cluster.stop_slurmctld()
        try:
            job_id = submit(submitter_client, 4, SLEEPER)

            def retrying():
                action = Action.objects.filter(jobs=job_id, kind=ActionKind.PLACEMENT).first()
                return (
                    action
                    if action and any("cluster unavailable" in e["message"] for e in action.log)
                    else None
                )

            action = wait_for(retrying, 40, "the placement to meet the stopped slurmctld")
            # Put off at the step that submits to Slurm (start); the placement
            # holds its GPUs, and nothing says the job runs.
            assert action.state == ActionState.EXECUTING
            assert action.steps[action.step_index]["op"] == "start"
            entry = next(e for e in action.log if "cluster unavailable" in e["message"])
            assert "retrying in" in entry["message"] and "slurmctld" in entry["message"].lower(), entry
            job = Job.objects.get(pk=job_id)
            assert job.state == JobState.PLACED and job.external_id is None
        finally:
            cluster.start_slurmctld()
        job = wait_for(lambda: running_in_slurm(cluster, job_id), 90, "the retried placement to run the job")
    assert Action.objects.get(pk=action.pk).state == ActionState.SUCCEEDED
    named = [j for j in cluster.json("squeue")["jobs"] if j.get("name") == f"rackwise-{job_id}"]
    assert [str(j["job_id"]) for j in named] == [job.external_id]
    assert slurm_nodes(cluster, job.external_id) == rackwise_hostnames(job_id)
    assert consistent_violations() == []


def _hold_in_slurm(cluster, account: str, nodes: int) -> str:
    """A user's ``sbatch --hold`` under a Slurm account, for Rackwise to adopt."""
    out = cluster.run(
        "sbatch",
        "--parsable",
        "--hold",
        f"--account={account}",
        "-p",
        cluster.partition,
        "-N",
        str(nodes),
        "--gres=gpu:4",
        "--exclusive",
        f"--chdir={cluster.jobs_dir_in_cluster}",
        "--wrap",
        "trap 'echo checkpoint requested' USR1; srun hostname; while true; do sleep 1; done",
    ).stdout.strip()
    return out.split(";")[0]


def test_slurm_accounts_are_tenants_and_a_reclaim_requeues_one_blocks_borrowed_jobs(
    slurm_fleet, operator_client, submitter_client, other_submitter
):
    cluster = slurm_fleet  # other_submitter: the tenant vision exists, as an operator would make it
    half = 16 * 4  # one block's 16 nodes outside its spares
    for tenant in ("llm", "vision"):
        response = operator_client.put(
            f"/api/tenants/{tenant}/quotas/",
            {"quotas": [{"gpus_per_node": 4, "nominal_gpus": half}]},
            format="json",
        )
        assert response.status_code == 200, response.content

    with workers(1, worker_env(cluster)):
        # vision's users sbatch under their account: adopted as vision's jobs,
        # they borrow the whole idle fleet (eight 4-node jobs, four per block).
        slurm_ids = [_hold_in_slurm(cluster, "vision", 4) for _ in range(8)]
        adopted = sync_until(
            lambda: Job.objects.filter(external_id__in=slurm_ids).count() == 8, 30, "the jobs to be adopted"
        )
        assert adopted
        vision_jobs = list(Job.objects.filter(external_id__in=slurm_ids))
        assert {j.tenant.name for j in vision_jobs} == {"vision"}
        sync_until(
            lambda: all(running_in_slurm(cluster, j.pk) for j in vision_jobs), 60, "vision's jobs to run"
        )
        figures = operator_client.get("/api/tenants/vision/").json()["quotas"][0]
        assert (figures["in_use_gpus"], figures["borrowed_gpus"]) == (2 * half, half)

        gang = submit(submitter_client, 16, SLEEPER, tenant="llm", locality="required")
        action = wait_for(
            lambda: Action.objects.filter(kind=ActionKind.RECLAIM, jobs=gang).first(), 30, "a reclaim"
        )
        victims = [s["job"] for s in action.steps if s["op"] == "preempt"]
        assert len(victims) == 4
        victim_hosts = set().union(*(rackwise_hostnames(v) for v in victims))
        (rack,) = racks_of(victim_hosts)
        wait_for(lambda: running_in_slurm(cluster, gang), 60, "the gang to run in Slurm")
        gang_hosts = slurm_nodes(cluster, Job.objects.get(pk=gang).external_id)
        assert len(gang_hosts) == 16 and racks_of(gang_hosts) == {rack}
        # Preemption on Slurm is a requeue: the victims wait, held, in Slurm and in Rackwise.
        for job in Job.objects.filter(pk__in=victims):
            # Why it waits: the reclaim, or (once a pass has seen it) its tenant's quota.
            assert job.state == JobState.PENDING, job.state
            assert job.state_reason.endswith(
                f"(reclaim) to start job #{gang} train-16n (llm)"
            ) or job.state_reason.startswith("quota: vision holds 64 of 64 nominal GPUs"), job.state_reason
            found = slurm_job(cluster, job.external_id)
            assert found["job_state"][0] == "PENDING" and is_held(found), found
        untouched = [j.pk for j in vision_jobs if j.pk not in victims]
        assert all(running_in_slurm(cluster, pk) for pk in untouched)
    assert consistent_violations() == []
