"""Tenants as the Tenants page and ``/api/tenants/`` show them: per node shape
their quota, what they hold, borrow and lend; their pending demand, fair share
(their weight's part, and the GPUs it comes to now: what a reclaim enforces)
and decayed usage (see placement.quota and fleet.services.tenants.usage)."""

from __future__ import annotations

from django.db.models import Count, Q

from fleet.choices import JobState
from fleet.models import Quota, RackReservation, Tenant
from fleet.services.tenants import usage


def tenant_figures(name: str | None = None) -> list[dict]:
    ledgers = usage.ledgers()
    demand = usage.pending_demand()
    demand_by_shape = usage.pending_by_shape()
    decayed = usage.decayed_usage()
    rows = Tenant.objects.annotate(
        running_jobs=Count("jobs", filter=Q(jobs__state=JobState.RUNNING)),
        pending_jobs=Count("jobs", filter=Q(jobs__state=JobState.PENDING)),
    ).order_by("name")
    if name is not None:
        rows = rows.filter(name=name)
    shares = list(Tenant.objects.values_list("name", "cohort", "weight"))
    weights = {t: weight for t, _, weight in shares}
    cohort_of = {t: cohort for t, cohort, _ in shares}
    total_weight = sum(weights.values()) or 1.0
    fair = {
        (cohort, shape): ledger.fair(
            {
                t: gpus
                for (t, s), gpus in demand_by_shape.items()
                if s == shape and cohort_of.get(t, Tenant.DEFAULT_COHORT) == cohort
            },
            weights,
        )
        for (cohort, shape), ledger in ledgers.items()
    }
    configured = {(q.tenant_id, q.gpus_per_node) for q in Quota.objects.all()}
    reserved: dict[int, list[str]] = {}
    for tenant_id, rack in RackReservation.objects.values_list("tenant_id", "rack__name").order_by(
        "rack__name"
    ):
        reserved.setdefault(tenant_id, []).append(rack)
    out = []
    for tenant in rows:
        shapes = []
        for (cohort, shape), ledger in sorted(ledgers.items(), key=lambda kv: kv[0][1]):
            if cohort != tenant.cohort:
                continue
            quota = ledger.quota(tenant.name)
            in_use = ledger.usage.get(tenant.name, 0)
            pending = demand_by_shape.get((tenant.name, shape), 0)
            if (tenant.pk, shape) not in configured and not in_use and not pending:
                continue
            shapes.append(
                {
                    "gpus_per_node": shape,
                    "nominal_gpus": quota.nominal,
                    "borrowing_limit_gpus": quota.borrowing_limit,
                    "lending_limit_gpus": quota.lending_limit,
                    "in_use_gpus": in_use,
                    "borrowed_gpus": ledger.borrowed(tenant.name),
                    "lent_gpus": ledger.lent(tenant.name),
                    "pending_gpus": pending,
                    "fair_share_gpus": round(fair[(cohort, shape)].get(tenant.name, 0.0)),
                    "cohort_capacity_gpus": ledger.capacity,
                }
            )
        out.append(
            {
                "name": tenant.name,
                "cohort": tenant.cohort,
                "weight": tenant.weight,
                "fair_share": round(tenant.weight / total_weight, 4),
                "decayed_usage_gpu_hours": round(decayed.get(tenant.name, 0.0), 2),
                "pending_gpus": demand.get(tenant.name, 0),
                "pending_jobs": tenant.pending_jobs,
                "running_jobs": tenant.running_jobs,
                "quotas": shapes,
                "reserved_racks": reserved.get(tenant.pk, []),
            }
        )
    return out
