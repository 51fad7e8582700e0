"""Job lifecycle: submit, place, start, finish, cancel. Each function is one
transaction that writes its audit record."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from django.db import IntegrityError, transaction
from django.utils import timezone

from fleet.choices import (
    FINISHED_JOB_STATES,
    HOLDING_JOB_STATES,
    JobState,
    Locality,
    NodeState,
    Role,
)
from fleet.models import GPU, Allocation, Job, Node, Tenant
from fleet.permissions import role_of
from fleet.services import audit
from fleet.services.capacity import FleetCapacity, fleet_capacity
from fleet.services.errors import Conflict, InvalidInput, NotAllowed
from fleet.services.racks import bump_versions


@dataclass
class JobSpec:
    """What a submitter asks for. Give ``num_gpus``, or ``num_nodes`` and
    ``gpus_per_node`` (or all three, consistent)."""

    name: str
    tenant: str | None = None
    num_gpus: int | None = None
    num_nodes: int | None = None
    gpus_per_node: int | None = None
    segment_nodes: int | None = None
    locality: str = Locality.REQUIRED
    priority: int = 0
    preemptible: bool = True
    checkpoint_interval_s: int = 3600
    expected_duration_s: int | None = None


@dataclass(frozen=True)
class Shape:
    num_gpus: int
    num_nodes: int | None
    gpus_per_node: int | None
    segment_nodes: int | None


def job_snapshot(job: Job) -> dict[str, object]:
    return {"state": job.state, "state_reason": job.state_reason}


def _positive(errors: dict[str, list[str]], field: str, value: int | None) -> None:
    if value is not None and value < 1:
        errors.setdefault(field, []).append(f"must be a positive integer, got {value}")


def normalise_shape(spec: JobSpec, capacity: FleetCapacity) -> Shape:
    """Turn the request into a concrete shape, or raise InvalidInput saying why it
    can never fit and what would.

    1. Sizes must be positive and the shape given one way or the other.
    2. A job of at most one node's GPUs is a sub-node job and may share a node.
    3. A bigger job takes whole nodes as one gang, cut into the fleet's dominant
       node size unless ``gpus_per_node`` says otherwise.
    4. ``segment_nodes`` (nodes that must share one domain) defaults to the whole
       gang when that fits in the largest domain.
    5. The shape must fit the installed fleet; a ``required`` segment must fit one
       domain.
    """
    errors: dict[str, list[str]] = {}
    for field in ("num_gpus", "num_nodes", "gpus_per_node", "segment_nodes"):
        _positive(errors, field, getattr(spec, field))
    if spec.locality not in Locality.values:
        errors["locality"] = [
            f"unknown locality {spec.locality!r}; use one of: " + ", ".join(Locality.values)
        ]
    if errors:
        raise InvalidInput(errors)

    if capacity.total_gpus == 0:
        raise InvalidInput("the fleet has no nodes yet; add racks before submitting jobs")

    num_gpus, num_nodes, gpn = spec.num_gpus, spec.num_nodes, spec.gpus_per_node
    if num_nodes is None and gpn is None:
        if num_gpus is None:
            raise InvalidInput(
                {"num_gpus": ["give num_gpus, or num_nodes together with gpus_per_node"]}
            )
    elif num_nodes is None or gpn is None:
        missing = "gpus_per_node" if num_nodes is not None else "num_nodes"
        raise InvalidInput({missing: [f"{missing} is required with {'num_nodes' if missing == 'gpus_per_node' else 'gpus_per_node'}"]})
    elif num_gpus is not None and num_gpus != num_nodes * gpn:
        raise InvalidInput(
            {"num_gpus": [f"num_gpus={num_gpus} does not match num_nodes x gpus_per_node = {num_nodes * gpn}; give one or the other"]}
        )

    max_gpn = capacity.max_gpus_per_node
    if gpn is not None and gpn > max_gpn:
        raise InvalidInput(
            {"gpus_per_node": [f"no node has {gpn} GPUs; the largest nodes have {max_gpn}"]}
        )

    if num_nodes is None:
        assert num_gpus is not None
        if num_gpus <= max_gpn and spec.segment_nodes in (None, 1):
            # A sub-node job: shares a node, so segments and node counts don't apply.
            shape = Shape(num_gpus, None, None, None)
            return shape
        gpn = capacity.dominant_gpus_per_node
        num_nodes = math.ceil(num_gpus / gpn)
    else:
        num_gpus = num_nodes * gpn

    assert gpn is not None
    if num_gpus > capacity.total_gpus:
        raise InvalidInput(
            {"num_gpus": [f"asks for {num_gpus} GPUs but the whole fleet has {capacity.total_gpus}"]}
        )
    available_nodes = capacity.nodes_of_size(gpn)
    if num_nodes > available_nodes:
        raise InvalidInput(
            {"num_nodes": [f"asks for {num_nodes} nodes of {gpn} GPUs but the fleet has {available_nodes} such nodes"]}
        )

    largest = capacity.largest_domain(gpn)
    segment = spec.segment_nodes
    if segment is None:
        segment = num_nodes if num_nodes <= largest else None
    else:
        if segment > num_nodes:
            raise InvalidInput(
                {"segment_nodes": [f"segment_nodes={segment} is larger than the job's {num_nodes} nodes"]}
            )
        if num_nodes % segment:
            divisors = [d for d in range(1, min(num_nodes, largest) + 1) if num_nodes % d == 0]
            raise InvalidInput(
                {"segment_nodes": [f"{num_nodes} nodes cannot be cut into segments of {segment}; use a divisor of {num_nodes} such as {', '.join(map(str, divisors[-3:]))}"]}
            )
        if segment > largest:
            raise InvalidInput(
                {"segment_nodes": [f"a segment of {segment} nodes cannot fit: the largest NVLink domain has {largest} nodes of {gpn} GPUs"]}
            )
    if spec.locality == Locality.REQUIRED and segment is None:
        raise InvalidInput(
            {"locality": [f"a required job must fit in one NVLink domain, but {num_nodes} nodes exceed the largest domain ({largest} nodes, {largest * gpn} GPUs); set segment_nodes (a divisor of {num_nodes} up to {largest}) to split it into rack-local segments, or use locality=preferred"]}
        )
    return Shape(num_gpus, num_nodes, gpn, segment)


def _resolve_tenant(actor, tenant_name: str | None) -> Tenant:
    role = role_of(actor)
    if role not in (Role.SUBMITTER, Role.OPERATOR):
        raise NotAllowed("only submitters and operators can submit jobs")
    mine = Tenant.objects.all() if role == Role.OPERATOR else actor.tenants.all()
    if tenant_name is None:
        names = list(actor.tenants.values_list("name", flat=True))
        if len(names) == 1:
            return Tenant.objects.get(name=names[0])
        hint = f"you belong to: {', '.join(names)}" if names else "you belong to no tenant"
        raise InvalidInput({"tenant": [f"tenant is required; {hint}"]})
    tenant = mine.filter(name=tenant_name).first()
    if tenant is None:
        names = ", ".join(mine.values_list("name", flat=True)) or "none"
        raise InvalidInput({"tenant": [f"unknown tenant {tenant_name!r} for you; yours: {names}"]})
    return tenant


def submit_job(actor, spec: JobSpec) -> Job:
    """Queue a job. Refuses (InvalidInput) a job that can never fit the fleet."""
    tenant = _resolve_tenant(actor, spec.tenant)
    shape = normalise_shape(spec, fleet_capacity())
    with transaction.atomic():
        job = Job.objects.create(
            name=spec.name,
            owner=actor,
            tenant=tenant,
            num_gpus=shape.num_gpus,
            num_nodes=shape.num_nodes,
            gpus_per_node=shape.gpus_per_node,
            segment_nodes=shape.segment_nodes,
            locality=spec.locality,
            priority=spec.priority,
            preemptible=spec.preemptible,
            checkpoint_interval_s=spec.checkpoint_interval_s,
            expected_duration_s=spec.expected_duration_s,
        )
        audit.record(actor, "job.submit", job, after=job_snapshot(job) | {"num_gpus": job.num_gpus})
    return job


def _release(job: Job) -> set[int]:
    """Release the job's GPUs; a draining node left empty becomes drained.
    Returns the ids of the racks touched."""
    now = timezone.now()
    active = Allocation.objects.filter(job=job, released_at__isnull=True)
    node_ids = set(active.values_list("gpu__node_id", flat=True))
    rack_ids = set(Node.objects.filter(id__in=node_ids).values_list("rack_id", flat=True))
    active.update(released_at=now)
    still_busy = Allocation.objects.filter(
        released_at__isnull=True, gpu__node_id__in=node_ids
    ).values_list("gpu__node_id", flat=True)
    Node.objects.filter(id__in=node_ids, state=NodeState.DRAINING).exclude(
        id__in=list(still_busy)
    ).update(state=NodeState.DRAINED, state_changed_at=now)
    return rack_ids


def cancel_job(actor, job_id: int) -> Job:
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job_id)
        if job.state in FINISHED_JOB_STATES:
            raise Conflict(
                f"job #{job.pk} is already {job.state}; only pending, placed, running "
                "or recovering jobs can be cancelled"
            )
        before = job_snapshot(job)
        bump_versions(_release(job))
        job.state = JobState.CANCELLED
        job.state_reason = f"cancelled by {audit.actor_name(actor)}"
        job.finished_at = timezone.now()
        job.save(update_fields=["state", "state_reason", "finished_at"])
        audit.record(actor, "job.cancel", job, before=before, after=job_snapshot(job))
    return job


def apply_placement(
    actor,
    job_id: int,
    gpus_by_node: Mapping[int, list[int]],
    *,
    reason: str,
) -> Job:
    """Bind a pending job to GPUs (node id -> GPU indices) as decided by the
    placement engine. Raises Conflict if the job is no longer pending or any GPU
    is taken or unusable; nothing is written in that case."""
    with transaction.atomic():
        # Compare-and-set on the job's state: a second caller finds 0 rows.
        job = Job.objects.select_for_update().get(pk=job_id)
        if job.state != JobState.PENDING:
            raise Conflict(f"job #{job.pk} is {job.state}, not pending; it cannot be placed")
        wanted = [(node_id, idx) for node_id, idxs in gpus_by_node.items() for idx in idxs]
        gpus = list(
            GPU.objects.select_related("node").filter(
                node_id__in=list(gpus_by_node), node__state=NodeState.HEALTHY
            )
        )
        by_key = {(g.node_id, g.index): g for g in gpus}
        missing = [key for key in wanted if key not in by_key]
        if missing:
            raise Conflict(f"GPUs {missing} are not on healthy nodes; the plan is stale")
        chosen = [by_key[key] for key in wanted]
        try:
            # A savepoint, so the IntegrityError leaves the outer transaction usable
            # for the rollback and the caller gets a clean Conflict.
            with transaction.atomic():
                Allocation.objects.bulk_create(Allocation(job=job, gpu=g) for g in chosen)
        except IntegrityError as exc:
            raise Conflict(f"a GPU in the plan for job #{job.pk} is already allocated") from exc
        before = job_snapshot(job)
        nodes = sorted({g.node.hostname for g in chosen})
        racks = sorted({g.node.rack_id for g in chosen})
        job.state = JobState.PLACED
        job.state_reason = ""
        job.placed_at = timezone.now()
        job.placement = {"racks": racks, "nodes": nodes, "reason": reason}
        job.save(update_fields=["state", "state_reason", "placed_at", "placement"])
        bump_versions(racks)
        audit.record(actor, "job.place", job, before=before, after=job_snapshot(job), message=reason)
    return job


def start_job(actor, job_id: int) -> Job:
    """placed -> running, when the job's processes are up."""
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job_id)
        if job.state != JobState.PLACED:
            raise Conflict(f"job #{job.pk} is {job.state}; only a placed job can start")
        before = job_snapshot(job)
        job.state = JobState.RUNNING
        job.started_at = job.started_at or timezone.now()
        job.save(update_fields=["state", "started_at"])
        audit.record(actor, "job.start", job, before=before, after=job_snapshot(job))
    return job


def finish_job(actor, job_id: int, *, succeeded: bool, reason: str = "") -> Job:
    """A running (or recovering) job ended; its GPUs return to the pool."""
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job_id)
        if job.state not in HOLDING_JOB_STATES:
            raise Conflict(f"job #{job.pk} is {job.state}; it holds no GPUs to finish with")
        before = job_snapshot(job)
        bump_versions(_release(job))
        job.state = JobState.COMPLETED if succeeded else JobState.FAILED
        job.state_reason = reason
        job.finished_at = timezone.now()
        job.save(update_fields=["state", "state_reason", "finished_at"])
        audit.record(actor, "job.finish", job, before=before, after=job_snapshot(job), message=reason)
    return job
