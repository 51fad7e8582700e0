"""What the Slurm adapter reads from Slurm's tools, parsed without a cluster.

The samples are trimmed from the real Slurm 24.11 test cluster's answers
(``scontrol show ... --json``, ``squeue --json``, data_parser v0.0.42)."""

from __future__ import annotations

import datetime as dt

import pytest

from fleet.cluster.base import (
    JOB_CANCELLED,
    JOB_COMPLETED,
    JOB_FAILED,
    JOB_PENDING,
    JOB_RUNNING,
    NODE_DRAINING,
    NODE_FAILED,
    NODE_HEALTHY,
    ClusterUnavailable,
)
from fleet.cluster.slurm import _after_revocation, comment_for, rackwise_job_of, segment_size
from fleet.cluster.slurm_cli import (
    SlurmCli,
    SlurmError,
    SlurmJob,
    expand_hostlist,
    gpus_per_node,
    job_base_state,
    job_report,
    job_state,
    node_report,
    node_state,
    parse_show_topology,
)
from fleet.services.execution.slurm_sync import node_change


def _n(value: int) -> dict:
    return {"set": True, "infinite": False, "number": value}


HELD_JOB = {
    "job_id": 1,
    "job_state": ["PENDING"],
    "state_reason": "JobHeldUser",
    "hold": True,
    "priority": _n(0),
    "nodes": "",
    "required_nodes": "r01n[03-06]",
    "comment": "rackwise:999:0",
    "partition": "gpu",
    "name": "probe",
    "user_name": "root",
    "node_count": _n(4),
    "tres_per_node": "gres/gpu:4",
    "tres_req_str": "cpu=4,mem=3125G,node=4,billing=4",
    "start_time": _n(0),
    "end_time": _n(0),
    "exit_code": {"status": ["SUCCESS"], "return_code": _n(0)},
}
RUNNING_JOB = HELD_JOB | {
    "job_state": ["RUNNING"],
    "state_reason": "None",
    "hold": False,
    "priority": _n(1),
    "nodes": "r01n[04-07]",
    "required_nodes": "r01n07,r01n04,r01n05,r01n06",
    "start_time": _n(1764597000),
}
REQUEUEING_JOB = RUNNING_JOB | {
    "job_state": ["PENDING", "COMPLETING"],
    "state_reason": "JobHeldUser",
    "hold": True,
}
CANCELLED_JOB = RUNNING_JOB | {
    "job_state": ["CANCELLED"],
    "end_time": _n(1764597060),
    "exit_code": {"status": ["SIGNALED"], "return_code": _n(0)},
}
FAILED_JOB = RUNNING_JOB | {
    "job_state": ["FAILED"],
    "state_reason": "NonZeroExitCode",
    "end_time": _n(1764597060),
    "exit_code": {"status": ["ERROR"], "return_code": _n(3)},
}


@pytest.mark.parametrize(
    ("states", "expected"),
    [
        (["IDLE"], NODE_HEALTHY),
        (["MIXED"], NODE_HEALTHY),
        (["ALLOCATED"], NODE_HEALTHY),
        (["IDLE", "DRAIN"], NODE_DRAINING),
        (["ALLOCATED", "DRAIN"], NODE_DRAINING),
        (["DOWN"], NODE_FAILED),
        (["DOWN", "DRAIN"], NODE_FAILED),
        (["IDLE", "NOT_RESPONDING"], None),  # for a second after every RESUME
        (["DOWN", "NOT_RESPONDING"], NODE_FAILED),
        (["IDLE", "DRAIN", "FAIL"], NODE_FAILED),
        ("IDLE+DRAIN", NODE_DRAINING),  # older data_parser: one string
        (["UNKNOWN"], None),  # slurmctld just started: says nothing
    ],
)
def test_node_states_map_to_rackwise(states, expected):
    assert node_state(states) == expected


def test_a_node_report_carries_reason_and_jobs():
    report = node_report(
        {"name": "r01n05", "state": ["IDLE", "DRAIN"], "reason": "rackwise: swap", "gres": "gpu:4"},
        {"r01n05": ["12"]},
    )
    assert (report.hostname, report.state, report.reason, report.jobs) == (
        "r01n05",
        NODE_DRAINING,
        "rackwise: swap",
        ("12",),
    )
    # A healthy node's leftover reason (RESUME keeps the text) is not reported.
    assert node_report({"name": "r01n01", "state": ["IDLE"], "reason": "old"}).reason == ""


@pytest.mark.parametrize(
    ("states", "base", "rackwise"),
    [
        (["PENDING"], "PENDING", JOB_PENDING),
        (["PENDING", "COMPLETING"], "PENDING", JOB_PENDING),
        (["PENDING", "REQUEUED"], "PENDING", JOB_PENDING),
        (["RUNNING"], "RUNNING", JOB_RUNNING),
        (["COMPLETED"], "COMPLETED", JOB_COMPLETED),
        (["COMPLETED", "COMPLETING"], "COMPLETED", JOB_COMPLETED),
        (["CANCELLED"], "CANCELLED", JOB_CANCELLED),
        (["FAILED"], "FAILED", JOB_FAILED),
        (["TIMEOUT"], "TIMEOUT", JOB_FAILED),
        (["NODE_FAIL"], "NODE_FAIL", JOB_FAILED),
        (["NODE_FAIL", "REQUEUED"], "PENDING", JOB_PENDING),  # on its way back to the queue
        (["OUT_OF_MEMORY"], "OUT_OF_MEMORY", JOB_FAILED),
    ],
)
def test_job_states_map_to_rackwise(states, base, rackwise):
    assert (job_base_state(states), job_state(states)) == (base, rackwise)


def test_a_held_job_is_seen_as_held_with_its_required_nodes():
    job = SlurmJob.parse(HELD_JOB)
    assert (job.job_id, job.state, job.held, job.nodes) == ("1", "PENDING", True, ())
    assert job.required == ("r01n03", "r01n04", "r01n05", "r01n06")
    assert not job.ended and not job.completing
    report = job_report(HELD_JOB)
    assert (report.state, report.num_nodes, report.gpus_per_node, report.hostnames) == (JOB_PENDING, 4, 4, ())
    assert report.extra["held"] and report.extra["partition"] == "gpu"


def test_a_requeue_in_progress_is_pending_but_completing():
    job = SlurmJob.parse(REQUEUEING_JOB)
    assert job.state == "PENDING" and job.completing and job.held


def test_a_running_job_reports_its_hosts_and_start():
    report = job_report(RUNNING_JOB)
    assert report.state == JOB_RUNNING
    assert report.hostnames == ("r01n04", "r01n05", "r01n06", "r01n07")
    assert report.started_at == dt.datetime.fromtimestamp(1764597000, tz=dt.UTC)
    assert report.ended_at is None


def test_ended_jobs_report_how_and_when():
    cancelled, failed = job_report(CANCELLED_JOB), job_report(FAILED_JOB)
    assert cancelled.state == JOB_CANCELLED and cancelled.ended_at is not None
    assert failed.state == JOB_FAILED
    assert failed.reason == "Slurm FAILED, exit code 3 (NonZeroExitCode)"


@pytest.mark.parametrize(
    ("job", "expected"),
    [
        ({"tres_per_node": "gres/gpu:4"}, 4),
        ({"tres_per_node": "gres/gpu:h100:2"}, 2),
        ({"tres_per_node": "", "tres_per_job": "gres/gpu:16", "node_count": _n(4)}, 4),
        ({"tres_per_node": "", "tres_req_str": "cpu=2,node=2,gres/gpu=8", "node_count": _n(2)}, 4),
        ({"tres_per_node": "", "tres_req_str": "cpu=1,node=1"}, None),
    ],
)
def test_gpus_per_node_from_the_job_tres(job, expected):
    assert gpus_per_node(job) == expected


def test_hostlists_expand_like_scontrol_show_hostnames():
    assert expand_hostlist("r01n[01-03],r02n18") == ["r01n01", "r01n02", "r01n03", "r02n18"]
    assert expand_hostlist("r01n07,r01n04") == ["r01n07", "r01n04"]
    assert expand_hostlist("") == [] and expand_hostlist(None) == []


def test_show_topology_text_gives_blocks():
    text = (
        "BlockName=rack01 BlockIndex=0 Nodes=r01n[01-18] BlockSize=18\n"
        "BlockName=rack02 BlockIndex=1 Nodes=r02n[01-18] BlockSize=18\n"
        "\n"
        "BlockName=bblock[0-1] BlockIndex=2 Nodes=r01n[01-18],r02n[01-18] BlockSize=36\n"
    )
    blocks = parse_show_topology(text)
    assert [(b.name, len(b.nodes), b.size) for b in blocks] == [("rack01", 18, 18), ("rack02", 18, 18)]
    assert blocks[1].nodes[0] == "r02n01"


def test_comments_name_the_rackwise_job():
    assert comment_for(42, 3) == "rackwise:42:3"
    assert rackwise_job_of("rackwise:42:3") == 42
    assert rackwise_job_of("someone's job") is None and rackwise_job_of("rackwise:x:1") is None


@pytest.mark.parametrize(
    ("rackwise", "slurm", "change"),
    [
        ("healthy", NODE_FAILED, "fail"),
        ("healthy", NODE_DRAINING, "drain"),
        ("healthy", NODE_HEALTHY, None),
        ("suspect", NODE_HEALTHY, None),  # suspicion is Rackwise's own (heartbeats)
        ("suspect", NODE_FAILED, "fail"),
        ("draining", NODE_HEALTHY, "undrain"),
        ("drained", NODE_HEALTHY, "undrain"),
        ("drained", NODE_DRAINING, None),
        ("failed", NODE_HEALTHY, "return"),
        ("failed", NODE_DRAINING, None),
        ("in_repair", NODE_HEALTHY, None),  # an operator's state, always
        ("in_repair", NODE_FAILED, None),
    ],
)
def test_node_sync_rule(rackwise, slurm, change):
    assert node_change(rackwise, slurm) == change


def _tool(tmp_path, name: str, body: str) -> SlurmCli:
    path = tmp_path / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return SlurmCli(str(tmp_path), timeout_s=1)


def test_an_unreachable_controller_is_cluster_unavailable(tmp_path):
    cli = _tool(
        tmp_path,
        "squeue",
        "echo 'slurm_load_jobs error: Unable to contact slurm controller (connect failure)' >&2; exit 1",
    )
    with pytest.raises(ClusterUnavailable, match="Unable to contact slurm controller"):
        cli.jobs()


def test_a_refusal_is_a_slurm_error(tmp_path):
    cli = _tool(tmp_path, "scontrol", "echo 'Invalid node state specified' >&2; exit 1")
    with pytest.raises(SlurmError, match="Invalid node state specified"):
        cli.run("scontrol", "update", "NodeName=x", "State=RESUME")


def test_a_hung_tool_times_out_as_cluster_unavailable(tmp_path):
    cli = _tool(tmp_path, "squeue", "sleep 5")
    with pytest.raises(ClusterUnavailable, match="within 1 s"):
        cli.run("squeue")


def test_a_missing_tool_is_cluster_unavailable(tmp_path):
    with pytest.raises(ClusterUnavailable, match="not found in RACKWISE_SLURM_BIN"):
        SlurmCli(str(tmp_path)).run("sbatch")


@pytest.mark.parametrize(
    ("nodes", "segments", "one_rack", "expected"),
    [
        (8, [["1", "2", "3", "4", "5", "6", "7", "8"]], True, 8),
        (8, [["1", "2", "3", "4"], ["5", "6", "7", "8"]], False, 4),  # two racks, 4 each
        (6, [["1", "2", "3", "4"], ["5", "6"]], False, None),  # unequal: the nodelist says it all
        (4, None, True, 4),
        (20, None, False, None),
    ],
)
def test_segment_size_follows_the_placement(nodes, segments, one_rack, expected):
    assert segment_size(nodes, segments, one_rack) == expected


def test_a_requeued_job_is_released_only_in_the_second_after_its_kill():
    # A requeued, pending job shows its time limit's end as end_time, far ahead;
    # releasing it within the second of the kill makes slurmd refuse the batch
    # step as revoked (seen in CI). With restart_cnt it waits for the next second.
    import time

    far = {"set": True, "infinite": False, "number": int(time.time()) + 10**6}
    requeued = SlurmJob.parse({"job_id": 7, "job_state": ["PENDING"], "end_time": far, "restart_cnt": 1})
    before = time.time()
    _after_revocation(requeued)
    assert int(time.time()) > int(before)
    fresh = SlurmJob.parse({"job_id": 8, "job_state": ["PENDING"], "end_time": far, "restart_cnt": 0})
    before = time.time()
    _after_revocation(fresh)
    assert time.time() - before < 0.5  # never ran: nothing was revoked
