"""The Slurm cluster of scripts/slurm-cluster is real: topology, pinned jobs, drain, migration, restarts."""

from __future__ import annotations

import time

import pytest


@pytest.fixture
def cluster(slurm_cluster):
    slurm_cluster.reset()
    return slurm_cluster


def submit(cluster, name: str, body: str, *args: str) -> str:
    """Write a batch script into the shared jobs directory and sbatch it; return the job id."""
    (cluster.jobs_dir / f"{name}.sh").write_text(f"#!/bin/bash\n{body}\n")
    inside = cluster.jobs_dir_in_cluster
    out = cluster.run(
        "sbatch",
        "--parsable",
        f"--partition={cluster.partition}",
        f"--job-name={name}",
        f"--chdir={inside}",
        f"--output={inside}/{name}-%j.out",
        *args,
        f"{inside}/{name}.sh",
    )
    return out.stdout.strip().split(";")[0]


def nodelist(cluster, job_id: str) -> list[str]:
    return cluster.run("scontrol", "show", "hostnames", cluster.job(job_id)["nodes"]).stdout.split()


def test_topology_has_one_block_per_rack(cluster):
    lines = cluster.run("scontrol", "show", "topology").stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["BlockName=rack01", "BlockName=rack02"]
    assert "Nodes=r01n[01-18]" in lines[0] and "BlockSize=18" in lines[0]
    assert "Nodes=r02n[01-18]" in lines[1]
    nodes = cluster.json("scontrol", "show", "nodes")["nodes"]
    assert sorted(n["name"] for n in nodes) == cluster.nodes
    assert all(n["gres"] == "gpu:4" for n in nodes)


def test_a_pinned_segmented_job_runs_on_exactly_its_nodes(cluster):
    chosen = ["r02n03", "r02n04", "r02n05", "r02n06"]
    job = submit(
        cluster,
        "pinned",
        "srun hostname\nsrun bash -c 'echo node=$SLURMD_NODENAME gpus=$CUDA_VISIBLE_DEVICES'",
        f"--nodelist={','.join(chosen)}",
        "-N",
        "4",
        "--segment=4",
        "--gres=gpu:4",
        "--exclusive",
    )
    done = cluster.wait_job_state(
        job, "COMPLETED", "FAILED", timeout=20, exact=True
    )  # not COMPLETED+COMPLETING: the output may not be flushed yet
    assert done["job_state"] == ["COMPLETED"]
    assert nodelist(cluster, job) == chosen
    out = (cluster.jobs_dir / f"pinned-{job}.out").read_text().splitlines()
    assert sorted(line.split()[0] for line in out if line.startswith("node=")) == [
        f"node={n}" for n in chosen
    ]
    assert all(line.endswith("gpus=0,1,2,3") for line in out if line.startswith("node="))


def test_drain_with_a_reason_shows_in_json_and_resume_returns_the_node(cluster):
    def node(name):
        return next(n for n in cluster.json("scontrol", "show", "nodes")["nodes"] if n["name"] == name)

    refused = cluster.run("scontrol", "update", "NodeName=r01n07", "State=DRAIN", check=False)
    assert refused.returncode != 0  # Slurm wants a reason

    cluster.run("scontrol", "update", "NodeName=r01n07", "State=DRAIN", "Reason=rackwise test")
    drained = node("r01n07")
    assert "DRAIN" in drained["state"]
    assert drained["reason"] == "rackwise test"

    cluster.run("scontrol", "update", "NodeName=r01n07", "State=RESUME")
    # slurmctld marks a resumed node NOT_RESPONDING until its next ping comes back.
    cluster.wait_for(lambda: node("r01n07")["state"] == ["IDLE"], what="r01n07 IDLE again")


def test_requeuehold_update_release_moves_a_running_job(cluster):
    job = submit(
        cluster,
        "mover",
        "srun sleep 300",
        "--nodelist=r01n01,r01n02",
        "-N",
        "2",
        "--gres=gpu:4",
        "--exclusive",
        "--requeue",
    )
    cluster.wait_job_state(job, "RUNNING")
    assert nodelist(cluster, job) == ["r01n01", "r01n02"]

    t0 = time.monotonic()
    cluster.run("scontrol", "requeuehold", job)
    # First comes ['PENDING', 'COMPLETING']: the requeue is not done until COMPLETING is gone, and
    # an update made before then is overwritten (the job then waits ~121 s in BeginTime).
    cluster.wait_job_state(job, "PENDING", exact=True)
    cluster.run("scontrol", "update", f"JobId={job}", "NodeList=r01n09,r01n10", "StartTime=now")
    cluster.run("scontrol", "release", job)
    cluster.wait_job_state(job, "RUNNING", timeout=30)
    seconds = time.monotonic() - t0
    print(f"\nmigration of job {job}: {seconds:.2f} s from requeuehold to RUNNING on the new nodes")
    assert nodelist(cluster, job) == ["r01n09", "r01n10"]
    assert seconds < 10  # without StartTime=now it waits ~121 s in BeginTime


def test_the_rest_api_answers_with_a_token(cluster):
    import json
    import urllib.request

    req = urllib.request.Request(
        f"{cluster.rest_url}/slurm/v0.0.42/nodes/",
        headers={"X-SLURM-USER-NAME": "root", "X-SLURM-USER-TOKEN": cluster.token()},
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        nodes = json.load(resp)["nodes"]
    assert len(nodes) == len(cluster.nodes)


def test_start_status_and_stop_are_idempotent(cluster):
    status = cluster.script("status")
    assert status.returncode == 0 and "36 idle" in status.stdout

    again = cluster.script("start")
    assert again.returncode == 0, again.stderr
    assert "already up" in again.stderr
    assert again.stdout.strip().splitlines()[-1] == "export " + " ".join(
        f"{k}={v}" for k, v in cluster.env.items()
    )
    assert cluster.script("start").stdout == again.stdout

    # A different shape is refused while it runs, with one clear line.
    other = cluster.script("start", "--racks", "3")
    assert other.returncode == 1 and other.stderr.strip().startswith("slurm-cluster: error:")


def test_a_running_job_survives_a_slurmctld_restart(cluster):
    job = submit(cluster, "survivor", "sleep 300", "-N", "1", "--nodelist=r02n18")
    cluster.wait_job_state(job, "RUNNING")
    cluster.stop_slurmctld()
    assert cluster.script("status").returncode == 1
    cluster.start_slurmctld()
    assert cluster.job(job)["job_state"] == ["RUNNING"]
    assert nodelist(cluster, job) == ["r02n18"]


def test_stop_twice_then_start_again_gives_the_same_cluster(cluster):
    assert cluster.script("stop").returncode == 0
    second = cluster.script("stop")
    assert second.returncode == 0 and "already stopped" in second.stderr
    down = cluster.script("status")
    assert down.returncode == 1 and "down" in down.stdout

    t0 = time.monotonic()
    up = cluster.script("start")
    assert up.returncode == 0, up.stderr
    print(f"\nrestart: {time.monotonic() - t0:.1f} s to 36 idle nodes")
    assert up.stdout.strip().splitlines()[-1] == "export " + " ".join(
        f"{k}={v}" for k, v in cluster.env.items()
    )
    assert cluster.node_states() == dict.fromkeys(cluster.nodes, "idle")
