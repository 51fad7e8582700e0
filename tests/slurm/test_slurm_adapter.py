"""The Slurm adapter against the real Slurm 24.11 test cluster (2 racks x 18 nodes).

Rackwise's fleet is imported from the live cluster (``import_topology --from
slurm-live``), jobs are placed in the test database through the job services,
and the adapter's steps are called directly, handed as the action service
hands them (``as_handed``: with the hosts the job holds now)."""

from __future__ import annotations

import io
import time

import pytest
from django.core.management import call_command

from fleet import steps as st
from fleet.choices import JobState, NodeState
from fleet.cluster.base import (
    DONE,
    JOB_CANCELLED,
    JOB_COMPLETED,
    JOB_RUNNING,
    NODE_DRAINING,
    NODE_FAILED,
    NODE_HEALTHY,
    ClusterUnavailable,
    StepFailed,
)
from fleet.cluster.slurm import SlurmAdapter
from fleet.models import Job, Node, Rack, Tenant
from fleet.services.execution import slurm_sync
from fleet.services.execution.execute import as_handed
from fleet.services.jobs import allocations as job_allocations
from fleet.services.jobs import submit as job_services

pytestmark = pytest.mark.django_db(transaction=False)


@pytest.fixture
def cluster(slurm_cluster):
    slurm_cluster.reset()
    return slurm_cluster


@pytest.fixture
def adapter(cluster, settings) -> SlurmAdapter:
    settings.RACKWISE_SLURM_BIN = str(cluster.bin)
    settings.RACKWISE_SLURM_PARTITION = cluster.partition
    settings.RACKWISE_SLURM_JOBS_DIR = str(cluster.jobs_dir)
    settings.RACKWISE_SLURM_JOBS_DIR_IN_CLUSTER = cluster.jobs_dir_in_cluster
    settings.RACKWISE_SLURM_CHECKPOINT_GRACE_S = 0.2
    return SlurmAdapter.from_settings()


@pytest.fixture
def fleet_of_slurm(adapter, operator):
    """Rackwise's racks and nodes, imported from the live cluster."""
    Tenant.objects.get_or_create(name="llm")
    call_command("import_topology", "--from", "slurm-live", stdout=io.StringIO())
    return {n.hostname: n for n in Node.objects.all()}


# A job that saves on the checkpoint signal (USR1's default action would end it).
TRAIN = "trap 'echo checkpoint >> ckpt-$SLURM_JOB_ID' USR1\nwhile true; do sleep 5 & wait $!; done"


def place(operator, nodes: dict[str, Node], hosts: list[str], *, name="train", script=TRAIN) -> Job:
    """A 4-GPU-per-node gang submitted and placed on ``hosts`` in the database."""
    job = job_services.submit_job(
        operator,
        job_services.JobSpec(name=name, tenant="llm", num_nodes=len(hosts), gpus_per_node=4),
    )
    Job.objects.filter(pk=job.pk).update(cluster_spec={"slurm": {"script": f"#!/bin/bash\n{script}\n"}})
    job_allocations.apply_placement(
        operator, job.pk, {nodes[h].pk: [0, 1, 2, 3] for h in hosts}, reason="test"
    )
    return Job.objects.get(pk=job.pk)


def allocate(adapter, job: Job, nodes: dict[str, Node], hosts: list[str]) -> str:
    step = st.Allocate(job=job.pk, nodes={nodes[h].pk: [0, 1, 2, 3] for h in hosts}, hostnames=hosts)
    outcome = adapter.perform(None, 0, step)
    assert outcome.status == DONE and outcome.external_id
    Job.objects.filter(pk=job.pk).update(external_id=outcome.external_id)  # as the service does
    job.refresh_from_db()
    return outcome.external_id


def squeue_job(cluster, job_id: str) -> dict:
    return next(j for j in cluster.json("squeue", "--states=all")["jobs"] if str(j["job_id"]) == job_id)


def hosts_of(cluster, job_id: str) -> list[str]:
    return cluster.run("scontrol", "show", "hostnames", squeue_job(cluster, job_id)["nodes"]).stdout.split()


def start(adapter, job: Job) -> None:
    assert adapter.perform(None, 1, as_handed(st.Start(job=job.pk))).status == DONE
    job_allocations.start_job(None, job.pk)


def test_the_live_import_makes_one_rack_per_block_and_the_sync_keeps_it(cluster, adapter, fleet_of_slurm):
    racks = {r.name: r for r in Rack.objects.all()}
    assert sorted(racks) == ["rack01", "rack02"]
    assert all(
        (r.nodes_per_domain, r.gpus_per_node, r.external_id) == (18, 4, r.name) for r in racks.values()
    )
    assert Node.objects.get(hostname="r02n18").rack.name == "rack02"
    cluster.run("scontrol", "update", "NodeName=r01n18", "State=DRAIN", "Reason=sync test")
    result = slurm_sync.sync(adapter)
    assert result["topology"] == {"changed": False}
    assert result["nodes"]["drain"] == ["r01n18"]
    assert result["adopted"] == [] and result["scancelled"] == []


def test_a_placed_job_runs_on_exactly_the_chosen_nodes_in_one_block(
    cluster, adapter, fleet_of_slurm, operator
):
    chosen = ["r01n03", "r01n04", "r01n05", "r01n06"]
    job = place(operator, fleet_of_slurm, chosen)
    sid = allocate(adapter, job, fleet_of_slurm, chosen)
    held = squeue_job(cluster, sid)
    assert held["job_state"] == ["PENDING"] and held["hold"] is True
    assert held["comment"] == f"rackwise:{job.pk}:0"

    # A retried allocate (even one whose id was never stored) finds the same Slurm job.
    Job.objects.filter(pk=job.pk).update(external_id=None)
    assert allocate(adapter, job, fleet_of_slurm, chosen) == sid
    assert allocate(adapter, job, fleet_of_slurm, chosen) == sid
    mine = [j for j in cluster.json("squeue")["jobs"] if j["comment"].startswith(f"rackwise:{job.pk}:")]
    assert len(mine) == 1

    start(adapter, job)
    running = squeue_job(cluster, sid)
    assert running["job_state"] == ["RUNNING"]
    assert hosts_of(cluster, sid) == chosen
    blocks = [
        line for line in cluster.run("scontrol", "show", "topology").stdout.splitlines() if "rack01" in line
    ]
    assert blocks and all(h.startswith("r01") for h in hosts_of(cluster, sid))
    # start again (a redelivered task): already running there, nothing done.
    assert adapter.perform(None, 1, as_handed(st.Start(job=job.pk))).status == DONE
    assert squeue_job(cluster, sid)["job_state"] == ["RUNNING"]

    report = adapter.job_states([job])[job.pk]
    assert (report.state, report.hostnames, report.external_id) == (JOB_RUNNING, tuple(chosen), sid)
    assert report.started_at is not None


def test_a_swap_after_slurm_marks_a_node_down_runs_on_the_spare(cluster, adapter, fleet_of_slurm, operator):
    chosen = ["r01n01", "r01n02", "r01n03", "r01n04"]
    job = place(operator, fleet_of_slurm, chosen)
    sid = allocate(adapter, job, fleet_of_slurm, chosen)
    start(adapter, job)

    cluster.run("scontrol", "update", "NodeName=r01n02", "State=DOWN", "Reason=test: GPU fell off the bus")
    reports = adapter.node_states()
    assert reports["r01n02"].state == NODE_FAILED and "fell off the bus" in reports["r01n02"].reason
    # The sync fails the node through the node service: the job is interrupted.
    changed = slurm_sync.sync_nodes(adapter)
    assert changed["fail"] == ["r01n02"]
    job.refresh_from_db()
    assert job.state == JobState.RECOVERING
    assert Node.objects.get(hostname="r01n02").state == NodeState.FAILED

    t0 = time.monotonic()
    swap = st.Swap(
        job=job.pk,
        swaps={fleet_of_slurm["r01n02"].pk: fleet_of_slurm["r01n10"].pk},
        hostname_swaps={"r01n02": "r01n10"},
    )
    assert adapter.perform(None, 0, as_handed(swap)).status == DONE
    assert adapter.perform(None, 0, as_handed(swap)).status == DONE  # idempotent
    job_allocations.swap_job_nodes(None, job.pk, swap.swaps, reason="test swap")
    assert adapter.perform(None, 1, as_handed(st.Restart(job=job.pk))).status == DONE
    took = time.monotonic() - t0
    assert hosts_of(cluster, sid) == ["r01n01", "r01n03", "r01n04", "r01n10"]
    assert squeue_job(cluster, sid)["job_state"] == ["RUNNING"]
    print(f"\nswap after DOWN: {took:.2f} s from the swap step to RUNNING on the spare")
    assert took < 10


def test_a_migration_requeueholds_repins_and_releases(cluster, adapter, fleet_of_slurm, operator):
    old, new = ["r01n11", "r01n12"], ["r02n11", "r02n12"]
    job = place(operator, fleet_of_slurm, old)
    sid = allocate(adapter, job, fleet_of_slurm, old)
    start(adapter, job)

    t0 = time.monotonic()
    assert adapter.perform(None, 0, st.Checkpoint(job=job.pk)).status == DONE
    assert adapter.perform(None, 1, st.Stop(job=job.pk)).status == DONE
    held = squeue_job(cluster, sid)
    assert "PENDING" in held["job_state"] and held["hold"] is True
    job_allocations.requeue_job(None, job.pk, reason="moving", action="job.stop")
    job_allocations.apply_placement(
        None, job.pk, {fleet_of_slurm[h].pk: [0, 1, 2, 3] for h in new}, reason="move"
    )
    assert allocate(adapter, job, fleet_of_slurm, new) == sid
    assert adapter.perform(None, 3, as_handed(st.Start(job=job.pk))).status == DONE
    took = time.monotonic() - t0
    assert hosts_of(cluster, sid) == new
    assert (cluster.jobs_dir / f"ckpt-{sid}").read_text().startswith("checkpoint")
    print(f"\nmigration (checkpoint + stop + allocate + start): {took:.2f} s")
    assert took < 10


def test_drain_and_undrain_both_ways(cluster, adapter, fleet_of_slurm):
    def slurm_state(host):
        return set(
            next(n for n in cluster.json("scontrol", "show", "nodes")["nodes"] if n["name"] == host)["state"]
        )

    # Rackwise -> Slurm, idempotently.
    adapter.set_node_state("r02n07", NODE_DRAINING, "swap prep")
    adapter.set_node_state("r02n07", NODE_DRAINING, "swap prep")
    assert "DRAIN" in slurm_state("r02n07")
    node = next(n for n in cluster.json("scontrol", "show", "nodes")["nodes"] if n["name"] == "r02n07")
    assert node["reason"] == "rackwise: swap prep"
    adapter.set_node_state("r02n07", NODE_HEALTHY, "")
    adapter.set_node_state("r02n07", NODE_HEALTHY, "")  # RESUME on an idle node would be refused
    back = {"DRAIN", "DOWN"}  # (a resumed node is IDLE+NOT_RESPONDING for about a second)
    assert "IDLE" in slurm_state("r02n07") and not slurm_state("r02n07") & back
    assert (
        adapter.perform(
            None, 0, st.Drain(node=fleet_of_slurm["r02n08"].pk, hostname="r02n08", reason="x")
        ).status
        == DONE
    )
    assert "DRAIN" in slurm_state("r02n08")
    adapter.perform(None, 0, st.Undrain(node=fleet_of_slurm["r02n08"].pk, hostname="r02n08"))
    assert not slurm_state("r02n08") & back

    # Slurm -> Rackwise.
    cluster.run("scontrol", "update", "NodeName=r02n09", "State=DRAIN", "Reason=bad fan")
    assert slurm_sync.sync_nodes(adapter)["drain"] == ["r02n09"]
    node = Node.objects.get(hostname="r02n09")
    assert node.state == NodeState.DRAINED and "bad fan" in node.state_reason
    assert slurm_sync.sync_nodes(adapter)["drain"] == []  # idempotent
    cluster.run("scontrol", "update", "NodeName=r02n09", "State=RESUME")
    # Just resumed, the node is IDLE+NOT_RESPONDING for about a second: no change until it answers.
    cluster.wait_for(
        lambda: slurm_sync.sync_nodes(adapter)["undrain"] == ["r02n09"], timeout=10, what="undrain"
    )
    assert Node.objects.get(hostname="r02n09").state == NodeState.HEALTHY


def test_job_states_after_scancel_and_after_a_job_ends(cluster, adapter, fleet_of_slurm, operator):
    short = place(operator, fleet_of_slurm, ["r02n01"], name="short", script="sleep 0.5")
    long = place(operator, fleet_of_slurm, ["r02n02"], name="long")
    for job in (short, long):
        allocate(adapter, job, fleet_of_slurm, [job_allocations.placement_of(job)["nodes"][0]])
        start(adapter, job)
    cluster.run("scancel", long.external_id)
    cluster.wait_job_state(long.external_id, "CANCELLED")
    cluster.wait_job_state(short.external_id, "COMPLETED")
    reports = adapter.job_states([short, long])
    assert reports[short.pk].state == JOB_COMPLETED and reports[short.pk].ended_at is not None
    assert reports[long.pk].state == JOB_CANCELLED
    # A job is never submitted twice: its Slurm job ended, so placing it again fails.
    short.refresh_from_db()
    with pytest.raises(StepFailed, match="already ended"):
        allocate(adapter, short, fleet_of_slurm, ["r02n03"])


def test_a_rackwise_cancel_and_reconcile_scancel_the_slurm_job(cluster, adapter, fleet_of_slurm, operator):
    job = place(operator, fleet_of_slurm, ["r02n15"])
    sid = allocate(adapter, job, fleet_of_slurm, ["r02n15"])
    start(adapter, job)
    job_services.cancel_job(operator, job.pk)  # Rackwise side only
    assert slurm_sync.reconcile_jobs(adapter) == [job.pk]
    cluster.wait_job_state(sid, "CANCELLED")
    assert slurm_sync.reconcile_jobs(adapter) == []
    adapter.cancel(Job.objects.get(pk=job.pk))  # idempotent: nothing left to cancel


def test_a_held_sbatch_job_is_adopted_placed_and_released(cluster, adapter, fleet_of_slurm):
    (cluster.jobs_dir / "user.sh").write_text("#!/bin/bash\nsleep 300\n")
    inside = cluster.jobs_dir_in_cluster
    sid = cluster.run(
        "sbatch", "--parsable", "--hold", "--no-requeue", "-N", "2", "--gres=gpu:4", "--job-name=user-train",
        f"--partition={cluster.partition}", f"--chdir={inside}", f"--output={inside}/user-%j.out",
        f"{inside}/user.sh",
    ).stdout.strip()  # fmt: skip
    adopted = slurm_sync.adopt_held_jobs(adapter)
    assert len(adopted) == 1 and slurm_sync.adopt_held_jobs(adapter) == []
    job = Job.objects.get(pk=adopted[0])
    assert (job.external_id, job.num_nodes, job.gpus_per_node, job.tenant.name) == (sid, 2, 4, "slurm")
    assert job.cluster_spec["slurm"]["adopted"] is True

    chosen = ["r02n05", "r02n06"]
    job_allocations.apply_placement(
        None, job.pk, {fleet_of_slurm[h].pk: [0, 1, 2, 3] for h in chosen}, reason="test"
    )
    assert allocate(adapter, job, fleet_of_slurm, chosen) == sid
    start(adapter, job)
    assert hosts_of(cluster, sid) == chosen
    # Moved at once (it was --no-requeue, and is still being launched): held pending again.
    assert adapter.perform(None, 2, st.Stop(job=job.pk)).status == DONE
    assert squeue_job(cluster, sid)["hold"] is True


def test_slurmctld_down_is_cluster_unavailable(cluster, adapter, fleet_of_slurm, operator):
    job = place(operator, fleet_of_slurm, ["r02n16"])
    cluster.stop_slurmctld()
    try:
        t0 = time.monotonic()
        with pytest.raises(ClusterUnavailable, match="slurmctld unreachable") as caught:
            adapter.node_states()
        took = time.monotonic() - t0
        print(f"\nslurmctld down: ClusterUnavailable after {took:.2f} s: {caught.value}")
        assert took < 2  # scontrol ping says DOWN at once
        with pytest.raises(ClusterUnavailable, match="slurmctld unreachable"):
            adapter.perform(
                None, 0, st.Allocate(job=job.pk, nodes={fleet_of_slurm["r02n16"].pk: [0, 1, 2, 3]})
            )
        # Without the ping, the client's own message, after its connection retries (about 9 s),
        # and a client that hangs past RACKWISE_SLURM_TIMEOUT_S is unavailable too.
        adapter.cli.timeout_s = 1
        with pytest.raises(ClusterUnavailable, match="within 1 s"):
            adapter.cli.jobs()
        adapter.cli.timeout_s = 20
    finally:
        cluster.start_slurmctld()
    assert not [j for j in cluster.json("squeue")["jobs"] if j["comment"].startswith(f"rackwise:{job.pk}:")]
    # Back: nodes read UNKNOWN / not responding (left out) until they register.
    t0 = time.monotonic()
    seen = []
    while len(reports := adapter.node_states()) < len(cluster.nodes) and time.monotonic() - t0 < 20:
        seen.append(len(reports))
        time.sleep(0.2)
    assert all(r.state == NODE_HEALTHY for r in reports.values()) and len(reports) == len(cluster.nodes)
    print(
        f"all nodes reported again {time.monotonic() - t0:.2f} s after slurmctld restarted "
        f"(partial: {seen[:5]})"
    )
