"""Node state changes requested by operators, health checks and the cluster.
Each is a move of the node lifecycle (``node_lifecycle``, its table and the
cluster mirror); these add what follows in other aggregates: a failure
interrupts the jobs on the node, a return resets its GPUs' health, and a change
that frees capacity asks for a scheduling pass."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from django.db import transaction
from django.utils import timezone

from fleet import dispatch, engine
from fleet.choices import HOLDING_JOB_STATES, GpuHealth
from fleet.models import GPU, Allocation, Job, Node
from fleet.services import webhooks
from fleet.services.errors import Conflict, InvalidInput
from fleet.services.jobs import lifecycle as job_lifecycle
from fleet.services.nodes import lifecycle as node_lifecycle
from fleet.services.nodes.lifecycle import MOVES as LIFECYCLE
from fleet.services.racks import racks_held_by
from placement.recover import restart_cost_gpu_hours


def drain_node(actor, node_id: int, reason: str = "", *, mirror: bool = True) -> Node:
    """Stop new work landing on the node; running jobs finish where they are."""
    node = node_lifecycle.transition(
        actor, node_id, "drain", reason=reason or "drained by operator", mirror=mirror
    )
    assert node is not None  # no where, no nowait, no settle: a refusal raises
    return node


def undrain_node(actor, node_id: int, reason: str = "", *, mirror: bool = True) -> Node:
    with transaction.atomic():
        node = node_lifecycle.transition(actor, node_id, "undrain", reason=reason, mirror=mirror)
        dispatch.schedule_soon()
    assert node is not None  # no where, no nowait, no settle: a refusal raises
    return node


def mark_node_failed(actor, node_id: int, reason: str = "", *, mirror: bool = True) -> Node:
    """Take a node out of service. Jobs holding GPUs on it are interrupted and
    move to ``recovering``; the control loop swaps in a spare."""

    def interrupt(node: Node) -> set[int]:
        job_ids = list(
            Allocation.objects.filter(gpu__node=node, released_at__isnull=True).values_list(
                "job_id", flat=True
            )
        )
        # id order, as every multi-job lock
        jobs = list(
            Job.objects.select_for_update()
            .filter(id__in=job_ids, state__in=HOLDING_JOB_STATES)
            .order_by("pk")
        )
        job_lifecycle.apply_many(
            actor,
            jobs,
            "interrupt",
            reason_of=lambda job: f"node {node.hostname} failed: {node.state_reason}",
        )
        webhooks.emit("node.failed", webhooks.node_failed(node, job_ids))
        # Every rack the interrupted jobs hold GPUs in shows their new state.
        return racks_held_by(j.pk for j in jobs)

    node = node_lifecycle.transition(
        actor, node_id, "fail", reason=reason or "marked failed by operator", mirror=mirror, effect=interrupt
    )
    assert node is not None  # no where, no nowait, no settle: a refusal raises
    return node


def return_node_to_service(actor, node_id: int, reason: str = "", *, mirror: bool = True) -> Node:
    """A repaired node comes back healthy, with its GPUs' health reset."""

    def reset_gpus(node: Node) -> set[int]:
        GPU.objects.filter(node=node).exclude(health=GpuHealth.OK).update(
            health=GpuHealth.OK, last_error="", health_changed_at=timezone.now()
        )
        return set()

    with transaction.atomic():
        node = node_lifecycle.transition(
            actor, node_id, "return", reason=reason or "returned to service", mirror=mirror, effect=reset_gpus
        )
        dispatch.schedule_soon()
    assert node is not None  # no where, no nowait, no settle: a refusal raises
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
            impact={
                "move": impact.move,
                "node": impact.hostname,
                "jobs": impact.jobs,
                "gpu_hours_lost": impact.gpu_hours,
            },
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
            lost = restart_cost_gpu_hours(
                engine.job_request(job), gpus, now=now.timestamp(), started_at=started
            )
        total += lost
        jobs.append(
            {
                "id": job.pk,
                "name": job.name,
                "state": job.state,
                "gpus": gpus,
                "gpus_here": here,
                "gpu_hours_lost": round(lost, 2),
            }
        )
    return Impact(move, node.hostname, jobs, round(total, 2))


MOVES: dict[str, NodeMove] = {
    m.name: m
    for m in (
        NodeMove("drain", "Drain", LIFECYCLE["drain"].allowed_from, True, drain_node),
        NodeMove("undrain", "Undrain", LIFECYCLE["undrain"].allowed_from, False, undrain_node),
        NodeMove("mark-failed", "Mark failed", LIFECYCLE["fail"].allowed_from, True, mark_node_failed),
        NodeMove(
            "return-to-service",
            "Return to service",
            LIFECYCLE["return"].allowed_from,
            False,
            return_node_to_service,
        ),
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
        raise InvalidInput(
            {
                "reason": [
                    f"say why: {spec.label.lower()} takes the node out of service, "
                    "and the reason is shown to everyone and kept in the audit log"
                ]
            }
        )
    with transaction.atomic():
        node = Node.objects.select_for_update().get(pk=node_id)
        # A move the state does not allow is refused by the move itself, saying why.
        if spec.disruptive and not confirm and node.state in spec.allowed_from:
            impact = impact_of(node, move)
            if impact.jobs:
                raise ConfirmationNeeded(impact)
        return spec.apply(actor, node_id, reason)
