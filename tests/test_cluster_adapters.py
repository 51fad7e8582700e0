"""Cluster adapters (fleet.cluster): typed steps and their stored shape, the
simulated and webhook adapters, job ends reported back through
fleet.services.execution.cluster_sync, retry with backoff when the cluster cannot be
reached, node changes refused (503) when the cluster cannot take them, and the
step kinds the console reads from the API.

The adapters here are real implementations of the adapter interface (a
cluster that is down, one that is down N times, one that records cancels), not
mocks of any real cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta

import pytest
from django.utils import timezone

from fleet import steps as st
from fleet.choices import ActionKind, ActionState, JobState
from fleet.cluster.base import (
    DONE,
    JOB_CANCELLED,
    JOB_COMPLETED,
    JOB_FAILED,
    JOB_PENDING,
    JOB_RUNNING,
    ClusterUnavailable,
    JobReport,
    Outcome,
    StepFailed,
)
from fleet.cluster.simulated import SimulatedAdapter
from fleet.cluster.webhook import WebhookAdapter
from fleet.models import Action, AuditEvent, Job, Node
from fleet.services.actions import propose as action_services
from fleet.services.execution import cluster_sync
from fleet.services.execution import execute as execution
from fleet.services.jobs import allocations as job_allocations
from fleet.services.jobs import submit as job_services
from fleet.services.nodes import moves as node_services
from tests.support import ROOT, InstantAdapter, nodes_of

# --- typed steps ------------------------------------------------------------------------

# What main's services stored before typed steps, read back from JSON (keys are strings).
OLD_STORED = [
    {
        "op": "allocate",
        "job": 7,
        "nodes": {"3": [0, 1, 2, 3], "4": [0, 1]},
        "segments": [["3", "4"]],
        "hostnames": ["r1-n02", "r1-n03"],
        "reason": "rack-local",
        "choices": [{"rack": "r1"}],
    },
    {
        "op": "allocate",
        "job": 7,
        "nodes": {"3": [0]},
        "segments": [["3"]],
        "hostnames": ["r1-n02"],
        "reason": "move",
    },
    {"op": "start", "job": 7},
    {"op": "restart", "job": 7},
    {"op": "checkpoint", "job": 7},
    {"op": "stop", "job": 7},
    {"op": "preempt", "job": 8},
    {"op": "requeue", "job": 7, "reason": "recovering without GPUs"},
    {"op": "swap", "job": 7, "swaps": {"1": 17}, "hostname_swaps": {"r1-n00": "r1-n16"}},
    {"op": "drain", "node": 5, "hostname": "r1-n04", "reason": "degraded GPU (GPU 1: XID 31)"},
    {"op": "undrain", "node": 5, "hostname": "r1-n04", "reason": "fixed"},
]


def _stored(data: dict) -> dict:
    return json.loads(json.dumps(data))


@pytest.mark.parametrize("old", OLD_STORED, ids=lambda d: d["op"])
def test_a_stored_step_reads_back_as_its_type_and_stores_as_it_was(old):
    step = st.Step.from_dict(old)

    assert type(step) is st.KINDS[old["op"]]
    assert _stored(step.to_dict()) == old
    assert st.Step.from_dict(_stored(step.to_dict())) == step


def test_every_step_kind_round_trips_and_is_described():
    assert {d["op"] for d in OLD_STORED} == set(st.KINDS), "a sample for every kind"
    for old in OLD_STORED:
        step = st.Step.from_dict(old)
        assert step.describe()
    assert st.Step.from_dict(OLD_STORED[0]).describe() == "allocate job #7 on r1-n02, r1-n03"
    assert (
        st.Swap(job=7, swaps={1: 17}, hostname_swaps={"r1-n00": "r1-n16"}).describe()
        == "swap job #7: r1-n00 -> r1-n16"
    )
    assert st.Drain(node=5, hostname="r1-n04").describe() == "drain node r1-n04"


def test_an_old_swap_with_string_node_ids_reads_as_integers():
    """Recovery stored the engine's string ids as swap targets; they read as ints."""
    step = st.Step.from_dict({"op": "swap", "job": 7, "swaps": {"1": "17"}, "hostname_swaps": {}})

    assert step.swaps == {1: 17}


@pytest.mark.parametrize(
    "bad",
    [
        {"op": "teleport", "job": 1},
        {"job": 1},
        "allocate",
        {"op": "start"},
        {"op": "start", "job": "seven"},
        {"op": "allocate", "job": 1},
        {"op": "allocate", "job": 1, "nodes": ["a"]},
        {"op": "swap", "job": 1},
        {"op": "drain"},
        {"op": "undrain", "node": "x"},
    ],
)
def test_a_step_that_does_not_parse_is_a_step_error(bad):
    with pytest.raises(st.StepError):
        st.Step.from_dict(bad)


def test_a_redacted_step_is_still_described():
    """fleet.redact keeps op and job only; the action page still names it."""
    assert action_services.describe_step({"op": "allocate", "job": 9}) == "allocate job #9"


# --- the step-kinds endpoint ----------------------------------------------------------


def test_any_reader_gets_the_step_kinds(viewer_client, anon_client):
    response = viewer_client.get("/api/step-kinds/")

    assert response.status_code == 200
    kinds = {k["op"]: k for k in response.json()}
    assert set(kinds) == set(st.KINDS)
    assert kinds["swap"]["effect"] == "swap"
    assert kinds["undrain"]["effect"] == "undrain"
    assert kinds["preempt"]["effect"] == "release"
    assert "nodes" in kinds["allocate"]["fields"]
    assert kinds["drain"]["label"] and kinds["drain"]["description"]
    assert anon_client.get("/api/step-kinds/").status_code in (401, 403)


def test_the_step_kinds_are_in_the_openapi_schema(viewer_client):
    schema = viewer_client.get("/api/schema/?format=json").json()

    assert "/api/step-kinds/" in schema["paths"]


# --- the simulated cluster ----------------------------------------------------------------


def _running_job(owner, nodes: list[Node], *, duration_s: int | None = 100, started_ago_s: float = 0) -> Job:
    job = job_services.submit_job(
        owner,
        job_services.JobSpec(
            name="sim", num_gpus=4 * len(nodes), tenant="llm", expected_duration_s=duration_s
        ),
    )
    job_allocations.apply_placement(None, job.pk, {n.pk: [0, 1, 2, 3] for n in nodes}, reason="test")
    job_allocations.start_job(None, job.pk)
    Job.objects.filter(pk=job.pk).update(started_at=timezone.now() - timedelta(seconds=started_ago_s))
    return Job.objects.get(pk=job.pk)


def test_the_simulated_cluster_reports_a_job_completed_once_its_scaled_duration_has_passed(fleet, submitter):
    nodes = list(fleet[0].nodes.order_by("slot")[:2])
    done = _running_job(submitter, nodes[:1], duration_s=100, started_ago_s=2)
    running = _running_job(submitter, nodes[1:], duration_s=100, started_ago_s=0)
    adapter = SimulatedAdapter(step_seconds=0, failure_rate=0, time_scale=0.01)

    reports = adapter.job_states([done, running])

    assert reports[done.pk].state == JOB_COMPLETED
    assert reports[done.pk].ended_at == done.started_at + timedelta(seconds=1)
    assert reports[running.pk].state == JOB_RUNNING


def test_the_simulated_cluster_gives_a_placed_job_an_id_and_can_inject_failures(fleet, operator):
    node = fleet[0].nodes.first()
    action = action_services.propose(
        kind=ActionKind.DRAIN, title="x", steps=[st.Drain(node=node.pk)], jobs=[]
    )
    step = st.Allocate(job=3, nodes={node.pk: [0]})

    assert SimulatedAdapter(0, 0, 1).perform(action, 0, step) == Outcome(DONE, external_id="sim-3")
    with pytest.raises(StepFailed, match="simulated failure injected in drain"):
        SimulatedAdapter(0, 1.0, 1, seed=1).perform(action, 0, st.Drain(node=node.pk))


def test_a_job_that_ended_in_the_cluster_ends_in_rackwise_and_frees_its_gpus(fleet, submitter):
    job = _running_job(submitter, list(fleet[0].nodes.order_by("slot")[:2]), duration_s=100, started_ago_s=5)
    adapter = SimulatedAdapter(step_seconds=0, failure_rate=0, time_scale=0.01)

    first = cluster_sync.sync(adapter)
    again = cluster_sync.sync(adapter)

    job.refresh_from_db()
    assert first["jobs"]["completed"] == [job.pk]
    assert job.state == JobState.COMPLETED
    assert job.finished_at == job.started_at + timedelta(seconds=1), "the cluster's end time"
    assert nodes_of(job.pk) == set()
    assert again["jobs"]["completed"] == [] and again["jobs"]["asked"] == 0, "idempotent"


def test_a_report_about_an_earlier_attempt_is_ignored(fleet, submitter):
    job = _running_job(submitter, list(fleet[0].nodes.order_by("slot")[:1]))
    report = JobReport("sim-1", JOB_COMPLETED)

    assert cluster_sync.apply_job_report(job.pk, report, attempt=job.attempt - 1) == "stale"
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    assert cluster_sync.apply_job_report(job.pk, JobReport("sim-1", JOB_PENDING)) == "running"
    assert cluster_sync.apply_job_report(job.pk, report, attempt=job.attempt) == "completed"
    assert cluster_sync.apply_job_report(job.pk, report, attempt=job.attempt) == "already completed"


def test_a_job_cancelled_in_the_cluster_is_cancelled_without_telling_the_cluster_again(
    fleet, submitter, monkeypatch, django_capture_on_commit_callbacks
):
    recorder = RecordingAdapter()
    monkeypatch.setattr("fleet.services.jobs.lifecycle.get_adapter", lambda: recorder)
    job = _running_job(submitter, list(fleet[0].nodes.order_by("slot")[:1]))

    with django_capture_on_commit_callbacks(execute=True):
        done = cluster_sync.apply_job_report(job.pk, JobReport("x", JOB_CANCELLED, reason="scancel by alice"))

    job.refresh_from_db()
    assert done == "cancelled"
    assert job.state == JobState.CANCELLED
    assert job.state_reason == "cancelled in the cluster: scancel by alice"
    assert nodes_of(job.pk) == set()
    assert recorder.cancelled == []


def test_a_cluster_that_does_not_answer_leaves_jobs_as_they_are(fleet, submitter):
    job = _running_job(submitter, list(fleet[0].nodes.order_by("slot")[:1]), started_ago_s=10**6)

    result = cluster_sync.sync_jobs(DownAdapter())

    assert "error" in result
    job.refresh_from_db()
    assert job.state == JobState.RUNNING


# --- cancel tells the cluster, best effort ------------------------------------------------


class RecordingAdapter(InstantAdapter):
    def __init__(self, fail: bool = False) -> None:
        self.cancelled: list[int] = []
        self.fail = fail

    def cancel(self, job) -> None:
        if self.fail:
            raise ClusterUnavailable("slurmctld is not answering")
        self.cancelled.append(job.pk)


@pytest.mark.parametrize("fail", [False, True])
def test_a_cancelled_job_is_ended_in_the_cluster_after_commit_best_effort(
    fleet, submitter, monkeypatch, django_capture_on_commit_callbacks, fail
):
    recorder = RecordingAdapter(fail=fail)
    monkeypatch.setattr("fleet.services.jobs.lifecycle.get_adapter", lambda: recorder)
    job = _running_job(submitter, list(fleet[0].nodes.order_by("slot")[:1]))

    with django_capture_on_commit_callbacks(execute=True):
        job_services.cancel_job(submitter, job.pk)

    job.refresh_from_db()
    assert job.state == JobState.CANCELLED
    assert recorder.cancelled == ([] if fail else [job.pk])


# --- retry with backoff -------------------------------------------------------------------


class FlakyAdapter(InstantAdapter):
    """A cluster that cannot be reached the first ``down`` times it is asked to
    do a step, then does every step, naming the jobs it starts."""

    def __init__(self, down: int) -> None:
        self.down = down
        self.performed: list[str] = []

    def perform(self, action, index, step, report=None):
        if self.down > 0:
            self.down -= 1
            raise ClusterUnavailable("connection refused (slurmctld)")
        self.performed.append(step.op)
        return Outcome(DONE, external_id="4242" if step.op == "allocate" else None)


def test_backoff_doubles_from_2_s_up_to_60_s():
    assert [execution.retry_delay(n) for n in range(1, 9)] == [2, 4, 8, 16, 32, 60, 60, 60]


def _placement(fleet, submitter, name: str, nodes: int):
    """A job of ``nodes`` whole nodes in the first rack, and its proposed
    placement (allocate, then start)."""
    held = list(fleet[0].nodes.order_by("slot")[:nodes])
    job = job_services.submit_job(
        submitter, job_services.JobSpec(name=name, num_gpus=4 * nodes, tenant="llm")
    )
    action = action_services.propose(
        kind=ActionKind.PLACEMENT,
        title="place",
        steps=[
            st.Allocate(
                job=job.pk, nodes={n.pk: [0, 1, 2, 3] for n in held}, hostnames=[n.hostname for n in held]
            ),
            st.Start(job=job.pk),
        ],
        jobs=[job.pk],
    )
    return job, action


def test_a_step_the_cluster_could_not_be_reached_for_is_retried_with_backoff_and_nothing_applied_meanwhile(
    fleet, submitter
):
    job, action = _placement(fleet, submitter, "flaky", nodes=2)
    adapter = FlakyAdapter(down=3)

    delays = []
    for _ in range(3):
        result = execution.execute_next_step(action.pk, adapter=adapter)
        assert not result.more
        delays.append(result.retry_in)
        action.refresh_from_db()
        job.refresh_from_db()
        assert action.state == ActionState.EXECUTING and action.step_index == 0
        assert job.state == JobState.PENDING and nodes_of(job.pk) == set(), "nothing applied"
    assert delays == [2, 4, 8]
    last = action.log[-1]
    assert last["message"] == "cluster unavailable, retrying in 8 s: connection refused (slurmctld)"
    assert (last["status"], last["step"], last["retries"]) == ("retrying", 0, 3)
    assert len(action.log) == 1, "one entry per step put off, counting its retries"

    while execution.execute_next_step(action.pk, adapter=adapter).more:
        pass

    action.refresh_from_db()
    job.refresh_from_db()
    assert action.state == ActionState.SUCCEEDED
    assert adapter.performed == ["allocate", "start"]
    assert job.state == JobState.RUNNING and job.external_id == "4242"
    assert [e["status"] for e in action.log] == ["retrying", "done", "done"]


class HandedAdapter(InstantAdapter):
    """Records each step as it is handed over."""

    def __init__(self) -> None:
        self.handed: list[st.Step] = []

    def perform(self, action, index, step, report=None):
        self.handed.append(step)
        return super().perform(action, index, step, report)


def test_the_adapter_is_handed_the_hosts_the_job_holds_and_the_stored_steps_stay_as_planned(fleet, submitter):
    job, action = _placement(fleet, submitter, "handed", nodes=2)
    action.refresh_from_db()
    stored = action.steps
    adapter = HandedAdapter()
    while execution.execute_next_step(action.pk, adapter=adapter).more:
        pass
    allocate, start = adapter.handed
    hosts = sorted(n.hostname for n in fleet[0].nodes.order_by("slot")[:2])
    assert sorted(allocate.hostnames) == hosts
    job.refresh_from_db()
    assert start == st.Start(job=job.pk, hostnames=hosts, segments=job.placement["segments"])
    action.refresh_from_db()
    assert action.state == ActionState.SUCCEEDED and action.steps == stored

    # A swap is handed the job's hosts as it begins and the pairs by name; a
    # node step its hostname.
    spare = fleet[0].nodes.order_by("slot")[5]
    swap = execution.as_handed(st.Swap(job=job.pk, swaps={fleet[0].nodes.order_by("slot")[0].pk: spare.pk}))
    assert swap.hostnames == hosts and swap.hostname_swaps == {hosts[0]: spare.hostname}
    assert execution.as_handed(st.Drain(node=spare.pk)).hostname == spare.hostname


class WatchingAdapter(InstantAdapter):
    """Records, after each step commits, what another reader would see."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def after_step(self, action, index, step) -> None:
        job = Job.objects.get(pk=step.job)
        self.seen.append((Action.objects.get(pk=action.pk).state, job.state))


def test_the_last_step_and_the_action_s_success_commit_together(fleet, submitter):
    """The job never shows running while its placement still shows executing
    (seen by the real-Slurm test: it found the job running, the action not done)."""
    _job, action = _placement(fleet, submitter, "watched", nodes=1)
    adapter = WatchingAdapter()

    while execution.execute_next_step(action.pk, adapter=adapter).more:
        pass

    assert adapter.seen == [
        (ActionState.EXECUTING, JobState.PLACED),
        (ActionState.SUCCEEDED, JobState.RUNNING),
    ]


def test_the_execute_action_task_sends_itself_again_with_the_backoff_as_countdown(fleet, monkeypatch):
    from fleet import dispatch, tasks

    node = fleet[0].nodes.first()
    action = action_services.propose(
        kind=ActionKind.DRAIN, title="x", steps=[st.Drain(node=node.pk)], jobs=[]
    )
    Action.objects.filter(pk=action.pk).update(state=ActionState.APPROVED)
    monkeypatch.setattr("fleet.services.execution.execute.get_adapter", lambda: FlakyAdapter(down=1))
    sent = []
    monkeypatch.setattr(
        dispatch, "_send", lambda name, args, countdown=None: sent.append((name, args, countdown))
    )

    message = tasks.execute_action(action.pk)

    assert message == "cluster unavailable, retrying in 2 s"
    assert sent == [("fleet.tasks.execute_action", (action.pk,), 2)]
    node.refresh_from_db()
    assert node.state == "healthy", "the cluster did not drain it, so Rackwise did not either"


def test_an_execute_action_that_finds_the_action_busy_is_sent_again_not_dropped(fleet, monkeypatch):
    """A webhook callback can arrive while the worker that posted the step still
    holds the action's lock; the message the callback sends must not be lost
    (the suite saw a webhook job wait for reconcile, past 30 s)."""
    from fleet import dispatch, locks, tasks

    node = fleet[0].nodes.first()
    action = action_services.propose(
        kind=ActionKind.DRAIN, title="x", steps=[st.Drain(node=node.pk)], jobs=[]
    )
    Action.objects.filter(pk=action.pk).update(state=ActionState.EXECUTING)
    sent = []
    monkeypatch.setattr(
        dispatch, "_send", lambda name, args, countdown=None: sent.append((name, args, countdown))
    )
    dispatch.taken("fleet.tasks.execute_action", action.pk)

    with locks.action_lock(action.pk):  # another worker, in a step
        message = tasks.execute_action(action.pk)

    assert message == "another worker is executing it; trying again shortly"
    assert sent == [("fleet.tasks.execute_action", (action.pk,), 1)]
    dispatch.taken("fleet.tasks.execute_action", action.pk)


def test_the_webhook_cluster_unreachable_is_cluster_unavailable(fleet):
    node = fleet[0].nodes.first()
    action = action_services.propose(
        kind=ActionKind.DRAIN, title="x", steps=[st.Drain(node=node.pk)], jobs=[]
    )

    with pytest.raises(ClusterUnavailable, match="unreachable"):
        WebhookAdapter("http://127.0.0.1:9/steps", "secret", 600).perform(action, 0, st.Drain(node=node.pk))


# --- node changes are mirrored to the cluster, or refused ----------------------------------


class DownAdapter(InstantAdapter):
    """A cluster that does not answer at all."""

    def set_node_state(self, hostname: str, state: str, reason: str) -> None:
        raise ClusterUnavailable("slurmctld is not answering")

    def job_states(self, jobs) -> dict:
        raise ClusterUnavailable("slurmctld is not answering")


class MirrorAdapter(InstantAdapter):
    def __init__(self) -> None:
        self.nodes: list[tuple[str, str]] = []

    def set_node_state(self, hostname: str, state: str, reason: str) -> None:
        self.nodes.append((hostname, state))


@pytest.mark.parametrize("action", ["drain", "mark-failed"])
def test_a_node_change_the_cluster_cannot_take_is_a_503_and_changes_nothing(
    fleet, operator_client, monkeypatch, action
):
    monkeypatch.setattr("fleet.services.nodes.lifecycle.get_adapter", lambda: DownAdapter())
    node = fleet[0].nodes.get(slot=2)

    response = operator_client.post(f"/api/nodes/{node.pk}/{action}/", {"reason": "x"}, format="json")

    assert response.status_code == 503, response.content
    assert response["Retry-After"] == "5"
    assert "slurmctld is not answering" in response.json()["detail"]
    node.refresh_from_db()
    assert node.state == "healthy"
    assert not AuditEvent.objects.filter(object_type="node", object_id=str(node.pk)).exists()


def test_node_changes_are_mirrored_to_the_cluster(fleet, operator, monkeypatch):
    mirror = MirrorAdapter()
    monkeypatch.setattr("fleet.services.nodes.lifecycle.get_adapter", lambda: mirror)
    node = fleet[0].nodes.get(slot=2)

    node_services.drain_node(operator, node.pk, "firmware")
    node_services.undrain_node(operator, node.pk, "done")
    node_services.mark_node_failed(operator, node.pk, "xid 79")
    node_services.return_node_to_service(operator, node.pk, "reseated")
    node_services.drain_node(operator, node.pk, "told by the cluster", mirror=False)

    assert mirror.nodes == [(node.hostname, s) for s in ("draining", "healthy", "failed", "healthy")]


def test_an_undrain_step_undrains_the_node(fleet, operator):
    node = fleet[0].nodes.get(slot=2)
    node_services.drain_node(operator, node.pk, "firmware")
    action = action_services.propose(
        kind=ActionKind.DRAIN,
        title="undrain",
        steps=[st.Undrain(node=node.pk, hostname=node.hostname)],
        jobs=[],
    )
    Action.objects.filter(pk=action.pk).update(state=ActionState.APPROVED)

    while execution.execute_next_step(action.pk, adapter=InstantAdapter()).more:
        pass

    node.refresh_from_db()
    action.refresh_from_db()
    assert action.state == ActionState.SUCCEEDED, action.error
    assert node.state == "healthy"
    assert action_services.check_plan(action, [st.Undrain(node=node.pk).to_dict()]) == [
        f"node {node.pk} is healthy, it can no longer be undrained"
    ]


# --- settings: RACKWISE_CLUSTER, and the old name -----------------------------------------


def _cluster_setting(**env: str) -> subprocess.CompletedProcess:
    base = os.environ.copy()
    for name in ("RACKWISE_CLUSTER", "RACKWISE_EXECUTOR"):
        base.pop(name, None)
    base.update(DEBUG="1", DJANGO_SETTINGS_MODULE="rackwise.settings", **env)
    code = "import django; django.setup(); from django.conf import settings; print(settings.RACKWISE_CLUSTER)"
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=base, capture_output=True, text=True, timeout=60
    )


def test_rackwise_executor_still_works_for_one_release_with_a_deprecation_warning():
    hook = {"RACKWISE_WEBHOOK_URL": "http://127.0.0.1:1/x", "RACKWISE_WEBHOOK_SECRET": "s"}
    old = _cluster_setting(RACKWISE_EXECUTOR="webhook", **hook)
    new = _cluster_setting(RACKWISE_CLUSTER="webhook", RACKWISE_EXECUTOR="simulated", **hook)
    default = _cluster_setting()

    assert old.returncode == 0, old.stderr
    assert old.stdout.strip() == "webhook"
    assert "RACKWISE_EXECUTOR is deprecated" in old.stderr
    assert new.stdout.strip() == "webhook" and "deprecated" not in new.stderr
    assert default.stdout.strip() == "simulated"
    refused = _cluster_setting(RACKWISE_CLUSTER="webhook")
    assert refused.returncode != 0 and "RACKWISE_CLUSTER=webhook needs RACKWISE_WEBHOOK_URL" in refused.stderr


# --- a job the cluster holds for Rackwise ends there -----------------------------------


class EndedAdapter(InstantAdapter):
    """A cluster in which every job Rackwise asks about has failed, and which
    refuses to start a job again (as the Slurm adapter refuses to resubmit)."""

    def perform(self, action, index, step, report=None):
        raise StepFailed(f"job #{step.job} already ended in the cluster")

    def job_states(self, jobs):
        return {job.pk: JobReport(job.external_id or "", JOB_FAILED, reason="NODE_FAIL") for job in jobs}


def test_a_pending_job_whose_cluster_job_ended_is_ended_by_the_failed_step_not_placed_again(fleet, submitter):
    # Before: sync asked only about jobs holding GPUs, so a job held pending in
    # the cluster (stopped for a move, or adopted) that ended there stayed
    # pending, and each scheduling pass placed it again, and failed again.
    nodes = list(fleet[0].nodes.order_by("slot")[:1])
    job = job_services.submit_job(submitter, job_services.JobSpec(name="gone", num_gpus=4, tenant="llm"))
    Job.objects.filter(pk=job.pk).update(external_id="77")
    action = action_services.propose(
        kind=ActionKind.PLACEMENT,
        title="place",
        steps=[st.Allocate(job=job.pk, nodes={nodes[0].pk: [0, 1, 2, 3]}), st.Start(job=job.pk)],
        jobs=[job.pk],
    )

    result = execution.execute_next_step(action.pk, adapter=EndedAdapter())

    assert result.message == "failed"
    job.refresh_from_db()
    assert job.state == JobState.FAILED and job.state_reason == "NODE_FAIL"
    assert cluster_sync.sync_jobs(EndedAdapter())["asked"] == 0
