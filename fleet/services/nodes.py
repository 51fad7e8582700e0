"""Node state changes requested by operators (and, later, by health checks).

Allowed transitions::

    healthy|suspect   --drain-->          draining (jobs still on it) | drained
    draining|drained  --undrain-->        healthy
    any but failed/in_repair --fail-->    failed   (jobs on it go to recovering)
    failed|in_repair|suspect --return-->  healthy  (GPU health reset to ok)

Each change is mirrored to the cluster (``ClusterAdapter.set_node_state``)
with the node row locked, before the transaction commits: if the cluster
cannot take it, the change is refused (:class:`ClusterDown`, a 503) and nothing
changes, so Rackwise and the cluster never disagree for long. ``mirror=False``
is for changes the cluster already has: a node step an adapter just carried
out, or a state the cluster itself reported.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from fleet import engine, events
from fleet.choices import HOLDING_JOB_STATES, GpuHealth, JobState, NodeState
from fleet.cluster.base import (
    NODE_DRAINING,
    NODE_FAILED,
    NODE_HEALTHY,
    ClusterUnavailable,
    StepFailed,
    get_adapter,
)
from fleet.models import GPU, Allocation, Job, Node
from fleet.services import audit, dispatch, webhooks
from fleet.services.errors import ClusterDown, Conflict, InvalidInput
from fleet.services.racks import bump_versions, racks_held_by
from fleet.text import clip
from placement.recover import restart_cost_gpu_hours

# Where each move may start (the module docstring's table).
DRAINABLE = (NodeState.HEALTHY, NodeState.SUSPECT)
UNDRAINABLE = (NodeState.DRAINING, NodeState.DRAINED)
FAILABLE = (NodeState.HEALTHY, NodeState.SUSPECT, NodeState.DRAINING, NodeState.DRAINED)
RETURNABLE = (NodeState.FAILED, NodeState.IN_REPAIR, NodeState.SUSPECT)


def _snapshot(node: Node) -> dict[str, str]:
    return {"state": node.state, "state_reason": node.state_reason}


def _transition(
    actor,
    node_id: int,
    *,
    action: str,
    allowed_from: tuple[str, ...],
    to_state: str | Callable[[Node], str],
    reason: str,
    refusal: str,
    cluster_state: str | None = None,
) -> Node:
    """Lock the node, check the transition is allowed, mirror it to the cluster
    (``cluster_state``, a ``NODE_*``; None: not mirrored), apply it, and audit it.
    ``to_state`` may depend on the locked node (a drain ends draining or drained).
    Must be called inside a transaction; the caller bumps the rack version last
    (rack rows are always locked last, so services never wait on each other in a
    cycle)."""
    node = Node.objects.select_for_update().get(pk=node_id)
    if node.state not in allowed_from:
        raise Conflict(f"node {node.hostname} is {node.state}; {refusal}")
    if cluster_state is not None:
        mirror_node_state(node.hostname, cluster_state, reason)
    before = _snapshot(node)
    node.state = to_state(node) if callable(to_state) else to_state
    node.state_reason = clip(reason)
    node.state_changed_at = timezone.now()
    node.save(update_fields=["state", "state_reason", "state_changed_at"])
    audit.record(actor, action, node, before=before, after=_snapshot(node), message=reason)
    return node


def mirror_node_state(hostname: str, state: str, reason: str) -> None:
    """Tell the cluster of a node change Rackwise is about to commit. Raises
    ClusterDown (the cluster did not answer) or Conflict (it refused)."""
    try:
        get_adapter().set_node_state(hostname, state, reason)
    except ClusterUnavailable as exc:
        raise ClusterDown(f"the cluster is unavailable, node {hostname} was not changed: {exc}") from exc
    except StepFailed as exc:
        raise Conflict(f"the cluster refused the change of node {hostname}: {exc}") from exc


def _has_active_allocations(node: Node) -> bool:
    return Allocation.objects.filter(gpu__node=node, released_at__isnull=True).exists()


def drain_node(actor, node_id: int, reason: str = "", *, mirror: bool = True) -> Node:
    """Stop new work landing on the node; running jobs finish where they are."""
    with transaction.atomic():
        node = _transition(
            actor,
            node_id,
            action="node.drain",
            allowed_from=DRAINABLE,
            to_state=lambda n: NodeState.DRAINING if _has_active_allocations(n) else NodeState.DRAINED,
            reason=reason or "drained by operator",
            refusal="only a healthy or suspect node can be drained",
            cluster_state=NODE_DRAINING if mirror else None,
        )
        bump_versions([node.rack_id])
    return node


def idle_draining_nodes(node_ids: Iterable[int] | None = None) -> QuerySet[Node]:
    """Draining nodes (of ``node_ids``, or all) that hold no GPUs any more: the
    ones due to become drained."""
    idle = Node.objects.filter(state=NodeState.DRAINING).exclude(
        id__in=Allocation.objects.filter(released_at__isnull=True).values("gpu__node_id")
    )
    return idle if node_ids is None else idle.filter(id__in=list(node_ids))


def settle_drained_nodes() -> list[int]:
    """Draining nodes that hold no GPUs any more become drained. A job's release
    does this itself, but skips a node another transaction holds at that moment
    (see jobs._release); reconcile calls this to catch those. Returns the ids."""
    settled = []
    for node_id in idle_draining_nodes().values_list("id", flat=True):
        with transaction.atomic():
            node = Node.objects.select_for_update().filter(pk=node_id, state=NodeState.DRAINING).first()
            if node is None or _has_active_allocations(node):
                continue  # changed since it was selected
            node.state = NodeState.DRAINED
            node.state_changed_at = timezone.now()
            node.save(update_fields=["state", "state_changed_at"])
            bump_versions([node.rack_id])
            settled.append(node.pk)
    return settled


def undrain_node(actor, node_id: int, reason: str = "", *, mirror: bool = True) -> Node:
    with transaction.atomic():
        node = _transition(
            actor,
            node_id,
            action="node.undrain",
            allowed_from=UNDRAINABLE,
            to_state=NodeState.HEALTHY,
            reason=reason,
            refusal="only a draining or drained node can be undrained",
            cluster_state=NODE_HEALTHY if mirror else None,
        )
        bump_versions([node.rack_id])
        dispatch.schedule_soon()
    return node


def mark_node_failed(actor, node_id: int, reason: str = "", *, mirror: bool = True) -> Node:
    """Take a node out of service. Jobs holding GPUs on it are interrupted and
    move to ``recovering``; the control loop swaps in a spare."""
    with transaction.atomic():
        node = _transition(
            actor,
            node_id,
            action="node.fail",
            allowed_from=FAILABLE,
            to_state=NodeState.FAILED,
            reason=reason or "marked failed by operator",
            refusal="it is already out of service",
            cluster_state=NODE_FAILED if mirror else None,
        )
        job_ids = Allocation.objects.filter(
            gpu__node=node, released_at__isnull=True
        ).values_list("job_id", flat=True)
        interrupted = []
        for job in Job.objects.select_for_update().filter(
            id__in=list(job_ids), state__in=HOLDING_JOB_STATES
        ).order_by("pk"):  # id order, as every multi-job lock
            interrupted.append(job.pk)
            before = {"state": job.state, "state_reason": job.state_reason}
            job.state = JobState.RECOVERING
            job.state_reason = clip(f"node {node.hostname} failed: {node.state_reason}")
            job.save(update_fields=["state", "state_reason"])
            audit.record(
                actor,
                "job.interrupt",
                job,
                before=before,
                after={"state": job.state, "state_reason": job.state_reason},
            )
            events.jobs_changed([job.pk])
            dispatch.recover_soon(job.pk)
        webhooks.emit("node.failed", webhooks.node_failed(node, job_ids))
        # Every rack the interrupted jobs hold GPUs in shows their new state.
        bump_versions({node.rack_id} | racks_held_by(interrupted))
    return node


def return_node_to_service(actor, node_id: int, reason: str = "", *, mirror: bool = True) -> Node:
    """A repaired node comes back healthy, with its GPUs' health reset."""
    with transaction.atomic():
        node = _transition(
            actor,
            node_id,
            action="node.return",
            allowed_from=RETURNABLE,
            to_state=NodeState.HEALTHY,
            reason=reason or "returned to service",
            refusal="only a failed, in-repair or suspect node can be returned to service "
            "(use undrain for a drained node)",
            cluster_state=NODE_HEALTHY if mirror else None,
        )
        GPU.objects.filter(node=node).exclude(health=GpuHealth.OK).update(
            health=GpuHealth.OK, last_error="", health_changed_at=timezone.now()
        )
        bump_versions([node.rack_id])
        dispatch.schedule_soon()
    return node


# --- operators' moves, guarded ---------------------------------------------------------


@dataclass(frozen=True)
class NodeMove:
    """A move an operator may ask of a node (the API path and the console's
    button). A disruptive move takes capacity out of service: it needs a reason,
    and, when the node holds jobs, a confirmation that names what it affects."""

    name: str
    label: str
    allowed_from: tuple[str, ...]
    disruptive: bool
    apply: Callable[..., Node]


@dataclass(frozen=True)
class Impact:
    """What a move would do to the jobs on a node: each job (id, name, its GPUs
    here and in all, the GPU-hours a stop now would lose) and the total lost."""

    move: str
    hostname: str
    jobs: list[dict]
    gpu_hours: float

    def describe(self) -> str:
        names = ", ".join(f"#{j['id']} {j['name']} ({j['gpus']} GPUs)" for j in self.jobs)
        count = f"{len(self.jobs)} job{'s' if len(self.jobs) != 1 else ''}"
        if self.move == "mark-failed":
            return (
                f"marking {self.hostname} failed interrupts {count}: {names}; they lose about "
                f"{self.gpu_hours:.1f} GPU-hours (work since their last checkpoint, and the restart)"
            )
        return (
            f"draining {self.hostname} affects {count}: {names}; they keep running there until they end, "
            f"but nothing new lands on it and a restart in place cannot use it"
        )


class ConfirmationNeeded(Conflict):
    """A disruptive move on a node that holds jobs, asked without ``confirm``
    (HTTP 409 with the impact)."""

    def __init__(self, impact: Impact) -> None:
        super().__init__(
            f"{impact.describe()}. Send confirm: true to go ahead.",
            confirm_required=True,
            impact={"move": impact.move, "node": impact.hostname, "jobs": impact.jobs, "gpu_hours_lost": impact.gpu_hours},
        )
        self.impact = impact


def impact_of(node: Node, move: str) -> Impact:
    """The jobs holding GPUs on ``node`` and what ``move`` would cost them."""
    job_ids = set(
        Allocation.objects.filter(gpu__node=node, released_at__isnull=True).values_list("job_id", flat=True)
    )
    now = timezone.now()
    jobs = []
    total = 0.0
    for job in Job.objects.filter(pk__in=job_ids).order_by("pk"):
        gpus = Allocation.objects.filter(job=job, released_at__isnull=True).count()
        here = Allocation.objects.filter(job=job, gpu__node=node, released_at__isnull=True).count()
        lost = 0.0
        if move == "mark-failed":
            started = job.started_at.timestamp() if job.started_at else None
            lost = restart_cost_gpu_hours(engine.job_request(job), gpus, now=now.timestamp(), started_at=started)
        total += lost
        jobs.append({"id": job.pk, "name": job.name, "state": job.state, "gpus": gpus, "gpus_here": here,
                     "gpu_hours_lost": round(lost, 2)})
    return Impact(move, node.hostname, jobs, round(total, 2))


MOVES: dict[str, NodeMove] = {
    m.name: m
    for m in (
        NodeMove("drain", "Drain", DRAINABLE, True, drain_node),
        NodeMove("undrain", "Undrain", UNDRAINABLE, False, undrain_node),
        NodeMove("mark-failed", "Mark failed", FAILABLE, True, mark_node_failed),
        NodeMove("return-to-service", "Return to service", RETURNABLE, False, return_node_to_service),
    )
}


def moves_for(state: str) -> list[str]:
    """The moves a node in ``state`` allows, in the console's order."""
    return [m.name for m in MOVES.values() if state in m.allowed_from]


def operator_move(actor, node_id: int, move: str, reason: str = "", *, confirm: bool = False) -> Node:
    """An operator's move on a node, guarded: a disruptive move needs a reason
    (InvalidInput), and on a node that holds jobs, ``confirm`` (else
    ConfirmationNeeded, naming the jobs and the GPU-hours at stake); a move the
    node's state does not allow is a Conflict. The node row is locked while the
    impact is read, so what was confirmed is what happens."""
    spec = MOVES[move]
    reason = reason.strip()
    if spec.disruptive and not reason:
        raise InvalidInput({"reason": [f"say why: {spec.label.lower()} takes the node out of service, "
                                       "and the reason is shown to everyone and kept in the audit log"]})
    with transaction.atomic():
        node = Node.objects.select_for_update().get(pk=node_id)
        # A move the state does not allow is refused by the move itself, saying why.
        if spec.disruptive and not confirm and node.state in spec.allowed_from:
            impact = impact_of(node, move)
            if impact.jobs:
                raise ConfirmationNeeded(impact)
        return spec.apply(actor, node_id, reason)
