"""The Job and Node lifecycles: each is the one writer of its aggregate's state.

Every (state, move) pair their tables leave out is refused with Conflict and
writes nothing (no row, no audit record, no rack version); and no other module
of ``fleet`` assigns or updates ``state`` on a job or a node (read from the
source, so a new writer fails here before it can bypass the check, the audit
and the events)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from django.forms.models import model_to_dict

from fleet.choices import JobState, NodeState
from fleet.models import Allocation, AuditEvent, Job, Node, Rack
from fleet.services.errors import Conflict
from fleet.services.jobs import allocations as job_allocations
from fleet.services.jobs import lifecycle as job_lifecycle
from fleet.services.jobs import submit as job_services
from fleet.services.nodes import lifecycle as node_lifecycle
from fleet.steps import Allocate

ROOT = Path(__file__).resolve().parent.parent


def _written(node: Node | None = None, job: Job | None = None) -> tuple:
    """Everything a refused move could have written."""
    return (
        model_to_dict(Node.objects.get(pk=node.pk)) if node else None,
        model_to_dict(Job.objects.get(pk=job.pk)) if job else None,
        AuditEvent.objects.count(),
        Allocation.objects.count(),
        sorted(Rack.objects.values_list("pk", "version")),
    )


JOB_PAIRS = [
    (state, move)
    for move, spec in job_lifecycle.MOVES.items()
    for state in JobState.values
    if state not in spec.allowed_from
]
NODE_PAIRS = [
    (state, move)
    for move, spec in node_lifecycle.MOVES.items()
    for state in NodeState.values
    if state not in spec.allowed_from
]


def test_the_tables_leave_pairs_out():
    # Not a vacuous walk: each table refuses moves from most states.
    assert len(JOB_PAIRS) >= 20 and len(NODE_PAIRS) >= 20


@pytest.mark.parametrize(("state", "move"), JOB_PAIRS)
def test_a_job_move_its_state_does_not_allow_is_refused_and_writes_nothing(fleet, submitter, state, move):
    job = job_services.submit_job(submitter, job_services.JobSpec(name="train", num_gpus=4))
    Job.objects.filter(pk=job.pk).update(state=state)  # the state under test, however it came about
    before = _written(job=job)

    with pytest.raises(Conflict, match=f"job #{job.pk} is "):
        job_lifecycle.transition(None, job.pk, move, to=job_lifecycle.MOVES[move].to[0], reason="test")

    assert _written(job=job) == before


def test_a_pending_job_finishes_only_when_it_has_a_job_in_the_cluster(fleet, submitter):
    job = job_services.submit_job(submitter, job_services.JobSpec(name="train", num_gpus=4))
    before = _written(job=job)
    with pytest.raises(Conflict, match="holds no GPUs to finish with"):
        job_allocations.finish_job(None, job.pk, succeeded=True)
    assert _written(job=job) == before

    job_services.set_external_id(job.pk, "4242")
    assert job_allocations.finish_job(None, job.pk, succeeded=False).state == JobState.FAILED


def test_placing_a_job_that_is_not_pending_is_refused_by_the_same_table(fleet, submitter):
    node = fleet[0].nodes.get(slot=0)
    job = job_services.submit_job(submitter, job_services.JobSpec(name="train", num_gpus=4))
    Job.objects.filter(pk=job.pk).update(state=JobState.RUNNING)
    before = _written(job=job)

    placed, refused = job_allocations.place_jobs(
        None, [Allocate(job=job.pk, nodes={node.pk: [0, 1, 2, 3]}, reason="test")]
    )

    assert placed == [] and refused == {job.pk: f"job #{job.pk} is running, not pending; it cannot be placed"}
    assert _written(job=job) == before


def test_a_batch_with_a_job_its_state_does_not_allow_is_refused_whole(fleet, submitter):
    pending = job_services.submit_job(submitter, job_services.JobSpec(name="a", num_gpus=4))
    running = job_services.submit_job(submitter, job_services.JobSpec(name="b", num_gpus=4))
    Job.objects.filter(pk=running.pk).update(state=JobState.RUNNING)
    jobs = list(Job.objects.filter(pk__in=[pending.pk, running.pk]).order_by("pk"))
    before = (_written(job=pending), _written(job=running))

    with pytest.raises(Conflict, match=f"job #{running.pk} is running, not pending"):
        job_lifecycle.apply_many(None, jobs, "place", reason_of=lambda job: "")

    assert (_written(job=pending), _written(job=running)) == before


@pytest.mark.parametrize(("state", "move"), NODE_PAIRS)
def test_a_node_move_its_state_does_not_allow_is_refused_and_writes_nothing(fleet, state, move):
    node = fleet[0].nodes.get(slot=2)
    Node.objects.filter(pk=node.pk).update(state=state)
    before = _written(node=node)

    refusal = f"node {node.hostname} is {state}; {node_lifecycle.MOVES[move].refusal}"
    with pytest.raises(Conflict, match=re.escape(refusal)):
        node_lifecycle.transition(None, node.pk, move, reason="test")

    assert _written(node=node) == before


def test_a_move_with_a_stale_condition_returns_none_and_writes_nothing(fleet):
    node = fleet[0].nodes.get(slot=2)
    before = _written(node=node)
    # A healthy node that is not draining: settling it (a job's end saw it
    # draining) finds it changed and does nothing.
    assert node_lifecycle.transition(None, node.pk, "settle", where={"state": NodeState.DRAINING}) is None
    assert _written(node=node) == before


def test_every_move_of_each_table_ends_in_a_state_of_its_aggregate():
    for spec in job_lifecycle.MOVES.values():
        assert set(spec.allowed_from) | set(spec.to) <= set(JobState.values)
    for spec in node_lifecycle.MOVES.values():
        assert set(spec.allowed_from) | set(spec.to) <= set(NodeState.values)


# --- only the lifecycle writes state ---------------------------------------------------

# Each lifecycle module, and the one place outside them that writes a `state`
# field that is neither a job's nor a node's.
OWNERS = {
    "fleet/services/jobs/lifecycle.py": "Job.state",
    "fleet/services/nodes/lifecycle.py": "Node.state",
    "fleet/services/actions/lifecycle.py": "Action.state",
}
NOT_JOBS_OR_NODES = {
    ("fleet/agent.py", "reading"): "a GPU reading the agent sends, not a row",
    ("fleet/services/webhooks.py", "WebhookDelivery"): "a webhook delivery's state",
    ("fleet/views.py", "context"): "a template context (a dict) with the filter's state",
}
STATE_FIELDS = {"state", "state_reason"}


def _writes_of_state(tree: ast.AST) -> list[tuple[int, str, str]]:
    """(line, object or call, field) for each ``x.state = ...`` and each
    ``.update(state=...)`` / ``.create(state=...)`` / ``Model(state=...)``."""
    found = []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            if isinstance(target, ast.Attribute) and target.attr in STATE_FIELDS:
                found.append((node.lineno, ast.unparse(target.value), target.attr))
            if (
                isinstance(target, ast.Call)
                and isinstance(target.func, ast.Name)
                and target.func.id == "setattr"
            ):
                found.append((node.lineno, "setattr", "?"))
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in ("update", "create", "get_or_create", "update_or_create", "Job", "Node"):
                for keyword in node.keywords:
                    if keyword.arg in STATE_FIELDS:
                        found.append((node.lineno, ast.unparse(node.func), keyword.arg))
    return found


def _fleet_sources():
    for path in sorted((ROOT / "fleet").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if "/migrations/" not in rel:
            yield rel, ast.parse(path.read_text(), filename=rel)


def test_only_the_lifecycles_write_the_state_of_a_job_or_a_node():
    bypasses = []
    for rel, tree in _fleet_sources():
        if rel in OWNERS:
            continue
        for line, obj, field in _writes_of_state(tree):
            if not any(rel == path and obj.startswith(prefix) for path, prefix in NOT_JOBS_OR_NODES):
                bypasses.append(f"{rel}:{line}: {obj}.{field}")
    assert bypasses == [], "state written outside its lifecycle:\n" + "\n".join(bypasses)


def test_the_source_check_finds_a_bypass():
    # The check itself can fail: each form of write it looks for is found.
    sample = ast.parse(
        "job.state = 'running'\n"
        "Node.objects.filter(pk=1).update(state='drained')\n"
        "Job.objects.filter(pk=1).update(state_reason='x')\n"
        "Job(name='x', state='pending')\n"
    )
    assert [(line, field) for line, _, field in _writes_of_state(sample)] == [
        (1, "state"),
        (2, "state"),
        (3, "state_reason"),
        (4, "state"),
    ]
