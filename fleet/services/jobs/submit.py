"""Jobs asked for: a submission (its shape checked against what the fleet can
ever hold, replayed for a retried key) and a cancel. Every change of a job's
state is a move of the job lifecycle (``jobs.lifecycle``)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

from django.db import IntegrityError, transaction

from fleet import dispatch, events
from fleet.choices import Locality, Role
from fleet.models import Job, Tenant
from fleet.permissions import role_of
from fleet.services import audit
from fleet.services.errors import Conflict, InvalidInput, NotAllowed
from fleet.services.jobs import allocations
from fleet.services.jobs import lifecycle as job_lifecycle
from fleet.services.jobs.capacity import fleet_capacity, normalise_shape


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
    # The client's key for this submission: a retry with the same key (in the same
    # tenant) returns the job the first one created instead of a second job.
    idempotency_key: str | None = None
    # How Slurm runs it (script or command, partition, account, time_limit_min, env).
    slurm: dict | None = None


def _request_digest(spec: JobSpec, tenant: Tenant) -> str:
    """What was asked, minus the key, with the tenant resolved (so leaving out
    one's only tenant and naming it are the same request)."""
    asked = asdict(spec) | {"tenant": tenant.name}
    asked.pop("idempotency_key")
    return hashlib.sha256(json.dumps(asked, sort_keys=True).encode()).hexdigest()


def _replay(tenant: Tenant, key: str, digest: str) -> Job | None:
    """The job an earlier submission with ``key`` created, or None; Conflict when
    the key was used for a different request."""
    job = Job.objects.select_related("owner", "tenant").filter(tenant=tenant, idempotency_key=key).first()
    if job is not None and job.request_digest != digest:
        raise Conflict(
            f"Idempotency-Key {key!r} was already used in tenant {tenant.name} for a different "
            f"request (job #{job.pk}); use a new key for a new job"
        )
    return job


def resolve_tenant(actor, tenant_name: str | None) -> Tenant:
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
        yours = ", ".join(mine.values_list("name", flat=True)) or "none"
        raise InvalidInput({"tenant": [f"unknown tenant {tenant_name!r} for you; yours: {yours}"]})
    return tenant


def missing_fields(actor, data) -> dict[str, list[str]]:
    """What a job request (raw, as sent) lacks beyond the fields its form checks
    one by one: a tenant, where the actor has not exactly one, and a size. The
    API reports them with the form's own errors, so that ``{}`` is told every
    field it needs at once."""
    errors: dict[str, list[str]] = {}
    if not hasattr(data, "get"):
        return errors
    if not data.get("tenant"):
        try:
            resolve_tenant(actor, None)
        except InvalidInput as exc:
            errors.update(exc.errors)
        except NotAllowed:
            pass
    if all(data.get(f) in (None, "") for f in ("num_gpus", "num_nodes", "gpus_per_node")):
        errors["num_gpus"] = ["give num_gpus, or num_nodes together with gpus_per_node"]
    return errors


def submit_job(actor, spec: JobSpec) -> Job:
    """Queue a job. Refuses (InvalidInput) a job that can never fit the fleet."""
    return submit_job_once(actor, spec)[0]


def submit_job_once(actor, spec: JobSpec) -> tuple[Job, bool]:
    """Queue a job, at most once per ``spec.idempotency_key`` and tenant.

    Returns ``(job, created)``: ``created`` is False when an earlier submission
    with the same key and the same request made the job. Refuses (Conflict) the
    same key with a different request, and (InvalidInput) a job that can never
    fit the fleet.
    """
    tenant = resolve_tenant(actor, spec.tenant)
    key = spec.idempotency_key
    digest = _request_digest(spec, tenant) if key else ""
    if key and (earlier := _replay(tenant, key, digest)) is not None:
        return earlier, False
    shape = normalise_shape(spec, fleet_capacity())
    try:
        job = _create(actor, spec, tenant, shape, key, digest)
    except IntegrityError:
        # A concurrent retry with the same key committed first (the unique
        # constraint refused this one, inside _create's savepoint): answer with its job.
        earlier = _replay(tenant, key, digest) if key else None
        if earlier is None:
            raise
        return earlier, False
    return job, True


def unsaved_job(actor, spec: JobSpec, tenant: Tenant, shape, **extra) -> Job:
    """The row a submission of ``spec`` (its ``shape`` normalised) would create, not
    saved: submission saves it, a what-if asks the engine about it."""
    return Job(
        name=spec.name,
        owner=actor,
        tenant=tenant,
        **{name: getattr(shape, name) for name in Job.SHAPE},
        **{name: getattr(spec, name) for name in Job.PLACEMENT_TERMS},
        checkpoint_interval_s=spec.checkpoint_interval_s,
        expected_duration_s=spec.expected_duration_s,
        cluster_spec={"slurm": dict(spec.slurm)} if spec.slurm else {},
        **extra,
    )


def _create(actor, spec: JobSpec, tenant: Tenant, shape, key: str | None, digest: str) -> Job:
    with transaction.atomic():
        job = unsaved_job(actor, spec, tenant, shape, idempotency_key=key, request_digest=digest)
        job.save(force_insert=True)
        audit.record(actor, "job.submit", job, after=job_lifecycle.snapshot(job) | {"num_gpus": job.num_gpus})
        events.jobs_changed([job.pk])
        dispatch.schedule_soon()
    return job


def cancel_job(
    actor, job_id: int, *, reason: str = "", tell_cluster: bool = True, expect_attempt: int | None = None
) -> Job:
    """End a job that has not finished; its GPUs return to the pool. Once
    committed, the cluster is told to end it too (best effort: a failure is
    logged; the sync reports the job again while it runs there).
    ``tell_cluster=False`` when the cluster itself reported the cancel;
    ``expect_attempt``: refuse (Conflict) if the job was restarted since."""
    return job_lifecycle.transition(
        actor,
        job_id,
        "cancel",
        reason=reason or f"cancelled by {audit.actor_name(actor)}",
        expect_attempt=expect_attempt,
        tell_cluster=tell_cluster,
        effect=allocations.release,
    )


def set_external_id(job_id: int, external_id: str) -> None:
    """Record the job's id in the cluster (given by the step that created it
    there). Called inside the transaction of that step's database change."""
    Job.objects.filter(pk=job_id).exclude(external_id=external_id).update(external_id=external_id[:64])
