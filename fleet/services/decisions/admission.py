"""A shared fleet: quota admission before placement, and preemption to start a job.

With no quota configured (no ``Quota`` row), every pending job goes to the
engine as it always did, and only a higher priority preempts (step 2). With quotas:

1. Admission (:func:`admit`): pending jobs are taken in fair-share order:
   overdue jobs first (the starvation bound, :func:`placement.quota.overdue`,
   oldest first), then jobs that keep their tenant within its fair share of the
   cohort's GPUs over everything pending (:meth:`placement.quota.Ledger.fair`,
   what a fair-share reclaim would start them with), then the rest; inside each,
   tenants with the least decayed usage per weight first, then priority, then
   submission. Each is admitted if its
   tenant's quota and what its cohort can lend cover it
   (:mod:`placement.quota`). The others wait with a reason that names the
   numbers. Only admitted jobs reach the engine.
2. Preemption to start a job (:func:`propose_reclaims`): an admitted job the
   engine could not place gets victims chosen by :func:`placement.reclaim.reclaim`:
   a job within its tenant's nominal quota takes back what other tenants
   borrowed (never from a tenant within its own nominal quota:
   :func:`placement.reclaim.reclaim_for_quota`), and any job may
   stop preemptible jobs of its own tenant with a lower priority. A job that
   borrows beyond its tenant's nominal quota (admitted and not placed, or held
   back by its quota because the cohort has nothing left to lend) reclaims too
   while its tenant stays within its fair share with it (weighted
   max-min of the cohort's GPUs over every tenant's demand, held plus waiting:
   :meth:`placement.quota.Ledger.fair`), from tenants above both their nominal
   quota and their fair share, never below either
   (:meth:`placement.quota.Ledger.fair_reclaim`): what one tenant borrowed goes
   back to whom fair share owes it. The victims
   are chosen to give it one NVLink domain at the least GPU-hours lost. The plan
   is an action (``reclaim``): checkpoint and preempt the victims (they go back to
   the queue), allocate and start the job. It runs without an operator up to
   ``RACKWISE_RECLAIM_APPROVAL_GPU_HOURS`` lost (and its kind's policy), and
   waits for approval above.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial

from django.conf import settings
from django.db.models import Min
from django.utils import timezone

from fleet import engine
from fleet.choices import ActionKind, ActionState, JobState
from fleet.models import Action, Job, Tenant
from fleet.services.actions import propose as action_services
from fleet.services.tenants import usage
from fleet.steps import Checkpoint, Preempt, Start, Step
from placement.quota import Admission, Ledger, Reclaim, overdue
from placement.reclaim import reclaim_for_quota

# After an operator rejects a reclaim, the job waits this long before another is proposed.
RECLAIM_COOLDOWN = timedelta(minutes=15)


@dataclass
class Admitted:
    """The outcome of admission for one pass."""

    jobs: list[Job] = field(default_factory=list)  # admitted, in fair-share order
    waiting: dict[int, str] = field(default_factory=dict)  # job id -> why its quota holds it back
    held: list[Job] = field(default_factory=list)  # those jobs, in fair-share order
    guaranteed: dict[int, int] = field(default_factory=dict)  # within nominal: job id -> pool overdraw
    ledgers: dict[tuple[str, int], Ledger] = field(default_factory=dict)
    shape_of: dict[int, int] = field(default_factory=dict)
    cohort_of: dict[str, str] = field(default_factory=dict)
    # Per ledger: each tenant's fair share of its GPUs now (Ledger.fair).
    fair: dict[tuple[str, int], dict[str, float]] = field(default_factory=dict)

    def ledger_of(self, job: Job) -> tuple[str, int] | None:
        """The key of the ledger ``job`` counts in (None: no shape holds it)."""
        shape = self.shape_of.get(job.pk)
        if shape is None:
            return None
        return (self.cohort_of.get(job.tenant.name, Tenant.DEFAULT_COHORT), shape)


def admit(pending: list[Job], busy: set[int]) -> Admitted:
    """Admission for ``pending`` jobs. With no quota configured, all of them, as
    they came (and no ledgers). Jobs of open actions (``busy``) that are still
    pending count as held (they are about to be placed)."""
    if not usage.quotas_configured():
        return Admitted(jobs=list(pending))
    shapes = sorted(usage.capacity_by_shape())
    extra: dict[tuple[str, int], int] = {}
    for job in Job.objects.select_related("tenant").filter(pk__in=busy, state=JobState.PENDING):
        shape = usage.job_shape(job, shapes)
        if shape is not None:
            extra[(job.tenant.name, shape)] = extra.get((job.tenant.name, shape), 0) + job.num_gpus
    tenants = list(Tenant.objects.values_list("name", "cohort", "weight"))
    out = Admitted(ledgers=usage.ledgers(extra), cohort_of={name: cohort for name, cohort, _ in tenants})
    decayed = usage.decayed_usage()
    weight = {name: w for name, _, w in tenants}
    now = timezone.now()
    floor = settings.RACKWISE_OVERDUE_FLOOR_S
    # Each tenant's fair share of its ledger's GPUs over everything pending now:
    # a job that keeps its tenant within it goes ahead of jobs that would not.
    demand: dict[tuple[str, int], dict[str, int]] = {key: {} for key in out.ledgers}
    for job in pending:
        shape = usage.job_shape(job, shapes)
        if shape is not None:
            out.shape_of[job.pk] = shape
            key = out.ledger_of(job)
            assert key is not None
            demand[key][job.tenant.name] = demand[key].get(job.tenant.name, 0) + job.num_gpus
    entitled = {key: ledger.fair(demand[key], weight) for key, ledger in out.ledgers.items()}

    def within_fair_share(job: Job) -> bool:
        key = out.ledger_of(job)
        if key is None:
            return True
        return out.ledgers[key].within_fair(job.tenant.name, job.num_gpus, entitled[key])

    def order(job: Job) -> tuple:
        tenant = job.tenant.name
        waited = (now - job.submitted_at).total_seconds()
        run = job.expected_duration_s or floor
        if overdue(
            waited,
            run,
            slowdown=settings.RACKWISE_OVERDUE_SLOWDOWN or None,
            floor_s=floor,
            cap_s=settings.RACKWISE_OVERDUE_CAP_S or None,
        ):
            return (0, 0, 0.0, 0, job.submitted_at, job.pk)  # the starvation bound: oldest first
        return (
            1,
            0 if within_fair_share(job) else 1,
            decayed.get(tenant, 0.0) / max(weight.get(tenant, 1.0), 0.01),
            -job.priority,
            job.submitted_at,
            job.pk,
        )

    waiting: dict[tuple[str, int], dict[str, int]] = {key: {} for key in out.ledgers}
    for job in sorted(pending, key=order):
        key = out.ledger_of(job)
        if key is None:
            out.jobs.append(job)  # no shape holds it: the engine says why
            continue
        tenant = job.tenant.name
        ledger = out.ledgers[key]
        decision = ledger.admit(tenant, job.num_gpus)
        if not decision.admitted:
            out.waiting[job.pk] = f"quota: {decision.reason}"
            out.held.append(job)
            waiting[key][tenant] = waiting[key].get(tenant, 0) + job.num_gpus
            continue
        ledger.take(tenant, job.num_gpus)
        out.jobs.append(job)
        if decision.guaranteed:
            out.guaranteed[job.pk] = decision.overdraw
    out.fair = {key: ledger.fair(waiting[key], weight) for key, ledger in out.ledgers.items()}
    return out


def quota_check(job: Job) -> Admission | None:
    """Admission of one job, not saved, against the quotas and what tenants
    hold now (what-if); None when no quota is configured or no shape holds it."""
    if not usage.quotas_configured():
        return None
    shape = usage.job_shape(job, sorted(usage.capacity_by_shape()))
    if shape is None:
        return None
    cohort = Tenant.objects.filter(pk=job.tenant_id).values_list("cohort", flat=True).first()
    ledger = usage.ledgers().get((cohort or Tenant.DEFAULT_COHORT, shape))
    return ledger.admit(job.tenant.name, job.num_gpus) if ledger is not None else None


def propose_reclaims(
    admitted: Admitted, waiting: dict[int, str], snap: engine.Snapshot, busy: set[int]
) -> list[action_services.Proposal]:
    """Preemption plans for admitted jobs the engine could not place (``waiting``),
    in fair-share order, each planned on the fleet as the earlier ones leave it
    (the caller's trial)."""
    recently_rejected = set(
        Action.jobs.through.objects.filter(
            action__kind=ActionKind.RECLAIM,
            action__state=ActionState.REJECTED,
            action__decided_at__gte=timezone.now() - RECLAIM_COOLDOWN,
        ).values_list("job_id", flat=True)
    )
    running = set(
        Job.objects.filter(state=JobState.RUNNING).exclude(pk__in=busy).values_list("pk", flat=True)
    )
    proposals = []
    # Without quotas, only a higher priority preempts: jobs with a lower-priority
    # preemptible job of their own tenant running.
    lowest = {
        row["tenant_id"]: row["low"]
        for row in Job.objects.filter(pk__in=running, preemptible=True)
        .values("tenant_id")
        .annotate(low=Min("priority"))
    }
    for job in [*admitted.jobs, *admitted.held]:
        if job.pk not in waiting or job.pk in recently_rejected:
            continue
        tenant = job.tenant.name
        held = job.pk in admitted.waiting  # its quota holds it back
        ledger = None
        # Without a reclaim it may make: only a higher priority's preemption inside its tenant.
        nothing = Reclaim({}, 0, widen=True)
        may = nothing
        if admitted.ledgers:
            key = admitted.ledger_of(job)
            if key is None:
                continue
            ledger = admitted.ledgers[key]
            may = (
                ledger.reclaim(
                    tenant,
                    job.num_gpus,
                    overdraw=admitted.guaranteed.get(job.pk),
                    fair=partial(admitted.fair.__getitem__, key),
                    counted=not held,
                )
                or nothing
            )
        limits = may.budgets
        if not limits and (held or lowest.get(job.tenant_id, job.priority) >= job.priority):
            continue  # nothing it may stop

        def may_preempt(victim, tenant=tenant, job=job, limits=limits, held=held) -> bool:
            if int(victim.id) not in running:
                return False
            if victim.tenant in limits:
                return True  # borrowed work, taken back for a tenant within its quota or fair share
            return (
                not held and victim.tenant == tenant and victim.preemptible and victim.priority < job.priority
            )

        request = engine.job_request(job)
        plan = reclaim_for_quota(
            snap.fleet,
            request,
            may_preempt,
            limits,
            ledger.usage if ledger is not None else {},
            partial(_nominal, ledger),
            widen=may.widen,
            need_gpus=may.need,
            policy=engine.policy(),
            now=time.time(),
        )
        if not plan.placed or not plan.victims or plan.placement is None:
            continue
        for vid in plan.victims:
            victim = snap.fleet.release(vid)
            if ledger is not None:
                ledger.give(victim.job.tenant, victim.gpus)
        if held and ledger is not None:
            ledger.take(tenant, job.num_gpus)
        snap.fleet.allocate(plan.placement.allocation(request))
        if not may.widen:  # a fair-share reclaim
            why = "reclaims GPUs held above their fair share"
        else:
            why = "reclaims borrowed GPUs" if limits else "preempts lower-priority work"
        proposals.append(_proposal(job, plan, snap, why, bool(limits)))
    return proposals


def _nominal(ledger: Ledger | None, tenant: str) -> int:
    return ledger.quota(tenant).nominal if ledger is not None else 0


def _proposal(job: Job, plan, snap: engine.Snapshot, why: str, reclaims: bool) -> action_services.Proposal:
    victims = [snap.jobs[v] if v in snap.jobs else Job.objects.get(pk=int(v)) for v in plan.victims]
    steps: list[Step] = [Checkpoint(job=v.pk) for v in victims]
    steps += [Preempt(job=v.pk) for v in victims]
    placement = plan.placement
    steps += [
        snap.allocate_step(job.pk, placement.nodes, placement.segments, placement.reason, placement.choices),
        Start(job=job.pk),
    ]
    names = ", ".join(f"#{v.pk} {v.name} ({v.tenant.name})" for v in victims)
    racks = ", ".join(snap.describe_racks(placement.racks))
    cost = plan.cost_gpu_hours
    return action_services.Proposal(
        kind=ActionKind.RECLAIM,
        title=f"start job #{job.pk} {job.name} ({job.tenant.name}) in {racks}: {why} from {names}",
        steps=steps,
        jobs=[job.pk, *(v.pk for v in victims)],
        engine_plan=plan.to_dict(),
        cost_gpu_hours=cost,
        benefit={"reason": plan.reason, "reclaim": reclaims, "victims": [v.pk for v in victims]},
        needs_approval=cost > settings.RACKWISE_RECLAIM_APPROVAL_GPU_HOURS,
    )
