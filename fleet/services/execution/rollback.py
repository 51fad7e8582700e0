"""Rolling back a plan that failed midway: every job it stopped runs again in
the same pass, on its old nodes or its new ones, while the plan still holds
them (``fleet.services.actions.lifecycle``: holds), so nothing else has taken
them. Called by :func:`fleet.services.execution.execute.execute_next_step` before the
action is marked failed; the failure's cost in GPU-hours is the lifecycle's
``lost_so_far``."""

from __future__ import annotations

from dataclasses import dataclass

from django.db import transaction
from django.utils import timezone

from fleet.choices import JobState
from fleet.cluster.base import WAITING, ClusterAdapter, ClusterUnavailable, StepFailed
from fleet.models import Action, Allocation, Job
from fleet.services.actions import lifecycle
from fleet.services.actions import rules as step_rules
from fleet.services.errors import ServiceError
from fleet.services.jobs import allocations as job_allocations
from fleet.services.jobs import lifecycle as job_lifecycle
from fleet.services.jobs import submit as job_services
from fleet.steps import Allocate, Start, Step, StepError


@dataclass
class RollBack:
    """What :func:`roll_back` did: log entries, and the jobs by where they run."""

    entries: list[dict]
    old_nodes: list[int]
    new_nodes: list[int]
    queued: list[int]

    def summary(self) -> str:
        running = len(self.old_nodes) + len(self.new_nodes)
        text = f"rolled back: {running} stopped job(s) running again"
        if running:
            text += f" ({len(self.old_nodes)} on their old nodes, {len(self.new_nodes)} on their new ones)"
        if self.queued:
            text += (
                f"; {len(self.queued)} back in the queue (" + ", ".join(f"#{j}" for j in self.queued) + ")"
            )
        return text


def roll_back(action: Action, adapter: ClusterAdapter) -> RollBack:
    """Put every job the plan stopped back to running, in this pass, while the
    plan still holds its nodes (so nothing else took them).

    1. A job the plan stopped and placed again is started where it was placed.
    2. A job stopped and not placed again goes back on the GPUs it left (its
       allocations released by the stop); if those are taken (by the plan's own
       earlier moves), on the nodes the plan meant for it.
    3. Each through the adapter and the job services, as a step would be.
    4. A job that cannot be started anywhere goes back to the queue, saying why.
    """
    out = RollBack([], [], [], [])
    stopped: list[int] = []
    for data in action.steps[: action.step_index]:
        if isinstance(data, dict) and data.get("op") in lifecycle.RELEASE_OPS and data.get("job") is not None:
            job_id = int(data["job"])
            if job_id not in stopped:
                stopped.append(job_id)
    planned: dict[int, Allocate] = {}
    for data in action.steps:
        try:
            step = Step.from_dict(data)
        except StepError:
            continue
        if isinstance(step, Allocate) and step.job in stopped:
            planned[step.job] = step  # the last one: where the plan meant it to end
    index = len(action.steps)  # rollback steps are numbered after the plan's own
    for job_id in stopped:
        job = Job.objects.filter(pk=job_id).first()
        if job is None or job.state not in (JobState.PENDING, JobState.PLACED):
            continue  # running (moved, or never stopped), or ended meanwhile
        reason = f"action #{action.pk} failed; restarted by its rollback"
        if job.state == JobState.PENDING:
            where = _restore_placement(action, adapter, job, planned.get(job_id), reason, index, out)
            index += 1
            if where is None:
                continue
        else:
            where = "new"
        try:
            index += 1
            outcome = adapter.perform(action, index, Start(job=job_id))
            if outcome.status == WAITING:
                raise StepFailed("the cluster has not started it yet")
            job_allocations.start_job(None, job_id)
        except (StepFailed, ClusterUnavailable, ServiceError) as exc:
            _requeue_after_rollback(action, job_id, f"could not be started again: {exc}", out)
            continue
        (out.old_nodes if where == "old" else out.new_nodes).append(job_id)
        out.entries.append(_rollback_entry(job_id, f"job #{job_id} running again on its {where} nodes"))
    return out


def _restore_placement(
    action: Action,
    adapter: ClusterAdapter,
    job: Job,
    planned: Allocate | None,
    reason: str,
    index: int,
    out: RollBack,
) -> str | None:
    """Place a stopped job again: on the GPUs it left, else where the plan meant
    it to go. Returns "old" or "new", or None (it went back to the queue)."""
    tries: list[tuple[str, dict[int, list[int]], list | None]] = []
    left = _gpus_left(job.pk)
    if left:
        tries.append(("old", left, (job.placement or {}).get("segments")))
    if planned is not None:
        tries.append(("new", {int(k): list(v) for k, v in planned.nodes.items()}, planned.segments))
    why = "no GPUs to go back to"
    for where, nodes, segments in tries:
        try:
            step_rules.refuse_held(action, nodes)
            outcome = adapter.perform(
                action, index, Allocate(job=job.pk, nodes=nodes, segments=segments, reason=reason)
            )
            if outcome.status == WAITING:
                raise StepFailed("the cluster has not placed it yet")
            with transaction.atomic():
                job_allocations.apply_placement(None, job.pk, nodes, reason=reason, segments=segments)
                if outcome.external_id:
                    job_services.set_external_id(job.pk, outcome.external_id)
            return where
        except (StepFailed, ClusterUnavailable, ServiceError) as exc:
            why = f"{where} nodes: {exc}"
    _requeue_after_rollback(action, job.pk, why, out)
    return None


def _gpus_left(job_id: int) -> dict[int, list[int]]:
    """The GPUs a job held until it was last stopped (node id -> indices)."""
    released = Allocation.objects.filter(job_id=job_id, released_at__isnull=False)
    last = released.order_by("-released_at").values_list("released_at", flat=True).first()
    if last is None:
        return {}
    out: dict[int, list[int]] = {}
    for node_id, gpu in released.filter(released_at=last).values_list("gpu__node_id", "gpu__index"):
        out.setdefault(node_id, []).append(gpu)
    return {n: sorted(g) for n, g in out.items()}


def _requeue_after_rollback(action: Action, job_id: int, why: str, out: RollBack) -> None:
    reason = (
        f"action #{action.pk} failed and its rollback could not restart the job ({why}); waiting in the queue"
    )
    job_lifecycle.note_waiting(job_id, reason)
    out.queued.append(job_id)
    out.entries.append(_rollback_entry(job_id, f"job #{job_id} back in the queue: {why}"))


def _rollback_entry(job_id: int, message: str) -> dict:
    return {
        "at": timezone.now().isoformat(),
        "op": "rollback",
        "job": job_id,
        "status": "rolled back",
        "message": message[:1000],
    }
